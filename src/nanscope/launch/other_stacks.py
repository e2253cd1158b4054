"""The causes a job without megatron-core is offered (facts.frameworks.WITHOUT_MEGATRON, or nothing pointing to
megatron-core, or an uncatalogued stack its lines name): not megatron-core's own, not Megatron's words for the
others, not another kind of job's reports, and no empty batch of tokens for a model that reads none.

    found = without_megatron(found, framework.name, core)   # launch.candidates.Candidate, in place and filtered
    found = token_free(found, framework.stack)
"""

from __future__ import annotations

from nanscope.causes import neutral
from nanscope.causes import reported as reported_causes
from nanscope.facts import frameworks
from nanscope.launch.reported import MEGATRON_LIBRARIES
from nanscope.launch.status import RULED_OUT

EMPTY = "empty-micro-batch"  # a cause of a token-normalised loss only (frameworks.TOKEN_FREE: models that read none)
# the causes that live in megatron-core (its router, DDP, schedules, optimizer, TransformerEngine recipes)
MEGATRON_CAUSES = ("moe-aux-loss", "moe-zero-token-expert", "moe-router-logits", "grad-reduce-overlap-race",
                   "cpu-offloaded-optimizer", "cp-rank-all-masked", "non-flash-attention-mask-pp",
                   "sp-new-architecture", "fp8-fp4-recipe")  # fmt: skip


def without_megatron(found: list, framework: str, core: str | None = "") -> list:
    """The candidates of a stack that trains without megatron-core (facts.frameworks.WITHOUT_MEGATRON), or of a job
    where nothing points to megatron-core (`core` None: launch.core_evidence): those whose mechanism and evidence
    are megatron-core's are not offered."""
    if framework not in frameworks.WITHOUT_MEGATRON and core is not None:
        return found
    for candidate in found:  # no TransformerEngine of Megatron's, no RerunStateMachine to tell a kernel from a device
        if candidate.id == "library-regression" and candidate.discriminator is not None:
            candidate.discriminator = neutral.LIBRARY_REGRESSION
            libraries = neutral.MLX_LIBRARIES if framework == frameworks.MLX_LM else neutral.LIBRARIES
            said = f"no flag decides it: {libraries} do"
            candidate.evidence = [said if line == MEGATRON_LIBRARIES else line for line in candidate.evidence]
    if framework in frameworks.WITHOUT_MEGATRON:
        own_reports(found)
        return [candidate for candidate in found if candidate.id not in MEGATRON_CAUSES]
    # nothing points to megatron-core: its causes are not offered, but one the framework's own code rules out (with
    # its reason: OpenRLHF's DeepSpeed has no megatron-core router) is said so
    return [c for c in found if c.id not in MEGATRON_CAUSES or c.status == RULED_OUT]


def own_reports(found: list) -> None:
    """A job without megatron-core: its reported causes keep the reports of stacks like it, not verl's or those of
    stacks that train with megatron-core (causes.reported.foreign)."""
    for candidate in found:
        cause = reported_causes.BY_NAME.get(candidate.id)
        if cause is not None:
            candidate.evidence = [line for line in candidate.evidence
                                  if line not in cause.evidence or not reported_causes.foreign(line)]  # fmt: skip


def token_free(found: list, stack: str | None) -> list:
    """The candidates of an uncatalogued stack whose model reads no tokens (facts.frameworks.TOKEN_FREE): no
    empty-micro-batch, and no other kind of job's reports; any other `stack`: `found` as it is."""
    if stack not in frameworks.TOKEN_FREE:
        return found
    own_reports(found)
    return [candidate for candidate in found if candidate.id != EMPTY]

"""Rules on the batch and GPU layout: a sample over the micro-batch budget, a rollout that is not a whole
number of global batches, rollout GPUs that cannot be placed (not NaN mechanisms, but what kills or
silently changes a run before one).
"""

from __future__ import annotations

from nanscope.launch.config import Batches, Config
from nanscope.launch.findings.finding import Finding, release_of


def budget(cfg: Config, batches: Batches, cp: int) -> Finding | None:
    if batches.budget_tokens is None or batches.longest_sample is None:
        return None
    if batches.longest_sample <= batches.budget_tokens:
        return None
    flags = [
        cfg.flag_text("max_tokens_per_gpu"),
        f"--context-parallel-size {cp}",
        "--use-dynamic-batch-size",
        batches.longest_from,
    ]
    mechanism = (
        f"slime packs micro-batches first-fit up to max-tokens-per-gpu x CP = {batches.budget_tokens} tokens, but "
        f"a sample may be {batches.longest_sample} tokens ({batches.longest_from}); such a sample gets a "
        "micro-batch of its own, over the budget memory was sized for. That is an out-of-memory risk, not a NaN "
        "mechanism by itself, but the longest samples are also the most off-policy ones."
    )
    need = -(-batches.longest_sample // cp)
    return Finding(
        id="sample-exceeds-microbatch-budget",
        severity="low",
        title="samples can be longer than the micro-batch budget",
        flags=flags,
        mechanism=mechanism,
        fix=f"--max-tokens-per-gpu {need} (>= longest / CP), or bound the sample: lower "
        "--rollout-max-response-len / --sglang-context-length, set --rollout-max-prompt-len.",
    )


def remainder(cfg: Config, batches: Batches) -> Finding | None:
    """rollout-batch-size x n-samples-per-prompt not a multiple of the global batch."""
    if batches.samples_per_rollout is None or not batches.steps_remainder:
        return None
    release = release_of(cfg)
    asserted = release.batch_remainder == "assert"
    mechanism = (
        f"slime {release.key} asserts rollout-batch-size x n-samples-per-prompt ({batches.samples_per_rollout}) "
        f"% global-batch-size ({batches.global_batch}) == 0 at start-up. The run does not start."
        if asserted
        else f"slime {release.key} trains whole global batches only and drops the rest "
        f"({release.batch_remainder_at}). Here {batches.samples_per_rollout} % {batches.global_batch} = "
        f"{batches.steps_remainder} samples of every rollout are generated and never trained."
    )
    return Finding(
        id="rollout-not-multiple-of-global-batch",
        severity="critical" if asserted else "low",
        title="rollout x n-samples is not a multiple of the global batch",
        flags=[
            cfg.flag_text("rollout_batch_size"),
            cfg.flag_text("n_samples_per_prompt"),
            f"--global-batch-size {batches.global_batch}",
        ],
        mechanism=mechanism,
        fix="make the global batch a divisor of rollout-batch-size x n-samples-per-prompt.",
    )


def colocate(cfg: Config, world: int) -> Finding | None:
    per_engine = cfg["rollout_num_gpus_per_engine"]
    rollout = cfg["rollout_num_gpus"]
    if rollout is None and not cfg["colocate"] and not cfg["debug_train_only"]:
        return Finding(
            id="rollout-gpus-unset",
            severity="critical",
            title="disaggregated run without --rollout-num-gpus",
            flags=["(no --colocate)", "(no --rollout-num-gpus)"],
            mechanism="Without --colocate the rollout engines need their own GPUs, and slime sizes them from "
            "--rollout-num-gpus. Left unset, the engines cannot be placed.",
            fix="--rollout-num-gpus N (e.g. 8), or --colocate.",
        )
    if rollout is not None and rollout % per_engine:
        return Finding(
            id="rollout-gpus-per-engine",
            severity="critical",
            title="rollout GPUs not a multiple of GPUs per engine",
            flags=[f"--rollout-num-gpus {rollout}", cfg.flag_text("rollout_num_gpus_per_engine")],
            mechanism=f"slime starts rollout-num-gpus / rollout-num-gpus-per-engine = {rollout}/{per_engine} "
            "SGLang engines. A remainder leaves GPUs without an engine or fails placement.",
            fix="make --rollout-num-gpus a multiple of --rollout-num-gpus-per-engine.",
        )
    if cfg["colocate"] and "--rollout-num-gpus" in cfg.given and cfg.origin("rollout_num_gpus").startswith("derived"):
        given = cfg.given.get("--rollout-num-gpus", ["?"])[0]
        return Finding(
            id="colocate-rollout-gpus-overridden",
            severity="info",
            title="--rollout-num-gpus is overridden by --colocate",
            flags=["--colocate", f"--rollout-num-gpus {given}"],
            mechanism=f"With --colocate slime sets rollout-num-gpus to the actor GPUs ({world}). The value given "
            "is ignored.",
            fix="drop --rollout-num-gpus (or set it to the actor GPUs).",
        )
    return None

"""The catalogue's causes for a job that is not slime's: what that framework's own code at its release does with each.

slime's rules are slime's code (its loss, its rollouts); another framework gets its own: verl's and OpenRLHF's loss
code read release by release (facts.peer_code: an exp before or after its clamp, file:line), Megatron-LM's
pretraining loss (cross-entropy, no log-ratio), and for the frameworks whose loss code nanscope does not read, the
causes undecided. The causes real reports had (launch.reported) and the faults in the model are the same for all.

    peer_candidates(framework, view, traceback, layout=(pp, cp))
"""

from __future__ import annotations

from nanscope.causes import catalogue
from nanscope.causes.neutral import neutral
from nanscope.facts import frameworks, peer_code
from nanscope.launch.candidates import FP16_OVERFLOW, Candidate, judged, reported_candidates, seen_in, unflagged
from nanscope.launch.evidence import Framework
from nanscope.launch.flagview import FlagView
from nanscope.launch.other_stacks import without_megatron
from nanscope.launch.reported import Context
from nanscope.launch.run_kind import RunKind
from nanscope.launch.status import ENABLED, RULED_OUT, STATUSES, UNDECIDABLE

_LOSS = ("kl-exp-overflow", "logprob-drift", "ratio-exp-overflow")
_READ = (frameworks.VERL, frameworks.OPENRLHF)  # the frameworks whose loss code facts.peer_code reads


def peer_candidates(
    framework: Framework,
    view: FlagView | None,
    traceback,
    pp: int | None = None,
    cp: int | None = None,
    core: str | None = "",
    kind: RunKind | None = None,
) -> list[Candidate]:
    """Every catalogued and reported cause for a `framework` job (`view`: its launch's flags, None without one;
    `core`: what points to megatron-core, None: nothing, and its own causes are not offered; `kind`: what the launch
    trains, where it says: a run without rollouts gets none of the batch causes)."""
    out = []
    for hazard in catalogue.CATALOGUE:
        weighed = (*frameworks.WITH_ROLLOUTS, frameworks.MEGATRON_LM, frameworks.PAI)  # the latter: ruled out, said why
        if hazard is catalogue.HEALTHY or (framework.name not in weighed and hazard.level == "batch"):
            continue  # a job nothing names, or a pretraining stack's, is not known to have a policy loss or rollouts
        if hazard.level == "batch" and kind is not None and not kind.rollouts:
            # SFT, pretraining, DPO, a reward model: no rollouts, rollout log-probs or reward function
            out.append(judged(hazard, RULED_OUT, [f"{kind.how}: {kind.words()}"], None, None))
            continue
        if hazard.name in _LOSS:
            status, evidence = _loss(framework, hazard.name, view)
        elif hazard.level == "batch":
            status, evidence = _rollouts(framework)
        elif framework.name == frameworks.OPENRLHF and hazard.name.startswith("moe-"):
            status, evidence = RULED_OUT, ["OpenRLHF runs Hugging Face models under DeepSpeed: no megatron-core router"]
        else:
            status, evidence = UNDECIDABLE, _model_flags(hazard, view) or [unflagged(hazard)]
        if view is None and status == ENABLED:
            status, evidence = UNDECIDABLE, ["no launch script: the flags that decide it are unknown", *evidence]
        out.append(judged(hazard, status, evidence, traceback if status != RULED_OUT else None, None))
    known = framework.name in (frameworks.MEGATRON_LM, frameworks.PAI)  # Megatron's argparse defaults: off
    context = Context(framework.name, view or FlagView(), pp, cp, defaults_known=known, script=view is not None,
                      **seen_in(traceback))  # fmt: skip
    out += reported_candidates(context, traceback, script=view is not None)
    neutral(out)
    out = without_megatron(out, framework.name, core)
    return sorted(out, key=lambda candidate: STATUSES.index(candidate.status))


def _model_flags(hazard, view: FlagView | None) -> list[str]:
    """What the launch's flags say of a fault in the model: those of the hazard's flags it gives (each a single flag,
    not off, not 0: they switch on what the cause needs), and --fp16's overflow at 65504 for activation-overflow."""
    if view is None:
        return []
    given = [view.show(entry) for entry in hazard.flags if " " not in entry and view.has(entry) and not view.off(entry)
             and view.number(entry) != 0]  # fmt: skip
    said = [f"{', '.join(given)}: given, which switches on what this cause needs; no flag says whether it fired"]
    activation = hazard.name == "activation-overflow"
    amp = activation and (view.value("--amp-opt-level") or "").upper() in ("O1", "O2", "O3")  # apex amp: fp16
    fp16 = "--fp16" if activation and view.on("--fp16") else "--amp-opt-level" if amp else None
    halves = [f"{view.show(fp16)}: {FP16_OVERFLOW} in fp16; no flag says whether one was"] if fp16 else []
    return (said if given else []) + halves


def _rollouts(framework: Framework) -> tuple[str, list[str]]:
    if framework.name in (frameworks.MEGATRON_LM, frameworks.PAI):
        return RULED_OUT, [f"{framework.name} pretrains or fine-tunes: no rollouts, rewards or log-prob passes"]
    return UNDECIDABLE, [f"{framework.name}'s rollout, reward and log-prob code is not read by nanscope"]


def _loss(framework: Framework, cause: str, view: FlagView | None) -> tuple[str, list[str]]:
    """The loss-numerics hazards: an exp of a log-ratio before its clamp, in the framework's code at its release."""
    if framework.name in (frameworks.MEGATRON_LM, frameworks.PAI):
        return RULED_OUT, [f"{framework.name}'s loss is a masked cross-entropy (pretrain_gpt.py loss_func): no exp of "
                           "a log-ratio"]  # fmt: skip
    if framework.name not in _READ:
        return UNDECIDABLE, [f"{framework.name}'s loss code is not read by nanscope"]
    runs = _runs(framework.name, cause, view or FlagView())
    if runs is not None and not runs[0]:
        return RULED_OUT, runs[1]
    flags = [] if runs is None else runs[1]
    spans = [defect for defect in peer_code.defects(framework.name, cause) if _applies(defect, cause, view)]
    if framework.release is not None:
        here = [defect for defect in spans if peer_code.in_span(defect, framework.release)]
        present = [defect for defect in here if defect.present]
        if present:
            return ENABLED, flags + [f"{framework.name} {framework.release}: {defect.where}" for defect in present]
        return RULED_OUT, flags + [f"{framework.name} {framework.release}: {defect.where}" for defect in here]
    said = [f"{_span(defect)}: {defect.where}" for defect in spans]
    if all(defect.present for defect in spans):
        return ENABLED, flags + said
    return UNDECIDABLE, flags + said + ["the release decides it: name it (the image or pip pin in the script)"]


def _span(defect: peer_code.Defect) -> str:
    first, last = defect.first or "the oldest read", defect.last or "the newest read"
    return f"{defect.framework} {first} .. {last}"


def _applies(defect: peer_code.Defect, cause: str, view: FlagView | None) -> bool:
    """verl's clip_cov / kl_cov loss modes take their own exp: the defect for the loss mode the launch runs."""
    if defect.framework != frameworks.VERL or cause != "ratio-exp-overflow":
        return True
    mode = (view.value("--loss-mode") if view is not None else None) or "vanilla"
    special = mode in ("clip_cov", "kl_cov", "clip-cov", "kl-cov")
    return ("clip_cov" in defect.when) == special


def _runs(framework: str, cause: str, view: FlagView) -> tuple[bool, list[str]] | None:
    """Whether the launch's flags run the code the cause lives in: (runs, the flags); None when not decided."""
    if cause == "ratio-exp-overflow":
        return True, []
    if framework == frameworks.VERL:
        kl_type = view.value("--kl-loss-type") or "low_var_kl"
        if not view.on("--use-kl-loss"):
            return False, [
                "actor_rollout_ref.actor.use_kl_loss not set (verl's default False, actor.yaml:103 at v0.9.0)"
            ]
        if kl_type not in ("low_var_kl", "k3"):
            return False, [view.show("--kl-loss-type") + ": no exp in the KL estimator"]
        return True, [view.show("--use-kl-loss"), view.show("--kl-loss-type") if view.has("--kl-loss-type") else
                      "kl_loss_type low_var_kl (verl's default, actor.yaml:116 at v0.9.0)"]  # fmt: skip
    if not (view.on("--use-kl-loss") or view.on("--use-loss")):
        return False, ["--use_kl_loss not set: OpenRLHF's KL only enters the reward, with no gradient through its exp"]
    estimator = view.value("--kl-estimator") or view.value("--estimator") or "k1"
    if estimator != "k3":
        return False, [f"--kl_estimator {estimator} (OpenRLHF's default k1): no exp in the KL estimator"]
    shown = view.show("--kl-estimator") if view.has("--kl-estimator") else view.show("--estimator")
    return True, [view.show("--use-kl-loss") if view.has("--use-kl-loss") else view.show("--use-loss"), shown]

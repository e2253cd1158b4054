"""A differential diagnosis from a launch: every catalogued cause, ruled out, enabled or undecidable by the flags.

`found NaN in local grad norm for bucket #0` has many causes. For each hazard of `nanscope.hazards` (and
each cause slime is immune to) this module says what the resolved flags of the launch's release show:

    enabled      the flags switch the mechanism on (evidence: those flags)
    ruled-out    the flags, or slime's own code, exclude it (evidence: the flag, or file:line)
    undecidable  no flag decides it (a fault in the model, a custom function nanscope cannot read)

and, for each one not ruled out, the single cheapest observation that confirms or excludes it (the
hazard record's `discriminator`). A parsed traceback adds what its check's message says
(`facts.megatron.CHECKS`): a gradient norm NaN or Inf rules out a hazard that leaves slime v0.1.0's gradient
finite (unless a later release's flag routes it into the ratio: --use-rollout-logprobs); an unexpectedly
large, finite one rules out those that make it NaN or Inf (the check passes over them); Megatron-LM's
forward-loss checks rule out every hazard of slime's loss and rollouts (slime never runs that loop), and a
fault in the model that leaves the loss as it was. A message nanscope does not know rules nothing out.

Pure: `candidates(config, traceback=None)` -> [Candidate], enabled first, then undecidable, then ruled out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope.causes import catalogue, immune
from nanscope.causes.classes import HARDWARE
from nanscope.causes.neutral import neutral
from nanscope.facts import releases
from nanscope.facts.flags import BY_NAME, SCRIPT
from nanscope.facts.paths import HOOK_PATH
from nanscope.launch import moe
from nanscope.launch.config import Config
from nanscope.launch.flagview import FlagView
from nanscope.launch.other_stacks import token_free, without_megatron
from nanscope.launch.reported import Context, reported
from nanscope.launch.status import ENABLED, RULED_OUT, STATUSES, UNDECIDABLE


@dataclass
class Candidate:
    """One cause and what the launch says about it.

    Attributes:
        id: the hazard's (or immune cause's) name.
        status: one of STATUSES.
        evidence: the flags (as written) or code that decide the status, one per line.
        discriminator: the cheapest observation that tells it apart; None when ruled out.
        cause_class: its class (nanscope.trace.sentinels.classify.CLASSES).
    """

    id: str
    status: str
    evidence: list[str] = field(default_factory=list)
    discriminator: str | None = None
    cause_class: str | None = None

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "status": self.status,
            "evidence": list(self.evidence),
            "discriminator": self.discriminator,
            "class": self.cause_class,
        }


def candidates(cfg: Config, traceback=None) -> list[Candidate]:
    """Every catalogued cause with its status under `cfg` (and `traceback`, a launch.tracebacks.Traceback).

    Args:
        cfg: the resolved launch (launch.config.resolve).
        traceback: the parsed traceback, if one was given: its failure means the gradient was non-finite.
    """
    out = []
    for hazard in catalogue.CATALOGUE:
        if hazard is catalogue.HEALTHY:
            continue
        status, evidence = _status(hazard, cfg)
        out.append(judged(hazard, status, evidence, traceback, cfg))
    for cause in immune.IMMUNE:
        evidence = [f"slime {cfg.release} is immune: {cause.why}", *cause.evidence]
        out.append(Candidate(cause.name, RULED_OUT, evidence, None, cause.cause_class))
    view = FlagView(cfg.given, {flag: " ".join([flag, *words]) for flag, words in cfg.given.items()})
    context = Context(
        "slime",
        view,
        pp=cfg["pipeline_model_parallel_size"],
        cp=cfg["context_parallel_size"],
        core=core_of(traceback),
        unread=bool(cfg.unread),
    )
    out += reported_candidates(context, traceback)
    return sorted(out, key=lambda candidate: STATUSES.index(candidate.status))


def core_of(traceback) -> tuple[str, ...] | None:
    """The megatron-core releases the traceback fits: its frames' lines, else its error line's form."""
    if traceback is None:
        return None
    if traceback.evidence.core_releases:
        return traceback.evidence.core_releases
    failure = traceback.failure
    return failure.releases if failure is not None and failure.releases else None


def seen_in(traceback) -> dict:
    """What a traceback or log (launch.tracebacks.Traceback; None: none given) tells the reported causes' rules
    (launch.reported.Context's fields)."""
    if traceback is None:
        return {"core": None}
    return {
        "core": core_of(traceback),
        "started": traceback.nonfinite.metrics.started,
        "loaded": traceback.metrics.loaded(),
        "loaded_then": traceback.loaded_then(),
        "versions": tuple(traceback.versions),
        "overlap_off": traceback.evidence.overlap_off,
    }


def reported_candidates(context: Context, traceback, script: bool = True) -> list[Candidate]:
    """The causes real reports had (launch.reported), the rerun verdict applied (`script` False: no flag read, so no
    flag enables one)."""
    out = []
    failure = None if traceback is None else traceback.failure
    for cause, status, evidence in reported(context):
        if not script and status == ENABLED:
            status, evidence = UNDECIDABLE, ["no launch script: the flags that decide it are unknown"]
        check = None if failure is None else failure.check
        if check is not None and status != RULED_OUT and check.value not in cause.makes:
            found = "a finite value, unexpectedly large" if check.value == "large" else check.value
            status, evidence = (
                RULED_OUT,
                evidence + [f"the traceback's check found {found}; this cause makes only {' or '.join(cause.makes)}"],
            )
        rerun = None if traceback is None else traceback.rerun
        if rerun is not None and status != RULED_OUT:
            status, evidence = _by_verdict(cause, rerun, status, evidence)
        discriminator = None if status == RULED_OUT else cause.discriminator
        out.append(Candidate(cause.name, status, [*evidence, *cause.evidence], discriminator, cause.cause_class))
    return out


def without_flags(traceback, framework, release, core: str | None = "") -> list[Candidate]:
    """The catalogued causes a traceback alone leaves: no flag decides any, its check and verdict rule some out.

    Only a slime job gets slime's hazards (its loss, its rollouts) and the causes slime is immune to; any other
    framework, or none named, gets the causes that live in the model, the kernels and the devices; megatron-core's
    own causes only where `core` (launch.core_evidence) says what points to it.
    """
    slime = framework.name == "slime"
    out = []
    for hazard in catalogue.CATALOGUE:
        if hazard is catalogue.HEALTHY or (not slime and hazard.level == "batch"):
            continue
        evidence = ["no launch script: the flags that decide it are unknown"]
        out.append(judged(hazard, UNDECIDABLE, evidence, traceback, None))
    if slime:
        key = release.release.key if release is not None else "(release unknown)"
        for cause in immune.IMMUNE:
            evidence = [f"slime {key} is immune: {cause.why}", *cause.evidence]
            out.append(Candidate(cause.name, RULED_OUT, evidence, None, cause.cause_class))
    context = Context(framework.name, FlagView(), None, None, defaults_known=False, script=False, **seen_in(traceback))
    out += reported_candidates(context, traceback, script=False)
    if not slime:
        neutral(out)
    out = token_free(without_megatron(out, framework.name, core), framework.stack)
    return sorted(out, key=lambda candidate: STATUSES.index(candidate.status))


def judged(hazard, status: str, evidence: list[str], traceback, cfg: Config | None) -> Candidate:
    """The hazard's candidate once the traceback's check and the rerun verdict have had their say."""
    failure = None if traceback is None else traceback.failure
    misfit = None if failure is None or status == RULED_OUT else _misfit(hazard, failure, cfg)
    if misfit is not None:
        status, evidence = RULED_OUT, evidence + [misfit]
    rerun = None if traceback is None else traceback.rerun
    if rerun is not None and status != RULED_OUT:
        status, evidence = _by_verdict(hazard, rerun, status, evidence)
    discriminator = None if status == RULED_OUT else hazard.discriminator
    return Candidate(hazard.name, status, evidence, discriminator, hazard.cause_class)


def _by_verdict(hazard, rerun, status: str, evidence: list[str]) -> tuple[str, list[str]]:
    """What the rerun state machine's verdict says: not reproducible means the device; reproducible, not a one-off."""
    said = f"the rerun state machine's verdict ({rerun.rerun} rerun, line {rerun.line}): {rerun.means}"
    device = hazard.cause_class == HARDWARE
    if rerun.verdict in ("transient", "persistent-fault"):
        return (ENABLED, evidence + [said]) if device else (RULED_OUT, evidence + [said])
    if device and (rerun.verdict == "application" or getattr(hazard, "fault_once", False)):
        return RULED_OUT, evidence + [said]
    return status, evidence


def _misfit(hazard, failure, cfg: Config | None) -> str | None:
    """Why the traceback's check cannot have fired on `hazard` (None: it can), by what its message says."""
    check = failure.check
    if check is None:  # a message nanscope does not know: it says nothing about the hazard
        return None
    if not check.slime and hazard.level == "batch":
        where = "the loss of Megatron-LM's own training loop" if check.quantity == "loss" else "Megatron-LM's optimizer"
        return (
            f"the traceback's check is Megatron-LM's ({check.source}), on {where}, which slime never runs: this "
            "hazard lives in slime's loss or rollouts"
        )
    if check.quantity == "loss":
        finite = hazard.loss_finite
        if check.value == "large":
            return f"the traceback's check found a finite spiky loss; this fault {_makes(finite, 'loss')}"
        if finite:
            return f"the traceback's check found {check.value} in the forward loss; this fault leaves the loss finite"
        return None
    # A shifted rollout log-prob only reaches a clamped TIS weight, unless it is the ratio's old policy.
    shifted_as_old = hazard is catalogue.ROLLOUT_LOGPROB_SHIFT and (cfg is None or cfg.get("use_rollout_logprobs"))
    finite = hazard.grad_finite and not shifted_as_old
    if check.value == "large":
        if finite:
            return None
        return (
            "the traceback's check found a finite gradient norm, unexpectedly large (--check-for-large-grads); "
            "this hazard makes slime v0.1.0's gradient NaN or Inf, which that check passes over "
            "(rerun_state_machine.py:703-706)"
        )
    if finite:
        return (
            f"the traceback's check found {check.value} in a gradient; this hazard "
            "leaves slime v0.1.0's gradient finite (`nanscope hazards`)"
        )
    return None


def _makes(finite: bool, what: str) -> str:
    """Why a finite, large value rules a cause out: it leaves `what` as it is, or makes it non-finite."""
    if finite:
        return f"leaves the {what} finite and as it was"
    return f"makes the {what} NaN or Inf, which the check passes over (rerun_state_machine.py:703-706)"


# metric -> the causes an excursion of it supports (first: at the first step logged; later: after it)
_METRIC_CAUSES = {
    "grad_norm": (("bad-checkpoint-resume", "sp-new-architecture", "library-regression"),
                  ("activation-overflow", "backward-only-fault", "library-regression")),
    "train_rollout_logprob_abs_diff": (("bad-checkpoint-resume", "rollout-logprob-shift", "nan-rollout-logprob"),
                                       ("rollout-logprob-shift", "nan-rollout-logprob", "ratio-exp-overflow")),
    "kl": (("kl-exp-overflow", "logprob-drift"), ("kl-exp-overflow", "logprob-drift")),
}  # fmt: skip


def with_metrics(found: list[Candidate], metrics, excursions=None) -> None:
    """Each metric's first step out of its range (launch.metrics; `excursions`: those to say, default all) as
    evidence for the causes that make it."""
    for excursion in metrics.excursions.values() if excursions is None else excursions:
        if excursion.metric not in _METRIC_CAUSES:
            continue
        first = excursion.step is not None and excursion.step == metrics.first_step
        names = _METRIC_CAUSES[excursion.metric][0 if first else 1]
        said = "the metrics: " + excursion.text() + (", the first step logged" if first else "")
        loaded = metrics.after_load(excursion)
        if loaded:
            said += f", after the checkpoint load the log names at line {metrics.load_line}"
            names = (*names, "bad-checkpoint-resume")
        for candidate in found:
            if candidate.id in names and candidate.status != RULED_OUT:
                candidate.evidence.append(said)


# the first non-finite metric's kind (by its key's last part) -> the causes it supports
_NONFINITE_CAUSES = {
    "grad_norm": ("backward-only-fault", "activation-overflow"), "grad norm": ("backward-only-fault", "activation-overflow"),
    "kl": ("kl-exp-overflow", "logprob-drift"), "ppo_kl": ("ratio-exp-overflow", "logprob-drift"),
    "reward": ("nan-reward",), "reward_std": ("nan-reward",), "loss": ("activation-overflow",),
    "lm loss": ("activation-overflow",),
}  # fmt: skip


def with_evidence(found: list[Candidate], traceback) -> None:
    """Another stack's evidence line (facts.signals) and the first non-finite metric line as evidence for the causes
    each supports."""
    failure = traceback.failure
    signal = None if failure is None else failure.signal
    said: list[tuple[tuple[str, ...], str]] = []
    if signal is not None:
        said.append((signal.causes, f"the log's {signal.id} line {failure.line}: {signal.means}"))
    reading = traceback.nonfinite.metrics.first
    if reading is not None:
        names = tuple(
            cause for key, _ in reading.values for cause in _NONFINITE_CAUSES.get(key.lower().rsplit("/", 1)[-1], ())
        )
        at = traceback.nonfinite.first_bound()  # the input's first record: an earlier step too
        step = f"{at} step {reading.printed or reading.step}" if at is not None else f"at line {reading.line}"
        said.append((names, f"the metrics: {reading.metric} non-finite first {step}: {reading.points_to}"))
    for names, text in said:
        for candidate in found:
            if candidate.id in names and candidate.status != RULED_OUT and text not in candidate.evidence:
                candidate.evidence.append(text)


def remaining(found: list[Candidate]) -> list[Candidate]:
    """The candidates not ruled out (the differential the verdict must not collapse to one)."""
    return [candidate for candidate in found if candidate.status != RULED_OUT]


def _status(hazard, cfg: Config) -> tuple[str, list[str]]:
    """(status, evidence) for one hazard: the loss in use first, then the hazard's own rule."""
    if hazard.level == "batch" and hazard.safe_finite:
        loss = _custom_loss(cfg)
        if loss is not None:
            return loss
    return _RULES[hazard.name](cfg)


def _custom_loss(cfg: Config) -> tuple[str, list[str]] | None:
    """A loss other than slime's decides each hazard the nanscope loss fixes: out with nanscope's, unknown otherwise."""
    if cfg["loss_type"] == "policy_loss":
        return None
    path = cfg["custom_loss_function_path"] or ""
    flags = [cfg.flag_text("loss_type"), cfg.flag_text("custom_loss_function_path")]
    if path.startswith("nanscope."):
        return RULED_OUT, flags + ["the nanscope loss is finite on this hazard (`nanscope hazards --loss safe`)"]
    return UNDECIDABLE, flags + ["a custom loss nanscope cannot read: the mechanism depends on its code"]


def _kl(cfg: Config) -> tuple[str, list[str]]:
    if not cfg["use_kl_loss"]:
        return RULED_OUT, [cfg.flag_text("use_kl_loss") + ": slime computes no KL term"]
    if cfg["kl_loss_type"] in ("kl", "k1", "k2"):
        default = f" (slime {cfg.release}'s default)" if cfg.origin("kl_loss_type") != SCRIPT else ""
        return RULED_OUT, [cfg.flag_text("kl_loss_type") + f"{default}: no exp in the KL estimator"]
    zero = " (the term stays in the graph at coefficient 0)" if cfg["kl_loss_coef"] == 0 else ""
    return ENABLED, [
        "--use-kl-loss",
        cfg.flag_text("kl_loss_type") + ": exp before the clamp",
        cfg.flag_text("kl_loss_coef") + zero,
    ]


def _ratio(cfg: Config) -> tuple[str, list[str]]:
    evidence = [
        cfg.flag_text("loss_type") + ": exp(log-ratio) before the eps-clip",
        cfg.flag_text("eps_clip"),
        cfg.flag_text("eps_clip_high"),
    ]
    if cfg.get("use_unbiased_kl") and cfg["use_kl_loss"]:
        evidence.append("--use-unbiased-kl: exp(log-ratio) again, unclamped, in the KL term")
    if cfg.get("use_rollout_logprobs"):
        evidence.append(
            "--use-rollout-logprobs: the old log-probs are the rollout's, so a rollout log-prob off by "
            "more than 88.72 is enough"
        )
        return ENABLED, evidence
    rbs, n, gbs = cfg["rollout_batch_size"], cfg["n_samples_per_prompt"], cfg["global_batch_size"]
    if rbs and gbs and rbs * n // gbs == 1:
        evidence.append(
            f"{rbs} x {n} / {gbs} = 1 optimizer step per rollout: the log-prob pass and the training "
            "forward use the same weights, so only a forward that differs between them (a model fault) "
            "moves the log-ratio past 88.72"
        )
    return ENABLED, evidence


# The flags that route rollout_log_probs into the loss (those the release defines): the TIS weight under
# --use-tis, and from v0.2.4 under --get-mismatch-metrics too (loss.py:712), or the ratio's old policy
# under --use-rollout-logprobs (loss.py:644).
_ROUTES = ("use_tis", "get_mismatch_metrics", "use_rollout_logprobs")


def _tis_input(cfg: Config) -> tuple[str, list[str]] | None:
    routes = [name for name in _ROUTES if name in cfg.values]
    if any(cfg[name] for name in routes):
        return None
    flags = ", ".join(cfg.flag_text(name) for name in routes)
    return RULED_OUT, [f"{flags}: slime {cfg.release}'s loss " + _reads_rollout(cfg)]


def _reads_rollout(cfg: Config) -> str:
    """What the release's loss does with rollout_log_probs when no route flag is on (its loss API's record)."""
    if releases.BY_KEY[cfg.release].loss_api.rollout_always_read:
        return "reads rollout_log_probs only into a detached metric (train_rollout_logprob_abs_diff)"
    return "never reads rollout_log_probs"


def _rollout_source(cfg: Config) -> str:
    custom = cfg["custom_generate_function_path"]
    return cfg.flag_text("custom_generate_function_path") if custom else "rollout log-probs from SGLang"


def _nan_rollout_logprob(cfg: Config) -> tuple[str, list[str]]:
    how = {
        "use_tis": "--use-tis: clamp(exp(old - rollout)) passes NaN",
        "get_mismatch_metrics": f"--get-mismatch-metrics: slime {cfg.release} applies the TIS weight "
        "clamp(exp(old - rollout)), which passes NaN",
        "use_rollout_logprobs": "--use-rollout-logprobs: a NaN rollout log-prob is the ratio's old log-prob",
    }
    return _tis_input(cfg) or (ENABLED, [how[name] for name in _ROUTES if cfg.get(name)] + [_rollout_source(cfg)])


def _logprob_shift(cfg: Config) -> tuple[str, list[str]]:
    tis = [BY_NAME[name].spelling for name in ("use_tis", "get_mismatch_metrics") if cfg.get(name)]
    evidence = [f"{' and '.join(tis)}: misaligned rollout log-probs reach the TIS weight"] if tis else []
    if cfg.get("use_rollout_logprobs"):
        evidence.append("--use-rollout-logprobs: misaligned rollout log-probs are the ratio's old log-probs")
    else:
        evidence.append(f"through slime {cfg.release}'s loss the gradient stays finite: the tis metric shows it")
    return _tis_input(cfg) or (ENABLED, [*evidence[:1], _rollout_source(cfg), *evidence[1:]])


def _reward(cfg: Config) -> tuple[str, list[str]]:
    if cfg["custom_rm_path"]:
        return ENABLED, [
            cfg.flag_text("custom_rm_path"),
            cfg.flag_text("advantage_estimator"),
            cfg.flag_text("n_samples_per_prompt") + ": one NaN reward poisons its group",
        ]
    open_ends = []
    if (cfg["rm_type"] or "").removeprefix("boxed_") == "remote_rm":
        open_ends.append(cfg.flag_text("rm_type") + ": the remote reward model's JSON may hold NaN")
    if cfg["rollout_function_path"] != BY_NAME["rollout_function_path"].default:
        open_ends.append(cfg.flag_text("rollout_function_path") + ": a custom rollout function sets the rewards")
    if "--custom-reward-post-process-path" in cfg.given:
        open_ends.append("--custom-reward-post-process-path: a custom function computes the advantages' rewards")
    if open_ends:
        return UNDECIDABLE, open_ends
    return RULED_OUT, [cfg.flag_text("rm_type") + ": slime's built-in rule-based reward returns finite values"]


def _temperature(cfg: Config) -> tuple[str, list[str]]:
    if cfg["rollout_temperature"] == 0:
        return ENABLED, [cfg.flag_text("rollout_temperature") + ": the logits are divided by 0"]
    return RULED_OUT, [cfg.flag_text("rollout_temperature") + ": not 0"]


MODEL_FAULT = "a fault in the model: no flag enables or excludes it"
FP16_OVERFLOW = "an activation past 65504 is inf"  # fp16's largest finite value: what --fp16 lets an activation reach
DEVICE_FAULT = "a device that computed a wrong value once: no flag enables or excludes it"


def unflagged(hazard) -> str:
    """Why no flag decides a fault in the model or the device (catalogue.Hazard), in words."""
    return DEVICE_FAULT if hazard.cause_class == HARDWARE else MODEL_FAULT


def _model(cfg: Config) -> tuple[str, list[str]]:
    evidence = [MODEL_FAULT]
    if "--fp16" in cfg.given:
        evidence.append(f"--fp16: {FP16_OVERFLOW}")
    return UNDECIDABLE, evidence


def _hardware(cfg: Config) -> tuple[str, list[str]]:
    evidence = [DEVICE_FAULT]
    if cfg.get("custom_megatron_before_train_step_hook_path") == HOOK_PATH:
        evidence.append(f"{HOOK_PATH} is installed: its rerun verdict (NANSCOPE_RERUN, default on) decides it")
    return UNDECIDABLE, evidence


_RULES = {
    catalogue.KL_EXP_OVERFLOW.name: _kl,
    catalogue.RATIO_EXP_OVERFLOW.name: _ratio,
    catalogue.NAN_ROLLOUT_LOGPROB.name: _nan_rollout_logprob,
    catalogue.NAN_REWARD.name: _reward,
    catalogue.ZERO_TEMPERATURE.name: _temperature,
    catalogue.ROLLOUT_LOGPROB_SHIFT.name: _logprob_shift,
    catalogue.ACTIVATION_OVERFLOW.name: _model,
    catalogue.BACKWARD_ONLY_FAULT.name: _model,
    catalogue.TRANSIENT_FAULT.name: _hardware,
    catalogue.LOGPROB_DRIFT.name: _kl,  # the same exp as kl-exp-overflow, reached step by step
    catalogue.MOE_AUX_LOSS.name: moe.aux_loss,
    catalogue.MOE_ZERO_TOKEN_EXPERT.name: moe.zero_token_expert,
    catalogue.MOE_ROUTER_LOGITS.name: moe.router_logits,
}

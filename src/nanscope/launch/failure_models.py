"""The model an error or an evidence line points to when no metric line names one (issue 41, round 10):

    ValueError: loss=nan, policy_loss=nan, entropy_loss=nan, advantage_loss=nan     the keys it names: the policy
    probability tensor contains either `inf`, `nan` or element < 0  (frames through swift/cli/rlhf.py)
                                                                                   an RL trainer samples its policy

    keys = message_keys(message)                 # the keys it gives NaN or Inf values, in order
    model, why = message_model(message)          # the one model the message's non-finite keys name, or None
    model, why = sampling_model(signal_id, frames, framework)   # the policy, for a sampling assert in an RL run
    model, why = step_model(frames)              # a frame of one model's step (`train_generator_step`), or None
    with_run_kind(summary, failure, kind)        # the same, where the launch script says the run is RL

Each regex runs on a bounded window with bounded repeats only: linear in the line.
"""

from __future__ import annotations

import re

from nanscope.facts.metric_names import NAME_MODELS
from nanscope.launch.error_words import WINDOW
from nanscope.launch.metric_points import model_of

# an error message's `key=nan` / `key: inf` pairs (error_words reads the first; here all of them)
_PAIRS = re.compile(
    r"(?<![\w./-])(?P<key>[A-Za-z_][\w./-]{0,80})\s{0,3}[=:]\s{0,3}['\"]?[-+]?(?:nan|inf(?:inity)?)(?![\w.])",
    re.IGNORECASE,
)
# a frame's path or function that is an RL trainer's (ms-swift's `swift rlhf` entry swift/cli/rlhf.py and
# swift/llm/train/rlhf.py:rlhf_main; TRL's trl/trainer/{grpo,ppo,rloo,online_dpo}_trainer.py; verl's and OpenRLHF's
# packages): the run generates from its policy while it trains
_RL_PART = re.compile(r"(?:^|[/\\_.])(?P<word>rlhf|grpo|ppo|rloo|dapo|gspo|online_dpo|verl|openrlhf)(?:[/\\_.]|$)")
_RL_STACKS = ("verl", "openrlhf", "slime", "rlinf")
# an RL trainer's generation in code pasted before a sampling error (shibing624/MedicalGPT#440, holdout16 03: TRL's
# legacy `response_tensors = ppo_trainer.generate(question_tensors, ...)`, then the multinomial's RuntimeError)
_RL_CALL = re.compile(
    r"\b(?P<call>(?:[A-Za-z0-9]{1,40}_)?(?:ppo|grpo|rloo|rlhf)(?:_\w{1,40})?\.(?:generate|sample))\s{0,4}\(",
    re.IGNORECASE,
)  # a name whose part is the RL word (`ppo_trainer`, `grpo`), never a word that holds it (`support_model`)
# a function named for one model's step: `train_<model>_step`, `<model>_step`, `train_<model>` (gigagan-pytorch's
# GigaGAN.train_generator_step / train_discriminator_step, lucidrains/gigagan-pytorch 0.2.x gigagan_pytorch.py); the
# word must be one NAME_MODELS knows; `train_step`, `forward` name none
_STEP = re.compile(r"(?:train_(?P<a>[a-z]{1,20})(?:_step)?|(?P<b>[a-z]{1,20})_step)")
CALL_REACH = 8  # lines of pasted code looked at before the error
_SAMPLING = ("probability-assert",)  # torch.multinomial's assert: the sampled model's probabilities


def message_keys(message: str | None) -> list[str]:
    """The keys an error's message gives NaN or Inf values, in order (`loss=nan, policy_loss=nan`)."""
    return [match["key"].rstrip(".") for match in _PAIRS.finditer(message or "", 0, WINDOW)]


def message_model(message: str | None) -> tuple[str, str] | None:
    """The one model whose keys an error's message gives non-finite values (`policy_loss=nan`: the policy), and
    why; None: no key names a model, or keys of several models."""
    keys = message_keys(message)
    model = model_of(keys, {key.lower() for key in keys}) if keys else None
    if model is None:
        return None
    named = next(key for key in keys if model_of([key], set()) == model)
    return model, f"the error's message names {named} non-finite"


_REFERENCE = re.compile(r"\b(?:model_ref|ref_model|reference_model|ref_policy)\b")


def rl_call(lines: list[str]) -> str | None:
    """The RL trainer's generation call in code lines pasted before an error (`ppo_trainer.generate`), or None."""
    for line in reversed(lines[-CALL_REACH:]):
        match = _RL_CALL.search(line[:400])
        if match is not None:
            return match["call"]
    return None


def sampling_model(
    signal_id: str | None, frames, framework: str | None, caller: str | None = None
) -> tuple[str, str] | None:
    """The policy, where sampling's assert fired in an RL run (its frames pass through an RL trainer, or the stack is
    one that trains only RL): the probabilities sampled from are the policy's, generating its rollout; None: not a
    sampling assert, or nothing says the run is RL (a supervised run samples only to evaluate)."""
    if signal_id not in _SAMPLING:
        return None
    for frame in frames:  # a frame's code hands the reference model to the sampling (`respond(model_ref, ...)`)
        named = _REFERENCE.search((getattr(frame, "code", "") or "")[:400])
        if named is not None:
            return "reference", f"a frame's code samples from {named[0]} ({frame.function}, line {frame.line})"
    if caller is not None:
        return "policy", f"the code pasted before it calls {caller}: an RL trainer's generation samples its policy"
    if framework in _RL_STACKS:
        return "policy", f"{framework} trains by RL: what it samples from while training is its policy's rollout"
    for frame in frames:
        path = frame.path.replace("\\", "/").lower()
        match = _RL_PART.search(path[-200:]) or _RL_PART.search(frame.function.lower()[:80])
        if match is not None:
            where = path.rsplit("/", 2)
            shown = "/".join(where[-2:]) if len(where) > 1 else path
            return ("policy", f"its frames pass through an RL trainer ({shown}:{frame.line} {frame.function}): what it "
                    "samples from while training is its policy's rollout")  # fmt: skip
    return None


def step_model(frames) -> tuple[str, str] | None:
    """The model whose step the innermost frame named for one runs (`train_generator_step`: the generator), and
    why; None: no frame's function is named for one model's step."""
    for frame in reversed(frames):
        match = _STEP.fullmatch(frame.function.lower()[:60])
        model = NAME_MODELS.get(match["a"] or match["b"]) if match is not None else None
        if model is not None:
            return (
                model,
                f"its traceback passes through {frame.function} ({frame.path}:{frame.line}), the {model}'s step",
            )
    return None


def with_run_kind(summary, failure, kind) -> None:
    """Name the policy in `summary` (launch.summary.Summary) for a sampling assert where the launch script says the
    run is RL (launch.run_kind: `swift rlhf --rlhf_type grpo`) and nothing else named a model."""
    if summary is None or summary.model is not None or kind is None or failure is None:
        return
    if kind.kind == "reward-model":  # the one model the run trains
        summary.model, summary.model_from = "reward model", f"the launch trains a reward model ({kind.how})"
        return
    if not kind.rollouts:
        return
    if failure.signal is not None and failure.signal.id in _SAMPLING:
        summary.model = "policy"
        summary.model_from = (f"the launch is an RL run ({kind.how}): what it samples from while training is its "
                              "policy's rollout")  # fmt: skip

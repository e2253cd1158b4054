"""What a metric line's non-finite values point to: the model whose keys they are, and what the other values on the
line say (the critic with the actor finite, the backward pass with the loss finite, a progress bar's running mean
with the reduced loss finite: no failure by itself).

    model = model_of(["critic/vf_loss"], keys)                  # "critic"
    said = points_to(bad, finite, model)                        # one phrase
    finite = contradiction(bad, found)                          # the finite values that contradict a NaN, or None
"""

from __future__ import annotations

import math
import re

from nanscope.facts.metric_names import (
    BEFORE_UPDATE,
    KEY_MODELS,
    OPENRLHF_MARKS,
    OPENRLHF_SHORT,
    REWARDS,
    STATISTIC_WORDS,
    TRAINER_ZERO,
)
from nanscope.launch.line_shapes import AVERAGE
from nanscope.launch.line_steps import number  # a printed value as a float
from nanscope.launch.metrics import RANGES

# keys that say a preference (DPO) or an RL log: there the unprefixed loss and gradient are the policy's
_PREFERENCE = ("rewards/chosen", "logps/chosen", "logits/chosen", "rewards_train/chosen", "logps_train/chosen")
_RL = ("reward", "reward_std", "kl", "ppo_kl", "advantages", "returns", "completion_length", "act_loss")
_PRIMARY = ("loss", "grad_norm", "grad norm", "lm loss", "logps", "logp", "rewards", "act_loss", "pg_loss")


# A progress bar's `loss` (Lightning's running mean of the last training losses) and the reduced losses and
# gradient norms that, finite on the same line, show the training itself finite
_RUNNING = ("loss",)
_REDUCED = ("reduced_train_loss", "train_loss", "reduced_loss", "train/loss", "lm loss", "loss_step")
_NORMS = ("gradient_norm", "grad_norm", "grad norm")


def _number(value: str) -> float | None:
    try:
        return float(value.strip("'\""))
    except ValueError:
        return None


def contradiction(bad: list[tuple[str, str]], found: list[tuple[str, str, int]]) -> str | None:
    """The finite values on a line that contradict its non-finite ones: a progress bar's running-mean `loss` non-finite
    while the reduced loss (and the gradient norm) the same line prints are finite; None: nothing contradicts them."""
    if not bad or not all(key.lower() in _RUNNING for key, _ in bad):
        return None
    finite = [
        (key, value)
        for key, value, _ in found
        if key.lower() in _REDUCED + _NORMS and (number := _number(value)) is not None and math.isfinite(number)
    ]
    if not any(key.lower() in _REDUCED for key, _ in finite):
        return None
    return ", ".join(f"{key} {value}" for key, value in finite[:3])


# a reward model's outputs on a preference pair, as its trainer logs them (a DPO log names log-probs beside them)
_PAIRWISE = ("chosen reward", "reject reward", "rejected reward", "chosen rewards", "rejected rewards")


def _prefixed(low: str) -> tuple[str | None, str | None]:
    """The model a key's prefix names, at its start or after leading path parts (`train/actor/grad_norm`), or after
    a statistic's word (rsl-rl's `Mean value_function loss`: `Mean` is no model's)."""
    found = _prefix_of(low)
    first, _, rest = low.partition(" ")
    return _prefix_of(rest) if found[0] is None and first in STATISTIC_WORDS and rest else found


def _prefix_of(low: str) -> tuple[str | None, str | None]:
    parts = low.split("/")
    for i in range(len(parts)):
        rest = "/".join(parts[i:])
        prefix = next((prefix for prefix, _ in KEY_MODELS if rest.startswith(prefix)), None)
        if prefix is not None:
            return prefix, dict(KEY_MODELS)[prefix]
    return None, None


def model_of(bad: list[str], keys: set[str]) -> str | None:
    """The one model whose metrics went non-finite: a key's prefix (`actor/`, `critic/`, ...) names it; in a
    preference or RL log the unprefixed loss, gradient norm, log-probs and rewards are the policy's. None: several
    models, or only a logged statistic (kl, logits, clip ratios) that is no model's failure."""
    models = set()
    rl = any(key in keys for key in _PREFERENCE + _RL)
    preference = any(key in keys for key in _PREFERENCE) or any("logps" in key or "nll" in key for key in keys)
    for key in bad:
        low = key.lower()
        prefix, named = _prefixed(low)
        if prefix is None and OPENRLHF_MARKS <= keys:  # OpenRLHF's short postfix keys (`cri=nan`)
            named = OPENRLHF_SHORT.get(low, named)
            prefix = low if low in OPENRLHF_SHORT else None
        if prefix is None and not preference and low.replace("_", " ") in _PAIRWISE:
            named = "reward model"  # a pairwise reward model's scores of the chosen and rejected answers
        if prefix is None and rl and any(low.split("/")[0].startswith(word) for word in _PRIMARY):
            named = "policy"
        if named is not None:
            models.add(named)
    return models.pop() if len(models) == 1 else None


def _before_update(key: str) -> str | None:
    """What a metric computed from the rollout before the update is (facts.metric_names), or None."""
    low = key.lower()
    return next((what for part, what in BEFORE_UPDATE if part in low), None)


def _rewards_finite(found) -> list[str]:
    """The reward or score values a line prints finite (`rollout/rewards=0.00195`)."""
    return [
        f"{key} {value}"
        for key, value, _ in found or ()
        if any(part in key.lower() for part in REWARDS) and not _before_update(key)
        and (number := _number(value)) is not None and math.isfinite(number)
    ][:2]  # fmt: skip


STATISTIC_ONLY = (
    "a logged statistic only"  # a first reading no model's failure: a later loss or gradient norm is watched
)
# TRL's GRPO logs the mean of a logging window's per-step values (v0.16.0 trl/trainer/grpo_trainer.py:956), its kl
# the KL of the policy's and the reference model's per-token log-probs over the completions' tokens (:914-918,
# :937-939); transformers' Trainer logs a NaN step's loss as the mean before it (4.57.6 trainer.py:2677-2682), and its
# grad_norm is the window's last step's. Whether the loss took the same KL (beta, and how each release or Unsloth's
# patch counts its tokens), the line does not say.
WINDOW_KL = (
    "TRL's GRPO logs its metrics as means over the logging window's steps (trl v0.16.0 grpo_trainer.py:956), kl the "
    "KL of the policy's and the reference model's per-token log-probs over the completions' tokens (:914-918, "
    ":937-939): some step of the window had non-finite log-probs, or completions of no token (a mean over an empty "
    "set); the line's finite loss (transformers' Trainer logs a NaN step's loss as the mean before it: "
    "logging_nan_inf_filter) and gradient norm (the window's last step's) clear no step of the window but the last"
)
MODEL_VALUES = ("loss", "lm loss", "grad_norm", "grad norm")  # a model's own values (terms), not a statistic


def term(key: str) -> str:
    """A metric key's own term, lowered: its last `/` part, less a training split's word before it (`train_` as
    NeMo-Aligner's SFT bar puts it before each, `train_grad_norm`: NeMo-Aligner af2b3bd nemo_aligner/algorithms/
    supervised.py:244, :265; nanoGPT's `train loss`), in any stack's log."""
    return key.lower().rsplit("/", 1)[-1].removeprefix("train_").removeprefix("train ").removeprefix("training ")


def shared_input(models: set[str]) -> str:
    """Several models' losses non-finite in one logged record (`models`: their names, the actor and the critic among
    them): which went first it cannot say, and an input they share is likelier than one model's own update."""
    named = (
        "the actor's and the critic's"
        if models == {"actor", "critic"}
        else f"{len(models)} models' ({', '.join(sorted(models))})"
    )
    return (f"{named} losses at once: an input they share (the observations, the rewards, the advantages and "
            "returns, the rollout) more than one model's own update")  # fmt: skip


def points_to(
    bad: list[tuple[str, str]], finite: dict[str, float], model: str | None, found=None, *, trainer: bool = False
) -> str:
    """What the first non-finite metrics point to, from what else the line shows (`found`: all its pairs; `trainer`:
    the line is a transformers Trainer dict)."""
    if bad and bad[0][0].endswith(AVERAGE):
        return (f"the running average of {bad[0][0][: -len(AVERAGE)]} since the start is non-finite (the logger's "
                "`median (global_avg)`): a value went NaN or Inf at this iteration or at an earlier one it did not "
                "print, and the sum it averages stays so")  # fmt: skip
    before = _before_update(bad[0][0]) if bad and bad[0][1] != "missing" else None
    if before is not None:
        rewards = _rewards_finite(found)
        if rewards:
            return (f"{before}, computed from the rollout before the update, while the rewards are finite "
                    f"({', '.join(rewards)}): that computation (a normalisation over a group's rewards is 0/0 where "
                    "they are all equal and no epsilon guards the std), not the loss; the update's loss and gradient "
                    "follow")  # fmt: skip
        return (f"{before}, computed from the rollout before the update: the rewards or values they are computed "
                "from, not the loss; the update's loss and gradient follow")  # fmt: skip
    keys = [key.lower() for key, _ in bad]
    last = [term(key) for key in keys]
    loss_ok = any(term(k) in ("loss", "lm loss") and abs(v) > 0 for k, v in finite.items())
    grad_zero = any(term(k) in ("grad_norm", "grad norm") and v == 0.0 for k, v in finite.items())
    if any(value == "missing" for _, value in bad) and not any(k in ("grad_norm", "grad norm") for k in last):
        return ("a loss that was not printed: Megatron prints an average loss only when it is > 0, so it was NaN, "
                "<= 0, or every iteration of the interval was skipped; weak evidence alone")  # fmt: skip
    if any(value == "missing" for _, value in bad):
        return ("the backward pass or the loss: the gradient norm is non-finite and the line prints no loss (Megatron "
                "prints an average loss only when it is > 0, which NaN is not)")  # fmt: skip
    models = {model_of([key], set()) for key in keys}
    if {"actor", "critic"} <= models:
        return shared_input(models - {None})
    if model == "critic" and len(found or ()) <= len(bad):  # rsl-rl's block: a line of its own
        return ("the critic (the value model): its value loss went non-finite first in the block's order (its line "
                "holds no actor metric): the returns or values it is fit to, or its own update")  # fmt: skip
    if model == "critic":
        return ("the critic (the value model): its value loss or gradient went non-finite while the actor's metrics "
                "on the line are finite: the returns or values it is fit to, or its own update")  # fmt: skip
    grad_ok = any(term(k) in ("grad_norm", "grad norm") and v > 0 for k, v in finite.items())
    # a statistic beside a finite loss, or a finite gradient (a GRPO loss about 0 at every step: holdout20 07, 08)
    if all(key.startswith(("logits/", "clip_ratio/")) or term(key) in ("kl", "clip_ratio") for key in keys) and (
        loss_ok or grad_ok
    ):
        finite_said = "the loss" if loss_ok else "the gradient norm"
        if trainer and "kl" in last:  # TRL's GRPO: a window's mean, and a term of each step's loss
            return f"{STATISTIC_ONLY} on the line, maybe more in a step of its window: {WINDOW_KL}"
        over = "the raw logits" if any(key.startswith("logits/") for key in keys) else "an empty token set"
        return (f"{STATISTIC_ONLY} (over {over}), while {finite_said} on the line is finite: not a diverged model "
                "on that line")  # fmt: skip
    if model == "reward" or any(
        key in ("reward_std", "reward", "rewards") or key.startswith("rewards/") and model is None for key in keys
    ):
        return "the reward: a reward function's NaN, or the spread of a group of one sample (std of one value)"
    if grad_ok and "loss" in keys:  # the gradient saw finite values
        return ("a logged aggregate, not the model: the loss is non-finite while the gradient norm on the line is "
                "finite, so the backward pass saw finite values (a mean over an empty set: a batch with no rejected, "
                "or no chosen, examples; a logging reduction)")  # fmt: skip
    if any(key.startswith(("logps", "rewards")) for key in keys):
        return _preference(keys, found or [])
    if any(k in ("grad_norm", "grad norm") for k in last) and loss_ok:
        bound = RANGES["loss"].bound  # the loss's range: past it, the excursion doctor says beside this
        big = [v for k, v in finite.items() if term(k) in ("loss", "lm loss") and abs(v) > bound]
        if big:
            return (f"the loss's size before its backward pass: the loss on the line is finite but {big[0]:g}, past "
                    f"{bound:g}, and the gradient norm is not: the gradients of a loss that large overflow, so its "
                    "growth is where to look first (a backward op alone can do it too: anomaly mode names it)")  # fmt: skip
        return ("the backward pass: the loss on the line is finite and the gradient norm is not (an fp16 loss scaler "
                "skipping the step, else a backward op: anomaly mode names it)")  # fmt: skip
    if any(k in ("loss", "lm loss") for k in last) and grad_zero:
        return ("a loss with no gradient: non-finite while the gradient norm is 0 (every token masked: 0/0, or the "
                "gradient zeroed)")  # fmt: skip
    if any(k in ("grad_norm", "grad norm") for k in last) and _zero_loss(finite):
        return _norm_beside_zero(finite, found, trainer=trainer)
    if evaluation_only(keys):
        return EVALUATION_ONLY
    if any("loss" in k or k == "cost" for k in last):  # Marian prints its training loss as `Cost`
        return "the forward pass or the loss itself: the loss is non-finite"
    return "a non-finite logged value, and nothing else on the line says where it came from"


# TRL's ORPO: no reference model, its reward beta times the policy's own log-probs, each response's log-probs averaged
# over its label tokens, its log-odds logged (trl f2cd577 trl/experimental/orpo/orpo_trainer.py:698-705, :743-744,
# :805-809, :871-872)
_ORPO = ("log_odds_ratio", "log_odds_chosen")
ORPO_SOURCE = "trl f2cd577 trl/experimental/orpo/orpo_trainer.py:698-705, :743-744, :805-809"


def _preference(keys: list[str], found) -> str:
    """A preference trainer's non-finite log-probs or rewards (`keys`, lowered), beside the record's pairs `found`
    ((key, value, span)): whose log-probs, and the step its finite logits clear."""
    finite = [key for key, value, _ in found if (number := _number(value)) is not None and math.isfinite(number)]
    orpo = any(term(key) in _ORPO for key, _, _ in found) or any(term(key) in _ORPO for key in keys)
    logits = [key for key in finite if key.lower().startswith("logits/")]
    if not logits or not any(key.startswith("logps") for key in keys):
        whose = " (ORPO's reward is beta times them: it has no reference model)" if orpo else (
            " (a preference reward is a log-ratio of them); the reference's are not logged")  # fmt: skip
        return f"the policy's forward pass: its log-probs are non-finite{whose}"
    said = (f"the policy's log-probs, not its logits: they are non-finite while {', '.join(logits)} on the line "
            f"{'is' if len(logits) == 1 else 'are'} finite (a mean over the logits: none of them NaN), so the step "
            "from logits to log-probs")  # fmt: skip
    if orpo:
        return (f"{said}: ORPO averages a response's log-probs over its label tokens, and a response with none (a "
                f"prompt that fills the length limit) is 0/0 ({ORPO_SOURCE}); its reward is beta times them: it has "
                "no reference model")  # fmt: skip
    return f"{said}: a log-softmax at the labels, summed or averaged over a response's label tokens (over none: 0/0)"


# icefall's Zipformer Whiten modules log `Whitening: name=<module>, num_groups=1, num_channels=256, metric=nan vs.
# limit=12.0`: a covariance statistic computed in fp32, in the backward pass, from the module's saved forward input
# (k2-fsa/icefall 36e0420 egs/librispeech/ASR/zipformer/scaling.py:971-1005, :1019-1031), so a non-finite metric is
# that input holding inf or NaN (an fp16 activation overflowed to inf is one)
_WHITENING = re.compile(r"Whitening: name=(?P<name>[\w.]{1,200}), num_groups=\d{1,6}, num_channels=\d{1,8}, "
                        r"metric=[-+]?(?:nan|inf)", re.IGNORECASE)  # fmt: skip
WHITENING_SOURCE = "k2-fsa/icefall 36e0420 egs/librispeech/ASR/zipformer/scaling.py:971-1005, :1019-1031"


def whitening(line: str) -> str | None:
    """What icefall's non-finite Whitening metric on `line` points to (None: no such line)."""
    match = _WHITENING.search(line, 0, 2048)
    if match is None:
        return None
    return (f"the forward activations entering {match['name']} (icefall's Whiten module): its whitening metric is "
            "computed in fp32 from them, so they held inf or NaN (an fp16 activation overflowed to inf is one) "
            f"({WHITENING_SOURCE})")  # fmt: skip


_EVALUATION = ("eval_", "eval/", "val_", "val/", "validation", "eval ", "val ", "valid ", "test ")  # lowered keys
# a held-out loss is computed after its step's update, a training loss before its own (transformers' Trainer logs the
# step's loss, then evaluates: 4.57.6 trainer.py _maybe_log_save_evaluate), so only a training loss logged after the
# evaluation clears the weights it ran on (holdout27 02: one step, `train_loss` finite, then `eval_loss` nan)
_HELD_OUT = "a loss on held-out data, no backward pass behind it (an evaluation batch with no labelled tokens is 0/0)"
EVALUATION_ONLY = (f"the evaluation, or weights the update before it made non-finite: {_HELD_OUT}; a finite training "
                   "loss of a later step, logged after it, would clear the weights")  # fmt: skip


# nanoGPT's evaluation line: estimate_loss() runs the model, unchanged, over batches of both splits, then train.py
# prints `step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}` (karpathy/nanoGPT, and its
# many copies): its train loss is of the same weights as its val loss (holdout17 21)
_ESTIMATED = re.compile(r"\bstep \d{1,12}: train loss (?P<train>[-+\w.]{1,40}), val loss ")
ESTIMATED = (f"the evaluation only: {_HELD_OUT}; the line's train loss, estimated with the same weights (nanoGPT's "
             "estimate_loss runs both splits), is finite, so the weights were")  # fmt: skip


def estimated(line: str) -> bool:
    """`line` is nanoGPT's evaluation line, its train loss finite."""
    match = _ESTIMATED.search(line, 0, 2000)
    return match is not None and (train := number(match["train"])) is not None and math.isfinite(train)


# mlx_lm evaluates at iteration `it` before that iteration's step and prints `Iter {it}: Val loss ...`, then reports
# `Iter {it}: Train loss ...`, the mean of the losses since its last report, the last of them on the evaluated weights
# (mlx-lm v0.31.3 mlx_lm/tuner/trainer.py:287-304, :319, :344; ml-explore/mlx-examples#1233, holdout23 10)
_MLX_VAL = re.compile(r"\bIter (?P<it>\d{1,12}): Val loss ")
_MLX_TRAIN = re.compile(r"\bIter (?P<it>\d{1,12}): Train loss ")


def same_iteration(evaluation: str, training: str) -> bool:
    """`training` is mlx_lm's train report of the iteration whose evaluation line is `evaluation`: its loss ran on
    the evaluated weights."""
    val, train = _MLX_VAL.search(evaluation, 0, 2000), _MLX_TRAIN.search(training, 0, 2000)
    return val is not None and train is not None and val["it"] == train["it"]


def evaluation_cleared(step: int | None, line: int) -> str:
    """What a held-out loss non-finite points to where a training loss logged after it is finite."""
    return (f"the evaluation only: {_HELD_OUT}; the training loss logged after it ({_where(step, line)}) is finite, so "
            "the weights were")  # fmt: skip


def _where(step: int | None, line: int) -> str:
    """`line N`, and its step where it names one."""
    return f"line {line}" + (f", step {step}" if step is not None else "")


def evaluation_only(keys: list[str]) -> bool:
    """Every one of `keys` (lowered) is an evaluation's (`eval_loss`, `Val loss`, `test acc`)."""
    return all(key.startswith(_EVALUATION) for key in keys)


# a reward printed in words before its value (mlx_lm's `Total rewards mean 1.406`, whose pairs keep only `mean`)
_REWARD_WORDS = re.compile(
    r"(?<![\w/])(?P<key>[A-Za-z][\w ]{0,30}?rewards?(?: mean)?)[ :=]{1,3}(?P<value>-?\d{1,12}\.\d{1,12})"
)


def training_too(step: int | None, line: int, *, same: bool, found=(), text: str = "") -> str:
    """What a held-out loss non-finite points to where a training loss logged after it is non-finite too: of the same
    step (`same`: mlx_lm prints `Iter 10: Val loss nan, ...` before `Iter 10: Train loss nan, ...`:
    ml-explore/mlx-examples#1233, holdout23 10), or the next training loss logged (`Epoch 3/50 | Train Loss: nan`
    after `Epoch 2/50 | ... | Val Loss: nan`: holdout22 04). `found`: the training line's pairs; finite rewards on it
    are rollouts the weights generated, so those weights were finite (`text`: the line, for a reward in words)."""
    words = [f"{m['key']} {m['value']}" for m in _REWARD_WORDS.finditer(text, 0, 2048)][:2]
    rewards = _rewards_finite(found) or words
    if same and rewards:
        kl = [key for key, value, _ in found if term(key) == "kl" and (n := _number(value)) is not None and not math.isfinite(n)]  # fmt: skip
        beside = (
            f", and {kl[0]} non-finite beside it (it needs the policy's and the reference's log-probs)" if kl else ""
        )
        return (f"the log-probs the loss is computed from{beside}, or weights that went non-finite late in the "
                f"window: the training loss reported at step {step} is non-finite too (line {line}: a mean over the "
                f"steps since the last report), while the rewards reported beside it are finite ({', '.join(rewards)}): "
                "the weights generated finite rollouts for at least part of that window")  # fmt: skip
    if same:
        return (f"the weights, not the evaluation alone: the training loss reported at step {step} is non-finite too "
                f"(line {line}): weights already non-finite make both losses so")  # fmt: skip
    return (f"the weights, not the evaluation alone: the next training loss logged after it is non-finite too "
            f"({_where(step, line)}): weights already non-finite make both losses so")  # fmt: skip


def _norm_beside_zero(finite: dict[str, float], found, *, trainer: bool) -> str:
    """What a non-finite gradient norm beside a logged loss of 0 points to: -0.0 is a computed loss (a step of the
    window finite); a Trainer's 0.0 may be its filter of a window of non-finite losses, or an RL loss of 0."""
    if _negative_zero(finite):
        return ("a non-finite gradient norm beside a logged loss of -0.0: a computed sum, rounded from a tiny negative "
                "value (transformers' filter logs +0.0 for a window whose every loss was non-finite), so at least one "
                "step of the logging window had a finite loss while the gradient norm (of its last step) is not: the "
                "backward pass, or a forward that went non-finite on that last step")  # fmt: skip
    if trainer and _rewards_finite(found):
        return (f"a non-finite gradient norm beside a logged loss of 0.0: {TRAINER_ZERO}, or an RL loss 0 by "
                "construction (TRL's GRPO trains each generation batch once by default, so its probability ratio is 1 at "
                "every step and its loss, the group-normalised advantages' mean, about 0: trl v0.16.0 "
                "grpo_config.py:267-270, grpo_trainer.py:924-932): the line cannot tell which; its rewards are scored from the generations, not from the "
                "training forward")  # fmt: skip
    if trainer:
        return (f"a non-finite gradient norm beside a logged loss of 0.0: {TRAINER_ZERO}, so the forward pass or the "
                "loss was non-finite too, unless every label was masked")  # fmt: skip
    return ("a non-finite gradient norm beside a loss of 0: the model's outputs already non-finite and masked, or "
            "every label masked (the line cannot tell which)")  # fmt: skip


def _negative_zero(finite: dict[str, float]) -> bool:
    """The loss printed as -0.0: a computed value (a mean of tiny negative losses rounded), no NaN filter's 0.0
    (transformers' logging_nan_inf_filter adds 0.0 / n to a window's sum of 0.0: +0.0)."""
    return any(term(k) in ("loss", "lm loss") and v == 0.0 and math.copysign(1.0, v) < 0 for k, v in finite.items())


def _zero_loss(finite: dict[str, float]) -> bool:
    return any(term(k) in ("loss", "lm loss") and v == 0.0 for k, v in finite.items())

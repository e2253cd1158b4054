"""The loss scalers' lines: DeepSpeed's overflow and skip lines (its ZeRO optimizers', its FP16 optimizers', its loss
scaler's), apex's, fairseq's, ColossalAI's, gpt-neox's OverflowMonitor, NVIDIA DeepLearningExamples' DLLogger scale:
each read as evidence (launch.signals.read_line hands each its anchored window).

Whose rank a DeepSpeed overflow line names: `[deepspeed] OVERFLOW! Rank 0 Skipping step` is logged by rank 0 for every
rank (DeepSpeed 0.16.4 deepspeed/runtime/fp16/loss_scaler.py:180-188, rank 0 only); ZeRO stage 2's `fp16 dynamic loss
scale overflow! Rank 6 Skipping step` is printed by every rank (ranks 6, 4, 1, ... at one time stamp: THUDM/GLM#32,
holdout17 10) once the overflow flag is all-reduced (MAX over the data- and model-parallel groups: DeepSpeed v0.3.13
deepspeed/runtime/zero/stage2.py:1387-1391 after has_overflow's all_reduce, :1561), so the rank it names printed an
overflow that may be any rank's, not its own.

    signal, fields = overflow(text, before)     # None: not such a line
    logging_rank("0", every_rank=False)         # 'rank 0 logs it (DeepSpeed prints it on rank 0 only)'
"""

from __future__ import annotations

import re
from dataclasses import replace

from nanscope.facts.signals import BY_ID, LOGGER_FILES, WORDING

_NUMBER = r"[\d.eE+-]{1,30}"
_OVERFLOW = re.compile(
    r"(?:(?:OVERFLOW! )?Rank (?P<rank>\d{1,9}) Skipping step\.|fp16 dynamic loss scale overflow!(?: Rank (?P<rank2>\d{1,9}))?"
    r" Skipping step\.|Overflow detected\. Skipping step\.)"
    rf"(?: Attempted loss scale: (?P<scale>{_NUMBER}),? (?:reducing to (?P<next>{_NUMBER})"
    r"|but hysteresis is (?P<hysteresis>\d{1,9})\.? Reducing hysteresis to (?P<left>\d{1,9})))?"
)
# apex's `Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0`, fairseq's `gradient
# overflow detected, ignoring gradient, setting loss scale to: 64.0`, ColossalAI's `Found overflow. Skip step`
_SCALER = re.compile(
    r"overflow[^\n]{0,60}?\bskip(?:ping|ped)?\b[^\n]{0,20}?\bstep|overflow detected[^\n]{0,60}?loss scale"
    r"|skipping step[^\n]{0,60}?loss scale|overflow on iteration \d",
    re.IGNORECASE,
)
_SCALE_TO = re.compile(
    r"(?:reducing loss scale to|setting loss scale to:?)\s{0,4}(?P<scale>[\d.eE+-]{1,30})", re.IGNORECASE
)


def overflow(text: str, before: str):
    match = _OVERFLOW.search(text)
    if match is None:
        return None
    rank = match["rank"] or match["rank2"]
    logged = _LOG_DIST.search(text, max(0, match.start() - 12), match.start())
    rank = rank or (logged["rank"] if logged is not None else None)
    if match["next"] is not None:
        detail = f"loss scale {match['scale']} -> {match['next']}"
    elif match["hysteresis"] is not None:
        detail = f"loss scale {match['scale']} kept, hysteresis {match['hysteresis']} -> {match['left']}"
    else:
        detail = "step skipped"
    logger = _LOGGER.search(text)  # DeepSpeed's logger, whose file names the optimizer; ColossalAI's copy prints bare
    named = LOGGER_FILES.get(logger["file"]) if logger is not None else None
    if "[deepscale]" in text:
        wording = "deepscale-overflow"
    elif "dynamic loss scale overflow" in text:
        wording = "deepspeed-dynamic-overflow"
    elif "Overflow detected" in text:
        wording = "overflow-detected"
    else:
        wording = "deepspeed-overflow-rank" if rank is not None else "deepspeed-overflow-plain"
    # ZeRO stage 2 prints its line on every rank (its `[deepscale] OVERFLOW!` too: v0.3.10 zero/stage2.py:1357-1361, no
    # rank check), stage 3 and the loss scaler on rank 0 only (v0.4.0 zero/stage3.py:2695-2700)
    stage2 = wording == "deepscale-overflow" and logger is not None and logger["file"] == "stage2.py"
    ranks = [] if rank is None else [logging_rank(rank, every_rank=wording == "deepspeed-dynamic-overflow" or stage2)]
    scale = _float(match["scale"])
    after = _float(match["next"]) if match["next"] is not None else scale
    said = WORDING[wording]
    if named is not None:
        said = replace(said, stacks=("deepspeed",), printed_by=f"{named[0]} (its logger's file, {logger['file']})",
                       source=named[1])  # fmt: skip
    return BY_ID["deepspeed-overflow"], {"detail": detail, "ranks": ranks, "wording": said,
                                         "scale": scale, "next_scale": after}  # fmt: skip


def _float(text: str | None) -> float | None:
    try:
        return None if text is None else float(text.rstrip(".,"))
    except ValueError:
        return None


_LOGGER = re.compile(r"\] \[(?P<file>\w{1,60}\.py):\d{1,6}:\w{1,60}\]")  # DeepSpeed's: `[INFO] [stage2.py:1357:step]`
# DeepSpeed's log_dist prefix, `[Rank 0] Overflow detected. ...`: the rank that printed it, rank 0 for the FP16 optimizer's
# overflow line (deepspeedai/DeepSpeed edaa722 deepspeed/utils/logging.py:107-108 get_dist_msg;
# runtime/fp16/fused_optimizer.py:267-270 log_dist(..., ranks=[0]))
_LOG_DIST = re.compile(r"\[Rank (?P<rank>\d{1,9})\] $")
_ITERATION_OVERFLOW = re.compile(r"Grad overflow on iteration:? (?P<step>\d{1,12})")
_DEEPSPEED_LOGGER = ("_update_scale]", "fused_optimizer.py:", "[deepspeed]")


def grad_overflow(text: str, before: str):
    """`Grad overflow on iteration 8`: DeepSpeed's FP16_Optimizer (after its logger's prefix, often on the line
    before: the message starts with a newline) or apex contrib's, which prints the same words."""
    match = _ITERATION_OVERFLOW.search(text)
    if match is None:
        return None
    wording = WORDING["grad-overflow-iteration"]
    deepspeed = any(mark in before[-300:] or mark in text for mark in _DEEPSPEED_LOGGER)
    if deepspeed:  # the words are shared; DeepSpeed's logger's prefix says whose they are here
        wording = replace(wording, stacks=("deepspeed",), printed_by="DeepSpeed's FP16_Optimizer (its logger's prefix)")
    signal = BY_ID["deepspeed-overflow" if deepspeed else "scaler-overflow"]
    said = "DeepSpeed's FP16_Optimizer, by its logger's prefix" if deepspeed else "DeepSpeed's or apex's FP16_Optimizer"
    return signal, {"detail": f"iteration {match['step']} skipped; {said}", "wording": wording,
                    "step": int(match["step"]), "step_from": "the line (the optimizer's own count)"}  # fmt: skip


def scaler(text: str, before: str):
    if _SCALER.search(text) is None:
        return None
    scale = _SCALE_TO.search(text)
    low = text.lower()
    wording = ("fairseq-overflow" if "ignoring gradient" in low else "colossalai-found-overflow"
               if "found overflow" in low else "apex-amp-overflow" if "loss scaler" in low else None)  # fmt: skip
    which = _WHICH_SCALER.search(text) if "loss scaler" in low else None  # apex amp: one scaler per loss
    return BY_ID["scaler-overflow"], {
        "detail": "step skipped"
        + (f", loss scale -> {scale['scale']}" if scale else "")
        + (f" (apex amp's loss scaler {which[1]}, of one per loss)" if which else ""),
        "wording": WORDING[wording] if wording else None,
        "next_scale": _float(scale["scale"]) if scale else None,
    }


_WHICH_SCALER = re.compile(r"loss scaler (\d{1,4})")
_IN_A_ROW = re.compile(r"Skipped (?P<count>\d{1,9}) iterations in a row due to Overflow")


def overflow_exit(text: str, before: str):
    """gpt-neox's OverflowMonitor: N consecutive overflow-skipped steps end the run."""
    match = _IN_A_ROW.search(text)
    if match is None:
        return None
    return BY_ID["overflow-exit"], {
        "op": "Exception",
        "detail": f"{match['count']} consecutive steps skipped on overflow: the run ended",
        "wording": WORDING["gpt-neox-overflow-monitor"],
    }


def minimum(text: str, before: str):
    return BY_ID["loss-scale-minimum"], {"detail": "loss scale at its minimum"}


_PARAMETER_SCALE = re.compile(rf"PARAMETER loss_scale\s{{0,4}}:\s{{0,4}}(?P<scale>{_NUMBER})")


def dle_scale(text: str, before: str):
    """NVIDIA DeepLearningExamples' DLLogger `PARAMETER loss_scale : 262144.0`: logged where apex amp's scaler found
    an overflow and the step was skipped; the scale is the one it set (the one it attempted is not printed)."""
    match = _PARAMETER_SCALE.search(text)
    if match is None or (scale := _float(match["scale"])) is None:
        return None
    return BY_ID["scaler-overflow"], {"detail": f"step skipped, loss scale -> {match['scale'].rstrip('.,')}",
                                      "wording": WORDING["dle-loss-scale-parameter"], "next_scale": scale}  # fmt: skip


_GRAD_SCALE = re.compile(rf"(?:Grad scale is small|grad_scale is too small, exiting):\s{{0,4}}(?P<scale>{_NUMBER})")


def grad_scale(text: str, before: str):
    """icefall's `Grad scale is small: 1.29e-26` (and its `grad_scale is too small, exiting: ...`): torch's GradScaler
    scale, set by halving on each overflowing step (the one attempted is not printed)."""
    match = _GRAD_SCALE.search(text)
    if match is None or (scale := _float(match["scale"])) is None:
        return None
    return BY_ID["scaler-overflow"], {"detail": f"grad scale {match['scale'].rstrip('.,')}",
                                      "wording": WORDING["icefall-grad-scale-small"], "next_scale": scale}  # fmt: skip


# guided-diffusion's fp16 trainer keeps the log2 of its loss scale, from 20.0, lowered by 1 on each step whose grad
# norm is inf or NaN, `Found NaN, decreased lg_loss_scale to {lg}` (guided-diffusion 22e0df8 guided_diffusion/
# fp16_util.py:12, :192-195, check_overflow :236-237; improved-diffusion 1bc7bbb improved_diffusion/train_util.py:26,
# :231): openai/guided-diffusion#50, holdout25 04
LG_ANCHOR = "decreased lg_loss_scale to"
_LG_SCALE = re.compile(
    r"Found NaN, decreased lg_loss_scale to (?P<lg>[-+]?\d{1,12}(?:\.\d{1,12})?(?:[eE][-+]?\d{1,3})?)"
)


def lg_scale(text: str, before: str):
    """guided-diffusion's `Found NaN, decreased lg_loss_scale to -16199.354`: a skipped step, the scale it set
    2^lg."""
    match = _LG_SCALE.search(text)
    if match is None or (lg := float(match["lg"])) > 1000:  # 2^lg past a float: no scale a scaler sets
        return None
    return BY_ID["scaler-overflow"], {"detail": f"log2 loss scale -> {match['lg']}",
                                      "wording": WORDING["guided-diffusion-found-nan"], "next_scale": 2.0**lg}  # fmt: skip


def logging_rank(rank: str, *, every_rank: bool) -> str:
    """What the line's `Rank N` says about who logged it (`every_rank`: a wording every rank prints)."""
    if int(rank) == 0 and not every_rank:
        return "rank 0 logs it (DeepSpeed prints it on rank 0 only)"
    if every_rank:
        return (f"rank {int(rank)} logs it (ZeRO stage 2 prints this line on every rank once the overflow flag is "
                f"all-reduced: an overflow on any rank, not rank {int(rank)}'s own)")  # fmt: skip
    return f"rank {int(rank)} logs it (its own overflow: this line is printed by each rank that overflowed)"

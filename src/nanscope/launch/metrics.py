"""Per-step metric lines before a failure, as warning signs: the step where each metric left its range.

Read from the log lines frameworks print each step:

    step 0: {'train/loss': -2.1e-06, 'train/grad_norm': 15310134.6, 'train/train_rollout_logprob_abs_diff': 9.25}
    step:83 - actor/kl_loss:nan - actor/entropy_loss:nan - actor/grad_norm:nan                        (verl)
     iteration   1/ 5000 | ... | lm loss: 1.20E+01 | ... | grad norm: nan |                    (Megatron-LM)
    {'loss': 0.2051, 'grad_norm': nan, 'learning_rate': 9.8e-06, 'epoch': 0.53}              (ms-swift, HF trainer)

A metric's range (`RANGES`) is finite and at most a bound. Every line of a log may be a metric line, so the values
are not all parsed: each metric's keys are searched in a block of the log as literals, and only a value written
past the bound (more integer digits, a larger exponent, nan or inf) matches, to be checked exactly. Time is that of
a literal-led search (each key's hits tried against a pattern that fails on the value's first characters: about
80 MB/s on a log whose every line is a metric line); memory is one excursion a metric.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from nanscope.facts.metric_names import TRAINER_ZERO


@dataclass(frozen=True)
class Range:
    """A metric's range: finite and |value| at most `bound`; `big`: a regex of the values written past it."""

    metric: str
    bound: float
    big: bytes
    words: str
    quick: bytes  # a superset of `big` that fails fast (its first characters): where it matches, `big` is tried


def _past(metric: str, bound: float, digits: int, exponent: int, words: str) -> Range:
    """The numbers written with at least `digits` integer digits, or an exponent of at least `exponent`, nan, inf."""
    exponents = rb"(?:[" + str(exponent).encode() + rb"-9]|[1-9]\d+)" if exponent < 10 else rb"[1-9]\d+"
    big = (
        rb"(?:-?\d{" + str(digits).encode() + rb",}(?:\.\d*)?(?:[eE][-+]?\d+)?"
        rb"|-?\d+(?:\.\d*)?[eE]\+?0*" + exponents + rb"|-?(?i:nan|inf(?:inity)?))"
    )
    quick = rb"-?(?:[nNiI]|\d{" + str(digits).encode() + rb"}|\d+(?:\.\d*)?[eE]\+?0*" + exponents + rb")"
    return Range(metric, bound, big, words, quick)


RANGES = {
    "grad_norm": _past("grad_norm", 1e4, 5, 4, "finite, <= 1e4"),
    "train_rollout_logprob_abs_diff": Range(
        "train_rollout_logprob_abs_diff",
        1.0,
        rb"(?:-?[1-9]\d*(?:\.\d*)?(?:[eE][-+]?\d+)?|-?\d+(?:\.\d*)?[eE]\+?0*[1-9]\d*|-?(?i:nan|inf(?:inity)?))",
        "finite, <= 1 nat",
        rb"-?(?:[nNiI1-9]|\d+(?:\.\d*)?[eE]\+?0*[1-9])",
    ),
    "kl": _past("kl", 10.0, 2, 1, "finite, |kl| <= 10"),
    "entropy": _past("entropy", 1e3, 4, 3, "finite"),
    "loss": _past("loss", 1e3, 4, 3, "finite, |loss| <= 1e3"),
}
_KEYS = {
    "grad_norm": (b"grad_norm", b"grad norm", b"gradient_norm"),
    "train_rollout_logprob_abs_diff": (b"logprob_abs_diff",),
    "kl": (b"kl_loss", b"ppo_kl"),
    "entropy": (b"entropy",),
    "loss": (b"'loss", b"/loss", b"lm loss", b"pg_loss", b"train_loss"),
}
_SEP = rb"(?:_loss)?['\"]?\s*[:=]\s*['\"]?"
# metric -> one pattern a key, each led by the key, that reads the value past the bound
_PATTERNS = {
    metric: tuple(re.compile(re.escape(key) + _SEP + rb"(" + RANGES[metric].big + rb")(?![\w.])") for key in keys)
    for metric, keys in _KEYS.items()
}
# The same, with `quick` for the value: the scan (a log may hold a metric line a line: 15 ms a 4 MiB block for
# `big`, 6 ms for `quick`); `_PATTERNS` then reads the value where one matched.
_QUICK = {
    metric: tuple(re.compile(re.escape(key) + _SEP + RANGES[metric].quick) for key in keys)
    for metric, keys in _KEYS.items()
}
# A checkpoint load in the log: an excursion after it points at the checkpoint (causes.reported BAD_CHECKPOINT).
# Matched in the lowered block with bytes.rfind (a case-insensitive regex has no literal fast path: 30 MB/s).
_LOADS = (b"loading checkpoint", b"loaded checkpoint", b"load checkpoint", b"resuming from", b"resume from",
          b"weights loaded", b"weights restored", b"restored from checkpoint")  # fmt: skip
_STEP = re.compile(r"\b(?:step|iteration|global_step)['\"]?\s*(?:[:=]\s*)?(?P<step>\d{1,12})\b", re.IGNORECASE)


@dataclass
class Excursion:
    """The first step a metric left its range."""

    metric: str
    step: int | None
    value: float
    line: int
    why: str

    def to_dict(self) -> dict:
        value = self.value if math.isfinite(self.value) else repr(self.value)
        return {"metric": self.metric, "step": self.step, "value": value, "line": self.line, "why": self.why}

    def text(self) -> str:
        step = f"step {self.step}" if self.step is not None else f"line {self.line}"
        return f"{self.metric} left its range at {step}: {self.value:.6g} ({self.why})"


# A transformers Trainer's logged dict's loss (`{'loss': 0.0, ...}`, LLaMA-Factory's, ms-swift's, TRL's the same):
# the Trainer leaves a step's NaN or Inf loss out of the window's sum (logging_nan_inf_filter, on by default) and
# logs sum / steps rounded to 4 places, so a window whose every step was non-finite logs 0.0 (transformers 4.48.1
# trainer.py:2533-2539, :3053-3058; training_args.py:966)
_TRAINER_LOSS = re.compile(rb"'loss': (?P<value>[-+]?\d[\d.]{0,40}(?:[eE][-+]?\d{1,4})?)(?![\w.])")
_EPOCH = re.compile(r"'epoch': (?P<epoch>[\d.]{1,20})")


@dataclass
class ZeroedLoss(Excursion):
    """A Trainer dict's loss of 0.0 right after a non-zero one (`value`: the one before)."""

    epoch: str | None = None

    def text(self) -> str:
        at = f"step {self.step}" if self.step is not None else f"line {self.line}" + (
            f" (epoch {self.epoch})" if self.epoch else "")  # fmt: skip
        return f"Trainer-logged loss fell from {self.value:.6g} to 0.0 at {at}: {TRAINER_ZERO}, unless the loss fell below 5e-5"

    def to_dict(self) -> dict:
        return {"line": self.line, "step": self.step, "epoch": self.epoch, "before": self.value}


@dataclass
class Metrics:
    """The metric lines of a log, block by block (`scan`); the first excursion of each metric is kept."""

    seen: bool = False  # a metric line was read
    first_step: int | None = None
    first_line: int | None = None  # the first metric line's
    excursions: dict[str, Excursion] = field(default_factory=dict)
    load_line: int | None = None  # the last checkpoint load before the first excursion
    load_text: str = ""  # ... its line, cut
    zeroed: ZeroedLoss | None = None  # the first Trainer-logged loss of 0.0 after a non-zero one
    trainer_loss: float | None = None  # the last Trainer-logged loss read (until `zeroed` is found)

    def scan(self, block: bytes, lines_before: int) -> None:
        """The metric values in `block` (whole lines); `lines_before`: the log's lines before it."""
        if not self.excursions:
            # transformers' from_pretrained prints `Loading checkpoint shards`: a model's weights, no training state
            lowered = block.lower().replace(b"loading checkpoint shards", b"loading pretrained shards")  # same length
            last = max(lowered.rfind(text) for text in _LOADS)
            if last >= 0:
                self.load_line = lines_before + block.count(b"\n", 0, last) + 1
                start = block.rfind(b"\n", 0, last) + 1
                self.load_text = block[start : start + 200].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
        if not self.seen:  # the first metric line's step; until one is seen, a block without a key is passed over
            found = [at for keys in _KEYS.values() for key in keys if (at := block.find(key)) >= 0]
            if not found:
                return
            self.seen, self.first_step = True, _step(block, min(found))
            self.first_line = lines_before + block.count(b"\n", 0, min(found)) + 1
        for metric in _KEYS:
            if metric not in self.excursions:
                self._past(metric, block, lines_before)
        if self.zeroed is None and b"'loss': " in block:
            self._zeroed(block, lines_before)

    def _zeroed(self, block: bytes, lines_before: int) -> None:
        """The first Trainer-logged loss of 0.0 in `block` after one of at least 1e-3 (this block's or before), on a
        Trainer-shaped dict (an `epoch`, no `step` of its own) whose gradient norm, if it logs one, is not finite."""
        for hit in _TRAINER_LOSS.finditer(block):
            value = float(hit["value"]) if hit["value"].strip(b"+-.") else None
            # the dict's line around it, at most 4 KiB each side (a bounded search: linear on a line of many dicts)
            low, high = max(0, hit.start() - 4096), min(len(block), hit.start() + 4096)
            end = block.find(b"\n", hit.start(), high)
            begin = block.rfind(b"\n", low, hit.start()) + 1 or low
            text = block[begin : high if end < 0 else end].decode("utf-8", "replace")
            if value == 0.0 and self.trainer_loss is not None and self.trainer_loss >= 1e-3 and _trainer_zero(text):
                line = lines_before + block.count(b"\n", 0, hit.start()) + 1
                epoch = _EPOCH.search(text)
                self.zeroed = ZeroedLoss(metric="loss", step=_step(block, hit.start()), value=self.trainer_loss,
                                         line=line, why="", epoch=epoch["epoch"] if epoch else None)  # fmt: skip
                return
            if value is not None and math.isfinite(value):
                self.trainer_loss = value

    def _past(self, metric: str, block: bytes, lines_before: int) -> None:
        """The first value of `metric` in `block` past its range: its excursion (a key absent costs one literal scan)."""
        bound, exact = RANGES[metric], _PATTERNS[metric]
        hits = sorted(
            (hit.start(), float(value[1]))
            for quick, full in zip(_QUICK[metric], exact)
            for hit in quick.finditer(block)
            if (value := full.match(block, hit.start())) is not None
        )
        for at, value in hits:
            if not math.isfinite(value) or abs(value) > bound.bound:
                why = f"{'not finite' if not math.isfinite(value) else f'past {bound.bound:g}'}; range: {bound.words}"
                line = lines_before + block.count(b"\n", 0, at) + 1
                self.excursions[metric] = Excursion(metric, _step(block, at), value, line, why)
                return

    def loaded(self) -> tuple[int, str] | None:
        """(line, text) of the checkpoint load the log names (None: none)."""
        return None if self.load_line is None else (self.load_line, self.load_text)

    def after_load(self, excursion: Excursion) -> bool:
        """The excursion comes after a checkpoint load the log names."""
        return self.load_line is not None and excursion.line > self.load_line

    def to_dict(self) -> dict:
        return {
            "seen": self.seen,
            "checkpoint_load_line": self.load_line,
            "first_step": self.first_step,
            "excursions": [excursion.to_dict() for excursion in self.excursions.values()],
            "trainer_loss_zeroed": None if self.zeroed is None else self.zeroed.to_dict(),
        }


_GRAD_NORM = re.compile(r"'grad_norm': (?P<value>[^,}]{1,40})")


def _trainer_zero(text: str) -> bool:
    """A dict line (from its `'loss'`) the Trainer logs, whose loss of 0.0 can be a window of filtered NaN losses: an
    `epoch`, no `step` key (a loop's own dict), and no finite gradient norm (a finite one saw finite values)."""
    norm = _GRAD_NORM.search(text)
    finite = norm is not None and norm["value"].strip().lower() not in ("nan", "inf", "-inf")
    return "'epoch': " in text and "'step': " not in text and not finite


def _step(block: bytes, at: int) -> int | None:
    """The step (or iteration) the line around `at` names, or None."""
    start, end = block.rfind(b"\n", 0, at) + 1, block.find(b"\n", at)
    line = block[start : len(block) if end < 0 else end].decode("utf-8", "replace")
    match = _STEP.search(line)
    return int(match["step"]) if match else None

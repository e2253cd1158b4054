"""Metric lines of every stack, read for the first non-finite value: which model, which metric, at which step.

    {'loss': 0.0, 'grad_norm': nan, 'rewards/chosen': nan, 'logps/rejected': nan, ...}      transformers, TRL, ...
    {"loss": -0.03, "kl": NaN, "global_step/max_steps": "300/1296", ...}                   ms-swift (JSON lines)
    step:1 - actor/grad_norm:9.8 - critic/vf_loss:nan - critic/grad_norm:nan               verl, OpenRLHF
    step 11 | epoch 0 | loss nan | grad_norm nan                                          NeMo AutoModel, `|` fields
    iteration 3385/ 8000 | ... | loss scale: 1.0 | number of nan iterations: 0 |          Megatron-LM (no `lm loss`)
    epoch: 0|step: 3184|ppo_ep: 1|act_loss: inf|cri_loss: inf                             DeepSpeed-Chat
    iter 3010: loss nan, time 1019.95ms, mfu 14.12%                                         nanoGPT
    Epoch(train) [1][240/735]  lr: 1.98e-04 ... loss: 2.5128  grad_norm: nan              mmengine (xtuner)
    2/351750 [00:04<..., loss=nan, reduced_train_loss=nan.0, global_step=1.000]            Lightning's bar (NeMo)
    step=642 loss=2.17 ... inf_nan_skip_batches=3                                           InternEvo

A line is parsed into (key, value) pairs by its shape (quoted keys, `|` fields, `key: value` / `key=value` /
`key value`); its step is the one it names, else the progress bar on it or before it, else the next bar (a
transformers dict is printed before its step's bar). The non-finite keys of the first such line name the model
(`actor/`, `critic/`, the policy of a preference or RL log, ...) and the metric; what the other values on it show
says what that points to. Megatron's iteration line without its `lm loss` (printed only when the average is > 0,
which NaN is not) is a non-finite loss; skip counters (`number of skipped iterations`, `inf_nan_skip_batches`,
DeepSpeed's `skipped=`) that rise are skipped steps. A wrapped key (`'counters/up   -dates'`) is joined.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from nanscope.facts.frameworks import PY_DICT
from nanscope.facts.metric_names import is_step_key
from nanscope.launch import blocks, dict_bars, epoch_steps, line_steps
from nanscope.launch import line_shapes as shapes
from nanscope.launch.bars import bars, bodiless, glued, interval_before, segments, step_at
from nanscope.launch.episodes import Episodes
from nanscope.launch.line_pairs import WINDOW, pairs
from nanscope.launch.line_steps import BAR_AFTER, BAR_BEFORE
from nanscope.launch.line_steps import number as _number  # a printed value as a float
from nanscope.launch.loop_lines import MEGATRON_HEAD
from nanscope.launch.loose import loose_pairs
from nanscope.launch.metric_points import (
    ESTIMATED,
    EVALUATION_ONLY,
    MODEL_VALUES,
    STATISTIC_ONLY,
    contradiction,
    estimated,
    evaluation_cleared,
    evaluation_only,
    model_of,
    points_to,
    same_iteration,
    term,
    training_too,
    whitening,
)
from nanscope.launch.missing_loss import missing_loss
from nanscope.launch.readings import COUNTERS, Counter, Reading, found_counters
from nanscope.launch.scales import SKIP_COUNTER, PrintedScale
from nanscope.launch.tables import Table, header

LOOKAHEAD = 8  # lines after a reading without a step where the next progress bar gives it
# `_quiet`'s passes: Megatron's iteration line's head (its step: loop_lines.MEGATRON_HEAD), a non-finite value, the
# skip counters, the keys
_BAD_VALUE = re.compile(r"[:=]\s{0,40}['\"]?[-+]?(?:nan|inf)", re.IGNORECASE)
_ZERO_COUNTS = re.compile(r"number of (skipped|nan) iterations:\s{0,12}(\d{1,12})")
# training_log's `loss scale: {:.1f} |` (core_v0.15.0rc0 megatron/training/training.py:1860)
_LOSS_SCALE = re.compile(r"\| loss scale:\s{0,12}(?P<scale>[\d.eE+-]{1,30}) \|")
_SHAPE_KEYS = re.compile(r"([A-Za-z][^|:\n]{0,100}?):")
_SHAPE = str.maketrans("", "", "0123456789 ")  # a line less its digits and spaces: its keys and punctuation
_SETTINGS = ("max_", "min_", "best_", "best ")  # a setting or a sentinel (`max_grad_norm: inf`, `best_loss inf`)
_NONFINITE = ("nan", "nan.0", "inf", "-inf", "+inf", "infinity", "-infinity")


def _nonfinite(value: str) -> bool:
    return value.strip("'\"").lower() in _NONFINITE


def _with_loose(found: list[tuple[str, str, int]], piece: str) -> tuple[list[tuple[str, str, int]], bool]:
    """`found`, and the named NaN/Inf values of `piece` no shape read (launch.loose: a printed tensor, wandb's
    summary, a bar's description); True when there are such values (a line of one named value is read then)."""
    if sum(1 for _, value, _ in found if _nonfinite(value)) and len(found) >= 2:
        return found, False
    loose = loose_pairs(piece)
    if not loose:
        return found, False
    taken = {at for _, _, at in found}
    return sorted(found + [pair for pair in loose if pair[2] not in taken], key=lambda item: item[2]), True


_NORMS = ("grad_norm", "grad norm", "gradient_norm")
# a key that is only the words of a non-finite value (`is NaN/Inf: nan`): the check's wording, no metric
_NAN_WORDS = re.compile(r"(?:nan|inf)(?:[/_ ]?(?:or[/_ ]?)?(?:nan|inf))*", re.IGNORECASE)


_RANK_KEYS = ("rank", "global_rank")  # a line's own process (not `local_rank`: one per node)
_MAX_RANKS = 16


def _loss_key(key: str) -> bool:
    low = term(key)
    return low == "loss" or low.endswith((" loss", "_loss")) and low != "loss scale"


def _norm_only(reading) -> bool:
    """Only a gradient norm went non-finite on the reading's line, a loss beside it finite and not 0."""
    keys = [term(key) for key, value in reading.values]
    loss = any(_loss_key(key) and value != 0.0 for key, value in reading.finite.items())
    return bool(keys) and all(key in _NORMS for key in keys) and loss


@dataclass
class MetricLines:
    """The metric lines of a log, fed in order (`feed`); keeps the first non-finite reading and counters."""

    first: Reading | None = None
    counters: list[Counter] = field(default_factory=list)
    later: int = 0  # metric lines with a non-finite value after the first
    keys: set[str] = field(default_factory=set)  # every key seen (the stack's shape: facts.frameworks.KEYS)
    bar: int | None = None  # the last progress bar's count
    bar_line: int = 0
    bar_done: bool = False  # the last bar was at its total: what follows it is not one of its steps
    explicit: int | None = None  # the last step a metric line named
    explicit_line: int = 0
    loss_keys: set[str] = field(default_factory=set)  # the loss fields of Megatron's iteration lines so far
    pending: int | None = None  # the line of a first reading still without a step (the next bar gives it)
    seen: dict[str, int] = field(default_factory=dict)  # counter key -> its last value
    weak: Reading | None = None  # the first Megatron iteration line whose only sign is a loss it did not print
    table: Table | None = None  # the column table being read (launch.tables)
    provisional: set[str] | None = None  # the keys of a first reading on the input's first line, maybe cut
    fragment: str | None = None  # the input's first line was cut before the first reading (said with it)
    quiet_shape: str | None = None  # the last finite Megatron iteration line less its digits (`_quiet`)
    recovered: int | None = None  # a later line where the first reading's gradient norm is finite again
    relapsed: bool = False  # ... or where a loss went non-finite after it
    glued: list = field(default_factory=list)  # bars after a pending dict with text glued after them (`_glued_bar`)
    since_bar: int = 0  # Trainer dicts since the last progress bar
    ranked: list | None = None  # the first reading's (key, value) pairs but its rank: another process's line of it
    redrawn: int | None = None  # the last bar's count where it is a terminal's redraw right after a Trainer dict
    zero_before: int | None = None  # a Trainer dict's line whose bar before is at 0 (its step: the bar after's)
    bar_total: int | None = None  # the last progress bar's total
    fresh: int | None = None  # the total of the bar just before a first reading
    nth: int = 0  # the first reading's place among the Trainer dicts since that bar (1: the first dict after it)
    evaluation_decided: bool = False  # an evaluation-only first reading was judged by the training loss after it
    scale: PrintedScale = field(default_factory=PrintedScale)  # the loss scale the lines print, and its first fall
    block: tuple[int, int] | None = None  # rsl-rl's last `Learning iteration N/M` header: (N, its line)
    headers: int = 0  # rsl-rl's block headers so far
    graver: Reading | None = None  # after a statistic-only first reading, the first non-finite loss or gradient norm
    counted: list[int] = field(default_factory=list)  # the steps of the bare `step value` lines just read
    epochs: list = field(default_factory=list)  # the epoch counters of the lines just before (launch.epoch_steps)
    episodes: Episodes = field(default_factory=Episodes)  # a second non-finite episode of the first reading's metric
    started: tuple[int, int] | None = None  # Megatron's first iteration line: (its iteration, its line)

    def rule(self, line: str, header_line: str, caption: list[str]) -> bool:
        """A table's rule row (`-- | --`) under `header_line` (`caption`: the lines before that): its columns are read
        from now on."""
        table = header(header_line, line, caption)
        if table is not None:
            self.table = table
            self.keys.update(table.key(column).lower() for column in table.columns)
        return table is not None

    def feed(self, line: str, number: int, *, bars: bool = True) -> None:
        """One metric line (`bars`: read its progress bar too; False: the caller reads the whole line's)."""
        if (header := shapes.block_header(line)) is not None:
            self.block, self.headers = (header, number), self.headers + 1
            return
        if not self._quiet(line, number):
            for offset, piece in segments(line):
                self._piece(line, piece, offset, number)
        if bars:
            self.bars(line, number)

    def _quiet(self, line: str, number: int) -> bool:
        """A Megatron iteration line of the shape last parsed in full (the same keys, a loss among them), no value
        non-finite, its skip counters 0: only its step is new, read by three regex passes instead of a parse (a
        Megatron log is such lines, each a candidate for its `number of nan iterations`). True: read so."""
        if self.quiet_shape is None or self.first is not None or self.provisional is not None or self.table:
            return False
        head = MEGATRON_HEAD.match(line)
        if head is None or _BAD_VALUE.search(line, 0, WINDOW) is not None:
            return False
        counts = _ZERO_COUNTS.findall(line, 0, WINDOW)
        if any(int(count) for _, count in counts):
            return False
        if line[:WINDOW].translate(_SHAPE) != self.quiet_shape:  # the same words and bars: the same keys
            return False
        self.explicit, self.explicit_line = int(head["step"]), number
        scale = _LOSS_SCALE.search(line, 0, WINDOW)  # its value changes, not its shape: a fall is a skipped step
        if scale is not None and (value := _number(scale["scale"])) is not None and math.isfinite(value):
            skipped = 0.0 if any(kind == "skipped" for kind, _ in counts) else None
            self.scale.value(value, number, self.explicit, skipped)
        return True

    def _shape(self, piece: str, bad) -> None:
        """Keep a finite Megatron iteration line's keys (with a loss, no counter but Megatron's two): the shape later
        lines are read quietly by (`_quiet`)."""
        keys = {key.strip().lower() for key in _SHAPE_KEYS.findall(piece, 0, WINDOW)}
        counters = {key for key in keys if key in COUNTERS or key.rsplit("/", 1)[-1] in COUNTERS}
        loss = any(key.endswith(" loss") and key != "loss scale" for key in keys)
        plain = not bad and counters <= {SKIP_COUNTER, "number of nan iterations"}
        quiet = plain and loss and MEGATRON_HEAD.match(piece) is not None
        self.quiet_shape = piece[:WINDOW].translate(_SHAPE) if quiet else None

    def _piece(self, line: str, piece: str, offset: int, number: int) -> None:
        found = self.table.row(piece) if self.table is not None else None
        found, loose = _with_loose(found or pairs(piece), piece)
        if not found:
            found, self.counted = shapes.counted(self.counted, piece)  # yanmtt's bare `step value` lines
        if not found:
            return
        self.keys.update([key.lower() for key, _, _ in found[:64]] + [PY_DICT] * shapes.trainer_dict(piece))
        counted = shapes.trainer_dict(piece) and offset == 0 and not shapes.evaluation_dict(piece)
        self.since_bar += counted
        step, step_from = self._step(line, piece, offset, found)
        found_counters(self.counters, self.seen, [p for p in found if shapes.separated(piece, p[2])], number, step)
        head = MEGATRON_HEAD.match(piece) if step is None else None  # its iteration, behind a time stamp
        if self.started is None and (megatron := head or MEGATRON_HEAD.match(piece)) is not None:
            self.started = (int(megatron["step"]), number)
        exact = step if line_steps.printed(step_from) is None else None  # a rounded step is not said as a number
        self.scale.feed(found, number, exact if head is None else int(head["step"]))
        missing = missing_loss(found, self.loss_keys)
        bad = [
            (key, value, at)
            for key, value, at in found
            if _nonfinite(value)
            and not is_step_key(key)
            and not key.lower().startswith(_SETTINGS)
            and not _NAN_WORDS.fullmatch(key)
        ]
        at = offset + (bad[0][2] if bad else found[0][2])
        if step is None:
            step, step_from = epoch_steps.step(piece, self.epochs) or step_at(
                line, at, logged=shapes.logs_its_step(piece)
            )
        values = [(key, value) for key, value, _ in bad] + missing
        if self.provisional is not None and line_steps.own(step_from):
            self._confirm(found, bool(bad), number)
        if self.first is not None and self.first.line != number:
            self._recovery(found, bad, number)
            self._after_evaluation(piece, found, step, number)
            self.episodes.feed(number, step if line_steps.own(step_from) else None,
                               [(key, _nonfinite(value)) for key, value, _ in found])  # fmt: skip
        if bad and (len(found) >= 2 or loose):
            if self.first is None:
                self._first(line, number, found, values, step=step, step_from=step_from)
            elif not blocks.fold(self.first, self.block, number, values):  # rsl-rl's block: one record
                self.later += 1
                self._graver(line, number, found, values, step=step, step_from=step_from)
            self._rank(found, step, number)
        elif missing and self.weak is None and self.first is None:
            self.weak = self._reading(line, number, found, missing, step=step, step_from=step_from)
            self.weak.weak = True
        if step is not None and line_steps.own(step_from):
            self.explicit, self.explicit_line = step, number
        if offset == 0 and piece is line:
            self._shape(piece, bad or missing)

    def _graver(self, line: str, number: int, found, values, *, step: int | None, step_from: str | None) -> None:
        """After a first reading that is a logged statistic only (a KL), the first later line whose loss or gradient
        norm is non-finite: a model's own value (holdout20 07: `kl` nan from step 3, `grad_norm` nan at step 14)."""
        if self.graver is None and self.first.points_to.startswith(STATISTIC_ONLY):
            if any(term(key) in MODEL_VALUES for key, _ in values):
                graver = self._reading(line, number, found, values, step=step, step_from=step_from)
                if graver.step_from == BAR_BEFORE:  # a Trainer dict logs after the bar before it: a later step
                    graver.after, graver.step, graver.step_from = graver.step, None, None
                self.graver = graver

    def _rank(self, found, step: int | None, number: int) -> None:
        """The rank a line of the first reading's step names (`... grad_norm nan rank 2`: CosyVoice's trainer logs
        each process's own line, QwenAudio/CosyVoice#652, holdout23 01), kept in the order logged."""
        first = self.first
        rank = next((int(v) for k, v, _ in found if k.lower() in _RANK_KEYS and v.isdigit() and len(v) <= 7), None)
        if rank is None or rank in first.ranks or len(first.ranks) >= _MAX_RANKS:
            return
        record = [(k, v) for k, v, _ in found if k.lower() not in _RANK_KEYS]  # the same record, another process
        if number == first.line:
            self.ranked = record
        elif record != self.ranked and (step is None or step != first.step):
            return
        first.ranks.append(rank)

    def _after_evaluation(self, piece: str, found, step: int | None, number: int) -> None:
        """The first line after an evaluation-only first reading that holds a training loss decides what that reading
        points to, once: non-finite, the weights; finite and not 0, of a later step (both named: a training loss is
        computed before its step's update, the evaluation after it) or of mlx_lm's same iteration, the evaluation
        only; else it stays undecided. A step before the reading's (a restarted run's line), a Trainer's end-of-run
        dict (`train_runtime`: an average of losses computed before their updates) decide nothing."""
        first = self.first
        if first.points_to != EVALUATION_ONLY or self.evaluation_decided:
            return
        if step is not None and first.step is not None and step < first.step:
            self.evaluation_decided = True  # the lines of a restarted run say nothing of the weights it ran on
            return
        losses = [value for key, value, _ in found if _loss_key(key) and not evaluation_only([key.lower()])]
        if not losses or any(key == "train_runtime" for key, _, _ in found):
            return
        self.evaluation_decided = True
        if any(_nonfinite(value) for value in losses):
            same = step is not None and step == first.step
            first.points_to = training_too(step, number, same=same, found=found, text=piece)
            return
        numbers = [_number(value) for value in losses]
        nonzero = all(n is not None and math.isfinite(n) and n != 0.0 for n in numbers)  # a Trainer's 0.0: NaN filtered
        named = step is not None and first.step is not None
        later = named and (step > first.step or step == first.step and same_iteration(first.text, piece))
        if nonzero and later:
            first.points_to = evaluation_cleared(step, number)

    def watched(self) -> tuple[bytes, ...]:
        """The literals (lowered) of the later lines to read, finite ones too: the key of a first reading whose
        gradient norm alone went non-finite, the loss finite (does it recover?), or whose second episode is watched
        for (launch.episodes); `loss` while an evaluation-only first reading waits for the training loss logged after
        it (`_after_evaluation`)."""
        first = self.first
        if first is None:
            return ()
        waiting = first.points_to == EVALUATION_ONLY and not self.evaluation_decided
        out = (b"loss",) if waiting else ()
        norm = self.recovered is None and not self.relapsed and _norm_only(first)
        if norm or self.episodes.waiting():
            out += (first.values[0][0].lower().encode("utf-8", "replace"),)
        return out

    def _recovery(self, found, bad, number: int) -> None:
        """A line after a norm-only first reading: the norm finite again (recovered), or a loss non-finite."""
        if not _norm_only(self.first) or self.recovered is not None or self.relapsed:
            return
        if any(_loss_key(key) for key, _, _ in bad):
            self.relapsed = True
            return
        key = self.first.values[0][0]
        if any(k == key and not _nonfinite(value) and _number(value) is not None for k, value, _ in found):
            self.recovered = number

    def context(self, lines: list[bytes], clean) -> None:
        """Lines just before a candidate line (not read as candidates: all finite): the step they name and their
        keys (a metric line cut before its step is after the step the one before it named)."""
        self.counted, self.epochs = [], epoch_steps.counts(lines, clean)
        for raw in lines:
            found = pairs(text := clean(raw.decode("utf-8", "replace")))
            shown = bars(text)
            if shown:  # a bar among them: the dicts after it are counted from it (launch.dict_bars)
                self._bar_seen(text, shown)
            self.since_bar += shapes.trainer_dict(text) and not shapes.evaluation_dict(text)
            pair = shapes.bare_pair(text)
            self.counted = self.counted + [pair[0]] if pair is not None else []
            if len(found) >= 2:
                self.keys.update([key.lower() for key, _, _ in found[:64]] + [PY_DICT] * shapes.trainer_dict(text))
                step, step_from = self._step(text, text, 0, found)
                if step is not None and line_steps.own(step_from):
                    self.explicit = step

    def bars(self, line: str, number: int) -> None:
        """The progress bar on `line` (the step of a metric line that names none; a first reading's pending step)."""
        found = bars(line)
        if found:
            between = self.since_bar  # the Trainer dicts since the bar before (launch.dict_bars)
            self.bar, self.bar_line = found[-1].count, number
            self._bar_seen(line, found)
            self.bar_done = found[-1].count == found[-1].total  # a finished loop (a dataset's map, an epoch)
            if self.pending is not None and self.first is not None and number - self.pending <= LOOKAHEAD:
                bar, first, same = found[-1], self.first, self._same_loop(found[-1])
                base = 0 if first.step is None else first.step
                one = dict_bars.one_a_step(base, bar.count, between, self.nth, same_loop=same)
                if one is not None:
                    every = "a step" if one[1] == 1 else f"every {one[1]} steps"
                    place = "the first" if self.nth == 1 else f"dict {self.nth}"
                    first.step_from = (
                        f"{place} of {between} dicts between the progress bars at {base} and {bar.shown()}: one {every}"
                    )
                    first.step, self.pending, self.glued = one[0], None, []
                    return
                if glued(line, bar) and shapes.trainer_dict(first.text):
                    self._glued_bar(bar)
                    return
                if not dict_bars.ran_past(base, bar.count, same_loop=same and self.nth == 1 and bodiless(line, bar)):
                    first.step, first.step_from, first.after = (
                        self.bar,
                        f"{BAR_AFTER}, {bar.shown()}",
                        None,
                    )
            self.pending, self.glued = None, []

    def _bar_seen(self, line: str, found) -> None:
        """A bar line: the dicts are counted from it; a terminal's lone bar right after a Trainer dict is tqdm's redraw
        at that dict's step (`tqdm.write` clears the bar, prints, draws it again: tqdm 4.67 std.py:750-756)."""
        last = found[-1]
        lone = len(found) == 1 and self.since_bar > 0 and not bodiless(line, last)
        self.redrawn, self.bar_total, self.since_bar = last.count if lone else None, last.total, 0

    def _same_loop(self, bar) -> bool:
        """The first reading took its step from the bar before it, of `bar`'s loop (the same total)."""
        first = self.first
        zero = first.step is None and self.zero_before == first.line
        before = zero or first.step_from is not None and first.step_from.startswith(BAR_BEFORE)
        return self.fresh == bar.total and before

    def _glued_bar(self, bar) -> None:
        """A bar after a pending Trainer dict with other text glued after its `]`: that text was printed while the bar
        was on screen, by the next log (TensorBoard's warning, a callback's logger line, before the next dict), so
        the bar is the next dict's step, not this one's (a pasted terminal shows a bar's last redraw). Two such bars
        give the logging interval, and the pending dict's step is the first less it."""
        self.glued.append(bar)
        if len(self.glued) < 2:
            return
        step, how = interval_before(self.glued[0], self.glued[1])
        if step is not None:
            self.first.step, self.first.step_from = step, how
        self.pending, self.glued = None, []

    def _step(self, line: str, piece: str, offset: int, found) -> tuple[int | None, str | None]:
        """The step a metric line names (launch.line_steps); None: its bar or a later one says."""
        return line_steps.named(piece, found)

    def step_named(self, line: str) -> int | None:
        """The step `line` names itself (None: none), without reading it as a metric line."""
        step, how = self._step(line, line, 0, pairs(line))
        return step if how is not None and how.startswith("the line") else None

    def _confirm(self, found, bad: bool, number: int) -> None:
        """A later line that names its step and shares keys with a first reading on the input's first line: that
        line was cut at its start (the excerpt begins mid-line). Its reading gives way to this line's, or keeps its
        values under the full key it was cut from."""
        keys, first = {key.lower() for key, _, _ in found}, self.first
        self.provisional, shared = None, self.provisional
        if first is None or number - first.line > LOOKAHEAD:
            return
        cut = first.values[0][0]
        full = next((key for key, _, _ in found if key.lower().endswith(cut.lower()) and len(key) > len(cut)), None)
        if len(keys & shared) < (1 if full is not None else 2):
            return
        if bad:
            self.first = None
            self.fragment = (
                f"line {first.line} is cut at its start ({first.text[:60]!r}): its non-finite values "
                "come from a line before the excerpt"
            )
        elif full is not None:
            first.values[0] = (full, first.values[0][1])

    def _reading(self, line: str, number: int, found, values, *, step: int | None, step_from: str | None) -> Reading:
        after, block = None, self.block
        if step is None and block is not None and 0 < number - block[1] <= shapes.BLOCK_LINES:
            step, step_from = block[0], blocks.step_from(block)
        near = self.bar is not None and number - self.bar_line <= LOOKAHEAD and not self.bar_done
        if step is None and self.explicit is not None and not (near and self.bar_line > self.explicit_line):
            after = self.explicit  # a step named since the last bar (a bar after it is later: holdout20 08)
        elif step is None and near:
            trainer = shapes.trainer_dict(line)
            if trainer and self.redrawn == self.bar:  # the bar redrawn after the dict before: this one is later
                after = self.bar  # (holdout22 04: dict, `1/300` redrawn with a warning glued, dict: after step 1)
            elif trainer and self.bar == 0:  # a Trainer logs after a step, never at step 0: the bar after says
                self.zero_before = number
            else:
                step, step_from = self.bar, BAR_BEFORE
        finite = {
            key: number_
            for key, value, _ in found
            if (term(key) in ("loss", "grad_norm", "grad norm", "lm loss", "gradient_norm")
                or key.lower().endswith(" loss") and key.lower() != "loss scale")
            and (number_ := _number(value)) is not None and math.isfinite(number_)
        }  # fmt: skip
        model = model_of([key for key, value in values if value != "missing"], {key.lower() for key, _, _ in found})
        contradicted = contradiction(values, found)
        said = whitening(line) or points_to(values, finite, model, found, trainer=shapes.trainer_dict(line))
        said = ESTIMATED if said == EVALUATION_ONLY and estimated(line) else said  # nanoGPT's line: the same weights
        if contradicted is not None:
            said = (f"the progress bar's running mean only: its {values[0][0]} (a mean over the last training steps) "
                    f"is {values[0][1]} while {contradicted} on the same line are finite: not a NaN failure by "
                    "itself")  # fmt: skip
        # where no step is named, the line's own epoch (transformers' Trainer logs a fraction of one: `'epoch': 0.52`)
        epoch = None if step is not None else next((v for k, v, _ in found if k.lower() == "epoch" and _number(v) is not None), None)  # fmt: skip
        return Reading(line=number, step=step, step_from=step_from, after=after, values=values, model=model,
                       finite=finite, points_to=said, text=line.strip()[:300], contradicted=contradicted,
                       fragment=self.fragment, epoch=epoch)  # fmt: skip

    def _first(self, line: str, number: int, found, values, *, step: int | None, step_from: str | None) -> None:
        self.first = self._reading(line, number, found, values, step=step, step_from=step_from)
        if number == 1 and self.first.step is None and self.first.after is None:
            self.provisional = {key.lower() for key, _, _ in found}
        unstepped = self.first.step is None and (self.first.after is None or self.first.after == self.redrawn)
        if unstepped or self.first.step_from == BAR_BEFORE and shapes.trainer_dict(line):  # a dict's bar after it
            self.pending = number  # gives its step (a bar redrawn after a dict is its step's)
            self.fresh, self.nth = self.bar_total, self.since_bar
        if not _norm_only(self.first):  # a second episode of its metric is watched for (launch.episodes)
            self.episodes.start(self.first.metric, self.first.step)

"""Progress bars (tqdm's `2/87543 [00:18<223:50:10, 9.20s/it, loss=nan]`) in a log: which step a value or a line
glued to a bar belongs to.

A bar shows the steps done. What sits inside its bracket (a postfix: `loss=nan`) is that count's step's. What a
program prints while the bar is on screen is glued after the bar's `]` on the same line, and it was printed while
the next step ran: a DeepSpeed overflow after `6/1184 [...]` is step 7's (the Trainer updates its bar at a step's
end, DeepSpeed's optimizer step prints inside the next one), and so is a dict printed after `9/860 [...]` by a
loop driven by `for step in tqdm(...)`. A line that only logs the step just done (TensorBoard's refusal of a NaN
scalar, `logged`) is that count's step. A bar's count is at least the steps done (tqdm redraws at most every
0.1 s): the step is said with the bar it came from.

    bar = last_bar(line, at)          # the last bar that starts before position `at`, or None
    step, how = step_at(line, at)     # the step of what sits at `at` (None, None: no bar before it)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WINDOW = 8192  # characters of a line searched for bars
_BAR = re.compile(r"(?P<count>\d{1,12})/(?P<total>\d{1,12}) \[\d")
# a progress bar that counts no training step (a dataset's map, a download)
_NOT_STEPS = re.compile(r"^\s{0,8}(?:Map|Filter|Tokeniz|Load|Download|Generat|Process|Extract|Convert|Fetch|Sav|Cast|"
                        r"Running)|examples/s|ex/s|B/s\]")  # fmt: skip
_CLOSE = 400  # characters after a bar's count where its bracket closes


@dataclass(frozen=True)
class Bar:
    """One progress bar on a line: its count and total, where its count starts, where its bracket closes (-1:
    not on the line)."""

    count: int
    total: int
    start: int
    close: int

    def shown(self) -> str:
        return f"{self.count}/{self.total}"


def bodiless(line: str, bar: Bar) -> bool:
    """The bar has a percentage but no `|` body before its count (`  2% 3/200 [...]`): a notebook's text rendering of
    its widget, which keeps only the bar's last state before each printed line (no redraw after a printed line)."""
    before = line[max(0, bar.start - 12) : bar.start]
    return "%" in before and "|" not in before


def counts_steps(line: str) -> bool:
    """The bars on `line` count training steps (not a dataset's map or a download)."""
    return _NOT_STEPS.search(line, 0, 200) is None


def bars(line: str) -> list[Bar]:
    """The step-counting bars of `line`, in order."""
    head = line[:WINDOW]
    if "/" not in head or " [" not in head or not counts_steps(line):  # no `N/M [` on it: a literal search first
        return []
    out = []
    for match in _BAR.finditer(line, 0, WINDOW):
        close = line.find("]", match.end(), match.end() + _CLOSE)
        out.append(Bar(int(match["count"]), int(match["total"]), match.start(), close))
    return out


def last_bar(line: str, at: int) -> Bar | None:
    """The last step-counting bar that starts before `at`."""
    found = [bar for bar in bars(line) if bar.start < at]
    return found[-1] if found else None


# between a value and the bar after it: the bar's description (`Loss: nan:   0%|▏   | 2/1000 [`), or the bar's start
# overwritten by a print (`loss tensor([nan], ...)        | 1/100 [`: the bar was on screen, the text went over it)
_DESCRIPTION = re.compile(r"[^|%\n]{0,40}?\s{0,4}\d{1,3}%\|[^|\n]{0,400}\|\s{0,4}\Z")
_OVERWRITTEN = re.compile(r"\s{2}\s{0,400}\|\s{0,4}\Z")


def _bar_after(line: str, at: int) -> tuple[int | None, str | None]:
    """The step of what sits at `at` from the bar that follows it on the line: a description's bar's count; a bar
    whose start the text overwrote was on screen when it was printed: the next step."""
    bar = next((bar for bar in bars(line) if bar.start > at), None)
    if bar is None or bar.start - at > 1200:
        return None, None
    between = line[at : bar.start]
    if _DESCRIPTION.search(between) is not None:
        return bar.count, f"the progress bar its description belongs to, {bar.shown()}"
    if "%|" not in between and _OVERWRITTEN.search(between) is not None:
        return bar.count + 1, f"printed over the start of the progress bar's {bar.shown()}: the next step"
    return None, None


# a bar of one epoch, described `Epoch E/N` (ColossalChat's trainers: coati/trainer/sft.py SFTTrainer._train,
# `trange(len(train_dataloader) // accumulation_steps, desc=f"Epoch {epoch + 1}/{self.max_epochs}")`, hpcaitech/
# ColossalAI at caab4a30): its count is the step within the epoch, its total the epoch's steps
_EPOCH_BAR = re.compile(
    r"\b[Ee]poch\s{0,4}\[?(?P<epoch>\d{1,6})\s{0,4}/\s{0,4}(?P<epochs>\d{1,6})\]?\s{0,4}:?\s{0,8}\d{1,3}%\|"
)


# Lightning's bar: `Epoch 1:   1%| | 23/4360 [..., loss=nan, v_num=0]`, its epoch counted from 0 (trainer.current_epoch)
# and `v_num` (the logger's version) in its postfix (ssbuild/chatglm_finetuning#104, holdout17 25)
_LIGHTNING_BAR = re.compile(r"\bEpoch (?P<epoch>\d{1,6}):\s{0,8}\d{1,3}%\|")


def _global(line: str, bar: Bar, count: int) -> tuple[int, str]:
    """A bar's `count` as a global step: in epoch E of a bar described `Epoch E/N`, (E - 1) epochs of its total
    before it (in Lightning's `Epoch E:`, counted from 0, E epochs); and the words saying so ("" for a bar that is no
    epoch's, or the first epoch's)."""
    lightning = _LIGHTNING_BAR.search(line, max(0, bar.start - 400), bar.start + 1)
    if lightning is not None and "v_num=" in line[bar.start : bar.start + 600] and int(lightning["epoch"]) > 0:
        epoch = int(lightning["epoch"])
        step = epoch * bar.total + count
        return step, (f" (Lightning's bar counts the batches of epoch {epoch}, its description, counted from 0: "
                      f"{epoch} x {bar.total} + {count}, where each epoch's bar is as long: batches, not optimizer "
                      "steps, and Lightning 1.x's total holds the validation batches too)")  # fmt: skip
    match = _EPOCH_BAR.search(line, max(0, bar.start - 400), bar.start + 1)
    if match is None or not 1 < int(match["epoch"]) <= int(match["epochs"]):
        return count, ""
    epoch = int(match["epoch"])
    step = (epoch - 1) * bar.total + count
    return step, (f" (the bar counts within epoch {epoch}/{match['epochs']}, its description: ({epoch} - 1) x "
                  f"{bar.total} + {count}, each epoch {bar.total} steps)")  # fmt: skip


def step_at(line: str, at: int, logged: bool = False) -> tuple[int | None, str | None]:
    """The step of what sits at `at` on `line`, from the bar before it: its count inside the bar's bracket, the next
    step after it (`logged`: a line that logs the step just done keeps the count); without one, the bar after it
    (`_bar_after`). A bar of one epoch (`Epoch 2/3: ... 451/1000`) counts within it: the global step is said."""
    bar = last_bar(line, at)
    if bar is None:
        return _bar_after(line, at)
    if bar.close < 0 or at < bar.close:
        step, said = _global(line, bar, bar.count)
        return step, f"the progress bar on its line, {bar.shown()}{said}"
    if logged:
        step, said = _global(line, bar, bar.count)
        return step, f"the progress bar it follows, {bar.shown()}: the step it logs{said}"
    step, said = _global(line, bar, bar.count + 1)
    return step, f"printed after the progress bar's {bar.shown()}: the next step{said}"


def glued(line: str, bar: Bar) -> bool:
    """Text other than the bar's own follows its closing `]` on `line` (printed while the bar was on screen)."""
    return bar.close > 0 and bool(line[bar.close + 1 : bar.close + 201].strip())


def interval_before(first: Bar, second: Bar) -> tuple[int | None, str | None]:
    """The step one logging interval before two bars that are the next two logs' steps (None: no interval)."""
    interval = second.count - first.count
    if not 0 < interval <= first.count:
        return None, None
    return first.count - interval, (f"the progress bars after it, {first.shown()} and {second.shown()}, are the next "
                                    f"logs' steps (each glued to what that log printed first): one interval "
                                    f"({interval} steps) before the first")  # fmt: skip


def segments(line: str) -> list[tuple[int, str]]:
    """A line holding several bars (a terminal's carriage-return redraws pasted as one line), cut before each bar's
    count: (offset, text) pieces, each read as its own line; one piece for a line with at most one bar."""
    found = bars(line)
    if len(found) < 2:
        return [(0, line)]
    cuts = [0] + [bar.start for bar in found] + [len(line)]
    return [(cuts[i], line[cuts[i] : cuts[i + 1]]) for i in range(len(cuts) - 1) if cuts[i + 1] > cuts[i]]

"""The key-value tables of openai-baselines' logger and of the stable-baselines that copied it: one table one dump of
one iteration's values, read as one metric record.

    Iteration 3027                                   (the loop's own line before the dump, where it prints one)
    kl just right!
    ---------------------------------
    | approxkl           | nan      |               a row: `| key | value |`, the keys sorted
    | n_updates          | 30       |               its step
    | value_loss         | nan      |
    ---------------------------------
    | time/              |          |               stable-baselines3: a tag's row, then its keys indented
    |    iterations      | 3        |               (time/iterations)

baselines/logger.py HumanOutputFormat.writekvs (openai/baselines ea25b9e, :37-63) writes the rows sorted by key
(:58) as `'| %s%s | %s%s |'` (:59) between two rules of dashes (:56), a float as `'%-8.3g'` (:42: nan as `nan`), and
stable-baselines copies it (hill-a/stable-baselines 259f278 stable_baselines/logger.py:90; its PPO2 logs `n_updates`,
ppo2/ppo2.py:394); stable-baselines3's HumanOutputFormat.write (DLR-RM/stable-baselines3 e05d2dbe
stable_baselines3/common/logger.py:203-208, :227-233) writes a row `| tag/ |  |` for each tag, the tag's keys after
it indented by three spaces (`time/iterations`, on_policy_algorithm.py:289; `train/n_updates`, ppo/ppo.py:297). So the row
order says nothing about which value went non-finite first: they are one iteration's.

A row is a line of exactly three `|` whose key starts with a letter (its value a number, a NaN/Inf word, a string
the logger printed, or empty: a tag's row); lines are split by hand (no regex over them), at most MAX_ROWS a table.

    table = read(block, start, number, clean)     # the table holding the row at `start`, or None
    table.line(), table.step, table.step_from      # a `key=value` line of its record; where its step comes from
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from nanscope.launch import line_steps
from nanscope.launch.scales import SCALE_KEYS

MAX_ROWS = 256  # rows of one table read
MAX_ROW = 400  # characters of a row
_BEFORE = 4  # lines before a table where the loop's `Iteration N` line is looked for
# the step rows, the first found wins: baselines' PPO2 `nupdates`, stable-baselines' `n_updates`, SB3's
# `train/n_updates` and `time/iterations`, then the timesteps
_STEPS = ("n_updates", "train/n_updates", "nupdates", "iterations", "time/iterations", "iteration", "iters",
          "total_timesteps", "time/total_timesteps", "timesteps_so_far", "serial_timesteps")  # fmt: skip
_ITERATION = re.compile(r"[\s*=#-]{0,40}(?:iteration|iter|update)\s{0,4}[:=#]?\s{0,4}(?P<step>\d{1,12})\b",
                        re.IGNORECASE)  # fmt: skip
_NONFINITE = ("nan", "-nan", "inf", "-inf", "+inf", "infinity", "-infinity")
# the policy's own values (its loss, its KL to the old policy, its entropy) and the value function's
_POLICY = ("approxkl", "approx_kl", "kl", "policy_loss", "policy_gradient_loss", "pg_loss", "policy_entropy",
           "entropy", "entropy_loss", "clipfrac", "clip_fraction", "std", "actor_loss", "pi_loss")  # fmt: skip
_VALUE = ("value_loss", "vf_loss", "critic_loss", "qf_loss", "qf1_loss", "qf2_loss", "evafter", "evbefore")


def row(line: str) -> tuple[str, str, bool] | None:
    """(key, value, indented) of a logger table's row `| key | value |`; None: not one."""
    text = line.strip()
    if len(text) > MAX_ROW or not text.startswith("|") or not text.endswith("|") or text.count("|") != 3:
        return None
    _, key, value, _ = text.split("|")
    name, value = key.strip(), value.strip()
    if not name or not (name[0].isalpha() or name[0] == "_"):
        return None
    if len(value) > 60:  # a value as the logger cuts it (baselines' _truncate: 23 characters)
        return None
    if not value and not name.endswith("/"):
        return None
    return name, value, key.startswith("    ")


def is_rule(line: str) -> bool:
    """A logger table's rule: dashes only."""
    text = line.strip()
    return 4 <= len(text) <= MAX_ROW and not text.strip("-")


def _number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _value(value: str) -> bool:
    """A number or a NaN/Inf word (a string the logger printed, `Hopper-v2`, is no metric)."""
    return _number(value) or value.lower() in _NONFINITE


def nonfinite(value: str) -> bool:
    return value.lower() in _NONFINITE or (_number(value) and not math.isfinite(float(value)))


@dataclass
class LoggerTable:
    """One table: its (key, value, line) rows with SB3's tags joined to their keys, its step and where it ends.

    Attributes:
        rows: (full key, value, line number), in the printed order.
        first: the line of its first row; `last`: of its last.
        stop: the offset in the block where its last row ends.
        step: the step a step row or the loop's line before it names (None: neither).
        step_from: where the step came from, in words.
    """

    rows: list[tuple[str, str, int]] = field(default_factory=list)
    first: int = 0
    last: int = 0
    stop: int = 0
    step: int | None = None
    step_from: str | None = None

    def bad(self) -> list[tuple[str, str, int]]:
        return [(key, value, number) for key, value, number in self.rows if nonfinite(value)]

    def line(self) -> str:
        """Its record as one `key=value` line (what launch.metric_lines reads), its step first."""
        head = [] if self.step is None else [f"step={self.step}"]
        return " ".join(head + [f"{key.replace(' ', '_')}={value}" for key, value, _ in self.rows if _value(value)])

    def text(self) -> str:
        """Its non-finite rows and its step row, as printed (cut)."""
        bad = self.bad()
        shown = [f"| {key} | {value} |" for key, value, _ in bad[:4]]
        step = self.step_from or ""
        return (" ".join(shown) + (f" ({step})" if step else ""))[:300]

    def model(self) -> str | None:
        """The policy where one of its values is non-finite, else the value function (the critic)."""
        keys = [key.lower().rsplit("/", 1)[-1] for key, _, _ in self.bad()]
        if any(key in _POLICY for key in keys):
            return "policy"
        if any(key in _VALUE for key in keys):
            return "critic"
        return None

    def points_to(self) -> str:
        bad = [key for key, _, _ in self.bad()]
        keys = [key.lower().rsplit("/", 1)[-1] for key in bad]
        value = [key for key, low in zip(bad, keys) if low in _VALUE]
        policy = [key for key, low in zip(bad, keys) if low in _POLICY]
        order = "one iteration's dump, its rows sorted by key: their order does not say which went first"
        if policy and value:
            return (f"the policy ({', '.join(policy[:3])}) and the value function ({', '.join(value[:2])}) of the same "
                    f"update ({order}): a network or an input they share (observations, returns, advantages)")  # fmt: skip
        finite = [
            key for key, value, _ in self.rows if key.lower().rsplit("/", 1)[-1] in _VALUE and not nonfinite(value)
        ]
        if policy and finite:
            return (f"the policy's update: {', '.join(policy[:3])} non-finite while the value function's "
                    f"{', '.join(finite[:2])} in the same table are finite ({order})")  # fmt: skip
        if policy:
            return f"the policy's update: {', '.join(policy[:3])} non-finite ({order})"
        if value:
            return (f"the value function (the critic): {', '.join(value[:2])} non-finite while the policy's values "
                    f"are finite ({order}): the returns it is fit to, or its own update")  # fmt: skip
        return f"a non-finite logged value ({order})"


def _lines_before(block: bytes, start: int, count: int) -> list[tuple[int, str]]:
    """Up to `count` (start, text) lines before the line at `start`, nearest first."""
    out, end = [], start - 1
    while end >= 0 and len(out) < count:
        begin = block.rfind(b"\n", 0, end) + 1
        out.append((begin, block[begin:end][: MAX_ROW + 1].decode("utf-8", "replace")))
        end = begin - 1
    return out


def read(block: bytes, start: int, number: int, clean) -> LoggerTable | None:
    """The logger table holding the row at `start` (the log's line `number`), read from its first row to its last;
    None: that line is no row."""
    rows: list[tuple[str, str, bool, int]] = []
    top, top_number = start, number
    for begin, text in _lines_before(block, start, MAX_ROWS):
        found = row(clean(text))
        if found is None:
            break
        top, top_number = begin, top_number - 1
        rows.insert(0, (*found, top_number))
    at, line, stop = start, number, start
    while at < len(block) and len(rows) < 2 * MAX_ROWS:
        end = block.find(b"\n", at)
        end = len(block) if end < 0 else end
        found = row(clean(block[at : min(end, at + MAX_ROW + 1)].decode("utf-8", "replace")))
        if found is None:
            break
        rows.append((*found, line))
        stop, at, line = end, end + 1, line + 1
    if len(rows) < 2 or not any(row_number == number for *_, row_number in rows):
        return None
    table = LoggerTable(first=rows[0][3], last=rows[-1][3], stop=stop)
    tag = None
    for key, value, indented, row_number in rows:
        if not value and key.endswith("/"):
            tag = key
            continue
        tag = tag if indented else None
        table.rows.append(((tag or "") + key, value, row_number))
    _step(table, block, top, top_number, clean)
    return table


def _step(table: LoggerTable, block: bytes, top: int, top_number: int, clean) -> None:
    """The table's step: a step row's, else the loop's `Iteration N` line a few lines before it."""
    values = {key.lower(): value for key, value, _ in table.rows}
    for key in _STEPS:
        value = values.get(key)
        if value is not None and _number(value) and math.isfinite(float(value)):
            table.step, table.step_from = int(float(value)), line_steps.with_rounding(f"the table's {key} row", value)
            return
    for distance, (_, text) in enumerate(_lines_before(block, top, _BEFORE + 1), start=1):
        text = clean(text)
        if row(text) is not None:
            return  # the table before this one
        if is_rule(text) or not text.strip():
            continue
        match = _ITERATION.match(text[:200])
        if match is not None:
            table.step = int(match["step"])
            table.step_from = f"the line before the table, line {top_number - distance}: {text.strip()[:60]}"
            return


def feed(metrics, table: LoggerTable) -> None:
    """Feed `table`'s record to `metrics` (launch.metric_lines.MetricLines) as one metric line at its first non-finite
    row; a first reading it makes is said as the table's: its rows, its step's source, its model."""
    bad = table.bad()
    before = metrics.first
    scale = next((number for key, _, number in table.rows if key.lower() in SCALE_KEYS), None)  # said at its row
    number = bad[0][2] if bad else scale or table.last
    metrics.feed(table.line(), number)
    if scale is not None:
        metrics.scale.at_row(number, scale)
    first = metrics.first
    if first is None or first is before:
        return
    if table.step is not None:
        first.step_from = table.step_from
    first.text, first.points_to = table.text(), table.points_to()
    first.model = table.model() or first.model

"""Metric-line shapes beside launch.metric_lines' key/value ones: the steps some stacks write their own way, a meter's
running average, a name of several words on a line of its own, and a bare `step value` column.

    [2020-05-04 10:11:00] Ep. 1 : Up. 300 : Sen. 76,800 : Cost nan : Time 60.00s         Marian NMT (`Up.`: updates)
    [step] 104 [Loss] nan [LR] 0.0001                                                       a bracketed step field
    [5000] loss nan / model_loss nan / actor_loss 0.5                                       a bare step at a line's head
     Learning iteration 121/1500  ...  Value function loss: inf                           rsl-rl's block
    loss: 2.1100 (nan)  grad_norm: 0.3900 (nan)                                             MetricLogger: median (global_avg)
    76980 nan                                                                               yanmtt: `print(ctr, lv)`

Every pattern is linear: no quantifier nests over the characters of another next to it.
"""

from __future__ import annotations

import re

from nanscope.facts.metric_names import STEP_SETTINGS
from nanscope.launch import named_arrays

WINDOW = 8192
BLOCK_LINES = 24  # lines of an rsl-rl block after its `Learning iteration` header
AVERAGE = " (running average)"  # the suffix of a key whose running average is the value read

_NUMBER = r"[-+]?(?:nan|inf(?:inity)?|\d[\d.]{0,40}(?:[eE][-+]?\d{1,4})?)(?![\w.])"
# Marian's Scheduler prints `Ep. {epochs} : Up. {batches} : Sen. {samples} : Cost ...` (marian-nmt/marian
# src/training/scheduler.h): `Up.` counts the updates
_UPDATES = re.compile(r"\bEp\.\s{1,4}\d{1,9}\s{1,4}:\s{1,4}Up\.\s{1,4}(?P<step>\d{1,12})\b")
# a step in a bracketed field name: `[step] 104 [Loss] nan` (lion-pytorch-like examples)
_FIELD_STEP = re.compile(
    r"\[(?:step|iter|iteration|update)\]\s{0,4}(?:[:=]\s{0,4})?(?P<step>\d{1,12})\b", re.IGNORECASE
)
# a field named in brackets (`[Loss] nan`)
_BRACKETED = re.compile(
    rf"\[(?P<key>[A-Za-z_][\w./-]{{0,40}})\]\s{{0,4}}(?:[:=]\s{{0,4}})?(?P<value>{_NUMBER})", re.IGNORECASE
)
# a bare step in brackets at a line's head, before named values (DreamerV3's `[5000] loss 1.2 / ...`)
_BARE_STEP = re.compile(r"\s{0,8}\[(?P<step>\d{1,12})\]\s{1,8}[A-Za-z_]")
# rsl-rl's header: `Learning iteration {it}/{total}` (rsl_rl/runners/on_policy_runner.py:178 at ff9e971,
# rsl_rl/utils/logger.py:237 today), the loss lines under it right-aligned (`{'Value function loss:':>35}`)
_HEADER = re.compile(r"Learning iteration\s{1,4}(?P<step>\d{1,12})\s{0,4}/\s{0,4}\d{1,12}")
# a name of several words, right-aligned on a line of its own (rsl-rl: `      Value function loss: inf`)
_SPACED = re.compile(rf"\s{{2,80}}(?P<key>[A-Za-z][A-Za-z0-9_./()-]{{0,40}}(?: [A-Za-z0-9_./()-]{{1,40}}){{1,6}}):\s{{1,8}}(?P<value>{_NUMBER})\s{{0,8}}\Z", re.IGNORECASE)  # fmt: skip
# ... unindented, alone on its line: a record printed a key per line (ericyangyu/PPO-for-Beginners
# graph_code/ppo_for_beginners/ppo.py at 06fecf6, _log_summary: `Average Episodic Return: {avg_ep_rews}` under
# `---- Iteration #N ----`, holdout23 15)
_ALONE = re.compile(rf"(?P<key>[A-Za-z][A-Za-z0-9_./()-]{{0,40}}(?: [A-Za-z][A-Za-z0-9_./()-]{{0,40}}){{1,5}}):\s{{1,8}}(?P<value>{_NUMBER})\s{{0,8}}\Z", re.IGNORECASE)  # fmt: skip
# a name of several words before its `: value` on a line of such pairs: rl_coach's Logger.log_dict prints `{prefix} - `
# then `{key}: {value} ` for each (`Policy training - Surrogate loss: nan KL divergence: nan Entropy: nan training
# epoch: 2`), uncoloured `{prefix}> {key}={value}, ...` (IntelLabs/coach v1.0.0 rl_coach/logger.py:89-100, its keys
# clipped_ppo_agent.py:280-289): the words between one value and the next key are that key's
_WORDS_AFTER = re.compile(r"\s{0,4}[,;]?\s{1,4}(?P<words>(?:[A-Za-z][A-Za-z0-9]{1,30} ){1,3})")
_WORDS_FIRST = re.compile(r"(?:\A|[-:>|\]]\s{1,4})(?P<words>(?:[A-Za-z][A-Za-z0-9]{1,30} ){1,3})\Z")
# words that are no part of a metric's name: a sentence's, a logger's level, a unit after the value before
_NOT_NAMES = frozenset(("of", "the", "a", "an", "no", "any", "for", "in", "on", "at", "with", "to", "from", "by", "and",
                        "or", "not", "is", "was", "are", "were", "found", "contains", "has", "have", "had", "info",
                        "warning", "warn", "error", "debug", "critical", "ms", "sec", "secs", "min", "mins", "it",
                        "gb", "mb", "gib", "mib", "tokens", "samples", "iters"))  # fmt: skip


def worded(text: str, matches: list) -> dict[int, str]:
    """The keys of `key: value` / `key=value` matches (launch.line_pairs' plain ones, in order) that are names of
    several words (`KL divergence: nan`), by index; {} unless at least two of them are separated by `:` or `=`."""
    separated = [i for i, m in enumerate(matches) if ":" in text[m.end("key") : m.start("value")]
                 or "=" in text[m.end("key") : m.start("value")]]  # fmt: skip
    if len(separated) < 2:
        return {}
    out = {}
    for i in separated:
        start = matches[i].start("key")
        if i == 0:
            found = _WORDS_FIRST.search(text, max(0, start - 100), start)
        else:
            found = _WORDS_AFTER.fullmatch(text, matches[i - 1].end("value"), start)
        words = found["words"].split() if found is not None else []
        if words and not _NOT_NAMES.intersection(word.lower() for word in words):
            out[i] = " ".join(words + [matches[i]["key"]])
    return out


# a group's name before its `key=value` pairs: a statistic's pairs under a colon (`Reward: mean=nan, min=nan`, an eval
# line, holdout25 15), any pairs in brackets (icefall's `train_loss[loss=nan, ArTop10Accuracy=0, ...], tot_loss[...]`:
# its MetricsTracker's str, holdout25 24); the pairs' keys are the group's. Other pairs after a colon keep their keys
# (`Eval: step=5 loss=nan`, `Results: val_loss=nan`: the head is a caption, the keys whole)
_GROUP_HEAD = re.compile(r"(?:\A|(?<=[\s,;|]))(?P<head>[A-Za-z][\w./-]{0,60}):\s{1,4}\Z")
_IN_GROUP = re.compile(r"\s{0,4},\s{0,4}|\s{1,4}")  # what lies between two pairs of one group
_STATISTICS = frozenset(("mean", "min", "max", "std", "median", "avg", "average", "sum", "var", "count", "last"))
# a head that names a logger's level or a process, no group (`INFO: mean=nan`, `rank0: mean=nan`)
_NOT_HEAD = re.compile(r"info|warning|warn|error|debug|critical|(?:local_)?rank\d{0,9}|worker\d{0,9}", re.IGNORECASE)


def grouped(text: str, matches: list) -> dict[int, str]:
    """The keys of `key=value` matches (launch.line_pairs' plain ones, in order) inside a named group, by index:
    `Reward: mean=nan, std=nan` as `Reward mean`, `Reward std`; `train_loss[loss=nan, acc=0]` as `train_loss loss`,
    `train_loss acc`."""
    out, head, close, end = {}, None, -1, -1
    for i, m in enumerate(matches):
        if "=" not in text[m.end("key") : m.start("value")]:
            head = None
            continue
        key = m["key"]
        if "[" in key and "]" not in key:  # `train_loss[loss`: a bracketed group opens in the key
            head, key = key.split("[", 1)
            close = text.find("]", m.end("value"), m.end("value") + 2000)
        elif head is not None and (
            0 <= close < m.start() or close < 0 and not _IN_GROUP.fullmatch(text, end, m.start())
        ):
            head = None  # past the group's `]`, or something else between its pairs
        elif head is not None and close < 0 and key.lower() not in _STATISTICS:
            head = None  # a colon's group holds statistics only
        found = _GROUP_HEAD.search(text, max(0, m.start() - 70), m.start()) if head is None else None
        if found is not None and key.lower() in _STATISTICS and not _NOT_HEAD.fullmatch(found["head"]):
            head, close = found["head"], -1
        if head is not None:
            out[i] = f"{head} {key}"
        end = m.end("value")
    return out


# MetricLogger's meter, `{median:.4f} ({global_avg:.4f})` (facebookresearch/deit utils.py:33, SmoothedValue; timm,
# BEiT and VideoMAE print the same): the parenthesised value is the mean since the start
_AVERAGED = re.compile(
    r"(?<![\w./-])(?P<key>[A-Za-z_][\w./-]{0,100}):\s{1,8}[-+]?(?:nan|inf|\d[\d.]{0,40}(?:[eE][-+]?\d{1,4})?)"
    r"\s{1,4}\((?P<value>[-+]?(?:nan|inf))\)",
    re.IGNORECASE,
)
# yanmtt's pretrain_nmt.py:281 (prajdabre/yanmtt at 8a91fdf): `print(ctr, lv)` every 10 batches
_BARE_PAIR = re.compile(rf"\s{{0,8}}(?P<step>\d{{1,12}})\s{{1,8}}(?P<value>{_NUMBER})\s{{0,8}}\Z", re.IGNORECASE)


def named_step(piece: str) -> tuple[int, str] | None:
    """The step a line writes its own way (Marian's `Up.`, `[step] N`, a bare `[N]` at its head), and how."""
    for pattern, how in ((_UPDATES, "the line (Marian's `Up.`: the update count)"), (_FIELD_STEP, "the line")):
        match = pattern.search(piece, 0, WINDOW)
        if match is not None:
            return int(match["step"]), how
    match = _BARE_STEP.match(piece)
    return (int(match["step"]), "the line (the bracketed number at its head)") if match is not None else None


def bracketed(text: str) -> list[tuple[str, str, int]]:
    """`[Name] value` fields (`[step] 104 [Loss] nan [LR] 0.0001`), where a line has at least two; else a bracketed
    list of names over an array of values (launch.named_arrays)."""
    found = [(m["key"], m["value"], m.start("value")) for m in _BRACKETED.finditer(text, 0, WINDOW)]
    return found if len(found) >= 2 else named_arrays.read(text)  # `[Total Loss, KL Loss] : [nan 2.3]`


def block_header(line: str) -> int | None:
    """The iteration of rsl-rl's `Learning iteration N/M` header line, or None."""
    match = _HEADER.search(line, 0, 400)
    return int(match["step"]) if match is not None else None


def spaced(line: str) -> list[tuple[str, str, int]]:
    """A line of one indented `Name of words: value` (rsl-rl's block), or of one unindented such pair whose words
    are a name's (PPO-for-Beginners' `Average Episodic Return: nan` under its banner), as one pair; [] otherwise."""
    match = _SPACED.match(line[:WINDOW]) or _ALONE.match(line[:WINDOW])
    if match is None or match.re is _ALONE and _NOT_NAMES.intersection(match["key"].lower().split()):
        return []
    return [(match["key"], match["value"], match.start("value"))]


def averages(piece: str) -> list[tuple[str, str, int]]:
    """The non-finite running averages of `name: median (global_avg)` meters, as (`name (running average)`, value,
    where)."""
    return [(m["key"] + AVERAGE, m["value"], m.start("value")) for m in _AVERAGED.finditer(piece, 0, WINDOW)]


def bare_pair(line: str) -> tuple[int, str] | None:
    """A line of a step and a value alone (`76980 nan`): (step, value)."""
    match = _BARE_PAIR.match(line[:200])
    return (int(match["step"]), match["value"]) if match is not None else None


def separated(piece: str, at: int) -> bool:
    """The value at `at` follows a `:` or `=` (a counter's field), not a space alone (`Skipped 50 iterations`: prose)."""
    before = piece[max(0, at - 48) : at].rstrip(" '\"")
    return before.endswith((":", "="))


def percent(piece: str, at: int, value: str) -> bool:
    """The value at `at` is a percentage (`Steps:   0%|`): a bar's progress, never a step."""
    return piece[at + len(value) : at + len(value) + 1] == "%"


def setting(piece: str, at: int, key: str) -> bool:
    """The step key ending at `at` is the last word of a setting's name (Unsloth's banner: `Gradient accumulation
    steps = 4` reads as the key `steps`): the word before it, with no separator between, names a setting."""
    start = piece.rfind(key, 0, at)
    words = piece[max(0, start - 40) : max(0, start)].rstrip(" _").rsplit(None, 1)
    return start > 0 and piece[start - 1] in " _" and bool(words) and words[-1].lower() in STEP_SETTINGS


def counted(steps: list[int], piece: str) -> tuple[list[tuple[str, str, int]], list[int]]:
    """A bare `step value` line continuing the counter of the lines just before it (yanmtt's `print(ctr, lv)`),
    read as (`step`, ...), (`value`, ...), and the counter's steps; [] where the lines before do not make it a counter
    (two numbers on a line are no metric by themselves)."""
    pair = bare_pair(piece)
    if pair is None or series(steps, pair[0]) is None:
        return [], steps
    return [("step", str(pair[0]), 0), ("value", pair[1], piece.rindex(pair[1]))], steps[-2:] + [pair[0]]


def series(steps: list[int], step: int) -> int | None:
    """The stride of a counter: `steps` (at least two, rising by one stride) continued by `step`; None otherwise."""
    if len(steps) < 2:
        return None
    run = steps[-2:] + [step]
    stride = run[1] - run[0]
    return stride if stride > 0 and run[2] - run[1] == stride else None


def trainer_dict(text: str) -> bool:
    """A transformers Trainer's logged dict (`{'loss': nan, 'grad_norm': nan, ...}`), which belongs to the step its
    progress bar shows: Trainer._inner_training_loop adds 1 to state.global_step and runs on_step_end, where
    ProgressCallback updates the bar to global_step, before _maybe_log_save_evaluate logs the dict, which
    ProgressCallback.on_log prints with tqdm.write: it clears the bar, prints the dict, and redraws the bar at the
    same count (transformers 4.57.6 trainer.py:2753-2756, trainer_callback.py:651-653, :676-693). So the bar after
    the dict gives its step, and a bar on the line before may lag (tqdm redraws at most every mininterval). A bar
    glued before the dict on its line is left to `bars.step_at` (its count + 1): real pasted logs (LLaMA-Factory's PPO
    loop, tests/fixtures/reports/real/llama-factory-357.txt) show dicts glued after the bar of the step before."""
    return "{'" in text


def evaluation_dict(text: str) -> bool:
    """A Trainer dict of an evaluation or of the run's end (`{'eval_loss': ...}`, `{'train_runtime': ...}`): no
    logging step of its own."""
    head = text[:200]
    return "{'eval_" in head or "'train_runtime'" in head


def logs_its_step(text: str) -> bool:
    """A Trainer dict with its `grad_norm` (transformers 4.38 on, `_maybe_log_save_evaluate`): glued after a bar, it
    was printed with the bar at its own step (the order above; transformers 5.10.4 trainer.py:1781-1784, the bar's
    update at trainer_callback.py:650, the dict's write at :690), so the bar's count is its step. A dict without it
    (LLaMA-Factory's PPO loop, which prints inside the step before its bar moves) keeps the count + 1."""
    return trainer_dict(text) and "'grad_norm'" in text or _METRIC_CHECK.search(text, 0, 2000) is not None


# a logging callback's check on a metric it is about to log (`Warning: Metric attention/early/mdi is NaN/Inf: nan`,
# JuncyLu/trl_DAPO's, holdout21 10): printed while the step's logs are written, after the bar moved to the step
_METRIC_CHECK = re.compile(r"\bmetric\s+\S{1,120}\s+is\s+(?:nan|inf)", re.IGNORECASE)

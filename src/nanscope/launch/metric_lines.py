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

import re
from dataclasses import dataclass, field

WINDOW = 8192  # characters of a line parsed
LOOKAHEAD = 8  # lines after a reading without a step where the next progress bar gives it
_VALUE = r"'[^'\n]{0,40}'|\"[^\"\n]{0,40}\"|[-+]?(?:nan(?:\.0)?|inf(?:inity)?|\d[\d.]{0,40}(?:[eE][-+]?\d{1,4})?)(?![A-Za-z_])"
_QUOTED = re.compile(
    rf"(?P<key>'[^'\n]{{1,120}}'|\"[^\"\n]{{1,120}}\")\s{{0,8}}:\s{{0,8}}(?P<value>{_VALUE})", re.IGNORECASE
)
_PLAIN = re.compile(rf"(?<![\w./()-])(?P<key>[A-Za-z_][\w./()\[\]-]{{0,100}})(?:\s{{0,3}}[:=]\s{{0,30}}|\s{{1,3}})(?P<value>{_VALUE})", re.IGNORECASE)  # fmt: skip
_FIELD = re.compile(rf"\s{{0,40}}(?P<key>[A-Za-z_][\w ./()\[\]-]{{0,100}}?)\s{{0,3}}[:=]?\s{{1,40}}(?P<value>{_VALUE})(?:/\s{{0,12}}\d{{1,12}})?", re.IGNORECASE)  # fmt: skip
_BAR = re.compile(r"(?P<count>\d{1,12})/(?P<total>\d{1,12}) \[\d")
# a progress bar that counts no training step (a dataset's map, a download)
_NOT_STEPS = re.compile(r"^\s{0,8}(?:Map|Filter|Tokeniz|Load|Download|Generat|Process|Extract|Convert|Fetch|Sav|Cast|"
                        r"Running)|examples/s|ex/s|B/s\]")  # fmt: skip
_EPOCH_ITER = re.compile(r"\]\[(?P<step>\d{1,12})/\d{1,12}\]")
_WRAP = re.compile(r"\s{2,40}[-\d]?")  # a terminal's wrap inside a quoted key, and the stray character after it
_STEP_KEYS = ("step", "global_step", "iteration", "iter", "steps", "updates", "global_step/max_steps", "it")
_SETTINGS = ("max_", "min_")  # a setting printed beside the metrics (`max_grad_norm: inf`), not a value that went bad
_NONFINITE = ("nan", "nan.0", "inf", "-inf", "+inf", "infinity", "-infinity")
# key (lowered, last part) -> cumulative; a counter of skipped or NaN steps
COUNTERS = {"number of skipped iterations": False, "number of nan iterations": False, "inf_nan_skip_batches": True,
            "skipped": True, "skipped_steps": True}  # fmt: skip
_ITERATION = ("consumed samples", "elapsed time per iteration (ms)")
# keys that say a preference (DPO) or an RL log: there the unprefixed loss and gradient are the policy's
_PREFERENCE = ("rewards/chosen", "logps/chosen", "logits/chosen", "rewards_train/chosen", "logps_train/chosen")
_RL = ("reward", "reward_std", "kl", "ppo_kl", "advantages", "returns", "completion_length", "act_loss")
_PRIMARY = ("loss", "grad_norm", "grad norm", "lm loss", "logps", "logp", "rewards", "act_loss", "pg_loss")
# verl logs its data metrics under `critic/` too (compute_data_metrics): the scores and rewards are the reward's,
# the advantages and returns computed from them; `critic/kl` is the KL in the reward
_MODELS = (("critic/score", "reward"), ("critic/rewards", "reward"), ("critic/advantages", None),
           ("critic/returns", None), ("critic/kl", None), ("actor/", "actor"), ("critic/", "critic"), ("ref/", "reference"), ("reference/", "reference"),
           ("reward_model/", "reward model"), ("act_", "actor"), ("cri_", "critic"), ("vf_", "critic"),
           ("policy_loss", "policy"), ("actor_loss", "actor"), ("critic_loss", "critic"), ("value_loss", "critic"),
           ("ref_", "reference"))  # fmt: skip


def _key(text: str) -> str:
    """A key as printed, without its quotes and a terminal's wrap inside it."""
    text = text.strip().strip("'\"")
    return _WRAP.sub("", text) if "  " in text else text


def _number(value: str) -> float | None:
    value = value.strip("'\"")
    try:
        return float(value)
    except ValueError:
        return None


def _nonfinite(value: str) -> bool:
    return value.strip("'\"").lower() in _NONFINITE


def pairs(line: str) -> list[tuple[str, str, int]]:
    """(key, value, where) of a metric line, in order, by its shape: quoted keys (with the plain `key=value` pairs
    around a dict), `|` fields (where at least two parse), else `key: value` / `key=value` / `key value`."""
    text = line[:WINDOW]
    if "{'" in text or '{"' in text or "': " in text or '": ' in text:
        quoted = [(_key(m["key"]), m["value"], m.start("value"), m.start()) for m in _QUOTED.finditer(text)]
        spans = [(start, at) for _, _, at, start in quoted]
        plain = [
            (_key(m["key"]), m["value"], m.start("value"))
            for m in _PLAIN.finditer(text)
            if not any(start <= m.start() <= at for start, at in spans) and "'" not in m["key"]
        ]
        return sorted([(key, value, at) for key, value, at, _ in quoted] + plain, key=lambda item: item[2])
    if text.count("|") >= 2:
        out, at = [], 0
        for part in text.split("|"):
            match = _FIELD.match(part)
            if match is not None and match.end() >= len(part.rstrip()) - 1:
                out.append((_key(match["key"]), match["value"], at + match.start("value")))
            at += len(part) + 1
        if len(out) >= 2:
            return out
    return [(_key(m["key"]), m["value"], m.start("value")) for m in _PLAIN.finditer(text)]


def _is_step_key(key: str) -> bool:
    low = key.lower()
    return low in _STEP_KEYS or low.rsplit("/", 1)[-1] in _STEP_KEYS or low.rsplit(" ", 1)[-1] in _STEP_KEYS


@dataclass
class Reading:
    """The first metric line with a non-finite value.

    Attributes:
        line: its line in the log.
        step: the step it names, or that its progress bar gives (None: not said).
        step_from: where the step came from.
        after: the last step an earlier metric line named, when this one names none.
        values: the non-finite (key, value) pairs, in the line's order: the first is `metric`.
        model: actor, critic, policy, reference, reward model, or None (one model alone is not named).
        finite: the line's finite loss and gradient-norm values, key -> value.
        points_to: what that points to, in one sentence.
        text: the line, cut.
    """

    line: int
    step: int | None
    step_from: str | None
    after: int | None
    values: list[tuple[str, str]]
    model: str | None
    finite: dict[str, float]
    points_to: str
    text: str

    @property
    def metric(self) -> str:
        return self.values[0][0]

    def to_dict(self) -> dict:
        return {"line": self.line, "step": self.step, "step_from": self.step_from, "after_step": self.after,
                "metric": self.metric, "model": self.model, "values": [list(pair) for pair in self.values],
                "finite": self.finite, "points_to": self.points_to, "text": self.text}  # fmt: skip


@dataclass
class Counter:
    """A skip counter that rose: steps with inf/NaN gradients skipped."""

    key: str
    value: int
    line: int
    step: int | None
    cumulative: bool

    def to_dict(self) -> dict:
        return {"key": self.key, "value": self.value, "line": self.line, "step": self.step,
                "cumulative": self.cumulative}  # fmt: skip


@dataclass
class MetricLines:
    """The metric lines of a log, fed in order (`feed`); keeps the first non-finite reading and counters."""

    first: Reading | None = None
    counters: list[Counter] = field(default_factory=list)
    later: int = 0  # metric lines with a non-finite value after the first
    keys: set[str] = field(default_factory=set)  # every key seen (the stack's shape: launch.stacks)
    bar: int | None = None  # the last progress bar's count
    bar_line: int = 0
    explicit: int | None = None  # the last step a metric line named
    loss_keys: set[str] = field(default_factory=set)  # the loss fields of Megatron's iteration lines so far
    pending: int | None = None  # the line of a first reading still without a step (the next bar gives it)
    seen: dict[str, int] = field(default_factory=dict)  # counter key -> its last value

    def feed(self, line: str, number: int) -> None:
        found = pairs(line)
        self.bars(line, number)
        if not found:
            return
        self.keys.update(key.lower() for key, _, _ in found[:64])
        step, step_from = self._step(line, found)
        self._counters(found, number, step)
        # a missing loss first: Megatron prints `lm loss` before `loss scale` and `grad norm`
        bad = self._missing_loss(found)
        bad += [
            (key, value)
            for key, value, _ in found
            if _nonfinite(value) and not _is_step_key(key) and not key.lower().startswith(_SETTINGS)
        ]
        if bad and len(found) >= 2:
            if self.first is None:
                self._first(line, number, found, bad, step=step, step_from=step_from)
            else:
                self.later += 1
        if step is not None and step_from == "the line":
            self.explicit = step

    def context(self, lines: list[bytes], clean) -> None:
        """Lines just before a candidate line (not read as candidates: all finite): the step they name and their
        keys (a metric line cut before its step is after the step the one before it named)."""
        for raw in lines:
            found = pairs(clean(raw.decode("utf-8", "replace")))
            if len(found) >= 2:
                self.keys.update(key.lower() for key, _, _ in found[:64])
                step, step_from = self._step("", found)
                if step is not None and step_from == "the line":
                    self.explicit = step

    def bars(self, line: str, number: int) -> None:
        """The progress bar on `line` (the step of a metric line that names none; a first reading's pending step)."""
        bars = list(_BAR.finditer(line, 0, WINDOW))
        if bars and _NOT_STEPS.search(line, 0, 200) is None:
            self.bar, self.bar_line = int(bars[-1]["count"]), number
            if self.pending is not None and self.first is not None and number - self.pending <= LOOKAHEAD:
                self.first.step, self.first.step_from = self.bar, "the progress bar after it"
            self.pending = None

    def _step(self, line: str, found) -> tuple[int | None, str | None]:
        for key, value, _ in found:
            if _is_step_key(key):
                number = _number(value.strip("'\"").split("/")[0])
                if number is not None:
                    return int(number), "the line"
        match = _EPOCH_ITER.search(line, 0, WINDOW)
        if match is not None:
            return int(match["step"]), "the line (the iteration within its epoch)"
        bar = _BAR.search(line, 0, found[0][2] if found else WINDOW)
        if bar is not None and _NOT_STEPS.search(line, 0, 200) is None:
            return int(bar["count"]), "the progress bar on its line"
        return None, None

    def _counters(self, found, number: int, step: int | None) -> None:
        for key, value, _ in found:
            name = key.lower()
            if name not in COUNTERS or (count := _number(value)) is None:
                continue
            count, before = int(count), self.seen.get(name)
            self.seen[name] = count
            cumulative = COUNTERS[name]
            rose = count > 0 and (not cumulative or before is None or count > before)
            if rose and not any(counter.key == key for counter in self.counters):
                known = step if (not cumulative or (before is not None and count > before)) else None
                self.counters.append(Counter(key, count, number, known, cumulative))

    def _missing_loss(self, found) -> list[tuple[str, str]]:
        """Megatron's iteration line without the loss its earlier lines printed (or, with `loss scale` and no skip,
        without any loss): a NaN loss is not printed (training_log prints an average only when it is > 0)."""
        keys = {key.lower(): value for key, value, _ in found}
        if not any(key in keys for key in _ITERATION):
            return []
        losses = {key for key in keys if key.endswith(" loss") and key != "loss scale"}
        if losses:
            self.loss_keys |= losses
            return []
        skipped = _number(keys.get("number of skipped iterations", "0")) or 0
        if skipped > 0 or "loss scale" not in keys:
            return []
        return [(key, "missing") for key in sorted(self.loss_keys)] or [("lm loss", "missing")]

    def _first(self, line: str, number: int, found, bad, *, step: int | None, step_from: str | None) -> None:
        after = None
        if step is None and self.explicit is not None:
            after = self.explicit
        elif step is None and self.bar is not None and number - self.bar_line <= LOOKAHEAD:
            step, step_from = self.bar, "the progress bar before it"
        finite = {
            key: number_
            for key, value, _ in found
            if key.lower().rsplit("/", 1)[-1] in ("loss", "grad_norm", "grad norm", "lm loss")
            and (number_ := _number(value)) is not None
        }
        model = model_of([key for key, _ in bad], {key.lower() for key, _, _ in found})
        self.first = Reading(
            line=number,
            step=step,
            step_from=step_from,
            after=after,
            values=bad,
            model=model,
            finite=finite,
            points_to=points_to(bad, finite, model),
            text=line.strip()[:300],
        )
        if step is None and after is None:
            self.pending = number


def model_of(bad: list[str], keys: set[str]) -> str | None:
    """The one model whose metrics went non-finite: a key's prefix (`actor/`, `critic/`, ...) names it; in a
    preference or RL log the unprefixed loss, gradient norm, log-probs and rewards are the policy's. None: several
    models, or only a logged statistic (kl, logits, clip ratios) that is no model's failure."""
    models = set()
    rl = any(key in keys for key in _PREFERENCE + _RL)
    for key in bad:
        low = key.lower()
        prefix = next((prefix for prefix, _ in _MODELS if low.startswith(prefix)), None)
        named = dict(_MODELS)[prefix] if prefix is not None else None
        if prefix is None and rl and any(low.split("/")[0].startswith(word) for word in _PRIMARY):
            named = "policy"
        if named is not None:
            models.add(named)
    return models.pop() if len(models) == 1 else None


def points_to(bad: list[tuple[str, str]], finite: dict[str, float], model: str | None) -> str:
    """What the first non-finite metrics point to, from what else the line shows."""
    keys = [key.lower() for key, _ in bad]
    last = [key.rsplit("/", 1)[-1] for key in keys]
    loss_ok = any(k.rsplit("/", 1)[-1] in ("loss", "lm loss") and abs(v) > 0 for k, v in finite.items())
    grad_zero = any(k.rsplit("/", 1)[-1] in ("grad_norm", "grad norm") and v == 0.0 for k, v in finite.items())
    if any(value == "missing" for _, value in bad):
        return ("Megatron prints a loss only when its average is > 0, and NaN is not: the loss was NaN (or not "
                "reported) at this iteration")  # fmt: skip
    models = {model_of([key], set()) for key in keys}
    if {"actor", "critic"} <= models:
        return ("both the actor's and the critic's losses on the same logged step: the line cannot tell which went "
                "first (a shared input: the rewards, the advantages, or the rollout)")  # fmt: skip
    if model == "critic":
        return ("the critic (the value model): its value loss or gradient went non-finite while the actor's metrics "
                "on the line are finite: the returns or values it is fit to, or its own update")  # fmt: skip
    if all(key.startswith(("logits/", "clip_ratio/")) or key in ("kl", "clip_ratio") for key in keys) and loss_ok:
        return ("a logged statistic only (over the raw logits, or over an empty token set), while the loss on the line "
                "is finite: not a diverged model")  # fmt: skip
    if model == "reward" or any(
        key in ("reward_std", "reward", "rewards") or key.startswith("rewards/") and model is None for key in keys
    ):
        return "the reward: a reward function's NaN, or the spread of a group of one sample (std of one value)"
    if any(key.startswith(("logps", "rewards")) for key in keys):
        return ("the policy's forward pass: its log-probs are non-finite (a preference reward is a log-ratio of them); "
                "the reference's are not logged")  # fmt: skip
    if any(k in ("grad_norm", "grad norm") for k in last) and loss_ok:
        return ("the backward pass: the loss on the line is finite and the gradient norm is not (an fp16 loss scaler "
                "skipping the step, else a backward op: anomaly mode names it)")  # fmt: skip
    if any(k in ("loss", "lm loss") for k in last) and grad_zero:
        return ("a loss with no gradient: non-finite while the gradient norm is 0 (every token masked: 0/0, or the "
                "gradient zeroed)")  # fmt: skip
    if any("loss" in k for k in last):
        return "the forward pass or the loss itself: the loss is non-finite"
    return "a logged metric is non-finite"

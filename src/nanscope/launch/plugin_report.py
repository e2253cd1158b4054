"""nanscope's own plugins in a log: the line each prints on a non-finite step, and the report file it names.

Both plugins write the same report (slime_plugin.outputs.Reports: `rollout<U>_step<M>_rank<K>.json`) and print one
line naming it when their vote finds a non-finite step, before the rerun and before raise or skip:

    verl   nanscope: rank 1: non-finite values in the actor's update 0 mini-batch 0: DIR/rollout0_step0_rank1.json; ...
           (nanscope.verl_plugin.report; the critic's says "the critic's", its report under DIR/critic/)
    slime  nanscope: rank 1: non-finite values at rollout 3 step 0: DIR/rollout3_step0_rank1.json; ...
           (nanscope.slime_plugin.report)

and a warning line per threshold crossed (slime_plugin.logs.warnings_for, the same texts for both):

    verl   nanscope: warning: actor update 0 mini-batch 0: 1 non-finite loss input entries (log-probs or advantages)
    slime  nanscope: warning: rollout 3 step 0: nanscope/max_ppo_log_ratio = 95.21 > 60: past fp32's exp overflow ...

`match(text)` reads a report line, `warning(text)` a warning line; `read(path)` the report it names, where that file is here (doctor runs on another
machine as often as not: a report that is not here is said so, never guessed); `line(report, path)` is the line a
report file stands for, so that a report given to doctor alone is read as its line is. Pure but for reading a file.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from nanscope.facts.signals import BY_ID, WORDING

LINE = re.compile(
    r"nanscope: rank (?P<rank>\d{1,9}): non-finite values "
    r"(?:in the (?P<role>[a-z]{1,20})'s update (?P<update>\d{1,12}) mini-batch (?P<minibatch>\d{1,12})"
    r"|at rollout (?P<rollout>\d{1,12}) step (?P<step>\d{1,12})): (?P<path>[^;\n]{1,1000}?)(?:;|\s*$)"
)
WARNING = re.compile(
    r"nanscope: warning: (?:(?P<role>[a-z]{1,20}) update (?P<update>\d{1,12}) mini-batch (?P<minibatch>\d{1,12})"
    r"|rollout (?P<rollout>\d{1,12}) step (?P<step>\d{1,12})): (?P<text>.{1,600})"
)
_INPUTS = re.compile(r"(?P<count>\d{1,12}) non-finite loss input entries")
_RATIO = re.compile(
    r"(?P<name>nanscope/max_\w{1,20}_log_ratio) (?:= (?P<value>[\w.+-]{1,40}) > (?P<limit>[\w.+-]{1,40})|is NaN)"
)
WARNING_ANCHOR = "nanscope: warning: "
ANCHOR = "non-finite values"  # a literal every LINE holds (tested first: most log lines hold none)
MAX_BYTES = 1 << 20  # a report is a few kB; a larger file named .json is not one
KEYS = ("rank", "rollout_id", "step_id", "first_forward", "first_backward", "class")  # what makes a file a report


@dataclass(frozen=True)
class Line:
    """One plugin line: who saw what, where its report is.

    Attributes:
        plugin: "verl" or "slime" (whose words).
        rank: the rank that saw the value.
        role: verl's "actor" or "critic"; None for slime.
        update, step: verl's update and mini-batch, or slime's rollout and step.
        path: the report's path as printed ("no report written" where the plugin could not write one).
    """

    plugin: str
    rank: int
    role: str | None
    update: int
    step: int
    path: str

    def where(self) -> str:
        if self.plugin == "verl":
            return f"the {self.role}'s update {self.update} mini-batch {self.step}"
        return f"rollout {self.update} step {self.step}"


@dataclass(frozen=True)
class Report:
    """What a plugin report says (the keys of nanscope.verl_plugin.report / slime_plugin.report).

    Attributes:
        module, direction, microbatch: the first non-finite module output (forward) or gradient (backward); None
            where the sentinel named none (a non-finite loss, or inputs alone).
        cause: the class of cause (trace.sentinels.classify), e.g. "model-forward".
        verdict: the rerun's ("reproducible", "not reproducible"), None where no rerun ran.
        bundle: the repro bundle's path, None where none was written.
    """

    rank: int
    role: str | None
    update: int
    step: int
    module: str | None
    direction: str | None
    microbatch: int | None
    cause: str | None
    verdict: str | None
    bundle: str | None

    def text(self) -> str:
        """The report in one sentence."""
        parts = []
        if self.module is not None:
            parts.append(f"first non-finite at {self.module} ({self.direction}, micro-batch {self.microbatch})")
        else:
            parts.append("no module named (the loss or its inputs)")
        if self.cause:
            parts.append(f"class {self.cause}")
        parts.append(f"rerun: {self.verdict}" if self.verdict else "no rerun")
        if self.bundle:
            parts.append(f"replay: nanscope trace {self.bundle}")
        return "; ".join(parts)


def match(text: str) -> Line | None:
    """The plugin line in `text` (one log line), or None."""
    found = LINE.search(text) if ANCHOR in text else None
    if found is None:
        return None
    verl = found["role"] is not None
    return Line(
        plugin="verl" if verl else "slime", rank=int(found["rank"]), role=found["role"],
        update=int(found["update"] if verl else found["rollout"]), step=int(found["minibatch"] if verl else found["step"]),
        path=found["path"].strip(),
    )  # fmt: skip


@dataclass(frozen=True)
class Warning:
    """One warning line the plugin printed at a step's end (the step went on).

    Attributes:
        kind: "inputs" (non-finite loss inputs replaced and dropped) or "log-ratio" (a log-ratio past a threshold).
        where: the step in the plugin's words ("the actor's update 0 mini-batch 0", "rollout 3 step 0").
        update: verl's update or slime's rollout.
        count: the non-finite entries ("inputs").
        name, value: the metric and its value as printed ("log-ratio"; value "NaN" where it was NaN).
        text: what the warning says after its head.
    """

    kind: str
    where: str
    update: int
    plugin: str
    count: int | None = None
    name: str | None = None
    value: str | None = None
    text: str = ""


def warning(text: str) -> Warning | None:
    """The plugin's warning line in `text` that doctor reads (non-finite inputs, a log-ratio), or None."""
    found = WARNING.search(text) if WARNING_ANCHOR in text else None
    if found is None:
        return None
    verl = found["role"] is not None
    where = (f"the {found['role']}'s update {found['update']} mini-batch {found['minibatch']}" if verl
             else f"rollout {found['rollout']} step {found['step']}")  # fmt: skip
    common = {"where": where, "update": int(found["update"] if verl else found["rollout"]),
              "plugin": "verl" if verl else "slime", "text": found["text"].strip()}  # fmt: skip
    if (inputs := _INPUTS.search(found["text"])) is not None:
        return Warning(kind="inputs", count=int(inputs["count"]), **common)
    if (ratio := _RATIO.search(found["text"])) is not None:
        return Warning(kind="log-ratio", name=ratio["name"], value=ratio["value"] or "NaN", **common)
    return None


def parse(doc) -> Report:
    """A report's dict (json.load of the file) as a Report. Raises ValueError: not a plugin report."""
    if not isinstance(doc, dict) or any(key not in doc for key in KEYS):
        raise ValueError(f"not a nanscope plugin report (expected the keys {', '.join(KEYS)})")
    first = doc["first_forward"] or doc["first_backward"] or {}
    direction = "forward" if doc["first_forward"] else "backward" if doc["first_backward"] else None
    rerun = doc.get("rerun") or {}
    return Report(
        rank=int(doc["rank"]), role=doc.get("role"), update=int(doc["rollout_id"]), step=int(doc["step_id"]),
        module=first.get("module"), direction=direction, microbatch=first.get("microbatch"),
        cause=doc.get("class"), verdict=rerun.get("verdict"), bundle=doc.get("bundle"),
    )  # fmt: skip


def read(path: str) -> Report | None:
    """The report at `path`, None where there is no such regular file here or it is not a plugin report."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > MAX_BYTES:
            return None
        with open(path, encoding="utf-8") as f:
            return parse(json.load(f))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def line(report: Report, path: str) -> str:
    """The line the plugin printed when it wrote `report` at `path` (its words, verl's or slime's)."""
    if report.role is not None:
        where = f"in the {report.role}'s update {report.update} mini-batch {report.step}"
    else:
        where = f"at rollout {report.update} step {report.step}"
    return f"nanscope: rank {report.rank}: non-finite values {where}: {path}"


def evidence(text: str, before: str):
    """The evidence a plugin line gives (launch.signals reads ANCHOR's lines with it): the line, and what its report
    says where that file is here."""
    said = match(text)
    if said is None:
        return None
    report = read(said.path)
    if report is not None:
        detail = f"{said.where()}, its report {said.path}: {report.text()}"
    else:
        detail = f"{said.where()}, its report {said.path} (not readable here: give it to doctor where it is)"
    return BY_ID["nanscope-report"], {
        "rank": said.rank,
        "step": said.update,
        "step_from": "the line (verl's update)" if said.plugin == "verl" else "the line (slime's rollout)",
        "op": report.module if report is not None else None,
        "detail": detail,
        "wording": WORDING[f"nanscope-{said.plugin}-report"],
    }


def warning_evidence(text: str, before: str):
    """The evidence a plugin's warning line gives (launch.signals reads WARNING_ANCHOR's lines with it): cleaned
    inputs, or a log-ratio's headroom."""
    said = warning(text)
    if said is None:
        return None
    fields = {"step": said.update, "detail": f"{said.where}: {said.text}",
              "wording": WORDING[f"nanscope-{said.plugin}-warning"]}  # fmt: skip
    if said.kind == "inputs":
        return BY_ID["nanscope-cleaned"], fields
    return BY_ID["nanscope-headroom"], {**fields, "metric": said.name, "value": "NaN" if said.value == "NaN" else None}

"""What `nanscope doctor` reports (`Diagnosis`), read by the renderers (nanscope.report.doctor)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope.launch.candidates import Candidate
from nanscope.launch.config import Batches, Config
from nanscope.launch.detect import Choice
from nanscope.launch.evidence import UNKNOWN, FrameEvidence, Framework
from nanscope.launch.findings.finding import Finding
from nanscope.launch.flagview import FlagView
from nanscope.launch.run_kind import RunKind
from nanscope.launch.script import LaunchScript
from nanscope.launch.summary import Summary
from nanscope.launch.topology import RankInfo, Topology
from nanscope.launch.tracebacks import Traceback


@dataclass
class Diagnosis:
    """Everything `nanscope doctor` reports; renderers (nanscope.report.doctor) only read it and write the prose.

    Without a launch script, `script`, `config`, `topology` and `batches` are None, and so is `failing`; without a
    traceback, `traceback` is None.

    Attributes:
        script: the parsed launch script.
        config: resolved flags.
        topology: the actor's layout.
        batches: derived batch/length figures.
        findings: rules that fired, most severe first.
        fine: checks that passed, one line each.
        failing: the failing (or asked-for) rank, if any.
        traceback: the parsed traceback, if one was given.
        explanations: why this rank reported, what `iteration -1` and `bucket #0` mean.
        notes: inputs that were missing or overridden, in words.
        model_origin: where num-layers/num-experts came from when not in the flags.
        env: the `--env` values used.
        candidates: every catalogued cause, ruled out / enabled / undecidable by the flags and the
            traceback, with the observation that tells it apart (launch.candidates).
        release: the slime release used and how it was chosen (launch.detect.Choice); None: no slime evidence.
        framework: the framework the inputs name (launch.evidence.Framework).
        inferred: values the inputs did not give and doctor inferred, each with how (launch.inference).
        missing: what each input not given would add, one line each.
        contradictions: where the inputs disagree (the frames' schedule against the script's PP, ...).
        flags: a non-slime launch's flags (launch.flagview), Megatron's spelling; None for slime's (`config`).
        summary: the traceback's or log's answers: rank, kind, check, step, model, metric (launch.summary).
    """

    script: LaunchScript | None
    config: Config | None
    topology: Topology | None
    batches: Batches | None
    findings: list[Finding]
    fine: list[str]
    failing: RankInfo | None = None
    traceback: Traceback | None = None
    explanations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    model_origin: str | None = None
    env: dict = field(default_factory=dict)
    candidates: list[Candidate] = field(default_factory=list)
    release: Choice | None = None
    framework: Framework = UNKNOWN
    inferred: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    contradictions: list[str] = field(default_factory=list)
    flags: FlagView | None = None
    summary: Summary | None = None  # what the traceback or log alone supports (launch.summary)
    unread_script: str | None = None  # the launch script given but not read as one, in one line (why, what it is)
    megatron_core: str | None = "a slime launch"  # what points to megatron-core (launch.core_evidence); None: nothing
    run_kind: RunKind | None = (
        None  # what the launch trains (RL, preference, SFT, ...); None: not said (launch.run_kind)
    )

    @property
    def evidence(self) -> FrameEvidence | None:
        return None if self.traceback is None else self.traceback.evidence

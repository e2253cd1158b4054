"""One run's evidence: a Repro of a launched run (outcome, first failure, frames, sentinel), what each run is
expected to give, and `repro_one`, one hazard under one loss."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from nanscope import case
from nanscope.causes import catalogue
from nanscope.errors import UserError
from nanscope.launch.tracebacks import parse_traceback
from nanscope.megatron import launcher, scratch
from nanscope.megatron.spec import Launcher, Layout, RunSpec, failed_check
from nanscope.trace.sentinels.observe import causal_order


@dataclass
class Repro:
    """One hazard x loss through the harness."""

    hazard: str
    loss: str
    expected: str  # "nan-check" | "completed"
    observed: str  # RunResult.observed, or "timeout"
    layout: dict
    ranks: list = field(default_factory=list)  # spec.RankRecord, by rank
    first_failure: int | None = None
    frames_match_case: bool | None = None  # every failing rank's megatron frames == the case's
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    site: list | None = None  # (sample, response position) the hazard changed, None for healthy
    site_log_probs: dict | None = None  # {"policy", "ref", "rollout"} log-probs at the site
    trace: dict | None = None  # the tracer's report on the sentinel's rank (else the first failing, else the last)
    trace_rank: int | None = None
    fault: str | None = None  # the fault planted in the model (megatron.faults), `--fault` or the hazard's
    fault_once: bool = False  # the fault fires on its module's first call only (`--fault-once`: a transient one)
    rerun: dict | None = None  # `--fault-once`: the plugin hook's rerun verdict (a report's "rerun"), from rank 0 up
    sentinel: dict | None = None  # the sentinel's finding across ranks (`sentinel_finding`)
    traceback: str | None = None  # Ray launch: the error as its driver saw it (RayTaskError around the rank's)

    @property
    def ok(self) -> bool:
        return self.observed == self.expected

    @property
    def params_finite(self) -> bool:
        return all(record.params_finite for record in self.ranks) if self.ranks else False

    @property
    def grad_norm(self) -> float | None:
        """The optimizer's (global) grad norm of the last completed step."""
        norms = [record.optimizer_grad_norm[-1] for record in self.ranks if record.optimizer_grad_norm]
        return norms[0] if norms else None


def expected_outcome(hazard: str, loss: str, fault: str | None = None) -> str:
    """The as-is loss fails the NaN check exactly when the catalogue says its gradient is not finite; the safe
    loss where its fix lives elsewhere (a flag, the model); both where a fault is planted in the model."""
    record = catalogue.get(hazard)
    broken = not record.grad_finite if loss == "as-is" else not record.safe_finite
    return "nan-check" if broken or fault is not None else "completed"


def sentinel_finding(ranks) -> dict:
    """The sentinel's finding where the first non-finite value appeared, across ranks.

    The rank that saw it first, in causal order: a forward finding on the earliest pipeline stage (the
    forward runs stage 0 first), else the latest stage with a finding (the backward starts at the loss
    and runs back to stage 0), and within a stage the earliest in its backward (micro-batch, then the
    index of the first non-finite output-gradient check): a tensor-parallel peer that received the value
    through a collective sees it later than the rank whose module made it. With nothing non-finite
    anywhere, every field but the evidence is None.

    Returns:
        {"rank", "step", "module", "direction", "microbatch", "class", "candidates", "evidence", "expert_tokens"}
        (expert_tokens: that rank's per-expert token counts of the failing micro-batch, trace.sentinels.expert_counts).
    """
    seen = [record for record in ranks if record.sentinel and record.sentinel["candidates"]]
    keys = ("step", "module", "direction", "microbatch", "class", "candidates", "evidence", "expert_tokens")
    if not seen:
        evidence = ranks[0].sentinel["evidence"] if ranks and ranks[0].sentinel else ["the sentinel did not run"]
        return {"rank": None, **dict.fromkeys(keys), "candidates": [], "evidence": evidence}
    first = min(seen, key=_causal_order)
    return {"rank": first.rank, **{key: first.sentinel.get(key) for key in keys}}


def _causal_order(record) -> tuple:
    return causal_order(
        rank=record.rank,
        pp=record.pp,
        forward=bool(record.sentinel["forward"]),
        producer=record.sentinel.get("producer"),
    )


def harness_notes(layout) -> list[str]:
    """What the CPU harness does differently from the case's GPUs, said once per report."""
    return [
        f"CPU harness: tp {layout.tp} x pp {layout.pp} x dp {layout.dp}, sequence parallel, 8 experts top-2, gloo",
        (
            f"context parallelism {layout.cp} at the loss level only (zigzag split of each sample's logits); "
            if layout.cp > 1
            else "context parallelism off (the tracer maps whole samples); "
        )
        + "attention sees whole sequences: CP inside attention needs TransformerEngine",
        "one sample per micro-batch: the local attention spec refuses packed (thd) sequences",
    ]


def from_run(run, launched, layout, expected: str | None = None) -> Repro:
    """A Repro from one run of a launch (spec.RunResult within spec.LaunchResult)."""
    spec = run.spec
    observed = "timeout" if launched.timed_out and run.observed == "incomplete" else run.observed
    failing = [record for record in run.ranks if failed_check(record)]
    first = run.first_failure()
    notes = [f"rank {rank}: no record ({launched.stuck.get(rank, 'crashed or killed')})" for rank in run.missing]
    if observed in ("incomplete", "timeout", "error"):
        notes.append("torchrun output (tail):\n" + launched.stderr_tail[-3000:])
    head = run.ranks[0] if run.ranks else None
    finding = sentinel_finding(run.ranks)
    # the rank where the non-finite value began: its tracer saw the producing op
    traced = (
        next((record for record in run.ranks if record.rank == finding["rank"]), None)
        or first
        or (run.ranks or [None])[-1]
    )
    sites = _at_inject_step(head.hazard_sites if head else [], spec.inject_step)
    site_log_probs = _at_inject_step(head.site_log_probs if head else [], spec.inject_step)
    return Repro(
        hazard=spec.hazard,
        loss=spec.loss,
        expected=expected or expected_outcome(spec.hazard, spec.loss, spec.model_fault),
        observed=observed,
        layout={"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep, "cp_loss_level": layout.cp},
        ranks=run.ranks,
        first_failure=first.rank if first else None,
        frames_match_case=_frames_match_case(failing, run.traceback) if failing else None,
        wall_s=launched.wall_s,
        notes=notes,
        site=sites[0] if sites else None,
        site_log_probs=site_log_probs[0] if site_log_probs else None,
        trace=traced.trace if traced else None,
        trace_rank=traced.rank if traced else None,
        fault=planted[0] if (planted := spec.planted()) else None,
        sentinel=finding,
        traceback=run.traceback,
    )


def _at_inject_step(per_step: list, inject_step: int | None) -> list:
    """The non-None entries of a per-step list, the inject step's first: a drifting hazard plants a site at every
    step, and the one that matters is where it crosses."""
    at = (inject_step or 1) - 1
    first = [per_step[at]] if at < len(per_step) and per_step[at] is not None else []
    return first + [x for i, x in enumerate(per_step) if x is not None and i != at]


def _frames_match_case(failing: list, shown: str | None) -> bool:
    """Every failing rank's megatron-core frames are the case's, and so are those of a Ray launch's traceback."""
    if not all(tuple(record.frames) == case.frames() for record in failing):
        return False
    try:
        return shown is None or parse_traceback(shown, "the Ray driver's traceback").megatron_frames() == case.frames()
    except UserError:  # no Megatron error in it
        return False


def repro_one(
    hazard: str,
    loss: str = "as-is",
    *,
    seed: int = 0,
    timeout_s: float = 300.0,
    trace: bool = False,
    fault: str | None = None,
    fault_step: int | None = None,
    fault_once: bool = False,
    via: Launcher = Launcher(),
) -> Repro:
    """Run one hazard under one loss through the 4-process harness and compare with the expectation.

    trace: replay the step under the tracer on every rank (CP 1: the tracer's token map reads whole
    samples) and report the first op that produced a non-finite value.
    fault: a fault planted in the model (megatron.faults: MODULE:forward|backward:nan|inf), firing at step
    `fault_step` (default 1; the steps before it are healthy, the hazard's batch is at that step).
    """
    layout = Layout(cp=1) if trace else Layout()
    at = fault_step or 1
    spec = RunSpec(
        hazard=hazard,
        loss=loss,
        seed=seed,
        trace=trace,
        steps=at,
        inject_step=at,
        model_fault=fault,
        model_fault_step=at if fault else None,
        model_fault_once=fault_once,
        # a one-time fault (--fault-once, or the transient-fault hazard): the plugin's hook reruns the step, a verdict
        hook=(fault_once if fault else catalogue.get(hazard).fault_once),
    )
    # only a hooked run keeps a directory of its own: the hook's reports are read there before it goes
    with scratch.directory("nanscope-one-") if spec.hook else contextlib.nullcontext(None) as out:
        launched = launcher.launch(
            [spec], layout, timeout_s=timeout_s, out_dir=out, loss_flags=case.loss_flags(), via=via
        )
        rep = from_run(launched.runs[0], launched, layout)
        if spec.hook:
            rep.fault_once, rep.rerun = True, _rerun(launched.runs[0].ranks)
    rep.notes = harness_notes(layout) + rep.notes
    if rep.fault_once:
        rep.notes.append(TRANSIENT_NOTE)
    return rep


# What a one-time fault's run shows: megatron's check cannot tell it from a persistent one; the rerun can.
TRANSIENT_NOTE = (
    "--fault-once: a transient fault (it fires once): megatron's check fails the step exactly as for a persistent "
    "fault; the plugin's hook (NANSCOPE_RERUN=on, as installed) ran the step again: its verdict tells them apart"
)


def _rerun(records: list) -> dict | None:
    """The rerun verdict of the first report the hook wrote (the verdict is the same on every rank), or None."""
    for record in sorted(records, key=lambda r: r.rank):
        for path in record.reports:
            with contextlib.suppress(OSError, ValueError):
                rerun = json.loads(Path(path).read_text()).get("rerun")
                if isinstance(rerun, dict) and rerun.get("verdict"):
                    return rerun
    return None


def max_abs_diff(paths_a: list[str | None], paths_b: list[str | None]) -> float | None:
    """max |a - b| over every tensor of per-rank saved dicts (grads or params); None if any is missing, or if there
    is none: a comparison over no ranks (a launch that timed out) compared nothing."""
    import torch  # heavy: torch, only a several-steps check with a defused twin compares parameters

    if not paths_a or len(paths_a) != len(paths_b):
        return None
    worst = 0.0
    for path_a, path_b in zip(paths_a, paths_b):
        if not path_a or not path_b or not Path(path_a).exists() or not Path(path_b).exists():
            return None
        saved_a, saved_b = torch.load(path_a, weights_only=True), torch.load(path_b, weights_only=True)
        assert saved_a.keys() == saved_b.keys()
        for name, a in saved_a.items():
            worst = max(worst, float((a.double() - saved_b[name].double()).abs().max()) if a.numel() else 0.0)
    return worst

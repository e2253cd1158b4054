"""What the harness is asked to run and what it reports: plain dataclasses with a JSON round-trip.

The parent (`launcher`) writes a `WorkerSpec` as JSON; every torchrun rank (`worker`) reads it, writes one
`RankRecord` per run as JSON, and the parent reads those back into `RunResult`s of a `LaunchResult`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from nanscope.causes import catalogue
from nanscope.facts.megatron import bucket_check_pattern


@dataclass(frozen=True)
class Layout:
    """Parallel layout. world = tp * pp * dp; experts: ep * etp must divide tp * dp."""

    tp: int = 2
    pp: int = 2
    dp: int = 1
    ep: int = 1
    etp: int | None = None  # None: same as tp (megatron's default)
    # Context parallelism at the loss level only: the model sees whole sequences (CP inside attention
    # needs TransformerEngine); each sample's logits are cut into slime's zigzag chunks and the loss
    # runs once per simulated CP rank, with that rank's slice of the batch. 2 as in the case.
    cp: int = 2

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class Launcher:
    """How the ranks start: torchrun's agent forking them (the default), or a train group of Ray actors."""

    kind: str = "torchrun"  # "torchrun" | "ray"
    ray_address: str | None = None  # with "ray": join this cluster; None: a local Ray instance
    ray_timeout_s: float = 60.0  # joining ray_address: the bound on the connection (ray_session.session)

    def __post_init__(self):
        assert self.kind in ("torchrun", "ray") and (self.kind == "ray" or self.ray_address is None), self


@dataclass(frozen=True)
class RunSpec:
    """One run: `steps` optimizer steps; the hazard's batch at `inject_step` (1-based), healthy elsewhere.

    inject_step None means step 1 for a hazard (a healthy run is healthy at every step).
    """

    hazard: str = "healthy"
    loss: str = "as-is"  # a name of nanscope.loss.NAMES
    steps: int = 1
    inject_step: int | None = None
    seed: int = 0
    save_params: bool = False  # write each rank's final parameters to the output dir
    save_grads: bool = False  # write each rank's fp32 main grads of the last step (before the optimizer)
    # on each rank, compare the last step's fp32 main grads with those run `compare_grads` (an earlier run
    # of the launch with save_grads) saved on that rank: RankRecord.grad_diff
    compare_grads: int | None = None
    defused: bool = False  # the hazard's clean twin: same batch and site, no trigger (hazards.build)
    hook: bool = False  # call nanscope.slime_plugin.before_train_step before each step, as slime does
    on_nonfinite: str = "raise"  # NANSCOPE_ON_NONFINITE for the hook: "raise" | "skip"
    trace: bool = False  # run the steps under the tracer (nanscope.trace.tracer.locator.Tracer) and record its report
    # slime with nanscope's plugin as its README installs it: the hook (needs hook=True), the "safe" loss
    # through slime's custom-loss path, each step's rollout saved (--save-debug-rollout-data); step k is
    # rollout k-1 (one optimizer step per rollout)
    plugin: bool = False
    env: dict = field(default_factory=dict)  # NANSCOPE_* variables for the hook, e.g. a replay's NANSCOPE_TRACE_STEP
    load_rollouts: str | None = None  # --load-debug-rollout-data of a replay: the template a plugin run saved
    fault: str | None = None  # test hook: "exit:R" (rank R dies) or "hang:R" (rank R hangs) at run start
    # a fault planted in the model (megatron.faults): "MODULE:forward|backward:nan|inf", firing at
    # model_fault_step (None: every step); a level "model" hazard brings its own
    model_fault: str | None = None
    model_fault_step: int | None = None
    model_fault_once: bool = False  # the model fault fires on its module's first call only (repro --fault-once)
    # the natural loop (megatron/natural.py): every step's batch sampled from the current policy, nothing planted
    # (hazard stays healthy); the last stage records each step's headroom (RankRecord.series)
    natural: bool = False
    lr: float | None = None  # Adam's learning rate; None: the case's (model.build_optimizer)

    def hazard_at(self, step: int) -> str:
        """The hazard step `step` carries: the run's at its inject step (a drifting one at every step), else healthy."""
        at = self.inject_step if self.inject_step is not None else 1
        return self.hazard if step == at or catalogue.get(self.hazard).drifts else "healthy"

    def progress_at(self, step: int) -> float:
        """How far a drifting hazard has come at `step`: step / inject step (1 where it crosses)."""
        return step / (self.inject_step if self.inject_step is not None else 1)

    def planted(self) -> tuple[str, int | None, bool] | None:
        """(fault spec, step it fires at or None for every step, once) of the model fault, if any.

        A level "model" hazard (not defused) plants its record's fault at the hazard's step.
        """
        if self.model_fault is not None:
            return self.model_fault, self.model_fault_step, self.model_fault_once
        hazard = catalogue.get(self.hazard)
        if hazard.fault is not None and not self.defused:
            return hazard.fault, self.inject_step if self.inject_step is not None else 1, hazard.fault_once
        return None


@dataclass(frozen=True)
class WorkerSpec:
    """The worker's input (spec.json): the layout, every run, and the bounds inside each rank."""

    layout: Layout
    runs: tuple[RunSpec, ...]
    rank_timeout_s: float  # bound on each run and barrier (the watchdog) and megatron's groups
    startup_timeout_s: float  # bound on each rank's process-group init
    bf16: bool
    loss_flags: dict  # the case's slime loss flags, read by the parent (nanscope.case) and passed down
    first_run: int = 0  # index of the first run this launch executes (a relaunch resumes there)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        fields = json.loads(text)
        runs = tuple(RunSpec(**run) for run in fields.pop("runs"))
        return cls(layout=Layout(**fields.pop("layout")), runs=runs, **fields)


@dataclass
class RankRecord:
    """What one rank saw in one run."""

    rank: int
    pp: int
    tp: int
    dp: int
    ep: int
    layers: list[int]  # 0-based decoder layers held (Megatron's layer_number is 1-based)
    holds_output_layer: bool
    ok: bool
    error: str | None = None  # the full exception message
    error_type: str | None = None
    error_time: float | None = None  # time.time() when raised: the first raiser has the smallest
    error_step: int | None = None
    frames: list[tuple[str, int, str]] = field(default_factory=list)  # megatron-core frames of the traceback
    grad_norms: list[float] = field(default_factory=list)  # local bucket grad norms, dense then expert
    optimizer_grad_norm: list[float | None] = field(default_factory=list)  # per completed step
    params_finite: bool | None = None
    param_checksum: str | None = None  # sha256 over this rank's parameters, in name order
    params_path: str | None = None
    grads_path: str | None = None
    grad_diff: float | None = None  # spec.compare_grads: max |grad - that run's grad| over this rank's parameters
    skipped_steps: int = 0  # steps the plugin hook skipped (on_nonfinite "skip")
    reports: list[str] = field(default_factory=list)  # report files the plugin hook wrote
    hook_log: list[dict] = field(default_factory=list)  # what the plugin hook logged (skip: nanscope/skipped_steps)
    trace: dict | None = None  # TraceReport.to_dict() of this rank (spec.trace)
    # the sentinel's reading of the first non-finite step (else the last step) and its classification
    # (trace.sentinels.classify): {"step", "forward", "backward", "grads", "output_grad_finite", "loss_inputs",
    # "nonfinite_params", "last_stage", "class", "candidates", "evidence", "module", "direction", "microbatch"}
    sentinel: dict | None = None
    losses: list[dict] = field(default_factory=list)  # per step on the last stage: slime's reduced metrics
    hazard_sites: list = field(default_factory=list)  # per step: (sample, response position) or None
    # per step: the batch's log-probs at the hazard site (policy = the log-prob pass at T 0.8, i.e.
    # log_probs; ref_log_probs; rollout_log_probs), e.g. policy -113 vs ref -1 for kl-exp-overflow
    site_log_probs: list = field(default_factory=list)
    series: list = field(default_factory=list)  # natural loop, last stage: per step the headroom (NaturalLoop.entry)
    seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RankRecord:
        fields = json.loads(text)
        fields["frames"] = [tuple(frame) for frame in fields["frames"]]
        return cls(**fields)


# error_type of a rank the harness stopped because a peer failed megatron's check while its own gradients
# passed (cpu_distributed.agree_on_grad_check): on a cluster the job ends there; here every rank records it.
PEER_FAILED = "PeerFailed"


_BUCKET_CHECK = bucket_check_pattern()


def failed_check(record: RankRecord) -> bool:
    """This rank raised megatron-core's DDP gradient check (NaN, or Inf, in a bucket's local norm)."""
    return record.error is not None and _BUCKET_CHECK.search(record.error) is not None


@dataclass
class RunResult:
    spec: RunSpec
    ranks: list[RankRecord]  # sorted by rank; ranks that wrote nothing are absent
    missing: list[int] = field(default_factory=list)  # ranks without a record (crashed, killed)
    # Ray launch: the run's error as its driver saw it (driver frames, RayTaskError, the rank's frames, the message)
    traceback: str | None = None

    @property
    def observed(self) -> str:
        """ "completed", "nan-check" (every error is megatron's NaN check, or a peer's failing it), "error"
        or "incomplete"."""
        if self.missing:
            return "incomplete"
        if all(record.ok for record in self.ranks):
            return "completed"
        if all(record.ok or failed_check(record) or record.error_type == PEER_FAILED for record in self.ranks):
            return "nan-check"
        return "error"

    def first_failure(self) -> RankRecord | None:
        failed = [record for record in self.ranks if not record.ok and record.error_time is not None]
        return min(failed, key=lambda record: record.error_time) if failed else None


@dataclass
class LaunchResult:
    layout: Layout
    runs: list[RunResult]
    returncode: int | None  # torchrun's or the Ray driver's exit code; the first non-zero one when relaunched
    timed_out: bool
    wall_s: float  # parent-side, spawn to exit
    # rank -> {"started" (time.time() at worker entry), "imports_s", "init_s", "cuda_visible_devices" (the rank's
    # CUDA_VISIBLE_DEVICES after process-group init: "" hides every device, `hidden_cuda`)}; Ray's add "pid"
    startup: dict[int, dict]
    stuck: dict[int, str]  # rank -> watchdog message, for ranks the watchdog ended
    stderr_tail: str
    launched_at: float = 0.0  # time.time() when the parent spawned the first torchrun
    launches: int = 1  # torchrun launches it took (relaunches after a launch died mid-way)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

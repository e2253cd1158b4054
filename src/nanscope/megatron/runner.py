"""Run slime v0.1.0 training steps on the tiny Qwen3-MoE through real megatron-core, on CPU over gloo.

Two halves:

- the worker, `python -m nanscope.megatron.runner --spec SPEC --out DIR`, one process per rank under
  torchrun: initialises the process group and megatron's parallel state ONCE, then executes a list of
  runs. Each run rebuilds the model and optimizer from its seed (runs are independent), builds every
  step's batch against the current model (slime's log-prob pass), and trains like slime's
  train_one_step: 1F1B schedule -> finalize_model_grads -> DDP bucket NaN check -> optimizer.step().
  An exception (megatron's NaN check raises RuntimeError) is caught per run and rank, recorded
  (message, megatron frames, time) and the worker moves on after a barrier. Each rank writes
  `DIR/run{i}.rank{r}.json`. A watchdog thread ends a rank stuck in one phase (a collective whose
  peers raised) with os._exit(3).
- the parent, `launch(runs, layout)`: writes the spec, spawns torchrun with a hard timeout, kills the
  whole process tree when it expires, relaunches for the remaining runs when a launch died mid-way,
  and returns dataclasses.

Which ranks raise (measured): at TP2 x PP2 (DP 1) every rank fails the NaN check in finish_grad_sync,
the last stage first (1F1B: it finishes its backward first) — NaN flows back through every stage and
TP rank. With DP > 1 only the replicas whose samples carry the NaN raise; the others pass their local
check and block in the data-parallel all-reduce until the watchdog ends them.

How slime's micro-batches are mapped onto the local (no TransformerEngine) layer spec: slime packs a
micro-batch's samples into one row with PackedSeqParams (thd), which the local DotProductAttention
refuses (it asserts packed_seq_params is None). Here each sample is its own micro-batch, padded at the
end to a fixed length (causal attention: the padding never reaches the sample's logits), so attention
stays per sample as with thd; the loss sees slime's batch keys for one sample and `logits`
[1, S, vocab/tp] float32, the shape GPTModel returns without labels.

Context parallelism inside attention needs TransformerEngine, so CP is applied at the loss level only
(`Layout.cp`, default 2 as in the case): see `_cp_loss`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

# ----------------------------------------------------------------------------------------------
# Spec and results (plain dataclasses, JSON round-trip)


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
class RunSpec:
    """One run: `steps` optimizer steps; the hazard's batch at `inject_step` (1-based), healthy elsewhere.

    inject_step None means step 1 for a hazard (a healthy run is healthy at every step).
    """

    hazard: str = "healthy"
    loss: str = "as-is"  # "as-is" | "safe": the module nanscope.loss.<as_is|safe>
    steps: int = 1
    inject_step: int | None = None
    seed: int = 0
    save_params: bool = False  # write each rank's final parameters to the output dir
    save_grads: bool = False  # write each rank's fp32 main grads of the last step (before the optimizer)
    defused: bool = False  # the hazard's clean twin: same batch and site, no trigger (hazards.build)
    hook: bool = False  # call nanscope.slime_plugin.before_train_step before each step, as slime does
    on_nonfinite: str = "raise"  # NANSCOPE_ON_NONFINITE for the hook: "raise" | "skip"
    trace: bool = False  # run the steps under the tracer (nanscope.trace.Tracer) and record its report
    fault: str | None = None  # test hook: "exit:R" (rank R dies) or "hang:R" (rank R hangs) at run start

    def hazard_at(self, step: int) -> str:
        at = self.inject_step if self.inject_step is not None else 1
        return self.hazard if step == at else "healthy"


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
    skipped_steps: int = 0  # steps the plugin hook skipped (on_nonfinite "skip")
    reports: list[str] = field(default_factory=list)  # report files the plugin hook wrote
    trace: dict | None = None  # TraceReport.to_dict() of this rank (spec.trace)
    losses: list[dict] = field(default_factory=list)  # per step on the last stage: slime's reduced metrics
    hazard_sites: list = field(default_factory=list)  # per step: (sample, response position) or None
    # per step: the batch's log-probs at the hazard site (policy = the log-prob pass at T 0.8, i.e.
    # log_probs; ref_log_probs; rollout_log_probs), e.g. policy -113 vs ref -1 for kl-exp-overflow
    site_log_probs: list = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class RunResult:
    spec: RunSpec
    ranks: list[RankRecord]  # sorted by rank; ranks that wrote nothing are absent
    missing: list[int] = field(default_factory=list)  # ranks without a record (crashed, killed)

    @property
    def observed(self) -> str:
        """"completed", "nan-check" (every error is megatron's NaN check), "error" or "incomplete"."""
        if self.missing:
            return "incomplete"
        if all(r.ok for r in self.ranks):
            return "completed"
        from nanscope import case

        if all(r.ok or (r.error or "").endswith(case.nan_check_message()) for r in self.ranks):
            return "nan-check"
        return "error"

    def first_failure(self) -> RankRecord | None:
        failed = [r for r in self.ranks if not r.ok and r.error_time is not None]
        return min(failed, key=lambda r: r.error_time) if failed else None


@dataclass
class LaunchResult:
    layout: Layout
    runs: list[RunResult]
    returncode: int | None  # torchrun's exit code; the first non-zero one when a relaunch followed
    timed_out: bool
    wall_s: float  # parent-side, spawn to exit
    startup: dict[int, dict]  # rank -> {"started" (time.time() at worker entry), "imports_s", "init_s"}
    stuck: dict[int, str]  # rank -> watchdog message, for ranks the watchdog ended
    stderr_tail: str
    launched_at: float = 0.0  # time.time() when the parent spawned the first torchrun
    launches: int = 1  # torchrun launches it took (relaunches after a launch died mid-way)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _record_from_json(d: dict) -> RankRecord:
    known = {f.name for f in dataclasses.fields(RankRecord)}
    d = {k: v for k, v in d.items() if k in known}  # records from a newer worker still load
    d["frames"] = [tuple(f) for f in d.get("frames", [])]
    return RankRecord(**d)


# ----------------------------------------------------------------------------------------------
# Parent side


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    runs: list[RunSpec],
    layout: Layout = Layout(),
    *,
    timeout_s: float = 300.0,
    rank_timeout_s: float = 120.0,
    startup_timeout_s: float = 180.0,
    out_dir: str | os.PathLike | None = None,
    bf16: bool = True,
    max_relaunches: int = 2,
) -> LaunchResult:
    """Execute `runs` in one torchrun launch of `layout.world` CPU processes (more if one dies).

    When a launch dies inside run i (a rank hung and its watchdog ended it, or a rank crashed), the
    runs after i are executed by a fresh launch, at most `max_relaunches` times; run i keeps the
    records its ranks did write and lists the others as missing.

    Args:
        runs: executed in order, each from a freshly built model.
        timeout_s: hard limit for the whole launch; on expiry the process tree is killed.
        rank_timeout_s: bound on each run (and barrier) inside each rank: the watchdog ends a rank
            stuck longer, and megatron's process groups time out after max(1, ceil(it / 60)) minutes.
        startup_timeout_s: bound on imports and process-group init (4 ranks importing megatron-core
            on 2 loaded cores can take 30 s).
        out_dir: where the ranks write records (and parameters); a temp dir when None.
        bf16: bf16 parameters with fp32 main params and grads (as the case); False for all-fp32.
        max_relaunches: fresh launches allowed after a launch dies mid-way.

    Returns:
        A LaunchResult; runs whose records are missing list the missing ranks.
    """
    _validate(runs, layout)
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="nanscope-run-")
        out_dir = tmp.name
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = {
        "layout": dataclasses.asdict(layout),
        "runs": [dataclasses.asdict(r) for r in runs],
        "rank_timeout_s": rank_timeout_s,
        "startup_timeout_s": startup_timeout_s,
        "bf16": bf16,
        "first_run": 0,
    }
    t0 = time.time()
    outputs, stuck, returncode, timed_out, launches = [], {}, None, False, 0
    while True:
        launches += 1
        code, timed_out, output = _torchrun(out, spec, layout.world, timeout_s - (time.time() - t0))
        returncode = code if not returncode else returncode  # the first failure's code sticks
        outputs.append(output)
        for r in range(layout.world):  # the watchdog's notes, kept across relaunches
            w = out / f"stuck.rank{r}.txt"
            if w.exists():
                stuck[r] = "; ".join(filter(None, [stuck.get(r), w.read_text()]))
                w.unlink()
        broken = _first_incomplete(out, len(runs), layout.world, spec["first_run"])
        if code == 0 or timed_out or broken is None or broken + 1 >= len(runs) or launches > max_relaunches:
            break
        spec["first_run"] = broken + 1  # the launch died in run `broken`: resume after it
    result = collect(out, runs, layout, returncode, timed_out, time.time() - t0, "\n".join(outputs))
    result.stuck, result.launched_at, result.launches = stuck, t0, launches
    if tmp is not None:
        tmp.cleanup()
    return result


def _torchrun(out: Path, spec: dict, world: int, timeout_s: float) -> tuple[int, bool, str]:
    """One torchrun of the worker over `spec`; kills the process tree after `timeout_s`."""
    (out / "spec.json").write_text(json.dumps(spec, indent=1))
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", str(world),
        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
        "-m", "nanscope.megatron.runner", "--spec", str(out / "spec.json"), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TORCHELASTIC_ERROR_FILE": ""}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_tree(proc.pid)
        try:
            output, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a descendant we could not see still holds the pipe
            proc.kill()
            output = b"(output lost: the process tree did not exit after SIGKILL)"
    return proc.returncode, timed_out, output.decode(errors="replace")


def _children() -> dict[int, list[int]]:
    """ppid -> pids, from /proc (Linux)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def kill_tree(pid: int) -> list[int]:
    """SIGKILL `pid` and all its descendants; returns the pids signalled.

    torchrun starts each rank in a new session, so killing torchrun's process group alone would
    orphan the ranks (and they would keep the output pipe open): the tree is collected first.
    """
    pids, todo = [], [pid]
    tree = _children() if os.path.isdir("/proc") else {}
    while todo:
        p = todo.pop()
        pids.append(p)
        todo.extend(tree.get(p, []))
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def _first_incomplete(out: Path, n_runs: int, world: int, first: int) -> int | None:
    """Index of the first run from `first` on that some rank wrote no record for."""
    for i in range(first, n_runs):
        if any(not (out / f"run{i}.rank{r}.json").exists() for r in range(world)):
            return i
    return None


def _validate(runs: list[RunSpec], layout: Layout) -> None:
    """Fail in the parent, not after 20 s of imports in every rank."""
    from nanscope import hazards, loss

    for r in runs:
        hazards.get(r.hazard)
        loss.get(r.loss)
        assert r.steps >= 1 and (r.inject_step is None or 1 <= r.inject_step <= r.steps), r
    assert min(layout.tp, layout.pp, layout.dp, layout.ep, layout.cp) >= 1, layout


def collect(out: Path, runs, layout, returncode, timed_out, wall, output) -> LaunchResult:
    """Read the ranks' records from `out` into a LaunchResult."""
    results = []
    for i, spec in enumerate(runs):
        records, missing = [], []
        for r in range(layout.world):
            path = out / f"run{i}.rank{r}.json"
            if path.exists():
                records.append(_record_from_json(json.loads(path.read_text())))
            else:
                missing.append(r)
        results.append(RunResult(spec, records, missing))
    startup, stuck = {}, {}
    for r in range(layout.world):
        s = out / f"startup.rank{r}.json"
        if s.exists():
            startup[r] = json.loads(s.read_text())
        w = out / f"stuck.rank{r}.txt"
        if w.exists():
            stuck[r] = w.read_text()
    tail = "\n".join(output.splitlines()[-200:])
    return LaunchResult(layout, results, returncode, timed_out, wall, startup, stuck, tail)


# ----------------------------------------------------------------------------------------------
# Worker side (inside torchrun)


class Watchdog:
    """Ends this process with os._exit(3) when a phase outlives its bound (a hung collective)."""

    def __init__(self, out: Path, rank: int):
        self.out, self.rank = out, rank
        self.phase, self.deadline = "startup", float("inf")
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def arm(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.phase, self.deadline = phase, time.monotonic() + seconds

    def _watch(self) -> None:
        while True:
            time.sleep(0.5)
            with self._lock:
                late = time.monotonic() > self.deadline
                phase = self.phase
            if late:
                msg = f"rank {self.rank}: watchdog: stuck in {phase}; exiting"
                (self.out / f"stuck.rank{self.rank}.txt").write_text(msg)
                print(msg, file=sys.stderr, flush=True)
                os._exit(3)


def _megatron_frames(tb) -> list[tuple[str, int, str]]:
    return [
        (os.path.basename(f.filename), f.lineno, f.name)
        for f in traceback.extract_tb(tb)
        if f"{os.sep}megatron{os.sep}core{os.sep}" in f.filename
    ]


def _pad(tokens, length: int):
    import torch

    return torch.nn.functional.pad(tokens, (0, length - tokens.numel()), value=0)


def seq_length_for(total_lengths: list[int], tp: int) -> int:
    """Fixed micro-batch length: the longest sample rounded up to a multiple of 64 * tp (SP splits it by tp)."""
    m = 64 * tp
    return max(m, -(-max(total_lengths) // m) * m)


class Worker:
    """One rank: parallel state once, then runs."""

    def __init__(self, spec: dict, out: Path, watchdog: Watchdog):
        import torch.distributed as dist
        from megatron.core import parallel_state as mpu

        self.spec, self.out, self.wd = spec, out, watchdog
        self.layout = Layout(**spec["layout"])
        self.bf16 = bool(spec.get("bf16", True))
        self.rank_timeout = float(spec.get("rank_timeout_s", 120.0))
        self.rank = dist.get_rank()
        self.mpu = mpu

    # -- model-side helpers -------------------------------------------------------------------

    def build(self, seed: int):
        from megatron.core.distributed import finalize_model_grads

        from nanscope.megatron.model import build_model, build_optimizer

        model, config = build_model(seed=seed, bf16=self.bf16)
        optimizer = build_optimizer(model, bf16=self.bf16)
        config.finalize_model_grads_func = finalize_model_grads
        config.grad_scale_func = optimizer.scale_loss
        config.timers = None
        return model, config, optimizer

    def policy(self, model, seq_length: int):
        """The model as a hazards.Policy: tokens per sample -> full-vocab logits [total_i, V] (T = 1).

        A collective: a forward-only pass of the pipeline schedule (one sample per micro-batch), the
        last stage all-gathers the vocab shards over TP, and the last stage's TP-rank-0 broadcasts
        the logits over the model-parallel group, so each rank builds the same batch.
        """
        import torch
        import torch.distributed as dist
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        mpu = self.mpu

        def run(tokens: list[torch.Tensor]) -> list[torch.Tensor]:
            def forward_step(it, m):
                t = next(it)
                out = m(input_ids=_pad(t, seq_length).unsqueeze(0), position_ids=None, attention_mask=None, labels=None)

                def keep(logits, non_loss_data=True):
                    full = gather_from_tensor_model_parallel_region(logits.float())  # [1, S, V]
                    return full[0, : t.numel()].detach().clone()

                return out, keep

            model.eval()
            with torch.no_grad():
                store = get_forward_backward_func()(
                    forward_step_func=forward_step, data_iterator=iter(tokens), model=[model],
                    num_microbatches=len(tokens), seq_length=seq_length, micro_batch_size=1,
                    forward_only=True, collect_non_loss_data=True,
                )  # fmt: skip
            model.train()
            src = _last_stage_tp0(mpu)
            sizes = [t.numel() for t in tokens]
            buf = torch.cat(store) if self.rank == src else torch.empty(sum(sizes), self.vocab_size)
            dist.broadcast(buf, src=src, group=mpu.get_model_parallel_group())  # within this replica
            return list(buf.split(sizes))

        return run

    # -- one run ------------------------------------------------------------------------------

    def execute(self, spec: RunSpec) -> RankRecord:
        """One run on this rank; any exception is recorded in the returned record, never raised."""
        from nanscope.megatron.model import TinyQwen3MoE

        mpu = self.mpu
        t0 = time.time()
        _apply_fault(spec.fault, self.rank)
        self.vocab_size = TinyQwen3MoE().vocab_size
        rec = RankRecord(
            rank=self.rank,
            pp=mpu.get_pipeline_model_parallel_rank(),
            tp=mpu.get_tensor_model_parallel_rank(),
            dp=mpu.get_data_parallel_rank(),
            ep=mpu.get_expert_model_parallel_rank(),
            layers=[],
            holds_output_layer=mpu.is_pipeline_last_stage(),
            ok=True,
        )
        model = None
        try:
            model = self.steps(spec, rec)
        except Exception as e:  # megatron's NaN check raises RuntimeError; record anything
            rec.ok, rec.error, rec.error_type = False, str(e), type(e).__name__
            rec.error_time, rec.error_step = time.time(), len(rec.hazard_sites)
            rec.frames = _megatron_frames(e.__traceback__)
            model = getattr(self, "_model", None)
            if model is not None:
                rec.grad_norms = _bucket_grad_norms(model)
        if model is not None:
            self.finish_record(spec, rec, model)
        self._model = None
        rec.seconds = time.time() - t0
        return rec

    def steps(self, spec: RunSpec, rec: RankRecord):
        """Build the model, then per step: the batch against the current model, then train_one_step."""
        from nanscope import hazards
        from nanscope import loss as losses
        from nanscope.megatron.model import layers_held

        run = f"run {self._run_index}"
        self.wd.arm(f"{run}: build", self.rank_timeout)
        model, config, optimizer = self.build(spec.seed)
        self._model = model
        rec.layers = layers_held(config)
        if spec.save_grads:
            rec.grads_path = str(self.out / f"grads.run{self._run_index}.rank{self.rank}.pt")
        self._grads_path = rec.grads_path
        self._hook = None
        if spec.hook:
            from nanscope import slime_plugin

            os.environ["NANSCOPE_ON_NONFINITE"] = spec.on_nonfinite
            os.environ["NANSCOPE_REPORT_DIR"] = str(self.out / f"reports.run{self._run_index}")
            self._hook = slime_plugin
        loss_module = losses.get(spec.loss)
        for step in range(1, spec.steps + 1):
            seed = spec.seed * 1000 + step
            rollout = hazards.case_rollout(self.vocab_size, seed=seed)
            seq_length = seq_length_for(rollout.total_lengths, self.layout.tp)
            self.wd.arm(f"{run} step {step}: log-prob pass", self.rank_timeout)
            batch = hazards.build(spec.hazard_at(step), self.policy(model, seq_length), rollout, seed=seed, defused=spec.defused)
            site = batch.pop("hazard_site", None)
            rec.hazard_sites.append(site)
            rec.site_log_probs.append(_site_log_probs(batch, site))
            self.wd.arm(f"{run} step {step}: train_one_step", self.rank_timeout)
            self._tracer = None
            try:
                if spec.trace:
                    from nanscope.trace import Tracer

                    with Tracer(modules=[model]) as self._tracer:
                        try:
                            losses, grad_norm, rec.grad_norms = self.train_one_step(model, optimizer, batch, seq_length, loss_module, step)
                        finally:
                            rec.trace = self._tracer.report().to_dict()
                else:
                    losses, grad_norm, rec.grad_norms = self.train_one_step(model, optimizer, batch, seq_length, loss_module, step)
            finally:
                if self._hook is not None:
                    rec.skipped_steps, rec.reports = self._hook.skipped_steps(), self._hook.reports()
            rec.optimizer_grad_norm.append(None if grad_norm is None else float(grad_norm))
            rec.losses.append(losses)
        return model

    def finish_record(self, spec: RunSpec, rec: RankRecord, model) -> None:
        """Parameters after the run: finiteness, checksum, optionally the tensors themselves."""
        import torch

        model.zero_grad_buffer()
        params = _named_params(model)
        rec.params_finite = all(bool(torch.isfinite(p).all()) for p in params.values())
        rec.param_checksum = _checksum(params)
        if spec.save_params:
            path = self.out / f"params.run{self._run_index}.rank{self.rank}.pt"
            torch.save(params, path)
            rec.params_path = str(path)

    def train_one_step(self, model, optimizer, batch, seq_length, loss_module, step: int = 1):
        """slime v0.1.0's train_one_step for one micro-batch per sample.

        Returns:
            (slime's reduced loss dict on the last stage else {}, the optimizer's grad norm,
             the local bucket grad norms before the step)
        """
        import torch
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from nanscope.slime_args import case_args

        mpu = self.mpu
        # The global batch is split over data-parallel replicas (sample i -> replica i % dp); each
        # replica runs its samples as micro-batches, slime's scaling uses the global batch size.
        n = len(batch["response_lengths"])
        dp, d = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
        args = case_args(global_batch_size=n)
        micro = [_sample(batch, i) for i in range(d, n, dp)]
        num_microbatches = len(micro)
        model.zero_grad_buffer()
        optimizer.zero_grad()
        if self._hook is not None:  # slime calls the hook after zeroing the grads
            self._hook.before_train_step(args, 0, step - 1, [model], optimizer, None)

        def forward_step(it, m):
            index, mb = next(it)
            if self._tracer is not None:
                from nanscope.trace import replay

                self._tracer.microbatch(index, replay.token_map(mb, packed_length=seq_length))
            tokens = _pad(mb["unconcat_tokens"][0], seq_length).unsqueeze(0)
            out = m(input_ids=tokens, position_ids=None, attention_mask=None, labels=None)
            return out, partial(_cp_loss, loss_module.loss_function, args, mb, num_microbatches, self.layout.cp)

        losses_reduced = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(enumerate(micro)), model=[model],
            num_microbatches=num_microbatches, seq_length=seq_length, micro_batch_size=1, forward_only=False,
        )  # fmt: skip
        bucket_norms = _bucket_grad_norms(model)
        if self._grads_path:
            torch.save({n: p.main_grad.detach().clone() for n, p in model.named_parameters()}, self._grads_path)
        update_successful, grad_norm, _ = optimizer.step()
        assert update_successful
        model.zero_grad_buffer()  # release grads, as slime does
        optimizer.zero_grad()
        reduced = {}
        if mpu.is_pipeline_last_stage(ignore_virtual=True):
            keys = losses_reduced[0]["keys"]
            values = sum(x["values"] for x in losses_reduced)
            torch.distributed.all_reduce(values, group=mpu.get_data_parallel_group(with_context_parallel=True))
            values = values.tolist()
            # slime: value * cp_size / num_samples (num_samples counted once per CP rank)
            reduced = {k: v * self.layout.cp / values[0] for k, v in zip(keys, values[1:])}
        return reduced, grad_norm, bucket_norms


def _last_stage_tp0(mpu) -> int:
    """Global rank of (last pipeline stage, TP rank 0) in this rank's data-parallel replica."""
    import torch.distributed as dist

    last = dist.get_global_rank(mpu.get_pipeline_model_parallel_group(), mpu.get_pipeline_model_parallel_world_size() - 1)
    # `last` shares this rank's TP rank; step back to TP rank 0 of the same stage.
    return last - mpu.get_tensor_model_parallel_rank()


def _cp_loss(loss_function, args, batch, num_microbatches, cp, logits):
    """The loss of one sample as `cp` context-parallel ranks compute it, summed, from whole logits.

    logits [1, S, V/tp]: the sample's `total` positions then padding (slime pads its packed row to a
    multiple of 128 and slices by total_lengths); the padding is dropped first (its gradient is zero). For cp > 1, CP rank r gets chunks r and
    2cp-1-r of the sample (zigzag, chunk = ceil(total / 2cp), zero-padded) and its slice of the batch
    (`microbatch.slice_for_cp`), exactly as slime hands them to the loss on a real CP rank.

    Scaling: on a real CP rank slime multiplies by dp*cp and DDP averages over dp*cp; here DDP averages
    over dp only, so the CP ranks' losses are summed and divided by cp. The metric values are summed
    over CP ranks, as slime's all-reduce over the data-parallel-with-CP group does.
    """
    from megatron.core import parallel_state as mpu

    from nanscope.loss import microbatch

    total = batch["total_lengths"][0]
    logits = logits[:, :total]
    if cp == 1:
        return loss_function(args, batch, num_microbatches, logits)
    losses, values, keys, normalizer = [], 0, None, None
    for r in range(cp):
        par = microbatch.Parallel(
            tp_group=mpu.get_tensor_model_parallel_group(), cp_rank=r, cp_size=cp,
            dp_cp_size=mpu.get_data_parallel_world_size() * cp,
        )  # fmt: skip
        local = microbatch.cp_local_logits(logits, [total], par)
        loss, normalizer, log = loss_function(args, microbatch.slice_for_cp(batch, par), num_microbatches, local, parallel=par)
        losses.append(loss)
        values, keys = values + log["values"], log["keys"]
    return sum(losses) / cp, normalizer, {"keys": keys, "values": values}


def _sample(batch: dict, i: int) -> dict:
    """Sample i of a slime batch as a one-sample micro-batch (same keys, lists of one)."""
    keys = ("unconcat_tokens", "total_lengths", "response_lengths", "loss_masks", "log_probs",
            "ref_log_probs", "rollout_log_probs", "advantages")  # fmt: skip
    return {k: [batch[k][i]] for k in keys if k in batch}


def _bucket_grad_norms(model) -> list[float]:
    """L2 norm of every DDP bucket's local grad (dense buckets, then expert buckets), as check_grads computes it."""
    groups = list(model.bucket_groups) + list(model.expert_parallel_bucket_groups)
    return [float(b.grad_data.norm(p=2)) for g in groups for b in g.buckets]


def _site_log_probs(batch: dict, site) -> dict | None:
    """{"policy", "ref", "rollout"} log-probs at a (sample, response position) site, or None."""
    if not site or site[1] is None:
        return None
    i, j = site
    keys = (("policy", "log_probs"), ("ref", "ref_log_probs"), ("rollout", "rollout_log_probs"))
    return {name: float(batch[key][i][j]) for name, key in keys if key in batch}


def _apply_fault(fault: str | None, rank: int) -> None:
    """Test hook: "exit:R" ends rank R at once; "hang:R" blocks rank R until its watchdog fires."""
    if not fault:
        return
    kind, _, who = fault.partition(":")
    assert kind in ("exit", "hang"), f"unknown fault {fault!r}"
    if int(who) == rank:
        if kind == "exit":
            os._exit(1)
        time.sleep(10**6)


def _named_params(model) -> dict:
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def _checksum(params: dict) -> str:
    import hashlib

    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].contiguous().numpy().tobytes())
    return h.hexdigest()


def _die_with_parent() -> None:
    """Linux: SIGKILL this rank when torchrun dies (prctl PR_SET_PDEATHSIG), so no rank outlives it."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _barrier(wd: Watchdog, seconds: float, what: str) -> None:
    import datetime

    import torch.distributed as dist

    wd.arm(f"barrier before {what}", seconds + 5)
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=seconds), wait_all_ranks=True)


def worker_main(argv: list[str] | None = None) -> int:
    """Entry point of each torchrun rank."""
    t_start = time.time()
    p = argparse.ArgumentParser(prog="python -m nanscope.megatron.runner")
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    out = Path(a.out)
    spec = json.loads(Path(a.spec).read_text())
    rank = int(os.environ.get("RANK", "0"))
    _die_with_parent()
    wd = Watchdog(out, rank)
    limit = float(spec.get("rank_timeout_s", 120.0))
    startup = float(spec.get("startup_timeout_s", 180.0))
    wd.arm("imports", startup)

    import datetime

    import torch
    import torch.distributed as dist

    from nanscope.megatron import cpu

    cpu.install()
    from megatron.core import parallel_state as mpu

    t_imports = time.time()
    wd.arm("process-group init", startup)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=startup))
    layout = Layout(**spec["layout"])
    assert layout.world == dist.get_world_size(), f"layout world {layout.world} != {dist.get_world_size()}"
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
        distributed_timeout_minutes=max(1, int(-(-limit // 60))),
    )
    torch.set_num_threads(1)
    t_init = time.time()
    (out / f"startup.rank{rank}.json").write_text(
        json.dumps({"started": t_start, "imports_s": t_imports - t_start, "init_s": t_init - t_imports})
    )
    worker = Worker(spec, out, wd)
    for i in range(int(spec.get("first_run", 0)), len(spec["runs"])):
        run = spec["runs"][i]
        _barrier(wd, limit, f"run {i}")
        wd.arm(f"run {i}", limit)
        worker._run_index = i
        rec = worker.execute(RunSpec(**run))
        (out / f"run{i}.rank{rank}.json").write_text(json.dumps(dataclasses.asdict(rec)))
    _barrier(wd, limit, "exit")
    # Every record is on disk and every rank is past the barrier: skip destroy_process_group and the
    # interpreter's teardown of torch/megatron (seconds per rank on 2 cores).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(worker_main())

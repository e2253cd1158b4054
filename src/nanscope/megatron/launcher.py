"""The parent side of the harness: spawn torchrun over the worker, bound it in time, collect the records.

    from nanscope.megatron.launcher import launch
    from nanscope.megatron.spec import Layout, RunSpec
    result = launch([RunSpec("healthy"), RunSpec("kl-exp-overflow")], Layout(), loss_flags=case.loss_flags())

`launch` writes the WorkerSpec, spawns `python -m nanscope.megatron.worker` (torchrun's elastic agent, which
forks the ranks after importing megatron-core once: see worker.py) with a hard timeout,
kills the whole process tree when it expires or when a stop signal arrives, relaunches for the
remaining runs when a launch died mid-way, and returns a LaunchResult. torchrun's TMPDIR is a temp
dir of the launch, so its `torchelastic_*` dirs go with it.

`launch(..., via=Launcher("ray"))` spawns the Ray driver instead (`ray_driver.py`: a train group of Ray actors,
one per rank, running the same `run.Runner`); a local Ray instance keeps its session dir in that temp dir, and its
processes are the driver's descendants, so the same timeout, stop signals and tree kill apply. Its records are
the same files; a run that raised also leaves the driver's traceback (`RunResult.traceback`).

Every process a launch starts sees no CUDA device (`hidden_cuda.HARNESS` in its environment), also on a GPU node:
the agent must not initialise the CUDA driver before it forks the ranks.

The launch's temp dirs are `scratch` dirs, marked as this process's. Killed by SIGKILL, this process
cleans nothing up; its agent notices (`proctree.ParentWatch`), kills the ranks and removes them. Should
the agent die too, the next launch removes them: each launch first sweeps the temp dir of every marked
dir whose owner is gone (a live run's never are).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from nanscope import loss
from nanscope.causes import catalogue
from nanscope.errors import UserError
from nanscope.megatron import hidden_cuda, proctree, ray_session, scratch
from nanscope.megatron import progress as progress_file
from nanscope.megatron.bootstrap import free_port
from nanscope.megatron.proctree import StopSignals
from nanscope.megatron.spec import Launcher, LaunchResult, Layout, RankRecord, RunResult, RunSpec, WorkerSpec


def launch(
    runs: list[RunSpec],
    layout: Layout = Layout(),
    *,
    loss_flags: dict,
    timeout_s: float = 300.0,
    rank_timeout_s: float = 120.0,
    startup_timeout_s: float = 180.0,
    out_dir: str | os.PathLike | None = None,
    bf16: bool = True,
    max_relaunches: int = 2,
    via: Launcher = Launcher(),
    progress: progress_file.Callback | None = None,
) -> LaunchResult:
    """Execute `runs` in one launch of `layout.world` CPU processes (more if one dies).

    When a launch dies in run i (a rank hung or crashed), the runs after i (from i if no rank got past process-group
    init: `resume_at`) go to a fresh launch, at most `max_relaunches` times; run i keeps its ranks' records.

    Args:
        runs: executed in order, each from a freshly built model.
        loss_flags: the case's slime loss flags (`nanscope.case.loss_flags()`), under every run's batch.
        timeout_s: hard limit for the whole launch; on expiry the process tree is killed.
        rank_timeout_s: bound on each run (and barrier) inside each rank: the watchdog ends a rank
            stuck longer, and megatron's process groups time out after max(1, ceil(it / 60)) minutes.
        startup_timeout_s: bound on each rank's process-group init (the rendezvous of 4 ranks on 2 loaded
            cores); the agent's imports, before the ranks exist, are bounded by timeout_s.
        out_dir: where the ranks write records (and parameters); a temp dir when None.
        bf16: bf16 parameters with fp32 main params and grads (as the case); False for all-fp32.
        max_relaunches: fresh launches allowed after a launch dies mid-way.
        via: torchrun (the default) or Ray (`ray_driver.py`: a local instance in the launch's temp dir, or a cluster).
        progress: called as progress(run, step, steps) after each step of a run and as progress(run, None, None)
            after each run, from a thread of this process (`megatron.progress`), while the launch runs.

    Returns:
        A LaunchResult; runs whose records are missing list the missing ranks.

    Raises:
        proctree.Interrupted: SIGINT, SIGTERM or SIGHUP arrived; the launch's process tree is killed and gone,
            the launch's temp dirs removed.
    """
    _validate(runs, layout, via)
    scratch.sweep()  # what killed launches left behind
    with contextlib.ExitStack() as stack:
        stop = stack.enter_context(StopSignals())
        if out_dir is None:
            out_dir = stack.enter_context(scratch.directory("nanscope-run-"))
        # torchrun's own temp dirs (torchelastic_*) go here, removed with it.
        child_tmp = stack.enter_context(scratch.directory("nanscope-tmp-"))  # and a local Ray instance's session
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        spec = WorkerSpec(
            layout=layout,
            runs=tuple(runs),
            rank_timeout_s=rank_timeout_s,
            startup_timeout_s=startup_timeout_s,
            bf16=bf16,
            loss_flags=dict(loss_flags),
        )
        stack.enter_context(progress_file.watched(out, progress))  # over every relaunch: each line read once
        t0 = time.time()
        outputs, stuck, returncode, timed_out, launches = [], {}, None, False, 0
        while True:
            launches += 1
            code, timed_out, output = _spawner(via)(out, spec, timeout_s - (time.time() - t0), child_tmp, stop)
            returncode = code if not returncode else returncode  # the first failure's code sticks
            outputs.append(output)
            notes = _take_stuck_notes(out, layout.world, stuck)
            resume = resume_at(_first_incomplete(out, len(runs), layout.world, spec.first_run), notes, layout.world)
            if code == 0 or timed_out or resume is None or resume >= len(runs) or launches > max_relaunches:
                break
            spec = dataclasses.replace(spec, first_run=resume)
        result = collect(out, runs, layout, returncode=returncode, timed_out=timed_out, wall=time.time() - t0,
                         output="\n".join(outputs))  # fmt: skip
        stop.check()
    result.stuck, result.launched_at, result.launches = stuck, t0, launches
    return result


def _command(out: Path, spec: WorkerSpec, tmp: str, via: Launcher) -> list[str]:
    """torchrun's agent over the worker (forking the ranks after the imports), or the Ray driver."""
    watch = ["--parent", str(os.getpid()), "--parent-tmp", tempfile.gettempdir()]  # the child's watch of this process
    files = ["--spec", str(out / "spec.json"), "--out", str(out)]
    if via.kind == "ray":
        address = ["--address", via.ray_address, "--ray-timeout", str(via.ray_timeout_s)] if via.ray_address else []
        return [sys.executable, "-m", "nanscope.megatron.ray_driver", *files, *watch, "--ray-temp", tmp, *address]
    ranks = ["--nproc-per-node", str(spec.layout.world), "--master-port", str(free_port())]
    return [sys.executable, "-m", "nanscope.megatron.worker", *ranks, *files, *watch]


def _spawner(via: Launcher):
    """`_torchrun`, or `_ray_driver` for `via`'s cluster."""
    return _torchrun if via.kind == "torchrun" else functools.partial(_ray_driver, via=via)


def _torchrun(out: Path, spec: WorkerSpec, timeout_s: float, tmp: str, stop: StopSignals) -> tuple[int, bool, str]:
    """One torchrun of the worker over `spec`, with TMPDIR `tmp` (`_spawn`)."""
    return _spawn(out, spec, timeout_s, tmp, stop, via=Launcher())


def _ray_driver(
    out: Path, spec: WorkerSpec, timeout_s: float, tmp: str, stop: StopSignals, *, via: Launcher
) -> tuple[int, bool, str]:
    """One Ray driver over `spec`, with TMPDIR `tmp`, its local Ray instance's session there (`_spawn`); a cluster
    it could not join (`ray_session.CONNECT_ERROR`) is one UserError line."""
    launched = _spawn(out, spec, timeout_s, tmp, stop, via=via)
    refused = out / ray_session.CONNECT_ERROR
    if refused.exists():
        raise UserError(refused.read_text())
    return launched


def _spawn(
    out: Path, spec: WorkerSpec, timeout_s: float, tmp: str, stop: StopSignals, *, via: Launcher
) -> tuple[int, bool, str]:
    """One launch (torchrun, or the Ray driver) of the ranks over `spec`, with TMPDIR `tmp`.

    Kills the process tree after `timeout_s`, or at once on a stop signal (then raises Interrupted): the Ray
    driver's tree holds the local Ray instance's processes, its actors included.
    """
    stop.check()
    (out / "spec.json").write_text(spec.to_json())
    cmd = _command(out, spec, tmp, via)
    # CUDA hidden (`hidden_cuda`): the agent, its forked ranks, the Ray driver and its instance answer as on a CPU-only
    # machine, so that no process initialises the CUDA driver before the agent forks.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TORCHELASTIC_ERROR_FILE": "",
           "TMPDIR": tmp, **hidden_cuda.HARNESS}  # fmt: skip
    return proctree.run_tree(cmd, env=env, timeout_s=timeout_s, stop=stop)


def resume_at(broken: int | None, notes: dict[int, str], world: int) -> int | None:
    """The run a fresh launch starts from, after a launch died in run `broken` (None: every run finished) with the
    watchdog's `notes`: the next one; or `broken` itself when every rank was stuck in process-group init (no run
    started: a rendezvous that never formed, such as a master port another process took after it was chosen, is
    retried on a new port)."""
    if broken is None:
        return None
    never_started = len(notes) == world and all("stuck in process-group init" in note for note in notes.values())
    return broken if never_started else broken + 1


def _take_stuck_notes(out: Path, world: int, stuck: dict[int, str]) -> dict[int, str]:
    """Move the watchdog's notes (`stuck.rank{r}.txt`) into `stuck`, joined to those of earlier launches; returns
    this launch's."""
    notes = {}
    for rank in range(world):
        note = out / f"stuck.rank{rank}.txt"
        if note.exists():
            notes[rank] = note.read_text()
            stuck[rank] = "; ".join(filter(None, [stuck.get(rank), notes[rank]]))
            note.unlink()
    return notes


def _first_incomplete(out: Path, n_runs: int, world: int, first: int) -> int | None:
    """Index of the first run from `first` on that some rank wrote no record for."""
    for i in range(first, n_runs):
        if any(not (out / f"run{i}.rank{rank}.json").exists() for rank in range(world)):
            return i
    return None


def _validate(runs: list[RunSpec], layout: Layout, via: Launcher = Launcher()) -> None:
    """Fail in the parent, not after 20 s of imports in every rank."""
    if via.kind == "ray" and via.ray_address is None:  # the launch's temp dir will be the session dir
        ray_session.check_temp(os.path.join(tempfile.gettempdir(), "nanscope-tmp-" + "x" * 8))
    for run in runs:
        catalogue.get(run.hazard)
        loss.known(run.loss)
        assert run.steps >= 1 and (run.inject_step is None or 1 <= run.inject_step <= run.steps), run
    assert min(layout.tp, layout.pp, layout.dp, layout.ep, layout.cp) >= 1, layout


def collect(out: Path, runs, layout, *, returncode, timed_out, wall, output) -> LaunchResult:
    """Read the ranks' records and startup times from `out` into a LaunchResult (stuck notes: `launch`)."""
    results = []
    for i, spec in enumerate(runs):
        records, missing = [], []
        for rank in range(layout.world):
            path = out / f"run{i}.rank{rank}.json"
            if path.exists():
                records.append(RankRecord.from_json(path.read_text()))
            else:
                missing.append(rank)
        shown = out / f"traceback.run{i}.txt"  # a Ray launch's driver wrote it
        results.append(RunResult(spec, records, missing, shown.read_text() if shown.exists() else None))
    startup = {}
    for rank in range(layout.world):
        path = out / f"startup.rank{rank}.json"
        if path.exists():
            startup[rank] = json.loads(path.read_text())
    tail = "\n".join(output.splitlines()[-200:])
    return LaunchResult(
        layout=layout,
        runs=results,
        returncode=returncode,
        timed_out=timed_out,
        wall_s=wall,
        startup=startup,
        stuck={},
        stderr_tail=tail,
    )

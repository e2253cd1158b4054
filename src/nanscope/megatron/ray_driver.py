"""The harness's Ray launch: `python -m nanscope.megatron.ray_driver --spec SPEC --out DIR --parent PID --parent-tmp TMP
--ray-temp RAYTMP [--address ADDRESS --ray-timeout S]`, the process `launcher.launch(..., via=Launcher("ray"))` starts instead of torchrun.

slime's layout: a train group of N Ray actors (`ray_actor.MegatronTrainRayActor`), one per rank, rank 0's address and
port the others' MASTER_ADDR/MASTER_PORT, gloo. The driver runs the spec's runs one at a time as slime's train.py runs
its rollouts: `train` calls ray.get on every actor's train ref. Each rank's record is written as the torchrun
worker's ranks write theirs (`DIR/run{i}.rank{r}.json`), so the parent collects either launch alike.

A run that raised on some ranks raises in ray.get the way the case's did, a RayTaskError around the rank's exception;
the driver writes it as the user would see it (`DIR/traceback.run{i}.txt`: the driver's frames, the RayTaskError
header, the rank's frames down to megatron-core's check, the message). The refs are settled first, so that the one
ray.get raises is the earliest Megatron error by its rank's error time, not whichever peer's error arrived first (at
DP > 1 the replicas that passed their check end with their own errors). An actor that dies (kill -9, its watchdog
ending a hung rank) ends the launch: the others are killed, the rank's death is its one-line note
(`DIR/stuck.rank{r}.txt`, unless its watchdog left one) and the driver exits 1, as torchrun's agent does.

The local Ray instance (`ray_session.session`) keeps its session dir in RAYTMP, a temp dir of the parent's; Ray's
processes are this process's descendants, which the parent kills with it (`proctree.kill_tree`) on a timeout or a
stop signal, and this process watches its parent (`proctree.ParentWatch`): killed by SIGKILL, the parent leaves
this process to kill them and sweep its temp dirs.
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback
from pathlib import Path

from nanscope import outputs
from nanscope.errors import UserError
from nanscope.facts.megatron import bucket_check_pattern
from nanscope.launch.logs import clean
from nanscope.megatron import hidden_cuda, proctree, ray_session, scratch
from nanscope.megatron.ray_actor import MegatronTrainRayActor
from nanscope.megatron.spec import RankRecord, WorkerSpec

POLL_S = 0.25
_BUCKET_CHECK = bucket_check_pattern()
_DETAIL = re.compile(r"Worker exit detail: ([^.]*)")


class RankDied(Exception):
    """An actor of the train group died during a run (its rank, pid and Ray's word for it, in one line)."""


class TrainGroup:
    """The train group: one actor per rank, their process group up; `async_train` starts a run on every rank.

    The actors hold no GPU (num_gpus=0) and see none: a local instance's workers inherit the driver's environment
    (`hidden_cuda.HARNESS`, set by the launch); on a cluster (`joined`) their runtime env sets it.
    """

    def __init__(self, spec: WorkerSpec, out: Path, *, joined: bool = False):
        import ray  # optional: the nanscope[ray] extra, in this process only

        world = spec.layout.world
        hidden = {"runtime_env": {"env_vars": dict(hidden_cuda.HARNESS)}} if joined else {}
        remote = ray.remote(num_cpus=1, num_gpus=0, max_restarts=0, **hidden)(MegatronTrainRayActor)
        self.spec, self.out = spec, out
        self.actors = [remote.remote(spec.to_json(), str(out), rank) for rank in range(world)]
        addr, port = ray.get(self.actors[0].master_addr_and_port.remote())
        self.pids = ray.get([actor.init.remote(addr, port) for actor in self.actors])
        self.died: dict[int, str] = {}  # rank -> its note, for the ranks that died during a run

    def async_train(self, index: int) -> list:
        """Start run `index` on every rank: one ref per rank, by rank."""
        return [actor.train.remote(index) for actor in self.actors]

    def settled(self, refs: list, index: int) -> list:
        """Wait for every ref of run `index`; write the ranks' records; the refs, the earliest Megatron error first.

        An actor that died ends the run for the others (they are killed). Raises RankDied when no rank raised a
        Megatron error, which ray.get would then report instead.
        """
        import ray  # optional: the nanscope[ray] extra

        pending, errors = list(refs), {}
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in (ref for ref in refs if ref not in pending and refs.index(ref) not in errors):
                rank = refs.index(ref)
                try:
                    ray.get(ref)
                    errors[rank] = None
                except ray.exceptions.RayActorError as e:
                    errors[rank] = e
                    self._died(rank, e, pending, refs)
                except ray.exceptions.RayTaskError as e:
                    errors[rank] = e
        records = self._write_records(index)
        order = sorted(range(len(refs)), key=lambda rank: _precedence(records.get(rank), errors[rank]))
        if self.died and not any(_megatron(records.get(rank)) for rank in order):
            raise RankDied("; ".join(self.died.values()))
        return [refs[rank] for rank in order]

    def _died(self, rank: int, e, pending: list, refs: list) -> None:
        """Note a rank's death (unless the driver killed it), then kill the ranks still running."""
        import ray  # optional: the nanscope[ray] extra

        if self.died.get(rank) == "killed":
            return
        detail = _DETAIL.search(str(e))
        note = f"rank {rank}: Ray actor MegatronTrainRayActor (pid {self.pids[rank]}) died" + (
            f": {detail[1].strip()}" if detail else ""
        )
        self.died[rank] = note
        stuck = self.out / f"stuck.rank{rank}.txt"
        if not stuck.exists():  # a watchdog that ended a hung rank has said more
            stuck.write_text(note)
        print(f"nanscope: {note}", file=sys.stderr, flush=True)
        for other in (refs.index(ref) for ref in pending):
            self.died.setdefault(other, "killed")
            ray.kill(self.actors[other], no_restart=True)

    def _write_records(self, index: int) -> dict[int, RankRecord]:
        import ray  # optional: the nanscope[ray] extra

        records = {}
        for rank, actor in enumerate(self.actors):
            if rank in self.died:
                continue
            text = ray.get(actor.record.remote(index))
            if text is not None:
                outputs.write_bytes(self.out / f"run{index}.rank{rank}.json", text.encode())  # whole or absent
                records[rank] = RankRecord.from_json(text)
        return records

    def finish(self) -> None:
        import ray  # optional: the nanscope[ray] extra

        ray.get([actor.finish.remote() for actor in self.actors])


def _megatron(record: RankRecord | None) -> bool:
    return record is not None and record.error is not None and _BUCKET_CHECK.search(record.error) is not None


def _precedence(record: RankRecord | None, error) -> tuple:
    """Megatron errors by error time first, then other errors by error time, then the ranks that completed."""
    if error is None:
        return (3, 0.0)
    if _megatron(record):
        return (0, record.error_time)
    return (1 if record is not None and record.error_time is not None else 2, record.error_time if record else 0.0)


def train(group: TrainGroup, index: int) -> None:
    """Run `index` on every rank, as slime's train.py trains on a rollout: ray.get of every actor's train ref."""
    import ray  # optional: the nanscope[ray] extra

    refs = group.async_train(index)
    ray.get(group.settled(refs, index))


def drive(spec: WorkerSpec, out: Path, *, joined: bool = False) -> int:
    """The spec's runs on a train group (on a cluster this process `joined`); 1 when a rank died (the launch ends
    there), else 0."""
    import ray  # optional: the nanscope[ray] extra

    group = TrainGroup(spec, out, joined=joined)
    for index in range(spec.first_run, len(spec.runs)):
        try:
            train(group, index)
        except ray.exceptions.RayTaskError as e:
            (out / f"traceback.run{index}.txt").write_text(user_traceback(e))
        except RankDied:
            return 1
        if group.died:
            return 1
    group.finish()
    return 0


def user_traceback(e: BaseException) -> str:
    """The exception as Python prints it to the user, without Ray's colour codes."""
    return "\n".join(clean(line) for line in "".join(traceback.format_exception(e)).split("\n"))


def main(argv: list[str] | None = None) -> int:
    """The driver process; exits 0, 1 when a rank died or the launch failed, 137 when its parent died."""
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--parent", type=int, required=True, help="the launching process's pid")
    parser.add_argument("--parent-tmp", required=True, help="its temp dir, where its marked dirs are swept")
    parser.add_argument("--ray-temp", required=True, help="the local Ray instance's dir (the parent's)")
    parser.add_argument("--address", help="join this Ray cluster instead of starting a local instance")
    parser.add_argument("--ray-timeout", type=float, default=ray_session.TIMEOUT_S, help="the bound on joining it")
    args = parser.parse_args(argv)

    def body() -> int:
        spec = WorkerSpec.from_json(Path(args.spec).read_text())
        try:
            with ray_session.session(
                args.address, cpus=spec.layout.world, temp=args.ray_temp, timeout_s=args.ray_timeout, gpus=0
            ):
                return drive(spec, Path(args.out), joined=args.address is not None)
        except UserError as e:  # the cluster did not answer: the launch's one line (launcher.launch raises it)
            (Path(args.out) / ray_session.CONNECT_ERROR).write_text(str(e))
            return 1

    proctree.agent(args.parent, lambda: scratch.sweep(args.parent_tmp), body)


if __name__ == "__main__":
    sys.exit(main())

"""One rank of the harness as a Ray actor, laid out as slime's: `MegatronTrainRayActor`, one per rank of a train group.

    actor = ray.remote(num_cpus=1)(MegatronTrainRayActor).remote(spec_json, out, rank)
    addr, port = ray.get(rank0.master_addr_and_port.remote())       # rank 0's, for every rank
    ray.get([a.init.remote(addr, port) for a in actors])             # gloo, megatron's parallel state
    ray.get([a.train.remote(i) for a in actors])                     # run i; raises as the rank raised

The rank's work is the torchrun worker's (`worker.py`): the same imports, `bootstrap.init` over gloo (MASTER_ADDR and
MASTER_PORT are rank 0's), the same watchdog and barriers, `run.Runner` for each run. A Ray actor is a fresh process
(nothing is forked from a process that imported megatron-core already), so each imports torch and megatron-core
itself. `train(i)` keeps run i's record for `record(i)` and, when the run raised on this rank, raises that exception
again, with its traceback: Ray wraps it (`RayTaskError(RuntimeError): ray::MegatronTrainRayActor.train()`) with the
frames from this method down to megatron-core's check, as the case's actor raised it.
"""

from __future__ import annotations

import json
import os
import socket
import time
import warnings
from pathlib import Path

from nanscope import outputs
from nanscope.megatron import bootstrap, hidden_cuda
from nanscope.megatron.spec import WorkerSpec
from nanscope.megatron.watchdog import Watchdog, barrier


class MegatronTrainRayActor:
    """One rank: imports at creation, gloo and megatron's parallel state at `init`, one run per `train` call."""

    def __init__(self, spec_json: str, out: str, rank: int):
        started = time.time()
        os.environ["OMP_NUM_THREADS"] = "1"  # as torchrun's ranks, before torch's import
        warnings.simplefilter("ignore")  # PYTHONWARNINGS=ignore of the torchrun path
        from nanscope.megatron import worker  # heavy: megatron-core and torch, in the actor only

        worker.import_rank_path()
        self.spec, self.out, self.rank = WorkerSpec.from_json(spec_json), Path(out), rank
        self.out.mkdir(parents=True, exist_ok=True)
        self.startup = {"started": started, "imports_s": time.time() - started, "pid": os.getpid()}
        self.runner = None
        self.records: dict[int, str] = {}

    def master_addr_and_port(self) -> tuple[str, int]:
        """This node's address and a port free on it: MASTER_ADDR and MASTER_PORT of the group (rank 0's)."""
        import ray  # optional: the nanscope[ray] extra; an actor runs under Ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def init(self, master_addr: str, master_port: int) -> int:
        """Process-group init (gloo) and megatron's parallel state, as `worker._rank` does; returns this pid."""
        import torch  # heavy: torch and megatron-core (the runner), imported at the actor's creation
        import torch.distributed as dist

        from nanscope.megatron.run import Runner

        spec, layout = self.spec, self.spec.layout
        os.environ.update(
            RANK=str(self.rank), WORLD_SIZE=str(layout.world), MASTER_ADDR=master_addr, MASTER_PORT=str(master_port)
        )
        wd = Watchdog(self.out, self.rank)
        wd.arm("process-group init", spec.startup_timeout_s)
        t_init = time.time()
        bootstrap.init(tp=layout.tp, pp=layout.pp, ep=layout.ep, etp=layout.etp,
                       timeout_s=spec.startup_timeout_s, group_timeout_s=spec.rank_timeout_s)  # fmt: skip
        assert layout.world == dist.get_world_size(), f"layout world {layout.world} != {dist.get_world_size()}"
        torch.set_num_threads(1)
        self.startup["init_s"] = time.time() - t_init
        self.startup["cuda_visible_devices"] = os.environ.get(hidden_cuda.VISIBLE)  # as Ray left it for this actor
        outputs.write_bytes(self.out / f"startup.rank{self.rank}.json", json.dumps(self.startup).encode())  # whole
        self.runner = Runner(spec, self.out, wd)
        return os.getpid()

    def train(self, index: int) -> None:
        """Run `index` on this rank after a barrier of every rank; raises the run's exception, if it raised one."""
        runner = self.runner
        barrier(runner.wd, self.spec.rank_timeout_s, f"run {index}")
        runner.wd.arm(f"run {index}", self.spec.rank_timeout_s)
        self.records[index] = runner.execute(index, self.spec.runs[index]).to_json()
        error, runner.raised = runner.raised, None
        if error is not None:
            raise error

    def record(self, index: int) -> str | None:
        """Run `index`'s RankRecord as JSON (None: this rank did not finish it)."""
        return self.records.get(index)

    def finish(self) -> None:
        """The exit barrier of every rank."""
        barrier(self.runner.wd, self.spec.rank_timeout_s, "exit")

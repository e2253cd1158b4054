"""The harness's launch: `python -m nanscope.megatron.worker --nproc-per-node N --master-port P --spec SPEC --out DIR
--parent PID --parent-tmp TMP`.

This process imports megatron-core and everything a rank runs ONCE (`import_rank_path`), then runs
torchrun's elastic agent in itself (torch.distributed.run's own configuration of these flags, static
rendezvous, no restarts) with start method "fork": each rank is forked from it with the imports done
(about 3 s of CPU per rank on 2 cores otherwise, and the optimizer's torch._dynamo import), and runs
`rank_main`. A rank starts megatron on CPU once (`bootstrap.init`), then executes the spec's runs in order
(`run.Runner`) and writes each run's record as `DIR/run{i}.rank{r}.json`, after a barrier of every rank.
A watchdog thread ends a rank stuck in one phase (a collective whose peers raised) with os._exit(3),
leaving `DIR/stuck.rank{r}.txt` (`watchdog.py`); the agent then stops the other ranks and exits 1.

No process outlives the launch, even when `nanscope repro` is killed by SIGKILL: each rank dies with the
agent (PR_SET_PDEATHSIG), and the agent watches its parent (`proctree.ParentWatch`): on the parent's death
it kills the ranks, removes the parent's temp dirs (`scratch.sweep` of TMP: those whose owner is gone)
and exits 137.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from nanscope import outputs
from nanscope.megatron import bootstrap, hidden_cuda, proctree, progress, scratch
from nanscope.megatron.run import Runner
from nanscope.megatron.spec import WorkerSpec
from nanscope.megatron.watchdog import Watchdog, barrier


def _die_with_parent(agent: int) -> None:
    """Linux: SIGKILL this rank when the agent dies (prctl PR_SET_PDEATHSIG), so no rank outlives it.

    An agent that died between the fork and the prctl is not signalled for: then this rank is re-parented
    already, and ends at once.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != agent:
        os._exit(proctree.PARENT_GONE_EXIT)


# What a rank imports on its way through a run (`run.Runner` imports them at first use), imported by the
# agent before it forks the ranks; bootstrap.import_megatron brings megatron-core and the CPU layer. The first
# megatron optimizer imports torch._dynamo (torch.optim wraps add_param_group in torch._disable_dynamo).
RANK_MODULES = (
    "torch._dynamo",
    "megatron.core.distributed.finalize_model_grads",
    "megatron.core.models.gpt.gpt_layer_specs",
    "nanscope.hazards",
    "nanscope.loss.as_is",
    "nanscope.loss.safe",
    "nanscope.megatron.faults",
    "nanscope.megatron.model",
    "nanscope.megatron.observe",
    "nanscope.megatron.step",
    "nanscope.facts.args",
    "nanscope.slime_plugin",
    "nanscope.trace.sentinels.classify",
    "nanscope.trace.sentinels.sentinel",
)


def import_rank_path() -> None:
    """megatron-core (torch.compile deferred, `bootstrap.import_megatron`) and RANK_MODULES."""
    bootstrap.import_megatron()
    for name in RANK_MODULES:
        importlib.import_module(name)


def main(argv: list[str] | None = None) -> int:
    """The launch process: the shared imports, then torchrun's agent forking the ranks; exits with 1 when a
    rank failed (as torchrun does), else 0; 137 when its parent died (`proctree.ParentWatch`)."""
    t_start = time.time()
    parser = argparse.ArgumentParser(prog="python -m nanscope.megatron.worker")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--parent", type=int, required=True, help="the launching process's pid")
    parser.add_argument("--parent-tmp", required=True, help="its temp dir, where its marked dirs are swept")
    args = parser.parse_args(argv)
    # First, so that a parent killed during the imports below is noticed too.
    watch = proctree.ParentWatch(args.parent, cleanup=lambda: scratch.sweep(args.parent_tmp))
    code = 1
    try:
        code = _agent(args, t_start)
    except BaseException:  # printed here: the exit below skips the interpreter's handler
        traceback.print_exc()
    finally:
        # Skip the interpreter's teardown of torch and megatron-core (a second or more on 2 cores); every path
        # ends in the watch's exit, so that an exception (a print to the dead parent's pipe) never ends this
        # process while the watch kills the ranks and removes the temp dirs.
        watch.exit(code)  # stdout and stderr flushed


def _agent(args: argparse.Namespace, t_start: float) -> int:
    """The shared imports, then torchrun's elastic agent over `rank_main`; 1 when a rank failed, else 0."""
    spec = WorkerSpec.from_json(Path(args.spec).read_text())
    import_rank_path()
    imports_s = time.time() - t_start
    from torch.distributed import run  # heavy: torch's agent, imported after megatron-core (above)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    flags = ["--nproc-per-node", str(args.nproc_per_node), "--master-addr", "127.0.0.1",
             "--master-port", str(args.master_port), "--start-method", "fork", "-m", __name__]  # fmt: skip
    launch_config, _, _ = run.config_from_args(run.parse_args(flags))
    gc.freeze()  # the ranks' collections never scan the imported modules they inherit
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        elastic_launch(launch_config, entrypoint=rank_main)(spec, Path(args.out), t_start, imports_s, os.getpid())
    except ChildFailedError as e:
        print(e.format_msg(), file=sys.stderr)
        return 1
    return 0


def rank_main(spec: WorkerSpec, out: Path, started: float, imports_s: float, agent: int) -> int:
    """One rank, forked by the agent with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    The rank runs in a fresh thread (`_rank`), so its Python frames start at the base of a new frame stack
    as in a fresh process: forked ~20 frames deep inside the agent, the model's calls crossed one of
    CPython 3.11's 16 KiB frame-stack chunks at a hot depth, which maps and unmaps the chunk on every
    crossing (measured: 64,000 mmap/munmap pairs per rank in a matrix, ~10 us each; about 500 in a thread).
    The signals the agent handles in Python are reset to an interpreter's defaults first: its handler,
    inherited through fork, raises in Python, which waits for a blocking collective to return.

    Returns 0 to the agent after every record is on disk and every rank is past the exit barrier; the
    forked process then ends with os._exit (multiprocessing's fork start), without interpreter teardown.
    """
    _die_with_parent(agent)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    done = []
    thread = threading.Thread(target=lambda: done.append(_rank(spec, out, started, imports_s)), daemon=True)
    thread.start()
    thread.join()
    if not done:  # its traceback is printed above
        raise RuntimeError(f"rank {os.environ['RANK']} failed")
    return 0


def _rank(spec: WorkerSpec, out: Path, started: float, imports_s: float) -> int:
    """Process-group init, the spec's runs, the exit barrier."""
    import torch  # heavy: torch, imported by the agent before the fork
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    wd = Watchdog(out, rank)
    wd.arm("process-group init", spec.startup_timeout_s)
    t_init = time.time()
    layout = spec.layout
    bootstrap.init(tp=layout.tp, pp=layout.pp, ep=layout.ep, etp=layout.etp,
                   timeout_s=spec.startup_timeout_s, group_timeout_s=spec.rank_timeout_s)  # fmt: skip
    assert layout.world == dist.get_world_size(), f"layout world {layout.world} != {dist.get_world_size()}"
    torch.set_num_threads(1)
    startup = {"started": started, "imports_s": imports_s, "init_s": time.time() - t_init,
               "cuda_visible_devices": os.environ.get(hidden_cuda.VISIBLE)}  # fmt: skip
    outputs.write_bytes(out / f"startup.rank{rank}.json", json.dumps(startup).encode())  # whole or absent: the parent
    # reads it after a kill too
    runner = Runner(spec, out, wd)
    for i in range(spec.first_run, len(spec.runs)):
        barrier(wd, spec.rank_timeout_s, f"run {i}")
        wd.arm(f"run {i}", spec.rank_timeout_s)
        rec = runner.execute(i, spec.runs[i])
        outputs.write_bytes(out / f"run{i}.rank{rank}.json", rec.to_json().encode())
        if rank == 0:
            progress.note(out, run=i)
    barrier(wd, spec.rank_timeout_s, "exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())

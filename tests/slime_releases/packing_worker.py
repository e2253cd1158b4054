"""torchrun worker (2 processes, gloo): the host reads of a slime release's own loss_function, its metric packing
included, with the release's policy loss and with the plugin's, on the same batches, CP 1 (DP 2) and CP 2.

    python -m torch.distributed.run --nproc-per-node 2 tests/slime_releases/packing_worker.py \\
        --slime-src /tmp/slime/v0.3.1 --out /tmp/out

Every release packs a micro-batch's metrics with `torch.tensor([n] + list(log.values()), device=logits.device)`
(slime/backends/megatron_utils/loss.py: v0.1.0:400-405, v0.2.4:1023-1028, v0.3.1:1312-1317, main:1375-1380), which
reads each 0-dim metric to the host: on CUDA one sync each. `HostReads` counts, in one forward and backward of the
release's `loss_function`, every read a CUDA host would wait for: at dispatch `.item()` and friends
(aten._local_scalar_dense, is_nonzero, equal), nonzero, masked_select, boolean-mask indexing, copies to the CPU; at
the Python level `Tensor.tolist()` and each tensor element of the data `torch.tensor(data)` builds (the packing).

Three variants per configuration: `own` (--loss-type policy_loss), `alone` (the plugin's loss without the hook:
its nan_guard/* among the metrics), `hooked` (the plugin's loss with the hook's record of the step open, as the
installed hook keeps it: the counters on the record). Each rank writes out/rank<R>.json.
"""

import argparse
import collections
import copy
import json
import os
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.slime_releases

from tests.slime_releases import worker  # noqa: E402
from tests.slime_releases.standins import load_loss_module  # noqa: E402

CASE = worker.CASE
CONFIGS = [
    worker.Config("case-flags", CASE),
    worker.Config("defaults"),
    worker.Config("recompute-loss-function", dict(CASE, recompute_loss_function=True), since="v0.2.4"),
    worker.Config("nan-rollout-logprob", CASE, hazard="nan-rollout-logprob"),
    worker.Config("nan-reward", CASE, hazard="nan-reward"),
    worker.Config("kl-exp-overflow", CASE, hazard="kl-exp-overflow"),
    worker.Config(
        "recompute kl-exp-overflow", dict(CASE, recompute_loss_function=True), since="v0.2.4", hazard="kl-exp-overflow"
    ),
]
READS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::equal", "aten::is_nonzero"}


class HostReads(TorchDispatchMode):
    """Counts what a CUDA host would wait for (the module docstring), by kind."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self._saved = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name in READS:
            self.counts[name] += 1
        if name == "aten::index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            self.counts["boolean mask"] += 1
        if name in ("aten::_to_copy", "aten::copy_") and _to_host(name, args, kwargs):
            self.counts["copy to the host"] += 1
        return func(*args, **kwargs)

    def __enter__(self):
        counts = self.counts
        tensor, tolist = torch.tensor, torch.Tensor.tolist

        def counted_tensor(data, *a, **k):
            read = sum(isinstance(x, torch.Tensor) for x in _flat(data)) if not isinstance(data, torch.Tensor) else 0
            counts["torch.tensor(data) element"] += read
            return tensor(data, *a, **k)

        def counted_tolist(t):
            counts["tolist"] += 1
            return tolist(t)

        self._saved = [(torch, "tensor", tensor), (torch.Tensor, "tolist", tolist)]
        torch.tensor, torch.Tensor.tolist = counted_tensor, counted_tolist
        return super().__enter__()

    def __exit__(self, *exc):
        for owner, name, value in self._saved:
            setattr(owner, name, value)
        return super().__exit__(*exc)


def _flat(data):
    if isinstance(data, (list, tuple)):
        return [x for item in data for x in _flat(item)]
    return [data]


def _to_host(name: str, args, kwargs) -> bool:
    if name == "aten::copy_":
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == "cpu" and args[0].device.type != "cpu"


def counted(module, args, batch, full, cp_size) -> tuple[dict, tuple]:
    with HostReads() as reads:
        result = worker.run(module.loss_function, args, batch, full, cp_size)
    return dict(reads.counts), result


def evaluate(module, release: str, cfg, cp_size: int) -> dict:
    from nanscope.loss import guard
    from nanscope.loss import target as targets
    from nanscope.slime_plugin import state
    from nanscope.slime_plugin.loss_watch import LossWatch

    args = argparse.Namespace(**{**worker.release_defaults(release), **cfg.flags})
    plugin_args = copy.copy(args)
    plugin_args.loss_type, plugin_args.custom_loss_function_path = "custom_loss", worker.PLUGIN
    batch, full = worker.build_batch(cfg)
    own = counted(module, args, batch, full, cp_size)
    alone = counted(module, plugin_args, batch, full, cp_size)
    watch = LossWatch(targets.running())  # what the installed hook keeps of the step's loss calls
    state.installation().hook = types.SimpleNamespace(losses=watch)
    try:
        hooked = counted(module, plugin_args, batch, full, cp_size)
    finally:
        state.installation().hook = None
        watch.remove()
    records = [s.counts.tolist() if s.counts is not None else None for s in watch.seen]
    alone_metrics = dict(zip(alone[1][2], alone[1][3][1:].tolist()))
    return {
        "config": cfg.name, "cp": cp_size, "own": own[0], "alone": alone[0], "hooked": hooked[0],
        "own_keys": own[1][2], "alone_keys": alone[1][2], "hooked_keys": hooked[1][2],
        "records": records, "alone_counters": [alone_metrics.get(name) for name in guard.METRICS],
        "hooked_equals_alone": bool(torch.equal(hooked[1][0], alone[1][0]) and torch.equal(hooked[1][1], alone[1][1])),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--slime-src", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    dist.init_process_group("gloo")
    from megatron.core import parallel_state as ps

    from nanscope.loss import target as releases
    from nanscope.megatron import cpu

    cpu.install()
    module = load_loss_module(a.slime_src)
    release = releases.identify().name.split(" ")[0]
    records = []
    for cp_size in (1, 2):
        ps.initialize_model_parallel(context_parallel_size=cp_size)
        for cfg in CONFIGS:
            if worker.ORDER.index(cfg.since) <= worker.ORDER.index(release):
                records.append(evaluate(module, release, cfg, cp_size))
        ps.destroy_model_parallel()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"rank{dist.get_rank()}.json").write_text(json.dumps({"release": release, "records": records}, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""One process: a slime checkout's own loss on the catalogue's loss hazards, at CP 1 and at CP 2 (each CP rank in
turn, megatron-core's parallel state standing in for the CP coordinate: `nanscope.trace.bundles.slime_import.parallel`).

Each call runs under nanscope's tracer (the in-process trace: op, source line, sample, token) while the plugin's
loss watch observes it (`nanscope.slime_plugin.loss_watch`, over the release's own policy loss and log-prob
helper), and the bundle the plugin would write is written from what the watch kept (`slime_plugin.bundles`).

    python tests/slime_releases/bundle_worker.py --slime-src /tmp/slime/v0.3.1 --out /tmp/out

Writes out/<hazard>_cp<size>_rank<r>.bundle.pt per call and out/inprocess.json: {bundle name: {"forward",
"backward": event dicts, "loss_finite", "grad_nonfinite"}}.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.slime_releases

from nanscope.loss import guard, microbatch  # noqa: E402
from nanscope.loss import target as targets  # noqa: E402
from nanscope.slime_plugin import bundles  # noqa: E402
from nanscope.slime_plugin.coords import Coords  # noqa: E402
from nanscope.slime_plugin.loss_watch import LossWatch  # noqa: E402
from nanscope.trace.bundles import slime_import  # noqa: E402
from nanscope.trace.tracer.events import Site  # noqa: E402
from nanscope.trace.tracer.locator import Tracer  # noqa: E402
from tests.slime_releases.worker import CASE, Config, build_batch, release_defaults  # noqa: E402

# The catalogue's loss-level hazards with a non-finite gradient (level "batch"), with the flags that expose them.
HAZARDS = [
    Config("kl-exp-overflow", CASE, hazard="kl-exp-overflow"),
    Config("ratio-exp-overflow", {}, hazard="ratio-exp-overflow"),
    Config("nan-rollout-logprob", CASE, hazard="nan-rollout-logprob"),
    Config("nan-reward", CASE, hazard="nan-reward"),
    Config("zero-temperature", dict(CASE, rollout_temperature=0.0), hazard="zero-temperature"),
]


def token_map(positions, masks):
    flat = [(i, p) for i, pos in enumerate(positions) for p in pos]

    def site_of(shape, index):
        if not flat or len(shape) not in (1, 2) or shape[0] != len(flat):
            return None
        sample, position = flat[index // (shape[1] if len(shape) == 2 and shape[1] else 1)]
        return Site(sample, position, "response", bool(masks[sample][position] == 0))

    return site_of


def one_call(module, release: str, cfg: Config, cp_rank: int, cp_size: int):
    """(bundle document, in-process record) of one CP rank's loss call on the hazard's batch."""
    args = argparse.Namespace(**{**release_defaults(release), **cfg.flags})
    batch, full = build_batch(cfg)
    par = microbatch.Parallel(cp_rank=cp_rank, cp_size=cp_size)
    full = full.clone().requires_grad_(True)
    local = microbatch.cp_local_logits(full, batch["total_lengths"], par) if cp_size > 1 else full
    sliced = microbatch.slice_for_cp(batch, par)
    target = targets.bind(module)
    with slime_import.parallel(cp_rank, cp_size):
        positions = guard.response_positions(target, args, sliced)
        masks = [torch.as_tensor(m) for m in sliced["loss_masks"]]
        watch = LossWatch(target)
        try:
            watch.begin()
            extra = (8,) if "step_global_batch_size" in module.loss_function.__code__.co_varnames else ()
            with Tracer(token_map=token_map(positions, masks)) as tracer:
                tracer.microbatch(0)
                loss = module.loss_function(args, sliced, 1, *extra, local)[0]
                loss.backward()
        finally:
            watch.remove()
        report = tracer.report().to_dict()
        coords = Coords(cp_rank=cp_rank, cp_size=cp_size)
        where = {"rollout_id": 0, "step_id": 0}
        doc = bundles.document(
            target=target,
            coords=coords,
            args=args,
            where=where,
            report={},
            seen=watch.seen,
            why={0: ["nonfinite-loss"]},
        )
    record = {
        "forward": report["forward"],
        "backward": report["backward"],
        "loss_finite": bool(torch.isfinite(loss)),
        "grad_nonfinite": int((~torch.isfinite(full.grad)).sum()),
    }
    return doc, record


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--slime-src", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as rendezvous:
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}/init", world_size=1, rank=0)
        from megatron.core import parallel_state as ps

        from nanscope.megatron import cpu

        cpu.install()
        ps.initialize_model_parallel()
        a.out.mkdir(parents=True, exist_ok=True)
        records = {}
        with slime_import.checkout_loss(a.slime_src) as module:
            release = targets.bind(module).release.name.split(" ")[0]
            for cfg in HAZARDS:
                for cp_size in (1, 2):
                    for cp_rank in range(cp_size):
                        doc, record = one_call(module, release, cfg, cp_rank, cp_size)
                        name = f"{cfg.name}_cp{cp_size}_rank{cp_rank}.bundle.pt"
                        torch.save(doc, a.out / name)
                        records[name] = record
        (a.out / "inprocess.json").write_text(json.dumps({"release": release, "records": records}, indent=1))
        ps.destroy_model_parallel()
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

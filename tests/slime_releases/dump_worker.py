"""One slime checkout: its own Sample and dump writers write nanscope's demo dumps, next to nanscope's writers.

    python tests/slime_releases/dump_worker.py --slime-src /tmp/slime/v0.2.4 --release v0.2.4 --out DIR

Writes DIR/{real,ours}-{rollout,train}.pt and DIR/facts.json (a fresh Sample's to_dict() keys; whether
every demo sample survives the release's Sample.from_dict / to_dict unchanged, keys in order). The
release's writers are called where they are plain functions (main's rollout writer and train payload,
v0.2.4's and v0.3.1's train_dump_utils on a one-process gloo group); the others are methods of Ray
actors, whose one torch.save line is repeated with the release's own Sample.to_dict().
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.slime_releases

from nanscope.dumps import demo, writers  # noqa: E402
from nanscope.facts import releases  # noqa: E402
from tests.slime_releases.standins import load_module  # noqa: E402

ROLLOUT_ID = 12


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--slime-src", type=Path, required=True)
    p.add_argument("--release", required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    release = releases.BY_KEY[args.release]
    Sample = load_module(args.slime_src, "slime.utils.types").Sample

    ours, _ = demo.demo_rollout(release.key)
    real = [Sample.from_dict(dict(d)) for d in ours]  # from_dict takes every field of our dicts, no more
    dicts = [s.to_dict() for s in real]
    facts = {
        "fields": list(Sample().to_dict()),
        "roundtrip": all(list(a) == list(b) and a == b for a, b in zip(dicts, ours)),
    }
    writers.write_rollout_dump(args.out / "ours-rollout.pt", ours, ROLLOUT_ID)
    if release.key == releases.MAIN:
        writer = load_module(args.slime_src, "slime.observability.rollout_data_utils")
        writer.save_debug_rollout_data(str(args.out / "real-rollout.pt"), real, rollout_id=ROLLOUT_ID, evaluation=False)
    else:  # a RolloutManager / Buffer method: dict(rollout_id, samples=[sample.to_dict() ...])
        torch.save(dict(rollout_id=ROLLOUT_ID, samples=dicts), args.out / "real-rollout.pt")

    data, _ = demo.demo_train(release.key)
    writers.write_train_dump(args.out / "ours-train.pt", data, ROLLOUT_ID, rank=0, release=release.key)
    _write_train(args, release, data)
    (args.out / "facts.json").write_text(json.dumps(facts))


def _write_train(args, release, data: dict) -> None:
    path = args.out / "real-train.pt"
    if release.key == releases.MAIN:
        builder = load_module(args.slime_src, "slime.observability.train_data_utils")
        shard = {"rank": 0, "data_parallel_rank": 0, "rollout_data": data}
        torch.save(builder._build_dump_payload([shard], rollout_id=ROLLOUT_ID, writer_rank=0), path)
    elif release.key == releases.V0_1_0:  # MegatronTrainRayActor.train: dict(rollout_id, rank, rollout_data)
        torch.save(dict(rollout_id=ROLLOUT_ID, rank=0, rollout_data=data), path)
    else:
        writer = load_module(args.slime_src, "slime.utils.train_dump_utils")
        with tempfile.TemporaryDirectory() as tmp:
            dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
            template = str(args.out / "real-train.pt").replace("real-train", "real-train{rank}")
            writer.save_debug_train_data(
                argparse.Namespace(save_debug_train_data=template), rollout_id=ROLLOUT_ID, rollout_data=data
            )
            dist.destroy_process_group()
        (args.out / "real-train0.pt").rename(path)


if __name__ == "__main__":
    main()

"""The one writer of each slime dump format: rollout dumps and train dumps, in any known release's layout.

Each writes with plain `torch.save`, in the layouts `nanscope.dumps.io` documents and reads
(`nanscope.dumps.formats` tells them apart): a rollout dump as `dict(rollout_id, samples=[Sample.to_dict(),
...])`, as every release's buffer writes it (the harness's `--save-debug-rollout-data` too:
`nanscope.megatron.step.save_rollout`); a train dump as `dict(rollout_id, rank, rollout_data)` with per-key
lists (v0.1.0 to v0.3.1) or main's `format_version` 2 payload. tests/slime_releases checks these against
each release's own dump writer. The synthetic samples the tests and the demo write are `nanscope.dumps.demo`.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import torch

from nanscope.facts import releases


def write_rollout_dump(path: str | Path | BinaryIO, samples: list[dict], rollout_id: int = 0) -> Path | BinaryIO:
    """Write `samples` (Sample.to_dict()-shaped dicts) the way every release's rollout dump writer does (to a path,
    its directories made, or into a binary file object)."""
    return _save(dict(rollout_id=rollout_id, samples=samples), path)


def write_train_dump(
    path: str | Path | BinaryIO,
    rollout_data: dict,
    rollout_id: int = 0,
    rank: int = 0,
    release: str = releases.V0_1_0,
) -> Path | BinaryIO:
    """Write a train dump the way the release's actor does: `rollout_data` (per-key lists) as it is, or for
    main one dict per sample (`format_version` 2; one data-parallel rank, cp=1). `path` as `write_rollout_dump`."""
    if releases.BY_KEY[release].train_layout == "samples":
        payload = _samples_payload(rollout_data, rollout_id, rank)
    else:
        payload = dict(rollout_id=rollout_id, rank=rank, rollout_data=rollout_data)
    return _save(payload, path)


def _save(payload: dict, path: str | Path | BinaryIO) -> Path | BinaryIO:
    """torch.save to a file object as it is, or to a path with its directories made."""
    if hasattr(path, "write"):
        torch.save(payload, path)
        return path
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


_SCHEDULE = ("micro_batch_indices", "num_microbatches", "global_batch_sizes")  # per rank, not per sample
_IDS = {"sample_indices": "sample_index", "partition": "rollout_position"}  # columns that become sample scalars


def _samples_payload(rollout_data: dict, rollout_id: int, rank: int) -> dict:
    """main's payload for one data-parallel rank (observability/train_data_utils.py:115-185): each per-sample
    column split into one dict per sample, the id columns as scalars, the schedule and raw_reward apart."""
    columns = {k: v for k, v in rollout_data.items() if k not in _IDS and k not in _SCHEDULE and k != "raw_reward"}
    samples = [
        {"data_parallel_rank": 0}
        | {name: rollout_data[k][i] for k, name in _IDS.items() if k in rollout_data}
        | {k: v[i] for k, v in columns.items()}
        for i in range(len(rollout_data["response_lengths"]))
    ]
    layout = {"rank": rank, "data_parallel_rank": 0} | {k: list(rollout_data.get(k) or []) or None for k in _IDS}
    layout |= {k: rollout_data[k] for k in _SCHEDULE if k in rollout_data}
    whole = {"raw_reward": rollout_data["raw_reward"]} if "raw_reward" in rollout_data else {}
    return {
        "format_version": 2,
        "rollout_id": rollout_id,
        "rank": rank,
        "samples": samples,
        "dp_shards": [layout],
    } | whole

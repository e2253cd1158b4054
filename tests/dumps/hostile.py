"""Builders of hostile dumps for the tests: files whose declared sizes or nesting would blow up a naive reader.

Most are plain `torch.save` of a crafted object (an expanded view, a meta or sparse tensor); nesting
deeper than Python's recursion limit cannot be pickled by Python itself, so `with_raw` splices raw
pickle opcodes in place of a placeholder string and writes the archive with torch's own zip writer.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

PLACEHOLDER = "NANSCOPE_PLACEHOLDER"


def torch_zip(path: str | Path, data_pkl: bytes, records: dict[str, bytes] | None = None) -> Path:
    """A torch.save-format archive (torch's own writer) whose data.pkl is `data_pkl`, with `records` (storages
    as data/<key>, byteorder, ...; byteorder little by default)."""
    path = Path(path)
    w = torch._C.PyTorchFileWriter(str(path))
    w.write_record("data.pkl", data_pkl, len(data_pkl))
    for name, data in {"byteorder": b"little", **(records or {})}.items():
        w.write_record(name, data, len(data))
    w.write_end_of_file()
    return path


def records(path: str | Path) -> dict[str, bytes]:
    """Every record of a torch.save archive, by name (data.pkl included)."""
    r = torch._C.PyTorchFileReader(str(path))
    return {name: r.get_record(name) for name in r.get_all_records() if not name.startswith(".data/")}


def rewrap(src: str | Path, dst: str | Path, data_pkl: bytes) -> Path:
    """`src`'s archive with its data.pkl replaced by `data_pkl` (storages kept)."""
    recs = records(src)
    del recs["data.pkl"]
    return torch_zip(dst, data_pkl, recs)


def with_raw(path: str | Path, obj, raw: bytes) -> Path:
    """`obj` pickled (protocol 2, as torch.save) with the one PLACEHOLDER string in it replaced by `raw` opcodes."""
    data = pickle.dumps(obj, protocol=2)
    mark = b"X" + len(PLACEHOLDER).to_bytes(4, "little") + PLACEHOLDER.encode()
    assert data.count(mark) == 1, "obj must hold PLACEHOLDER exactly once"
    return torch_zip(path, data.replace(mark, raw))


def nested_list(depth: int) -> bytes:
    """Opcodes of [[[...]]] nested `depth` deep: push the lists, then append each into the one below."""
    return b"]" * depth + b"a" * (depth - 1)


def nested_dict(depth: int, key: str = "a") -> bytes:
    """Opcodes of {key: {key: ...}} nested `depth` deep (innermost {}), each key memoized once."""
    k = key.encode()
    put = b"X" + len(k).to_bytes(4, "little") + k + b"q\xff"  # the key, memoized at 255
    return b"}" + put + b"}" + (b"h\xff}" * (depth - 2)) + b"s" * (depth - 1)


def rollout(sample: dict) -> dict:
    """A one-sample rollout dump around `sample` (tokens, response_length and reward filled in if absent)."""
    return {"rollout_id": 0, "samples": [{"tokens": [1, 2, 3], "response_length": 2, "reward": 1.0, **sample}]}


def train(**rollout_data) -> dict:
    """A one-sample train dump (tokens and response_lengths filled in if absent)."""
    data = {"tokens": [torch.zeros(4, dtype=torch.long)], "response_lengths": [2], **rollout_data}
    return {"rollout_id": 0, "rank": 0, "rollout_data": data}

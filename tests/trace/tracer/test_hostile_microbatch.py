"""Hostile micro-batch files are refused cheaply by `nanscope trace FILE.pt`: one line, exit 2, memory bounded.

Each case runs in its own forked process under RLIMIT_AS (its imports plus 1.375 GiB) and an alarm (`tests.dumps.hostile.isolated`),
so a loader that allocates what a file only declares dies instead of passing, and its peak RSS is measured.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from nanscope import case, hazards
from nanscope.trace.loading import pickle_budget
from nanscope.trace.tracer import replay
from tests.dumps.hostile import isolated, torch_zip
from tests.dumps.test_hostile import FLOODS

MiB = 2**20


@pytest.fixture
def healthy_file(tmp_path) -> Path:
    """The healthy hazard's micro-batch, as save_microbatch writes it."""
    doc, _ = hazards.microbatch_document("healthy", flags=case.loss_flags())
    path = tmp_path / "healthy.pt"
    replay.save_microbatch(path, doc["batch"], doc["logits"], doc["args"], "as-is")
    return path


def stride0_microbatch(path: Path, tokens: int) -> Path:
    """A micro-batch of one sample declaring `tokens` tokens, every tensor a stride-0 view of one element:
    a 3 KB file, consistent in every length the loader compares."""
    one = lambda dtype=torch.float32: torch.zeros(1, dtype=dtype)  # noqa: E731
    batch = {
        "unconcat_tokens": [one(torch.long).expand(tokens)],
        "loss_masks": [one().expand(tokens - 1)],
        "log_probs": [one().expand(tokens - 1)],
        "advantages": [one().expand(tokens - 1)],
        "total_lengths": [tokens],
        "response_lengths": [tokens - 1],
    }
    logits = torch.zeros(1, 1, 1).expand(1, tokens, 4)
    doc = {"format": replay.FORMAT, "batch": batch, "logits": logits, "args": {"global_batch_size": 1}, "loss": "as-is"}
    torch.save(doc, path)
    return path


def test_stride0_microbatches_are_refused_cheaply(tmp_path):
    """Before issue 24, trace built a Python list of every declared position: 3.5 GB from a 3 KB file."""
    paths = [stride0_microbatch(tmp_path / f"s{n}.pt", n) for n in (10**8, 10**10)]
    for path, res in zip(paths, isolated([["trace", str(p)] for p in paths]), strict=True):
        n = int(path.stem[1:])
        line = (
            f"{path}: unconcat_tokens of sample 0: tensor of {n:,} elements with stride 0 over a storage of 1, "
            "expected each element stored once"
        )
        assert (res["rc"], res["stderr"]) == (2, f"nanscope trace: error: {line}\n"), res
        assert res["seconds"] < 10 and res["grew"] < 64 * MiB, res  # a hang check: 3.5 GB were built before


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
def test_opcode_floods_in_a_microbatch_are_refused_before_torch_load(tmp_path):
    """torch.load(weights_only=True) builds what the pickle says (4.8 GB of sets from 20 MB); the pickle is
    walked first and refused at its budget, having built nothing."""
    paths = {
        name: torch_zip(tmp_path / f"{name}.pt", b"\x80\x02" + op * (20 << 20) + b".") for name, op in FLOODS.items()
    }
    table = pickle_budget.bounds()
    for (name, path), res in zip(paths.items(), isolated([["trace", str(p)] for p in paths.values()]), strict=True):
        size = path.stat().st_size
        budget = pickle_budget.budget(size)
        line = (
            f"{path}: micro-batch file: its pickle builds over {budget:,} bytes of objects by byte "
            f"{2 + budget // table[FLOODS[name][0]]:,} of data.pkl, the budget of a {size:,}-byte file "
            "(8 bytes a byte + 32 MiB); refusing it"
        )
        assert (res["rc"], res["stderr"]) == (2, f"nanscope trace: error: {line}\n"), (name, res)
        assert res["seconds"] < 10 and res["grew"] < size + 64 * MiB, (name, res)  # a hang check, not a speed


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
def test_a_compressed_record_is_refused_before_torch_inflates_it(tmp_path, healthy_file):
    """torch's reader inflates a deflated record to the size its header declares: a zip bomb."""
    packed = tmp_path / "packed.pt"
    with zipfile.ZipFile(healthy_file) as src, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    (res,) = isolated([["trace", str(packed)]])
    with zipfile.ZipFile(packed) as z:
        first = z.infolist()[0]
    line = (
        f"{packed}: micro-batch file: record {first.filename} is compressed ({first.compress_size:,} bytes "
        f"declaring {first.file_size:,}); torch.save stores records uncompressed"
    )
    assert (res["rc"], res["stderr"]) == (2, f"nanscope trace: error: {line}\n"), res

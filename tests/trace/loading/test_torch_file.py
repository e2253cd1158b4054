"""The bounds every torch.load(weights_only=True) reader keeps (`nanscope.trace.loading.torch_file`): what the pickle
builds, bounded before torch.load runs; each tensor's elements stored once inside its own storage."""

from __future__ import annotations

import io
import struct
import tracemalloc
import zipfile
from collections import OrderedDict

import pytest
import torch
from torch._weights_only_unpickler import Unpickler

from nanscope.errors import UserError
from nanscope.trace.loading import pickle_budget, torch_file
from nanscope.trace.loading.pickle_budget import OverBudget
from tests.dumps.hostile import torch_zip
from tests.dumps.test_budget import BODIES


@pytest.mark.parametrize("name", [n for n in BODIES if n != "OrderedDict()"])
def test_check_bounds_what_torchs_unpickler_builds(name):
    """Python's count of what torch's weights_only unpickler allocates on the same opcodes (tracemalloc's
    peak) never exceeds what `check` charged for them (without building any of it), but for its own few
    objects."""
    data = b"\x80\x02" + BODIES[name] + b"N."
    charged = pickle_budget.check(data, 1 << 40)
    tracemalloc.start()
    try:
        Unpickler(io.BytesIO(data)).load()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= charged + 16384, (name, peak, charged)  # 16 KiB: the unpickler's own few objects


def test_check_refuses_at_the_opcode_that_passes_the_budget(monkeypatch):
    monkeypatch.setattr(pickle_budget, "BASE_BYTES", 0)
    data = b"\x80\x02" + b"(" * 10_000 + b"."
    with pytest.raises(OverBudget) as e:
        pickle_budget.check(data, 1000)
    assert e.value.position == 2 + 8000 // pickle_budget.bounds()[ord("(")]


def test_check_walks_every_argument_as_torch_reads_it():
    """Lengths and arguments are skipped, not read as opcodes; GLOBAL's lines end the walk if unterminated."""
    text = "(" * 100  # MARKs inside a string are no opcodes
    data = b"\x80\x02X" + struct.pack("<I", len(text)) + text.encode() + b"U\x03(((\x8a\x02((J((((."
    expected = sum(pickle_budget.bounds()[op] for op in b"\x80XU\x8aJ.") + 4 * 100 + 4 * 3 + 2
    assert pickle_budget.check(data, 0) == expected
    assert pickle_budget.check(b"\x80\x02X\x03\x00\x00\x00a\nbcfoo", 0) > 0  # GLOBAL's line unended: it stops
    with pytest.raises(OverBudget):  # a truncated length still charges what it declared, within the data
        pickle_budget.check(b"X" + struct.pack("<I", 1 << 31) + b"x" * (10 << 20), 0)


def test_a_real_microbatch_is_far_below_its_budget(tmp_path):
    from nanscope import case, hazards
    from nanscope.trace.tracer import replay

    doc, _ = hazards.microbatch_document("healthy", flags=case.loss_flags())
    path = tmp_path / "mb.pt"
    replay.save_microbatch(path, doc["batch"], doc["logits"], doc["args"], "as-is")
    data = torch._C.PyTorchFileReader(str(path)).get_record("data.pkl")
    assert pickle_budget.check(data, path.stat().st_size) < path.stat().st_size  # 1.3 MB file, 0.3 MB charged


@pytest.mark.parametrize(
    "make,problem",
    [
        (lambda: torch.zeros(1).expand(10**10), "tensor of 10,000,000,000 elements with stride 0 over a storage of 1"),
        (lambda: torch.zeros(3, 1).expand(3, 4), "tensor of 12 elements with stride 0 over a storage of 3"),
        (
            lambda: torch.zeros(10).as_strided((4, 4), (2, 1)),
            "tensor of 16 elements with stride 2 over a storage of 10",
        ),
        (lambda: torch.zeros(10).as_strided((3, 3), (1, 2)), "tensor of 9 elements with stride 2 over a storage of 10"),
    ],
)
def test_overlapping_views_are_refused(make, problem):
    assert torch_file.overrun(make()) == f"{problem}, expected each element stored once"


def test_views_inside_their_storage_are_accepted():
    base = torch.zeros(4, 5)
    for x in (
        base,
        base.t(),
        base[:, 1:3],
        base[1:, ::2],
        base.unsqueeze(1).expand(4, 1, 5),
        torch.zeros(0).expand(3, 0),
        base.as_strided((2, 2), (10, 1), 7),
    ):
        assert torch_file.overrun(x) is None, x.shape


class _View:
    """What `overrun` reads of a tensor, for a view torch itself would not build (set_ resizes the storage)."""

    shape, strides, offset = (4,), (1,), 2

    def numel(self):
        return 4

    def stride(self):
        return self.strides

    def storage_offset(self):
        return self.offset

    def element_size(self):
        return 4

    def untyped_storage(self):
        return torch.zeros(4).untyped_storage()


def test_a_view_past_its_storage_is_refused():
    assert torch_file.overrun(_View()) == "tensor of 4 elements at offset 2 past its storage of 4"


def test_load_refuses_in_one_line_naming_file_and_place(tmp_path):
    cases = {
        "meta": (
            {"a": [torch.empty(10**12, device="meta")]},
            "a[0]: a tensor on device meta (no data in the file), expected cpu",
        ),
        "sparse": (
            [torch.sparse_coo_tensor(torch.tensor([[0, 9]]), torch.ones(2), (10,), check_invariants=True)],
            "file[0]: a sparse_coo tensor, expected a dense one",
        ),
        "stride0": (
            OrderedDict(x={"y": (torch.ones(1).expand(10**9),)}),
            "x['y'][0]: tensor of 1,000,000,000 elements with stride 0 over a storage of 1, expected each element "
            "stored once",
        ),
    }
    for name, (obj, problem) in cases.items():
        torch.save(obj, tmp_path / f"{name}.pt")
        with pytest.raises(UserError) as e:
            torch_file.load(tmp_path / f"{name}.pt", "bundle")
        assert str(e.value) == f"{tmp_path / name}.pt: {problem}"
    torch.save({"w": torch.nn.Parameter(torch.ones(2, 3).t())}, tmp_path / "ok.pt")  # a view, a Parameter
    assert torch_file.load(tmp_path / "ok.pt", "bundle")["w"].shape == (3, 2)


def test_load_refuses_files_torch_load_would_trust(tmp_path):
    (tmp_path / "legacy.pt").write_bytes(b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.")  # a legacy-format magic
    torch.save({"a": torch.ones(3)}, tmp_path / "ok.pt")
    with (
        zipfile.ZipFile(tmp_path / "ok.pt") as src,
        zipfile.ZipFile(tmp_path / "z.pt", "w", zipfile.ZIP_DEFLATED) as dst,
    ):
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    torch_zip(tmp_path / "sets.pt", b"\x80\x02" + b"\x8f" * (1 << 20) + b".")
    with zipfile.ZipFile(tmp_path / "z.pt") as z:
        first = z.infolist()[0]
    size = (tmp_path / "sets.pt").stat().st_size
    budget = pickle_budget.budget(size)
    for name, line in {
        "legacy": "not a nanscope bundle (not a torch.save zip archive)",
        "z": f"bundle: record {first.filename} is compressed ({first.compress_size:,} bytes declaring "
        f"{first.file_size:,}); torch.save stores records uncompressed",
        "sets": f"bundle: its pickle builds over {budget:,} bytes of objects by byte "
        f"{2 + budget // pickle_budget.bounds()[0x8F]:,} of data.pkl, the budget of a {size:,}-byte file (8 bytes "
        "a byte + 32 MiB); refusing it",
    }.items():
        with pytest.raises(UserError) as e:
            torch_file.load(tmp_path / f"{name}.pt", "bundle")
        assert str(e.value) == f"{tmp_path / name}.pt: {line}"

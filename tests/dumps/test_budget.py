"""The restricted unpickler's memory budget: what it builds is charged (at least what it allocates), and
refused past 8 bytes a byte of the file + 32 MiB; real dumps need far less.

The 20 MB floods, under the limit (2 GiB with a CPU build) with their peak RSS measured, are in test_hostile.py.
"""

from __future__ import annotations

import gc
import pickle
import struct
import tracemalloc

import numpy as np
import pytest
import torch

from nanscope.dumps import demo, io, writers
from nanscope.dumps.unpickler import Loader, Refused
from nanscope.errors import UserError
from nanscope.facts import releases
from nanscope.trace.loading import pickle_budget
from nanscope.trace.loading.pickle_budget import OverBudget
from tests.dumps.hostile import PLACEHOLDER, rollout, torch_zip, with_raw

N = 20_000


def _u(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _j(i: int) -> bytes:
    return b"J" + struct.pack("<i", i)


def _g(x: float) -> bytes:
    return b"G" + struct.pack(">d", x)


ORDERED_DICT = b"ccollections\nOrderedDict\nq\x00"
BODIES = {  # opcodes after PROTO 2, each building N objects (or N entries) of one kind
    "EMPTY_SET": b"\x8f" * N,
    "EMPTY_DICT": b"}" * N,
    "EMPTY_LIST": b"]" * N,
    "MARK": b"(" * N,
    "TUPLE1 around TUPLE1": b"N" + b"\x85" * N,
    "TUPLE3": b"NNN\x87" * N,
    "TUPLE": b"(NNNNt" * N,
    "BININT": b"".join(_j(1000 + i) for i in range(N)),
    "BININT2": b"M\x00\x10" * N,
    "BINFLOAT": _g(0.5) * N,
    "LONG1": (b"\x8a\x08" + bytes(range(1, 9))) * N,
    "BINUNICODE ascii": _u("x" * 50) * N,
    "BINUNICODE astral": _u("x" * 50 + "\U0001f600") * N,
    "SHORT_BINSTRING": b"U\x05hello" * N,
    "LONG_BINPUT": b"N" + b"".join(b"r" + struct.pack("<I", i) for i in range(N)),
    "SETITEMS": b"}(" + b"".join(_j(1000 + i) + b"N" for i in range(N)) + b"u",
    "SETITEM": b"}" + b"".join(_j(1000 + i) + b"Ns" for i in range(N)),
    "APPENDS of objects": b"](" + (b"N" + _g(0.5)) * N + b"e",
    "APPEND": b"]" + b"Na" * N,
    "number runs of one": b"]" + b"(K\x01e" * N,
    "a run of mixed ints": b"](" + b"K\x01M\x00\x10" * (4 * N) + b"e",
    "OrderedDict()": ORDERED_DICT + b"h\x00)R" * N,
}


@pytest.fixture
def unbounded(monkeypatch):
    """A budget no test pickle reaches: what a load charges can be compared with what it allocates."""
    monkeypatch.setattr(pickle_budget, "BASE_BYTES", 1 << 40)


class Tracked(Loader):
    """A Loader that remembers the most it had charged at once (charges made for a while, then refunded)."""

    most = 0

    def _charge(self, n: int) -> None:
        super()._charge(n)
        self.most = max(self.most, self.budget - self.left)


@pytest.mark.parametrize("name", BODIES)
def test_what_the_unpickler_builds_is_charged_at_least(tmp_path, unbounded, name):
    """Python's own count of the bytes allocated while loading (tracemalloc's peak, numpy's arrays
    included) never exceeds the most charged at once, but for the loader's own few objects (16 KiB): the
    budget bounds memory, not a proxy of it. And the charge is close to it: the factor means something."""
    path = torch_zip(tmp_path / "p.pt", b"\x80\x02" + BODIES[name] + b"N.")
    loader = Tracked.open(str(path))
    tracemalloc.start()
    try:
        loader.load()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    charged = max(loader.most, loader.budget - loader.left)
    assert peak <= charged + 16384, (name, peak, charged)
    assert charged <= 3 * peak, (name, peak, charged)


def test_a_flood_is_refused_at_the_opcode_that_passes_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(pickle_budget, "BASE_BYTES", 0)
    path = torch_zip(tmp_path / "sets.pt", b"\x80\x02" + b"\x8f" * 100_000 + b".")
    size = path.stat().st_size
    with pytest.raises(OverBudget) as e:
        Loader.open(str(path)).load()
    at = 2 + 8 * size // pickle_budget.charges()[0x8F]
    assert str(e.value) == (
        f"its pickle builds over {8 * size:,} bytes of objects by byte {at:,} of data.pkl, the budget of a "
        f"{size:,}-byte file (8 bytes a byte + 0 MiB); refusing it"
    )
    assert (e.value.budget, e.value.file_bytes, e.value.position, e.value.where) == (8 * size, size, at, ())


def test_a_flood_inside_a_sample_names_the_file_field_and_sample(tmp_path, monkeypatch):
    monkeypatch.setattr(pickle_budget, "BASE_BYTES", 0)
    path = with_raw(tmp_path / "d.pt", rollout({"reward": PLACEHOLDER}), b"(" * 100_000 + b"N" + b"t" * 100_000)
    # with one sample, slime's samples list is filled by APPEND: `where` reads it from the dict's frame
    size = path.stat().st_size
    start = torch._C.PyTorchFileReader(str(path)).get_record("data.pkl").index(b"((((")
    with pytest.raises(UserError) as e:
        list(io.load(path).samples())
    head = f"{path}: reward of sample 0: its pickle builds over {8 * size:,} bytes of objects by byte "
    tail = f" of data.pkl, the budget of a {size:,}-byte file (8 bytes a byte + 0 MiB); refusing it"
    message = str(e.value)
    assert message.startswith(head) and message.endswith(tail), message
    assert start <= int(message[len(head) : -len(tail)].replace(",", "")) < start + 100_000


def test_the_budget_is_8_bytes_a_byte_plus_32_mib():
    assert (pickle_budget.BYTES_PER_BYTE, pickle_budget.BASE_BYTES) == (8, 32 << 20)
    assert pickle_budget.budget(20 << 20) == 8 * (20 << 20) + (32 << 20)


def _charged_per_byte(path) -> float:
    loader = Loader.open(str(path))
    loader.load()
    return (loader.budget - loader.left) / path.stat().st_size


def test_real_dumps_fit_the_budget_with_room(tmp_path):
    """The factor's reason: the demo dumps of every release (samples of 88 tokens, 25 fields) need at most
    6 bytes a byte (5.3 measured, main's train dump); samples of thousands of tokens about 1."""
    for release in releases.KEYS:
        for kind in ("rollout", "train"):
            path = tmp_path / f"{kind}-{release}.pt"
            demo.write_demo(path, kind, release=release)
            assert _charged_per_byte(path) < 6, (kind, release)
    rng = np.random.default_rng(0)
    samples = [demo.rollout_sample(i, 512, 4096, reward=1.0, rng=rng) for i in range(16)]
    writers.write_rollout_dump(tmp_path / "long.pt", samples, 0)
    assert _charged_per_byte(tmp_path / "long.pt") < 1.2
    train = demo.train_data_from_samples(samples, [0.0] * len(samples))
    writers.write_train_dump(tmp_path / "long-train.pt", train, rollout_id=0)
    assert _charged_per_byte(tmp_path / "long-train.pt") < 0.2


def test_a_run_longer_than_a_piece_loads_the_same(tmp_path):
    """One APPENDS of 200,000 mixed ints (a pickler writes 1,000 a batch; a hostile file need not) is
    decoded a piece of 65,536 at a time, to the same list."""
    body = b"](" + b"".join(b"K\x07" if i % 3 else b"M\x00\x10" if i % 2 else _j(-5 - i) for i in range(200_000))
    data = b"\x80\x02" + body + b"e."
    path = torch_zip(tmp_path / "run.pt", data)
    got = Loader.open(str(path)).load()
    assert [len(c) for c in got.chunks] == [65536, 65536, 65536, 3392]
    assert got.tolist() == pickle.loads(data)


def test_the_collector_runs_while_samples_are_handed_out_and_after(tmp_path, make_samples):
    """The collector is paused only while the pickle runs: on at each sample handed out, after the end,
    after a refusal."""
    writers.write_rollout_dump(tmp_path / "r.pt", make_samples(3), 0)
    loader = Loader.open(str(tmp_path / "r.pt"))
    assert [gc.isenabled() for _ in loader.events()] == [True, True, True] and gc.isenabled()
    torch_zip(tmp_path / "bad.pt", b"\x80\x02" + b"(" * 10 + b"\xff")
    with pytest.raises(Refused):
        Loader.open(str(tmp_path / "bad.pt")).load()
    assert gc.isenabled()

"""The restricted unpickler: a subset of torch.load(weights_only=True) that loads the same objects.

Three things are shown here: every malicious pickle of the corpus is refused by both loaders and none of
its payloads runs; on generated objects (and on generated corruptions of their pickles) every file this
loader accepts loads to the same object as torch.load(weights_only=True), and every file weights_only
refuses, this loader refuses too; and its allowlist is a subset of torch's own.
"""

from __future__ import annotations

import copyreg
import math
import os
import pickle
import struct
import subprocess
import tempfile
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nanscope.dumps.unpickler import CList, Loader, Refused, Unreadable, _allowed, _torch_allowed
from tests.dumps.hostile import records, rewrap, torch_zip


def g(module: str, name: str) -> bytes:
    """GLOBAL module.name."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def u(text: str) -> bytes:
    """BINUNICODE text."""
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


class Boom:
    """A custom class whose unpickling (BUILD -> __setstate__) makes a directory."""

    def __setstate__(self, state):
        os.mkdir(state["marker"])


def corpus(marker: str) -> dict[str, bytes]:
    """Malicious pickles, each of whose payloads would create `marker` (a path) if it ran."""
    m = u(marker)
    sh = u(f"mkdir {marker}")
    return {
        "reduce os.system": g("os", "system") + sh + b"\x85R",
        "reduce posix.system": g("posix", "system") + sh + b"\x85R",
        "reduce subprocess.check_call": g("subprocess", "check_call") + b"](" + u("mkdir") + m + b"e\x85R",
        "reduce builtins.eval": g("builtins", "eval") + u(f"__import__('os').mkdir({marker!r})") + b"\x85R",
        "reduce builtins.exec": g("builtins", "exec") + u(f"import os; os.mkdir({marker!r})") + b"\x85R",
        "getattr chain": g("builtins", "getattr")
        + g("builtins", "__import__")
        + u("os")
        + b"\x85R"
        + u("mkdir")
        + b"\x86R"
        + m
        + b"\x85R",
        "global to an importable module": g("shutil", "copytree") + u(str(Path(marker).parent)) + m + b"\x86R",
        "copyreg._reconstructor": g("copyreg", "_reconstructor")
        + g("subprocess", "Popen") * 2
        + b"]("
        + u("mkdir")
        + m
        + b"e\x87R",
        "copyreg extension code (EXT2)": b"\x83\xef\xbe" + m + b"\x85R",
        "custom class (NEWOBJ + BUILD)": g(__name__, "Boom") + b")\x81}" + u("marker") + m + b"sb",
        "nested torch.save: torch.load of embedded bytes": g("torch", "load")
        + g("io", "BytesIO")
        + b"C\x04PK\x03\x04"
        + b"\x85R\x85R",
        "tensor subclass rebuild": g("torch._tensor", "_rebuild_from_type_v2")
        + g("torch._utils", "_rebuild_tensor_v2")
        + g(__name__, "Boom")
        + b")}\x87R",
        "STACK_GLOBAL (protocol 4)": b"\x8c\x02os\x94\x8c\x05mkdir\x94\x93" + m + b"\x85R",
        "INST opcode": b"(" + m + b"ios\nmkdir\n",
        "OBJ opcode": b"(" + g("os", "mkdir") + m + b"o",
        "storage key outside the archive": g("torch._utils", "_rebuild_tensor_v2")
        + b"(("
        + u("storage")
        + g("torch", "FloatStorage")
        + u("../../etc/passwd")
        + u("cpu")
        + b"K\x04tQK\x00K\x04\x85K\x01\x85\x89"
        + g("collections", "OrderedDict")
        + b")Rt"
        + b"R",
    }


def wrap(payload: bytes) -> bytes:
    """The payload as a rollout dump's sample: {'rollout_id': 0, 'samples': [payload]}."""
    return b"\x80\x02}(" + u("rollout_id") + b"K\x00" + u("samples") + b"](" + payload + b"eu."


def fast(path) -> object:
    return Loader.open(str(path)).load()


def weights_only(path) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, map_location="cpu", weights_only=True)


def outcome(load, path) -> tuple[str, object]:
    """("ok", object) or ("refused", exception type name): any exception counts as a refusal."""
    try:
        return "ok", load(path)
    except Exception as e:  # weights_only raises UnpicklingError, RuntimeError, KeyError, ... on bad input
        return "refused", type(e).__name__


@pytest.fixture
def ext_code():
    """Register copyreg extension 0xBEEF -> os.mkdir for the EXT2 payload, as a compromised process could."""
    copyreg.add_extension("os", "mkdir", 0xBEEF)
    yield
    copyreg.remove_extension("os", "mkdir", 0xBEEF)


def test_malicious_corpus_is_refused_and_never_runs(tmp_path, ext_code):
    marker = tmp_path / "pwned"
    cases = corpus(str(marker))
    assert len(cases) >= 8
    for name, payload in cases.items():
        for body in (b"\x80\x02" + payload + b".", wrap(payload)):
            path = torch_zip(tmp_path / "evil.pt", body)
            with pytest.raises((Refused, Unreadable)):
                fast(path)
            assert outcome(weights_only, path)[0] == "refused", name
            assert not marker.exists(), f"{name}: the payload ran"
    # The corpus is live: plain pickle runs these payloads (one of them, in a child, to keep this process clean).
    code = f"import pickle; pickle.loads({cases['reduce os.system']!r} + b'.')"
    subprocess.run([os.sys.executable, "-c", code], check=True, timeout=60, stdout=subprocess.DEVNULL)
    assert marker.is_dir()


def test_refusals_name_what_they_refuse(tmp_path):
    cases = corpus(str(tmp_path / "x"))
    expect = {
        "reduce os.system": "loading it needs arbitrary unpickling (it references os.system)",
        "custom class (NEWOBJ + BUILD)": f"loading it needs arbitrary unpickling (it references {__name__}.Boom)",
        "STACK_GLOBAL (protocol 4)": "pickle opcode 140 is outside the weights_only subset",
        "tensor subclass rebuild": "torch._tensor._rebuild_from_type_v2 is in torch's weights_only allowlist but not "
        "in nanscope's subset of it (a scan reads plain dense tensors: no meta, sparse, quantized or nested ones)",
        "storage key outside the archive": "a malformed storage reference",
    }
    for name, text in expect.items():
        with pytest.raises(Refused) as e:
            fast(torch_zip(tmp_path / "e.pt", b"\x80\x02" + cases[name] + b"."))
        assert str(e.value) == text


def test_allowlist_is_a_subset_of_torchs():
    ours, theirs = _allowed(), _torch_allowed()
    assert ours and all(theirs[name] is value for name, value in ours.items())
    assert set(ours) == {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2"} | {
        f"torch.{t}Storage"
        for t in (
            "Byte",
            "Char",
            "Short",
            "Int",
            "Long",
            "Half",
            "Float",
            "Double",
            "Bool",
            "BFloat16",
            "ComplexFloat",
            "ComplexDouble",
        )
    }


# ------------------------------------------------------------------------------------------ same objects


def same(a, b, seen: dict[int, int]) -> bool:
    """b (this loader's, CList for list) is a as torch.load built it: types, values bitwise, and sharing."""
    if type(a) in (list, dict, OrderedDict, torch.Tensor):
        if id(a) in seen:
            return seen[id(a)] == id(b)
        seen[id(a)] = id(b)
    if type(a) is list:
        return type(b) is CList and len(a) == len(b) and all(same(x, y, seen) for x, y in zip(a, b.tolist()))
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return struct.pack("<d", a) == struct.pack("<d", b)
    if type(a) is tuple:
        return len(a) == len(b) and all(same(x, y, seen) for x, y in zip(a, b))
    if type(a) in (dict, OrderedDict):
        return list(a) == list(b) and all(same(a[k], b[k], seen) for k in a)
    if type(a) is torch.storage.TypedStorage:  # a storage left unrebuilt by an edit that dropped the REDUCE
        sa, sb = a._untyped_storage, b._untyped_storage
        return (a.dtype, a._size()) == (b.dtype, b._size()) and sa.tolist() == sb.tolist()
    if callable(a) or isinstance(a, torch.serialization.StorageType):  # an allowlisted global, not called
        return a is b
    if type(a) is torch.Tensor:
        sa, sb = a.untyped_storage(), b.untyped_storage()
        key = ("storage", sa.data_ptr())
        if key in seen and seen[key] != sb.data_ptr():
            return False
        seen[key] = sb.data_ptr()
        return (a.dtype, a.shape, a.stride(), a.storage_offset(), a.requires_grad, a._backward_hooks) == (
            b.dtype,
            b.shape,
            b.stride(),
            b.storage_offset(),
            b.requires_grad,
            b._backward_hooks,
        ) and sa.tolist() == sb.tolist()
    return a == b


DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
]


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = rng.normal(0, 100, shape)
    if dtype.is_floating_point:
        values[rng.random(shape) < 0.1] = rng.choice([math.nan, math.inf, -math.inf, -0.0])
    t = torch.tensor(values).to(dtype) if dtype != torch.bool else torch.tensor(values > 0)
    view = draw(st.sampled_from(["plain", "slice", "transpose", "expand", "grad"]))
    if view == "slice" and t.dim() and t.shape[0] > 1:
        t = t[1:]
    elif view == "transpose" and t.dim() >= 2:
        t = t.transpose(0, -1)
    elif view == "expand" and t.numel():
        t = t.reshape(-1)[:1].expand(draw(st.integers(0, 5)))
    elif view == "grad" and dtype.is_floating_point:
        t = t.clone().requires_grad_(True)
    return t


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.integers(-(2**300), 2**300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
number_lists = st.one_of(
    st.lists(st.integers(0, 151_935), min_size=0, max_size=2500),
    st.lists(st.floats(allow_nan=True, width=64), max_size=2500),
    st.lists(st.integers(0, 1), max_size=2500),
    st.lists(st.one_of(st.integers(-(2**31), 2**31 - 1), st.floats()), max_size=50),
)
keys = st.one_of(st.text(max_size=6), st.integers(-5, 5))
objects = st.recursive(
    st.one_of(scalars, number_lists, tensors()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(keys, inner, max_size=4),
        st.dictionaries(keys, inner, max_size=3).map(OrderedDict),
        st.sets(st.integers(0, 3), max_size=2),
        st.binary(max_size=4),
        inner.map(lambda x: [x, x]),
    ),
    max_leaves=12,
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


def check_agree(path) -> str:
    """The property on one file; returns which way it went."""
    wo, ours = outcome(weights_only, path), outcome(fast, path)
    if ours[0] == "ok":
        assert wo[0] == "ok", f"accepted what weights_only refuses ({wo[1]})"
        assert same(wo[1], ours[1], {}), "loaded a different object"
    return f"{wo[0]}/{ours[0]}"


@SETTINGS
@given(obj=objects)
def test_generated_objects_load_the_same(obj):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.pt"
        torch.save(obj, path)
        event(check_agree(path))


OPCODES = [
    b"(",
    b"t",
    b"e",
    b"a",
    b"s",
    b"u",
    b"R",
    b"b",
    b"\x81",
    b"0",
    b"2",
    b"N",
    b"]",
    b"}",
    b"\x85",
    b"h\x00",
    b"q\x00",
    b"K\x07",
    b"G" + b"\x7f" * 8,
    g("os", "system"),
    g("collections", "OrderedDict"),
    g("torch", "FloatStorage"),
    b"Q",
    b".",
    b"\x8c\x01a",
]


@SETTINGS
@given(obj=objects, data=st.data())
def test_corrupted_pickles_agree(obj, data):
    """Edits of a valid data.pkl (bytes changed, opcodes inserted, cut short): agree or both refuse."""
    with tempfile.TemporaryDirectory() as d:
        good = Path(d) / "good.pt"
        torch.save(obj, good)
        raw = bytearray(records(good)["data.pkl"])
        for _ in range(data.draw(st.integers(1, 2))):
            if len(raw) < 5:
                break
            at = data.draw(st.integers(2, len(raw) - 2))  # after PROTO, before STOP
            edit = data.draw(st.sampled_from(["byte", "insert", "delete"]))
            if edit == "byte":
                raw[at] = data.draw(st.integers(0, 255))
            elif edit == "insert":
                raw[at:at] = data.draw(st.sampled_from(OPCODES))
            else:
                del raw[at : at + data.draw(st.integers(1, 9))]
        if data.draw(st.integers(0, 3)) == 0:
            raw = raw[: data.draw(st.integers(0, len(raw)))]
        event(check_agree(rewrap(good, Path(d) / "bad.pt", bytes(raw))))


def test_slime_shaped_dumps_are_accepted_and_the_same(tmp_path):
    """The property is not vacuous: the files scan reads are accepted, and equal to weights_only's."""
    from nanscope.dumps import demo

    for kind in ("rollout", "train"):
        demo.write_demo(tmp_path / f"{kind}.pt", kind=kind)
        assert check_agree(tmp_path / f"{kind}.pt") == "ok/ok"


def test_a_sample_changed_after_it_was_handed_out_is_refused(tmp_path):
    """A sample dict put back on the stack (BINGET) and given another key after the scan read it."""
    from nanscope.dumps import demo, writers

    good = writers.write_rollout_dump(tmp_path / "g.pt", [demo.rollout_sample(i, 2, 3) for i in range(3)])
    raw = records(good)["data.pkl"]
    first = raw.index(b"}", raw.index(u("samples")))  # sample 0's EMPTY_DICT, memoized right after
    memo = raw[first + 1 : first + 3]
    assert memo[:1] == b"q"
    bad = raw[:-2] + b"h" + memo[1:] + u("reward") + b"G" + struct.pack(">d", math.nan) + b"s0u."
    bad_path = rewrap(good, tmp_path / "b.pt", bad)
    loader = Loader.open(str(bad_path))
    with pytest.raises(Refused, match=r"SETITEM on sample 0 after it was complete"):
        for _ in loader.events():
            pass


def test_number_runs_are_arrays(tmp_path):
    """Lists of numbers come back as arrays without Python objects: log-probs float64, tokens int32, masks uint8."""
    torch.save(
        {"lp": [-0.5] * 1500, "tok": [1, 300, 70_000] * 700, "mask": [1, 0] * 900, "mixed": [1, 2.5]}, tmp_path / "n.pt"
    )
    r = fast(tmp_path / "n.pt")
    assert [[c.dtype.name for c in r[k].chunks] for k in ("lp", "tok", "mask")] == [
        ["float64", "float64"],
        ["int32", "int32", "int32"],
        ["uint8", "uint8"],
    ]
    assert r["mixed"].array() is None and r["mixed"].tolist() == [1, 2.5]
    assert r["tok"].array().tolist() == [1, 300, 70_000] * 700


def test_a_compressed_record_is_refused_before_it_is_inflated(tmp_path):
    """torch's zip reader inflates a deflated record to its declared size: 10 MB from a 10 KB file here."""
    import zipfile

    data = b"\x80\x02}(" + u("samples") + b"]" + u("pad") + u("a" * 10**7) + b"u."
    path = tmp_path / "z.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, body in (("data.pkl", data), ("byteorder", b"little"), ("version", b"3\n")):
            z.writestr(f"z/{name}", body)
    assert path.stat().st_size < 20_000 and len(weights_only(path)["pad"]) == 10**7
    with pytest.raises(Refused) as e:
        fast(path)
    assert str(e.value).startswith("record z/data.pkl is compressed (") and str(e.value).endswith(
        f"bytes declaring {len(data):,}); torch.save stores records uncompressed"
    )


def test_why_not_the_c_unpickler_with_a_restricted_find_class(tmp_path):
    """The route issue 13 proposed, pickle.Unpickler with find_class limited to the same globals, is not a
    subset of weights_only: opcodes that need no global (DUP, FROZENSET) and targets weights_only checks
    (SETITEM on a list) pass through it. weights_only and this loader refuse all three."""
    import io

    class Restricted(pickle.Unpickler):
        def find_class(self, module, name):
            raise pickle.UnpicklingError(f"{module}.{name}")

    for body, loaded in (
        (b"\x80\x02]2\x86.", ([], [])),
        (b"\x80\x02(K\x01\x91.", frozenset({1})),
        (b"\x80\x02](K\x00K\x01eK\x00K\x07s.", [7, 1]),
    ):
        assert Restricted(io.BytesIO(body)).load() == loaded
        path = torch_zip(tmp_path / "x.pt", body)
        assert outcome(weights_only, path)[0] == "refused"
        with pytest.raises(Refused):
            fast(path)

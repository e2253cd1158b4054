"""A restricted loader for `torch.save` files: a subset of `torch.load(weights_only=True)`, numbers at C speed.

torch's weights_only unpickler runs every pickle opcode in Python; slime's rollout dumps are lists of Python
numbers, about three opcodes a token, so a case-sized dump (512 samples of up to 65,536 tokens) takes from
45 seconds on an idle laptop core to minutes on a busy one, and 1.9 GB. This loader runs the same opcode
semantics, but:

* a run of number opcodes inside one list batch (`MARK`, up to 1,000 `BININT*`/`BINFLOAT`, `APPENDS`: how
  the pickler writes every list) is validated and decoded as a whole, by numpy (floats, small ints) or by
  the C unpickler on the validated bytes alone (mixed ints), into a numpy array;
* lists become `CList`s, which keep those arrays (a number a few bytes, not a 32-byte Python object);
* the samples of a rollout dump are handed out as soon as each is complete (`Loader.events`), while the
  rest of the file is still being read;
* what it builds is charged, before it is built, to a budget of 8 bytes a byte of the file + 32 MiB
  (`nanscope.trace.loading.pickle_budget`): a file of 20 MB of EMPTY_SET opcodes is refused at 201 MB, not 4.8 GB.

What it accepts is a strict subset of what torch's weights_only unpickler accepts, and it loads the same
object (with `CList` in place of list). Refused, where weights_only accepts: globals other than `_allowed()`
(collections.OrderedDict, torch._utils._rebuild_tensor_v2 and the dtype storage markers, all taken from
torch's own allowlist), BUILD, NEWOBJ, REDUCE other than `OrderedDict()` and a plain tensor rebuild,
dict keys other than str/int/float/bool/None (a deeply nested tuple key crashes CPython's hash), storages
whose record size differs from their declared size, archives of the other byte order, the legacy non-zip
format. Every opcode weights_only lacks (INST, OBJ, STACK_GLOBAL, EXT*, FRAME, ...) is refused too. A
refusal carries `where`, the path of the value being read (`samples`, 3, `tokens`).

Why not `pickle.Unpickler` with `find_class` limited to the same globals (the route issue 13 proposed): it
is not a subset of weights_only. Opcodes that need no global (DUP, FROZENSET, ...) and mutations
weights_only checks the target of (SETITEM on a list) pass through it; a 9-byte pickle (LONG_BINPUT 2^31-1)
makes it try to allocate a 16 GiB memo table; and it builds the whole object graph before returning: 3.4 GB
on a case-sized rollout dump of full-length responses (benchmarks/scan_throughput.py). This loader: 1.15 GB,
streaming, in 40 % of its time.

    loader = Loader.open("rollout_data/12.pt")
    for index, sample in loader.events():   # rollout samples as they complete (dicts of CLists)
        ...
    loader.result                            # the whole object once events() is exhausted
"""

from __future__ import annotations

import bisect
import gc
import itertools
import os
import pickle
import re
import struct
import sys
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np

from nanscope.trace.loading import pickle_budget, torch_file
from nanscope.trace.loading.pickle_budget import OverBudget

# The opcodes read here (as pickle's own constants: one-byte bytes).
MARK, STOP, BININT, BININT1, BININT2, NONE = b"(", b".", b"J", b"K", b"M", b"N"
BINPERSID, REDUCE, BINUNICODE, APPEND, BUILD, GLOBAL = b"Q", b"R", b"X", b"a", b"b", b"c"
EMPTY_DICT, APPENDS, BINGET, LONG_BINGET, EMPTY_LIST = b"}", b"e", b"h", b"j", b"]"
BINPUT, LONG_BINPUT, SETITEM, TUPLE, EMPTY_TUPLE, SETITEMS = b"q", b"r", b"s", b"t", b")", b"u"
BINFLOAT, PROTO, TUPLE1, TUPLE2, TUPLE3, NEWTRUE, NEWFALSE = b"G", b"\x80", b"\x85", b"\x86", b"\x87", b"\x88", b"\x89"
LONG1, SHORT_BINSTRING, EMPTY_SET = b"\x8a", b"U", b"\x8f"

_BLOCKED_MODULES = ("sys", "os", "posix", "nt")  # as torch's weights_only unpickler
_KEY_TYPES = (str, int, float, bool, type(None))
_F8 = np.dtype([("op", "u1"), ("v", ">f8")])  # one BINFLOAT opcode: 'G' + big-endian double
_U1 = np.dtype([("op", "u1"), ("v", "u1")])  # one BININT1 opcode: 'K' + byte
# A run of BININT1/BININT2/BININT opcodes. Possessive: the opcodes' first bytes differ, so there is nothing to
# backtrack to, and a greedy `+` kept state for every opcode matched (57 bytes a byte of the run: 1.1 GB for 20 MB).
_INTS = re.compile(rb"(?:K.|M..|J....)++", re.S)
_PIECE = 65536  # integer opcodes decoded at a time (a piece of a run)
_INTS_PIECE = re.compile(rb"(?:K.|M..|J....){1,%d}+" % _PIECE, re.S)
_PIECE_TRANSIENT = 64  # bytes an integer of a piece takes while decoded: a list slot, an int, its opcode twice
_RUN = 112 + pickle_budget.SLOT  # a number run's array beyond its data: numpy's header, its slot in the chunks
_BLOCK = 4096  # opcodes examined at a time when measuring a homogeneous run
_WHERE_DEPTH = 16  # the outermost containers a refusal's `where` names


class Refused(Exception):
    """The pickle needs something outside the allowlist (or outside this loader's subset of it).

    Attributes:
        where: the path of the value being read when it was refused (dict keys and list indices, outermost
            first), as far as the open containers tell it; empty before the first container.
    """

    where: tuple = ()


class Unreadable(Exception):
    """The file is not a well-formed torch.save archive (truncated, bad reference, stack underflow, ...).

    Attributes:
        where: as `Refused.where`.
    """

    where: tuple = ()


def _torch_allowed() -> dict[str, Any]:
    """torch's weights_only allowlist (its default table, without user additions)."""
    from torch._weights_only_unpickler import _get_allowed_globals  # heavy: torch, at the first file read

    return _get_allowed_globals()


def _allowed() -> dict[str, Any]:
    """Our globals: OrderedDict, the v2 tensor rebuild and the dtype storage markers, from torch's own table."""
    import torch  # heavy: torch, at the first file read

    table = _torch_allowed()
    names = ["collections.OrderedDict", "torch._utils._rebuild_tensor_v2"] + [
        name for name, v in table.items()
        if isinstance(v, torch.serialization.StorageType) and name.startswith("torch.") and name.count(".") == 1
        and not name.startswith("torch.Q")
    ]  # fmt: skip
    return {name: table[name] for name in names}


class CList:
    """A list as this loader keeps it: chunks in order, numpy arrays for number runs, Python lists otherwise.

    `array()` gives the whole list as one array when every entry came from a number run (what a slime
    dump's lists are); `tolist()` gives exactly the list torch.load would have built.
    """

    __slots__ = ("chunks", "n", "_starts")

    def __init__(self):
        self.chunks: list[np.ndarray | list] = []
        self.n = 0
        self._starts: list[int] | None = None  # index of each chunk's first entry, built by item()

    def __len__(self) -> int:
        return self.n

    def add_array(self, a: np.ndarray) -> None:
        self.chunks.append(a)
        self.n += len(a)
        self._starts = None

    def add_objects(self, items: list) -> None:
        if self.chunks and type(self.chunks[-1]) is list:
            self.chunks[-1].extend(items)
        else:
            self.chunks.append(list(items))
        self.n += len(items)
        self._starts = None

    def item(self, i: int) -> Any:
        """Entry i, as torch.load's list would hold it (a Python number for a number run)."""
        if not 0 <= i < self.n:
            raise IndexError(i)
        if self._starts is None:
            self._starts = list(itertools.accumulate((len(c) for c in self.chunks[:-1]), initial=0))
        k = bisect.bisect_right(self._starts, i) - 1
        c = self.chunks[k][i - self._starts[k]]
        return c if type(self.chunks[k]) is list else c.item()

    def array(self) -> np.ndarray | None:
        """All entries as one array (int32 or float64, as the runs were), or None if any is not from a run."""
        if not self.chunks:
            return np.array([])
        if any(type(c) is list for c in self.chunks):
            return None
        return self.chunks[0] if len(self.chunks) == 1 else np.concatenate(self.chunks)

    def __iter__(self) -> Iterator[Any]:
        for c in self.chunks:
            if type(c) is list:
                yield from c
            else:  # a slice at a time: a huge run never becomes one huge Python list
                for a in range(0, len(c), _BLOCK):
                    yield from c[a : a + _BLOCK].tolist()

    def tolist(self) -> list:
        return list(self)


class Loader:
    """One torch.save archive, read by the restricted unpickler. See the module docstring."""

    def __init__(self, path: str, reader, data: bytes, file_bytes: int):
        self.path, self.reader, self.data = path, reader, data
        self.pos = 0
        self.budget = pickle_budget.budget(file_bytes)  # bytes of objects the pickle may build
        self.left, self.file_bytes = self.budget, file_bytes
        self.stack: list = []
        self.meta: list[list] = []  # the stacks below each open MARK
        self.owners: list = []  # the object under each open MARK (what its APPENDS/SETITEMS fill)
        self.memo: dict[int, Any] = {}
        self.storages: dict[str, Any] = {}
        self.storage_ids: set[int] = set()
        self.sealed: set[int] = set()  # ids of samples handed out, and of their fields: no later mutation
        self.samples: CList | None = None  # the rollout dump's `samples` list, once seen
        self.handed: list[dict] = []  # samples handed out, in order (a prefix of `samples`)
        self.streaming = True  # False once the samples list holds something other than complete dicts
        self.result: Any = None
        self._ready, self._yielded = False, 0
        self._allowed = _allowed()
        self._ops = self._table()

    @classmethod
    def open(cls, path: str) -> Loader:
        """Open the archive with torch's own zip reader and read its data.pkl record.

        Raises:
            Unreadable: not a zip archive, a TorchScript archive, no data.pkl, an unknown byte order.
            Refused: an archive of the other byte order (torch would byteswap it; this loader does not).

        What the pickle builds is charged to a budget proportional to the file's size
        (`nanscope.trace.loading.pickle_budget`); `events()` raises OverBudget past it.
        """
        import torch  # heavy: torch, at the first file read

        with open(path, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                raise Unreadable("not a torch.save zip archive (torch >= 1.6 format)")
        _check_directory(path)
        try:
            reader = torch._C.PyTorchFileReader(path)
            records = set(reader.get_all_records())
            if "constants.pkl" in records:
                raise Unreadable("a TorchScript archive, not a torch.save file")
            if "data.pkl" not in records:
                raise Unreadable("no data.pkl record")
            order = reader.get_record("byteorder") if "byteorder" in records else b"little"
            data = reader.get_record("data.pkl")
        except RuntimeError as e:
            raise Unreadable(_first_line(e)) from None
        if order not in (b"little", b"big"):
            raise Unreadable(f"unknown byte order {order[:20]!r}")
        if order != sys.byteorder.encode():
            raise Refused(f"a {order.decode()}-endian archive on a {sys.byteorder}-endian machine")
        return cls(path, reader, bytes(data), os.path.getsize(path))

    # ----------------------------------------------------------------------------------------- driving

    def events(self) -> Iterator[tuple[int, dict]]:
        """Run the pickle, yielding (index, sample dict) for each rollout sample as soon as it is complete.

        When exhausted, `result` holds the whole object. Raises Refused, Unreadable or OverBudget (what the
        pickle builds, charged before it is built, would pass the file's budget).

        Python's cyclic garbage collector is paused while the pickle runs (not while a sample is handed
        out): it would traverse every container built so far, again and again, for no cycle (5x the time of
        a million empty lists).
        """
        data, ops, n, charges = self.data, self._ops, len(self.data), pickle_budget.charges()
        collecting = gc.isenabled()
        gc.disable()
        try:
            while True:
                if self.pos >= n:
                    raise Unreadable("truncated pickle: no STOP")
                op = data[self.pos]
                self.pos += 1
                handler = ops[op]
                if handler is None:
                    raise Refused(f"pickle opcode {op} is outside the weights_only subset")
                self.left -= charges[op]
                if self.left < 0:
                    raise OverBudget(self.budget, self.file_bytes, self.pos - 1)
                if handler():
                    break
                if self._ready:
                    if collecting:
                        gc.enable()
                    yield from self._flush()
                    gc.disable()
        except (Refused, Unreadable, OverBudget) as e:
            e.where = self.where()
            raise
        except (
            IndexError,
            KeyError,
            struct.error,
            UnicodeDecodeError,
            OverflowError,
            ValueError,
            TypeError,
            RuntimeError,
        ) as e:
            error = Unreadable(f"malformed pickle at byte {self.pos - 1}: {type(e).__name__}: {_first_line(e)}")
            error.where = self.where()
            raise error from None
        finally:
            if collecting:
                gc.enable()
        self._check_samples()

    def where(self) -> tuple:
        """The path of the value being read: for each open container, a dict's key or a list's index.

        A diagnostic, read from the stacks (of the outermost 16 frames). In a dict's frame the key is the one
        before the container being filled by the next frame, else the last string at an even position; a
        list's index counts its entries, plus the finished items of its open batch (not the callables and
        argument tuples of an item still being built). A list filled one APPEND at a time inside a dict's
        frame adds its length (the item on top of the list being filled by the next frame, or the last).
        """
        path: list = []
        shown = min(len(self.owners), _WHERE_DEPTH + 1)  # the frames read; a flood of MARKs opens millions
        frames = [(self.owners[k], self.meta[k + 1] if k + 1 < len(self.meta) else self.stack) for k in range(shown)]
        for depth, (owner, inner) in enumerate(frames[:_WHERE_DEPTH]):
            deeper = frames[depth + 1][0] if depth + 1 < len(frames) else None
            filling = bool(inner) and inner[-1] is deeper and type(deeper) in (dict, OrderedDict, CList)
            if type(owner) in (dict, OrderedDict):
                appended = filling and len(inner) > 1 and type(inner[-2]) is CList  # [..., key, list, item]
                j = len(inner) - 2 - appended if filling else len(inner) - 1 - (len(inner) - 1) % 2
                while j >= 0 and type(inner[j]) is not str:
                    j -= 2
                path.append(inner[j] if j >= 0 else None)
                if appended:
                    path.append(len(inner[-2]))
                elif deeper is None and 0 <= j < len(inner) - 1 and type(inner[j + 1]) is CList:
                    path.append(len(inner[j + 1]))
            elif type(owner) is CList:
                done = len(inner) - 1 if filling else sum(not callable(x) and type(x) is not tuple for x in inner)
                path.append(len(owner) + done)
        return tuple(path)

    def load(self) -> Any:
        """The whole object (consumes the events)."""
        for _ in self.events():
            pass
        return self.result

    # -------------------------------------------------------------------------------------- the opcodes

    def _table(self) -> list:
        """The handler of each opcode byte value (None: outside the subset)."""
        table = {
            PROTO: self._proto, STOP: self._stop, MARK: self._mark, NONE: lambda: self._push(None),
            NEWTRUE: lambda: self._push(True), NEWFALSE: lambda: self._push(False),
            BININT: lambda: self._push(self._unpack("<i", 4)), BININT1: lambda: self._push(self._take(1)[0]),
            BININT2: lambda: self._push(self._unpack("<H", 2)), BINFLOAT: lambda: self._push(self._unpack(">d", 8)),
            LONG1: self._long1, BINUNICODE: self._binunicode, SHORT_BINSTRING: self._short_binstring,
            EMPTY_TUPLE: lambda: self._push(()), EMPTY_LIST: self._empty_list, EMPTY_DICT: lambda: self._push({}),
            EMPTY_SET: lambda: self._push(set()), TUPLE: self._tuple_mark,
            TUPLE1: lambda: self._tuple(1), TUPLE2: lambda: self._tuple(2), TUPLE3: lambda: self._tuple(3),
            BINPUT: lambda: self._put(self._take(1)[0]), LONG_BINPUT: lambda: self._put(self._unpack("<I", 4)),
            BINGET: lambda: self._push(self.memo[self._take(1)[0]]),
            LONG_BINGET: lambda: self._push(self.memo[self._unpack("<I", 4)]),
            APPEND: self._append, APPENDS: self._appends, SETITEM: self._setitem, SETITEMS: self._setitems,
            GLOBAL: self._global, REDUCE: self._reduce, BINPERSID: self._binpersid,
            BUILD: self._refuse_build,
        }  # fmt: skip
        return [table.get(bytes([op])) for op in range(256)]

    def _charge(self, n: int) -> None:
        """Charge n bytes about to be built beyond what the opcode's table entry charged."""
        self.left -= n
        if self.left < 0:
            raise OverBudget(self.budget, self.file_bytes, self.pos - 1)

    def _take(self, k: int) -> bytes:
        b = self.data[self.pos : self.pos + k]
        if len(b) != k:
            raise Unreadable(f"truncated pickle at byte {self.pos}")
        self.pos += k
        return b

    def _unpack(self, fmt: str, k: int):
        return struct.unpack(fmt, self._take(k))[0]

    def _push(self, x: Any) -> None:
        self.stack.append(x)

    def _proto(self) -> None:
        self._take(1)

    def _stop(self) -> bool:
        self.result = self.stack.pop()
        return True

    def _long1(self) -> None:
        n = self._take(1)[0]
        self._charge(n)
        self._push(int.from_bytes(self._take(n), "little", signed=True))

    def _binunicode(self) -> None:
        self._push(self._text(self._unpack("<I", 4), "surrogatepass"))

    def _short_binstring(self) -> None:
        self._push(self._text(self._take(1)[0], "strict"))  # torch.load's encoding

    def _text(self, n: int, errors: str) -> str:
        """n bytes of UTF-8 as a str, charged at the most they can build first, then at what they built."""
        bound = pickle_budget.payload(BINUNICODE[0], n)
        self._charge(bound)
        text = str(self._take(n), "utf-8", errors)
        self.left += bound - max(0, sys.getsizeof(text) - pickle_budget.BUILDS[BINUNICODE])
        return text

    def _empty_list(self) -> None:
        lst = CList()
        if self._is_samples_key():
            self.samples = lst
        self._push(lst)

    def _tuple(self, k: int) -> None:
        if len(self.stack) < k:
            raise IndexError("tuple of more items than the stack holds")
        items = tuple(self.stack[-k:])
        del self.stack[-k:]
        self._push(items)

    def _tuple_mark(self) -> None:
        items = self._pop_mark()
        self._charge(pickle_budget.SLOT * len(items))
        self._push(tuple(items))

    def _put(self, i: int) -> None:
        self.memo[i] = self.stack[-1]

    def _mark(self) -> None:
        st = self.stack
        if st and type(st[-1]) is CList and self._number_run(st[-1]):
            return
        self.meta.append(st)
        self.owners.append(st[-1] if st else None)
        self.stack = []

    def _pop_mark(self) -> list:
        items = self.stack
        self.stack = self.meta.pop()
        self.owners.pop()
        return items

    def _target(self, types: tuple[type, ...], what: str):
        t = self.stack[-1]
        if type(t) not in types:
            raise Refused(f"{what} on a {type(t).__name__}")
        if id(t) in self.sealed:
            raise Refused(f"{what} on sample {self._sample_index(t)} after it was complete")
        return t

    def _append(self) -> None:
        item = self.stack.pop()
        self._target((CList,), "APPEND").add_objects([item])

    def _appends(self) -> None:
        items = self._pop_mark()
        self._charge(pickle_budget.SLOT * len(items))
        self._target((CList,), "APPENDS").add_objects(items)

    def _setitem(self) -> None:
        v, k = self.stack.pop(), self.stack.pop()
        self._set(self._target((dict, OrderedDict), "SETITEM"), [k, v])

    def _setitems(self) -> None:
        items = self._pop_mark()
        self._charge(pickle_budget.DICT_ENTRY * (len(items) // 2))
        self._set(self._target((dict, OrderedDict), "SETITEMS"), items)

    def _set(self, d: dict, items: list) -> None:
        if len(items) % 2:
            raise IndexError("SETITEMS with an odd number of items")
        for k, v in zip(items[::2], items[1::2]):
            if type(k) not in _KEY_TYPES:
                raise Refused(f"a dict key of type {type(k).__name__}")
            d[k] = v
        self._maybe_sample(d)

    def _global(self) -> None:
        from torch._utils import IMPORT_MAPPING, NAME_MAPPING  # heavy: torch, at the first file read

        module, name = self._line(), self._line()
        if (module, name) in NAME_MAPPING:
            module, name = NAME_MAPPING[(module, name)]
        elif module in IMPORT_MAPPING:
            module = IMPORT_MAPPING[module]
        full = f"{module}.{name}"
        if full in self._allowed:
            self._push(self._allowed[full])
        elif module not in _BLOCKED_MODULES and full in _torch_allowed():
            raise Refused(
                f"{full} is in torch's weights_only allowlist but not in nanscope's subset of it (a scan "
                "reads plain dense tensors: no meta, sparse, quantized or nested ones)"
            )
        else:
            raise Refused(f"loading it needs arbitrary unpickling (it references {full[:100]})")

    def _line(self) -> str:
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            raise Unreadable("truncated GLOBAL")
        line, self.pos = self.data[self.pos : end], end + 1
        return line.decode("utf-8")

    def _reduce(self) -> None:
        import torch  # heavy: torch, at the first file read

        args, func = self.stack.pop(), self.stack[-1]
        if func is OrderedDict and args == ():
            self.left += pickle_budget.TENSOR - pickle_budget.ORDERED_DICT  # charged as a tensor, at most
            self.stack[-1] = OrderedDict()
        elif func is torch._utils._rebuild_tensor_v2:
            self.stack[-1] = self._rebuild(args)
        else:
            raise Refused(f"a call of {getattr(func, '__name__', type(func).__name__)} outside the subset")

    def _refuse_build(self) -> None:
        raise Refused("BUILD (setting an object's state) is outside the subset")

    # ------------------------------------------------------------------------------------------- tensors

    def _binpersid(self) -> None:
        """A storage reference, ('storage', marker, key, location, numel), loaded through torch's zip reader."""
        import torch  # heavy: torch, at the first file read

        pid = self.stack.pop()
        if type(pid) is not tuple or len(pid) != 5 or pid[0] != "storage":
            raise Refused("a persistent id other than a storage")
        _, marker, key, location, numel = pid
        if (
            not isinstance(marker, torch.serialization.StorageType)
            or type(key) is not str
            or not key.isdigit()
            or type(location) is not str
            or type(numel) is not int
            or numel < 0
        ):
            raise Refused("a malformed storage reference")
        storage = self.storages.get(key)  # not `or`: a storage's truth value is deprecated (and warns)
        if storage is None:  # main's per-sample rollout_mask_sums are views of one storage: seen again
            storage = self._storage(key, marker.dtype, numel)
        else:  # charged as a new storage object: none was built
            self.left += pickle_budget.STORAGE
        if numel:  # as torch: an empty storage is not cached, each reference gets its own
            self.storages[key] = storage
        self.storage_ids.add(id(storage))
        self._push(storage)

    def _storage(self, key: str, dtype, numel: int):
        """torch's own steps (serialization._load, map_location='cpu'), the record size checked first."""
        import torch  # heavy: torch, at the first file read

        nbytes = numel * torch._utils._element_size(dtype)
        try:
            raw = self.reader.get_storage_from_record(f"data/{key}", nbytes, torch.UntypedStorage)
        except RuntimeError as e:  # no such record, or its size differs from nbytes
            raise Unreadable(f"storage {key}: {_first_line(e)}") from None
        untyped = raw._typed_storage()._untyped_storage
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)

    def _rebuild(self, args: tuple):
        """torch._utils._rebuild_tensor_v2 of a plain tensor, its arguments checked first."""
        import torch  # heavy: torch, at the first file read

        if type(args) is not tuple or len(args) != 6:
            raise Refused("a tensor rebuild with other than 6 arguments")
        storage, offset, size, stride, requires_grad, hooks = args
        if (
            id(storage) not in self.storage_ids
            or not _ints(size)
            or not _ints(stride)
            or len(size) != len(stride)
            or type(offset) is not int
            or offset < 0
            or type(requires_grad) is not bool
            or type(hooks) is not OrderedDict
            or hooks
        ):
            raise Refused("a tensor rebuild outside the subset (plain storage, sizes, strides, no hooks)")
        elements = storage._size()  # the public size() warns that TypedStorage is deprecated
        if all(size) and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= elements:
            raise Unreadable(f"a tensor view past the end of its storage of {elements}")
        return torch._utils._rebuild_tensor_v2(*args)

    # ------------------------------------------------------------------------------------ number runs

    def _number_run(self, target: CList) -> bool:
        """At a MARK under a list: decode `number opcodes... APPENDS` as one array. False if not such a run."""
        data, pos = self.data, self.pos
        first = data[pos : pos + 1]
        end = pos + 2 * _homogeneous(data, pos, 2, BININT1) if first == BININT1 else pos
        if first == BINFLOAT:  # log-probs: 'G' + 8 bytes each, read as one strided big-endian array
            end = pos + 9 * _homogeneous(data, pos, 9, BINFLOAT)
            charge = (end - pos) // 9 * 8 + _RUN
            make = lambda: np.frombuffer(data, _F8, (end - pos) // 9, pos)["v"].astype(np.float64)
        elif end > pos and data[end : end + 1] == APPENDS:  # loss masks: 'K' + 1 byte each
            charge = (end - pos) // 2 + _RUN
            make = lambda: np.frombuffer(data, _U1, (end - pos) // 2, pos)["v"].copy()
        else:  # token ids: K/M/J mixed; validated by the regex, decoded by the C unpickler
            m = _INTS.match(data, pos)
            if m is None:
                return False
            end = m.end()
            opcodes = (end - pos) // 2  # at most: 2 bytes an opcode
            # int32 arrays, one a piece, and a piece as the C unpickler's list while it is decoded
            charge = 4 * opcodes + _RUN * (1 + opcodes // _PIECE) + _PIECE_TRANSIENT * min(opcodes, _PIECE)
            make = lambda: _int_array(data, pos, end) if opcodes <= _PIECE else _int_pieces(data, pos, end)
        if data[end : end + 1] != APPENDS:
            return False
        if id(target) in self.sealed:
            raise Refused(f"APPENDS on sample {self._sample_index(target)} after it was complete")
        self._charge(charge)
        made = make()
        for array in [made] if type(made) is np.ndarray else made:
            target.add_array(array)
            charge -= array.nbytes + _RUN
        self.left += charge  # what was charged beyond what the arrays took
        self.pos = end + 1
        return True

    # ----------------------------------------------------------------------------------- rollout samples

    def _is_samples_key(self) -> bool:
        """A list about to be the value of the top-level dict's 'samples' key (how torch.save lays it out:
        the root dict alone at depth 0, its MARK open, the key 'samples' just pushed)."""
        st = self.stack
        return (
            self.samples is None
            and len(self.meta) == 1
            and len(self.meta[0]) == 1
            and type(self.owners[0]) is dict
            and len(st) % 2 == 1
            and st[-1] == "samples"
        )

    def _maybe_sample(self, d: dict) -> None:
        """After SETITEM(S) into d: if d sits in the frame that fills the samples list, it is complete.

        Handed-out samples are a prefix of the list; anything else in the list ends the streaming (the
        reader takes the rest from the final list).
        """
        if not self.streaming or self.samples is None or not self.owners or self.owners[-1] is not self.samples:
            return
        if self.stack[-1] is not d or id(d) in self.sealed:
            return
        if len(self.samples) + len(self.stack) - 1 != len(self.handed):
            self.streaming = False
            return
        self.sealed.add(id(d))
        self.sealed.update(id(v) for v in d.values() if type(v) in (CList, dict, OrderedDict))
        self.handed.append(d)
        self._ready = True

    def _flush(self) -> Iterator[tuple[int, dict]]:
        self._ready = False
        for i in range(self._yielded, len(self.handed)):
            yield i, self.handed[i]
        self._yielded = len(self.handed)

    def _sample_index(self, obj: Any) -> int:
        return next((i for i, d in enumerate(self.handed) if d is obj or any(v is obj for v in d.values())), -1)

    def _check_samples(self) -> None:
        """The samples handed out are the first ones of the final `samples` list, in order."""
        if not self.handed:
            return
        final = self.result.get("samples") if type(self.result) is dict else None
        if (
            final is not self.samples
            or len(final) < len(self.handed)
            or any(a is not b for a, b in zip(final, self.handed))
        ):
            raise Refused("the samples handed out are not the file's samples list (rearranged after reading)")


def _check_directory(path: str) -> None:
    """Every record stored uncompressed, once (`torch_file.check_records`): then none can hold more than the
    file's own bytes. torch.save never compresses; torch's reader inflates a deflated record to the size its
    header declares, so a small file could otherwise ask for gigabytes.
    """
    try:
        torch_file.check_records(path)
    except torch_file.Compressed as e:
        raise Refused(str(e)) from None
    except torch_file.BadArchive as e:
        raise Unreadable(str(e)) from None


def _homogeneous(data: bytes, pos: int, width: int, op: bytes) -> int:
    """How many opcodes `op` of `width` bytes follow each other from `pos`."""
    k = 0
    while True:
        ops = data[pos + k * width : pos + (k + _BLOCK) * width : width]
        n = len(ops) - len(ops.lstrip(op))
        k += n
        if n < _BLOCK:
            return k


def _int_array(data: bytes, pos: int, end: int) -> np.ndarray:
    """A validated run of integer opcodes as an int32 array, by the C unpickler on those bytes alone."""
    return np.array(pickle.loads(b"(" + data[pos:end] + b"l."), dtype=np.int32)


def _int_pieces(data: bytes, pos: int, end: int) -> list[np.ndarray]:
    """A run of more than `_PIECE` integer opcodes as int32 arrays, `_PIECE` at a time: decoded at once, a
    hostile run of millions would first be a Python list of them, 40 bytes an int."""
    out = []
    while pos < end:
        piece = _INTS_PIECE.match(data, pos, end).end()
        out.append(_int_array(data, pos, piece))
        pos = piece
    return out


def _ints(x: Any) -> bool:
    return type(x) is tuple and all(type(v) is int and v >= 0 for v in x)


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(e).__name__

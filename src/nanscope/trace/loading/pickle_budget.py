"""The memory a pickle may make an unpickler build: a budget proportional to the file's size, plus a constant.

An unpickler allocates per opcode, not per byte of data: one EMPTY_SET byte builds a 216-byte set, one MARK
a list, one TUPLE1 a tuple around the one before. A 20 MB file of such opcodes made torch's weights_only
unpickler, and nanscope's, hold 1.7-4.8 GB; `--max-dump-mb` bounds the file, not what it builds. So every
loader of a torch.save file charges what each opcode builds against

    budget(file_bytes) = BYTES_PER_BYTE * file_bytes + BASE_BYTES      (8 bytes a byte + 32 MiB)

and refuses the file past it (`OverBudget`: one line naming the file, the opcode's byte and the budget).
The charges (`BUILDS`) are what CPython 3.11 allocates on a 64-bit machine, measured (peak RSS of a million
of each): a reference 8 bytes (9 in a growing list), an int 32, a float 24, a set 232, a dict 72 and 64 an
entry, a MARK's frame 88, nanscope's CList 136, a tensor about 660 (768 charged), a storage object 512.
The file's own bytes (its pickle, and its storages: each record stored uncompressed, read once) are
outside the budget.

Two ways of charging, one table:

- nanscope's restricted unpickler (`nanscope.dumps.unpickler`) charges as it runs (`charges()`: what an
  opcode builds plus its stack slot; a container's entries where it is filled; a string, a number run's
  arrays, at the most first and then at what they took), and refuses at the opcode that would pass the
  budget. Its C-speed paths (a number run: up to 1,000 numbers decoded at once) are charged once a run.
- a file that torch.load(weights_only=True) will read (a traced micro-batch, a repro bundle:
  `nanscope.trace.loading.torch_file`) is walked first by `check()`, which builds nothing and charges every opcode
  as if nothing were freed and every pushed value became a dict's entry (`bounds()`): an upper bound of
  what torch's unpickler holds at any point of the same pickle.

The factor, from real dumps (bytes charged a byte of the file): a case-sized rollout dump (512 samples of
up to 65,536 tokens, lists) 0.91, its train dump (tensors) 0.02; the demo dumps (`scan --write-demo`, 16
samples of 88 tokens, 25 fields each) 2.7-4.3 for the rollout dumps and 4.3-5.3 for the train dumps of the
four releases, the densest real layout measured (tests/dumps/test_budget.py). `BYTES_PER_BYTE` is 8, 1.5x
that: a 20 MB flood is refused at 201 MB of objects (190-230 MiB of peak RSS with the pickle's own bytes,
in about a second). `BASE_BYTES` lets any small file through whatever its layout; samples of a dozen
tokens (11.7 bytes a byte) pass up to 9 MB.
"""

from __future__ import annotations

from nanscope.inputs import MiB

BYTES_PER_BYTE = 8  # 1.5x the densest real dump measured (the module docstring)
BASE_BYTES = 32 * MiB
SLOT = 9  # one reference: a stack slot or a list's entry, 8 bytes and the eighth a growing list over-allocates
DICT_ENTRY = 64  # a dict's entry (hash, key, value), its share of the index, both tables alive while it grows
STATIC_SLOT = 2 * SLOT + DICT_ENTRY  # check()'s charge per pushed value: stack slot + container slot + entry
TENSOR = 768  # a tensor: its Python object, TensorImpl, sizes and strides (measured: 660)
STORAGE = 512  # a storage object around a record's bytes (the bytes are the file's own)
ORDERED_DICT = 144  # the other call the restricted unpickler makes: OrderedDict()

# Bytes each opcode builds, its own stack slot not included (`charges`, `check` add it where it pushes).
# Opcodes absent here are outside torch's weights_only subset (and nanscope's); their charge is 0.
BUILDS = {
    b"(": 88,  # MARK: a new list for the frame, the old one kept on the metastack (measured: 85)
    b"N": 0, b"\x88": 0, b"\x89": 0, b")": 0, b"K": 0, b"h": 0, b"j": 0, b"c": 0,  # shared objects
    b"M": 32, b"J": 32, b"G": 24,  # BININT2, BININT (ints above 256), BINFLOAT
    b"\x8a": 32, b"X": 80, b"U": 80,  # LONG1, BINUNICODE, SHORT_BINSTRING: plus their payload (`payload`)
    b"]": 136, b"}": 72, b"\x8f": 232,  # EMPTY_LIST (a CList and its chunk list), EMPTY_DICT, EMPTY_SET
    b"t": 40, b"\x85": 48, b"\x86": 56, b"\x87": 64,  # TUPLE (plus a slot an item), TUPLE1-3
    b"q": DICT_ENTRY, b"r": DICT_ENTRY + 32,  # BINPUT, LONG_BINPUT: a memo entry (an int key above 256)
    b"R": TENSOR, b"\x81": TENSOR, b"b": TENSOR, b"Q": STORAGE,  # REDUCE, NEWOBJ, BUILD, BINPERSID
    b"a": SLOT, b"s": DICT_ENTRY, b"e": 0, b"u": 0,  # APPEND, SETITEM; APPENDS, SETITEMS: a slot/entry an item
    b"\x80": 0, b".": 0,  # PROTO, STOP
}  # fmt: skip
# The opcodes that push a value (a new or a shared object) onto the stack.
PUSHES = frozenset(b"N\x88\x89)KhjcMJG\x8aXU]}\x8f")
# Bytes of argument after each fixed-width opcode (the others: GLOBAL's two lines, a length-prefixed payload).
_WIDTH = {b"K": 1, b"h": 1, b"q": 1, b"\x80": 1, b"M": 2, b"J": 4, b"j": 4, b"r": 4, b"G": 8}


class OverBudget(Exception):
    """A pickle would build more than the budget of its file.

    Attributes:
        budget: the budget in bytes; file_bytes: the file's size; position: the opcode's byte in data.pkl;
        where: as the restricted unpickler's refusals (the path of the value being read), else empty.
    """

    where: tuple = ()

    def __init__(self, budget: int, file_bytes: int, position: int):
        super().__init__(
            f"its pickle builds over {budget:,} bytes of objects by byte {position:,} of data.pkl, the budget "
            f"of a {file_bytes:,}-byte file ({BYTES_PER_BYTE} bytes a byte + {BASE_BYTES // MiB} MiB); refusing it"
        )
        self.budget, self.file_bytes, self.position = budget, file_bytes, position


def budget(file_bytes: int) -> int:
    """The bytes of objects a pickle in a file of `file_bytes` may build."""
    return BYTES_PER_BYTE * file_bytes + BASE_BYTES


def charges() -> list[int]:
    """The restricted unpickler's charge per opcode byte value: what it builds plus its stack slot."""
    out = [0] * 256
    for op, n in BUILDS.items():
        out[op[0]] = n + (SLOT if op[0] in PUSHES else 0)
    return out


def payload(op: int, n: int) -> int:
    """The most a payload of n bytes builds beyond the object's header: a str up to 4 bytes a byte (one
    astral character makes CPython store every character in 4), an int's digits n."""
    return 4 * n if op in b"XU" else n


def check(data: bytes, file_bytes: int) -> int:
    """Walk a pickle as torch's weights_only unpickler reads it, building nothing; refuse it past the budget.

    Every opcode is charged as if nothing were freed and every value it pushes became a dict's entry, so
    the sum bounds what the unpickler holds at any point. The walk ends at STOP, at an opcode outside
    torch's subset or at a truncation (where torch's unpickler stops too, with its own error).

    Returns:
        The bytes charged.

    Raises:
        OverBudget: at the first opcode that crosses the budget.
    """
    table = bounds()
    left, pos, n = budget(file_bytes), 0, len(data)
    while pos < n:
        op = data[pos]
        left -= table[op]
        start, pos = pos, pos + 1
        width = _WIDTHS[op]
        if width >= 0:
            pos += width
        elif op == 0x2E or op not in _KNOWN:  # STOP, or an opcode torch refuses
            break
        elif op == 0x63:  # GLOBAL: module and name, a line each
            first = data.find(b"\n", pos)
            second = data.find(b"\n", first + 1) if first >= 0 else -1
            if second < 0:
                break
            pos = second + 1
        else:  # BINUNICODE: a 4-byte length; SHORT_BINSTRING, LONG1: a 1-byte length
            size = int.from_bytes(data[pos : pos + 4], "little") if op == 0x58 else data[pos] if pos < n else 0
            pos += (4 if op == 0x58 else 1) + size
            left -= payload(op, min(size, n))
        if left < 0:
            raise OverBudget(budget(file_bytes), file_bytes, start)
    return budget(file_bytes) - left


def bounds() -> list[int]:
    """`check()`'s charge per opcode byte value: what it builds plus, if it pushes, `STATIC_SLOT`."""
    out = [0] * 256
    for op, n in BUILDS.items():
        out[op[0]] = n + (STATIC_SLOT if op[0] in PUSHES else 0)
    return out


_KNOWN = frozenset(op[0] for op in BUILDS)
# -1: a variable-length argument (or none known); else the bytes of argument after the opcode.
_WIDTHS = tuple(
    _WIDTH.get(bytes([c]), -1 if c in b"cXU\x8a." or c not in _KNOWN else 0) for c in range(256)
)  # fmt: skip

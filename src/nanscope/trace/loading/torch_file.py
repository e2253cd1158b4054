"""A torch.save file read with torch.load(weights_only=True), bounded by what was read.

weights_only never runs the file's code, but it trusts the file's sizes: a deflated record is inflated to
the size its header declares, a pickle of 20 MB can build gigabytes of objects, and a stride-0 view of one
element can declare 10^10 of them, which a reader then walks position by position. So `load`, the reader
of trace's micro-batch files and of every other torch.save file nanscope reads with torch.load (repro
bundles), checks, before torch.load runs:

- a regular file under the caller's cap (`nanscope.inputs.check_file`);
- every record stored uncompressed, once (`check_records`; torch.save never compresses);
- a pickle that builds at most its file's budget (`nanscope.trace.loading.pickle_budget.check`);

and after it, that every tensor is a plain dense CPU tensor whose elements each lie once inside its own
storage (`overrun`: no stride-0 or overlapping view, none past the storage's end). Every refusal is one
UserError line naming the file and, for a tensor, where it sits in the loaded object.

    doc = torch_file.load("mb.pt", "micro-batch file", limit=4 << 30, option="--max-input-mb")

Torch is imported only when a file is read (`nanscope.dumps.unpickler` imports `check_records` at its top).
"""

from __future__ import annotations

import re
import warnings
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

from nanscope.errors import UserError
from nanscope.inputs import check_file
from nanscope.trace.loading import pickle_budget


class BadArchive(ValueError):
    """Not a zip archive torch.save could have written (unreadable, or a record name twice)."""


class Compressed(BadArchive):
    """A record is compressed: torch's reader would inflate it to whatever size its header declares."""


def check_records(path: str) -> None:
    """Every record of the zip archive stored uncompressed, once: then none can hold more than the file.

    Raises:
        BadArchive: not a readable zip archive, or a record name that appears twice.
        Compressed: a deflated (or otherwise packed) record.
    """
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as e:
        raise BadArchive(f"not a readable zip archive: {_first_line(e)}") from None
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        raise BadArchive("a record name appears twice in the archive")
    packed = next((i for i in infos if i.compress_type != zipfile.ZIP_STORED or i.file_size != i.compress_size), None)
    if packed is not None:
        raise Compressed(
            f"record {packed.filename[:80]} is compressed ({packed.compress_size:,} bytes declaring "
            f"{packed.file_size:,}); torch.save stores records uncompressed"
        )


def load(
    path,
    what: str,
    limit: int | None = None,
    option: str | None = None,
    *,
    name: Callable[[tuple, Any], str] | None = None,
) -> Any:
    """torch.load(path, weights_only=True) on the CPU, within the bounds of the module docstring.

    Args:
        what: the file's kind in messages ("micro-batch file": "PATH: not a nanscope micro-batch file (...)").
        limit, option: the largest file accepted in bytes (None: any size), and the option that raises it.
        name: how a tensor's place in the loaded object (keys and indices, outermost first) reads in a refusal,
            given the place and the object; default `where`.

    Raises:
        UserError: one line naming the file (and the tensor).
    """
    import torch  # heavy: torch, only when a file is read

    size = check_file(path, what, limit, option)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:  # an I/O error, a file that vanished since the check
        raise UserError(f"{path}: {what}: cannot read: {e.strerror or e}") from None
    if magic != b"PK\x03\x04":
        raise UserError(f"{path}: not a nanscope {what} (not a torch.save zip archive)")
    try:
        check_records(str(path))
        pickle_budget.check(torch._C.PyTorchFileReader(str(path)).get_record("data.pkl"), size)
    except (BadArchive, pickle_budget.OverBudget) as e:
        raise UserError(f"{path}: {what}: {e}") from None
    except RuntimeError as e:  # torch's reader: no data.pkl record, a malformed archive
        raise UserError(f"{path}: not a nanscope {what} ({_first_line(e)})") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a protocol other than 2: one line, not torch's warning
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle errors, unsafe globals, a TorchScript archive, a truncated storage
        raise UserError(f"{path}: not a nanscope {what} (torch.load weights_only: {refusal(e)})") from None
    for place, tensor in _tensors(obj):
        problem = plain_problem(tensor) or overrun(tensor)
        if problem:
            raise UserError(f"{path}: {name(place, obj) if name else where(place)}: {problem}")
    return obj


def plain_problem(x) -> str | None:
    """Why `x` is not a plain dense CPU tensor (what a file's data can only be), or None."""
    import torch  # heavy: torch, only for the tensors a file holds

    if type(x) not in (torch.Tensor, torch.nn.Parameter) or x.is_quantized or x.is_nested:
        return f"a {type(x).__name__} tensor, expected a plain tensor"
    if x.layout != torch.strided:
        return f"a {str(x.layout).removeprefix('torch.')} tensor, expected a dense one"
    if x.device.type != "cpu":
        return f"a tensor on device {x.device.type} (no data in the file), expected cpu"
    return None


def overrun(x) -> str | None:
    """Why a dense tensor's declared elements are not each stored once inside its storage, or None.

    Dimensions sorted by stride, each must step past everything the smaller ones span (so no two indices
    share an element: a stride-0 view of one element declaring 10^10 fails here), and the last element must
    lie inside the storage.
    """
    n = x.numel()
    if n == 0:
        return None
    storage = x.untyped_storage().nbytes() // x.element_size()
    extent = 1  # elements spanned by the dimensions checked so far
    for stride, length in sorted((st, sz) for sz, st in zip(x.shape, x.stride()) if sz > 1):
        if stride < extent:
            return (
                f"tensor of {n:,} elements with stride {stride} over a storage of {storage:,}, expected each "
                "element stored once"
            )
        extent += (length - 1) * stride
    if x.storage_offset() + extent > storage:
        return f"tensor of {n:,} elements at offset {x.storage_offset():,} past its storage of {storage:,}"
    return None


def where(place: tuple) -> str:
    """A place in a loaded object as a refusal names it: `batch['log_probs'][3]`; `file` at the top."""
    head, rest = (str(place[0]), place[1:]) if place and type(place[0]) is str else ("file", place)
    return head[:40] + "".join(f"[{p[:40]!r}]" if type(p) is str else f"[{p}]" for p in rest)


def _tensors(obj: Any) -> Iterator[tuple[tuple, Any]]:
    """Every tensor in a loaded object (dicts, lists, tuples; each object once), with its place, depth first.

    Iterative, places kept as links to the parent's, so a nesting as deep as the pickle allows costs
    one entry a level.
    """
    import torch  # heavy: torch, only for the tensors a file holds

    todo: list[tuple[Any, Any]] = [(None, obj)]  # (link to the place: (key, parent link) or None, object)
    seen: set[int] = set()
    while todo:
        link, x = todo.pop()
        if id(x) in seen:
            continue
        if isinstance(x, torch.Tensor):
            seen.add(id(x))
            yield _place(link), x
        elif isinstance(x, dict):
            seen.add(id(x))
            todo.extend(((k, link), v) for k, v in reversed(list(x.items())))
        elif isinstance(x, (list, tuple)):
            seen.add(id(x))
            todo.extend(((i, link), v) for i, v in reversed(list(enumerate(x))))


def _place(link) -> tuple:
    out = []
    while link is not None:
        key, link = link
        out.append(key)
    return tuple(reversed(out))


def refusal(e: BaseException) -> str:
    """Why torch.load(weights_only=True) refused a file, without torch's advice to load it with weights_only=False
    (which runs the file's code): the unpickler's own reason where torch gives one."""
    reason = _WEIGHTS_ONLY.search(str(e))
    if reason is not None:  # torch's advice to allowlist the global follows the reason
        return reason.group(1).split(". Please use")[0].strip().rstrip(".")[:200]
    line = _first_line(e)
    advice = re.search(r"weights[ _]only", line, re.IGNORECASE) is not None
    return "the file holds objects outside weights_only's allowlist" if advice else line


_WEIGHTS_ONLY = re.compile(r"WeightsUnpickler error: ([^\n]*)")


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(e).__name__

"""The one reader of slime's debug dumps (the one writer of each format is `nanscope.dumps.writers`).

Which release wrote a file is read from its fields (`nanscope.dumps.formats`: v0.1.0, v0.2.4, v0.3.1,
main); `Dump.format` says which, and what differs from v0.1.0's layout. slime writes two kinds of dump
with `torch.save`: rollout dumps, `dict(rollout_id, samples=[Sample.to_dict(), ...])`
(`nanscope.dumps.rollout_dump`), and train dumps, `dict(rollout_id, rank, rollout_data=per-key lists)`
or main's `dict(format_version=2, rollout_id, rank, samples=[one dict per sample], ...)`
(`nanscope.dumps.train_dump`).

Everything is read by `nanscope.dumps.unpickler`, a restricted unpickler that accepts a subset of what
`torch.load(weights_only=True)` accepts and loads the same objects, with lists of numbers kept as numpy
arrays; a file that needs anything more is refused unless the caller passes `trust_pickle=True`
(`torch.load(weights_only=False)`). A rollout dump's samples are converted and handed out as the file is
read, so a scan of one needs the pickle bytes and the compact arrays, never Python's object graph.

Nothing a file declares is trusted (`Limits`, `nanscope.dumps.fields`): the file must be a regular file
under a size cap; a sample's fields and declared response length under a per-sample cap; a tensor dense,
on the CPU, 1-D and contiguous inside its own storage; what the pickle builds while it is read at most 8
bytes a byte of the file + 32 MiB (`nanscope.trace.loading.pickle_budget`); and the entries converted over the whole
file at most one per byte of it, so samples sharing one list cannot multiply the work. Each refusal is one
line naming the file, the field and the sample.

Two readers use it: `load` (the scan's samples, or with `tokens=True` a token map's) and `load_rollout`
(the rollout a traced step maps its tokens with, as tensors).
"""

from __future__ import annotations

import itertools
import os
import warnings
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from nanscope.dumps import formats
from nanscope.dumps.dump import Dump, SampleData
from nanscope.dumps.fields import SEQUENCES, Fields, keys_text, stored_rollout_id, type_name
from nanscope.dumps.limits import Budget, Limits
from nanscope.dumps.rollout_dump import scan_sample, token_sample
from nanscope.dumps.train_dump import is_main_sample, main_sample, train_dump
from nanscope.dumps.unpickler import Loader, Refused, Unreadable
from nanscope.errors import UserError
from nanscope.facts import ranges
from nanscope.inputs import check_file
from nanscope.trace.loading.pickle_budget import OverBudget


class _NotADump(UserError):
    """The file was read, but its top level is none of slime's dump layouts."""


def load(
    path: str | Path,
    *,
    trust_pickle: bool = False,
    reward_key: str | None = None,
    cp_size: int = 1,
    tp_size: int = 1,
    limits: Limits | None = None,
    tokens: bool = False,
) -> Dump:
    """Open a slime rollout or train dump; its samples stream from `Dump.samples()`.

    Args:
        path: the .pt file.
        trust_pickle: allow arbitrary unpickling (torch.load(weights_only=False)). Only for trusted files.
        reward_key: slime's --reward-key: pick this key when a sample's reward is a dict.
        cp_size, tp_size: context- and tensor-parallel sizes of the run that wrote a train dump; with
            cp_size > 1 the CP rank is (rank // tp_size) % cp_size (Megatron's default order tp-cp-ep-dp-pp).
        limits: size caps (default `Limits()`); a file or sample over them is refused before it is converted.
        tokens: a rollout dump's samples as a token map reads them (`rollout_dump.token_sample`: the token
            ids, no reward or log-probs) instead of as the checks do.

    Raises:
        UserError: unreadable, refused, oversized or malformed file (one line naming the field and sample),
            here or while the samples stream.
    """
    path, limits = str(path), limits or Limits()
    size = check_file(path, "dump", limits.max_bytes, "--max-dump-mb")
    fields = Fields(path, limits, Budget(path, size))
    read = dict(reward_key=reward_key, cp_size=cp_size, tp_size=tp_size, tokens=tokens)
    if trust_pickle:
        return _from_object(fields, _torch_load(path), **read)
    with _one_line(path):
        loader = Loader.open(path)
        events = _one_line_rows(path, loader.events())
        first = next(events, None)
    if first is None:  # no sample streamed: the whole file is read
        return _from_object(fields, loader.result, **read)
    dump = Dump(path, "rollout", None, None, _progress=lambda: (loader.pos, len(loader.data)))
    convert = _converter(fields, dump, first[1], reward_key=reward_key, tokens=tokens)

    def rows() -> Iterator[SampleData]:
        yield from (convert(sample, i) for i, sample in itertools.chain([first], events))
        dump._progress = None
        dump.rollout_id = stored_rollout_id(loader.result.get("rollout_id"))
        dump.rank = _rank(loader.result.get("rank")) if dump.kind == "train" else None
        yield from _rest_rows(fields, loader.result["samples"], convert, loader.handed)

    dump._rows = rows()
    return dump


def _converter(
    fields: Fields, dump: Dump, first: Any, *, reward_key: str | None, tokens: bool
) -> Callable[[dict, int], SampleData]:
    """How the samples of a `samples` list convert, decided by its first sample; sets the dump's kind and format."""
    if is_main_sample(first):
        dump.kind, dump.format = "train", formats.train_samples(first)
        return lambda sample, i: main_sample(fields, sample, i)
    dump.format = formats.rollout(first if isinstance(first, dict) else {})
    if tokens:
        return lambda sample, i: token_sample(fields, sample, i)
    return lambda sample, i: scan_sample(fields, sample, i, reward_key)


def _rank(x: Any) -> int | None:
    """The dump's stored rank, where it is one a run can have (`nanscope.facts.ranges`), else None."""
    return x if ranges.in_range(x, 0, ranges.MAX_RANK) else None


def _from_object(fields: Fields, obj: Any, *, reward_key: str | None, cp_size: int, tp_size: int, tokens: bool) -> Dump:
    """A Dump over a fully loaded object."""
    if not isinstance(obj, dict):
        raise _NotADump(f"{fields.path}: not a slime dump: top level is {type_name(obj)}, expected a dict")
    if "samples" in obj:
        samples = obj["samples"]
        if not isinstance(samples, SEQUENCES):
            raise _NotADump(
                f"{fields.path}: samples: expected a list of Sample.to_dict() dicts, got {type_name(samples)}"
            )
        dump = Dump(fields.path, "rollout", stored_rollout_id(obj.get("rollout_id")), None, _total=len(samples))
        convert = _converter(fields, dump, next(iter(samples), None), reward_key=reward_key, tokens=tokens)
        dump.rank = _rank(obj.get("rank")) if dump.kind == "train" else None
        dump._rows = _rest_rows(fields, samples, convert, [])
        return dump
    if "rollout_data" in obj:
        return train_dump(fields, obj, cp_size, tp_size)
    raise _NotADump(
        f"{fields.path}: not a slime dump: expected key 'samples' (rollout dump) or 'rollout_data' (train dump), "
        f"found {', '.join(keys_text(obj)) or 'none'}"
    )


def _rest_rows(fields: Fields, samples, convert: Callable, handed: list[dict]) -> Iterator[SampleData]:
    """The samples after the `handed` ones (already streamed), each a dict seen once, converted in turn."""
    first = {id(sample): i for i, sample in enumerate(handed)}
    for i, sample in enumerate(samples):
        if i < len(handed):
            continue
        if not isinstance(sample, dict):
            raise UserError(f"{fields.path}: sample {i}: expected a Sample.to_dict() dict, got {type_name(sample)}")
        j = first.setdefault(id(sample), i)
        if j != i:
            raise UserError(
                f"{fields.path}: sample {i}: the same object as sample {j} (a shared reference, not "
                "slime's one dict per sample)"
            )
        yield convert(sample, i)


# ------------------------------------------------------------------------------------ one-line refusals


@contextmanager
def _one_line(path: str):
    """The restricted unpickler's refusals as one UserError line."""
    try:
        yield
    except Refused as e:
        raise UserError(
            f"{path}: {_located(e.where)}refused: {e}; nanscope reads dumps with a restricted "
            "unpickler, a subset of torch.load(weights_only=True). If you trust the file, rerun with "
            "--trust-pickle"
        ) from None
    except Unreadable as e:
        raise UserError(f"{path}: {_located(e.where)}unreadable torch.save file ({e})") from None
    except OverBudget as e:
        raise UserError(f"{path}: {_located(e.where)}{e}") from None


def _located(where: tuple) -> str:
    """Where in the file a refusal happened: "{field} of sample {i}: " in slime's layouts, else the path."""
    if where[:1] == ("samples",) and len(where) > 1 and type(where[1]) is int:
        field = where[2] if len(where) > 2 and type(where[2]) is str else None
        return f"{field[:40]} of sample {where[1]}: " if field else f"sample {where[1]}: "
    if where[:1] == ("rollout_data",) and len(where) > 2 and type(where[1]) is str and type(where[2]) is int:
        return f"{where[1][:40]} of sample {where[2]}: "
    return f"at {''.join(f'[{str(p)[:40]!r}]' for p in where)}: " if where else ""


def _one_line_rows(path: str, rows: Iterator) -> Iterator:
    with _one_line(path):
        yield from rows


def _torch_load(path: str) -> Any:
    """torch.load(weights_only=False) for --trust-pickle, errors turned into one-line UserErrors."""
    import torch  # heavy: torch, only --trust-pickle loads with it

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=False, mmap=zipfile.is_zipfile(path))
    except Exception as e:  # truncated zip, bad magic number, EOF, a payload that raises, ...
        raise UserError(f"{path}: unreadable even with --trust-pickle ({type(e).__name__}: {_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(e).__name__


# ------------------------------------------------------------------------------- a traced step's rollout


def load_rollout(path: str) -> list[dict]:
    """slime's rollout dump as [{"tokens": int64 [total], "response_length": int, "loss_mask": float32 [response]}],
    read by `load` as a token map reads it.

    Raises:
        ValueError: one line naming the file and the field.
    """
    import torch  # heavy: torch; scan reads dumps as arrays, only the traced step's rollout needs tensors

    try:
        os.stat(path)
    except OSError as e:  # missing, unreadable
        raise ValueError(f"{path}: cannot read the rollout dump: {type(e).__name__}: {str(e).strip()[:200]}") from None
    try:
        dump = load(path, tokens=True)
        samples = list(dump.samples()) if dump.kind == "rollout" else None
    except _NotADump:
        samples = None
    except UserError as e:  # refused, unreadable, malformed: the reader's line, naming the field and sample
        raise ValueError(f"{path}: cannot read the rollout dump: {str(e).removeprefix(f'{path}: ')}") from None
    if samples is None:
        raise ValueError(f"{path}: not a slime rollout dump (expected a dict with a list 'samples')")
    return [
        {
            "tokens": torch.from_numpy(sample.tokens),
            "response_length": sample.response_length,
            "loss_mask": torch.from_numpy(sample.loss_mask.astype(np.float32)),
        }
        for sample in samples
    ]

"""Safe readers for slime's debug dumps (the writers of synthetic ones are in `nanscope.dumps.demo`).

Which release wrote a file is read from its fields (`nanscope.dumps.formats`: v0.1.0, v0.2.4, v0.3.1,
main); `Dump.format` says which, and what differs from v0.1.0's layout, described here. slime v0.1.0
writes two kinds of dump with `torch.save`:

* rollout dumps, `--save-debug-rollout-data .../{rollout_id}.pt` (slime/ray/buffer.py):
  `dict(rollout_id=int, samples=[Sample.to_dict(), ...])`. Each sample dict has the `Sample` fields
  (index, prompt, tokens, response, response_length, label, reward, loss_mask, rollout_log_probs,
  status, metadata) as plain Python values: lists of ints/floats, `status` as its string value.
  `tokens` is prompt + response; the response is the last `response_length` tokens.
* train dumps, `--save-debug-train-data .../{rollout_id}_{rank}.pt` (megatron_utils/actor.py):
  `dict(rollout_id=int, rank=int, rollout_data=dict)`, written AFTER the optimizer step (so a step that
  crashes never writes one). `rollout_data` holds this rank's data-parallel share as per-key lists:
  tokens (long tensors), total_lengths, response_lengths, rewards (already GRPO-normalised), truncated,
  loss_masks (int tensors), sample_indices, rollout_log_probs (bf16 tensors), and on the last pipeline
  stage log_probs, ref_log_probs, advantages, returns (fp32 tensors); `raw_reward` covers the whole rollout.
  Under context parallelism (cp > 1) the per-token tensors log_probs, ref_log_probs, rollout_log_probs and
  advantages hold only this CP rank's two zigzag chunks of the response; tokens and loss_masks stay whole.
  v0.2.4 and v0.3.1 keep this layout (rollout_log_probs float32, more keys); main writes
  `dict(format_version=2, rollout_id, rank, samples=[one dict of those keys per sample], ...)` with the
  CP-sliced fields gathered back to whole responses, read like a rollout dump's samples.

Everything is read by `nanscope.dumps.unpickler`, a restricted unpickler that accepts a subset of what
`torch.load(weights_only=True)` accepts and loads the same objects, with lists of numbers kept as numpy
arrays; a file that needs anything more is refused unless the caller passes `trust_pickle=True`
(`torch.load(weights_only=False)`). A rollout dump's samples are converted and handed out as the file is
read, so a scan of one needs the pickle bytes and the compact arrays, never Python's object graph.

Nothing a file declares is trusted (`Limits`): the file must be a regular file under a size cap; a
sample's fields and declared response length under a per-sample cap; a tensor must be dense, on the CPU,
1-D and contiguous inside its own storage (a stride-0 view declaring 10^10 elements over one is refused,
as are meta, sparse, quantized and nested tensors); and the entries converted over the whole file are at
most one per byte of it, so samples sharing one list cannot multiply the work. Each refusal is one line
naming the file, the field and the sample.
"""

from __future__ import annotations

import itertools
import warnings
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nanscope.dumps import formats
from nanscope.dumps.formats import DumpFormat
from nanscope.dumps.limits import SAMPLE_COST, Budget, Limits
from nanscope.dumps.unpickler import CList, Loader, Refused, Unreadable
from nanscope.errors import UserError
from nanscope.facts.keys import DUMP_PER_TOKEN, TRAIN_DUMP_PER_SAMPLE
from nanscope.inputs import check_file


@dataclass
class SampleData:
    """One sample as compact arrays; what the checks read.

    Per-token arrays hold one entry per position in `positions` (response positions, 0-based). For rollout
    dumps and cp=1 train dumps `positions` is None, meaning 0..response_length-1.

    Attributes:
        sample: 0-based index of the sample in the file.
        prompt_length: len(tokens) - response_length (the offset of response token 0 in the sequence).
        response_length: as stored.
        tokens_length: len(tokens).
        loss_mask: int8 [response_length] (slime's default of all ones when the dump has None; empty then
            if response_length > len(tokens), a length mismatch that stops the sample's checks).
        reward: the scalar reward (rollout dumps: raw, after --reward-key; train dumps: normalised `rewards`).
        rollout_log_probs, log_probs, ref_log_probs, advantages: float arrays or None when absent.
        positions: int64 response positions of the per-token arrays (CP-sliced train dumps), or None.
        lengths: field name -> length as stored, for the length checks.
    """

    sample: int
    prompt_length: int
    response_length: int
    tokens_length: int
    loss_mask: np.ndarray
    reward: float | None = None
    rollout_log_probs: np.ndarray | None = None
    log_probs: np.ndarray | None = None
    ref_log_probs: np.ndarray | None = None
    advantages: np.ndarray | None = None
    positions: np.ndarray | None = None
    lengths: dict[str, int] = field(default_factory=dict)


@dataclass
class Dump:
    """A dump being read. `samples()` streams `SampleData` once; for a rollout dump read by the restricted
    unpickler the file is still being parsed while samples come out.

    Attributes:
        path: the file.
        kind: "rollout" or "train".
        rollout_id: as stored (a rollout dump's is known once `samples()` is exhausted).
        rank: the global rank (train dumps) or None.
        num_samples: samples handed out so far; the file's number once `samples()` is exhausted.
        cp_size: context-parallel size the per-token arrays are sliced for (train dumps).
        format: the release format the file was read as.
    """

    path: str
    kind: str
    rollout_id: Any
    rank: int | None
    cp_size: int = 1
    num_samples: int = 0
    format: DumpFormat = formats.V0_1_0
    _rows: Iterator[SampleData] | None = None
    _progress: Callable[[], tuple[int, int]] | None = None  # while streaming: (pickle bytes read, all)
    _total: int = 0  # samples in the file, when known before they stream

    @classmethod
    def from_samples(
        cls, path: str, kind: str, samples: list[SampleData], rollout_id: Any = None, rank: int | None = None
    ) -> Dump:
        """A Dump over samples already converted (to time the checks apart from loading), read as v0.1.0's."""
        return cls(path, kind, rollout_id, rank, _rows=iter(samples))

    def samples(self) -> Iterator[SampleData]:
        """Yield each sample once."""
        assert self._rows is not None, "samples() consumed twice"
        rows, self._rows = self._rows, None
        for s in rows:
            self.num_samples += 1
            yield s

    def progress(self) -> tuple[int, int]:
        """(done, total) in the reader's own units: pickle bytes while streaming, else samples."""
        return self._progress() if self._progress else (self.num_samples, max(self._total, self.num_samples))


# ----------------------------------------------------------------------------------------------- loading


def load(
    path: str | Path,
    *,
    trust_pickle: bool = False,
    reward_key: str | None = None,
    cp_size: int = 1,
    tp_size: int = 1,
    limits: Limits | None = None,
) -> Dump:
    """Open a slime v0.1.0 rollout or train dump; its samples stream from `Dump.samples()`.

    Args:
        path: the .pt file.
        trust_pickle: allow arbitrary unpickling (torch.load(weights_only=False)). Only for trusted files.
        reward_key: slime's --reward-key: pick this key when a sample's reward is a dict.
        cp_size, tp_size: context- and tensor-parallel sizes of the run that wrote a train dump; with
            cp_size > 1 the CP rank is (rank // tp_size) % cp_size (Megatron's default order tp-cp-ep-dp-pp).
        limits: size caps (default `Limits()`); a file or sample over them is refused before it is converted.

    Raises:
        UserError: unreadable, refused, oversized or malformed file (one line naming the field and sample),
            here or while the samples stream.
    """
    path, limits = str(path), limits or Limits()
    size = check_file(path, "dump", limits.max_bytes, "--max-dump-mb")
    fields = _Fields(path, limits, Budget(path, size))
    if trust_pickle:
        return _from_object(fields, _torch_load(path), reward_key, cp_size, tp_size)
    with _one_line(path):
        loader = Loader.open(path)
        events = _one_line_rows(path, loader.events())
        first = next(events, None)
    if first is None:  # no sample streamed: the whole file is read
        return _from_object(fields, loader.result, reward_key, cp_size, tp_size)
    sample = first[1]
    dump = Dump(path, "rollout", None, None, _progress=lambda: (loader.pos, len(loader.data)))
    convert = _converter(fields, dump, sample, reward_key)

    def rows() -> Iterator[SampleData]:
        yield from (convert(s, i) for i, s in itertools.chain([first], events))
        dump._progress = None
        dump.rollout_id = _rollout_id(loader.result.get("rollout_id"))
        dump.rank = _rank(loader.result.get("rank")) if dump.kind == "train" else None
        yield from _rest_rows(fields, loader.result["samples"], convert, loader.handed)

    dump._rows = rows()
    return dump


def _is_train_sample(sample: Any) -> bool:
    """A sample of main's train dump (format_version 2): train keys (response_lengths), not Sample fields."""
    return isinstance(sample, dict) and "response_lengths" in sample and "response_length" not in sample


def _converter(f: _Fields, dump: Dump, first: Any, reward_key: str | None) -> Callable[[dict, int], SampleData]:
    """How the samples of `dump` convert, decided by its first sample; sets the dump's kind and format."""
    if _is_train_sample(first):
        dump.kind, dump.format = "train", formats.train_samples(first)
        return lambda s, i: _train_sample(f, {k: s[k] for k in TRAIN_DUMP_PER_SAMPLE if s.get(k) is not None}, i, 1, 0)
    dump.format = formats.rollout(first if isinstance(first, dict) else {})
    return lambda s, i: _rollout_sample(f, s, i, reward_key)


def _rank(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _from_object(f: _Fields, obj: Any, reward_key: str | None, cp_size: int, tp_size: int) -> Dump:
    """A Dump over a fully loaded object."""
    if not isinstance(obj, dict):
        raise UserError(f"{f.path}: not a slime dump: top level is {_type(obj)}, expected a dict")
    if "samples" in obj:
        samples = obj["samples"]
        if not isinstance(samples, _SEQUENCES):
            raise UserError(f"{f.path}: samples: expected a list of Sample.to_dict() dicts, got {_type(samples)}")
        dump = Dump(f.path, "rollout", _rollout_id(obj.get("rollout_id")), None, _total=len(samples))
        convert = _converter(f, dump, next(iter(samples), None), reward_key)
        dump.rank = _rank(obj.get("rank")) if dump.kind == "train" else None
        dump._rows = _rest_rows(f, samples, convert, [])
        return dump
    if "rollout_data" in obj:
        return _train_dump(f, obj, cp_size, tp_size)
    raise UserError(
        f"{f.path}: not a slime dump: expected key 'samples' (rollout dump) or 'rollout_data' (train dump), "
        f"found {', '.join(_keys(obj)) or 'none'}"
    )


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
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=False, mmap=zipfile.is_zipfile(path))
    except Exception as e:  # truncated zip, bad magic number, EOF, a payload that raises, ...
        raise UserError(f"{path}: unreadable even with --trust-pickle ({type(e).__name__}: {_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(e).__name__


# ---------------------------------------------------------------------------------------- rollout dumps


def _rest_rows(f: _Fields, samples, convert: Callable, handed: list[dict]) -> Iterator[SampleData]:
    """The samples after the `handed` ones (already streamed), each a dict seen once, converted in turn."""
    first = {id(s): i for i, s in enumerate(handed)}
    for i, s in enumerate(samples):
        if i < len(handed):
            continue
        if not isinstance(s, dict):
            raise UserError(f"{f.path}: sample {i}: expected a Sample.to_dict() dict, got {_type(s)}")
        j = first.setdefault(id(s), i)
        if j != i:
            raise UserError(
                f"{f.path}: sample {i}: the same object as sample {j} (a shared reference, not "
                "slime's one dict per sample)"
            )
        yield convert(s, i)


def _rollout_sample(f: _Fields, s: dict, i: int, reward_key: str | None) -> SampleData:
    for key in ("tokens", "response_length", "reward"):
        if key not in s:
            raise UserError(f"{f.path}: sample {i}: missing field '{key}' (not a Sample.to_dict())")
    f.budget.take(SAMPLE_COST, "sample", i)
    n_tokens = f.length(s["tokens"], "tokens", i)
    resp = f.response_length(s["response_length"], "response_length", i)
    lengths = {"tokens": n_tokens, "response_length": resp}
    mask = s.get("loss_mask")
    if mask is None:  # slime: "always instantiate loss_mask if not provided"
        mask_arr = f.default_mask(resp, n_tokens, "loss_mask", i)
    else:
        mask_arr = f.mask(mask, "loss_mask", i)
        lengths["loss_mask"] = len(mask_arr)
    rlp = s.get("rollout_log_probs")
    rlp_arr = None if rlp is None else f.floats(rlp, "rollout_log_probs", i)
    if rlp_arr is not None:
        lengths["rollout_log_probs"] = len(rlp_arr)
    return SampleData(
        sample=i,
        prompt_length=n_tokens - resp,
        response_length=resp,
        tokens_length=n_tokens,
        loss_mask=mask_arr,
        reward=f.reward(s["reward"], i, reward_key),
        rollout_log_probs=rlp_arr,
        lengths=lengths,
    )


# ------------------------------------------------------------------------------------------ train dumps


def _train_dump(f: _Fields, obj: dict, cp_size: int, tp_size: int) -> Dump:
    path, data = f.path, obj["rollout_data"]
    if not isinstance(data, dict):
        raise UserError(f"{path}: rollout_data: expected a dict of per-key lists, got {_type(data)}")
    for key in ("tokens", "response_lengths"):
        if key not in data:
            raise UserError(f"{path}: rollout_data: missing key '{key}' (not a slime v0.1.0 train dump)")
    present = [k for k in TRAIN_DUMP_PER_SAMPLE if k in data and data[k] is not None]
    for k in present:
        if not isinstance(data[k], _SEQUENCES):
            raise UserError(f"{path}: rollout_data['{k}']: expected a per-sample list, got {_type(data[k])}")
    n = len(data["tokens"])
    for k in present:
        if len(data[k]) != n:
            raise UserError(f"{path}: rollout_data['{k}']: {len(data[k])} entries, but tokens has {n} samples")
    rank = obj.get("rank")
    if cp_size > 1 and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise UserError(f"{path}: rank: {_brief(rank)}; needed to find the CP rank with --context-parallel-size")
    cp_rank = (rank // tp_size) % cp_size if cp_size > 1 else 0
    rows = (_train_sample(f, {k: _entry(data[k], i) for k in present}, i, cp_size, cp_rank) for i in range(n))
    rlp = data.get("rollout_log_probs")
    first = _entry(rlp, 0) if rlp else None
    dtype = str(first.dtype).removeprefix("torch.") if _is_tensor(first) else None
    return Dump(
        path,
        "train",
        _rollout_id(obj.get("rollout_id")),
        rank if isinstance(rank, int) else None,
        cp_size,
        format=formats.train(list(data), dtype),
        _rows=rows,
        _total=n,
    )


def _train_sample(f: _Fields, row: dict, i: int, cp_size: int, cp_rank: int) -> SampleData:
    f.budget.take(SAMPLE_COST, "sample", i)
    n_tokens = f.length(row["tokens"], "tokens", i)
    resp = f.response_length(row["response_lengths"], "response_lengths", i)
    lengths = {"tokens": n_tokens, "response_length": resp}
    if "total_lengths" in row:
        lengths["total_lengths"] = f.int(row["total_lengths"], "total_lengths", i)
    if "loss_masks" in row:
        mask = f.mask(row["loss_masks"], "loss_masks", i)
        lengths["loss_mask"] = len(mask)
    else:
        mask = f.default_mask(resp, n_tokens, "loss_masks", i)
    out = SampleData(
        sample=i,
        prompt_length=n_tokens - resp,
        response_length=resp,
        tokens_length=n_tokens,
        loss_mask=mask,
        lengths=lengths,
    )
    if "rewards" in row:
        out.reward = f.reward(row["rewards"], i, None)
    for key in DUMP_PER_TOKEN:
        if key in row:
            arr = f.floats(row[key], key, i)
            setattr(out, key, arr)
            lengths[key] = len(arr)
    if cp_size > 1 and 0 < resp <= n_tokens:
        f.budget.take(n_tokens, "tokens", i)
        out.positions = cp_response_positions(n_tokens, resp, cp_size, cp_rank)
    return out


def cp_response_positions(total_length: int, response_length: int, cp_size: int, cp_rank: int) -> np.ndarray:
    """Response positions (0-based) of one CP rank's per-token entries, in the rank's order.

    Returns:
        int64 [local_len], from `nanscope.loss.layout.response_positions` (slime v0.1.0's zigzag).
    """
    from nanscope.loss.layout import response_positions

    return np.asarray(response_positions(total_length, response_length, cp_rank, cp_size), dtype=np.int64)


# -------------------------------------------------------------------------------------- field converters


class _Fields:
    """Converts one sample's fields, refusing before any allocation what the limits do not allow.

    Every message is one line: `{path}: {field} of sample {i}: ...`.
    """

    def __init__(self, path: str, limits: Limits, budget: Budget):
        self.path, self.limits, self.budget = path, limits, budget

    def _error(self, name: str, i: int, what: str) -> UserError:
        return UserError(f"{self.path}: {name} of sample {i}: {what}")

    def _capped(self, n: int, name: str, i: int, what: str = "entries") -> int:
        cap = self.limits.max_sample_tokens
        if n > cap:
            raise self._error(
                name, i, f"{n:,} {what}, over the per-sample cap of {cap:,} (raise it with --max-sample-tokens)"
            )
        return n

    def tensor(self, x: Any, name: str, i: int) -> Any:
        """`x` if it is a plain dense CPU tensor whose elements all lie in its own storage, once each."""
        import torch

        if type(x) not in (torch.Tensor, torch.nn.Parameter) or x.is_quantized or x.is_nested:
            raise self._error(name, i, f"a {type(x).__name__} tensor, expected a plain tensor")
        if x.layout != torch.strided:
            raise self._error(name, i, f"a {str(x.layout).removeprefix('torch.')} tensor, expected a dense one")
        if x.device.type != "cpu":
            raise self._error(name, i, f"a tensor on device {x.device.type} (no data in the file), expected cpu")
        if x.dim() > 1:
            raise self._error(name, i, f"tensor of shape {tuple(x.shape)}, expected 1-D")
        n = x.numel()
        if n > 1 and x.stride(0) != 1:
            raise self._error(
                name,
                i,
                f"tensor of {n:,} elements with stride {x.stride(0)} over a storage of "
                f"{_storage_len(x):,}, expected a contiguous one",
            )
        if x.storage_offset() + n > _storage_len(x):
            raise self._error(
                name,
                i,
                f"tensor of {n:,} elements at offset {x.storage_offset():,} past its storage of {_storage_len(x):,}",
            )
        return x

    def length(self, x: Any, name: str, i: int) -> int:
        if _is_tensor(x):
            if self.tensor(x, name, i).dim() != 1:
                raise self._error(name, i, f"tensor of shape {tuple(x.shape)}, expected 1-D")
            return self._capped(x.numel(), name, i)
        if not isinstance(x, _SEQUENCES):
            raise self._error(name, i, f"{_type(x)}, expected a list")
        return self._capped(len(x), name, i)

    def int(self, x: Any, name: str, i: int) -> int:
        if _is_tensor(x) and self.tensor(x, name, i).numel() == 1:
            x = x.item()
        if isinstance(x, bool) or not isinstance(x, int):
            raise self._error(name, i, f"{_brief(x)}, expected an int")
        return x

    def response_length(self, x: Any, name: str, i: int) -> int:
        """A declared response length: an int in [0, the per-sample cap]."""
        n = self.int(x, name, i)
        if n < 0:
            raise UserError(f"{self.path}: {name} of sample {i}: {n} is negative")
        return self._capped(n, name, i, "tokens declared")

    def default_mask(self, resp: int, n_tokens: int, name: str, i: int) -> np.ndarray:
        """slime's all-ones loss mask of a sample that has none: int8 [resp]; empty when resp > n_tokens, a
        length mismatch whose sample is not checked further."""
        n = resp if resp <= n_tokens else 0
        self.budget.take(n, name, i)
        return np.ones(n, dtype=np.int8)

    def floats(self, x: Any, name: str, i: int) -> np.ndarray:
        """A 1-D list/tensor of numbers as float32 (tensors keep their values; bf16 widens exactly)."""
        if _is_tensor(x):
            import torch

            self.tensor(x, name, i)
            if x.dim() != 1 or not x.dtype.is_floating_point:
                raise self._error(name, i, f"tensor {x.dtype} {tuple(x.shape)}, expected 1-D float")
            self.budget.take(self._capped(x.numel(), name, i), name, i)
            x = x.detach()
            if x.dtype == torch.bfloat16:  # widen exactly by bit shift: bf16 is the top half of an fp32
                return (x.view(torch.int16).numpy().view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            return x.float().numpy()
        if not isinstance(x, _SEQUENCES):
            raise self._error(name, i, f"{_type(x)}, expected a list of floats")
        self.budget.take(self._capped(len(x), name, i), name, i)
        if type(x) is CList:  # all number runs: already an array; else the list it stands for
            arr = x.array()
            if arr is not None:
                return arr.astype(np.float64, copy=False)
            x = x.tolist()
        try:
            arr = np.array(x, dtype=np.float64)
        except (TypeError, ValueError, OverflowError, RecursionError):
            bad = next((j for j, v in enumerate(x) if isinstance(v, bool) or not isinstance(v, (int, float))), None)
            where = f"element {bad} is {_type(x[bad])}" if bad is not None else "not a flat list of numbers"
            raise self._error(name, i, where) from None
        if arr.ndim != 1:
            raise self._error(name, i, "not a flat list of numbers")
        nan_at = np.flatnonzero(np.isnan(arr))
        none_at = next((int(j) for j in nan_at if x[j] is None), None)  # numpy turns None into nan
        if none_at is not None:
            raise self._error(name, i, f"element {none_at} is None")
        return arr

    def mask(self, x: Any, name: str, i: int) -> np.ndarray:
        """A loss mask as int8; values other than 0/1 are malformed."""
        if _is_tensor(x):
            self.tensor(x, name, i)
            if x.dim() != 1:
                raise self._error(name, i, f"tensor of shape {tuple(x.shape)}, expected 1-D")
            self.budget.take(self._capped(x.numel(), name, i), name, i)
            arr = x.detach().numpy()
        elif isinstance(x, _SEQUENCES):
            self.budget.take(self._capped(len(x), name, i), name, i)
            arr = x.array() if type(x) is CList else None
            try:
                arr = np.array(x.tolist() if type(x) is CList else x) if arr is None else arr
            except (TypeError, ValueError, OverflowError, RecursionError):
                raise self._error(name, i, "not a flat list of 0/1") from None
        else:
            raise self._error(name, i, f"{_type(x)}, expected a list of 0/1")
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "biuf"):
            raise self._error(name, i, "not a flat list of 0/1")
        if arr.size and ((arr != 0) & (arr != 1)).any():
            j = int(np.flatnonzero((arr != 0) & (arr != 1))[0])
            raise self._error(name, i, f"element {j} is {arr[j]}, expected 0 or 1")
        return arr.astype(np.int8, copy=False)

    def reward(self, r: Any, i: int, reward_key: str | None) -> float:
        """slime's Sample.get_reward_value: reward, or reward[reward_key] with --reward-key."""
        if reward_key is not None:
            if not isinstance(r, dict):
                raise self._error("reward", i, f"--reward-key {reward_key} given but reward is {_type(r)}, not a dict")
            if reward_key not in r:
                raise self._error("reward", i, f"no key '{reward_key}' (has {_keys(r)})")
            r = r[reward_key]
        elif isinstance(r, dict):
            raise self._error("reward", i, f"a dict with keys {_keys(r)}; pass --reward-key")
        if _is_tensor(r) and self.tensor(r, "reward", i).numel() == 1:
            r = r.item()
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            raise self._error(
                "reward", i, f"{_brief(r)}, expected a number (slime v0.1.0 builds a float tensor from the rewards)"
            )
        if isinstance(r, int) and r.bit_length() > 1024:
            raise self._error("reward", i, f"{_brief(r)}, too large for the float tensor slime v0.1.0 builds")
        return float(r)


def _rollout_id(x: Any) -> int | float | str | None:
    """The stored rollout id as reports can show it: a plain number or string, else its type in brackets."""
    if x is None or isinstance(x, (int, float)):
        return x
    return x[:200] if isinstance(x, str) else f"<{type(x).__name__}>"


_SEQUENCES = (list, tuple, CList)


def _type(x: Any) -> str:
    """A value's type for an error line: a CList is the list the file holds."""
    return "list" if type(x) is CList else type(x).__name__


def _entry(col, i: int) -> Any:
    """Entry i of a per-sample list (a CList gives Python numbers for its number runs)."""
    return col.item(i) if type(col) is CList else col[i]


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def _storage_len(x: Any) -> int:
    """Elements of x's dtype its storage holds (the bytes the file gave it)."""
    return x.untyped_storage().nbytes() // x.element_size()


def _brief(x: Any) -> str:
    """A value for an error line: the type and a short repr of a scalar; only the type of anything else,
    whose repr could be huge or nested deeper than Python's recursion limit."""
    if isinstance(x, int) and x.bit_length() > 64:
        return f"int of {x.bit_length()} bits"
    if x is None or isinstance(x, (int, float, str)):
        return f"{type(x).__name__} {x!r:.40}"
    return _type(x)


def _keys(d: dict) -> list[str]:
    """The first 8 of a dict's keys as text, sorted (see `_key_text`)."""
    return sorted(map(_key_text, d))[:8]


def _key_text(k: Any) -> str:
    """A key as text: a string cut to 40 characters, an int of up to 64 bits as is, else its type in brackets."""
    if isinstance(k, str):
        return k[:40]
    if isinstance(k, int) and k.bit_length() <= 64:
        return str(k)
    return f"<{type(k).__name__}>"


def load_rollout(path: str) -> list[dict]:
    """slime's rollout dump as [{"tokens": int64 [total], "response_length": int, "loss_mask": [response]}].

    Raises:
        ValueError: one line naming the file and the field.
    """
    import torch  # heavy: scan reads dumps without torch; only the traced step's rollout needs it

    try:
        doc = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # missing, unreadable, not a torch file, unsafe globals
        raise ValueError(f"{path}: cannot read the rollout dump: {type(e).__name__}: {str(e).strip()[:200]}") from None
    samples = doc.get("samples") if isinstance(doc, dict) else None
    if not isinstance(samples, list):
        raise ValueError(f"{path}: not a slime rollout dump (expected a dict with a list 'samples')")
    out = []
    for i, s in enumerate(samples):
        try:
            tokens = torch.as_tensor(s["tokens"], dtype=torch.int64).reshape(-1)
            response = int(s["response_length"])
            mask = s.get("loss_mask")
            mask = torch.ones(response) if mask is None else torch.as_tensor(mask, dtype=torch.float32).reshape(-1)
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"{path}: sample {i}: {type(e).__name__}: {e}") from None
        out.append({"tokens": tokens, "response_length": response, "loss_mask": mask})
    return out

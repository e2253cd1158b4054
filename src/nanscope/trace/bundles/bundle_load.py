"""Read a repro bundle (`nanscope.trace.bundles.bundle`) and check every field the replay reads.

`load(path)` reads the file within the bounds every torch.save reader keeps (`nanscope.trace.loading.torch_file`:
records stored uncompressed, a pickle within its file's budget, no code run, each tensor a dense CPU tensor
whose elements each lie once in its own storage), then checks the document: types, lengths that agree
(tokens = total length, masks = response length, each per-token list = the tokens this CP rank holds), rows,
coordinates, the loss's args (`replay.arg_problem`: types, finite numbers, known choices, counts >= 1, every
integer within int64, path templates `inputs.fill_template` fills), token ids >= 0, loss masks of 0s and 1s. What
the replay allocates follows from the bytes read. Every refusal is one UserError line naming the file, the field
and, for a per-sample field, the micro-batch (by its loss call's `index`, as every message names it) and the
sample.

Each micro-batch's CP coordinate: its own `parallel` ({"cp_rank", "cp_size"}) when the bundle has one, else the
rank's `coords` when those say CP > 1, else it is inferred: nanscope's CPU harness simulates CP at the loss, so
one rank calls the loss once per simulated CP rank, and those calls share their forward micro-batch (`checked`
returns the coordinate each entry replays with, and how it was found).
"""

from __future__ import annotations

from nanscope.errors import UserError
from nanscope.facts import ranges
from nanscope.facts.keys import PER_TOKEN, SAMPLE
from nanscope.inputs import fill_template
from nanscope.loss import layout
from nanscope.trace.bundles import bundle, bundle_text
from nanscope.trace.loading import torch_file
from nanscope.trace.tracer.replay import arg_problem, mask_problem, sample_count, token_problem, value_text

RETURNS = ("dict", "pair", "tensors")
_COORDS = ("rank", "pp", "tp", "cp_rank", "cp_size", "dp_rank", "dp_size")
_PLAIN = (bool, int, float, str, type(None))
_MAX_CP = 64  # the largest context-parallel size an inference tries
_MAX_VERSION = 40  # characters of the `nanscope` version field ("0.1.0", "0.1.0.dev3+g1234abc")
_TEMPLATES = ("save_debug_rollout_data", "load_debug_rollout_data")  # the dumps `nanscope trace` may read
# Each entry's optional parts and the type each must have.
_PARTS = (("batch", dict), ("current", dict), ("loss", dict), ("rows", list), ("parallel", dict))


def load(path, limit: int | None = None, option: str | None = None, other=None) -> dict:
    """Read and check a bundle; returns the document with each micro-batch's `cp` ((cp_rank, cp_size, how)) set.
    `other(doc)`: True for another kind of bundle (a verl one), returned as read for its own checks."""
    doc = torch_file.load(path, "repro bundle", limit, option, name=_field)
    if other is not None and other(doc):
        return doc
    return checked(path, doc)


def checked(path, doc) -> dict:
    """`doc` checked field by field (see the module docstring); UserError naming the file and field."""
    if not isinstance(doc, dict):
        raise UserError(f"{path}: not a repro bundle: expected a dict, got {type(doc).__name__}")
    if doc.get("format") != bundle.FORMAT:
        raise UserError(f"{path}: format {doc.get('format')!r:.60}: expected {bundle.FORMAT!r} (a repro bundle)")
    for key in ("release", "rollout_id", "step_id", "coords", "args", "microbatches"):
        if key not in doc:
            raise UserError(f"{path}: missing key {key!r}")
    _release(path, doc["release"])
    version = doc.get("nanscope")
    if version is not None and not (isinstance(version, str) and 0 < len(version) <= _MAX_VERSION):
        raise UserError(
            f"{path}: nanscope: expected the version that wrote it, a string of 1-{_MAX_VERSION} characters"
        )
    for key in ("rollout_id", "step_id"):
        _int(path, doc[key], key)
    coords = _coords(path, doc["coords"])
    _args(path, doc["args"])
    problem = bundle_text.report_problem(doc.get("report"))
    if problem:
        raise UserError(f"{path}: report: {problem}")
    entries = doc["microbatches"]
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UserError(f"{path}: microbatches: expected a list of dicts")
    if not entries:
        raise UserError(f"{path}: microbatches: empty (a bundle holds the loss calls of the step it was written on)")
    indices = [_int(path, e.get("index"), f"microbatches[{i}] index") for i, e in enumerate(entries)]
    if len(set(indices)) != len(indices):
        raise UserError(f"{path}: microbatches: a loss call index appears twice")
    for i, entry in enumerate(entries):
        _entry_head(path, entry, i)
    for entry, cp in zip(entries, _coordinates(path, entries, coords)):
        entry["cp"] = cp
        _entry_body(path, entry, cp)
    return doc


def _field(place: tuple, doc) -> str:
    """A tensor's place as the refusals name it: `micro-batch 3: log_probs of sample 1` (the entry's index)."""
    if len(place) == 5 and place[0] == "microbatches" and place[2] in ("batch", "current") and type(place[4]) is int:
        index = doc["microbatches"][place[1]].get("index")
        where = f"micro-batch {index}" if type(index) is int else f"microbatches[{place[1]}]"
        current = "current " if place[2] == "current" else ""
        return f"{where}: {current}{str(place[3])[:40]} of sample {place[4]}"
    return torch_file.where(place)


def _int(path, value, what: str, low: int = 0, high: int = ranges.MAX_ID) -> int:
    if not ranges.in_range(value, low, high):
        raise UserError(
            f"{path}: {what}: expected an integer from {low} to {high:,}, got {type(value).__name__} {value!r:.40}"
        )
    return value


def _release(path, release) -> None:
    ok = isinstance(release, dict) and all(isinstance(release.get(k), str) for k in ("name", "module"))
    if not ok or release.get("log_prob_returns") not in RETURNS:
        raise UserError(f"{path}: release: expected {{name, module, log_prob_returns in {', '.join(RETURNS)}}}")


def _coords(path, coords) -> dict:
    if not isinstance(coords, dict):
        raise UserError(f"{path}: coords: expected a dict, got {type(coords).__name__}")
    out = {}
    for key in _COORDS:  # a rank or coordinate up to MAX_RANK, a size up to MAX_WORLD
        size = key.endswith("size")
        high = ranges.MAX_WORLD if size else ranges.MAX_RANK
        out[key] = _int(path, coords.get(key, 1 if size else 0), f"coords {key}", high=high)
    for rank, size in (("cp_rank", "cp_size"), ("dp_rank", "dp_size")):
        if out[size] < 1 or out[rank] >= out[size]:
            raise UserError(f"{path}: coords: {rank} {out[rank]} outside {size} {out[size]}")
    if not isinstance(coords.get("last_stage", True), bool):
        raise UserError(f"{path}: coords: last_stage: expected true or false")
    return out


def _args(path, args) -> None:
    """Plain values; the loss's fields and every integer as `replay.arg_problem` wants them; the dump templates
    fillable (`inputs.fill_template`: only {rollout_id} and {rank}, a small width)."""
    if not isinstance(args, dict) or not all(isinstance(k, str) and isinstance(v, _PLAIN) for k, v in args.items()):
        raise UserError(f"{path}: args: expected a dict of field names to numbers, strings, booleans or None")
    for name, value in args.items():
        problem = arg_problem(name, value)
        if problem:
            raise UserError(f"{path}: args: {name[:60]} {value_text(value)}: {problem}")
    for name in _TEMPLATES:
        if isinstance(args.get(name), str):
            fill_template(args[name], f"{path}: args: {name}", rollout_id=0, rank=0)


def _entry_head(path, entry: dict, i: int) -> None:
    where = f"micro-batch {entry['index']}"
    if entry.get("microbatch") is None:  # the forward micro-batch was not known: the loss call's index stands in
        entry["microbatch"] = entry["index"]
    _int(path, entry["microbatch"], f"{where}: microbatch")
    why = entry.get("why", [])
    if not isinstance(why, list) or not all(w in bundle.WHY for w in why):
        raise UserError(f"{path}: {where}: why: expected a list of {', '.join(bundle.WHY)}")
    for key, kind in _PARTS:
        if not isinstance(entry.get(key), (kind, type(None))):
            got = type(entry.get(key)).__name__
            raise UserError(
                f"{path}: {where}: {key}: expected {'a dict' if kind is dict else 'a list'} or None, got {got}"
            )
    if entry.get("batch") is None and entry.get("current") is not None:
        raise UserError(f"{path}: {where}: current log-probs without the batch they belong to")
    loss = entry.get("loss")
    if loss is not None and not (type(loss.get("value")) in (int, float) and isinstance(loss.get("finite"), bool)):
        raise UserError(f"{path}: {where}: loss: expected {{value: number, finite: bool}}")
    if not isinstance(entry.get("rows_how", ""), str):
        raise UserError(f"{path}: {where}: rows_how: expected a string")


def _coordinates(path, entries: list[dict], coords: dict) -> list[tuple[int, int, str]]:
    """(cp_rank, cp_size, how it was found) of each entry (see the module docstring)."""
    groups: dict[int, list[int]] = {}
    for i, entry in enumerate(entries):
        if entry.get("batch") is not None:
            groups.setdefault(entry["microbatch"], []).append(i)
    out = []
    for i, entry in enumerate(entries):
        own = entry.get("parallel")
        if own is not None:
            if not isinstance(own, dict):
                raise UserError(f"{path}: micro-batch {entry['index']}: parallel: expected {{cp_rank, cp_size}}")
            rank = _int(path, own.get("cp_rank"), f"micro-batch {entry['index']}: parallel cp_rank")
            size = _int(path, own.get("cp_size"), f"micro-batch {entry['index']}: parallel cp_size", low=1)
            if rank >= size:
                raise UserError(
                    f"{path}: micro-batch {entry['index']}: parallel: cp_rank {rank} outside cp_size {size}"
                )
            out.append((rank, size, "the bundle's"))
        elif coords["cp_size"] > 1 or entry.get("batch") is None:
            out.append((coords["cp_rank"], coords["cp_size"], "the rank's coords"))
        else:
            group = groups[entry["microbatch"]]
            out.append(_inferred(path, entry, len(group), group.index(i)))
    return out


def _inferred(path, entry: dict, calls: int, position: int) -> tuple[int, int, str]:
    """A simulated CP rank's coordinate: the loss calls of one micro-batch, one per rank; a lone call: the first
    coordinate whose token counts fit every sample."""
    batch = entry["batch"]
    if not isinstance(batch, dict):
        raise UserError(f"{path}: micro-batch {entry['index']}: batch: expected a dict")
    if calls > 1:
        return position, calls, f"inferred: loss call {position + 1} of {calls} on forward micro-batch"
    for size in range(1, _MAX_CP + 1):
        for rank in range(size):
            if _fits(batch, rank, size):
                how = "the rank's coords" if size == 1 else "inferred from the token counts"
                return rank, size, how
    return 0, 1, "the rank's coords"  # the body's check names the field that disagrees


def _fits(batch: dict, rank: int, size: int) -> bool:
    try:
        samples = zip(batch["total_lengths"], batch["response_lengths"], batch["log_probs"])
        return all(_local(total, response, rank, size) == len(x) for total, response, x in samples)
    except (KeyError, TypeError, ValueError, AssertionError):
        return False


def _local(total: int, response: int, rank: int, size: int) -> int:
    return sum(s.length for s in layout.segments(total, response, rank, size))


def _entry_body(path, entry: dict, cp: tuple[int, int, str]) -> None:
    batch = entry.get("batch")
    if batch is None:
        return
    where = f"{path}: micro-batch {entry['index']}"
    n = sample_count(where, batch, tuple(k for k in PER_TOKEN if batch.get(k) is not None), (list,))
    locals_ = [_sample(where, batch, i, cp) for i in range(n)]
    for key in PER_TOKEN:
        for i, x in enumerate(batch.get(key) or []):
            _per_token(where, x, f"{key} of sample {i}", locals_[i])
    _extra(where, batch)
    current = entry.get("current")
    if current is not None:
        for key in ("log_probs", "entropy"):
            parts = current.get(key)
            if parts is None and key == "entropy":
                continue
            if not isinstance(parts, list) or len(parts) != n:
                raise UserError(f"{where}: current {key}: expected a list of {n} tensors (one per sample)")
            for i, x in enumerate(parts):
                _per_token(where, x, f"current {key} of sample {i}", locals_[i])
    rows = entry.get("rows")
    if rows is not None and (len(rows) != n or not all(type(r) is int and 0 <= r < 2**63 for r in rows)):
        raise UserError(f"{where}: rows: expected {n} integers >= 0 (one dump row per sample)")


def _sample(where: str, batch: dict, i: int, cp: tuple[int, int, str]) -> int:
    """Sample i's lengths checked against its tensors; returns the response tokens this CP rank holds."""
    total, response = batch["total_lengths"][i], batch["response_lengths"][i]
    if type(total) is not int or type(response) is not int:
        raise UserError(f"{where}: total_lengths / response_lengths of sample {i}: expected integers")
    if not 0 < response < total:
        raise UserError(f"{where}: response_lengths of sample {i}: {response} must be in [1, total_length {total})")
    tokens = batch["unconcat_tokens"][i]
    if not _tensor(tokens) or tokens.dim() != 1 or tokens.is_floating_point() or tokens.is_complex():
        raise UserError(f"{where}: unconcat_tokens of sample {i}: expected a 1-D integer tensor")
    problem = token_problem(tokens)
    if problem:
        raise UserError(f"{where}: unconcat_tokens of sample {i}: {problem}")
    if tokens.numel() != total:  # before any list of positions: the file bounds what the lengths may declare
        raise UserError(f"{where}: unconcat_tokens of sample {i}: {tokens.numel()} tokens != total_length {total}")
    mask = batch["loss_masks"][i]
    if not _tensor(mask) or mask.dim() != 1 or mask.is_complex() or mask.numel() != response:
        got = f"{mask.numel()} entries" if _tensor(mask) else type(mask).__name__
        raise UserError(f"{where}: loss_masks of sample {i}: {got}, expected a 1-D tensor of {response} entries")
    problem = mask_problem(mask)
    if problem:
        raise UserError(f"{where}: loss_masks of sample {i}: {problem}")
    return _local(total, response, cp[0], cp[1])


def _tensor(x) -> bool:
    import torch  # heavy: torch, loaded by the file's read already

    return isinstance(x, torch.Tensor)


def _per_token(where: str, x, what: str, local: int) -> None:
    if not _tensor(x) or x.dim() != 1 or not x.is_floating_point():
        shape = f"{x.dtype} {list(x.shape)}" if _tensor(x) else type(x).__name__
        raise UserError(f"{where}: {what}: expected a 1-D float tensor, got {shape}")
    if x.numel() != local:
        raise UserError(f"{where}: {what}: {x.numel()} entries != {local} local response tokens")


def _extra(where: str, batch: dict) -> None:
    """The release's own keys (max_seq_lens, rollout_mask_sums, ...): plain values, lists of them, tensors."""
    for key, value in batch.items():
        if key in SAMPLE or key in PER_TOKEN:
            continue
        items = value if isinstance(value, list) else [value]
        if not isinstance(key, str) or not all(isinstance(x, _PLAIN) or _tensor(x) for x in items):
            raise UserError(f"{where}: batch: {str(key)[:40]}: expected numbers, strings, tensors or a list of them")

"""Replay one slime micro-batch's loss, forward and backward, under the tracer.

Micro-batch file format (`save_microbatch` writes it, `load_microbatch` reads it with
torch.load(weights_only=True): plain tensors, lists, numbers and strings only):

    {
      "format": "nanscope-microbatch/1",
      "batch":  {                       # the slime micro-batch the loss received (see loss.microbatch)
          "unconcat_tokens":   [int64 [total_i], ...],
          "total_lengths":     [int, ...],
          "response_lengths":  [int, ...],
          "loss_masks":        [float32 [response_i], ...],
          "log_probs", "ref_log_probs", "rollout_log_probs", "advantages":
                               [float [n_i], ...]        # this CP rank's tokens; log_probs and advantages
                                                         # required, the others when the args use them
      },
      "logits":   float32 [1, T_local, V_local],         # the model output the loss received
      "args":     {field: value}                         # slime loss args (facts.args.LOSS_DEFAULTS names)
      "loss":     "as-is" | "safe",
      "parallel": {"cp_rank": int, "cp_size": int, "tp_size": int}   # optional, default one process
    }

`load_microbatch` reads it within the bounds every torch.save reader keeps (`nanscope.trace.loading.torch_file`:
records stored uncompressed, a pickle within its file's budget, each tensor's elements stored once in its
own storage), and checks each field, so that what the replay allocates follows from the bytes read.

A tensor-parallel vocabulary shard (tp_size > 1) replays as if the shard were the whole vocabulary:
the log-probs differ, the positions of exp overflows in the loss terms mostly do not. Case-sized
logits are several GB: `save_microbatch(..., samples=[i])` keeps only some samples' rows.
"""

from __future__ import annotations

import math
import os

import torch

from nanscope.errors import UserError
from nanscope.facts.args import LOSS_DEFAULTS, loss_args
from nanscope.facts.flags import BY_NAME
from nanscope.facts.keys import PER_TOKEN, SAMPLE
from nanscope.loss import NAMES as LOSSES
from nanscope.loss import get as loss_module
from nanscope.loss import layout
from nanscope.loss.microbatch import Parallel
from nanscope.trace.loading import torch_file
from nanscope.trace.tracer.events import InputFinding, Site, TokenMap, TraceReport
from nanscope.trace.tracer.locator import Tracer

FORMAT = "nanscope-microbatch/1"
# Loss args that count samples, integers >= 1 in any run (`arg_problem`); the loss divides by global_batch_size.
COUNTS = ("global_batch_size", "n_samples_per_prompt")
# The sentinel's own .pt (slime_plugin.hook): a micro-batch's input_ids, no logits; not replayable here.
SENTINEL_FORMAT = "nanscope-sentinel-microbatch/1"


def _parallel(cp_rank: int = 0, cp_size: int = 1, **_):
    return Parallel(cp_rank=cp_rank, cp_size=cp_size)


def token_map(batch: dict, cp_rank: int = 0, cp_size: int = 1, packed_length: int | None = None) -> TokenMap:
    """A Tracer token map for a slime micro-batch on CP rank `cp_rank`.

    Tensors whose first dimension is N (the local response tokens, samples concatenated: the loss
    level, [N] or [N, V]) map to (sample, response position) via layout.response_positions. Tensors
    [1, T, ...], [T, 1, ...] or [T, V] with T the packed row length map to (sample, sequence position)
    via the packed offsets; T is `packed_length` or the sum of the samples' local lengths.
    """
    responses = []  # per local response token: (sample, response position, masked)
    sequence = []  # per entry of the packed row: (sample, sequence position), None past the sample's end
    for i, (total, response) in enumerate(zip(batch["total_lengths"], batch["response_lengths"])):
        mask = torch.as_tensor(batch["loss_masks"][i])
        positions = layout.response_positions(total, response, cp_rank, cp_size)
        responses += [(i, p, bool(mask[p] == 0)) for p in positions]
        sequence += [(i, p) if p < total else None for p in layout.sequence_positions(total, cp_rank, cp_size)]
    response_tokens, row_length = len(responses), packed_length or len(sequence)

    def site_of(shape: tuple, flat: int) -> Site | None:
        inner = math.prod(shape[1:]) if len(shape) > 1 else 1
        if len(shape) in (1, 2) and response_tokens and shape[0] == response_tokens:
            sample, position, masked = responses[flat // inner]
            return Site(sample, position, "response", masked)
        if len(shape) == 3 and shape[0] == 1 and shape[1] == row_length:
            row = flat // shape[2]
        elif len(shape) >= 2 and shape[0] == row_length and (len(shape) == 2 or shape[1] == 1):
            row = flat // inner
        else:
            return None
        hit = sequence[row] if row < len(sequence) else None
        return None if hit is None else Site(hit[0], hit[1], "sequence", None)

    return site_of


def scan_batch(
    batch: dict, cp_rank: int = 0, cp_size: int = 1, logits: torch.Tensor | None = None
) -> list[InputFinding]:
    """Non-finite entries already in the micro-batch's per-token inputs (and the logits), per key.

    Returns:
        One InputFinding per key with a non-finite entry: counts, and the (sample, response
        position) of the first one; for "logits", the sample and its sequence position.
    """
    out = []
    for key in PER_TOKEN:
        counts, first = count_nonfinite(batch.get(key) or [])
        if first is not None:
            i, index = first
            total, response = batch["total_lengths"][i], batch["response_lengths"][i]
            position = layout.response_positions(total, response, cp_rank, cp_size)[index]
            out.append(
                InputFinding(key, counts, i, position, bool(torch.as_tensor(batch["loss_masks"][i])[position] == 0))
            )
    if logits is not None and not bool(torch.isfinite(logits).all()):
        counts, (_, index) = count_nonfinite([logits.detach().reshape(-1)])
        site = token_map(batch, cp_rank, cp_size, logits.size(1))(tuple(logits.shape), index)
        out.append(InputFinding("logits", counts, site.sample if site else None, site.token if site else None))
    return out


def count_nonfinite(parts) -> tuple[dict, tuple[int, int] | None]:
    """Over `parts` (1-D tensors or lists of numbers, any float dtype): the {"nan", "posinf", "neginf"} counts, and
    (part, index) of the first non-finite entry, None when every entry is finite."""
    counts, first = {"nan": 0, "posinf": 0, "neginf": 0}, None
    for i, x in enumerate(parts):
        x = torch.as_tensor(x).detach().float()
        bad = ~torch.isfinite(x)
        if not bool(bad.any()):
            continue
        counts["nan"] += int(x.isnan().sum())
        counts["posinf"] += int(torch.isposinf(x).sum())
        counts["neginf"] += int(torch.isneginf(x).sum())
        if first is None:
            first = (i, int(bad.nonzero()[0, 0]))
    return counts, first


def replay(doc: dict, allow=(), device="cpu") -> TraceReport:
    """Trace the loss of a loaded micro-batch document (see the module docstring), forward + backward, on `device`
    (the batch's tensors and the logits go there; the input scan and the token map read the host copy).

    The loss sees one micro-batch of one process (num_microbatches 1, dp_cp_size 1): the scale of
    the loss differs from the run's, not where non-finite values appear.
    """
    module = loss_module(doc["loss"])
    batch = doc["batch"]
    parallel = _parallel(**(doc.get("parallel") or {}))
    args = loss_args(**doc["args"])
    logits = doc["logits"].detach().clone().float()
    inputs = scan_batch(batch, parallel.cp_rank, parallel.cp_size, logits)
    sites = token_map(batch, parallel.cp_rank, parallel.cp_size, logits.size(1))
    logits = logits.to(device).requires_grad_(True)
    moved = {k: [x.to(device) if isinstance(x, torch.Tensor) else x for x in v] for k, v in batch.items()}
    with Tracer(token_map=sites, allow=allow) as tracer:
        value, _, _ = module.loss_function(args, moved, 1, logits, parallel=parallel)
        value.backward()
    report = tracer.report(inputs)
    bad = int((~torch.isfinite(logits.grad)).sum())
    report.outcome = {"loss": float(value.detach()), "loss_finite": bool(torch.isfinite(value)), "grad_nonfinite": bad}
    return report


def document(batch: dict, logits: torch.Tensor, args, loss: str, parallel: dict | None = None) -> dict:
    """The file format's dict: only the keys the loss reads, detached CPU tensors, plain types.

    Args:
        args: a namespace or dict with slime's field names; only the loss fields are kept.
    """
    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r}: expected one of {', '.join(LOSSES)}")
    fields = vars(args) if not isinstance(args, dict) else args
    cpu = lambda x: torch.as_tensor(x).detach().cpu()  # noqa: E731
    out = {k: [cpu(x) for x in batch[k]] for k in ("unconcat_tokens", "loss_masks") + PER_TOKEN if k in batch}
    out["total_lengths"] = [int(x) for x in batch["total_lengths"]]
    out["response_lengths"] = [int(x) for x in batch["response_lengths"]]
    doc = {
        "format": FORMAT,
        "batch": out,
        "logits": logits.detach().float().cpu(),
        "args": {k: fields[k] for k in LOSS_DEFAULTS if k in fields and k != "custom_loss_function_path"},
        "loss": loss,
    }
    doc["args"]["loss_type"] = "policy_loss"
    if parallel:
        doc["parallel"] = {k: int(parallel[k]) for k in ("cp_rank", "cp_size", "tp_size") if k in parallel}
    return doc


def select_samples(doc: dict, samples: list[int]) -> dict:
    """A document holding only some samples of a micro-batch, and only their rows of the logits.

    A case-sized micro-batch's logits are [1, 16384, 151936 / TP] fp32 (several GB); the samples
    around a non-finite event are usually enough to replay it. Sample numbers are renumbered
    0, 1, ... in the order given; the loss's per-sample means do not mix samples, so a sample's
    terms are the same as in the whole micro-batch.
    """
    batch, parallel = doc["batch"], doc.get("parallel") or {}
    cp = int(parallel.get("cp_size", 1))
    starts, base = [], 0
    for total in batch["total_lengths"]:
        starts.append(base)
        base += layout.local_length(int(total), cp)
    rows = [
        torch.arange(starts[i], starts[i] + layout.local_length(int(batch["total_lengths"][i]), cp)) for i in samples
    ]
    out = {k: [v[i] for i in samples] for k, v in batch.items()}
    return {**doc, "batch": out, "logits": doc["logits"][:, torch.cat(rows)].clone()}


def save_microbatch(
    path,
    batch: dict,
    logits: torch.Tensor,
    args,
    loss: str,
    parallel: dict | None = None,
    samples: list[int] | None = None,
) -> None:
    """Write a micro-batch file for `nanscope trace FILE.pt` (format in the module docstring).

    Args:
        batch: the slime micro-batch the loss received; logits: [1, T_local, V_local] model output;
        args: slime's args namespace (or a dict); loss: "as-is" or "safe";
        parallel: {"cp_rank", "cp_size", "tp_size"} of the rank that saw it, if not one process;
        samples: keep only these samples (see select_samples), e.g. the one an event points at.
    """
    doc = document(batch, logits, args, loss, parallel)
    if samples is not None:
        doc = select_samples(doc, samples)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(doc, path)


def load_microbatch(path, limit: int | None = None, option: str | None = None) -> dict:
    """Read and validate a micro-batch file. Raises UserError (one line) naming the file, field and sample.

    Args:
        limit: the largest file accepted, in bytes (None: any size); option: the CLI option that raises it.
    """
    doc = torch_file.load(path, "micro-batch file", limit, option, name=_field)
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a dict with keys batch, logits, args, loss; got {type(doc).__name__}")
    if doc.get("format") == SENTINEL_FORMAT:
        raise UserError(
            f"{path}: the sentinel's copy of a micro-batch's input_ids, no logits to replay: "
            f'rerun the step as the report\'s "replay" says ({_step_env(doc)})'
        )
    for key in ("batch", "logits", "args", "loss"):
        if key not in doc:
            raise UserError(f"{path}: missing key {key!r} (expected batch, logits, args, loss)")
    if not isinstance(doc["loss"], str) or doc["loss"] not in LOSSES:
        raise UserError(f"{path}: loss {doc['loss']!r}: expected one of {', '.join(LOSSES)}")
    logits = doc["logits"]
    shaped = _plain(logits) and logits.dim() == 3 and logits.size(0) == 1 and logits.numel() > 0
    if not shaped or not logits.is_floating_point():
        what = type(logits).__name__
        if isinstance(logits, torch.Tensor):
            what = f"shape {tuple(logits.shape)} {logits.dtype}"
        raise UserError(f"{path}: logits: expected a float tensor [1, T, V], got {what}")
    _check_args(path, doc["args"])
    parallel = _check_parallel(path, doc.get("parallel") or {})
    lengths = _check_batch(path, doc["batch"], parallel, logits.size(1))
    return {**doc, "batch": {**doc["batch"], **lengths}}  # lengths as ints, as slime passes them


def _step_env(doc: dict) -> str:
    return f"NANSCOPE_TRACE_STEP={doc.get('rollout_id')}:{doc.get('step_id')}"


def _field(place: tuple, doc=None) -> str:
    """A tensor's place in the document as the other refusals name it: `log_probs of sample 3`, `logits`."""
    if len(place) == 3 and place[0] == "batch" and type(place[1]) is str and type(place[2]) is int:
        return f"{place[1][:40]} of sample {place[2]}"
    return torch_file.where(place)


def _plain(x) -> bool:
    """A dense CPU tensor (not meta, not sparse): what the loss can read."""
    return isinstance(x, torch.Tensor) and x.layout == torch.strided and not x.is_meta


def _check_args(path, args) -> None:
    """slime's loss fields (`arg_problem`), and loss_type policy_loss (what `document` writes; custom_loss would
    import custom_loss_function_path)."""
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args) or set(args) - set(LOSS_DEFAULTS):
        bad = sorted(map(str, set(args) - set(LOSS_DEFAULTS))) if isinstance(args, dict) else type(args).__name__
        raise UserError(f"{path}: args: not slime loss fields: {bad}")
    for name, value in args.items():
        problem = arg_problem(name, value)
        if problem:
            raise UserError(f"{path}: args: {name} {value_text(value)}: {problem}")
    if args.get("loss_type", "policy_loss") != "policy_loss":  # custom_loss would import what the file names
        raise UserError(
            f"{path}: args: loss_type {args['loss_type']!r:.40}: a micro-batch replays slime's policy_loss "
            "(a custom_loss would import and run the module the file names)"
        )


def arg_problem(name: str, value) -> str | None:
    """Why `value` cannot be the run's value of args field `name`, or None.

    Every integer fits int64 (torch takes the loss's numbers as C integers and doubles). slime's loss fields
    (`facts.args.LOSS_DEFAULTS`) have their flag's type (`facts.flags`; None only where None is the default), and
    ranges only where no run could have another value: the counts (`COUNTS`) are integers >= 1 (slime sets
    global_batch_size to rollout_batch_size x n_samples_per_prompt / num_steps_per_rollout, megatron-core's
    micro-batch calculator asserts at least one micro-batch in it; the loss divides by it), a float is finite, a
    string field one of its choices in some release. Temperature, clips and coefficients are otherwise taken as
    the run had them: rollout_temperature 0 is a catalogued hazard (zero-temperature), which slime accepts and the
    replay must show; clamp bounds in either order and any coefficient are what slime would compute with.
    """
    if type(value) is int and not -(2**63) <= value < 2**63:
        return "outside int64"
    if name not in LOSS_DEFAULTS or (value is None and LOSS_DEFAULTS[name] is None):
        return None
    flag = BY_NAME[name]
    if flag.kind in ("true", "false"):
        return None if type(value) is bool else "expected bool"
    if name in COUNTS:
        return None if type(value) is int and value >= 1 else "expected an integer >= 1"
    if flag.kind == "float":
        if type(value) not in (int, float):
            return "expected int or float"
        return None if math.isfinite(value) else "expected a finite number"
    choices = sorted({c for _, values in flag.choices for c in values})
    if type(value) is not str:
        return "expected str"
    return None if not choices or value in choices else f"expected one of {', '.join(choices)}"


def token_problem(tokens: torch.Tensor) -> str | None:
    """Why a 1-D tensor cannot be a sample's token ids, or None: an integer dtype, no id below 0."""
    if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
        return f"expected integer token ids, got {tokens.dtype}"
    if tokens.numel() and int(tokens.min()) < 0:
        return f"token id {int(tokens.min())} at position {int(tokens.argmin())}: expected ids >= 0"
    return None


def mask_problem(mask: torch.Tensor) -> str | None:
    """Why a 1-D tensor cannot be a sample's loss mask, or None: every entry 0 or 1 (slime's masks are 0/1 ints;
    NaN or 7 would scale the loss instead of selecting tokens)."""
    if mask.is_complex():
        return f"expected 0 or 1 entries, got {mask.dtype}"
    bad = ~((mask == 0) | (mask == 1))
    if bool(bad.any()):
        at = int(bad.nonzero()[0, 0])
        return f"entry {at} is {mask[at].item()!r}: expected 0 or 1"
    return None


def value_text(value) -> str:
    """`value` in a refusal: repr, shortened (an integer of thousands of digits by its size)."""
    if type(value) is int and value.bit_length() > 128:
        return f"<{value.bit_length()}-bit integer>"
    return f"{value!r:.40}"


def _int(path, value, what: str) -> int:
    if isinstance(value, torch.Tensor) and _plain(value) and value.numel() == 1 and not value.is_floating_point():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f"{path}: {what}: expected an integer, got {type(value).__name__} {value!r:.40}")
    return value


def _check_parallel(path, parallel) -> dict:
    if not isinstance(parallel, dict) or set(parallel) - {"cp_rank", "cp_size", "tp_size"}:
        raise UserError(f"{path}: parallel: expected a dict with cp_rank, cp_size, tp_size")
    out = {key: _int(path, value, f"parallel {key}") for key, value in parallel.items()}
    cp_rank, cp_size, tp_size = out.get("cp_rank", 0), out.get("cp_size", 1), out.get("tp_size", 1)
    if cp_size < 1 or tp_size < 1 or not 0 <= cp_rank < cp_size:
        raise UserError(
            f"{path}: parallel: cp_rank {cp_rank}, cp_size {cp_size}, tp_size {tp_size}: "
            "need sizes >= 1 and 0 <= cp_rank < cp_size"
        )
    return {"cp_rank": cp_rank, "cp_size": cp_size}


def _numel(path, x, what: str) -> int:
    """Entries of a per-sample tensor (or list of numbers), refused unless dense and numeric."""
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError):
            raise UserError(f"{path}: {what}: expected a tensor or a list of numbers, got {type(x).__name__}") from None
    if not _plain(x) or x.dtype == torch.bool or x.is_complex():
        raise UserError(f"{path}: {what}: expected a dense real tensor, got {x.dtype}, {x.layout}, on {x.device.type}")
    return x.numel()


def _values(path, x, what: str, problem) -> None:
    """`problem` (token_problem, mask_problem) of a per-sample entry `_numel` accepted, as one line."""
    found = problem(x if isinstance(x, torch.Tensor) else torch.as_tensor(x))
    if found:
        raise UserError(f"{path}: {what}: {found}")


def sample_count(where: str, batch: dict, per_token: tuple[str, ...], kinds: tuple[type, ...]) -> int:
    """The samples of a loss batch (a micro-batch file's, a repro bundle's), checked in one line each: slime's
    per-sample keys and log_probs and advantages present, each per-sample key and the `per_token` keys present a
    list (of `kinds`) with one entry per sample, at least one sample."""
    for key in SAMPLE + ("log_probs", "advantages"):
        if key not in batch:
            raise UserError(f"{where}: batch: missing key {key!r}")
    keys = SAMPLE + per_token
    for key in keys:
        if not isinstance(batch[key], kinds):
            got = type(batch[key]).__name__
            raise UserError(f"{where}: batch: {key}: expected a list (one entry per sample), got {got}")
    n = len(batch["total_lengths"])
    if n == 0:
        raise UserError(f"{where}: batch: no samples (total_lengths is empty)")
    for key in keys:
        if len(batch[key]) != n:
            raise UserError(f"{where}: batch: {key} has {len(batch[key])} samples, total_lengths has {n}")
    return n


def _check_batch(path, batch, parallel: dict, packed: int) -> dict[str, list[int]]:
    """Checks a micro-batch file's batch (one line naming the field and sample); returns its total_lengths and
    response_lengths as ints (a 0-dim integer tensor is accepted as its value)."""
    if not isinstance(batch, dict):
        raise UserError(f"{path}: batch: expected a dict, got {type(batch).__name__}")
    n = sample_count(str(path), batch, tuple(k for k in PER_TOKEN if k in batch), (list, tuple))
    cp_rank, cp_size = parallel["cp_rank"], parallel["cp_size"]
    used, totals, responses = 0, [], []
    for i in range(n):
        total = _int(path, batch["total_lengths"][i], f"total_lengths of sample {i}")
        response = _int(path, batch["response_lengths"][i], f"response_lengths of sample {i}")
        totals.append(total)
        responses.append(response)
        if not 0 < response < total:
            raise UserError(f"{path}: response_lengths of sample {i}: {response} must be in [1, total_length {total})")
        tokens = _numel(path, batch["unconcat_tokens"][i], f"unconcat_tokens of sample {i}")
        _values(path, batch["unconcat_tokens"][i], f"unconcat_tokens of sample {i}", token_problem)
        if tokens != total:
            raise UserError(f"{path}: unconcat_tokens of sample {i}: {tokens} tokens != total_length {total}")
        masks = _numel(path, batch["loss_masks"][i], f"loss_masks of sample {i}")
        _values(path, batch["loss_masks"][i], f"loss_masks of sample {i}", mask_problem)
        if masks != response:
            raise UserError(f"{path}: loss_masks of sample {i}: {masks} entries != response_length {response}")
        used += layout.local_length(total, cp_size)
        if used > packed:  # before any per-position list: the logits bound what the samples may declare
            raise UserError(f"{path}: logits: packed length {packed} < sum of the samples' local lengths {used}")
        local = len(layout.response_positions(total, response, cp_rank, cp_size))
        for key in PER_TOKEN:
            if key in batch and (got := _numel(path, batch[key][i], f"{key} of sample {i}")) != local:
                raise UserError(f"{path}: {key} of sample {i}: {got} entries != {local} local response tokens")
    return {"total_lengths": totals, "response_lengths": responses}

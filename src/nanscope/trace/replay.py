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
      "args":     {field: value}                         # slime loss args (slime_args.LOSS_DEFAULTS names)
      "loss":     "as-is" | "safe",
      "parallel": {"cp_rank": int, "cp_size": int, "tp_size": int}   # optional, default one process
    }

A tensor-parallel vocabulary shard (tp_size > 1) replays as if the shard were the whole vocabulary:
the log-probs differ, the positions of exp overflows in the loss terms mostly do not. Case-sized
logits are several GB: `save_microbatch(..., samples=[i])` keeps only some samples' rows.
"""

from __future__ import annotations

import math
import os

import torch

from nanscope.errors import UserError
from nanscope.loss import NAMES as LOSSES
from nanscope.loss import get as loss_module
from nanscope.loss import layout
from nanscope.trace.locator import InputFinding, Site, TokenMap, TraceReport, Tracer

FORMAT = "nanscope-microbatch/1"
SAMPLE_KEYS = ("unconcat_tokens", "total_lengths", "response_lengths", "loss_masks")
TOKEN_KEYS = ("log_probs", "ref_log_probs", "rollout_log_probs", "advantages")


def _parallel(cp_rank: int = 0, cp_size: int = 1, **_):
    from nanscope.loss.microbatch import Parallel

    return Parallel(cp_rank=cp_rank, cp_size=cp_size)


def token_map(batch: dict, cp_rank: int = 0, cp_size: int = 1, packed_length: int | None = None) -> TokenMap:
    """A Tracer token map for a slime micro-batch on CP rank `cp_rank`.

    Tensors whose first dimension is N (the local response tokens, samples concatenated: the loss
    level, [N] or [N, V]) map to (sample, response position) via layout.response_positions. Tensors
    [1, T, ...], [T, 1, ...] or [T, V] with T the packed row length map to (sample, sequence position)
    via the packed offsets; T is `packed_length` or the sum of the samples' local lengths.
    """
    resp, seq = [], []
    for i, (total, response) in enumerate(zip(batch["total_lengths"], batch["response_lengths"])):
        mask = torch.as_tensor(batch["loss_masks"][i])
        resp += [(i, p, bool(mask[p] == 0)) for p in layout.response_positions(total, response, cp_rank, cp_size)]
        seq += [(i, p) if p < total else None for p in layout.sequence_positions(total, cp_rank, cp_size)]
    n, t_len = len(resp), packed_length or len(seq)

    def fn(shape: tuple, flat: int) -> Site | None:
        inner = math.prod(shape[1:]) if len(shape) > 1 else 1
        if len(shape) in (1, 2) and n and shape[0] == n:
            i, p, masked = resp[flat // inner]
            return Site(i, p, "response", masked)
        if len(shape) == 3 and shape[0] == 1 and shape[1] == t_len:
            row = flat // shape[2]
        elif len(shape) >= 2 and shape[0] == t_len and (len(shape) == 2 or shape[1] == 1):
            row = flat // inner
        else:
            return None
        hit = seq[row] if row < len(seq) else None
        return None if hit is None else Site(hit[0], hit[1], "sequence", None)

    return fn


def scan_batch(batch: dict, cp_rank: int = 0, cp_size: int = 1, logits: torch.Tensor | None = None) -> list[InputFinding]:
    """Non-finite entries already in the micro-batch's per-token inputs (and the logits), per key.

    Returns:
        One InputFinding per key with a non-finite entry: counts, and the (sample, response
        position) of the first one; for "logits", the sample and its sequence position.
    """
    out = []
    for key in TOKEN_KEYS:
        counts, first = {"nan": 0, "posinf": 0, "neginf": 0}, None
        for i, x in enumerate(batch.get(key) or []):
            x = torch.as_tensor(x, dtype=torch.float32)
            bad = ~torch.isfinite(x)
            if not bool(bad.any()):
                continue
            counts["nan"] += int(x.isnan().sum())
            counts["posinf"] += int(torch.isposinf(x).sum())
            counts["neginf"] += int(torch.isneginf(x).sum())
            if first is None:
                k = int(bad.nonzero()[0, 0])
                total, response = batch["total_lengths"][i], batch["response_lengths"][i]
                pos = layout.response_positions(total, response, cp_rank, cp_size)[k]
                first = (i, pos, bool(torch.as_tensor(batch["loss_masks"][i])[pos] == 0))
        if first is not None:
            out.append(InputFinding(key, counts, *first))
    if logits is not None and not bool(torch.isfinite(logits).all()):
        flat = logits.detach().reshape(-1)
        k = int((~torch.isfinite(flat)).nonzero()[0, 0])
        site = token_map(batch, cp_rank, cp_size, logits.size(1))(tuple(logits.shape), k)
        counts = {"nan": int(flat.isnan().sum()), "posinf": int(torch.isposinf(flat).sum()), "neginf": int(torch.isneginf(flat).sum())}
        out.append(InputFinding("logits", counts, site.sample if site else None, site.token if site else None))
    return out


def replay(doc: dict, allow=()) -> TraceReport:
    """Trace the loss of a loaded micro-batch document (see the module docstring), forward + backward.

    The loss sees one micro-batch of one process (num_microbatches 1, dp_cp_size 1): the scale of
    the loss differs from the run's, not where non-finite values appear.
    """
    from nanscope.slime_args import loss_args

    module = loss_module(doc["loss"])
    batch, par_args = doc["batch"], doc.get("parallel") or {}
    par = _parallel(**par_args)
    args = loss_args(**doc["args"])
    logits = doc["logits"].detach().clone().float().requires_grad_(True)
    inputs = scan_batch(batch, par.cp_rank, par.cp_size, logits)
    with Tracer(token_map=token_map(batch, par.cp_rank, par.cp_size, logits.size(1)), allow=allow) as tracer:
        value, _, _ = module.loss_function(args, batch, 1, logits, parallel=par)
        value.backward()
    report = tracer.report(inputs)
    bad = int((~torch.isfinite(logits.grad)).sum())
    report.outcome = {"loss": float(value.detach()), "loss_finite": bool(torch.isfinite(value)), "grad_nonfinite": bad}
    return report


def hazard_microbatch(name: str, loss: str = "as-is", seed: int = 0, vocab_size: int = 512) -> tuple[dict, tuple | None]:
    """A catalogued hazard's micro-batch as a document for `replay` (as hazards.run_loss builds it).

    Returns:
        (document, hazard site (sample, response position) or None).
    """
    from nanscope import case, hazards

    policy = hazards.synthetic_policy(vocab_size, seed)
    batch = hazards.build(name, policy, hazards.case_rollout(vocab_size, seed), seed)
    logits = hazards.packed_logits(policy, batch["unconcat_tokens"])
    args = {**case.loss_flags(), "global_batch_size": len(batch["response_lengths"])}
    return document(batch, logits, args, loss), batch["hazard_site"]


def document(batch: dict, logits: torch.Tensor, args, loss: str, parallel: dict | None = None) -> dict:
    """The file format's dict: only the keys the loss reads, detached CPU tensors, plain types.

    Args:
        args: a namespace or dict with slime's field names; only the loss fields are kept.
    """
    from nanscope.slime_args import LOSS_DEFAULTS

    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r}: expected one of {', '.join(LOSSES)}")
    fields = vars(args) if not isinstance(args, dict) else args
    cpu = lambda x: torch.as_tensor(x).detach().cpu()  # noqa: E731
    out = {k: [cpu(x) for x in batch[k]] for k in ("unconcat_tokens", "loss_masks") + TOKEN_KEYS if k in batch}
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
    batch, par = doc["batch"], doc.get("parallel") or {}
    cp = int(par.get("cp_size", 1))
    starts, base = [], 0
    for total in batch["total_lengths"]:
        starts.append(base)
        base += layout.local_length(int(total), cp)
    rows = [torch.arange(starts[i], starts[i] + layout.local_length(int(batch["total_lengths"][i]), cp)) for i in samples]
    out = {k: [v[i] for i in samples] for k, v in batch.items()}
    return {**doc, "batch": out, "logits": doc["logits"][:, torch.cat(rows)].clone()}


def save_microbatch(path, batch: dict, logits: torch.Tensor, args, loss: str, parallel: dict | None = None,
                    samples: list[int] | None = None) -> None:
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


def load_microbatch(path) -> dict:
    """Read and validate a micro-batch file. Raises UserError naming the file and field."""
    from nanscope.slime_args import LOSS_DEFAULTS

    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file")
    try:
        doc = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle errors, not a torch file, unsafe globals
        raise UserError(f"{path}: not a nanscope micro-batch file (torch.load weights_only: {str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a dict with keys batch, logits, args, loss; got {type(doc).__name__}")
    for key in ("batch", "logits", "args", "loss"):
        if key not in doc:
            raise UserError(f"{path}: missing key {key!r} (expected batch, logits, args, loss)")
    if doc["loss"] not in LOSSES:
        raise UserError(f"{path}: loss {doc['loss']!r}: expected one of {', '.join(LOSSES)}")
    logits = doc["logits"]
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.size(0) != 1 or not logits.is_floating_point():
        what = f"shape {tuple(logits.shape)} {logits.dtype}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise UserError(f"{path}: logits: expected a float tensor [1, T, V], got {what}")
    if not isinstance(doc["args"], dict) or set(doc["args"]) - set(LOSS_DEFAULTS):
        bad = sorted(set(doc["args"]) - set(LOSS_DEFAULTS)) if isinstance(doc["args"], dict) else type(doc["args"]).__name__
        raise UserError(f"{path}: args: not slime loss fields: {bad}")
    _check_batch(path, doc["batch"], doc.get("parallel") or {}, logits.size(1))
    return doc


def _check_batch(path, batch, par: dict, packed: int) -> None:
    if not isinstance(batch, dict):
        raise UserError(f"{path}: batch: expected a dict, got {type(batch).__name__}")
    for key in SAMPLE_KEYS + ("log_probs", "advantages"):
        if key not in batch:
            raise UserError(f"{path}: batch: missing key {key!r}")
    n = len(batch["total_lengths"])
    cp_rank, cp_size = int(par.get("cp_rank", 0)), int(par.get("cp_size", 1))
    for key in SAMPLE_KEYS[:1] + SAMPLE_KEYS[2:] + tuple(k for k in TOKEN_KEYS if k in batch):
        if len(batch[key]) != n:
            raise UserError(f"{path}: batch: {key} has {len(batch[key])} samples, total_lengths has {n}")
    used = 0
    for i in range(n):
        total, response = int(batch["total_lengths"][i]), int(batch["response_lengths"][i])
        if not 0 < response < total:
            raise UserError(f"{path}: response_lengths of sample {i}: {response} must be in [1, total_length {total})")
        if torch.as_tensor(batch["unconcat_tokens"][i]).numel() != total:
            raise UserError(f"{path}: unconcat_tokens of sample {i}: {torch.as_tensor(batch['unconcat_tokens'][i]).numel()} tokens != total_length {total}")
        if torch.as_tensor(batch["loss_masks"][i]).numel() != response:
            raise UserError(f"{path}: loss_masks of sample {i}: {torch.as_tensor(batch['loss_masks'][i]).numel()} entries != response_length {response}")
        local = len(layout.response_positions(total, response, cp_rank, cp_size))
        for key in TOKEN_KEYS:
            if key in batch and torch.as_tensor(batch[key][i]).numel() != local:
                raise UserError(f"{path}: {key} of sample {i}: {torch.as_tensor(batch[key][i]).numel()} entries != {local} local response tokens")
        used += layout.local_length(total, cp_size)
    if used > packed:
        raise UserError(f"{path}: logits: packed length {packed} < sum of the samples' local lengths {used}")


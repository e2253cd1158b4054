"""Replay a repro bundle's loss offline, on CPU by default: the op, source line, sample and token, then the guard.

The bundle (`nanscope.trace.bundles.bundle`) holds what the release's policy loss received but the logits, and the
current policy's per-token log-probs and entropy as the release's own helper computed them from the logits.
The replay starts from those as leaves that require grad: it calls the loss (the release's `loss_function`, or
nanscope's model `nanscope.loss.as_is.loss_function`) with a stand-in logits tensor [1, T_local, 1] while the
release's log-prob helper (`facts.releases.LossApi.log_prob_helper`) returns the leaves in the shape that
release returns (`log_prob_returns`: a dict in v0.1.0, (empty, dict) later, tensors in nanscope's model).
Everything after the helper is the release's own code, run eagerly under the tracer (`locator.Tracer`), with
the bundle's CP coordinate standing in for megatron-core's parallel state (`slime_import.parallel`).

Then the same micro-batch through the guard (`nanscope.loss.guard.call` around the release's policy loss, as
the plugin's loss runs it): the loss and d loss / d leaves, finite or not.

Where the bundle kept no current log-probs, the old-policy `log_probs` stand in for them: approximate, and said.

The replay runs on the device its caller names (`device`: the bundle's tensors, the leaves and the stand-in logits
go there; the token map and the input scan read the host copy): the CPU unless asked.

    with bundle_replay.loss_path(doc, slime_src=None) as path:
        result = bundle_replay.replay(doc, path, source="x.bundle.pt")
    result.found, result.to_dict()
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nanscope.causes.classes import DATA, LOSS_NUMERICS
from nanscope.errors import UserError
from nanscope.facts.args import LOSS_DEFAULTS, loss_args
from nanscope.facts.keys import PER_TOKEN
from nanscope.facts.releases import RELEASES
from nanscope.loss import guard
from nanscope.loss import target as targets
from nanscope.loss.microbatch import Parallel
from nanscope.trace.bundles import slime_import
from nanscope.trace.bundles.bundle_rows import Rows, rows_of
from nanscope.trace.tracer.events import InputFinding, Site
from nanscope.trace.tracer.locator import Tracer
from nanscope.trace.tracer.replay import count_nonfinite
from nanscope.trace.tracer.step import first_across_ranks

CURRENT = "current log_probs"  # an InputFinding's name: the helper's output was non-finite already
CURRENT_ENTROPY = "current entropy"


@dataclass(frozen=True)
class LossPath:
    """The loss a replay runs through: `target` (a release bound to its module, or nanscope's model) and why."""

    target: targets.Target
    used: str  # "slime v0.1.0's own loss (checkout /tmp/slime/v0.1.0)"
    why: str
    release: bool  # a slime release (else nanscope's model)


@dataclass(frozen=True)
class _Pinned(targets.Target):
    """A target whose policy loss is `original`: the guard calls it while the module's own name is replaced."""

    original: object = None

    @property
    def entry(self):
        return self.original


@dataclass
class EntryReplay:
    """One micro-batch of a bundle, replayed: its trace (with outcome), the guard's outcome, its rows."""

    index: int
    microbatch: int
    why: list
    cp: tuple
    trace: dict  # TraceReport.to_dict(), samples translated to rollout rows where known
    guard: dict  # {"loss", "loss_finite", "grad_nonfinite"}
    rows: Rows
    approximate: bool

    @property
    def found(self) -> bool:
        outcome = self.trace["outcome"]
        return not outcome["loss_finite"] or outcome["grad_nonfinite"] > 0

    def to_dict(self) -> dict:
        cp_rank, cp_size, how = self.cp
        return {
            "index": self.index, "microbatch": self.microbatch, "why": self.why,
            "cp": {"cp_rank": cp_rank, "cp_size": cp_size, "how": how}, "approximate": self.approximate,
            "rows": self.rows.rows, "rows_how": self.rows.how, "trace": self.trace, "guard": self.guard,
        }  # fmt: skip


@dataclass
class BundleReplay:
    """A whole bundle: the header, each replayed micro-batch, and the first producers over them."""

    source: str
    where: dict  # rollout_id, step_id, coords, release, nanscope
    loss: LossPath
    entries: list[EntryReplay]
    skipped: list[dict]  # micro-batches without a batch (no loss on this stage): {"index", "microbatch", "why"}
    report: dict | None
    first: dict = field(default_factory=dict)  # first_across_ranks over the entries

    @property
    def found(self) -> bool:
        """The replay names the cause in the loss: an op of it (loss-numerics) or a non-finite input (data). False
        when the NaN started upstream: the loss replays finite, or the current log-probs were non-finite already."""
        if self.cause is not None:
            return True
        nonfinite = any(
            not e.trace["outcome"]["loss_finite"] or e.trace["outcome"]["grad_nonfinite"] for e in self.entries
        )
        return nonfinite and not self.current_nonfinite

    @property
    def approximate(self) -> bool:
        return any(entry.approximate for entry in self.entries)

    @property
    def current_nonfinite(self) -> bool:
        """The log-probs (or entropy) the release computed from this step's logits were non-finite already."""
        return any(finding["name"] in (CURRENT, CURRENT_ENTROPY) for finding in self.first.get("inputs", []))

    @property
    def cause(self) -> str | None:
        """loss-numerics (an op of the loss produced it); data (a non-finite input, or --rollout-temperature 0, which
        the log-prob helper divides the logits by); None: upstream of the loss (the model)."""
        if self.first.get("forward") or self.first.get("backward"):
            return LOSS_NUMERICS
        if self.current_nonfinite:
            return DATA if self.where.get("rollout_temperature") == 0 else None
        return DATA if self.first.get("inputs") else None

    def to_dict(self) -> dict:
        return {
            "source": self.source, **self.where, "loss": self.loss.used, "loss_why": self.loss.why,
            "release_loss": self.loss.release, "approximate": self.approximate, "found": self.found,
            "current_nonfinite": self.current_nonfinite,
            "class": self.cause, "first": self.first, "microbatches": [e.to_dict() for e in self.entries],
            "not_replayed": self.skipped, "report": self.report,
        }  # fmt: skip


def release_key(name: str) -> str | None:
    """The release key ("v0.2.4", "main") of a LossApi name as a bundle records it, None if it is no release."""
    return next((r.key for r in RELEASES if r.loss_api.name == name), None)


@contextlib.contextmanager
def loss_path(doc: dict, slime_src: str | Path | None = None):
    """The LossPath for a bundle (a context: a checkout's modules leave sys.modules when it ends).

    A bundle written through nanscope's model replays through it; one written through a slime release replays
    through that release: `slime_src`'s checkout, else an installed slime, else nanscope's model of v0.1.0.
    """
    release = dict(doc["release"])
    del doc  # the context may outlive this bundle (`nanscope trace DIR` keeps it for the next): not its tensors
    name = release["name"]
    key = release_key(name)
    if release["module"] == targets.MODEL_LOSS or key is None:
        why = "the bundle was written through it (nanscope's CPU harness)"
        if release["module"] != targets.MODEL_LOSS:
            why = f"the bundle names the release {name!r:.80}, which nanscope does not know"
        yield LossPath(targets.model(), targets.MODEL.name, why, False)
        return
    if slime_src is None and not slime_import.installed():
        why = f"the bundle was written through slime {key}, which is not importable here: give --slime-src DIR"
        yield LossPath(targets.model(), targets.MODEL.name, why, False)
        return
    with contextlib.ExitStack() as stack:
        if slime_src is not None:
            checkout = slime_import.find_checkout(slime_src, key)
            module = stack.enter_context(slime_import.checkout_loss(checkout))
            where = f"checkout {checkout}"
        else:
            module, where = slime_import.installed_loss(), "installed"
        bound = targets.bind(module)
        if release_key(bound.release.name) != key:
            raise UserError(
                f"the bundle was written through slime {key}, but the slime here ({where}) is {bound.release.name}: "
                "give that release's checkout with --slime-src"
            )
        yield LossPath(bound, f"slime {bound.release.name}'s own loss ({where})", "the release that wrote it", True)


def replay(doc: dict, path: LossPath, *, source: str, rollout=None, allow=(), device="cpu") -> BundleReplay:
    """Replay every micro-batch of a checked bundle (`bundle_load.load`) that has a batch.

    Args:
        rollout: (path, [token tuple per dump row]) of the run's rollout dump, to name samples by their row.
        device: where the loss runs (the module docstring).
    """
    entries, skipped = [], []
    for entry in doc["microbatches"]:
        if entry.get("batch") is None:
            skipped.append({k: entry.get(k) for k in ("index", "microbatch", "why")})
            continue
        rows = rows_of(doc, entry, rollout)
        entries.append(replay_entry(doc, entry, path, rows=rows, allow=allow, device=device))
    coords = doc["coords"]
    records = [{"rank": coords["rank"], "pp": coords["pp"], "tp": coords["tp"], "trace": e.trace} for e in entries]
    where = {k: doc[k] for k in ("rollout_id", "step_id", "coords", "release")} | {"nanscope": doc.get("nanscope")}
    where["rollout_temperature"] = doc["args"].get("rollout_temperature")
    result = BundleReplay(
        source=source, where=where, loss=path, entries=entries, skipped=skipped, report=doc.get("report")
    )
    result.first = first_of(records)
    return result


def first_of(records: list[dict]) -> dict:
    """`trace.tracer.step.first_across_ranks` over replayed micro-batches ({"rank", "pp", "tp", "trace"} each), with the
    first non-finite input of each name only."""
    if not records:
        return {}
    first = first_across_ranks(records)
    inputs, seen = [], set()
    for finding in first["inputs"]:
        if finding["name"] not in seen:
            seen.add(finding["name"])
            inputs.append(finding)
    return {**first, "inputs": inputs}


def records_of(results: list[dict]) -> list[dict]:
    """The replayed micro-batches of several bundles' `to_dict()`s, as `first_of` takes them."""
    return [
        {"rank": r["coords"]["rank"], "pp": r["coords"]["pp"], "tp": r["coords"]["tp"], "trace": entry["trace"]}
        for r in results
        for entry in r["microbatches"]
    ]


def replay_entry(doc: dict, entry: dict, path: LossPath, *, rows: Rows, allow=(), device="cpu") -> EntryReplay:
    """One micro-batch: under the tracer from the recorded leaves, then through the guard, on `device`."""
    cp_rank, cp_size, _ = entry["cp"]
    host = {k: list(v) if isinstance(v, list) else v for k, v in entry["batch"].items()}
    batch = on_device(host, device)
    args = _args(doc["args"], path)
    par = Parallel(cp_rank=cp_rank, cp_size=cp_size)
    dp = doc["coords"]["dp_size"]
    state = slime_import.parallel(cp_rank, cp_size, dp) if path.release else contextlib.nullcontext()
    with state, slime_import.eager():
        _refuse_collectives(args, cp_size, path)
        positions = guard.response_positions(path.target, args, host, par)
        masks = [torch.as_tensor(m) for m in host["loss_masks"]]  # the token map reads them, on the host
        current, approximate = _current(entry, host)
        leaves = _leaves(current, device)
        inputs = _scan(host, positions, masks, leaves)
        with Tracer(token_map=_token_map(positions, masks), allow=allow) as tracer:
            tracer.microbatch(entry["microbatch"])
            value = _run(path, args, batch, par, leaves)
        report = tracer.report(inputs)
        report.outcome = _outcome(value, leaves)
        fresh = _leaves(current, device)
        with _guarded(path, par):
            guarded = _outcome(_run(path, args, batch, par, fresh), fresh)
    trace = rows.translate(report.to_dict())
    return EntryReplay(
        index=entry["index"], microbatch=entry["microbatch"], why=list(entry.get("why", [])),
        cp=entry["cp"], trace=trace, guard=guarded, rows=rows, approximate=approximate,
    )  # fmt: skip


def _args(fields: dict, path: LossPath):
    """The loss's args from the bundle's: the release's own policy loss, never a module the bundle names."""
    if not path.release:
        kept = {k: v for k, v in fields.items() if k in LOSS_DEFAULTS and k != "custom_loss_function_path"}
        for name, value in kept.items():
            default = LOSS_DEFAULTS[name]
            if default is not None and value is not None and type(value) is not type(default):
                if not (isinstance(default, float) and type(value) is int):
                    raise UserError(f"args: {name} {value!r:.40}: expected {type(default).__name__}")
        kept["global_batch_size"] = max(1, int(kept.get("global_batch_size", 1) or 1))
        return loss_args(**{**kept, "loss_type": "policy_loss"})
    values = dict(fields)
    for name, value in values.items():  # the release's load_function would import these
        if name.endswith("_function_path") and value and name != "custom_loss_function_path":
            if not str(value).startswith("slime."):
                raise UserError(
                    f"args: {name} {value!r:.80}: the bundle names code outside slime; an offline replay does not "
                    "import it"
                )
    values |= {"loss_type": "policy_loss", "custom_loss_function_path": None, "recompute_loss_function": False}
    return argparse.Namespace(**values)


def _refuse_collectives(args, cp_size: int, path: LossPath) -> None:
    if cp_size > 1 and (
        getattr(args, "advantage_estimator", None) == "gspo"
        or getattr(args, "use_opsm", False)
        or getattr(args, "allgather_cp", False)
    ):
        raise UserError(
            "args: gspo, OPSM and --allgather-cp gather a sample over its CP ranks: one rank's bundle cannot replay "
            f"them at CP {cp_size}"
        )


def _current(entry: dict, batch: dict) -> tuple[dict, bool]:
    """The recorded current log-probs and entropy, or the old-policy log_probs standing in for them."""
    current = entry.get("current")
    if current is not None:
        entropy = current.get("entropy")
        if entropy is None:
            entropy = [torch.zeros_like(x, dtype=torch.float32) for x in current["log_probs"]]
        return {"log_probs": current["log_probs"], "entropy": entropy}, False
    old = batch["log_probs"]
    return {"log_probs": old, "entropy": [torch.zeros_like(x, dtype=torch.float32) for x in old]}, True


def _leaves(current: dict, device="cpu") -> dict:
    return {k: [x.detach().float().to(device).clone().requires_grad_(True) for x in v] for k, v in current.items()}


def on_device(batch: dict, device) -> dict:
    """The batch with its tensors (and lists of tensors) on `device`; lengths and other values as they are."""

    def moved(x):
        return x.to(device) if isinstance(x, torch.Tensor) else x

    return {k: [moved(x) for x in v] if isinstance(v, list) else moved(v) for k, v in batch.items()}


def _token_map(positions: list[list[int]], masks: list[torch.Tensor]):
    """[N] and [N, ...] tensors (this rank's response tokens, samples concatenated) -> (sample, response token)."""
    flat = [(i, p) for i, pos in enumerate(positions) for p in pos]

    def site_of(shape: tuple, index: int) -> Site | None:
        if not flat or len(shape) not in (1, 2) or shape[0] != len(flat):
            return None
        sample, position = flat[index // (shape[1] if len(shape) == 2 and shape[1] else 1)]
        return Site(sample, position, "response", bool(masks[sample][position] == 0))

    return site_of


def _scan(batch: dict, positions, masks, leaves: dict) -> list[InputFinding]:
    """Non-finite entries already in the inputs: the batch's per-token keys, then the recorded current ones."""
    named = [(key, batch[key]) for key in PER_TOKEN if batch.get(key)]
    named += [(CURRENT, leaves["log_probs"]), (CURRENT_ENTROPY, leaves["entropy"])]
    out = []
    for name, parts in named:
        counts, first = count_nonfinite(parts)
        if first is not None:
            i, index = first
            position = positions[i][index]
            out.append(InputFinding(name, counts, i, position, bool(masks[i][position] == 0)))
    return out


def _helper(path: LossPath, leaves: dict):
    """The release's log-prob helper's stand-in: the recorded leaves, shaped as that release returns them."""
    returns = path.target.release.log_prob_returns

    def recorded(*_, with_entropy: bool = True, **__):
        if returns == "tensors":
            return torch.cat(leaves["log_probs"]), torch.cat(leaves["entropy"])
        found = {"log_probs": list(leaves["log_probs"])}
        if with_entropy:
            found["entropy"] = list(leaves["entropy"])
        return found if returns == "dict" else (torch.empty((0,)), found)

    return recorded


@contextlib.contextmanager
def _replaced(module, name: str, value):
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def _run(path: LossPath, args, batch: dict, par: Parallel, leaves: dict) -> torch.Tensor:
    """The release's loss_function on a stand-in logits tensor, the helper returning `leaves`; backward too."""
    module = path.target.module
    total = sum(x.numel() for x in leaves["log_probs"])
    device = next((x.device for x in leaves["log_probs"]), torch.device("cpu"))  # the replay's device
    logits = torch.zeros(1, max(total, 1), 1, device=device)
    with _replaced(module, path.target.release.log_prob_helper, _helper(path, leaves)):
        try:
            if not path.release:
                value = module.loss_function(args, batch, 1, logits, parallel=par)[0]
            else:
                params = inspect.signature(module.loss_function).parameters
                extra = (args.global_batch_size,) if "step_global_batch_size" in params else ()
                value = module.loss_function(args, batch, 1, *extra, logits)[0]
            if value.requires_grad:
                value.backward()
        except (RuntimeError, IndexError, ValueError, TypeError, KeyError, AssertionError) as e:
            why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise UserError(f"{path.used} cannot run on the bundle's tensors: {type(e).__name__}: {why}") from None
    return value.detach()


def _outcome(value: torch.Tensor, leaves: dict) -> dict:
    grads = [x.grad for parts in leaves.values() for x in parts if x.grad is not None]
    bad = sum(int((~torch.isfinite(g)).sum()) for g in grads)
    return {
        "loss": float(value),
        "loss_finite": bool(torch.isfinite(value)),
        "grad_nonfinite": bad,
        "grad_entries": sum(g.numel() for g in grads),
    }


@contextlib.contextmanager
def _guarded(path: LossPath, par: Parallel):
    """The module's policy loss replaced by the guard around it, as the plugin's loss calls it."""
    module, name = path.target.module, path.target.release.entry
    pinned = _Pinned(path.target.release, module, path.target.slicer, original=getattr(module, name))

    def guarded(args, batch, logits, sum_of_sample_mean, **kwargs):
        parallel = kwargs.get("parallel", par) if not path.release else None
        return guard.call(pinned, args, batch, logits, sum_of_sample_mean, parallel=parallel)

    with _replaced(module, name, guarded):
        yield

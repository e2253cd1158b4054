"""A verl repro bundle (nanscope.verl_plugin wrote it on a non-finite step): its format, checks, and replay.

The bundle holds, per kept micro-batch, what verl's `nanscope` loss mode received ([B, T] old_log_prob, log_prob,
advantages, response_mask, rollout_is_weights), the loss the step's loss function returned, the numbers verl
normalised by (dp_size, batch_num_tokens, global_batch_size), and the actor config's loss fields (`plain_config`).

`replay` runs each micro-batch through verl's own `ppo_loss` (verl v0.9.0 verl/workers/utils/losses.py:57-144) with
the run's inner policy loss mode, forward and backward, under nanscope's op tracer (nanscope.trace.tracer.locator),
in the verl installed here:

    upstream       the current log-probs the model gave are already non-finite: the NaN started upstream of the loss
                   (the report's first_forward names the module); exit 0
    op             the first op whose output is non-finite, forward or backward, with its source line, sample and
                   response token: the loss made it; exit 1
    finite         the loss and its gradient are finite on these inputs (the guard's view); exit 0

verl's ppo_loss reads the log-probs from a model output over whole sequences (no_padding_2_padding, padding.py:97-140):
the replay lays each sample out as a one-token prompt followed by its T response positions, which puts every
recorded log-prob back where ppo_loss slices it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope.errors import UserError
from nanscope.trace.loading import torch_file

FORMAT = "nanscope-verl-bundle/1"
# ActorConfig fields the replay rebuilds (verl/workers/config/actor.py:150-196), and its policy_loss's (:79-104)
CONFIG_FIELDS = (
    "clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode", "loss_scale_factor",
    "entropy_coeff", "use_kl_loss", "kl_loss_coef", "kl_loss_type",
)  # fmt: skip
POLICY_FIELDS = ("loss_mode", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta")
INPUTS = ("old_log_prob", "log_prob", "advantages", "response_mask", "rollout_is_weights")
_PLAIN = (bool, int, float, str, type(None))


def plain_config(config) -> dict:
    """The loss fields of verl's actor config as plain values ({} for None)."""
    if config is None:
        return {}
    out = {k: getattr(config, k, None) for k in CONFIG_FIELDS}
    policy = getattr(config, "policy_loss", None)
    out["policy_loss"] = {k: getattr(policy, k, None) for k in POLICY_FIELDS}
    return {k: v for k, v in out.items() if isinstance(v, (*_PLAIN, dict))}


def load(path, limit: int | None = None, option: str | None = None) -> dict:
    """Read a verl bundle within torch_file's bounds and check what the replay reads; one UserError line if not."""
    return checked(path, torch_file.load(path, "repro bundle", limit, option))


def is_verl(doc) -> bool:
    return isinstance(doc, dict) and doc.get("format") == FORMAT


def checked(path, doc) -> dict:
    """`doc` checked: the format, the report, each micro-batch's inputs (2-D, one shape) and loss, the config."""
    if not is_verl(doc):
        raise UserError(f"{path}: not a verl repro bundle: expected format {FORMAT!r}")
    if not isinstance(doc.get("report"), dict):
        raise UserError(f"{path}: report: expected a dict")
    config = doc.get("config", {})
    if not isinstance(config, dict) or not all(isinstance(v, (*_PLAIN, dict)) for v in config.values()):
        raise UserError(f"{path}: config: expected a dict of plain values")
    entries = doc.get("microbatches")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UserError(f"{path}: microbatches: expected a list of dicts")
    for i, entry in enumerate(entries):
        _entry(path, i, entry)
    return doc


def _entry(path, i: int, entry: dict) -> None:
    import torch  # heavy: torch, only a bundle being read needs it

    inputs = entry.get("inputs")
    if not isinstance(inputs, dict) or not set(inputs) <= set(INPUTS):
        raise UserError(f"{path}: microbatches[{i}].inputs: expected a dict with keys among {', '.join(INPUTS)}")
    shapes = {tuple(t.shape) for t in inputs.values() if isinstance(t, torch.Tensor)}
    if len(shapes) > 1 or not all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in inputs.values()):
        raise UserError(f"{path}: microbatches[{i}].inputs: expected [B, T] tensors of one shape")
    if inputs and not {"old_log_prob", "log_prob", "advantages", "response_mask"} <= set(inputs):
        raise UserError(
            f"{path}: microbatches[{i}].inputs: missing old_log_prob, log_prob, advantages or response_mask"
        )
    batch = entry.get("batch", {})
    if not isinstance(batch, dict) or not all(isinstance(v, _PLAIN) for v in batch.values()):
        raise UserError(f"{path}: microbatches[{i}].batch: expected a dict of numbers")


@dataclass
class Replay:
    """One micro-batch's replay: `finding` upstream | op | finite | no inputs; `lines` say it."""

    microbatch: int
    finding: str
    lines: list[str] = field(default_factory=list)
    event: dict | None = None


def replay(doc: dict) -> list[Replay]:
    """Each micro-batch of a checked bundle through verl's ppo_loss under the tracer (the module docstring)."""
    try:
        from verl.workers.utils import losses  # heavy: the installed verl, whose loss replays the bundle
    except ImportError:
        raise UserError("a verl bundle replays through verl's own ppo_loss: install verl (0.9.0) here") from None
    mode = doc.get("report", {}).get("inner_loss_mode") or "vanilla"
    loss_mode = doc.get("config", {}).get("policy_loss", {}).get("loss_mode")
    if loss_mode and loss_mode != "nanscope":
        mode = loss_mode
    return [_one(losses, doc.get("config", {}), entry, mode) for entry in doc["microbatches"]]


def main(source, doc: dict, *, show, save=None) -> int:
    """`nanscope trace` on a checked verl bundle: `show(line)` each line, `save(dict)` the JSON; exit 1 when the loss
    made the first non-finite value, else 0."""
    replays = replay(doc)
    for line in lines(source, doc, replays):
        show(line)
    if save is not None:
        save(to_dict(doc, replays))
    return 1 if any(r.finding == "op" for r in replays) else 0


def lines(source, doc: dict, replays: list[Replay]) -> list[str]:
    """What `nanscope trace` prints for a verl bundle: a head line, then each micro-batch's finding."""
    r = doc["report"]
    head = (
        f"nanscope trace: {source}: verl bundle, rank {r.get('rank')}, update {r.get('rollout_id')} mini-batch "
        f"{r.get('step_id')}, class {r.get('class')}"
    )
    return [head] + ["  " + line for replay in replays for line in replay.lines]


def to_dict(doc: dict, replays: list[Replay]) -> dict:
    """The JSON of a verl bundle's replay (`nanscope trace --json`, key verl_bundle)."""
    return {"report": doc["report"], "microbatches": [vars(r) for r in replays]}


def _one(losses, config: dict, entry: dict, mode: str) -> Replay:
    import torch  # heavy: torch, only a replay needs it

    from nanscope.trace.tracer.locator import Tracer  # heavy: torch

    mb, inputs = entry.get("microbatch"), entry.get("inputs") or {}
    if not inputs:
        return Replay(
            mb, "no inputs", [f"micro-batch {mb}: no loss inputs kept (the run's loss mode was not nanscope)"]
        )
    logp, mask = inputs["log_prob"].float(), inputs["response_mask"].bool()
    bad = ~torch.isfinite(logp)
    if bool(bad.any()):
        sample, token = (int(x) for x in bad.nonzero()[0])
        return Replay(mb, "upstream", [
            f"micro-batch {mb}: the current log-probs the model gave are non-finite ({int(bad.sum())} of "
            f"{logp.numel()}, the first at sample {sample}, response token {token}): the NaN started upstream of the "
            f"loss, in the model (the report's first_forward names the module)"
        ])  # fmt: skip
    data, output, logp = _inputs(inputs, entry.get("batch", {}), mask)
    with Tracer() as tracer:
        loss, _ = losses.ppo_loss(_config(config, mode), output, data)
        loss.backward()
    report = tracer.report()
    event = report.first_forward or report.forward or report.first_backward or report.backward
    if event is None and bool(torch.isfinite(loss)) and bool(torch.isfinite(logp.grad).all()):
        return Replay(
            mb, "finite", [f"micro-batch {mb}: verl's ppo_loss ({mode}) is finite here, forward and backward"]
        )
    shown = event.to_dict() if event is not None and hasattr(event, "to_dict") else None
    where = f"{event.op} ({event.phase}) at {event.source}" if event is not None else "an op the tracer did not name"
    return Replay(mb, "op", [f"micro-batch {mb}: verl's ppo_loss ({mode}) makes the first non-finite value: {where}"],
                  shown)  # fmt: skip


def _inputs(inputs: dict, batch: dict, mask):
    """(data TensorDict, model output, the log-probs leaf) in the layout ppo_loss reads (the module docstring)."""
    import torch  # heavy: torch
    from tensordict import TensorDict  # heavy: verl's dependency

    b, t = mask.shape
    logp = inputs["log_prob"].float().clone().requires_grad_()
    # per sample: a one-token prompt then T response positions; log-prob j sits at sequence position j
    values = torch.cat([logp, torch.zeros(b, 1)], dim=1).reshape(-1)
    offsets = torch.arange(0, b + 1) * (t + 1)
    output = {"log_probs": torch.nested.nested_tensor_from_jagged(values, offsets=offsets)}
    prompts = torch.nested.nested_tensor_from_jagged(torch.zeros(b, dtype=torch.long), offsets=torch.arange(b + 1))
    responses = torch.nested.nested_tensor_from_jagged(
        torch.zeros(b * t, dtype=torch.long), offsets=torch.arange(0, b + 1) * t
    )
    fields = {"response_mask": mask, "old_log_probs": inputs["old_log_prob"].float(),
              "advantages": inputs["advantages"].float(), "prompts": prompts, "responses": responses}  # fmt: skip
    if "rollout_is_weights" in inputs:
        fields["rollout_is_weights"] = inputs["rollout_is_weights"].float()
    from verl.utils import tensordict_utils  # heavy: verl

    data = TensorDict(fields, batch_size=[b])
    tensordict_utils.assign_non_tensor(
        data, dp_size=batch.get("dp_size", 1), batch_num_tokens=batch.get("batch_num_tokens"),
        global_batch_size=batch.get("global_batch_size"), max_response_len=t,
    )  # fmt: skip
    return data, output, logp


def _config(config: dict, mode: str):
    from verl.workers.config import ActorConfig, PolicyLossConfig  # heavy: verl

    policy = {k: v for k, v in (config.get("policy_loss") or {}).items() if k in POLICY_FIELDS and v is not None}
    policy["loss_mode"] = mode
    fields = {k: v for k, v in config.items() if k in CONFIG_FIELDS and v is not None}
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=PolicyLossConfig(
        **policy), **fields)  # fmt: skip

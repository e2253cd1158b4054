"""Writers of synthetic slime v0.1.0 dumps: test fixtures, benchmarks and `nanscope scan --write-demo`.

Everything here writes with plain `torch.save`, in the layout `nanscope.dumps.io` documents and reads:
rollout dumps as `dict(rollout_id, samples=[Sample.to_dict(), ...])` with Python lists, train dumps as
`dict(rollout_id, rank, rollout_data)` with per-key lists of tensors. Nothing here is used to read a dump.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nanscope.errors import UserError


def rollout_sample(
    index: int,
    prompt_len: int,
    response_len: int,
    *,
    reward: float | dict = 1.0,
    rng: np.random.Generator | None = None,
    masked_span: tuple[int, int] | None = None,
    as_lists: bool = True,
) -> dict:
    """One synthetic `Sample.to_dict()`: random token ids, log-probs in [-6, 0), all-ones loss mask.

    Args:
        masked_span: response positions [lo, hi) with loss_mask 0 (like a tool-call result in multi-turn).
        as_lists: plain Python lists, as slime writes them; False gives tensors (faster to write and load).
    """
    import torch

    rng = rng if rng is not None else np.random.default_rng(index)
    tokens = rng.integers(0, 151936, prompt_len + response_len, dtype=np.int64)
    logp = -rng.exponential(0.7, response_len).clip(0, 6)
    mask = np.ones(response_len, dtype=np.int64)
    if masked_span is not None:
        mask[masked_span[0] : masked_span[1]] = 0
    conv = (lambda a: a.tolist()) if as_lists else torch.from_numpy
    return dict(
        index=index,
        prompt="synthetic",
        tokens=conv(tokens),
        response="",
        response_length=response_len,
        label=None,
        reward=reward,
        loss_mask=conv(mask),
        rollout_log_probs=conv(logp),
        status="completed",
        metadata={},
    )


def write_rollout_dump(path: str | Path, samples: list[dict], rollout_id: int = 0) -> Path:
    """Write `samples` (Sample.to_dict()-shaped dicts) the way slime v0.1.0's buffer does."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(dict(rollout_id=rollout_id, samples=samples), path)
    return path


def write_train_dump(path: str | Path, rollout_data: dict, rollout_id: int = 0, rank: int = 0) -> Path:
    """Write a train dump the way slime v0.1.0's actor does (per-key lists in `rollout_data`)."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(dict(rollout_id=rollout_id, rank=rank, rollout_data=rollout_data), path)
    return path


def train_data_from_samples(samples: list[dict], normalised_rewards: list[float]) -> dict:
    """A cp=1 train dump's rollout_data built from rollout samples, with fp32 old/ref log-probs.

    log_probs starts as the rollout log-probs (the trainer agrees with the sampler) and ref_log_probs as
    log_probs; callers plant hazards by editing the tensors. advantages = the normalised reward per token
    (slime's get_grpo_returns with normalize_advantages off).
    """
    import torch

    data: dict[str, list] = {
        k: []
        for k in (
            "tokens",
            "total_lengths",
            "response_lengths",
            "rewards",
            "truncated",
            "loss_masks",
            "sample_indices",
            "rollout_log_probs",
            "log_probs",
            "ref_log_probs",
            "advantages",
        )
    }
    for s, r in zip(samples, normalised_rewards):
        resp = s["response_length"]
        logp = torch.as_tensor(s["rollout_log_probs"], dtype=torch.float32)
        data["tokens"].append(torch.as_tensor(s["tokens"], dtype=torch.long))
        data["total_lengths"].append(len(s["tokens"]))
        data["response_lengths"].append(resp)
        data["rewards"].append(r)
        data["truncated"].append(0)
        data["loss_masks"].append(torch.as_tensor(s["loss_mask"], dtype=torch.int))
        data["sample_indices"].append(s["index"])
        data["rollout_log_probs"].append(logp.to(torch.bfloat16))
        data["log_probs"].append(logp.clone())
        data["ref_log_probs"].append(logp.clone())
        data["advantages"].append(torch.full((resp,), r if math.isfinite(r) else float("nan")))
    return data


# ------------------------------------------------------------------------------------------------- demo


@dataclass(frozen=True)
class Planted:
    """A hazard planted in a demo dump: where it is and which check must find it."""

    kind: str
    sample: int
    token: int | None
    what: str


def write_demo(path: str | Path, kind: str = "rollout", rollout_id: int = 12) -> list[Planted]:
    """Write a small dump (16 samples = 2 GRPO groups of 8, prompt 24 + response 64 tokens, response
    positions 32-47 masked like a tool result) with known hazards planted, and return them.

    Args:
        kind: "rollout" (what --save-debug-rollout-data writes) or "train" (--save-debug-train-data, cp=1).
    """
    rng = np.random.default_rng(1234)
    samples = [rollout_sample(i, 24, 64, reward=float(i % 3 == 0), rng=rng, masked_span=(32, 48)) for i in range(16)]
    samples[9]["rollout_log_probs"][17] = float("nan")
    if kind == "rollout":
        samples[3]["reward"] = float("nan")
        samples[12]["rollout_log_probs"][40] = -100.0
        samples[14]["loss_mask"] = [0] * 64
        write_rollout_dump(path, samples, rollout_id)
        return [
            Planted("nonfinite-reward", 3, None, "reward nan: GRPO spreads it to group 0 (samples 0-7)"),
            Planted("nonfinite-rollout-logprob", 9, 17, "rollout log-prob nan, reaches TIS"),
            Planted("kl-margin", 12, 40, "rollout log-prob -100 on a masked token (bound > 88.72)"),
            Planted("zero-loss-mask", 14, None, "loss mask all zero"),
        ]
    if kind != "train":
        raise UserError(f"--demo-kind {kind}: expected rollout or train")
    import torch

    from nanscope.loss.formulas import grpo_normalize

    rewards = grpo_normalize(torch.tensor([s["reward"] for s in samples]), 8).tolist()
    data = train_data_from_samples(samples, rewards)
    data["log_probs"][9][17] = data["ref_log_probs"][9][17] = -0.5  # the trainer's own log-prob is finite
    data["log_probs"][5][40], data["ref_log_probs"][5][40] = -97.0, -2.0  # ref - logp = 95 > 88.72, masked
    data["log_probs"][7][3], data["rollout_log_probs"][7][3] = -1.0, -95.0  # old - rollout = 94: TIS exp inf
    write_train_dump(path, data, rollout_id, rank=0)
    return [
        Planted("kl-margin", 5, 40, "ref_logp - logp = 95 on a masked token: low_var_kl exp overflows"),
        Planted("tis-margin", 7, 3, "old_logp - rollout_logp = 94: TIS exp is inf (clamped, no NaN)"),
        Planted("nonfinite-rollout-logprob", 9, 17, "rollout log-prob nan, reaches TIS"),
    ]

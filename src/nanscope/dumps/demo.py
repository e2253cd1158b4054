"""Synthetic slime dumps, in any known release's format: tests, benchmarks, `scan --write-demo`.

Synthetic `Sample.to_dict()` dicts with the release's Sample fields (`nanscope.facts.releases`), a train
dump's `rollout_data` built from them, and the demo: a small dump with known hazards planted. They are
written by `nanscope.dumps.writers`, the one writer of each format. tests/slime_releases checks the
samples against each release's own Sample. Nothing here is used to read a dump.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from nanscope.dumps import writers
from nanscope.errors import UserError
from nanscope.facts import releases
from nanscope.loss.formulas import grpo_normalize

# Sample.to_dict() of a fresh Sample, for the fields v0.1.0 does not have (slime/utils/types.py at v0.2.4
# and v0.3.1; spec_info and prefix_cache_info are dataclasses to_dict() turns into dicts).
_SAMPLE_DEFAULTS = {
    "group_index": None,
    "rollout_id": None,
    "multimodal_inputs": None,
    "multimodal_train_inputs": None,
    "multimodal_train_input_id": None,
    "apply_chat_template_kwargs": {},
    "weight_versions": [],
    "rollout_top_p_token_ids": None,
    "rollout_top_p_token_offsets": None,
    "rollout_routed_experts": None,
    "remove_sample": False,
    "teacher_log_probs": None,
    "generate_function_path": None,
    "custom_rm_path": None,
    "train_metadata": None,
    "session_id": None,
    "non_generation_time": 0.0,
    "spec_info": {
        "spec_accept_token_num": 0,
        "spec_draft_token_num": 0,
        "spec_verify_ct": 0,
        "completion_token_num": 0,
    },
    "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
}


def rollout_sample(
    index: int,
    prompt_len: int,
    response_len: int,
    *,
    reward: float | dict = 1.0,
    rng: np.random.Generator | None = None,
    masked_span: tuple[int, int] | None = None,
    as_lists: bool = True,
    release: str = releases.V0_1_0,
) -> dict:
    """One synthetic `Sample.to_dict()`: random token ids, log-probs in [-6, 0), all-ones loss mask.

    Args:
        masked_span: response positions [lo, hi) with loss_mask 0 (like a tool-call result in multi-turn).
        as_lists: plain Python lists, as slime writes them; False gives tensors (faster to write and load).
        release: whose Sample fields the dict has (the fields v0.1.0 lacks at a fresh Sample's values).
    """
    rng = rng if rng is not None else np.random.default_rng(index)
    tokens = rng.integers(0, 151936, prompt_len + response_len, dtype=np.int64)
    logp = -rng.exponential(0.7, response_len).clip(0, 6)
    mask = np.ones(response_len, dtype=np.int64)
    if masked_span is not None:
        mask[masked_span[0] : masked_span[1]] = 0
    conv = (lambda a: a.tolist()) if as_lists else torch.from_numpy
    v0_1_0 = dict(
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
    fields = releases.BY_KEY[release].sample_fields
    return {k: v0_1_0[k] if k in v0_1_0 else _fresh(_SAMPLE_DEFAULTS[k]) for k in fields}


def _fresh(value):
    """A default as a new object per sample (slime's default_factory), never one shared dict or list."""
    return type(value)(value) if isinstance(value, (dict, list)) else value


def train_data_from_samples(
    samples: list[dict], normalised_rewards: list[float], release: str = releases.V0_1_0
) -> dict:
    """A cp=1 train dump's rollout_data built from rollout samples, with fp32 old/ref log-probs.

    log_probs starts as the rollout log-probs (the trainer agrees with the sampler) and ref_log_probs as
    log_probs; callers plant hazards by editing the tensors. advantages = returns = the normalised reward
    per token (slime's get_grpo_returns with normalize_advantages off). rollout_log_probs are in the
    release's dtype; v0.3.1 and main add the rollout ids, per-rollout mask sums and the step schedule.
    """
    target = releases.BY_KEY[release]
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[target.rollout_logprob_dtype]

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
    for s, reward in zip(samples, normalised_rewards):
        resp = s["response_length"]
        logp = torch.as_tensor(s["rollout_log_probs"], dtype=torch.float32)
        data["tokens"].append(torch.as_tensor(s["tokens"], dtype=torch.long))
        data["total_lengths"].append(len(s["tokens"]))
        data["response_lengths"].append(resp)
        data["rewards"].append(reward)
        data["truncated"].append(0)
        data["loss_masks"].append(torch.as_tensor(s["loss_mask"], dtype=torch.int))
        data["sample_indices"].append(s["index"])
        data["rollout_log_probs"].append(logp.to(dtype))
        data["log_probs"].append(logp.clone())
        data["ref_log_probs"].append(logp.clone())
        data["advantages"].append(torch.full((resp,), reward if math.isfinite(reward) else float("nan")))
    data["returns"] = list(data["advantages"])  # the same tensors, as slime's GRPO branch keeps them
    data["raw_reward"] = [s["reward"] for s in samples]
    if target.train_keys or target.train_layout == "samples":  # v0.3.1 on (ray/rollout.py:743-777, :887-889)
        n = len(samples)
        data["rollout_ids"] = list(range(n))
        data["rollout_mask_sums"] = torch.tensor([float(sum(s["loss_mask"])) for s in samples])
        data["global_batch_sizes"], data["num_microbatches"], data["micro_batch_indices"] = [n], [1], [list(range(n))]
    if target.train_layout == "samples":  # main keeps each sample's position in the rollout (actor.py:540)
        data["partition"] = list(range(len(samples)))
    return data


# ------------------------------------------------------------------------------------------------- demo


@dataclass(frozen=True)
class Planted:
    """A hazard planted in a demo dump: where it is and which check must find it."""

    kind: str
    sample: int
    token: int | None
    what: str


DEMO_ROLLOUT = 12  # the demo's rollout_id where its file name gives none


def write_demo(
    path: str | Path, kind: str = "rollout", rollout_id: int = DEMO_ROLLOUT, release: str = releases.V0_1_0
) -> list[Planted]:
    """Write a small dump (16 samples = 2 GRPO groups of 8, prompt 24 + response 64 tokens, response
    positions 32-47 masked like a tool result) with known hazards planted, and return them.

    Args:
        kind: "rollout" (what --save-debug-rollout-data writes) or "train" (--save-debug-train-data, cp=1).
        rollout_id: the id the dump stores (`scan --write-demo` passes the one the file's name gives).
        release: whose format (nanscope.facts.releases key); the planted hazards are the same in each.
    """
    if kind == "rollout":
        samples, planted = demo_rollout(release)
        writers.write_rollout_dump(path, samples, rollout_id)
        return planted
    if kind != "train":
        raise UserError(f"--demo-kind {kind}: expected rollout or train")
    data, planted = demo_train(release)
    writers.write_train_dump(path, data, rollout_id, rank=0, release=release)
    return planted


def _demo_samples(release: str) -> list[dict]:
    rng = np.random.default_rng(1234)
    samples = [
        rollout_sample(i, 24, 64, reward=float(i % 3 == 0), rng=rng, masked_span=(32, 48), release=release)
        for i in range(16)
    ]
    samples[9]["rollout_log_probs"][17] = float("nan")
    return samples


def demo_rollout(release: str = releases.V0_1_0) -> tuple[list[dict], list[Planted]]:
    """The demo rollout dump's samples (Sample.to_dict() dicts of `release`) and the hazards planted in them."""
    samples = _demo_samples(release)
    samples[3]["reward"] = float("nan")
    samples[12]["rollout_log_probs"][40] = -100.0
    samples[14]["loss_mask"] = [0] * 64
    return samples, [
        Planted("nonfinite-reward", 3, None, "reward nan: GRPO spreads it to group 0 (samples 0-7)"),
        Planted("nonfinite-rollout-logprob", 9, 17, "rollout log-prob nan, reaches TIS"),
        Planted("kl-margin", 12, 40, "rollout log-prob -100 on a masked token (bound > 88.72)"),
        Planted("zero-loss-mask", 14, None, "loss mask all zero"),
    ]


def demo_train(release: str = releases.V0_1_0) -> tuple[dict, list[Planted]]:
    """The demo train dump's rollout_data (as `release`'s actor holds it, cp=1) and the hazards planted in it."""
    samples = _demo_samples(release)
    rewards = grpo_normalize(torch.tensor([s["reward"] for s in samples]), 8).tolist()
    data = train_data_from_samples(samples, rewards, release)
    data["log_probs"][9][17] = data["ref_log_probs"][9][17] = -0.5  # the trainer's own log-prob is finite
    data["log_probs"][5][40], data["ref_log_probs"][5][40] = -97.0, -2.0  # ref - logp = 95 > 88.72, masked
    data["log_probs"][7][3], data["rollout_log_probs"][7][3] = -1.0, -95.0  # old - rollout = 94: TIS exp inf
    return data, [
        Planted("kl-margin", 5, 40, "ref_logp - logp = 95 on a masked token: low_var_kl exp overflows"),
        Planted("tis-margin", 7, 3, "old_logp - rollout_logp = 94: TIS exp is inf (clamped, no NaN)"),
        Planted("nonfinite-rollout-logprob", 9, 17, "rollout log-prob nan, reaches TIS"),
    ]


# ----------------------------------------------------------------------------------- a drifting run

# The drifting run's per-rollout steps: the KL log-ratio of one masked tool token, the train-rollout gap on
# one sample's trained tokens (bf16-exact values, so the series are exact in every release's format).
DRIFT_KL_STEP = 18.0
DRIFT_GAP_STEP = 0.25
DRIFT_KL_AT = (5, 40)  # sample, response token (masked: positions 32-47 are a tool result)
DRIFT_GAP_SAMPLE = 2
DRIFT_ROLLOUTS = 6  # rollouts 0-5: the KL log-ratio 0, 18, ..., 90, past 88.72 at the last


def drifting_run_paths(directory: str | Path, rollouts: int = DRIFT_ROLLOUTS) -> list[Path]:
    """The files `write_drifting_run` writes, in its order: rollout i's rollout dump, then its train dump."""
    directory = Path(directory)
    paths = []
    for i in range(rollouts):
        paths.append(directory / "rollout_data" / f"{i}.pt")
        if i < rollouts - 1:
            paths.append(directory / "train_data" / f"{i}_0.pt")
    return paths


def write_drifting_run(
    directory: str | Path,
    rollouts: int = DRIFT_ROLLOUTS,
    release: str = releases.V0_1_0,
    opener: Callable[[Path], ContextManager[str | Path | BinaryIO]] | None = None,
) -> list[Path]:
    """Write a run's dumps whose log-ratio drifts towards fp32's exp overflow, and return their paths
    (`drifting_run_paths`).

    `opener(path)` is a context manager giving what each writer writes to, a path or a binary file (`scan
    --write-demo`: a buffer, written whole once every dump is serialised); default: `path` itself.

    Rollout i (0 <= i < rollouts) has a rollout dump `rollout_data/{i}.pt` and, but for the last one (slime
    writes a train dump after the rollout's training, and the last rollout's training is the one that
    fails), a train dump `train_data/{i}_0.pt`. The demo's 16 samples (prompt 24, response 64, positions
    32-47 masked) have every log-prob -0.5, but for:

        sample 5, token 40 (masked)  log_probs = rollout_log_probs = -(1 + 18 i), ref_log_probs = -1:
                                     KL log-ratio 18 i, bound -rollout 1 + 18 i (91 > 88.72 at i = 5)
        sample 2, trained tokens     rollout_log_probs = -0.5 - 0.25 i: gap and TIS log-ratio 0.25 i
    """
    opener = opener or contextlib.nullcontext  # the writers make the directories
    targets = iter(drifting_run_paths(directory, rollouts))
    for i in range(rollouts):
        samples = [
            rollout_sample(j, 24, 64, reward=float(j % 3 == 0), masked_span=(32, 48), release=release)
            for j in range(16)
        ]
        for s in samples:
            s["rollout_log_probs"] = [-0.5] * 64
        trained = [t for t in range(64) if not 32 <= t < 48]
        for t in trained:
            samples[DRIFT_GAP_SAMPLE]["rollout_log_probs"][t] = -0.5 - DRIFT_GAP_STEP * i
        sample, token = DRIFT_KL_AT
        samples[sample]["rollout_log_probs"][token] = -(1.0 + DRIFT_KL_STEP * i)
        with opener(next(targets)) as path:
            writers.write_rollout_dump(path, samples, rollout_id=i)
        if i == rollouts - 1:
            break
        rewards = grpo_normalize(torch.tensor([s["reward"] for s in samples]), 8).tolist()
        data = train_data_from_samples(samples, rewards, release)
        data["log_probs"][DRIFT_GAP_SAMPLE][trained] = -0.5
        data["ref_log_probs"][DRIFT_GAP_SAMPLE][trained] = -0.5
        data["ref_log_probs"][sample][token] = -1.0
        with opener(next(targets)) as path:
            writers.write_train_dump(path, data, rollout_id=i, rank=0, release=release)
    return drifting_run_paths(directory, rollouts)

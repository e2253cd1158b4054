"""torchrun worker (2 processes, gloo): a slime checkout's own loss_function with its own policy loss,
then with nanscope's plugin as the custom loss, on the same batches, under megatron-core's real
parallel state with CP 1 (DP 2) and CP 2.

    python -m torch.distributed.run --nproc-per-node 2 tests/slime_releases/worker.py \\
        --slime-src /tmp/slime/v0.3.1 --out /tmp/out

Each rank writes out/rank<R>.json: one record per (configuration, CP size) with the relative
differences plugin vs release (healthy batches), or the finiteness of both (hazard batches), and on
v0.1.0 nanscope.loss.safe (the CPU harness's fix) vs the plugin through slime v0.1.0.
torch.compile is disabled (TORCHDYNAMO_DISABLE=1) unless --compile: both sides then run slime's
compiled helpers eagerly, op for op the same.
"""

import argparse
import copy
import inspect
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.slime_releases

from nanscope.facts.paths import LOSS_FUNCTION_PATH  # noqa: E402
from tests.slime_releases.standins import load_loss_module  # noqa: E402

ORDER = ("v0.1.0", "v0.2.4", "v0.3.1", "main")
PLUGIN = LOSS_FUNCTION_PATH
ICEPOP = "slime.backends.megatron_utils.loss.icepop_function"
OUTSIDE_TIS = "__main__.outside_tis"
MASKED = ("kl-exp-overflow", "ratio-exp-overflow", "nan-rollout-logprob", "inf-ref-logprob")  # hazard on a masked token
CASE = dict(use_kl_loss=True, kl_loss_type="low_var_kl", kl_loss_coef=0.0, use_tis=True)


@dataclass(frozen=True)
class Config:
    """One configuration: slime flags over the release's defaults, batch options, hazard (None: healthy)."""

    name: str
    flags: dict = field(default_factory=dict)
    since: str = "v0.1.0"
    hazard: str | None = None
    int_masks: bool = False
    grouped_sums: bool = False
    top_p: bool = False
    breaks_release: bool = True  # a hazard: the release's own loss is non-finite on it (on some CP rank)


HEALTHY = [
    Config("defaults"),
    Config("case-flags", CASE),
    Config("kl-default-type", dict(use_kl_loss=True, kl_loss_coef=0.01)),
    Config("k2", dict(use_kl_loss=True, kl_loss_type="k2", kl_loss_coef=0.01)),
    Config("k3", dict(use_kl_loss=True, kl_loss_type="k3", kl_loss_coef=0.01)),
    Config("low-var-kl", dict(use_kl_loss=True, kl_loss_type="low_var_kl", kl_loss_coef=0.01)),
    Config("entropy", dict(entropy_coef=0.001)),
    Config("per-token-loss", dict(calculate_per_token_loss=True)),
    Config("tis", dict(use_tis=True, tis_clip_low=0.1)),
    Config("gspo", dict(advantage_estimator="gspo")),
    Config("int-loss-masks", CASE, int_masks=True),
    Config("eps-clip-c", dict(eps_clip_c=3.0)),
    Config("icepop", dict(use_tis=True, custom_tis_function_path=ICEPOP, tis_clip_low=0.5), since="v0.2.4"),
    Config("use-rollout-logprobs", dict(use_rollout_logprobs=True), since="v0.2.4"),
    Config("opsm", dict(use_opsm=True), since="v0.2.4"),
    Config("mismatch-metrics", dict(get_mismatch_metrics=True), since="v0.2.4"),
    Config(
        "unbiased-kl",
        dict(use_kl_loss=True, kl_loss_type="low_var_kl", kl_loss_coef=0.01, use_unbiased_kl=True),
        since="v0.2.4",
    ),
    Config("recompute-loss-function", dict(CASE, recompute_loss_function=True), since="v0.2.4"),
    Config("custom-tis-outside-slime", dict(use_tis=True, custom_tis_function_path=OUTSIDE_TIS), since="v0.2.4"),
    Config("cispo", dict(advantage_estimator="cispo", eps_clip=1.0, eps_clip_high=0.28), since="v0.3.1"),
    Config("grouped-rollout-mask-sums", CASE, since="v0.3.1", grouped_sums=True),
    Config("rollout-top-p", dict(rollout_top_p=0.9), since="v0.3.1", top_p=True),
]

HAZARDS = [
    Config("kl-exp-overflow", CASE, hazard="kl-exp-overflow"),
    Config("kl-exp-overflow k3 int-masks", dict(CASE, kl_loss_type="k3"), hazard="kl-exp-overflow", int_masks=True),
    Config("ratio-exp-overflow", {}, hazard="ratio-exp-overflow"),
    Config("nan-rollout-logprob", CASE, hazard="nan-rollout-logprob"),
    Config("nan-reward", CASE, hazard="nan-reward"),
    Config("nan-old-logprob", {}, hazard="nan-old-logprob"),
    Config("inf-ref-logprob", CASE, hazard="inf-ref-logprob"),
    Config("gspo nan-old-logprob", dict(advantage_estimator="gspo"), hazard="nan-old-logprob"),
    Config(
        "unbiased-kl ratio-exp-overflow", dict(CASE, use_unbiased_kl=True), since="v0.2.4", hazard="ratio-exp-overflow"
    ),
    Config(
        "icepop nan-rollout-logprob",
        dict(CASE, custom_tis_function_path=ICEPOP),
        since="v0.2.4",
        hazard="nan-rollout-logprob",
    ),
    Config(
        "mismatch-metrics nan-rollout-logprob",
        dict(get_mismatch_metrics=True),
        since="v0.2.4",
        hazard="nan-rollout-logprob",
    ),
    Config(
        "use-rollout-logprobs nan-rollout-logprob",
        dict(use_rollout_logprobs=True),
        since="v0.2.4",
        hazard="nan-rollout-logprob",
    ),
    Config(
        "custom-tis-outside-slime nan-rollout-logprob",
        dict(CASE, custom_tis_function_path=OUTSIDE_TIS),
        since="v0.2.4",
        hazard="nan-rollout-logprob",
    ),
    Config("opsm nan-reward", dict(use_opsm=True), since="v0.2.4", hazard="nan-reward"),
    Config(
        "recompute kl-exp-overflow", dict(CASE, recompute_loss_function=True), since="v0.2.4", hazard="kl-exp-overflow"
    ),
    # cispo stops the gradient at its clipped ratio, so the overflow stays out of the backward
    Config(
        "cispo ratio-exp-overflow",
        dict(advantage_estimator="cispo"),
        since="v0.3.1",
        hazard="ratio-exp-overflow",
        breaks_release=False,
    ),
    Config("cispo nan-old-logprob", dict(advantage_estimator="cispo"), since="v0.3.1", hazard="nan-old-logprob"),
    Config(
        "top-p kl-exp-overflow", dict(CASE, rollout_top_p=0.9), since="v0.3.1", hazard="kl-exp-overflow", top_p=True
    ),
]


def outside_tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    """A user's TIS function outside slime's loss module (--custom-tis-function-path): its own exp."""
    ratio = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))
    weights = ratio.clamp(0.5, 1.5)
    return pg_loss * weights, loss_masks, {"tis": ratio.detach(), "tis_clipfrac": (weights != ratio).float()}


def release_defaults(release: str) -> dict:
    """The args slime's parser and validation give the loss path (arguments.py at each tag).

    rollout_temperature is the case's (0.8), the temperature of the batches' log-probs (nanscope.hazards).
    """
    d = dict(
        loss_type="policy_loss", custom_loss_function_path=None, advantage_estimator="grpo", rollout_temperature=0.8,
        eps_clip=0.2, eps_clip_high=0.2, eps_clip_c=None, use_kl_loss=False, kl_loss_coef=0.0,
        kl_loss_type="kl" if release == "v0.1.0" else "k1", kl_coef=0.0, entropy_coef=0.0, use_tis=False,
        tis_clip=2.0, tis_clip_low=0.0, calculate_per_token_loss=False, global_batch_size=8,
    )  # fmt: skip
    if release != "v0.1.0":
        d.update(
            qkv_format="thd", allgather_cp=False, log_probs_chunk_size=-1, use_rollout_logprobs=False,
            use_opsm=False, opsm_delta=1e-4, get_mismatch_metrics=False, custom_tis_function_path=None,
            use_unbiased_kl=False, recompute_loss_function=False, rollout_top_p=1.0,
        )  # fmt: skip
    return d


def build_batch(cfg: Config, seed: int = 0, defused: bool = False) -> tuple[dict, torch.Tensor]:
    """A case-shaped micro-batch (8 samples, vocab 512) and its packed logits [1, S, V] (whole sequences).

    defused: the hazard's twin, the same batch without the trigger value (nanscope.hazards.build).
    """
    from nanscope import case, hazards
    from nanscope.causes import catalogue

    policy = hazards.synthetic_policy(512, seed)
    planted = cfg.hazard if cfg.hazard in catalogue.BY_NAME else "healthy"
    batch = hazards.build(planted, policy, case.rollout(512, seed), seed, defused=defused)
    g = torch.Generator().manual_seed(seed + 7)
    if cfg.hazard is None:  # old != current policy, so ratios, clipping and OPSM have something to do
        batch["log_probs"] = [x + 0.3 * torch.randn(x.shape, generator=g) for x in batch["log_probs"]]
    elif cfg.hazard == "nan-old-logprob" and not defused:
        batch["log_probs"][2][0] = float("nan")  # a trained token (loss_mask 1)
    elif cfg.hazard == "inf-ref-logprob" and not defused:
        i = 1
        j = int((batch["loss_masks"][i] == 0).nonzero()[0])
        batch["ref_log_probs"][i][j] = float("inf")
    if cfg.int_masks:
        batch["loss_masks"] = [m.int() for m in batch["loss_masks"]]
    group = 4 if cfg.grouped_sums else 1  # samples per rollout id
    sums = [float(m.sum()) for m in batch["loss_masks"]]
    firsts = [i - i % group for i in range(len(sums))]
    batch["rollout_mask_sums"] = torch.tensor([sum(sums[f : f + group]) for f in firsts])
    logits = hazards.packed_logits(policy, batch["unconcat_tokens"])
    if cfg.top_p:  # the nucleus of each response token: itself and the policy's 5 most likely tokens
        ids, offsets, start = [], [], 0
        for tokens, r in zip(batch["unconcat_tokens"], batch["response_lengths"]):
            rows = logits[0, start + tokens.numel() - r - 1 : start + tokens.numel() - 1]  # [r, V]
            top = rows.topk(5, dim=-1).indices  # [r, 5]
            ids.append(torch.cat([tokens[-r:, None], top], dim=-1).flatten().int())
            offsets.append(torch.arange(0, 6 * (r + 1), 6, dtype=torch.int32))
            start += tokens.numel()
        batch["rollout_top_p_token_ids"], batch["rollout_top_p_token_offsets"] = ids, offsets
    for key in ("rewards", "hazard_site"):
        batch.pop(key)
    return batch, logits


def run(loss_function, args, batch, full: torch.Tensor, cp_size: int):
    """One forward + backward through `loss_function` on this rank's slice; (loss, d loss/d full, keys, values)."""
    from megatron.core import parallel_state as ps

    from nanscope.loss import microbatch
    from nanscope.loss.microbatch import Parallel

    par = Parallel(cp_rank=ps.get_context_parallel_rank(), cp_size=cp_size)
    full = full.clone().requires_grad_(True)
    local = microbatch.cp_local_logits(full, batch["total_lengths"], par) if cp_size > 1 else full
    batch = copy.deepcopy(microbatch.slice_for_cp(batch, par))
    params = inspect.signature(loss_function).parameters
    extra = (8,) if "step_global_batch_size" in params else ()
    loss, _, log = loss_function(args, batch, 1, *extra, local)
    loss.backward()  # megatron's schedule calls backward; v0.2's reentrant checkpoint refuses autograd.grad
    return loss.detach().double(), full.grad.double(), list(log["keys"]), log["values"].double()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 when equal, inf when only one is finite)."""
    if torch.equal(a, b):
        return 0.0
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def finite(result) -> bool:
    loss, grad, _, values = result
    return bool(torch.isfinite(loss) and torch.isfinite(grad).all() and torch.isfinite(values).all())


def compare(ref, got) -> dict:
    """Relative differences of loss, gradient and each of the reference's metrics."""
    n = len(ref[2])
    assert got[2][:n] == ref[2], (got[2], ref[2])
    metrics = {k: rel(got[3][1 + i], ref[3][1 + i]) for i, k in enumerate(ref[2])}
    return {"loss": rel(got[0], ref[0]), "grad": rel(got[1], ref[1]), "metrics": metrics, "keys": got[2]}


def evaluate(module, release: str, cfg: Config, cp_size: int) -> dict:
    args = argparse.Namespace(**{**release_defaults(release), **cfg.flags})
    plugin_args = copy.copy(args)
    plugin_args.loss_type, plugin_args.custom_loss_function_path = "custom_loss", PLUGIN
    batch, full = build_batch(cfg)
    own = run(module.loss_function, args, batch, full, cp_size)
    plugin = run(module.loss_function, plugin_args, batch, full, cp_size)
    record = {
        "config": cfg.name,
        "cp": cp_size,
        "hazard": cfg.hazard,
        "breaks_release": cfg.breaks_release,
        "release_finite": finite(own),
        "plugin_finite": finite(plugin),
        "release_metrics": dict(zip(own[2], own[3][1:].tolist())),
        "plugin_metrics": dict(zip(plugin[2], plugin[3][1:].tolist())),
    }
    if cfg.hazard is None:
        record.update(compare(own, plugin))
    elif cfg.hazard in MASKED:  # a masked token: the plugin's step is the release's own on the defused twin
        twin, twin_full = build_batch(cfg, defused=True)
        defused = run(module.loss_function, args, twin, twin_full, cp_size)
        record["vs_defused"] = {"loss": rel(plugin[0], defused[0]), "grad": rel(plugin[1], defused[1])}
    return record


def evaluate_model(module, cfg: Config, cp_size: int) -> dict:
    """v0.1.0 only: nanscope.loss.safe (as_is in the plugin's guard) vs the plugin through slime v0.1.0."""
    from nanscope.loss import safe

    args = argparse.Namespace(**{**release_defaults("v0.1.0"), **cfg.flags})
    plugin_args = copy.copy(args)
    plugin_args.loss_type, plugin_args.custom_loss_function_path = "custom_loss", PLUGIN
    batch, full = build_batch(cfg)
    slime_path = run(module.loss_function, plugin_args, batch, full, cp_size)
    model_path = run(safe.loss_function, args, batch, full, cp_size)
    return {"config": cfg.name, "cp": cp_size, "hazard": cfg.hazard, **compare(slime_path, model_path)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--slime-src", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--only", default=None, help="run only configurations whose name contains this")
    a = p.parse_args()
    if not a.compile:
        os.environ["TORCHDYNAMO_DISABLE"] = "1"
    dist.init_process_group("gloo")
    from megatron.core import parallel_state as ps

    from nanscope.loss import target as releases
    from nanscope.megatron import cpu

    cpu.install()
    module = load_loss_module(a.slime_src)
    release = releases.identify().name.split(" ")[0]
    records = []
    for cp_size in (1, 2):
        ps.initialize_model_parallel(context_parallel_size=cp_size)
        for cfg in HEALTHY + HAZARDS:
            if ORDER.index(cfg.since) <= ORDER.index(release) and (a.only is None or a.only in cfg.name):
                records.append({"kind": "plugin", **evaluate(module, release, cfg, cp_size)})
                if release == "v0.1.0" and cfg.flags.get("advantage_estimator") != "gspo":
                    records.append({"kind": "model", **evaluate_model(module, cfg, cp_size)})
        ps.destroy_model_parallel()
    out = {"release": releases.identify().name, "records": records}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"rank{dist.get_rank()}.json").write_text(json.dumps(out, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

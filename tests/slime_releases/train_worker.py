"""torchrun worker (2 processes, TP 2, gloo): slime v0.1.0's own train() and train_one_step with nanscope's hook.

    python -m torch.distributed.run --nproc-per-node 2 tests/slime_releases/train_worker.py \\
        --slime-src /tmp/slime/v0.1.0 --out /tmp/out [--only NAME]

What runs is slime v0.1.0's: `setup_model_and_optimizer` (megatron's DDP with slime's DDP config, megatron's
distributed optimizer, bf16 under Float16Module, the LR scheduler), `get_data_iterator` (real DataIterators,
micro-batch size 1), `train()` (its wiring of finalize_model_grads and the loss scale, its wandb logging) and
the `train_one_step` it calls, with `--loss-type policy_loss` (slime's own loss) and
`--custom-megatron-before-train-step-hook-path nanscope.slime_plugin.before_train_step`. The stand-ins are
`standins.load_model_module`'s (megatron.training's names and a recording wandb). The model is the CPU
harness's tiny Qwen3-MoE (4 layers, 8 experts), one rollout group of 8 case-shaped samples per rollout
(`nanscope.case.rollout`, `nanscope.hazards.build` against the model itself), one optimizer step per rollout.

Scenarios (each on a freshly built model, same seed; SCENARIOS below), all with the plugin's default raise mode
and rerun unless said:

    observe_only      a healthy step without the hook, then with it: slime's loss, gradients, metrics
    kl_hazard         the case's kl-exp-overflow: the report, its bundle against slime's own log-prob helper on
                      the same logits, the rerun's verdict, the error
    one_time_fault    a NaN in FAULT's forward output at its first call of the step, on FAULT_RANK only
    persistent_fault  the same NaN at every call
    skip_transient    NANSCOPE_ON_NONFINITE=skip, NANSCOPE_SKIP_ON=transient: [one-time fault, healthy, KL hazard]
    plugin_loss       the hook and the plugin's loss (--loss-type custom_loss) over [a masked NaN rollout log-prob,
                      healthy]: the guard's counters logged once a step as nanscope/nan_guard/*
    drift             the KL log-ratio of a masked tool token grows by 22 a rollout (DRIFT) until slime's step dies

Each rank writes out/rank<R>.json: per scenario what train_one_step returned or raised per rollout, the
plugin's reports, logged metrics and `nanscope...` stdout lines, what reached wandb.log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.slime_releases

HOOK = "nanscope.slime_plugin.before_train_step"
SEQ = 128  # slime's get_batch pads a micro-batch to a multiple of 128; every case sample is shorter
SEEDS = {"healthy": 1, "later": 3}
FAULT = "decoder.layers.1.mlp"  # the one-time fault's module (forward output), on FAULT_RANK only
FAULT_RANK = 1
DRIFT = [12.0 + 22.0 * r for r in range(6)]  # the masked tool token's KL log-ratio ref - logp, per rollout
PLUGIN_ENV = ("NANSCOPE_REPORT_DIR", "NANSCOPE_ON_NONFINITE", "NANSCOPE_SKIP_ON", "NANSCOPE_RERUN")


class Run:
    """One scenario's model, optimizer, scheduler and what was observed, on this rank."""

    def __init__(self, w, hook: bool, fault: str | None = None):
        import torch
        from megatron.core import tensor_parallel

        self.w = w
        self.args = w.args(hook)
        w.megatron_training.set_args(self.args)
        torch.manual_seed(0)
        tensor_parallel.model_parallel_cuda_manual_seed(0, force_reset_rng=True)
        self.model, self.optimizer, self.scheduler = w.slime.setup_model_and_optimizer(self.args)
        # slime v0.1.0 returns the last of the chained optimizers (its variable shadowing, model.py:142, fixed by
        # slime#963): that one is what slime's train_one_step and the hook get. The scheduler holds them all.
        for chained in self.scheduler.optimizer.chained_optimizers:
            _torch_adam_step(chained.optimizer)
        self.steps: list[dict] = []  # what each train_one_step returned, or raised
        self.grads: dict | None = None  # every parameter's main_grad at the last optimizer step
        self.logits: list = []  # the last chunk's output of each training forward (the loss's logits)
        self.armed = False  # a "once" fault fires at the next training forward of the planted module
        wrapped = self.optimizer.step

        def step(*a, **k):  # observes only: the gradients megatron's optimizer is about to apply
            self.grads = {n: p.main_grad.detach().clone() for n, p in self.model[0].named_parameters()}
            return wrapped(*a, **k)

        self.optimizer.step = step
        self.model[0].register_forward_hook(self._keep_logits)
        if fault is not None:
            self._plant(fault)

    def _keep_logits(self, module, args, output):
        if module.training:
            self.logits.append(output.detach().clone())

    def _plant(self, when: str):
        """A NaN in FAULT's forward output on FAULT_RANK only: at its first training call after `armed` ("once"),
        or at every training call ("always")."""
        import torch.distributed as dist

        from nanscope.megatron import faults

        if dist.get_rank() != FAULT_RANK:
            return
        chunk = self.model[0]

        def active() -> bool:
            if when == "always":
                return chunk.training
            if self.armed and chunk.training:
                self.armed = False
                return True
            return False

        handles = faults.plant(chunk, faults.Fault(FAULT, "forward", "nan"), 0, active)
        assert handles, f"no module {FAULT}"

    def policy(self, tokens):
        """The model as hazards.Policy: full-vocab logits [total, V] per sample (a TP collective, eval mode)."""
        import torch
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        chunk, out = self.model[0], []
        chunk.eval()
        with torch.no_grad():
            for t in tokens:
                ids = torch.nn.functional.pad(t, (0, SEQ - t.numel())).unsqueeze(0)
                logits = chunk(input_ids=ids, position_ids=None, attention_mask=None, labels=None)
                out.append(gather_from_tensor_model_parallel_region(logits.float())[0, : t.numel()].clone())
        chunk.train()
        return out

    def rollout(self, hazard: str, seed: int, drift: float | None = None) -> tuple[dict, tuple | None]:
        """One rollout's data as slime v0.1.0's process_rollout_data leaves it on this rank (DP 1: all of it), and
        the hazard's (sample, response position)."""
        import torch

        from nanscope import case, hazards
        from nanscope.megatron.model import TinyQwen3MoE

        batch = hazards.build(hazard, self.policy, case.rollout(TinyQwen3MoE().vocab_size, seed), seed)
        site = batch["hazard_site"]
        if drift is not None:  # the first masked (tool-output) token of sample 0: ref - logp = drift
            j = int((batch["loss_masks"][0] == 0).nonzero()[0])
            batch["ref_log_probs"][0][j] = batch["log_probs"][0][j] + drift
            site = (0, j)
        data = {
            "tokens": batch["unconcat_tokens"],
            "total_lengths": batch["total_lengths"],
            "response_lengths": batch["response_lengths"],
            "loss_masks": [m.to(torch.int) for m in batch["loss_masks"]],  # data.py:137
            "log_probs": batch["log_probs"],
            "ref_log_probs": batch["ref_log_probs"],
            "rollout_log_probs": batch["rollout_log_probs"],  # bf16, data.py:148
            "advantages": batch["advantages"],
        }
        return data, site

    def train(self, rollout_id: int, data: dict) -> dict:
        """slime's train() over one rollout (one step): what its train_one_step returned, or the error it raised."""
        slime = self.w.slime
        data_iterator, num_microbatches = self.w.data.get_data_iterator(self.args, self.model, data)
        real = slime.train_one_step
        record = {"rollout_id": rollout_id}

        def train_one_step(*a, **k):  # observes only: slime's train() looks train_one_step up here
            loss, grad_norm = real(*a, **k)
            record.update(loss=loss, grad_norm=float(grad_norm))
            return loss, grad_norm

        slime.train_one_step = train_one_step
        try:
            slime.train(rollout_id, self.model, self.optimizer, self.scheduler, data_iterator, num_microbatches)
        except Exception as e:
            record["error"] = f"{type(e).__name__}: {e}"
            record["error_type"] = type(e).__name__
            record["message"] = str(e)
            record["traceback"] = traceback.format_exc()
        finally:
            slime.train_one_step = real
        record["lr_steps"] = self.scheduler.num_steps
        self.steps.append(record)
        return record


def _torch_adam_step(optimizer) -> None:
    """The `step` entry torch's Adam keeps per parameter, where megatron-core's init_state_fn left none.

    slime calls megatron's init_state_fn eagerly (model.py:142-145); it fills exp_avg and exp_avg_sq as
    TransformerEngine's and Apex's FusedAdam expect (optimizer/__init__.py:376). Without them (this CPU box)
    megatron falls back to torch.optim.Adam, whose lazy init skips a non-empty state and then reads its `step`.
    This puts there what torch's own init would (a CPU float 0), so the first step is Adam's first step.
    """
    import torch

    for state in optimizer.state.values():
        if state and "step" not in state:
            state["step"] = torch.tensor(0.0)


class Worker:
    def __init__(self, checkout: Path, out: Path):
        import torch.distributed as dist

        from tests.slime_releases import standins

        self.out, self.rank = out, dist.get_rank()
        self.slime, self.wandb = standins.load_model_module(checkout)
        self.megatron_training = sys.modules["megatron.training"]
        from slime.backends.megatron_utils import data, loss

        self.loss, self.data = loss, data
        self.own_helper = loss.get_log_probs_and_entropy  # slime's own, before the plugin wraps it

    def args(self, hook: bool):
        import torch

        from nanscope import case
        from nanscope.megatron.model import TinyQwen3MoE

        sizes = TinyQwen3MoE()
        args = case.args(global_batch_size=8)  # the case's loss flags: low_var_kl at coef 0, TIS, GRPO
        vars(args).update(
            # train_one_step, train, get_data_iterator
            custom_megatron_before_train_step_hook_path=HOOK if hook else None,
            seq_length=SEQ, micro_batch_size=1, decoder_seq_length=None, rollout_batch_size=1, num_rollout=8,
            use_dynamic_batch_size=False, max_tokens_per_gpu=None, overlap_grad_reduce=False, align_grad_reduce=True,
            overlap_param_gather=False, align_param_gather=False, manual_gc=False, use_wandb=True, ci_test=False,
            # setup_model_and_optimizer: slime's DDP and optimizer configs are read from these by name
            moe_use_upcycling=False, load="(nothing: megatron_training.load_checkpoint)", pretrained_checkpoint=None,
            offload=False, use_distributed_optimizer=True, accumulate_allreduce_grads_in_fp32=True,
            check_for_large_grads=False, ddp_bucket_size=None, ddp_pad_buckets_for_high_nccl_busbw=False,
            ddp_average_in_collective=False, overlap_param_gather_with_optimizer_step=False,
            enable_gloo_process_groups=False, optimizer="adam", lr=1e-6, min_lr=0.0, weight_decay=0.1,
            adam_beta1=0.9, adam_beta2=0.98, adam_eps=1e-8, clip_grad=1.0, bf16=True, fp16=False,
            params_dtype=torch.bfloat16,
            lr_decay_iters=None, lr_wsd_decay_iters=None, lr_warmup_fraction=None, lr_warmup_iters=0,
            lr_warmup_init=0.0, lr_decay_style="linear", start_weight_decay=0.1, end_weight_decay=0.1,
            weight_decay_incr_style="constant", use_checkpoint_opt_param_scheduler=False,
            override_opt_param_scheduler=False, lr_wsd_decay_style="exponential",
            # slime's model provider (model_provider.py)
            transformer_impl="local", record_memory_history=False,
            spec=("tests.slime_releases.megatron_training", "layer_spec"), num_experts=sizes.num_experts,
            num_layers=sizes.num_layers, fp8_param_gather=False, padded_vocab_size=sizes.vocab_size,
            max_position_embeddings=sizes.max_sequence_length, fp16_lm_cross_entropy=False,
            untie_embeddings_and_output_weights=True, position_embedding_type="rope", rotary_percent=1.0,
            rotary_base=sizes.rotary_base, use_rope_scaling=False, mtp_num_layers=None,
        )  # fmt: skip
        return args

    def wandb_logged(self) -> list[dict]:
        """What was passed to wandb.log since the last call (slime's train/* and the plugin's nanscope/*)."""
        logged = [{k: _plain(v) for k, v in d.items()} for d in self.wandb.logged()]
        self.wandb.calls.clear()
        return logged

    def plugin(self, name: str, **env) -> Path:
        """A fresh plugin installation reading this environment at its first step; returns its report dir."""
        from nanscope import slime_plugin

        slime_plugin.uninstall()
        for k in PLUGIN_ENV:
            os.environ.pop(k, None)
        reports = self.out / "reports" / name
        os.environ.update({"NANSCOPE_REPORT_DIR": str(reports), **env})
        return reports


def _plain(value):
    import torch

    return value.item() if isinstance(value, torch.Tensor) else value


def plugin_state() -> dict:
    from nanscope import slime_plugin

    return {"reports": slime_plugin.reports(), "skipped": slime_plugin.skipped_steps(), "logged": slime_plugin.logged()}


def healthy(w: Worker, hook: bool) -> tuple[dict, Run]:
    if hook:
        w.plugin("healthy")
    run = Run(w, hook=hook)
    step = run.train(0, run.rollout("healthy", SEEDS["healthy"])[0])
    return {"step": step, "plugin": plugin_state() if hook else None, "wandb": w.wandb_logged()}, run


SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


@scenario
def observe_only(w: Worker) -> dict:
    """A healthy step without the hook, then with it (hook alone, slime's own loss): loss, grads, metrics."""
    import torch

    out = {}
    out["without"], a = healthy(w, hook=False)
    out["with"], b = healthy(w, hook=True)
    out["grads_equal"] = sorted(a.grads) == sorted(b.grads) and all(
        torch.equal(a.grads[k], b.grads[k]) for k in a.grads
    )
    out["grads_finite"] = all(bool(torch.isfinite(g).all()) for g in a.grads.values())
    out["grads_nonzero"] = any(bool(g.abs().sum() > 0) for g in a.grads.values())
    params = dict(a.model[0].named_parameters()), dict(b.model[0].named_parameters())
    out["params_equal"] = all(torch.equal(params[0][k], params[1][k]) for k in params[0])
    return out


def _report(paths: list[str]) -> dict | None:
    reports = [p for p in paths if p.endswith(".json")]
    return json.loads(Path(reports[0]).read_text()) if reports else None


@scenario
def kl_hazard(w: Worker) -> dict:
    """The hook alone over slime's own loss, the case's KL hazard, raise mode (rerun on): the report, its
    bundle against slime's own get_log_probs_and_entropy on the same logits, the verdict and the error."""
    import torch

    from nanscope.trace.loading import torch_file

    w.plugin("kl")
    run = Run(w, hook=True)
    data, site = run.rollout("kl-exp-overflow", 2)
    step = run.train(0, data)
    state = plugin_state()
    out = {"step": step, "site": site, "plugin": state, "report": _report(state["reports"])}
    # slime's own helper on the logits of each micro-batch of the first pass (a TP collective: every rank, all 8)
    n = len(data["tokens"])
    own = [
        w.own_helper(
            run.logits[k], args=run.args, unconcat_tokens=[data["tokens"][k]],
            total_lengths=[data["total_lengths"][k]], response_lengths=[data["response_lengths"][k]],
            with_entropy=True,
        )
        for k in range(n)
    ]  # fmt: skip
    out["forwards"] = len(run.logits)  # the first pass's and the rerun's
    out["rerun_logits_equal"] = all(torch.equal(run.logits[k], run.logits[n + k]) for k in range(n))
    paths = [p for p in state["reports"] if p.endswith(".bundle.pt")]
    out["bundles"] = []
    for path in paths:
        doc = torch.load(path, weights_only=True)
        torch_file.load(path, "repro bundle")  # and through nanscope's restricted loader
        entries = []
        for e in doc["microbatches"]:
            k, batch = e["microbatch"], e["batch"]
            inputs = {
                key: [torch.equal(batch[key][0], data[src][k])]
                for key, src in (("unconcat_tokens", "tokens"), ("loss_masks", "loss_masks"),
                                 ("log_probs", "log_probs"), ("ref_log_probs", "ref_log_probs"),
                                 ("rollout_log_probs", "rollout_log_probs"), ("advantages", "advantages"))
            }  # fmt: skip
            inputs["lengths"] = [batch["total_lengths"] == [data["total_lengths"][k]]
                                 and batch["response_lengths"] == [data["response_lengths"][k]]]  # fmt: skip
            current = e["current"]
            entries.append({
                "microbatch": k, "why": e["why"], "inputs_equal": all(v[0] for v in inputs.values()),
                "unequal_inputs": [key for key, v in inputs.items() if not v[0]],
                "log_probs_equal": current is not None and all(
                    torch.equal(a, b) for a, b in zip(current["log_probs"], own[k]["log_probs"], strict=True)),
                "entropy_equal": current is not None and all(
                    torch.equal(a, b) for a, b in zip(current["entropy"], own[k]["entropy"], strict=True)),
                "log_probs_dtype": str(current["log_probs"][0].dtype) if current else None,
            })  # fmt: skip
        out["bundles"].append({
            "path": path, "bytes": os.path.getsize(path), "format": doc["format"], "release": doc["release"],
            "coords": doc["coords"], "microbatches": entries, "skipped_keys": doc["skipped_keys"],
        })  # fmt: skip
    return out


@scenario
def one_time_fault(w: Worker) -> dict:
    """Raise mode: a NaN in FAULT's forward output at its first call of the step, on FAULT_RANK only."""
    w.plugin("fault")
    run = Run(w, hook=True, fault="once")
    data, _ = run.rollout("healthy", SEEDS["healthy"])
    run.armed = True
    step = run.train(0, data)
    state = plugin_state()
    return {"step": step, "plugin": state, "report": _report(state["reports"])}


@scenario
def persistent_fault(w: Worker) -> dict:
    """Raise mode: a NaN in FAULT's forward output at every call, on FAULT_RANK only."""
    w.plugin("persistent")
    run = Run(w, hook=True, fault="always")
    data, _ = run.rollout("healthy", SEEDS["healthy"])
    step = run.train(0, data)
    state = plugin_state()
    return {"step": step, "plugin": state, "report": _report(state["reports"])}


@scenario
def skip_transient(w: Worker) -> dict:
    """NANSCOPE_ON_NONFINITE=skip, NANSCOPE_SKIP_ON=transient over [one-time fault, healthy, KL hazard]."""
    w.plugin("skip", NANSCOPE_ON_NONFINITE="skip", NANSCOPE_SKIP_ON="transient")
    run = Run(w, hook=True, fault="once")
    steps = []
    for rollout_id, (hazard, seed, fault) in enumerate(
        [("healthy", SEEDS["healthy"], True), ("healthy", SEEDS["later"], False), ("kl-exp-overflow", 2, False)]
    ):
        data, _ = run.rollout(hazard, seed)
        run.armed = fault
        steps.append(run.train(rollout_id, data))
        if "error" in steps[-1]:
            break
    state = plugin_state()
    reports = {p: json.loads(Path(p).read_text()) for p in state["reports"] if p.endswith(".json")}
    return {"steps": steps, "plugin": state, "reports": reports, "wandb": w.wandb_logged()}


@scenario
def plugin_loss(w: Worker) -> dict:
    """All three lines (the hook and the plugin's loss, --loss-type custom_loss) over a masked NaN rollout log-prob,
    then a healthy step: the guard's counters reach the step once, through the vote, not slime's metric packing."""
    from nanscope.facts.paths import LOSS_FUNCTION_PATH

    w.plugin("plugin_loss")
    run = Run(w, hook=True)
    run.args.loss_type, run.args.custom_loss_function_path = "custom_loss", LOSS_FUNCTION_PATH
    w.wandb_logged()
    steps = []
    for rollout_id, (hazard, seed) in enumerate([("nan-rollout-logprob", 2), ("healthy", SEEDS["healthy"])]):
        data, site = run.rollout(hazard, seed)
        steps.append(run.train(rollout_id, data))
    return {"steps": steps, "site": site, "plugin": plugin_state(), "wandb": w.wandb_logged()}


@scenario
def drift(w: Worker) -> dict:
    """Raise mode: the KL log-ratio on a masked tool token grows every rollout (DRIFT) until slime's loss dies."""
    w.plugin("drift")
    run = Run(w, hook=True)
    w.wandb_logged()
    steps = []
    for rollout_id, d in enumerate(DRIFT):
        data, _ = run.rollout("healthy", SEEDS["healthy"] + 10 * rollout_id, drift=d)
        steps.append(run.train(rollout_id, data))
        if "error" in steps[-1]:
            break
    import torch

    state = plugin_state()
    bundles = [torch.load(p, weights_only=True) for p in state["reports"] if p.endswith(".bundle.pt")]
    losses = [e["loss"] for b in bundles for e in b["microbatches"]]  # slime's loss on the micro-batch, as seen
    return {"drift": DRIFT, "steps": steps, "plugin": state, "bundle_losses": losses, "wandb": w.wandb_logged()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--slime-src", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", default=None, help="run only this scenario")
    a = p.parse_args()
    os.environ["TORCHDYNAMO_DISABLE"] = "1"  # v0.1.0's helpers are @torch.compile'd: run them eagerly
    import torch

    torch.set_num_threads(1)
    from nanscope.megatron import bootstrap
    from nanscope.megatron.watchdog import Watchdog
    from tests.megatron.layout_worker import Tee

    bootstrap.init(tp=2, timeout_s=90, group_timeout_s=60)
    import torch.distributed as dist

    a.out.mkdir(parents=True, exist_ok=True)
    wd = Watchdog(a.out, dist.get_rank())
    w = Worker(a.slime_src, a.out)
    results = {}
    for name, fn in SCENARIOS.items():
        if a.only is not None and name != a.only:
            continue
        wd.arm(name, 150.0)
        started, tee = time.time(), Tee(sys.stdout)
        try:
            with contextlib.redirect_stdout(tee):
                results[name] = fn(w)
        except Exception:
            results[name] = {"crashed": traceback.format_exc()}
        results[name]["stdout"] = [line for line in tee.kept.getvalue().splitlines() if line.startswith("nanscope")]
        results[name]["seconds"] = time.time() - started
        print(f"rank {w.rank}: {name}: {results[name]['seconds']:.1f} s", flush=True)
    wd.arm("end", 60.0)
    (a.out / f"rank{w.rank}.json").write_text(json.dumps(results, indent=1, default=str))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

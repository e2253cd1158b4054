"""The plugin inside slime v0.1.0's own train_one_step: the hook alone over slime's own loss, on CPU.

slime v0.1.0's `train()` and the `train_one_step` it calls run here over megatron-core 0.15.0rc0 on gloo:
2 processes, TP 2, megatron's DDP (slime's own DDP config: the bucket NaN check on) and distributed optimizer,
bf16, the CPU harness's tiny Qwen3-MoE, real slime DataIterators (micro-batch size 1) over case-shaped
rollouts, `--loss-type policy_loss` and `--custom-megatron-before-train-step-hook-path
nanscope.slime_plugin.before_train_step`. The stand-ins (megatron.training's names, a recording wandb) and why
none of them is on the loss or step path: standins.py and megatron_training.py. The scenarios: train_worker.py.

Needs slime's v0.1.0 checkout under NANSCOPE_SLIME_SRC (tests/checkouts.py). In the slow tier (`pytest -m slow`).
"""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkouts import slime_release

WORKER = Path(__file__).with_name("train_worker.py")
MEGATRON_TEXT = re.compile(
    r"^Rank (\d+), node \S+, device cpu, iteration -1: Unexpected result nan \(message='found NaN in local grad "
    r"norm for bucket #0 in backward pass before data-parallel communication collective'\)$"
)
REPRODUCIBLE = "nanscope: rerun: reproducible on this device:"
TRANSIENT = "nanscope: rerun: not reproducible (transient):"

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _free_port() -> str:
    with socket.socket() as sock:  # torchrun's --master-port 0 hangs in rendezvous
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Both ranks' results of every scenario (train_worker.py), from one torchrun launch."""
    checkout = slime_release("v0.1.0")
    out = tmp_path_factory.mktemp("train_one_step")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", _free_port(),
        str(WORKER), "--slime-src", str(checkout), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    stuck = sorted(p.read_text() for p in out.glob("stuck.rank*.txt"))
    assert proc.returncode == 0 and not stuck, (stuck, proc.stderr[-4000:])
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in results:
        crashed = {name: r["crashed"] for name, r in rank.items() if "crashed" in r}
        assert not crashed, crashed
    return results


def _lines(error: str) -> list[str]:
    return error.splitlines()


@pytest.mark.timeout(450)
def test_slime_train_one_step_trains_over_megatron_core(ranks):
    for rank in ranks:
        step = rank["observe_only"]["without"]["step"]
        assert "error" not in step, step.get("traceback")
        # slime's own metrics of v0.1.0's policy loss (case flags: KL at coef 0, TIS), finite, and a real update
        assert list(step["loss"]) == ["loss", "pg_loss", "entropy_loss", "pg_clipfrac", "ppo_kl", "kl_loss", "tis",
                                      "ois", "tis_clipfrac"]  # fmt: skip
        assert all(v == v and abs(v) < 1e6 for v in step["loss"].values()), step["loss"]
        assert 0 < step["grad_norm"] < float("inf") and step["lr_steps"] == 8  # scheduler.step(increment=gbs)
        assert rank["observe_only"]["grads_finite"] and rank["observe_only"]["grads_nonzero"]
    logged = ranks[0]["observe_only"]["without"]["wandb"]  # slime's train() logs on TP rank 0 only
    assert [d["train/step"] for d in logged] == [0] and "train/grad_norm" in logged[0]
    assert ranks[1]["observe_only"]["without"]["wandb"] == []


@pytest.mark.timeout(450)
def test_the_observe_only_wrapping_leaves_slime_loss_gradient_and_metrics_bitwise(ranks):
    for rank in ranks:
        o = rank["observe_only"]
        assert o["with"]["step"]["loss"] == o["without"]["step"]["loss"]  # every metric, bitwise (float64 JSON)
        assert o["with"]["step"]["grad_norm"] == o["without"]["step"]["grad_norm"]
        assert o["grads_equal"] and o["params_equal"], "main_grad before the step / parameters after it"
        assert o["with"]["plugin"]["reports"] == []
        slime_logged = [d for d in o["with"]["wandb"] if any(k.startswith("train/") and k != "train/step" for k in d)]
        assert slime_logged == o["without"]["wandb"]  # what slime's train() itself logged
    # and the hook did observe the loss: its headroom metrics of the step
    (logged,) = ranks[0]["observe_only"]["with"]["plugin"]["logged"]
    assert 0 < logged["nanscope/max_kl_log_ratio"] < 1 and logged["nanscope/nonfinite_inputs"] == 0


@pytest.mark.timeout(450)
def test_the_kl_hazard_report_names_output_layer_and_loss_numerics(ranks):
    for r, rank in enumerate(ranks):
        k = rank["kl_hazard"]
        report = k["report"]
        assert report["rank"] == r and report["first_forward"] is None
        assert report["first_backward"]["module"] == "output_layer"
        assert report["first_backward"]["param"] == "output_layer.weight"
        assert report["first_backward"]["microbatch"] == k["site"][0]  # one sample per micro-batch
        assert not any(name.startswith("module.") for name in report["nonfinite_grads"])  # public names
        assert report["class"] == "loss-numerics" and report["class_candidates"] == ["loss-numerics"]
        assert "every loss input was finite" in report["class_evidence"]  # the loss watch saw the inputs


@pytest.mark.timeout(450)
def test_the_bundle_holds_the_inputs_and_slime_own_current_log_probs(ranks):
    import torch

    for r, rank in enumerate(ranks):
        k = rank["kl_hazard"]
        (bundle,) = k["bundles"]
        assert bundle["bytes"] <= 2 * 1024 * 1024
        assert bundle["format"] == "nanscope-bundle/1" and bundle["release"]["name"] == "v0.1.0"
        assert bundle["coords"]["rank"] == r and bundle["coords"]["tp"] == r
        (entry,) = bundle["microbatches"]
        assert entry["microbatch"] == k["site"][0] and entry["why"] == ["sentinel-backward"]
        assert entry["inputs_equal"], entry["unequal_inputs"]  # tokens, lengths, masks, log-probs, advantages
        # the current log-probs and entropy as slime's get_log_probs_and_entropy computed them (the loss's
        # call, observed), equal to slime's own helper called again on the same logits
        assert entry["log_probs_equal"] and entry["entropy_equal"] and entry["log_probs_dtype"] == "torch.float32"
        doc = torch.load(bundle["path"], weights_only=True)
        assert doc["report"]["first_backward"]["module"] == "output_layer"
        assert doc["microbatches"][0]["loss"]["finite"]  # slime's loss was finite; its gradient was not
        assert k["rerun_logits_equal"], "the rerun's forwards saw the same logits"


@pytest.mark.timeout(450)
def test_a_persistent_data_hazard_is_reproducible_and_raises_the_verdict_then_megatron_text(ranks):
    for r, rank in enumerate(ranks):
        k = rank["kl_hazard"]
        rerun = k["report"]["rerun"]
        assert rerun["verdict"] == "reproducible"
        assert rerun["first"] == rerun["rerun"] == {
            "module": "output_layer", "direction": "backward", "microbatch": k["site"][0], "class": "loss-numerics"
        }  # fmt: skip
        step = k["step"]
        assert step["error_type"] == "RuntimeError" and step["lr_steps"] == 0  # no update, no LR step
        verdict, megatron = _lines(step["message"])
        assert verdict.startswith(REPRODUCIBLE) and k["report"]["bundle"].replace(".bundle.pt", ".json") in verdict
        assert MEGATRON_TEXT.match(megatron) and MEGATRON_TEXT.match(megatron)[1] == str(r)
        assert k["forwards"] == 16  # the step's 8 micro-batches, then the rerun's 8


@pytest.mark.timeout(450)
def test_a_persistent_fault_is_reproducible(ranks):
    for rank in ranks:
        p = rank["persistent_fault"]
        assert p["report"]["rerun"]["verdict"] == "reproducible"
        assert p["report"]["rerun"]["first"] == p["report"]["rerun"]["rerun"]
        assert p["report"]["class"] == "model-forward"
        assert _lines(p["step"]["message"])[0].startswith(REPRODUCIBLE)
        assert p["report"]["rerun"]["producer"]["rank"] == 1
    assert ranks[1]["persistent_fault"]["report"]["first_forward"]["module"] == "decoder.layers.1.mlp"


@pytest.mark.timeout(450)
def test_a_one_time_fault_is_not_reproducible_and_names_its_rank(ranks):
    for r, rank in enumerate(ranks):
        f = rank["one_time_fault"]
        rerun = f["report"]["rerun"]
        assert rerun["verdict"] == "not reproducible" and rerun["rerun"] is None  # the rerun was finite
        # the first producer across ranks: rank 1, where it was planted, not rank 0, which received it through TP
        assert rerun["producer"]["rank"] == 1 and rerun["producer"]["module"] == "decoder.layers.1.mlp"
        assert rerun["producer"]["device"] == "cpu" and rerun["producer"]["node"]
        verdict, megatron = _lines(f["step"]["message"])  # raise mode: an error all the same, on both ranks
        assert verdict.startswith(TRANSIENT) and "rank 1," in verdict and "dmesg" in verdict
        assert MEGATRON_TEXT.match(megatron)[1] == str(r)
    assert ranks[0]["one_time_fault"]["report"]["first_forward"]["module"] != "decoder.layers.1.mlp"


@pytest.mark.timeout(450)
def test_skip_on_transient_skips_the_one_time_fault_and_stops_at_the_persistent_hazard(ranks):
    for rank in ranks:
        s = rank["skip_transient"]
        fault, healthy, hazard = s["steps"]
        assert "error" not in fault and fault["grad_norm"] != fault["grad_norm"] and fault["lr_steps"] == 0
        assert "error" not in healthy and 0 < healthy["grad_norm"] < float("inf") and healthy["lr_steps"] == 8
        assert hazard["error_type"] == "RuntimeError" and hazard["lr_steps"] == 8
        verdict, megatron = _lines(hazard["message"])
        assert verdict.startswith(REPRODUCIBLE) and ".json" in verdict and MEGATRON_TEXT.match(megatron)
        assert s["plugin"]["skipped"] == 1
        verdicts = sorted((Path(p).name, doc["rerun"]["verdict"]) for p, doc in s["reports"].items())
        assert [v for _, v in verdicts] == ["not reproducible", "reproducible"], verdicts
    logged = ranks[0]["skip_transient"]["plugin"]["logged"]
    assert [(d["rollout_id"], d["nanscope/skipped_steps"]) for d in logged] == [(0, 1), (1, 1)]


@pytest.mark.timeout(450)
def test_the_drift_warning_comes_at_least_two_steps_before_slime_loss_goes_nan(ranks):
    d = ranks[0]["drift"]
    failed = [s["rollout_id"] for s in d["steps"] if "error" in s]
    assert failed == [len(d["steps"]) - 1] and d["drift"][failed[0]] > 88.72  # fp32 exp overflows there
    (m,) = failed
    for rank in ranks:
        step = rank["drift"]["steps"][m]
        assert _lines(step["message"])[0].startswith(REPRODUCIBLE) and MEGATRON_TEXT.match(_lines(step["message"])[1])
    warned = sorted(
        {
            int(re.search(r"rollout (\d+) step 0", line)[1])
            for line in d["stdout"]
            if line.startswith("nanscope: warning:")
        }
    )
    assert warned and warned[0] <= m - 2, (warned, m)
    assert warned == [i for i, x in enumerate(d["drift"][:m]) if x > 20]  # the thresholds: 20, then 60
    texts = [line for line in d["stdout"] if line.startswith("nanscope: warning:")]
    assert any("> 60" in t and "88.72" in t for t in texts) and all("nanscope/max_kl_log_ratio" in t for t in texts)
    assert all("sample 0" in t for t in texts)  # the drifting sample
    assert not any(line.startswith("nanscope: warning:") for line in ranks[1]["drift"]["stdout"])  # rank 0 logs


@pytest.mark.timeout(450)
def test_the_metrics_go_through_v0_1_0_wandb_log_as_nanscope_names(ranks):
    d = ranks[0]["drift"]
    logged = d["wandb"]
    ours = [x for x in logged if any(k.startswith("nanscope/") for k in x)]
    slime = [x for x in logged if x not in ours]
    assert all(set(x) - {"train/step"} <= {k for k in x if k.startswith("nanscope/")} for x in ours)
    assert [x["train/step"] for x in ours] == [x["train/step"] for x in slime] == list(range(len(d["steps"]) - 1))
    series = [x["nanscope/max_kl_log_ratio"] for x in ours]
    assert series == sorted(series) and series[-1] > 60
    assert {"nanscope/train_rollout_gap_max", "nanscope/clamped_tokens", "nanscope/max_tis_log_ratio"} <= set(ours[0])
    assert ranks[1]["drift"]["wandb"] == []


@pytest.mark.timeout(450)
def test_the_plugins_loss_counts_reach_the_step_once_through_the_vote_not_slimes_metrics(ranks):
    # the three lines over a masked NaN rollout log-prob, then a healthy step: both finite; slime's own train/* log
    # has no nan_guard key (its packing would read each to the host); the hook logs the step's counts, once
    for rank in ranks:
        steps = rank["plugin_loss"]["steps"]
        assert [("error" in s, 0 < s.get("grad_norm", 0) < float("inf")) for s in steps] == [(False, True)] * 2, steps
        assert not any("nan_guard" in k for s in steps for k in s["loss"])
    o = ranks[0]["plugin_loss"]  # TP rank 0 logs
    counts = [{k: v for k, v in step.items() if k.startswith("nanscope/nan_guard/")} for step in o["plugin"]["logged"]]
    zero = dict.fromkeys(
        (f"nanscope/nan_guard/{k}" for k in ("log_probs", "ref_log_probs", "rollout_log_probs", "advantages",
                                             "exp_overflow", "dropped_tokens")), 0.0)  # fmt: skip
    assert counts == [{**zero, "nanscope/nan_guard/rollout_log_probs": 1.0}, zero]  # a masked token: none dropped
    lines = [line for line in o["stdout"] if "nan_guard" in line]  # besides the headroom's warnings on the NaN input
    assert lines == ["nanscope: rollout 0 step 0: {'nanscope/nan_guard/rollout_log_probs': 1.0}"]
    ours = [x for x in o["wandb"] if any(k.startswith("nanscope/") for k in x)]
    assert [x["nanscope/nan_guard/rollout_log_probs"] for x in ours] == [1.0, 0.0]  # through v0.1.0's wandb.log
    assert not any(k.startswith("train/nan_guard") for x in o["wandb"] for k in x)
    assert ranks[1]["plugin_loss"]["stdout"] == [] and ranks[1]["plugin_loss"]["plugin"]["logged"] == []

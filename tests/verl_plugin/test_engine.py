"""The plugin inside verl 0.9.0's own actor update (ActorRolloutRefWorker.init_model + update_actor, 2 gloo ranks,
FSDP2 on CPU: tests/verl_plugin/worker.py), against verl alone. Slow tier; needs the verl environment.

The end-to-end cases A-F of issue 43 are tests/verl/'s; these three check the engine subclass's own machinery:
cleaning before verl counts its tokens, raise with a report and a reproducible verdict, skip on a transient fault.
"""

import json

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from tests.verl_plugin import worker  # noqa: E402

from nanscope.cli.main import main  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("verl") / "model"
    worker.tiny_model(str(path))
    return str(path)


def _run(tmp_path, model, name, port, **spec):
    out = str(tmp_path / name)
    env = {"NANSCOPE_REPORT_DIR": str(tmp_path / "reports"), **spec.pop("env", {})}
    spec = {"out": out, "model": model, "port": port, "plugin": True, "loss_mode": "nanscope", "steps": 1,
            "env": env, **spec}  # fmt: skip
    mp.spawn(worker.run, args=(spec,), nprocs=2)
    ranks = []
    for rank in (0, 1):
        with open(f"{out}.rank{rank}.json") as f:
            ranks.append(json.load(f))
    return ranks, torch.load(out + ".params.pt")


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_nan_old_log_prob_is_dropped_before_verl_counts_tokens(tmp_path, model):
    got, params = _run(tmp_path, model, "plugin", 29710, plants=["A"])
    want, masked = _run(tmp_path, model, "masked", 29720, plugin=False, loss_mode="vanilla", plants=["A-masked"])
    assert got[0]["engine"] == "NanscopeFSDPEngineWithLMHead" and want[0]["engine"] == "FSDPEngineWithLMHead"
    assert _equal(params, masked)
    metrics = got[0]["metrics"][0]
    assert metrics["nanscope/nan_guard/old_log_probs"] == [1.0]
    assert metrics["nanscope/nan_guard/dropped_tokens"] == [1.0]
    assert metrics["actor/pg_loss"] == want[0]["metrics"][0]["actor/pg_loss"]


def test_a_layer_faulty_on_every_pass_raises_everywhere_with_a_reproducible_report(tmp_path, model, capsys):
    ranks, _ = _run(tmp_path, model, "raise", 29730, fault="every")
    assert ranks[1]["error"].startswith("RuntimeError: nanscope: rerun: reproducible on this device")
    assert ranks[0]["error"].startswith("PeerNonFinite: nanscope: rank 0 stops with its peers: rank(s) 1 saw")
    report = json.loads((tmp_path / "reports" / "rollout0_step0_rank1.json").read_text())
    assert report["first_forward"]["module"] == "model.layers.1.mlp" and report["first_forward"]["microbatch"] == 0
    assert report["class"] == "model-forward" and report["rerun"]["verdict"] == "reproducible"
    assert not (tmp_path / "reports" / "rollout0_step0_rank0.json").exists()
    bundle = tmp_path / "reports" / "rollout0_step0_rank1.bundle.pt"
    capsys.readouterr()
    assert main(["trace", str(bundle)]) == 0
    assert "the NaN started upstream of the loss" in capsys.readouterr().out


# a decaying schedule (cosine from the first update), so an update whose only step was skipped and did not hold the
# learning rate would leave the next one at a smaller rate than a fresh run's first
WARMUP = ("actor.optim.lr_scheduler_type=cosine", "actor.optim.lr_warmup_steps_ratio=0.0",
          "actor.optim.total_training_steps=4")  # fmt: skip


def test_a_transient_fault_is_skipped_on_every_rank_and_the_next_step_is_clean(tmp_path, model):
    env = {"NANSCOPE_ON_NONFINITE": "skip"}
    ranks, params = _run(tmp_path, model, "skip", 29740, fault="first", steps=2, env=env, overrides=WARMUP)
    clean_ranks, clean = _run(tmp_path, model, "clean", 29750, steps=1, step_offset=1, env=env, overrides=WARMUP)
    # the skipped update held the schedule (verl logs the rate after its schedule step): the next update ran at the
    # rate a fresh run's first does, and left the schedule where that run's first leaves it
    held, after = ranks[0]["metrics"][0]["lr"], ranks[0]["metrics"][1]["lr"]
    assert held == [0.01] and after == clean_ranks[0]["metrics"][0]["lr"] and after[0] < 0.01
    for rank in ranks:
        assert rank["error"] is None
        first, second = rank["metrics"]
        assert first["nanscope/skipped_steps"] == [1.0] and second["nanscope/skipped_steps"] == [1.0]
        assert str(first["grad_norm"][0]) == "nan"
    report = json.loads((tmp_path / "reports" / "rollout0_step0_rank1.json").read_text())
    assert report["rerun"]["verdict"] == "not reproducible"
    assert _equal(params, clean)


def test_a_masked_log_ratio_of_95_under_clip_cov_is_clamped_and_reported(tmp_path, model):
    env = {"NANSCOPE_INNER_LOSS_MODE": "clip_cov"}
    got, params = _run(tmp_path, model, "clamped", 29760, plants=["B"], env=env)
    want, unplanted = _run(tmp_path, model, "unplanted", 29770, plugin=False, loss_mode="clip_cov")
    assert _equal(params, unplanted)
    metrics = got[0]["metrics"][0]
    assert metrics["grad_norm"] == want[0]["metrics"][0]["grad_norm"]
    assert 95 < metrics["nanscope/max_ppo_log_ratio"][0] < 96 and metrics["nanscope/nan_guard/exp_overflow"] == [1.0]


def test_with_nothing_planted_two_updates_are_verls_bit_for_bit(tmp_path, model):
    got, params = _run(tmp_path, model, "plugin2", 29780, steps=2)
    want, alone = _run(tmp_path, model, "alone2", 29790, plugin=False, loss_mode="vanilla", steps=2)
    assert _equal(params, alone)
    for rank in (0, 1):  # one all-gather per optimizer step more than verl, nothing else
        for mine, verls in zip(got[rank]["collectives"], want[rank]["collectives"]):
            assert mine == {**verls, "all_gather": verls.get("all_gather", 0) + 1}, (mine, verls)
    for mine, verls in zip(got[0]["metrics"], want[0]["metrics"]):
        ours = {k for k in mine if k.startswith("nanscope/")}
        assert ours and {k: v for k, v in mine.items() if k not in ours and not k.startswith(("perf/", "mfu"))} == {
            k: v for k, v in verls.items() if not k.startswith(("perf/", "mfu"))
        }


def test_verl_use_external_modules_installs_the_engine_too(tmp_path, model):
    got, _ = _run(tmp_path, model, "env", 29800, plugin=False, loss_mode="vanilla", external_modules=True)
    assert got[0]["engine"] == got[1]["engine"] == "NanscopeFSDPEngineWithLMHead"
    assert got[0]["error"] is None and "nanscope/nonfinite_inputs" in got[0]["metrics"][0]

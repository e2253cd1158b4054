"""The whole route in the CPU harness: slime (nanscope's model of v0.1.0) with the plugin's hook writes a repro
bundle on each rank at the hazard's step; `nanscope trace` replays it offline and names the same op, source line,
sample and token as NANSCOPE_TRACE_STEP's trace of the same step in the run (a second run of the launch, from the
first run's saved rollout), at CP 1 and at CP 2 (simulated at the loss: `Layout.cp`).

At CP 2 the in-run trace maps no token (its token map reads megatron's CP, 1 in the harness, while the harness cuts
each sample for two CP ranks at the loss): there the op, source line and micro-batch are compared with the in-run
trace, and the sample and token with the hazard's site as the harness planted it.

zero-temperature is the one loss-level hazard whose op runs before the recorded log-probs (the helper's division
of the logits by 0): the in-run trace names that aten.div, the bundle's replay the non-finite inputs (data).
Model-level hazards replay finite: the NaN started upstream of the loss, at the sentinel's module.
"""

import json
from pathlib import Path

import pytest

from nanscope import case
from nanscope.causes import catalogue
from nanscope.causes.classes import LOSS_NUMERICS
from nanscope.cli.main import main
from nanscope.megatron import launcher
from nanscope.megatron.spec import Layout, RunSpec

pytestmark = pytest.mark.usefixtures("wide_lines")  # trace's lines asserted whole

# logprob-drift at its crossing step overflows kl-exp-overflow's exp (ref - logp > 88.72 at a masked tool token);
# its bundles are replayed offline by the drift test of repro --plugin
LOSS_HAZARDS = [h.name for h in catalogue.CATALOGUE if h.level == "batch" and not h.grad_finite and not h.drifts]
MODEL_HAZARDS = ["activation-overflow", "backward-only-fault"]
EXP = [h.name for h in catalogue.CATALOGUE if h.name in LOSS_HAZARDS and h.cause_class == LOSS_NUMERICS]


def _launch(out: Path, cp: int, model: list[str]):
    """One launch: each loss hazard plain (its bundles) then traced (NANSCOPE_TRACE_STEP from its rollout)."""
    plain = [RunSpec(hazard=h, steps=1, inject_step=1, plugin=True, hook=True) for h in LOSS_HAZARDS + model]
    traced = [
        RunSpec(
            hazard=h, steps=1, inject_step=1, plugin=True, hook=True, env={"NANSCOPE_TRACE_STEP": "0:0"},
            load_rollouts=str(out / f"rollouts.run{i}" / "{rollout_id}.pt"),
        )
        for i, h in enumerate(LOSS_HAZARDS)
    ]  # fmt: skip
    launched = launcher.launch(plain + traced, Layout(cp=cp), timeout_s=900, out_dir=out, loss_flags=case.loss_flags())
    return {run.spec.hazard: run for run in launched.runs[: len(plain)]}, {
        run.spec.hazard: run for run in launched.runs[len(plain) :]
    }


def _offline(run, tmp: Path, name: str) -> tuple[int, dict]:
    """`nanscope trace` on the run's report directory: (exit code, its JSON)."""
    (directory,) = {Path(p).parent for r in run.ranks for p in r.reports}
    out = tmp / f"{name}.json"
    code = main(["trace", str(directory), "--json", str(out)])
    return code, json.loads(out.read_text())


def _first(doc: dict) -> dict:
    """The first producers over the replayed bundles of one step."""
    from nanscope.trace.bundles.bundle_replay import first_of, records_of

    return first_of(records_of(doc["bundles"]))


def _in_run(run) -> dict:
    (path,) = {p for r in run.ranks for p in r.reports if p.endswith("rank0.trace.json")}
    return json.loads(Path(path).read_text())["first"]


KEYS = ("op", "source", "node", "microbatch")


# Each CP is a launch of every loss-level hazard (35 s at CP 1, two minutes at CP 2): the slow tier. The fast tier's
# path through the same route is tests/cli/test_repro_plugin.py (the hook's bundle, replayed offline).
@pytest.fixture(scope="module", params=[pytest.param(cp, marks=pytest.mark.slow) for cp in (1, 2)], ids=["cp1", "cp2"])
def launched(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"cp{request.param}")
    return request.param, out, *_launch(out, request.param, MODEL_HAZARDS if request.param == 1 else [])


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_offline_replay_names_what_the_in_run_trace_names(launched, tmp_path, capsys):
    cp, _, plain, traced = launched
    for hazard in LOSS_HAZARDS:
        code, doc = _offline(plain[hazard], tmp_path, hazard)
        text = capsys.readouterr().out
        assert code == 1, (hazard, text)
        offline, in_run = _first(doc), _in_run(traced[hazard])
        guards = [e["guard"] for b in doc["bundles"] for e in b["microbatches"]]
        if hazard == "zero-temperature":  # its fix is the flag: the guard cannot make a NaN policy finite
            assert (
                in_run["forward"]["op"] == "aten.div.Tensor" and "log_probs_and_entropy" in in_run["forward"]["source"]
            )
            assert offline["forward"] is None and offline["backward"] is None
            assert {b["class"] for b in doc["bundles"] if b["found"]} == {"data"}
            continue
        assert guards and all(g["loss_finite"] and g["grad_nonfinite"] == 0 for g in guards), hazard
        (site,) = {tuple(s) for r in plain[hazard].ranks for s in r.hazard_sites if s is not None}
        for phase in ("forward", "backward"):
            got, want = offline[phase], in_run[phase]
            if want is None:  # an input hazard: no op produced it, in the run or offline
                assert got is None, (hazard, phase, got)
                continue
            assert {k: got[k] for k in KEYS} == {k: want[k] for k in KEYS}, (hazard, phase)
            assert (got["rank"], got["pp"]) == (want["rank"], want["pp"])
            if cp == 1:
                assert (got["sample"], got["token"], got["masked"]) == (want["sample"], want["token"], want["masked"])
            assert (got["sample"], got["token"]) == site, (hazard, phase)
        if hazard not in EXP:  # the input the hazard planted, named offline at its sample
            assert {b["class"] for b in doc["bundles"] if b["found"]} == {"data"}
            assert offline["inputs"] and offline["inputs"][0]["sample"] == site[0]


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_model_level_hazards_replay_finite_and_point_to_the_sentinel(launched, tmp_path, capsys):
    """activation-overflow's fault fires in the log-prob pass too, so the last stage's recorded log-probs are non-finite
    already; backward-only-fault never reaches the loss (only the first stage's ranks report). Both: exit 0, upstream,
    at the sentinel's modules; the guard's replay and the verdict where a bundle holds a loss."""
    cp, _, plain, _ = launched
    if cp != 1:
        pytest.skip("the model-level hazards run in the CP 1 launch")
    for hazard in MODEL_HAZARDS:
        code, doc = _offline(plain[hazard], tmp_path, hazard)
        # the loss replayed through, one line per bundle, then (where a bundle holds a loss) the guard and the verdict
        loss, *lines = capsys.readouterr().out.splitlines()[1:]
        with_loss = [b for b in doc["bundles"] if b["microbatches"]]
        tail = lines[len(doc["bundles"]) :]
        lines = lines[: len(doc["bundles"])]
        assert code == 0 and loss.startswith("loss: nanscope's model of slime v0.1.0 "), (hazard, loss)
        assert all(line.startswith("rollout 0 step 0, rank ") for line in lines), (hazard, lines)
        if with_loss:
            guard, verdict = tail
            assert guard.startswith("with the guard (") and guard.endswith(
                f"loss and d loss / d log-probs finite in every replayed micro-batch of the {len(with_loss)} "
                "bundle(s) that hold a loss (rollout 0 step 0, ranks 2-3)"
            ), guard
            assert verdict.startswith("verdict (rollout 0 step 0, rank 2): ") and verdict.endswith(lines[2][-80:])
        else:
            assert tail == [
                "verdict: no bundle holds a loss (none from the last pipeline stage): nothing replayed; each line "
                "above names its rank's first non-finite module"
            ], (hazard, tail)
        assert not any(b["found"] or b["class"] for b in doc["bundles"]), hazard
        for b, line in zip(sorted(doc["bundles"], key=lambda b: b["coords"]["rank"]), lines, strict=True):
            hits = [b["report"][k] for k in ("first_forward", "first_backward") if b["report"][k]]
            assert hits and all(f"module {hit['module']!r}" in line for hit in hits), line
            if b["microbatches"]:
                assert "the log-probs the release computed from this step's logits were non-finite already" in line
                assert "the NaN started upstream of the loss, in the model; " in line
            else:
                assert ": no loss on this rank; the sentinel's first non-finite module, " in line
        if hazard == "backward-only-fault":
            assert {b["coords"]["pp"] for b in doc["bundles"]} == {0}

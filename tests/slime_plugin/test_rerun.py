"""The rerun of a non-finite step, in the CPU harness at PP 2 x TP 2: a one-time fault is not reproducible (and
named on its rank), a persistent fault is; NANSCOPE_SKIP_ON=transient skips the first and stops on the second."""

import json

import pytest

from nanscope import case
from nanscope.megatron import launcher
from nanscope.megatron.spec import Layout, RunSpec

FAULT = "decoder.layers.1.mlp:forward:inf"  # layer 1 sits on stage 0 (ranks 0 and 1, TP 0 and 1)
TRANSIENT = {"NANSCOPE_SKIP_ON": "transient"}


def fault_run(*, once: bool, **kwargs) -> RunSpec:
    return RunSpec(hook=True, model_fault=FAULT, model_fault_step=1, model_fault_once=once, **kwargs)


def _launch(tmp_path_factory, runs: list[RunSpec]) -> list:
    out = tmp_path_factory.mktemp("rerun")
    result = launcher.launch(runs, Layout(tp=2, pp=2), timeout_s=400, out_dir=out, loss_flags=case.loss_flags())
    return result.runs


# two launches, so that the fast tier pays only for the one its tests read (the skipping runs are the slow tier's)
@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    return _launch(
        tmp_path_factory, [fault_run(once=True, on_nonfinite="raise"), fault_run(once=False, on_nonfinite="raise")]
    )


@pytest.fixture(scope="module")
def launched_skipping(tmp_path_factory):
    runs = [
        fault_run(once=True, on_nonfinite="skip", steps=2, env=TRANSIENT),
        fault_run(once=False, on_nonfinite="skip", steps=2, env=TRANSIENT),
    ]
    return _launch(tmp_path_factory, runs)


def reports(run) -> list[dict]:
    return [json.loads(open(p).read()) for r in run.ranks for p in r.reports if p.endswith(".json")]


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_one_time_fault_is_not_reproducible_and_names_its_rank(launched):
    once = launched[0]
    found = reports(once)
    assert found and {r["rerun"]["verdict"] for r in found} == {"not reproducible"}
    assert all(r["rerun"]["rerun"] is None for r in found)  # the rerun was finite everywhere
    producer = found[0]["rerun"]["producer"]
    # the forward runs stage 0 first: its TP rank 0 made it (TP 1 made it too, later in rank order)
    assert (producer["rank"], producer["pp"], producer["module"], producer["direction"]) == (
        0,
        0,
        "decoder.layers.1.mlp",
        "forward",
    )
    for r in once.ranks:  # raise mode still ends the step: the verdict naming the rank, then megatron's words
        if r.error_type != "PeerNonFinite":
            assert r.error.startswith("nanscope: rerun: not reproducible (transient): the rerun of the step is finite")
            assert "first producer: rank 0, node " in r.error and "check dmesg for XID and ECC errors" in r.error


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_persistent_fault_is_reproducible(launched):
    found = reports(launched[1])
    assert found and {r["rerun"]["verdict"] for r in found} == {"reproducible"}
    assert all(r["rerun"]["first"] == r["rerun"]["rerun"] for r in found)


@pytest.mark.slow  # a launch of its own: the fast tier runs the rerun's two verdicts above
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_skip_on_transient_skips_the_transient_step_and_stops_on_the_reproducible_one(launched_skipping):
    transient, persistent = launched_skipping
    assert transient.observed == "completed"
    assert all(r.skipped_steps == 1 and r.params_finite for r in transient.ranks)
    assert persistent.observed != "completed"
    errors = [r.error for r in persistent.ranks if r.error and r.error_type != "PeerNonFinite"]
    assert errors and all(e.startswith("nanscope: rerun: reproducible on this device: ") for e in errors)
    assert all("report " in e and ".json, its bundle beside it)" in e for e in errors)

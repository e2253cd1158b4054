"""The plugin's step on CUDA (scenario `plugin_step`): at most the vote's one synchronizing call from the plugin's code
per step, skip mode that leaves every tensor of both of the case's optimizers unchanged, and the hook's cost."""

import math

import pytest

from tests.gpu import scenario

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return scenario.run("plugin_step", tmp_path_factory.mktemp("gpu") / "plugin_step.json", timeout_s=420)


@pytest.mark.timeout(480)
@pytest.mark.parametrize("optimizer", ["distributed", "hybrid"])
def test_at_most_one_sync_a_step_from_the_plugin_and_skip_leaves_every_tensor(result, optimizer):
    run = result[optimizer]
    assert all(math.isfinite(x) for x in run["healthy"]) and math.isfinite(run["after"]), run
    assert len(run["plugin_syncs"]) <= 1, run["plugin_syncs"]  # the vote's copy of its table to the host
    assert run["skipped"] == 1 and math.isnan(run["skipped_grad_norm"]), run
    assert run["params_changed"] == [] and run["optimizer_tensors"] > 0
    assert run["optimizer_changed"] == []  # the fp32 main parameters, Adam's exp_avg, exp_avg_sq and step
    assert run["params_changed_after"] > 0 and run["optimizer_changed_after"] > 0  # a healthy step's update is seen
    assert any(name.endswith(".bundle.pt") for name in run["reports"]), run["reports"]
    kind = "HybridDeviceOptimizer" if optimizer == "hybrid" else "DistributedOptimizer"
    assert kind in run["optimizer_kinds"], run["optimizer_kinds"]


@pytest.mark.timeout(480)
def test_the_hook_costs_at_most_5_percent_and_1_mib_of_peak_memory(result):
    cost = result["cost"]
    assert cost["tokens"] >= 3000 and cost["sizes"]["num_layers"] == 8 and cost["sizes"]["hidden_size"] == 1024
    assert cost["time_ratio"] <= 1.05, cost
    assert cost["peak_extra_bytes"] <= MiB, cost

"""`nanscope repro` on a GPU node (scenario `harness`): the CPU's results with CUDA visible, no process holding the GPU."""

import pytest

from tests.gpu import scenario


@pytest.mark.timeout(540)
def test_repro_with_cuda_visible_gives_the_cpu_results_and_no_process_holds_the_gpu(tmp_path):
    r = scenario.run("harness", tmp_path / "harness.json", timeout_s=500)
    assert r["cuda_available_here"]  # the user's process sees the GPU: the harness hides it itself
    assert r["control"]["cuda_driver"]  # the check sees a process that holds the GPU (this one, after an allocation)
    for name in ("matrix", "plugin"):
        run = r[name]
        assert run["returncodes"] == {"visible": 0, "hidden": 0}, run["output_tail"]
        assert run["ok"] == {"visible": True, "hidden": True}
        assert run["differences"] == []  # the same JSON, timings and temp paths aside
        started = [p for p in run["processes"] if not p["root"]]
        assert len(started) >= 5, run["processes"]  # torchrun's agent and its 4 ranks at least
        for p in started:
            assert (
                p["environ"]["CUDA_VISIBLE_DEVICES"] == "" and p["environ"]["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
            ), p
            assert not p["cuda_driver"], p
    (root,) = [p for p in r["matrix"]["processes"] if p["root"]]
    assert not root["cuda_driver"], root  # the matrix's parent never imports torch

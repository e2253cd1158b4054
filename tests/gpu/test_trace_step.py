"""NANSCOPE_TRACE_STEP on CUDA input ids (scenario `trace_step`): the traced step names the case's op, sample and
token, and megatron's check then ends the step as without nanscope."""

import pytest

from tests.gpu import scenario


@pytest.mark.timeout(360)
def test_the_traced_step_on_cuda_names_the_op_sample_and_token(tmp_path):
    r = scenario.run("trace_step", tmp_path / "trace_step.json", timeout_s=300)
    assert r["input_ids_device"] == "cuda:0"
    assert r["error"] is not None and "found NaN in local grad norm" in r["error"], r["error"]
    assert any(name.endswith(".trace.json") for name in r["reports"]), r["reports"]
    sample, token = r["site"]
    fwd, bwd = r["trace"]["first"]["forward"], r["trace"]["first"]["backward"]
    assert (fwd["op"], fwd["sample"], fwd["token"], fwd["masked"]) == ("aten.exp.default", sample, token, True)
    assert (bwd["op"], bwd["node"], bwd["sample"], bwd["token"]) == ("aten.mul.Tensor", "ExpBackward0", sample, token)

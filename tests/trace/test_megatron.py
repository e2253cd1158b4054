"""Sentinel and tracer on the tiny megatron-core model, around forward_backward_func (one process)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("megatron_worker.py")


@pytest.mark.slow  # the fast tier traces under megatron through `repro --trace` (tests/cli/test_repro.py)
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_sentinel_and_tracer_name_the_kl_overflow_under_megatron(tmp_path):
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(WORKER), str(out)], check=True, timeout=280, capture_output=True)
    d = json.loads(out.read_text())
    sample, token = d["site"]
    mb, local = divmod(sample, d["per_micro"])  # 8 samples packed 4 per micro-batch
    # Both passes end where the case did: megatron's DDP bucket check.
    for err in (d["error_sentinel"], d["error_trace"]):
        assert "Unexpected result nan" in err and "bucket #0" in err
    # Sentinel: no module output is non-finite (the overflow is in the loss, outside the model);
    # in backward the first non-finite parameter gradient is the output layer's, in the hazard's
    # micro-batch: micro-batch 0 checked every parameter gradient once before it.
    r = d["reading"]
    assert r["forward"] is None
    n_params = len(d["param_names"])
    assert r["backward"] == {
        "module": "module.output_layer",
        "microbatch": mb,
        "order": mb * n_params,
        "param": "module.output_layer.weight",
    }
    assert "module.output_layer.weight" in r["grads"]
    # Tracer: exp in approx_kl (forward) and ExpBackward0's mul (backward) at the hazard's token,
    # sample numbered within its micro-batch.
    f, b = d["trace"]["forward"], d["trace"]["backward"]
    assert (f["op"], f["microbatch"], f["sample"], f["token"], f["masked"]) == (
        "aten.exp.default",
        mb,
        local,
        token,
        True,
    )
    assert " in approx_kl `k3 = (-log_ratio).exp() - 1 + log_ratio`" in f["source"]
    assert (b["op"], b["node"], b["microbatch"], b["sample"], b["token"]) == (
        "aten.mul.Tensor",
        "ExpBackward0",
        mb,
        local,
        token,
    )
    # Second pass, a healthy batch with one inf weight in layer 2's input norm (0-based layer 2 =
    # megatron's layer_number 3). Sentinel: the first non-finite module output in forward order is
    # that norm's, in micro-batch 0.
    p = d["poisoned_reading"]
    assert "Unexpected result nan" in d["poisoned_error"]
    assert (p["forward"]["module"], p["forward"]["microbatch"]) == ("module.decoder.layers.2.input_layernorm", 0)
    # Tracer: the inf parameter is an input (no op produced the inf); the first non-finite op output
    # is in that norm, at the first token; the first NaN comes later, out of inf inputs.
    t = d["poisoned_trace"]
    assert [i["name"] for i in t["inputs"]] == ["parameter module.decoder.layers.2.input_layernorm.weight"]
    ff = t["first_forward"]
    assert (ff["module"], ff["produced"], ff["microbatch"], ff["sample"], ff["token"], ff["axis"]) == (
        "module.decoder.layers.2.input_layernorm",
        "",
        0,
        0,
        0,
        "sequence",
    )
    assert t["forward"]["produced"] == "nan" and t["forward"]["index"] > ff["index"]
    assert t["forward"]["module"].startswith("module.decoder.layers.2.")

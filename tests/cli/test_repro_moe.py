"""`nanscope repro --hazard moe-zero-token-expert`: one real harness run (torchrun, gloo) through argv."""

import json

import pytest

from nanscope import case
from nanscope.cli.main import main


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    """repro's lines read whole at 160 columns, its width before issue 42 (the rule: tests/cli/test_terminal.py)."""
    monkeypatch.setenv("COLUMNS", "160")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_zero_token_expert_raises_the_case_s_message_and_the_report_names_the_expert(tmp_path, capsys):
    path = tmp_path / "z.json"
    assert main(["repro", "--hazard", "moe-zero-token-expert", "--json", str(path), "--timeout", "350"]) == 0
    doc = json.loads(path.read_text())
    assert (doc["expected"], doc["observed"], doc["frames_match_case"]) == ("nan-check", "nan-check", True)
    assert doc["fault"] == "decoder.layers.3.mlp.experts.local_experts.5:zero-tokens:nan"
    failed = [r for r in doc["ranks"] if r["error"] and r["error"].endswith(case.nan_check_message())]
    assert [r["rank"] for r in failed] == [2, 3]  # the last stage, which holds layer 3
    s = doc["sentinel"]
    assert {k: s[k] for k in ("rank", "step", "module", "direction", "microbatch", "class")} == {
        "rank": 2,
        "step": 1,
        "module": "decoder.layers.3.mlp.experts.local_experts.5.linear_fc2",
        "direction": "backward",
        "microbatch": 0,
        "class": "model-backward",
    }
    tokens = s["expert_tokens"]
    layers = {layer["layer"]: layer for layer in tokens["layers"]}
    assert list(layers) == ["decoder.layers.2.mlp", "decoder.layers.3.mlp"] and tokens["microbatch"] == 0
    layer3 = layers["decoder.layers.3.mlp"]
    assert layer3["experts"] == list(range(8)) and layer3["received"][5] == 0 and layer3["zero"] == [5]
    assert layer3["routed"][5] == 0 and all(count > 0 for i, count in enumerate(layer3["received"]) if i != 5)
    assert layers["decoder.layers.2.mlp"]["zero"] == []
    assert tokens["finding"] == (
        "expert 5 of layer 3 received 0 tokens, and its weight gradient is the first non-finite one "
        "(decoder.layers.3.mlp.experts.local_experts.5.linear_fc2.weight)"
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "expert 5 of layer 3 received 0 tokens, and its weight gradient is the first non-finite one" in out
    assert "as expected: moe-zero-token-expert under the as-is loss fails megatron-core's DDP NaN check" in out

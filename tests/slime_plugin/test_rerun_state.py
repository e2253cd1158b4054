"""The rerun's record of what a pass advances (`rerun.StepState`), on megatron-core's own TopKRouter with expert
bias: the tokens per expert the router's forward counted, the bias, and torch's RNG are put back for the rerun."""

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, torch
    from nanscope.megatron import bootstrap
    bootstrap.init()  # a gloo world of 1, megatron's parallel state
    from megatron.core.process_groups_config import ModelCommProcessGroups
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.moe.router import TopKRouter
    from nanscope.slime_plugin import rerun

    config = TransformerConfig(
        num_layers=1, hidden_size=8, num_attention_heads=1, num_moe_experts=4, moe_router_topk=2,
        moe_router_enable_expert_bias=True, moe_router_score_function="sigmoid", add_bias_linear=False,
        use_cpu_initialization=True,
    )
    router = TopKRouter(config, ModelCommProcessGroups.use_mpu_process_groups())
    model = torch.nn.ModuleDict({"router": router, "out": torch.nn.Linear(8, 8)})
    routers = rerun.router_state([model])
    with torch.no_grad():
        router.expert_bias += 0.25  # what earlier steps left
    state = rerun.StepState(routers, None)
    drawn = torch.rand(3)
    router(torch.randn(5, 1, 8))  # the first pass: the router counts its tokens per expert
    advanced = router.local_tokens_per_expert.tolist()
    with torch.no_grad():
        router.expert_bias += 1.0
    state.restore()
    print(json.dumps({
        "names": [list(names) for _, names in routers], "advanced": advanced,
        "counts": router.local_tokens_per_expert.tolist(), "bias": router.expert_bias.tolist(),
        "rng": torch.rand(3).tolist() == drawn.tolist(),
    }))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_step_record_puts_the_router_s_counts_bias_and_rng_back():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["names"] == [["expert_bias", "local_tokens_per_expert"]]  # the router only, found once
    assert sum(got["advanced"]) == 5 * 2  # 5 tokens, top-2: the forward counted them
    assert got["counts"] == [0.0] * 4 and got["bias"] == [0.25] * 4  # as before the pass
    assert got["rng"] is True

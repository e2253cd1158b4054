"""Full activation recompute on CPU (--recompute-granularity full, as in the case): megatron's CheckpointFunction
saves and restores the CUDA generator around the recompute (tensor_parallel/random.py:383, :391), which the CPU
layer stands in for (`cpu_megatron.CpuRecomputeRng`). The gradients equal those of the same step without recompute."""

import subprocess
import sys
import textwrap

import pytest

WORKER = textwrap.dedent(
    """
    import json
    import torch
    from nanscope.megatron import bootstrap, model

    torch.set_num_threads(1)
    bootstrap.init()
    grads = []
    for recompute in (False, True):
        (chunk,), _ = model.build_chunks(seed=0, bf16=False, training=model.Training(recompute=recompute))
        tokens = torch.arange(64).remainder(512).unsqueeze(0)
        logits = chunk(input_ids=tokens, position_ids=None, attention_mask=None, labels=None)
        logits.float().pow(2).mean().backward()
        grads.append({n: p.main_grad.clone() for n, p in chunk.named_parameters()})
    without, with_ = grads
    print(json.dumps({"params": len(without), "equal": [n for n in without if torch.equal(without[n], with_[n])],
                      "nonzero": sum(bool(g.abs().sum() > 0) for g in with_.values())}))
    """
)


@pytest.mark.slow  # ~10-30 s on 2 cores; the layout matrix's recompute layout covers it too
@pytest.mark.integration
@pytest.mark.timeout(180)
def test_full_recompute_runs_on_cpu_and_gives_the_gradients_without_it():
    proc = subprocess.run([sys.executable, "-c", WORKER], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = __import__("json").loads(proc.stdout.splitlines()[-1])
    assert len(result["equal"]) == result["params"] and result["nonzero"] > result["params"] // 2

"""CP at the loss level: the zigzag split over 2 simulated CP ranks gives the loss, gradient and
metrics of the whole sequence (no process group: TP 1, DP 1)."""

import pytest
import torch

from nanscope import case, hazards
from nanscope.loss import as_is
from nanscope.megatron import step


@pytest.fixture
def single_process(monkeypatch):
    from megatron.core import parallel_state as mpu

    monkeypatch.setattr(mpu, "get_tensor_model_parallel_group", lambda *a, **k: None)
    monkeypatch.setattr(mpu, "get_data_parallel_world_size", lambda *a, **k: 1)


@pytest.mark.parametrize("hazard", ["healthy", "kl-exp-overflow"])
def test_zigzag_cp2_matches_whole_sequence(single_process, hazard):
    policy = hazards.synthetic_policy(512, seed=3)
    batch = hazards.build(hazard, policy, case.rollout(512, seed=3), seed=3)
    args = case.args(global_batch_size=8)
    i = batch["hazard_site"][0] if batch["hazard_site"] else 0
    mb = step._sample(batch, i)
    total = mb["total_lengths"][0]
    # [1, S, V]: the sample's logits then padding to the harness's fixed length (zeros, as a model's
    # padded positions would be ignored).
    logits = policy(batch["unconcat_tokens"])[i][None]  # the synthetic policy's logits depend on i
    padded = torch.nn.functional.pad(logits, (0, 0, 0, step.seq_length_for([total], 1) - total))

    out = {}
    for cp in (1, 2):
        x = padded.clone().requires_grad_(True)
        loss, normalizer, log = step._cp_loss(
            x, loss_function=as_is.loss_function, args=args, batch=mb, num_microbatches=8, cp=cp
        )
        loss.backward()
        # slime's reduction on the last stage: value * cp / num_samples (counted once per CP rank)
        metrics = (log["values"][1:] * cp / log["values"][0]).tolist()
        out[cp] = (loss.detach(), x.grad, metrics, normalizer)
    (l1, g1, m1, n1), (l2, g2, m2, n2) = out[1], out[2]
    assert n1 == n2 == 1
    torch.testing.assert_close(l2, l1)
    torch.testing.assert_close(m2, m1, rtol=1e-5, atol=1e-6)  # fp32 sums in a different order
    finite = torch.isfinite(g1)
    assert torch.equal(finite, torch.isfinite(g2))  # NaN in the same places (kl-exp-overflow)
    torch.testing.assert_close(g2[finite], g1[finite])
    assert g1[:, total:].abs().sum() == 0  # padding gets no gradient
    assert (hazard == "healthy") == bool(finite.all())

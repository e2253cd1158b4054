"""Classify: the sentinel's real readings on a small model with a planted fault -> the class and its evidence."""

import pytest
import torch

from nanscope.causes.classes import CLASSES, DATA, LOSS_NUMERICS, MODEL_BACKWARD, MODEL_FORWARD, OPTIMIZER
from nanscope.trace.sentinels.classify import Observation, classify, layer_of
from nanscope.trace.sentinels.reading import Hit, Producer
from nanscope.trace.sentinels.sentinel import Sentinel


class Net(torch.nn.Module):
    """Three linear layers named as megatron names its decoder layers: layers.0, layers.1, layers.2."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class _NanBackward(torch.autograd.Function):
    """Identity forward; NaN gradient backward: a kernel bug in the module it wraps."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, float("nan"))


def _plant(module, direction):
    def hook(mod, args, out):
        if direction == "forward":
            return out.index_fill(-1, torch.tensor([0]), float("inf"))
        return _NanBackward.apply(out)

    module.register_forward_hook(hook)


def _step(fault=None, loss="plain", advantages=None, lr=None):
    """One forward/backward (two micro-batches) under the sentinel; returns the Observation it gives."""
    net = Net()
    if fault is not None:
        _plant(net.layers[fault[0]], fault[1])  # registered before the sentinel's hooks: it sees the fault
    sentinel = Sentinel([net])
    adv = torch.ones(4) if advantages is None else advantages
    out_grads = []
    for mb in range(2):
        out = net(torch.full((2, 4), 0.5 + mb))
        out.register_hook(lambda g: out_grads.append(bool(torch.isfinite(g).all())))
        if loss == "exp-then-clamp":  # finite forward, 0 * inf = NaN backward
            value = (out + 100).exp().clamp(max=1.0).sum()
        else:
            value = (out * adv).sum()
        value.backward()
    reading = sentinel.read(grads=True)
    params = ()
    if lr is not None:
        torch.optim.SGD(net.parameters(), lr=lr).step()
        params = tuple(n for n, p in net.named_parameters() if not torch.isfinite(p).all())
    inputs = {"advantages": (int((~torch.isfinite(adv)).sum()), adv.numel())}
    return Observation(
        reading.forward, reading.backward, tuple(reading.grads), inputs, all(out_grads), nonfinite_params=params
    )


def test_healthy_step_has_no_class():
    c = classify(_step())
    assert (c.cls, c.candidates, c.module, c.finite) == (None, (), None, True)
    assert c.evidence == ["no non-finite module output, loss input, gradient or parameter"]


def test_forward_fault_is_model_forward_naming_the_layer():
    c = classify(_step(fault=(1, "forward")))
    assert (c.cls, c.module, c.direction, c.microbatch) == (MODEL_FORWARD, "layers.1", "forward", 0)
    assert c.evidence[0] == "first non-finite output in forward order: module layers.1 (decoder layer 1), micro-batch 0"


def test_backward_fault_is_model_backward_naming_the_module():
    c = classify(_step(fault=(1, "backward")))
    assert (c.cls, c.module, c.direction, c.microbatch) == (MODEL_BACKWARD, "layers.1", "backward", 0)
    assert "first non-finite parameter gradient in backward order: layers.1.bias" in c.evidence[2]
    assert c.evidence[-1].startswith("the gradient arriving at the model's output was finite")


def test_exp_overflow_in_the_loss_is_loss_numerics():
    obs = _step(loss="exp-then-clamp")
    assert obs.forward is None and obs.output_grad_finite is False
    c = classify(obs)
    # backward reaches the last layer first: its gradient is the first non-finite one
    assert (c.cls, c.module, c.direction) == (LOSS_NUMERICS, "layers.2", "backward")
    assert c.evidence[:2] == ["the model's forward was finite", "every loss input was finite"]


def test_nonfinite_advantage_is_data():
    adv = torch.tensor([1.0, float("nan"), 1.0, 1.0])
    c = classify(_step(advantages=adv))
    assert (c.cls, c.module) == (DATA, None)
    assert c.evidence == [
        "the model's forward was finite",
        "non-finite loss inputs: advantages: 1 of 4 entries non-finite",
    ]


def test_update_that_writes_nonfinite_parameters_is_optimizer():
    c = classify(_step(lr=float("inf")))
    assert c.cls == OPTIMIZER
    assert c.evidence[1].startswith("non-finite parameters after the step: layers.0.weight, layers.0.bias")


def test_all_log_probs_nonfinite_points_at_the_log_prob_pass():
    c = classify(
        Observation(loss_inputs={"log_probs": (96, 96), "ref_log_probs": (96, 96), "rollout_log_probs": (0, 96)})
    )
    assert c.cls == DATA
    assert c.evidence[1] == (
        "non-finite loss inputs: log_probs: 96 of 96 entries non-finite (all); "
        "ref_log_probs: 96 of 96 entries non-finite (all)"
    )
    assert "--rollout-temperature" in c.evidence[2]


def test_a_forward_fault_outranks_the_poisoned_loss_inputs():
    hit = Hit("decoder.layers.1.mlp", 2, 40)
    c = classify(Observation(forward=hit, loss_inputs={"log_probs": (96, 96)}, layer_offset=2))
    assert (c.cls, c.microbatch) == (MODEL_FORWARD, 2)
    assert "decoder.layers.1.mlp (decoder layer 3)" in c.evidence[0]


@pytest.mark.parametrize(
    "output_grad, last, inputs, cls, candidates",
    [
        (None, True, None, None, (DATA, LOSS_NUMERICS, MODEL_BACKWARD)),
        (None, True, {}, None, (LOSS_NUMERICS, MODEL_BACKWARD)),
        (False, True, None, None, (DATA, LOSS_NUMERICS)),
        (False, True, {}, LOSS_NUMERICS, (LOSS_NUMERICS,)),
        (False, False, None, None, (DATA, LOSS_NUMERICS, MODEL_FORWARD, MODEL_BACKWARD)),
        (True, False, None, MODEL_BACKWARD, (MODEL_BACKWARD,)),
    ],
)
def test_backward_hits_decide_only_what_was_observed(output_grad, last, inputs, cls, candidates):
    hit = Hit("output_layer", 0, 0, "output_layer.weight")
    c = classify(Observation(backward=hit, output_grad_finite=output_grad, last_stage=last, loss_inputs=inputs))
    assert (c.cls, c.candidates, c.module) == (cls, candidates, "output_layer")
    assert set(c.candidates) <= set(CLASSES)


def test_fused_gradient_seen_only_accumulated():
    c = classify(Observation(grads=("decoder.layers.0.mlp.linear_fc1.weight",), output_grad_finite=True))
    assert (c.cls, c.module, c.microbatch) == (MODEL_BACKWARD, "decoder.layers.0.mlp.linear_fc1", None)
    assert "a fused kernel" in c.evidence[2]


def test_to_dict_keys():
    d = classify(Observation(forward=Hit("embedding", 0, 0))).to_dict()
    assert d == {
        "class": MODEL_FORWARD,
        "candidates": [MODEL_FORWARD],
        "module": "embedding",
        "direction": "forward",
        "microbatch": 0,
        "evidence": d["evidence"],
    }


def test_layer_of():
    assert [
        layer_of("decoder.layers.12.mlp"),
        layer_of("layers.3"),
        layer_of("decoder.final_layernorm"),
        layer_of("decoder.layers.0", 24),
    ] == [12, 3, None, 24]


def test_a_stage_without_the_loss_says_where_the_loss_is():
    hit = Hit("decoder.layers.0.mlp", 0, 3, "decoder.layers.0.mlp.router.weight")
    c = classify(Observation(backward=hit, output_grad_finite=True, last_stage=False))
    assert c.cls == MODEL_BACKWARD and c.evidence[1] == "the loss runs on the last pipeline stage"


def test_the_producer_of_the_first_nonfinite_output_gradient_is_the_module_named():
    # Parameter checks reach a child first (the experts' last linear); the output-gradient checks show the
    # gradient was finite at the router's output and non-finite at the next output checked.
    hit = Hit("decoder.layers.0.self_attention.linear_proj", 1, 7, "decoder.layers.0.self_attention.linear_proj.weight")
    made = Producer("decoder.layers.0.mlp.router", "decoder.layers.0.pre_mlp_layernorm", 1)
    c = classify(Observation(backward=hit, output_grad_finite=True, loss_inputs={}, producer=made, layer_offset=2))
    assert (c.cls, c.module, c.direction, c.microbatch) == (
        MODEL_BACKWARD,
        "decoder.layers.0.mlp.router",
        "backward",
        1,
    )
    assert c.evidence[3] == (
        "first non-finite gradient at a module output in backward order: at decoder.layers.0.pre_mlp_layernorm's "
        "output, micro-batch 1, checked right after the finite gradient at decoder.layers.0.mlp.router's output: "
        "module decoder.layers.0.mlp.router (decoder layer 2)'s own backward made it"
    )
    # a gradient that arrived non-finite names no producer: the parameter hit stands
    arrived = Producer(None, "output_layer", 0)
    c = classify(Observation(backward=hit, output_grad_finite=False, loss_inputs={}, producer=arrived))
    assert c.module == "decoder.layers.0.self_attention.linear_proj"

"""Faults planted in a model: the spec, the public module names, and what a planted fault does to values."""

import pytest
import torch

from nanscope.errors import UserError
from nanscope.megatron import faults


def test_parse_a_spec():
    f = faults.parse("decoder.layers.0.mlp:backward:nan", 3)
    assert (f.module, f.direction, f.value, f.step, f.spec) == (
        "decoder.layers.0.mlp",
        "backward",
        "nan",
        3,
        "decoder.layers.0.mlp:backward:nan",
    )


@pytest.mark.parametrize(
    "text, step, message",
    [
        (
            "decoder.layers.0.mlp",
            None,
            "--fault 'decoder.layers.0.mlp': expected MODULE:forward|backward:nan|inf, "
            "e.g. decoder.layers.0.mlp:forward:inf"
            ", or EXPERT:zero-tokens:nan|inf, e.g. decoder.layers.3.mlp.experts.local_experts.5:zero-tokens:nan",
        ),
        (
            "decoder.layers.0.mlp:sideways:inf",
            None,
            "--fault 'decoder.layers.0.mlp:sideways:inf': expected "
            "MODULE:forward|backward:nan|inf, e.g. decoder.layers.0.mlp:forward:inf"
            ", or EXPERT:zero-tokens:nan|inf, e.g. decoder.layers.3.mlp.experts.local_experts.5:zero-tokens:nan",
        ),
        (
            ":forward:nan",
            None,
            "--fault ':forward:nan': expected MODULE:forward|backward:nan|inf, e.g. decoder.layers.0.mlp:forward:inf"
            ", or EXPERT:zero-tokens:nan|inf, e.g. decoder.layers.3.mlp.experts.local_experts.5:zero-tokens:nan",
        ),
        (
            "output_layer:forward:zero",
            None,
            "--fault 'output_layer:forward:zero': expected "
            "MODULE:forward|backward:nan|inf, e.g. decoder.layers.0.mlp:forward:inf"
            ", or EXPERT:zero-tokens:nan|inf, e.g. decoder.layers.3.mlp.experts.local_experts.5:zero-tokens:nan",
        ),
        ("output_layer:forward:inf", 0, "--fault-step 0: expected a step >= 1"),
    ],
)
def test_a_bad_spec_is_one_line(text, step, message):
    with pytest.raises(UserError) as e:
        faults.parse(text, step)
    assert str(e.value) == message


def test_public_names_strip_the_wrappers_and_make_layers_global():
    assert faults.public_name("module.module.decoder.layers.1.mlp.router", 2) == "decoder.layers.3.mlp.router"
    assert faults.public_name("module.module.decoder.layers.0", 2) == "decoder.layers.2"
    assert faults.public_name("module.output_layer", 2) == "output_layer"
    assert faults.public_name("module.module", 0) == faults.public_name("", 0) == ""


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.fc(x)), None  # megatron's MLP / MoE layers return (output, bias)


class Tiny(torch.nn.Module):
    """Named like megatron's stage: decoder.layers.{0,1}, output_layer; wrapped once like DDP."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.decoder = torch.nn.Module()
        self.decoder.layers = torch.nn.ModuleList(Block() for _ in range(2))
        self.output_layer = torch.nn.Linear(4, 2)

    def forward(self, x):
        for layer in self.decoder.layers:
            x, _ = layer(x)
        return self.output_layer(x)


def _run(spec=None, offset=0, active=True):
    wrapped = torch.nn.Sequential()
    wrapped.module = Tiny()
    handles = faults.plant(wrapped, faults.parse(spec), offset, lambda: active) if spec else []
    outputs = []
    wrapped.module.decoder.layers[1].register_forward_hook(lambda m, a, out: outputs.append(out[0]))
    out = wrapped.module(torch.full((3, 4), 0.5))
    out.sum().backward()
    grads = {n: p.grad for n, p in wrapped.module.named_parameters()}
    return handles, outputs[0], out, grads


def test_forward_fault_puts_one_value_in_the_module_output():
    handles, layer1, out, _ = _run("decoder.layers.3:forward:inf", offset=2)  # global 3 = local 1 of this stage
    assert len(handles) == 1
    assert torch.isinf(layer1).sum() == 1 and torch.isposinf(layer1.flatten()[0])
    assert not torch.isfinite(out).all()


def test_backward_fault_leaves_the_forward_and_poisons_the_module_gradients():
    _, clean_layer1, clean_out, clean_grads = _run()
    handles, layer1, out, grads = _run("decoder.layers.1:backward:nan")
    assert len(handles) == 1 and torch.equal(layer1, clean_layer1) and torch.equal(out, clean_out)
    assert torch.equal(grads["output_layer.weight"], clean_grads["output_layer.weight"])  # after it: finite
    assert torch.isnan(grads["decoder.layers.1.fc.weight"]).any()  # its own backward made the NaN
    assert torch.isnan(grads["decoder.layers.0.fc.weight"]).any()  # and everything before it


def test_a_fault_fires_only_when_active_and_only_where_the_stage_holds_the_module():
    _, _, clean_out, _ = _run()
    assert torch.equal(_run("decoder.layers.1:forward:nan", active=False)[2], clean_out)
    handles, _, out, _ = _run("decoder.layers.1:forward:nan", offset=2)  # this stage holds layers 2-3
    assert handles == [] and torch.equal(out, clean_out)


def test_the_harness_model_names_and_an_unknown_module():
    names = faults.module_names()  # the real tiny Qwen3-MoE, built in a child process
    assert len(names) == len(set(names)) == 176
    assert names[0] == "embedding" and names[-1] == "output_layer"
    for name in (
        "decoder.layers.1.mlp.router",
        "decoder.layers.3.mlp.experts.local_experts.7",
        "decoder.layers.0.self_attention",
        "decoder.final_layernorm",
    ):
        assert name in names
    faults.check(faults.parse("decoder.layers.1.mlp.router:forward:nan"))
    with pytest.raises(UserError) as e:
        faults.check(faults.parse("decoder.layers.4.mlp:forward:nan"))
    assert str(e.value) == (
        "--fault decoder.layers.4.mlp:forward:nan: the harness model has no module "
        "'decoder.layers.4.mlp' (`nanscope repro --list-modules` lists them)"
    )


def test_a_router_fault_hits_its_first_routed_prob_forward_and_backward():
    from tests.trace.moe_toy import Stage

    stage = Stage()
    faults.plant(stage, faults.parse("decoder.layers.0.mlp.router:forward:nan"), 0, lambda: True)
    router = stage.module.decoder.layers[0].mlp.router
    seen = []
    router.register_forward_hook(lambda m, a, out: seen.append(out))
    torch.manual_seed(1)
    out = stage(torch.randn(8, 4))
    probs, routing_map = seen[0]
    first = routing_map.reshape(-1).int().argmax()  # the first True: an unrouted prob is never read
    assert torch.isnan(probs).sum() == 1 and torch.isnan(probs.reshape(-1)[first])
    assert not torch.isfinite(out).all()
    stage = Stage()
    faults.plant(stage, faults.parse("decoder.layers.1.mlp.router:backward:nan"), 0, lambda: True)
    out = stage(torch.randn(8, 4))
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isnan(stage.module.decoder.layers[1].mlp.router.weight.grad).any()


def test_a_zero_tokens_fault_names_an_expert():
    f = faults.parse("decoder.layers.3.mlp.experts.local_experts.5:zero-tokens:nan")
    assert (f.module, f.direction, f.value) == ("decoder.layers.3.mlp.experts.local_experts.5", "zero-tokens", "nan")
    with pytest.raises(UserError) as e:
        faults.parse("decoder.layers.3.mlp:zero-tokens:nan")
    assert str(e.value) == (
        "--fault decoder.layers.3.mlp:zero-tokens: expected an expert, decoder.layers.L.mlp.experts.local_experts.E"
    )

"""The tracer on small modules: producer vs propagator, module path, source line, allow-list."""

import inspect
import warnings

import torch

from nanscope.trace.tracer.locator import Tracer


class LogBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.log(self.fc(x))  # NaN where fc(x) < 0


class Net(torch.nn.Module):
    """fc -> log (NaN producer) -> two more Linears that only propagate."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(torch.nn.Linear(4, 4), LogBlock(), torch.nn.Linear(4, 4))
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.head(self.blocks(x))


def _line(fn, needle):
    lines, start = inspect.getsourcelines(fn)
    (hit,) = [start + i for i, line in enumerate(lines) if needle in line]
    return hit


def test_forward_producer_is_the_log_in_its_module_not_the_layers_after_it():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(3, 4)
    with Tracer(modules=[net]) as t:
        net(x).sum().backward()
    r = t.report()
    f = r.forward
    assert (f.op, f.phase, f.module, f.produced) == ("aten.log.default", "forward", "blocks.1", "nan")
    assert f.source.endswith(
        f"test_locator.py:{_line(LogBlock.forward, 'torch.log')} in forward `return torch.log(self.fc(x))  # NaN where fc(x) < 0`"
    )
    assert r.first_forward is f  # nothing non-finite before it
    # The first NaN entry: the log's input there is negative.
    assert float(f.input_summary[0].rsplit(": ", 1)[1]) < 0
    assert f.nonfinite["nan"] == int((net.blocks[1].fc(net.blocks[0](x)) < 0).sum())
    # Backward: every NaN there comes from the forward's NaN activations; no backward op produces one.
    assert r.backward is None and r.first_backward is not None
    assert r.ops_seen > 20


def test_detect_anomaly_blames_a_propagator_the_tracer_does_not():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.autograd.detect_anomaly(check_nan=True):
                net(x).sum().backward()
            blamed = None
        except RuntimeError as e:
            blamed = str(e).split("'")[1]
    assert blamed == "AddmmBackward0"  # the head Linear's backward: it only multiplies NaN activations
    with Tracer(modules=[net]) as t:
        net(x).sum().backward()
    assert t.report().forward.op == "aten.log.default" and t.report().backward is None


class SqrtNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Linear(3, 3, bias=False)

    def forward(self, x):
        return torch.sqrt(torch.relu(self.scale(x)))  # finite; d sqrt / dx = 1 / (2 sqrt(0)) = inf at 0


def test_backward_inf_producer_named_with_its_forward_node_and_module():
    net = SqrtNet()
    with torch.no_grad():
        net.scale.weight.copy_(torch.eye(3))
    x = torch.tensor([[1.0, 0.0, 4.0]])
    with Tracer(modules=[net]) as t:
        net(x).sum().backward()
    r = t.report()
    assert r.forward is None and r.first_forward is None  # sqrt(0) = 0: the forward is finite
    b = r.backward
    # SqrtBackward0 = grad / (2 * result): 1 / 0 = +inf at entry 1, from finite inputs.
    assert (b.node, b.created_by, b.module, b.produced, b.first_index) == ("SqrtBackward0", "sqrt", "", "inf", 1)
    assert b.op == "aten.div.Tensor" and b.nonfinite == {"nan": 0, "posinf": 1, "neginf": 0}
    assert b.source.endswith(f"in forward `{inspect.getsource(SqrtNet.forward).splitlines()[1].strip()}`")
    # detect_anomaly(check_nan=True) only looks for NaN: it lets this inf through silently.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly(check_nan=True):
            net(x).sum().backward()


def test_constant_minus_inf_mask_is_not_a_producer_and_allow_list_silences_ops():
    x = torch.randn(2, 5)
    mask = torch.tensor([[False, True, False, False, True]] * 2)
    with Tracer() as t:
        torch.softmax(x.masked_fill(mask, float("-inf")), dim=-1)
    r = t.report()
    assert r.forward is None and r.first_forward.op == "aten.masked_fill.Scalar"
    # log(0) = -inf from finite inputs is a producer, unless allow-listed (by name or predicate).
    z = torch.tensor([0.0, 1.0])
    with Tracer() as t:
        torch.log(z)
    assert (t.report().forward.op, t.report().forward.produced) == ("aten.log.default", "inf")
    for allow in (("aten.log",), lambda op, module: op.startswith("aten.log")):
        with Tracer(allow=allow) as t:
            torch.log(z)
        assert t.report().forward is None


def test_nonfinite_input_is_propagation_and_token_map_applies():
    x = torch.zeros(4, 2)
    x[2, 1] = float("nan")
    lin = torch.nn.Linear(2, 2)
    with Tracer(
        modules=[lin], token_map=lambda shape, i: (i // shape[-1], 0, "response", None) if len(shape) == 2 else None
    ) as t:
        lin(x)
    r = t.report()
    assert r.forward is None
    assert (r.first_forward.op, r.first_forward.module, r.first_forward.sample) == ("aten.addmm.default", "", 2)


def test_tracer_leaves_no_hooks_or_modes_behind():
    net = Net()
    with Tracer(modules=[net]):
        pass
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())
    assert not torch._C._is_torch_function_mode_enabled()
    assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY) is None


def test_several_chunks_get_prefixed_paths():
    a, b = SqrtNet(), Net()
    torch.manual_seed(0)
    with Tracer(modules=[a, b]) as t:
        b(torch.randn(3, 4))
    assert t.report().forward.module == "chunk1.blocks.1"


def test_nonfinite_parameters_are_reported_as_inputs():
    from nanscope.trace.tracer import text as render

    net = Net()
    with torch.no_grad():
        net.head.weight[0, 2] = float("inf")
    with Tracer(modules=[net]) as t:
        net.head(torch.ones(1, 4))
    r = t.report()
    assert [(i.name, i.nonfinite) for i in r.inputs] == [
        ("parameter head.weight", {"nan": 0, "posinf": 1, "neginf": 0})
    ]
    # The Linear multiplies the inf weight by finite inputs: propagation, no producer.
    assert r.forward is None and r.first_forward.module == "head"
    assert "  parameter head.weight: 1 posinf\n" in "\n".join(render.lines(r)) + "\n"


def test_uninitialised_memory_is_not_blamed():
    with Tracer() as t:
        x = torch.empty(4)
        x.fill_(float("nan"))  # filling with a constant NaN: the constant is an input
        torch.empty_strided((2, 2), (2, 1)).zero_()
    r = t.report()
    assert r.forward is None and r.first_forward.op == "aten.fill_.Scalar"


def test_a_view_of_an_unwritten_buffer_is_not_a_non_finite_output():
    # megatron's attention: a view of a torch.empty buffer made on an earlier step (its bits NaN here), read by
    # baddbmm with beta=0, which ignores it (dot_product_attention.py:156-161)
    buffer = torch.full((32,), float("nan"))
    q, k = torch.ones(2, 2, 3), torch.ones(2, 3, 2)
    with Tracer() as t:
        scores = torch.baddbmm(buffer[0:8].view(2, 2, 2), q, k, beta=0.0, alpha=0.5)
        torch.log(scores - 1.5)  # log(0): -inf, the first non-finite result
    r = t.report()
    assert (r.first_forward.op, r.forward.op, r.forward.produced) == ("aten.log.default", "aten.log.default", "inf")


def test_out_buffers_are_not_inputs():
    buf = torch.full((2,), float("nan"))  # stale NaN in the out= buffer: overwritten, not read
    with Tracer() as t:
        torch.exp(torch.tensor([1.0, 100.0]), out=buf)
    f = t.report().forward
    assert (f.op, f.produced, f.first_index) == ("aten.exp.out", "inf", 1)

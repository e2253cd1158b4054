"""The sentinel: first non-finite module in forward and backward order, per micro-batch, no host sync."""

import pytest
import torch

from nanscope.trace.sentinels import call_layers, grad_screens, slots
from nanscope.trace.sentinels.reading import Hit, Producer
from nanscope.trace.sentinels.sentinel import Sentinel


class Exp(torch.nn.Module):
    def forward(self, x):
        return x.exp()


class Net(torch.nn.Module):
    """fc1 -> exp -> fc2: an input of 100 overflows exp (fp32 limit 88.72)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(2, 2)
        self.exp = Exp()
        self.fc2 = torch.nn.Linear(2, 1)
        with torch.no_grad():
            self.fc1.weight.copy_(torch.eye(2))
            self.fc1.bias.zero_()

    def forward(self, x):
        return self.fc2(self.exp(self.fc1(x)))


GOOD = torch.tensor([[0.5, -0.5]])
BAD = torch.tensor([[100.0, 0.0]])


def _step(net, inputs):
    for x in inputs:  # one micro-batch each, gradients accumulate
        net(x).sum().backward()


def test_first_module_in_forward_and_backward_order_with_its_microbatch():
    net = Net()
    s = Sentinel([net])
    _step(net, [GOOD, BAD, BAD])
    r = s.read()
    # Per micro-batch the output checks run fc1, exp, fc2 (post-hooks: inner modules first; the root
    # returns fc2's tensor itself, which is not checked twice): micro-batch 1's exp is call 3 + 1 = 4.
    assert r.forward == Hit("exp", 1, 4, None)
    # Backward: fc2's weight gradient is grad^T @ exp output (inf): the first bad parameter gradient.
    # fc2.bias gets sum(grad) = 1 (finite). Micro-batch 0 checked 4 parameter gradients first.
    assert (r.backward.module, r.backward.param, r.backward.microbatch) == ("fc2", "fc2.weight", 1)
    assert r.backward.order >= 4
    assert r.step == 0 and not r.finite
    # read() starts a new step.
    _step(net, [GOOD])
    r2 = s.read()
    assert (r2.step, r2.forward, r2.backward) == (1, None, None)
    # .grad accumulated over steps still holds the bad values: read(grads=True) sees them. fc2.weight:
    # inf; fc1: d/dh = w2 * exp(h) = inf, times x = (100, 0) -> inf and 0 * inf = NaN; fc2.bias: finite.
    assert s.read(grads=True).grads == ["fc1.weight", "fc1.bias", "fc2.weight"]


def test_grads_reads_main_grad_when_present():
    net = Net()
    s = Sentinel([net], params=False)
    for p in net.parameters():
        p.main_grad = torch.zeros_like(p)
    net.fc1.bias.main_grad[1] = float("nan")
    r = s.read(grads=True)
    assert r.grads == ["fc1.bias"] and r.forward is None and r.backward is None
    assert grad_screens.check_grads(net) == ["fc1.bias"]
    assert grad_screens.check_grads([("w", torch.nn.Parameter(torch.zeros(2)))]) == []  # no grad yet
    # 1e20 is finite, but its square overflows the 2-norm used as a fast screen: re-checked exactly.
    net.fc1.bias.main_grad.fill_(1e20)
    assert s.read(grads=True).grads == [] and grad_screens.check_grads(net) == []


def test_hooks_never_read_a_flag_on_the_host(monkeypatch):
    """No .item()/bool()/tolist() while the step runs: the only sync is read()."""
    net = Net()
    s = Sentinel([net])

    def boom(*_args, **_kwargs):
        raise AssertionError("host sync inside a sentinel hook")

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "cpu", "numpy"):
            m.setattr(torch.Tensor, name, boom)
        _step(net, [GOOD, BAD])
    assert s.read().forward == Hit("exp", 1, 4, None)


def test_folding_keeps_the_exact_order(monkeypatch):
    monkeypatch.setattr(slots, "_FOLD", 3)
    net = Net()
    s = Sentinel([net])
    _step(net, [GOOD] * 5 + [BAD])  # 5 clean micro-batches x 3 checks: exp of micro-batch 5 is call 16
    assert s.read().forward == Hit("exp", 5, 16, None)


def test_several_chunks_and_remove():
    a, b = Net(), Net()
    s = Sentinel([a, b])
    a(GOOD).sum().backward()
    b(BAD).sum().backward()
    r = s.read()
    assert (r.forward.module, r.forward.microbatch, r.backward.param) == ("chunk1.exp", 0, "chunk1.fc2.weight")
    s.remove()
    b(BAD).sum().backward()
    assert s.read().forward is None
    assert all(not m._forward_hooks for m in b.modules())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_every_nonfinite_class_is_flagged(bad):
    lin = torch.nn.Linear(2, 2)
    s = Sentinel(lin)
    lin(torch.tensor([[bad, 0.0]]))
    assert s.read().forward == Hit("", 0, 0, None)


def test_identity_modules_are_not_checked_twice():
    net = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Dropout(0.0), Exp())
    s = Sentinel(net)
    net.eval()
    net(BAD)
    # Identity and Dropout return their input tensor: only Exp's output is checked (call 0).
    assert s.read().forward == Hit("2", 0, 0, None)


def test_include_selects_the_checked_modules():
    net = Net()
    s = Sentinel([net], params=False, include=lambda name, m: name != "exp")
    _step(net, [BAD])
    # exp is not checked: the first non-finite output is fc2's (call 1 after fc1's call 0).
    assert s.read().forward == Hit("fc2", 0, 1, None)


def test_sentinel_keeps_no_activation_alive():
    import gc
    import weakref

    net = Net()
    s = Sentinel([net])
    with torch.no_grad():
        out = net(GOOD)
    ref = weakref.ref(out)
    del out
    gc.collect()
    assert ref() is None  # only 0-dim sums and a weak reference are kept
    assert s.read().finite


def test_reading_in_words():
    from nanscope.trace.tracer import text as render

    net = Net()
    s = Sentinel([net])
    _step(net, [GOOD, BAD])
    assert render.reading_lines(s.read(grads=True)) == [
        "sentinel step 0: non-finite values",
        "  forward:  first non-finite module output: 'exp', micro-batch 1 (check #4)",
        # micro-batch 0 checked 4 gradients (#0-#3); in micro-batch 1 the engine accumulates fc2.bias
        # (= sum of ones, finite: #4) before fc2.weight (#5).
        "  backward: first non-finite parameter gradient: fc2.weight (module 'fc2'), micro-batch 1 (check #5)",
        "  accumulated gradients non-finite: fc1.weight, fc1.bias, fc2.weight",
    ]
    _step(net, [GOOD])
    assert render.reading_lines(s.read()) == ["sentinel step 1: every module output and parameter gradient finite"]


def test_remove_restores_every_module_call_and_sentinels_stack():
    net = Net()
    first, second = Sentinel([net]), Sentinel([net])
    _step(net, [BAD])
    assert first.read().forward == second.read().forward == Hit("exp", 0, 1, None)
    first.remove()  # the other sentinel keeps checking
    _step(net, [BAD])
    assert first.read().forward is None and second.read().forward == Hit("exp", 0, 1, None)
    second.remove()
    assert all("_call_impl" not in vars(m) and call_layers.CHECKS not in vars(m) for m in net.modules())


def test_checks_see_forward_hooks_registered_after_the_sentinel():
    net = Net()
    s = Sentinel([net])
    net.fc1.register_forward_hook(lambda m, a, out: out * float("inf"))  # a fault planted after the sentinel
    _step(net, [GOOD])
    assert s.read().forward == Hit("fc1", 0, 0, None)


def test_a_global_forward_hook_runs_and_is_checked():
    # Without hooks a wrapper calls forward straight away, as nn.Module does; a process-wide hook (here one
    # that poisons fc1's output) sends every call through nn.Module's hook path again.
    net = Net()
    s = Sentinel([net])
    poison = torch.nn.modules.module.register_module_forward_hook(
        lambda m, a, out: out * float("inf") if m is net.fc1 else None
    )
    try:
        _step(net, [GOOD])
    finally:
        poison.remove()
    assert s.read().forward == Hit("fc1", 0, 0, None)
    _step(net, [GOOD])
    assert s.read().finite


def test_a_module_class_with_its_own_call_keeps_it():
    class Doubling(torch.nn.Linear):  # its call doubles the output; forward alone does not
        def _call_impl(self, *args, **kwargs):
            return 2 * super()._call_impl(*args, **kwargs)

    lin = Doubling(2, 2)
    x = torch.ones(1, 2)
    expected = lin(x)
    s = Sentinel(lin)
    assert torch.equal(lin(x), expected)
    assert s.read().finite


def test_the_last_checked_tensor_is_let_go_after_a_training_forward():
    import gc
    import weakref

    net = Net()
    s = Sentinel([net])
    out = net(GOOD)  # grad mode on: fc2's output is the root's, checked last
    ref = weakref.ref(out)
    del out
    gc.collect()
    assert ref() is None
    assert s.read().finite


def test_a_tuple_output_with_several_float_tensors_is_checked_whole():
    class Pair(torch.nn.Module):
        def forward(self, x):
            return x * 2, x.exp()  # the second member overflows

    net = torch.nn.Sequential(Pair())
    s = Sentinel(net, params=False)
    net(BAD)
    assert s.read().forward == Hit("0", 0, 0, None)


def test_double_backward_and_no_grad_forwards_are_checked():
    net = Net()
    s = Sentinel([net])
    x = BAD.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(net(x).sum(), x, create_graph=True)  # hooks see gradients that require grad
    g.sum().backward()
    with torch.no_grad():
        net(BAD)
    r = s.read()
    assert r.forward == Hit("exp", 0, 1, None) and r.backward is not None


def test_steady_state_reuses_the_slots():
    net = Net()
    s = Sentinel([net])
    _step(net, [GOOD, GOOD])
    s.read()
    forward = s._outputs.forward
    buffer, views = forward._buffer, list(forward.slots)
    _step(net, [GOOD, BAD])
    assert s.read().forward == Hit("exp", 1, 4, None)
    assert forward._buffer is buffer and len(views) == 6 and all(a is b for a, b in zip(forward.slots, views))


def test_grads_screen_a_flat_buffer_once_and_name_the_parameter_exactly():
    net = Net()
    s = Sentinel([net], params=False)
    params = list(net.parameters())
    flat = torch.zeros(sum(p.numel() for p in params) + 3)  # + padding, as megatron's DDP buffers have
    offset = 0
    for p in params:  # main_grad views into one buffer, as megatron's DDP lays them out
        p.main_grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    assert grad_screens.storage_norms(net.named_parameters()).shape == (1,)  # one norm, not four
    assert s.read(grads=True).grads == []
    net.fc2.weight.main_grad[0, 1] = float("inf")
    assert s.read(grads=True).grads == ["fc2.weight"]
    net.fc2.weight.main_grad.zero_()
    flat[-1] = float("nan")  # in the padding: the screen flags the buffer, no parameter holds it
    assert s.read(grads=True).grads == []


class Poisoned(torch.nn.Module):
    """Identity forward; backward turns the arriving gradient into NaN: a kernel bug in a backward."""

    class _Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad * float("nan")

    def forward(self, x):
        return self._Fn.apply(x * 1.0)


class Chain(torch.nn.Module):
    """fc1 -> bad -> fc2: `bad` has no parameter, so the first non-finite parameter gradient is fc1's."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bad, self.fc2 = torch.nn.Linear(2, 2), Poisoned(), torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.fc2(self.bad(self.fc1(x)))


def test_output_grads_name_the_module_whose_backward_made_the_first_nonfinite_gradient():
    net = Chain()
    s = Sentinel(net, output_grads=True)
    _step(net, [GOOD, GOOD])
    r = s.read()
    # Backward of micro-batch 0: fc2's output (finite), bad's output (finite), fc1's output (NaN: bad's
    # backward made it). Parameter checks alone reach fc1 first (bad holds no parameter).
    assert r.forward is None and (r.backward.module, r.backward.microbatch) == ("fc1", 0)
    assert r.producer == Producer(module="bad", seen_at="fc1", microbatch=0, order=2)
    assert not r.finite and r.to_dict()["producer"] == {"module": "bad", "seen_at": "fc1", "microbatch": 0, "order": 2}
    s.remove()


def test_output_grads_say_when_the_gradient_arrived_nonfinite():
    net = Net()
    s = Sentinel(net, output_grads=True)
    net(GOOD).sum().backward()
    net(GOOD).sum().backward(torch.tensor(float("nan")))  # micro-batch 1: a non-finite loss gradient
    r = s.read()
    assert r.producer == Producer(module=None, seen_at="fc2", microbatch=1, order=3)
    # off by default: no output-gradient check, no producer
    net2 = Chain()
    s2 = Sentinel(net2)
    _step(net2, [GOOD])
    assert s2.read().producer is None


def _flat_main_grads(net):
    """main_grad views into one flat buffer, accumulated by a post-accumulate hook, as megatron's DDP does."""
    params = list(net.parameters())
    flat = torch.zeros(sum(p.numel() for p in params))
    offset = 0
    for p in params:
        p.main_grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
        if not p.requires_grad:
            continue

        def move(p):
            p.main_grad.add_(p.grad)
            p.grad = None

        p.register_post_accumulate_grad_hook(move)
    return flat


def test_gradients_are_screened_once_per_backward_call_not_per_parameter():
    net = Net()
    _flat_main_grads(net)
    s = Sentinel([net])
    _step(net, [GOOD, GOOD, BAD])
    # One flat buffer: one screen before the first backward call and one at the end of each of the 3.
    assert s._gradients.screens.labels == [-1, 0, 1, 2]
    r = s.read()
    # Micro-batch 2 made fc2.weight's gradient inf (see the first test); 4 gradients arrived per call
    # before it, and fc2.bias (finite) arrives ahead of fc2.weight or after it: order 8 or 9.
    assert (r.backward.module, r.backward.param, r.backward.microbatch) == ("fc2", "fc2.weight", 2)
    assert r.backward.order in (8, 9)


def test_a_gradient_written_without_its_hook_is_still_found():
    # A fused weight-gradient kernel writes main_grad during backward without calling the parameter's hook.
    net = Net()
    net.fused = torch.nn.Parameter(torch.zeros(3), requires_grad=False)  # no hook: its gradient is written
    _flat_main_grads(net)
    s = Sentinel([net])
    net(GOOD).sum().backward()
    out = net(GOOD)

    def kernel(grad):  # "the kernel", in call 1
        net.fused.main_grad.fill_(float("nan"))

    out.register_hook(kernel)
    out.sum().backward()
    r = s.read()
    # The screen at the end of call 1 turned non-finite; no arrival of that call is bad: the first
    # non-finite parameter in parameter order, at the call's first arrival (4 arrived in call 0).
    assert r.backward == Hit("", 1, 4, "fused")


def test_a_backward_call_that_ends_after_read_does_not_leak_into_the_next_step():
    # read() inside a backward call (e.g. from a hook before megatron's reduce): the call's end-of-call
    # screen, queued earlier, must not land in the next step's screens.
    net = Net()
    _flat_main_grads(net)
    s = Sentinel([net])
    readings = []
    out = net(BAD)
    out.register_hook(lambda g: readings.append(s.read()))  # runs first in backward, before the parameters
    out.sum().backward()
    assert readings[0].forward == Hit("exp", 0, 1, None)
    # The gradients are left non-finite (not zeroed): stale before the next step's first call, so that
    # step's backward is not blamed (a leaked screen of the bad call, taken first, would blame call 0).
    _step(net, [GOOD])
    r = s.read()
    assert r.forward is None and r.backward is None

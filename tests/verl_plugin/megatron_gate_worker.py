"""One process of tests/verl_plugin/test_megatron_gate.py: the plugin's watch on real megatron-core DDP chunks in bf16.

nanscope's megatron-core CPU harness (nanscope.megatron.bootstrap: a gloo world of one, the tiny Qwen3-MoE in bf16,
megatron's Adam); a forward hook makes decoder.layers.0.mlp output NaN on every pass ("every") or the first
("first"). `none`: megatron alone, with DDP's NaN check off as verl leaves it; `plugin`: the watch over the chunks,
its gate on finish_grad_sync, skip mode. Prints one JSON line: error, skipped, the parameters finite and unchanged.

usage (from the repository root): python -m tests.verl_plugin.megatron_gate_worker none|plugin every|first REPORT_DIR
"""

import json
import sys

import torch

from nanscope.megatron import bootstrap

bootstrap.init()
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: E402  (after bootstrap.init)
from tests.verl import faults  # noqa: E402

from nanscope.slime_plugin.settings import Settings  # noqa: E402

plugin = sys.argv[1] == "plugin"
fault = sys.argv[2]  # every | first
ddp, conf, opt = bootstrap.build_training(seed=0, bf16=True)
ddp.ddp_config.check_for_nan_in_grad = (
    False  # verl's default: megatron-core's DDP config (distributed_data_parallel_config.py:35)
)


class Engine:
    """The part of verl's MegatronEngine the watch reads (transformer_impl.py:670-678, 626-639)."""

    module = [ddp]

    def optimizer_zero_grad(self):
        opt.zero_grad()
        for c in self.module:
            c.zero_grad_buffer()

    def get_data_parallel_rank(self):
        return 0

    def get_data_parallel_size(self):
        return 1


mods = dict(ddp.named_modules())
name = next(n for n in mods if n.endswith("layers.0.mlp"))
faults.nan_output(mods[name], fault)  # the verl tests' fault (tests/verl/faults.py)
before = {n: p.detach().clone() for n, p in ddp.named_parameters()}
tokens = torch.randint(0, 512, (1, 16), generator=torch.Generator().manual_seed(0))


def run():
    def forward_step(it, m):
        out = m(input_ids=tokens, position_ids=None, attention_mask=None, labels=None)
        return out, lambda o: (o.float().mean(), {"loss": o.float().mean().detach()})

    return get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter([0, 0, 0]),
        model=[ddp],
        num_microbatches=1,
        seq_length=16,
        micro_batch_size=1,
        forward_only=False,
    )


error = None
if plugin:
    from nanscope.verl_plugin.watch import Watch

    watch = Watch(Engine(), settings=Settings(report_dir=sys.argv[3], on_nonfinite="skip"), role="actor")
    watch.training = True
    try:
        watch.passes(run)
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    skipped = watch.skips.take()
else:
    run()
    skipped = False
if not skipped:
    ok, norm, _ = opt.step()
after = {n: p.detach() for n, p in ddp.named_parameters()}
print(
    json.dumps(
        {
            "error": error,
            "skipped": skipped,
            "finite": all(bool(torch.isfinite(p).all()) for p in after.values()),
            "unchanged": all(torch.equal(before[n], after[n]) for n in before),
            "module": name,
        }
    )
)

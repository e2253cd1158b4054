"""One process, real megatron-core on CPU: a healthy step's host syncs and allocations with the plugin and without.

    python tests/slime_plugin/audit_worker.py [--samples 4] [--vocab 512] [--plugin-loss]

The tiny Qwen3-MoE (fp32, the harness's vocabulary 512 by default: its logits, 64 x 512 float32 a micro-batch, are
20,000 times smaller than the case's, 16,384 x 151,936 / TP 4, so a temporary under 1/64 of them here is far under
it there) under megatron's DDP and distributed optimizer, slime v0.1.0's train_one_step
(`nanscope.megatron.chunked`), one sample per micro-batch. Four steps on the same batch: without the plugin
(warm-up), without it (audited), with the hook installed (its first step installs it), with it (audited). With
--plugin-loss the audited step with the plugin also runs the plugin's NaN-safe loss (--loss-type custom_loss).
Prints one JSON line: each audited step's syncs by owner and kind (`audit.Audit`), the plugin's largest
allocation, and the step's logits tensor (the last chunk's output of one micro-batch).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.slime_plugin.audit

from tests.slime_plugin.audit import Audit  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512, help="the model's vocabulary (default the harness's)")
    p.add_argument("--plugin-loss", action="store_true")
    p.add_argument("--report-dir", default="nanscope_reports")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from nanscope import case, hazards, slime_plugin
    from nanscope.facts import paths
    from nanscope.megatron import bootstrap, chunked, step
    from nanscope.megatron.model import TinyQwen3MoE, Training
    from nanscope.slime_plugin.settings import Settings

    bootstrap.init()
    sizes = TinyQwen3MoE(vocab_size=a.vocab)
    training = Training(distributed_optimizer=True)
    chunks, _, optimizer = bootstrap.build_layout(seed=0, bf16=False, training=training, sizes=sizes)
    scheduler = chunked.lr_schedule(optimizer)
    vocab = sizes.vocab_size
    rollout = case.rollout(vocab, 5, n_samples=a.samples)
    seq = step.seq_length_for(rollout.total_lengths, 1)
    batch = hazards.build("healthy", chunked.log_prob_pass(chunks, seq, vocab), rollout, 5)
    batch.pop("hazard_site", None)
    logits = []
    chunks[-1].register_forward_hook(lambda m, i, out: logits.append(out.untyped_storage().nbytes()))
    slime_plugin.configure(Settings(report_dir=a.report_dir))

    def train(hook, plugin_loss=False):
        args = case.args(global_batch_size=a.samples)
        if plugin_loss:  # the README's install: the plugin's loss through slime's custom-loss path
            args.loss_type, args.custom_loss_function_path = "custom_loss", paths.LOSS_FUNCTION_PATH
        grad_norm, ok = chunked.train_one_step(
            chunks, optimizer, scheduler, batch, args=args, seq_length=seq, hook=slime_plugin if hook else None
        )
        assert ok and grad_norm == grad_norm, "not a healthy step"

    train(hook=False)
    with Audit() as without:
        train(hook=False)
    train(hook=True, plugin_loss=a.plugin_loss)
    with Audit() as with_plugin:
        train(hook=True, plugin_loss=a.plugin_loss)
    assert slime_plugin.reports() == [] and slime_plugin.skipped_steps() == 0
    print(json.dumps({
        "samples": a.samples, "vocab": a.vocab, "plugin_loss": a.plugin_loss, "logits_bytes": max(logits),
        "without": without.table(), "with": with_plugin.table(),
        "run_syncs": [without.count("run"), with_plugin.count("run")], "plugin_syncs": with_plugin.count("plugin"),
        "plugin_largest": with_plugin.largest["plugin"], "run_largest": with_plugin.largest["run"],
    }))  # fmt: skip


if __name__ == "__main__":
    main()

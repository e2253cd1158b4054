"""A transformers Trainer dict's step from the one bar redrawn after it, where the log ends without a second.

    {'loss': 0.0, 'grad_norm': nan, 'learning_rate': 3.3e-10, 'epoch': 2.0}
      1%|█▎        | 2/300 [00:03<09:24,  1.89s/it]huggingface/tokenizers: The current process just got forked...

Trainer._inner_training_loop adds 1 to state.global_step and runs on_step_end, where ProgressCallback updates the
bar to global_step, before _maybe_log_save_evaluate logs the dict, which ProgressCallback.on_log prints with
tqdm.write: the bar is cleared, the dict printed and the bar redrawn at the same count (transformers 4.57.6
trainer.py:2753-2756, trainer_callback.py:651-653, :676-693). So the bar right after the dict shows its step, and a
bar before it, whose redraw at that step the dict's write overwrote on screen, lags. launch.metric_lines reads a bar
after a dict with text glued after it as the next log's (that text printed by the next log, before its dict) and
settles the dict's step only from two such bars; where the log holds one such bar and no non-finite line after the
dict, that bar is the last the log shows of the dict's step: its count, at or before it (the bar may have moved on
before the glued text was printed).

    settle(metrics)      # at the log's end (launch.logs): a pending dict's step from its one glued bar
"""

from __future__ import annotations


def settle(metrics) -> None:
    """A pending Trainer dict (launch.metric_lines.MetricLines) with one glued bar after it and no non-finite line
    after it: its step is that bar's count."""
    first = metrics.first
    if first is None or metrics.pending is None or len(metrics.glued) != 1 or metrics.later or "{'" not in first.text:
        return
    bar = metrics.glued[0]
    if first.step is not None and first.step >= bar.count:
        return
    first.step = bar.count
    first.step_from = (
        f"the progress bar redrawn after it, {bar.shown()} (the Trainer updates its bar to the step before it prints "
        f"the step's dict, and tqdm.write redraws the bar after the dict): at or before step {bar.count}"
    )
    metrics.pending, metrics.glued = None, []

"""The words every doctor renderer uses for evidence other than Megatron's error line: another stack's evidence line
(facts.signals), the first non-finite metric line, the skip counters, the ranks left waiting.

    signal_sentence(failure)      "DeepSpeed's fp16 loss scaler skipped a step on inf or NaN gradients (line 3: ...)."
    first_sentence(summary)       "The first non-finite value: critic/vf_loss (the critic) at step 1 ...: it points to ..."
    evidence_lines(traceback)     the lines of the error section
"""

from __future__ import annotations

from nanscope.launch.summary import Summary

_WHO = {
    "deepspeed-overflow": "DeepSpeed's fp16 loss scaler skipped a step on inf or NaN gradients",
    "loss-scale-minimum": "DeepSpeed's fp16 loss scale reached its minimum with the gradients still overflowing, and "
    "the run ended",
    "anomaly-nan": "autograd's anomaly mode found a backward function returning non-finite values",
    "anomaly-forward": "autograd's anomaly mode traced the forward call of a backward function that failed",
    "probability-assert": "sampling (torch.multinomial) was given probabilities holding inf, NaN or a negative value",
    "device-assert": "a CUDA device-side assert fired",
    "nccl-timeout": "a collective timed out (NCCL's watchdog)",
    "skip-nonfinite-grad": "the framework skipped an optimizer step on a non-finite gradient norm",
    "logged-nonfinite": "TensorBoard's writer was given a NaN or Inf scalar",
    "nonfinite-error": "the run ended on an error naming NaN or Inf",
    "nonfinite-message": "the log says a loss or a gradient went NaN or Inf",
}
_MODELS = {"actor": "the actor", "critic": "the critic, the value model", "policy": "the policy",
           "reference": "the reference model", "reward model": "the reward model", "reward": "the reward"}  # fmt: skip


def signal_sentence(failure, count: int = 1) -> str:
    """One sentence: what the evidence line says (`count`: lines of its kind in the log), where, rank and step."""
    signal = failure.signal
    said = [f"line {failure.line}" + (f", and {count - 1} more such line(s)" if count > 1 else "")]
    if failure.op:
        said.append(f"{failure.op}" + (f", output {failure.output}" if failure.output is not None else ""))
    if failure.detail and failure.detail != failure.op:
        said.append(failure.detail)
    who = f"On rank {failure.rank}, " if failure.rank is not None else ""
    step = f" at step {failure.step}" if failure.step is not None else ""
    head = _WHO.get(signal.id, signal.means)
    head = head[0].lower() + head[1:] if who else head
    sentence = f"{who}{head}{step} ({'; '.join(said)})."
    if signal.id == "nccl-timeout":
        sentence += " The ranks its lines name waited; the one that failed is not in them."
    return sentence


def first_sentence(summary: Summary) -> str | None:
    """The first non-finite metric, its model and step, and what it points to (None: no metric line says one)."""
    if summary.metric is None:
        return None
    model = f" ({_MODELS.get(summary.model, summary.model)})" if summary.model else ""
    step = f" at step {summary.step}" if summary.step is not None else " (the line names no step)"
    where = f" (line {summary.lines['metric']})" if "metric" in summary.lines else ""
    points = f": it points to {summary.points_to}" if summary.points_to else ""
    return f"The first non-finite metric: {summary.metric}{model}{step}{where}{points}."


def evidence_lines(traceback) -> list[str]:
    """The error section's lines about evidence other than Megatron's (each traceable to a line of the input)."""
    out, failure, seen = [], traceback.failure, traceback.nonfinite
    if failure is not None and failure.signal is not None:
        signal = failure.signal
        out.append(f"evidence: {signal.id} ({signal.stack}), line {failure.line}: {failure.text}")
        out.append(f"it means: {signal.means}" + (f" [{signal.source}]" if signal.source else ""))
        out += [f"rank named: {said}" for said in failure.ranks]
    for key, hit in seen.first.items():
        if failure is None or hit.line != failure.line:
            count = seen.counts[key]
            out.append(f"also: {key} at line {hit.line}" + (f" ({count} lines)" if count > 1 else "") + f": {hit.text}")
    if seen.stale is not None:
        line, value, before = seen.stale
        same = f", the same as before the overflow ({before})" if before == value else ""
        out.append(
            f"grad_norm {value} at line {line} is the skipped step's, so the previous step's{same}: DeepSpeed ZeRO "
            "returns from the step on an overflow before computing the norm (stage_1_and_2.py:1839-1853, 0.16.4)"
        )
    if seen.waiting:
        out.append(f"ranks left waiting in a collective: {', '.join(map(str, seen.waiting))} (not the failing rank)")
    reading = seen.metrics.first
    if reading is not None:
        shown = ", ".join(f"{key} {value}" for key, value in reading.values[:8])
        step = f"step {reading.step} ({reading.step_from})" if reading.step is not None else "no step named"
        after = f", after step {reading.after}" if reading.after is not None else ""
        out.append(f"first non-finite metric line {reading.line}, {step}{after}: {shown}")
        if seen.metrics.later:
            out.append(f"{seen.metrics.later} later metric line(s) hold non-finite values too")
    for counter in seen.metrics.counters:
        step = f" at step {counter.step}" if counter.step is not None else ""
        kind = "cumulative" if counter.cumulative else "over the logging interval"
        out.append(f"skip counter: {counter.key} {counter.value}{step} (line {counter.line}, {kind})")
    return out

"""The plugin run's lines that read only its reports and hook logs: where the first non-finite value was produced,
and when the early warning came (split from nanscope.report.repro to keep modules small)."""

from __future__ import annotations

from nanscope.report.text import span
from nanscope.repro import PluginCheck, Repro


def first_value(plugin: PluginCheck) -> str:
    """Where the first non-finite value was produced (the reports' rerun.producer, the same on every rank: first in
    causal order across ranks), and which rank raised Megatron's error first (by wall clock: any rank whose gradients
    the value reached, a peer of the producer as often as the producer)."""
    raised = plugin.raised.first_failure
    who = "" if raised is None else f"; rank {raised} raised Megatron's error first"
    producer = next((r["rerun"]["producer"] for r in plugin.reports if (r.get("rerun") or {}).get("producer")), None)
    if producer is not None:
        return (
            f"the first non-finite value (the rerun's producer): rank {producer['rank']} (pp {producer['pp']}, tp "
            f"{producer['tp']}), module {producer['module']!r}, {producer['direction']}, micro-batch "
            f"{producer['microbatch']}, class {producer['class'] or 'undecided'}{who}"
        )
    # no rerun (NANSCOPE_RERUN=off): the first rank to raise, whose reading need not be the producer's
    report = next((r for r in plugin.reports if r["rank"] == raised), plugin.reports[0])
    hit = report["first_forward"] or report["first_backward"]
    where = f"module {hit['module']!r}, micro-batch {hit['microbatch']}" if hit else "accumulated gradients"
    return f"rank {report['rank']}'s first non-finite: {where}{who} (no rerun in the reports: no producer across ranks)"


def warning_line(plugin: PluginCheck) -> str:
    """When the raise run's hook warned, against the step the hazard killed."""
    if not plugin.warned:
        return f"early warning: none before step {plugin.inject_step}, where as-is died"
    first = next(entry for entry in hook_log(plugin.raised) if entry.get("warnings"))["warnings"][0]
    ahead = plugin.inject_step - plugin.warned[0]
    return (
        f"early warning: the raise run's hook warned at steps {span(plugin.warned)}, {ahead} step"
        f"{'s' if ahead != 1 else ''} before as-is died at step {plugin.inject_step}; first: {first}"
    )


def hook_log(rep: Repro) -> list[dict]:
    """What the plugin's hook logged, from the first rank that logged anything."""
    return next((record.hook_log for record in rep.ranks if record.hook_log), [])

"""What every doctor renderer writes the same way: a group of ranks, a stage's layers, the release line,
the key flags, a frame's location, and how many stages are shown."""

from __future__ import annotations

from nanscope.facts import frameworks, wordings
from nanscope.report.doctor.evidence_text import evidence_lines
from nanscope.report.text import span

# The resolved flags shown in the report (all modelled flags are in the JSON's "config").
KEY_FLAGS = (
    "advantage_estimator",
    "loss_type",
    "use_kl_loss",
    "kl_loss_coef",
    "kl_loss_type",
    "entropy_coef",
    "eps_clip",
    "eps_clip_high",
    "eps_clip_c",
    "use_tis",
    "tis_clip",
    "tis_clip_low",
    "rollout_temperature",
    "check_for_nan_in_loss_and_grad",
    "rerun_mode_effective",
    "custom_generate_function_path",
    "custom_rm_path",
    "num_layers",
    "num_experts",
)

MAX_STAGE_ROWS = 64  # pipeline stages listed in the terminal layout and drawn in the HTML layer split


def ranks_text(group) -> str:
    """A group of ranks (a list or a range): `48-63`, `2, 18, 34, 50`; a long strided one as `0, 8, ..., 1016 (128
    ranks, every 8)`, without listing it (a group of a large world may hold 100,000 ranks)."""
    if group is None:
        return "not listed"
    if isinstance(group, range) and len(group) > 1:
        if group.step == 1:
            return f"{group[0]}-{group[-1]}" if len(group) >= 3 else f"{group[0]}, {group[1]}"
        if len(group) > 8:
            return f"{group[0]}, {group[1]}, ..., {group[-1]} ({len(group):,} ranks, every {group.step})"
        return ", ".join(map(str, group))
    group = list(group)
    if len(group) <= 8 or group == list(range(group[0], group[-1] + 1)):
        return span(group, min_run=3)
    step = group[1] - group[0]
    if group == list(range(group[0], group[-1] + 1, step)):
        return f"{group[0]}, {group[1]}, ..., {group[-1]} ({len(group):,} ranks, every {step})"
    return ", ".join(map(str, group[:8])) + f", ... ({len(group):,} ranks)"


def stage_text(stage) -> str:
    """A pipeline stage's decoder layers (chunk by chunk with virtual stages) and what else it holds."""
    if len(stage.chunks) > 1:
        layers = " | ".join(span(chunk.layers) for chunk in stage.chunks)
    else:
        layers = span(stage.layers)
    extras = [
        name for name, held in (("embedding", stage.embedding), ("final norm + output layer", stage.output)) if held
    ]
    return layers + (" + " + ", ".join(extras) if extras else "")


def release_line(diagnosis) -> str:
    """One line: the slime release and how it was chosen; without slime evidence, the framework and its evidence."""
    choice = diagnosis.release
    if choice is not None:
        return f"slime release {choice.release.name} ({choice.how}: {choice.source})"
    framework = diagnosis.framework
    release = framework.release or ("release unknown" if framework.name != "unknown" else "")
    return (
        f"framework {framework.name}"
        + (f" {release}" if framework.release else f", {release}" if release else "")
        + f" ({framework.how})"
    )


def failure_lines(diagnosis) -> list[str]:
    """The error line's form, the megatron-core releases that print it, and the rerun verdict (terminal, HTML)."""
    traceback = diagnosis.traceback
    if traceback is None:
        return []
    failure, out = traceback.failure, []
    if failure is not None and failure.signal is not None:
        out += evidence_lines(traceback)
    elif failure is not None:
        out.append(f"form: {failure.format} ({wordings.BY_FORM[failure.format].means})")
        if failure.releases:
            first, last = failure.releases[0], failure.releases[-1]
            out.append(f"megatron-core that prints it: {first}" + ("" if first == last else f" .. {last}"))
        elif failure.unreleased:
            out.append(f"megatron-core that prints it: {failure.unreleased}")
        if failure.rank_from:
            out.append(f"rank {failure.rank} from {failure.rank_from}")
    elif traceback.frames and traceback.error is not None:
        out.append(f"error line (it names no NaN or Inf): {traceback.error}")
    elif traceback.frames or traceback.code:  # frames, or what is left of them: known code lines
        out.append("no error line: the traceback ends before it")
    else:
        out.append("no error line that names a NaN or an Inf")
    if failure is None or failure.signal is None:
        out += evidence_lines(traceback)
    for excursion in traceback.excursions():
        out.append("metric: " + excursion.text())
    rerun = traceback.rerun
    if rerun is not None:
        out.append(
            f"rerun verdict: {rerun.verdict} ({rerun.rerun} rerun{', ' + rerun.values if rerun.values else ''}): {rerun.means}"
        )
    elif diagnosis.framework.name not in frameworks.WITHOUT_MEGATRON and diagnosis.megatron_core is not None:
        why = ("slime runs the RerunStateMachine disabled: no rerun, no verdict" if diagnosis.framework.name == "slime"
               else "a RerunStateMachine run disabled reruns nothing and gives no verdict")  # fmt: skip
        if failure is not None and failure.format == "assert":  # core 0.4 to 0.9: no RerunStateMachine yet
            why = "Megatron's assertion comes before the RerunStateMachine: nothing reruns it"
        out.append(f"rerun verdict: none in the input ({why})")
    return out


def key_flags(diagnosis) -> list[tuple[str, str, str]]:
    """(flag name, value, origin) for the flags that matter to the NaN mechanisms."""
    rows = []
    for name in KEY_FLAGS:
        resolved = diagnosis.config.values[name]
        label = "rerun mode (effective)" if name == "rerun_mode_effective" else name.replace("_", "-")
        rows.append((label, "-" if resolved.value is None else f"{resolved.value}", resolved.origin))
    return rows


def frame_where(frame) -> str:
    """`path:line function` with known library paths cut to their package-relative suffix."""
    if frame.line is None:
        return frame.function
    path = frame.known.suffix if frame.known is not None and "/" in frame.known.suffix else frame.path
    return f"{path}:{frame.line} {frame.function}"

"""What every doctor renderer writes the same way: a group of ranks, a stage's layers, the release line,
the key flags, a frame's location, and how many stages are shown."""

from __future__ import annotations

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


def ranks_text(group: list[int]) -> str:
    """A group of ranks: `48-63`, `2, 18, 34, 50`; a long strided one as `0, 8, ..., 1016 (128 ranks, every 8)`."""
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
    """One line: the release and how it was chosen."""
    choice = diagnosis.release
    return f"slime release {choice.release.name} ({choice.how}: {choice.source})"


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

"""`nanscope hazards` rendered: terminal tables (batch hazards run, model faults, immune causes) and JSON."""

from __future__ import annotations

from rich import box
from rich.markup import escape
from rich.table import Table

from nanscope.causes import catalogue, classes


def render(outcomes: list, loss: str, console, model_level: tuple = (), immune: tuple = ()) -> None:
    """The batch hazards (observed vs what slime v0.1.0 gives), the model faults, the immune causes, the mechanisms.

    Args:
        outcomes: nanscope.hazards.Outcome of each batch-level hazard.
        model_level: level "model" hazards (not run here: they need the harness model).
        immune: causes.immune.Immune records.
    """
    table = Table(
        title=f"hazards through the {loss} loss (case slime-795 flags)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
    )
    names = [o.name for o in outcomes] + [h.name for h in model_level]
    for col in ("hazard", "class", "loss finite", "grad finite", "NaN or inf grads", "expected (as-is)"):
        _column(table, col, names)
    for o in outcomes:
        h = catalogue.get(o.name)
        row = (
            o.name,
            h.cause_class or "-",
            _yes(o.loss_finite),
            _yes(o.grad_finite),
            str(o.nan_grad_entries),
            _expected(h),
        )
        table.add_row(*row)
    console.print(table)
    if model_level:
        faults = Table(
            title="faults in the model (run: nanscope repro --hazard NAME)",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            show_edge=False,
        )
        for col in ("hazard", "class", "expected (as-is)", "safe loss"):
            _column(faults, col, names)
        for h in model_level:
            safe = "finite" if h.safe_finite else "NaN: the fix is not the loss"
            faults.add_row(h.name, h.cause_class, _expected(h), safe)
        console.print(faults)
    if immune:
        console.print("[bold]causes slime v0.1.0 is immune to[/]")
        for c in immune:
            console.print(
                f"  [bold]{c.name}[/] ({c.cause_class}): {escape(c.cause)}. Not in slime v0.1.0: "
                f"{escape(c.why)}. Evidence: {'; '.join(c.evidence)}."
            )
    for o in outcomes:
        console.print(f"[bold]{o.name}[/]: {escape(o.mechanism)}")
    for h in model_level:
        console.print(
            f"[bold]{h.name}[/]: {escape(h.mechanism)} Planted: {escape(h.fault or '-')}. "
            f"The fix lives in {escape(h.fix)}."
        )


def _column(table, name: str, hazards: list[str]) -> None:
    """A column of `table`: the hazard's as wide as the longest name (a name is never split or cut), the others
    wrapped at word boundaries to fit the terminal."""
    if name == "hazard":
        table.add_column(name, no_wrap=True, min_width=max(map(len, hazards), default=len(name)))
    elif name == "class":
        table.add_column(name, no_wrap=True, min_width=max(map(len, classes.CLASSES)))
    else:  # the header and the value wrap at word boundaries
        table.add_column(name)


def to_json(outcomes: list, loss: str, model_level: tuple = (), immune: tuple = ()) -> dict:
    """`{"loss", "hazards": [...], "model_level": [...], "immune": [...]}`.

    hazards: {"name", "mechanism", "loss_finite", "grad_finite", "nan_grad_entries", "metrics"} as run, plus
    the record's {"class", "level", "flags", "fix", "discriminator", "safe_finite"} (safe_finite: nanscope's loss
    makes it finite; False where the fix lives elsewhere: a flag, the model, a kernel). model_level: the record's fields with
    "fault" and the expected "loss_finite" / "grad_finite". immune: {"name", "cause", "why", "evidence", "class"}.
    """
    keys = ("name", "mechanism", "loss_finite", "grad_finite", "nan_grad_entries", "metrics")
    rows = [{k: getattr(o, k) for k in keys} | _record(catalogue.get(o.name)) for o in outcomes]
    faults = [
        {
            "name": h.name,
            "mechanism": h.mechanism,
            "fault": h.fault,
            "loss_finite": h.loss_finite,
            "grad_finite": h.grad_finite,
        }
        | _record(h)
        for h in model_level
    ]
    safe = [
        {"name": c.name, "cause": c.cause, "why": c.why, "evidence": list(c.evidence), "class": c.cause_class}
        for c in immune
    ]
    return {"loss": loss, "hazards": rows, "model_level": faults, "immune": safe}


def _record(h) -> dict:
    return {
        "class": h.cause_class,
        "level": h.level,
        "flags": list(h.flags),
        "fix": h.fix,
        "discriminator": h.discriminator,
        "safe_finite": h.safe_finite,
    }


def _expected(h) -> str:
    return f"loss {'finite' if h.loss_finite else 'NaN'}, grad {'finite' if h.grad_finite else 'NaN'}"


def _yes(ok: bool) -> str:
    return "[green]yes[/]" if ok else "[red]NO[/]"

"""`nanscope hazards` rendered: a terminal table with each hazard's mechanism, and its JSON."""

from __future__ import annotations

from nanscope import hazards


def render(outcomes: list, loss: str, console) -> None:
    """The table (observed vs what slime v0.1.0 gives), then each mechanism in words."""
    from rich.table import Table

    table = Table(title=f"hazards through the {loss} loss (case slime-795 flags)")
    for col in ("hazard", "loss finite", "grad finite", "non-finite grad entries", "expected (as-is)"):
        table.add_column(col, no_wrap=(col == "hazard"))
    for o in outcomes:
        h = hazards.get(o.name)
        table.add_row(
            o.name,
            _yes(o.loss_finite),
            _yes(o.grad_finite),
            str(o.nan_grad_entries),
            f"loss {'finite' if h.loss_finite else 'NaN'}, grad {'finite' if h.grad_finite else 'NaN'}",
        )
    console.print(table)
    for o in outcomes:
        console.print(f"[bold]{o.name}[/]: {o.mechanism}")


def to_json(outcomes: list, loss: str) -> dict:
    """`{"loss", "hazards": [{"name", "mechanism", "loss_finite", "grad_finite", "nan_grad_entries"}]}`."""
    keys = ("name", "mechanism", "loss_finite", "grad_finite", "nan_grad_entries")
    return {"loss": loss, "hazards": [{k: getattr(o, k) for k in keys} for o in outcomes]}


def _yes(ok: bool) -> str:
    return "[green]yes[/]" if ok else "[red]NO[/]"

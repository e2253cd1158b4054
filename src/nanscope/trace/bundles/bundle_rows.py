"""Which row of the rollout dump each sample of a bundle's micro-batch is (the sample `nanscope scan` names).

In order: the bundle's own `rows` (the plugin derives them where it can); else the run's rollout dump, each
sample's tokens matched to a row (`--rollout`, or the dump the bundle's args name when it is there); else,
for a bundle nanscope's CPU harness wrote, the harness's partition (one sample per micro-batch, sample
dp_rank + micro-batch x dp_size); else none: the sample's position in its micro-batch, said so.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanscope.loss.target import MODEL_LOSS

HARNESS = "nanscope's CPU harness: one sample per micro-batch, row dp_rank + micro-batch x dp_size"


@dataclass(frozen=True)
class Rows:
    """The dump rows of a micro-batch's samples (None: unknown) and how they were found."""

    rows: list | None
    how: str

    def row(self, sample: int | None) -> int | None:
        if sample is None or self.rows is None or not 0 <= sample < len(self.rows):
            return None
        return self.rows[sample]

    def translate(self, trace: dict) -> dict:
        """A TraceReport dict whose samples are dump rows where known (`microbatch_sample` keeps the position)."""
        out = dict(trace)
        for phase in ("forward", "backward", "first_forward", "first_backward"):
            if out.get(phase) is not None:
                out[phase] = self._event(out[phase])
        out["inputs"] = [self._event(finding) for finding in trace.get("inputs", [])]
        return out

    def _event(self, event: dict) -> dict:
        sample = event.get("sample")
        row = self.row(sample)
        return {**event, "sample": row if row is not None else sample, "microbatch_sample": sample, "row": row}


def rows_of(doc: dict, entry: dict, rollout=None) -> Rows:
    """The rows of `entry`'s samples (see the module docstring).

    Args:
        rollout: (path, [tuple of token ids, one per dump row]) of the step's rollout dump, or None.
    """
    n = len(entry["batch"]["total_lengths"])
    if entry.get("rows") is not None:
        return Rows(list(entry["rows"]), entry.get("rows_how") or "the bundle's rows")
    if rollout is not None:
        path, samples = rollout
        by_tokens: dict[tuple, int] = {}
        for row, tokens in enumerate(samples):
            by_tokens.setdefault(tuple(tokens), row)
        found = [by_tokens.get(tuple(t.tolist())) for t in entry["batch"]["unconcat_tokens"]]
        if None not in found:
            return Rows(found, f"matched by their tokens to the rows of {path}")
    microbatch = entry["microbatch"]
    coords = doc["coords"]
    if doc["release"]["module"] == MODEL_LOSS and n == 1:
        return Rows([coords["dp_rank"] + microbatch * coords["dp_size"]], HARNESS)
    why = entry.get("rows_how") or "the bundle has no rows"
    return Rows(None, f"samples are positions in micro-batch {microbatch} ({why}; --rollout DUMP names the rows)")

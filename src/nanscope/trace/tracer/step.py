"""Trace one training step of a real run on every rank, and name the op that ran first across ranks.

The slime plugin starts a `StepTrace` before the step that NANSCOPE_TRACE_STEP names and stops it at
the end of that step's backward pass. Each rank traces the ops it runs (its pipeline stage, its
tensor-parallel shard): a forward pre-hook on every model chunk marks the micro-batch (the chunk's
forward calls so far this step, 0-based) and gives the tracer a token map for it.

Token maps come from the rollout (slime's `--load-debug-rollout-data` dump, `Sample.to_dict()` rows, read by
`nanscope.dumps.io.load_rollout`):
the tokens a chunk receives are matched to the rollout's samples, as slime packs them (`cu_seqlens` of
`packed_seq_params` in units of whole sequences, each sample's zigzag share under context
parallelism; without packed_seq_params one sample per row, padded at the end). A matched micro-batch
maps loss-level tensors [N] to (rollout sample, response token) and [1, T, ...] tensors to (rollout
sample, sequence position), both 0-based, sample = position in the rollout's `samples` list.

`first_across_ranks` picks the producer that ran first: in forward the earliest micro-batch, then the
earliest pipeline stage; in backward the earliest micro-batch, then the latest stage (1F1B runs a
micro-batch's backward from the last stage down).
"""

from __future__ import annotations

import torch

from nanscope.loss import layout
from nanscope.trace.tracer import replay
from nanscope.trace.tracer.events import Site, TokenMap, TraceReport
from nanscope.trace.tracer.locator import Tracer

_KEY = 16  # leading local tokens that index the rollout's samples for matching


class RolloutIndex:
    """The rollout's samples indexed by their leading local tokens on this CP rank."""

    def __init__(self, samples: list[dict], cp_rank: int = 0, cp_size: int = 1):
        self.samples, self.cp_rank, self.cp_size = samples, cp_rank, cp_size
        self.local: list[torch.Tensor] = []  # int64 [local_length]: sample i's tokens in this rank's row
        self.by_key: dict[tuple, list[int]] = {}  # leading min(_KEY, length) tokens -> samples
        for i, sample in enumerate(samples):
            local = self._local_tokens(sample["tokens"])
            self.local.append(local)
            self.by_key.setdefault(tuple(local[:_KEY].tolist()), []).append(i)
        self.key_lengths = sorted({len(key) for key in self.by_key})

    def _local_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.tensor(layout.sequence_positions(tokens.numel(), self.cp_rank, self.cp_size))
        padded = torch.cat([tokens, tokens.new_zeros(1)])  # zigzag padding reads token id 0, as slime pads
        return padded[positions.clamp(max=tokens.numel())]

    def find(self, segment: torch.Tensor, exact: bool = False) -> int | None:
        """The rollout sample whose local tokens are `segment` (exact) or start it (the longest such)."""
        best = None
        candidates = [i for k in self.key_lengths for i in self.by_key.get(tuple(segment[:k].tolist()), [])]
        for i in candidates:
            n = self.local[i].numel()
            if (n == segment.numel() if exact else n <= segment.numel()) and torch.equal(segment[:n], self.local[i]):
                if best is None or n > self.local[best].numel():
                    best = i
        return best


def _packed_ids(index: RolloutIndex, input_ids: torch.Tensor, packed_seq_params) -> list[int | None]:
    """The rollout sample of each sample in a packed row [1, T], in row order (None: not in the rollout).

    With packed_seq_params the row is cut at its cu_seqlens (whole-sequence units, so divided by
    cp_size), the last segment usually slime's padding to a multiple of 128. Without, samples are
    matched one after the other from the row's start until one is not found (the padding). The row (on the
    run's device) comes to the host once, where the rollout's tokens are: every comparison is on the CPU.
    """
    row = input_ids.detach().reshape(-1).to("cpu")  # the dump's tokens are on the host: compare there (one copy)
    if packed_seq_params is not None:
        bounds = [int(x) // index.cp_size for x in packed_seq_params.cu_seqlens_q.tolist()]
        return [index.find(row[start:end], exact=True) for start, end in zip(bounds[:-1], bounds[1:])]
    ids, start = [], 0
    while start < row.numel() and (sample := index.find(row[start:])) is not None:
        ids.append(sample)
        start += index.local[sample].numel()
    return ids


def microbatch_map(index: RolloutIndex, input_ids, packed_seq_params=None) -> tuple[TokenMap | None, list[int]]:
    """A token map for one micro-batch, and its rollout sample ids in packed order.

    Returns (None, matched ids) when a sample other than trailing padding is not in the rollout: a
    partial map would put later samples at wrong offsets.
    """
    seen = _packed_ids(index, input_ids, packed_seq_params)
    while seen and seen[-1] is None:  # slime pads the packed row to a multiple of 128 with one last segment
        seen.pop()
    ids = [i for i in seen if i is not None]
    if not ids or len(ids) < len(seen):
        return None, ids
    samples = [index.samples[i] for i in ids]
    batch = {
        "total_lengths": [sample["tokens"].numel() for sample in samples],
        "response_lengths": [sample["response_length"] for sample in samples],
        "loss_masks": [sample["loss_mask"] for sample in samples],
    }
    local = replay.token_map(batch, index.cp_rank, index.cp_size, packed_length=input_ids.reshape(-1).numel())

    def site_of(shape: tuple, flat: int) -> Site | None:
        site = local(shape, flat)
        return None if site is None else site._replace(sample=ids[site.sample])

    return site_of, ids


class StepTrace:
    """The tracer around one step of this rank, micro-batches marked from the model chunks' forward calls.

    Args:
        chunks: the model chunks (megatron's list).
        rollout: the step's rollout samples (`nanscope.dumps.io.load_rollout`), or None (then no token positions).
        cp_rank, cp_size: this rank's context-parallel coordinate (slime slices tokens by it).
        warn: prints one warning line (the plugin's); a micro-batch that cannot be matched to the rollout is traced
            without token positions and said so, never an error in the user's forward.
    """

    def __init__(self, chunks, rollout: list[dict] | None, cp_rank: int = 0, cp_size: int = 1, warn=None):
        self.chunks, self.warn = list(chunks), warn or _warn
        self.index = RolloutIndex(rollout, cp_rank, cp_size) if rollout is not None else None
        self.tracer = Tracer(modules=self.chunks)
        self.calls = [0] * len(self.chunks)
        self.microbatches: dict[int, list[int]] = {}  # micro-batch -> rollout sample ids (matched ones)
        self._handles: list = []

    def start(self) -> None:
        for index, chunk in enumerate(self.chunks):
            self._handles.append(chunk.register_forward_pre_hook(self._mark(index), with_kwargs=True))
        self.tracer.__enter__()

    def _mark(self, chunk: int):
        def hook(module, args, kwargs):
            microbatch = self.calls[chunk]
            self.calls[chunk] += 1
            sites = None
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            if self.index is not None and input_ids is not None:
                packed = kwargs.get("packed_seq_params")
                try:
                    sites, self.microbatches[microbatch] = microbatch_map(self.index, input_ids, packed)
                except Exception as e:  # nanscope's own failure: the user's forward goes on, without token positions
                    self.warn(f"trace: micro-batch {microbatch} not matched to the rollout: {type(e).__name__}: {e}")
            self.tracer.microbatch(microbatch, sites)

        return hook

    def stop(self) -> TraceReport:
        """End the trace (idempotent) and return this rank's report."""
        if self._handles:
            self.tracer.__exit__(None, None, None)
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
        return self.tracer.report()


def _warn(text: str) -> None:
    print(f"nanscope: warning: {text}", flush=True)


def first_across_ranks(records: list[dict]) -> dict:
    """The first producer of each phase over every rank's trace, the first non-finite op output of each
    phase (producer or not: it shows where values from a non-finite input surfaced), and the inputs.

    Args:
        records: per rank {"rank", "pp", "tp", "trace": TraceReport.to_dict()}.

    Returns:
        {"forward", "backward", "first_forward", "first_backward": event dict + rank/pp/tp or None,
         "inputs": [finding + rank]}.
    """

    def first(phase: str, stage_sign: int):
        found = [(record, record["trace"][phase]) for record in records if record["trace"].get(phase)]
        if not found:
            return None
        never = float("inf")
        record, event = min(
            found,
            key=lambda pair: (
                never if pair[1]["microbatch"] is None else pair[1]["microbatch"],
                stage_sign * pair[0]["pp"],
                pair[0]["tp"],
                pair[0]["rank"],
            ),
        )
        return {**event, "rank": record["rank"], "pp": record["pp"], "tp": record["tp"]}

    inputs = [
        {**finding, "rank": record["rank"]} for record in records for finding in record["trace"].get("inputs", [])
    ]
    return {
        "forward": first("forward", 1),
        "backward": first("backward", -1),
        "first_forward": first("first_forward", 1),
        "first_backward": first("first_backward", -1),
        "inputs": inputs,
    }

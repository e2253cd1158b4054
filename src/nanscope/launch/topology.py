"""Rank layout of a slime v0.1.0 actor: parallel sizes, layer split per pipeline stage, rank coordinates.

Coordinates are megatron-core's `RankGenerator`'s, by arithmetic (launch.ranks, checked against megatron-core's
own in tests/launch/test_ranks.py), built as `initialize_model_parallel` (core_v0.15.0rc0) builds them: a dense
generator (tp, cp, dp, pp; ep=1) and a separate expert generator (tp=expert-tensor-parallel, ep, dp=expert data
parallel, pp; cp=1), both in slime's order `tp-cp-ep-dp-pp` (`tp-cp-ep-pp-dp` with --use-tp-pp-dp-mapping). No rank
is enumerated: a rank's coordinates and groups are computed when asked, so a world of 2^20 ranks is described in
the time of one of 8. The layer split re-derives Megatron's `get_num_layers_to_build` /
`get_transformer_layer_offset`; layers are 0-based here (Megatron's `layer_number` is 1-based).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from nanscope.errors import UserError
from nanscope.facts.flags import BY_NAME
from nanscope.launch.config import Config
from nanscope.launch.ranks import Grid
from nanscope.launch.words import count

MAX_WORLD = 1 << 20  # ranks (1,048,576): more GPUs than any cluster has; a larger world is refused in one line
MAX_LAYERS = 1 << 16  # decoder layers
MAX_EXPERTS = 1 << 16  # routed experts
LAYERS_UNKNOWN = (  # the note where no layer count is given
    "num-layers unknown: pass --model JSON or --model-args FILE to derive the layer split"
)
MAX_LISTED = 4096  # ranks: a group (or, for ep_groups, a world) larger than this is described, not listed
# (group key, generator, its kind there): the groups a rank belongs to
GROUPS = (("tp", "dense", "tp"), ("cp", "dense", "cp"), ("dp", "dense", "dp"), ("pp", "dense", "pp"),
          ("ep", "expert", "ep"), ("etp", "expert", "tp"), ("edp", "expert", "dp"))  # fmt: skip


@dataclass
class Chunk:
    """One model chunk (virtual stage) of a pipeline stage: decoder layers first..last (0-based)."""

    vp: int
    layers: list[int]


@dataclass
class Stage:
    """One pipeline stage: its chunks, and whether it holds the embedding / final norm + output layer."""

    pp: int
    chunks: list[Chunk]
    embedding: bool
    output: bool

    @property
    def layers(self) -> list[int]:
        return [layer for chunk in self.chunks for layer in chunk.layers]


@dataclass
class RankInfo:
    """Where one global rank sits."""

    rank: int
    tp: int
    cp: int
    dp: int
    pp: int
    ep: int
    etp: int
    edp: int
    node_index: int
    local_device: int
    layers: list[int] | None
    chunks: list[Chunk] | None
    holds_output_layer: bool
    holds_embedding: bool
    experts: list[int] | None
    groups: dict[str, Sequence[int] | None]  # key (GROUPS, and dp_cp) -> its group's ranks, megatron-core's order


@dataclass
class Topology:
    """The actor's parallel layout (world = actor nodes x GPUs per node)."""

    world: int
    nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    cp: int
    dp: int
    ep: int
    etp: int
    edp: int
    vpp: int | None
    order: str
    num_layers: int | None
    num_experts: int | None
    stages: list[Stage] | None
    experts_per_rank: int | None
    dense: Grid  # the dense layers' generator (tp, cp, dp, pp)
    expert: Grid  # the expert layers' generator (etp as tp, ep, expert dp as dp, pp)
    notes: list[str] = field(default_factory=list)

    def coord(self, rank: int) -> dict[str, int]:
        """The rank's index in each of its groups (GROUPS keys)."""
        grids = {"dense": self.dense, "expert": self.expert}
        return {key: grids[grid].coord(rank, kind) for key, grid, kind in GROUPS}

    def group(self, rank: int, key: str) -> range:
        """The ranks of `rank`'s `key` group (GROUPS keys)."""
        grid, kind = next((grid, kind) for name, grid, kind in GROUPS if name == key)
        return (self.dense if grid == "dense" else self.expert).group(rank, kind)

    def group_index(self, rank: int, key: str) -> int:
        """Which `key` group holds `rank`, numbered as megatron-core lists them."""
        grid, kind = next((grid, kind) for name, grid, kind in GROUPS if name == key)
        return (self.dense if grid == "dense" else self.expert).group_index(rank, kind)

    def rank(self, rank: int) -> RankInfo:
        """Coordinates, node, device, layers and groups of one global rank."""
        if not 0 <= rank < self.world:
            raise UserError(
                f"rank {rank} is outside the world: 0..{self.world - 1} "
                f"(= {count(self.nodes, 'node')} x {count(self.gpus_per_node, 'GPU')})"
            )
        coord = self.coord(rank)
        stage = self.stages[coord["pp"]] if self.stages else None
        experts = None
        if self.experts_per_rank:
            experts = list(range(coord["ep"] * self.experts_per_rank, (coord["ep"] + 1) * self.experts_per_rank))
        groups: dict[str, Sequence[int] | None] = {key: self.group(rank, key) for key in ("tp", "cp", "dp", "pp")}
        listed = self.dp * self.cp <= MAX_LISTED  # dp-cp: two digits, listed (None: too large to list)
        groups["dp_cp"] = self.dense.members(rank, ("dp", "cp")) if listed else None
        groups |= {key: self.group(rank, key) for key in ("ep", "etp", "edp")}
        return RankInfo(
            rank=rank,
            tp=coord["tp"],
            cp=coord["cp"],
            dp=coord["dp"],
            pp=coord["pp"],
            ep=coord["ep"],
            etp=coord["etp"],
            edp=coord["edp"],
            node_index=rank // self.gpus_per_node,
            local_device=rank % self.gpus_per_node,
            layers=stage.layers if stage else None,
            chunks=stage.chunks if stage else None,
            holds_output_layer=coord["pp"] == self.pp - 1,
            holds_embedding=coord["pp"] == 0,
            experts=experts,
            groups=groups,
        )


def _sizes(cfg: Config) -> dict[str, int]:
    """Parallel sizes from the flags, each checked: >= 1, and the world at most MAX_WORLD ranks."""
    fields = dict(
        nodes="actor_num_nodes",
        gpn="actor_num_gpus_per_node",
        tp="tensor_model_parallel_size",
        pp="pipeline_model_parallel_size",
        cp="context_parallel_size",
        ep="expert_model_parallel_size",
        etp="expert_tensor_parallel_size",
    )
    sizes = {key: cfg[name] for key, name in fields.items()}
    for key, name in fields.items():
        if sizes[key] < 1:
            raise UserError(f"{BY_NAME[name].spelling} {sizes[key]}: must be >= 1")
    sizes["world"] = sizes["nodes"] * sizes["gpn"]
    if sizes["world"] > MAX_WORLD:
        raise UserError(
            f"world({sizes['world']}) = actor-num-nodes({sizes['nodes']}) x actor-num-gpus-per-node({sizes['gpn']}) "
            f"is over {MAX_WORLD:,} ranks"
        )
    return sizes


def _check_count(cfg: Config, name: str, high: int) -> int | None:
    """A model size (num_layers, num_experts): None when unknown, else in 1..high."""
    value = cfg[name]
    if value is None:
        return None
    where = f"{BY_NAME[name].spelling} {value} ({cfg.origin(name)})"
    if value < 1:
        raise UserError(f"{where}: must be >= 1")
    if value > high:
        raise UserError(f"{where}: over {high:,}, more than nanscope lays out")
    return value


def _check_divides(sizes: dict[str, int]) -> tuple[int, int]:
    world, tp, pp, cp, ep, etp = sizes["world"], sizes["tp"], sizes["pp"], sizes["cp"], sizes["ep"], sizes["etp"]
    world_text = f"world({world}) = actor-num-nodes({sizes['nodes']}) x actor-num-gpus-per-node({sizes['gpn']})"
    if world % (tp * pp * cp):
        raise UserError(f"tp({tp})*pp({pp})*cp({cp}) = {tp * pp * cp} does not divide {world_text}")
    if world % (etp * ep * pp):
        raise UserError(f"etp({etp})*ep({ep})*pp({pp}) = {etp * ep * pp} does not divide {world_text}")
    return world // (tp * pp * cp), world // (etp * ep * pp)


def virtual_size(cfg: Config, num_layers: int | None, pp: int) -> int | None:
    """Megatron's virtual_pipeline_model_parallel_size from the two VPP flags (None when 1)."""
    per_rank, stages = cfg["num_virtual_stages_per_pipeline_rank"], cfg["num_layers_per_virtual_pipeline_stage"]
    for name, value in (
        ("num_virtual_stages_per_pipeline_rank", per_rank),
        ("num_layers_per_virtual_pipeline_stage", stages),
    ):
        if value is not None and value < 1:
            raise UserError(f"{BY_NAME[name].spelling} {value}: must be >= 1")
    if per_rank is not None and stages is not None:
        raise UserError(
            "--num-virtual-stages-per-pipeline-rank and --num-layers-per-virtual-pipeline-stage are mutually exclusive"
        )
    vpp = per_rank
    if stages is not None:
        if cfg["decoder_first_pipeline_num_layers"] is not None or cfg["decoder_last_pipeline_num_layers"] is not None:
            raise UserError(
                "uneven pipeline (--decoder-first/last-pipeline-num-layers) needs "
                "--num-virtual-stages-per-pipeline-rank, not --num-layers-per-virtual-pipeline-stage"
            )
        if num_layers is None:
            return None
        total = num_layers + cfg["account_for_embedding_in_pipeline_split"] + cfg["account_for_loss_in_pipeline_split"]
        if total % pp or (total // pp) % stages:
            raise UserError(
                f"num-layers({total}) / pp({pp}) is not a multiple of num-layers-per-virtual-pipeline-stage({stages})"
            )
        vpp = total // pp // stages
    if vpp is not None and vpp > 1 and pp == 1:
        raise UserError("virtual pipeline stages need pipeline-model-parallel-size > 1")
    return vpp if vpp and vpp > 1 else None


def split_layers(
    num_layers: int,
    pp: int,
    vpp: int | None = None,
    first: int | None = None,
    last: int | None = None,
    emb: bool = False,
    loss: bool = False,
) -> list[list[list[int]]]:
    """Decoder layers (0-based) per pipeline rank per virtual stage, as Megatron builds them.

    Returns:
        `out[pp_rank][vp_stage]` = list of layer indices.

    Raises:
        UserError: a split Megatron would reject, with the arithmetic.
    """
    chunks_per_stage = vpp or 1
    for name, value in (("decoder-first-pipeline-num-layers", first), ("decoder-last-pipeline-num-layers", last)):
        if value is not None and not 1 <= value <= num_layers:  # Megatron: "must be larger than 0"
            raise UserError(f"--{name} {value}: must be in 1..num-layers({num_layers})")
    split = _Split(num_layers=num_layers, pp=pp, vpp=vpp, first=first, last=last, emb=emb, loss=loss)
    if split.uneven and (emb or loss):
        raise UserError(
            "uneven pipeline (--decoder-first/last-pipeline-num-layers) cannot be combined with "
            "--account-for-embedding/loss-in-pipeline-split"
        )
    out = []
    for pp_rank in range(pp):
        count = split.stage_count(pp_rank)
        if count % chunks_per_stage:
            raise UserError(
                f"layers on pipeline stage {pp_rank} ({count}) are not divisible by virtual stages ({chunks_per_stage})"
            )
        chunks = []
        for vp in range(chunks_per_stage):
            size = count // chunks_per_stage
            if emb and pp_rank == 0 and vp == 0:
                size -= 1
            if loss and pp_rank == pp - 1 and vp == chunks_per_stage - 1:
                size -= 1
            start = split.offset(pp_rank, vp) if pp > 1 else 0
            chunks.append(list(range(start, start + size)))
        out.append(chunks)
    flat = sorted(layer for stage in out for chunk in stage for layer in chunk)
    if flat != list(range(num_layers)):
        raise UserError(
            f"this pipeline split does not cover layers 0..{num_layers - 1} exactly once "
            f"(pp {pp}, vpp {vpp}, first {first}, last {last})"
        )
    return out


@dataclass(frozen=True)
class _Split:
    """The flags of one pipeline split: layers, stages, virtual stages, the uneven first/last stage sizes,
    and whether the embedding / the loss count as a layer (--account-for-embedding/loss-in-pipeline-split)."""

    num_layers: int
    pp: int
    vpp: int | None
    first: int | None
    last: int | None
    emb: bool
    loss: bool

    @property
    def uneven(self) -> bool:
        return self.first is not None or self.last is not None

    def stage_count(self, pp_rank: int) -> int:
        """Decoder layers on one pipeline stage (Megatron's get_num_layers_to_build, all chunks)."""
        num_layers, pp, first, last = self.num_layers, self.pp, self.first, self.last
        if not self.uneven:
            total = num_layers + self.emb + self.loss
            if total % pp:
                shown = f"num-layers({num_layers})" + " + 1 (embedding)" * self.emb + " + 1 (loss)" * self.loss
                raise UserError(
                    f"{shown} % pp({pp}) = {total % pp} != 0: Megatron splits the layers evenly over the "
                    "pipeline stages (uneven: --decoder-first/last-pipeline-num-layers)"
                )
            return total // pp
        rest = num_layers - (first or 0) - (last or 0)
        left = pp - (first is not None) - (last is not None)
        if left > 0 and (rest < 1 or rest % left):
            why = (
                f"is not divisible by the {left} middle stages"
                if rest > 0
                else "leaves no layers for the middle stages"
            )
            raise UserError(
                f"uneven pipeline: num-layers({num_layers}) - first({first or 0}) - last({last or 0}) = {rest} {why}"
            )
        if pp_rank == 0 and first is not None:
            return first
        if pp_rank == pp - 1 and last is not None:
            return last
        return rest // left if left > 0 else 0

    def offset(self, pp_rank: int, vp: int) -> int:
        """The first decoder layer of one chunk (Megatron's get_transformer_layer_offset)."""
        vpp = self.vpp
        if self.uneven:
            head, tail = self.first or 0, self.last or 0
            middle_stages = self.pp - (self.first is not None) - (self.last is not None)
            middle = self.num_layers - head - tail
            middle_rank = pp_rank if self.first is None else pp_rank - 1
            if vpp:
                first_chunk, last_chunk, middle_chunk = head // vpp, tail // vpp, middle // vpp
                total = first_chunk + middle_chunk + last_chunk
                if pp_rank == 0:
                    return vp * total
                return vp * total + first_chunk + middle_rank * (middle_chunk // middle_stages if middle_stages else 0)
            per = middle // middle_stages if middle_stages else 0
            return 0 if pp_rank == 0 else middle_rank * per + head
        total = self.num_layers + self.emb + self.loss
        per = total // self.pp
        offset = vp * (total // vpp) + pp_rank * (per // vpp) if vpp else pp_rank * per
        if self.emb and not (pp_rank == 0 and vp == 0):
            offset -= 1
        return offset


def _grids(sizes: dict[str, int], dp: int, edp: int, order: str) -> tuple[Grid, Grid]:
    """The dense and the expert generators, as initialize_model_parallel builds them (parallel_state.py)."""
    dense = Grid.of(order, tp=sizes["tp"], cp=sizes["cp"], ep=1, dp=dp, pp=sizes["pp"])
    expert = Grid.of(order, tp=sizes["etp"], cp=1, ep=sizes["ep"], dp=edp, pp=sizes["pp"])
    # the two must have the same pipeline groups: with the same stride, every rank's group is the same range
    if sizes["pp"] > 1 and dense.stride("pp") != expert.stride("pp"):
        raise UserError(
            f"order {order}: pipeline groups of dense and expert layers differ "
            f"(dp {dp} vs expert dp {edp}); Megatron rejects this layout"
        )
    return dense, expert


def build(cfg: Config) -> Topology:
    """Derive the layout from a resolved configuration.

    Raises:
        UserError: sizes that do not divide the world, experts that do not divide EP, a layer split
            Megatron would reject.
    """
    sizes = _sizes(cfg)
    dp, edp = _check_divides(sizes)
    order = "tp-cp-ep-pp-dp" if cfg["use_tp_pp_dp_mapping"] else "tp-cp-ep-dp-pp"
    if not order.endswith("pp") and sizes["pp"] > 1 and edp != dp:
        raise UserError(f"--use-tp-pp-dp-mapping needs expert dp({edp}) == dp({dp})")
    notes = []
    num_layers = _check_count(cfg, "num_layers", MAX_LAYERS)
    num_experts = _check_count(cfg, "num_experts", MAX_EXPERTS)
    experts_per_rank = None
    if num_experts is not None:
        if num_experts % sizes["ep"]:
            raise UserError(f"num-experts({num_experts}) is not divisible by expert-model-parallel-size({sizes['ep']})")
        experts_per_rank = num_experts // sizes["ep"]
    elif sizes["ep"] > 1:
        notes.append("num-experts unknown (no model args): experts per EP rank not derived")
    vpp = virtual_size(cfg, num_layers, sizes["pp"])
    stages = None
    if cfg["pipeline_model_parallel_layout"] is not None:
        notes.append("--pipeline-model-parallel-layout is not modelled: layer split not derived")
    elif num_layers is None:
        notes.append(LAYERS_UNKNOWN)
    else:
        split = split_layers(
            num_layers,
            sizes["pp"],
            vpp=vpp,
            first=cfg["decoder_first_pipeline_num_layers"],
            last=cfg["decoder_last_pipeline_num_layers"],
            emb=cfg["account_for_embedding_in_pipeline_split"],
            loss=cfg["account_for_loss_in_pipeline_split"],
        )
        stages = [
            Stage(
                pp_rank,
                [Chunk(vp, layers) for vp, layers in enumerate(chunks)],
                pp_rank == 0,
                pp_rank == sizes["pp"] - 1,
            )
            for pp_rank, chunks in enumerate(split)
        ]
    dense, expert = _grids(sizes, dp, edp, order)
    return Topology(
        world=sizes["world"],
        nodes=sizes["nodes"],
        gpus_per_node=sizes["gpn"],
        tp=sizes["tp"],
        pp=sizes["pp"],
        cp=sizes["cp"],
        dp=dp,
        ep=sizes["ep"],
        etp=sizes["etp"],
        edp=edp,
        vpp=vpp,
        order=order,
        num_layers=num_layers,
        num_experts=num_experts,
        stages=stages,
        experts_per_rank=experts_per_rank,
        dense=dense,
        expert=expert,
        notes=notes,
    )

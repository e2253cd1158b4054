"""Rank layout of a slime v0.1.0 actor: parallel sizes, layer split per pipeline stage, rank coordinates.

Coordinates come from megatron-core's own `RankGenerator`, built as `initialize_model_parallel`
(core_v0.15.0rc0) builds it: a dense generator (tp, cp, dp, pp; ep=1) and a separate expert generator
(tp=expert-tensor-parallel, ep, dp=expert data parallel, pp; cp=1), both in slime's order
`tp-cp-ep-dp-pp` (`tp-cp-ep-pp-dp` with --use-tp-pp-dp-mapping). The layer split re-derives
Megatron's `get_num_layers_to_build` / `get_transformer_layer_offset`; layers are 0-based here
(Megatron's `layer_number` is 1-based).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope.errors import UserError
from nanscope.facts.flags import BY_NAME
from nanscope.launch.config import Config

MAX_WORLD = 1 << 20  # ranks (1,048,576); laying out 1M ranks through RankGenerator takes about a minute
MAX_LAYERS = 1 << 16  # decoder layers
MAX_EXPERTS = 1 << 16  # routed experts
REPRO_EXTRA = "pip install 'nanscope[repro]'"  # the extra that brings megatron-core


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
        return [layer for c in self.chunks for layer in c.layers]


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
    groups: dict[str, list[int]]


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
    coords: list[dict[str, int]]
    groups: dict[str, list[list[int]]]
    notes: list[str] = field(default_factory=list)

    def rank(self, rank: int) -> RankInfo:
        """Coordinates, node, device, layers and groups of one global rank."""
        if not 0 <= rank < self.world:
            raise UserError(
                f"rank {rank} is outside the world: 0..{self.world - 1} "
                f"(= {self.nodes} nodes x {self.gpus_per_node} GPUs)"
            )
        c = self.coords[rank]
        stage = self.stages[c["pp"]] if self.stages else None
        experts = None
        if self.experts_per_rank:
            experts = list(range(c["ep"] * self.experts_per_rank, (c["ep"] + 1) * self.experts_per_rank))
        groups = {token: next(g for g in gs if rank in g) for token, gs in self.groups.items()}
        return RankInfo(
            rank=rank,
            tp=c["tp"],
            cp=c["cp"],
            dp=c["dp"],
            pp=c["pp"],
            ep=c["ep"],
            etp=c["etp"],
            edp=c["edp"],
            node_index=rank // self.gpus_per_node,
            local_device=rank % self.gpus_per_node,
            layers=stage.layers if stage else None,
            chunks=stage.chunks if stage else None,
            holds_output_layer=c["pp"] == self.pp - 1,
            holds_embedding=c["pp"] == 0,
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
    s = {k: cfg[name] for k, name in fields.items()}
    for k, name in fields.items():
        if s[k] < 1:
            raise UserError(f"{BY_NAME[name].spelling} {s[k]}: must be >= 1")
    s["world"] = s["nodes"] * s["gpn"]
    if s["world"] > MAX_WORLD:
        raise UserError(
            f"world({s['world']}) = actor-num-nodes({s['nodes']}) x actor-num-gpus-per-node({s['gpn']}) "
            f"is over {MAX_WORLD:,} ranks"
        )
    return s


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


def _check_divides(s: dict[str, int]) -> tuple[int, int]:
    world, tp, pp, cp, ep, etp = s["world"], s["tp"], s["pp"], s["cp"], s["ep"], s["etp"]
    world_text = f"world({world}) = actor-num-nodes({s['nodes']}) x actor-num-gpus-per-node({s['gpn']})"
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
        n = num_layers + cfg["account_for_embedding_in_pipeline_split"] + cfg["account_for_loss_in_pipeline_split"]
        if n % pp or (n // pp) % stages:
            raise UserError(
                f"num-layers({n}) / pp({pp}) is not a multiple of num-layers-per-virtual-pipeline-stage({stages})"
            )
        vpp = n // pp // stages
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
    v = vpp or 1
    uneven = first is not None or last is not None
    for name, value in (("decoder-first-pipeline-num-layers", first), ("decoder-last-pipeline-num-layers", last)):
        if value is not None and not 1 <= value <= num_layers:  # Megatron: "must be larger than 0"
            raise UserError(f"--{name} {value}: must be in 1..num-layers({num_layers})")
    if uneven and (emb or loss):
        raise UserError(
            "uneven pipeline (--decoder-first/last-pipeline-num-layers) cannot be combined with "
            "--account-for-embedding/loss-in-pipeline-split"
        )
    out = []
    for r in range(pp):
        count = _stage_count(num_layers, pp, r, first, last, emb, loss)
        if count % v:
            raise UserError(f"layers on pipeline stage {r} ({count}) are not divisible by virtual stages ({v})")
        chunks = []
        for vp in range(v):
            n = count // v
            if emb and r == 0 and vp == 0:
                n -= 1
            if loss and r == pp - 1 and vp == v - 1:
                n -= 1
            start = _offset(num_layers, pp, r, vp, vpp, first, last, emb, loss) if pp > 1 else 0
            chunks.append(list(range(start, start + n)))
        out.append(chunks)
    flat = sorted(layer for stage in out for chunk in stage for layer in chunk)
    if flat != list(range(num_layers)):
        raise UserError(
            f"this pipeline split does not cover layers 0..{num_layers - 1} exactly once "
            f"(pp {pp}, vpp {vpp}, first {first}, last {last})"
        )
    return out


def _stage_count(num_layers, pp, r, first, last, emb, loss) -> int:
    if first is None and last is None:
        n = num_layers + emb + loss
        if n % pp:
            total = f"num-layers({num_layers})" + " + 1 (embedding)" * emb + " + 1 (loss)" * loss
            raise UserError(
                f"{total} % pp({pp}) = {n % pp} != 0: Megatron splits the layers evenly over the "
                "pipeline stages (uneven: --decoder-first/last-pipeline-num-layers)"
            )
        return n // pp
    rest = num_layers - (first or 0) - (last or 0)
    left = pp - (first is not None) - (last is not None)
    if left > 0 and (rest < 1 or rest % left):
        why = f"is not divisible by the {left} middle stages" if rest > 0 else "leaves no layers for the middle stages"
        raise UserError(
            f"uneven pipeline: num-layers({num_layers}) - first({first or 0}) - last({last or 0}) = {rest} {why}"
        )
    if r == 0 and first is not None:
        return first
    if r == pp - 1 and last is not None:
        return last
    return rest // left if left > 0 else 0


def _offset(num_layers, pp, r, vp, vpp, first, last, emb, loss) -> int:
    if first is not None or last is not None:
        head, tail = first or 0, last or 0
        middle_stages = pp - (first is not None) - (last is not None)
        middle = num_layers - head - tail
        middle_rank = r if first is None else r - 1
        if vpp:
            fc, lc, mc = head // vpp, tail // vpp, middle // vpp
            total = fc + mc + lc
            if r == 0:
                return vp * total
            return vp * total + fc + middle_rank * (mc // middle_stages if middle_stages else 0)
        per = middle // middle_stages if middle_stages else 0
        return 0 if r == 0 else middle_rank * per + head
    n = num_layers + emb + loss
    per = n // pp
    offset = vp * (n // vpp) + r * (per // vpp) if vpp else r * per
    if emb and not (r == 0 and vp == 0):
        offset -= 1
    return offset


def _rank_coords(s: dict[str, int], dp: int, edp: int, order: str):
    try:
        from megatron.core.parallel_state import RankGenerator
    except ImportError:
        raise UserError(f"rank coordinates need megatron-core's RankGenerator: {REPRO_EXTRA}") from None

    dense = RankGenerator(tp=s["tp"], ep=1, dp=dp, pp=s["pp"], cp=s["cp"], order=order, rank_offset=0)
    expert = RankGenerator(tp=s["etp"], ep=s["ep"], dp=edp, pp=s["pp"], cp=1, order=order, rank_offset=0)
    if dense.get_ranks("pp") != expert.get_ranks("pp"):
        raise UserError(
            f"order {order}: pipeline groups of dense and expert layers differ "
            f"(dp {dp} vs expert dp {edp}); Megatron rejects this layout"
        )
    coords = [dict() for _ in range(s["world"])]
    groups = {}
    for key, gen, token in (
        ("tp", dense, "tp"),
        ("cp", dense, "cp"),
        ("dp", dense, "dp"),
        ("pp", dense, "pp"),
        ("dp_cp", dense, "dp-cp"),
        ("ep", expert, "ep"),
        ("etp", expert, "tp"),
        ("edp", expert, "dp"),
    ):
        groups[key] = gen.get_ranks(token)
        if key == "dp_cp":
            continue
        for group in groups[key]:
            for i, rank in enumerate(group):
                coords[rank][key] = i
    return coords, groups


def build(cfg: Config) -> Topology:
    """Derive the layout from a resolved configuration.

    Raises:
        UserError: sizes that do not divide the world, experts that do not divide EP, a layer split
            Megatron would reject.
    """
    s = _sizes(cfg)
    dp, edp = _check_divides(s)
    order = "tp-cp-ep-pp-dp" if cfg["use_tp_pp_dp_mapping"] else "tp-cp-ep-dp-pp"
    if not order.endswith("pp") and s["pp"] > 1 and edp != dp:
        raise UserError(f"--use-tp-pp-dp-mapping needs expert dp({edp}) == dp({dp})")
    notes = []
    num_layers = _check_count(cfg, "num_layers", MAX_LAYERS)
    num_experts = _check_count(cfg, "num_experts", MAX_EXPERTS)
    experts_per_rank = None
    if num_experts is not None:
        if num_experts % s["ep"]:
            raise UserError(f"num-experts({num_experts}) is not divisible by expert-model-parallel-size({s['ep']})")
        experts_per_rank = num_experts // s["ep"]
    elif s["ep"] > 1:
        notes.append("num-experts unknown (no model args): experts per EP rank not derived")
    vpp = virtual_size(cfg, num_layers, s["pp"])
    stages = None
    if cfg["pipeline_model_parallel_layout"] is not None:
        notes.append("--pipeline-model-parallel-layout is not modelled: layer split not derived")
    elif num_layers is None:
        notes.append("num-layers unknown: pass --model JSON or --model-args FILE to derive the layer split")
    else:
        split = split_layers(
            num_layers,
            s["pp"],
            vpp,
            cfg["decoder_first_pipeline_num_layers"],
            cfg["decoder_last_pipeline_num_layers"],
            cfg["account_for_embedding_in_pipeline_split"],
            cfg["account_for_loss_in_pipeline_split"],
        )
        stages = [
            Stage(r, [Chunk(vp, layers) for vp, layers in enumerate(chunks)], r == 0, r == s["pp"] - 1)
            for r, chunks in enumerate(split)
        ]
    coords, groups = _rank_coords(s, dp, edp, order)
    return Topology(
        world=s["world"],
        nodes=s["nodes"],
        gpus_per_node=s["gpn"],
        tp=s["tp"],
        pp=s["pp"],
        cp=s["cp"],
        dp=dp,
        ep=s["ep"],
        etp=s["etp"],
        edp=edp,
        vpp=vpp,
        order=order,
        num_layers=num_layers,
        num_experts=num_experts,
        stages=stages,
        experts_per_rank=experts_per_rank,
        coords=coords,
        groups=groups,
        notes=notes,
    )

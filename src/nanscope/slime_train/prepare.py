"""Write what slime's train.py reads before it trains: the --ref-load checkpoint and the rollout, from one model.

    python -m nanscope.slime_train.prepare REQUEST.json      # one process, a gloo group of one rank

In the run's environment (slime, Megatron-LM and the stand-ins on its path, `runtime_env.process_env`), as slime's
own tools/convert_hf_to_torch_dist.py does it: Megatron-LM's argument parser and slime's
`set_default_megatron_args`, slime's `init` (parallel state, seeds, tokenizer), Megatron-LM's `get_model` with
slime's model provider (so the checkpoint holds exactly the modules slime will build, `--spec` included), then
Megatron-LM's `save_checkpoint` in torch_dist format. The weights are megatron's initialisation except the output
layer's, at the harness's scale (`nanscope.megatron.model.OUTPUT_INIT_STD`: logits spanning tens of units, like a
trained LLM's).

The same model then plays SGLang: a rollout group of the case's shape (`nanscope.hazards.case_rollout`: multi-turn,
a tool-output span with loss_mask 0), its rollout log-probs this model's at the rollout temperature plus SGLang's
noise (0.0 on tool tokens), and the hazard planted by `nanscope.hazards.build`, the catalogue's one place for it.
The rollouts are written as slime's rollout dumps (`nanscope.dumps.writers`), which --load-debug-rollout-data reads:
rollout 0 carries the hazard, the next ones are healthy groups of their own (drawn with other seeds).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from nanscope.causes import catalogue
from nanscope.megatron import bootstrap
from nanscope.slime_train import spec, worker

# Hazards whose trigger lives in the rollout's own fields (a Sample's rollout_log_probs, reward): the ones a
# --debug-train-only run can carry in its data. The others live in the log-prob pass, the model or the flags.
IN_DATA = (
    catalogue.HEALTHY.name,
    catalogue.NAN_ROLLOUT_LOGPROB.name,
    catalogue.NAN_REWARD.name,
    catalogue.ROLLOUT_LOGPROB_SHIFT.name,
)


@dataclass(frozen=True)
class Request:
    """What to write: the writer's Megatron flags, where, and the rollout's shape and hazard."""

    argv: tuple[str, ...]  # Megatron-LM flags: the model's, the CPU ones, --hf-checkpoint, --save
    rollout: str  # the rollout dumps' path template, {rollout_id} in it
    rollouts: int  # how many: rollout 0 with the hazard, the others healthy
    result: str  # where this process writes its Result as JSON
    hazard: str
    seed: int
    temperature: float  # --rollout-temperature
    group_size: int  # --n-samples-per-prompt
    samples: int  # --rollout-batch-size x --n-samples-per-prompt
    sample_fields: tuple[str, ...]  # the release's Sample.to_dict() keys

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Request:
        fields = json.loads(text)
        return cls(**{**fields, "argv": tuple(fields["argv"]), "sample_fields": tuple(fields["sample_fields"])})


@dataclass(frozen=True)
class Result:
    site: tuple[int, int | None] | None  # the hazard's (sample, response position); (sample, None): a whole sample
    patched: list[str]  # `cpu.install_slime`'s patches, as every Ray worker of the run applies them
    seconds: float


def _init(argv: tuple[str, ...]):
    """The CPU layer, a gloo group of one rank and slime's init from Megatron-LM's parser; returns the args."""
    import torch.distributed as dist  # heavy: torch, megatron-core, Megatron-LM and slime below

    from nanscope.megatron import cpu

    worker.torch_probes_triton()
    bootstrap.import_megatron()
    cpu.install_slime(gpus_per_node=1)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{bootstrap.free_port()}", rank=0, world_size=1)
    sys.argv = ["nanscope.slime_train.prepare", *argv]
    from megatron.training.arguments import parse_args, validate_args  # heavy: Megatron-LM and slime (the run's path)
    from slime.backends.megatron_utils.arguments import set_default_megatron_args
    from slime.backends.megatron_utils.initialize import init

    args = set_default_megatron_args(parse_args())
    args.micro_batch_size, args.global_batch_size = 1, 1  # one rank; no batch is trained here
    args.save_interval = 1  # validate_args asserts one with --save (slime's conversion tool sets 1 too)
    validate_args(args)
    spec.use_spec(args)  # after validate_args, as the actors' init hook sets it (spec.py says why)
    init(args)
    return args


def _save_model(args):
    """slime's model at one rank, saved by Megatron-LM's save_checkpoint under --save; returns its chunk."""
    import torch  # heavy: as _init
    from megatron.core.enums import ModelType
    from megatron.training.checkpointing import save_checkpoint
    from megatron.training.training import get_model
    from slime.backends.megatron_utils.model_provider import get_model_provider_func

    from nanscope.megatron.model import OUTPUT_INIT_STD

    chunks = get_model(get_model_provider_func(args), ModelType.encoder_or_decoder, wrap_with_ddp=False)
    gpt = chunks[0].module  # Float16Module(GPTModel)
    with torch.no_grad():
        gpt.output_layer.weight.normal_(0.0, OUTPUT_INIT_STD / args.hidden_size**0.5)
    save_checkpoint(1, chunks, None, None, 0)
    return chunks[0]


def _policy(chunk):
    """The model as `nanscope.hazards.Policy`: per-sample tokens -> [total_i, V] float32 logits (T = 1)."""
    import torch  # heavy: as _init

    chunk.eval()

    def policy(tokens: list[torch.Tensor]) -> list[torch.Tensor]:
        with torch.no_grad():
            return [chunk(input_ids=t[None], position_ids=None, attention_mask=None)[0].float() for t in tokens]

    return policy


def _samples(batch: dict, rewards: list[float], fields: tuple[str, ...]) -> list[dict]:
    """The batch as Sample.to_dict() rows (the release's `fields`), as a generate function would fill them."""
    columns = zip(batch["unconcat_tokens"], batch["response_lengths"], batch["loss_masks"], batch["rollout_log_probs"])
    rows = []
    for i, (tokens, response_length, loss_mask, rollout_logp) in enumerate(columns):
        row = {"index": i, "prompt": "", "tokens": tokens.tolist(), "response": "", "label": None}
        row |= {"response_length": response_length, "reward": rewards[i], "loss_mask": loss_mask.int().tolist()}
        row |= {"rollout_log_probs": rollout_logp.float().tolist(), "status": "completed", "metadata": {}}
        assert set(row) <= set(fields), sorted(set(row) - set(fields))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    request = Request.from_json(Path((argv or sys.argv[1:])[0]).read_text())
    from nanscope import hazards  # heavy: torch
    from nanscope.dumps import writers

    args = _init(request.argv)
    chunk = _save_model(args)
    policy, site = _policy(chunk), None
    for rollout_id in range(request.rollouts):
        seed = request.seed + rollout_id
        rollout = hazards.case_rollout(
            args.padded_vocab_size, seed, temperature=request.temperature, group_size=request.group_size,
            n_samples=request.samples,
        )  # fmt: skip
        batch = hazards.build(request.hazard if rollout_id == 0 else catalogue.HEALTHY.name, policy, rollout, seed)
        path = request.rollout.format(rollout_id=rollout_id)
        writers.write_rollout_dump(path, _samples(batch, batch["rewards"], request.sample_fields), rollout_id)
        site = batch["hazard_site"] if rollout_id == 0 else site
    from nanscope.megatron import cpu  # heavy: torch (imported above)

    result = Result(
        site=tuple(site) if site is not None else None, patched=cpu.installed(), seconds=time.time() - started
    )
    Path(request.result).write_text(json.dumps(dataclasses.asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

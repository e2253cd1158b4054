"""A launch's flags in Megatron's spelling, whichever framework wrote them: the one view the reported causes'
rules (launch.reported) read.

    --overlap-grad-reduce                                              slime, Megatron-LM, Pai-Megatron-Patch
    --overlap_grad_reduce true                                         ms-swift's `megatron sft`
    actor_rollout_ref.actor.megatron.override_ddp_config.overlap_grad_reduce=True   verl (hydra)

`FlagView.of_argv` reads `--flag [values]` lists (underscores and dotted prefixes folded to Megatron's dashes);
`FlagView.of_hydra` reads verl's `key=value` overrides through `HYDRA` (the key's last part, under the keys that
hold Megatron's options).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SHORT = re.compile(r"-[A-Za-z][A-Za-z0-9]{0,5}")  # a CLI's short flag (`-ng`, `-hf`), read where it has aliases
_TRUE = ("", "true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off", "none", "null")
# verl's hydra keys that carry Megatron options (their last part is the option's name), and its own keys nanscope
# reads, each with the name doctor gives it.
_MEGATRON_PARTS = (
    "actor_rollout_ref.actor.megatron.override_transformer_config.",
    "actor_rollout_ref.actor.megatron.override_ddp_config.",
    "actor_rollout_ref.actor.optim.override_optimizer_config.",
    "actor_rollout_ref.actor.megatron.",
)
HYDRA = {
    "trainer.nnodes": "--nnodes",
    "trainer.n_gpus_per_node": "--nproc-per-node",
    "actor_rollout_ref.actor.strategy": "--verl-strategy",
    "actor_rollout_ref.actor.use_kl_loss": "--use-kl-loss",
    "actor_rollout_ref.actor.kl_loss_type": "--kl-loss-type",
    "actor_rollout_ref.actor.kl_loss_coef": "--kl-loss-coef",
    "actor_rollout_ref.actor.clip_ratio": "--clip-ratio",
    "actor_rollout_ref.actor.clip_ratio_low": "--clip-ratio-low",
    "actor_rollout_ref.actor.clip_ratio_high": "--clip-ratio-high",
    "actor_rollout_ref.actor.clip_ratio_c": "--clip-ratio-c",
    "actor_rollout_ref.actor.loss_agg_mode": "--loss-agg-mode",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "--loss-mode",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "--ppo-mini-batch-size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "--ppo-micro-batch-size-per-gpu",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "--ulysses-sequence-parallel-size",
    "actor_rollout_ref.rollout.n": "--rollout-n",
    "actor_rollout_ref.model.path": "--model",
    "algorithm.adv_estimator": "--adv-estimator",
    "algorithm.use_kl_in_reward": "--use-kl-in-reward",
    "algorithm.kl_penalty": "--kl-penalty",
    "data.train_batch_size": "--train-batch-size",
    "trainer.resume_mode": "--resume-mode",
    # NeMo 2's recipes on the `nemo llm` command line (nemo_run overrides)
    "trainer.num_nodes": "--nnodes",
    "trainer.devices": "--nproc-per-node",
    "trainer.strategy.tensor_model_parallel_size": "--tensor-model-parallel-size",
    "trainer.strategy.pipeline_model_parallel_size": "--pipeline-model-parallel-size",
    "trainer.strategy.context_parallel_size": "--context-parallel-size",
    "trainer.strategy.sequence_parallel": "--sequence-parallel",
    "resume.restore_config.path": "--load",
    "resume.resume_if_exists": "--resume-from-checkpoint",
    # NeMo 1's Megatron models on a Hydra command line (`python examples/nlp/gpt/train_gpt_sft.py model.x=...`): their
    # config's `model:` section (NVIDIA/NeMo examples/nlp/language_modeling/conf/megatron_gpt_config.yaml; a key the
    # config lacks is added with `+`, which of_hydra drops)
    "model.tensor_model_parallel_size": "--tensor-model-parallel-size",
    "model.pipeline_model_parallel_size": "--pipeline-model-parallel-size",
    "model.virtual_pipeline_model_parallel_size": "--virtual-pipeline-model-parallel-size",
    "model.context_parallel_size": "--context-parallel-size",
    "model.sequence_parallel": "--sequence-parallel",
    "model.restore_from_path": "--pretrained-checkpoint",  # a .nemo file's weights (NeMo-Aligner's, the config's top)
    "restore_from_path": "--pretrained-checkpoint",
    "exp_manager.resume_if_exists": "--resume-from-checkpoint",
}


def spelling(name: str) -> str:
    """`--tensor_model_parallel_size`, `--actor.eps_clip` -> `--tensor-model-parallel-size`, `--eps-clip`."""
    return "--" + name.lstrip("-").rsplit(".", 1)[-1].replace("_", "-")


@dataclass
class FlagView:
    """Flags in Megatron's spelling -> their words, and how each was written (for evidence)."""

    given: dict[str, list[str]] = field(default_factory=dict)
    written: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_argv(cls, argv: list[str], aliases: dict[str, str] | None = None) -> FlagView:
        """`aliases`: a CLI's short flags -> their long spelling (`-ng` -> `--num_gpus`); given, any other short flag
        (`-hf`) is a flag of its own too."""
        view, current, aliases = cls(), None, aliases or {}
        for word in argv:
            if word.startswith("--") and len(word) > 2 or aliases and _SHORT.fullmatch(word.partition("=")[0]):
                name, eq, value = word.partition("=")
                current = spelling(aliases.get(name, name))
                view.given[current] = [value] if eq else []
                view.written[current] = word
            elif current is not None:
                view.given[current].append(word)
                view.written[current] += f" {word}"
        return view

    @classmethod
    def of_hydra(cls, argv: list[str]) -> FlagView:
        view = cls()
        for word in argv:
            key, eq, value = word.lstrip("+~").partition("=")
            if not eq:
                continue
            name = HYDRA.get(key)
            if name is None:
                part = next((part for part in _MEGATRON_PARTS if key.startswith(part)), None)
                name = spelling(key[len(part) :]) if part is not None and "." not in key[len(part) :] else None
            if name is not None:
                view.given[name] = [value.strip("'\"")]
                view.written[name] = word
        return view

    def has(self, flag: str) -> bool:
        return flag in self.given

    def on(self, flag: str) -> bool:
        """A store-true flag given, or a flag whose value says true (`--x true`, `x=True`)."""
        words = self.given.get(flag)
        return words is not None and (not words or words[0].lower() in _TRUE)

    def off(self, flag: str) -> bool:
        words = self.given.get(flag)
        return bool(words) and words[0].lower() in _FALSE

    def value(self, flag: str) -> str | None:
        words = self.given.get(flag)
        return words[0] if words else None

    def number(self, flag: str) -> float | None:
        value = self.value(flag)
        if value is None or not re.fullmatch(r"[+-]?\d+(\.\d*)?([eE][+-]?\d+)?", value):
            return None
        return float(value)

    def show(self, flag: str) -> str:
        """The flag as the launch wrote it."""
        return self.written.get(flag, flag)

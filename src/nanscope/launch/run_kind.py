"""What kind of run a launch trains: RL (rollouts, rewards, a policy loss), preference training (DPO and its kin),
a reward model, supervised fine-tuning or pretraining, by its entry point or the flag that names it
(facts.frameworks.RUN_KINDS, KIND_FLAGS). Only an RL run has rollouts, rollout log-probs and a reward function, so
only there are the catalogue's batch causes (a KL's exp, a reward's NaN, a sampling temperature) offered.

    kind = run_kind(script, view)    # RunKind("preference", "--rlhf_type dpo"), or None: the launch does not say
"""

from __future__ import annotations

from dataclasses import dataclass

from nanscope.facts.frameworks import KIND_FLAG_SETS, KIND_FLAGS, RUN_KINDS
from nanscope.launch.flagview import FlagView

_WORDS = {"rl": "an RL run (rollouts, rewards, a policy loss)", "preference": "preference training (a policy and "
          "a reference model, no rollouts or rewards)", "reward-model": "a reward model's training (no rollouts)",
          "sft": "supervised fine-tuning (no rollouts or rewards)", "pretraining": "pretraining (no rollouts or "
          "rewards)"}  # fmt: skip


@dataclass(frozen=True)
class RunKind:
    """A run's kind and where it was read."""

    kind: str
    how: str

    @property
    def rollouts(self) -> bool:
        return self.kind == "rl"

    def words(self) -> str:
        return _WORDS[self.kind]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "how": self.how, "rollouts": self.rollouts}


def run_kind(entry: str, view: FlagView | None) -> RunKind | None:
    """The kind of the run whose entry point is `entry` (launch.script's train_script) and flags `view`; None: not
    said."""
    for flag, values in KIND_FLAGS.items():
        value = (view.value(flag) or "").strip("'\"").lower() if view is not None and view.has(flag) else ""
        if value in values:
            return RunKind(values[value], view.show(flag))
    name = entry.replace("\\", "/").rsplit("/", 1)[-1] if entry.endswith(".py") else entry
    kind = next((kind for prefix, kind in RUN_KINDS if name.startswith(prefix)), None)
    if kind is not None:
        return RunKind(kind, f"the entry point {entry}")
    for flags, kind in KIND_FLAG_SETS if view is not None else ():
        if all(view.has(flag) for flag in flags):
            return RunKind(kind, f"{entry} with {' and '.join(view.show(flag) for flag in flags)}")
    return None

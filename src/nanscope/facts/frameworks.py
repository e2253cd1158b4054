"""The frameworks whose Megatron NaN reports doctor reads, and what names each in a traceback or a log.

A frame's path names its framework by a directory of that framework's package (`PATHS`); a log line by a text only
that framework prints (`TEXTS`: a Ray actor's class, a log prefix). The RL frameworks call Megatron-LM and
megatron-core, so a traceback holds frames of several: the first of `NAMES` with evidence is the job's.

    from nanscope.facts.frameworks import NAMES, PATHS
"""

from __future__ import annotations

SLIME, MEGATRON_LM, NEMO, NEMO_RL, VERL, OPENRLHF, ROLL, MS_SWIFT, PAI, UNKNOWN = (
    "slime", "megatron-lm", "nemo", "nemo-rl", "verl", "openrlhf", "roll", "ms-swift", "pai-megatron-patch", "unknown",
)  # fmt: skip
# In order of precedence: a job's own framework before the libraries it calls (NeMo's recipes and ms-swift call
# Megatron-LM's training loop; every one of them calls megatron-core).
NAMES = (SLIME, VERL, OPENRLHF, NEMO_RL, ROLL, MS_SWIFT, PAI, NEMO, MEGATRON_LM, UNKNOWN)

# framework -> directories (with their slashes) one of its frames' paths holds
PATHS: dict[str, tuple[str, ...]] = {
    SLIME: ("/slime/backends/", "/slime/ray/", "/slime/utils/", "/slime/rollout/", "/slime_plugins/"),
    VERL: ("/verl/workers/", "/verl/trainer/", "/verl/single_controller/", "/verl/utils/", "/verl/models/"),
    OPENRLHF: ("/openrlhf/",),
    NEMO_RL: ("/nemo_rl/",),
    ROLL: ("/roll/pipeline/", "/roll/distributed/", "/roll/models/", "/roll/utils/"),
    MS_SWIFT: ("/swift/megatron/", "/swift/cli/", "/swift/llm/", "/swift/trainers/"),
    PAI: ("/megatron_patch/",),
    NEMO: ("/nemo/lightning/", "/nemo/collections/", "/megatron/bridge/", "/nemo/core/"),
    MEGATRON_LM: (
        "/megatron/training/",
        "/pretrain_gpt.py",
        "/pretrain_mamba.py",
        "/train_rl.py",
        "/megatron/training.py",
    ),
}
# framework -> texts in a log line that name it (a Ray actor, a logger's prefix)
TEXTS: dict[str, tuple[str, ...]] = {
    SLIME: ("MegatronTrainRayActor", "slime.backends.megatron_utils"),
    VERL: ("ray::WorkerDict.", "verl.single_controller", "(TaskRunner pid="),
    OPENRLHF: ("openrlhf.",),
    NEMO_RL: ("nemo_rl.",),
    ROLL: ("(ActorWorker(actor_train",),
    MS_SWIFT: ("[INFO:swift]", "[WARNING:swift]"),
    PAI: ("megatron_patch.",),
    NEMO: ("i.pretrain/", "nemo_run", "[NeMo I ", "[NeMo W "),
}
# The megatron-core package, which every one of them calls (not a framework of its own).
CORE = "/megatron/core/"

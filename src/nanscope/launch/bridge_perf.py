"""Megatron-Bridge's performance launcher, scripts/performance/setup_experiment.py: its short flags, a node's GPUs by
GPU type, and the parallel sizes its recipes set, which nanscope does not read.

    python3 scripts/performance/setup_experiment.py -g gb200 -m llama31 -ng 128 -gn 4 -c nvfp4

NVIDIA-NeMo/Megatron-Bridge 067f987 scripts/performance/argument_parser.py: -ng/--num_gpus (:223), the parallel
sizes -tp -pp -cp -vp -ep -et (:389-420, default None: the recipe's), -gn/--gpus_per_node (:464, default None), -g/--gpu
(:687), -c/--compute_dtype (:695); a node's GPUs by type, NUM_GPUS_PER_NODE_MAP (:30-38), where --gpus_per_node is not
given (setup_experiment.py:973-976). The nodes are ceil(num_gpus / gpus_per_node) (setup_experiment.py:662).

    ALIASES                       short flag -> its long spelling (FlagView.of_argv reads them)
    per_node(view) -> (n, how)    a node's GPUs from the GPU type, where --gpus_per_node is not given
    recipe_sizes(view) -> [str]   the parallel sizes the recipe sets (not given on the command line)
"""

from __future__ import annotations

ENTRY = "/scripts/performance/setup_experiment.py"
ALIASES = {
    "-ng": "--num_gpus", "-gn": "--gpus_per_node", "-g": "--gpu", "-c": "--compute_dtype", "-m": "--model_family_name",
    "-mr": "--model_recipe_name", "-tp": "--tensor_model_parallel_size", "-pp": "--pipeline_model_parallel_size",
    "-cp": "--context_parallel_size", "-vp": "--virtual_pipeline_model_parallel_size",
    "-ep": "--expert_model_parallel_size", "-et": "--expert_tensor_parallel_size",
}  # fmt: skip
_GPUS_PER_NODE = {"h100": 8, "b200": 8, "b300": 8, "gb200": 4, "gb300": 4, "vr200": 4, "r100": 1}
# Megatron's spelling of each parallel size the recipe sets where the command line does not
_SIZES = {"TP": "--tensor-model-parallel-size", "PP": "--pipeline-model-parallel-size", "CP": "--context-parallel-size",
          "EP": "--expert-model-parallel-size"}  # fmt: skip


def is_perf(entry: str) -> bool:
    """`entry` (a train command's script) is the performance launcher."""
    return ("/" + entry.replace("\\", "/").lower()).endswith(ENTRY)


def per_node(view) -> tuple[int, str] | None:
    """A node's GPUs from --gpu's type (launch.flagview.FlagView `view`), where --gpus_per_node is not given."""
    gpu = (view.value("--gpu") or "").lower()
    if view.has("--gpus-per-node") or gpu not in _GPUS_PER_NODE:
        return None
    n = _GPUS_PER_NODE[gpu]
    return n, f"{view.show('--gpu')}: {n} a node (Megatron-Bridge's map of GPU types)"


def recipe_sizes(view) -> list[str]:
    """The parallel sizes (TP, PP, CP, EP) the command line leaves to the recipe."""
    return [name for name, flag in _SIZES.items() if not view.has(flag)]

"""Launch scripts of frameworks other than slime: which framework a script runs, and its parallel layout and flags.

    python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 ...   verl
    python3 -m openrlhf.cli.train_ppo_ray --actor_num_nodes 1 ...                                       OpenRLHF
    torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py --tensor-model-parallel-size 2 ...          Megatron-LM
    NPROC_PER_NODE=8 megatron sft --tensor_model_parallel_size 2 ...                                    ms-swift
    torchrun ... examples/qwen2/pretrain_qwen.py ... (PYTHONPATH with Pai-Megatron-Patch)             Pai-Megatron-Patch

A script is slime's only on slime's evidence (a flag only slime's parser defines, or a slime release named): no
other script is read with slime's rules. The layout is megatron-core's (launch.topology) from the sizes the
framework's flags give; a size the script reads from an unset variable is the default, said so.

    framework = script_framework(script, text)
    launch = read_foreign(script, text, framework)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nanscope.facts import frameworks
from nanscope.facts.flags import BY_SPELLING, SLIME
from nanscope.launch import bridge_perf
from nanscope.launch.detect import named_release
from nanscope.launch.evidence import UNKNOWN, Framework
from nanscope.launch.flagview import FlagView
from nanscope.launch.script import LaunchScript
from nanscope.launch.topology import MAX_EXPERTS, MAX_LAYERS, MAX_WORLD
from nanscope.launch.words import count

_MODULES = (
    ("verl.", frameworks.VERL), ("openrlhf.", frameworks.OPENRLHF), ("nemo_rl", frameworks.NEMO_RL),
    ("roll.", frameworks.ROLL), ("swift", frameworks.MS_SWIFT), ("nemo_automodel", frameworks.NEMO_AUTOMODEL),
    ("nemo", frameworks.NEMO),
    ("megatron.training", frameworks.MEGATRON_LM),
)  # fmt: skip
_CLIS = (("megatron ", frameworks.MS_SWIFT), ("swift ", frameworks.MS_SWIFT), ("nemo ", frameworks.NEMO),
         ("llamafactory-cli ", frameworks.LLAMA_FACTORY), ("xtuner ", frameworks.XTUNER), ("tune ", frameworks.TORCHTUNE))  # fmt: skip
_PATHS = (
    ("/verl/", frameworks.VERL), ("/openrlhf/", frameworks.OPENRLHF), ("/nemo_rl/", frameworks.NEMO_RL),
    ("/examples/start_", frameworks.ROLL), ("/roll/", frameworks.ROLL), ("/megatron_patch/", frameworks.PAI),
    ("/pai-megatron-patch/", frameworks.PAI), ("/nemo_automodel/", frameworks.NEMO_AUTOMODEL), ("/nemo/", frameworks.NEMO),
    # LLaMA-Factory up to 0.7.0 (and ChatGLM-Efficient-Tuning, its predecessor): src/train_bash.py
    (frameworks.LLAMA_FACTORY_ENTRY, frameworks.LLAMA_FACTORY),
    # open-r1's scripts run TRL's trainers (huggingface/open-r1 013b054 src/open_r1/grpo.py: from trl import GRPOTrainer)
    ("/open_r1/", frameworks.TRL),
    # Megatron-Bridge's performance recipes (NVIDIA-NeMo/Megatron-Bridge scripts/performance/setup_experiment.py)
    ("/scripts/performance/setup_experiment.py", frameworks.NEMO), ("/torchtitan/", frameworks.TORCHTITAN),
)  # fmt: skip
_TEXTS = (("Pai-Megatron-Patch", frameworks.PAI), ("megatron_patch", frameworks.PAI), ("ColossalAI", frameworks.COLOSSALAI),
          ("colossalai run", frameworks.COLOSSALAI), ("nvcr.io/nvidia/nemo:", frameworks.NEMO),
          ("torchtitan/models/", frameworks.TORCHTITAN))  # fmt: skip
# DeepSpeed's own launcher, and a config handed to the job (`--deepspeed ds_config.json`: the transformers Trainer's
# and Megatron-DeepSpeed's flag) or to `accelerate launch` (`--use_deepspeed`, `--deepspeed_config_file`)
_DEEPSPEED_FLAGS = ("--deepspeed", "--deepspeed_config", "--use_deepspeed", "--deepspeed_config_file")
_MEGATRON_LM = ("pretrain_gpt.py", "pretrain_mamba.py", "pretrain_bert.py", "pretrain_t5.py", "train_rl.py")
# A framework's release named in the script's text (`pip install verl==0.4.1`, an image tag, a checkout).
_RELEASE = {
    frameworks.VERL: re.compile(r"\bverl(?:==|[-_@:/])v?(\d+\.\d+(?:\.\d+)?)\b", re.IGNORECASE),
    frameworks.OPENRLHF: re.compile(r"\bopenrlhf(?:==|[-_@:/])v?(\d+\.\d+\.\d+)\b", re.IGNORECASE),
    frameworks.MEGATRON_LM: re.compile(r"(?:megatron-core==|core_v)(\d+\.\d+\.\d+\w*)"),
    frameworks.MS_SWIFT: re.compile(r"\bms-swift==v?(\d+\.\d+\.\d+)"),
}
# The flags only slime's parser defines (not Megatron's): a script that gives one is slime's.
SLIME_ONLY = tuple(spelling for spelling, flag in BY_SPELLING.items() if flag.owner == SLIME)
DEFAULTED = "Megatron's default (not given)"  # a parallel size the script does not give
_SIZES = {
    "tp": "--tensor-model-parallel-size",
    "pp": "--pipeline-model-parallel-size",
    "cp": "--context-parallel-size",
    "ep": "--expert-model-parallel-size",
    "etp": "--expert-tensor-parallel-size",
}


def script_framework(script: LaunchScript, text: str) -> Framework:
    """The framework a launch script runs (facts.frameworks.NAMES), with the evidence; UNKNOWN without any."""
    entry = script.train_script
    found = None
    if entry.startswith("-m "):
        module = entry[3:]
        found = next(((name, f"python3 -m {module}") for prefix, name in _MODULES if module.startswith(prefix)), None)
    found = found or next(
        ((name, f"the `{entry}` command") for prefix, name in _CLIS if entry.startswith(prefix)), None
    )
    path = "/" + entry.replace("\\", "/").lower()
    found = found or next(((name, f"the script {entry}") for part, name in _PATHS if part in path), None)
    found = found or next(((name, f"the script names {part}") for part, name in _TEXTS if part in text), None)
    # `--flag value`, `--flag=value`, as written -> `_` as `-` (facts.frameworks.OWN_FLAGS' spelling)
    given = {(flag := arg.split("=", 1)[0]).replace("_", "-"): flag for arg in script.argv if arg.startswith("--")}
    found = found or next(
        ((name, f"its flag {given[flag]}") for flag, name in frameworks.OWN_FLAGS if flag in given), None
    )
    if found is None and path.rsplit("/", 1)[-1] in _MEGATRON_LM:
        # `--deepspeed`: Megatron-LM's parser defines no such flag (core_v0.15.0rc0 megatron/training/arguments.py);
        # Megatron-DeepSpeed's adds DeepSpeed's (deepspeedai/Megatron-DeepSpeed 207b2d5 megatron/arguments.py:55,
        # `deepspeed.add_config_arguments(parser)`) (holdout19 06: pretrain_gpt.py ... --deepspeed_config=...)
        ds = next((flag for flag in given.values() if flag in _DEEPSPEED_FLAGS), None)
        found = (frameworks.MEGATRON_DEEPSPEED, f"{entry.rsplit('/', 1)[-1]} with {ds}") if ds else None
        found = found or (frameworks.MEGATRON_LM, f"Megatron-LM's {entry.rsplit('/', 1)[-1]}")
    slime = [flag for flag in SLIME_ONLY if flag in script.argv]
    if found is None and (slime or named_release(text)):
        shown = f"slime's flags ({', '.join(slime[:3])})" if slime else "the slime release its text names"
        found = (frameworks.SLIME, f"the launch script runs {entry} with {shown}")
    found = found or _deepspeed(script)
    if found is None:
        return UNKNOWN
    name, how = found
    match = _RELEASE.get(name).search(text) if name in _RELEASE else None
    release = None if match is None else ("v" + match[1] if name != frameworks.MEGATRON_LM else match[1])
    return Framework(name, release, how + (f"; the script names {match[0]}" if match else ""))


def text_framework(text: str) -> tuple[str, str] | None:
    """(framework, the text that names it) for a script nanscope reads no train command in (a wrapper, variables
    only): a framework's path or words in its text (`torchtitan/models/...`, `nvcr.io/nvidia/nemo:`); None: none."""
    low = text.lower()
    found = next(((name, part) for part, name in _TEXTS if part in text), None)
    return found or next(((name, part.strip("/")) for part, name in _PATHS if part in low), None)


def _deepspeed(script: LaunchScript) -> tuple[str, str] | None:
    """DeepSpeed, by its launcher (`deepspeed train.py ...`) or a DeepSpeed config the command hands over."""
    launcher = script.launcher[0].rsplit("/", 1)[-1] if script.launcher else ""
    if launcher == "deepspeed":
        return frameworks.DEEPSPEED, f"the `deepspeed` launcher runs {script.train_script}"
    words = script.argv + script.launcher
    for i, word in enumerate(words):
        flag = word.split("=", 1)[0]
        if flag in _DEEPSPEED_FLAGS:
            value = word.split("=", 1)[1] if "=" in word else (words[i + 1] if i + 1 < len(words) else "")
            shown = f"{flag} {value}".strip() if not value.startswith("-") else flag
            return frameworks.DEEPSPEED, f"{shown[:80]}: the job runs DeepSpeed"
    return None


@dataclass
class Foreign:
    """A non-slime launch: its flags (Megatron's spelling) and the parallel sizes they give.

    Attributes:
        sizes: tp, pp, cp, ep, etp, vpp, nodes, gpus_per_node -> value (None: not given).
        origins: size -> where it came from, as the script wrote it.
        notes: what was not read, or assumed.
    """

    framework: Framework
    view: FlagView
    sizes: dict[str, int | None]
    origins: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # values given that are no size: one line each, as written
    model: dict[str, int] = field(default_factory=dict)  # the model's sizes the layout needs ({"--num-layers": 4})
    recipe: list[str] = field(default_factory=list)  # the parallel sizes a recipe sets, not read (launch.bridge_perf)

    def given(self, size: str) -> int | None:
        """A parallel size the script gives (None: not given, only Megatron's default, DEFAULTED)."""
        return None if self.origins.get(size) == DEFAULTED else self.sizes.get(size)


# Sizes of the model a Megatron launch gives, which the layer split and the experts per rank need (megatron-core
# 0.15.0rc0 transformer_config.py: num_layers, num_moe_experts; --decoder-{first,last}-pipeline-num-layers).
_MODEL_SIZES = {
    "--num-layers": MAX_LAYERS,
    "--num-experts": MAX_EXPERTS,
    "--decoder-first-pipeline-num-layers": MAX_LAYERS,
    "--decoder-last-pipeline-num-layers": MAX_LAYERS,
}


def read_foreign(script: LaunchScript, framework: Framework) -> Foreign:
    """The flags and sizes of a non-slime launch."""
    overrides = any("=" in word and not word.startswith("-") for word in script.argv)
    hydra = framework.name == frameworks.VERL or (framework.name == frameworks.NEMO and overrides)  # key=value
    aliases = bridge_perf.ALIASES if bridge_perf.is_perf(script.train_script) else None  # its short flags
    view = FlagView.of_hydra(script.argv) if hydra else FlagView.of_argv(script.argv, aliases)
    launch = Foreign(framework, view, {})
    for size, flag in {**_SIZES, "vpp": "--virtual-pipeline-model-parallel-size"}.items():
        launch.sizes[size] = _checked(launch, view, flag)
        if view.has(flag):
            launch.origins[size] = view.show(flag)
    stages = _checked(launch, view, "--num-layers-per-virtual-pipeline-stage")
    launch.sizes["vpp"] = launch.sizes["vpp"] or _checked(launch, view, "--num-virtual-stages-per-pipeline-rank")
    for flag, high in _MODEL_SIZES.items():
        value = _checked(launch, view, flag, high)
        if value is not None:
            launch.model[flag] = value
    if stages is not None:
        launch.notes.append(f"--num-layers-per-virtual-pipeline-stage {stages}: virtual stages need num-layers")
    if script.cut:
        launch.notes.append(script.cut)
    if script.pasted:
        launch.notes.append(script.pasted)
    launch.notes += script.read_as + script.limits  # how the text was read, and what of it was not
    launch.notes += [  # what it sets is not in the flags read (a slime launch's say so too: launch.notes.input_notes)
        f"line {source.line}: source {source.path}: {source.reason}; the variables it sets are unknown (pass --env NAME=VALUE)"
        for source in script.sources
        if source.status == "missing"
    ]
    _deepspeed_config(launch, view)
    _world(launch, script)
    launch.recipe = bridge_perf.recipe_sizes(view) if aliases else []
    _visible_devices(launch, script)
    for size, value in launch.sizes.items():
        if value is None and size in ("tp", "pp", "cp", "ep"):
            launch.sizes[size], launch.origins[size] = 1, DEFAULTED
    return launch


def _world(launch: Foreign, script: LaunchScript) -> None:
    """Nodes and GPUs per node: verl's trainer.*, a launcher's --nnodes / --nproc_per_node (DeepSpeed's --num_nodes /
    --num_gpus, accelerate's --num_machines and its --num_processes across them), ms-swift's and xtuner's NNODES /
    NPROC_PER_NODE, OpenRLHF's actor nodes and GPUs, Megatron-Bridge's --gpus_per_node (its nodes: `_bridge_nodes`)."""
    view, launcher = launch.view, FlagView.of_argv(script.launcher)
    pairs = (
        ("nodes", (view, "--nnodes"), (launcher, "--nnodes"), (view, "--actor-num-nodes"), (launcher, "--num-nodes"),
         (launcher, "--num-machines")),
        ("gpus_per_node", (view, "--nproc-per-node"), (launcher, "--nproc-per-node"), (view, "--actor-num-gpus-per-node"),
         (launcher, "--num-gpus"), (view, "--gpus-per-node")),
    )  # fmt: skip
    env = {"nodes": "NNODES", "gpus_per_node": "NPROC_PER_NODE"}
    for size, *places in pairs:
        launch.sizes[size], every = None, False
        for source, flag in places:
            if source.has(flag) and size == "gpus_per_node" and _every_device(source, flag):
                launch.origins[size], every = source.show(flag), True
                launch.notes.append(f"gpus per node: {source.show(flag)}: every visible GPU, a count the script does "
                                    "not give")  # fmt: skip
                break
            if source.has(flag):
                launch.sizes[size], launch.origins[size] = _checked(launch, source, flag), source.show(flag)
                break
        if size not in launch.origins and script.command_env.get(env[size]) is not None:
            text = script.command_env[env[size]]
            launch.origins[size] = f"{env[size]}={text}"
            launch.sizes[size] = _size(launch, f"{env[size]}={text}", text)
        if size == "gpus_per_node" and launch.sizes[size] is None and launcher.has("--num-processes"):
            _processes(launch, launcher)
        typed = bridge_perf.per_node(view) if bridge_perf.is_perf(script.train_script) else None
        if size == "gpus_per_node" and launch.sizes[size] is None and typed is not None:
            launch.sizes[size], launch.origins[size] = typed
        if launch.sizes[size] is None and not every:
            launch.notes.append(f"{size.replace('_', ' ')}: not given (or read from an unset variable)")
    _bridge_nodes(launch)


def _every_device(view: FlagView, flag: str) -> bool:
    """The value asks for every visible GPU: torchrun's `--nproc_per_node auto` or `gpu` (torch/distributed/run.py's
    determine_local_world_size), Lightning's `devices=-1` or `auto` (NeMo's `trainer.devices`: Lightning's docs,
    accelerators/gpu_basic: -1 is all available GPUs)."""
    value = (view.value(flag) or "").strip().strip("'\"").lower()
    return value in ("auto", "gpu") or (value == "-1" and "devices" in view.show(flag))


def _bridge_nodes(launch: Foreign) -> None:
    """Megatron-Bridge's performance scripts take every GPU as --num_gpus and a node's as --gpus_per_node, and ask
    for ceil(num_gpus / gpus_per_node) nodes (NVIDIA-NeMo/Megatron-Bridge 067f987 scripts/performance/
    argument_parser.py:224, :465; setup_experiment.py:662). DeepSpeed's launcher's --num_gpus, a node's, is read above."""
    view, per_node = launch.view, launch.sizes.get("gpus_per_node")
    if launch.framework.name != frameworks.NEMO or launch.sizes.get("nodes") is not None or not per_node:
        return
    if not view.has("--num-gpus") or (total := _checked(launch, view, "--num-gpus")) is None:
        return
    launch.sizes["nodes"], launch.origins["nodes"] = -(total // -per_node), f"{view.show('--num-gpus')} / {per_node}"
    launch.notes = [note for note in launch.notes if not note.startswith("nodes: not given")]


def _processes(launch: Foreign, launcher: FlagView) -> None:
    """accelerate's --num_processes counts the processes on every machine together: a node's share where the machines
    are given and divide it."""
    total, nodes = _checked(launch, launcher, "--num-processes"), launch.sizes.get("nodes") or 1
    if total is None:
        return
    if total % nodes:
        launch.notes.append(
            f"{launcher.show('--num-processes')}: {count(total, 'process', 'processes')} on {count(nodes, 'machine')} do not divide"
        )
        return
    launch.sizes["gpus_per_node"] = total // nodes
    launch.origins["gpus_per_node"] = (
        f"{launcher.show('--num-processes')} over {count(nodes, 'machine')} (accelerate's count)"
    )


_ZERO = re.compile(r"(?:zero|stage|_z)[_-]?(?P<stage>[0-3])(?![\d])", re.IGNORECASE)


def _deepspeed_config(launch: Foreign, view: FlagView) -> None:
    """The DeepSpeed config a launch hands over (`--deepspeed deepspeed_zero2`), and the ZeRO stage its name says."""
    flag = next((flag for flag in ("--deepspeed", "--deepspeed-config", "--deepspeed-config-file") if view.value(flag)),
                None)  # fmt: skip
    if flag is None:
        return
    value = view.value(flag) or ""
    stage = _ZERO.search(value.rsplit("/", 1)[-1])
    said = f" (ZeRO stage {stage['stage']}, by its name; the file itself is not read)" if stage else ""
    launch.notes.append(f"DeepSpeed config: {view.show(flag)}{said}")


def _visible_devices(launch: Foreign, script: LaunchScript) -> None:
    """CUDA_VISIBLE_DEVICES (the command's own, else the script's) counts the GPUs a node's processes see: the GPUs
    per node where the launch does not give them, and a contradiction where it gives another count."""
    text = script.command_env.get("CUDA_VISIBLE_DEVICES", script.variables.get("CUDA_VISIBLE_DEVICES"))
    if not isinstance(text, str) or not re.fullmatch(r"\d{1,4}(,\d{1,4}){0,255}", text.strip()):
        return
    count, given = len(text.split(",")), launch.sizes.get("gpus_per_node")
    shown = f"CUDA_VISIBLE_DEVICES={text.strip()}"
    if given is None and "gpus_per_node" not in launch.origins:
        launch.sizes["gpus_per_node"], launch.origins["gpus_per_node"] = count, f"{shown} ({count} devices)"
        launch.notes = [note for note in launch.notes if not note.startswith("gpus per node: not given")]
        default = " (verl's own default, trainer.n_gpus_per_node 8, would not fit them)" * (
            launch.framework.name == frameworks.VERL and count < 8
        )
        launch.notes.append(f"GPUs per node not given: {count}, the devices {shown} names{default}")
    elif given is not None and given != count:
        launch.notes.append(
            f"{launch.origins['gpus_per_node']} but {shown} names {count} devices: the processes of a node see {count}"
        )


def _checked(launch: Foreign, view: FlagView, flag: str, high: int = MAX_WORLD) -> int | None:
    """The size `flag` gives (None: not given, or no size: then said in `launch.refused`)."""
    if not view.has(flag):
        return None
    return _size(launch, view.show(flag), view.value(flag) or "", high)


def _size(launch: Foreign, written: str, text: str, high: int = MAX_WORLD) -> int | None:
    """A size as the script wrote it: a whole number in 1..high, else None, with the reason in `launch.refused`
    (a negative, zero or absurd value is never taken silently, nor replaced by a default). A value read from a
    variable the script never sets is not a size yet: None, without a word (the layout says it is not given)."""
    text = text.strip()
    if "$" in text:
        return None
    if not re.fullmatch(r"[+-]?\d{1,30}", text):
        launch.refused.append(f"{written}: not a whole number")
    elif int(text) < 1:
        launch.refused.append(f"{written}: must be >= 1")
    elif int(text) > high:
        launch.refused.append(f"{written}: over {high:,}, more than nanscope lays out")
    else:
        return int(text)
    return None

"""verl 0.9.0's own actor update on 2 gloo ranks on CPU, as a test runs it: `run(Spec(...), tmp_path, model)`.

Each rank is a subprocess (`python -m tests.verl.rank`, tests/verl/rank.py) with a hard timeout: both are killed when
it passes. The run is verl's `ActorRolloutRefWorker(role="actor").init_model()` + `update_actor()` (v0.9.0's engine
path), FSDP2, fp32, a tiny Qwen3 (`tiny_qwen3`), with the CPU stand-ins of tests/verl/standins.py. A Spec chooses
the plugin's install path, the loss mode, NANSCOPE_* variables, the plants of tests/verl/data.py (rank 1, by step),
a test-only fault on rank 1's `model.layers.1.mlp`, and the number of steps. The result holds, per rank, the engine's
class, the metrics (the worker's, and verl's driver's reduction: `actor/...`), the exception that ended the run, what
the rank printed, and the full parameters before the first step and after the last.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "nanscope.verl_plugin"
INSTALLS = (None, "external_lib", "env")  # verl alone; the config line; VERL_USE_EXTERNAL_MODULES
FAULT_MODULE = "model.layers.1.mlp"

# verl's ppo_trainer.yaml, as a CPU run of the actor needs it: FSDP2 (FSDP1's sync_module_states refuses CPU
# parameters, fsdp/transformer_impl.py:418-430), fp32, eager attention, no remove-padding (it needs flash_attn's
# varlen kernels), 4 samples a rank in one mini-batch, one sample a micro-batch.
ACTOR = (
    "actor.strategy=fsdp2", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size_per_gpu=1",
    "actor.use_torch_compile=False", "actor.fsdp_config.model_dtype=fp32", "actor.fsdp_config.dtype=float32",
    "actor.optim.lr=1e-2", "model.use_remove_padding=False", "model.enable_gradient_checkpointing=False",
    "+model.override_config.attn_implementation=eager", "rollout.n=1", "rollout.log_prob_micro_batch_size_per_gpu=1",
    "ref.log_prob_micro_batch_size_per_gpu=1",
)  # fmt: skip
# the critic (ppo_trainer.yaml's critic: dp_critic), as the actor above: FSDP2, fp32, eager attention, no
# remove-padding, 4 samples a rank in one mini-batch, one sample a micro-batch
CRITIC = (
    "strategy=fsdp2", "ppo_mini_batch_size=4", "ppo_micro_batch_size_per_gpu=1", "fsdp.model_dtype=fp32",
    "fsdp.dtype=float32", "optim.lr=1e-2", "model.use_remove_padding=False", "model.enable_gradient_checkpointing=False",
    "+model.override_config.attn_implementation=eager", "enable=True",
)  # fmt: skip
ROLES = ("actor", "critic")
# a decaying learning rate (cosine from the first update), so a step that advances the schedule shows in `lr`
COSINE = (
    "actor.optim.lr_scheduler_type=cosine", "actor.optim.lr_warmup_steps_ratio=0.0",
    "actor.optim.total_training_steps=4",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Spec:
    install: str | None = None  # one of INSTALLS
    loss_mode: str = "vanilla"  # actor.policy_loss.loss_mode
    env: dict[str, str] = field(default_factory=dict)  # NANSCOPE_* and the like, in both ranks' environment
    plants: dict[int, str] = field(default_factory=dict)  # step -> a tests/verl/data.py plant, on rank 1
    fault: str | None = None  # None, "every" (pass) or "first" (pass only): rank 1's FAULT_MODULE outputs NaN
    steps: int = 1
    step_offset: int = 0  # the data of step i is data.mini_batch(rank, i + step_offset, ...)
    overrides: tuple[str, ...] = ()  # more of ppo_trainer.yaml's actor_rollout_ref.*, as in ACTOR
    count: bool = False  # count collectives and host reads during each update_actor (tests/verl/rank.py: counting)
    role: str = "actor"  # the actor (ActorRolloutRefWorker.update_actor) or the critic (TrainingWorker, value_model)

    def __post_init__(self):
        assert self.install in INSTALLS, self.install
        assert self.fault in (None, "every", "first"), self.fault
        assert self.role in ROLES, self.role
        # verl's trainer builds the critic's config in its driver, not in the worker (trainer_base.py:250): only
        # VERL_USE_EXTERNAL_MODULES reaches the critic's process
        assert self.role == "actor" or self.install != "external_lib", "the critic takes the plugin from the env"

    def hydra(self, model: str) -> list[str]:
        if self.role == "critic":  # the actor's keys are left as ppo_trainer.yaml has them
            mine = [f"model.path={model}", *CRITIC, *self.overrides]
            return [f"+critic.{o[1:]}" if o.startswith("+") else f"critic.{o}" for o in mine]
        mine = [f"model.path={model}", f"actor.policy_loss.loss_mode={self.loss_mode}", *ACTOR, *self.overrides]
        if self.install == "external_lib":
            mine.append(f"model.external_lib={PLUGIN}")
        return [f"+actor_rollout_ref.{o[1:]}" if o.startswith("+") else f"actor_rollout_ref.{o}" for o in mine]


@dataclass
class Rank:
    engine: str | None  # the engine's class, module.qualname
    metrics: list[dict]  # per step, as update_actor returns them (lists per micro-batch or rank)
    driver: list[dict]  # per step, as verl's driver logs them: actor/..., reduced
    error: str | None  # "Type: message" of what ended the run
    traceback: str | None
    output: str  # what the rank printed (stdout and stderr)
    before: dict[str, torch.Tensor] | None  # full parameters before the first step (None when the run raised)
    steps: list[dict[str, torch.Tensor]]  # and after each step
    counts: list[dict[str, int]]  # per step, with Spec.count: calls of each collective and host read
    seconds: list[float]  # per step, update_actor's wall time on this rank (benchmarks/verl_step.py; no test's)
    cpu: list[float]  # ... and its CPU time

    @property
    def after(self) -> dict[str, torch.Tensor] | None:
        return self.steps[-1] if self.steps else None


def tiny_qwen3(path: Path) -> str:
    """A 2-layer Qwen3 (hidden 64, vocab 128, fp32) built from its config and saved to `path`, seed 0."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    Qwen3ForCausalLM(config).save_pretrained(path)
    # verl's HFModelConfig loads a tokenizer from the model's path (workers/config/model.py:159-162)
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    return str(path)


def tiny_qwen3_critic(path: Path) -> str:
    """`tiny_qwen3`'s model with a one-label token-classification head (verl's critic, fsdp/transformer_impl.py:
    274-285), seed 0."""
    from transformers import Qwen3Config, Qwen3ForTokenClassification

    tiny_qwen3(path)
    torch.manual_seed(0)
    Qwen3ForTokenClassification(Qwen3Config.from_pretrained(path, num_labels=1)).save_pretrained(path)
    return str(path)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(spec: Spec, rank: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANSCOPE_", "VERL_"))}
    path = [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        VERL_PLATFORM="cpu", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(path), PYTHONUNBUFFERED="1",
        **spec.env,
    )  # fmt: skip
    if spec.install == "env":  # the stand-ins first: the platform is `cpu` before the plugin asks for the device
        env["VERL_USE_EXTERNAL_MODULES"] = f"tests.verl.cpu_standin,{PLUGIN}"
    return env


def run(spec: Spec, tmp_path: Path, model: str, *, name: str = "run", timeout: float = 240) -> list[Rank]:
    """Both ranks of one run; each gets `timeout` seconds, then both are killed and the test fails."""
    out = tmp_path / name
    out.mkdir()
    path = out / "spec.json"
    payload = {"overrides": spec.hydra(model), "steps": spec.steps, "role": spec.role, "step_offset": spec.step_offset,
               "plants": {str(k): v for k, v in spec.plants.items()}, "count": spec.count,
               "fault": spec.fault and {"rank": 1, "module": FAULT_MODULE, "when": spec.fault}}  # fmt: skip
    path.write_text(json.dumps(payload))
    port = _port()
    logs = [open(out / f"rank{r}.log", "w") for r in (0, 1)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.verl.rank", str(path), str(r)],
            cwd=ROOT,
            env=_environment(spec, r, port),
            stdout=logs[r],
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for r in (0, 1)
    ]
    try:
        for p in procs:
            p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"a verl rank ran past {timeout} s: {out}/rank*.log") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
    return [_rank(out, path, r, procs[r].returncode) for r in (0, 1)]


def _rank(out: Path, path: Path, rank: int, code: int) -> Rank:
    output = (out / f"rank{rank}.log").read_text()
    result = Path(f"{path}.rank{rank}.json")
    assert code == 0 and result.exists(), f"rank {rank} exited {code} without its result:\n{output[-4000:]}"
    got = json.loads(result.read_text())
    params = Path(f"{path}.rank{rank}.params.pt")
    saved = torch.load(params) if params.exists() else {}
    return Rank(engine=got["engine"], metrics=got["metrics"], driver=got["driver"], error=got["error"],
                traceback=got["traceback"], output=output, before=saved.get("before"), steps=saved.get("steps", []),
                counts=got["counts"], seconds=got["seconds"], cpu=got["cpu"])  # fmt: skip


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Bitwise equal parameters (same names, same bits)."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

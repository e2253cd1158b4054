"""Run slime's own train.py on CPU, end to end: what `nanscope repro --slime-src DIR` launches.

    result = run.run(run.Request(sources=run.Sources(slime=Path("slime")), case_flags=..., ...))

In a work dir of its own (removed at the end):
1. the tiny Qwen3-MoE's Hugging Face dir (`hf.write`);
2. one process writes the --ref-load checkpoint and the rollout with the hazard (`prepare`);
3. a head process starts a local Ray instance with 4 logical GPUs and runs each launch's train.py on it as its
   own driver (`head`): `as-is` (the case's flags), or with the plugin `sentinel` (README lines 2 and 3, skip
   mode: the non-finite step is detected, rerun, reported and skipped) then `plugin` (all three lines).

Every process of the run gets the same PYTHONPATH: nanscope's stand-ins first (`standins/`: sglang,
torch_memory_saver, triton, the driver's sitecustomize), then slime's checkout, then Megatron-LM's (for
`megatron.training`; its megatron-core shadows the installed wheel, as the case's PYTHONPATH=/root/Megatron-LM/
does), then what the environment had. Every process of it, Ray's own included, sees no CUDA device
(`hidden_cuda.slime_run`), also on a GPU node. The result holds each launch's exit code, seconds, the driver's traceback
(cleaned of Ray's colour codes) and the tails of its output; the caller (`nanscope.slime_repro`) checks them.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nanscope.errors import UserError
from nanscope.facts import releases
from nanscope.inputs import read_bytes
from nanscope.launch.logs import clean
from nanscope.megatron import hidden_cuda, proctree, scratch
from nanscope.megatron.proctree import StopSignals
from nanscope.outputs import copy_file
from nanscope.slime_train import flags, head, hf, prepare, worker

STANDINS = Path(__file__).with_name("standins")
STANDIN_MODULES = ("sglang", "sglang_router", "torch_memory_saver", "triton", "sitecustomize")
TAIL_LINES = 60
TRACEBACK = "Traceback (most recent call last):"


@dataclass(frozen=True)
class Sources:
    """Where slime and Megatron-LM come from."""

    slime: Path  # a checkout holding train.py and slime/
    megatron_lm: Path | None  # a directory holding megatron/training; None: importable here already

    def pythonpath(self) -> list[str]:
        paths = [str(STANDINS), str(self.slime)]
        paths += [str(self.megatron_lm)] if self.megatron_lm is not None else []
        return paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


@dataclass(frozen=True)
class Launch:
    """One launch of train.py: the README's plugin lines it adds, and the plugin's settings."""

    name: str
    lines: tuple[int, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


AS_IS = Launch("as-is")
SENTINEL = Launch("sentinel", (2, 3), {"NANSCOPE_ON_NONFINITE": "skip"})
PLUGIN = Launch("plugin", (1, 2, 3))


@dataclass(frozen=True)
class Request:
    sources: Sources
    case_flags: Mapping[str, list[str]]  # the case's launch.sh flags, {flag: [values]}
    hazard: str
    temperature: float  # the case's --rollout-temperature
    group_size: int  # the case's --n-samples-per-prompt
    release: str  # the checkout's slime release (its Sample fields)
    launches: tuple[Launch, ...] = (AS_IS,)
    report_dir: str | None = None  # the plugin's NANSCOPE_REPORT_DIR, its dumps and W&B dir, the launches' logs
    seed: int = 0
    timeout_s: float = 1800.0


@dataclass
class LaunchResult:
    name: str
    plan: flags.Plan
    returncode: int | None
    seconds: float | None
    traceback: str | None  # the driver's last traceback, as Python printed it (Ray's colour codes removed)
    stdout_tail: str
    stderr_tail: str
    steps: list[dict]  # slime's per-step train log (model.py:476 `step N: {...}`), numbers parsed


@dataclass
class Result:
    release: str
    site: tuple | None  # the hazard's (sample, response position)
    patched: list[str]  # the CPU layer's patches, as the workers apply them
    prepare_s: float
    ray_s: float | None
    wall_s: float
    launches: list[LaunchResult]
    timed_out: bool = False
    error: str | None = None  # a step of the run that failed before train.py (prepare, the head), with its output
    left_out: list[str] = field(default_factory=list)  # the drivers' logs that could not be left in the report dir


def environment(request: Request, report_dir: str | None) -> dict:
    """The env_vars of every process of the run (the job's runtime env, as the case's RUNTIME_ENV_JSON)."""
    env = {
        "PYTHONPATH": os.pathsep.join(request.sources.pythonpath()),
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",  # the case's runtime env; Megatron-LM's validate_args asserts it at TP > 1
        worker.GPUS_VAR: str(flags.WORLD),
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        # torch.compile'd helpers (slime's ppo_utils, megatron's fusions) run eagerly: TorchInductor would compile
        # C++ in every rank at their first call on CPU (its GPU kernels are Triton's); the ops are the same
        "TORCHDYNAMO_DISABLE": "1",
        "WANDB_SILENT": "true",
        # slime v0.1.0 never finishes an actor's W&B run, and Ray kills the actors when train.py exits (SIGKILL: no
        # atexit); an offline run's .wandb file is flushed every 15 s by default, so an actor's records (the plugin's
        # nanscope/* among them) would be lost: every 0.2 s here.
        "WANDB__TRANSACTION_LOG_FLUSH_INTERVAL": "0.2",
        # slime >= v0.3.1 destroys and rebuilds WORLD for --offload's sleep and wake-up (dropped with --colocate) and
        # then wraps every process group in its ReloadableProcessGroup (utils/reloadable_process_group.py:150-190),
        # whose collectives do not reach gloo through torch 2.13's reduce_scatter_single; its own switch turns that
        # off (backends/megatron_utils/actor.py:66-69). v0.1.0 has no such code.
        "SLIME_DESTROY_WORLD_PROCESS_GROUP": "0",
        # CUDA hidden, the GPUs Ray offers still named for slime's lookup of its GPU id (`hidden_cuda.slime_run`)
        **hidden_cuda.slime_run(flags.WORLD),
    }
    if report_dir is not None:
        env["NANSCOPE_REPORT_DIR"] = report_dir
    return env


def run(request: Request, progress: Callable[[str], None] | None = None) -> Result:
    """The run: prepare, the head and its launches; raises proctree.Interrupted on a stop signal. `progress(line)`
    as each phase starts and ends."""
    say = progress or (lambda line: None)
    started = time.time()
    with StopSignals() as stop, scratch.directory("nanscope-slime-") as work:
        work = Path(work)
        report_dir = str(Path(request.report_dir).absolute()) if request.report_dir else None
        paths = _paths(work, report_dir)
        hf.write(paths.hf)
        env = environment(request, report_dir)
        say("writing the checkpoint and the rollout (slime's model, the hazard in its rollout)")
        prep = _prepare(request, work, paths, env, stop)
        if isinstance(prep, Result):
            return prep
        names = ", ".join(launch.name for launch in request.launches)
        say(f"checkpoint and rollout written in {prep['seconds']:.0f} s; slime's train.py under Ray: {names}")
        plans = {
            launch.name: flags.launch(request.case_flags, _own_ckpt(paths, work, launch.name), lines=launch.lines)
            for launch in request.launches
        }
        head_request = _head_request(request, work, plans, env)
        remaining = request.timeout_s - (time.time() - started)
        code, timed_out, output = proctree.run_tree(
            [sys.executable, "-m", head.__name__, str(work / "head.json"), "--parent", str(os.getpid()),
             "--parent-tmp", str(work.parent)],
            # Ray's own processes: the run's env is the job's; CUDA hidden from all of them, as from the job's
            env={**os.environ, **hidden_cuda.slime_run(flags.WORLD)}, timeout_s=remaining, stop=stop,
        )  # fmt: skip
        say(f"slime's train.py {'timed out' if timed_out else 'done'} after {time.time() - started:.0f} s")
        done = json.loads(Path(head_request.result).read_text()) if Path(head_request.result).exists() else {}
        launches = [_launch_result(launch, plans[launch.name], done) for launch in head_request.launches]
        left_out = _leave_logs(head_request.launches, Path(report_dir)) if report_dir is not None else []
        error = None if code == 0 or timed_out else f"the Ray head exited {code}:\n{_tail(output)}"
        return Result(
            release=request.release, site=prep["site"], patched=prep["patched"], prepare_s=prep["seconds"],
            ray_s=done.get("ray_s"), wall_s=time.time() - started, launches=launches, timed_out=timed_out,
            error=error, left_out=left_out,
        )  # fmt: skip


def _leave_logs(launches, report_dir: Path) -> list[str]:
    """The drivers' logs beside the plugin's reports, each written whole, a link at its name replaced, never
    followed (`nanscope.outputs`); returns why a log could not be left there (a full disk), one line each."""
    left_out = []
    for launch in launches:
        for log in (launch.stdout, launch.stderr):
            if os.path.isfile(log):
                try:
                    copy_file(log, report_dir / Path(log).name)
                except OSError as e:
                    left_out.append(f"{report_dir / Path(log).name}: {e.strerror or e}")
    return left_out


def _own_ckpt(paths: flags.Paths, work: Path, name: str) -> flags.Paths:
    """`paths` with a --load/--save dir of the launch's own, empty: each launch starts from --ref-load (v0.3.1 saves
    a checkpoint after its last rollout, which the next launch would otherwise resume from)."""
    ckpt = work / f"ckpt.{name}"
    ckpt.mkdir()
    return dataclasses.replace(paths, ckpt=str(ckpt))


def _paths(work: Path, report_dir: str | None) -> flags.Paths:
    out = Path(report_dir) if report_dir is not None else work
    return flags.Paths(
        hf=str(work / "hf"),
        ref=str(work / "ref"),
        ckpt="",  # each launch's own (`_own_ckpt`)
        rollout=str(work / "rollout" / "{rollout_id}.pt"),
        wandb=str(out / "wandb"),
        dumps=str(out / "rollout_data" / "{rollout_id}.pt"),
    )


def _prepare(request: Request, work: Path, paths: flags.Paths, env: dict, stop: StopSignals) -> dict | Result:
    """The prepare process (checkpoint and rollout); its result dict, or a Result saying how it failed."""
    argv = [*flags.model_args(), "--transformer-impl", "local", *flags.CPU_FLAGS,
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", paths.hf, "--save", paths.ref,
            "--no-save-optim", "--no-save-rng"]  # fmt: skip
    prep = prepare.Request(
        argv=tuple(argv), rollout=paths.rollout, rollouts=int(flags.RESIZED["--num-rollout"][0]),
        result=str(work / "prepare.json"),
        hazard=request.hazard, seed=request.seed, temperature=request.temperature, group_size=request.group_size,
        samples=_samples(request.case_flags), sample_fields=releases.get(request.release).sample_fields,
    )  # fmt: skip
    (work / "prepare.request.json").write_text(prep.to_json())
    started = time.time()
    code, timed_out, output = proctree.run_tree(
        [sys.executable, "-m", prepare.__name__, str(work / "prepare.request.json")],
        env={**os.environ, **env}, timeout_s=request.timeout_s, stop=stop,
    )  # fmt: skip
    if code != 0 or timed_out:
        what = "timed out" if timed_out else f"exited {code}"
        return Result(release=request.release, site=None, patched=[], prepare_s=time.time() - started, ray_s=None,
                      wall_s=time.time() - started, launches=[], timed_out=timed_out,
                      error=f"writing the checkpoint and the rollout {what}:\n{_tail(output)}")  # fmt: skip
    return json.loads(Path(prep.result).read_text())


def _samples(case_flags: Mapping[str, list[str]]) -> int:
    """The rollout's samples: the run's --rollout-batch-size x the case's --n-samples-per-prompt."""
    return int(flags.RESIZED["--rollout-batch-size"][0]) * int(case_flags["--n-samples-per-prompt"][0])


def _head_request(request: Request, work: Path, plans: dict, env: dict) -> head.HeadRequest:
    launches = tuple(
        head.DriverLaunch(
            name=launch.name, argv=plans[launch.name].argv, env={**env, **launch.env},
            stdout=str(work / f"train.{launch.name}.out"), stderr=str(work / f"train.{launch.name}.err"),
        )
        for launch in request.launches
    )  # fmt: skip
    out = head.HeadRequest(
        train_py=str(request.sources.slime / "train.py"), cwd=str(work), cpus=flags.WORLD + 2, gpus=flags.WORLD,
        ray_temp=_ray_temp(work), launches=launches, result=str(work / "head.result.json"),
    )  # fmt: skip
    (work / "head.json").write_text(out.to_json())
    return out


def _ray_temp(work: Path) -> str:
    """A short dir for Ray's session (its sockets' paths must fit AF_UNIX), inside the work dir."""
    temp = work / "ray"
    temp.mkdir()
    return str(temp)


def _launch_result(launch: head.DriverLaunch, plan: flags.Plan, done: dict) -> LaunchResult:
    finished = next((item for item in done.get("launches", []) if item["name"] == launch.name), None)
    stdout = _read(launch.stdout)
    stderr = _read(launch.stderr)
    return LaunchResult(
        name=launch.name, plan=plan, returncode=finished["returncode"] if finished else None,
        seconds=finished["seconds"] if finished else None, traceback=driver_traceback(stderr),
        stdout_tail=_tail(stdout), stderr_tail=_tail(stderr), steps=train_steps(stdout) or train_steps(stderr),
    )  # fmt: skip


def _read(path: str) -> str:
    return Path(path).read_text(errors="replace") if Path(path).exists() else ""


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(clean(line) for line in text.splitlines()[-lines:])


# Ray's prefix on a line it forwards from a worker: `(MegatronTrainRayActor pid=7)`, `(pid=7, ip=10.0.0.1)`,
# `(raylet)`. A Python traceback's own lines never start with `(`.
_FORWARDED = re.compile(r"^\([^()]{0,200}\) ")
# An exception's line, at column 0: `RuntimeError: Rank 3, ...`, `ray.exceptions.ActorDiedError: ...`, `KeyboardInterrupt`
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]{0,200}(?:\(\w{1,80}\))?(?::|$)")
_NESTED = "ray.exceptions.RayTaskError"  # its message goes on with the actor's own traceback


def driver_traceback(stderr: str) -> str | None:
    """The last traceback the driver printed: from its header to the exception's last line.

    Ray prints its workers' log lines into the driver's output with a `(pid=...)` or `(Actor pid=...)` prefix,
    coloured, from a thread of the driver's: one can come between two lines of the traceback as Python writes it
    (CI, 2026-12-06: the traceback read ended before its error line). Such a line is left out while the traceback
    is unfinished, and ends it once its exception's line is in (as an empty line does).
    """
    lines = [clean(line) for line in stderr.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.startswith(TRACEBACK)]
    if not starts:
        return None
    block: list[str] = []
    for line in lines[starts[-1] :]:
        if not line.strip():
            break
        if block and _FORWARDED.match(line):
            if _EXCEPTION.match(block[-1]) and not block[-1].startswith(_NESTED):
                break
            continue
        block.append(line)
    return "\n".join(block) + "\n"


_STEP = re.compile(r"step (\d+): \{(.*)\}\s*$")
_ITEM = re.compile(r"'([^']+)': (-?inf|nan|[-+0-9.eE]+)")


def train_steps(stdout: str) -> list[dict]:
    """slime's per-step train log lines as {key: float}: `step N: {'train/loss': ..., ...}`, which v0.1.0 prints
    (model.py:476, stdout) and v0.3.1 logs (model.py:909, its logger: stderr)."""
    steps = []
    for line in stdout.splitlines():
        match = _STEP.search(clean(line))
        if match:
            steps.append({"step": int(match[1]), **{k: float(v) for k, v in _ITEM.findall(match[2])}})
    return steps


# The modules of a checkout the run imports itself (prepare.py, and slime's train.py through them): every release has
# them (v0.1.0 to main); a directory without them is no slime checkout, whatever else it holds.
REQUIRED = ("train.py", "slime/__init__.py", "slime/utils/types.py", "slime/backends/megatron_utils/arguments.py",
            "slime/backends/megatron_utils/initialize.py", "slime/backends/megatron_utils/model_provider.py")  # fmt: skip
TYPES_LIMIT = 1 << 20  # slime/utils/types.py is a few kB at every release


def check_sources(slime: str | Path, megatron_lm: str | Path | None) -> Sources:
    """The checkouts `--slime-src` and `--megatron-lm-src` name, checked; UserError (one line) if not usable."""
    root = Path(slime)
    if not (root / "train.py").is_file() or not (root / "slime" / "__init__.py").is_file():
        held = sorted(p.name for p in root.iterdir() if (p / "train.py").is_file()) if root.is_dir() else []
        first = releases.V0_1_0 if releases.V0_1_0 in held else held[0] if held else ""
        hint = f": it holds checkouts {', '.join(held)}; name one, e.g. {root / first}" if held else ""
        raise UserError(f"--slime-src {slime}: not a slime checkout (no train.py and slime/ there){hint}")
    missing = [name for name in REQUIRED if not (root / name).is_file()]
    if missing:
        raise UserError(
            f"--slime-src {slime}: not a slime checkout: no {', '.join(missing)} (every release has them; the run "
            "imports them)"
        )
    sample_fields(root)  # a types.py that cannot be read is refused now, not as the run's traceback
    if megatron_lm is None:
        if importlib.util.find_spec("megatron.training") is None:  # the megatron-core wheel has no megatron.training
            raise UserError(
                "--slime-src needs Megatron-LM's megatron.training, which is not importable here: pass "
                "--megatron-lm-src DIR (a Megatron-LM checkout; core_v0.15.0rc0 for the case's line numbers)"
            )
        return Sources(slime=root.absolute(), megatron_lm=None)
    lm = Path(megatron_lm)
    if not (lm / "megatron" / "training" / "__init__.py").is_file():
        raise UserError(f"--megatron-lm-src {megatron_lm}: no megatron/training/ there (a Megatron-LM checkout's root)")
    return Sources(slime=root.absolute(), megatron_lm=lm.absolute())


def sample_fields(checkout: Path) -> tuple[str, ...]:
    """The fields of the checkout's Sample dataclass (slime/utils/types.py), in order; () when there is none.

    Raises:
        UserError: types.py is not a regular file under TYPES_LIMIT, not UTF-8, or not Python this interpreter can
            parse (a syntax error, a nesting deeper than its parser takes).
    """
    path = checkout / "slime" / "utils" / "types.py"
    if not path.exists():
        return ()
    data = read_bytes(path, "slime's Sample (--slime-src)", TYPES_LIMIT)
    try:
        tree = ast.parse(data.decode("utf-8"), filename=str(path))
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path}: slime's Sample (--slime-src): not UTF-8 (byte {e.start}): not a slime checkout"
        ) from None
    except (SyntaxError, RecursionError, MemoryError, ValueError) as e:
        why = e.msg if isinstance(e, SyntaxError) else "nested too deeply" if not isinstance(e, ValueError) else str(e)
        raise UserError(f"{path}: slime's Sample (--slime-src): not Python this interpreter parses: {why}") from None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Sample":
            return tuple(
                x.target.id for x in node.body if isinstance(x, ast.AnnAssign) and isinstance(x.target, ast.Name)
            )
    return ()

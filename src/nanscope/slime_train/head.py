"""The Ray head of a CPU run of slime's train.py, and the driver launches on it.

    python -m nanscope.slime_train.head HEAD.json --parent PID --parent-tmp TMP

A local Ray instance (`ray_session.session`) offering `gpus` logical GPUs and `cpus` CPUs, on loopback, its session
in the parent's temp dir; then each launch's `python TRAIN_PY ARGV...` in turn, as its own Ray driver (RAY_ADDRESS),
the way `ray job submit -- python3 train.py` runs slime's: train.py is the driver's top frame. The job's runtime env
(`RAY_JOB_CONFIG_JSON_ENV_VAR`, the variable Ray's job supervisor hands a submitted driver) carries the
`--runtime-env-json` the case's launch passes (PYTHONPATH and friends) plus the workers' setup hook
(`nanscope.slime_train.worker.setup`). Each launch's stdout and stderr go to its files; this process writes
HEAD.json's `result` file: per launch its exit code and seconds.

The parent kills this process's tree on a timeout or a stop signal (Ray's processes and the drivers are in it, and
what a driver detached: this process adopts its orphans, `proctree.adopt_orphans`); killed with SIGKILL, the parent
leaves this process to end them (`proctree.ParentWatch`). At its end it kills what the drivers left running.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from nanscope.megatron import proctree, ray_session, scratch

SETUP_HOOK = "nanscope.slime_train.worker.setup"
DRIVER_VAR = "NANSCOPE_SLIME_DRIVER"  # the sitecustomize patches the driver's one CUDA-only call where it is set


@dataclass(frozen=True)
class DriverLaunch:
    """One `python train.py ARGV` on the cluster."""

    name: str
    argv: tuple[str, ...]
    env: dict  # the job's env_vars (the workers'), the driver's too
    stdout: str
    stderr: str


@dataclass(frozen=True)
class HeadRequest:
    train_py: str
    cwd: str  # the drivers' working directory (the run's work dir)
    cpus: int
    gpus: int
    ray_temp: str
    launches: tuple[DriverLaunch, ...]
    result: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> HeadRequest:
        fields = json.loads(text)
        launches = tuple(DriverLaunch(**{**launch, "argv": tuple(launch["argv"])}) for launch in fields["launches"])
        return cls(**{**fields, "launches": launches})


def job_config(env: dict) -> str:
    """RAY_JOB_CONFIG_JSON_ENV_VAR's value: the job's runtime env, as `ray job submit --runtime-env-json` sets it."""
    return json.dumps({"runtime_env": {"env_vars": env, "worker_process_setup_hook": SETUP_HOOK}})


def drive(request: HeadRequest, address: str, ray_s: float) -> list[dict]:
    """Each launch's train.py on the cluster at `address`, in turn; returns [{name, returncode, seconds}]."""
    done = []
    Path(request.result).write_text(json.dumps({"ray_s": ray_s, "launches": done}))
    for launch in request.launches:
        env = {**os.environ, **launch.env, "RAY_ADDRESS": address, DRIVER_VAR: "1"}
        env["RAY_JOB_CONFIG_JSON_ENV_VAR"] = job_config(launch.env)
        started = time.time()
        with open(launch.stdout, "w") as out, open(launch.stderr, "w") as err:
            code = subprocess.call(
                [sys.executable, request.train_py, *launch.argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=request.cwd,
            )
        done.append({"name": launch.name, "returncode": code, "seconds": time.time() - started})
        Path(request.result).write_text(json.dumps({"ray_s": ray_s, "launches": done}))  # should the next one hang
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("request")
    parser.add_argument("--parent", type=int, required=True, help="the launching process's pid")
    parser.add_argument("--parent-tmp", required=True, help="its temp dir, where its marked dirs are swept")
    args = parser.parse_args(argv)

    def body() -> int:
        proctree.adopt_orphans()  # a process train.py detaches stays in this tree: the parent's timeout kills it
        request = HeadRequest.from_json(Path(args.request).read_text())
        started = time.time()
        try:
            with ray_session.session(cpus=request.cpus, gpus=request.gpus, temp=request.ray_temp):
                import ray  # optional: the nanscope[ray] extra, in this process only

                drive(request, ray.get_runtime_context().gcs_address, time.time() - started)
        finally:  # what the drivers left running (a detached process): gone with the run
            proctree.wait_gone(proctree.kill_tree(os.getpid(), root=False))
        return 0

    proctree.agent(args.parent, lambda: scratch.sweep(args.parent_tmp), body)


if __name__ == "__main__":
    sys.exit(main())

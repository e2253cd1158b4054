"""slime's own train.py on CPU (`nanscope repro --slime-src`): the case's traceback from slime's own code, and the
plugin run that trains through it. Slow: each launch is minutes of 4 Ray actors on 2 cores.

Needs slime checkouts under NANSCOPE_SLIME_SRC (one directory per tag) and Megatron-LM's `megatron/` at
core_v0.15.0rc0 under NANSCOPE_TEST_MEGATRON_LM_SRC; both default to CI's copies beside the repository
(tests/checkouts.py), where a missing one fails instead of skipping.

    NANSCOPE_SLIME_SRC=../shared/slime-src pytest -m slow tests/slime_releases/test_slime_train.py
"""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nanscope import case
from nanscope.slime_repro import compared_frames, normalised
from tests import checkouts
from tests.processes import ProcessWatch

SRC = checkouts.SLIME_SRC
LM = checkouts.MEGATRON_LM_SRC
RUN_TIMEOUT_S = 1800  # one run: prepare, Ray, one or two train.py launches (about 1-4 min each on 2 idle cores)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("wide_lines")]  # the second: trace's lines asserted whole


@pytest.fixture(autouse=True)
def _checkouts():
    checkouts.slime_release("v0.1.0")
    if LM is None or not (LM / "megatron" / "training").is_dir():
        checkouts.missing(f"no Megatron-LM megatron/training at {LM} (NANSCOPE_TEST_MEGATRON_LM_SRC)")


def _nanscope(*argv: str, cwd: Path, timeout: float = RUN_TIMEOUT_S, watches: list | None = None):
    """`nanscope ARGV` in `cwd`; with `watches`, a ProcessWatch of its descendants is appended to it."""
    with subprocess.Popen([sys.executable, "-m", "nanscope.cli.main", *argv], cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:  # fmt: skip
        with ProcessWatch(proc.pid, poll_s=0.5) if watches is not None else contextlib.nullcontext() as watch:
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
        if watches is not None:
            watches.append(watch)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _repro(tmp: Path, release: str, *extra: str, watches: list | None = None) -> tuple:
    out = _nanscope(
        "repro", "--slime-src", str(Path(SRC).absolute() / release), "--megatron-lm-src", str(Path(LM).absolute()),
        "--json", str(tmp / "out.json"), *extra, cwd=tmp, timeout=RUN_TIMEOUT_S + 120, watches=watches,
    )  # fmt: skip
    assert (tmp / "out.json").exists(), out.stdout[-4000:] + out.stderr[-4000:]
    return out, json.loads((tmp / "out.json").read_text())


@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_as_is_dies_with_the_case_error_and_every_slime_and_megatron_frame_of_the_case(tmp_path):
    watches = []
    out, doc = _repro(tmp_path, "v0.1.0", "--traceback-out", str(tmp_path / "tb.txt"), watches=watches)
    assert out.returncode == 0 and doc["ok"], out.stdout[-6000:]
    # every process of the run (prepare, the Ray head and its instance, train.py, the Ray workers) sees no CUDA
    # device, and Ray's 4 logical GPUs stay named for slime's lookup of its GPU id (nanscope.megatron.hidden_cuda)
    watch = watches[0]
    assert watch.matching("train.py") and len(watch.matching("MegatronTrainRayActor")) >= 4, watch.seen
    assert watch.matching("nanscope.slime_train.prepare") and watch.matching("nanscope.slime_train.head")
    for seen in watch.ours():
        assert seen.environ == {"CUDA_VISIBLE_DEVICES": "-1,0,1,2", "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
                                "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}, seen  # fmt: skip
    assert not any(seen.cuda_driver for seen in watch.seen.values()), watch.seen
    assert doc["release"] == "v0.1.0" and [launch["name"] for launch in doc["launches"]] == ["as-is"]
    assert doc["launches"][0]["returncode"] == 1  # train.py died
    tb = (tmp_path / "tb.txt").read_text()
    assert tb == doc["as_is"]["traceback"] and tb.startswith("Traceback (most recent call last):\n")
    # the frame diff: train.py -> actor.py -> model.py -> megatron-core, exactly the case's (file, line, function)
    case_frames = compared_frames(case.text("traceback.txt"))
    assert [tuple(f) for f in doc["as_is"]["frames"]["run"]] == case_frames == compared_frames(tb)
    assert doc["as_is"]["frames"]["missing"] == [] and doc["as_is"]["frames"]["extra"] == []
    assert (
        case_frames[0] == ("train.py", 89, "<module>") and case_frames[-1][0] == "megatron/core/rerun_state_machine.py"
    )
    assert "ray.exceptions.RayTaskError(RuntimeError): ray::MegatronTrainRayActor.train()" in tb
    # Ray's first error is megatron's own, from a rank that saw the NaN: the case's message
    assert doc["as_is"]["message"] == case.nan_check_message() and doc["as_is"]["rank"] in range(4)
    last = tb.rstrip("\n").splitlines()[-1]
    assert (
        last
        == f"RuntimeError: Rank {doc['as_is']['rank']}, node {os.uname()[1]}, device cpu, iteration -1: {case.nan_check_message()}"
    )
    # what ran is said: the stand-ins, the CPU layer's patches, the dropped CPU-impossible flags
    assert doc["standins"] == ["sglang", "sglang_router", "torch_memory_saver", "triton", "sitecustomize"]
    assert "torch.distributed.init_process_group" in doc["patched"]["workers"]
    dropped = [flag.split()[0] for flag, _ in doc["flags"]["dropped"]]
    for flag in ("--colocate", "--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--moe-grouped-gemm",
                 "--moe-permute-fusion", "--attention-backend"):  # fmt: skip
        assert flag in dropped
    argv = doc["launches"][0]["argv"]
    assert "--colocate" not in argv and argv[argv.index("--transformer-impl") + 1] == "local"
    assert argv[argv.index("--pipeline-model-parallel-size") + 1] == "2" and "--use-dynamic-batch-size" in argv

    # doctor reads the produced traceback as the case's: rank, check, frames of the release
    doctor = _nanscope(
        "doctor", "--case", "slime-795", "--traceback", str(tmp_path / "tb.txt"), "--json", str(tmp_path / "d.json"),
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert doctor.returncode == 0, doctor.stderr[-3000:]
    report = json.loads((tmp_path / "d.json").read_text())
    failure = report["failure"]
    assert (failure["rank"], failure["kind"], failure["check"], failure["bucket"]) == (
        doc["as_is"]["rank"],
        "NaN",
        "grad-norm-nan",
        0,
    )
    assert report["slime_release"]["name"] == "v0.1.0"
    ours = [f for f in report["frames"] if normalised(f["path"])]  # slime's and megatron-core's
    assert len(ours) == 12 and all(f["matches"] for f in ours), [f["release"] for f in ours]


@pytest.mark.timeout(RUN_TIMEOUT_S + 600)
def test_plugin_catches_reports_and_trains_through(tmp_path):
    reports = tmp_path / "reports"
    out, doc = _repro(tmp_path, "v0.1.0", "--plugin", "--report-dir", str(reports))
    assert out.returncode == 0 and doc["ok"], out.stdout[-6000:]
    plugin = doc["plugin"]
    assert [launch["name"] for launch in doc["launches"]] == ["sentinel", "plugin"]
    assert all(launch["returncode"] == 0 for launch in doc["launches"])  # both train through
    assert plugin["reports"] >= 1 and plugin["bundles"] and plugin["verdicts"]
    assert plugin["loss_finite"] and plugin["nan_guard"]  # the plugin's loss dropped the NaN token
    assert plugin["replay"]["found"]
    sample, position = doc["site"]

    # nanscope trace on the report dir names the op, the sample and the token, through the checkout's own loss
    trace = _nanscope(
        "trace", str(reports), "--slime-src", str(Path(SRC).absolute() / "v0.1.0"), "--json", str(tmp_path / "t.json"),
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert trace.returncode == 1, trace.stderr[-3000:]  # 1: it found where the non-finite values began
    found = [b for b in json.loads((tmp_path / "t.json").read_text())["bundles"] if b["found"]]
    assert found and {b["coords"]["rank"] for b in found} <= {2, 3}  # the loss runs on the last stage
    first = found[0]["first"]
    # the op (TIS's multiply in slime's own loss, loss.py:282), the sample and the token of the planted NaN
    assert first["first_backward"]["op"] == "aten.mul.Tensor" and "loss.py:282" in first["first_backward"]["source"]
    assert (first["first_backward"]["sample"], first["first_backward"]["token"]) == (sample, position)
    assert [(i["name"], i["sample"], i["token"]) for i in first["inputs"]] == [("rollout_log_probs", sample, position)]
    assert f"rollout_log_probs at sample {sample}, response token {position}" in trace.stdout

    # the nanscope/* series reached W&B, offline, from both launches
    from tests.slime_plugin.test_wandb import history, records

    rows = [row for path in plugin["wandb_runs"] for row in history(records(Path(path)))]
    assert any(key.startswith("nanscope/") for row in rows for key in row)


@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_v0_3_1_dies_with_the_case_error_through_the_case_megatron_frames(tmp_path):
    checkouts.slime_release("v0.3.1")
    out, doc = _repro(tmp_path, "v0.3.1")
    assert out.returncode == 0 and doc["ok"], out.stdout[-6000:]
    assert doc["release"] == "v0.3.1" and doc["as_is"]["message"] == case.nan_check_message()
    frames = [tuple(f) for f in doc["as_is"]["frames"]["run"]]
    core = [f for f in compared_frames(case.text("traceback.txt")) if f[0].startswith("megatron/")]
    assert [f for f in frames if f[0].startswith("megatron/")] == core  # megatron-core's: the case's, line for line
    assert frames[0][0] == "train.py" and ("slime/backends/megatron_utils/model.py", 642, "train_one_step") in frames

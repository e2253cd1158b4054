"""Reading what a run of slime's train.py printed, and checking the checkouts it is pointed at (no launch)."""

import json
import os
from pathlib import Path

import pytest

from nanscope import case, slime_repro
from nanscope.errors import UserError
from nanscope.slime_train import run

# The driver's stderr as a CPU run leaves it: Ray's worker-log lines (prefixed, coloured) around the traceback.
RAY_LINE = "\x1b[36m(MegatronTrainRayActor pid=19292)\x1b[0m WARNING:megatron.core.rerun_state_machine:Implicit init"
CASE_TB = case.text("traceback.txt")
RUN_TB = (
    CASE_TB.replace("/workspace/deepresearch/train.py", "/home/u/slime/train.py")
    .replace("/usr/local/lib/python3.12/dist-packages/slime/", "/home/u/slime/slime/")
    .replace("/root/Megatron-LM/", "/opt/Megatron-LM/")
)


def test_the_driver_traceback_is_the_last_one_without_rays_interleaved_lines():
    colored = RUN_TB.replace("ray::MegatronTrainRayActor.train()", "\x1b[36mray::MegatronTrainRayActor.train()\x1b[39m")
    stderr = "\n".join(["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "ValueError: old",
                        RAY_LINE, colored.rstrip("\n"), RAY_LINE, "", "more"])  # fmt: skip
    assert run.driver_traceback(stderr) == RUN_TB
    assert run.driver_traceback("no traceback here\n") is None


def test_a_worker_line_ray_forwards_into_the_middle_of_the_driver_traceback_is_left_out():
    """CI, 2026-12-06: Ray's log thread wrote a worker's line between two lines of the traceback Python was printing;
    the traceback read ended there, before its error line (and the check then raised on a missing failure)."""
    lines = RUN_TB.splitlines()
    at = next(i for i, line in enumerate(lines) if "param_and_grad_buffer.py" in line)
    cut = lines[:at] + [RAY_LINE, "(raylet) a line of the raylet's"] + lines[at:]
    stderr = "\n".join(["log line", *cut, RAY_LINE, "2026-12-06 02:00:00,000\tINFO worker.py:1 -- shutting down"])
    assert run.driver_traceback(stderr) == RUN_TB
    nested = RUN_TB.index("ray.exceptions.RayTaskError")  # a worker line just after Ray's own exception line
    head, tail = RUN_TB[:nested], RUN_TB[nested:].split("\n", 1)
    assert run.driver_traceback(head + tail[0] + "\n" + RAY_LINE + "\n" + tail[1]) == RUN_TB


def test_frames_compare_by_their_path_from_slime_or_megatron_and_ray_frames_are_left_out():
    frames = slime_repro.compared_frames(RUN_TB)
    assert frames == slime_repro.compared_frames(CASE_TB)
    assert frames[:3] == [("train.py", 89, "<module>"), ("train.py", 61, "train"),
                          ("slime/backends/megatron_utils/actor.py", 258, "train")]  # fmt: skip
    assert len(frames) == 12 and not any("ray/" in path for path, _, _ in frames)
    assert slime_repro.normalised("/x/ray/_private/worker.py") is None
    assert slime_repro.normalised("/src/nanscope/slime_train/spec.py") is None  # nanscope's own: not compared
    assert slime_repro.normalised("/w/slime-src/v0.1.0/slime/utils/data.py") == "slime/utils/data.py"


def test_a_frame_diff_names_what_is_missing_and_what_is_extra():
    case_frames = slime_repro.compared_frames(CASE_TB)
    shifted = [(p, line + 1 if "schedules.py" in p else line, f) for p, line, f in case_frames]
    diff = slime_repro.FrameDiff(case_frames, shifted)
    assert not diff.ok
    assert diff.missing == [f for f in case_frames if "schedules.py" in f[0]]
    assert diff.extra == [f for f in shifted if "schedules.py" in f[0]]
    assert slime_repro.FrameDiff(case_frames, list(reversed(case_frames))).missing == []  # order counts too:
    assert not slime_repro.FrameDiff(case_frames, list(reversed(case_frames))).ok


def test_another_release_keeps_the_cases_megatron_frames_under_its_own_slime_lines():
    case_frames = slime_repro.compared_frames(CASE_TB)
    later = [("train.py", 99, "<module>"), ("train.py", 69, "train"), ("slime/backends/megatron_utils/actor.py", 381, "train"),
             ("slime/backends/megatron_utils/actor.py", 512, "train_actor")]  # fmt: skip
    later += [f for f in case_frames if f[0].startswith("megatron/")]
    diff = slime_repro.FrameDiff(case_frames, later)
    assert not diff.ok and diff.megatron_ok
    assert not slime_repro.FrameDiff(case_frames, later[2:]).megatron_ok  # no train.py on top
    assert not slime_repro.FrameDiff(case_frames, later[:-1]).megatron_ok  # a megatron frame short


def test_slimes_step_log_lines_are_read_with_nan_and_inf():
    out = "\n".join([
        "\x1b[36m(MegatronTrainRayActor pid=7)\x1b[0m step 0: {'train/loss': -0.0123, 'train/nan_guard/dropped_tokens': 1.0, "
        "'train/grad_norm': 0.51, 'train/lr-pg_0': 1e-06, 'train/step': 0}",
        "step 1: {'train/loss': nan, 'train/tis': inf}",
        "rollout 0: {'rollout/raw_reward': 0.5}",
    ])  # fmt: skip
    steps = run.train_steps(out)
    assert steps[0] == {"step": 0, "train/loss": -0.0123, "train/nan_guard/dropped_tokens": 1.0, "train/grad_norm": 0.51,
                        "train/lr-pg_0": 1e-06, "train/step": 0.0}  # fmt: skip
    assert steps[1]["train/loss"] != steps[1]["train/loss"] and steps[1]["train/tis"] == float("inf")
    assert len(steps) == 2


def _checkout(root: Path, fields: str = "index: int = 0\n    tokens: list = None\n") -> Path:
    for name in run.REQUIRED:  # the modules --slime-src checks for, empty
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    (root / "slime" / "utils" / "types.py").write_text(f"class Sample:\n    {fields}")
    return root


def test_sources_refuse_what_is_not_a_checkout_in_one_line(tmp_path):
    with pytest.raises(UserError, match=r"--slime-src .*: not a slime checkout \(no train.py and slime/ there\)$"):
        run.check_sources(tmp_path, None)
    _checkout(tmp_path / "v0.1.0")
    _checkout(tmp_path / "main")
    with pytest.raises(UserError, match=r"it holds checkouts main, v0.1.0; name one, e.g. .*/v0.1.0$"):
        run.check_sources(tmp_path, None)
    with pytest.raises(UserError, match=r"--megatron-lm-src .*: no megatron/training/ there"):
        run.check_sources(tmp_path / "v0.1.0", tmp_path)
    (tmp_path / "lm" / "megatron" / "training").mkdir(parents=True)
    (tmp_path / "lm" / "megatron" / "training" / "__init__.py").write_text("")
    sources = run.check_sources(tmp_path / "v0.1.0", tmp_path / "lm")
    assert sources.pythonpath()[:3] == [str(run.STANDINS), str(tmp_path / "v0.1.0"), str(tmp_path / "lm")]


def test_the_release_of_a_checkout_is_read_from_its_sample_fields(tmp_path):
    from nanscope.facts import releases

    v010 = releases.get("v0.1.0").sample_fields
    root = _checkout(tmp_path / "a", "".join(f"{name}: object = None\n    " for name in v010))
    assert run.sample_fields(root) == tuple(v010) and slime_repro.release_of(root) == "v0.1.0"
    assert slime_repro.release_of(_checkout(tmp_path / "b")) == ""  # not a release nanscope knows


def test_the_standins_are_the_ones_the_output_names():
    names = {p.name.removesuffix(".py") for p in run.STANDINS.iterdir() if p.suffix == ".py" or p.is_dir()}
    assert names == set(run.STANDIN_MODULES)


@pytest.mark.timeout(60)  # a FIFO opened for reading blocks until a writer comes: the old code hung here
def test_the_plugin_runs_report_dir_reads_its_regular_report_files_only(tmp_path):
    # issue 42: a FIFO named *.json in --slime-src --plugin's report directory blocked forever
    os.mkfifo(tmp_path / "rollout1_step0_rank0.json")
    os.mkfifo(tmp_path / "notes.json")
    (tmp_path / "rollout1_step0_rank1.json").write_text(json.dumps({"rank": 1, "replay": {"text": "rerun"}}))
    (tmp_path / "rollout1_step0_rank2.json").write_text("{half a report")
    check = slime_repro._plugin(None, None, str(tmp_path), tmp_path)
    assert check.reports == [{"rank": 1, "replay": {"text": "rerun"}}] and check.bundles == []

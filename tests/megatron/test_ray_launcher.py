"""`--launcher ray`: the harness's ranks as a train group of Ray actors (nanscope[ray]), one local Ray launch shared.

The launch runs conftest's three runs (healthy, kl-exp-overflow, healthy), which torchrun's `launched` ran too, then a
fourth whose rank 1 the test kills with SIGKILL. A Ray launch costs about 35 s on 2 cores (each actor imports torch
and megatron-core itself: nothing is forked from a process that has them), so the tests share it; the interruptions
each start Ray in a `nanscope repro` of their own and stop it as soon as its actors exist.
"""

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from nanscope import case, repro
from nanscope.cli.main import main
from nanscope.megatron import launcher, ray_session
from nanscope.megatron.spec import Launcher, Layout, RankRecord, RunSpec
from tests.megatron.conftest import HARNESS_RUNS
from tests.processes import ProcessWatch

pytestmark = [
    pytest.mark.slow,  # Ray's start-up is seconds a launch: the slow tier (the fast tier checks the flags, tests/cli)
    pytest.mark.integration,
    pytest.mark.skipif(not ray_session.available(), reason="needs the nanscope[ray] extra"),
]

KILLED = 1  # the rank the test kills with SIGKILL in the last run
HEADER = re.compile(
    r"^ray\.exceptions\.RayTaskError\(RuntimeError\): ray::MegatronTrainRayActor\.train\(\) \(pid=\d+, ip=[\d.]+, "
    r"actor_id=[0-9a-f]+, repr=<[\w.]+\.MegatronTrainRayActor object at 0x[0-9a-f]+>\)$"
)


@pytest.fixture(scope="module")
def short_tmp():
    """A short TMPDIR: Ray's session sockets must stay under AF_UNIX's 107 bytes (pytest's tmp_path is too long)."""
    path = tempfile.mkdtemp(prefix="n", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_launched(ray_launched_watched):
    return ray_launched_watched[0]


@pytest.fixture(scope="module")
def ray_launched_watched(tmp_path_factory, short_tmp):
    """The Ray launch, and the environment each of its processes was started with (tests/processes.py)."""
    out = tmp_path_factory.mktemp("ray")
    runs = [*HARNESS_RUNS, RunSpec("healthy", fault=f"hang:{KILLED}")]
    killer = threading.Thread(target=_kill_in_last_run, args=(out, len(HARNESS_RUNS)), daemon=True)
    killer.start()
    before = tempfile.tempdir
    tempfile.tempdir = str(short_tmp)  # the launch's temp dirs, the local Ray instance's session among them
    try:
        with ProcessWatch(os.getpid()) as watch:
            launched = launcher.launch(
                runs, Layout(tp=2, pp=2), timeout_s=240, rank_timeout_s=120, out_dir=out,
                loss_flags=case.loss_flags(), via=Launcher("ray"), max_relaunches=0,
            )  # fmt: skip
        return launched, watch
    finally:
        tempfile.tempdir = before


def _kill_in_last_run(out: Path, last: int) -> None:
    """SIGKILL rank KILLED's actor once every rank has finished the runs before `last` (rank KILLED hangs in it)."""
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        if all((out / f"run{last - 1}.rank{rank}.json").exists() for rank in range(4)):
            time.sleep(1.0)
            os.kill(json.loads((out / f"startup.rank{KILLED}.json").read_text())["pid"], signal.SIGKILL)
            return
        time.sleep(0.1)


def _comparable(record: RankRecord, out: Path) -> dict:
    """A record without its timings, its paths relative to the launch's output dir."""
    fields = dataclasses.asdict(record)
    for key in ("error_time", "seconds"):
        fields.pop(key)
    for key in ("params_path", "grads_path"):
        fields[key] = fields[key] and os.path.relpath(fields[key], out)
    return fields


@pytest.mark.timeout(300)
def test_every_process_of_the_ray_launch_sees_no_cuda_device(ray_launched_watched):
    # the driver, the local Ray instance it starts (GCS, raylet, their agents) and the actors: CUDA hidden in each
    # (nanscope.megatron.hidden_cuda), and Ray offers no GPU, so it sets no CUDA_VISIBLE_DEVICES of its own
    launched, watch = ray_launched_watched
    assert watch.matching("nanscope.megatron.ray_driver") and len(watch.matching("MegatronTrainRayActor")) >= 4
    for seen in watch.ours():
        assert seen.environ == {"CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
                                "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": None}, seen  # fmt: skip
    assert not any(seen.cuda_driver for seen in watch.seen.values()), watch.seen
    assert {rank: s["cuda_visible_devices"] for rank, s in launched.startup.items()} == dict.fromkeys(range(4), "")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ray_records_equal_torchrun_s_except_pids_and_timings(ray_launched, launched, short_tmp):
    assert launched.ok
    assert [run.observed for run in ray_launched.runs[:3]] == [run.observed for run in launched.runs]
    assert [run.observed for run in ray_launched.runs[:3]] == ["completed", "nan-check", "completed"]
    ray_out = Path(ray_launched.runs[0].ranks[0].params_path).parent
    torchrun_out = Path(launched.runs[0].ranks[0].params_path).parent
    for ray_run, torchrun_run in zip(ray_launched.runs[:3], launched.runs):
        assert [_comparable(r, ray_out) for r in ray_run.ranks] == [
            _comparable(r, torchrun_out) for r in torchrun_run.ranks
        ]
    # each actor is a process of its own, which imported megatron-core itself
    assert len({startup["pid"] for startup in ray_launched.startup.values()}) == 4
    assert list(short_tmp.iterdir()) == []  # the launch's temp dirs and the Ray session dir are gone


@pytest.mark.timeout(300)
def test_the_failure_reaches_the_driver_as_the_case_s_did(ray_launched):
    text = ray_launched.runs[1].traceback
    assert text is not None and all(run.traceback is None for run in ray_launched.runs[::2])
    ours, theirs = text.splitlines(), case.text("traceback.txt").splitlines()
    # driver frames, then ray.get's; the header, as Ray words it, and its two caret lines
    assert ours[0] == theirs[0] == "Traceback (most recent call last):"
    assert ours[1].endswith(", in drive") and "    ray.get(group.settled(refs, index))" in ours
    at, their_at = _header(ours), _header(theirs)
    assert ours[at - 2].endswith(", in get_objects") and theirs[their_at - 2].endswith(", in get_objects")
    assert ours[at - 1] == theirs[their_at - 1] == "    raise value.as_instanceof_cause()"
    assert HEADER.match(ours[at]) and HEADER.match(theirs[their_at])
    assert [len(line.strip()) * "^" == line.strip() for line in ours[at + 1 : at + 3]] == [True, True]
    # megatron-core's frames line for line (schedules.py:2185 ... rerun_state_machine.py:505), and the message
    assert _core_lines(ours) == _core_lines(theirs) and len(_core_lines(ours)) == 2 * 7
    assert ours[-1] == "RuntimeError: " + ray_launched.runs[1].first_failure().error
    assert ours[-1].startswith("RuntimeError: Rank ") and ours[-1].endswith(case.nan_check_message())
    assert theirs[-1].endswith(case.nan_check_message())
    # the harness runs its own step: slime's actor.py and model.py are not there
    assert not any("slime/backends" in line for line in ours)
    assert "ray_actor.py" in ours[at + 3] and ours[at + 4] == "    raise error"


def _header(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith("ray.exceptions.RayTaskError"))


def _core_lines(lines: list[str]) -> list[str]:
    """megatron-core's frames (each `File` line from megatron/core/ on, and its code line)."""
    out = []
    for i, line in enumerate(lines):
        if line.startswith("  File ") and "/megatron/core/" in line:
            out += ["megatron/core/" + line.split("/megatron/core/", 1)[1], lines[i + 1]]
    return out


@pytest.mark.timeout(300)
def test_repro_s_check_accepts_the_ray_shape(ray_launched):
    rep = repro.from_run(ray_launched.runs[1], ray_launched, Layout(tp=2, pp=2))
    assert (rep.observed, rep.ok, rep.frames_match_case) == ("nan-check", True, True)
    assert rep.traceback == ray_launched.runs[1].traceback
    broken = dataclasses.replace(ray_launched.runs[1], traceback=rep.traceback.replace("line 505", "line 504"))
    assert repro.from_run(broken, ray_launched, Layout(tp=2, pp=2)).frames_match_case is False


@pytest.mark.timeout(300)
def test_doctor_reads_it_with_the_case_s_coordinates_for_that_world(ray_launched, tmp_path, capsys):
    # the harness's world, as shipped (cases/harness/launch.sh: TP2 x PP2 on one node of 4, the tiny Qwen3-MoE)
    script, ray_tb, case_tb = case.harness_script(), tmp_path / "ray.txt", tmp_path / "case.txt"
    ray_tb.write_text(ray_launched.runs[1].traceback)
    first = ray_launched.runs[1].first_failure()
    # the case's own traceback, its error line the harness's: Rank R, node N, device cpu
    case_tb.write_text(re.sub(r"Rank 50, node dgx172, device 2", first.error.split(", iteration")[0],
                              case.text("traceback.txt")))  # fmt: skip
    docs = []
    for tb in (ray_tb, case_tb):
        assert main(["doctor", str(script), "--traceback", str(tb), "--json", str(tmp_path / "d.json")]) == 0
        docs.append(json.loads((tmp_path / "d.json").read_text()))
    capsys.readouterr()
    assert docs[0]["failing_rank"] == docs[1]["failing_rank"]
    got = docs[0]["failing_rank"]
    assert (got["rank"], got["pp"], got["tp"], got["dp"], got["layers"], got["holds_output_layer"]) == (
        first.rank, first.pp, first.tp, first.dp, first.layers, first.holds_output_layer,
    )  # fmt: skip
    assert got["pp"] == 1 and got["holds_output_layer"]  # the last stage raises first, as rank 50 in the case


@pytest.mark.timeout(300)
def test_an_actor_killed_with_sigkill_is_reported_with_its_rank_in_one_line(ray_launched):
    last = ray_launched.runs[-1]
    assert ray_launched.returncode == 1 and last.observed == "incomplete" and KILLED in last.missing
    note = ray_launched.stuck[KILLED]
    assert "\n" not in note and re.fullmatch(
        rf"rank {KILLED}: Ray actor MegatronTrainRayActor \(pid \d+\) died.*", note
    )
    assert f"nanscope: {note}" in ray_launched.stderr_tail
    assert set(ray_launched.stuck) == {KILLED}  # the others were stopped by the driver, not reported as dead


def _ours(tag: str) -> list[tuple[int, str]]:
    """(pid, cmdline) of every live process whose environment carries NANSCOPE_TEST_TAG=tag (Ray's included)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"NANSCOPE_TEST_TAG={tag}".encode() in environ.split(b"\0") and state != "Z":
            found.append((int(entry), cmdline))
    return found


def _actors_up(tag: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while sum(c.startswith("ray::MegatronTrainRayActor") for _, c in _ours(tag)) < 4:
        assert proc.poll() is None and time.monotonic() < deadline, "the 4 actors never started"
        time.sleep(0.1)


def _repro(tag: str, tmp: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "NANSCOPE_TEST_TAG": tag, "TMPDIR": str(tmp), "HOME": str(tmp / "home")}
    # one run (its records in a marked temp dir, which the driver sweeps when its parent is gone), stopped while the
    # actors import megatron-core
    argv = [sys.executable, "-m", "nanscope.cli.main", "repro", "--launcher", "ray", "--hazard", "kl-exp-overflow"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def _wait_gone(tag: str, tmp: Path) -> None:
    deadline = time.monotonic() + 20
    while (_ours(tag) or [p for p in tmp.iterdir() if p.name != "home"]) and time.monotonic() < deadline:
        time.sleep(0.1)


def _kill_ours(tag: str) -> None:
    for pid, _ in _ours(tag):  # on failure: no orphan outlives the test either
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "sig, code",
    [
        (signal.SIGINT, 130),
        (signal.SIGTERM, 143),
        (signal.SIGHUP, 129),
    ],
)
def test_a_stop_signal_leaves_no_ray_process_and_no_session_dir(short_tmp, sig, code):
    tag, tmp = uuid.uuid4().hex, short_tmp / str(sig.value)
    (tmp / "home").mkdir(parents=True)
    # As from a terminal: the signal at its default even when pytest runs in a background job (SIGINT ignored) or
    # under nohup (SIGHUP ignored: nanscope keeps a signal its user chose to ignore, megatron/proctree.py)
    proc = _repro(tag, tmp, preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    try:
        _actors_up(tag, proc)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        _wait_gone(tag, tmp)
        left = [c for _, c in _ours(tag)]
    finally:
        proc.kill()
        _kill_ours(tag)
    assert proc.returncode == code
    assert re.fullmatch(r"nanscope repro: interrupted; \d+ workers stopped\n", err.decode())
    assert left == []
    assert sorted(p.name for p in tmp.iterdir()) == ["home"] and not (tmp / "home" / ".ray").exists()


@pytest.mark.timeout(120)
def test_sigkill_of_repro_leaves_no_ray_process_and_no_session_dir(short_tmp):
    # SIGKILL cannot be caught: the Ray driver notices its parent's death, kills its tree (the local Ray instance,
    # the actors) and removes the parent's temp dirs, the session dir among them.
    tag, tmp = uuid.uuid4().hex, short_tmp / "k"
    (tmp / "home").mkdir(parents=True)
    proc = _repro(tag, tmp)
    try:
        _actors_up(tag, proc)
        assert sorted(p.name.split("-")[1] for p in tmp.iterdir() if p.name != "home") == ["run", "tmp"]
        proc.kill()
        assert proc.wait(timeout=10) == -signal.SIGKILL
        _wait_gone(tag, tmp)
        left = [c for _, c in _ours(tag)]
    finally:
        proc.kill()
        _kill_ours(tag)
    assert left == []
    assert sorted(p.name for p in tmp.iterdir()) == ["home"] and not (tmp / "home" / ".ray").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_launch_s_timeout_kills_the_ray_tree(short_tmp):
    before = tempfile.tempdir
    tempfile.tempdir = tmp = str(short_tmp / "t")
    os.mkdir(tmp)
    try:
        res = launcher.launch([RunSpec("healthy")], timeout_s=8, loss_flags=case.loss_flags(), via=Launcher("ray"))
    finally:
        tempfile.tempdir = before
    assert res.timed_out and not res.ok and res.runs[0].missing == [0, 1, 2, 3]
    assert os.listdir(tmp) == []
    assert ray_session.holders(tmp) == []


@pytest.mark.timeout(300)
def test_repro_prints_the_traceback_writes_it_and_puts_it_in_the_json(ray_launched, tmp_path, capsys, wide_lines):
    from nanscope.cli import repro as cli
    from nanscope.report import repro as report

    rep = repro.from_run(ray_launched.runs[1], ray_launched, Layout(tp=2, pp=2))
    args = cli.add_parser(argparse.ArgumentParser().add_subparsers()).parse_args(
        ["--launcher", "ray", "--hazard", "kl-exp-overflow", "--traceback-out", str(tmp_path / "tb.txt")]
    )
    doc = report.to_json(rep)
    cli._ray_output(args, rep, doc)
    out = capsys.readouterr().out
    tb = tmp_path / "tb.txt"
    assert out == (
        "\nthe Ray driver's traceback (kl-exp-overflow, as-is loss), as slime's train.py shows it:\n"
        + rep.traceback
        + f"diagnose it in the harness's world (its launch script: {case.harness_script()}): "
        f"nanscope doctor --case harness --traceback {tb}\n"
    )
    assert tb.read_text() == rep.traceback == doc["traceback"]
    assert doc["launcher"] == {"kind": "ray", "ray_address": None}
    # the command it prints, run as printed: doctor finds the cause that fired enabled by the harness's flags
    command = shlex.split(out.splitlines()[-1].split("): ", 1)[1])
    assert command[:2] == ["nanscope", "doctor"]
    assert main([*command[1:], "--json", str(tmp_path / "d.json")]) == 0
    capsys.readouterr()
    got = json.loads((tmp_path / "d.json").read_text())
    status = {c["id"]: c["status"] for c in got["candidates"]}
    assert status["kl-exp-overflow"] == "enabled" and got["inputs"]["script"] == case.harness_script()
    first = ray_launched.runs[1].first_failure()
    assert (got["failing_rank"]["rank"], got["failing_rank"]["pp"]) == (first.rank, 1)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_matrix_under_ray_has_torchrun_s_outcome(all_matrix, tmp_path, capsys, short_tmp, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    assert all_matrix[0] == 0  # torchrun's, shared with tests/cli/test_repro.py
    docs = {"torchrun": all_matrix[1]}
    assert main(["repro", "--all", "--launcher", "ray", "--json", str(tmp_path / "ray.json")]) == 0
    docs["ray"] = json.loads((tmp_path / "ray.json").read_text())

    def outcome(doc):
        keys = ("expected", "observed", "ok", "frames_match_case")  # the first failure: by wall clock
        return [
            (row["hazard"], *(row[loss][key] for loss in ("as_is", "safe") for key in keys),
             row["as_is"]["sentinel"]["rank"], row["as_is"]["sentinel"]["class"], row["max_grad_diff_safe_vs_as_is"])
            for row in doc["matrix"]
        ]  # fmt: skip

    assert docs["ray"]["ok"] is docs["torchrun"]["ok"] is True
    assert outcome(docs["ray"]) == outcome(docs["torchrun"])
    out = capsys.readouterr().out
    assert "ray.exceptions.RayTaskError(RuntimeError): ray::MegatronTrainRayActor.train()" in out

"""A launch's temp dirs: marked with their owner, swept when it is gone, never while it lives."""

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nanscope import case
from nanscope.megatron import launcher, scratch
from nanscope.megatron.spec import RunSpec

OWNER = (
    "import sys, tempfile, time\n"
    "tempfile.tempdir = sys.argv[1]\n"
    "from nanscope.megatron import scratch\n"
    "with scratch.directory('nanscope-run-') as path:\n"
    "    print(path, flush=True)\n"
    "    time.sleep(60)\n"
)


def _owned_by_a_child(root: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(root)], stdout=subprocess.PIPE, text=True)
    return proc, Path(proc.stdout.readline().strip())


@pytest.mark.timeout(60)
def test_a_dead_owners_dir_is_swept_a_live_owners_never(tmp_path):
    proc, path = _owned_by_a_child(tmp_path)
    try:
        assert json.loads((path / scratch.MARK).read_text())["pid"] == proc.pid
        (path / "run0.rank0.json").write_text("{}")
        assert scratch.sweep(tmp_path) == []  # alive: kept
        assert path.is_dir()
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert scratch.sweep(tmp_path) == [str(path)]  # killed: its TemporaryDirectory never cleaned up
    assert list(tmp_path.iterdir()) == []


def test_a_clean_exit_removes_the_dir_and_a_live_mark_names_this_process(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with scratch.directory("nanscope-tmp-") as path:
        assert Path(path).parent == tmp_path and Path(path).name.startswith("nanscope-tmp-")
        mark = json.loads((Path(path) / scratch.MARK).read_text())
        assert mark == scratch.identity(os.getpid())
        assert not scratch.owner_gone(path)
        assert scratch.sweep() == []
    assert list(tmp_path.iterdir()) == []


def _marked(root: Path, name: str, owner: dict) -> Path:
    path = root / name
    path.mkdir()
    (path / scratch.MARK).write_text(json.dumps(owner))
    return path


def test_only_marked_nanscope_dirs_of_a_gone_owner_are_removed(tmp_path):
    me = scratch.identity(os.getpid())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = {**me, "pid": int(dead.stdout)}  # exited and reaped
    reused = {**me, "start": me["start"] - 1}  # this pid, but another process's start time: the owner is gone
    elsewhere = {**gone, "pidns": "pid:[1]"}  # another pid namespace: its pids cannot be looked up here
    removed = [_marked(tmp_path, "nanscope-run-a", gone), _marked(tmp_path, "nanscope-tmp-b", reused)]
    kept = [
        _marked(tmp_path, "nanscope-run-live", me),
        _marked(tmp_path, "nanscope-run-ns", elsewhere),
        _marked(tmp_path, "mine-not-nanscope", gone),
    ]
    (tmp_path / "nanscope-run-unmarked").mkdir()  # an older nanscope's, or a user's: never ours to judge
    (tmp_path / "nanscope-run-bad").mkdir()
    (tmp_path / "nanscope-run-bad" / scratch.MARK).write_text("{not json")
    (tmp_path / "nanscope-run-big").mkdir()
    (tmp_path / "nanscope-run-big" / scratch.MARK).write_text(json.dumps({**gone, "pad": "x" * 5000}))
    (tmp_path / "nanscope-run-fifo").mkdir()
    os.mkfifo(tmp_path / "nanscope-run-fifo" / scratch.MARK)  # read without blocking, refused
    target = _marked(tmp_path, "target", gone)
    (tmp_path / "nanscope-run-link").symlink_to(target)  # a link is not followed
    (tmp_path / "nanscope-file").write_text(json.dumps(gone))
    assert sorted(scratch.sweep(tmp_path)) == sorted(str(p) for p in removed)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [p.name for p in kept] + ["nanscope-run-unmarked", "nanscope-run-bad", "nanscope-run-big",
                                  "nanscope-run-fifo", "target", "nanscope-run-link", "nanscope-file"]
    )  # fmt: skip
    assert (target / scratch.MARK).exists()


def test_a_missing_root_sweeps_nothing(tmp_path):
    assert scratch.sweep(tmp_path / "absent") == []


@pytest.mark.timeout(60)
def test_a_launch_first_sweeps_what_killed_launches_left_and_marks_its_own_dirs(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    proc, stale = _owned_by_a_child(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    seen = {}

    def torchrun(out, spec, timeout_s, tmp, stop):  # no processes: what the agent would be given
        seen.update(out=out, tmp=Path(tmp), stale=stale.exists())
        seen["marks"] = [json.loads((p / scratch.MARK).read_text()) for p in (out, Path(tmp))]
        return 0, False, ""

    monkeypatch.setattr(launcher, "_torchrun", torchrun)
    result = launcher.launch([RunSpec("healthy")], loss_flags=case.loss_flags())
    assert result.runs[0].missing == [0, 1, 2, 3]
    assert seen["stale"] is False
    assert seen["marks"] == [scratch.identity(os.getpid())] * 2
    assert seen["out"].parent == tmp_path and seen["out"].name.startswith("nanscope-run-")
    assert seen["tmp"].parent == tmp_path and seen["tmp"].name.startswith("nanscope-tmp-")
    assert list(tmp_path.iterdir()) == []

"""nanscope.outputs, the one writer under every output: whole or nothing, never through a link (issue 42)."""

from __future__ import annotations

import os

import pytest

from nanscope import outputs


def test_a_write_replaces_a_link_at_the_name_and_never_its_target(tmp_path):
    (tmp_path / "victim").write_text("keep me")
    os.symlink("victim", tmp_path / "out.json")
    os.symlink("missing", tmp_path / "dangling.json")
    outputs.write_bytes(tmp_path / "out.json", b"new")
    outputs.write_bytes(tmp_path / "dangling.json", b"new")
    assert (tmp_path / "victim").read_text() == "keep me" and not (tmp_path / "missing").exists()
    assert not os.path.islink(tmp_path / "out.json") and (tmp_path / "out.json").read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["dangling.json", "out.json", "victim"]


def test_a_failed_write_leaves_the_old_file_no_temporary_and_none_of_the_directories_it_made(tmp_path):
    (tmp_path / "old").write_text("old")
    with pytest.raises(RuntimeError), outputs.replacing(tmp_path / "old") as temporary:
        open(temporary, "w").write("half")
        raise RuntimeError("the writer failed")
    with pytest.raises(OSError), outputs.replacing(tmp_path / "a" / "b" / "c.pt", parents=True) as temporary:
        raise OSError(28, "No space left on device")
    assert (tmp_path / "old").read_text() == "old" and os.listdir(tmp_path) == ["old"]


def test_a_copy_keeps_the_permission_bits_of_the_file_it_replaces(tmp_path):
    (tmp_path / "src").write_text("log")
    (tmp_path / "dst").write_text("old")
    os.chmod(tmp_path / "dst", 0o640)
    outputs.copy_file(tmp_path / "src", tmp_path / "dst")
    assert (tmp_path / "dst").read_text() == "log" and os.stat(tmp_path / "dst").st_mode & 0o777 == 0o640


def test_link_in_names_the_first_link_below_the_root(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").mkdir()
    os.symlink("../elsewhere", tmp_path / "run" / "rollout_data")
    assert outputs.link_in(tmp_path / "run" / "rollout_data", tmp_path / "run") == str(tmp_path / "run/rollout_data")
    assert outputs.link_in(tmp_path / "run" / "train_data", tmp_path / "run") is None


@pytest.mark.parametrize("path", ["/tmp/reports", "/dev/shm/reports", "/home/u/runs/.sshx", "/opt/run"])
def test_a_directory_of_the_runs_own_is_no_system_directory(path):
    assert outputs.system_directory(path) is None

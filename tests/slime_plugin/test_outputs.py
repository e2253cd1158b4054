"""The report directory: checked at install, on every rank at once; a later write failure is a warning."""

import os
import subprocess
import sys
import textwrap

import pytest

from nanscope.slime_plugin import outputs
from nanscope.slime_plugin.coords import Coords


@pytest.mark.parametrize("where", ["file", "/dev/null", "/proc/nanscope", "under-a-file"])
def test_a_directory_that_cannot_take_reports_is_one_line_naming_the_variable(tmp_path, where):
    (tmp_path / "file").write_text("x")
    path = {"file": str(tmp_path / "file"), "under-a-file": str(tmp_path / "file" / "r")}.get(where, where)
    problem = outputs.check_dir(path)
    assert problem.startswith(f"NANSCOPE_REPORT_DIR={path!r}: cannot write reports there: ") and "\n" not in problem


def test_a_good_directory_is_created_and_left_empty(tmp_path):
    assert outputs.check_dir(str(tmp_path / "a" / "b")) is None
    assert os.listdir(tmp_path / "a" / "b") == []


def test_a_failed_write_is_a_warning_and_no_path(tmp_path, capsys):
    files = outputs.Reports(str(tmp_path), Coords(rank=3))
    (tmp_path / "rollout0_step1_rank3.json").mkdir()  # the report's own path is taken
    assert files.report({"rank": 3}, {"rollout_id": 0, "step_id": 1}, None) is None and files.paths == []
    out = capsys.readouterr().out
    assert (
        out.startswith(f"nanscope: warning: rank 3: could not write its report to {tmp_path}: ")
        and out.count("\n") == 1
    )


AGREE = textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist

    rank = int(sys.argv[1])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from nanscope.slime_plugin import watch

    try:
        watch._agree_on_report_dir(sys.argv[3 + rank])
        print("ok")
    except ValueError as e:
        print("refused", e)
    """
)


def test_the_ranks_agree_when_one_node_cannot_write(tmp_path):
    # rank 1's node-local directory is a file: both ranks refuse at install, neither waits for the other
    (tmp_path / "taken").write_text("x")
    good, bad = str(tmp_path / "good"), str(tmp_path / "taken")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", AGREE, str(rank), "29621", good, bad], stdout=subprocess.PIPE, text=True
        )
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outs[0] == f"refused NANSCOPE_REPORT_DIR={good!r}: another rank cannot write reports there"
    assert outs[1].startswith(f"refused NANSCOPE_REPORT_DIR={bad!r}: cannot write reports there: ")

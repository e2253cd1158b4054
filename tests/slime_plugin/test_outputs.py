"""The report directory: checked at install, on every rank at once; a later write failure is a warning.

Files are written to a temporary file and renamed into place: a link at a report's name is replaced, never
followed; a full disk (torch.save's RuntimeError), a directory at a file's name or a missing directory is one
warning line, and whatever could be written is kept."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from nanscope.slime_plugin import outputs
from nanscope.slime_plugin.coords import Coords

WHERE = {"rollout_id": 0, "step_id": 1}
BUNDLE = {"format": "nanscope-bundle/1", "tensor": torch.arange(4096.0)}  # 16 KiB of tensor data


@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_a_directory_that_cannot_take_reports_is_one_line_naming_the_variable(tmp_path, where):
    (tmp_path / "file").write_text("x")
    path = {"file": str(tmp_path / "file"), "under-a-file": str(tmp_path / "file" / "r")}[where]
    problem = outputs.check_dir(path)
    assert problem.startswith(f"NANSCOPE_REPORT_DIR={path!r}: cannot write reports there: ") and "\n" not in problem


@pytest.mark.parametrize(
    "path,resolved",
    [("/", "/"), ("/etc", "/etc"), ("/usr/", "/usr"), ("/lib", None), ("/boot", "/boot"), ("/proc", "/proc"),
     ("/proc/self", None), ("/sys/kernel", "/sys/kernel"), ("/dev", "/dev"), ("/dev/null", "/dev/null"),
     ("/tmp/../etc", "/etc"), ("/bin", None), ("/sbin", None), ("/lib64", None), ("/usr/lib", None)],
)  # fmt: skip
def test_a_system_directory_is_refused_by_where_it_resolves(path, resolved):
    # /lib, /bin and /sbin are links to /usr/... on merged-/usr systems: their resolved path is what is named
    resolved = resolved or os.path.realpath(path)
    assert outputs.check_dir(path) == (
        f"NANSCOPE_REPORT_DIR={path!r}: resolves to {resolved}, a system directory: give a directory of the run's own"
    )


@pytest.mark.parametrize(
    "path,why",
    [("/etc/cron.d", "a system directory"), ("/usr/local/bin", "a system directory"),
     ("/var/spool/cron", "a system directory"), ("/boot/grub", "a system directory"),
     ("/root/.ssh", "inside a .ssh directory (credentials)"), ("/home/u/.ssh/keys", "inside a .ssh directory "
     "(credentials)"), ("/home/u/.aws", "inside a .aws directory (credentials)")],
)  # fmt: skip
def test_a_directory_below_a_system_one_or_of_credentials_is_refused(path, why):
    # issue 42: the check matched exact paths only; /etc/cron.d, /root/.ssh and /usr/local/bin were accepted
    assert outputs.check_dir(path) == (
        f"NANSCOPE_REPORT_DIR={path!r}: resolves to {os.path.realpath(path)}, {why}: give a directory of the run's own"
    )


def test_a_link_to_a_system_directory_is_refused(tmp_path):
    (tmp_path / "reports").symlink_to("/etc")
    assert "resolves to /etc, a system directory" in outputs.check_dir(str(tmp_path / "reports"))


def test_a_good_directory_is_created_and_left_empty(tmp_path):
    assert outputs.check_dir(str(tmp_path / "a" / "b")) is None
    assert os.listdir(tmp_path / "a" / "b") == []
    assert outputs.check_dir("/dev/shm") is None  # a tmpfs, not the kernel's


def test_a_report_written_through_a_link_replaces_the_link_not_its_target(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    files = outputs.Reports(str(tmp_path / "r"), Coords(rank=0))
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "rollout0_step1_rank0.json").symlink_to(victim)
    (tmp_path / "r" / "rollout0_step1_rank0.bundle.pt").symlink_to(victim)
    path = files.report({"rank": 0}, WHERE, BUNDLE)
    assert victim.read_text() == "keep me"
    assert not os.path.islink(path) and json.loads(open(path).read())["rank"] == 0
    bundle = str(tmp_path / "r" / "rollout0_step1_rank0.bundle.pt")
    assert not os.path.islink(bundle) and torch.equal(torch.load(bundle, weights_only=True)["tensor"], BUNDLE["tensor"])
    assert files.paths == [path, bundle] and sorted(os.listdir(tmp_path / "r")) == sorted(
        map(os.path.basename, files.paths)
    )


def test_a_directory_at_the_bundles_name_keeps_the_report_and_warns(tmp_path, capsys):
    files = outputs.Reports(str(tmp_path), Coords(rank=3))
    (tmp_path / "rollout0_step1_rank3.bundle.pt").mkdir()
    path = files.report({"rank": 3}, WHERE, BUNDLE)
    report = json.loads(open(path).read())
    assert report["bundle"] is None and report["microbatch_file"] is None and files.paths == [path]
    assert capsys.readouterr().out == (
        f"nanscope: warning: rank 3: could not write its repro bundle rollout0_step1_rank3.bundle.pt to {tmp_path}: "
        "Is a directory\n"
    )
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []  # the temporary file is gone


def test_a_failed_report_is_a_warning_and_no_path(tmp_path, capsys):
    files = outputs.Reports(str(tmp_path), Coords(rank=3))
    (tmp_path / "rollout0_step1_rank3.json").mkdir()  # the report's own path is taken
    assert files.report({"rank": 3}, WHERE, None) is None and files.paths == []
    assert capsys.readouterr().out == (
        f"nanscope: warning: rank 3: could not write its report rollout0_step1_rank3.json to {tmp_path}: Is a directory\n"
    )


FULL_DISK = textwrap.dedent(
    """
    import json, resource, signal, sys
    import torch
    from nanscope.slime_plugin import outputs
    from nanscope.slime_plugin.coords import Coords

    # a disk that takes no file past 4 KiB (EFBIG, as ENOSPC on a full disk): torch.save raises RuntimeError
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    files = outputs.Reports(sys.argv[1], Coords(rank=1))
    path = files.report({"rank": 1}, {"rollout_id": 0, "step_id": 1}, {"tensor": torch.arange(4096.0)})
    print(json.dumps({"path": path, "paths": files.paths}))
    """
)


def test_a_full_disk_under_torch_save_is_a_warning_and_the_report_goes_out(tmp_path):
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warning, result = proc.stdout.splitlines()
    assert warning.startswith(
        f"nanscope: warning: rank 1: could not write its repro bundle rollout0_step1_rank1.bundle.pt to {tmp_path}: "
        "RuntimeError: "
    )
    path = str(tmp_path / "rollout0_step1_rank1.json")
    assert json.loads(result) == {"path": path, "paths": [path]}
    assert json.loads(open(path).read())["bundle"] is None
    assert os.listdir(tmp_path) == ["rollout0_step1_rank1.json"]


def test_a_rank_writes_at_most_max_bundles_and_its_later_reports_say_so(tmp_path):
    files = outputs.Reports(str(tmp_path), Coords(rank=0), max_bundles=1)
    first = files.report({"rank": 0}, {"rollout_id": 0, "step_id": 0}, BUNDLE)
    second = files.report({"rank": 0}, {"rollout_id": 1, "step_id": 0}, BUNDLE)
    assert json.loads(open(first).read())["bundle"].endswith("rollout0_step0_rank0.bundle.pt")
    report = json.loads(open(second).read())
    assert report["bundle"] is None
    assert report["bundle_left_out"] == "NANSCOPE_MAX_BUNDLES=1: this rank wrote as many"
    assert sorted(os.listdir(tmp_path)) == ["rollout0_step0_rank0.bundle.pt", "rollout0_step0_rank0.json",
                                            "rollout1_step0_rank0.json"]  # fmt: skip


def test_the_verdict_is_added_to_the_report_in_place(tmp_path):
    files = outputs.Reports(str(tmp_path), Coords(rank=0))
    path = files.report({"rank": 0, **WHERE, "class": "data"}, WHERE, None)
    files.add(path, rerun={"verdict": "reproducible"})
    assert json.loads(open(path).read()) == {
        "rank": 0, "rollout_id": 0, "step_id": 1, "microbatch_file": None, "class": "data",
        "rerun": {"verdict": "reproducible"}, "bundle": None,
    }  # fmt: skip


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


@pytest.mark.slow  # 2 processes and gloo: the fast tier refuses a directory on one rank above
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

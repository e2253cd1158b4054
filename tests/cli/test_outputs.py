"""Hostile outputs: every command's --json, --html and --write-demo never hang, never destroy a file.

A FIFO, a device or a directory as a target, a target that is one of the run's inputs (by its name, a symlink
or a hard link), two outputs naming one file, and an existing --write-demo target are each refused in one line,
exit 2, before anything is written; the files are as they were and no temporary file is left. A write that
fails half-way (here: the file-size limit, as a full disk would) leaves the old file whole. Each case runs in
its own process with an alarm (tests/cli/isolated.py): a write that blocks on a FIFO dies of it.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nanscope import case, hazards
from nanscope.causes import catalogue
from nanscope.cli.main import main
from nanscope.dumps import demo
from nanscope.errors import UserError
from nanscope.report import files
from nanscope.trace.tracer import replay
from tests.cli.isolated import refused, run_isolated

REGULAR = "outputs are written to regular files"
KNOWN = ", ".join(catalogue.BY_NAME)
INPUTS = ("run.sh", "model.sh", "tb.txt", "dump.pt", "mb.pt", "dumps/1.pt", "old.pt", "real.json")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A launch script that sources a file, a traceback, a dump, a directory of dumps, a micro-batch file; a FIFO,
    a directory, and symlinks and hard links to the inputs."""
    d = tmp_path_factory.mktemp("outputs")
    (d / "run.sh").write_text("source ./model.sh\npython3 train.py --colocate --rollout-batch-size 1 $MODEL_ARGS\n")
    (d / "model.sh").write_text('MODEL_ARGS="--num-layers 4"\n')
    (d / "tb.txt").write_text("Rank 0, node a, device 0, iteration 1: Unexpected result nan (message='x')\n")
    demo.write_demo(d / "dump.pt")
    demo.write_demo(d / "dumps" / "1.pt")
    doc, _ = hazards.microbatch_document("healthy", flags=case.loss_flags())
    replay.save_microbatch(d / "mb.pt", doc["batch"], doc["logits"], doc["args"], "as-is")
    (d / "old.pt").write_bytes(b"a file the user keeps")
    (d / "real.json").write_text("the old report\n")
    os.chmod(d / "real.json", 0o640)
    os.mkfifo(d / "fifo")
    (d / "sub").mkdir()
    os.symlink("run.sh", d / "link.sh")
    os.link(d / "run.sh", d / "hard.sh")
    os.symlink("dump.pt", d / "dumplink.pt")
    os.link(d / "mb.pt", d / "mbhard.pt")
    os.symlink("real.json", d / "report.json")
    return d


def _snapshot(d: Path) -> dict:
    return {name: (d / name).read_bytes() for name in INPUTS}


def _check_nothing_lost(d: Path, before: dict) -> None:
    """The inputs as they were, the FIFO still a FIFO, no temporary file anywhere."""
    assert _snapshot(d) == before
    assert stat.S_ISFIFO(os.stat(d / "fifo").st_mode)
    assert [p.name for p in d.rglob("*.tmp")] == []


def _refusals(work: Path, cases: list[tuple[str, list[str]]]) -> None:
    """Each (message, argv) refused with exactly that line, and nothing lost."""
    before = _snapshot(work)
    argvs = [argv for _, argv in cases]
    for (want, argv), result in zip(cases, run_isolated(argvs, work)):
        assert refused(result, argv[0]) == want, argv
    _check_nothing_lost(work, before)


@pytest.mark.slow  # slow tier: a CLI run per kind of target (seconds); the fast tier refuses a symlinked target below
@pytest.mark.timeout(400)
def test_a_target_that_is_no_regular_file_is_refused_in_one_line(work):
    fifo = f"not a regular file (a FIFO); {REGULAR}"
    doctor = ["doctor", "--case", "slime-795"]
    _refusals(
        work,
        [
            (f"--json fifo: {fifo}", [*doctor, "--json", "fifo"]),
            (f"--html fifo: {fifo}", [*doctor, "--html", "fifo"]),
            (f"--json /dev/null: not a regular file (a character device); {REGULAR}", [*doctor, "--json", "/dev/null"]),
            (f"--json fifo: {fifo}", ["scan", "dump.pt", "--json", "fifo"]),
            (f"--html fifo: {fifo}", ["scan", "dump.pt", "--html", "fifo"]),
            (f"--json fifo: {fifo}", ["scan", "dumps", "--json", "fifo"]),
            (f"--write-demo fifo: {fifo}", ["scan", "--write-demo", "fifo", "--force"]),
            ("--write-demo sub: is a directory, expected a file path", ["scan", "--write-demo", "sub"]),
            ("--json sub: is a directory, expected a file path", ["scan", "dump.pt", "--json", "sub"]),
            (f"--json fifo: {fifo}", ["trace", "mb.pt", "--json", "fifo"]),
            (f"--json fifo: {fifo}", ["hazards", "--json", "fifo"]),
            (f"--json fifo: {fifo}", ["repro", "--list-modules", "--json", "fifo"]),
        ],
    )


@pytest.mark.slow  # slow tier: a CLI run per pair (seconds); the fast tier refuses a symlinked target below
@pytest.mark.timeout(400)
def test_an_input_or_another_output_as_target_is_refused_and_kept(work):
    cases = [
        ("--json run.sh: is this run's launch script: writing it would destroy it", ["run.sh", "--json", "run.sh"]),
        ("--html link.sh: is this run's launch script: writing it would destroy it", ["run.sh", "--html", "link.sh"]),
        (
            "--json hard.sh: is this run's launch script run.sh: writing it would destroy it",
            ["run.sh", "--json", "hard.sh"],
        ),
        (
            "--json tb.txt: is this run's traceback: writing it would destroy it",
            ["run.sh", "--traceback", "tb.txt", "--json", "tb.txt"],
        ),
        ("--json model.sh: is this run's sourced file: writing it would destroy it", ["run.sh", "--json", "model.sh"]),
        (
            "--html same.json: names the same file as --json same.json: give each its own",
            ["--case", "slime-795", "--json", "same.json", "--html", "same.json"],
        ),
    ]
    scans = [
        ("--json dump.pt: is this run's dump: writing it would destroy it", ["dump.pt", "--json", "dump.pt"]),
        (
            "--html dumplink.pt: is this run's dump: writing it would destroy it",
            ["dump.pt", "--html", "dumplink.pt"],
        ),
        ("--json dumps/1.pt: is this run's dump: writing it would destroy it", ["dumps", "--json", "dumps/1.pt"]),
        (
            "--html x.json: names the same file as --json ./x.json: give each its own",
            ["dump.pt", "--json", "./x.json", "--html", "x.json"],
        ),
    ]
    traces = [
        ("--json mb.pt: is this run's micro-batch file: writing it would destroy it", ["mb.pt", "--json", "mb.pt"]),
        (
            "--json mbhard.pt: is this run's micro-batch file mb.pt: writing it would destroy it",
            ["mb.pt", "--json", "mbhard.pt"],
        ),
    ]
    _refusals(
        work,
        [(w, ["doctor", *a]) for w, a in cases]
        + [(w, ["scan", *a]) for w, a in scans]
        + [(w, ["trace", *a]) for w, a in traces],
    )
    assert not (work / "same.json").exists() and not (work / "x.json").exists()


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
@pytest.mark.timeout(400)
def test_write_demo_keeps_an_existing_file_unless_forced_and_list_modules_checks_its_flags(work):
    argvs = [
        ["scan", "--write-demo", "old.pt"],
        ["scan", "--force", "dump.pt"],
        ["repro", "--list-modules", "--hazard", "bogus", "--steps", "5"],
        ["repro", "--list-modules", "--steps", "3", "--trace"],
        ["scan", "--write-demo", "new/deeper/12.pt"],
        ["repro", "--list-modules", "--json", "modules.json"],
    ]
    before = _snapshot(work)
    results = run_isolated(argvs, work)
    assert [refused(result, argv[0]) for argv, result in zip(argvs[:4], results)] == [
        "--write-demo old.pt: exists (pass --force to replace it)",
        "--force goes with --write-demo PATH (it replaces an existing file there)",
        f"--hazard: unknown hazard 'bogus'; known: {KNOWN}",
        "--list-modules lists the model's modules and exits: not with --steps, --trace",
    ]
    assert [r["rc"] for r in results[4:]] == [0, 0], results[4:]
    _check_nothing_lost(work, before)
    modules = json.loads((work / "modules.json").read_text())
    assert list(modules) == ["modules"] and len(modules["modules"]) == 176 and modules["modules"][-1] == "output_layer"
    assert (work / "new" / "deeper" / "12.pt").stat().st_size > 0


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
def test_write_demo_force_replaces_and_a_replaced_output_keeps_its_mode(tmp_path):
    (tmp_path / "old.pt").write_bytes(b"a file the user keeps")
    (tmp_path / "real.json").write_text("the old report\n")
    os.chmod(tmp_path / "real.json", 0o640)
    argvs = [["scan", "--write-demo", "old.pt", "--force"], ["doctor", "--case", "slime-795", "--json", "real.json"]]
    results = run_isolated(argvs, tmp_path)
    assert [r["rc"] for r in results] == [0, 0], results
    assert (tmp_path / "old.pt").read_bytes()[:2] == b"PK"  # a torch.save zip archive now
    assert "verdict" in json.loads((tmp_path / "real.json").read_text())
    assert stat.S_IMODE(os.stat(tmp_path / "real.json").st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.pt", "real.json"]


LINK = "outputs are never written through one"


@pytest.mark.timeout(400)
def test_no_output_is_written_through_a_symlink_dangling_or_not(tmp_path):
    """issue 42: --json, --html and --write-demo --force followed a link and replaced its target; a dangling link
    created its target; --demo-kind run wrote into a linked directory. Each is refused in one line; nothing moves."""
    (tmp_path / "victim.txt").write_text("keep me\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").mkdir()
    demo.write_demo(tmp_path / "dump.pt")
    for name, target in (("out.json", "victim.txt"), ("nowhere.json", "missing.json"), ("demo.pt", "victim.txt"),
                         ("linked", "elsewhere"), ("run/rollout_data", "../elsewhere")):  # fmt: skip
        os.symlink(target, tmp_path / name)
    doctor = ["doctor", "--case", "slime-795"]
    cases = [
        ("doctor", f"--json out.json: is a symbolic link (to victim.txt); {LINK}: name the file itself, or remove the "
         "link", [*doctor, "--json", "out.json"]),
        ("doctor", f"--html nowhere.json: is a symbolic link (to missing.json); {LINK}: name the file itself, or "
         "remove the link", [*doctor, "--html", "nowhere.json"]),
        ("hazards", f"--json nowhere.json: is a symbolic link (to missing.json); {LINK}: name the file itself, or "
         "remove the link", ["hazards", "--json", "nowhere.json"]),
        ("scan", f"--json out.json: is a symbolic link (to victim.txt); {LINK}: name the file itself, or remove the "
         "link", ["scan", "dump.pt", "--json", "out.json"]),
        ("scan", f"--write-demo demo.pt: is a symbolic link (to victim.txt); {LINK}: name the file itself, or remove "
         "the link", ["scan", "--write-demo", "demo.pt", "--force"]),
        ("scan", f"--write-demo linked: is a symbolic link (to elsewhere); {LINK}: name the directory itself, or "
         "remove the link",
         ["scan", "--write-demo", "linked", "--demo-kind", "run", "--force"]),
        ("scan", f"--write-demo run: {tmp_path}/run/rollout_data is a symbolic link (to ../elsewhere); {LINK}: "
         "remove the link",
         ["scan", "--write-demo", "run", "--demo-kind", "run", "--force"]),
        ("trace", f"--json out.json: is a symbolic link (to victim.txt); {LINK}: name the file itself, or remove the "
         "link", ["trace", "--hazard", "healthy", "--json", "out.json"]),
    ]  # fmt: skip
    results = run_isolated([argv for _, _, argv in cases], tmp_path)
    assert [refused(r, command) for (command, _, _), r in zip(cases, results)] == [want for _, want, _ in cases]
    assert (tmp_path / "victim.txt").read_text() == "keep me\n"
    assert not (tmp_path / "missing.json").exists() and os.listdir(tmp_path / "elsewhere") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.pt", "dump.pt", "elsewhere", "linked", "nowhere.json",
                                                          "out.json", "run", "victim.txt"]  # fmt: skip


def _users_link(target: str, link: Path) -> None:
    """A symlink a user made (root's too: the rule is where a link is, not who owns it)."""
    os.symlink(target, link)


@pytest.mark.slow  # the fast tier refuses a link at the output's own name, above
@pytest.mark.timeout(400)
def test_no_output_is_written_through_a_symlinked_directory(tmp_path):
    """issue 42: `--json linkdir/x.json`, linkdir -> elsewhere, wrote into elsewhere: a link at the file's own name was
    refused, one among its directories was followed. Refused now, relative or absolute, in one line naming the link,
    where it points and the resolved path; nothing is written there. A plain directory is written as before."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "real").mkdir()
    demo.write_demo(tmp_path / "dump.pt")
    _users_link("elsewhere", tmp_path / "linkdir")
    _users_link(str(tmp_path / "linkdir"), tmp_path / "real" / "deeper")  # a link to a link, one level down
    through = f"linkdir is a symbolic link (to elsewhere); {LINK}: pass the resolved path, {tmp_path}/elsewhere"
    doctor = ["doctor", "--case", "slime-795"]
    cases = [
        (doctor + ["--json", "linkdir/d.json"], "doctor", f"--json linkdir/d.json: {through}/d.json"),
        (doctor + ["--html", "linkdir/d.html"], "doctor", f"--html linkdir/d.html: {through}/d.html"),
        (["scan", "dump.pt", "--json", "linkdir/s.json"], "scan", f"--json linkdir/s.json: {through}/s.json"),
        (["scan", "dump.pt", "--html", "./linkdir/s.html"], "scan",
         f"--html ./linkdir/s.html: ./{through}/s.html"),
        (doctor + ["--json", f"{tmp_path}/linkdir/d.json"], "doctor",
         f"--json {tmp_path}/linkdir/d.json: {tmp_path}/{through}/d.json"),
        (doctor + ["--html", "real/deeper/d.html"], "doctor",
         f"--html real/deeper/d.html: real/deeper is a symbolic link (to {tmp_path}/linkdir); {LINK}: pass the "
         f"resolved path, {tmp_path}/elsewhere/d.html"),
        (["scan", "--write-demo", "linkdir/new/12.pt"], "scan",
         f"--write-demo linkdir/new/12.pt: linkdir is a symbolic link (to elsewhere); {LINK}: pass the resolved path, "
         f"{tmp_path}/elsewhere/new/12.pt"),
    ]  # fmt: skip
    results = run_isolated([argv for argv, _, _ in cases], tmp_path)
    assert [refused(r, command) for (_, command, _), r in zip(cases, results)] == [want for _, _, want in cases]
    assert os.listdir(tmp_path / "elsewhere") == []
    ok = run_isolated([doctor + ["--json", "real/d.json", "--html", f"{tmp_path}/real/d.html"]], tmp_path)
    assert ok == [
        {"rc": 0, "stderr": f"nanscope doctor: wrote real/d.json (--json), {tmp_path}/real/d.html (--html)\n"}
    ]
    assert sorted(os.listdir(tmp_path / "real")) == ["d.html", "d.json", "deeper"]


def test_a_system_link_among_the_directories_is_followed(tmp_path):
    """A link in `/` or a system tree is the system's (/bin -> usr/bin, a distro's /var/run -> /run): kept working;
    a link anywhere else is refused, root's too."""
    from nanscope.outputs import linked_directory

    _users_link("elsewhere", tmp_path / "linkdir")
    assert linked_directory(tmp_path / "linkdir" / "x.json") == f"{tmp_path}/linkdir"
    assert linked_directory("linkdir/x.json") is None  # relative to this process's directory: no such link here
    assert linked_directory(tmp_path / "x.json") is None and linked_directory("x.json") is None
    for system in ("/bin", "/var/run"):
        if os.path.islink(system):
            assert linked_directory(f"{system}/x.json") is None
    os.symlink(tmp_path, tmp_path / "roots")  # made by whoever runs the tests, root in a container
    assert linked_directory(tmp_path / "roots" / "x.json") == f"{tmp_path}/roots"


@pytest.mark.slow  # slow tier: several CLI runs (seconds); tests/cli/test_scan_trend.py writes the demo in the fast tier
@pytest.mark.timeout(400)
def test_write_demo_goes_alone_and_never_replaces_what_the_scan_reads(tmp_path):
    """issue 42: `scan z.pt --write-demo z.pt --force` replaced the dump it read; --json and --html were ignored."""
    demo.write_demo(tmp_path / "z.pt")
    before = (tmp_path / "z.pt").read_bytes()
    cases = [
        ("--write-demo writes a demo and exits: not with a dump to scan (scan the demo afterwards: nanscope scan z.pt)",
         ["scan", "z.pt", "--write-demo", "z.pt", "--force"]),
        ("--write-demo writes a demo and exits: not with --json, --html (scan the demo afterwards: nanscope scan "
         "y.pt)", ["scan", "--write-demo", "y.pt", "--json", "y.json", "--html", "y.html"]),
    ]  # fmt: skip
    results = run_isolated([argv for _, argv in cases], tmp_path)
    assert [refused(r, "scan") for r in results] == [want for want, _ in cases]
    assert (tmp_path / "z.pt").read_bytes() == before and sorted(os.listdir(tmp_path)) == ["z.pt"]


def _file_size_limit():
    """A file-size limit well under the report's size, as a full disk: writing past it fails with EFBIG."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


@pytest.mark.timeout(400)
def test_a_write_that_fails_half_way_leaves_the_old_file_whole(tmp_path):
    (tmp_path / "d.json").write_text("the old report\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if os.environ.get("NANSCOPE_TEST_SRC"):
        env["PYTHONPATH"] = os.environ["NANSCOPE_TEST_SRC"]
    proc = subprocess.run(
        [sys.executable, "-m", "nanscope.cli.main", "doctor", "--case", "slime-795", "--json", "d.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a bound: an interpreter's start and doctor took over 100 s at load 11
        preexec_fn=_file_size_limit,
    )
    assert (proc.returncode, proc.stderr) == (
        2,
        "nanscope doctor: error: --json d.json: cannot write: File too large\n",
    )
    assert (tmp_path / "d.json").read_text() == "the old report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json"]


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
@pytest.mark.timeout(700)
def test_write_demo_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    """issue 42: torch's inline_container.cc message and empty directories; now the disk's reason, nothing left."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if os.environ.get("NANSCOPE_TEST_SRC"):
        env["PYTHONPATH"] = os.environ["NANSCOPE_TEST_SRC"]
    (tmp_path / "run").mkdir()
    errors = []
    for argv in (["new/deeper/12.pt"], ["run", "--demo-kind", "run"]):
        proc = subprocess.run(
            [sys.executable, "-m", "nanscope.cli.main", "scan", "--write-demo", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,  # a bound, not a speed: an interpreter's start under load
            preexec_fn=_file_size_limit,
        )
        errors.append((proc.returncode, proc.stderr))
    assert errors == [
        (2, "nanscope scan: error: --write-demo new/deeper/12.pt: cannot write: File too large\n"),
        (2, "nanscope scan: error: --write-demo run/rollout_data/0.pt: cannot write: File too large\n"),
    ]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["run"]


def test_an_empty_path_is_refused_not_ignored(tmp_path, capsys):
    demo.write_demo(tmp_path / "dump.pt")
    for flag, argv in (("--json", [str(tmp_path / "dump.pt"), "--json", ""]), ("--write-demo", ["--write-demo", ""])):
        assert main(["scan", *argv]) == 2
        assert capsys.readouterr().err == f"nanscope scan: error: {flag} '': an empty path (give a file name)\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write any file")
def test_a_read_only_target_is_kept(tmp_path):
    (tmp_path / "keep.json").write_text("mine\n")
    os.chmod(tmp_path / "keep.json", 0o444)
    with pytest.raises(UserError, match=r"^--json .*keep\.json: file not writable$"):
        files.check_outputs({"--json": tmp_path / "keep.json"})


def test_a_failed_rename_removes_the_temporary_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    target.write_text("old\n")

    def refuse(src, dst):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(files.os, "replace", refuse)
    with pytest.raises(UserError, match=r"^--json .*r\.json: cannot write: Invalid cross-device link$"):
        files.write_json(target, {"new": 1})
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["r.json"]

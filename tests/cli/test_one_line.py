"""The CLI's one-line rule under hostile arguments: out-of-range counts, newlines in names, torch's warnings, and
bad input that used to read as an internal error. Each is exit 2 and exactly one `nanscope CMD: error:` line."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from nanscope import case, hazards
from nanscope.causes import catalogue
from nanscope.cli import hazards as hazards_command
from nanscope.cli import scan as scan_command
from nanscope.cli.main import main
from nanscope.dumps import demo
from nanscope.errors import UserError
from tests.cli.isolated import refused, run_isolated

KNOWN = ", ".join(catalogue.BY_NAME)


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
@pytest.mark.timeout(300)
def test_bad_counts_names_and_unreadable_files_are_one_line_each(tmp_path):
    demo.write_demo(tmp_path / "dump.pt")
    (tmp_path / "old.pt").write_bytes(b"a file")
    doc, _ = hazards.microbatch_document("kl-exp-overflow", flags=case.loss_flags())
    # total_lengths as 0-dim tensors (they used to reach the replay, which raised IndexError, and then the JSON
    # writer): read as their values, the file traces as the one with ints does
    batch = {**doc["batch"], "total_lengths": [torch.tensor(n) for n in doc["batch"]["total_lengths"]]}
    torch.save({**doc, "batch": batch}, tmp_path / "tensor_lengths.pt")
    torch.save(doc, tmp_path / "int_lengths.pt")
    cases = [
        # a bad count: argparse's line (tests/cli/test_numbers.py)
        ("a\\nb.pt: dump: no such file", ["scan", "a\nb.pt"]),
        ("a\\nb.pt: micro-batch file: no such file", ["trace", "a\nb.pt"]),
        ("a\\nb.sh: launch script: no such file", ["doctor", "a\nb.sh"]),
        (f"--hazard a\\nb: unknown hazard; known: {KNOWN}", ["trace", "--hazard", "a\nb"]),
        ("--json 'no\\ndir/x.json': no such directory: 'no\\ndir'", ["scan", "dump.pt", "--json", "no\ndir/x.json"]),
        ("\\x1b[31mred.pt: dump: no such file", ["scan", "\x1b[31mred.pt"]),
        ("--write-demo old.pt/12.pt: cannot write: Not a directory", ["scan", "--write-demo", "old.pt/12.pt"]),
    ]
    # issue 32 item 11: a kernel file system's files pass the regular-file check, yet /proc/kmsg blocks the read
    # and /proc/self/mem fails it (EIO): refused by their resolved path, whatever a symlink calls them
    for name in ("model.sh", "k.bundle.pt"):
        os.symlink("/proc/version", tmp_path / name)
    kernel = "in /proc, a kernel file system whose reads can block or fail: not read (copy the file elsewhere first)"
    cases += [
        (f"/proc/version: dump: {kernel}", ["scan", "/proc/version"]),
        (f"/proc/version: micro-batch file: {kernel}", ["trace", "/proc/version"]),
        (f"k.bundle.pt: repro bundle: resolves to /proc/version, {kernel}", ["trace", "k.bundle.pt"]),
        (f"model.sh: model-args file: resolves to /proc/version, {kernel}",
         ["doctor", "--case", "slime-795", "--model-args", "model.sh"]),
        (f"model.sh: launch script: resolves to /proc/version, {kernel}", ["doctor", "model.sh"]),
        ("--rollout 'x/{rollout_id:>3000000000}.pt': {rollout_id:>3000000000}: expected an integer format of "
         "width <= 64, e.g. {rollout_id:04d}", ["trace", "x.bundle.pt", "--rollout", "x/{rollout_id:>3000000000}.pt"]),
    ]  # fmt: skip
    if os.path.isfile("/sys/kernel/profiling"):
        sysfs = kernel.replace("in /proc,", "in /sys,")
        cases.append((f"/sys/kernel/profiling: launch script: {sysfs}", ["doctor", "/sys/kernel/profiling"]))
    tail = [
        ["scan", "dump.pt", "--max-rows", "0"],
        ["trace", "tensor_lengths.pt", "--json", "tensor_lengths.json"],
        ["trace", "int_lengths.pt", "--json", "int_lengths.json"],
    ]
    results = run_isolated([argv for _, argv in cases] + tail, tmp_path)
    for (want, argv), result in zip(cases, results):
        assert refused(result, argv[0]) == want, argv
    assert (results[-3]["rc"], results[-3]["stderr"]) == (1, "")  # 0 rows: the counts only
    assert results[-2]["rc"] == results[-1]["rc"] == 0, results[-2:]
    traced = [json.loads((tmp_path / f"{name}.json").read_text()) for name in ("tensor_lengths", "int_lengths")]
    assert traced[0]["source"] == "tensor_lengths.pt" and {**traced[0], "source": "int_lengths.pt"} == traced[1]
    assert (tmp_path / "old.pt").read_bytes() == b"a file"


def _warns_then(outcome):
    def run(args):
        warnings.warn("the first line\nand a second", UserWarning, stacklevel=1)
        warnings.warn("deprecated, someday", FutureWarning, stacklevel=1)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return run


def test_warnings_never_split_an_error_line_and_are_one_line_each_after_success(monkeypatch, capsys):
    monkeypatch.setattr(hazards_command, "run", _warns_then(UserError("--json x: no such directory: y")))
    assert main(["hazards"]) == 2
    assert capsys.readouterr().err == "nanscope hazards: error: --json x: no such directory: y\n"
    monkeypatch.setattr(hazards_command, "run", _warns_then(RuntimeError("a bug")))
    assert main(["hazards"]) == 2
    assert capsys.readouterr().err == (
        "nanscope hazards: internal error: RuntimeError: a bug (rerun with --debug for the traceback)\n"
    )
    monkeypatch.setattr(hazards_command, "run", _warns_then(1))
    assert main(["hazards"]) == 1
    assert capsys.readouterr().err == (
        "nanscope hazards: warning: UserWarning: the first line\n"
        "nanscope hazards: warning: FutureWarning: deprecated, someday\n"
    )


def test_many_warnings_are_capped(monkeypatch, capsys):
    def run(args):
        for i in range(25):
            warnings.warn(f"warning {i}", UserWarning, stacklevel=1)
        return 0

    monkeypatch.setattr(hazards_command, "run", run)
    assert main(["hazards"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "nanscope hazards: warning: UserWarning: warning 0" and len(lines) == 11
    assert lines[-1] == "nanscope hazards: warning: 15 more warnings not shown"


def test_an_internal_error_names_its_input_on_one_line(monkeypatch, capsys):
    def run(args):
        raise KeyError("x")

    monkeypatch.setattr(scan_command, "run", run)
    assert main(["scan", "dumps/a\nb.pt"]) == 2
    assert capsys.readouterr().err == (
        "nanscope scan: internal error on dumps/a\\nb.pt: KeyError: 'x' (rerun with --debug for the traceback)\n"
    )

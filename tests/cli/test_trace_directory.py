"""`nanscope trace REPORT_DIR` on a crashed run's untidy report directory (issue 32): one bad file is one `refused:`
line naming it and its field, every other file is still listed and replayed; one bundle in memory at a time; what
a file holds never reaches the terminal as control characters; the outputs never replace an input.

The bundles are written as the plugin writes them (tests/trace/bundles/test_bundle_replay.py's `write`).
"""

from __future__ import annotations

import gc
import json
import os
import re
import weakref
from pathlib import Path

import pytest
import torch

from nanscope.cli.main import main
from nanscope.trace.bundles import bundle_load
from tests.trace.bundles.test_bundle_replay import write

pytestmark = pytest.mark.usefixtures("wide_lines")  # trace's lines asserted whole


HEALTHY = "rollout1_step0_rank2.bundle.pt"  # the hazard's bundle: its loss names the op (exit 1)


def _variant(root: Path, name: str, change) -> Path:
    doc = torch.load(root / HEALTHY, weights_only=True)
    change(doc, doc["microbatches"][0])
    torch.save(doc, root / name)
    return root / name


def _untidy(root: Path) -> dict[str, str]:
    """A report directory with the hazard's bundle and one file per trigger of issue 32 item 1; name -> the
    refusal after `refused: PATH: `."""
    write(root / HEALTHY)
    reports = {
        "rollout2_step0_rank1.json": '{"rank": 1, "rollout_id": 2, "step_id": 0, "first_forward": "x"}',
        "rollout2_step0_rank2.json": '{"rank": 2, "rollout_id": 2, "step_id": 0, "first_backward": [1]}',
        "rollout2_step0_rank3.json": "[" * 100_000 + "]" * 100_000,  # 200 kB, under the 16 MiB cap
        "rollout2_step0_rank4.json": '{"rank": 1' + "0" * 5000 + "}",
    }
    for name, text in reports.items():
        (root / name).write_text(text)
    _variant(root, "rollout3_step0_rank0.bundle.pt", lambda d, m: m.update(loss=[1.0, True]))
    _variant(root, "rollout3_step0_rank1.bundle.pt", lambda d, m: m.update(current=[]))
    _variant(root, "rollout3_step0_rank2.bundle.pt", lambda d, m: d["args"].update(eps_clip=10**400))
    os.symlink("/proc/self/mem", root / "rollout4_step0_rank0.bundle.pt")  # EIO on read
    shape = "expected None or {module: a name, microbatch: an index}"
    return {
        "rollout3_step0_rank0.bundle.pt": "micro-batch 0: loss: expected a dict or None, got list",
        "rollout3_step0_rank1.bundle.pt": "micro-batch 0: current: expected a dict or None, got list",
        "rollout3_step0_rank2.bundle.pt": "args: eps_clip <1329-bit integer>: outside int64",
        "rollout4_step0_rank0.bundle.pt": "repro bundle: resolves to /proc/<pid>/mem, in /proc, a kernel file system "
        "whose reads can block or fail: not read (copy the file elsewhere first)",
        "rollout2_step0_rank1.json": f"report: first_forward: {shape}, got str",
        "rollout2_step0_rank2.json": f"report: first_backward: {shape}, got list",
        "rollout2_step0_rank3.json": "report: not valid JSON: nested too deeply",
        "rollout2_step0_rank4.json": "report: not valid JSON: Exceeds the limit (4300 digits) for integer string "
        "conversion",
    }


def _pid_free(line: str) -> str:
    return re.sub(r"/proc/\d+/", "/proc/<pid>/", line)


@pytest.mark.timeout(120)
def test_one_bad_file_is_one_refused_line_and_every_other_file_is_still_replayed(tmp_path, capsys):
    refusals = _untidy(tmp_path)
    assert main(["trace", str(tmp_path), "--json", str(tmp_path / "t.json")]) == 1  # the hazard's bundle names it
    out, err = capsys.readouterr()
    lines = [_pid_free(line) for line in out.splitlines()]
    assert lines[0] == f"nanscope trace: {tmp_path}: 1 bundle, 0 other files"
    assert lines[1].startswith("loss: nanscope's model of slime v0.1.0 ")
    assert lines[2].startswith("rollout 1 step 0, rank 2 (pp 1, tp 0, cp 0 of 1, dp 0 of 1): aten.exp.default at ")
    assert lines[3].startswith("with the guard ") and lines[4].startswith("verdict (rollout 1 step 0, rank 2): ")
    assert lines[5:] == [f"refused: {tmp_path / name}: {why}" for name, why in refusals.items()]
    assert err == f"nanscope trace: wrote {tmp_path / 't.json'} (--json)\n"
    doc = json.loads((tmp_path / "t.json").read_text())
    assert [b["source"] for b in doc["bundles"]] == [str(tmp_path / HEALTHY)]
    assert [_pid_free(r) for r in doc["refused"]] == [line.removeprefix("refused: ") for line in lines[5:]]
    # the same bundles alone: the field in one line, exit 2
    for name, why in refusals.items():
        if name.endswith(".bundle.pt"):
            assert main(["trace", str(tmp_path / name)]) == 2
            assert _pid_free(capsys.readouterr().err) == f"nanscope trace: error: {tmp_path / name}: {why}\n"


def test_every_file_refused_says_why_on_stderr_and_what_is_no_file_is_said_skipped(tmp_path, capsys):
    """issue 42: every bundle refused exited 2 with nothing on stderr; FIFOs, device links and directories named
    like the plugin's files were skipped silently; `trace /proc` was an internal error."""
    for rank in (0, 1):
        (tmp_path / f"rollout1_step0_rank{rank}.bundle.pt").write_bytes(b"junk")
    os.mkfifo(tmp_path / "rollout1_step0_rank2.json")
    (tmp_path / "rollout1_step0_rank3.bundle.pt").mkdir()
    os.symlink("/dev/zero", tmp_path / "rollout1_step0_rank4.json")
    (tmp_path / "notes.json").mkdir()  # not named like the plugin's files: not the directory's business
    assert main(["trace", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    why = "not a nanscope repro bundle (not a torch.save zip archive)"
    assert out.splitlines()[1:] == [f"refused: {tmp_path}/rollout1_step0_rank{r}.bundle.pt: {why}" for r in (0, 1)]
    assert err.splitlines() == [
        f"nanscope trace: skipped {tmp_path}/rollout1_step0_rank2.json: a FIFO, not a regular file",
        f"nanscope trace: skipped {tmp_path}/rollout1_step0_rank3.bundle.pt: a directory, not a regular file",
        f"nanscope trace: skipped {tmp_path}/rollout1_step0_rank4.json: a link to a character device, not a regular "
        "file",
        f"nanscope trace: error: 2 of 2 files refused (the refused: lines above); the first: {tmp_path}/"
        f"rollout1_step0_rank0.bundle.pt: {why}",
    ]
    assert main(["trace", "/proc"]) == 2
    assert capsys.readouterr().err == (
        "nanscope trace: error: /proc: in /proc, a kernel file system whose reads can block or fail: not read\n"
    )


def test_the_default_report_directory_is_read_under_its_old_spelling_too(tmp_path, capsys, monkeypatch):
    """issue 42: one default, nanscope_reports; `repro --plugin` wrote nanscope-reports before."""
    (tmp_path / "nanscope-reports").mkdir()
    write(tmp_path / "nanscope-reports" / HEALTHY)
    monkeypatch.chdir(tmp_path)
    assert main(["trace", "nanscope_reports"]) == 1
    out, err = capsys.readouterr()
    assert err == "nanscope trace: nanscope_reports: missing; reading nanscope-reports, its old spelling\n"
    assert out.splitlines()[0] == "nanscope trace: nanscope-reports: 1 bundle, 0 other files"


def test_a_bug_one_file_hits_is_its_refused_line_not_the_end_of_the_listing(tmp_path, capsys, monkeypatch):
    from nanscope.trace.bundles import bundle_text

    write(tmp_path / HEALTHY)
    (tmp_path / "rollout2_step0_rank1.json").write_text('{"rank": 1, "rollout_id": 2, "step_id": 0}')

    def broken(report):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(bundle_text, "sentinel_text", broken)
    assert main(["trace", str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"refused: {tmp_path / 'rollout2_step0_rank1.json'}: internal error: ZeroDivisionError: a bug (rerun with "
        "--debug for the traceback)"
    )


def test_a_directory_holds_one_bundle_in_memory_at_a_time(tmp_path, capsys, monkeypatch):
    """Issue 32 item 6: 80 links to one 68 MB bundle reached 5.6 GB. Each bundle read must find every tensor of
    the bundles before it freed."""
    write(tmp_path / HEALTHY)
    for rank in (3, 4, 5):
        os.symlink(HEALTHY, tmp_path / f"rollout1_step0_rank{rank}.bundle.pt")
    alive, held, read = [], [], bundle_load.load

    def load(path, *args, **kwargs):
        gc.collect()
        held.append(sum(ref() is not None for ref in alive))
        doc = read(path, *args, **kwargs)
        alive.extend(weakref.ref(t) for mb in doc["microbatches"] for t in mb["batch"]["log_probs"])
        return doc

    monkeypatch.setattr(bundle_load, "load", load)
    assert main(["trace", str(tmp_path)]) == 1
    assert capsys.readouterr().out.count(": aten.exp.default at ") == 4 + 1  # a line per bundle, and the verdict
    assert len(alive) == 4 * 8 and held == [0, 0, 0, 0]  # 8 tensors a bundle, none alive at the next read


def test_file_text_never_reaches_the_terminal_as_control_characters(tmp_path, capsys):
    """A release name, report class, module, rows_how, trace input and file name from a file: escaped, so none can
    retitle or clear the terminal or forge a line."""
    write(tmp_path / HEALTHY)
    bundle = tmp_path / "rollout5_step0_rank0.bundle.pt"
    write(bundle, "healthy")  # replays finite: the verdict quotes the report's module and class
    doc = torch.load(bundle, weights_only=True)
    doc["release"]["name"] = "v9\x1b]0;pwned\x07"
    doc["report"].update(first_backward={"module": "m\x1b[2J", "microbatch": 0}, **{"class": "c\rX"})
    doc["microbatches"][0]["rows_how"] = "\nverdict: all clear"
    torch.save(doc, bundle)
    trace = {"rank": 0, "rollout_id": 6, "step_id": 0, "first": {"inputs": [{"rank": 0, "name": "x\x1b[2J"}]}}
    (tmp_path / "rollout6_step0_rank0.trace.json").write_text(json.dumps(trace))
    forged = "x\nrefused: nothing; all clear\n.bundle.pt"
    (tmp_path / forged).write_text("{}")
    assert main(["trace", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert main(["trace", str(bundle)]) == 0
    single = capsys.readouterr().out
    for text in (out, single):
        assert not any(c in text for c in "\x1b\x07\r") and "\nverdict: all clear" not in text
        assert "module 'm\\x1b[2J', micro-batch 0" in text
    assert "refused: nothing; all clear" not in out.splitlines()
    assert f"refused: {tmp_path}/x\\nrefused: nothing; all clear\\n.bundle.pt: not a nanscope repro bundle " in out
    assert "non-finite input on rank 0: x\\x1b[2J\n" in out
    assert "through v9\\x1b]0;pwned\\x07\n" in single
    assert "(\\nverdict: all clear; --rollout DUMP names the rows)\n" in single
    assert "class: not in the loss; the report's class: c\\rX\n" in single


def test_the_json_never_replaces_a_file_it_reads(tmp_path, capsys):
    """Issue 32 item 2: `trace DIR --json DIR/x.bundle.pt` replaced the bundle; a bundle's --json must not replace
    the rollout dump its args name either."""
    from nanscope.dumps import demo

    write(tmp_path / HEALTHY)
    (tmp_path / "rollout1_step0_rank1.json").write_text('{"rank": 1, "rollout_id": 1, "step_id": 0}')
    demo.write_demo(tmp_path / "dumps" / "1.pt")
    (tmp_path / "slime" / "slime").mkdir(parents=True)
    (tmp_path / "slime" / "slime" / "loss.py").write_text("# the checkout whose loss the replay imports\n")
    named = _variant(
        tmp_path,
        "rollout1_step0_rank3.bundle.pt",
        lambda d, m: d["args"].update(save_debug_rollout_data=str(tmp_path / "dumps" / "{rollout_id}.pt")),
    )
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for argv, what in [
        ([str(tmp_path), "--json", str(tmp_path / HEALTHY)], "repro bundle"),
        ([str(tmp_path), "--json", str(tmp_path / "rollout1_step0_rank1.json")], "report"),
        ([str(named), "--json", str(tmp_path / "dumps" / "1.pt")], "rollout dump"),
        ([str(named), "--rollout", str(tmp_path / "dumps" / "1.pt"), "--json", str(tmp_path / "dumps" / "1.pt")],
         "rollout dump"),
        ([str(named), "--slime-src", str(tmp_path / "slime"), "--json", str(tmp_path / "slime" / "slime" / "loss.py")],
         "--slime-src file"),
    ]:  # fmt: skip
        assert main(["trace", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err == f"nanscope trace: error: --json {argv[-1]}: is this run's {what}: writing it would destroy it\n"
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before

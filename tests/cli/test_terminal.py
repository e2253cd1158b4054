"""Output that fits the terminal (issue 42 item 2): one width rule for every console, help wrapped to the
terminal, argparse's errors in one line, strings from files and the environment cleaned of controls."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from nanscope.cli import help, terminal
from nanscope.cli.main import COMMANDS, main
from nanscope.report import text
from nanscope.slime_plugin.settings import Settings


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        raise OSError("no terminal here")


def test_the_width_is_columns_else_the_terminal_else_100():
    assert terminal.width(io.StringIO(), {}) == terminal.PIPED_WIDTH == 100
    assert terminal.width(io.StringIO(), {"COLUMNS": "80"}) == 80
    assert terminal.width(io.StringIO(), {"COLUMNS": "5"}) == terminal.MIN_WIDTH
    for junk in ("", "wide", "٨٠", "-80", "1e3", "999999"):
        assert terminal.width(io.StringIO(), {"COLUMNS": junk}) == 100, junk
    assert terminal.width(_Tty(), {}) == 100  # a terminal whose size cannot be read


def test_a_terminals_width_is_its_own():
    """An 80-column terminal (a pty whose window is 80 wide), COLUMNS unset: 80."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))
        with os.fdopen(os.dup(slave), "w") as stream:
            assert terminal.width(stream, {}) == 80 and terminal.width(stream, {"COLUMNS": "120"}) == 120
    finally:
        os.close(master)
        os.close(slave)


def test_help_lays_out_prose_and_examples_at_the_width():
    text = (
        "examples:\n"
        "  nanscope repro --hazard kl-exp-overflow --loss as-is # the case's exact error,\n"
        "                                                       # from a last-stage rank\n"
        "  nanscope hazards  # seconds\n"
        "  nanscope repro --slime-src ~/slime --megatron-lm-src ~/Megatron-LM --plugin --report-dir reports\n"
        "\n"
        "exit code: 0 when every run's observed outcome is its expected one,\n"
        "1 when not.\n"
    )
    assert help.layout(text, 60) == [
        "examples:",
        "  nanscope repro --hazard kl-exp-overflow --loss as-is",
        "      # the case's exact error, from a last-stage rank",
        "  nanscope hazards  # seconds",
        "  nanscope repro --slime-src ~/slime --megatron-lm-src \\",
        "      ~/Megatron-LM --plugin --report-dir reports",
        "",
        "exit code: 0 when every run's observed outcome is its",
        "expected one, 1 when not.",
    ]


def test_help_lays_out_a_definition_beside_its_term_or_below_it():
    """trace's `Input, one of:` list was broken like a shell command, a ` \\` at the end of each line."""
    text = (
        "Input, one of:\n"
        "  FILE.pt        a micro-batch file written by replay.save_microbatch (batch, logits,\n"
        "                 args), or a bundle.\n"
        "  --hazard NAME  a catalogued hazard.\n"
        "  nanscope trace x.pt  # an example\n"
    )
    assert help.layout(text, 50) == [
        "Input, one of:",
        "  FILE.pt        a micro-batch file written by",
        "                 replay.save_microbatch (batch,",
        "                 logits, args), or a bundle.",
        "  --hazard NAME  a catalogued hazard.",
        "  nanscope trace x.pt  # an example",
    ]
    assert help.layout(text, 30)[1:9] == [
        "  FILE.pt",
        "      a micro-batch file",
        "      written by",
        "      replay.save_microbatch",
        "      (batch, logits, args),",
        "      or a bundle.",
        "  --hazard NAME",
        "      a catalogued hazard.",
    ]


@pytest.mark.parametrize("command", ("",) + COMMANDS)
def test_every_help_fits_80_columns(command):
    env = {"COLUMNS": "80", "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, "-m", "nanscope.cli.main", *([command] if command else []), "--help"]
    out = subprocess.run(argv, capture_output=True, text=True, env={**_env(), **env}, timeout=60).stdout
    assert out.count("\n") > 5 and [line for line in out.splitlines() if len(line) > 80] == []
    continued = [line for line in out.splitlines() if line.endswith(" \\")]
    assert [line for line in continued if "nanscope " not in line] == []  # only an example's command is continued


def test_a_plain_line_folds_between_words_indented_and_keeps_a_long_word_whole():
    assert text.fold("  source:  a.py:1 in f `k3 = x.exp() - 1`", 24) == [
        "  source:  a.py:1 in f",
        "      `k3 = x.exp() - 1`",
    ]
    assert text.fold("refused: /a/very/long/path/of/a/file.pt: no", 20) == [
        "refused:",
        "    /a/very/long/path/of/a/file.pt:",
        "    no",
    ]
    assert text.fold("short", 20) == ["short"]


def test_trace_fits_80_columns_and_loses_no_word(monkeypatch, capsys):
    """Issue 42 item 2: trace printed lines of up to 286 columns whatever the terminal."""
    reports = Path(__file__).resolve().parents[2] / "examples" / "reports"
    monkeypatch.setenv("COLUMNS", "1000")
    assert main(["trace", str(reports)]) == 1
    wide = capsys.readouterr().out
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["trace", str(reports)]) == 1
    out = capsys.readouterr().out
    assert max(len(line) for line in wide.splitlines()) > 120  # lines to fold
    assert [line for line in out.splitlines() if len(line) > 80] == [] and out.split() == wide.split()


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "COLUMNS"}


@pytest.mark.parametrize(
    "argv, line",
    [
        (["scan", "--max-rows", "x"], "nanscope scan: error: argument --max-rows: 'x': expected an integer from 0 to "
         "1,000,000 (see nanscope scan --help)"),
        (["repro", "--seed", str(2**64)], "nanscope repro: error: argument --seed: '18446744073709551616': expected "
         "an integer from 0 to 4,294,967,295 (see nanscope repro --help)"),
        (["hazards", "--seed", str(2**64)], "nanscope hazards: error: argument --seed: '18446744073709551616': "
         "expected an integer from 0 to 4,294,967,295 (see nanscope hazards --help)"),
        (["trace", "--hazard", "kl-exp-overflow", "--seed", str(2**64)], "nanscope trace: error: argument --seed: "
         "'18446744073709551616': expected an integer from 0 to 4,294,967,295 (see nanscope trace --help)"),
        (["scan", "--demo-kind", "x\x1b[2J"], "nanscope scan: error: argument --demo-kind: invalid choice: "
         "'x\\x1b[2J' (choose from 'rollout', 'train', 'run') (see nanscope scan --help)"),
        (["nope"], "nanscope: error: argument COMMAND: invalid choice: 'nope' (choose from 'repro', 'hazards', "
         "'doctor', 'scan', 'trace') (see nanscope --help)"),
    ],
)  # fmt: skip
def test_a_bad_option_value_is_one_line_exit_2(argv, line, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and capsys.readouterr().err == line + "\n"


def test_the_plugins_unknown_variable_warning_is_cleaned_of_controls():
    name = "NANSCOPE_\x1b]52;c;aGk=\x07X\x9b2J"
    (line,) = Settings.from_env({name: "1"}).unknown_lines()
    assert line.startswith("NANSCOPE_\\x1b]52;c;aGk=\\x07X\\x9b2J is not one of the plugin's variables")


def test_write_demos_path_is_cleaned_of_controls(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    name = "d\x1b]52;c;aGk=\x07\x9d.pt"
    assert main(["scan", "--write-demo", name]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x9d" not in out and "\x07" not in out
    assert out.splitlines()[0].startswith("wrote rollout dump 'd\\x1b]52;c;aGk=\\x07\\x9d.pt' (rollout 12,")
    assert out.splitlines()[-1] == "now run: nanscope scan 'd\\x1b]52;c;aGk=\\x07\\x9d.pt'"
    # its trend page: the path was in the chart's tooltips raw (ESC, BEL, C1)
    assert main(["scan", ".", "--workers", "1", "--html", "t.html", "--quiet"]) == 1
    page = (tmp_path / "t.html").read_text()
    assert "d\\x1b]52;c;aGk=\\x07\\x9d.pt" in page and not any(c in page for c in "\x1b\x07\x9d")


def test_html_text_keeps_its_newlines_and_loses_its_controls():
    from nanscope.report.html import esc

    assert esc("a<b>\n\x1b[2J\x9b'\t") == "a&lt;b&gt;\n\\x1b[2J\\x9b&#x27;\\t"


def _shell(script: str) -> subprocess.CompletedProcess:
    nanscope = f"{sys.executable} -m nanscope.cli.main"
    return subprocess.run(
        ["bash", "-c", script.replace("nanscope", nanscope)], capture_output=True, text=True, timeout=120
    )


def test_a_closed_pipe_exits_quietly_and_a_full_disk_is_one_line():
    """`| head` ends the command with 141 (128 + SIGPIPE) and nothing on stderr; stdout on /dev/full is one line,
    exit 2 (both were exit 1 with nothing, or an internal error)."""
    import os

    read, write = os.pipe()
    os.close(read)  # the reader gone before the first line: every write fails with EPIPE, whatever the timing
    try:
        argv = [sys.executable, "-m", "nanscope.cli.main", "doctor", "--case", "slime-795"]
        done = subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")
    done = _shell("nanscope hazards > /dev/full")
    assert (done.returncode, done.stderr) == (
        2,
        "nanscope hazards: error: cannot write standard output: No space left on device\n",
    )


def test_json_and_html_say_where_they_wrote(tmp_path, capsys):
    out = tmp_path / "d.json"
    assert main(["doctor", "--case", "slime-795", "--json", str(out), "--html", str(tmp_path / "d.html")]) == 0
    assert capsys.readouterr().err == f"nanscope doctor: wrote {out} (--json), {tmp_path / 'd.html'} (--html)\n"


def test_doctor_and_scan_fit_80_columns(tmp_path, monkeypatch, capsys):
    """Issue 42 item 2: in an 80-column terminal no line of doctor's or scan's is wider (repro's: tests/cli/
    test_repro.py's matrix; hazards': tests/cli/test_hazards.py)."""
    monkeypatch.setenv("COLUMNS", "80")
    dump = tmp_path / "12.pt"
    for argv in (["doctor", "--case", "slime-795"], ["doctor", "--case", "harness"],
                 ["scan", "--write-demo", str(dump)], ["scan", str(dump)]):  # fmt: skip
        assert main(argv) in (0, 1)
        out = capsys.readouterr().out
        assert out.count("\n") > 3 and [line for line in out.splitlines() if len(line) > 80] == [], argv
        assert "…" not in out, argv  # rich's ellipsis: a cell cut (doctor's flags table cut them piped)


def test_repro_s_ray_traceback_and_doctor_line_fit_80_columns(tmp_path, monkeypatch, capsys):
    """`repro --launcher ray` printed its header (93 columns), the driver's traceback and the doctor line (161
    columns here) with a bare print, wider than an 80-column terminal; folded now, no word lost."""
    import argparse

    from nanscope import case
    from nanscope.cli import repro as cli
    from nanscope.repro.runs import Repro

    monkeypatch.setenv("COLUMNS", "80")
    driver = (Path(__file__).resolve().parents[2] / "src/nanscope/cases/slime-795/traceback.txt").read_text()
    rep = Repro("kl-exp-overflow", "as-is", "nan-check", "nan-check", {}, traceback=driver)
    tb = tmp_path / "tb.txt"
    args = cli.add_parser(argparse.ArgumentParser().add_subparsers()).parse_args(
        ["--launcher", "ray", "--hazard", "kl-exp-overflow", "--traceback-out", str(tb)]
    )
    doc: dict = {}
    cli._ray_output(args, rep, doc)
    out = capsys.readouterr().out
    wide = [line for line in out.splitlines() if len(line) > 80 and " " in line.strip()]
    assert wide == []  # a wider line is one word alone (a path)
    assert out.splitlines()[:3] == [
        "",
        "the Ray driver's traceback (kl-exp-overflow, as-is loss), as slime's train.py",
        "    shows it:",
    ]
    line = f"diagnose it in the harness's world (its launch script: {case.harness_script()}): nanscope doctor --case "
    header = "the Ray driver's traceback (kl-exp-overflow, as-is loss), as slime's train.py shows it:"
    assert out.split() == f"{header}\n{driver}\n{line}harness --traceback {tb}".split()  # every word, in order
    assert tb.read_text() == driver == doc["traceback"]


def _in_a_terminal(argv: list[str], cwd: Path) -> tuple[int, list[str]]:
    """`nanscope ARGV`'s exit code and lines, its stdout and stderr an 80-column pseudo-terminal, COLUMNS=80 (rich's
    colours taken out)."""
    import fcntl
    import os
    import pty
    import re
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))
    argv = [sys.executable, "-m", "nanscope.cli.main", *argv]
    try:
        done = subprocess.Popen(argv, stdout=slave, stderr=slave, cwd=cwd, env=_env_in(80))
    finally:
        os.close(slave)
    out, deadline = b"", time.monotonic() + 120
    try:
        while time.monotonic() < deadline:  # read while it writes: a full pty would block it
            if select.select([master], [], [], 1)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
        code = done.wait(timeout=10)
    finally:
        done.kill()
        os.close(master)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode()).replace("\r\n", "\n")
    return code, text.splitlines()


def _piped(argv: list[str], cwd: Path) -> tuple[int, list[str]]:
    argv = [sys.executable, "-m", "nanscope.cli.main", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=_env_in(80), timeout=120)
    return done.returncode, done.stderr.splitlines()


def _env_in(columns: int) -> dict:
    """The environment at COLUMNS=`columns`, this checkout's nanscope first whatever the directory a test runs in."""
    import os

    source = str(Path(terminal.__file__).resolve().parents[2])
    return {
        **_env(),
        "COLUMNS": str(columns),
        "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")]),
    }


def test_an_error_and_a_wrote_line_fit_an_80_column_terminal_and_stay_one_line_piped(tmp_path):
    """Issue 42, done when: no line over 80 columns in an 80-column terminal. A command's one line on stderr (its
    error, argparse's, `wrote PATH`) was printed whole, up to ~290 columns; folded at the width now where stderr is a
    terminal, its further lines indented, and still the one line that a pipe's reader greps."""
    where = "a_long_directory_name/and_another_one_under_it"
    (tmp_path / where).mkdir(parents=True)
    cases = [
        (["scan", f"{where}/rollout_data_12.pt"], 2,
         f"nanscope scan: error: {where}/rollout_data_12.pt: dump: no such file"),
        (["scan", "--demo-kind", "a-kind-of-demo"], 2, "nanscope scan: error: argument --demo-kind: invalid choice: "
         "'a-kind-of-demo' (choose from 'rollout', 'train', 'run') (see nanscope scan --help)"),
        (["doctor", "--case", "slime-795", "--json", f"{where}/d.json", "--html", f"{where}/d.html"], 0,
         f"nanscope doctor: wrote {where}/d.json (--json), {where}/d.html (--html)"),
    ]  # fmt: skip
    long = "x" * 100  # a word wider than the terminal: cut there, as the terminal itself would wrap it
    cases.append((["scan", f"{long}.pt"], 2, f"nanscope scan: error: {long}.pt: dump: no such file"))
    for argv, code, line in cases:
        assert len(line) > 90
        piped = _piped(argv, tmp_path)
        assert piped == (code, [line]), argv  # one line, whole, where stderr is a pipe
        shown, lines = _in_a_terminal(argv, tmp_path)
        assert shown == code and [seen for seen in lines if len(seen) > 80] == [], argv
        start = next(i for i, seen in enumerate(lines) if seen.startswith(f"nanscope {argv[0]}: "))
        want = text.fold(line, 80, cut_words=True)
        folded = lines[start : start + len(want)]
        assert folded == want and len(folded) > 1, argv
        assert all(more.startswith("    ") for more in folded[1:]), argv


@pytest.mark.slow  # a pty each: the fast tier fits scan --write-demo to 80 columns in test_doctor_and_scan_fit_80_columns
def test_scan_write_demos_lines_fit_an_80_column_terminal(tmp_path):
    """`scan --write-demo`'s `wrote ...` lines go through a rich console at the width (they held before the fix
    above: a guard, that they keep to it)."""
    where = "a_long_directory_name/and_another_one_under_it"
    for argv in (["scan", "--write-demo", f"{where}/12.pt"], ["scan", "--write-demo", where, "--demo-kind", "run"]):
        code, lines = _in_a_terminal(argv, tmp_path)
        assert code == 0 and lines[0].startswith("wrote ") and [seen for seen in lines if len(seen) > 80] == [], argv


def test_a_note_is_folded_on_a_terminal_only(monkeypatch):
    """`terminal.note`, which every one-line message on stderr goes through (an internal error's, a warning's)."""
    monkeypatch.setenv("COLUMNS", "30")
    line = "nanscope scan: internal error on x.pt: ValueError: a message of some length"
    tty, pipe = _Tty(), io.StringIO()
    terminal.note(line, tty)
    terminal.note(line, pipe)
    assert pipe.getvalue() == line + "\n"
    assert tty.getvalue() == "nanscope scan: internal error\n    on x.pt: ValueError: a\n    message of some length\n"

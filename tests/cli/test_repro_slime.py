"""`nanscope repro --slime-src`: its input errors are one line and exit 2, before anything starts (the runs themselves:
tests/slime_releases/test_slime_train.py, slow)."""

import os
from pathlib import Path

import pytest

from nanscope.cli.main import main
from nanscope.slime_train import run as slime_run


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    """repro's lines read whole at 160 columns, its width before issue 42 (the rule: tests/cli/test_terminal.py)."""
    monkeypatch.setenv("COLUMNS", "160")


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The files of a checkout that `--slime-src` checks for (empty: no run starts in these tests)."""
    root = tmp_path / "slime"
    for name in slime_run.REQUIRED:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    return root


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--steps", "2"], "--slime-src runs slime's own train.py: not with --steps (the harness's flags)"),
        (["--launcher", "ray"], "--slime-src runs slime's own train.py: not with --launcher (the harness's flags)"),
        (
            ["--hazard", "kl-exp-overflow"],
            "--slime-src plants the hazard in the rollout only; kl-exp-overflow does not live there (choose one of "
            "healthy, nan-rollout-logprob, nan-reward, rollout-logprob-shift; the harness runs every hazard: drop "
            "--slime-src)",
        ),
        (["--loss", "safe"], "--slime-src --loss safe: the fix runs as the plugin does, through --plugin"),
        (
            ["--plugin", "--traceback-out", "tb.txt"],
            "--traceback-out goes with the as-is run (without --plugin): the plugin run trains through",
        ),  # fmt: skip
        (["--report-dir", "r"], "--report-dir r goes with --plugin (the plugin's reports and bundles)"),
    ],
)
def test_what_does_not_go_with_slime_src_is_one_line(checkout, extra, message, capsys):
    assert main(["repro", "--slime-src", str(checkout), *extra]) == 2
    assert capsys.readouterr().err == f"nanscope repro: error: {message}\n"


def test_a_directory_that_is_not_a_checkout_is_one_line(tmp_path, capsys):
    assert main(["repro", "--slime-src", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"nanscope repro: error: --slime-src {tmp_path}: not a slime checkout (no train.py and slime/ there)\n"
    )
    assert main(["repro", "--megatron-lm-src", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"nanscope repro: error: --megatron-lm-src {tmp_path} goes with --slime-src DIR\n"


def test_megatron_lm_src_must_hold_megatron_training(checkout, tmp_path, capsys):
    assert main(["repro", "--slime-src", str(checkout), "--megatron-lm-src", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"nanscope repro: error: --megatron-lm-src {tmp_path}: no megatron/training/ there (a Megatron-LM checkout's "
        "root)\n"
    )


def test_without_megatron_lm_src_megatron_training_must_be_importable(checkout, capsys):
    import importlib.util

    if importlib.util.find_spec("megatron.training") is not None:
        pytest.skip("megatron.training is importable here")
    assert main(["repro", "--slime-src", str(checkout)]) == 2
    assert capsys.readouterr().err == (
        "nanscope repro: error: --slime-src needs Megatron-LM's megatron.training, which is not importable here: pass "
        "--megatron-lm-src DIR (a Megatron-LM checkout; core_v0.15.0rc0 for the case's line numbers)\n"
    )


def test_a_fake_checkout_is_one_line_not_the_runs_traceback(tmp_path, capsys):
    # issue 42: train.py and slime/ alone passed, and the run ended exit 1 with prepare's 10-line traceback
    (tmp_path / "fake" / "slime").mkdir(parents=True)
    (tmp_path / "fake" / "slime" / "__init__.py").write_text("")
    (tmp_path / "fake" / "train.py").write_text("")
    assert main(["repro", "--slime-src", str(tmp_path / "fake")]) == 2
    assert capsys.readouterr().err == (
        f"nanscope repro: error: --slime-src {tmp_path / 'fake'}: not a slime checkout: no slime/utils/types.py, "
        "slime/backends/megatron_utils/arguments.py, slime/backends/megatron_utils/initialize.py, "
        "slime/backends/megatron_utils/model_provider.py (every release has them; the run imports them)\n"
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b"class Sample:\n    index: int\n# \xff\xfe\n", "not UTF-8 (byte 31): not a slime checkout"),
        (b"x = " + b"-" * 100_000 + b"1\n", "not Python this interpreter parses: nested too deeply"),
        (b"x = 1" + b" + 1" * 200_000 + b"\n", "not Python this interpreter parses: nested too deeply"),
        (b"x = " + b"(" * 300 + b")" * 300 + b"\n", "not Python this interpreter parses: too many nested parentheses"),
    ],
)
def test_a_checkout_whose_sample_cannot_be_read_is_one_line(checkout, text, why, capsys):
    # issue 42: a deeply nested or non-UTF-8 slime/utils/types.py was an internal error
    (checkout / "slime" / "utils" / "types.py").write_bytes(text)
    assert main(["repro", "--slime-src", str(checkout)]) == 2
    types = checkout / "slime" / "utils" / "types.py"
    assert capsys.readouterr().err == f"nanscope repro: error: {types}: slime's Sample (--slime-src): {why}\n"


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("file", "--report-dir {path}: not a directory"),
        ("fifo", "--report-dir {path}: not a directory (a FIFO)"),
        ("under-a-file", "--report-dir {path}: not a directory: {tmp}/file is a file"),
        ("/etc/cron.d", "--report-dir {path}: resolves to /etc/cron.d, a system directory: give a directory of the "
         "run's own"),
    ],
)  # fmt: skip
def test_the_plugins_report_dir_is_checked_before_the_run(checkout, tmp_path, where, message, capsys):
    # issue 42: never checked; a regular file failed after the run's 83 s with an internal error
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    path = {"file": tmp_path / "file", "fifo": tmp_path / "fifo", "under-a-file": tmp_path / "file" / "r"}.get(
        where, where
    )
    assert main(["repro", "--slime-src", str(checkout), "--plugin", "--report-dir", str(path)]) == 2
    want = message.format(path=path, tmp=tmp_path)
    assert capsys.readouterr().err == f"nanscope repro: error: {want}\n"


def test_its_plain_lines_fold_at_the_console_width(capsys):
    """Issue 42: in an 80-column terminal no line of repro's is wider; --slime-src's lines (the flags kept, patched,
    an error) were printed whole, hundreds of columns."""
    import io

    from rich.console import Console

    from nanscope.report import slime_repro as report
    from nanscope.slime_repro import SlimeRepro
    from nanscope.slime_train.run import Result, Sources

    error = "prepare failed: " + " ".join(f"word{i}" for i in range(60))
    result = Result(release="v0.1.0", site=(3, 15), patched=[f"torch.cuda.patch_{i}" for i in range(12)],
                    prepare_s=1.0, ray_s=None, wall_s=2.0, launches=[], error=error)  # fmt: skip
    rep = SlimeRepro(result=result, sources=Sources(slime=Path("/x/slime"), megatron_lm=None), hazard="kl-exp-overflow")
    report.render(rep, Console(width=80, file=io.StringIO()))
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 80 and " ".join(out.split()).count(error) == 1

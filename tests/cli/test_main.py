"""The top-level guard: an internal error is one line and exit 2; --debug shows the traceback."""

import pytest

from nanscope.cli import hazards, main, scan
from nanscope.cli.main import main as nanscope


def _boom(args):
    raise RecursionError("maximum recursion depth exceeded\nsecond line")


def test_internal_error_is_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(scan, "run", _boom)
    assert nanscope(["scan", "rollout_data/12.pt"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "nanscope scan: internal error on rollout_data/12.pt: RecursionError: maximum recursion depth exceeded "
        "(rerun with --debug for the traceback)\n"
    )


def test_debug_raises_before_or_after_the_command(monkeypatch):
    monkeypatch.setattr(hazards, "run", _boom)
    for argv in (["--debug", "hazards"], ["hazards", "--debug"]):
        with pytest.raises(RecursionError):
            nanscope(argv)


def test_input_named_by_flag_when_no_file(monkeypatch, capsys):
    monkeypatch.setattr(hazards, "run", _boom)
    assert nanscope(["hazards"]) == 2
    assert capsys.readouterr().err.startswith("nanscope hazards: internal error: RecursionError: ")
    assert main._input(type("A", (), {"case": "slime-795"})()) == " on --case slime-795"


def test_user_error_and_no_command(capsys):
    assert nanscope([]) == 2
    assert nanscope(["repro", "--hazard", "nope"]) == 2
    assert capsys.readouterr().err.endswith(
        "nanscope repro: error: --hazard: unknown hazard 'nope'; known: healthy, kl-exp-overflow, ratio-exp-overflow, "
        "nan-rollout-logprob, nan-reward, zero-temperature, rollout-logprob-shift, activation-overflow, "
        "backward-only-fault, transient-fault, logprob-drift, moe-aux-loss, moe-zero-token-expert, moe-router-logits\n"
    )


def test_version(capsys):
    from nanscope import __version__

    with pytest.raises(SystemExit) as e:
        nanscope(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"nanscope {__version__}\n"


def test_the_parser_imports_no_torch():
    """Every `nanscope ...` starts by building the parser: torch (a second of imports) waits for a command that
    runs a model or reads a tensor (repro --slime-src's flags once pulled it in through the model's sizes)."""
    import subprocess
    import sys

    code = "import sys; from nanscope.cli.main import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "False\n"

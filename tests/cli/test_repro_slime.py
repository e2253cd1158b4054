"""`nanscope repro --slime-src`: its input errors are one line and exit 2, before anything starts (the runs themselves:
tests/slime_releases/test_slime_train.py, slow)."""

from pathlib import Path

import pytest

from nanscope.cli.main import main


@pytest.fixture
def checkout(tmp_path) -> Path:
    root = tmp_path / "slime"
    (root / "slime").mkdir(parents=True)
    (root / "slime" / "__init__.py").write_text("")
    (root / "train.py").write_text("")
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
        (["--timeout", "0"], "--timeout 0: must be a finite number of seconds > 0"),
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

"""The plugin's nanscope/* through each release's own logger to TensorBoard, read back from the event files.

v0.2.4 and v0.3.1 log train metrics through `slime.utils.logging_utils.log(args, metrics, step_key)`, main
through `slime.observability.logging_utils.log` (`facts.releases.LossApi.metrics_logger`): wandb.log under
--use-wandb, and under --use-tensorboard `_TensorboardAdapter(args)` (a singleton: a torch SummaryWriter on
TENSORBOARD_DIR, else on tensorboard_log/<--tb-project-name>/<--tb-experiment-name>) writes every metric but the
step key as a scalar at that step. The real module is imported from the checkout (standins.load_module; it
imports the real wandb at module level); the scalars are read back with TensorBoard's EventAccumulator.

Needs slime checkouts under NANSCOPE_SLIME_SRC (tests/checkouts.py).
"""

import sys
from types import SimpleNamespace

import pytest

from nanscope.facts import releases
from nanscope.slime_plugin import logs
from nanscope.slime_plugin.settings import Settings
from tests.checkouts import slime_release
from tests.slime_releases.standins import PACKAGES, load_module

RELEASES = ("v0.2.4", "v0.3.1", "main")

pytest.importorskip("wandb")  # slime's logging_utils imports it at module level
pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

# 64 x 8 samples per rollout, 256 per optimizer step: 2 steps a rollout, train/step = 2 x rollout_id + step_id
ARGS = dict(rollout_batch_size=64, n_samples_per_prompt=8, global_batch_size=256, use_wandb=False)
STEPS = [  # (rollout_id, step_id, metrics): values exact in float32, which TensorBoard stores
    (0, 0, {"nanscope/max_kl_log_ratio": 0.5, "nanscope/train_rollout_gap_p99": 0.75, "nanscope/clamped_tokens": 0}),
    (0, 1, {"nanscope/max_kl_log_ratio": 21.0, "nanscope/train_rollout_gap_p99": 1.25, "nanscope/clamped_tokens": 3}),
    (1, 0, {"nanscope/max_kl_log_ratio": 71.5, "nanscope/train_rollout_gap_p99": None, "nanscope/clamped_tokens": 9}),
]


@pytest.fixture(params=RELEASES)
def release(request, monkeypatch, tmp_path):
    """(the release's LossApi.metrics_logger, its logging module) from the checkout; sys.modules' slime put back after."""
    checkout = slime_release(request.param)
    logger = releases.BY_KEY[request.param].loss_api.metrics_logger
    module = logger.rpartition(".")[0]
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    monkeypatch.chdir(tmp_path)  # slime's default: tensorboard_log/<project>/<experiment> in the working directory
    ours = lambda name: name in ("slime", "ray") or name.startswith("slime.")
    before = {name: m for name, m in sys.modules.items() if ours(name)}
    try:
        yield logger, load_module(checkout, module, (*PACKAGES, "slime.observability"))
    finally:
        for name in [name for name in sys.modules if ours(name)]:
            del sys.modules[name]
        sys.modules.update(before)


def test_the_scalars_at_train_step(release, tmp_path, capsys):
    metrics_logger, module = release
    args = SimpleNamespace(use_tensorboard=True, tb_project_name="nanscope", tb_experiment_name="test", **ARGS)
    logger = logs.Logger(Settings(), metrics_logger, logs=True)
    for rollout_id, step_id, metrics in STEPS:
        logger.step(args, {"rollout_id": rollout_id, "step_id": step_id}, metrics, {})
    module._TensorboardAdapter(args).finish()  # flushes and closes the SummaryWriter

    events = EventAccumulator(str(tmp_path / "tensorboard_log" / "nanscope" / "test"), size_guidance={"scalars": 0})
    events.Reload()
    read = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert read == {
        name: [(2 * r + s, m[name]) for r, s, m in STEPS if m[name] is not None] for name in STEPS[0][2]
    }  # every step's measured metrics at slime's train/step, and train/step itself not a scalar
    assert [line.split(":")[2] for line in capsys.readouterr().out.splitlines()] == [
        " rollout 0 step 1",
        " rollout 1 step 0",
    ]  # the two crossings' warnings; no failure to log


def test_a_misconfigured_tensorboard_is_one_warning_line_a_step(release, capsys):
    metrics_logger, _ = release
    args = SimpleNamespace(use_tensorboard=True, tb_project_name=None, tb_experiment_name=None, **ARGS)
    logger = logs.Logger(Settings(), metrics_logger, logs=True)
    for step_id in (0, 1):
        logger.step(args, {"rollout_id": 0, "step_id": step_id}, {"nanscope/clamped_tokens": 0}, {})
    assert (
        capsys.readouterr().out.splitlines()
        == [
            "nanscope: warning: could not log ['nanscope/clamped_tokens']: ValueError: tb_project_name and "
            "tb_experiment_name, or TENSORBOARD_DIR are required"
        ]
        * 2
    )
    assert [row["step_id"] for row in logger.logged] == [0, 1]

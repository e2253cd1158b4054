"""Issue 41, round 11: the two classes holdout11 read partly right, each on crafted input of its class: a log of two
pastes (a retry, then the run it retried) or of a restarted run, whose second non-finite episode went unsaid (1-3),
and a hand-made Markdown table whose columns name the runs it compares, the metric named by its caption (4-5). Each
positive test fails on round 10's doctor (main 9f85dea)."""

import pytest

from nanscope.launch.episodes import Episodes
from nanscope.launch.tables import header
from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


def _iteration(step: int, loss: str, norm: str, nan: int) -> str:
    return (f" iteration {step:>8}/    1000 | consumed samples: {step * 256:>12} | elapsed time per iteration (ms): "
            f"4990.2 | learning rate: 2.000E-06 | global batch size:   256 | lm loss: {loss} | loss scale: 1.0 | "
            f"grad norm: {norm} | number of skipped iterations:   0 | number of nan iterations: {nan:>3} |\n")  # fmt: skip


# 1. Megatron's iteration lines, two pastes: a retry that went NaN at its second iteration, then the main run's end
_TWO_PASTES = (_iteration(1, "1.052344E+01", "12.345", 0) + _iteration(2, "nan", "nan", 1) + "\n"
               + _iteration(226, "2.301234E+00", "1.234", 0) + _iteration(227, "2.298765E+00", "1.198", 0)
               + _iteration(228, "nan", "nan", 1))  # fmt: skip


def test_1_a_second_paste_s_non_finite_step_is_said(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _TWO_PASTES)
    assert doc["summary"]["step"] == 2 and doc["summary"]["metric"] == "lm loss"
    assert doc["metrics"]["nonfinite_again"] == {"line": 6, "step": 228, "metric": "lm loss", "finite_line": 4,
                                                 "finite_step": 226, "step_went_back": False}  # fmt: skip
    assert "lm loss is non-finite again at step 228 (line 6), after finite lines from step 226 (line 4)." in out


# 2. transformers' dicts, with no step: the episode is placed by line
_DICTS = """{'loss': 1.2345, 'grad_norm': 3.21, 'learning_rate': 1e-05, 'epoch': 0.01}
{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.02}

{'loss': 0.8123, 'grad_norm': 1.02, 'learning_rate': 9e-06, 'epoch': 1.1}
{'loss': 0.8012, 'grad_norm': 0.98, 'learning_rate': 9e-06, 'epoch': 1.11}
{'loss': nan, 'grad_norm': nan, 'learning_rate': 9e-06, 'epoch': 1.12}
"""


def test_2_a_trainer_log_s_second_episode_is_placed_by_line(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _DICTS)
    assert doc["metrics"]["nonfinite_again"]["line"] == 6 and doc["metrics"]["nonfinite_again"]["finite_line"] == 4
    assert "loss is non-finite again at line 6, after finite lines from line 4." in out


# 3. a run restarted from an earlier checkpoint: the step counter goes back, and the sentence says it is another run
_RESTART = """step:4 - actor/pg_loss:0.12 - actor/grad_norm:0.9
step:5 - actor/pg_loss:nan - actor/grad_norm:nan
step:3 - actor/pg_loss:0.11 - actor/grad_norm:0.8
step:4 - actor/pg_loss:0.13 - actor/grad_norm:0.7
step:5 - actor/pg_loss:nan - actor/grad_norm:nan
"""


def test_3_a_step_counter_that_goes_back_is_another_run(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _RESTART)
    assert doc["metrics"]["nonfinite_again"]["step_went_back"] is True
    assert ("actor/pg_loss is non-finite again at step 5 (line 5), after finite lines from step 3 (line 3); the step "
            "counter goes back below step 5 in between: another run (restarted, resumed, or a second paste), so each "
            "run's first non-finite step is one of these.") in out  # fmt: skip


def test_3b_a_loss_scaler_s_isolated_norms_are_no_episode(tmp_path, capsys):
    # grad_norm nan beside a finite loss, finite after, nan again: a dynamic loss scaler's skipped steps
    log = "".join(
        f"{{'loss': 2.{i}, 'grad_norm': {'nan' if i in (2, 5) else '1.5'}, 'epoch': 0.{i}}}\n" for i in range(8)
    )
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["metrics"]["nonfinite_again"] is None
    assert doc["summary"]["benign"] is not None


def test_3c_episodes_in_order_and_once():
    episodes = Episodes()
    episodes.feed(1, 1, [("loss", True)])  # not started: nothing
    episodes.start("Loss", 7)
    episodes.feed(3, 8, [("loss", True)])  # still non-finite: the same episode
    episodes.feed(4, None, [("eval_loss", False)])  # a line without the metric
    assert episodes.waiting() and episodes.again is None
    episodes.feed(5, 9, [("loss", False)])
    episodes.feed(6, 10, [("loss", True)])
    episodes.feed(7, 11, [("loss", False)])
    episodes.feed(8, 12, [("loss", True)])  # only the first second episode is kept
    assert (episodes.again.line, episodes.again.step, episodes.again.finite_line, episodes.again.metric) == (
        6, 10, 5, "loss")  # fmt: skip


# 4. a reporter's Markdown table comparing runs: the caption names the metric, each column a run
_TABLE = """Loss of stage 2 with each DeepSpeed version:

| step | Stage2_1node_ds0.13.1 | Stage2_1node_ds0.14.0 |
|------|-----------------------|-----------------------|
| 1    | 11.2                  | 11.2                  |
| 10   | 7.85                  | 7.86                  |
| 20   | 6.91                  | nan                   |
| 30   | 6.40                  | nan                   |
"""


def test_4_a_table_of_runs_takes_its_metric_from_the_caption(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _TABLE)
    assert (doc["summary"]["metric"], doc["summary"]["step"]) == ("Stage2_1node_ds0.14.0/Loss", 20)
    assert "The first non-finite metric: Stage2_1node_ds0.14.0/Loss at step 20 (line 7). What it points to: " in out


def test_5_a_table_whose_columns_name_metrics_keeps_them():
    assert header("| step | Stage2_a | Stage2_b |", "|--|--|--|", ["grad_norm per step:", ""]).metric == "grad_norm"
    table = header("| Step | Training Loss | kl |", "-- | -- | --", ["Loss of stage 2:"])
    assert table.metric is None and table.row("| 3 | nan | 0.1 |")[1][0] == "Training Loss"
    assert header("| step | run_a | run_b |", "|--|--|--|", ["results:"]).metric is None  # nothing names one

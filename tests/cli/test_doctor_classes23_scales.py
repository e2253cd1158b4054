"""Issue 41, round 23: the loss scale classes of holdout23 (reports 05 to 08), on crafted input of each class in the
stack's own format: a falling loss scale Megatron's iteration lines print is overflows skipped (1), Megatron's lines
beside DeepSpeed's engine are Megatron-DeepSpeed's and its grad norm repeats after a skipped step (2), an overflow
series starting at the initial scale the run's config prints is the scaler calibrating (3), and an overflow line right
before a progress bar happened in that bar's step (4). Each positive test fails on main e40e49b."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


def _megatron(rows) -> str:
    """Megatron-LM's iteration lines (training_log: core_v0.15.0rc0 megatron/training/training.py:1815-1870), each row
    (iteration, lm loss, loss scale, grad norm, number of skipped iterations)."""
    return "".join(
        f" [2025-03-04 05:{i:02d}:00] iteration {step:8d}/  100000 | consumed samples: {step * 512:12d} | elapsed "
        "time per iteration (ms): 1234.5 | learning rate: 2.000000E-04 | global batch size:   512 | lm loss: "
        f"{loss:.6E} | loss scale: {scale:.1f} | grad norm: {norm:.3f} | number of skipped iterations: {skipped:3d} "
        "| number of nan iterations:   0 |\n"
        for i, (step, loss, scale, norm, skipped) in enumerate(rows)
    )


# 1. the loss scale Megatron's iteration lines print falls mid-run (holdout23 07: 65536 -> 8192 -> 4096 at iteration
# 29040 .. 29060, every value finite): each halving a step whose gradients overflowed, skipped
_FALLING = [(4010, 2.31, 65536, 1.2, 0), (4020, 2.30, 65536, 1.1, 0), (4030, 2.29, 65536, 1.3, 0),
            (4040, 3.9, 16384, 1.3, 0), (4050, 3.1, 8192, 1.3, 0), (4060, 2.9, 8192, 1.4, 0)]  # fmt: skip


def test_1_a_loss_scale_falling_mid_run_is_overflows_skipped(tmp_path, capsys):
    """main: "Not a NaN failure by itself: no non-finite value and no error found in 6 lines"."""
    doc, out = _doctor(tmp_path, capsys, _megatron(_FALLING))
    assert (
        "The loss scale its metric lines print falls from 65536 (2^16) at line 3 (step 4030) to 16384 (2^14) at line 4 "
        "(step 4040), then to 8192 (2^13) at line 5 (step 4050): at least 3 halvings, each a step whose gradients held "
        "inf or NaN and that a dynamic loss scaler skipped, past a run's start (its first 100 steps, where a scale "
        "calibrates): gradients overflowing mid-run, not a scale calibrating." in out
    )
    assert "Not a NaN failure by itself" not in out and "its scale calibrating)" not in out
    summary = doc["summary"]
    assert (summary["check"], summary["metric"], summary["after_step"], summary["benign"]) == (
        "loss-scale-fall",
        "loss scale",
        4030,
        None,
    )
    assert doc["metrics"]["loss_scale_falls"] == {
        "falls": 2,
        "skipped_at_least": 3,
        "halvings": 3,
        "last": 8192.0,
        "last_line": 5,
        "last_step": 4050,
        "past_start": True,
        "uncounted": {"line": 4, "step": 4040},
    }


def test_1_a_fall_by_no_power_of_two_says_no_halvings(tmp_path, capsys):
    """A scale not halved (a mean printed, another factor): one skipped step a fall at least, no halvings said."""
    rows = [(4010, 2.3, 65536, 1.0, 0), (4020, 2.3, 30000, 1.0, 0), (4030, 2.2, 1000, 1.0, 0)]
    doc, out = _doctor(tmp_path, capsys, _megatron(rows))
    assert (
        "then to 1000 at line 3 (step 4030): a dynamic loss scaler found inf or NaN gradients and skipped at least 2 "
        "steps in between, past a run's start" in out
    )
    assert doc["metrics"]["loss_scale_falls"]["halvings"] is None


def test_1_the_lines_own_skip_counter_at_0_is_said(tmp_path, capsys):
    """main: the counter's 0 beside the fall unsaid."""
    _, out = _doctor(tmp_path, capsys, _megatron(_FALLING))
    assert (
        "The same lines print `number of skipped iterations: 0` at line 4 (step 4040), where the scale fell: the steps "
        "skipped there are not in that counter (Megatron-LM's counts each step its own optimizer skips over the "
        "interval a line covers: core_v0.15.0rc0 megatron/training/training.py:1553-1558, :1867)." in out
    )


def test_1_a_counter_that_counts_the_skips_is_no_contradiction(tmp_path, capsys):
    rows = [row[:4] + (3 if row[0] == 4040 else 1 if row[0] == 4050 else 0,) for row in _FALLING]
    doc, out = _doctor(tmp_path, capsys, _megatron(rows))
    assert "where the scale fell" not in out and doc["summary"]["check"] == "skip-counter"


def test_1_a_counter_across_lines_cut_out_is_not_said(tmp_path, capsys):
    """A paste that cuts lines out (`...`, holdout19 06): the line after the cut covers only its own interval."""
    rows = [(10, 9.1, 65536, 1.0, 0), (20, 8.7, 65536, 1.0, 0)], [(2480, 3.2, 4096, 1.0, 0), (2490, 3.1, 4096, 1.0, 0)]
    _, out = _doctor(tmp_path, capsys, _megatron(rows[0]) + "...\n" + _megatron(rows[1]))
    assert (
        "falls from 65536 (2^16) at line 2 (step 20) to 4096 (2^12) at line 4 (step 2480): at least 4 halvings" in out
    )
    assert "where the scale fell" not in out


def test_1_a_fall_at_a_runs_start_is_still_a_calibration(tmp_path, capsys):
    rows = [(10, 9.1, 65536, 1.0, 0), (20, 8.7, 32768, 1.0, 0), (30, 8.2, 32768, 1.0, 0)]
    _, out = _doctor(tmp_path, capsys, _megatron(rows))
    assert (
        "falls from 65536 (2^16) at line 1 (step 10) to 32768 (2^15) at line 2 (step 20): a dynamic loss scaler found "
        "inf or NaN gradients in between and skipped a step (at a run's start, its scale calibrating)." in out
    )


def test_1_a_steady_or_growing_scale_says_nothing_found(tmp_path, capsys):
    rows = [(4010, 2.3, 32768, 1.0, 0), (4020, 2.3, 65536, 1.0, 0), (4030, 2.2, 65536, 1.0, 0)]
    doc, out = _doctor(tmp_path, capsys, _megatron(rows))
    assert doc["summary"]["check"] is None and doc["metrics"].get("loss_scale_falls") is None
    assert "Not a NaN failure by itself: no non-finite value and no error found in 3 lines" in out


# 2. Megatron's iteration lines beside DeepSpeed's engine's logger lines (holdout23 05: ZeRO stage 1 and 2's
# `[deepscale] OVERFLOW!`, DeepSpeed v0.5.9 .. v0.6.0 stage_1_and_2.py:1653, its logger's format
# deepspeed/utils/logging.py:39)
def _zero(scale: float, to: float) -> str:
    return (f"[2022-01-19 13:09:13,305] [INFO] [stage_1_and_2.py:1644:step] [deepscale] OVERFLOW! Rank 0 Skipping "
            f"step. Attempted loss scale: {scale:.1f}, reducing to {to:.1f}\n")  # fmt: skip


def _mds(last_norm: float) -> str:
    """Megatron-DeepSpeed's lines: three overflows, the grad norm after the last one `last_norm`."""
    return (
        _megatron([(17060, 2.66, 1048576, 453082.517, 0), (17061, 2.67, 1048576, 464441.887, 0)])
        + _zero(1048576, 1048576)
        + _megatron([(17062, 4.37, 1048576, 464441.887, 0)])
        + _zero(1048576, 524288)
        + _megatron([(17063, 4.36, 524288, 464441.887, 0), (17064, 4.39, 524288, 879946.622, 0)])
        + _zero(524288, 262144)
        + _megatron([(17065, 4.40, 262144, last_norm, 0)])
    )


_MDS = _mds(879946.622)


def test_2_megatron_lines_beside_deepspeeds_engine_are_megatron_deepspeed(tmp_path, capsys):
    """main: "megatron-lm ... it calls deepspeed"."""
    doc, _ = _doctor(tmp_path, capsys, _MDS)
    assert doc["framework"]["name"] == "megatron-deepspeed"
    assert doc["framework"]["how"] == (
        "its metric lines' keys (consumed samples, elapsed time per iteration (ms)), Megatron-LM's, beside DeepSpeed's "
        "engine (its logger's lines, `[stage_1_and_2.py:1644:step]`), which Megatron-LM's own training loop never runs"
    )


def test_2_megatron_lines_beside_a_word_naming_deepspeed_stay_megatron_lms(tmp_path, capsys):
    counted = [(step, loss, scale, norm, 2 if scale < 65536 else 0) for step, loss, scale, norm, _ in _FALLING]
    doc, _ = _doctor(tmp_path, capsys, "DeepSpeed is not installed: continuing without it\n" + _megatron(counted))
    assert doc["framework"]["name"] == "megatron-lm"


def test_2_the_grad_norm_repeated_after_each_skipped_step_is_said(tmp_path, capsys):
    """main: DeepSpeed's stale norm looked for as `grad_norm` only."""
    doc, out = _doctor(tmp_path, capsys, _MDS)
    assert (
        "grad norm 464441.887 at line 4 is the skipped step's, so the previous step's, the same as before the overflow "
        "(464441.887); of the 3 overflow lines with a norm printed before and after, 3 show it unchanged: DeepSpeed's "
        "ZeRO and FP16 optimizers return from the step on an overflow before computing the norm (0.16.4 "
        "zero/stage_1_and_2.py:1839-1853, fp16/fused_optimizer.py:263-275)" in out
    )
    assert doc["signals"]["stale_grad_norms"] == {"key": "grad norm", "followed": 3, "repeated": 3}


def test_2_a_norm_that_moves_after_an_overflow_is_not_all_unchanged(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _mds(1.5))
    assert doc["signals"]["stale_grad_norms"] == {"key": "grad norm", "followed": 3, "repeated": 2}


# 3. DeepSpeed's own print of its fp16 config (v0.16.4 deepspeed/runtime/config.py:1000-1005, `  {name} {dots}
# {value}`, dots 29 less the name; its user json at :990-997), then two overflows at the first steps of a run
_CONFIG = {
    "dynamic_loss_scale_args": "[2021-05-25 06:30:55,344] [INFO] [config.py:752:print]   dynamic_loss_scale_args "
    "...... {'init_scale': 256, 'scale_window': 1000, 'delayed_shift': 2, 'min_scale': 1}\n",
    "initial_dynamic_scale": "[2024-01-02 03:04:05,100] [INFO] [config.py:1005:print]   initial_dynamic_scale "
    "........ 256\n",
    "json": '[2024-01-02 03:04:05,101] [INFO] [config.py:991:print_user_config]   json = {\n    "fp16":{\n'
    '        "enabled":true,\n        "initial_scale_power":8,\n        "loss_scale":0\n    },\n}\n',
}
_SAID = {
    "dynamic_loss_scale_args": "line 1: dynamic_loss_scale_args' init_scale 256",
    "initial_dynamic_scale": "line 1: initial_dynamic_scale 256",
    "json": "line 4: initial_scale_power 8, 2^8",
}
_BANNER = "[INFO|trainer.py:1143] 2021-05-25 06:30:55,345 >> ***** Running training *****\n"
_STAGE3 = ("[2021-05-25 06:38:10,754] [INFO] [stage3.py:2708:_overflow_clean_up] [deepscale] OVERFLOW! Rank 0 "
           "Skipping step. Attempted loss scale: {}, reducing to {}\n")  # fmt: skip


@pytest.mark.parametrize("form", list(_CONFIG))
def test_3_overflows_from_the_printed_initial_scale_are_the_scaler_calibrating(tmp_path, capsys, form):
    """main: "The loss scale is down to 128 ...: the gradients overflow step after step, not a calibration"."""
    doc, out = _doctor(
        tmp_path, capsys, _CONFIG[form] + _BANNER + _STAGE3.format(256, 256) + _STAGE3.format(256, 128.0)
    )
    assert (
        f"The first attempted loss scale is 256, the initial scale the run's config prints ({_SAID[form]}), and it is "
        "kept on 1 overflow(s) (spending the scaler's hysteresis), then halves: the scale calibrating at a run's "
        "start, not a NaN failure by itself (a scale that keeps falling is one)." in out
    )
    assert doc["summary"]["benign"] == (
        "the fp16 loss scale calibrating at the run's start (its initial scale, as the run's config prints it, "
        "halving), no loss non-finite"
    )


def test_3_a_scale_falling_far_from_the_printed_initial_scale_is_no_calibration(tmp_path, capsys):
    lines = "".join(_STAGE3.format(2**k, 2 ** (k - 1)) for k in range(8, 1, -1))  # 256 -> 2
    doc, out = _doctor(tmp_path, capsys, _CONFIG["dynamic_loss_scale_args"] + lines)
    assert "The loss scale is down to 2 (7 overflow line(s), halving): the gradients overflow step after step" in out
    assert doc["summary"]["benign"] is None


def test_3_the_printed_initial_scale_far_past_a_runs_start_is_no_calibration(tmp_path, capsys):
    bar = "  5%|▌         | {}/9000 [20:00<6:00:00,  2.40s/it]"
    lines = "".join(bar.format(n) + _STAGE3.format(256 >> i, 128 >> i) for i, n in enumerate((500, 501)))
    doc, out = _doctor(tmp_path, capsys, _CONFIG["dynamic_loss_scale_args"] + lines)
    assert "calibrating at a run's start" not in out and doc["summary"]["benign"] is None


# 4. an overflow line with no step right before a progress bar (holdout23 08: DeepSpeed's loss scaler, v0.16.4
# fp16/loss_scaler.py:180-188, then tqdm's bar `22/53500 [...]`, the next overflow glued after it)
_LOSS_SCALER = ("[2023-08-11 16:05:57,242] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 "
                "Skipping step. Attempted loss scale: {}, reducing to {}")  # fmt: skip
_TQDM = "  0%|          | {}/53500 [10:13<431:03:27, 29.02s/it]"


def test_4_an_overflow_right_before_a_bar_is_that_bars_step(tmp_path, capsys):
    """main: no step ("line 1"); the series from the glued line's step 223."""
    log = (
        _LOSS_SCALER.format(2048, 1024) + "\n"
        + _TQDM.format(222) + _LOSS_SCALER.format(1024, 512) + "\n"
        + _TQDM.format(223) + _LOSS_SCALER.format(512, 256) + "\n"
    )  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert (doc["failure"]["step"], doc["summary"]["step"]) == (222, 222)
    assert (
        "DeepSpeed's loss scaler (its logger's file, loss_scaler.py) skipped a step on inf or NaN gradients at step "
        "222 (the progress bar right after it, 222/53500: DeepSpeed prints it inside that step, before the loop moves "
        "its bar to it) (line 1, and 2 more such line(s); loss scale 2048 -> 1024;" in out
    )
    assert "with an overflow on every step from step 222 to 224 (3 overflow line(s)), past a run's start" in out


@pytest.mark.parametrize(
    "after",
    [
        "\n" + _TQDM.format(22),  # a blank line between: a pasted excerpt's next part
        "\r".join(_TQDM.format(n) for n in (0, 1, 2)),  # a terminal's redraws written at once (holdout23 06)
        _TQDM.format(0),  # the bar drawn before the first step
    ],
    ids=["blank line", "several redraws", "a bar at 0"],
)
def test_4_no_step_from_a_bar_that_does_not_follow_it(tmp_path, capsys, after):
    doc, _ = _doctor(tmp_path, capsys, _LOSS_SCALER.format(2048, 1024) + "\n" + after + "\n")
    assert doc["failure"]["step"] is None

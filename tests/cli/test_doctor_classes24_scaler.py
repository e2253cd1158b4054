"""Issue 41, round 24: holdout24's classes 07 and 09 on crafted input of each class. Each positive test fails on
main 6020a98.

07: a dynamic loss scaler's lone overflow at a high scale far into a run is the scaler probing the scale it doubled
after a window of clean steps (DeepSpeed 0.16.4 deepspeed/runtime/fp16/loss_scaler.py:178-184, :199-202): benign.
09: torch elastic's agent names the local rank whose process it observed fail first (torch 2.13.0
torch/distributed/elastic/multiprocessing/api.py:1001-1006; torchrun's Root Cause table, errors/__init__.py:184-200)."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


def _bar(step: int, total: int = 20000) -> str:
    """transformers' ProgressCallback bar (tqdm), redrawn in place: the logger's next line lands on its line."""
    return f" 12%|█▏        | {step}/{total} [41:02<4:50:11,  1.02s/it]"


def _overflow(scale: int) -> str:
    """DeepSpeed 0.16.4's overflow line (fp16/loss_scaler.py:180-183) through its logger (utils/logging.py's format)."""
    return (f"[2024-03-01 10:00:00,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
            f"step. Attempted loss scale: {scale}, reducing to {scale // 2}\n")  # fmt: skip


def _dicts(loss: str = "0.1814") -> str:
    # transformers' Trainer log dicts (trainer.py's self.log, printed by ProgressCallback.on_log)
    return f"{{'loss': 0.1214, 'learning_rate': 9.87e-05, 'epoch': 0.99}}\n{{'loss': {loss}, 'learning_rate': 9.86e-05, 'epoch': 1.0}}\n"


_EVAL = "{'eval_loss': 0.1332675814628601, 'eval_runtime': 72.742, 'epoch': 1.0}\n"


# 1. (holdout24 07) one overflow at 2^17 far past a run's start, every loss finite: the scaler's periodic probe
def test_1_a_lone_overflow_at_a_high_scale_mid_run_is_benign(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _dicts() + _bar(2400) + _overflow(131072) + _EVAL)
    assert doc["summary"]["benign"] == (
        "the fp16 loss scale probing a higher scale mid-run (one overflow at step 2401, the scale halved from 131072 "
        "(2^17) to 65536 (2^16)), no loss non-finite"
    )
    assert (
        "One overflow at step 2401, the scale halved from 131072 (2^17) to 65536 (2^16), past a run's start (its "
        "first 100 steps), no loss the text prints non-finite: a dynamic loss scaler doubles its scale after a window "
        "of steps without an overflow (DeepSpeed's loss_scale_window, default 1000) and halves it on the next "
        "overflow, so this is the scaler probing a higher scale, benign, not a NaN failure by itself"
    ) in out
    assert "1 overflow line(s), the loss scale from" not in out


# 2. two probes thousands of steps apart, the scale grown back between them: the same probe, twice
def test_2_probes_far_apart_are_benign(tmp_path, capsys):
    log = _dicts() + _bar(2400) + _overflow(131072) + _dicts() + _bar(3900) + _overflow(131072) + _EVAL
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["benign"] == (
        "the fp16 loss scale probing a higher scale mid-run (2 overflows from step 2401, at least 1500 steps apart, "
        "the scale never below 65536 (2^16)), no loss non-finite"
    )
    assert "(2 overflow lines), past a run's start" in out


# 3. negatives: overflows on consecutive steps, a scale falling below 2^16, a loss NaN after: not a probe
@pytest.mark.parametrize(
    "log",
    [
        _dicts() + _bar(2400) + _overflow(131072) + _bar(2401) + _overflow(65536),
        _dicts() + _bar(2400) + _overflow(32768) + _EVAL,
        _dicts() + _bar(2400) + _overflow(131072) + _dicts("nan"),
    ],
    ids=["consecutive", "low scale", "loss nan after"],
)
def test_3_no_probe_where_the_text_says_otherwise(tmp_path, capsys, log):
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["benign"] is None or "probing" not in doc["summary"]["benign"]
    assert "this is the scaler probing a higher scale" not in out  # the verdict's probe (the signal's meaning names
    # a probe among its readings: round 29)


_ANOMALY = (
    "Traceback (most recent call last):\n"
    '  File "/work/train.py", line 120, in <module>\n    loss.backward()\n'
    '  File "/usr/lib/python3.10/site-packages/torch/_tensor.py", line 522, in backward\n'
    "    torch.autograd.backward(\n"
    "RuntimeError: Function 'DivBackward0' returned nan values in its 1th output.\n"
)


# 4. (holdout24 09) torch elastic's agent line after the error (torch 2.13.0 api.py:1003, the glog prefix of torch
# 2.4+'s logger): its local rank is the rank, said as the process the agent observed fail first
def test_4_the_elastic_agents_local_rank_is_read(tmp_path, capsys):
    agent = (
        "E0115 05:44:28.123000 6100 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
        "local_rank: 3 (pid: 4411) of binary: /usr/bin/python3\n"
    )
    doc, out = _doctor(tmp_path, capsys, _ANOMALY + agent)
    assert doc["summary"]["rank"] == 3
    assert doc["summary"]["lines"]["rank"] == 7
    assert doc["summary"]["rank_from"] == "torch elastic's agent: local_rank 3, the process it observed fail first"
    assert (
        "torch elastic's agent names local_rank 3 as the process it observed fail first (line 7: `failed (exitcode: "
        "1) local_rank: 3 (pid: 4411)`): the rank whose process failed first, as the agent observed it."
    ) in out


_TABLE = (
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    "============================================================\ntrain.py FAILED\n"
    "------------------------------------------------------------\nFailures:\n  <NO_OTHER_FAILURES>\n"
    "------------------------------------------------------------\nRoot Cause (first observed failure):\n[0]:\n"
    "  time      : 2024-06-16_20:34:34\n  host      : node-2\n  rank      : 9 (local_rank: 1)\n"
    "  exitcode  : 1 (pid: 76628)\n  error_file: <N/A>\n"
    "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
    "============================================================\n"
)


# 5. torchrun's Root Cause table (torch 2.13.0 errors/__init__.py:184-200) gives the global rank
def test_5_the_root_cause_tables_global_rank_is_read(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _ANOMALY + _TABLE)
    assert doc["summary"]["rank"] == 9
    assert "torch elastic's agent names rank 9 (local_rank 1) as the process it observed fail first" in out


# 6. negative: the error's own lines are rank 0's (`[rank0]:` prefixes): the agent's local_rank 1 is not the rank
def test_6_an_error_of_another_rank_keeps_its_rank(tmp_path, capsys):
    prefixed = "".join(f"[rank0]: {line}\n" for line in _ANOMALY.splitlines())
    agent = (
        "[2024-02-08 10:19:38,064] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) "
        "local_rank: 1 (pid: 2702) of binary: /usr/bin/python\n"
    )
    doc, out = _doctor(tmp_path, capsys, prefixed + agent)
    assert doc["summary"]["rank"] == 0
    assert doc["summary"]["rank_from"] is None
    assert (
        "torch elastic's agent names local_rank 1 as the process it observed fail first (line 7: `failed (exitcode: "
        "1) local_rank: 1 (pid: 2702)`); the error the text shows is rank 0's, so the agent's first observed exit is "
        "not said to be where it began."
    ) in out

"""Issue 42's fourth probe round against doctor: terminal escapes from a log, readers that were not linear, internal
errors and wrong answers on odd input. Each test failed on the code before its fix."""

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nanscope.cli.main import main
from nanscope.launch import logs
from nanscope.launch.tracebacks import parse_traceback

REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "reports"
NEMO = REPORTS / "nemo-14348.log"

# ESC c (reset), ESC ( 0 (line drawing), ESC # 8 (screen of E), ESC 7 (save cursor), a bare ESC, an unfinished CSI,
# 8-bit CSI (U+009B) and OSC (U+009D) with BEL
ESCAPES = "\x1bc" + "\x1b(0" + "\x1b#8" + "\x1b7" + "\x1b" + "\x1b[1;" + "\x9b2J" + "\x9d0;title\x07"


def _controls(text: str) -> set[str]:
    return {c for c in text if (ord(c) < 32 and c != "\n") or 0x7F <= ord(c) <= 0x9F}


pytestmark = pytest.mark.usefixtures("wide_terminal")


def test_no_control_character_of_a_log_reaches_the_terminal_or_the_page(tmp_path, capsys):
    """They came through node names, frame paths, function names and unknown messages; the JSON stays faithful."""
    log = tmp_path / "esc.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        f'  File "/opt/{ESCAPES}/megatron/core/distributed/param_and_grad_buffer.py", line 185, in check_{ESCAPES}\n'
        f"RuntimeError: Rank 5, node dgx{ESCAPES}1, device 2, iteration -1: Unexpected result nan (message='my check "
        f"{ESCAPES} said no')\n",
        encoding="utf-8",
    )
    out, page = tmp_path / "d.json", tmp_path / "d.html"
    assert main(["doctor", "--traceback", str(log), "--json", str(out), "--html", str(page)]) == 0
    terminal = capsys.readouterr().out
    assert _controls(terminal) == set() and _controls(page.read_text(encoding="utf-8")) == set()
    assert "dgx\\x1bc\\x1b(0" in terminal  # shown, escaped
    assert _controls(out.read_text(encoding="utf-8")) == set()  # every one a \u escape in the file
    assert json.loads(out.read_text())["failure"]["node"] == f"dgx{ESCAPES}1"


def test_a_closed_standard_input_is_one_line(tmp_path):
    code = "import sys; from nanscope.cli.main import main; sys.exit(main(['doctor', '--traceback', '-']))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.close(0)
    )
    assert (proc.returncode, proc.stderr) == (
        2,
        "nanscope doctor: error: standard input: traceback: standard input is closed: nothing to read (pass a file)\n",
    )


def test_one_junk_line_with_a_19_digit_rank_does_not_sink_an_earlier_error(tmp_path, capsys):
    log = tmp_path / "job.log"
    junk = "Rank 1234567890123456789, node n, device 1, iteration 2: Unexpected result nan (message='x')\n"
    log.write_text(NEMO.read_text() + "later noise\n" + junk)
    out = tmp_path / "d.json"
    assert main(["doctor", "--traceback", str(log), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["failure"]["rank"], doc["failure"]["check"]) == (4, "grad-norm-nan")
    lines = len(NEMO.read_text().splitlines()) + 2
    assert (
        f"traceback: {log}: line {lines}: the rank has 19 digits, more than Megatron ever prints: not a Megatron error "
        "line: not read as one"
    ) in doc["notes"]


@pytest.mark.parametrize(
    ("encode", "said"),
    [
        (lambda text: gzip.compress(text.encode()), "the log is gzip-compressed: read decompressed"),
        (lambda text: text.encode("utf-16"), "the log is UTF-16 LE: read decoded"),
        (lambda text: text.encode("utf-16-be"), "the log is UTF-16 BE: read decoded"),
    ],
    ids=["gzip", "utf-16", "utf-16-be-no-bom"],
)
def test_a_gzipped_or_utf16_log_is_read_and_said(encode, said, tmp_path, capsys):
    """Before: "no Megatron error found", with no word about the encoding or the compression."""
    log = tmp_path / "job.log"
    log.write_bytes(encode(NEMO.read_text()))
    out = tmp_path / "d.json"
    assert main(["doctor", "--traceback", str(log), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["failure"]["rank"], doc["framework"]["name"]) == (4, "nemo")
    assert f"traceback: {said}" in doc["notes"]


def test_a_gzipped_log_with_nothing_in_it_says_what_it_is(tmp_path, capsys):
    log = tmp_path / "job.log.gz"
    log.write_bytes(gzip.compress(b"all is well\n" * 100))
    assert main(["doctor", "--traceback", str(log)]) == 0  # round 4: readable text is never refused
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "gzip-compressed" in out
    assert "no non-finite value and no error found in 100 lines (what was read: plain lines, no metric line)" in out


def test_a_sourced_device_fifo_or_directory_is_said_to_be_one(tmp_path, capsys):
    """Before: each was "not found"."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    script = tmp_path / "launch.sh"
    script.write_text(
        "source /dev/zero\nsource fifo\nsource dir\npython3 train.py --actor-num-nodes 1 --colocate --num-layers 4\n"
    )
    out = tmp_path / "d.json"
    assert main(["doctor", str(script), "--json", str(out)]) == 0
    notes = json.loads(out.read_text())["notes"]
    for line, path, what in ((1, "/dev/zero", "a character device"), (2, "fifo", "a FIFO"), (3, "dir", "a directory")):
        assert f"line {line}: source {path}: {what}, not a file: not read; pass --model-args FILE or --model JSON" in (
            notes
        )


def test_a_source_another_frameworks_launch_could_not_read_is_said(tmp_path, capsys):
    """Before: a Megatron-LM or unknown launch's unread `source` went without a word (a slime launch's is said)."""
    script = tmp_path / "launch.sh"
    script.write_text("source /dev/zero\nsource nothere.sh\ntorchrun pretrain_gpt.py --num-layers 4\n")
    assert main(["doctor", str(script), "--json", str(tmp_path / "d.json")]) == 0
    notes = json.loads((tmp_path / "d.json").read_text())["notes"]
    assert notes[:2] == [
        "line 1: source /dev/zero: a character device, not a file: not read; the variables it sets are unknown (pass "
        "--env NAME=VALUE)",
        "line 2: source nothere.sh: not found; the variables it sets are unknown (pass --env NAME=VALUE)",
    ]
    assert "line 2: source nothere.sh: not found" in capsys.readouterr().out


# A line of each class that was not linear, at about 1 MB: a hang check (10 CPU seconds, where a linear reader
# takes well under one), not a speed assertion.
CRAFTED = {
    "rerun verdict of repeated `( = `": "First rerun: unexpected result is reproducible within the tolerance "
    + "( = " * 250_000,
    "step, 50,000 spaces, a metric": ("step" + " " * 50_000 + "grad_norm: nan\n") * 20,
    "repeated check messages": "found NaN in local grad norm for bucket #0 in backward pass before data-parallel "
    "communication collective " * 9_000,
    "repeated `Unexpected result`": "Unexpected result nan (message=' " * 30_000,
    "repeated `Rank R, node N,`": "Rank 1, node n, device 1, " * 40_000,
    "repeated frames": 'File "a", line 1, in f ' * 40_000,
    # issue 41's readers: other stacks' evidence lines and metric lines
    "a dict of NaNs": "{" + "'loss': nan, " * 80_000 + "}",
    "`|` fields": "| loss nan " * 100_000,
    "a wrapped quoted key": "{'" + "a  -" * 250_000 + "': nan, 'b': 1}",
    "an anomaly warning's op": "Error detected in " + "a" * 1_000_000,
    "a wrapped `found inf during`": "found " + " " * 500_000 + "inf during" + " " * 500_000,
    "a sentence saying NaN": "loss " + "is " * 300_000 + "nan",
    "an error line naming NaN": "RuntimeError: " + "x" * 1_000_000 + " nan",
    "repeated overflow lines": "[deepspeed] OVERFLOW! Rank 0 Skipping step. " * 25_000,
    "repeated watchdog lines": "Watchdog caught collective operation timeout: WorkNCCL(" * 20_000,
    "Megatron's iteration fields": " iteration 1/ 2 |" * 60_000 + " loss scale: 1.0 | grad norm: nan |",
    # issue 41's second round: bars, tables, wrapped records, a terminal's wrap inside a word
    "progress bars on one line": "1/9 [00:01, loss=nan] " * 45_000,
    "a table's rule": "-- | " * 200_000,
    "a table's header and rule": "a | " * 100_000 + "\n" + "-- | " * 100_000 + "\n" + "1 | nan | " * 50_000,
    "wrapped record pieces": "a: nan |\n" * 30_000,  # 300 KB: quadratic would be 9e8 steps
    "spaces inside a word": "OVERFLOW! Attempted loss scal" + " " * 1_000_000 + "e: 8",
    "an anomaly tail": "x(" * 300_000 + "\n (Triggered internally at python_anomaly_mode.cpp:1.)",
    # issue 41's third round: named values anywhere, bars after a value, cut wordings, interleaved frames, a watch
    "printed tensors": "loss tensor(nan, " * 60_000,
    "tensor wrappers before a NaN": "tensor([" * 120_000 + "nan",
    "spaces before a named NaN": "loss" + " " * 1_000_000 + "nan",
    "words before a NaN": "a " * 500_000 + "nan",
    "a value before many bar rules": "loss nan" + " |" * 400_000 + " 1/9 [00:01<00:02]",
    "bar descriptions": "Loss: nan:   0%|" * 60_000 + "| 2/9 [00:01",
    "glued statements": ")    self.f(" * 90_000,
    "glued frames": 'x File "a.py", line 1, in f ' * 30_000,
    "a cut watchdog line": "Watchdog caught " * 60_000,
    "cut overflow lines": "OVERFLOW! Rank 0 Sk" * 50_000,
    "a watched gradient norm": "{'loss': 1.0, 'grad_norm': nan, 'epoch': 1}\n" + "grad_norm grad_norm\n" * 100_000,
    "time keys holding step": "time/step=1, " * 80_000 + "loss=nan",
    # issue 41's fifth round: OOM lines, DLLogger's loss scale, words saying infinite, bracketed steps, glued bars
    "repeated OOM lines": "OutOfMemoryError: CUDA out of memory. GPU 0 has a total capacity of " * 15_000,
    "repeated DLLogger scales": "DLL 2020 - PARAMETER loss_scale : " * 30_000,
    "words getting infinite": "get infinite " * 80_000 + "grad_norm",
    "bracketed steps": "[Step [Step 1 " * 80_000 + "loss: nan | grad_norm: nan",
    "epoch brackets": "Epoch: [0]  [ " * 80_000 + "0/9]  loss: 1 (1)  loss_scale: 2 (2)  grad_norm: inf (inf)",
    "glued bars after a dict": "{'loss': 1.0, 'grad_norm': nan}\n" + "| 20/99 [00:01<00:02]x" * 40_000,
    # issue 41's rounds 6 to 9 (launch/glued.py ... launch/line_shapes.py): a class of line for each new reader
    "an error glued after a frame's code": "main(args)" * 100_000 + "RuntimeError: nan",
    "a message glued after a record": "{| Epoch: 1/2 (3/8) |" * 50_000 + "}grad_norm was NaN!",
    "an epoch counter of many digits": "epoch: " + "9" * 1_000_000 + " loss: nan",
    "epoch counters one a line": "".join(f"epoch: {i} loss: 0.1\n" for i in range(40_000)) + "epoch: 40000 loss: nan",
    "named arrays of brackets": "Global Step : 1, " + "[" * 1_000_000 + " : [nan]",
    "a named array of many names": "Global Step : 1, [1, 1] [" + "L, " * 150_000 + "L] : [" + " nan" * 150_001 + "]",
    "loop counters": "Epoch:[0/2](7/2) " * 60_000 + "loss:nan",
    "counters before a spaced name": "0 epoch,  1  batch, A " * 45_000 + "Loss: nan",
    "a counter's line before a metric's": "Epoch    :  8\n" + " " * 1_000_000 + "LOSS     :  nan",
    "TerminateOnNaN's words": "Batch 3: Invalid loss, " * 45_000 + "terminating training",
    "a JSON message of escapes": '{"message": "' + '\\"' * 500_000 + ' NaN"}',
    "JSON message openings": '{"message": "' * 80_000 + 'NaN"}',
    "a logger table's rule": "-" * 1_000_000 + "\n| a | nan |\n" + "-" * 30,
    "a logger table's cells": "-" * 30 + "\n" + "| a " * 250_000 + "| nan |\n" + "-" * 30,
    "an error naming many values": "ValueError: " + "a=1, " * 200_000 + "b=nan",
    "a distribution's parentheses": "ValueError: Expected parameter " + "(" * 1_000_000,
    "a named tensor's brackets": " t: tensor(" + "[" * 1_000_000 + "inf",
    "loop lines of many digits": "INFO iteration " + "9" * 1_000_000 + "\nValueError: loss=nan",
    "a Trainer bar of blocks": "{'loss': nan}\n  1%|" + "\u2588" * 1_000_000 + "| 2/300 [00:03<09:24]x",
    "Marian's fields": "Ep. 1 : Up. 300 : " * 55_000 + "Cost nan",
    "bracketed step fields": "[step] 1 " * 110_000 + "[Loss] nan",
    "a bare step of many digits": "[" + "5" * 1_000_000 + "] loss nan",
    "meter averages": "loss: 2.1 (1) " * 70_000 + "g: 1 (nan)",
    "a step column": "76980 " * 160_000 + "nan",
    # issue 41's rounds 16 and 17
    "sampling asserts under pasted code": (
        "    x = ppo_trainer.generate(q,\n" * 7 + "RuntimeError: probability tensor "
        "contains either inf, nan or element < 0\n"
    )
    * 8_000,
    "verl skips under tagged lines": (
        "[Global Step: 20] Update Actor Ends ...\n" * 4 + " WARN: rank 0 grad_norm is not finite: inf\n"
    )
    * 10_000,
    "a Lightning bar's epochs": "Epoch 1: " * 100_000 + " 1%| | 23/4360 [00:32<1:43:33, loss=nan, v_num=0]",
    "JSON float refusals": "Out of range float values are not JSON compliant: " * 40_000 + "nan",
    "a wrapped distribution's head": (
        "ValueError: Expected parameter logits (Tensor of shape (2, 2)) of distribution "
        "Categorical(logits: "
        * 3
        + "\ntorch.Size([2])) to satisfy the constraint "
        + "Real(), " * 100_000
        + "but found invalid values:\n"
    )
    * 10,
    "printed loss scales": "| epoch 1 | num_updates 5 | loss_scale 0.000 " * 60_000 + "\n",
    "debugger prompts": ("(Pdb++) " + "rewards_j" * 20_000 + "\ntensor([[nan]], device='cuda:0')\n") * 10,
    "Trainer losses falling to 0.0": "{'loss': 1.5, 'loss': 0.0, 'epoch': " * 60_000 + "\n",
    "Trainer losses on one line": "{'loss': 1.5, 'epoch': 0.1} " * 100_000 + "\n",
    "iteration prefixes before a message": "iteration 1: " * 50_000 + "found NaN in local grad norm for bucket #0",
    "split words before a metric": "train " * 200_000 + "loss nan\n",
    "a message with a broken last word": "Rank 1: found NaN in local grad norm in backward pass " + "x " * 200_000,
    "function words before nan": "number of nan " * 100_000 + "\n",
    "wrapped raise forms": "Rank 1, node n, device 1,\n iteration 1: Unexpected result nan\n(message='x\n" * 20_000,
    "check flags set true": "GRAD_NaN " + "has_nan= " * 50_000 + "nan=True inf=False " * 20_000 + "\n",
    "a key-per-line record": "_step: 1\nkey: 0.5\n" * 20_000 + "loss: nan\n" + "kl: nan\n" * 20_000,
    "metric checks glued after a bar": " 1/9 [00:01<00:01, 1.0s/it]"
    + "Warning: Metric a is " * 50_000
    + "NaN/Inf: nan",
    "settings ending in a step's word": "Gradient accumulation " * 100_000 + "steps = 8 | loss: nan\n",
    "dicts between two bars": (" 0/20 [00:00<?, ?it/s]\n" + "{'loss': 0.0, 'grad_norm': nan}\n" * 5) * 2_000,
    "dicts opened and never closed": "{'loss': nan, 'grad_norm': 1.0, 'rewards/a\n" * 5_000,
    "pieces of a dict far below its head": "{'x': 1,\n" + "'loss': nan, 'kl': 0.1,\n" * 5_000 + "}\n",
    # issue 41's round 23: known code lines glued, a frame's lost head, anomaly mode's forward call, CheckNumerics'
    # words, names of several words
    "known code lines glued": "self.loss_scaler.update_scale(has_overflow)" * 40_000 + "\n" + "  x(" * 300_000,
    "known code lines spaced": "  self._take_model_step(lr_kwargs) " * 50_000 + "\n",
    "a frame's lost head": "**" + "a/" * 500_000 + 'b.py", line 1, in f**\n' + '", line 1, in ' * 100_000,
    "anomaly forward calls": "Error detected in A. Traceback of forward call that caused the error:\n"
    + 'x.py", line 1, in f\n    ...\n' * 40_000
    + "RuntimeError: Function 'A' returned nan values in its 0th output.\n",
    "CheckNumerics words": "InvalidArgumentError: nan" + " : Tensor had " * 80_000 + "NaN values\n",
    "names of several words": "Ab Cd: nan " * 100_000 + "\n" + "a " * 300_000 + "b: nan c: nan\n",
    "one overflow from many processes": "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2.0, "
    "reducing to 1.0\n" * 5_000,
    "a record under a banner of dashes": "-" * 200_000 + " Iteration #5 " + "-" * 200_000 + "\nKL: nan\n" * 2_000,
    "arrays of NumPy's repr": "Losses: [" + "array([1.0, 2.0], dtype=float32), " * 50_000 + "array([nan])]\n",
    "a name of many words alone on its line": ("Average Episodic " * 100_000 + "Return: nan\n") * 3,
    "a dict printed a key a line, never closed": "{\n" + "    'a': 1,\n" * 20_000 + "    'grad_norm': nan,\n" * 500,
    "iters beside steps": "iter 16 step 1: loss nan, " * 20_000 + "\n",
    "a row of bare values": ("2024-05-27 12:23:01,982 " + "---- " * 100_000 + "nan nan\n") * 2,
    "dotted exception paths": "a." * 200_000 + "ValueError: loss is nan\n",
    "grad scale warnings": "Grad scale is small: " * 100_000 + "1e-20\n" + "Grad scale is small: 0.0\n" * 5_000,
    "lines of many ranks at one step": "Batch 7/100 loss nan grad_norm nan rank 2\n" * 5_000,
    # issue 41's round 23: a scaler's printed initial scale, Megatron's loss scale column, DeepSpeed's engine's logger
    # beside Megatron's lines, overflow lines far before a grad norm
    "config prints before an init_scale": "dynamic_loss_scale_args ...... {" * 30_000 + "'init_scale': 256}",
    "initial_scale_power keys": '"initial_scale_power": ' * 40_000 + "8",
    "Megatron lines whose loss scale falls": "".join(
        f" iteration {i:8d}/  100000 | consumed samples: {i:12d} | lm loss: 2.000000E+00 | loss scale: "
        f"{2.0 ** (i % 3):.1f} | grad norm: 1.000 | number of skipped iterations:   0 | number of nan iterations: 0 |\n"
        for i in range(1, 6_000)
    ),
    "logger brackets beside Megatron's lines": " iteration 1/ 2 | consumed samples: 1 | lm loss: 1.0 | loss scale: 1.0 "
    "|\n" + "] [a.py:1:" * 100_000 + "\n",
    "overflow lines far before a grad norm": "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, "
    "reducing to 1\n" * 12_000 + "{'grad_norm': 1.0, 'loss': 1.0}\n",
    "elastic agent words": "failed (exitcode: 1) local_rank: " * 40_000 + "1 (pid: 2",
    "Root Cause headers and rank keys": "Root Cause (first observed failure):" + " rank      : 9 (local_rank:" * 40_000,
    "overflow probes far apart": "".join(
        f" 1%| {i * 200}/99999 [00:01<00:01, 1.0s/it][deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss "
        "scale: 131072, reducing to 65536\n"
        for i in range(1, 6_000)
    ),
    # issue 41's round 26: a group's name before its pairs, TRL's None log-prob under its sampling line
    "group heads and open brackets": "Reward: " * 30_000 + "mean=nan, " * 30_000 + "a[b=nan, " * 30_000,
    "caret lines before None errors": ("[rank0]:" + " " * 300 + "^~" * 1_000 + "\nCould not infer dtype of NoneType\n")
    * 400,
    "skip and log2-scale words": "The grad norm is nan. " * 20_000
    + "Skipping updating the model" * 5_000
    + "Found NaN, decreased lg_loss_scale to 1" * 20_000,
    "captions over indented lines": "at step 6 " * 20_000 + "step 6:\n" + "  a: 1\n" * 20_000 + "  b: mean=nan\n",
    "None errors under sampling lines": "sampling_per_token_logps = [torch.tensor(" * 20_000 + "\nRuntimeError: Could "
    "not infer dtype of NoneType\n" + "Could not infer dtype of NoneType" * 20_000,
}


# hang checks, not speeds (seconds for the largest on 2 cores): CI's slow tier; the fast tier keeps one linear-time
# check of the error line's reader (tests/launch/test_tracebacks.py)
@pytest.mark.slow
@pytest.mark.parametrize("text", list(CRAFTED.values()), ids=list(CRAFTED))
def test_each_reader_of_a_line_is_linear(text):
    start = time.process_time()
    found = logs.scan([text.encode() + b"\n"], "crafted")
    try:
        parse_traceback(text)
    except ValueError:
        pass
    assert time.process_time() - start < 10, "a reader is not linear on this line"
    assert found is None or len(found.context) < 100_000


# issue 41's rounds 6 to 9 quote a piece of each of these lines: a metric's name, a table's key, an error's words;
# ESC c, an OSC 52 clipboard write, 8-bit CSI, OSC and ST, a CSI erase, NEL (complete sequences: a name with a bare
# ESC or an unfinished CSI in it is no name these readers take, and the log is refused; a named array takes no name
# with a control in it)
QUOTED_ESCAPES = "\x1bc" + "\x1b]52;c;SGVsbG8=\x07" + "\x9b31m\x9d0;x\x9c" + "\x1b[2J\x85"
QUOTED = {
    "a Trainer dict's key": "{'loss': 0.0, 'grad_%snorm': nan, 'epoch': 2.0}",
    "a spaced name after counters": "0 epoch,  153  batch, Discrim%sinator  Loss:  nan",
    "a logger table's key": "-----------------\n| approx%skl | nan |\n| n_updates | 30 |\n-----------------",
    "an error's named value": "ValueError: loss=nan, policy%s_loss=nan",
    "a warning's words": "/data/imagination.py:49: UserWarning: NaN in %ssampled next states!",
    "a JSON record's message": '{"simapp_exception": {"message": "NaN %s detected in loss function, aborting training."}}',
    "Marian's field": "[2020-05-04 10:11:00] Ep. 1 : Up. 300 : Sen. 76,800 : Co%sst nan : Time 60.00s",
    "rsl-rl's block": " Learning iteration 121/1500\n Value %sfunction loss: inf",
}


@pytest.mark.parametrize("line", list(QUOTED.values()), ids=list(QUOTED))
def test_no_control_character_of_a_quoted_piece_reaches_the_terminal_or_the_page(line, tmp_path, capsys):
    log = tmp_path / "esc.log"
    log.write_text(line.replace("%s", QUOTED_ESCAPES) + "\n", encoding="utf-8")
    out, page = tmp_path / "d.json", tmp_path / "d.html"
    assert main(["doctor", "--traceback", str(log), "--json", str(out), "--html", str(page)]) == 0
    terminal = capsys.readouterr().out
    assert (_controls(terminal), _controls(page.read_text(encoding="utf-8"))) == (set(), set())
    assert "\\u001bc" in out.read_text(encoding="utf-8")  # the JSON stays faithful
    assert _controls(out.read_text(encoding="utf-8")) == set()  # every one a \\u escape in the file

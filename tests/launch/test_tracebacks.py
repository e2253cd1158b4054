"""Traceback parsing: the Megatron error line, NaN vs Inf, bucket, frames annotated against releases."""

import time
from pathlib import Path

import pytest

from nanscope.errors import UserError
from nanscope.launch.tracebacks import explain_1f1b, explain_bucket, explain_iteration, parse_traceback

CASE = Path(__file__).resolve().parents[2] / "src" / "nanscope" / "cases" / "slime-795"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "launch"


def test_case_failure_line():
    f = parse_traceback((CASE / "traceback.txt").read_text()).failure
    assert (f.rank, f.node, f.device, f.iteration, f.result, f.kind, f.bucket) == (50, "dgx172", 2, -1, "nan", "NaN", 0)
    assert f.message.startswith("found NaN in local grad norm for bucket #0 in backward pass")


def test_case_frames_all_match_the_releases():
    tb = parse_traceback((CASE / "traceback.txt").read_text())
    # 6 driver/Ray frames, the Ray actor boundary, 3 slime frames, 7 megatron-core frames
    assert len(tb.frames) == 17
    assert [fr.function for fr in tb.frames[-4:]] == [
        "finish_grad_sync",
        "start_grad_sync",
        "check_grads",
        "validate_result",
    ]
    checked = [fr for fr in tb.frames if fr.matches is not None]
    assert len(checked) == 12 and all(fr.matches for fr in checked)  # 2 train.py + 3 slime + 7 megatron
    assert tb.frames[6].path == "<ray actor>" and "ip=172.27.6.172" in tb.frames[6].note
    assert tb.ray_ip == "172.27.6.172"
    assert tb.frames[-1].release_text == "matches megatron-core 0.15.0rc0 rerun_state_machine.py:505"
    assert tb.frames[7].release_text == "matches slime v0.1.0 actor.py:258"
    assert tb.frames[2].release_text == "ray (line not checked)"


def test_bare_traceback_inf_unknown_frame_and_line_mismatch():
    tb = parse_traceback((FIXTURES / "vpp_traceback.txt").read_text())
    f = tb.failure
    assert (f.rank, f.kind, f.bucket, f.result) == (7, "Inf", 1, "inf")
    unknown = tb.frames[1]
    assert unknown.known is None and unknown.function == "wrapped"
    assert unknown.note.startswith("unknown frame")
    assert tb.frames[3].matches is True  # schedules.py:1787, interleaved schedule
    assert tb.frames[4].matches is False  # rerun_state_machine.py:507 is not 0.15.0rc0's 505
    assert tb.frames[4].release_text == "differs from megatron-core 0.15.0rc0 rerun_state_machine.py:505"


def test_error_line_found_inside_other_text():
    text = (
        "2025-01-01 INFO ... (MegatronTrainRayActor pid=1) Rank 3, node n1, device 3, iteration 12: "
        "Unexpected result tensor(nan, device='cuda:3') (message='found NaN in local grad norm for bucket #2 ...')"
    )
    tb = parse_traceback(text)
    assert (tb.failure.rank, tb.failure.iteration, tb.failure.kind, tb.failure.bucket) == (3, 12, "NaN", 2)
    assert tb.frames == [] and tb.other_ranks == []
    later = text.replace("Rank 3,", "Rank 7,").replace("device 3", "device 7")
    assert parse_traceback(text + "\n" + later + "\n" + text).other_ranks == [7]


def test_no_megatron_error_is_a_user_error():
    with pytest.raises(UserError, match=r"no_megatron_error\.txt: no Megatron error found"):
        parse_traceback((FIXTURES / "no_megatron_error.txt").read_text(), "no_megatron_error.txt")


def test_explanations():
    assert explain_iteration(-1).startswith("iteration -1: Megatron's RerunStateMachine starts its counter at -1")
    assert explain_bucket(0, 3).endswith(
        "on a PP stage > 0 Megatron turns bucketing off, so each gradient buffer "
        "is a single bucket: the check covered the gradients of all of this rank's dense parameters that train "
        "(under LoRA, its adapters; expert parameters are a separate buffer, checked after)."
    )
    assert "overlap-grad-reduce off" in explain_bucket(0, 0) and "turns bucketing off" not in explain_bucket(0, 0, True)
    assert explain_bucket(1, 3).startswith("bucket #1: a bucket group with several buckets")
    assert explain_bucket(None, 3) == ""
    assert explain_1f1b(4, 3).startswith("PP 3 is the last stage: in 1F1B the last stage (PP 3) holds the loss")
    assert explain_1f1b(4, 1).startswith("PP 1 is not the last stage (PP 3)")


def test_cut_before_closing_quote_is_parsed_and_marked_truncated():
    text = (CASE / "traceback.txt").read_text().rstrip()
    assert text.endswith("collective')")
    f = parse_traceback(text[:-2]).failure
    assert (f.rank, f.node, f.device, f.iteration, f.kind, f.bucket, f.truncated, f.line) == (
        50,
        "dgx172",
        2,
        -1,
        "NaN",
        0,
        True,
        42,
    )
    assert f.message.endswith("communication collective")
    assert parse_traceback(text).failure.truncated is False
    # cut inside the result: the rank is still there, the message is empty
    cut = parse_traceback("Rank 3, node n1, device 3, iteration 12: Unexpected result na").failure
    assert (cut.rank, cut.result, cut.message, cut.truncated) == (3, "na", "", True)


def test_other_megatron_log_lines_with_the_same_prefix_are_not_failures():
    text = "Rank 3, node n1, device 3, iteration 12: Rerunning the step\n"
    read = parse_traceback(text)  # round 4: readable text is read, with nothing in it (no longer a UserError)
    assert (read.failure, read.frames, read.lines) == (None, [], 1)


@pytest.mark.parametrize(
    "line",
    [
        "Rank 1, node a, device 1, iteration 1: Unexpected result (message='",  # the probe: cubic before
        "Rank 1, node a, device 1, iteration 1: Unexpected result x (message='y') ",  # many complete errors
        "Rank 1, node ",  # a node name that never ends
        "RayTaskError(E): ray::a() (",
        '  File "x", line 1, in f ',
    ],
)
def test_a_1mb_adversarial_line_parses_in_linear_time(line):
    text = line * (1_000_000 // len(line))
    start = time.process_time()  # CPU time: a loaded machine does not fail it
    try:
        parse_traceback(text)
    except UserError:
        pass
    assert time.process_time() - start < 10  # a hang check (cubic took minutes), not a speed: linear is well under 1


def test_a_number_no_megatron_prints_is_one_user_error():
    text = "Rank " + "1" * 5000 + ", node a, device 1, iteration -1: Unexpected result nan (message='x')\n"
    with pytest.raises(UserError, match=r"^tb\.txt: line 1: the rank has 5000 digits, more than Megatron ever prints"):
        parse_traceback(text, "tb.txt")


def test_a_train_py_of_a_job_no_framework_names_is_not_slime_s_without_slime_beside_it():
    """SpeechBrain's recipe train.py (holdout10 03-speechbrain-1462's shape) was said to differ from slime v0.1.0's
    train.py:89, "entry point: parses slime's arguments"; slime's own train.py beside a Ray boundary still is."""
    tb = parse_traceback(
        "Traceback (most recent call last):\n"
        '  File "/srv/speechbrain/recipes/LibriSpeech/LM/train.py", line 208, in <module>\n'
        "    lm_brain.fit(\n"
        '  File "/srv/speechbrain/speechbrain/core.py", line 1129, in fit\n'
        "    self.check_gradients(loss)\n"
        "ValueError: Loss is not finite and patience is exhausted. To debug, wrap `fit()` with autograd's "
        "`detect_anomaly()`, e.g.\n"
    )
    assert tb.framework.name == "unknown"
    assert [(frame.path.rsplit("/", 1)[-1], frame.known, frame.release_text) for frame in tb.frames] == [
        ("train.py", None, "-"),
        ("core.py", None, "-"),
    ]
    case = parse_traceback((CASE / "traceback.txt").read_text())
    assert case.frames[0].release_text == "matches slime v0.1.0 train.py:89"

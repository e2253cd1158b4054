"""Traceback parsing: the Megatron error line, NaN vs Inf, bucket, frames annotated against releases."""

from pathlib import Path

import pytest

from nanscope.errors import UserError
from nanscope.launch.tracebacks import explain_1f1b, explain_bucket, explain_iteration, parse_traceback

CASE = Path(__file__).resolve().parents[2] / "src" / "nanscope" / "cases" / "slime-795"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "launch"


def test_case_failure_line():
    f = parse_traceback((CASE / "traceback.txt").read_text()).failure
    assert (f.rank, f.node, f.device, f.iteration, f.result, f.kind, f.bucket) == (
        50, "dgx172", 2, -1, "nan", "NaN", 0)
    assert f.message.startswith("found NaN in local grad norm for bucket #0 in backward pass")


def test_case_frames_all_match_the_releases():
    tb = parse_traceback((CASE / "traceback.txt").read_text())
    # 6 driver/Ray frames, the Ray actor boundary, 3 slime frames, 7 megatron-core frames
    assert len(tb.frames) == 17
    assert [fr.function for fr in tb.frames[-4:]] == ["finish_grad_sync", "start_grad_sync", "check_grads",
                                                       "validate_result"]
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
    text = "2025-01-01 INFO ... (MegatronTrainRayActor pid=1) Rank 3, node n1, device 3, iteration 12: " \
           "Unexpected result tensor(nan, device='cuda:3') (message='found NaN in local grad norm for bucket #2 ...')"
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
    assert explain_bucket(0, 3).endswith("on a PP stage > 0 Megatron turns bucketing off, so each gradient buffer "
                                         "is a single bucket: the check covered all of this rank's dense parameters "
                                         "(expert parameters are a separate buffer, checked after).")
    assert "overlap-grad-reduce off" in explain_bucket(0, 0) and "turns bucketing off" not in explain_bucket(0, 0, True)
    assert explain_bucket(1, 3).startswith("bucket #1: a bucket group with several buckets")
    assert explain_bucket(None, 3) == ""
    assert explain_1f1b(4, 3).startswith("PP 3 is the last stage: in 1F1B the last stage (PP 3) holds the loss")
    assert explain_1f1b(4, 1).startswith("PP 1 is not the last stage (PP 3)")

"""A log read as a stream (launch.logs): colour codes, Ray's prefixes, pieces of long lines, the traceback that
ends at the first error, and every Megatron check's message told apart (facts.megatron.CHECKS)."""

import pytest

from nanscope.errors import UserError
from nanscope.facts.megatron import CHECKS, check_of
from nanscope.launch import logs
from nanscope.launch.tracebacks import parse_traceback

ERROR = "Rank 3, node n1, device 3, iteration 12: Unexpected result {result} (message='{message}')"


def _error(message: str, result: str = "nan") -> str:
    return ERROR.format(result=result, message=message)


@pytest.mark.parametrize(
    ("message", "check", "kind"),
    [
        ("found NaN in local grad norm for bucket #3 in backward pass before data-parallel communication collective",
         "grad-norm-nan", "NaN"),
        ("found Inf in local grad norm for bucket #0 in backward pass before data-parallel communication collective",
         "grad-norm-inf", "Inf"),
        ("found unexpected large grads in bucket #1 in backward pass before data-parallel communication collective",
         "large-grads", "large"),
        ("found NaN in local forward loss calculation", "forward-loss-nan", "NaN"),
        ("found Inf in local forward loss calculation", "forward-loss-inf", "Inf"),
        ("Spiky loss", "spiky-loss", "large"),
        ("loss is NaN", None, "NaN"),  # a job's own validate_result call
    ],
)  # fmt: skip
def test_each_message_names_its_check(message, check, kind):
    failure = parse_traceback(_error(message)).failure
    assert (None if failure.check is None else failure.check.id, failure.kind) == (check, kind)


def test_the_messages_are_megatrons_own():
    """The texts as megatron-core 0.15.0rc0 and Megatron-LM's pretrain_gpt.py write them (/tmp/notes facts, §4)."""
    assert [check.message for check in CHECKS] == [
        "found NaN in local grad norm for bucket #{bucket} in backward pass before data-parallel communication "
        "collective",
        "found Inf in local grad norm for bucket #{bucket} in backward pass before data-parallel communication "
        "collective",
        "found unexpected large grads in bucket #{bucket} in backward pass before data-parallel communication "
        "collective",
        "found NaN in local forward loss calculation",
        "found Inf in local forward loss calculation",
        "Spiky loss",
        "found NaN in local grad norm in backwards pass",  # Megatron-LM's clip_grads.py, core 0.4 and 0.5
    ]
    assert [check.slime for check in CHECKS] == [True, True, True, False, False, False, False]
    # cut short: a long enough start of a message still names it
    assert check_of("found unexpected large grads in bucket #0 in back", truncated=True).id == "large-grads"
    assert check_of("found unexpected large grads in bucket #0 in back") is None


def test_prefixes_colours_and_crlf_around_the_traceback():
    lines = [
        "noise before the traceback",
        "Traceback (most recent call last):",
        "an older traceback's last line",
        "\x1b[36m(MegatronTrainRayActor pid=7, ip=10.0.0.2)\x1b[0m Traceback (most recent call last):",
        '\x1b[36m(MegatronTrainRayActor pid=7, ip=10.0.0.2)\x1b[0m   File "/x/megatron/core/rerun_state_machine.py", '
        "line 505, in validate_result",
        "\x1b[36m(MegatronTrainRayActor pid=7, ip=10.0.0.2)\x1b[0m     raise RuntimeError(full_message)",
        "\x1b[36m(MegatronTrainRayActor pid=7, ip=10.0.0.2)\x1b[0m RuntimeError: "
        + _error("found NaN in local forward loss calculation").replace("Rank 3,", "Rank \x1b[1m3\x1b[0m,"),
        _error("x").replace("Rank 3", "Rank 9") + " [repeated 7x across cluster]",
    ]
    found = logs.scan(["\r\n".join(lines).encode()[i : i + 5] for i in range(0, 2000, 5)], "tb")  # 5-byte chunks
    assert (found.failure.rank, found.failure.line, found.failure.check.id, found.others) == (
        3,
        7,
        "forward-loss-nan",
        [9],
    )
    assert found.context[0] == "Traceback (most recent call last):" and len(found.context) == 4  # the last one
    tb = parse_traceback("\n".join(lines))
    assert [(frame.function, frame.line, frame.release_text) for frame in tb.frames] == [
        ("validate_result", 505, "matches megatron-core 0.15.0rc0 rerun_state_machine.py:505")
    ]


def test_a_line_longer_than_a_piece_is_read_in_pieces(monkeypatch):
    monkeypatch.setattr(logs, "MAX_LINE", 64)
    monkeypatch.setattr(logs, "CONTEXT", 64)
    text = ("x" * 1000 + "\n") * 3 + _error("found Inf in local forward loss calculation") + "\n" + "y" * 5000
    found = logs.scan([text.encode()[i : i + 100] for i in range(0, len(text), 100)], "tb")
    assert (found.failure.line, found.failure.kind, found.failure.truncated) == (4, "Inf", False)
    # cut short at the end of the log, inside "Unexpected result": still the error, marked truncated
    cut = logs.scan([b"log\nRank 5, node n, device 1, iteration 2: Unexp"], "tb").failure
    assert (cut.rank, cut.line, cut.truncated) == (5, 2, True)


def test_no_error_and_an_impossible_number_are_one_user_error(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("Rank 1 is fine\n" * 1000)
    from nanscope.launch.tracebacks import read_traceback

    read = read_traceback(str(log))  # round 4: readable text is read, with nothing in it (no longer a UserError)
    assert (read.failure, read.frames, read.lines) == (None, [], 1000)
    log.write_text(_error("x").replace("Rank 3", "Rank " + "1" * 30))
    with pytest.raises(UserError, match=r"job\.log: line 1: the rank has 30 digits"):
        logs.read_log(str(log))

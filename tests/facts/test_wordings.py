"""Every line Megatron has printed for its NaN checks, core 0.4 to main (facts.wordings): a synthetic line of each
form, message and release is read back whole, with or without its prefix and quotes, behind log prefixes, and cut
at any point; the rerun verdicts too.

Where Megatron-LM's sources are at hand, each release's own f-string is rendered and must equal the template:

    NANSCOPE_TEST_MEGATRON_LM_GIT=/path/to/Megatron-LM/.git   # a clone with the core_vX.Y.Z tags and main
    NANSCOPE_TEST_MEGATRON_LM=../shared/megatron-lm           # or one checkout per tag: core_v0.15.0rc0/megatron/...

Without either, the checkouts CI has beside the repository (../shared/megatron-lm: the case's 0.15.0rc0) are read;
the releases no source is at hand for are one skip, not one per text.
"""

import ast
import os
import subprocess
from pathlib import Path

import pytest

from nanscope.facts import wordings
from nanscope.facts.megatron import BUCKETLESS_NAN, BY_ID, CLIP_NONFINITE
from nanscope.launch.failure import failures
from nanscope.launch.rerun import line_verdict
from tests import checkouts

GIT = os.environ.get("NANSCOPE_TEST_MEGATRON_LM_GIT")
CHECKOUTS = os.environ.get("NANSCOPE_TEST_MEGATRON_LM") or str(checkouts.SHARED / "megatron-lm")
MESSAGE = BY_ID["grad-norm-nan"].message.replace("{bucket}", "0")
FILE = "/opt/Megatron-LM/megatron/core/distributed/param_and_grad_buffer.py"
TS = "2025-08-30 12:01:02.123456"
# A value for each expression the f-strings interpolate, by its source text (what the templates' names stand for).
EXPRESSIONS = {
    "rank": 50, "_safe_get_rank()": 50, "safe_get_rank()": 50, "global_rank": 50,
    "node": "dgx172", "os.uname()[1]": "dgx172",
    "device": 2, "torch.cuda.current_device()": 2,
    "self.current_iteration": -1, "self.current_iteration + 1": -1,
    "result": "nan", "self.initial_result": "nan", "i": 0,
    "validation_call.caller.filename": FILE, "validation_call.caller.lineno": 188, "validation_call.sequence": 2,
    "datetime.datetime.now()": TS, "os.getenv('SLURM_JOBID', 'N/A')": "4242", "status": "rerun_disabled",
}  # fmt: skip
NEW = set(wordings.RELEASES[wordings.RELEASES.index("0.16.0") :])  # log_failure with the iteration, "invocation"


def _template(key: str, release: str, message: str = MESSAGE) -> str:
    """What facts.wordings says the text `key` of `release` renders to, with EXPRESSIONS' values."""
    values = dict(rank=50, node="dgx172", device=2, iteration=-1, result="nan", initial="nan", message=message)
    values |= dict(file=FILE, lineno=188, invocation=2, ts=TS, job="4242", status="rerun_disabled")
    values["spelling"] = "invocation" if release in NEW else "invokation"
    messages = {
        "clip-grad-norm-nan": wordings.ASSERT.format(**{**values, "message": CLIP_NONFINITE}),
        "grad-norm-nan-assert": wordings.ASSERT.format(**{**values, "message": BUCKETLESS_NAN}),
        "forward-loss-nan-assert": wordings.ASSERT.format(**{**values, "message": BY_ID["forward-loss-nan"].message}),
        "raise": wordings.RAISE.format(**values),
        "log-at-file": wordings.LOG_AT_FILE.format(**values),
        "log-on-rank": wordings.LOG_ON_RANK.format(**values),
        "tracker": wordings.TRACKER.format(**values),
        "first-not": wordings.FIRST_NOT.format(**values),
        "first-yes": wordings.FIRST_YES.format(**values) + ("." if release in NEW else ""),
        "second-not": wordings.SECOND_NOT.format(**values),
        "second-yes": wordings.SECOND_YES.format(**values),
        "transient": wordings.TRANSIENT + "!",
        "persistent": wordings.PERSISTENT + "!",
        "correct": wordings.CORRECT.format(**values),
        "log-failure-old": wordings.FAILURE_OLD.format(**values, what=message),
        "log-failure-new": wordings.FAILURE_NEW.format(**values, what=message),
    }
    if key in messages:
        return messages[key]
    return BY_ID[key].message.replace("{bucket}", "0")


def _source(release: str, path: str) -> str | None:
    tag = "main" if release == "main" else f"core_v{release}"
    if GIT:
        done = subprocess.run(["git", "--git-dir", GIT, "show", f"{tag}:{path}"], capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else None
    if CHECKOUTS and (Path(CHECKOUTS) / tag / path).is_file():
        return (Path(CHECKOUTS) / tag / path).read_text()
    return None


def _render(lines: list[str]) -> str:
    """The string the f-string lines make with EXPRESSIONS' values (a `message=` keyword, a call around it ok)."""
    text = " ".join(line.strip().removeprefix("message=").rstrip(",") for line in lines)
    try:
        tree = ast.parse(f"({text})", mode="eval")
    except SyntaxError:
        tree = ast.parse(text.rstrip(")") + ")" * (text.count("(") - text.count(")")))
    strings = [node for node in ast.walk(tree) if isinstance(node, (ast.JoinedStr, ast.Constant))]
    out = []
    for piece in strings[0].values if isinstance(strings[0], ast.JoinedStr) else [strings[0]]:
        out.append(str(piece.value) if isinstance(piece, ast.Constant) else str(EXPRESSIONS[ast.unparse(piece.value)]))
    return "".join(out).removesuffix("\n")  # the tracker's f.write adds its own newline (core 0.18 on)


CASES = [(key, release) for key in wordings.SOURCES for release in wordings.spans(key)]
AT_HAND = [(key, release) for key, release in CASES if _source(release, wordings.SOURCES[key][0]) is not None]
NO_SOURCE = sorted({release for _, release in CASES} - {release for _, release in AT_HAND})


@pytest.mark.parametrize(("key", "release"), AT_HAND, ids=[f"{k}@{r}" for k, r in AT_HAND])
def test_each_release_prints_the_text_the_table_says(key, release):
    path = wordings.SOURCES[key][0]
    source = _source(release, path)
    first, last = wordings.spans(key)[release]
    lines = source.splitlines()[first - 1 : last]
    message = f"message {key}" if key in ("log-failure-old", "log-failure-new") else MESSAGE
    EXPRESSIONS["message"] = message
    assert _render(lines) == _template(key, release, message)


@pytest.mark.skipif(not NO_SOURCE, reason="every release's source is at hand")
def test_the_releases_without_a_source_at_hand_are_named():
    pytest.skip(
        f"no Megatron-LM source (NANSCOPE_TEST_MEGATRON_LM_GIT or NANSCOPE_TEST_MEGATRON_LM) for {', '.join(NO_SOURCE)}"
    )


# ---- synthetic lines of every form, read back ------------------------------------------------------------------

MESSAGES = [(check.id, check.message) for check in BY_ID.values() if check.id != "clip-grad-norm-nan"]
RAISED = [
    (form, release, check, message)
    for form in ("raise", "log-at-file", "log-on-rank", "tracker")
    for release in wordings.spans(form)
    for check, message in MESSAGES
    if check in wordings.SOURCES and release in wordings.spans(check)
]
PREFIXES = [
    "",
    "RuntimeError: ",
    "[rank50]: RuntimeError: ",
    "(MegatronTrainRayActor pid=2526545, ip=172.27.6.172) ",
    "i.pretrain/0 [default2]:[rank50]: ",
    "ERROR:megatron.core.rerun_state_machine:",
    "[2025-08-30 12:01:02] \x1b[31mERROR\x1b[0m ",
]


STATED = {  # what each form says of the failing rank
    "raise": ("rank", "node", "device", "iteration"),
    "log-at-file": ("iteration",),
    "log-on-rank": ("rank", "iteration"),
    "tracker": ("rank", "node", "device", "iteration"),
}


def _line(form: str, release: str, message: str) -> str:
    values = dict(
        rank=50, node="dgx172", device=2, iteration=-1, result="nan", message=message.replace("{bucket}", "3")
    )
    values |= dict(file=FILE, lineno=188, invocation=2, ts=TS, job="4242", status="rerun_disabled")
    values["spelling"] = "invocation" if release in NEW else "invokation"
    return getattr(wordings, form.upper().replace("-", "_")).format(**values)


@pytest.mark.parametrize(("form", "release", "check", "message"), RAISED)
def test_every_form_of_every_release_is_read_back(form, release, check, message):
    line = _line(form, release, message)
    for prefix in PREFIXES:
        (failure,) = failures(prefix + line)
        stated = STATED[form]
        want = {"rank": 50, "node": "dgx172", "device": 2, "iteration": -1}
        assert {key: getattr(failure, key) for key in stated} == {key: want[key] for key in stated}, prefix
        assert (failure.format, failure.check.id, failure.truncated) == (form, check, False)
        assert failure.bucket == (3 if "{bucket}" in message else None)
        assert release in failure.releases and failure.kind == BY_ID[check].value
        if "[rank50]" in prefix:  # the log prefix names the rank where the form does not
            assert failure.rank == 50


ASSERTED = [
    ("clip-grad-norm-nan", CLIP_NONFINITE, ("0.4.0", "0.5.0")),
    ("grad-norm-nan", BUCKETLESS_NAN, ("0.6.0", "0.7.0", "0.8.0", "0.9.0")),
    ("forward-loss-nan", BY_ID["forward-loss-nan"].message, ("0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "0.9.0")),
]


@pytest.mark.parametrize(("check", "message", "releases"), ASSERTED)
def test_the_assertions_before_the_rerun_state_machine(check, message, releases):
    line = wordings.ASSERT.format(rank=11, message=message, device=3, node="worker-3")
    for prefix in ("", "AssertionError: ", "[rank11]: AssertionError: "):
        (failure,) = failures(prefix + line)
        assert (failure.format, failure.rank, failure.device, failure.node, failure.check.id) == (
            "assert",
            11,
            3,
            "worker-3",
            check,
        )
        assert failure.releases == releases and failure.bucket is None and failure.iteration is None


@pytest.mark.parametrize(("check", "message"), MESSAGES + [("clip-grad-norm-nan", CLIP_NONFINITE)])
def test_a_message_alone_with_or_without_quotes(check, message):
    text = message.replace("{bucket}", "0")
    texts = [f"(message='{text}')", f"message='{text}'"]
    if check != "spiky-loss":  # `Spiky loss` alone is any text's: only Megatron's `message='...'` names the check
        texts += [text, f"'{text}'", f'"{text}"', f"`{text}`", f"title: {text}'"]
    for quoted in texts:
        found = list(failures(quoted))
        assert [(f.format, f.check.id, f.truncated) for f in found] == [("message", check, False)], quoted


def test_a_line_cut_at_any_point_is_read_as_far_as_it_goes():
    """Issue titles and pastes cut anywhere: never an error; the fields before the cut are read."""
    line = "RuntimeError: " + _line("raise", "0.15.0rc0", BY_ID["grad-norm-nan"].message)
    at_unexpected = line.index("Unexpected")
    for cut in range(len(line) + 1):
        found = list(failures(line[:cut]))
        if cut >= line.index("node dgx172,") + len("node dgx172,"):
            assert len(found) == 1 and found[0].rank == 50, line[:cut]
        if cut >= at_unexpected + len("Unexpected result nan (message='found NaN in local grad norm"):
            assert found[0].check.id == "grad-norm-nan" and found[0].kind == "NaN", line[:cut]
        if found and cut < len(line):
            assert found[0].truncated, line[:cut]
    message = BY_ID["large-grads"].message.replace("{bucket}", "1")
    for cut in range(24, len(message) + 1):
        (failure,) = failures(message[:cut])
        assert failure.check.id == "large-grads" and failure.truncated == (cut < len(message))


def test_a_cut_message_that_fits_two_checks_names_the_likelier_and_says_so():
    (failure,) = failures("found NaN in local grad norm in backward")
    assert (failure.check.id, failure.ambiguous) == ("grad-norm-nan", ["clip-grad-norm-nan"])
    # inside the raise form (core 0.12 on) only the bucket check prints it
    (failure,) = failures("Unexpected result nan (message='found NaN in local grad norm")
    assert (failure.check.id, failure.ambiguous, failure.releases[0]) == ("grad-norm-nan", [], "0.12.0")


@pytest.mark.parametrize("release", wordings.RELEASES[wordings.RELEASES.index("0.10.0") :])
def test_the_rerun_verdicts_of_every_release(release):
    values = dict(rank=3, node="n1", device=3, iteration=3, result="nan", initial="nan", message=MESSAGE)
    for key in ("first-not", "first-yes", "second-not", "second-yes"):
        text = _template(key, release)
        line = wordings.FAILURE_NEW.format(**values, what=text) if release in NEW and key.startswith("first") else text
        verdict = line_verdict("WARNING:megatron.core.rerun_state_machine:" + line, 7)
        assert (verdict.key, verdict.values) == (key, "nan != nan" if key.endswith("not") else "nan = nan")
        if release in NEW and key.startswith("first"):
            assert (verdict.rank, verdict.node, verdict.device, verdict.iteration) == (3, "n1", 3, 3)
    old = {"transient": "first-not", "persistent": "second-not", "correct": "second-yes"}
    for key, verdict_key in old.items():
        what = _template(key, release)
        template = wordings.FAILURE_NEW if release in NEW else wordings.FAILURE_OLD
        verdict = line_verdict(template.format(**values, what=what), 9)
        assert (verdict.key, verdict.rank, verdict.node, verdict.device) == (verdict_key, 3, "n1", 3)

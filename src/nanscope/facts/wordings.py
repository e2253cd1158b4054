"""Every line Megatron has printed for its NaN and Inf checks, from megatron-core 0.4 to main, and where each
release prints it.

A check's message (`facts.megatron.CHECKS`) reaches the log inside one of Megatron's forms (`FORMS`):

    raise        Rank R, node N, device D, iteration I: Unexpected result X (message='M')      core 0.12 on
                 (rerun mode disabled: RuntimeError; from 0.16 a non-fatal check only logs it as a warning)
    assert       Rank R: M. Device: D, node: N                                                 core 0.4 to 0.9
                 (AssertionError; M is the DDP buffer's, clip_grads' or pretrain_gpt's message)
    log-at-file  Unexpected result X at FILE line L, invokation #S at iteration #I (message='M')  core 0.10 to 0.13
    log-on-rank  Unexpected result X on rank R at iteration #I invokation #S (message='M')        core 0.14 on
                 ("invokation" to 0.15, "invocation" from 0.16; rerun mode enabled: logged, the step is rerun)
    tracker      ts=T node=N device=D jobID=J rank=R iteration=I status=S result=X message='M'  core 0.12 on
                 (--result-rejected-tracker-filename)
    message      M alone (an issue title, a quote)

and, when the rerun state machine is enabled, its verdict follows (`VERDICTS`): the first rerun on the same GPU,
then the second on another GPU, each reproducible or not, with `log_failure`'s `Rank R, node N, device D: ...!`
(0.10 to 0.15) or `Rank R, node N, device D, iteration #I: ...!` (0.16 on) around the conclusion.

`SOURCES` is where each text is, release by release: "<key>": "<release>:<first line>[-<last line>] ...", the
f-string's lines in that release's file (Megatron-LM's tags core_vX.Y.Z, and main at MAIN). The forms' templates
use str.format names; tests/facts/test_wordings.py renders each release's own f-string and compares.
"""

from __future__ import annotations

from dataclasses import dataclass

RELEASES = (
    "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "0.9.0", "0.10.0", "0.11.0", "0.12.0", "0.13.0", "0.14.0",
    "0.15.0rc0", "0.15.0", "0.16.0", "0.17.0", "0.18.0", "0.19.0", "main",
)  # fmt: skip
MAIN = "d98e8a64dd (2026-08-22)"  # Megatron-LM main as read for this table
TAG = "core_v{release}"  # Megatron-LM's tag of a release ("main" is the branch)

_BUFFER = "megatron/core/distributed/param_and_grad_buffer.py"
_MACHINE = "megatron/core/rerun_state_machine.py"
_CLIP = "megatron/optimizer/clip_grads.py"  # Megatron-LM's, before megatron/core/optimizer (0.4, 0.5)
_PRETRAIN = "pretrain_gpt.py"

# key -> (file, "release:first[-last] ...")
SOURCES: dict[str, tuple[str, str]] = {
    "clip-grad-norm-nan": (_CLIP, "0.4.0:99-101 0.5.0:104-106"),
    "forward-loss-nan-assert": (_PRETRAIN, "0.4.0:155-156 0.5.0:118-119 0.6.0:130-131 0.7.0:142-143 0.8.0:139-140 "
                                "0.9.0:157-158"),
    "grad-norm-nan-assert": (_BUFFER, "0.6.0:122-124 0.7.0:115-117 0.8.0:115-117 0.9.0:142-144"),
    "grad-norm-nan": (_BUFFER, "0.10.0:162-163 0.11.0:163-164 0.12.0:168-169 0.13.0:180-181 0.14.0:189-190 "
                      "0.15.0rc0:188-189 0.15.0:188-189 0.16.0:225-226 0.17.0:272-273 0.18.0:326-327 0.19.0:352-353 "
                      "main:358-359"),
    "grad-norm-inf": (_BUFFER, "0.12.0:176-177 0.13.0:188-189 0.14.0:197-198 0.15.0rc0:196-197 0.15.0:196-197 "
                      "0.16.0:233-234 0.17.0:280-281 0.18.0:334-335 0.19.0:360-361 main:366-367"),
    "large-grads": (_BUFFER, "0.12.0:187-188 0.13.0:199-200 0.14.0:208-209 0.15.0rc0:207-208 0.15.0:207-208 "
                    "0.16.0:244-245 0.17.0:291-292 0.18.0:345-346 0.19.0:371-372 main:377-378"),
    "forward-loss-nan": (_PRETRAIN, "0.10.0:183 0.11.0:183 0.12.0:187 0.13.0:254 0.14.0:254 0.15.0rc0:254 0.15.0:90 "
                         "0.16.0:138 0.17.0:204 0.18.0:155 0.19.0:254 main:267"),
    "forward-loss-inf": (_PRETRAIN, "0.12.0:194 0.13.0:261 0.14.0:261 0.15.0rc0:261 0.15.0:97 0.16.0:145 0.17.0:211 "
                         "0.18.0:162 0.19.0:261 main:274"),
    "spiky-loss": (_PRETRAIN, "0.10.0:192 0.11.0:192 0.12.0:207 0.13.0:274 0.14.0:274 0.15.0rc0:274 0.15.0:110 "
                   "0.16.0:158 0.17.0:224 0.18.0:175 0.19.0:274 main:287"),
    "raise": (_MACHINE, "0.12.0:501-503 0.13.0:501-503 0.14.0:501-503 0.15.0rc0:501-503 0.15.0:501-503 "
              "0.16.0:527-529 0.17.0:530-532 0.18.0:529-531 0.19.0:529-531 main:529-531"),
    "log-at-file": (_MACHINE, "0.10.0:520-524 0.11.0:520-524 0.12.0:570-574 0.13.0:570-574"),
    "log-on-rank": (_MACHINE, "0.14.0:567-571 0.15.0rc0:567-571 0.15.0:567-571 0.16.0:604-608 0.17.0:607-611 "
                    "0.18.0:606-610 0.19.0:606-610 main:606-610"),
    "tracker": (_MACHINE, "0.12.0:943-946 0.13.0:942-945 0.14.0:957-960 0.15.0rc0:957-960 0.15.0:957-960 "
                "0.16.0:1012-1015 0.17.0:1015-1018 0.18.0:1041-1044 0.19.0:1034-1037 main:1034-1037"),
    "first-not": (_MACHINE, "0.10.0:540-541 0.11.0:540-541 0.12.0:590-591 0.13.0:589-590 0.14.0:586-587 "
                  "0.15.0rc0:586-587 0.15.0:586-587 0.16.0:625-626 0.17.0:628-629 0.18.0:627-628 0.19.0:627-628 "
                  "main:627-628"),
    "first-yes": (_MACHINE, "0.10.0:551-553 0.11.0:551-553 0.12.0:611-613 0.13.0:610-612 0.14.0:607-609 "
                  "0.15.0rc0:607-609 0.15.0:607-609 0.16.0:651-653 0.17.0:654-656 0.18.0:653-655 0.19.0:653-655 "
                  "main:653-655"),
    "second-not": (_MACHINE, "0.10.0:568-569 0.11.0:568-569 0.12.0:633-634 0.13.0:632-633 0.14.0:629-630 "
                   "0.15.0rc0:629-630 0.15.0:629-630 0.16.0:674-675 0.17.0:677-678 0.18.0:676-677 0.19.0:676-677 "
                   "main:676-677"),
    "second-yes": (_MACHINE, "0.10.0:574-575 0.11.0:574-575 0.12.0:644-645 0.13.0:643-644 0.14.0:640-641 "
                   "0.15.0rc0:640-641 0.15.0:640-641 0.16.0:687-688 0.17.0:690-691 0.18.0:689-690 0.19.0:689-690 "
                   "main:689-690"),
    "transient": (_MACHINE, "0.10.0:543 0.11.0:543 0.12.0:598 0.13.0:597 0.14.0:594 0.15.0rc0:594 0.15.0:594 "
                  "0.16.0:634 0.17.0:637 0.18.0:636 0.19.0:636 main:636"),
    "persistent": (_MACHINE, "0.10.0:571 0.11.0:571 0.12.0:636 0.13.0:635 0.14.0:632 0.15.0rc0:632 0.15.0:632 "
                   "0.16.0:677 0.17.0:680 0.18.0:679 0.19.0:679 main:679"),
    "correct": (_MACHINE, "0.10.0:577 0.11.0:577 0.12.0:647 0.13.0:646 0.14.0:643 0.15.0rc0:643 0.15.0:643 "
                "0.16.0:690 0.17.0:693 0.18.0:692 0.19.0:692 main:692"),
    "log-failure-old": (_MACHINE, "0.10.0:501 0.11.0:501 0.12.0:548 0.13.0:548 0.14.0:539 0.15.0rc0:539 0.15.0:539"),
    "log-failure-new": (_MACHINE, "0.16.0:570-571 0.17.0:573-574 0.18.0:572-573 0.19.0:572-573 main:572-573"),
}  # fmt: skip


# The lines of two frames every DDP-check traceback has, release by release (core 0.12 on): they narrow the releases
# a form leaves. (path suffix, function) -> "release:line ...".
FRAME_LINES: dict[tuple[str, str], str] = {
    (_MACHINE, "validate_result"): "0.12.0:505 0.13.0:505 0.14.0:505 0.15.0rc0:505 0.15.0:505 0.16.0:532 0.17.0:535 "
    "0.18.0:534 0.19.0:534 main:534",  # raise RuntimeError(full_message)
    (_BUFFER, "check_grads"): "0.12.0:165 0.13.0:177 0.14.0:186 0.15.0rc0:185 0.15.0:185 0.16.0:222 0.17.0:269 "
    "0.18.0:323 0.19.0:349 main:355",  # rerun_state_machine.validate_result(
}


# The DDP buffer's file of core 0.4.0 and 0.5.0, renamed param_and_grad_buffer.py on main by 247fcc11f4 (2024-03-20,
# before 0.6.0). Its NaN assertion came on main by d66807759c (written 2023-12-05, on main 2024-02-27, the day after
# core_v0.5.0, whose file has no check in it, :85-116): the assertion through a frame of this file is a Megatron-LM
# main of that window, no release.
GRAD_BUFFER = "megatron/core/distributed/grad_buffer.py"
GRAD_BUFFER_MAIN = "Megatron-LM main between core 0.5.0 and 0.6.0 (February to March 2024), in no release"
# the lines of finish_grad_sync's synchronous call of start_grad_sync (whose check raises the assertion), taken only
# where overlap_grad_reduce is off: NVIDIA/Megatron-LM d66807759c and 53a350eddb grad_buffer.py:145-146, 293e10419f
# :154-155 (with overlap on, start_grad_sync runs from register_grad_ready instead)
GRAD_BUFFER_SYNC = (146, 155)
GRAD_BUFFER_SYNC_SOURCE = (
    "NVIDIA/Megatron-LM 53a350eddb megatron/core/distributed/grad_buffer.py:145-146; 293e10419f :154-155"
)


def frame_releases(suffix: str, function: str, line: int) -> set[str] | None:
    """The releases whose `function` in `suffix` is at `line` (None: not a frame the table knows)."""
    table = FRAME_LINES.get((suffix, function))
    if table is None:
        return None
    pairs = (item.split(":") for item in table.split())
    return {release for release, at in pairs if int(at) == line}


def spans(key: str) -> dict[str, tuple[int, int]]:
    """release -> (first, last) line of the text `key` names, in that release's file."""
    out = {}
    for item in SOURCES[key][1].split():
        release, _, lines = item.partition(":")
        first, _, last = lines.partition("-")
        out[release] = (int(first), int(last or first))
    return out


def source(key: str, release: str) -> str:
    """`file:first-last (core_vX)` of a text in one release."""
    first, last = spans(key)[release]
    where = f"{first}" if first == last else f"{first}-{last}"
    return f"{SOURCES[key][0]}:{where} ({TAG.format(release=release) if release != 'main' else 'main ' + MAIN})"


def span_text(key: str) -> str:
    """The releases a text exists in, as a range: `core 0.12.0..main`."""
    have = list(spans(key))
    return f"core {have[0]}..{have[-1]}"


@dataclass(frozen=True)
class Form:
    """One of Megatron's forms around a check's message.

    Attributes:
        id: JSON `failure.format`.
        template: the line, str.format names (rank, node, device, iteration, result, message, ...).
        key: its SOURCES key (None: not Megatron's text, `message`).
        fatal: the job dies of it (rerun mode disabled); False: logged, the rerun state machine reruns the step.
        means: one line for the report.
    """

    id: str
    template: str
    key: str | None
    fatal: bool
    means: str


RAISE = (
    "Rank {rank}, node {node}, device {device}, iteration {iteration}: Unexpected result {result} (message='{message}')"
)
ASSERT = "Rank {rank}: {message}. Device: {device}, node: {node}"
LOG_AT_FILE = (
    "Unexpected result {result} at {file} line {lineno}, invokation #{invocation} at iteration #{iteration} "
    "(message='{message}')"
)
LOG_ON_RANK = (
    "Unexpected result {result} on rank {rank} at iteration #{iteration} {spelling} #{invocation} (message='{message}')"
)
TRACKER = (
    "ts={ts} node={node} device={device} jobID={job} rank={rank} iteration={iteration} status={status} "
    "result={result} message='{message}'"
)

FORMS: tuple[Form, ...] = (
    Form("raise", RAISE, "raise", True, "megatron-core's RerunStateMachine in mode DISABLED raised it (core 0.12 on)"),
    Form("assert", ASSERT, None, True, "an assertion of megatron-core 0.4 to 0.9, before the RerunStateMachine"),
    Form(
        "log-at-file",
        LOG_AT_FILE,
        "log-at-file",
        False,
        "the RerunStateMachine, enabled, logged it and reruns the step (core 0.10 to 0.13)",
    ),
    Form(
        "log-on-rank",
        LOG_ON_RANK,
        "log-on-rank",
        False,
        "the RerunStateMachine, enabled, logged it and reruns the step (core 0.14 on)",
    ),
    Form(
        "tracker",
        TRACKER,
        "tracker",
        False,
        "a line of the RerunStateMachine's result-rejected tracker file (core 0.12 on)",
    ),
    Form("message", "{message}", None, False, "the check's message alone, without the line Megatron wraps it in"),
    Form(
        "rerun", "{verdict}", None, False, "only the rerun state machine's verdict: the error line is not in the input"
    ),
)
BY_FORM = {form.id: form for form in FORMS}
# Where each assertion's message is (core 0.4 to 0.9), by check id.
ASSERTED = {
    "clip-grad-norm-nan": "clip-grad-norm-nan",
    "grad-norm-nan": "grad-norm-nan-assert",
    "forward-loss-nan": "forward-loss-nan-assert",
}

# The rerun state machine's verdict lines (VERDICTS[key] = the text after any `Rank R, ...: ` prefix).
FIRST_NOT = "First rerun: unexpected result is not reproducible within the tolerance ({result} != {initial})"
FIRST_YES = (
    "First rerun: unexpected result is reproducible within the tolerance ({result} = {initial}). "
    "Need to rerun on a different GPU to verify correctness"
)
SECOND_NOT = (
    "Second rerun: unexpected result is not reproducible on a different GPU, therefore was likely incorrect "
    "({result} != {initial})"
)
SECOND_YES = (
    "Second rerun: unexpected result is reproducible on a different GPU, therefore it was likely correct "
    "({result} = {initial})"
)
FAILURE_OLD = "Rank {rank}, node {node}, device {device}: {what}!"  # log_failure, core 0.10 to 0.15
FAILURE_NEW = "Rank {rank}, node {node}, device {device}, iteration #{iteration}: {what}!"  # core 0.16 on
TRANSIENT = "Possible transient error"
PERSISTENT = "Possible persistent error"
CORRECT = "Correct result (but possible Application error) ({message})"


@dataclass(frozen=True)
class Verdict:
    """One rerun outcome: its key (SOURCES), its text's start, which rerun and whether it reproduced, its meaning."""

    key: str
    start: str
    rerun: str  # "first" (same GPU) | "second" (another GPU)
    reproducible: bool
    verdict: str
    means: str


VERDICTS: tuple[Verdict, ...] = (
    Verdict(
        "first-not",
        "First rerun: unexpected result is not reproducible",
        "first",
        reproducible=False,
        verdict="transient",
        means="rerun on the same GPU, the step was finite: a transient fault (the device, a link), not the data or the "
        "model (Megatron: 'Possible transient error')",
    ),
    Verdict(
        "first-yes",
        "First rerun: unexpected result is reproducible",
        "first",
        reproducible=True,
        verdict="reproducible-same-gpu",
        means="rerun on the same GPU, the same result: deterministic on that GPU; Megatron checkpoints and reruns it on "
        "another GPU to tell a faulty GPU from the computation",
    ),
    Verdict(
        "second-not",
        "Second rerun: unexpected result is not reproducible",
        "second",
        reproducible=False,
        verdict="persistent-fault",
        means="on another GPU the step was finite: the first GPU computes it wrong every time (Megatron: 'Possible "
        "persistent error'); the device, not the data or the model",
    ),
    Verdict(
        "second-yes",
        "Second rerun: unexpected result is reproducible",
        "second",
        reproducible=True,
        verdict="application",
        means="another GPU gives the same result: the value is what the computation makes of this data (Megatron: "
        "'Correct result (but possible Application error)'): the data, the loss or the model, not the hardware",
    ),
)
BY_VERDICT = {verdict.key: verdict for verdict in VERDICTS}

"""Issue 33: `nanscope doctor --traceback FILE` alone on real public NaN reports, each written in its report's format
with our own ranks, hosts and paths (tests/fixtures/reports/; the report is cited by tracker and number), and on
input that is no report at all.

Each asserts what the report states: the rank, the kind, the check, the bucket, the device and Megatron's form (its
`format`), the framework its frames or log prefixes name, what the frames show, the rerun verdict.
"""

import io
import json
import sys
from pathlib import Path

import pytest

from nanscope.cli.main import main

REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "reports"
CASE = Path(__file__).resolve().parents[2] / "src" / "nanscope" / "cases" / "slime-795" / "traceback.txt"
STATED = ("rank", "node", "device", "iteration", "kind", "check", "bucket", "format", "truncated")


pytestmark = pytest.mark.usefixtures("wide_terminal")


def _doctor(path: Path, tmp_path: Path, capsys, *extra: str) -> tuple[dict, str]:
    out = tmp_path / "d.json"
    code = main(["doctor", "--traceback", str(path), "--json", str(out), *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(out.read_text()), " ".join(captured.out.split())


# (fixture, report, the failure's fields the report states, framework, framework release, schedule, check reached)
CASES = [
    # THUDM/slime#795: the case's own traceback, Ray-wrapped, slime v0.1.0 over megatron-core 0.15.0rc0
    (CASE, "slime#795", dict(rank=50, node="dgx172", device=2, iteration=-1, kind="NaN", check="grad-norm-nan",
     bucket=0, format="raise", truncated=False), "slime", "v0.1.0", "1f1b", "bucket"),
    # THUDM/slime#795 (comment, Qwen3-32B): slime between v0.1.0 and v0.2.4 (train_actor, lines of no tag), PP 1
    (REPORTS / "slime-795-qwen3-32b.txt", "slime#795 (comment)", dict(rank=5, device=5, kind="NaN",
     check="grad-norm-nan", bucket=0, format="raise"), "slime", None, "no-pipelining", "bucket"),
    # THUDM/slime#2073: a Qwen3.5 VLM on slime main; Ray-prefixed actor lines
    (REPORTS / "slime-2073.log", "slime#2073", dict(rank=1, device=1, kind="NaN", check="grad-norm-nan", bucket=0,
     format="raise"), "slime", "main", "no-pipelining", "bucket"),
    # alibaba/Pai-Megatron-Patch#366: core 0.6-0.9's assertion, no bucket, 1F1B (TP4 PP8)
    (REPORTS / "pai-366.txt", "Pai-Megatron-Patch#366", dict(rank=21, device=5, node="llm-pretrain-worker-2",
     kind="NaN", check="grad-norm-nan", bucket=None, format="assert"), "pai-megatron-patch", None, "1f1b", "bucket"),
    # alibaba/Pai-Megatron-Patch#392: the issue title only, its message cut at the start ("NaN in local forward loss")
    (REPORTS / "pai-392-title.txt", "Pai-Megatron-Patch#392", dict(rank=None, kind="NaN", check="forward-loss-nan",
     format="message", truncated=True), "unknown", None, None, None),
    # alibaba/Pai-Megatron-Patch#680: pretrain_gpt's assertion cut after "Device: 2,", torchrun [rankN]: prefixes
    (REPORTS / "pai-680.log", "Pai-Megatron-Patch#680", dict(rank=93, device=5, node=None, kind="NaN",
     check="forward-loss-nan", format="assert"), "pai-megatron-patch", None, None, None),
    # alibaba/Pai-Megatron-Patch#60: Megatron-LM's clip_grads assertion (core 0.4, 0.5), in the optimizer step
    (REPORTS / "pai-60.txt", "Pai-Megatron-Patch#60", dict(rank=6, device=6, kind="NaN", check="clip-grad-norm-nan",
     bucket=None, format="assert"), "pai-megatron-patch", None, None, "clip-grads"),
    # alibaba/Pai-Megatron-Patch#604: the issue title, cut after its bucket
    (REPORTS / "pai-604-title.txt", "Pai-Megatron-Patch#604", dict(kind="Inf", check="grad-norm-inf", bucket=0,
     format="message", truncated=True), "unknown", None, None, None),
    # modelscope/ms-swift#9791: two ranks' [rankN]: lines interleaved; rank 9's traceback is read
    (REPORTS / "ms-swift-9791.log", "ms-swift#9791", dict(rank=9, device=1, iteration=12, kind="NaN",
     check="grad-norm-nan", bucket=0, format="raise"), "ms-swift", None, "1f1b", "bucket"),
    # modelscope/ms-swift#9791: its title, ending in the message's closing quote
    (REPORTS / "ms-swift-9791-title.txt", "ms-swift#9791 (title)", dict(kind="NaN", check="grad-norm-nan", bucket=0,
     format="message", truncated=False), "unknown", None, None, None),
    # modelscope/ms-swift#8366: GKD; the error line cut inside its message (an issue title's length)
    (REPORTS / "ms-swift-8366.log", "ms-swift#8366", dict(rank=3, device=3, kind="NaN", check="grad-norm-nan",
     bucket=0, format="raise", truncated=True), "ms-swift", None, "no-pipelining", "bucket"),
    # NVIDIA/Megatron-LM#780: the message alone, quoted, core 0.6-0.9 (no bucket)
    (REPORTS / "megatron-lm-780.txt", "Megatron-LM#780", dict(rank=None, kind="NaN", check="grad-norm-nan",
     bucket=None, format="message"), "unknown", None, None, None),
    # NVIDIA/Megatron-LM#5026: the rerun state machine enabled (core 0.16 on: "invocation"), its first rerun's verdict
    (REPORTS / "megatron-lm-5026.log", "Megatron-LM#5026", dict(rank=6, node="ci-runner-17-task-0", device=6,
     iteration=4, kind="NaN", check="grad-norm-nan", bucket=0, format="log-on-rank"), "unknown", None, None, None),
    # NVIDIA/Megatron-LM#2597: the same logger line as core 0.14-0.15 spell it ("invokation")
    (REPORTS / "megatron-lm-2597.log", "Megatron-LM#2597", dict(rank=21, device=None, iteration=5, kind="NaN",
     check="grad-norm-nan", bucket=0, format="log-on-rank"), "unknown", None, None, None),
    # NVIDIA/Megatron-LM#6018: NeMo 25.09 distillation, NeMo-Run's `i.distill/0 [rank2]:` prefixes
    (REPORTS / "megatron-lm-6018.log", "Megatron-LM#6018", dict(rank=2, device=2, iteration=-1, kind="NaN",
     check="grad-norm-nan", bucket=0, format="raise"), "nemo", None, "1f1b", "bucket"),
    # NVIDIA-NeMo/Speech#14348 (NeMo): the error line behind `i.pretrain/0 [default4]:[rank4]:`
    (REPORTS / "nemo-14348.log", "NeMo#14348", dict(rank=4, node="chip-train-01", device=4, iteration=-1, kind="NaN",
     check="grad-norm-nan", bucket=0, format="raise"), "nemo", None, None, None),
    # NVIDIA-NeMo/Speech#14751 (NeMo): a summary line without its prefix, then the detailed error: the full one is read
    (REPORTS / "nemo-14751.log", "NeMo#14751", dict(rank=6, device=6, kind="Inf", check="grad-norm-inf", bucket=3,
     format="raise"), "nemo", None, "no-pipelining", "bucket"),
    # alibaba/ROLL#193: Ray's `(ActorWorker(actor_train-3) pid=.., ip=..)` prefix and ROLL's own log header
    (REPORTS / "roll-193.log", "ROLL#193", dict(rank=3, device=3, iteration=-1, kind="NaN", check="grad-norm-nan",
     bucket=0, format="raise"), "roll", None, "no-pipelining", "bucket"),
    # alibaba/ROLL#398: a comment's line cut at its start, in backticks
    (REPORTS / "roll-398.txt", "ROLL#398", dict(rank=None, node=None, device=4, iteration=-1, kind="NaN",
     check="grad-norm-nan", bucket=0, format="raise"), "unknown", None, None, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "report", "failure", "framework", "release", "schedule", "check"),
    CASES,
    ids=[case[1] for case in CASES],
)
def test_a_real_report_alone(path, report, failure, framework, release, schedule, check, tmp_path, capsys):
    doc, out = _doctor(path, tmp_path, capsys)
    assert {key: doc["failure"][key] for key in failure} == failure, report
    assert (doc["framework"]["name"], doc["framework"]["release"]) == (framework, release), doc["framework"]
    assert (doc["frame_evidence"]["schedule"], doc["frame_evidence"]["check"]) == (schedule, check)
    assert doc["config"] is None and doc["topology"] is None and doc["failing_rank"] is None
    assert doc["missing"][0].startswith("no launch script: give it to place ")
    assert "No launch script: no flag rule ran" in doc["verdict"]
    assert "(a log or traceback alone: no launch script)" in out
    names = {candidate["id"] for candidate in doc["candidates"]}
    # slime's loss and rollout hazards are slime's rules: only a slime job gets them
    assert ("kl-exp-overflow" in names) == (framework == "slime"), names


def test_the_release_each_form_and_frame_narrows_to(tmp_path, capsys):
    doc, _ = _doctor(CASE, tmp_path, capsys)
    assert doc["failure"]["megatron_core"]["first"] == "0.12.0" and doc["failure"]["megatron_core"]["last"] == "main"
    assert doc["frame_evidence"]["megatron_core"] == ["0.15.0rc0", "0.15.0"]  # rerun_state_machine.py:505, :185
    assert doc["slime_release"] == {
        "version": "v0.1.0",
        "name": "v0.1.0",
        "how": "frames",
        "source": "frames under slime/backends/ (actor.py:258 train); its frames actor.py:258 train, model.py:431 "
        "train, model.py:310 train_one_step are slime v0.1.0's lines",
    }
    two = {r: _doctor(REPORTS / f, tmp_path, capsys)[0]["failure"]["megatron_core"] for r, f in (
        ("5026", "megatron-lm-5026.log"), ("2597", "megatron-lm-2597.log"), ("366", "pai-366.txt"),
        ("60", "pai-60.txt"))}  # fmt: skip
    assert {r: (v["first"], v["last"]) for r, v in two.items()} == {
        "5026": ("0.16.0", "main"),  # "invocation"
        "2597": ("0.14.0", "0.15.0"),  # "invokation"
        "366": ("0.6.0", "0.9.0"),  # the DDP buffer's assertion
        "60": ("0.4.0", "0.5.0"),  # clip_grads' assertion
    }


def test_the_rerun_verdict_is_stated_and_weighs_the_causes(tmp_path, capsys):
    """NVIDIA/Megatron-LM#5026: reproducible on the same GPU, the log cut inside the verdict's last words."""
    doc, out = _doctor(REPORTS / "megatron-lm-5026.log", tmp_path, capsys)
    rerun = doc["failure"]["rerun"]
    assert (rerun["verdict"], rerun["rerun"], rerun["reproducible"], rerun["values"]) == (
        "reproducible-same-gpu",
        "first",
        True,
        "nan = nan",
    )
    assert (rerun["rank"], rerun["node"], rerun["device"], rerun["iteration"]) == (6, "ci-runner-17-task-0", 6, 4)
    assert "The rerun state machine's verdict (first rerun): rerun on the same GPU, the same result" in doc["verdict"]
    assert "rerun verdict: reproducible-same-gpu (first rerun, nan = nan)" in out
    transient = next(c for c in doc["candidates"] if c["id"] == "transient-fault")
    assert transient["status"] == "ruled-out" and transient["evidence"][-1].startswith(
        "the rerun state machine's verdict (first rerun, line 4)"
    )


def test_a_verdict_of_a_transient_fault_leaves_the_device(tmp_path, capsys):
    log = tmp_path / "job.log"
    log.write_text(
        "ERROR:megatron.core.rerun_state_machine:Unexpected result nan on rank 2 at iteration #9 invokation #1 "
        "(message='found NaN in local grad norm for bucket #0 in backward pass before data-parallel communication "
        "collective')\n"
        "WARNING:megatron.core.rerun_state_machine:First rerun: unexpected result is not reproducible within the "
        "tolerance (12.5 != nan)\n"
        "ERROR:megatron.core.rerun_state_machine:Rank 2, node n4, device 2: Possible transient error!!\n"
    )
    doc, _ = _doctor(log, tmp_path, capsys)
    assert (doc["failure"]["rank"], doc["failure"]["node"], doc["failure"]["device"]) == (2, "n4", 2)
    assert doc["failure"]["rerun"]["verdict"] == "transient"
    status = {c["id"]: c["status"] for c in doc["candidates"]}
    # not reproducible on the same GPU: the device (and a race, which is timing) stay; what reproduces is out
    assert [name for name, s in status.items() if s != "ruled-out"] == ["transient-fault", "grad-reduce-overlap-race"]
    assert status["transient-fault"] == "enabled" and status["library-regression"] == "ruled-out"


def test_a_traceback_cut_before_its_error_line_still_shows_its_frames(tmp_path, capsys):
    text = (REPORTS / "roll-193.log").read_text().splitlines()
    cut = tmp_path / "cut.log"
    cut.write_text("\n".join(text[:10]) + "\n")  # up to schedules.py's forward_backward_no_pipelining
    doc, out = _doctor(cut, tmp_path, capsys)
    assert {key: doc["failure"][key] for key in STATED} == dict.fromkeys(STATED)
    assert (doc["framework"]["name"], doc["frame_evidence"]["schedule"], doc["frame_evidence"]["pp"]) == (
        "roll",
        "no-pipelining",
        "1",
    )
    assert "The traceback ends before its error line: only its frames say what happened." in doc["verdict"]


def test_standard_input(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((REPORTS / "nemo-14348.log").read_bytes())))
    doc, _ = _doctor(Path("-"), tmp_path, capsys)
    assert (doc["failure"]["rank"], doc["failure"]["format"], doc["framework"]["name"]) == (4, "raise", "nemo")


def test_a_verl_log_without_an_error_line_is_verls_and_gets_no_slime_rules(tmp_path, capsys):
    """verl-project/verl#747: autograd's anomaly mode names the op; the frames are verl's."""
    doc, _ = _doctor(REPORTS / "verl-747.log", tmp_path, capsys)
    assert doc["framework"]["name"] == "verl" and doc["slime_release"] is None
    # issue 41: autograd's anomaly error is evidence: which backward function, which output, in the actor's update
    assert (doc["failure"]["format"], doc["failure"]["check"], doc["failure"]["op"], doc["failure"]["output"]) == (
        "signal",
        "anomaly-nan",
        "ExpBackward0",
        0,
    )
    assert (doc["summary"]["model"], doc["summary"]["kind"]) == ("actor", "NaN")
    assert not any(c["id"].startswith(("kl-", "ratio-", "nan-r", "zero-t")) for c in doc["candidates"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "no Megatron error found"),
        (bytes(range(256)) * 64, "no Megatron error found"),
        (b"\0" * 4096, "no Megatron error found"),
        (b"def train():\n    return loss.backward()\n", "no Megatron error found"),
    ],
    ids=["empty", "binary", "nul-bytes", "python-source"],
)
def test_input_that_is_no_report_is_one_line(content, message, tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_bytes(content)
    assert main(["doctor", "--traceback", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"nanscope doctor: error: {path}: {message}")


def test_nul_bytes_around_a_real_error_line_still_read(tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_bytes(b"\0" * 1000 + b"\n" + (REPORTS / "nemo-14348.log").read_bytes() + b"\0" * 1000)
    doc, _ = _doctor(path, tmp_path, capsys)
    assert (doc["failure"]["rank"], doc["failure"]["check"]) == (4, "grad-norm-nan")


def test_contradictions_with_the_script_are_stated(tmp_path, capsys):
    """The case's launch (PP 4, 1F1B, slime v0.1.0) with THUDM/slime#795's Qwen3-32B comment (PP 1, lines of no
    release) and with THUDM/slime#2073 (slime main)."""
    out = tmp_path / "d.json"
    argv = ["doctor", "--case", "slime-795", "--json", str(out), "--traceback"]
    assert main([*argv, str(REPORTS / "slime-795-qwen3-32b.txt")]) == 0
    doc = json.loads(out.read_text())
    assert doc["contradictions"] == [
        "the frames run forward_backward_no_pipelining (PP 1) but the script sets --pipeline-model-parallel-size 4"
    ]
    assert main([*argv, str(REPORTS / "slime-2073.log")]) == 0
    doc = json.loads(out.read_text())
    assert doc["contradictions"] == [
        "the frames run forward_backward_no_pipelining (PP 1) but the script sets --pipeline-model-parallel-size 4",
        "the frames are slime main's lines but the diagnosis uses v0.1.0 (case: the bundled case ran slime v0.1.0; "
        "pass --slime-version to choose another)",
    ]
    assert main([*argv, str(REPORTS / "roll-193.log")]) == 0
    doc = json.loads(out.read_text())
    assert doc["contradictions"][-1].startswith("the traceback's frames are roll's (frames under roll/distributed/")
    assert "contradictions - the frames run forward_backward_no_pipelining" in " ".join(capsys.readouterr().out.split())

"""`nanscope doctor --traceback FILE` on what real logs contain (issue 24, item 5): Megatron's messages told apart,
ANSI colour codes, and a whole job log of any size, read as a stream.

Each runs through argv (`nanscope doctor --case slime-795 --traceback FILE --json OUT`), the bundled case's
launch with its traceback changed the way a real log differs from it.
"""

import json
import re
import time
import tracemalloc
from importlib.resources import files
from pathlib import Path

import pytest

from nanscope.cli.main import main

CASE_TRACEBACK = (files("nanscope") / "cases" / "slime-795" / "traceback.txt").read_text()
BUCKET_NAN = "found NaN in local grad norm for bucket #0 in backward pass before data-parallel communication collective"
FAILURE_KEYS = ("rank", "node", "device", "iteration", "result", "kind", "message", "bucket", "truncated")


pytestmark = pytest.mark.usefixtures("wide_terminal")


def _doctor(tmp_path: Path, traceback: str | bytes, capsys) -> dict:
    """`nanscope doctor --case slime-795 --traceback FILE --json OUT`: exit 0, its JSON document."""
    log, out = tmp_path / "traceback.txt", tmp_path / "d.json"
    if isinstance(traceback, str):
        log.write_text(traceback)
    else:
        log.write_bytes(traceback)
    code = main(["doctor", "--case", "slime-795", "--traceback", str(log), "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(out.read_text())


def _with_message(result: str, message: str) -> str:
    return CASE_TRACEBACK.replace(
        f"Unexpected result nan (message='{BUCKET_NAN}')", f"Unexpected result {result} (message='{message}')"
    )


def test_megatron_lm_forward_loss_message_is_a_loss_failure_of_a_job_not_slimes(tmp_path, capsys):
    doc = _doctor(tmp_path, _with_message("nan", "found NaN in local forward loss calculation"), capsys)
    verdict = doc["verdict"]
    assert verdict.startswith(
        "Rank 50 found NaN in its local forward loss (Megatron-LM's loss_func), on node dgx172 (node index 6), "
        "device 2."
    )
    assert "gradient norm" not in verdict
    failure = doc["failure"]
    assert (failure["kind"], failure["check"], failure["checked"], failure["bucket"]) == (
        "NaN",
        "forward-loss-nan",
        "loss",
        None,
    )
    assert failure["message_source"] == "Megatron-LM core_v0.15.0rc0 pretrain_gpt.py:254"
    assert failure["slime_runs_this_check"] is False
    assert (
        "The job was not slime's: this check is Megatron-LM's (Megatron-LM core_v0.15.0rc0 pretrain_gpt.py:254), in "
        "Megatron-LM's own training loop, which slime never runs (slime computes its loss in its own loss function)."
    ) in verdict
    status = {c["id"]: c["status"] for c in doc["candidates"]}
    # slime's loss and rollouts never ran; a fault that leaves the loss finite did not make it NaN. The router's
    # logits are in the forward, before the loss: without the model-args file they stay undecided
    assert [name for name, s in status.items() if s != "ruled-out"] == [
        "bad-checkpoint-resume",  # enabled by --load (causes.reported), before the undecidable ones
        "cpu-offloaded-optimizer",  # enabled by --optimizer-cpu-offload
        "activation-overflow",
        "transient-fault",
        "moe-router-logits",
        "library-regression",
        "sp-new-architecture",
    ]
    shift = next(c for c in doc["candidates"] if c["id"] == "kl-exp-overflow")
    assert shift["evidence"][-1] == (
        "the traceback's check is Megatron-LM's (Megatron-LM core_v0.15.0rc0 pretrain_gpt.py:254), on the loss of "
        "Megatron-LM's own training loop, which slime never runs: this hazard lives in slime's loss or rollouts"
    )
    assert doc["explanations"][0].startswith(
        "PP 3 is the last stage: the loss, and so its check, is computed on the last"
    )


def test_unexpected_large_grads_is_a_finite_gradient_not_nan(tmp_path, capsys):
    message = "found unexpected large grads in bucket #0 in backward pass before data-parallel communication collective"
    doc = _doctor(tmp_path, _with_message("tensor(4817.25, device='cuda:2')", message), capsys)
    verdict = doc["verdict"]
    assert verdict.startswith(
        "Rank 50 found an unexpectedly large gradient norm (bucket #0), tensor(4817.25, device='cuda:2'): finite, "
        "not NaN or Inf, but at least 10 times the largest of its first 100 checks (--check-for-large-grads), before "
        "the data-parallel reduce, on node dgx172 (node index 6), device 2."
    )
    failure = doc["failure"]
    assert (failure["kind"], failure["check"], failure["checked"], failure["bucket"]) == (
        "large",
        "large-grads",
        "gradient",
        0,
    )
    assert failure["message_source"] == "megatron-core 0.15.0rc0 distributed/param_and_grad_buffer.py:207"
    assert "found ?" not in verdict and "because --check-for-large-grads is on" in verdict
    # every catalogued hazard makes the gradient NaN or Inf, which this check passes over; a shifted rollout
    # log-prob leaves it finite and stays open
    open_ = [c["id"] for c in doc["candidates"] if c["status"] != "ruled-out"]
    assert open_ == [  # the reported causes that can make a finite gradient norm far out of range stay open too
        "rollout-logprob-shift",
        "bad-checkpoint-resume",
        "cpu-offloaded-optimizer",
        "library-regression",
        "sp-new-architecture",
    ]
    assert (
        "the traceback's check (large-grads) runs only under --check-for-large-grads, which this launch does not "
        "set: the traceback may come from another launch"
    ) in doc["notes"]


def _coloured(text: str) -> str:
    """The case's traceback as a terminal shows it: Ray's colour codes on its header (always written, also to a
    file), numbers highlighted, the error line red after an erase-line code, CRLF line ends."""
    text = text.replace("ray::MegatronTrainRayActor.train()", "\x1b[36mray::MegatronTrainRayActor.train()\x1b[39m")
    text = text.replace("RuntimeError: Rank 50, node dgx172, device 2, iteration -1: Unexpected result nan", (
        "\x1b[K\x1b[31mRuntimeError\x1b[0m: Rank \x1b[1;36m50\x1b[0m, node dgx172, device \x1b[1;36m2\x1b[0m, "
        "iteration \x1b[1;36m-1\x1b[0m: Unexpected result \x1b[1;35mnan\x1b[0m"
    ))  # fmt: skip
    text = re.sub(r'File "([^"]+)"', lambda m: f'File "\x1b[35m{m[1]}\x1b[0m"', text)
    return text.replace("\n", "\r\n")


def test_ansi_colour_codes_are_read_as_a_terminal_shows_them(tmp_path, capsys):
    plain = _doctor(tmp_path, CASE_TRACEBACK, capsys)
    coloured = _doctor(tmp_path, _coloured(CASE_TRACEBACK), capsys)
    assert {key: coloured["failure"][key] for key in FAILURE_KEYS} == {
        key: plain["failure"][key] for key in FAILURE_KEYS
    }
    assert coloured["frames"] == plain["frames"] and len(plain["frames"]) == 17
    assert coloured["frames"][6]["path"] == "<ray actor>"  # the Ray boundary, behind its colour codes


def _driver_log(path: Path, filler_bytes: int) -> None:
    """A 64-rank job's Ray driver log: actor and raylet output (coloured prefixes), the driver's traceback,
    then the other ranks' failures as Ray reports them."""
    actor = "\x1b[36m(MegatronTrainRayActor pid={pid}, ip=172.27.6.{ip})\x1b[0m "
    step = (
        actor + "[2025-08-30 12:01:{s:02d}] model.py:329 - rollout {i}: {{'train/loss': 0.0123, "
        "'train/grad_norm': 1.52, 'train/pg_clipfrac': 0.0021, 'train/ppo_kl': 1.3e-05}}\n"
    )
    raylet = "\x1b[33m(raylet, ip=172.27.6.{ip})\x1b[0m [2025-08-30 12:01:{s:02d},000 I 881 881] node_manager.cc:1093\n"
    with open(path, "w") as log:
        log.write("2025-08-30 12:00:01,123\tINFO worker.py:1841 -- Connected to Ray cluster.\n")
        written, i = 0, 0
        while written < filler_bytes:
            line = (step if i % 7 else raylet).format(pid=2526000 + i % 64, ip=i % 8, s=i % 60, i=i)
            log.write(line)
            written += len(line)
            i += 1
        log.write(
            CASE_TRACEBACK.replace(
                "ray::MegatronTrainRayActor.train()", "\x1b[36mray::MegatronTrainRayActor.train()\x1b[39m"
            )
        )
        for rank in (51, 49, 48):
            log.write(
                f"2025-08-30 12:02:10,001\tERROR worker.py:439 -- Unhandled error (suppress with "
                f"'RAY_IGNORE_UNHANDLED_ERRORS=1'): \x1b[36mray::MegatronTrainRayActor.train()\x1b[39m "
                f"(pid=25265{rank}, ip=172.27.6.172, actor_id=a9400{rank})\n"
                + CASE_TRACEBACK.split("ray.exceptions.RayTaskError", 1)[1]
                .split("\n", 1)[1]
                .replace("Rank 50,", f"Rank {rank},")
            )


def test_a_whole_driver_log_over_the_input_cap_is_read_without_raising_it(tmp_path, capsys):
    log = tmp_path / "driver.log"
    _driver_log(log, 6 << 20)
    assert log.stat().st_size > 6 << 20  # over --max-input-mb's 4 MiB, not raised
    doc = _doctor(tmp_path, log.read_bytes(), capsys)
    plain = _doctor(tmp_path, CASE_TRACEBACK, capsys)
    failure = doc["failure"]
    assert {key: failure[key] for key in FAILURE_KEYS} == {key: plain["failure"][key] for key in FAILURE_KEYS}
    assert doc["frames"] == plain["frames"]  # the traceback that ends at the error, from the whole log
    assert (
        "the traceback also has Megatron errors from rank(s) 48, 49, 51; the first, rank 50, is explained"
        in doc["notes"]
    )


def test_a_log_streams_in_bounded_memory(tmp_path):
    """The memory a log takes is bounded whatever its size; its speed is measured in benchmarks/doctor_inputs.py
    (issue 42: no test asserts a speed), and a reader that is not linear is caught by a hang bound."""
    from nanscope.launch.tracebacks import read_traceback  # here: the tests above also run on the code before it

    log = tmp_path / "driver.log"
    _driver_log(log, 48 << 20)
    start = time.process_time()
    traceback = read_traceback(str(log))
    seconds = time.process_time() - start  # timed apart from the memory: tracemalloc slows it by a third
    tracemalloc.start()
    try:
        read_traceback(str(log))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (traceback.failure.rank, traceback.other_ranks, len(traceback.frames)) == (50, [48, 49, 51], 17)
    assert seconds < 120, "a hang: a linear reader takes a few seconds on a loaded box"
    assert peak < 24 << 20, peak  # a chunk, a line piece and the context kept, not the log

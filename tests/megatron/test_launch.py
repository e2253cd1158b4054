"""Parent-side pieces of the harness that need no torchrun."""

import os
import signal
import subprocess
import sys
import time

import pytest

from nanscope import case
from nanscope.megatron import launcher, proctree, step
from nanscope.megatron.spec import RunSpec


def test_kill_tree_reaches_descendants_in_their_own_session():
    # Like torchrun: the child starts its own child in a NEW session (killpg would miss it), and
    # both hold the parent's stdout pipe.
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
        "print('up', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline() == b"up\n"
    time.sleep(0.2)  # let the grandchild start
    pids = proctree.kill_tree(proc.pid)
    assert len(pids) == 2 and pids[0] == proc.pid
    t = time.time()
    proc.communicate(timeout=10)  # returns only once the grandchild released the pipe too
    assert time.time() - t < 5


def test_bad_runs_fail_in_the_parent_before_any_launch(tmp_path):
    with pytest.raises(ValueError, match="unknown hazard 'nope'"):
        launcher.launch([RunSpec("nope")], out_dir=tmp_path, loss_flags=case.loss_flags())
    with pytest.raises(ValueError, match=r"^unknown loss .typo.; known: as-is, safe$"):
        launcher.launch([RunSpec("healthy", loss="typo")], out_dir=tmp_path, loss_flags=case.loss_flags())
    assert not (tmp_path / "spec.json").exists()


def test_run_spec_injects_the_hazard_at_one_step():
    spec = RunSpec("kl-exp-overflow", steps=3, inject_step=2)
    assert [spec.hazard_at(s) for s in (1, 2, 3)] == ["healthy", "kl-exp-overflow", "healthy"]
    assert RunSpec("nan-reward", steps=2).hazard_at(1) == "nan-reward"  # default: the first step


def test_seq_length_is_a_multiple_of_64_tp():
    assert step.seq_length_for([44, 30], tp=2) == 128
    assert step.seq_length_for([129], tp=1) == 192


def test_stop_signals_are_noted_then_raised_with_the_exit_code():
    before = signal.getsignal(signal.SIGHUP)
    with proctree.StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal changes nothing: the first one counts
        time.sleep(0.1)  # the handler runs in the main thread between bytecodes
        assert stop.signum == signal.SIGHUP
        with pytest.raises(proctree.Interrupted) as e:
            stop.check(workers=4)
    assert (e.value.exit_code, e.value.workers) == (129, 4)
    assert signal.getsignal(signal.SIGHUP) is before  # restored


def test_an_ignored_stop_signal_stays_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with proctree.StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.1)
            assert stop.signum is None
            stop.check()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_kill_tree_catches_a_child_forked_while_the_tree_is_read():
    # A parent that keeps forking: freezing (SIGSTOP) before killing leaves no survivor.
    code = (
        "import subprocess, sys, time\n"
        "print('up', flush=True)\n"
        "while True:\n"
        "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        "    time.sleep(0.05)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline() == b"up\n"
    time.sleep(0.5)
    pids = proctree.kill_tree(proc.pid)
    proc.wait(timeout=10)
    assert len(pids) >= 3 and proctree.wait_gone(pids[1:], timeout_s=10) == []


def test_the_matrix_is_validated_and_judged_without_importing_torch():
    # `nanscope repro` launches the harness without importing torch (about 2 s before the launch on 2
    # cores); its ranks compare the healthy gradients (RunSpec.compare_grads), so it never needs torch.
    code = (
        "import sys\n"
        "from nanscope import loss, repro\n"
        "from nanscope.causes import catalogue\n"
        "from nanscope.cli import main\n"
        "from nanscope.megatron import launcher\n"
        "from nanscope.megatron.spec import Layout, RunSpec\n"
        "from nanscope.report import repro as report\n"
        "runs = [RunSpec(h.name, name) for h in catalogue.CATALOGUE for name in loss.NAMES]\n"
        "launcher._validate(runs, Layout())\n"
        "print([repro.expected_outcome(r.hazard, r.loss, r.model_fault) for r in runs].count('nan-check'))\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # 7 hazards fail as-is; 3 (zero-temperature and the two model faults) fail safe too
    assert out.split() == ["10", "False"]

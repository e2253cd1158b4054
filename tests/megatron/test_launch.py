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
    pids = proctree.kill_tree(proc.pid)  # the grandchild exists: Popen returned before 'up' was printed
    assert len(pids) == 2 and pids[0] == proc.pid
    proc.communicate(timeout=30)  # returns only once the grandchild released the pipe too (a bound, not a speed)


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
    seen = []
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL), signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with proctree.StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGTERM)  # a second signal changes nothing: the first one counts
            time.sleep(0.1)  # the handler runs in the main thread between bytecodes
            assert stop.signum == signal.SIGHUP
            with pytest.raises(proctree.Interrupted) as e:
                stop.check(workers=4)
        assert (e.value.exit_code, e.value.workers) == (129, 4)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL  # restored
        # a handler of the caller's own (a test runner's) receives the noted signal once, on leaving
        signal.signal(signal.SIGHUP, lambda signum, frame: seen.append(signum))
        with proctree.StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.1)
            assert seen == []
        time.sleep(0.1)
        assert seen == [signal.SIGHUP]
    finally:
        signal.signal(signal.SIGHUP, before[0])
        signal.signal(signal.SIGTERM, before[1])


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
    deadline = time.monotonic() + 60  # two children forked, however loaded the box (a bound, not a speed)
    while len(proctree.children().get(proc.pid, [])) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
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
    # 12 hazards fail as-is; 7 (zero-temperature and the six model faults) fail safe too
    assert out.split() == ["19", "False"]


# An agent under its launching process: a ParentWatch whose cleanup removes argv[1], and a child of its own
# in a new session (as a rank); prints the two pids, then exits with 5 after `argv[2]` seconds.
AGENT = (
    "import os, shutil, subprocess, sys, time\n"
    "from nanscope.megatron import proctree\n"
    "watch = proctree.ParentWatch(int(sys.argv[3]), cleanup=lambda: shutil.rmtree(sys.argv[1]))\n"
    "rank = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
    "print(os.getpid(), rank.pid, flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
    "watch.exit(5)\n"
)
# The launching process: starts the agent with its own pid, sleeps.
LAUNCHER = (
    "import os, subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', sys.argv[1], *sys.argv[2:], str(os.getpid())], start_new_session=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.timeout(60)
def test_an_agent_whose_parent_is_sigkilled_kills_its_children_then_cleans_up(tmp_path):
    (tmp_path / "run").mkdir()
    argv = [sys.executable, "-c", LAUNCHER, AGENT, str(tmp_path / "run"), "60"]
    parent = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    agent, rank = map(int, parent.stdout.readline().split())
    assert proctree.alive(agent) and proctree.alive(rank)
    parent.kill()
    parent.wait(timeout=10)
    assert proctree.wait_gone([agent, rank], timeout_s=30) == []  # a bound, not a speed
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(60)
def test_an_agent_whose_parent_lives_exits_with_its_own_code_and_cleans_nothing(tmp_path):
    (tmp_path / "run").mkdir()
    argv = [sys.executable, "-c", AGENT, str(tmp_path / "run"), "0.5"]
    proc = subprocess.Popen([*argv, str(os.getpid())], stdout=subprocess.PIPE, text=True)
    _, rank = map(int, proc.stdout.readline().split())
    assert proc.wait(timeout=30) == 5
    assert (tmp_path / "run").is_dir()
    assert proctree.alive(rank)  # not the watch's to kill: its parent lives
    os.kill(rank, signal.SIGKILL)


def test_kill_tree_without_its_root_spares_the_caller():
    code = (
        "import os, subprocess, sys, time\n"
        "from nanscope.megatron import proctree\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        "time.sleep(0.2)\n"
        "print(proctree.kill_tree(os.getpid(), root=False) == [child.pid], child.wait(timeout=10), flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout) == (0, f"True {-signal.SIGKILL}\n")


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
def test_a_rank_forked_after_its_agent_died_ends_at_once():
    code = (
        "import ctypes, os, sys\nfrom nanscope.megatron import worker\n"
        "worker._die_with_parent(os.getppid() + int(sys.argv[1]))\n"
        "sig = ctypes.c_int()\nctypes.CDLL(None).prctl(2, ctypes.byref(sig))\nprint(sig.value)\n"
    )  # 2 = PR_GET_PDEATHSIG
    alive = subprocess.run([sys.executable, "-c", code, "0"], capture_output=True, text=True, timeout=60)
    assert (alive.returncode, alive.stdout) == (0, f"{int(signal.SIGKILL)}\n")  # dies with its agent
    gone = subprocess.run([sys.executable, "-c", code, str(10**6)], capture_output=True, timeout=60)
    assert (gone.returncode, gone.stdout) == (137, b"")  # its agent is not its parent: already gone


def test_a_launch_stuck_in_process_group_init_is_retried_from_the_run_it_never_started():
    from nanscope.megatron.launcher import resume_at

    init = {r: f"rank {r}: watchdog: stuck in process-group init; exiting" for r in range(4)}
    assert resume_at(0, init, 4) == 0  # no rank got past init: run 0 never started, it goes to the fresh launch
    assert resume_at(3, init, 4) == 3
    partly = {**init, 2: "rank 2: watchdog: stuck in run 0; exiting"}
    assert resume_at(0, partly, 4) == 1  # a rank ran run 0: its records stand, the launch resumes after it
    assert resume_at(0, {r: init[r] for r in range(3)}, 4) == 1  # a rank without a note may have run it
    assert resume_at(1, {}, 4) == 2  # a crash, no watchdog note
    assert resume_at(None, {}, 4) is None  # every run finished

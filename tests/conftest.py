import contextlib
import io
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests import checkouts

# Tests run on CPU with torch's default threads; keep them from oversubscribing 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

RELEASE_DIR = Path(__file__).resolve().parent / "slime_releases"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every test under tests/slime_releases runs real slime: marked `release` (deselected by plain `pytest`)."""
    for item in items:
        if RELEASE_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.release)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """No silent skip: where CI's copy of slime exists, a skip for want of a slime checkout is a failure."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and checkouts.must_have() and item.get_closest_marker("release") is not None:
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "checkout" in reason or "NANSCOPE_SLIME_SRC" in reason:
            report.outcome = "failed"
            report.longrepr = f"skipped for want of a checkout, though {checkouts.SHARED_SLIME} exists: {reason}"


def pytest_terminal_summary(terminalreporter):
    """A run whose tests skipped for want of slime's or Megatron-LM's checkouts says how many, in capitals: exit 0
    with "54 skipped" must not read as a pass of what those tests guarantee."""
    line = checkouts.not_tested_line(terminalreporter.stats.get("skipped", []))
    if line:
        terminalreporter.write_line(line, red=True, bold=True)


@pytest.fixture
def wide_lines(monkeypatch):
    """Output wider than any line a test asserts whole (trace's are folded at the terminal's width, else 100 columns:
    tests/cli/test_terminal.py checks the fold)."""
    monkeypatch.setenv("COLUMNS", "1000")


class _Stop:
    """A stop signal to the test run (SIGTERM, SIGHUP, SIGINT): the run stops, also when the signal arrived while a
    harness launch held it (its launcher hands it on once its processes are gone: proctree.StopSignals)."""

    def __init__(self):
        self.signum: int | None = None

    def __call__(self, signum, frame):
        self.signum = self.signum or signum
        raise KeyboardInterrupt(signal.Signals(signum).name)


_STOP = _Stop()


def pytest_configure(config):
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _STOP)


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_protocol(item, nextitem):
    """A test that swallowed the stop (the CLI turns it into exit 130/143/129) still ends the run after it."""
    yield
    if _STOP.signum is not None:
        pytest.exit(f"stopped by {signal.Signals(_STOP.signum).name}", returncode=128 + _STOP.signum)


@pytest.fixture(autouse=True)
def _fresh_plugin_installation():
    """The plugin reads its settings once per installation: every test starts with none (and leaves none)."""
    yield
    state = sys.modules.get("nanscope.slime_plugin.state")
    if state is not None:
        state.uninstall()


@pytest.fixture(scope="session")
def all_matrix(tmp_path_factory) -> tuple[int, dict, str]:
    """`nanscope repro --all` (torchrun), run once per session for every test that reads it (slow tier):
    (exit code, its JSON, what it printed)."""
    from nanscope.cli.main import main  # heavy: the CLI's imports, only where a test asks for the matrix

    path = tmp_path_factory.mktemp("all-matrix") / "m.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["repro", "--all", "--json", str(path)])
    return code, json.loads(path.read_text()), out.getvalue()

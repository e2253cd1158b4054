"""Ray as nanscope's `ray` extra: `scan DIR --ray` equals `scan DIR`; without Ray, one line saying how to install it.

The Ray scan runs in a `nanscope scan` process of its own, which starts (and removes) a local Ray instance; the
local parallel mode runs here. `--launcher ray` itself: tests/megatron/test_ray_launcher.py.
"""

import ast
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from pathlib import Path

import pytest

from nanscope.cli.main import main
from nanscope.dumps import demo, ray_scan, writers
from nanscope.errors import UserError
from nanscope.megatron import ray_session


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    """repro's lines read whole at 160 columns, its width before issue 42 (the rule: tests/cli/test_terminal.py)."""
    monkeypatch.setenv("COLUMNS", "160")


ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "nanscope"
# the only modules that import Ray (inside functions: it is optional)
RAY_MODULES = {"megatron/ray_session.py", "megatron/ray_actor.py", "megatron/ray_driver.py", "dumps/ray_scan.py",
               "slime_train/head.py"}  # fmt: skip


def _dumps(root: Path) -> None:
    demo.write_demo(root / "rollout_data" / "12.pt")
    demo.write_demo(root / "train_data" / "12_0.pt", kind="train")
    clean = [demo.rollout_sample(i, 4, 8, reward=float(i % 2)) for i in range(8)]
    writers.write_rollout_dump(root / "rollout_data" / "13.pt", clean, rollout_id=13)
    (root / "rollout_data" / "14.pt").write_bytes(b"PK\x03\x04 truncated")  # one file's one-line error


def _json(path: Path) -> dict:
    doc = json.loads(path.read_text())
    for summary in doc["files"]:
        summary.pop("seconds")  # each file's wall time
    return doc


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.skipif(not ray_session.available(), reason="needs the nanscope[ray] extra")
def test_scan_directory_as_ray_tasks_equals_the_local_parallel_mode(tmp_path, capsys):
    dumps = tmp_path / "dumps"
    _dumps(dumps)
    # --quiet: the lines a file come in the order the files finish, which neither mode fixes
    local = main(
        ["scan", str(dumps), "--json", str(tmp_path / "l.json"), "--html", str(tmp_path / "l.html"), "--quiet"]
    )
    out, err = capsys.readouterr()
    short, tag = Path(tempfile.mkdtemp(prefix="n", dir="/tmp")), uuid.uuid4().hex  # Ray's sockets: a short TMPDIR
    try:
        argv = [sys.executable, "-m", "nanscope.cli.main", "scan", str(dumps), "--ray",
                "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"), "--quiet"]  # fmt: skip
        env = {**os.environ, "TMPDIR": str(short), "NANSCOPE_TEST_TAG": tag}
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=100)
        left = os.listdir(short)
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert (local, out.count("\n") > 5) == (2, True)
    assert (proc.returncode, proc.stdout, proc.stderr) == (local, out, err)
    assert err.startswith("nanscope scan: error: 1 of 4 dumps failed; the first: ") and "14.pt: unreadable" in err
    assert _json(tmp_path / "r.json") == _json(tmp_path / "l.json")
    assert (tmp_path / "r.html").read_text() == (tmp_path / "l.html").read_text()
    assert left == []  # the local instance's session dir is gone
    assert not any(f"NANSCOPE_TEST_TAG={tag}".encode() in _environ(pid) for pid in os.listdir("/proc"))


def _environ(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes() if pid.isdigit() else b""
    except OSError:
        return b""


@pytest.mark.slow
@pytest.mark.skipif(not ray_session.available(), reason="needs the nanscope[ray] extra")
def test_a_task_that_fails_in_ray_is_its_file_s_one_line_error():
    import ray.exceptions  # optional: the nanscope[ray] extra; no Ray instance is started

    summary = ray_scan.failed("/d/12.pt", ray.exceptions.WorkerCrashedError())
    assert summary.path == "/d/12.pt" and summary.total == 0 and summary.would_nan == ""
    assert re.fullmatch(r"/d/12\.pt: Ray task failed: WorkerCrashedError: The worker died [^\n]*", summary.error)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [(["repro", "--launcher", "ray"], "--launcher ray"), (["scan", "DIR", "--ray"], "--ray")],
)
def test_without_ray_each_mode_says_how_to_install_it_in_one_line(argv, flag, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as where the extra is not installed
    argv = [str(tmp_path) if arg == "DIR" else arg for arg in argv]
    assert main(argv) == 2
    assert capsys.readouterr() == (
        "",
        f"nanscope {argv[0]}: error: {flag} needs Ray, which is not installed: pip install 'nanscope[ray]'\n",
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["repro", "--ray-address", "h:6379"], "--ray-address h:6379 goes with --launcher ray"),
        (["repro", "--traceback-out", "tb.txt"], "--traceback-out tb.txt goes with --launcher ray"),
        (["scan", "DIR", "--ray-address", "h:6379"], "--ray-address h:6379 goes with --ray"),
    ],
)
def test_ray_flags_without_ray_mode_are_one_line_errors(argv, message, tmp_path, capsys):
    assert main([str(tmp_path) if arg == "DIR" else arg for arg in argv]) == 2
    assert capsys.readouterr().err == f"nanscope {argv[0]}: error: {message}\n"


def test_ray_is_an_exactly_pinned_extra_the_tests_install_and_only_the_ray_modules_import():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["ray"] == ["ray==2.60.0"] and "nanscope[ray]" in extras["test"]
    importers = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(name.split(".")[0] == "ray" for name in names):
                importers.add(str(path.relative_to(SRC)))
    assert importers == RAY_MODULES


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(60)
@pytest.mark.skipif(not ray_session.available(), reason="needs the nanscope[ray] extra")
@pytest.mark.parametrize("command", ["scan", "repro"])
def test_an_address_where_nothing_listens_is_one_line_at_once(command, tmp_path, capsys):
    """Issue 32 item 7: `--ray-address 127.0.0.1:1` retried past 240 s, deaf to SIGTERM; now refused before Ray is
    imported (scan) or a launch starts (repro)."""
    demo.write_demo(tmp_path / "12.pt")
    address = f"127.0.0.1:{_closed_port()}"
    argv = {"scan": ["scan", str(tmp_path), "--ray"], "repro": ["repro", "--launcher", "ray", "--hazard", "healthy"]}
    started = time.monotonic()
    assert main([*argv[command], "--ray-address", address]) == 2
    assert time.monotonic() - started < 30  # a hang check: it retried for 240 s before
    assert capsys.readouterr() == (
        "",
        f"nanscope {command}: error: --ray-address {address}: cannot connect (Connection refused): start the "
        "cluster's head there (`ray start --head`) or give its HOST:PORT\n",
    )


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("head", "--ray-address head: expected HOST:PORT of the cluster's head (its GCS port, 6379 by default)"),
        ("head:0", "--ray-address head:0: expected HOST:PORT of the cluster's head (its GCS port, 6379 by default)"),
        ("FULL", "--ray-address FULL: no answer within 0.2 s (--ray-timeout): is the cluster's head there?"),
    ],
)
def test_the_probe_refuses_in_one_line_within_its_bound(address, message):
    with socket.socket() as full, socket.socket() as queued:
        full.bind(("127.0.0.1", 0))
        full.listen(0)  # one connection queued, never accepted: the next one's SYN is dropped, its connect waits
        queued.connect(full.getsockname())
        where = f"127.0.0.1:{full.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(UserError) as raised:
            ray_session.probe(address.replace("FULL", where), timeout_s=0.2)
        assert str(raised.value) == message.replace("FULL", where) and time.monotonic() - started < 5


def _silent_listener() -> socket.socket:
    """A port that accepts connections (the kernel's backlog) and never answers: no Ray head."""
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    return server


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(not ray_session.available(), reason="needs the nanscope[ray] extra")
def test_an_address_that_never_answers_is_bounded_and_sigterm_ends_it_at_once(tmp_path):
    demo.write_demo(tmp_path / "dumps" / "12.pt")
    with _silent_listener() as server:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        argv = [sys.executable, "-m", "nanscope.cli.main", "scan", str(tmp_path / "dumps"), "--ray",
                "--ray-address", address]  # fmt: skip
        proc = subprocess.run([*argv, "--ray-timeout", "3"], capture_output=True, text=True, timeout=120)
        ours = [line for line in proc.stderr.splitlines() if line.startswith("nanscope")]
        assert (proc.returncode, ours) == (
            2,
            [
                f"nanscope scan: error: --ray-address {address}: ray.init did not connect within 3 s (--ray-timeout): "
                "something answers there, but not a Ray cluster's head (its GCS port, 6379 by default)"
            ],
        )
        waiting = subprocess.Popen([*argv, "--ray-timeout", "100"], stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(8)  # Ray imported, ray.init retrying
            assert waiting.poll() is None
            waiting.send_signal(signal.SIGTERM)
            waiting.wait(timeout=30)  # the bound: well under --ray-timeout's 100 s, not a speed
            assert waiting.returncode == -signal.SIGTERM
        finally:
            waiting.kill()
            waiting.communicate()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(not ray_session.available(), reason="needs the nanscope[ray] extra")
def test_repro_s_ray_driver_gives_up_joining_after_the_bound_in_one_line(capsys):
    """The probe passes (the port accepts); the driver's ray.init never connects: the launch's one line, exit 2."""
    with _silent_listener() as server:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        argv = ["repro", "--launcher", "ray", "--ray-address", address, "--ray-timeout", "3", "--hazard", "healthy"]
        assert main(argv) == 2
    assert capsys.readouterr() == (
        "",
        f"nanscope repro: error: --ray-address {address}: ray.init did not connect within 3 s (--ray-timeout): "
        "something answers there, but not a Ray cluster's head (its GCS port, 6379 by default)\n",
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ray_session.available(), reason="needs the nanscope[ray] extra")
def test_scan_joins_a_running_cluster_and_equals_the_local_scan(tmp_path):
    """--ray-address joins a head started by `ray start --head` (ray.init in the joining thread), then leaves it as
    it was; the head is ended by its session dir, never `ray stop` (every Ray on the machine)."""
    dumps = tmp_path / "dumps"
    _dumps(dumps)
    head = Path(tempfile.mkdtemp(prefix="nh", dir="/tmp"))  # Ray's sockets: a short path
    env = {**os.environ, **ray_session.LOCAL_ENV}
    port = _closed_port()
    try:
        subprocess.run(
            ["ray", "start", "--head", "--port", str(port), "--num-cpus", "2", "--include-dashboard", "false",
             "--temp-dir", str(head), "--disable-usage-stats"],
            env=env, capture_output=True, timeout=180, check=True,
        )  # fmt: skip
        argv = [sys.executable, "-m", "nanscope.cli.main", "scan", str(dumps)]
        local = subprocess.run([*argv, "--json", str(tmp_path / "l.json")], capture_output=True, text=True, timeout=60)
        joined = subprocess.run(
            [*argv, "--ray", "--ray-address", f"127.0.0.1:{port}", "--json", str(tmp_path / "r.json")],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        ray_session.reap(str(head))
        shutil.rmtree(head, ignore_errors=True)
    assert (joined.returncode, joined.stdout) == (local.returncode, local.stdout), joined.stderr[-2000:]
    assert _json(tmp_path / "r.json") == _json(tmp_path / "l.json")

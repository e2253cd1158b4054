"""Ray for nanscope (the `nanscope[ray]` extra): join a cluster, or start a local instance that leaves nothing behind.

    ray_session.require("--launcher ray")            # UserError (one line) when Ray is not installed
    with ray_session.session(address=None, cpus=4):  # ray.init; on exit ray.shutdown and the cleanup below
        ...
    ray_session.probe("head:6379", timeout_s=60)     # UserError (one line) when nothing answers there

A local instance runs without a dashboard, with `cpus` CPUs, on loopback only and off ~/.ray (`LOCAL_ENV`), and
keeps its session directory (logs, sockets) in a temp dir of nanscope's own, marked as this process's
(`scratch.directory`). Its processes (gcs_server, raylet, the monitors, the agents, the workers) hold files under
that dir or name it in their command line, which is how `reap` finds them, and only them: never another user's
or another run's Ray (`ray stop` would end every Ray on the machine). On exit `ray.shutdown()` ends them and
`reap` ends what is left (the agents linger a minute after their raylet); a process killed with SIGKILL cleans
nothing up, so a reaper (`python -m nanscope.megatron.ray_session`, started next to the instance) watches it and
then reaps and removes the dir. Joining `address`, nanscope starts nothing and leaves the cluster as it was (the
actors and tasks it started end with it: Ray ends what a dead driver owned).

Joining is bounded by `timeout_s` (--ray-timeout): ray.init has no connect timeout of its own and retries an address
where nothing answers for minutes, deaf to SIGTERM while it does. So the head's port is probed first (`probe`: a TCP
connection, refused or unanswered in one line), then ray.init runs in a thread of its own while this one waits
(signals are handled here, at once); past the bound, one line (`UserError`) and the thread is left to the exit.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

from nanscope.errors import UserError
from nanscope.megatron import scratch
from nanscope.megatron.proctree import alive

INSTALL = "pip install 'nanscope[ray]'"
# Set before ray.init of a local instance (the workers inherit them): no token file in ~/.ray, no usage report,
# and Ray's single-node mode, in which the node's address is 127.0.0.1 and every process listens on loopback.
LOCAL_ENV = MappingProxyType(
    {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
)
OBJECT_STORE_BYTES = 128 * 1024 * 1024  # records and summaries are small; Ray's default takes 30% of memory
SOCKET_PATH_MAX = 107  # AF_UNIX: Ray's sockets live under the session dir
SOCKET_TAIL = len("/session_2026-12-01_19-38-06_791234_4194304/sockets/plasma_store")
POLL_S = 0.2
TIMEOUT_S = 60.0  # --ray-timeout's default: joining a cluster (probe and ray.init)
CONNECT_ERROR = "ray-connect-error.txt"  # the Ray driver's one line when it cannot join (launcher.launch raises it)


def available() -> bool:
    """Ray can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False


def require(flag: str) -> None:
    """Raise UserError (one line, saying how to install it) when Ray is not installed."""
    if not available():
        raise UserError(f"{flag} needs Ray, which is not installed: {INSTALL}")


@contextlib.contextmanager
def session(
    address: str | None = None,
    *,
    cpus: int,
    temp: str | None = None,
    timeout_s: float = TIMEOUT_S,
    gpus: int | None = None,
) -> Iterator[str | None]:
    """ray.init, joining `address` or starting a local instance of `cpus` CPUs; yields the local instance's dir
    (None when joining). On exit: ray.shutdown, and for a local instance `reap`.

    temp: the dir for the local instance's session, a marked scratch dir its owner removes (the harness's launch
        passes its own); None: a new one, removed on exit.
    timeout_s: the bound on joining `address` (`probe`, then ray.init); UserError past it.
    gpus: logical GPUs the local instance offers (Ray resources only: `repro --slime-src` gives slime the GPUs it
        schedules its actors on; nothing runs on a GPU); None: what Ray detects.
    """
    if address is not None:
        deadline = time.monotonic() + timeout_s
        probe(address, timeout_s)  # before Ray's import: nothing there is one line in a second
        import ray  # optional: the nanscope[ray] extra, only --launcher ray and scan --ray use it

        _join(address, timeout_s, max(0.0, deadline - time.monotonic()))
        try:
            yield None
        finally:
            ray.shutdown()
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(_env(LOCAL_ENV))  # before ray's import: it reads the single-node switch there
        import ray  # optional: the nanscope[ray] extra, only --launcher ray and scan --ray use it

        if temp is None:
            scratch.sweep()  # what killed runs left behind
            temp = stack.enter_context(scratch.directory("nanscope-ray-"))
        check_temp(temp)
        reaper = _start_reaper(temp)
        stack.callback(_stop_reaper, reaper, temp)
        ray.init(
            num_cpus=cpus,
            num_gpus=gpus,
            include_dashboard=False,
            _temp_dir=temp,
            _node_ip_address="127.0.0.1",  # with the single-node switch: everything on loopback
            object_store_memory=OBJECT_STORE_BYTES,
            log_to_driver=True,
            logging_level=logging.WARNING,  # not "Started a local Ray instance." on every run
        )
        stack.callback(ray.shutdown)
        yield temp


def probe(address: str, timeout_s: float = TIMEOUT_S, flag: str = "--ray-address") -> None:
    """A TCP connection to `address`'s head (HOST:PORT, or ray://HOST:PORT) within `timeout_s`; "auto" and "local"
    are Ray's to resolve (ray.init's bound covers them).

    Raises:
        UserError: one line naming the flag and the address: not HOST:PORT, refused, unreachable, or no answer.
    """
    if address.strip() in ("auto", "local"):
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{flag} {address}: expected HOST:PORT of the cluster's head (its GCS port, 6379 by default)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except TimeoutError:
        raise UserError(
            f"{flag} {address}: no answer within {timeout_s:g} s (--ray-timeout): is the cluster's head there?"
        ) from None
    except OSError as e:  # refused, unreachable, a name that does not resolve
        why = e.strerror or str(e) or type(e).__name__
        raise UserError(
            f"{flag} {address}: cannot connect ({why}): start the cluster's head there (`ray start --head`) or give "
            "its HOST:PORT"
        ) from None


def _join(address: str, timeout_s: float, left_s: float) -> None:
    """ray.init(address) in a thread of its own, waited for at most `left_s`: this thread keeps handling signals."""
    import ray  # optional: the nanscope[ray] extra

    done, failed = threading.Event(), []

    def init() -> None:
        try:
            ray.init(address=address, log_to_driver=True, logging_level=logging.WARNING)
        except BaseException as e:  # noqa: BLE001 - raised again in the waiting thread
            failed.append(e)
        finally:
            done.set()

    quiet = _NotMainThread()
    logging.getLogger("ray._private.worker").addFilter(quiet)  # "SIGTERM handler is not set": ours is
    try:
        threading.Thread(target=init, name="nanscope-ray-init", daemon=True).start()
        joined = done.wait(left_s)
    finally:
        logging.getLogger("ray._private.worker").removeFilter(quiet)
    if not joined:
        raise UserError(
            f"--ray-address {address}: ray.init did not connect within {timeout_s:g} s (--ray-timeout): something "
            "answers there, but not a Ray cluster's head (its GCS port, 6379 by default)"
        )
    if failed:
        raise failed[0]


class _NotMainThread(logging.Filter):
    """Drops Ray's warning that a ray.init outside the main thread sets no SIGTERM handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


def check_temp(temp: str) -> None:
    """Raise UserError (one line) when Ray's socket paths under `temp` would be too long for AF_UNIX."""
    if len(temp) + SOCKET_TAIL > SOCKET_PATH_MAX:
        raise UserError(
            f"{temp}: too long a path for a Ray session dir (its sockets' paths would pass {SOCKET_PATH_MAX} "
            "bytes): set TMPDIR to a shorter directory"
        )


def _stop_reaper(reaper: subprocess.Popen, temp: str) -> None:
    """After ray.shutdown: end what it left of the instance (and the reaper, which names `temp`)."""
    reap(temp)
    reaper.terminate()
    reaper.wait()


@contextlib.contextmanager
def _env(values) -> Iterator[None]:
    """os.environ with `values` set, restored after."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _start_reaper(temp: str) -> subprocess.Popen:
    """The watch of this process: when it is gone, reap `temp`'s processes and remove it."""
    cmd = [sys.executable, "-m", __name__, "--parent", str(os.getpid()), "--dir", temp]
    # its own session: a Ctrl-C in the terminal is for this process, which cleans up itself
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)


def holders(temp: str) -> list[int]:
    """The processes, other than this one, that name `temp` in their command line or hold a file under it."""
    root = os.path.realpath(temp)
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if root in Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(entry))
                continue
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:  # gone, or not ours to read
            continue
        if any(_under(f"/proc/{entry}/fd/{fd}", root) for fd in fds):
            found.append(int(entry))
    return found


def _under(link: str, root: str) -> bool:
    try:
        return os.readlink(link).startswith(root + "/")
    except OSError:
        return False


def reap(temp: str, grace_s: float = 2.0) -> list[int]:
    """SIGTERM the processes of `temp` (`holders`), SIGKILL those left after `grace_s`; returns the pids signalled."""
    pids = holders(temp)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        if sig == signal.SIGTERM:
            pids += [pid for pid in holders(temp) if pid not in pids]
    return pids


def main(argv: list[str] | None = None) -> int:
    """The reaper: waits for --parent to be gone, then reaps --dir and removes it."""
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args(argv)
    parent = scratch.identity(args.parent)
    while parent is not None and scratch.identity(args.parent) == parent:
        time.sleep(POLL_S)
    reap(args.dir)
    shutil.rmtree(args.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A directory's scan ended early (a stop its `check` raises): its workers and the pool's manager thread are gone
when the stop propagates, so an exit right after it has nothing to race (issue 42: CPython 3.11's exit hook wrote to
the manager's closed wake-up pipe, one traceback under `scan DIR`'s line on a loaded machine)."""

import os
import threading
from multiprocessing import active_children

import pytest

from nanscope import case
from nanscope.dumps import demo, many, writers

FILES = 40


class Stop(Exception):
    pass


@pytest.mark.timeout(240)
def test_a_stopped_scan_leaves_no_worker_and_no_thread(tmp_path):
    samples = [demo.rollout_sample(i, 64, 8000, as_lists=False) for i in range(32)]
    writers.write_rollout_dump(tmp_path / "0.pt", samples)
    for i in range(1, FILES):
        os.link(tmp_path / "0.pt", tmp_path / f"{i}.pt")
    threads, children = set(threading.enumerate()), set(active_children())
    done = []

    def check() -> None:
        raise Stop  # at the first poll: the workers are starting or scanning their first files

    with pytest.raises(Stop):
        many.scan_files(many.find_dumps(tmp_path)[0], case.scan_config(), workers=2, done=done.append, check=check)
    assert set(threading.enumerate()) - threads == set()  # the pool's manager thread, joined before the raise
    assert set(active_children()) - children == set()
    assert len(done) < FILES

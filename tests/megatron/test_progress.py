"""A launch's progress lines (issue 42 item 3): rank 0 notes each step and run in the out directory; the launcher
reads them back, each once, while the launch runs and when it ends."""

from nanscope.megatron import progress


def test_notes_are_read_back_in_order_once_and_a_cut_line_is_not(tmp_path):
    seen = []
    with progress.watched(tmp_path, lambda *event: seen.append(event)):
        progress.note(tmp_path, run=0, step=1, steps=2)
        progress.note(tmp_path, run=0, step=2, steps=2)
        progress.note(tmp_path, run=0)
        with open(tmp_path / progress.FILE, "a") as f:
            f.write("run 1 ste")  # a rank killed mid-line: never a line
    assert seen == [(0, 1, 2), (0, 2, 2), (0, None, None)]
    assert [progress.parse(line) for line in ("run 1 step x 2", "run 1 done", "junk", "run 3 step 4 5 6")] == [
        None, (1, None, None), None, None,
    ]  # fmt: skip


def test_no_callback_reads_nothing_and_a_note_that_cannot_be_written_is_dropped(tmp_path):
    with progress.watched(tmp_path, None):
        pass
    progress.note(tmp_path / "gone", run=0)  # no such directory: dropped, never raised into a rank
    assert not (tmp_path / progress.FILE).exists()

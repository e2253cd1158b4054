"""A long command's progress on stderr: one line a step, run or file, under a rich progress display on a terminal,
plain lines when stderr is a file or a pipe; nothing with --quiet.

    with progress.Lines("repro", quiet=args.quiet, total=10) as lines:
        run_matrix(..., progress=lines)          # lines("run 3 of 10 done: kl-exp-overflow, as-is")

Each line reads `nanscope repro: run 3 of 10 done: ...`. Lines may come from a thread (the launch's watcher): rich's
display and print() both take them.
"""

from __future__ import annotations

import sys
import threading

from nanscope.cli import terminal
from nanscope.inputs import printable
from nanscope.report.text import folded


class Lines:
    """The callable a long run reports to; a context manager around the run."""

    def __init__(self, command: str, *, quiet: bool, total: int | None = None, bar: bool | None = None) -> None:
        self.command, self.quiet, self.total = command, quiet, total
        self.bar = sys.stderr.isatty() if bar is None else bar
        self.lock = threading.Lock()
        self.display = None  # rich's Progress, on a terminal
        self.task = None

    def __enter__(self) -> Lines:
        if self.bar and not self.quiet:
            from rich.progress import (  # heavy: rich, only a terminal's display needs it
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            columns = [TextColumn(f"nanscope {self.command}")]
            columns += [BarColumn(), MofNCompleteColumn()] if self.total else []
            self.display = Progress(
                *columns, TimeElapsedColumn(), console=terminal.console(stderr=True), transient=True
            )
            self.display.start()
            self.task = self.display.add_task(self.command, total=self.total)
        return self

    def __exit__(self, *exc) -> None:
        if self.display is not None:
            self.display.stop()

    def __call__(self, line: str, *, advance: bool = True) -> None:
        if self.quiet:
            return
        text = f"nanscope {self.command}: {printable(line)}"
        with self.lock:
            if self.display is None:  # folded at the width, as every line of output
                print(folded(text, terminal.width(sys.stderr)), file=sys.stderr, flush=True)
                return
            self.display.console.print(text, highlight=False, markup=False)
            if advance:
                self.display.advance(self.task)

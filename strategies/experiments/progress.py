"""Progress of a study on stderr: tasks done, the current rate and the time left."""

from __future__ import annotations

import sys
import time

from .design import cell_label


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class StudyProgress:
    """``study: 12/40 tasks, 3/10 cells done, 4m10s elapsed, about 9m20s left`` on stderr
    (rewritten in place on a terminal, one line per finished task otherwise)."""

    def __init__(self, tasks: list[tuple[dict, int]], done: set, quiet: bool = False) -> None:
        self.total = len(tasks)
        self.quiet = quiet
        self.stream = sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.perf_counter()
        self.finished_now = 0
        self.left_per_cell: dict[str, int] = {}
        for cell, rep in tasks:
            label = cell_label(cell)
            self.left_per_cell.setdefault(label, 0)
            if (label, rep) not in done:
                self.left_per_cell[label] += 1
        self.done_before = sum(1 for c, r in tasks if (cell_label(c), r) in done)

    @property
    def cells_done(self) -> int:
        return sum(1 for v in self.left_per_cell.values() if v == 0)

    def line(self) -> str:
        done = self.done_before + self.finished_now
        elapsed = time.perf_counter() - self.t0
        todo = self.total - done
        if self.finished_now:
            eta = f"about {_hms(elapsed / self.finished_now * todo)} left"
        else:
            eta = "time left: estimating" if todo else "nothing left"
        return (
            f"study: {done}/{self.total} tasks, {self.cells_done}/{len(self.left_per_cell)} "
            f"cells done, {_hms(elapsed)} elapsed, {eta}"
        )

    def say(self, text: str) -> None:
        if not self.quiet:
            self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
            self.stream.flush()

    def show(self) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\033[K" + self.line())
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def task_done(self, cell: dict, rep: int) -> None:
        """Count a task finished in this run and show the progress line.

        Parameters
        ----------
        cell : dict
            The task's design values.
        rep : int
            Its replication.
        """
        self.finished_now += 1
        self.left_per_cell[cell_label(cell)] -= 1
        self.show()

    def close(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()

"""Independent pieces of work (a cross-validation's folds, one fold's paths each) in a pool
of processes, in item order, with a progress line; an error, Ctrl-C or SIGTERM stops the
workers by their pids."""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from .. import quiet_flower


def default_jobs(n_items: int) -> int:
    """Processes for ``n_items`` independent pieces: one per core, at most one per piece."""
    return max(1, min(n_items, os.cpu_count() or 1))


class PieceProgress:
    """``label: 7/20 done, 35 s, about 60 s left`` on stderr, at most every 2 s (and at the
    end), unless ``quiet``."""

    def __init__(self, label: str, total: int, quiet: bool = False, stream=None) -> None:
        self.label, self.total, self.quiet = label, total, quiet
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.perf_counter()
        self.last = -math.inf

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        if self.quiet or (now - self.last < 2.0 and done < self.total):
            return
        self.last = now
        elapsed = now - self.t0
        left = ""
        if 0 < done < self.total:
            left = f", about {elapsed / done * (self.total - done):.0f} s left"
        self.stream.write(f"{self.label}: {done}/{self.total} done, {elapsed:.0f} s{left}\n")
        self.stream.flush()


@contextlib.contextmanager
def _terminate_raises():
    """SIGTERM raises KeyboardInterrupt in the main thread while the pool runs (so the
    workers are stopped too); elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_items(
    fn: Callable, items: Sequence, jobs: int = 1, progress: PieceProgress | None = None
) -> list:
    """``[fn(item) for item in items]``, in ``jobs`` processes when ``jobs > 1``; results in
    item order.

    Parameters
    ----------
    fn : callable
        Called on each item; with ``jobs > 1`` it must pickle.
    items : sequence
        The pieces of work; with ``jobs > 1`` they must pickle.
    jobs : int, optional
        The processes (spawned; Flower's log quiet in each); 1 or fewer, or a single
        item: in this process.
    progress : PieceProgress, optional
        Called with the count of pieces done as each one ends.

    Returns
    -------
    list
        ``fn``'s results, in item order.
    """
    out: list = [None] * len(items)
    if jobs <= 1 or len(items) <= 1:
        for i, item in enumerate(items):
            out[i] = fn(item)
            if progress is not None:
                progress(i + 1)
        return out
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads
    pool = ProcessPoolExecutor(jobs, mp_context=ctx, initializer=quiet_flower)
    workers = []
    try:
        with _terminate_raises():
            futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
            workers = list(getattr(pool, "_processes", {}).values())
            for done, fut in enumerate(as_completed(futures), start=1):
                out[futures[fut]] = fut.result()
                if progress is not None:
                    progress(done)
    except BaseException:
        # an error, Ctrl-C or SIGTERM: stop the workers by their pids now, not after their
        # current piece
        workers = workers or list(getattr(pool, "_processes", {}).values())
        for proc in workers:
            proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return out

"""The server's model problems of a batched run, solved in worker processes.

In a federated tuning every running fit solves its own model problem each round
(:func:`strategies.solvers.modelsolve.solve_model`); :mod:`strategies.solvers.lockstep`
gathers them, and
:class:`ModelWorkers` answers the gathered requests: each step's first ones in the server's
process, for up to :data:`PARALLEL_AFTER` seconds, and the rest in a pool of worker
processes if there is a rest and each problem took at least :data:`MIN_PARALLEL` (so a
tuning with few or cheap fits never starts one).  The
requests are independent and each is solved by the same deterministic code wherever it
runs, so the answers, and the whole tuning, are the same to the last bit with any number of
workers.

The workers are started with ``spawn`` (a clean interpreter: the server may hold threads,
gRPC channels or Ray, which a fork would copy) without the caller's ``__main__``, all at
once when the pool starts; they hold nothing between steps, and are stopped
by :meth:`ModelWorkers.close` when the batch ends; a worker whose parent has gone exits by
itself within a second.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
import time
import types
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from logging import WARNING

from flwr.common.logger import log

from ..solvers import modelsolve

#: Seconds of a step's model problems solved in the server's process before the rest go
#: to the workers ...
PARALLEL_AFTER = 0.5
#: ... if they took at least this long each (seconds): sending one costs about 0.5 ms
#: (a GrAUC-PFL fit's, about 2 ms to solve, stays; a RowFed fit's, about 50 ms, goes).
MIN_PARALLEL = 0.01
#: A step whose problems proved cheaper than :data:`MIN_PARALLEL` is not gathered (the
#: fits step one after another, their problems solved where they arise: the same answers
#: without the cooperative threads' cost); every this many steps it is gathered again to
#: measure anew.
PROBE_EVERY = 10
#: At most this many workers by default (one per available core up to it).
MAX_DEFAULT_WORKERS = 4


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    """One worker per available core, at most :data:`MAX_DEFAULT_WORKERS`; 0 on one core."""
    cores = available_cores()
    return 0 if cores < 2 else min(cores, MAX_DEFAULT_WORKERS)


def _watch_parent(parent: int) -> None:
    """In a worker: exit when the process that started it has gone (killed without a
    chance to stop its pool)."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


@contextlib.contextmanager
def _without_main():
    """Workers started here do not import the caller's ``__main__``: ``spawn`` re-imports
    it in every new process (to find what it defines), which would run a script that does
    its work at the top level once more per worker; they need only this package."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _solve_chunk(requests: Sequence[modelsolve.ModelRequest]) -> list[modelsolve.ModelSolution]:
    return [modelsolve.solve_request(r) for r in requests]


class ModelWorkers:
    """The batch function of :func:`strategies.solvers.lockstep.run` for model problems: the
    answers to ``requests``, in order (module docstring).  ``workers``: the pool's size
    (``None``: :func:`default_workers`; 0 or 1: always in this process); ``after``: the
    seconds of each step solved here first (``None``: :data:`PARALLEL_AFTER`; 0: every
    step of two or more problems to the workers)."""

    def __init__(self, workers: int | None = None, after: float | None = None) -> None:
        self.workers = default_workers() if workers is None else int(workers)
        if self.workers < 0:
            raise ValueError(f"workers: must be 0 or more, got {self.workers}")
        self.after = PARALLEL_AFTER if after is None else float(after)
        self._pool: ProcessPoolExecutor | None = None
        self.steps = {"serial": 0, "parallel": 0}
        self._per_problem: float | None = None  # seconds, measured at the last gathering
        self._since_probe = 0

    def gathers(self) -> bool:
        """Whether the next step's problems are worth gathering: there are workers, and the
        problems were not found cheap at the last measurement (:data:`PROBE_EVERY`)."""
        if self.workers < 2:
            return False
        if self._per_problem is None or self._per_problem >= MIN_PARALLEL:
            return True
        self._since_probe += 1
        if self._since_probe >= PROBE_EVERY:
            self._since_probe = 0
            return True
        return False

    @property
    def started(self) -> bool:
        return self._pool is not None

    def pids(self) -> list[int]:
        """The running workers' process ids."""
        procs = getattr(self._pool, "_processes", None) or {}
        return sorted(procs)

    def __call__(self, requests: list[modelsolve.ModelRequest]) -> list[modelsolve.ModelSolution]:
        if self.workers < 2 or len(requests) < 2:
            self.steps["serial"] += 1
            return _solve_chunk(requests)
        # here first, while that is quick; the rest to the workers when there is a rest and
        # each problem costs well above what sending it costs
        out: list[modelsolve.ModelSolution] = []
        t0 = time.perf_counter()
        while len(out) < len(requests) and time.perf_counter() - t0 <= self.after:
            out.append(modelsolve.solve_request(requests[len(out)]))
        rest = requests[len(out) :]
        if out:
            self._per_problem = (time.perf_counter() - t0) / len(out)
        if not rest or (out and (time.perf_counter() - t0) / len(out) < MIN_PARALLEL):
            self.steps["serial"] += 1
            return out + _solve_chunk(rest)
        return out + self._parallel(rest)

    def _parallel(self, requests: list[modelsolve.ModelRequest]) -> list[modelsolve.ModelSolution]:
        # several chunks per worker: balanced (fits differ in cost) at little pickling
        n = len(requests)
        k = min(n, 8 * self.workers)
        chunks = [requests[i * n // k : (i + 1) * n // k] for i in range(k)]
        try:
            parts = list(self._start().map(_solve_chunk, chunks))
        except (BrokenProcessPool, OSError, AssertionError) as exc:  # no workers to be had
            log(WARNING, "server workers unavailable (%s); solving in the server's process", exc)
            self.close()
            self.workers = 0
            self.steps["serial"] += 1
            return _solve_chunk(requests)
        self.steps["parallel"] += 1
        return [sol for part in parts for sol in part]

    def _start(self) -> ProcessPoolExecutor:
        if self._pool is None:
            with _without_main():  # every worker now, none re-running the caller's script
                pool = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_watch_parent,
                    initargs=(os.getpid(),),
                )
                self._pool = pool
                started = [pool.submit(os.getpid) for _ in range(self.workers)]
            for f in started:
                f.result()
        return self._pool

    def close(self) -> None:
        """Stop the workers (waiting for them to exit)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ModelWorkers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["ModelWorkers", "available_cores", "default_workers"]

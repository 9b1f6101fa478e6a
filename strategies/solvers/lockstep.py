"""Many calls run in lockstep so that their expensive steps can be done together.

A federated tuning hands every fit's answers to its own strategy, one fit after another
(:mod:`strategies.server.batch`); with the proximal quasi-Newton solver each of them then solves
its server model problem, an inner ADMM of tens to hundreds of milliseconds.  One fit after
another, hundreds of fits make the server's step seconds a round on one core; gathered,
the model problems of all fits can be solved in several processes at once
(:mod:`strategies.server.workers`).

:func:`run` executes the calls as cooperative threads: exactly one runs at any time, in
the order given, until it finishes or asks for a deferred step through :func:`call`.
When every call has done one or the other, the waiting requests are handed to the batch
function at once, and the calls resume in order with their answers.  Nothing runs
concurrently, so the calls see the same state, in the same order, as when run one after
another; outside :func:`run`, :func:`call` simply applies the single function.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

_LOCAL = threading.local()


class _Worker:
    def __init__(self, fn: Callable[[], Any], yielded: threading.Semaphore) -> None:
        self.fn = fn
        self.resume = threading.Semaphore(0)
        self.yielded = yielded
        self.request: Any = None
        self.answer: Any = None
        self.failure: BaseException | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        self.resume.acquire()
        _LOCAL.worker = self
        try:
            self.result = self.fn()
        except BaseException as exc:  # re-raised by run() in the caller's thread
            self.error = exc
        finally:
            self.done = True
            self.yielded.release()

    def wait_for(self, request: Any) -> Any:
        """Hand ``request`` to the scheduler and sleep until its answer is in."""
        self.request = request
        self.yielded.release()
        self.resume.acquire()
        answer, failure = self.answer, self.failure
        self.answer = self.failure = None
        if failure is not None:
            raise failure
        return answer


def call(single: Callable[[Any], Any], request: Any) -> Any:
    """``single(request)``, or, inside :func:`run`, the answer of the batch function to this
    request among the others waiting.

    Parameters
    ----------
    single : callable
        The function that answers one request outside :func:`run`.
    request : object
        The request.

    Returns
    -------
    object
        Its answer.
    """
    worker = getattr(_LOCAL, "worker", None)
    if worker is None:
        return single(request)
    return worker.wait_for(request)


def run(calls: Sequence[Callable[[], Any]], batch: Callable[[list], list]) -> list:
    """Run ``calls`` in lockstep (module docstring); the first call that raised re-raises
    here once every call has finished.

    Parameters
    ----------
    calls : sequence of callable
        The calls, each without arguments.
    batch : callable
        ``batch(requests)`` answers the deferred requests of one step, in order (a list of
        answers).

    Returns
    -------
    list
        The calls' results, in order.
    """
    if not calls:
        return []
    yielded = threading.Semaphore(0)
    workers = [_Worker(fn, yielded) for fn in calls]

    def step(worker: _Worker) -> None:
        worker.resume.release()
        yielded.acquire()  # it finished or asked for a deferred step

    for w in workers:
        w.thread.start()
        step(w)
    while True:
        waiting = [w for w in workers if not w.done and w.request is not None]
        if not waiting:
            break
        requests = [w.request for w in waiting]
        for w in waiting:
            w.request = None
        try:
            answers = batch(requests)
        except BaseException as exc:  # every waiting call fails; the first with the cause
            waiting[0].failure = exc
            for w in waiting[1:]:
                w.failure = RuntimeError("lockstep: the batch of this step failed")
        else:
            for w, a in zip(waiting, answers, strict=True):
                w.answer = a
        for w in waiting:
            step(w)
    for w in workers:
        w.thread.join()
    for w in workers:
        if w.error is not None:
            raise w.error
    return [w.result for w in workers]


__all__ = ["call", "run"]

"""Two ways to run the same Strategy and NumPyClient objects.

- :func:`run_inprocess`: Flower's own ``Server`` over in-process client proxies, for tests
  and large studies.  Messages go through Flower's own serialization
  (``NumPyClient.to_client()``), so the numbers equal those of ``flwr run``.
- :class:`StoppingServer`: Flower's ``Server`` that stops sending work once the strategy has
  finished (the remaining rounds of ``num_rounds`` pass empty and silent), used by both.
"""

from __future__ import annotations

import logging
import re
from logging import INFO

from flwr.common import log
from flwr.server import Server
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from .. import flower_quieted

#: A round line of :func:`round_logger` in a log: method, round, limit, the rest.
ROUND_LINE = re.compile(r"([\w-]+) round (\d+)(?:/(\d+))?: (objective .*)$")


def round_logger(method: str, every: int = 1, limit: int | None = None):
    """A ``progress`` callback for strategies: logs round, objective, residuals and elapsed
    time every ``every`` rounds (and round 1).  The lines have the form
    ``<method> round <k>/<limit>: objective ...`` (:data:`ROUND_LINE` reads them).

    Parameters
    ----------
    method : str
        The name that starts each line.
    every : int, optional
        The rounds between two lines.
    limit : int, optional
        The round limit the lines show (``None``: ``<method> round <k>: ...``).

    Returns
    -------
    callable
        ``progress(round, objective, residuals, elapsed)``, ``residuals`` ``None`` or
        an object with ``describe()``.
    """
    of = "" if limit is None else f"/{int(limit)}"

    def report(rnd, objective, res, elapsed):
        if rnd % every and rnd > 1:
            return
        what = "" if res is None else f", {res.describe()}"
        log(
            INFO,
            "%s round %d%s: objective %.10g%s (%.1f s)",
            method,
            rnd,
            of,
            objective,
            what,
            elapsed,
        )

    return report


def log_line(line: str) -> None:
    """A progress line in the run's log (a federated tuning's rounds)."""
    log(INFO, "%s", line)


class InProcessClientProxy(ClientProxy):
    """A ``ClientProxy`` that calls a ``Client`` object directly."""

    def __init__(self, cid: str, client) -> None:
        super().__init__(cid)
        self.client = client

    def get_properties(self, ins, timeout, group_id):
        return self.client.get_properties(ins)

    def get_parameters(self, ins, timeout, group_id):
        return self.client.get_parameters(ins)

    def fit(self, ins, timeout, group_id):
        return self.client.fit(ins)

    def evaluate(self, ins, timeout, group_id):
        return self.client.evaluate(ins)

    def reconnect(self, ins, timeout, group_id):  # pragma: no cover - nothing to do
        raise NotImplementedError


def run_inprocess(strategy, clients, max_rounds: int) -> int:
    """Drive ``strategy`` with ``clients`` through Flower's own :class:`~flwr.server.Server`
    (one client at a time), for up to ``max_rounds`` rounds, stopping when the strategy has
    finished.

    Flower's per-round INFO log is silenced here (tests and studies run many fits); the
    strategies' warnings still show.

    Parameters
    ----------
    strategy : flwr.server.strategy.Strategy
        The strategy; it has finished when its ``finished`` is true.
    clients : sequence of NumPyClient
        The clients, registered as cids ``"0"``, ``"1"``, ... in their order.
    max_rounds : int
        The round limit.

    Returns
    -------
    int
        The number of rounds run.
    """
    manager = SimpleClientManager()
    for k, c in enumerate(clients):
        manager.register(InProcessClientProxy(str(k), c.to_client()))
    server = StoppingServer(client_manager=manager, strategy=strategy)
    server.set_max_workers(1)
    with flower_quieted():
        server.fit(max_rounds, timeout=None)
    return server.rounds_run


class _QuietOnceFinished(logging.Filter):
    """Drops Flower's per-round banner (``[ROUND n]`` and its blank line) for the empty rounds
    after the strategy has finished."""

    def __init__(self, server: StoppingServer) -> None:
        super().__init__()
        self.server = server

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            self.server.stopped and record.levelno == INFO and record.msg in ("", "[ROUND %s]")
        )


class StoppingServer(Server):
    """``flwr.server.Server`` that stops working once the strategy has ``finished`` (its
    method done and evaluated): the rest of Flower's ``num_rounds`` loop runs empty, without
    a message to any node and without a log line.  ``rounds_run`` counts the rounds that
    ran."""

    rounds_run = 0
    stopped = False

    def _stop_if_finished(self) -> bool:
        if not self.stopped and getattr(self.strategy, "finished", False):
            self.stopped = True
            log(INFO, "strategy finished after round %d", self.rounds_run)
        return self.stopped

    def fit_round(self, server_round, timeout):
        if self._stop_if_finished():
            return None
        self.rounds_run = server_round
        return super().fit_round(server_round, timeout)

    def evaluate_round(self, server_round, timeout):
        if self._stop_if_finished():
            return None
        return super().evaluate_round(server_round, timeout)

    def fit(self, num_rounds, timeout):
        quiet = _QuietOnceFinished(self)
        logger = logging.getLogger("flwr")
        logger.addFilter(quiet)
        try:
            return super().fit(num_rounds, timeout)
        finally:
            logger.removeFilter(quiet)


def stopping_server(strategy) -> StoppingServer:
    return StoppingServer(client_manager=SimpleClientManager(), strategy=strategy)

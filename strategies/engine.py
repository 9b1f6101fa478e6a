"""Two ways to run the same Strategy and NumPyClient objects.

- :func:`run_inprocess`: Flower's own ``Server`` over in-process client proxies, for tests
  and large studies.  Messages go through Flower's own serialization
  (``NumPyClient.to_client()``), so the numbers equal those of ``flwr run``.
- :class:`StoppingServer`: Flower's ``Server`` that ends the run once the strategy says it is
  ``done`` (no empty rounds up to ``num_rounds``), used by the ServerApp under ``flwr run``.
"""

from __future__ import annotations

import logging
from logging import INFO

from flwr.common import log
from flwr.server import Server
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.history import History


def round_logger(method: str, every: int = 1):
    """A ``progress`` callback for strategies: logs round, objective, residuals and elapsed
    time every ``every`` rounds (and round 1)."""

    def report(rnd, objective, res, elapsed):
        if rnd % every and rnd > 1:
            return
        if res is None:
            log(INFO, "%s round %d: objective %.10g (%.1f s)", method, rnd, objective, elapsed)
        else:
            log(
                INFO,
                "%s round %d: objective %.10g, %s (%.1f s)",
                method,
                rnd,
                objective,
                res.describe(),
                elapsed,
            )

    return report


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
    """Drive ``strategy`` with ``clients`` (``NumPyClient`` objects) through Flower's own
    :class:`~flwr.server.Server` (one client at a time), for up to ``max_rounds`` rounds,
    stopping when the strategy has finished.  Returns the number of rounds run.

    Flower's per-round INFO log is silenced here (tests and studies run many fits); the
    strategies' warnings still show.
    """
    manager = SimpleClientManager()
    for k, c in enumerate(clients):
        manager.register(InProcessClientProxy(str(k), c.to_client()))
    server = StoppingServer(client_manager=manager, strategy=strategy)
    server.set_max_workers(1)
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        server.fit(max_rounds, timeout=None)
    finally:
        logger.setLevel(level)
    return server.rounds_run


class _Done(Exception):
    pass


class StoppingServer(Server):
    """``flwr.server.Server`` that ends the round loop once the strategy has ``finished``
    (its method done and evaluated), instead of running empty rounds up to ``num_rounds``.
    ``rounds_run`` counts the rounds that ran."""

    rounds_run = 0

    def fit_round(self, server_round, timeout):
        if getattr(self.strategy, "finished", False):
            raise _Done(server_round)
        self.rounds_run = server_round
        return super().fit_round(server_round, timeout)

    def fit(self, num_rounds, timeout):
        try:
            return super().fit(num_rounds, timeout)
        except _Done as stop:
            log(INFO, "strategy finished after round %s", int(stop.args[0]) - 1)
            return History(), 0.0


def stopping_server(strategy) -> StoppingServer:
    return StoppingServer(client_manager=SimpleClientManager(), strategy=strategy)

"""Two ways to run the same Strategy and NumPyClient objects.

- :func:`run_inprocess`: a plain loop (``configure_fit -> client.fit -> aggregate_fit``, then
  ``configure_evaluate -> client.evaluate -> aggregate_evaluate``) over in-process client
  proxies, for tests and large studies.  Messages go through Flower's own serialization
  (``NumPyClient.to_client()``), so the numbers equal those of ``flwr run``.
- :class:`StoppingServer`: Flower's ``Server`` that ends the run once the strategy says it is
  ``done`` (no empty rounds up to ``num_rounds``), used by the ServerApp under ``flwr run``.
"""

from __future__ import annotations

from logging import INFO

from flwr.common import Code, GetParametersIns, log
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


def _call_all(instructions, method: str, server_round: int):
    results, failures = [], []
    for proxy, ins in instructions:
        try:
            res = getattr(proxy, method)(ins, None, server_round)
        except Exception as exc:  # a failing client is a failure, as in Flower
            failures.append(exc)
            continue
        (results if res.status.code == Code.OK else failures).append((proxy, res))
    return results, failures


def run_inprocess(strategy, clients, max_rounds: int) -> int:
    """Drive ``strategy`` with ``clients`` (``NumPyClient`` objects) for up to ``max_rounds``
    rounds, stopping when ``strategy.done``.  Returns the number of rounds run."""
    manager = SimpleClientManager()
    for k, c in enumerate(clients):
        manager.register(InProcessClientProxy(str(k), c.to_client()))
    params = strategy.initialize_parameters(client_manager=manager)
    if params is None:
        first = manager.all()[sorted(manager.all())[0]]
        params = first.get_parameters(GetParametersIns(config={}), None, 0).parameters
    rnd = 0
    for rnd in range(1, max_rounds + 1):
        if getattr(strategy, "done", False):
            return rnd - 1
        ins = strategy.configure_fit(server_round=rnd, parameters=params, client_manager=manager)
        if ins:
            results, failures = _call_all(ins, "fit", rnd)
            new, _ = strategy.aggregate_fit(rnd, results, failures)
            if new is not None and new.tensors:
                params = new
        ins = strategy.configure_evaluate(
            server_round=rnd, parameters=params, client_manager=manager
        )
        if ins:
            results, failures = _call_all(ins, "evaluate", rnd)
            strategy.aggregate_evaluate(rnd, results, failures)
    return rnd


class _Done(Exception):
    pass


class StoppingServer(Server):
    """``flwr.server.Server`` that stops the round loop once ``strategy.done`` is true (after
    that round's evaluation), instead of running empty rounds up to ``num_rounds``."""

    def fit_round(self, server_round, timeout):
        if getattr(self.strategy, "done", False):
            raise _Done(server_round)
        return super().fit_round(server_round, timeout)

    def fit(self, num_rounds, timeout):
        try:
            return super().fit(num_rounds, timeout)
        except _Done as stop:
            log(INFO, "strategy finished after round %s", int(stop.args[0]) - 1)
            return History(), 0.0


def stopping_server(strategy) -> StoppingServer:
    return StoppingServer(client_manager=SimpleClientManager(), strategy=strategy)

"""The in-process engine is Flower's own ``Server``: once a strategy has finished, the rest of
the ``num_rounds`` loop sends nothing and logs nothing, and Flower's history is kept."""

from __future__ import annotations

import logging

import pytest
from flwr.server.client_manager import SimpleClientManager

from grauc_flower import federation as fed
from grauc_flower.client import GrAUCClient
from grauc_flower.data import simulate
from strategies.config import GrAUCConfig
from strategies.runtime.engine import InProcessClientProxy, StoppingServer, run_inprocess
from strategies.server.registry import Registry


class _Counting(GrAUCClient):
    fits = 0
    evaluations = 0

    def fit(self, parameters, config):
        type(self).fits += 1
        return super().fit(parameters, config)

    def evaluate(self, parameters, config):
        type(self).evaluations += 1
        return super().evaluate(parameters, config)


def _federation(max_rounds=200):
    sites = simulate(n_sites=4, n_features=3, n_train=30, seed=11)
    cfg = GrAUCConfig(max_rounds=max_rounds)
    clients = [_Counting(s, cfg.ridge, index=k) for k, s in enumerate(sites)]
    strategy = fed.make_strategy("grauc", cfg, len(sites), Registry(), sites)
    return strategy, clients


def test_rounds_after_finishing_send_nothing():
    _Counting.fits = _Counting.evaluations = 0
    strategy, clients = _federation()
    rounds = run_inprocess(strategy, clients, 200)
    assert strategy.finished and 1 < rounds < 50
    assert rounds == strategy.rounds  # the start round (each site's own fit) is the first
    # one fit per site per round, one evaluation per site at the end; none afterwards
    assert _Counting.fits == 4 * rounds
    assert _Counting.evaluations == 4


def test_flower_history_is_kept_and_empty_rounds_are_silent(caplog):
    strategy, clients = _federation()
    manager = SimpleClientManager()
    for k, c in enumerate(clients):
        manager.register(InProcessClientProxy(str(k), c.to_client()))
    server = StoppingServer(client_manager=manager, strategy=strategy)
    server.set_max_workers(1)
    with caplog.at_level(logging.INFO, logger="flwr"):
        history, _ = server.fit(200, timeout=None)
    banners = [r.getMessage() for r in caplog.records if r.msg == "[ROUND %s]"]
    assert banners == [f"[ROUND {k}]" for k in range(1, server.rounds_run + 2)]
    assert "mean_auc" in history.metrics_distributed
    assert any("strategy finished after round" in r.getMessage() for r in caplog.records)


def test_flower_is_quieted_inside_the_block_and_restored_after_it_also_on_error():
    from flwr.common.logger import FLOWER_LOGGER

    from strategies import flower_quieted

    class Drop(logging.Filter):
        def filter(self, record):
            return False

    before = FLOWER_LOGGER.level
    FLOWER_LOGGER.setLevel(logging.INFO)
    try:
        drop = Drop()
        with pytest.raises(RuntimeError), flower_quieted(drop):
            assert FLOWER_LOGGER.level == logging.WARNING and drop in FLOWER_LOGGER.filters
            raise RuntimeError("a failing fit")
        assert FLOWER_LOGGER.level == logging.INFO and drop not in FLOWER_LOGGER.filters
        FLOWER_LOGGER.setLevel(logging.ERROR)  # never lowered
        with flower_quieted():
            assert FLOWER_LOGGER.level == logging.ERROR
    finally:
        FLOWER_LOGGER.setLevel(before)

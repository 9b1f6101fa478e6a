"""Flower's own strategies by name (``fedprox``, ``fedadam``, ``krum``, ...) for both methods.

Each name's global model after a few rounds is checked against a loop written here from the
published update rules (McMahan et al. 2017; Li et al. 2020; Hsu et al. 2019; Reddi et al.
2021; Yin et al. 2018; Blanchard et al. 2017), driven by the same clients' local work; the
local work itself (FedProx's proximal term) against the datafit's exact proximal map; and
the Flower simulation engine against the in-process engine with every name in one run.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT

from strategies.config import GLOBAL_METHODS, GrAUCConfig, RowFedConfig

ROUNDS = 4


def _server_rule(name: str, cfg):
    """A fresh server step ``w, answers, sizes, round -> w`` for method ``name``."""
    state: dict = {}

    def step(w, answers, sizes, rnd):
        answers = np.asarray(answers)
        sizes = np.asarray(sizes, dtype=float)
        mean = np.tensordot(sizes / sizes.sum(), answers, axes=1)
        delta = mean - w
        if name in ("fedavg", "fedprox"):
            return mean
        if name == "fedavgm":  # momentum on the pseudo-gradient w - mean
            m = -delta if rnd == 1 else cfg.fedavgm_momentum * state["m"] - delta
            state["m"] = m
            return w - cfg.fedavgm_lr * m
        if name in ("fedadagrad", "fedadam", "fedyogi"):
            b1 = 0.0 if name == "fedadagrad" else cfg.fedopt_beta_1
            b2 = cfg.fedopt_beta_2
            m = b1 * state.get("m", 0.0 * w) + (1 - b1) * delta
            v = state.get("v", 0.0 * w)
            if name == "fedadagrad":
                v = v + delta**2
            elif name == "fedadam":
                v = b2 * v + (1 - b2) * delta**2
            else:
                v = v - (1 - b2) * delta**2 * np.sign(v - delta**2)
            state["m"], state["v"] = m, v
            eta = cfg.fedopt_eta
            if name == "fedadam":  # Flower's bias correction counts the round from 2
                eta = eta * np.sqrt(1 - b2 ** (rnd + 1)) / (1 - b1 ** (rnd + 1))
            return w + eta * m / (np.sqrt(v) + cfg.fedopt_tau)
        if name == "fedmedian":
            return np.median(answers, axis=0)
        if name == "fedtrimmedavg":
            cut = int(cfg.fedtrimmedavg_beta * len(answers))
            ordered = np.sort(answers, axis=0)
            return ordered[cut : len(answers) - cut].mean(axis=0)
        if name == "krum":
            flat = answers.reshape(len(answers), -1)
            d2 = ((flat[:, None, :] - flat[None, :, :]) ** 2).sum(axis=2)
            near = max(1, len(flat) - cfg.krum_malicious - 2)
            scores = [np.sort(np.delete(d2[i], i))[:near].sum() for i in range(len(flat))]
            if cfg.krum_keep > 0:
                best = np.argsort(scores)[: cfg.krum_keep]
                return np.tensordot(sizes[best] / sizes[best].sum(), answers[best], axes=1)
            return answers[int(np.argmin(scores))]
        raise AssertionError(name)

    return step


def _reference(name, cfg, clients, strategy):
    """``ROUNDS`` rounds of ``name`` by hand: every client's own ``fit`` (task ``fedavg``)
    from the global model, then the server rule above."""
    w = clients[0].get_parameters({})[0]
    rule = _server_rule(name, cfg)
    config = {**strategy.local_config(), **strategy.work_config()}
    if name == "fedprox":
        config["proximal_mu"] = cfg.fedprox_mu
    for rnd in range(1, ROUNDS + 1):
        answers, sizes = [], []
        for c in clients:
            new, n, _ = c.fit([w], config)
            answers.append(new[0])
            sizes.append(n)
        w = rule(w, answers, sizes, rnd)
    return w


def _settings():
    # values away from the defaults, so a setting that is not passed on shows
    return dict(
        fedavg_rounds=ROUNDS,
        fedprox_mu=0.7,
        fedopt_eta=0.05,
        fedopt_beta_1=0.8,
        fedopt_beta_2=0.95,
        fedopt_tau=1e-2,
        fedavgm_lr=0.7,
        fedavgm_momentum=0.5,
        fedtrimmedavg_beta=0.2,
        krum_malicious=1,
    )


@pytest.mark.parametrize("keep", [0, 2])
def test_grauc_global_methods_follow_the_published_rules(keep):
    from grauc_flower import federation as fed
    from grauc_flower.client import GrAUCClient
    from grauc_flower.data import simulate
    from strategies.registry import Registry
    from strategies.runtime.engine import run_inprocess

    sites = simulate(simulation=1, n_sites=6, n_features=4, n_train=40, seed=4711)
    cfg = GrAUCConfig(**_settings(), krum_keep=keep)
    names = GLOBAL_METHODS if keep == 0 else ("krum",)
    moved = set()
    for name in names:
        clients = [GrAUCClient(s, cfg.ridge, index=k) for k, s in enumerate(sites)]
        strategy = fed.make_strategy(name, cfg, len(sites), Registry())
        run_inprocess(strategy, clients, fed.max_rounds_for(name, cfg))
        want = _reference(name, cfg, clients, strategy)
        np.testing.assert_allclose(strategy.global_model, want, rtol=1e-10, atol=1e-12)
        moved.add(tuple(np.round(want, 8)))
    assert len(moved) == len(names)  # each name a different model


def test_rowfed_global_methods_follow_the_published_rules():
    from rowfed_flower import federation as fed
    from strategies.rowfed import rowfed_registry
    from strategies.runtime.engine import run_inprocess

    spec = fed.RowFedDataSpec(num_clients=6, num_features=4, num_responses=2, n_train=30, seed=8)
    data = fed.load_data(spec)
    cfg = RowFedConfig(**_settings())
    for name in GLOBAL_METHODS:
        clients = data.make_clients()
        strategy = fed.make_strategy(name, cfg, len(clients), rowfed_registry())
        run_inprocess(strategy, clients, fed.max_rounds_for(name, cfg))
        want = _reference(name, cfg, clients, strategy)
        np.testing.assert_allclose(strategy.global_model, want, rtol=1e-10, atol=1e-12)


def test_fedprox_local_steps_reach_the_proximal_point():
    """Many FedProx local steps end at ``argmin f + (mu/2)||b - w||^2``, the datafit's
    exact proximal map."""
    from grauc_flower.auc import PairwiseLogistic, split_by_class
    from grauc_flower.data import simulate
    from strategies.local import local_descent

    site = simulate(simulation=1, n_sites=1, n_features=3, n_train=60, seed=5)[0]
    f = PairwiseLogistic(*split_by_class(site.x_train, site.y_train), eta=1e-3)
    w = np.array([0.5, -1.0, 2.0])
    mu = 0.8
    got = local_descent(f, w, 3000, proximal_mu=mu)
    np.testing.assert_allclose(got, f.prox(w, mu), atol=1e-8)
    # no proximal term: plain gradient descent, which ends elsewhere
    assert np.max(np.abs(local_descent(f, w, 3000) - got)) > 1e-2


def test_bad_flower_settings_name_the_key():
    from strategies.errors import InputError

    for key, value in (
        ("fedprox_mu", -1.0),
        ("fedopt_eta", 0.0),
        ("fedopt_beta_1", 1.0),
        ("fedtrimmedavg_beta", 0.5),
        ("krum_keep", -1),
    ):
        with pytest.raises(InputError, match=key.replace("_", "-")):
            GrAUCConfig(**{key: value})
        with pytest.raises(InputError, match=key.replace("_", "-")):
            RowFedConfig(**{key: value})


@pytest.mark.flower
@pytest.mark.slow
@pytest.mark.parametrize("family", ["grauc", "rowfed"])
def test_every_name_through_flwr_run_equals_inprocess(family, tmp_path):
    """One ``flwr run`` whose ``method`` list holds every global-model name; each name's
    coefficients equal the in-process engine's (1e-8)."""
    from strategies.runtime.simulation import flwr_run

    out = str(tmp_path / "run")
    os.makedirs(out)
    rounds = 3
    names = ",".join(GLOBAL_METHODS)
    if family == "grauc":
        from grauc_flower import federation as fed

        rc = {
            "method": names,
            "data.num-sites": 5,
            "data.num-features": 4,
            "grauc.fedavg-rounds": rounds,
            "grauc.fedprox-mu": 0.3,
            "out-dir": out,
        }
        flwr_run(ROOT, rc, 5)
        spec = fed.DataSpec(n_sites=5, n_features=4)
        sites, _ = fed.load_sites(spec)
        cfg = GrAUCConfig(fedavg_rounds=rounds, fedprox_mu=0.3)
        inproc = fed.run_methods_inprocess(cfg, sites, list(GLOBAL_METHODS))
        for name, res in inproc.items():
            got = pd.read_csv(os.path.join(out, name, "coefficients.csv"))
            assert list(got["site"]) == res.sites
            np.testing.assert_allclose(got.iloc[:, 1:].to_numpy(), res.coefficients, atol=1e-8)
    else:
        from rowfed_flower import federation as fed

        rc = {
            "task": "rowfed",
            "method": names,
            "rowfed-data.num-clients": 5,
            "rowfed-data.num-features": 4,
            "rowfed-data.num-responses": 2,
            "rowfed.fedavg-rounds": rounds,
            "rowfed.fedprox-mu": 0.3,
            "out-dir": out,
        }
        flwr_run(ROOT, rc, 5)
        spec = fed.RowFedDataSpec(num_clients=5, num_features=4, num_responses=2)
        cfg = RowFedConfig(fedavg_rounds=rounds, fedprox_mu=0.3)
        inproc = fed.run_methods_inprocess(cfg, fed.load_data(spec), list(GLOBAL_METHODS))
        for name, res in inproc.items():
            got = pd.read_csv(os.path.join(out, name, "coefficients.csv"))
            want = fed.coefficients_frame(res, *_names(res))
            assert list(got["feature"]) == list(want["feature"])
            np.testing.assert_allclose(
                got.iloc[:, 2:].to_numpy(), want.iloc[:, 2:].to_numpy(), atol=1e-8
            )


def _names(res):
    m, p, q = res.theta.shape
    return [f"x{k + 1}" for k in range(p)], [f"y{k + 1}" for k in range(q)]

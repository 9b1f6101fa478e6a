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

from rowfed_flower import sources as rsources
from strategies.config import FEDAVG_FAMILY, GLOBAL_METHODS, GrAUCConfig, RowFedConfig

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
    from strategies.runtime.engine import run_inprocess
    from strategies.server.registry import Registry

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
    from rowfed_flower import sources as rsources
    from strategies.runtime.engine import run_inprocess
    from strategies.server.rowfed import rowfed_registry

    spec = rsources.DataSpec(num_clients=6, num_features=4, num_responses=2, n_train=30, seed=8)
    data = rsources.load_data(spec)
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
    from grauc_flower.data import simulate
    from grauc_flower.datafit import PairwiseLogistic, split_by_class
    from strategies.solvers.local import local_descent

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
    """One ``flwr run`` whose ``method`` list holds every comparator name (Flower's
    strategies, Ditto, fine-tuning, IFCA, mean fusion); each name's coefficients equal the
    in-process engine's (1e-8).  GrAUC-PFL's sites differ in size (simulation 2) and its
    fused comparator weights them by their rows (``size-power = 1``)."""
    from strategies.runtime.simulation import flwr_run

    out = str(tmp_path / "run")
    os.makedirs(out)
    rounds = 3
    every = ("mean-fusion", *FEDAVG_FAMILY)
    names = ",".join(every)
    if family == "grauc":
        from grauc_flower import federation as fed

        rc = {
            "method": names,
            "data.num-sites": 5,
            "data.num-features": 4,
            "data.simulation": 2,
            "grauc.fedavg-rounds": rounds,
            "grauc.fedprox-mu": 0.3,
            "grauc.size-power": 1.0,
            "out-dir": out,
        }
        flwr_run(ROOT, rc, 5)
        spec = fed.DataSpec(simulation=2, n_sites=5, n_features=4)
        sites, _ = fed.load_sites(spec)
        cfg = GrAUCConfig(fedavg_rounds=rounds, fedprox_mu=0.3, size_power=1.0)
        equal = fed.run_methods_inprocess(cfg.replace(size_power=0.0), sites, ["mean-fusion"])
        weighted = fed.run_methods_inprocess(cfg, sites, ["mean-fusion"])
        assert (
            np.abs(equal["mean-fusion"].coefficients - weighted["mean-fusion"].coefficients).max()
            > 1e-3
        )
        inproc = fed.run_methods_inprocess(cfg, sites, list(every))
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
        spec = rsources.DataSpec(num_clients=5, num_features=4, num_responses=2)
        cfg = RowFedConfig(fedavg_rounds=rounds, fedprox_mu=0.3)
        inproc = fed.run_methods_inprocess(cfg, rsources.load_data(spec), list(every))
        for name, res in inproc.items():
            got = pd.read_csv(os.path.join(out, name, "coefficients.csv"))
            want = fed.coefficients_frame(res, *_names(res))
            assert list(got["feature"]) == list(want["feature"])
            np.testing.assert_allclose(
                got.iloc[:, 2:].to_numpy(), want.iloc[:, 2:].to_numpy(), atol=1e-8
            )


def _names(res):
    m, p, q = res.coefficients.shape
    return [f"x{k + 1}" for k in range(p)], [f"y{k + 1}" for k in range(q)]


# ---------------------------------------------------------------------------------------
# Personalized comparators on FedAvg's global model: ditto, fedavg-ft


def test_grauc_ditto_and_finetuning_against_direct_computations():
    """Ditto's personal models are each site's ``argmin f_z + (mu/2)||b - w||^2`` at FedAvg's
    final ``w`` (scipy's L-BFGS on the site's own loss, tight); fine-tuning is ``ft-steps``
    gradient steps of size ``1/L_z`` from ``w``, written out; both share FedAvg's ``w``."""
    from scipy.optimize import minimize

    from grauc_flower import federation as fed
    from grauc_flower.data import simulate
    from grauc_flower.datafit import PairwiseLogistic, split_by_class

    sites = simulate(simulation=1, n_sites=5, n_features=3, n_train=40, seed=2024)
    cfg = GrAUCConfig(fedavg_rounds=6, ditto_mu=0.3, ft_steps=7, standardize="none")
    res = fed.run_methods_inprocess(cfg, sites, ["fedavg", "ditto", "fedavg-ft"])
    w = res["fedavg"].coefficients[0]
    assert res["ditto"].rounds == res["fedavg-ft"].rounds == cfg.fedavg_rounds + 1
    for z, s in enumerate(sites):
        f = PairwiseLogistic(*split_by_class(s.x_train, s.y_train), eta=cfg.ridge)
        mu = cfg.ditto_mu
        opt = minimize(
            lambda b, f=f, mu=mu: f.value(b) + 0.5 * mu * np.sum((b - w) ** 2),
            w,
            jac=lambda b, f=f, mu=mu: f.grad(b) + mu * (b - w),
            method="L-BFGS-B",
            options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 10000},
        )
        np.testing.assert_allclose(res["ditto"].coefficients[z], opt.x, atol=1e-6)
        b = w.copy()
        for _ in range(cfg.ft_steps):
            b = b - f.grad(b) / f.lipschitz()
        np.testing.assert_allclose(res["fedavg-ft"].coefficients[z], b, rtol=1e-10, atol=1e-12)
    # personal: the sites differ, and each is scored with its own model
    assert np.ptp(res["ditto"].coefficients[:, 0]) > 1e-3
    assert set(res["ditto"].evaluation) == {s.site for s in sites}


def test_rowfed_ditto_is_the_penalized_proximal_problem():
    """RowFed's Ditto model of each client: ``argmin ||Y - X T - 1 a'||^2/(2n) + lam2 |T|_1 +
    (mu/2)||T - W||^2`` over ``T`` and a free intercept ``a`` (cvxpy)."""
    import cvxpy as cp

    from rowfed_flower import federation as fed

    spec = rsources.DataSpec(num_clients=4, num_features=3, num_responses=2, n_train=25, seed=3)
    data = rsources.load_data(spec)
    cfg = RowFedConfig(fedavg_rounds=5, ditto_mu=0.5, lam2=0.05, standardize="none")
    res = fed.run_methods_inprocess(cfg, data, ["fedavg", "ditto"])
    w = res["fedavg"].coefficients[0]
    for m, c in enumerate(data.clients):
        n, p = c.x.shape
        t, a = cp.Variable((p, c.y.shape[1])), cp.Variable(c.y.shape[1])
        fit = cp.sum_squares(
            c.y - c.x @ t - np.ones((n, 1)) @ cp.reshape(a, (1, -1), order="C")
        ) / (2 * n)
        obj = fit + cfg.lam2 * cp.sum(cp.abs(t)) + cfg.ditto_mu / 2 * cp.sum_squares(t - w)
        cp.Problem(cp.Minimize(obj)).solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12)
        np.testing.assert_allclose(res["ditto"].coefficients[m], t.value, atol=1e-6)


def _gd(f, start, steps):
    b = np.array(start, dtype=float)
    for _ in range(steps):
        b = b - f.grad(b) / f.lipschitz()
    return b


def test_grauc_ifca_against_the_algorithm_written_out():
    """IFCA: round 1 is FedAvg's local work from zero and its answers' k-means gives the k
    models (checked as a k-means fixed point: each centre the mean of the answers nearest
    to it); each later round every site takes the model of least loss, steps from it, and
    each model becomes the size-weighted mean of its sites' answers; the last round gives
    each site the model of least loss."""
    from grauc_flower import federation as fed
    from grauc_flower.client import GrAUCClient
    from grauc_flower.data import simulate
    from grauc_flower.datafit import PairwiseLogistic, split_by_class
    from strategies.runtime.engine import run_inprocess
    from strategies.server.registry import Registry

    sites = simulate(simulation=1, n_sites=8, n_features=3, n_train=40, seed=77)
    fs = [PairwiseLogistic(*split_by_class(s.x_train, s.y_train), eta=1e-3) for s in sites]
    sizes = np.array([s.y_train.shape[0] for s in sites], dtype=float)
    steps = GrAUCConfig().fedavg_local_steps
    cfg = GrAUCConfig(fedavg_rounds=1, ifca_k=2, seed=3, standardize="none")
    first = fed.make_strategy("ifca", cfg, len(sites), Registry())
    clients = [GrAUCClient(s, cfg.ridge, index=k) for k, s in enumerate(sites)]
    run_inprocess(first, clients, fed.max_rounds_for("ifca", cfg))
    models = first.global_model
    answers = np.stack([_gd(f, np.zeros(3), steps) for f in fs])
    nearest = np.argmin(((answers[:, None] - models[None]) ** 2).sum(axis=2), axis=1)
    assert set(nearest) == {0, 1}
    for j in range(2):
        np.testing.assert_allclose(models[j], answers[nearest == j].mean(axis=0), atol=1e-12)
    # four rounds from the same start (the same seed gives the same k-means)
    res = fed.run_methods_inprocess(cfg.replace(fedavg_rounds=5), sites, ["ifca"])["ifca"]
    for _ in range(4):
        chosen = [int(np.argmin([f.value(m) for m in models])) for f in fs]
        new = np.stack([_gd(f, models[j], steps) for f, j in zip(fs, chosen, strict=True)])
        for j in range(2):
            member = np.array(chosen) == j
            if member.any():
                models[j] = (sizes[member, None] * new[member]).sum(0) / sizes[member].sum()
    final = [models[int(np.argmin([f.value(m) for m in models]))] for f in fs]
    np.testing.assert_allclose(res.coefficients, np.stack(final), rtol=1e-10, atol=1e-12)
    assert np.ptp(res.coefficients[:, 0]) > 0.1  # two groups of sites, two models


def test_rowfed_ifca_gives_each_client_its_best_model():
    """Each client ends with the one of the server's final k models that fits its own data
    best (least squares), and the clients do not all share one model."""
    from rowfed_flower import federation as fed
    from rowfed_flower.datafit import LocalLeastSquares
    from strategies.runtime.engine import run_inprocess
    from strategies.server.rowfed import rowfed_registry

    spec = rsources.DataSpec(num_clients=6, num_features=4, num_responses=2, n_train=30, seed=5)
    data = rsources.load_data(spec)
    cfg = RowFedConfig(fedavg_rounds=6, ifca_k=3, intercept=False, standardize="none")
    clients = data.make_clients()
    strategy = fed.make_strategy("ifca", cfg, len(clients), rowfed_registry())
    run_inprocess(strategy, clients, fed.max_rounds_for("ifca", cfg))
    models = strategy.global_model  # (k, p, q)
    assert models.shape == (3, 4, 2)
    theta = strategy.coefficients()
    chosen = set()
    for m, c in enumerate(data.clients):
        f = LocalLeastSquares(c.x, c.y)
        best = int(np.argmin([f.value(t) for t in models]))
        np.testing.assert_array_equal(theta[m], models[best])
        chosen.add(best)
    assert len(chosen) >= 2


@pytest.mark.parametrize("name", ["fedavgm", "fedadam"])
def test_a_round_nobody_answered_does_not_count(name):
    """Every site fails the first round: the server's optimizer starts at the first round
    that aggregates (no crash of FedAvgM's momentum, FedAdam's bias correction counted from
    there), and the model equals that of a run without the failure."""
    from grauc_flower import federation as fed
    from grauc_flower.client import GrAUCClient
    from grauc_flower.data import simulate
    from strategies.runtime.engine import run_inprocess
    from strategies.server.registry import Registry

    class FailsOnce(GrAUCClient):
        failed = False

        def fit(self, parameters, config):
            if not self.failed:
                self.failed = True
                raise RuntimeError("the site's first round fails")
            return super().fit(parameters, config)

    sites = simulate(simulation=1, n_sites=5, n_features=3, n_train=40, seed=31)
    cfg = GrAUCConfig(fedavg_rounds=4)
    models = []
    for kind in (GrAUCClient, FailsOnce):
        clients = [kind(s, cfg.ridge, index=k) for k, s in enumerate(sites)]
        strategy = fed.make_strategy(name, cfg, len(sites), Registry())
        run_inprocess(strategy, clients, fed.max_rounds_for(name, cfg) + 1)
        assert strategy.rounds == cfg.fedavg_rounds
        models.append(strategy.global_model)
    np.testing.assert_allclose(models[1], models[0], rtol=1e-12, atol=1e-14)

"""A run stopped after a checkpoint and resumed from it ends exactly where an uninterrupted
run ends; a site that stops answering is partial participation."""

from __future__ import annotations

import numpy as np
import pytest

from grauc_flower import federation as fed
from grauc_flower.client import GrAUCClient
from grauc_flower.data import simulate
from strategies.config import GrAUCConfig
from strategies.errors import InputError
from strategies.runtime.engine import run_inprocess
from strategies.server.registry import Registry


@pytest.mark.parametrize(
    ("algorithm", "standardize", "changes"),
    [
        ("admm", "none", {}),
        ("pqn", "none", {}),
        ("admm", "federated", {}),
        ("pqn", "federated", {}),
        ("admm", "none", {"participation": 0.5}),  # the draws go on where they stopped
        ("pqn", "none", {"participation": 0.5}),
    ],
)
def test_resume_equals_uninterrupted(tmp_path, standardize, algorithm, changes):
    sites = simulate(n_sites=5, n_features=3, n_train=30, seed=2718)
    cfg = GrAUCConfig(
        max_rounds=25, tol=1e-12, standardize=standardize, algorithm=algorithm, **changes
    )
    full = fed.run_methods_inprocess(cfg, sites, ["grauc"])["grauc"]
    assert full.rounds > 7
    ckpt = str(tmp_path / "state.npz")
    # "killed" after 7 rounds; the last checkpoint is round 5
    fed.run_methods_inprocess(
        cfg.replace(max_rounds=7),
        sites,
        ["grauc"],
        checkpoint={"checkpoint": ckpt, "checkpoint_every": 5, "resume": ""},
    )
    ckpt5 = str(tmp_path / "state5.npz")
    fed.run_methods_inprocess(
        cfg.replace(max_rounds=5),
        sites,
        ["grauc"],
        checkpoint={"checkpoint": ckpt5, "checkpoint_every": 5, "resume": ""},
    )
    resumed = fed.run_methods_inprocess(
        cfg,
        sites,
        ["grauc"],
        checkpoint={"checkpoint": "", "checkpoint_every": 5, "resume": ckpt5},
    )["grauc"]
    assert resumed.rounds == full.rounds
    np.testing.assert_allclose(resumed.coefficients, full.coefficients, rtol=0, atol=1e-10)
    assert [h["round"] for h in resumed.history] == list(range(1, full.rounds + 1))
    np.testing.assert_allclose(
        [h["objective"] for h in resumed.history],
        [h["objective"] for h in full.history],
        rtol=1e-12,
    )


def _three_rounds_checkpoint(tmp_path, sites) -> str:
    """A checkpoint of a default fit after 3 rounds; returns its path."""
    ckpt = str(tmp_path / "s.npz")
    fed.run_methods_inprocess(
        GrAUCConfig(max_rounds=3),
        sites,
        ["grauc"],
        checkpoint={"checkpoint": ckpt, "checkpoint_every": 1, "resume": ""},
    )
    return ckpt


def test_resume_rejects_another_federation(tmp_path):
    ckpt = _three_rounds_checkpoint(tmp_path, simulate(n_sites=4, n_features=3, n_train=30, seed=1))
    other = simulate(n_sites=5, n_features=3, n_train=30, seed=1)
    with pytest.raises(InputError, match="resume"):
        fed.run_methods_inprocess(
            GrAUCConfig(max_rounds=3),
            other,
            ["grauc"],
            checkpoint={"checkpoint": "", "checkpoint_every": 1, "resume": ckpt},
        )


def test_resume_rejects_another_site_weighting(tmp_path):
    """A checkpoint written with size-power 0 cannot be resumed with size-power 1 (the
    stored losses, gradients and models are of another objective)."""
    sites = simulate(simulation=2, n_sites=4, n_features=3, seed=1)
    ckpt = _three_rounds_checkpoint(tmp_path, sites)
    with pytest.raises(InputError, match="size-power"):
        fed.run_methods_inprocess(
            GrAUCConfig(max_rounds=3, size_power=1.0),
            sites,
            ["grauc"],
            checkpoint={"checkpoint": "", "checkpoint_every": 1, "resume": ckpt},
        )


class _Dropping(GrAUCClient):
    """A site that stops answering after ``after`` rounds of the fit (ADMM steps, or pqn
    answers: the start round's, which carries the first gradient, and the gradients)."""

    def __init__(self, *a, after: int, **k):
        super().__init__(*a, **k)
        self.after, self.calls = after, 0

    def fit(self, parameters, config):
        if config.get("task") in ("admm", "gradient") or config.get("then"):
            self.calls += 1
            if self.calls > self.after:
                raise RuntimeError("site offline")
        return super().fit(parameters, config)

    def evaluate(self, parameters, config):
        if self.calls > self.after:
            raise RuntimeError("site offline")
        return super().evaluate(parameters, config)


@pytest.mark.parametrize("algorithm", ["admm", "pqn"])
def test_a_site_that_never_comes_back_is_reported(algorithm):
    sites = simulate(n_sites=4, n_features=3, n_train=30, seed=3)
    cfg = GrAUCConfig(max_rounds=30, min_fit_fraction=0.7, algorithm=algorithm, standardize="none")
    clients = [GrAUCClient(s, cfg.ridge, index=k) for k, s in enumerate(sites)]
    clients[2] = _Dropping(sites[2], cfg.ridge, index=2, after=3)
    registry = Registry()
    strategy = fed.make_strategy("grauc", cfg, len(sites), registry, sites)
    run_inprocess(strategy, clients, fed.max_rounds_for("grauc", cfg))
    res = fed.collect("grauc", strategy)
    assert res.extra["missing"] == [sites[2].site]
    if algorithm == "admm":
        assert res.rounds == 30  # the other three sites carried on
    else:  # the other three converged with the silent site's block frozen
        assert res.converged and 3 < res.rounds < 30
    # the silent site kept the coefficients of its last (3rd) step
    three = fed.run_methods_inprocess(cfg.replace(max_rounds=3), sites, ["grauc"])["grauc"]
    np.testing.assert_array_equal(
        strategy.state.beta[2], fed.collect("grauc", strategy).coefficients[2]
    )
    np.testing.assert_allclose(res.coefficients[2], three.coefficients[2], rtol=0, atol=0)
    assert sites[2].site not in res.evaluation
    # with a quorum of all sites, every round after the drop is skipped
    strict = fed.make_strategy(
        "grauc", cfg.replace(min_fit_fraction=1.0), len(sites), Registry(), sites
    )
    clients[2] = _Dropping(sites[2], cfg.ridge, index=2, after=3)
    run_inprocess(strict, clients, 12)
    assert strict.rounds == 3

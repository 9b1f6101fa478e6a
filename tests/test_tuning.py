"""Choosing the levels from the data (docs/methods.md 3.4), checked against independent
computations: the top of the GrAUC-PFL path against a conic solver (cvxpy) on either side of
it, the selection rules against means and standard errors computed here by hand, and the
folds and held-out rows by counting."""

from __future__ import annotations

import warnings

import cvxpy as cp
import numpy as np
import pandas as pd
import pytest
from test_grauc_reference import mst_graph

from grauc_flower.data import SiteData
from grauc_flower.graph import build_graph
from grauc_flower.tuning import lam_max_of, lam_maxes
from strategies.config import GrAUCConfig
from strategies.errors import InputError
from strategies.stats import tuning


def make_sites(seed=3, z=5, p=3):
    rng = np.random.default_rng(seed)
    sites = []
    for k in range(z):
        n = int(rng.integers(16, 26))
        y = (rng.random(n) < 0.4).astype(np.int64)
        y[:4], y[4:8] = 1, 0
        mu = np.array([1.0, 0.5, -0.5]) + 0.6 * rng.standard_normal(p)
        x = rng.standard_normal((n, p)) + np.outer(y, mu)
        sites.append(
            SiteData(
                f"s{k}",
                float(rng.uniform(28, 46)),
                float(rng.uniform(-120, -72)),
                x,
                y,
                x[:0],
                y[:0],
            )
        )
    return sites


SITES = make_sites()


def pairs(s: SiteData) -> np.ndarray:
    xp, xn = s.x_train[s.y_train == 1], s.x_train[s.y_train == 0]
    return (xp[:, None, :] - xn[None, :, :]).reshape(-1, xp.shape[1])


def cvxpy_fit(sites, edges, w, lam, ridge, penalty):
    ds = [pairs(s) for s in sites]
    b = cp.Variable((len(ds), ds[0].shape[1]))
    loss = sum(
        cp.sum(cp.logistic(-d @ b[k])) / d.shape[0] + 0.5 * ridge * cp.sum_squares(b[k])
        for k, d in enumerate(ds)
    )
    norm = cp.norm1 if penalty == "l1" else (lambda v: cp.norm(v, 2))
    pen = sum(w[e] * norm(b[u] - b[v]) for e, (u, v) in enumerate(edges))
    problem = cp.Problem(cp.Minimize(loss + lam * pen))
    warnings.filterwarnings("ignore", "Solution may be inaccurate")
    problem.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    # at a fused point the cone is degenerate and Clarabel may call 1e-10 "inaccurate"; the
    # spreads compared below (1e-6, 1e-4) are far above that accuracy
    assert problem.status in ("optimal", "optimal_inaccurate")
    return b.value


def spread(beta: np.ndarray) -> float:
    return float(np.abs(beta - beta.mean(axis=0)).max())


# ---------------------------------------------------------------------------------------
# lam_max
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("penalty", ["l1", "group"])
def test_lam_max_on_a_tree_is_where_the_sites_fuse(penalty):
    """At 1.01 lam_max the conic solver's sites are equal; at 0.97 lam_max they are not."""
    cfg = GrAUCConfig(ridge=0.01, w_dist=1.0, q=0.01, penalty=penalty, standardize="none")
    top = lam_max_of(SITES, cfg)
    edges, w = mst_graph(SITES, cfg.w_dist, cfg.q)  # rebuilt there with geopy, scipy
    above = cvxpy_fit(SITES, edges, w, 1.01 * top, cfg.ridge, penalty)
    below = cvxpy_fit(SITES, edges, w, 0.97 * top, cfg.ridge, penalty)
    assert spread(above) < 1e-6
    assert spread(below) > 1e-4


def test_lam_max_with_cycles_is_exact_for_l1():
    """knn graph (cycles): the linear program's level, against the conic solver."""
    cfg = GrAUCConfig(ridge=0.01, w_dist=0.5, graph="knn", knn_k=2, standardize="none")
    top = lam_max_of(SITES, cfg)
    g = build_graph(np.array([s.lat for s in SITES]), np.array([s.lon for s in SITES]), "knn", 2)
    assert len(g.edges) > len(SITES) - 1  # a cycle
    w = g.weights(cfg.w_dist, cfg.q)
    assert spread(cvxpy_fit(SITES, g.edges, w, 1.01 * top, cfg.ridge, "l1")) < 1e-6
    assert spread(cvxpy_fit(SITES, g.edges, w, 0.97 * top, cfg.ridge, "l1")) > 1e-4


def test_lam_max_per_setting_and_standardized():
    """lam_maxes gives each (ridge, w_dist) its own level (the ridge moves the common fit,
    w_dist the weights), and standardization is the pooled scaling of the penalty's scale."""
    cfg = GrAUCConfig(q=0.01, standardize="none")
    tops = lam_maxes(SITES, cfg, (0.001, 1.0), (0.0, 2.0))
    assert len(set(tops.values())) == 4
    for (ridge, w), top in tops.items():
        assert top == pytest.approx(lam_max_of(SITES, cfg.replace(ridge=ridge, w_dist=w)))
    std = lam_max_of(SITES, cfg.replace(standardize="federated"))
    x = np.vstack([s.x_train for s in SITES])
    center, scale = x.mean(axis=0), x.std(axis=0, ddof=1)
    scaled = [
        SiteData(s.site, s.lat, s.lon, (s.x_train - center) / scale, s.y_train, s.x_test, s.y_test)
        for s in SITES
    ]
    assert std == pytest.approx(lam_max_of(scaled, cfg), rel=1e-7)


def test_lam_max_of_a_tree_is_the_subtree_sums():
    """A path 0-1-2 with gradients (1, 2, -3): the edge (0,1) carries 1, the edge (1,2) 3."""
    edges = np.array([[0, 1], [1, 2]])
    grads = np.array([[1.0, 0.0], [2.0, 1.0], [-3.0, -1.0]])
    level, exact = tuning.lam_max(edges, np.array([1.0, 0.5]), grads)
    assert exact and level == pytest.approx(3.0 / 0.5)
    level, _ = tuning.lam_max(edges, np.array([1.0, 0.5]), grads, grouped=True)
    assert level == pytest.approx(np.hypot(3.0, 1.0) / 0.5)
    # a zero-weight edge splits the graph: each part is fused on its own
    level, _ = tuning.lam_max(edges, np.array([1.0, 0.0]), np.array([[1.0], [-1.0], [0.0]]))
    assert level == pytest.approx(1.0)


def test_common_fit_zeroes_the_summed_gradient():
    rng = np.random.default_rng(0)
    a = [rng.standard_normal((6, 3)) for _ in range(3)]

    def oracle(b):
        vals = [0.5 * np.sum((m @ b - 1) ** 2) for m in a]
        grads = [m.T @ (m @ b - 1) for m in a]
        return sum(vals), np.sum(grads, axis=0)

    b, calls = tuning.common_fit(oracle, 3)
    stacked = np.vstack(a)
    expected = np.linalg.lstsq(stacked, np.ones(len(stacked)), rcond=None)[0]
    np.testing.assert_allclose(b, expected, atol=1e-8)
    assert calls > 1


def test_log_path():
    grid = tuning.log_path(2.0, 4, 1e-3)
    np.testing.assert_allclose(grid, [2.0, 0.2, 0.02, 0.002, 0.0])
    assert tuning.log_path(float("inf")) == (0.0,)


# ---------------------------------------------------------------------------------------
# choosing
# ---------------------------------------------------------------------------------------
def cv_table():
    """Three folds, lam in (1, 0.5, 0.1): means 0.80, 0.84, 0.85; the SE of lam = 0.1 is
    sd(0.83, 0.85, 0.87)/sqrt(3) = 0.02/sqrt(3) * 1 = 0.011547."""
    scores = {1.0: (0.79, 0.80, 0.81), 0.5: (0.83, 0.84, 0.85), 0.1: (0.83, 0.85, 0.87)}
    rows = [
        {"fold": k, "lam": lam, "val": v}
        for lam, vals in scores.items()
        for k, v in enumerate(vals)
    ]
    return pd.DataFrame(rows)


def test_choose_best_and_one_standard_error():
    table = cv_table()
    best, summary = tuning.choose(table, ("lam",), "val", True, "best", ("lam",))
    assert best == {"lam": 0.1}
    se = np.std([0.83, 0.85, 0.87], ddof=1) / np.sqrt(3)
    assert summary.loc[summary["lam"] == 0.1, "se"].item() == pytest.approx(se)
    one_se, _ = tuning.choose(table, ("lam",), "val", True, "1se", ("lam",))
    assert one_se == {"lam": 0.5}  # 0.84 >= 0.85 - 0.0115; 0.80 is not
    # minimizing: the same table read as a loss
    low, _ = tuning.choose(table, ("lam",), "val", False, "best", ("lam",))
    assert low == {"lam": 1.0}
    with pytest.raises(InputError, match="cv-rule"):
        tuning.choose(table, ("lam",), "val", True, "worst")


def test_one_standard_error_rule_takes_the_smaller_end_when_told():
    """``-k``: the smallest k within one SE is simplest (IFCA's number of models)."""
    scores = {1: (0.80, 0.82, 0.84), 2: (0.84, 0.86, 0.88), 3: (0.85, 0.86, 0.87)}
    table = pd.DataFrame(
        [{"fold": f, "k": k, "val": v} for k, vals in scores.items() for f, v in enumerate(vals)]
    )
    # best mean 0.86 at k = 2 and 3 (ties: grid order); SE 0.02; k = 1 (0.82) is outside
    assert tuning.choose(table, ("k",), "val", True, "1se", ("-k",))[0] == {"k": 2}
    assert tuning.choose(table, ("k",), "val", True, "1se", ("k",))[0] == {"k": 3}
    table.loc[table["k"] == 1, "val"] += 0.03  # now 0.85, within one SE of 0.86
    assert tuning.choose(table, ("k",), "val", True, "1se", ("-k",))[0] == {"k": 1}
    assert tuning.KNOBS["ifca"].simplest == ("-ifca_k",)
    assert tuning.KNOBS["fedavg-ft"].simplest == ("-ft_steps",)
    assert tuning.KNOBS["ditto"].simplest == ("ditto_mu",)
    assert tuning.KNOBS["fedadam"].simplest == ()


def test_choose_ignores_folds_without_a_score():
    table = cv_table()
    table.loc[(table["lam"] == 1.0) & (table["fold"] == 0), "val"] = np.nan
    _, summary = tuning.choose(table, ("lam",), "val", True)
    assert summary.loc[summary["lam"] == 1.0, "folds"].item() == 2
    assert summary.loc[summary["lam"] == 1.0, "mean"].item() == pytest.approx(0.805)
    table["val"] = np.nan
    with pytest.raises(InputError, match="no setting"):
        tuning.choose(table, ("lam",), "val", True)


# ---------------------------------------------------------------------------------------
# folds and held-out rows
# ---------------------------------------------------------------------------------------
def test_folds_are_balanced():
    y = np.array([1] * 7 + [0] * 13)
    fold = tuning.stratified_folds(y, 5, np.random.default_rng(1))
    for k in range(5):
        assert np.sum((fold == k) & (y == 1)) in (1, 2)
        assert np.sum(fold == k) == 4
    fold = tuning.row_folds(11, 3, np.random.default_rng(2))
    assert sorted(np.bincount(fold)) == [3, 4, 4]


def test_holdout_takes_a_share_of_each_class():
    y = np.array([1] * 5 + [0] * 16)
    mask = tuning.holdout_mask(y, len(y), 0.25, np.random.default_rng(0))
    assert np.sum(mask & (y == 1)) == 1  # 1.25 rounds to 1
    assert np.sum(mask & (y == 0)) == 4
    # a class of one row stays in training
    y = np.array([1, 0, 0, 0])
    mask = tuning.holdout_mask(y, 4, 0.5, np.random.default_rng(0))
    assert not mask[0] and mask.sum() == 2
    assert tuning.holdout_mask(None, 10, 0.3, np.random.default_rng(0)).sum() == 3


def test_cv_options_are_checked():
    for kwargs, key in (
        ({"folds": 1}, "folds"),
        ({"rule": "x"}, "cv-rule"),
        ({"tol": 0.0}, "cv-tol"),
        ({"jobs": -1}, "jobs"),
    ):
        with pytest.raises(InputError, match=key):
            tuning.CVOptions(**kwargs)


def test_grid_edge_only_where_a_wider_grid_could_help():
    """w_dist = 1 chosen at a lam tried only with w_dist 1 and 2 (lam's path depends on
    w_dist) is the smallest value tried there but inside the grid 0, 1, 2: no edge (the
    rule before named it); the same choice where 0 and 1 were tried at that lam would be
    the smallest of the grid: an edge; on a product grid the edges are each setting's
    ends."""
    import pandas as pd

    from strategies.stats.tuning import grid_edges

    dependent = pd.DataFrame({"lam": [0.5, 0.4, 0.3, 0.1, 0.3, 0.2], "w_dist": [0, 0, 1, 1, 2, 2]})
    assert grid_edges(dependent, ["lam", "w_dist"], {"lam": 0.3, "w_dist": 1}) == {}
    shared = pd.DataFrame({"lam": [0.5, 0.3, 0.3, 0.1, 0.2], "w_dist": [0, 0, 1, 1, 2]})
    want = {"w_dist": "largest"}
    assert grid_edges(shared, ["lam", "w_dist"], {"lam": 0.3, "w_dist": 1}) == {}
    assert grid_edges(shared, ["lam", "w_dist"], {"lam": 0.3, "w_dist": 0}) == {
        "w_dist": "smallest"
    }
    assert grid_edges(shared.assign(w_dist=[0, 1, 2, 2, 2]), ["lam", "w_dist"],
                      {"lam": 0.3, "w_dist": 2}) == want  # fmt: skip
    product = pd.DataFrame({"a": [1, 1, 2, 2], "b": [5, 6, 5, 6]})
    assert grid_edges(product, ["a", "b"], {"a": 2, "b": 5}) == {"a": "largest", "b": "smallest"}

"""``python -m grauc_flower bench``: what a fit costs, side by side, on this machine.

- rounds to a 1e-4 and a 1e-6 relative objective gap, and to the stopping rule, for the
  defaults (proximal quasi-Newton; also with exact curvature and with partial participation
  0.5 and 0.8), ADMM with the exact local step, and the paper's linearized ADMM (rho in
  {0.1, 1}, from zeros) on the 20-institution simulation-1 problem, against an optimum from
  tight solves;
- wall time per round in-process and through ``flwr run`` (20 simulated SuperNodes);
- the surrogate's gradient: time and peak memory versus ``n m`` (chunked vs one pass);
- graph building versus the number of sites ``Z``; the server step versus ``Z`` (p = 20);
- ``fit --tune cv`` (the federated tuning) with the default grid and 5 folds on the 20
  sites: its rounds against one fit's, the server's time per round against a site's.

Ratios between variants are the figures to quote; absolute times depend on the machine.
"""

from __future__ import annotations

import itertools
import time
import tracemalloc

import numpy as np
import pandas as pd

from strategies.config import GrAUCConfig
from strategies.experiments.benchtable import check_out, finish, format_table  # noqa: F401
from strategies.solvers import admm

from . import federation as fed
from .datafit import PairwiseLogistic
from .graph import build_graph


def _gap_rounds(history: list[dict], fstar: float, level: float) -> float:
    gaps = np.array([abs(h["objective"] - fstar) / abs(fstar) for h in history])
    bad = np.flatnonzero(gaps > level)
    if len(bad) == 0:
        return 1.0
    return float(bad[-1] + 2) if bad[-1] + 1 < len(gaps) else float("nan")


def rounds_table(quick: bool) -> list[dict]:
    """Rounds to a 1e-4 and a 1e-6 relative objective gap and to the stopping rule (default
    ``tol``) for the default algorithm (proximal quasi-Newton), ADMM with the exact local
    step (defaults otherwise) and the paper's linearized ADMM from zeros at rho in {0.1, 1};
    the optimum is the lowest objective of tight solves by both algorithms."""
    sites, _ = fed.load_sites(fed.DataSpec())
    base = GrAUCConfig()
    tight = [
        fed.run_methods_inprocess(base.replace(tol=1e-13, max_rounds=200), sites, ["grauc"]),
        fed.run_methods_inprocess(
            base.replace(algorithm="admm", tol=1e-13, max_rounds=4000), sites, ["grauc"]
        ),
    ]
    fstar = min(h["objective"] for t in tight for h in t["grauc"].history)
    rows = []
    limit = 1500 if quick else 4000
    variants = [
        ("defaults (pqn)", base),
        ("pqn, curvature exact", base.replace(curvature="exact")),
        ("pqn, participation 0.5", base.replace(participation=0.5)),
        ("pqn, participation 0.8", base.replace(participation=0.8)),
        ("admm prox", base.replace(algorithm="admm")),
    ]
    for rho in (0.1, 1.0):
        variants.append(
            (
                f"admm linearized rho={rho:g} zeros (paper)",
                base.replace(algorithm="admm", local_solver="linearized", rho=rho, init="zeros"),
            )
        )
    for name, cfg in variants:
        stop = fed.run_methods_inprocess(cfg.replace(max_rounds=limit), sites, ["grauc"])["grauc"]
        t0 = time.perf_counter()
        res = fed.run_methods_inprocess(cfg.replace(tol=1e-12, max_rounds=limit), sites, ["grauc"])[
            "grauc"
        ]
        rows.append(
            {
                "what": "rounds",
                "variant": name,
                "rounds_to_1e-4": _gap_rounds(res.history, fstar, 1e-4),
                "rounds_to_1e-6": _gap_rounds(res.history, fstar, 1e-6),
                "rounds_to_stop": stop.rounds if stop.converged else float("nan"),
                "seconds_per_round_inprocess": (time.perf_counter() - t0) / res.rounds,
            }
        )
    ref = rows[0]["rounds_to_1e-6"]
    for row in rows:
        row["rounds_1e-6_over_default"] = row["rounds_to_1e-6"] / ref
    return rows


def flower_round_time() -> dict:
    """A whole GrAUC-PFL fit with the default settings (stopping rule at ``tol`` = 1e-6)
    through ``flwr run`` (20 simulated SuperNodes): wall time with start-up, rounds, and the
    seconds per round read off the server's per-round log."""
    import re

    from strategies.runtime.cli import project_dir
    from strategies.runtime.simulation import flwr_run

    t0 = time.perf_counter()
    out = flwr_run(project_dir(), {"method": "grauc"}, 20)
    wall = time.perf_counter() - t0
    stamps = {
        int(k): float(t)
        for k, t in re.findall(r"grauc round (\d+)(?:/\d+)?: objective .*?\(([\d.]+) s\)", out)
    }
    first, last = min(stamps), max(stamps)
    per_round = (stamps[last] - stamps[first]) / max(last - first, 1)
    return {
        "what": "flower",
        "variant": "flwr run, 20 SuperNodes, default fit",
        "seconds_per_round_flower": per_round,
        "rounds": last,
        "wall_seconds": wall,
        "startup_seconds": wall - per_round * last,
    }


def gradient_table(sizes) -> list[dict]:
    rows = []
    rng = np.random.default_rng(0)
    p = 20
    for n, m in sizes:
        xp, xn = rng.standard_normal((n, p)), rng.standard_normal((m, p))
        b = rng.standard_normal(p) * 0.1
        f = PairwiseLogistic(xp, xn, pairs="exact")  # the pair loop's chunks (--scale: the grid)
        tracemalloc.start()
        t0 = time.perf_counter()
        f.value_and_grad(b)
        t_chunk = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        row = {
            "what": "gradient",
            "variant": f"n={n} m={m}",
            "n_times_m": n * m,
            "seconds_chunked": t_chunk,
            "peak_MiB_chunked": peak / 2**20,
        }
        if n * m <= 5e7:
            one = PairwiseLogistic(xp, xn, chunk_elements=n * m, pairs="exact")
            t0 = time.perf_counter()
            one.value_and_grad(b)
            row["seconds_one_pass"] = time.perf_counter() - t0
            row["chunked_over_one_pass"] = t_chunk / row["seconds_one_pass"]
        rows.append(row)
    return rows


def graph_table(zs) -> list[dict]:
    rows = []
    rng = np.random.default_rng(0)
    for z in zs:
        lat = np.degrees(np.arcsin(rng.uniform(-1, 1, z)))
        lon = rng.uniform(-180, 180, z)
        t0 = time.perf_counter()
        build_graph(lat, lon)
        rows.append(
            {"what": "graph", "variant": f"Z={z}", "Z": z, "seconds": time.perf_counter() - t0}
        )
    return rows


def server_step_table(zs, p: int = 20) -> list[dict]:
    """The server step's time versus the number of sites: ADMM's (the global component and
    the server update, averaged over 20 repeats on a random graph) and proximal
    quasi-Newton's per round over a whole default fit of a simulated problem.

    Parameters
    ----------
    zs : iterable of int
        The numbers of sites ``Z``.
    p : int, optional
        The number of features.

    Returns
    -------
    list of dict
        Two rows per ``Z`` (``admm``, ``pqn``): the seconds per step (pqn: the median over
        rounds, with the last five rounds' mean, the largest, the total and the rounds).
    """
    from strategies.solvers.problems import grauc_problem

    rows = []
    rng = np.random.default_rng(0)
    for z in zs:
        lat = np.degrees(np.arcsin(rng.uniform(-1, 1, z)))
        lon = rng.uniform(-180, 180, z)
        graph = build_graph(lat, lon)
        problem = grauc_problem(graph, z, GrAUCConfig())
        state = admm.init_state(problem, rng.standard_normal((z, p)), 0.1, threshold=False)
        c = np.full(z, 1.0)
        reps = 20
        t0 = time.perf_counter()
        for _ in range(reps):
            admm.global_component(problem, state, c)
            state, _ = admm.server_update(problem, state, state.beta + 0.01, 1e-6, 1e-6)
        rows.append(
            {
                "what": "server step",
                "variant": f"admm Z={z} p={p}",
                "Z": z,
                "seconds": (time.perf_counter() - t0) / reps,
            }
        )
        # pqn: the server's time per round over a whole default fit of a simulated problem
        # with z sites and p features (BFGS updates, the model problem solved and polished)
        sites, _ = fed.load_sites(fed.DataSpec(n_sites=z, n_features=p))
        steps = []
        fed.run_methods_inprocess(
            GrAUCConfig(),
            sites,
            ["grauc"],
            progress=lambda rnd, obj, step, elapsed, out=steps: out.append(step.seconds),
        )
        seconds = np.array(steps)
        rows.append(
            {
                "what": "server step",
                "variant": f"pqn Z={z} p={p} (whole fit)",
                "Z": z,
                "seconds": float(np.median(seconds)),
                "seconds_last5": float(seconds[-5:].mean()),
                "seconds_max": float(seconds.max()),
                "seconds_total": float(seconds.sum()),
                "rounds": len(seconds),
            }
        )
    return rows


def tuning_time(quick: bool) -> dict:
    """``fit --tune cv`` (the federated tuning: one batched run) with the default grid (lam
    from lam_max, w_dist, ridge) and 5 folds on the main job's 20 sites: rounds and fits of
    the tuning and refit together against one default fit's, the server's time per round
    against the slowest site's, the chosen setting and the refit's test AUC."""
    from strategies.experiments.benchtable import timed_tuning
    from strategies.server.registry import Registry
    from strategies.stats.tuning import CVOptions

    from . import federated_tuning, tuning
    from .client import GrAUCClient

    sites, _ = fed.load_sites(fed.DataSpec())
    cfg = GrAUCConfig()
    grid = tuning.Grid(ridge=(0.1,), w_dist=(1.0,)) if quick else tuning.Grid()
    single = fed.run_methods_inprocess(cfg, list(sites), ["grauc"])["grauc"].rounds
    clients = [GrAUCClient(s, cfg.ridge, index=k) for k, s in enumerate(sites)]
    tune = (CVOptions(quiet=True), grid)
    batch = federated_tuning.tuned_strategy("grauc", cfg, len(sites), Registry(), tune)
    row = timed_tuning(batch, clients, fed.max_rounds_for("grauc", cfg, True))
    res = fed.collect("grauc", batch)
    chosen = res.extra["config"]
    return {
        "what": "tune cv",
        "variant": "grauc, 5 folds, " + ("quick grid" if quick else "default grid"),
        **row,
        "rounds_one_fit": single,
        "chosen": f"lam={chosen.lam:.4g} w_dist={chosen.w_dist:g} ridge={chosen.ridge:g}",
        "test_auc": float(np.mean([m["auc"] for m in res.evaluation.values()])),
    }


#: The designs of the criteria comparison: (name, DataSpec fields, folds, standardize, the
#: grid's w_dist and ridge values; lam from lam_max).  Crime's ridge grid holds the crime
#: study's ridge 1 (configs/crime_grauc.toml).
CRITERIA_DESIGNS = (
    ("sim 1 (main job)", {}, 5, "none", ((0.0, 1.0), (0.01, 0.1))),
    ("sim 2", {"simulation": 2}, 3, "none", ((0.0, 1.0), (0.01, 0.1))),
    ("sim 3", {"simulation": 3}, 5, "none", ((0.0, 1.0), (0.01, 0.1))),
    ("sim 4", {"simulation": 4}, 5, "none", ((0.0, 1.0), (0.01, 0.1))),
    ("crime (states)", {"source": "crime"}, 3, "federated", ((0.0,), (0.1, 1.0))),
)


def _test_auc(sites, coef: np.ndarray) -> float:
    """Mean over sites of the test AUC of ``coef`` (input scale, a row per site)."""
    from .metrics import auc

    values = []
    for s, b in zip(sites, coef, strict=True):
        if len(set(s.y_test.tolist())) == 2:
            values.append(auc(s.x_test @ b, s.y_test))
    return float(np.mean(values))


def criteria_table(seeds=3, quick: bool = False, designs=None, repeats=(1, 3)) -> list[dict]:
    """The cross-validation criteria of the federated tuning (docs/methods.md 3.12) compared
    on held-out test AUC: per design and data split, one batched tuning of GrAUC-PFL (the
    criteria ``folds``, ``pooled``, ``loss`` read from the same fits, each by the ``best``
    and the ``1se`` rule: each one's choice refitted on all rows), one with the folds drawn
    3 times (``repeats``), and FedAvg and individual fits tuned by their own
    cross-validation; the mean test AUC over sites of each.

    Parameters
    ----------
    seeds : int or iterable of int, optional
        The data splits: an int ``n`` for the seeds ``0 .. n - 1``, else the seeds.
    quick : bool, optional
        Without ``designs``, the first two of :data:`CRITERIA_DESIGNS` only.
    designs : sequence of tuple, optional
        The designs, each ``(name, DataSpec fields, folds, standardize, (w_dist, ridge)
        grids)``; default :data:`CRITERIA_DESIGNS`.
    repeats : iterable of int, optional
        How many times the folds are drawn, a tuning each; with more than one, only the
        ``folds`` criterion is compared.

    Returns
    -------
    list of dict
        A row per design, split, method and criterion (and rule): its mean test AUC and the
        seconds (GrAUC-PFL's also its choice and the tuning's rounds).
    """
    from strategies.runtime.engine import run_inprocess
    from strategies.server.registry import Registry
    from strategies.stats.tuning import RULES, CVOptions, choose

    from . import federated_tuning, tuning
    from .client import GrAUCClient

    rows = []
    if designs is None:
        designs = CRITERIA_DESIGNS[:2] if quick else CRITERIA_DESIGNS
    for name, spec_fields, folds, standardize, (w_dist, ridge) in designs:
        for seed in range(seeds) if isinstance(seeds, int) else seeds:
            spec = fed.DataSpec(**spec_fields, data_seed=seed)
            sites, _ = fed.load_sites(spec)
            sites = list(sites)
            cfg = GrAUCConfig(standardize=standardize)
            grid = tuning.Grid(w_dist=w_dist, ridge=ridge)
            for rep in repeats:
                opts = CVOptions(folds=folds, quiet=True, repeats=rep, seed=seed)
                t0 = time.perf_counter()
                clients = [GrAUCClient(s, cfg.ridge, index=k) for k, s in enumerate(sites)]
                batch = federated_tuning.tuned_strategy(
                    "grauc", cfg, len(sites), Registry(), (opts, grid)
                )
                run_inprocess(batch, clients, fed.max_rounds_for("grauc", cfg, True))
                out = batch.outputs
                params = tuning.PARAMS["grauc"]
                frames = {
                    "folds": ("val_auc", True),
                    "pooled": ("pooled_auc", True),
                    "loss": ("val_loss", False),
                }
                site_table = federated_tuning.federated_tables(
                    [j for j in batch.jobs.values() if j.key.startswith("cv/")],
                    batch.pooled,
                    _settings(batch),
                    params,
                    batch.registry.order(),
                )[1]
                criteria = ("folds", "pooled", "loss") if rep == 1 else ("folds",)
                for criterion, rule in itertools.product(criteria, RULES):
                    table = site_table if criterion == "pooled" else out["table"]
                    score, up = frames[criterion]
                    chosen, _ = choose(table, params, score, up, rule, tuning.SIMPLEST["grauc"])
                    if (criterion, rule) == ("folds", "best"):
                        assert chosen == out["tuned"]
                    # the all-rows fit at the choice (a plain fit: the batch's equals it)
                    refit = fed.run_methods_inprocess(cfg.replace(**chosen), sites, ["grauc"])
                    label = criterion + (f" x{rep}" if rep > 1 else "")
                    rows.append(
                        {
                            "what": "criteria",
                            "design": name,
                            "seed": seed,
                            "method": "grauc",
                            "criterion": label + (" 1se" if rule == "1se" else ""),
                            "test_auc": _test_auc(sites, refit["grauc"].coefficients),
                            "chosen": ", ".join(f"{k}={v:.4g}" for k, v in chosen.items()),
                            "rounds": batch.rounds,
                            "seconds": time.perf_counter() - t0,
                        }
                    )
            rows += _comparator_criteria(sites, cfg, grid, folds, seed, name)
            print(pd.DataFrame(rows[-6:]).to_string(index=False), flush=True)
    return rows


def _comparator_criteria(sites, cfg, grid, folds: int, seed: int, design: str) -> list[dict]:
    """:func:`criteria_table`'s rows of FedAvg and the individual fits, each tuned by its own
    in-process cross-validation over ``grid``'s ridge values and refitted on all rows."""
    from strategies.stats.tuning import CVOptions

    from . import tuning

    rows = []
    for method in ("fedavg", "individual"):
        t0 = time.perf_counter()
        base = tuning.Grid(ridge=grid.ridge)
        opts = CVOptions(folds=folds, quiet=True, seed=seed)
        tuned, _, _ = tuning.tune(sites, cfg, method, base, opts)
        res = fed.run_methods_inprocess(tuned, sites, [method])[method]
        rows.append(
            {
                "what": "criteria",
                "design": design,
                "seed": seed,
                "method": method,
                "criterion": "folds (in process)",
                "test_auc": _test_auc(sites, res.coefficients),
                "seconds": time.perf_counter() - t0,
            }
        )
    return rows


#: The designs of the new-site study: (name, DataSpec fields, folds, the tuning grid's
#: w_dist and ridge values); the features scaled federatedly (the default).
NEW_SITE_DESIGNS = (
    ("sim 1 (main job)", {}, 5, ((0.0, 1.0), (0.01, 0.1))),
    ("crime (states)", {"source": "crime"}, 3, ((0.0,), (0.1, 1.0))),
)


def new_site_table(seeds=3, designs=None, rules=None) -> list[dict]:
    """Sites outside the federation (``predict --site``, docs/methods.md 3.13): per design and
    data split, GrAUC-PFL is tuned inside the whole federation and FedAvg by its own
    cross-validation; then each site in turn is left out, both are refitted on the other
    sites at those settings, and the left-out site's test rows are scored by each rule
    (GrAUC-PFL's coefficients of the sites near it) and by FedAvg's global model; for scale,
    the site's own coefficients of the whole federation's fit (``in the federation``).

    Parameters
    ----------
    seeds : int or iterable of int, optional
        The data splits: an int ``n`` for the seeds ``0 .. n - 1``, else the seeds.
    designs : sequence of tuple, optional
        The designs, each ``(name, DataSpec fields, folds, (w_dist, ridge) grids)``; default
        :data:`NEW_SITE_DESIGNS`.
    rules : sequence of str, optional
        The new-site rules; by default :data:`strategies.stats.predict.NEW_SITE_RULES`.

    Returns
    -------
    list of dict
        A row per design, split, left-out site (with test rows of both classes) and scorer:
        its test AUC.
    """
    from strategies.stats.predict import NEW_SITE_RULES, combine
    from strategies.stats.tuning import CVOptions

    from . import federated_tuning, tuning
    from .graph import new_site_neighbours
    from .metrics import auc

    rules = rules or NEW_SITE_RULES
    rows = []
    for name, spec_fields, folds, (w_dist, ridge) in designs or NEW_SITE_DESIGNS:
        for seed in range(seeds) if isinstance(seeds, int) else seeds:
            t0 = time.perf_counter()
            sites = list(fed.load_sites(fed.DataSpec(**spec_fields, data_seed=seed))[0])
            cfg = GrAUCConfig()
            opts = CVOptions(folds=folds, quiet=True, seed=seed)
            grid = tuning.Grid(w_dist=w_dist, ridge=ridge)
            whole = federated_tuning.run_tuned_inprocess(cfg, sites, "grauc", (opts, grid))
            g_cfg = whole.extra["config"]
            f_cfg, _, _ = tuning.tune(sites, cfg, "fedavg", tuning.Grid(ridge=ridge), opts)
            lat = np.array([s.lat for s in sites])
            lon = np.array([s.lon for s in sites])
            for z, site in enumerate(sites):
                if len(set(site.y_test.tolist())) < 2:
                    continue
                rest = [s for k, s in enumerate(sites) if k != z]
                keep = np.arange(len(sites)) != z
                g = fed.run_methods_inprocess(g_cfg, rest, ["grauc"])["grauc"]
                f = fed.run_methods_inprocess(f_cfg, rest, ["fedavg"])["fedavg"]
                scores = {"in the federation": whole.coefficients[z], "FedAvg": f.coefficients[0]}
                for rule in rules:
                    u, d, w = new_site_neighbours(
                        lat[keep], lon[keep], lat[z], lon[z], rule, g_cfg.graph, g_cfg.knn_k,
                        g_cfg.w_dist, g_cfg.q,
                    )  # fmt: skip
                    scale = g.extra.get("scale")
                    scores[rule] = combine(g.coefficients[u], w, rule, g_cfg.penalty, scale)
                for scorer, coef in scores.items():
                    rows.append(
                        {
                            "what": "new site",
                            "design": name,
                            "seed": seed,
                            "site": site.site,
                            "n_train": len(site.y_train),
                            "scorer": scorer,
                            "test_auc": auc(site.x_test @ coef, site.y_test),
                            "grauc": f"lam={g_cfg.lam:.4g} w_dist={g_cfg.w_dist:g} "
                            f"ridge={g_cfg.ridge:g}",
                        }
                    )
            frame = pd.DataFrame([r for r in rows if r["design"] == name and r["seed"] == seed])
            print(
                f"{name}, split {seed} ({time.perf_counter() - t0:.0f} s): "
                + ", ".join(
                    f"{k} {v:.4f}" for k, v in frame.groupby("scorer")["test_auc"].mean().items()
                ),
                flush=True,
            )
    return rows


def new_site_run(out: str, seeds: int) -> pd.DataFrame:
    """``bench --new-site``: :func:`new_site_table` written to ``out``, then summarized.

    Parameters
    ----------
    out : str
        The directory ``bench.csv`` goes into (checked first; empty: nothing written).
    seeds : int
        The number of data splits.

    Returns
    -------
    pandas.DataFrame
        The mean and count of the test AUC per machine, design and scorer.
    """
    check_out(out)
    df = finish(new_site_table(seeds), out)
    keys = ["machine", "what", "design", "scorer"]
    return df.groupby(keys, sort=False)["test_auc"].agg(["mean", "count"]).reset_index()


#: The calibrations the study compares (docs/methods.md 3.14): each site's own logistic
#: recalibration of its out-of-fold scores, the sites' random-effects mean for every site,
#: and each site's shrunk toward that mean (the one ``predict --probability`` uses).
CALIBRATIONS = ("site", "pooled", "shrunk")
#: The methods whose risks the study calibrates: GrAUC-PFL tuned inside the federation
#: (its calibration.csv), GrAUC-PFL at its default setting (``grauc-default``: the
#: calibration a plain ``fit`` writes, the cross-validation of its own setting), FedAvg and
#: each site alone tuned by their own cross-validation.
CALIBRATED_METHODS = ("grauc", "grauc-default", "fedavg", "individual")


def out_of_fold_calibration(sites, cfg: GrAUCConfig, method: str, folds: int, seed: int):
    """A comparator's ``calibration.csv`` table
    (:func:`strategies.stats.calibration.calibration_frame`) the way a tuned GrAUC-PFL fit
    gets its own: each site's rows in the folds a federated tuning draws
    (:func:`strategies.client.folds.site_folds`), ``method`` fitted at ``cfg`` on the other
    folds' rows of every site, each held-out row scored by its site's coefficients of that
    fit, and each site's out-of-fold scores recalibrated (Firth) and shrunk.

    Parameters
    ----------
    sites : sequence of SiteData
        The sites' data.
    cfg : GrAUCConfig
        The setting ``method`` is fitted at.
    method : str
        The comparator.
    folds : int
        The number of folds.
    seed : int
        The folds' seed.

    Returns
    -------
    pandas.DataFrame
        The calibration table, a row per site.
    """
    from dataclasses import replace

    from strategies.client.folds import site_folds
    from strategies.client.guards import Guards
    from strategies.stats.calibration import calibration_frame, recalibrate

    fold_of = [site_folds(s.y_train, folds, seed, 0, s.site, True) for s in sites]
    oof = [np.full(len(s.y_train), np.nan) for s in sites]
    for k in range(folds):
        part = [replace(s, x_train=s.x_train[f != k], y_train=s.y_train[f != k])
                for s, f in zip(sites, fold_of, strict=True)]  # fmt: skip
        fits = fed.run_methods_inprocess(cfg, part, [method], guards=Guards().for_view())
        coef = fits[method].coefficients
        for z, (s, f) in enumerate(zip(sites, fold_of, strict=True)):
            oof[z][f == k] = s.x_train[f == k] @ coef[z]
    fits = [recalibrate(o, s.y_train) for o, s in zip(oof, sites, strict=True)]
    return calibration_frame(
        [s.site for s in sites], [f["n_pos"] for f in fits], [f["n_neg"] for f in fits],
        [f["a"] for f in fits], [f["b"] for f in fits], [f["cov"][0, 0] for f in fits],
        [f["cov"][1, 1] for f in fits],
    )  # fmt: skip


def calibration_table(seeds=3, designs=None, methods=CALIBRATED_METHODS) -> list[dict]:
    """Calibrated risks on held-out test rows: per design and data split, each of ``methods``
    fitted to every site's training rows with its calibration from out-of-fold scores
    (GrAUC-PFL's calibration.csv from its federated tuning; the others' from
    :func:`out_of_fold_calibration` at the setting their own cross-validation chose), each
    site's test rows scored by its coefficients and mapped to probabilities by each of
    :data:`CALIBRATIONS`.

    Parameters
    ----------
    seeds : int or iterable of int, optional
        The data splits: an int ``n`` for the seeds ``0 .. n - 1``, else the seeds.
    designs : sequence of tuple, optional
        The designs, each ``(name, DataSpec fields, folds, (w_dist, ridge) grids)``; default
        :data:`NEW_SITE_DESIGNS`.
    methods : sequence of str, optional
        The methods, among :data:`CALIBRATED_METHODS` (the default).

    Returns
    -------
    list of dict
        A row per design, split, method, site (with test rows of both classes) and
        calibration: Brier score, expected calibration error, and the calibration intercept
        and slope on the site's test rows, with the site's training and test counts.
    """
    from scipy.special import expit

    from strategies.stats.calibration import calibration_mean, calibration_metrics
    from strategies.stats.tuning import CVOptions

    from . import federated_tuning, tuning

    rows = []
    for name, spec_fields, folds, (w_dist, ridge) in designs or NEW_SITE_DESIGNS:
        for seed in range(seeds) if isinstance(seeds, int) else seeds:
            sites, _ = fed.load_sites(fed.DataSpec(**spec_fields, data_seed=seed))
            sites = list(sites)
            opts = CVOptions(folds=folds, quiet=True, seed=seed)
            fitted = {}
            for method in methods:
                if method in ("grauc", "grauc-default"):
                    c = GrAUCConfig()
                    grid = tuning.Grid(w_dist=w_dist, ridge=ridge)
                    if method == "grauc-default":  # one setting: a plain fit's calibration
                        grid = tuning.Grid(lam=(c.lam,), w_dist=(c.w_dist,), ridge=(c.ridge,),
                                           size_power=(c.size_power,))  # fmt: skip
                    res = federated_tuning.run_tuned_inprocess(c, sites, "grauc", (opts, grid))
                    fitted[method] = (res.coefficients, res.extra["calibration"])
                    continue
                cfg, _, _ = tuning.tune(
                    sites, GrAUCConfig(), method, tuning.Grid(ridge=ridge), opts
                )
                coef = fed.run_methods_inprocess(cfg, sites, [method])[method].coefficients
                fitted[method] = (coef, out_of_fold_calibration(sites, cfg, method, folds, seed))
            for method, (coefficients, cal) in fitted.items():
                cal = cal.set_index("site")
                own_a, own_b = cal["site_intercept"], cal["site_slope"]
                mu_a, mu_b = calibration_mean(cal)
                for s, beta in zip(sites, coefficients, strict=True):
                    if len(set(s.y_test.tolist())) < 2:
                        continue
                    score = s.x_test @ beta
                    ab = {
                        "site": (own_a[s.site], own_b[s.site]),
                        "pooled": (mu_a, mu_b),
                        "shrunk": (cal.at[s.site, "intercept"], cal.at[s.site, "slope"]),
                    }
                    if not np.isfinite(ab["site"]).all():  # no estimate of its own
                        ab["site"] = ab["pooled"]
                    for how in CALIBRATIONS:
                        a, b = ab[how]
                        scores = calibration_metrics(expit(a + b * score), s.y_test)
                        rows.append({"what": "calibration", "design": name, "seed": seed,
                                     "method": method, "site": s.site,
                                     "n_train": len(s.y_train), "n_test": len(s.y_test),
                                     "calibration": how, **scores})  # fmt: skip
            print(f"calibration: {name}, split {seed} done", flush=True)
    return rows


def calibration_run(out: str, seeds: int) -> pd.DataFrame:
    """``bench --calibration``: :func:`calibration_table` written to ``out``, then summarized.

    Parameters
    ----------
    out : str
        The directory ``bench.csv`` goes into (checked first; empty: nothing written).
    seeds : int
        The number of data splits.

    Returns
    -------
    pandas.DataFrame
        The mean Brier score, calibration error and slope per machine, design, method,
        calibration and the sites' size (the smaller or larger half of a design's sites by
        training rows, or all when they have one size).
    """
    check_out(out)
    df = finish(calibration_table(seeds), out)
    small = df.groupby("design")["n_train"].transform(lambda n: n <= n.median())
    equal = df.groupby("design")["n_train"].transform("nunique") == 1
    df["sites"] = np.where(equal, "all (one size)", np.where(small, "smaller half", "larger half"))
    keys = ["machine", "what", "design", "method", "sites", "calibration"]
    return df.groupby(keys, sort=False)[["brier", "ece", "cal_slope"]].mean().reset_index()


def _settings(batch) -> list[dict]:
    """The settings of a GrAUC-PFL tuning's all-rows jobs, in their index order."""
    out = {}
    for job in batch.jobs.values():
        if job.key.startswith("cv/"):
            i = int(job.key.split("/")[1])
            out.setdefault(i, {k: job.setting[k] for k in ("lam", "w_dist", "ridge", "size_power")})
    return [out[i] for i in sorted(out)]


def criteria_run(out: str, seeds: int, quick: bool = False) -> pd.DataFrame:
    """``bench --criteria``: :func:`criteria_table` written to ``out``.

    Parameters
    ----------
    out : str
        The directory ``bench.csv`` goes into (checked first; empty: nothing written).
    seeds : int
        The number of data splits.
    quick : bool, optional
        Fewer designs (:func:`criteria_table`).

    Returns
    -------
    pandas.DataFrame
        The table's rows, with the machine.
    """
    check_out(out)
    return finish(criteria_table(seeds, quick), out)


def run(out: str, quick: bool = False, flower: bool = True) -> pd.DataFrame:
    """``bench``: the rounds, ``flwr run``, gradient, graph, server-step and tuning
    measurements written to ``out``.

    Parameters
    ----------
    out : str
        The directory ``bench.csv`` goes into (checked first; empty: nothing written).
    quick : bool, optional
        Smaller measurements: a lower round limit, fewer gradient and graph sizes, and the
        tuning's grid at one ``w_dist`` and one ``ridge``.
    flower : bool, optional
        Whether to time a fit through ``flwr run``.

    Returns
    -------
    pandas.DataFrame
        A row per measurement, with the machine.
    """
    check_out(out)
    rows = rounds_table(quick)
    if flower:
        rows.append(flower_round_time())
    rows += gradient_table([(1000, 9000), (10000, 90000)] if not quick else [(1000, 9000)])
    rows += graph_table([100, 1000, 10000] if not quick else [100, 1000])
    rows += server_step_table([200, 2000])
    rows.append(tuning_time(quick))
    return finish(rows, out)

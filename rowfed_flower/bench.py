"""``python -m rowfed_flower bench``: rounds RowFed needs, side by side, on this machine.

On the §2.8 simulation (M = 10 clients, n_m = 100, (p, q) = (20, 20)), for the lasso at the
default levels and for SCAD and MCP: rounds to a 1e-4 and a 1e-6 relative objective gap and to the
stopping rule (``tol`` = 1e-6) for the defaults (``algorithm = auto``: proximal quasi-Newton;
for SCAD and MCP its local linear approximations), the defaults with partial participation
(0.5, 0.8) and with exact curvature, ADMM with the exact local step (for the lasso also at
participation 0.5), and the paper's linearized ADMM at rho in {0.3, 1, 3}; and the
in-process time per round.  The optimum is the lowest objective of a tight run (tol 1e-12)
of every variant (for SCAD and MCP: of the ADMM variants, the paper's fixed points; the gap
is signed, so ending below them counts as reaching them).  Ratios
between variants are the figures to quote; absolute times depend on the machine.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from strategies.config import RowFedConfig
from strategies.experiments.benchtable import check_out, finish, format_table  # noqa: F401


def _first_below(gaps: np.ndarray, level: float) -> float:
    """The first round after which the (signed) gap stays at or below ``level`` (nan if
    never)."""
    above = np.flatnonzero(gaps > level)
    if len(above) == 0:
        return 1.0
    return float(above[-1] + 2) if above[-1] + 1 < len(gaps) else float("nan")


def rounds_table(quick: bool = False) -> list[dict]:
    """Every variant through the in-process engine (the Strategy and NumPyClient objects
    that ``flwr run`` uses), from the same ridge start, without an intercept (§2.8 has
    none)."""
    from .federation import run_methods_inprocess
    from .sources import DataSpec, simulated_data

    data = simulated_data(DataSpec(seed=1))
    base = RowFedConfig(intercept=False)
    limit = 1500 if quick else 4000
    rows = []
    settings = [("lasso", base.lam1, base.lam2)]
    if not quick:
        settings += [("scad", 0.2, 0.1), ("mcp", 0.2, 0.1)]
    for penalty, lam1, lam2 in settings:
        cfg = base.replace(penalty=penalty, lam1=lam1, lam2=lam2)
        variants = [
            (f"defaults ({cfg.resolved_algorithm})", {}),
            ("admm prox, rho=1", {"algorithm": "admm"}),
        ]
        for share in (0.5, 0.8):  # a random part of the clients per round (seed 0)
            variants.append((f"defaults, participation {share:g}", {"participation": share}))
        if penalty == "lasso":
            variants.append(
                ("admm prox, participation 0.5", {"algorithm": "admm", "participation": 0.5})
            )
        variants.append(("defaults, curvature exact", {"curvature": "exact"}))
        for rho in (0.3, 1.0, 3.0):
            changes = {"algorithm": "admm", "local_solver": "linearized", "rho": rho}
            variants.append((f"admm linearized rho={rho:g} (paper)", changes))
        runs = {}
        for name, changes in variants:
            try:
                variant = cfg.replace(**changes)
                variant.penalty_obj().check_rho(variant.rho)
            except ValueError as exc:  # SCAD's concavity bound at a small rho
                rows.append(
                    {"what": "rounds", "penalty": penalty, "variant": name, "note": str(exc)}
                )
                continue
            t0 = time.perf_counter()
            tight = run_methods_inprocess(
                variant.replace(tol=1e-12, max_rounds=limit), data, ["rowfed"]
            )["rowfed"]
            seconds = (time.perf_counter() - t0) / max(tight.rounds, 1)
            stop = run_methods_inprocess(variant.replace(max_rounds=limit), data, ["rowfed"])[
                "rowfed"
            ]
            runs[name] = (tight, stop, seconds)
        # the reference: the lowest objective of the tight runs whose history holds true
        # values (ADMM's iterates; the full-participation pqn's accepted points -- the
        # incremental form records the models' value at its estimate, a prediction before
        # the end); for MCP/SCAD only the paper's ADMM, its fixed points (pqn's
        # approximations may end at another stationary point, and the gap is signed, so
        # ending below the reference counts as reaching it)
        fstar = min(
            h["objective"]
            for name, (t, _, _) in runs.items()
            if "admm" in name or (penalty == "lasso" and name.startswith("defaults ("))
            for h in t.history
        )
        for name, (tight, stop, seconds) in runs.items():
            gaps = np.array([(h["objective"] - fstar) / abs(fstar) for h in tight.history])
            rows.append(
                {
                    "what": "rounds",
                    "penalty": penalty,
                    "variant": name,
                    "rounds_to_1e-4": _first_below(gaps, 1e-4),
                    "rounds_to_1e-6": _first_below(gaps, 1e-6),
                    "rounds_to_stop": stop.rounds if stop.converged else float("nan"),
                    "objective_at_stop": stop.objective,
                    "seconds_per_round_inprocess": seconds,
                }
            )
    return rows


def tuning_rows(quick: bool) -> list[dict]:
    """The federated tuning (one batched run) on the same problem, lasso, the default grids
    (``--tune gic`` and ``--tune cv`` with 5 folds): rounds and fits of the tuning and the
    refit together against one default fit's, the server's time per round against the
    slowest client's."""
    from strategies.experiments.benchtable import timed_tuning
    from strategies.server.rowfed import rowfed_registry
    from strategies.stats.tuning import CVOptions

    from . import federation as fed
    from . import sources as rsources
    from .federated_tuning import tuned_strategy
    from .tuning import DEFAULT_LAM1_GRID, DEFAULT_LAM2_GRID

    data = rsources.load_data(rsources.DataSpec())
    cfg = RowFedConfig()
    single = fed.run_methods_inprocess(cfg, data, ["rowfed"])["rowfed"].rounds
    lam1 = DEFAULT_LAM1_GRID[:2] if quick else DEFAULT_LAM1_GRID
    rows = []
    for by in ("gic", "cv"):
        options = (CVOptions(quiet=True), lam1, DEFAULT_LAM2_GRID, None)
        batch = tuned_strategy("rowfed", cfg, len(data.clients), rowfed_registry(),
                                   (by, options))  # fmt: skip
        row = timed_tuning(batch, data.make_clients(), fed.max_rounds_for("rowfed", cfg, True))
        res = fed.collect("rowfed", batch)
        rows.append(
            {
                "what": "tune",
                "variant": f"rowfed lasso, --tune {by}" + (", 5 folds" if by == "cv" else ""),
                **row,
                "rounds_one_fit": single,
                "chosen": f"lam1={res.lam1:g} lam2={res.lam2:g}",
            }
        )
    return rows


def run(out: str, quick: bool = False) -> pd.DataFrame:
    """``bench``: the rounds of every variant (:func:`rounds_table`) and of the federated tuning
    (:func:`tuning_rows`), in one table.

    Parameters
    ----------
    out : str
        The directory ``bench.csv`` is written to (empty: nothing is written), checked
        before anything runs.
    quick : bool, optional
        The lasso only at a lower round limit, and the tuning over the first two ``lam1``
        values of the default grid.

    Returns
    -------
    pandas.DataFrame
        A row per measurement, with a ``machine`` column.
    """
    check_out(out)
    return finish(rounds_table(quick) + tuning_rows(quick), out)

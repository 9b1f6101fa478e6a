"""``python -m rowfed_flower bench --scale``: RowFed's cost against the clients, (p, q)
and the rows a client (:mod:`strategies.experiments.scale` runs the cells): a default fit
and its ``--tune gic``, with their peak memory."""

from __future__ import annotations

import time

import pandas as pd

from strategies.config import RowFedConfig


def _scale_data(clients: int, pq: int, rows: int):
    from .sources import DataSpec, simulated_data

    spec = DataSpec(seed=1, num_clients=clients, n_train=rows, num_features=pq,
                          num_responses=pq)  # fmt: skip
    return simulated_data(spec)


def scale_fit(clients: int = 10, pq: int = 100, rows: int = 100) -> dict:
    """A default RowFed fit (in process) of the paper's simulation (docs/methods.md 2.8).

    Parameters
    ----------
    clients : int, optional
        The number of clients.
    pq : int, optional
        ``p = q = pq``.
    rows : int, optional
        Training rows a client.

    Returns
    -------
    dict
        ``seconds`` (the fit's wall time) and ``rounds``.
    """
    from .federation import run_methods_inprocess

    data = _scale_data(clients, pq, rows)
    t0 = time.perf_counter()
    res = run_methods_inprocess(RowFedConfig(), data, ["rowfed"])["rowfed"]
    return {"seconds": time.perf_counter() - t0, "rounds": int(res.rounds)}


def scale_tune(clients: int = 10, pq: int = 100, rows: int = 100) -> dict:
    """``fit --tune gic`` (inside the federation, in process, the default grids) of the same
    design: the GIC path and its choice.

    Parameters
    ----------
    clients : int, optional
        The number of clients.
    pq : int, optional
        ``p = q = pq``.
    rows : int, optional
        Training rows a client.

    Returns
    -------
    dict
        ``seconds`` (wall time), ``rounds`` and the chosen ``lam1``, ``lam2``.
    """
    from strategies.config import TuneConfig

    from .federated_tuning import federated_options, run_tuned_inprocess

    data = _scale_data(clients, pq, rows)
    t0 = time.perf_counter()
    opts = federated_options(TuneConfig(by="gic"))
    res = run_tuned_inprocess(RowFedConfig(), data, "rowfed", ("gic", opts))
    return {"seconds": time.perf_counter() - t0, "rounds": int(res.rounds),
            "lam1": float(res.lam1), "lam2": float(res.lam2)}  # fmt: skip


def scale_cells(quick: bool = False) -> list:
    """The cells of ``bench --scale``: a default fit against the clients (10, 20, 50 at
    p = q = 100), against p = q (20, 50, 100 at 10 clients) and against the rows a client
    (10^2 to 10^5 at p = q = 20); ``--tune gic`` against p = q.  ``quick``: the small end."""
    from strategies.experiments.scale import Cell

    here = "rowfed_flower.scale"
    clients = (5, 10) if quick else (10, 20, 50)
    pqs = (10, 20) if quick else (20, 50, 100)
    rows = (100, 1_000) if quick else (100, 1_000, 10_000, 100_000)
    top = pqs[-1]
    cells = [Cell("rowfed", "fit", "clients", m, f"{here}:scale_fit", {"clients": m, "pq": top})
             for m in clients]  # fmt: skip
    cells += [Cell("rowfed", "fit", "p = q", k, f"{here}:scale_fit", {"pq": k}) for k in pqs]
    cells += [Cell("rowfed", "fit", "rows a client", n, f"{here}:scale_fit",
                   {"pq": pqs[0], "rows": n}) for n in rows]  # fmt: skip
    cells += [Cell("rowfed", "tune gic", "p = q", k, f"{here}:scale_tune", {"pq": k})
              for k in pqs]  # fmt: skip
    return cells


def scale_run(out: str, quick: bool = False) -> pd.DataFrame:
    """``bench --scale``: every cell of :func:`scale_cells`, each in a fresh process
    (:func:`strategies.experiments.scale.run_scale`), with a progress line per cell on stderr.

    Parameters
    ----------
    out : str
        The directory ``scale.csv``, ``slopes.csv`` and ``scale.png`` are written to (empty:
        nothing is written).
    quick : bool, optional
        The small end of each axis.

    Returns
    -------
    pandas.DataFrame
        A row per cell.
    """
    from strategies.experiments.scale import run_scale
    from strategies.runtime.cli import line_to_stderr

    return run_scale(scale_cells(quick), out, progress=line_to_stderr)

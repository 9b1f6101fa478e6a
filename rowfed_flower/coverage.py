"""The RowFed coverage study (docs/studies.md, "Coverage studies"):
``python -m rowfed_flower study --config configs/coverage_rowfed.toml``.

A study config with a ``[coverage]`` table.  One task simulates the docs/methods.md 2.8
federation (``[data] clusters``: the client clusters of each non-zero row), fits RowFed at
the config's fixed ``lam1``, ``lam2`` with ``inference = oracle``, and scores the intervals
of its ``inference.csv`` against the true Θ (:mod:`strategies.experiments.coverage`): per
kind of true coefficient (``fused``: non-zero in a row shared with other clients;
``unique``: non-zero in the client's own row; ``zero``), and whether the structure was
identified (every predictor's row partition and every zero exactly right).
"""

from __future__ import annotations

import pandas as pd

from strategies import quiet_flower
from strategies.experiments.coverage import (
    identified,
    run_coverage,
    score_table,
    task_frame,
    true_kinds,
)
from strategies.stats.inference import group_sizes

from .study import parse_settings, simulated_federation

TASK = "rowfed_flower.coverage:run_task"
#: The design key the coverage figure puts on its x axis.
SIZE_KEY = "n_m"


def run_task(settings: dict, cell: dict, rep: int, seed: int) -> dict[str, pd.DataFrame]:
    """One (cell, replication): ``results`` with one row per kind of coefficient.

    Parameters
    ----------
    settings : dict
        The study config's tables but ``[design]``
        (:func:`rowfed_flower.study.parse_settings`).
    cell : dict
        The design cell: ``M``, ``n_m``, ``p``, ``q``.
    rep : int
        The replication's number, recorded in the rows.
    seed : int
        The task's seed: the simulation's and the fit's.

    Returns
    -------
    dict of str to pandas.DataFrame
        ``{"results": frame}``.
    """
    quiet_flower()
    from . import federation as fed
    from .inference import inference_table

    st = parse_settings(settings, tuple(cell))
    data = simulated_federation(st, cell, seed)
    cfg = st.cfg.replace(seed=seed)
    res = fed.run_methods_inprocess(cfg, data, ["rowfed"])["rowfed"]
    fit = res.extra.get("inference")
    if fit is None:
        raise RuntimeError("no oracle refit: a client sent no moments")
    table = inference_table(fit, res.sites, data.features, data.responses, cfg.level)
    truth = data.theta_true
    kind = true_kinds(group_sizes(data.partitions_true)[:, :, None], truth == 0)
    ident = identified(data.partitions_true, res.clusters, truth != 0, res.coefficients != 0)
    rows = score_table("rowfed", table, truth, kind, ident)
    return {"results": task_frame(rows, cell, rep, seed, res)}


def run(a, study, st) -> int:
    """The ``study`` command on a coverage config.

    Parameters
    ----------
    a : argparse.Namespace
        The ``study`` subcommand's options.
    study : Study
        The parsed config (:func:`rowfed_flower.study.load`).
    st : Settings
        Its parsed settings; ``st.coverage`` is the intervals' level.

    Returns
    -------
    int
        The exit code.
    """
    return run_coverage(a, study, TASK, st.coverage, SIZE_KEY)


__all__ = ["TASK", "run", "run_task"]

"""Coverage studies of the oracle intervals, both methods (docs/studies.md, "Coverage").

A coverage study fits the method at fixed tuning values with ``inference = oracle`` on
simulated data whose truth is known, and asks two questions per replication: was the
structure identified exactly (every predictor's partition of the sites, and for RowFed
the zeros), and which true coefficients do the intervals cover?  A study config turns into
one by a ``[coverage]`` table (:func:`parse_coverage`); the method's own task computes the
truth and calls :func:`coverage_rows`; the runner writes :func:`coverage_summary` in place of
the usual mean (SD) tables.

Each true coefficient has a *kind* (:func:`true_kinds`): ``fused`` (non-zero, or any value
for a method without a sparsity penalty, shared by two or more sites), ``unique`` (its site's
alone) or ``zero`` (a true zero of a method that sets coefficients to zero).  A coefficient
is covered when ``lower <= truth <= upper``; one the fit set to zero has no interval and
counts as covered exactly when the truth is zero.  Flower-free.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..errors import InputError
from ..solvers.problems import canonical_labels

#: The kinds of coefficient, in table order.
KINDS = ("fused", "unique", "zero")
#: The per-replication columns a coverage task writes (after the design keys and ``rep``).
COLUMNS = ("method", "kind", "n_coef", "n_covered", "coverage", "width", "identified")


def coverage_setting(settings: dict, method: str, fixed: Sequence[str]) -> float | None:
    """:func:`parse_coverage` and, for a coverage study, :func:`check_coverage_settings`.

    Parameters
    ----------
    settings : dict
        The study config's tables but ``[design]`` (:attr:`Study.settings`).
    method : str
        The method's name, the only one a coverage study may fit.
    fixed : sequence of str
        The method's tuning values, set in its table in a coverage study.

    Returns
    -------
    float or None
        The coverage level, or ``None`` when the config is not a coverage study.
    """
    level = parse_coverage(settings)
    if level is not None:
        check_coverage_settings(settings, method, fixed)
    return level


def parse_coverage(settings: dict) -> float | None:
    """The ``[coverage]`` table of a study config: ``None`` when absent (not a coverage
    study), else its ``level`` (default 0.95)."""
    table = settings.get("coverage")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise InputError("coverage: expected a table (e.g. level = 0.95)")
    for key in table:
        if key != "level":
            raise InputError(f"coverage.{key}: unknown setting (allowed: level)")
    level = table.get("level", 0.95)
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise InputError(f"coverage.level: must be in (0, 1), got {level!r}")
    return float(level)


def check_coverage_settings(settings: dict, method: str, fixed: Sequence[str]) -> None:
    """What a coverage study cannot have: another method, a ``[tuning]`` table (the tuning
    values are fixed), a real data source.  Each is an :class:`InputError` naming the key.

    Parameters
    ----------
    settings : dict
        The study config's tables but ``[design]``.
    method : str
        The method's name.
    fixed : sequence of str
        The tuning values set in the method's table instead (named by the error).
    """
    methods = settings.get("methods", [method])
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",")]
    if list(methods) != [method]:
        raise InputError(f"methods: a coverage study fits {method!r} only, got {methods!r}")
    if "tuning" in settings:
        raise InputError(
            f"tuning: a coverage study fits at fixed values; set {', '.join(fixed)} in [{method}]"
        )
    data = settings.get("data", {})
    if isinstance(data, dict) and data.get("source", "simulated") != "simulated":
        raise InputError("data.source: a coverage study needs simulated data (a known truth)")


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two label arrays split the sites the same way for every predictor (labels
    compared up to renaming).

    Parameters
    ----------
    a, b : ndarray, shape (sites, p)
        Cluster labels per site and predictor.

    Returns
    -------
    bool
        ``False`` also when the shapes differ.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    return all(
        np.array_equal(canonical_labels(a[:, j]), canonical_labels(b[:, j]))
        for j in range(a.shape[1])
    )


def identified(true_labels, labels, true_support=None, support=None) -> bool:
    """The structure was identified exactly: the same partition for every predictor, and
    (when given) the same zeros.

    Parameters
    ----------
    true_labels, labels : ndarray, shape (sites, p)
        The true and the fitted cluster labels (:func:`same_partition`).
    true_support, support : ndarray of bool, optional
        The true and the fitted non-zero patterns; ``true_support`` ``None``: not compared.

    Returns
    -------
    bool
    """
    if not same_partition(true_labels, labels):
        return False
    if true_support is None:
        return True
    return bool(np.array_equal(np.asarray(true_support, bool), np.asarray(support, bool)))


def true_kinds(group_size: np.ndarray, zero: np.ndarray | None = None) -> np.ndarray:
    """The kind of every true coefficient: ``zero`` where ``zero`` is true, else ``fused``
    when ``group_size > 1``, else ``unique``.

    Parameters
    ----------
    group_size : ndarray
        The number of sites that share each true coefficient (broadcast to ``zero``'s shape).
    zero : ndarray of bool, optional
        The true zeros; ``None``: a method without a sparsity penalty (no ``zero`` kind).

    Returns
    -------
    ndarray of str
        ``"fused"``, ``"unique"`` or ``"zero"`` per coefficient.
    """
    size = np.asarray(group_size)
    if zero is not None:
        size = np.broadcast_to(size, np.shape(zero))
    kind = np.where(size > 1, "fused", "unique")
    if zero is not None:
        kind = np.where(np.asarray(zero, bool), "zero", kind)
    return kind


def covered(truth, estimate, lower, upper) -> np.ndarray:
    """Elementwise: the interval holds the truth; a coefficient without an interval (set
    to zero by the fit, or not estimable) is covered only when its estimate is the truth.

    Parameters
    ----------
    truth, estimate : array_like
        The true and the estimated coefficients.
    lower, upper : array_like
        The intervals' bounds; a coefficient has an interval where both are finite.

    Returns
    -------
    ndarray of bool
        Whether each coefficient is covered.
    """
    truth = np.asarray(truth, dtype=float)
    lower = np.asarray(lower, dtype=float)
    upper = np.asarray(upper, dtype=float)
    has = np.isfinite(lower) & np.isfinite(upper)
    inside = (lower <= truth) & (truth <= upper)
    return np.where(has, inside, np.asarray(estimate, dtype=float) == truth)


def coverage_rows(method: str, kind, hit, width, ident: bool) -> list[dict]:
    """One replication's rows: per kind present, the number of true coefficients, how many
    were covered, their share, the mean interval width (over those with an interval) and
    whether the structure was identified.

    Parameters
    ----------
    method : str
        The method's name (the ``method`` column).
    kind : array_like of str
        Each coefficient's kind (:func:`true_kinds`).
    hit : array_like of bool
        Whether each is covered (:func:`covered`).
    width : array_like of float
        Each interval's width (not finite: no interval).
    ident : bool
        Whether the structure was identified (:func:`identified`).

    Returns
    -------
    list of dict
        One row per kind present, in :data:`KINDS` order, with the columns of
        :data:`COLUMNS`.
    """
    kind = np.asarray(kind).ravel()
    hit = np.asarray(hit, dtype=bool).ravel()
    width = np.asarray(width, dtype=float).ravel()
    rows = []
    for k in KINDS:
        on = kind == k
        if not on.any():
            continue
        w = width[on][np.isfinite(width[on])]
        rows.append(
            {
                "method": method,
                "kind": k,
                "n_coef": int(on.sum()),
                "n_covered": int(hit[on].sum()),
                "coverage": float(hit[on].mean()),
                "width": float(w.mean()) if w.size else np.nan,
                "identified": bool(ident),
            }
        )
    return rows


def score_table(method: str, table: pd.DataFrame, truth, kind, ident: bool) -> list[dict]:
    """:func:`coverage_rows` of an ``inference.csv`` table against the true coefficients.

    Parameters
    ----------
    method : str
        The method's name.
    table : pandas.DataFrame
        The inference table, with ``estimate``, ``lower`` and ``upper`` columns and its rows
        in the order of ``truth``'s elements (site, feature[, response]).
    truth : ndarray
        The true coefficients.
    kind : array_like of str
        Each coefficient's kind (:func:`true_kinds`).
    ident : bool
        Whether the structure was identified.

    Returns
    -------
    list of dict
        The replication's rows (:func:`coverage_rows`).
    """
    shape = np.shape(truth)
    estimate, lower, upper = (
        table[c].to_numpy(dtype=float).reshape(shape) for c in ("estimate", "lower", "upper")
    )
    hit = covered(truth, estimate, lower, upper)
    return coverage_rows(method, kind, hit, upper - lower, ident)


def task_frame(rows: list[dict], cell: dict, rep: int, seed: int, res) -> pd.DataFrame:
    """A coverage task's ``results``: the design values, ``rep``, the rows, and the fit's
    ``rounds``, ``converged`` and the task's seed.

    Parameters
    ----------
    rows : list of dict
        The replication's rows (:func:`score_table`).
    cell : dict
        The design values, the first columns.
    rep : int
        The replication.
    seed : int
        The task's seed.
    res : object
        The fit's result, with ``rounds`` and ``converged``.

    Returns
    -------
    pandas.DataFrame
    """
    frame = pd.DataFrame(rows).assign(rounds=res.rounds, converged=res.converged, seed=seed)
    frame.insert(0, "rep", rep)
    for pos, key in enumerate(cell):
        frame.insert(pos, key, cell[key])
    return frame


def run_coverage(a, study, task: str, level: float, size_key: str) -> int:
    """The ``study`` command on a coverage config (both methods): coverage tables and
    ``fig_coverage.png``.

    Parameters
    ----------
    a : argparse.Namespace
        The ``study`` command's options (:func:`strategies.experiments.runner.add_study_options`).
    study : Study
        The study config.
    task : str
        The method's coverage task, ``"module:function"``.
    level : float
        The intervals' nominal level (the figure's line).
    size_key : str
        The design key on the figure's x axis (the sample size).

    Returns
    -------
    int
        The exit code (:func:`strategies.experiments.runner.run_study`).
    """
    from .runner import run_study_args

    def figures(out, study, results, store, cells) -> list[str]:
        return [coverage_figure(out, study, results, level, size_key)]

    return run_study_args(a, study, task, (), figures, tables=coverage_tables)


def summarize_coverage(results: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """The coverage per cell, method and kind of coefficient.

    Parameters
    ----------
    results : pandas.DataFrame
        The study's results: the coverage tasks' rows (:func:`task_frame`).
    keys : sequence of str
        The design keys.

    Returns
    -------
    pandas.DataFrame
        One row per cell, method and kind (cells in the order of their first row, kinds in
        :data:`KINDS` order): ``n_reps``, ``identified`` (share of replications with the
        structure identified), ``coverage`` (covered / true coefficients over every
        replication) with ``coverage_mcse`` (SD of the replications' coverage / sqrt(n)),
        the same over the identified replications only (``n_identified``,
        ``coverage_identified``, ``coverage_identified_mcse``), the mean ``n_coef`` and the
        mean ``width``.
    """
    cols = [*keys, "method", "kind"]
    if results.empty:
        return pd.DataFrame(columns=[*cols, "n_reps", "identified", "coverage"])
    frame = results.copy()
    frame["identified"] = frame["identified"].astype(str).str.lower().isin(("true", "1"))
    rows = []
    for group, part in frame.groupby(cols, sort=False, dropna=False):
        ident = part[part["identified"]]
        rows.append(
            {
                **dict(zip(cols, group, strict=True)),
                "n_reps": int(part["rep"].nunique()),
                "identified": float(part["identified"].mean()),
                "coverage": _share(part),
                "coverage_mcse": _mcse(part),
                "n_identified": int(ident["rep"].nunique()),
                "coverage_identified": _share(ident),
                "coverage_identified_mcse": _mcse(ident),
                "n_coef": float(part["n_coef"].mean()),
                "width": float(part["width"].mean()),
            }
        )
    out = pd.DataFrame(rows)
    order = {k: i for i, k in enumerate(KINDS)}
    rank = out["kind"].map(order)
    cells = out[list(keys) + ["method"]].astype(str).agg("|".join, axis=1)
    first = {c: i for i, c in enumerate(dict.fromkeys(cells))}
    out = out.assign(_c=cells.map(first), _k=rank).sort_values(["_c", "_k"], kind="stable")
    return out.drop(columns=["_c", "_k"]).reset_index(drop=True)


def _share(part: pd.DataFrame) -> float:
    n = part["n_coef"].sum()
    return float(part["n_covered"].sum() / n) if n else np.nan


def _mcse(part: pd.DataFrame) -> float:
    if len(part) < 2:
        return np.nan
    return float(part["coverage"].std(ddof=1) / np.sqrt(len(part)))


def coverage_table(summary: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """The README's layout: one row per cell and kind; the identified share, the coverage
    over all replications and over the identified ones as ``0.951 (0.004)`` (Monte Carlo
    SE), and the mean width.

    Parameters
    ----------
    summary : pandas.DataFrame
        :func:`summarize_coverage`'s table.
    keys : sequence of str
        The design keys.

    Returns
    -------
    pandas.DataFrame
        The design keys, ``method``, ``kind``, ``reps``, ``identified``, ``coverage``,
        ``coverage_identified`` and ``width``, as text.
    """
    if summary.empty:
        return pd.DataFrame(columns=[*keys, "kind"])

    def fmt(value, se) -> str:
        if not np.isfinite(value):
            return ""
        return f"{value:.3f}" + (f" ({se:.3f})" if np.isfinite(se) else "")

    return pd.DataFrame(
        {
            **{k: summary[k] for k in keys},
            "method": summary["method"],
            "kind": summary["kind"],
            "reps": summary["n_reps"],
            "identified": [f"{v:.3f}" for v in summary["identified"]],
            "coverage": [
                fmt(v, s)
                for v, s in zip(summary["coverage"], summary["coverage_mcse"], strict=True)
            ],
            "coverage_identified": [
                fmt(v, s)
                for v, s in zip(
                    summary["coverage_identified"],
                    summary["coverage_identified_mcse"],
                    strict=True,
                )
            ],
            "width": [f"{v:.3g}" if np.isfinite(v) else "" for v in summary["width"]],
        }
    )


def coverage_tables(results: pd.DataFrame, keys: Sequence[str]):
    """The runner's tables for a coverage study.

    Parameters
    ----------
    results : pandas.DataFrame
        The study's results.
    keys : sequence of str
        The design keys.

    Returns
    -------
    summary : pandas.DataFrame
        ``summary.csv`` (:func:`summarize_coverage`).
    table : pandas.DataFrame
        ``summary_table.csv`` (:func:`coverage_table`).
    caption : str
        The report's caption of the latter.
    """
    summary = summarize_coverage(results, keys)
    caption = (
        "Per design cell and kind of true coefficient: the share of replications whose "
        "structure was identified exactly, the coverage of the intervals over all "
        "replications and over the identified ones (Monte Carlo SE), and the mean interval "
        "width (summary_table.csv)."
    )
    return summary, coverage_table(summary, keys), caption


def coverage_figure(out: str, study, results: pd.DataFrame, level: float, size_key: str) -> str:
    """``fig_coverage.png``: per kind, the coverage against the sample size (all
    replications, and the identified ones) with +/- 2 Monte Carlo SE and the nominal level;
    other design keys, one line each.

    Parameters
    ----------
    out : str
        The output directory.
    study : Study
        The study config (its design keys).
    results : pandas.DataFrame
        The study's results.
    level : float
        The nominal level, drawn as a line.
    size_key : str
        The design key of the sample size, on the x axis.

    Returns
    -------
    str
        The figure's path.
    """
    from .plots import finish, pyplot

    plt = pyplot()
    summary = summarize_coverage(results, study.keys)
    kinds = [k for k in KINDS if (summary["kind"] == k).any()]
    others = [k for k in study.keys if k != size_key]
    lines = summary[others].drop_duplicates() if others else pd.DataFrame(index=[0])
    varying = [k for k in others if lines[k].nunique() > 1]
    width = max(4.2 * len(kinds), 8.0, 3.3 * 2 * len(lines))  # room for the legend's row
    fig, axes = plt.subplots(1, len(kinds), figsize=(width, 4.2), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    sizes = sorted(summary[size_key].unique().tolist())
    handles, labels = [], []
    for ax, kind in zip(axes[0], kinds, strict=True):
        part = summary[summary["kind"] == kind]
        for i, line in enumerate(lines.to_dict("records")):
            sel = part
            for k in others:
                sel = sel[sel[k] == line[k]]
            sel = sel.sort_values(size_key)
            x = [sizes.index(v) for v in sel[size_key]]
            name = ", ".join(f"{k}={line[k]}" for k in varying)
            colour = colours[i % len(colours)]
            h = ax.errorbar(
                np.asarray(x) - 0.04,
                sel["coverage"],
                yerr=2 * sel["coverage_mcse"].fillna(0),
                fmt="o-",
                color=colour,
                capsize=3,
            )
            h2 = ax.errorbar(
                np.asarray(x) + 0.04,
                sel["coverage_identified"],
                yerr=2 * sel["coverage_identified_mcse"].fillna(0),
                fmt="s--",
                color=colour,
                mfc="white",
                capsize=3,
            )
            if kind == kinds[0]:
                handles += [h, h2]
                labels += [
                    f"{name}: all replications" if name else "all replications",
                    f"{name}: structure identified" if name else "structure identified",
                ]
        ax.axhline(level, color="k", lw=0.8)
        ax.set_xticks(range(len(sizes)))
        ax.set_xticklabels([str(v) for v in sizes])
        ax.set_xlim(-0.5, len(sizes) - 0.5)
        ax.set_xlabel(size_key)
        ax.set_ylabel("coverage")
        low = np.nanmin(part[["coverage", "coverage_identified"]].to_numpy(dtype=float))
        ax.set_ylim(max(0.0, min(0.85, float(low) - 0.03)), 1.005)
        ax.set_title(f"{kind} coefficients")
    path = os.path.join(out, "fig_coverage.png")
    title = (
        f"Coverage of the {level:.0%} oracle intervals (line: {level:.2f}; bars: +/- 2 Monte "
        "Carlo SE over replications)"
    )
    return finish(fig, title, path, handles, labels)


__all__ = [
    "COLUMNS",
    "KINDS",
    "check_coverage_settings",
    "coverage_figure",
    "coverage_rows",
    "coverage_setting",
    "coverage_table",
    "coverage_tables",
    "covered",
    "identified",
    "parse_coverage",
    "run_coverage",
    "same_partition",
    "score_table",
    "summarize_coverage",
    "task_frame",
    "true_kinds",
]

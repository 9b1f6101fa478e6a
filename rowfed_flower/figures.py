"""Figures of a RowFed study (matplotlib, Agg backend), written next to ``results.csv``.

- ``fig_errors.png``: boxplots over replications of MSE-Est, MSE-Pred and RI per method,
  one group per design cell.
- ``fig_clusters.png``: one replication of one cell (``[figures] cell``): the client
  partition of each variable (row of Theta), true and as estimated by each method; a column
  is a variable, a colour a group of clients sharing that row.

Real data (no true Theta: the results hold ``mse_pred`` and ``mse_<response>`` per client):
``fig_errors.png`` has one panel per metric (MSE-Pred, then each response), boxes of the
per-client values over all replications; ``fig_client_mse.png`` the mean MSE-Pred of each
client (state) per method; ``fig_clusters.png`` shows the estimated partitions only, of the
variables RowFed splits into the most groups.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from strategies.experiments.plots import (
    COMPARATOR_COLORS,
    COMPARATOR_LABELS,
    figure_cell,
    finish,
    method_boxes,
    pyplot,
)

LABELS = {
    "rowfed": "RowFed",
    "perfl-lsma": "PerFL-LSMA",
    "nonfed": "NonFed",
    **COMPARATOR_LABELS,
    "truth": "truth",
}
COLORS = {
    "rowfed": "#d62728",
    "perfl-lsma": "#9467bd",
    "nonfed": "#1f77b4",
    **COMPARATOR_COLORS,
}
METRICS = (
    ("mse_est", "MSE-Est"),
    ("mse_pred", "MSE-Pred"),
    ("ri", "RI (Rand index)"),
)
#: At most this many variables in the cluster figure (the true non-zero rows come first).
MAX_VARIABLES = 20


def _methods(results: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(results["method"]))
    return [m for m in LABELS if m in present] + [m for m in present if m not in LABELS]


def _cell_names(results: pd.DataFrame, keys) -> tuple[list[tuple], list[str]]:
    """Cells in order of appearance, labelled by the keys that vary (all if none varies)."""
    cells = list(dict.fromkeys(tuple(r) for r in results[list(keys)].itertuples(index=False)))
    varying = [k for i, k in enumerate(keys) if len({c[i] for c in cells}) > 1] or list(keys)
    names = []
    for c in cells:
        names.append(", ".join(f"{k}={c[keys.index(k)]}" for k in varying))
    return cells, names


def real_metrics(results: pd.DataFrame) -> tuple[tuple[str, str], ...]:
    """``(column, label)`` of a real-data study's metrics: MSE-Pred, then per response."""
    per = [c for c in results.columns if c.startswith("mse_") and c != "mse_pred"]
    return (("mse_pred", "MSE-Pred"), *((c, f"MSE {c[4:]}") for c in per))


def fig_errors(results: pd.DataFrame, keys, path: str) -> str:
    """``fig_errors.png``: boxplots over replications of each metric per method, one group per
    design cell (real data: of every client's values; a panel per metric, MSE-Pred, then
    each response).

    Parameters
    ----------
    results : pandas.DataFrame
        The study's ``results.csv`` rows.
    keys : sequence of str
        The design keys; a cell is labelled by those that vary.
    path : str
        The PNG file.

    Returns
    -------
    str
        ``path``.
    """
    plt = pyplot()
    keys = list(keys)
    methods = _methods(results)
    cells, names = _cell_names(results, keys)
    width = 0.8 / len(methods)
    n_reps = int(results.groupby(keys)["rep"].nunique().min())
    real = "client" in results.columns
    metrics = real_metrics(results) if real else METRICS
    fig, axes = plt.subplots(
        len(metrics),
        1,
        figsize=(max(7.0, 1.3 * len(cells) * len(methods) / 2 + 2), 1.2 + 2.8 * len(metrics)),
        sharex=True,
        squeeze=False,
    )
    axes = axes[:, 0]
    for ax, (metric, label) in zip(axes, metrics, strict=True):
        for k, m in enumerate(methods):
            groups = []
            for c in cells:
                sel = np.logical_and.reduce(
                    [results[key] == v for key, v in zip(keys, c, strict=True)]
                )
                groups.append(results[sel & (results["method"] == m)][metric].dropna())
            method_boxes(ax, groups, k, width, COLORS.get(m, "white"))
        if metric.startswith("mse"):
            from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

            ax.set_yscale("log")
            lo, hi = ax.get_ylim()
            if hi / lo > 1e4:  # many decades (e.g. a client fitted almost exactly): decades
                ax.yaxis.set_major_locator(LogLocator(numticks=12))
            else:
                subs = (
                    (1.0, 2.0, 5.0)
                    if hi / lo > 10
                    else (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)
                )
                ax.yaxis.set_major_locator(LogLocator(subs=subs))
                ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3, which="both")
        ax.set_xlim(-0.6, len(cells) - 0.4)
    axes[-1].set_xticks(range(len(cells)))
    axes[-1].set_xticklabels(names, rotation=20 if len(cells) > 4 else 0)
    handles = [
        plt.Rectangle((0, 0), 1, 1, facecolor=COLORS.get(m, "white"), alpha=0.75) for m in methods
    ]
    reps = f"{n_reps} replication{'s' if n_reps != 1 else ''}"
    if real:
        title = (
            f"Test prediction error per client (boxes: every client and replication, {reps} "
            "of a random train/test split; log scale)"
        )
    else:
        title = (
            f"Estimation and prediction error, cluster recovery ({reps} per cell; "
            "MSE on a log scale)"
        )
    return finish(fig, title, path, handles, [LABELS.get(m, m) for m in methods])


def fig_client_mse(results: pd.DataFrame, cell: dict, path: str) -> str:
    """Real data: each client's MSE-Pred per method, mean over the replications (one cell);
    clients ordered by their training size.

    Parameters
    ----------
    results : pandas.DataFrame
        A real-data study's ``results.csv`` rows (``client``, ``n_train``, ``mse_pred``).
    cell : dict
        The design cell shown.
    path : str
        The PNG file.

    Returns
    -------
    str
        ``path``.
    """
    plt = pyplot()
    sel = np.logical_and.reduce([results[k] == v for k, v in cell.items()])
    sub = results[sel]
    methods = _methods(sub)
    mean = sub.groupby(["client", "method"])["mse_pred"].mean().unstack("method")
    size = sub.groupby("client")["n_train"].mean()
    order = list(size.sort_values(kind="stable").index)
    mean = mean.loc[order]
    n_reps = sub["rep"].nunique()
    fig, ax = plt.subplots(figsize=(max(8.0, 0.24 * len(order) + 2.0), 5.2))
    xs = np.arange(len(order))
    markers = {"rowfed": "o", "perfl-lsma": "s", "nonfed": "^", "fedavg": "D"}
    shown = [m for m in methods if m in mean.columns]
    for k, m in enumerate(shown):
        dodge = (k - (len(shown) - 1) / 2) * 0.16  # methods that agree stay visible
        ax.plot(
            xs + dodge,
            mean[m].to_numpy(),
            markers.get(m, "o"),
            color=COLORS.get(m),
            ms=5,
            alpha=0.85,
            label=LABELS.get(m, m),
        )
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{c} ({int(round(size[c]))})" for c in order], rotation=90, fontsize=8)
    ax.set_xlim(-0.6, len(order) - 0.4)
    ax.set_xlabel("client (training rows), smallest first")
    ax.set_ylabel("MSE-Pred (test rows)")
    ax.grid(axis="y", alpha=0.3, which="both")
    handles, labels = ax.get_legend_handles_labels()
    reps = f"{n_reps} replication{'s' if n_reps != 1 else ''}"
    cell_text = ", ".join(f"{k}={v}" for k, v in cell.items())
    title = f"Test MSE-Pred of each client, mean over {reps} ({cell_text}; log scale)"
    return finish(fig, title, path, handles, labels)


def fig_clusters(clusters: pd.DataFrame, cell: dict, rep: int, path: str, title: str = "") -> str:
    """``fig_clusters.png``: the client groups of each variable (row of Θ), a panel per method
    (the truth first, when known); at most :data:`MAX_VARIABLES` variables (without the
    truth: those RowFed splits into the most groups).

    Parameters
    ----------
    clusters : pandas.DataFrame
        A task's ``clusters`` frame: ``method, client`` and each variable's group labels.
    cell : dict
        The design cell, named in the title.
    rep : int
        The replication, named in the title.
    path : str
        The PNG file.
    title : str, optional
        A title instead of the default one (a note of the variables shown is appended).

    Returns
    -------
    str
        ``path``.
    """
    plt = pyplot()
    from matplotlib.colors import ListedColormap

    truth = (clusters["method"] == "truth").any()
    panels = (["truth"] if truth else []) + [m for m in _methods(clusters) if m != "truth"]
    features = [c for c in clusters.columns if c not in ("method", "client")]
    if truth or "rowfed" not in panels:
        shown = features[:MAX_VARIABLES]
    else:  # real data: the variables RowFed splits into the most groups (ties: file order)
        lab = clusters[clusters["method"] == "rowfed"][features]
        groups = lab.nunique(axis=0).to_numpy()
        top = np.argsort(-groups, kind="stable")[:MAX_VARIABLES]
        shown = [features[j] for j in sorted(top)]
    numbered = all(f.startswith("x") and f[1:].isdigit() for f in shown)
    clients = list(dict.fromkeys(clusters["client"]))
    n_rows = len(clients)
    cmap = ListedColormap(plt.get_cmap("Set3").colors + plt.get_cmap("Pastel1").colors[:8])
    cols = 2 if len(panels) > 2 else len(panels)
    rows = int(np.ceil(len(panels) / cols))
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(
            cols * (0.32 * len(shown) + 1.6) + 0.4,
            rows * (0.27 * n_rows + 1.3 + (0.0 if numbered else 1.3)) + 1.3,
        ),
        squeeze=False,
    )
    for ax in axes.flat[len(panels) :]:
        ax.set_axis_off()
    for ax, m in zip(axes.flat, panels, strict=False):
        lab = clusters[clusters["method"] == m].set_index("client").loc[clients, shown]
        mat = lab.to_numpy(dtype=int)
        ax.imshow(mat % 20, cmap=cmap, vmin=0, vmax=19, aspect="auto", interpolation="nearest")
        if mat.size <= 600:
            for (i, j), v in np.ndenumerate(mat):
                ax.text(j, i, str(v), ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(shown)))
        if numbered:
            ax.set_xticklabels([f[1:] for f in shown], fontsize=8)
        else:
            ax.set_xticklabels(shown, fontsize=7, rotation=90)
        ax.set_yticks(range(n_rows))
        ax.set_yticklabels(clients, fontsize=8)
        n_groups = [len(np.unique(mat[:, j])) for j in range(mat.shape[1])]
        ax.set_title(f"{LABELS.get(m, m)} (groups per variable: {min(n_groups)}–{max(n_groups)})")
        ax.set_xlabel("variable (row of Θ)")
        ax.set_ylabel("client")
    more = ""
    if len(shown) < len(features):
        which = "1–" + str(len(shown)) if shown == features[: len(shown)] else str(len(shown))
        kind = "" if shown == features[: len(shown)] else " most split by RowFed"
        more = f"; variables {which}{kind} of {len(features)}"
    custom = title
    cell_text = ", ".join(f"{k}={v}" for k, v in cell.items())
    title = (
        f"Client groups per variable (a colour and number = a group sharing the row), "
        f"replication {rep} ({cell_text}{more})"
    )
    return finish(fig, title if not custom else custom + more, path)


def make_figures(out: str, study, results: pd.DataFrame, store, cells) -> list[str]:
    """Every figure of the study into ``out``; returns the paths written.

    Parameters
    ----------
    out : str
        The study's output directory.
    study : Study
        The parsed config: its design keys and ``[figures] cell``.
    results : pandas.DataFrame
        Every finished task's rows.
    store : PartStore
        The finished tasks' files (a task's ``clusters`` frame).
    cells : list of dict
        This run's design cells (:func:`strategies.experiments.plots.figure_cell`).

    Returns
    -------
    list of str
    """
    made = [fig_errors(results, study.keys, os.path.join(out, "fig_errors.png"))]
    cell = figure_cell(results, study, cells)
    sel = np.logical_and.reduce([results[k] == v for k, v in cell.items()])
    rep = int(results[sel]["rep"].min())
    if "client" in results.columns:  # real data
        made.append(fig_client_mse(results, cell, os.path.join(out, "fig_client_mse.png")))
    clusters = store.read(cell, rep, "clusters")
    if clusters is not None:
        made.append(fig_clusters(clusters, cell, rep, os.path.join(out, "fig_clusters.png")))
    return made

"""Figures of a GrAUC-PFL study (matplotlib, Agg backend), written next to ``results.csv``.

- ``fig_mean_auc.png``: mean test AUC per method against prevalence, one panel per level
  (columns) and per simulation / training size (rows); bars are 95% intervals over
  replications (the layout of the paper's Figures 3–4).
- ``fig_auc_boxplots.png``: the same panels, boxes of the per-site AUCs (all sites and
  replications) per method and prevalence.
- ``fig_site_auc.png``: one cell (``[figures] cell``): each site's test AUC per method over
  the replications.
- ``fig_coef_heatmap.png``: one replication of that cell: GrAUC-PFL's coefficients (sites x
  features) with a dendrogram of the sites (average linkage, Euclidean), next to the
  individual fits in the same site order (the paper's Figure 6); each panel's colours scaled
  per feature (:func:`scaled_by_feature`).
- ``fig_site_map.png``: the sites at their coordinates with the graph's edges; an edge's
  shade is the number of features on which GrAUC-PFL fused its two sites; site colours are
  the dendrogram's two main clusters.

A real-data study (no prevalence or level in its design) gets ``fig_mean_auc.png`` as the
mean test AUC over institutions of each replication (a line per replication across methods,
the mean and its 95% interval), one panel per design cell, and the three one-cell figures.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pandas as pd

from strategies.experiments.plots import (
    COMPARATOR_COLORS,
    COMPARATOR_LABELS,
    figure_cell,
    finish,
    method_boxes,
    place_labels,
    pyplot,
)

LABELS = {
    "grauc": "GrAUC-PFL",
    "individual": "Individual",
    "fedavg": "FedAvg",
    "pooled": "Pooled",
    **COMPARATOR_LABELS,
}
COLORS = {
    "grauc": "#d62728",
    "individual": "#1f77b4",
    "pooled": "#7f7f7f",
    **COMPARATOR_COLORS,
}


def _methods(results: pd.DataFrame) -> list[str]:
    order = list(LABELS)
    present = list(dict.fromkeys(results["method"]))
    return [m for m in order if m in present] + [m for m in present if m not in order]


def _panels(results: pd.DataFrame, keys) -> tuple[list, list, list[str]]:
    """Row groups (every design key but prevalence and level) and level columns."""
    row_keys = [k for k in keys if k not in ("prevalence", "level")]
    rows = list(dict.fromkeys(tuple(r) for r in results[row_keys].itertuples(index=False)))
    levels = sorted(results["level"].unique())
    return rows, levels, row_keys


def _row_title(row_keys, row) -> str:
    names = {"simulation": "sim", "n_train": "N_train"}
    parts = []
    for k, v in zip(row_keys, row, strict=True):
        if k == "n_train" and v == 0:
            parts.append("N_train mixed")
        else:
            parts.append(f"{names.get(k, k)} {v}")
    return ", ".join(parts)


def _per_rep(results: pd.DataFrame, keys) -> pd.DataFrame:
    return results.groupby([*keys, "method", "rep"], sort=False)["auc"].mean().reset_index()


def fig_mean_auc(results: pd.DataFrame, keys, path: str) -> str:
    """Mean test AUC per method against prevalence (``fig_mean_auc.png`` of a simulation
    study): one panel per level (columns) and per value of the other design keys (rows);
    bars are 95% intervals over replications.

    Parameters
    ----------
    results : pandas.DataFrame
        The study's results: a row per replication, method and site (``method``, ``rep``,
        ``auc`` and the design keys).
    keys : sequence of str
        The design keys (with ``prevalence`` and ``level``).
    path : str
        Where the figure is saved.

    Returns
    -------
    str
        ``path``.
    """
    plt = pyplot()
    per_rep = _per_rep(results, keys)
    rows, levels, row_keys = _panels(results, keys)
    methods = _methods(results)
    fig, axes = plt.subplots(
        len(rows),
        len(levels),
        figsize=(max(6.5, 4.2 * len(levels) + 0.6), 3.4 * len(rows) + 1.2),
        squeeze=False,
        sharey=True,
    )
    n_reps = int(per_rep.groupby([*keys, "method"])["rep"].nunique().min())
    for i, row in enumerate(rows):
        sel_row = np.logical_and.reduce(
            [per_rep[k] == v for k, v in zip(row_keys, row, strict=True)]
        )
        for j, level in enumerate(levels):
            ax = axes[i][j]
            sub = per_rep[sel_row & (per_rep["level"] == level)]
            for k, m in enumerate(methods):
                g = sub[sub["method"] == m].groupby("prevalence")["auc"]
                if g.ngroups == 0:
                    continue
                mean, sd, n = g.mean(), g.std(ddof=1).fillna(0.0), g.count()
                half = 1.96 * sd / np.sqrt(n)
                dodge = (k - (len(methods) - 1) / 2) * 0.003  # keep the bars apart
                ax.errorbar(
                    mean.index.to_numpy() + dodge,
                    mean.to_numpy(),
                    yerr=half.to_numpy(),
                    marker="o",
                    ms=4,
                    capsize=3,
                    color=COLORS.get(m),
                    label=LABELS.get(m, m),
                )
            ax.set_title(f"{_row_title(row_keys, row)}; level {level}")
            prevs = sorted(results["prevalence"].unique())
            if len(prevs) == 1:
                ax.set_xticks(prevs)
                ax.set_xlim(prevs[0] + 0.03, prevs[0] - 0.03)
            else:
                ax.invert_xaxis()  # the paper runs from balanced (0.3) to rare (0.05)
            ax.grid(alpha=0.3)
            if i == len(rows) - 1:
                ax.set_xlabel("prevalence")
            if j == 0:
                ax.set_ylabel("mean test AUC")
    handles, labels = axes[0][0].get_legend_handles_labels()
    reps = f"{n_reps} replication{'s' if n_reps != 1 else ''}"
    title = f"Mean test AUC over institutions (bars: 95% interval over {reps})"
    return finish(fig, title, path, handles, labels)


def fig_real_mean_auc(results: pd.DataFrame, keys, path: str) -> str:
    """Mean test AUC over institutions per replication and method (real data): one panel
    per design cell, a grey line per replication joining the methods, the mean and its
    95% interval over replications.

    Parameters
    ----------
    results : pandas.DataFrame
        The study's results: a row per replication, method and site (``method``, ``rep``,
        ``auc`` and the design keys).
    keys : sequence of str
        The design keys (a panel per combination of their values).
    path : str
        Where the figure is saved.

    Returns
    -------
    str
        ``path``.
    """
    plt = pyplot()
    keys = list(keys)
    per_rep = _per_rep(results, keys)
    methods = _methods(results)
    cells = list(dict.fromkeys(tuple(r) for r in per_rep[keys].itertuples(index=False)))
    fig, axes = plt.subplots(
        1, len(cells), figsize=(max(6.0, 4.2 * len(cells) + 0.8), 5.0), squeeze=False
    )
    n_reps = int(per_rep.groupby(keys)["rep"].nunique().min())
    for ax, c in zip(axes[0], cells, strict=True):
        sel = np.logical_and.reduce([per_rep[k] == v for k, v in zip(keys, c, strict=True)])
        wide = per_rep[sel].pivot(index="rep", columns="method", values="auc")
        wide = wide[[m for m in methods if m in wide.columns]]
        xs = np.arange(wide.shape[1])
        for _, row in wide.iterrows():
            ax.plot(xs, row.to_numpy(), color="0.6", lw=1, alpha=0.7, zorder=1)
        for k, m in enumerate(wide.columns):
            v = wide[m].dropna().to_numpy()
            half = 1.96 * v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0.0
            ax.errorbar(
                [k],
                [v.mean()],
                yerr=[half],
                marker="o",
                ms=8,
                capsize=5,
                color=COLORS.get(m),
                zorder=2,
            )
            ax.annotate(
                f"{v.mean():.3f}", (k, v.mean()), xytext=(9, -3), textcoords="offset points"
            )
        ax.set_xticks(xs)
        ax.set_xticklabels([LABELS.get(m, m) for m in wide.columns])
        ax.set_xlim(-0.5, len(xs) - 0.3)
        ax.set_title(_cell_title(dict(zip(keys, c, strict=True))))
        ax.set_ylabel("mean test AUC over institutions")
        ax.grid(axis="y", alpha=0.3)
    reps = f"{n_reps} replication{'s' if n_reps != 1 else ''} (random splits)"
    title = f"Mean test AUC over institutions: {reps}; grey lines join one replication"
    return finish(fig, title, path)


def fig_auc_boxplots(results: pd.DataFrame, keys, path: str) -> str:
    """The per-site test AUCs as boxes (all sites and replications) per method and prevalence
    (``fig_auc_boxplots.png``), in the panels of :func:`fig_mean_auc`.

    Parameters
    ----------
    results : pandas.DataFrame
        The study's results: a row per replication, method and site (``method``, ``auc``
        and the design keys).
    keys : sequence of str
        The design keys (with ``prevalence`` and ``level``).
    path : str
        Where the figure is saved.

    Returns
    -------
    str
        ``path``.
    """
    plt = pyplot()
    rows, levels, row_keys = _panels(results, keys)
    methods = _methods(results)
    prevalences = sorted(results["prevalence"].unique(), reverse=True)
    width = 0.8 / len(methods)
    fig, axes = plt.subplots(
        len(rows),
        len(levels),
        figsize=(
            max(6.5, max(4.2, 0.22 * len(prevalences) * len(methods) + 1.0) * len(levels) + 0.6),
            3.4 * len(rows) + 1.2,
        ),
        squeeze=False,
        sharey=True,
    )
    for i, row in enumerate(rows):
        sel_row = np.logical_and.reduce(
            [results[k] == v for k, v in zip(row_keys, row, strict=True)]
        )
        for j, level in enumerate(levels):
            ax = axes[i][j]
            sub = results[sel_row & (results["level"] == level)]
            for k, m in enumerate(methods):
                groups = [
                    sub[(sub["method"] == m) & (sub["prevalence"] == prev)]["auc"].dropna()
                    for prev in prevalences
                ]
                method_boxes(ax, groups, k, width, COLORS.get(m, "white"))
            ax.set_xticks(range(len(prevalences)))
            ax.set_xticklabels([f"{p:g}" for p in prevalences])
            ax.set_xlim(-0.6, len(prevalences) - 0.4)
            ax.set_title(f"{_row_title(row_keys, row)}; level {level}")
            ax.grid(axis="y", alpha=0.3)
            if i == len(rows) - 1:
                ax.set_xlabel("prevalence")
            if j == 0:
                ax.set_ylabel("test AUC per site")
    title = "Test AUC of each institution (boxes: all sites and replications)"
    return finish(fig, title, path, _patches(plt, methods), [LABELS.get(m, m) for m in methods])


def _patches(plt, methods):
    return [
        plt.Rectangle((0, 0), 1, 1, facecolor=COLORS.get(m, "white"), alpha=0.75) for m in methods
    ]


def _cell_title(cell: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in cell.items())


def fig_site_auc(results: pd.DataFrame, cell: dict, path: str) -> str:
    """Test AUC per site and method: with one replication each AUC as a point with its DeLong
    95% interval; with several, a box over the replications with the replications as dots.

    Parameters
    ----------
    results : pandas.DataFrame
        The study's results (``method``, ``site``, ``rep``, ``auc``, ``auc_se`` and the
        design keys).
    cell : dict
        The design values of the cell shown.
    path : str
        Where the figure is saved.

    Returns
    -------
    str
        ``path``.
    """
    from matplotlib.lines import Line2D

    from .metrics import auc_interval

    plt = pyplot()
    sel = np.logical_and.reduce([results[k] == v for k, v in cell.items()])
    sub = results[sel]
    methods = _methods(sub)
    sites = list(dict.fromkeys(sub["site"]))
    n_reps = sub["rep"].nunique()
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.16 * len(sites) * len(methods) + 2.0), 5.0))
    for k, m in enumerate(methods):
        color = COLORS.get(m, "gray")
        data = [sub[(sub["method"] == m) & (sub["site"] == s)] for s in sites]
        pos = [x - 0.4 + width * (k + 0.5) for x in range(len(sites))]
        keep = [(d, p) for d, p in zip(data, pos, strict=True) if d["auc"].notna().any()]
        if not keep:
            continue
        if n_reps == 1:  # one AUC per site: a point and its interval
            for d, p in keep:
                a, se = float(d["auc"].iloc[0]), float(d["auc_se"].iloc[0])
                lo, hi = auc_interval(a, se)
                if np.isfinite(lo):
                    ax.plot([p, p], [lo, hi], color=color, lw=1.6, solid_capstyle="butt")
                ax.plot(p, a, "o", color=color, mec="black", mew=0.6, ms=5)
            continue
        bp = ax.boxplot(
            [d["auc"].dropna().to_numpy() for d, _ in keep],
            positions=[p for _, p in keep],
            widths=width * 0.85,
            patch_artist=True,
            medianprops={"color": "black"},
            flierprops={"markersize": 2},
        )
        for box in bp["boxes"]:
            box.set_facecolor(color)
            box.set_alpha(0.75)
        for d, p in keep:  # the replications themselves
            vals = d["auc"].dropna().to_numpy()
            ax.plot(np.full(len(vals), p), vals, ".", color="black", ms=2.5, alpha=0.5)
    ax.set_xticks(range(len(sites)))
    ax.set_xticklabels(sites, rotation=90 if len(sites) > 12 else 0)
    ax.set_xlim(-0.6, len(sites) - 0.4)
    for x in range(len(sites) - 1):  # separate the sites
        ax.axvline(x + 0.5, color="0.85", lw=0.6, zorder=0)
    ax.set_ylabel("test AUC")
    ax.set_xlabel("site")
    ax.grid(axis="y", alpha=0.3)
    labels = [LABELS.get(m, m) for m in methods]
    if n_reps == 1:
        handles = [
            Line2D([], [], color=COLORS.get(m, "gray"), marker="o", mec="black", lw=1.6)
            for m in methods
        ]
        title = f"Test AUC of each site with its DeLong 95% interval ({_cell_title(cell)})"
        return finish(fig, title, path, handles, labels)
    title = f"Test AUC of each site over {n_reps} replications ({_cell_title(cell)})"
    return finish(fig, title, path, _patches(plt, methods), labels)


def _linkage(coef: np.ndarray):
    from scipy.cluster.hierarchy import linkage

    if coef.shape[0] < 2:
        return None
    return linkage(coef, method="average", metric="euclidean")


def scaled_by_feature(coef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``coef`` (sites x features) with each feature divided by its largest |coefficient|,
    and those scales (1 for a feature that is zero everywhere): a colour scale per feature,
    so that one large feature does not wash out the features that differ between sites."""
    scale = np.nanmax(np.abs(coef), axis=0) if len(coef) else np.ones(coef.shape[1])
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
    return coef / scale, scale


#: The fit report's heatmap shows at most this many features (those that differ most).
HEATMAP_FEATURES = 30


def fig_coef_heatmap(
    coef: pd.DataFrame, cell: dict, rep: int, path: str, method: str = "grauc", title: str = ""
) -> tuple[str, np.ndarray]:
    """``method``'s coefficients (sites x features) with a dendrogram of the sites, and the
    individual fits beside them when ``coef`` has them.

    Parameters
    ----------
    coef : pandas.DataFrame
        Coefficients: ``method``, ``site`` (optionally ``lat``, ``lon``) and a column per
        feature, a row per method and site.
    cell : dict
        The design values named in the default title.
    rep : int
        The replication named in the default title.
    path : str
        Where the figure is saved.
    method : str, optional
        The method whose coefficients are clustered.
    title : str, optional
        The figure's title (empty: one naming ``rep`` and ``cell``).

    Returns
    -------
    path : str
        ``path``.
    labels : ndarray of int, shape (Z,)
        The sites' cluster labels (two main dendrogram clusters, from 1; all 1 for a
        single site).
    """
    from scipy.cluster.hierarchy import dendrogram, fcluster

    plt = pyplot()
    features = [c for c in coef.columns if c not in ("method", "site", "lat", "lon")]
    g = coef[coef["method"] == method]
    sites = list(g["site"])
    beta = g[features].to_numpy(dtype=float)
    link = _linkage(beta)
    panels = [(method, beta)]
    ind = coef[coef["method"] == "individual"]
    if len(ind) and method != "individual":
        panels.append(("individual", ind.set_index("site").loc[sites, features].to_numpy(float)))
    p = len(features)
    cw = 0.55 if p <= 20 else max(0.13, 11.0 / p)  # inches per feature column
    fontsize = 10 if p <= 20 else (7 if p <= 40 else 5.5)
    label_in = max(len(str(f)) for f in features) * fontsize * 0.0076 if p > 12 else 0.3
    fig = plt.figure(
        figsize=(3.5 + cw * p * len(panels), 2.0 + 0.3 * len(sites) + max(0.0, label_in - 0.4))
    )
    widths = [1.4, 0.5] + [max(2.0, 0.9 * cw * p)] * len(panels) + [0.25]
    grid = fig.add_gridspec(1, len(widths), width_ratios=widths, wspace=0.08)
    ax_d = fig.add_subplot(grid[0, 0])
    if link is not None:
        with warnings.catch_warnings():  # all sites fused: scipy warns of a zero-width axis,
            warnings.simplefilter("ignore", UserWarning)  # which is set just below
            dn = dendrogram(
                link,
                orientation="left",
                ax=ax_d,
                no_labels=True,
                color_threshold=0,
                above_threshold_color="black",
            )
        order = dn["leaves"]
        top = float(link[:, 2].max()) or 1.0
        ax_d.set_xlim(top * 1.05, -0.03 * top)  # merges at distance 0 (fused sites) show
        labels = fcluster(link, t=2, criterion="maxclust")
    else:
        order, labels = list(range(len(sites))), np.ones(len(sites), dtype=int)
    ax_d.set_axis_off()
    im = None
    for k, (m, raw) in enumerate(panels):
        # each panel scaled on its own: the individual fits' noise would wash out the fused
        b, scale = scaled_by_feature(raw)
        ticks = (
            features if p > 12 else [f"{f}\n±{v:.2g}" for f, v in zip(features, scale, strict=True)]
        )
        ax = fig.add_subplot(grid[0, k + 2])
        rows = b[order][::-1]  # dendrogram leaves run bottom-up
        im = ax.imshow(rows, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
        ax.set_xticks(range(len(features)))
        ax.set_xticklabels(ticks, rotation=90 if p > 12 else 0, fontsize=min(10, fontsize))
        ax.set_yticks(range(len(sites)))
        ax.set_yticklabels([sites[i] for i in order][::-1] if k == 0 else [])
        ax.set_title(LABELS.get(m, m))
    cax = fig.add_subplot(grid[0, -1])
    fig.colorbar(im, cax=cax, label="coefficient / the feature's largest |coefficient|")
    h = fig.get_figheight()
    fig.suptitle(
        title or f"Coefficients, scaled per feature, replication {rep} ({_cell_title(cell)})",
        y=1 - 0.1 / h,
        va="top",
        fontsize=12,
    )
    bottom = (0.3 + label_in) / h if p > 12 else 0.6 / h
    fig.subplots_adjust(left=0.04, right=0.92, top=1 - 0.75 / h, bottom=bottom)
    fig.savefig(path)
    plt.close(fig)
    return path, labels


def geographic_groups(lat: np.ndarray, lon: np.ndarray, gap: float = 5.0) -> np.ndarray:
    """Clumps of sites (single linkage on degrees, cut at ``gap``), labels ``0, 1, ...``.

    Parameters
    ----------
    lat, lon : ndarray, shape (Z,)
        The sites' coordinates in degrees.
    gap : float, optional
        The distance in degrees that separates clumps.

    Returns
    -------
    ndarray of int, shape (Z,)
        Each site's clump.
    """
    from scipy.cluster.hierarchy import fcluster, linkage

    if len(lat) < 2:
        return np.zeros(len(lat), dtype=int)
    link = linkage(np.column_stack([lat, lon]), method="single")
    return fcluster(link, t=gap, criterion="distance") - 1


def fig_site_map(
    coef: pd.DataFrame,
    clusters: pd.DataFrame | None,
    labels,
    cell: dict,
    rep: int,
    path: str,
    graph: str = "mst",
    knn_k: int = 3,
    edges: np.ndarray | None = None,
    title: str = "",
) -> str:
    """Sites and graph edges; an edge's colour is the number of features on which its two
    sites share a cluster in ``clusters``.  When the sites form 2–4 far-apart clumps (the
    simulations' Los Angeles and New York groups) each clump also gets a zoomed panel.

    Parameters
    ----------
    coef : pandas.DataFrame
        Coefficients with ``method``, ``site``, ``lat``, ``lon``: the sites are GrAUC-PFL's
        rows (else each site once), in their order.
    clusters : pandas.DataFrame or None
        GrAUC-PFL's fused groups (``site`` and a label per feature); ``None``: grey edges.
    labels : sequence of int
        Each site's cluster (from 1), its colour.
    cell : dict
        The design values named in the default title.
    rep : int
        The replication named in the default title.
    path : str
        Where the figure is saved.
    graph : str, optional
        The graph built from the coordinates when ``edges`` is not given (named in the
        default title).
    knn_k : int, optional
        Its ``k`` for a k-nearest-neighbour graph.
    edges : ndarray of int, shape (n_edges, 2), optional
        Index pairs into the sites.
    title : str, optional
        The figure's title (empty: one naming the graph, ``rep`` and ``cell``).

    Returns
    -------
    str
        ``path``.
    """
    from .graph import build_graph

    plt = pyplot()
    has_grauc = (coef["method"] == "grauc").any()
    g = coef[coef["method"] == "grauc"] if has_grauc else coef.drop_duplicates("site")
    sites = list(g["site"])
    lat = g["lat"].to_numpy(float)
    lon = g["lon"].to_numpy(float)
    if edges is None:
        edges = build_graph(lat, lon, graph, knn_k).edges
    n_feat = 1
    fused = None
    if clusters is not None:
        lab = clusters.set_index("site").loc[sites].to_numpy()
        n_feat = lab.shape[1]
        fused = np.array([(lab[u] == lab[v]).sum() for u, v in edges])
    clumps = geographic_groups(lat, lon)
    n_clumps = int(clumps.max()) + 1
    zoom = 2 <= n_clumps <= 4
    ncols = n_clumps if zoom else 1
    fig, grid = _map_layout(plt, ncols, zoom)
    cmap = plt.get_cmap("viridis", n_feat + 1)
    palette = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"]
    colors = np.array([palette[(int(c) - 1) % len(palette)] for c in labels])

    def draw(ax, keep, annotate, adjustable="datalim"):
        _draw_sites(ax, lon, lat, edges, keep, colors, cmap, fused, adjustable)
        if annotate:
            labelled.append((ax, np.flatnonzero(keep)))

    labelled: list = []  # (axes, sites) whose labels are placed once the layout is fixed
    overview = fig.add_subplot(grid[0, :ncols])
    draw(overview, np.ones(len(sites), dtype=bool), annotate=not zoom)
    if zoom:
        overview.set_title("all sites")
        for c in range(n_clumps):
            ax = fig.add_subplot(grid[1, c])
            keep = clumps == c
            pad = 0.3
            ax.set_xlim(lon[keep].min() - pad, lon[keep].max() + pad)
            ax.set_ylim(lat[keep].min() - pad, lat[keep].max() + pad)
            draw(ax, keep, annotate=True, adjustable="box")
            ax.set_title(
                f"{int(keep.sum())} sites near ({lat[keep].mean():.1f}, {lon[keep].mean():.1f})"
            )
    if fused is not None:
        _fused_colorbar(plt, fig, fig.add_subplot(grid[:, ncols]), cmap, n_feat)
    h = fig.get_figheight()
    fig.suptitle(
        title
        or f"Sites and {graph.upper()} edges (colour of a site: its GrAUC-PFL coefficient "
        f"cluster)\nreplication {rep} ({_cell_title(cell)})",
        y=1 - 0.1 / h,
        va="top",
        fontsize=12,
    )
    fig.subplots_adjust(top=1 - 0.95 / h, bottom=0.7 / h, left=0.08, right=0.92)
    fig.canvas.draw()  # the final limits: labels are placed in display coordinates
    for ax, idx in labelled:
        place_labels(ax, lon[idx], lat[idx], [sites[k] for k in idx])
    fig.savefig(path)
    plt.close(fig)
    return path


def _map_layout(plt, ncols: int, zoom: bool):
    """:func:`fig_site_map`'s figure and grid: the overview on top, with ``zoom`` a row of
    ``ncols`` zoomed panels below, and a thin column for the colour bar."""
    fig = plt.figure(figsize=(max(7.5, 3.8 * ncols + 1.2), 8.0 if zoom else 5.6))
    grid = fig.add_gridspec(
        2 if zoom else 1,
        ncols + 1,
        width_ratios=[1] * ncols + [0.05],
        height_ratios=[1, 1.25] if zoom else [1],
        hspace=0.35,
        wspace=0.4,
    )
    return fig, grid


def _fused_colorbar(plt, fig, cax, cmap, n_feat: int) -> None:
    """:func:`fig_site_map`'s colour bar: the features fused across an edge, 0 to
    ``n_feat``."""
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(-0.5, n_feat + 0.5))
    bar = fig.colorbar(sm, cax=cax, label="features fused across the edge")
    bar.set_ticks(range(0, n_feat + 1, max(1, (n_feat + 1) // 6)))


def _draw_sites(ax, lon, lat, edges, keep, colors, cmap, fused, adjustable: str) -> None:
    """:func:`fig_site_map`'s panel: the edges touching the ``keep`` sites (coloured by
    ``fused`` through ``cmap``, else grey), the sites, the aspect of their mean latitude."""
    from matplotlib.ticker import MaxNLocator

    for e, (u, v) in enumerate(edges):
        if not (keep[u] or keep[v]):
            continue
        shade = cmap(fused[e]) if fused is not None else "gray"
        ax.plot([lon[u], lon[v]], [lat[u], lat[v]], color=shade, lw=2.4, zorder=1)
    ax.scatter(lon[keep], lat[keep], c=colors[keep], s=55, edgecolor="black", zorder=2)
    ax.set_aspect(1.0 / np.cos(np.deg2rad(np.mean(lat[keep]))), adjustable=adjustable)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.grid(alpha=0.3)
    ax.set_xlabel("longitude")
    ax.set_ylabel("latitude")


def make_figures(out: str, study, results: pd.DataFrame, store, cells) -> list[str]:
    """Every figure of the study into ``out``.

    Parameters
    ----------
    out : str
        The study's output directory.
    study : Study
        The study config (its design keys, ``[figures]`` and ``[grauc]`` tables).
    results : pandas.DataFrame
        The study's results.
    store : PartStore
        The finished tasks' frames (the figure cell's ``coef`` and ``clusters``).
    cells : list of dict
        This run's cells.

    Returns
    -------
    list of str
        The paths written.
    """
    keys = list(study.keys)
    if "prevalence" in keys and "level" in keys:  # the simulations
        made = [
            fig_mean_auc(results, keys, os.path.join(out, "fig_mean_auc.png")),
            fig_auc_boxplots(results, keys, os.path.join(out, "fig_auc_boxplots.png")),
        ]
    else:  # real data
        made = [fig_real_mean_auc(results, keys, os.path.join(out, "fig_mean_auc.png"))]
    cell = figure_cell(results, study, cells)
    made.append(fig_site_auc(results, cell, os.path.join(out, "fig_site_auc.png")))
    sel = np.logical_and.reduce([results[k] == v for k, v in cell.items()])
    rep = int(results[sel]["rep"].min())
    coef = store.read(cell, rep, "coef")
    if coef is not None and (coef["method"] == "grauc").any():
        clusters = store.read(cell, rep, "clusters")
        path, labels = fig_coef_heatmap(coef, cell, rep, os.path.join(out, "fig_coef_heatmap.png"))
        made.append(path)
        cfg = study.settings.get("grauc", {})
        made.append(
            fig_site_map(
                coef,
                clusters,
                labels,
                cell,
                rep,
                os.path.join(out, "fig_site_map.png"),
                graph=str(cfg.get("graph", "mst")),
                knn_k=int(cfg.get("knn-k", 3)),
            )
        )
    return made

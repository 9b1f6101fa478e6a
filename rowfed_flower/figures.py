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
import tempfile

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
    clients ordered by their training size."""
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
    """Every figure of the study into ``out``; returns the paths written."""
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


# ---------------------------------------------------------------------------------------
# report.html of a fit (strategies/report.py builds the page)


def _client_order(theta: np.ndarray) -> list[int]:
    """Clients in the leaf order of an average-linkage dendrogram of their coefficients."""
    from scipy.cluster.hierarchy import leaves_list, linkage

    if theta.shape[0] < 3:
        return list(range(theta.shape[0]))
    return [int(k) for k in leaves_list(linkage(theta, method="average"))]


def fig_client_graph(clients, fused: np.ndarray, edges: np.ndarray, n_features: int, drawn):
    """Clients on a circle (similar clients adjacent); each drawn edge coloured by the number
    of predictors on which its two clients share a row."""
    plt = pyplot()
    m = len(clients)
    angle = 2 * np.pi * np.arange(m) / max(m, 1)
    xy = np.column_stack([np.cos(angle), np.sin(angle)])
    fig, ax = plt.subplots(figsize=(7.5, 6.4))
    cmap = plt.get_cmap("viridis", n_features + 1)
    for e in np.argsort(fused, kind="stable"):  # the most fused on top
        if not drawn[e]:
            continue
        u, v = edges[e]
        ax.plot(*xy[[u, v]].T, color=cmap(fused[e]), lw=0.8 + 2.2 * fused[e] / max(1, n_features))
    ax.scatter(xy[:, 0], xy[:, 1], s=60, color="#20324a", zorder=3)
    for k, name in enumerate(clients):
        c, s = np.cos(angle[k]), np.sin(angle[k])
        ax.text(
            1.1 * c,
            1.1 * s,
            str(name),
            ha="left" if c > 0.1 else "right" if c < -0.1 else "center",
            va="center",
            fontsize=8 if m > 20 else 10,
        )
    ax.set_xlim(-1.5, 1.5)
    ax.set_ylim(-1.3, 1.3)
    ax.set_aspect("equal")
    ax.set_axis_off()
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(-0.5, n_features + 0.5))
    bar = fig.colorbar(sm, ax=ax, shrink=0.8, label="predictors whose row the two clients share")
    bar.set_ticks(range(0, n_features + 1, max(1, (n_features + 1) // 6)))
    fig.tight_layout()
    return fig


def shown_predictors(coef: pd.DataFrame, responses, most: int = MAX_VARIABLES) -> list[str]:
    """The predictors a coefficient heatmap shows: all of them up to ``most``, else the
    ``most`` whose rows differ most across clients (the sum over ``responses`` of the SD
    across clients), in file order."""
    rows = coef[coef["feature"] != "(intercept)"]
    features = list(dict.fromkeys(rows["feature"]))
    if len(features) <= most:
        return features
    spread = rows.groupby("feature", sort=False)[list(responses)].std(ddof=0).sum(axis=1)
    top = set(spread.loc[features].to_numpy().argsort(kind="stable")[::-1][:most])
    return [f for k, f in enumerate(features) if k in top]


def fig_coefficients(coef: pd.DataFrame, responses, order: list[int]):
    """Heatmaps of the first four responses' coefficients (clients x predictors, input
    scale); beyond :data:`MAX_VARIABLES` predictors, those that differ most across clients
    (:func:`shown_predictors`)."""
    plt = pyplot()
    clients = list(dict.fromkeys(coef["client"]))
    rows = coef[coef["feature"] != "(intercept)"]
    shown = list(responses)[:4]
    features = shown_predictors(coef, shown)
    p = len(features)
    cw = 0.45 if p <= 20 else max(0.1, 9.0 / p)
    cols = min(2, len(shown))  # two panels a row
    n_rows = -(-len(shown) // cols)
    tall = 0.26 * len(clients) if len(clients) <= 30 else 0.16 * len(clients)
    fig, axes = plt.subplots(
        n_rows,
        cols,
        figsize=(1.8 + cols * (cw * p + 1.4), n_rows * (1.8 + tall)),
        squeeze=False,
    )
    for ax in axes.flat[len(shown) :]:
        ax.set_axis_off()
    ordered = [clients[k] for k in order]
    for ax, name in zip(axes.flat, shown, strict=False):
        mat = rows.pivot(index="client", columns="feature", values=name).loc[ordered, features]
        vmax = float(np.nanmax(np.abs(mat.to_numpy(float)))) or 1.0
        im = ax.imshow(mat.to_numpy(float), aspect="auto", cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        ax.set_yticks(range(len(ordered)))
        ax.set_yticklabels(ordered, fontsize=8 if len(ordered) <= 30 else 6)
        ax.set_xticks(range(p))
        ax.set_xticklabels(features, rotation=90, fontsize=7 if p > 20 else 9)
        ax.set_title(f"response {name}")
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    return fig


def fit_report(out_dir: str) -> str:
    """Write ``out_dir/report.html`` from a RowFed (or baseline) fit's files."""
    from strategies import report

    from .tuning import params_of

    metrics = report.read_metrics(out_dir)
    method = metrics["method"]
    coef = report.read_csv(out_dir, "coefficients.csv")
    clusters = report.read_csv(out_dir, "clusters.csv")
    responses = [c for c in coef.columns if c not in ("client", "feature")]
    clients = list(dict.fromkeys(coef["client"]))
    plain = coef[coef["feature"] != "(intercept)"]
    features = list(dict.fromkeys(plain["feature"]))
    theta = np.stack(
        [plain[plain["client"] == c][responses].to_numpy(float).ravel() for c in clients]
    )
    order = _client_order(theta)
    # the fusion graph and how much of each edge is fused
    lab = clusters.set_index("feature").loc[features, clients].to_numpy().T  # (clients, p)
    edge_file = report.read_csv(out_dir, "edges.csv")
    index = {c: k for k, c in enumerate(clients)}
    if edge_file is not None:
        edges = np.array(
            [
                [index[u], index[v]]
                for u, v in zip(edge_file.iloc[:, 0], edge_file.iloc[:, 1], strict=True)
            ]
        )
        graph = f"the fusion graph's {len(edges)} edges (edges.csv; all drawn)"
    else:
        edges = np.array([(u, v) for u in range(len(clients)) for v in range(u + 1, len(clients))])
        graph = "all pairs of clients (an edge is drawn where the two share at least one row)"
    edges = edges.reshape(-1, 2).astype(int)
    fused = np.array([(lab[u] == lab[v]).sum() for u, v in edges], dtype=int)
    drawn = np.ones(len(edges), bool) if edge_file is not None else fused > 0
    position = {c: k for k, c in enumerate(order)}
    placed = [clients[k] for k in order]
    graph_fig = fig_client_graph(
        placed,
        fused,
        np.array([[position[u], position[v]] for u, v in edges]).reshape(-1, 2),
        len(features),
        drawn,
    )
    sections = {
        "map": report.Section(
            "map",
            "Fusion graph of the clients",
            report.text(
                f"Clients around a circle, ordered so that clients with similar coefficients sit "
                f"together; {graph}. An edge's colour and width: the number of predictors (of "
                f"{len(features)}) on which the two clients ended with the same row of "
                "coefficients."
            )
            + report.image(graph_fig),
        ),
    }
    cl = clusters.set_index("feature")[clients].T.reset_index(names="client")
    with tempfile.TemporaryDirectory() as tmp:
        path = fig_clusters(
            cl.assign(method=method), {"method": method}, 0, os.path.join(tmp, "c.png"),
            "Client groups per predictor (a colour and number = a group of clients sharing "
            "the row; colours repeat after 20 groups)",
        )  # fmt: skip
        sections["coefficients"] = report.Section(
            "coefficients",
            "Coefficients",
            report.text(
                f"{'Each' if len(responses) <= 4 else 'The first four'} response's "
                "coefficients on the input scale (coefficients.csv), clients ordered by "
                "average-linkage clustering"
                + (
                    f", for the {MAX_VARIABLES} of {len(features)} predictors whose rows "
                    "differ most across clients"
                    if len(features) > MAX_VARIABLES
                    else ""
                )
                + "; below, the client groups of each predictor (clusters.csv)."
            )
            + report.image(fig_coefficients(coef, responses, order))
            + report.image(path)
            + report.inference_block(
                out_dir,
                metrics,
                "client",
                "least squares on the identified structure, t intervals with the refit's "
                "degrees of freedom",
            ),
        )
    sections["accuracy"] = _accuracy_section(out_dir, metrics, responses)
    data = pd.DataFrame(
        [
            {"client": c, "n_train": m.get("n_train"), "n_test": m.get("n_test")}
            for c, m in metrics["clients"].items()
        ]
    )
    sections["data"] = report.Section("data", "Data", report.table(data, 200))
    test = metrics.get("test") or {}
    tuned = metrics.get("tuned") or (metrics.get("tuning") or {}).get("selected")
    summary = [
        ("method", LABELS.get(method, method)),
        ("engine", metrics.get("engine")),
        ("clients", metrics.get("n_clients")),
        ("predictors", metrics.get("n_features")),
        ("responses", ", ".join(responses)),
        ("training rows", (metrics.get("split") or {}).get("n_train")),
        ("test rows", (metrics.get("split") or {}).get("n_test")),
        ("rounds", metrics.get("rounds")),
        ("converged", metrics.get("converged")),
        ("objective", metrics.get("objective")),
        ("lam1, lam2", f"{metrics['lam1']:g}, {metrics['lam2']:g}"),
        ("tuned", tuned),
        ("mean test MSE", test.get("mse")),
        ("seconds", metrics.get("seconds")),
    ]
    summary = [(k, v) for k, v in summary if v is not None]
    params = params_of(method)
    return report.fit_report(out_dir, metrics, "RowFed fit report", summary, sections, params)


def _accuracy_section(out_dir: str, metrics: dict, responses):
    from strategies import report

    from .federation import mse_frame

    test = report.read_csv(out_dir, "test.csv")
    if test is not None and len(test):
        frame, what = test, "test"
    else:
        frame = mse_frame(metrics, responses, "train")
        what = "in-sample (no test rows: --test-data or --holdout)"
    title = "Accuracy per client"
    if frame.empty:
        return report.Section("accuracy", title, report.text("No client has an MSE."))
    many = frame["response"].nunique() > 4
    if many:  # a panel per response is unreadable: the mean over responses, per client
        mean = frame.groupby("client", sort=False)["mse"].mean().reset_index()
        note = report.text(
            f"Each client's {what} mean squared prediction error averaged over the "
            f"{frame['response'].nunique()} responses; the dashed line is the mean over "
            "clients. Per response, with 95% Wald intervals: the table below and the files."
        )
        fig = report.fig_forest(mean, "client", "mse", None, "MSE (mean over responses)")
        return report.Section(
            "accuracy", title, note + report.image(fig) + report.table(frame, 200)
        )
    note = report.text(
        f"Each client's {what} mean squared prediction error per response with a 95% Wald "
        "interval (from the spread of its squared errors); the dashed line is the mean over "
        "clients."
    )
    fig = report.fig_forest(frame, "client", "mse", "response", "MSE")
    return report.Section("accuracy", title, note + report.image(fig) + report.table(frame, 200))

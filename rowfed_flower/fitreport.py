"""``report.html`` of a RowFed fit: the method's sections of the page that
:func:`strategies.report.fit_report` builds from the fit's files (the clients' graph of
shared rows, the coefficients, each client's test error)."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pandas as pd

from strategies.experiments.plots import pyplot

from .figures import LABELS, MAX_VARIABLES, fig_clusters


def _client_order(theta: np.ndarray) -> list[int]:
    """Clients in the leaf order of an average-linkage dendrogram of their coefficients."""
    from scipy.cluster.hierarchy import leaves_list, linkage

    if theta.shape[0] < 3:
        return list(range(theta.shape[0]))
    return [int(k) for k in leaves_list(linkage(theta, method="average"))]


def fig_client_graph(clients, fused: np.ndarray, edges: np.ndarray, n_features: int, drawn):
    """Clients on a circle (similar clients adjacent); each drawn edge coloured by the number
    of predictors on which its two clients share a row.

    Parameters
    ----------
    clients : sequence of str
        The clients' names, in their order around the circle.
    fused : ndarray of int, shape (E,)
        Per edge, the number of predictors on which its two clients share a row.
    edges : ndarray of int, shape (E, 2)
        The edges, as positions in ``clients``.
    n_features : int
        The number of predictors (the colour scale's top).
    drawn : ndarray of bool, shape (E,)
        The edges to draw.

    Returns
    -------
    matplotlib.figure.Figure
    """
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
    across clients), in file order.

    Parameters
    ----------
    coef : pandas.DataFrame
        ``coefficients.csv``: ``client, feature`` and a column per response.
    responses : sequence of str
        The responses whose spread counts.
    most : int, optional
        The most predictors shown.

    Returns
    -------
    list of str
    """
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
    (:func:`shown_predictors`).

    Parameters
    ----------
    coef : pandas.DataFrame
        ``coefficients.csv``: ``client, feature`` and a column per response.
    responses : sequence of str
        The responses; the first four are drawn.
    order : list of int
        The clients' order down the rows, as positions in their order in ``coef``.

    Returns
    -------
    matplotlib.figure.Figure
    """
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
    lab = clusters.set_index("feature").loc[features, clients].to_numpy().T  # (clients, p)
    sections = {"map": _graph_section(out_dir, clients, len(features), lab, order)}
    sections["coefficients"] = _coefficients_section(
        out_dir, metrics, coef, clusters, responses, order
    )
    sections["accuracy"] = _accuracy_section(out_dir, metrics, responses)
    data = pd.DataFrame(
        [
            {"client": c, "n_train": m.get("n_train"), "n_test": m.get("n_test")}
            for c, m in metrics["clients"].items()
        ]
    )
    sections["data"] = report.Section("data", "Data", report.table(data, 200))
    summary = _summary(metrics, responses)
    params = params_of(method)
    return report.fit_report(out_dir, metrics, "RowFed fit report", summary, sections, params)


def _graph_section(out_dir: str, clients: list, n_features: int, lab: np.ndarray, order):
    """The clients' fusion graph: each edge by the predictors on which its two clients
    ended with the same row (``lab``: each client's group per predictor)."""
    from strategies import report

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
        n_features,
        drawn,
    )
    return report.Section(
        "map",
        "Fusion graph of the clients",
        report.text(
            f"Clients around a circle, ordered so that clients with similar coefficients sit "
            f"together; {graph}. An edge's colour and width: the number of predictors (of "
            f"{n_features}) on which the two clients ended with the same row of "
            "coefficients."
        )
        + report.image(graph_fig),
    )


def _coefficients_section(out_dir: str, metrics: dict, coef, clusters, responses, order):
    """The coefficients (clients in ``order``), the client groups of each predictor and, with
    oracle inference, the intervals."""
    from strategies import report

    method = metrics["method"]
    clients = list(dict.fromkeys(coef["client"]))
    n_features = coef.loc[coef["feature"] != "(intercept)", "feature"].nunique()
    cl = clusters.set_index("feature")[clients].T.reset_index(names="client")
    with tempfile.TemporaryDirectory() as tmp:
        path = fig_clusters(
            cl.assign(method=method), {"method": method}, 0, os.path.join(tmp, "c.png"),
            "Client groups per predictor (a colour and number = a group of clients sharing "
            "the row; colours repeat after 20 groups)",
        )  # fmt: skip
        return report.Section(
            "coefficients",
            "Coefficients",
            report.text(
                f"{'Each' if len(responses) <= 4 else 'The first four'} response's "
                "coefficients on the input scale (coefficients.csv), clients ordered by "
                "average-linkage clustering"
                + (
                    f", for the {MAX_VARIABLES} of {n_features} predictors whose rows "
                    "differ most across clients"
                    if n_features > MAX_VARIABLES
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


def _summary(metrics: dict, responses) -> list[tuple]:
    """The report's summary table: the fit's settings and outcome, what is known of it."""
    method = metrics["method"]
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
    return [(k, v) for k, v in summary if v is not None]


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

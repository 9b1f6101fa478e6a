"""``report.html`` of a GrAUC-PFL fit: the method's sections of the page that
:func:`strategies.report.fit_report` builds from the fit's files (the site map, the
coefficient heatmap, each site's test AUC, calibration)."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pandas as pd

from .figures import HEATMAP_FEATURES, LABELS, fig_coef_heatmap, fig_site_map


def _map_section(out_dir: str, metrics: dict, coef: pd.DataFrame, labels):
    from strategies import report

    sites = report.read_csv(out_dir, "sites.csv")
    edges = report.read_csv(out_dir, "edges.csv")
    clusters = report.read_csv(out_dir, "clusters.csv")
    title = "Map of the sites"
    if sites is None or not {"lat", "lon"} <= set(sites.columns):
        return report.Section("map", title, report.text("No site coordinates were given."))
    # copy(): one block per dtype (the merge leaves one per feature column)
    frame = coef.merge(sites[["site", "lat", "lon"]], on="site").copy()
    index = {s: k for k, s in enumerate(frame["site"])}
    method = metrics["method"]
    if edges is not None and len(edges):
        pairs = np.array(
            [[index[u], index[v]] for u, v in zip(edges["site_u"], edges["site_v"], strict=True)]
        )
        what = f"the fusion graph's {len(pairs)} edges ({metrics['config'].get('graph', 'mst')})"
    else:
        pairs = np.zeros((0, 2), dtype=int)
        what = "no fusion graph (a baseline fit)"
    note = report.text(
        f"Sites at their coordinates with {what}. An edge's colour is the number of features "
        "on which its two sites ended with the same coefficient (fused); a site's colour is its "
        "coefficient cluster (the dendrogram's two main clusters)."
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = fig_site_map(
            frame.assign(method="grauc"),
            clusters if len(pairs) else None,
            labels,
            {},
            0,
            os.path.join(tmp, "map.png"),
            edges=pairs,
            title=f"{LABELS.get(method, method)}: sites and graph",
        )
        return report.Section("map", title, note + report.image(path))


def _accuracy_section(out_dir: str, metrics: dict):
    from strategies import report

    from .federation import auc_frame

    test = report.read_csv(out_dir, "test.csv")
    if test is not None and len(test):
        frame, what = test, "test"
    else:
        frame = auc_frame(metrics, list(metrics.get("auc", {})), "train")
        what = "in-sample (no test rows: --test-data or --holdout)"
    title = "Accuracy per site"
    if frame.empty:
        return report.Section("accuracy", title, report.text("No site has an AUC."))
    mean = float(np.nanmean(frame["auc"].to_numpy(float)))
    note = report.text(
        f"Each site's {what} AUC with its DeLong 95% interval; the dashed line is the mean over "
        f"sites ({mean:.4f})."
    )
    fig = report.fig_forest(frame, "site", "auc", None, "AUC")
    return report.Section("accuracy", title, note + report.image(fig) + report.table(frame))


def _calibration_block(out_dir: str) -> str:
    """A tuned fit's calibration (calibration.csv): each site's recalibration slope with its
    95% interval beside the slope shrunk toward the sites' mean, and the table; ``""``
    without the file."""
    from strategies import report

    cal = report.read_csv(out_dir, "calibration.csv")
    if cal is None or cal.empty:
        return ""
    note = report.text(
        "Each site maps its score to a risk, P(y = 1) = expit(intercept + slope x score), "
        "fitted on its out-of-fold scores of the chosen setting (Firth's logistic "
        "regression; red, with its 95% interval), then shrunk toward the sites' mean (dashed) "
        "by how precise it is (blue: what predict --probability uses; docs/methods.md 3.14)."
    )
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 1.3 + 0.24 * len(cal)))
    y = np.arange(len(cal))[::-1]
    est, se = cal["site_slope"].to_numpy(float), cal["site_slope_se"].to_numpy(float)
    ok = np.isfinite(est) & np.isfinite(se)
    ax.hlines(y[ok], est[ok] - 1.96 * se[ok], est[ok] + 1.96 * se[ok], color="#20324a", lw=1.2)
    ax.plot(est, y, "s", color="#d62728", ms=5, mec="black", mew=0.5, label="site's own")
    ax.plot(cal["slope"], y, "D", color="#1f77b4", ms=5, mec="black", mew=0.5, label="shrunk")
    ax.axvline(float(np.nanmean(cal["slope"])), color="0.4", ls="--", lw=0.9)
    ax.set_yticks(y)
    ax.set_yticklabels(cal["site"].astype(str), fontsize=8 if len(cal) > 25 else 9)
    ax.set_xlabel("calibration slope (per unit of score)")
    ax.legend(loc="best", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    body = note + report.image(fig) + report.table(cal.round(4))
    return "<h3>Calibrated risks</h3>" + body + _reliability_block(out_dir)


def _reliability_block(out_dir: str) -> str:
    """The reliability diagram of a tuned fit's calibrated risks on the sites' evaluation
    rows (reliability.csv): each site's bands (grey, area by rows) and all sites' rows pooled
    into tenths of predicted risk (blue); ``""`` without the file."""
    from strategies import report

    bands = report.read_csv(out_dir, "reliability.csv")
    if bands is None or bands.empty:
        return ""
    rows = bands["rows"].to_numpy(float)
    prob = bands["mean_probability"].to_numpy(float)
    seen = bands["observed"].to_numpy(float)
    tenth = np.minimum((prob * 10).astype(int), 9)
    pooled = [(np.average(prob[tenth == k], weights=rows[tenth == k]),
               np.average(seen[tenth == k], weights=rows[tenth == k]), rows[tenth == k].sum())
              for k in range(10) if (tenth == k).any()]  # fmt: skip
    px, py, pn = (np.array(v) for v in zip(*pooled, strict=True))
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    ax.plot([0, 1], [0, 1], color="0.5", ls="--", lw=0.9, label="perfect calibration")
    ax.scatter(prob, seen, s=4 + 60 * rows / rows.max(), color="0.55", alpha=0.45, lw=0,
               label="a site's band")  # fmt: skip
    ax.plot(px, py, "o-", color="#1f77b4", ms=5, mec="black", mew=0.5, label="all sites pooled")
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("predicted risk (mean over the band)")
    ax.set_ylabel("observed rate")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    in_sample = sorted(set(bands.loc[bands["split"] != "test", "site"].astype(str)))
    where = "the sites' test rows" + (
        f" (training rows at {len(in_sample)} site(s) without test rows: "
        + ", ".join(in_sample)
        + ")"
        if in_sample
        else ""
    )
    note = report.text(
        f"Reliability of the calibrated risks on {where} ({int(rows.sum())} rows): "
        "each site groups its rows by predicted risk into bands of at least its guard's "
        "floor of rows and sends each band's mean risk and observed rate (grey, area by "
        "rows; reliability.csv); the blue line pools every site's bands by tenths of risk. "
        "Brier score, calibration error, intercept and slope per site: the table above "
        "(test.csv)."
    )
    table = pd.DataFrame({"predicted": px, "observed": py, "rows": pn.astype(int)}).round(4)
    return "<h3>Reliability on the test rows</h3>" + note + report.image(fig) + report.table(table)


def fit_report(out_dir: str) -> str:
    """Write ``out_dir/report.html`` from a GrAUC-PFL (or baseline) fit's files."""
    from strategies import report

    from .tuning import PARAMS

    metrics = report.read_metrics(out_dir)
    method = metrics["method"]
    coef = report.read_csv(out_dir, "coefficients.csv")
    heat, labels = _coefficients_section(out_dir, metrics, coef)
    sections = {
        "data": report.Section("data", "Data", _data_block(out_dir)),
        "map": _map_section(out_dir, metrics, coef, labels),
        "coefficients": heat,
        "accuracy": _accuracy_section(out_dir, metrics),
    }
    calibration = _calibration_block(out_dir)
    if calibration:  # discrimination, then calibration: one section on accuracy
        acc = sections["accuracy"]
        sections["accuracy"] = report.Section(acc.id, acc.title, acc.body + calibration)
    return report.fit_report(
        out_dir, metrics, "GrAUC-PFL fit report", _summary(metrics), sections,
        PARAMS.get(method, ()),
    )  # fmt: skip


def _coefficients_section(out_dir: str, metrics: dict, coef: pd.DataFrame):
    """The coefficient heatmap (at most :data:`HEATMAP_FEATURES` features, those that
    differ most between the sites), the table and, with oracle inference, the intervals;
    returns the section and the heatmap's site labels (the dendrogram's clusters)."""
    from strategies import report

    method = metrics["method"]
    names = [c for c in coef.columns if c not in ("site", "lat", "lon")]
    shown = names
    if len(names) > HEATMAP_FEATURES:  # the features whose coefficients differ most
        spread = coef[names].std(ddof=0).to_numpy()
        top = set(np.argsort(-spread, kind="stable")[:HEATMAP_FEATURES])
        shown = [f for k, f in enumerate(names) if k in top]
    few = (
        ""
        if shown == names
        else f" Shown: the {len(shown)} of {len(names)} features whose coefficients differ most "
        "between the sites (their SD over the sites, input scale)."
    )
    with tempfile.TemporaryDirectory() as tmp:
        path, labels = fig_coef_heatmap(
            coef[[c for c in coef.columns if c not in names or c in shown]].assign(method=method),
            {},
            0,
            os.path.join(tmp, "heatmap.png"),
            method=method,
            title=f"{LABELS.get(method, method)} coefficients, scaled per feature, sites clustered",
        )
        heat = report.Section(
            "coefficients",
            "Coefficients",
            report.text(
                "Each site's coefficients, each feature's colours scaled by its largest "
                "|coefficient| over the sites in each panel (under its name when there are few), "
                "so that the "
                "features that differ between sites show whatever their scale; the sites are "
                "ordered by average-linkage clustering of their coefficient vectors (input "
                "scale), so fused sites sit together with a dendrogram merge at distance 0. "
                "The values themselves (coefficients.csv, input scale) are in the table below."
                + few
            )
            + report.image(path)
            + report.table(coef.round(4))
            + report.inference_block(
                out_dir,
                metrics,
                "site",
                "the surrogate refitted on the fused groups (one coefficient per feature and "
                "group, ridge as fitted), normal intervals with sandwich standard errors",
            ),
        )
    return heat, labels


def _summary(metrics: dict) -> list[tuple]:
    """The report's summary table: the fit's settings and outcome, what is known of it."""
    method = metrics["method"]
    split = metrics.get("split", {})
    test = metrics.get("test") or {}
    summary = [
        ("method", LABELS.get(method, method)),
        ("engine", metrics.get("engine")),
        ("data", metrics.get("source")),
        ("sites", metrics.get("n_sites")),
        ("features", len(metrics.get("features", []))),
        ("training rows", split.get("n_train")),
        ("test rows", split.get("n_test")),
        ("rounds", metrics.get("rounds")),
        ("converged", metrics.get("converged")),
        ("objective", metrics.get("objective")),
        ("mean test AUC" if test else "mean in-sample AUC", metrics.get("mean_auc")),
        ("tuned", metrics.get("tuned")),
        ("seconds", metrics.get("seconds")),
    ]
    return [(k, v) for k, v in summary if v is not None]


def _data_block(out_dir: str) -> str:
    """The sites' rows and prevalence (sites.csv), as the data section's HTML."""
    from strategies import report

    sites = report.read_csv(out_dir, "sites.csv")
    if sites is None:
        return report.text("No sites.csv in this directory.")
    counts = sites.drop(columns=[c for c in ("lat", "lon") if c in sites.columns])
    rows = counts["n_pos"] + counts["n_neg"]
    prevalence = counts["n_pos"] / rows
    return report.text(
        f"{len(sites)} sites; training rows per site {int(rows.min())}–{int(rows.max())}, "
        "prevalence "
        f"{prevalence.min():.2f}–{prevalence.max():.2f} (sites.csv)."
    ) + report.table(counts.assign(prevalence=prevalence), 200)

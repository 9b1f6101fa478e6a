"""``report.html``: one self-contained page per fit or study, the same for both methods.

Every figure is a PNG embedded as a ``data:`` URI, the style sheet is inline, and the page
has no script and no link to anything outside itself, so it opens anywhere (an e-mail
attachment, a machine without a network).  Sections carry fixed ``id`` attributes
(:data:`FIT_SECTIONS`, :data:`STUDY_SECTIONS`) so that a reader, or a test, can find them.

A fit's page is built from the files the fit wrote (``metrics.json``, ``history.csv``,
``cv.csv``, ``test.csv``, ...), so it is the same whichever engine ran the fit, and
``python -m <method> report DIR`` rebuilds it.  The method packages supply what differs:
the map (or graph) of the sites, the coefficient figure and the per-site accuracy
(:func:`fit_report`'s ``method_sections``).  This module supplies the page, the shared
figures (convergence, the cross-validation curve, forest plots) and the study page.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .experiments.plots import pyplot

#: The sections of a fit's page, in order.
FIT_SECTIONS = (
    "summary",
    "data",
    "map",
    "coefficients",
    "cv",
    "accuracy",
    "convergence",
    "settings",
)
#: The sections of a study's page, in order.
STUDY_SECTIONS = ("summary", "figures", "settings")

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:0;
color:#222;background:#fafafa}
header{background:#20324a;color:#fff;padding:18px 32px}
header h1{margin:0 0 4px 0;font-size:22px}header p{margin:0;color:#cfd8e3}
nav{padding:8px 32px;background:#e9edf2;font-size:14px}nav a{margin-right:16px;color:#20324a}
section{background:#fff;margin:18px 32px;padding:14px 22px;border:1px solid #dde3ea;
border-radius:6px}
section h2{margin-top:4px;font-size:18px;color:#20324a}
img{max-width:100%;height:auto;display:block;margin:8px 0}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #d5dbe2;padding:3px 8px;text-align:right}
th{background:#eef2f6}td.l,th.l{text-align:left}
p.note{color:#555;font-size:13px}
"""


@dataclass
class Section:
    """One section of a page: its anchor, heading and HTML body."""

    id: str
    title: str
    body: str


# ---------------------------------------------------------------------------------------
# HTML pieces


def text(message: str, note: bool = False) -> str:
    """A paragraph (escaped).

    Parameters
    ----------
    message : str
        The paragraph's text.
    note : bool, optional
        In the smaller, grey style of a note.

    Returns
    -------
    str
        The HTML.
    """
    cls = ' class="note"' if note else ""
    return f"<p{cls}>{html.escape(message)}</p>"


def image(source) -> str:
    """An ``<img>`` with the PNG embedded: ``source`` is a file path or a matplotlib
    figure (closed after it is drawn)."""
    if isinstance(source, str):
        with open(source, "rb") as fh:
            data = fh.read()
        alt = os.path.basename(source)
    else:
        import matplotlib.pyplot as plt

        buf = io.BytesIO()
        source.savefig(buf, format="png")
        plt.close(source)
        data, alt = buf.getvalue(), "figure"
    encoded = base64.b64encode(data).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{encoded}">'


def _cell(value) -> str:
    if isinstance(value, float | np.floating):
        if not math.isfinite(value):
            return ""
        return f"{value:.4g}"
    return html.escape(str(value))


def table(frame: pd.DataFrame, max_rows: int = 60) -> str:
    """A table (numbers to 4 significant digits; text left-aligned).

    Parameters
    ----------
    frame : pandas.DataFrame
        The rows.
    max_rows : int, optional
        At most this many rows, with a note of how many more the file has.

    Returns
    -------
    str
        The HTML.
    """
    shown = frame.head(max_rows)
    numeric = [pd.api.types.is_numeric_dtype(shown[c]) for c in shown.columns]
    head = "".join(
        f"<th{'' if n else ' class=l'}>{html.escape(str(c))}</th>"
        for c, n in zip(shown.columns, numeric, strict=True)
    )
    rows = []
    for values in shown.itertuples(index=False):
        cells = "".join(
            f"<td{'' if n else ' class=l'}>{_cell(v)}</td>"
            for v, n in zip(values, numeric, strict=True)
        )
        rows.append(f"<tr>{cells}</tr>")
    more = len(frame) - len(shown)
    tail = text(f"... and {more} more rows", note=True) if more > 0 else ""
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>{tail}"


def pairs(items: Sequence[tuple[str, object]]) -> str:
    """A two-column table of names and values."""
    return table(pd.DataFrame([(k, _value(v)) for k, v in items], columns=["", "value"]), 200)


def _value(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list | tuple):
        return ", ".join(_value(x) for x in v)
    if isinstance(v, dict):
        return "; ".join(f"{k} {_value(x)}" for k, x in v.items())
    return "" if v is None else str(v)


def write_page(path: str, title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """Write the page to ``path`` (through a temporary file) and return the path.

    Parameters
    ----------
    path : str
        The HTML file.
    title : str
        The page's title and heading.
    subtitle : str
        The line under the heading.
    sections : sequence of Section
        The sections in order, each linked from the navigation bar.

    Returns
    -------
    str
        ``path``.
    """
    nav = "".join(f'<a href="#{s.id}">{html.escape(s.title)}</a>' for s in sections)
    body = "".join(
        f'<section id="{s.id}"><h2>{html.escape(s.title)}</h2>{s.body}</section>' for s in sections
    )
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<header><h1>{html.escape(title)}</h1><p>{html.escape(subtitle)}</p></header>"
        f"<nav>{nav}</nav>{body}</body></html>\n"
    )
    tmp = path + ".part"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(page)
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------
# shared figures


def fig_convergence(history: pd.DataFrame):
    """The objective's distance to its last value and (ADMM) the residuals, per round."""
    plt = pyplot()
    resid = [
        c
        for c in ("primal_residual", "dual_residual")
        if c in history and pd.to_numeric(history[c], errors="coerce").notna().any()
    ]
    fig, axes = plt.subplots(1, 2 if resid else 1, figsize=(11 if resid else 6.5, 3.8))
    axes = np.atleast_1d(axes)
    obj = pd.to_numeric(history["objective"], errors="coerce").to_numpy(float)
    rounds = history["round"].to_numpy()
    gap = np.abs(obj - obj[-1]) / max(1.0, abs(obj[-1]))
    keep = gap > 0
    ax = axes[0]
    if keep.any():
        ax.semilogy(rounds[keep], gap[keep], "o-", ms=3, color="#20324a")
    ax.set_xlabel("round")
    ax.set_ylabel("|objective - final| / max(1, |final|)")
    ax.set_title(f"objective (final {obj[-1]:.6g})")
    ax.grid(alpha=0.3, which="both")
    if resid:
        for c, color in zip(resid, ("#d62728", "#1f77b4"), strict=False):
            v = pd.to_numeric(history[c], errors="coerce").to_numpy(float)
            ok = np.isfinite(v) & (v > 0)
            axes[1].semilogy(rounds[ok], v[ok], ".-", ms=3, color=color, label=c.replace("_", " "))
        axes[1].set_xlabel("round")
        axes[1].set_title("residuals")
        axes[1].legend(frameon=False)
        axes[1].grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


#: More settings of the other parameters than this: the chosen one's line in colour, the
#: rest as thin grey lines (a legend of dozens of colours cannot be read).
CV_LINES_IN_COLOUR = 6


def fig_cv_curve(summary: pd.DataFrame, params: Sequence[str], chosen: dict, label: str):
    """The mean validation score (± one standard error over folds) along the parameter with
    the most values, one line per setting of the others; the chosen setting starred.  With
    more than ``CV_LINES_IN_COLOUR`` settings of the others, only the chosen setting's line
    is in colour (with its band), the others thin and grey (their grids along the x axis
    may differ: GrAUC-PFL's λ path is scaled to each setting's own λ_max).

    Parameters
    ----------
    summary : pandas.DataFrame
        A row per setting: the ``params``, ``mean`` and ``se``
        (:func:`strategies.stats.tuning.summarize`).
    params : sequence of str
        The tuned parameters.
    chosen : dict
        The chosen value of each parameter.
    label : str
        The score's name: the y axis' label (and the line's, without other parameters).

    Returns
    -------
    matplotlib.figure.Figure
    """
    plt = pyplot()
    counts = [summary[p].nunique() for p in params]
    x_param = params[int(np.argmax(counts))]
    others = [p for p in params if p != x_param]
    groups = list(summary.groupby(others, sort=False)) if others else [((), summary)]
    many = len(groups) > CV_LINES_IN_COLOUR
    fig, ax = plt.subplots(figsize=(9.5, 4.6))
    cmap = plt.get_cmap("tab10")
    values = summary[x_param].to_numpy(float)
    logx = bool(
        (values > 0).sum() >= 3 and values[values > 0].max() / values[values > 0].min() > 20
    )
    positive = values[values > 0]
    zero_at = positive.min() / 10.0 if logx and (values <= 0).any() else None

    def place(x):  # 0 on a log axis: one decade left of the smallest value
        x = np.asarray(x, float)
        return np.where(x > 0, x, zero_at) if zero_at is not None else x

    keys = [key if isinstance(key, tuple) else (key,) for key, _ in groups]
    chosen_key = [float(chosen[p]) for p in others]
    is_chosen = [bool(np.allclose(np.asarray(key, float), chosen_key)) for key in keys]
    star = None
    for k, ((_, grp), key) in enumerate(zip(groups, keys, strict=True)):
        grp = grp.sort_values(x_param)
        x = place(grp[x_param])
        m, se = grp["mean"].to_numpy(float), grp["se"].to_numpy(float)
        if many and not is_chosen[k]:
            ax.plot(x, m, "-", color="0.65", lw=0.7, alpha=0.7, zorder=1)
            continue
        name = ", ".join(f"{p} {v:g}" for p, v in zip(others, key, strict=True)) or label
        color = "#1f4e9c" if many else cmap(k % 10)
        lw = 2.0 if is_chosen[k] and len(groups) > 1 else 1.2
        ax.plot(x, m, "o-", ms=3, color=color, lw=lw, zorder=3, label=name)
        ok = np.isfinite(se)
        ax.fill_between(x[ok], (m - se)[ok], (m + se)[ok], color=color, alpha=0.15, lw=0)
        at = np.isclose(grp[x_param].to_numpy(float), chosen[x_param])
        if is_chosen[k] and at.any():
            star = (x[at][:1], m[at][:1])
    if many:
        n_other = len(groups) - sum(is_chosen)
        ax.plot([], [], "-", color="0.65", lw=0.7, label=f"the other {n_other} settings")
    if star is not None:  # named by its x value: the coloured line names the rest
        ax.plot(
            *star,
            "*",
            ms=18,
            color="#ff7f0e",
            mec="black",
            zorder=5,
            ls="none",
            label=f"chosen: {x_param} {chosen[x_param]:g}",
        )
    if logx:
        ax.set_xscale("log")
        if zero_at is not None:
            ax.axvline(zero_at * 3.0, color="0.6", lw=0.8, ls=":")
            ax.annotate(
                "0",
                (zero_at, 0),
                xycoords=("data", "axes fraction"),
                xytext=(0, -14),
                textcoords="offset points",
                ha="center",
                va="top",
                fontsize=10,
            )
    ax.set_xlabel(
        x_param + (" (log scale; left of the dotted line: 0)" if zero_at is not None else "")
    )
    ax.set_ylabel(label)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def fig_forest(
    frame: pd.DataFrame,
    label: str,
    estimate: str,
    panel: str | None,
    xlabel: str,
    reference: float | None = None,
):
    """A forest plot: one row per value of ``label``, the estimate with its ``lower``-``upper``
    interval (when the frame has them), a dashed line at ``reference``; one panel per value
    of ``panel``.

    Parameters
    ----------
    frame : pandas.DataFrame
        The rows to draw.
    label : str
        The column naming each row.
    estimate : str
        The column of the estimates.
    panel : str or None
        The column whose values split the panels (``None``: one panel).
    xlabel : str
        The x axis' label.
    reference : float, optional
        Where the dashed line is drawn (default: the mean of the estimates).

    Returns
    -------
    matplotlib.figure.Figure
    """
    plt = pyplot()
    panels = list(dict.fromkeys(frame[panel])) if panel else [None]
    rows = list(dict.fromkeys(frame[label]))
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(min(16.0, 1.5 + 4.2 * len(panels)), 1.3 + 0.24 * len(rows)),
        sharey=True,
        squeeze=False,
    )
    for ax, name in zip(axes[0], panels, strict=True):
        sub = frame if name is None else frame[frame[panel] == name]
        sub = sub.set_index(label).reindex(rows)
        y = np.arange(len(rows))[::-1]
        est = sub[estimate].to_numpy(float)
        if "lower" in sub and "upper" in sub:
            lo, hi = sub["lower"].to_numpy(float), sub["upper"].to_numpy(float)
            ok = np.isfinite(lo) & np.isfinite(hi)
            ax.hlines(y[ok], lo[ok], hi[ok], color="#20324a", lw=1.4)
        ax.plot(est, y, "s", color="#d62728", ms=5, mec="black", mew=0.5)
        if reference is not None:
            ax.axvline(reference, color="0.4", ls="--", lw=0.9)
        elif np.isfinite(est).any():
            ax.axvline(np.nanmean(est), color="0.4", ls="--", lw=0.9)
        ax.set_yticks(y)
        ax.set_yticklabels(rows, fontsize=8 if len(rows) > 25 else 9)
        ax.set_xlabel(xlabel)
        if name is not None:
            ax.set_title(str(name))
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------
# pages


#: Columns that name sites or clients: read as text, so that ``01`` stays ``01``.
ID_COLUMNS = ("site", "site_u", "site_v", "client")


def read_csv(out_dir: str, name: str) -> pd.DataFrame | None:
    """``out_dir/name`` (identifiers as text), or None when the fit did not write it.

    Parameters
    ----------
    out_dir : str
        The fit's directory.
    name : str
        The file's name.

    Returns
    -------
    pandas.DataFrame or None
    """
    path = os.path.join(out_dir, name)
    if not os.path.isfile(path):
        return None
    return pd.read_csv(path, dtype={c: str for c in ID_COLUMNS})


def cv_section(out_dir: str, metrics: dict, params: Sequence[str]) -> Section:
    """The cross-validation curve from ``cv.csv`` and ``metrics.json`` (or a line saying
    the fit was not tuned).

    Parameters
    ----------
    out_dir : str
        The fit's directory.
    metrics : dict
        Its ``metrics.json`` (``tuned`` and ``cv``).
    params : sequence of str
        The tuned settings' names (those that are columns of ``cv.csv`` are drawn).

    Returns
    -------
    Section
    """
    from .stats.tuning import summarize

    cv = read_csv(out_dir, "cv.csv")
    title = "Cross-validation"
    if cv is None or "tuned" not in metrics:
        return Section("cv", title, text("This fit was not tuned (fit --tune cv tunes it)."))
    info = metrics["cv"]
    score = info["score"]
    params = [p for p in params if p in cv.columns]
    summary = summarize(cv, params, score)
    label = {
        "val_auc": "mean validation AUC",
        "val_mse": "mean validation MSE",
        "val_loss": "mean validation surrogate loss",
        "pooled_auc": "mean pooled out-of-fold AUC",
        "pooled_mse": "mean pooled out-of-fold MSE",
    }.get(score, score)
    chosen = {p: float(metrics["tuned"][p]) for p in params}
    body = text(
        f"{info['folds']}-fold cross-validation over {info['settings']} settings, rule "
        f"'{info['rule']}': chose {', '.join(f'{p} = {v:g}' for p, v in chosen.items())} "
        f"({label} {info['mean']:.4g} ± {info['se']:.2g} SE; best mean of the grid "
        f"{info['best_mean']:.4g}). Bands: ± one standard error over folds."
    )
    return Section("cv", title, body + image(fig_cv_curve(summary, params, chosen, label)))


def convergence_section(out_dir: str, metrics: dict) -> Section:
    """The convergence figure from ``history.csv`` (:func:`fig_convergence`), or a line saying
    the method is fitted in one round.

    Parameters
    ----------
    out_dir : str
        The fit's directory.
    metrics : dict
        Its ``metrics.json`` (``method``, ``converged``, ``rounds``).

    Returns
    -------
    Section
    """
    history = read_csv(out_dir, "history.csv")
    title = "Convergence"
    if history is None or history.empty:
        return Section(
            "convergence", title, text(f"{metrics['method']} is fitted in one round: no history.")
        )
    state = "converged" if metrics.get("converged") else "stopped at the round limit"
    body = text(f"{metrics['method']}: {state} after {metrics['rounds']} rounds.")
    return Section("convergence", title, body + image(fig_convergence(history)))


#: At most this many intervals in a report's forest plot of the oracle refit.
MAX_INTERVALS = 60


def inference_block(out_dir: str, metrics: dict, entity: str, refit: str) -> str:
    """With ``--inference oracle`` (either method): a forest plot of the refit's distinct
    coefficients from ``inference.csv`` -- one row per feature (and response) and group of
    ``entity`` values sharing it, ordered by feature -- under a sentence naming the refit
    and its intervals.

    Parameters
    ----------
    out_dir : str
        The fit's directory.
    metrics : dict
        Its ``metrics.json``: ``inference`` gives the level, or the reason for no intervals.
    entity : str
        The column of ``inference.csv`` naming the sites or clients (``site``, ``client``).
    refit : str
        What the refit is, for the sentence.

    Returns
    -------
    str
        The HTML; '' without ``inference.csv``, the reason when the refit gave none.
    """
    info = metrics.get("inference") or {}
    table = read_csv(out_dir, "inference.csv")
    if table is None:
        return text(f"No intervals: {info['error']}.", note=True) if "error" in info else ""
    keys = ["feature"] + (["response"] if "response" in table.columns else [])
    shown = table[np.isfinite(table["se"].astype(float))]
    groups = (
        shown.groupby([*keys, "estimate"], sort=False)
        .agg(members=(entity, list), lower=("lower", "first"), upper=("upper", "first"))
        .reset_index()
    )
    for key in keys:  # the table's own order of features (and responses)
        rank = {v: k for k, v in enumerate(dict.fromkeys(table[key]))}
        groups[f"_{key}"] = groups[key].map(rank)
    groups = groups.sort_values([f"_{key}" for key in keys], kind="stable")

    def who(members: list) -> str:
        if len(members) <= 3:
            return ", ".join(map(str, members))
        return f"{len(members)} {entity}s ({members[0]} ... {members[-1]})"

    groups["label"] = [
        " / ".join(str(row[k]) for k in keys) + f": {who(row['members'])}"
        for _, row in groups.iterrows()
    ]
    level = info.get("level", 0.95)
    more = len(groups) > MAX_INTERVALS
    body = text(
        f"Oracle inference: {refit}; {100 * level:g}% intervals (inference.csv). One row per "
        f"{' and '.join(keys)} and group of {entity}s sharing that coefficient; coefficients "
        "without an interval (zeros, groups without data) are not shown; the dashed line is "
        "0. These are post-selection intervals, valid when the structure is right."
        + (f" The first {MAX_INTERVALS} of {len(groups)} rows are shown." if more else "")
    )
    if groups.empty:
        return body + text("No coefficient has an interval.", note=True)
    fig = fig_forest(
        groups.head(MAX_INTERVALS), "label", "estimate", None, "coefficient", reference=0.0
    )
    return body + image(fig)


def settings_section(metrics: dict) -> Section:
    skip = {"config"}
    items = [("config." + k, v) for k, v in sorted(metrics.get("config", {}).items())]
    run = [
        (k, v) for k, v in metrics.items() if k not in skip and not isinstance(v, dict) and v != []
    ]
    return Section("settings", "Settings", pairs(run + items))


def read_metrics(out_dir: str) -> dict:
    """A fit's ``metrics.json``."""
    with open(os.path.join(out_dir, "metrics.json")) as fh:
        return json.load(fh)


def fit_report(
    out_dir: str,
    metrics: dict,
    title: str,
    summary: Sequence[tuple[str, object]],
    method_sections: dict[str, Section],
    params: Sequence[str],
) -> str:
    """Write ``out_dir/report.html`` for a fit: the summary, the method's sections, and the
    shared CV curve, convergence and settings.

    Parameters
    ----------
    out_dir : str
        The fit's directory.
    metrics : dict
        Its :func:`read_metrics`.
    title : str
        The page's title.
    summary : sequence of (str, object)
        The summary's name, value pairs.
    method_sections : dict of str to Section
        The method's ``data``, ``map``, ``coefficients`` and ``accuracy`` sections.
    params : sequence of str
        The tuned settings' names, for the CV curve.

    Returns
    -------
    str
        The page's path.
    """
    sections = {
        "summary": Section("summary", "Summary", pairs(summary)),
        **method_sections,
        "cv": cv_section(out_dir, metrics, params),
        "convergence": convergence_section(out_dir, metrics),
        "settings": settings_section(metrics),
    }
    subtitle = f"{metrics['method']} fit; page written {time.strftime('%Y-%m-%d %H:%M')}"
    return write_page(
        os.path.join(out_dir, "report.html"), title, subtitle, [sections[s] for s in FIT_SECTIONS]
    )


def study_report(
    out: str,
    study,
    results: pd.DataFrame,
    summary_table: pd.DataFrame,
    figures: Sequence[str],
    caption: str | None = None,
) -> str:
    """Write ``out/report.html`` for a study: the summary table, every figure, the design
    and settings.

    Parameters
    ----------
    out : str
        The study's output directory.
    study : Study
        The parsed config: its cells, replications, seed and settings.
    results : pandas.DataFrame
        The finished tasks' rows, for the counts.
    summary_table : pandas.DataFrame
        The table of the summary section (``summary_table.csv``).
    figures : sequence of str
        The figures' PNG files (none: a line saying the study ran without figures).
    caption : str, optional
        The summary table's caption (default: mean (SD) over replications).

    Returns
    -------
    str
        The page's path.
    """
    name = os.path.basename(os.path.abspath(out))
    keys = list(study.keys)
    n_cells = len(results.drop_duplicates(keys)) if keys else 1
    reps = results.groupby(keys)["rep"].nunique() if keys else results["rep"].nunique()
    lo, hi = (int(reps.min()), int(reps.max())) if keys else (int(reps), int(reps))
    subtitle = (
        f"{n_cells} of {len(study.cells)} design cells, "
        f"{lo if lo == hi else f'{lo}-{hi}'} of {study.replications} replications each; "
        f"page written {time.strftime('%Y-%m-%d %H:%M')}"
    )
    sections = [
        Section(
            "summary",
            "Summary",
            text(
                caption
                or "Mean (SD) over replications per design cell and method (summary_table.csv)."
            )
            + table(summary_table, 200),
        ),
        Section(
            "figures",
            "Figures",
            "".join(image(p) for p in figures)
            if figures
            else text("No figures (the study ran with --no-figures)."),
        ),
        Section(
            "settings",
            "Design and settings",
            pairs(
                [("replications", study.replications), ("seed", study.seed)]
                + [
                    (k, ", ".join(map(str, sorted({c[k] for c in study.cells}))))
                    for k in study.keys
                ]
                + [
                    (f"{part}.{k}", v)
                    for part, block in study.settings.items()
                    if isinstance(block, dict)
                    for k, v in block.items()
                ]
            ),
        ),
    ]
    return write_page(os.path.join(out, "report.html"), f"Study {name}", subtitle, sections)


def add_report_parser(sub) -> None:
    """The ``report`` subcommand of a method's command line (:func:`cmd_report`)."""
    p = sub.add_parser("report", help="rebuild a fit's report.html from its output directory")
    p.add_argument("--model", required=True, help="the fit's output directory")


def cmd_report(args, builder: Callable[[str], str]) -> int:
    """``report``: rebuild ``report.html`` in the fit's directory; prints one line.

    Parameters
    ----------
    args : argparse.Namespace
        The ``report`` subcommand's options: ``model``, the fit's directory.
    builder : callable
        ``builder(out_dir) -> path``: the method's report (its ``fit_report``).

    Returns
    -------
    int
        The exit code, 0.
    """
    from .errors import InputError

    out_dir = args.model
    for name in ("metrics.json", "coefficients.csv"):
        if not os.path.isfile(os.path.join(out_dir, name)):
            raise InputError(f"model: no {name} in {out_dir} (not a fit's output directory)")
    print(f"wrote {builder(out_dir)}")
    return 0


__all__ = [
    "FIT_SECTIONS",
    "add_report_parser",
    "cmd_report",
    "STUDY_SECTIONS",
    "Section",
    "fig_convergence",
    "fig_cv_curve",
    "fig_forest",
    "fit_report",
    "image",
    "pairs",
    "study_report",
    "table",
    "text",
    "write_page",
]

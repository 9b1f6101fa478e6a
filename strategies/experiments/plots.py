"""Figure helpers shared by both methods' study figures."""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Display names and colours of the comparators both methods share (Flower's global-model
#: strategies, Ditto, fine-tuning), the same in both methods' figures.
COMPARATOR_LABELS = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "fedavgm": "FedAvgM",
    "fedadagrad": "FedAdagrad",
    "fedadam": "FedAdam",
    "fedyogi": "FedYogi",
    "fedmedian": "FedMedian",
    "fedtrimmedavg": "FedTrimmedAvg",
    "krum": "Krum",
    "ditto": "Ditto",
    "fedavg-ft": "FedAvg-FT",
    "ifca": "IFCA",
    "mean-fusion": "Mean fusion",
}
COMPARATOR_COLORS = {
    "fedavg": "#2ca02c",
    "fedprox": "#98df8a",
    "fedavgm": "#17becf",
    "fedadagrad": "#bcbd22",
    "fedadam": "#8c564b",
    "fedyogi": "#e377c2",
    "fedmedian": "#ff7f0e",
    "fedtrimmedavg": "#ffbb78",
    "krum": "#c5b0d5",
    "ditto": "#393b79",
    "fedavg-ft": "#637939",
    "ifca": "#e7969c",
    "mean-fusion": "#843c39",
}
#: Legend entries per row.
LEGEND_COLUMNS = 7


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend with the studies' font sizes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 11, "axes.titlesize": 11, "figure.dpi": 110})
    return plt


def finish(fig, title: str, path: str, handles=None, labels=None) -> str:
    """Title on top, the legend in a band below it, panels under both; save and close.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure.
    title : str
        Its title, wrapped to the figure's width.
    path : str
        Where the figure is saved.
    handles, labels : list, optional
        The legend's entries (``None``: no legend), at most :data:`LEGEND_COLUMNS` a row.

    Returns
    -------
    str
        ``path``.
    """
    import textwrap

    import matplotlib.pyplot as plt

    h = fig.get_figheight()
    lines = textwrap.wrap(title, width=int(fig.get_figwidth() * 8.5))
    extra = 0.22 * (len(lines) - 1)
    rows = -(-len(labels) // LEGEND_COLUMNS) if handles else 1
    band = (0.85 if handles else 0.5) + extra + 0.3 * (rows - 1)
    fig.tight_layout(rect=(0, 0, 1, 1 - band / h))  # before the title: it is placed by hand
    fig.suptitle("\n".join(lines), y=1 - 0.1 / h, va="top", fontsize=12)
    if handles:
        fig.legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, 1 - (0.4 + extra) / h),
            ncol=min(len(labels), LEGEND_COLUMNS),
            frameon=False,
        )
    fig.savefig(path)
    plt.close(fig)
    return path


def figure_cell(results: pd.DataFrame, study, cells) -> dict:
    """The cell of the one-cell figures: ``[figures] cell`` when it has results, else the
    first cell of this run's grid that has results.

    Parameters
    ----------
    results : pandas.DataFrame
        The study's results.
    study : Study
        The study config (its design keys and ``[figures]`` table).
    cells : list of dict
        This run's cells.

    Returns
    -------
    dict
        The design values of the cell (the first row's when no cell of ``cells`` has
        results).
    """
    keys = list(study.keys)
    wanted = study.settings.get("figures", {}).get("cell")
    have = {tuple(r) for r in results[keys].itertuples(index=False)}
    candidates = []
    if wanted:
        candidates += [
            c
            for c in cells
            if all(
                np.isclose(c[k], v) if isinstance(v, float) else c[k] == v
                for k, v in wanted.items()
            )
        ]
    candidates += list(cells)
    for c in candidates:
        if tuple(c[k] for k in keys) in have:
            return dict(c)
    first = results.iloc[0]
    return {k: first[k] for k in keys}


def method_boxes(ax, groups, k: int, width: float, color: str) -> None:
    """The boxes of the ``k``-th method beside the other methods' at each group.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The panel.
    groups : sequence of array_like
        ``groups[x]``: the method's values at group ``x`` (possibly empty: no box).
    k : int
        The method's place among the methods at each group.
    width : float
        Each box's width (in units of the groups' spacing).
    color : str
        The boxes' colour.
    """
    data, pos = [], []
    for x, values in enumerate(groups):
        if len(values):
            data.append(np.asarray(values))
            pos.append(x - 0.4 + width * (k + 0.5))
    if not data:
        return
    bp = ax.boxplot(
        data,
        positions=pos,
        widths=width * 0.85,
        patch_artist=True,
        medianprops={"color": "black"},
        flierprops={"markersize": 2, "alpha": 0.5},
    )
    for box in bp["boxes"]:
        box.set_facecolor(color)
        box.set_alpha(0.75)


def place_labels(ax, x, y, texts, fontsize: float = 8.0) -> list:
    """Label points without overlap: each label tries eight positions around its point, at
    growing distances (beyond the nearest with a leader line), and takes the first whose
    drawn box overlaps no label placed before and no other point.  Needs the final layout
    (call after ``fig.canvas.draw()``).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The panel.
    x, y : array_like
        The points, in data coordinates.
    texts : sequence
        One label per point.
    fontsize : float, optional
        The labels' font size.

    Returns
    -------
    list of matplotlib.text.Annotation
        The text artists, the highest point's first.
    """
    from matplotlib.transforms import Bbox

    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    pts = ax.transData.transform(np.column_stack([x, y]))
    r = 4.0 * fig.dpi / 72.0
    dots = [Bbox([[px - r, py - r], [px + r, py + r]]) for px, py in pts]
    placed: list = []
    artists = []
    directions = ((1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))
    for k in np.argsort(-pts[:, 1], kind="stable"):  # top first
        text = ax.annotate(
            str(texts[k]),
            (x[k], y[k]),
            xytext=(5, 4),
            textcoords="offset points",
            fontsize=fontsize,
        )
        fallback = None
        for far in (1.0, 2.5, 4.0, 6.0, 8.5):
            for dx, dy in directions:
                text.set_position((dx * 5 * far, dy * 4 * far))
                text.set_ha("left" if dx > 0 else "right" if dx < 0 else "center")
                text.set_va("bottom" if dy > 0 else "top" if dy < 0 else "center")
                box = text.get_window_extent(renderer).expanded(1.05, 1.1)
                clear = not any(box.overlaps(b) for b in placed) and not any(
                    box.overlaps(d) for j, d in enumerate(dots) if j != k
                )
                fallback = fallback or (far, dx, dy)
                if clear:
                    break
            else:
                continue
            break
        else:  # nowhere clear: the nearest position
            far, dx, dy = fallback
            text.set_position((dx * 5 * far, dy * 4 * far))
            text.set_ha("left" if dx > 0 else "right" if dx < 0 else "center")
            text.set_va("bottom" if dy > 0 else "top" if dy < 0 else "center")
        if far > 1.0:
            ax.annotate(
                "",
                (x[k], y[k]),
                xytext=text.get_position(),
                textcoords="offset points",
                arrowprops={"arrowstyle": "-", "color": "0.45", "lw": 0.6, "shrinkB": 3},
            )
        placed.append(text.get_window_extent(renderer))
        artists.append(text)
    return artists

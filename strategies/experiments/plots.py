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
    """Title on top, the legend in a band below it, panels under both; save and close."""
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
    first cell of this run's grid that has results."""
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
    """The boxes of the ``k``-th method beside the other methods' at each group ``x``
    (``groups[x]``: the values, possibly empty), each box ``width`` wide."""
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

"""The tuning's command-line options, shared by both methods' ``fit``: ``--tune`` and the
cross-validation options, their :class:`~strategies.stats.tuning.CVOptions`, their run-config
keys for ``--engine flower``, and what ``metrics.json`` records of a cross-validation."""

from __future__ import annotations

import argparse


def add_tuning_arguments(parser: argparse.ArgumentParser, tunes: tuple[str, ...]) -> None:
    """``--tune`` and the cross-validation options both ``fit`` commands share.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The ``fit`` command's parser.
    tunes : tuple of str
        ``--tune``'s choices (the method's ways to tune, e.g. ``cv``, ``gic``).
    """
    from ..stats.tuning import RULES

    parser.add_argument(
        "--tune",
        choices=tunes,
        help="choose the penalty levels from the data: " + ", ".join(tunes),
    )
    parser.add_argument(
        "--folds", type=int, default=5, metavar="K", help="cv: folds within each site (default: 5)"
    )
    parser.add_argument(
        "--cv-rule",
        choices=RULES,
        default="best",
        help="cv: the best mean validation score, or the most regularized setting within "
        "one standard error of it (default: best)",
    )
    parser.add_argument(
        "--cv-criterion",
        choices=("folds", "pooled", "loss"),
        default="folds",
        help="cv: the mean of per-fold scores, each site's score of its pooled out-of-fold "
        "predictions, or the validation loss (default: folds)",
    )
    parser.add_argument(
        "--cv-repeats",
        type=int,
        default=1,
        metavar="R",
        help="cv: draw the folds R times (default: 1)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        metavar="N",
        help="cv: processes for the server's model problems (fused methods) or the folds "
        "(comparators); default: one per core",
    )
    parser.add_argument(
        "--max-fits",
        type=int,
        default=0,
        metavar="N",
        help="cv, gic: at most N fits at once in the federated tuning; the others wait their "
        "turn, with the same results (0, the default: no limit; fewer take less memory and "
        "more rounds)",
    )
    parser.add_argument(
        "--knob-grid",
        default="",
        metavar="LIST",
        help="cv, a comparator: values of its own setting (fedprox-mu, ditto-mu, ifca-k, "
        "fedopt-eta, ...; default: strategies/stats/tuning.py KNOBS)",
    )


def cv_options(args: argparse.Namespace, seed: int):
    """The :class:`~strategies.stats.tuning.CVOptions` of a ``fit`` command's options.

    Parameters
    ----------
    args : argparse.Namespace
        The ``fit`` command's options (:func:`add_tuning_arguments`'s, and ``quiet`` when
        there).
    seed : int
        The folds' seed.

    Returns
    -------
    CVOptions
    """
    from ..stats.tuning import CVOptions

    return CVOptions(
        folds=args.folds,
        rule=args.cv_rule,
        jobs=args.jobs,
        seed=seed,
        quiet=bool(getattr(args, "quiet", False)),
        criterion=args.cv_criterion,
        repeats=args.cv_repeats,
        max_fits=args.max_fits,
    )


def tune_run_config(by: str, opts, grids: dict) -> dict:
    """The ``tune.*`` run-config keys of a federated tuning (``--engine flower``).

    Parameters
    ----------
    by : str
        How the levels are tuned (``tune.by``, e.g. ``cv``, ``gic``).
    opts : CVOptions
        The cross-validation's options (read: ``folds``, ``rule``, ``criterion``,
        ``repeats``, ``seed``, ``tol``, ``max_rounds``, ``max_fits``).
    grids : dict
        ``{"lam-grid": values, ...}``: each grid as numbers, written comma-separated
        (empty: the default), or a word (RowFed's ``auto``), written as it is.

    Returns
    -------
    dict
        The ``tune.*`` keys.
    """
    out = {
        "tune.by": by,
        "tune.folds": opts.folds,
        "tune.rule": opts.rule,
        "tune.criterion": opts.criterion,
        "tune.repeats": opts.repeats,
        "tune.fold-seed": opts.seed,
        "tune.tol": opts.tol,
        "tune.max-rounds": opts.max_rounds,
        "tune.max-fits": opts.max_fits,
    }
    for key, values in grids.items():  # numbers, or a word (RowFed's "auto")
        text = values if isinstance(values, str) else ",".join(repr(float(v)) for v in values)
        out[f"tune.{key}"] = text
    return out


def tuning_metrics(summary, params, score: str, maximize: bool, opts, no_edge=()) -> dict:
    """What ``metrics.json`` records of a cross-validation: the chosen setting, its mean
    validation score and standard error, the best mean of the grid, the grid's size, the
    folds and rule of ``opts``, and ``at_grid_edge`` (:func:`strategies.stats.tuning.grid_edges`).

    Parameters
    ----------
    summary : pandas.DataFrame
        One row per setting, with the columns of ``params``, ``mean``, ``se`` and
        ``chosen`` (:func:`strategies.stats.tuning.choose`).
    params : sequence of str
        The tuned settings.
    score : str
        The validation score's name (``cv.score``, e.g. ``val_auc``).
    maximize : bool
        Whether higher is better (for the best mean).
    opts : CVOptions
        The cross-validation's options (read: ``folds``, ``rule``).
    no_edge : collection of tuple, optional
        ``(setting, end)`` pairs left out of ``at_grid_edge``: ends that cannot be passed.

    Returns
    -------
    dict
        ``tuned`` (``{setting: value}``), ``at_grid_edge`` (``{setting: end}``) and ``cv``.
    """
    from ..stats.tuning import grid_edges

    row = summary[summary["chosen"]].iloc[0]
    best = summary["mean"].max() if maximize else summary["mean"].min()
    tuned = {p: _plain(row[p]) for p in params}
    edges = grid_edges(summary, params, tuned).items()
    return {
        "tuned": tuned,
        "at_grid_edge": {p: end for p, end in edges if (p, end) not in no_edge},
        "cv": {
            "score": score,
            "mean": _plain(row["mean"]),
            "se": _plain(row["se"]),
            "best_mean": _plain(best),
            "settings": int(len(summary)),
            "folds": opts.folds,
            "rule": opts.rule,
        },
    }


def _plain(value):
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and value != value else value

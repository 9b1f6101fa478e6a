"""The tuning's command-line options, shared by both methods' ``fit``: ``--tune`` and the
cross-validation options, their :class:`~strategies.stats.tuning.CVOptions`, their run-config
keys for ``--engine flower``, and what ``metrics.json`` records of a cross-validation."""

from __future__ import annotations

import argparse


def add_tuning_arguments(parser: argparse.ArgumentParser, tunes: tuple[str, ...]) -> None:
    """``--tune`` and the cross-validation options both ``fit`` commands share."""
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
    """The :class:`~strategies.stats.tuning.CVOptions` of a ``fit`` command's options."""
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
    """The ``tune.*`` run-config keys of a federated tuning (``--engine flower``): ``by``,
    the options of ``opts`` and each grid of ``grids`` (``{"lam-grid": values, ...}``) as
    comma-separated numbers (empty: the default)."""
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
    folds and rule of ``opts``, and ``at_grid_edge`` (:func:`strategies.stats.tuning.grid_edges`;
    less the ``(setting, end)`` pairs of ``no_edge``, ends that cannot be passed)."""
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

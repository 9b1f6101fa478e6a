"""Command line: ``python -m grauc_flower fit|run|study ...``.

``fit``  fits one method on DATA.csv + SITES.csv and writes coefficients, history, metrics,
         the graph, the sites and ``report.html`` (the contract documented in the README).
``report`` rebuilds a fit's ``report.html`` from its files.
``run``  runs the Flower app on Flower's simulation engine (what ``flwr run .`` does), with a
         private SuperLink that is stopped afterwards.
``study`` runs a simulation study from a TOML config (:mod:`grauc_flower.study`).
"""

from __future__ import annotations

import argparse

from strategies.config import GRAUC_METHODS, CheckpointConfig, GrAUCConfig
from strategies.errors import InputError
from strategies.experiments.scale import add_scale_option, format_scale
from strategies.report import add_report_parser, cmd_report
from strategies.runtime.cli import (
    Parser,
    add_flags,
    add_guard_arguments,
    add_run_parser,
    add_settings,
    add_test_arguments,
    cmd_run,
    end_fit,
    run_main,
)
from strategies.runtime.tuning_options import add_tuning_arguments
from strategies.stats.predict import add_predict_parser, cmd_predict, read_grauc_model

from . import tuning
from .sources import DataSpec

D = GrAUCConfig()


def _fit_parser(sub) -> None:
    p = sub.add_parser("fit", help="fit one method on DATA.csv and SITES.csv (or real data)")
    p.add_argument(
        "--source",
        default="csv",
        choices=("csv", "cdc", "crime", "simulated"),
        help="csv: --data and --sites; cdc: the CDC COVID-19 case file as --data (counties "
        "at the shipped centroids); crime: Communities and Crime (the shipped copy, or --data); "
        "simulated: the main job's 20 simulated sites (--data-seed)",
    )
    p.add_argument("--data", default="", help="CSV: site, y (0/1), features (or the CDC file)")
    p.add_argument("--sites", default="", help="CSV: site, lat, lon (source csv)")
    p.add_argument("--out", required=True, help="output directory")
    add_flags(p, DataSpec)  # --data-seed and the real sources' options
    p.add_argument(
        "--method", default="grauc", choices=GRAUC_METHODS, help="the method (default: grauc)"
    )
    p.add_argument(
        "--engine",
        default="inprocess",
        choices=("inprocess", "flower"),
        help="inprocess: Flower's server in this process; flower: flwr run (default: inprocess)",
    )
    add_test_arguments(p)
    add_guard_arguments(p)
    p.add_argument(
        "--calibration",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="grauc, mean-fusion without --tune: calibrate the risks from a cross-validation "
        "of the fit's own setting (--folds), run beside the fit; predict --probability reads "
        "it (default: on)",
    )
    add_settings(p, GrAUCConfig)
    add_tuning_arguments(p, ("cv",))
    p.add_argument(
        "--lam-grid",
        default="",
        metavar="LIST",
        help=f"cv: lam values (default: {tuning.N_LAM} log-spaced from lam_max down to "
        f"lam_max * {tuning.LAM_RATIO:g}, and 0)",
    )
    for name, default in (
        ("w-dist", tuning.W_DIST_GRID),
        ("ridge", tuning.RIDGE_GRID),
        ("rounds", tuning.ROUNDS_GRID),
    ):
        p.add_argument(
            f"--{name}-grid",
            default="",
            metavar="LIST",
            help=f"cv: {name.replace('rounds', 'fedavg-rounds')} values (default: "
            + ",".join(f"{v:g}" for v in default)
            + ")",
        )
    p.add_argument(
        "--size-power-grid",
        default="",
        metavar="LIST",
        help="cv: size-power values of grauc and mean-fusion, each in [0, 1] (default: 0,1 "
        "when the sites differ in size, else the --size-power value)",
    )
    add_flags(p, CheckpointConfig)  # --checkpoint, --checkpoint-every, --resume
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="Flower's own log (a line per message and round; all of it with --engine flower)",
    )


def _bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="rounds, time per round, gradient, graph, server step")
    p.add_argument("--out", default="", help="directory for bench.csv")
    p.add_argument("--quick", action="store_true", help="smaller sizes and round limits")
    p.add_argument("--no-flower", action="store_true", help="skip the flwr run timing")
    p.add_argument(
        "--criteria",
        action="store_true",
        help="instead: the cross-validation criteria compared by the tuned fits' test AUC",
    )
    p.add_argument(
        "--seeds", type=int, default=3, help="--criteria, --new-site, --calibration: data splits"
    )
    p.add_argument(
        "--family",
        action="store_true",
        help="instead: rounds over the problem family (median, 90th percentile, worst)",
    )
    p.add_argument(
        "--new-site",
        action="store_true",
        help="instead: sites left out of the federation in turn, scored by predict's "
        "new-site rules and by FedAvg's global model (test AUC)",
    )
    p.add_argument(
        "--calibration",
        action="store_true",
        help="instead: the calibrated risks of the tuned fits on test rows (Brier, ECE, "
        "calibration slope) by each site's own, the pooled and the shrunk calibration",
    )
    add_scale_option(p)
    p.add_argument(
        "--max-rows",
        type=int,
        default=1_000_000,
        metavar="N",
        help="--scale: the largest site measured (rows; default 1000000)",
    )


def cmd_bench(a) -> int:
    from . import bench

    if a.scale:
        if a.max_rows < 1000:
            raise InputError(f"--max-rows: must be at least 1000, got {a.max_rows}")
        from . import scale

        print(format_scale(scale.scale_run(a.out, quick=a.quick, max_rows=a.max_rows)))
        return 0
    if a.criteria:
        df = bench.criteria_run(a.out, a.seeds, quick=a.quick)
    elif a.family:
        from . import family

        df = family.family_run(a.out, quick=a.quick)
    elif a.new_site:
        df = bench.new_site_run(a.out, a.seeds)
    elif a.calibration:
        df = bench.calibration_run(a.out, a.seeds)
    else:
        df = bench.run(a.out, quick=a.quick, flower=not a.no_flower)
    print(bench.format_table(df))
    return 0


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m grauc_flower",
        description="GrAUC-PFL on Flower: each institution's own risk score, fused along "
        "a geographic graph; its comparators; studies and benchmarks.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    _fit_parser(sub)
    add_run_parser(sub, GRAUC_METHODS, "grauc,fedavg,individual", "data.num-sites", 20)
    _bench_parser(sub)
    add_predict_parser(sub, "risk scores", new_sites=True, probability=True)
    add_report_parser(sub)
    from .study import add_parser as _study_parser

    _study_parser(sub)
    return parser


def cmd_fit(a) -> int:
    """``fit``: the flow (:func:`grauc_flower.api.fit_to_dir`, which the API runs too),
    then its one line and warnings."""
    from .api import fit_to_dir

    metrics = fit_to_dir(a)
    what = "test" if metrics["split"]["n_test"] else "in-sample"
    scores = f"mean {what} AUC {metrics['mean_auc']:.4f}"
    end_fit(a.method, metrics, tuning.used_levels(a.method), scores, a.out)
    return 0


def dispatch(args) -> int:
    if args.command == "fit":
        return cmd_fit(args)
    if args.command == "bench":
        return cmd_bench(args)
    if args.command == "predict":
        from .federation import new_site_model

        return cmd_predict(args, read_grauc_model, ignore_outputs=False, extend=new_site_model)
    if args.command == "report":
        from .fitreport import fit_report

        return cmd_report(args, fit_report)
    if args.command == "study":
        from .study import cmd_study, load

        study, st = load(args.config)
        if st.coverage is not None:
            from .coverage import run as run_coverage

            return run_coverage(args, study, st)
        return cmd_study(args, study, st)
    return cmd_run(args, "grauc", "Per-institution")


def main(argv=None) -> int:
    return run_main(build_parser(), dispatch, argv)

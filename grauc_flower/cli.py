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
import json
import os
import sys
import time
from dataclasses import replace

from strategies.config import (
    GRAUC_FUSED_METHODS,
    GRAUC_METHODS,
    CheckpointConfig,
    GrAUCConfig,
    to_run_config,
)
from strategies.errors import InputError
from strategies.experiments.scale import add_scale_option, format_scale
from strategies.predict import add_predict_parser, cmd_predict, read_grauc_model
from strategies.report import add_report_parser, cmd_report
from strategies.runtime.cli import (
    Parser,
    RoundProgress,
    add_flags,
    add_guard_arguments,
    add_run_parser,
    add_settings,
    add_test_arguments,
    add_tuning_arguments,
    atomic_output_dir,
    check_test_arguments,
    cmd_run,
    cv_options,
    end_fit,
    finish_outputs,
    from_flags,
    guards_from_args,
    guards_record,
    guards_run_config,
    line_to_stderr,
    moments_asked,
    note_default_floors,
    project_dir,
    run_main,
    settings_from_args,
    tune_run_config,
    tuning_metrics,
)
from strategies.tuning import size_powers

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
        print(format_scale(bench.scale_run(a.out, quick=a.quick, max_rows=a.max_rows)))
        return 0
    if a.criteria:
        df = bench.criteria_run(a.out, a.seeds, quick=a.quick)
    elif a.family:
        df = bench.family_run(a.out, quick=a.quick)
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


def config_from_args(a) -> GrAUCConfig:
    return settings_from_args(GrAUCConfig, a)


def _data_spec(a):
    """The fit command's data as a :class:`~grauc_flower.sources.DataSpec` (what the Flower
    engine's ClientApps load); checks which files each source needs."""
    if a.source == "csv":
        for key in ("data", "sites"):
            if not getattr(a, key):
                raise InputError(f"{key}: --source csv needs --data and --sites")
    elif a.test_data or a.holdout:
        key = "test-data" if a.test_data else "holdout"
        raise InputError(
            f"{key}: --source {a.source} has its own test set "
            + ("(the simulation's test rows)" if a.source == "simulated" else "(--train-fraction)")
        )
    if a.source == "simulated" and (a.data or a.sites):
        raise InputError("data: --source simulated takes no --data or --sites")
    check_test_arguments(a)
    if a.source == "cdc" and not a.data:
        raise InputError("data: --source cdc needs --data (the CDC COVID-19 case file)")
    if a.source in ("cdc", "crime") and a.sites:
        raise InputError(f"sites: --source {a.source} places sites at the shipped centroids")
    return from_flags(
        DataSpec,
        a,
        source=a.source,
        data_path=os.path.abspath(a.data) if a.data else "",
        sites_path=os.path.abspath(a.sites) if a.sites else "",
        allow_missing_class=a.missing_class == "borrow",
        test_path=os.path.abspath(a.test_data) if a.test_data else "",
        holdout=a.holdout,
    )


def _checkpoint(a) -> CheckpointConfig:
    """The checkpoint options, their paths made absolute."""
    return from_flags(
        CheckpointConfig,
        a,
        path=os.path.abspath(a.checkpoint) if a.checkpoint else "",
        resume=os.path.abspath(a.resume) if a.resume else "",
    )


def _grid(a) -> tuning.Grid:
    """The cross-validation grid of the options (each value checked)."""
    from strategies.tuning import parse_grid

    def given(name: str, default, minimum: float = 0.0):
        text = getattr(a, name.replace("-", "_") + "_grid")
        return parse_grid(text, f"{name}-grid", minimum) if text else default

    rounds = given("rounds", tuning.ROUNDS_GRID, 1)
    if any(r != int(r) for r in rounds):
        raise InputError(f"rounds-grid: values must be integers >= 1, got {a.rounds_grid!r}")
    return tuning.Grid(
        lam=given("lam", ()),
        w_dist=given("w-dist", tuning.W_DIST_GRID),
        ridge=given("ridge", tuning.RIDGE_GRID),
        fedavg_rounds=tuple(int(r) for r in rounds),
        knob=a.knob_grid or None,
        size_power=a.size_power_grid or (),  # checked once the sites are known
    )


def _check_tuning(a) -> None:
    from strategies.tuning import KNOBS

    grids = (
        "lam_grid",
        "w_dist_grid",
        "ridge_grid",
        "rounds_grid",
        "knob_grid",
        "size_power_grid",
    )
    if not a.tune:
        for g in grids:
            if getattr(a, g):
                raise InputError(f"{g.replace('_', '-')}: grids need --tune cv")
        return
    if a.method not in tuning.PARAMS:
        raise InputError(f"tune: cv is available for {', '.join(tuning.PARAMS)}, not {a.method}")
    if (a.cv_criterion != "folds" or a.cv_repeats > 1) and a.method not in GRAUC_FUSED_METHODS:
        key = "cv-criterion" if a.cv_criterion != "folds" else "cv-repeats"
        raise InputError(f"{key}: for the fused methods' federated tuning ({a.method} is not one)")
    if a.knob_grid and a.method not in KNOBS:
        raise InputError(f"knob-grid: {a.method} has no setting to tune besides its levels")
    if a.size_power_grid and a.method not in GRAUC_FUSED_METHODS:
        raise InputError(
            f"size-power-grid: {a.method} does not weight its sites (a fused method does)"
        )
    knob = KNOBS[a.method].name if a.method in KNOBS else None
    for name in tuning.PARAMS[a.method]:
        if getattr(a, name, None) is not None:
            key = name.replace("_", "-")
            grid = {"fedavg_rounds": "rounds", knob: "knob"}.get(name, key)
            raise InputError(f"{key}: chosen by --tune cv; give --{grid}-grid to set its values")


def _load(a, spec):
    """The sites (with their test rows, if any) and the feature names."""
    from .sources import load_real_spec, load_sites

    if a.source in ("csv", "simulated"):
        sites, features = load_sites(spec)
        if not sites:
            raise InputError("data: no site of the data is in the sites file")
        return list(sites), features
    sites, table = load_real_spec(spec)
    if not a.quiet:
        for note in table.notes:
            sys.stderr.write(f"note: {note}\n")
        n_train = sum(len(s.y_train) for s in sites)
        n_test = sum(len(s.y_test) for s in sites)
        sys.stderr.write(
            f"{a.source}: {len(sites)} sites, {len(table.features)} features, "
            f"{n_train} training and {n_test} test rows\n"
        )
    return list(sites), table.features


def _calibration_only(tmp: str, run: dict, opts) -> dict:
    """A plain fit's outputs after the cross-validation that calibrated it: ``metrics.json``
    without a choice (``tuned``, ``at_grid_edge``, ``cv``), with the calibration's folds and
    rounds, and no ``cv.csv`` (one setting, nothing chosen)."""
    for key in ("tuned", "at_grid_edge"):
        run.pop(key, None)
    cv = run.pop("cv", {})
    run["calibration"] = {
        **run.get("calibration", {}),
        "from": "each site's pooled out-of-fold scores at the fit's own setting",
        "folds": opts.folds,
        "cv_auc": cv.get("mean"),
    }
    run["tuning"] = {**run.get("tuning", {}), "purpose": "calibration"}
    with open(os.path.join(tmp, "metrics.json"), "w") as fh:
        json.dump(run, fh, indent=2)
    os.remove(os.path.join(tmp, "cv.csv"))
    return run


def cmd_fit(a) -> int:
    from strategies.runtime.launch import stream_echo

    from . import federation as fed
    from .figures import fit_report

    cfg = config_from_args(a)
    _check_tuning(a)
    grid = _grid(a) if a.tune else None
    spec = _data_spec(a)
    guards = guards_from_args(a)
    sites, features = _load(a, spec)
    counts = [(s.site, len(s.y_train), {"1": s.n_pos, "0": s.n_neg}, s.n_features) for s in sites]
    refused = note_default_floors(counts, moments_asked(cfg, "a Hessian or covariance"))
    if grid is not None:
        sizes = [len(s.y_train) for s in sites]
        powers = size_powers(sizes, cfg, a.size_power_grid or None)
        grid = replace(grid, size_power=powers)
    # a fused method's plain fit is calibrated too: the cross-validation of its own setting,
    # batched with the fit (docs/methods.md 3.14); its result is the plain fit
    calibrate = (
        not a.tune and a.method in GRAUC_FUSED_METHODS and a.calibration
        and not (a.checkpoint or a.resume)
    )  # fmt: skip
    if calibrate and max(min(s.n_pos, s.n_neg) for s in sites) < a.folds:
        calibrate = False  # no site fills the folds: a plain fit, without risks
        sys.stderr.write(
            f"note: no calibration (no site has {a.folds} training rows of each class for "
            "the folds; give fewer --folds)\n"
        )
    if calibrate:
        grid = tuning.Grid(lam=(cfg.lam,), w_dist=(cfg.w_dist,), ridge=(cfg.ridge,),
                           size_power=(cfg.size_power,))  # fmt: skip
    t0 = time.perf_counter()
    extra: dict = {}
    with atomic_output_dir(a.out) as tmp:
        # a fused method is tuned inside the federation (one batched run, either engine);
        # the comparators by the in-process cross-validation, then refitted
        federated = (a.tune == "cv" or calibrate) and a.method in GRAUC_FUSED_METHODS
        opts = cv_options(a, a.data_seed) if a.tune == "cv" or calibrate else None
        if a.tune == "cv" and not federated:
            cfg, table, summary = tuning.tune(sites, cfg, a.method, grid, opts, widen=True)
            table.to_csv(os.path.join(tmp, "cv.csv"), index=False)
            extra = tuning_metrics(summary, tuning.PARAMS[a.method], "val_auc", True, opts)
            if table.attrs.get("extended"):
                extra["cv"]["extended"] = table.attrs["extended"]
            if not a.quiet:
                chosen = ", ".join(f"{k} = {v:g}" for k, v in extra["tuned"].items())
                sys.stderr.write(
                    f"cv: chose {chosen} (mean validation AUC {extra['cv']['mean']:.4f} over "
                    f"{opts.folds} folds); refitting on all training data\n"
                )
        if opts is not None and (opts.criterion != "folds" or opts.repeats > 1) and not federated:
            key = "cv-criterion" if opts.criterion != "folds" else "cv-repeats"
            raise InputError(
                f"{key}: for the fused methods' federated tuning ({a.method} is not one)"
            )
        if a.engine == "inprocess":
            limit = fed.round_limit(a.method, cfg)
            progress = RoundProgress(a.method, limit, a.quiet)
            if federated:
                progress = None if a.quiet else line_to_stderr
            ckpt = _checkpoint(a).strategy_kwargs()
            if ckpt["resume"] and not os.path.isfile(ckpt["resume"]):
                raise InputError(f"resume: file not found: {a.resume}")
            if federated and (ckpt["checkpoint"] or ckpt["resume"]):
                raise InputError("checkpoint: not with --tune cv (the tuning runs many fits)")
            if federated:
                res = tuning.run_tuned_inprocess(
                    cfg, sites, a.method, (opts, grid), progress, guards
                )
            else:
                res = fed.run_methods_inprocess(
                    cfg, sites, [a.method], progress=progress, checkpoint=ckpt, guards=guards
                )[a.method]
            fed.write_result(tmp, res, features, cfg)
        else:
            from strategies.runtime.simulation import flwr_run

            rc = {
                **to_run_config(cfg, "grauc"),
                "task": "grauc",
                "method": a.method,
                "out-dir": tmp,
                **spec.to_run_config(),
                "data.num-sites": len(sites),
                **_checkpoint(a).to_run_config(),
                **guards_run_config(guards),
            }
            if federated:
                grids = {"lam-grid": grid.lam, "w-dist-grid": grid.w_dist}
                grids.update({"ridge-grid": grid.ridge, "size-power-grid": grid.size_power})
                rc.update(tune_run_config("cv", opts, grids))
            flwr_run(project_dir(), rc, len(sites), echo=stream_echo(a.quiet, a.verbose))
            os.remove(os.path.join(tmp, "auc.csv"))
        with open(os.path.join(tmp, "metrics.json")) as fh:
            run = json.load(fh)
        if calibrate:  # the one setting's cross-validation gave the calibration, no choice
            run = _calibration_only(tmp, run, opts)
        elif federated and not a.quiet:
            chosen = ", ".join(f"{k} = {v:g}" for k, v in run["tuned"].items())
            t = run["tuning"]
            sys.stderr.write(
                f"cv: chose {chosen} (criterion {opts.criterion}, {run['cv']['score']} "
                f"{run['cv']['mean']:.4f}); tuning and refit took {t['rounds']} rounds "
                f"for {t['fits']} fits\n"
            )
        updates = dict(
            engine=a.engine,
            features=list(features),
            n_sites=len(sites),
            seconds=round(time.perf_counter() - t0, 3),
            source=a.source,
            data=os.path.abspath(a.data) if a.data else "(built in)",
            sites=os.path.abspath(a.sites) if a.sites else "(built in)",
            guards=guards_record(guards, refused),
            **extra,
        )
        n_test = sum(len(s.y_test) for s in sites)
        split = {
            "test": "none"
            if not n_test
            else ("file" if a.test_data else "holdout" if a.holdout else "source"),
            "holdout": a.holdout or None,
            "train-fraction": spec.train_fraction if a.source in ("cdc", "crime") else None,
            "data-seed": spec.data_seed,
            "n_train": sum(len(s.y_train) for s in sites),
            "n_test": n_test,
        }
        metrics = finish_outputs(
            tmp,
            updates,
            split,
            lambda m: fed.write_test_table(tmp, m, [s.site for s in sites]),
            lambda d: fed.sites_table(sites).to_csv(os.path.join(d, "sites.csv"), index=False),
            fit_report,
        )
    what = "test" if n_test else "in-sample"
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
        from .figures import fit_report

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

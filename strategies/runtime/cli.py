"""Command-line plumbing shared by both methods' commands: one-line errors, atomic outputs."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import shutil
import sys
import tempfile
import time

from ..errors import InputError, plain


class Parser(argparse.ArgumentParser):
    """``argparse`` whose errors are one line (``error: ...``) with exit code 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(2)


def add_settings(parser: argparse.ArgumentParser, cls) -> None:
    """One option per field of the settings dataclass ``cls`` (``--name-with-dashes``),
    with its help, its choices and its default shown; an option not given keeps the
    dataclass default (read back by :func:`settings_from_args`).  The class's own fields
    come first, the ones it inherits (Flower's strategies' settings) after them.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The parser the options are added to.
    cls : type
        A settings dataclass whose fields all have defaults; each field's ``help``,
        ``choices`` and ``metavar`` metadata go to its option.
    """
    defaults = cls()
    own = cls.__dict__.get("__annotations__", {})
    ordered = sorted(dataclasses.fields(cls), key=lambda f: f.name not in own)
    for f in ordered:
        default = getattr(defaults, f.name)
        shown = f"{default:g}" if isinstance(default, float) else str(default).lower()
        parser.add_argument(
            "--" + f.name.replace("_", "-"), **_option(f, f.name, None, f" (default: {shown})")
        )


def _option(f, dest: str, default, shown: str) -> dict:
    """``add_argument``'s keywords for settings field ``f``: its type (a bool a
    ``--x/--no-x`` pair), choices or placeholder (declared, else the name), and its help
    followed by ``shown`` (the default as the help shows it)."""
    kwargs = {"dest": dest, "default": default, "help": f.metadata.get("help", "") + shown}
    if f.type == "bool":
        kwargs["action"] = argparse.BooleanOptionalAction
        return kwargs
    kwargs["type"] = {"float": float, "int": int, "str": str}[f.type]
    if f.metadata.get("choices"):
        kwargs["choices"] = f.metadata["choices"]
    else:
        kwargs["metavar"] = f.metadata.get("metavar") or dest.upper()
    return kwargs


class RoundProgress:
    """Progress lines on stderr: round, objective, residuals, elapsed, at most every 2 s."""

    def __init__(self, method: str, max_rounds: int, quiet: bool) -> None:
        self.method, self.max_rounds, self.quiet = method, max_rounds, quiet
        self.last = 0.0

    def __call__(self, rnd, objective, res, elapsed) -> None:
        if self.quiet or time.perf_counter() - self.last < 2.0:
            return
        self.last = time.perf_counter()
        resid = "" if res is None else f"  {res.describe()}"
        sys.stderr.write(
            f"{self.method}: round {rnd}/{self.max_rounds}  objective "
            f"{objective:.8g}{resid}  {elapsed:.1f} s\n"
        )


def line_to_stderr(line: str) -> None:
    """A progress line (a federated tuning's) on stderr."""
    sys.stderr.write(line + "\n")


def add_flags(parser: argparse.ArgumentParser, cls) -> None:
    """One option per field of ``cls`` that declares a ``flag`` (``--<flag>``), with its
    help, choices and the declared default.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The parser the options are added to.
    cls : type
        A dataclass (a data spec, the checkpoint options) of whose fields only some are
        ``fit`` options: those declaring a ``flag`` (:func:`strategies.config.setting`).
    """
    defaults = cls()
    for f in dataclasses.fields(cls):
        flag = f.metadata.get("flag")
        if not flag:
            continue
        default = getattr(defaults, f.name)
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        # an empty default is explained by the help itself ("empty: ...")
        shown = f" (default: {shown})" if shown else ""
        parser.add_argument("--" + flag, **_option(f, flag.replace("-", "_"), default, shown))


def from_flags(cls, args: argparse.Namespace, **fixed):
    """``cls`` from its :func:`add_flags` options and the ``fixed`` fields; a value out of
    range is an error naming the option (``train-fraction: ...``), not the run-config key.

    Parameters
    ----------
    cls : type
        The dataclass whose flagged fields :func:`add_flags` made options.
    args : argparse.Namespace
        The parsed options (each flag's dashes as underscores).
    **fixed
        Fields set directly; they override the options' values.

    Returns
    -------
    object
        An instance of ``cls``.
    """
    from ..config import config_key

    flagged = [f for f in dataclasses.fields(cls) if f.metadata.get("flag")]
    try:
        given = {f.name: getattr(args, f.metadata["flag"].replace("-", "_")) for f in flagged}
        return cls(**{**given, **fixed})
    except InputError as exc:
        text = str(exc)
        for f in flagged:
            key = getattr(cls, "key_prefix", "") + config_key(f)
            if text.startswith(key + ":"):
                raise InputError(f.metadata["flag"] + text[len(key) :]) from None
        raise


def settings_from_args(cls, args: argparse.Namespace):
    """``cls`` with the options given on the command line (the rest: its defaults).

    Parameters
    ----------
    cls : type
        The settings dataclass whose fields :func:`add_settings` made options.
    args : argparse.Namespace
        The parsed options; a field whose attribute is missing or ``None`` (not given)
        keeps its default.

    Returns
    -------
    object
        An instance of ``cls``.
    """
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if getattr(args, f.name, None) is not None
    }
    return cls(**given)


def add_test_arguments(parser: argparse.ArgumentParser) -> None:
    """``--test-data`` and ``--holdout``: a test set for the fitted model, both methods."""
    parser.add_argument(
        "--test-data",
        default="",
        metavar="FILE",
        help="a CSV with the data's columns: each site's model is scored on its own rows",
    )
    parser.add_argument(
        "--holdout",
        type=float,
        default=None,
        metavar="F",
        help="hold out this share of each site's rows for testing (seeded; default: none)",
    )


def add_guard_arguments(parser: argparse.ArgumentParser) -> None:
    """The sites' disclosure floors as ``fit`` options, named as in a SuperNode's node
    config (:mod:`strategies.client.guards`).  In ``fit`` every row is on this machine, so a floor
    applies only when given; the output names the sites a federation at the default floors
    would refuse."""
    for flag, kind, what in (
        ("min-rows", int, "rows a site needs to take part"),
        ("min-class-rows", int, "rows of each class a site has it needs to take part"),
        ("min-rows-per-feature", float, "rows per feature a site needs to send second moments"),
    ):
        parser.add_argument(
            "--" + flag, type=kind, default=None, metavar="N",
            help=f"{what} (default here: no floor; a federation's sites: 3)",
        )  # fmt: skip


def guards_from_args(args: argparse.Namespace):
    """The floors ``fit`` applies: the ones given (>= 0, else an error naming the option),
    none for the rest (:meth:`strategies.client.guards.Guards.off`)."""
    from ..client.guards import Guards

    given = {}
    for name in ("min_rows", "min_class_rows", "min_rows_per_feature"):
        value = getattr(args, name, None)
        if value is None:
            continue
        if not value >= 0:  # also nan
            raise InputError(f"{name.replace('_', '-')}: must be >= 0, got {plain(value)}")
        given[name] = value
    return dataclasses.replace(Guards.off(), **given, origin="fit")


def guards_run_config(guards) -> dict:
    """The ``guards.*`` run-config keys of ``guards`` (``fit --engine flower``: the floors
    of the simulated sites)."""
    from ..config import GuardsConfig

    return GuardsConfig(
        guards.min_rows, guards.min_class_rows, guards.min_rows_per_feature
    ).to_run_config()


def moments_asked(cfg, what: str) -> str:
    """What a fit at ``cfg`` asks each site second moments for, or empty: exact curvature
    or oracle inference.

    Parameters
    ----------
    cfg : GrAUCConfig or RowFedConfig
        The method's settings (read: ``curvature``, ``inference``).
    what : str
        The method's name for the second moments (e.g. ``"X'X"``).

    Returns
    -------
    str
        ``what`` when ``cfg.curvature`` is ``"exact"`` or ``cfg.inference`` is
        ``"oracle"``, else empty.
    """
    return what if cfg.curvature == "exact" or cfg.inference == "oracle" else ""


def guards_record(guards, refused: dict) -> dict:
    """``metrics.json``'s ``guards``: the floors applied and what the default floors of a
    federation would have refused.

    Parameters
    ----------
    guards : Guards
        The floors the fit applied (:func:`guards_from_args`).
    refused : dict
        ``{site: [refusal, ...]}`` at the default floors (:func:`note_default_floors`).

    Returns
    -------
    dict
        ``{"applied": guards.floors(), "refused_at_default_floors": refused}``.
    """
    return {"applied": guards.floors(), "refused_at_default_floors": refused}


def note_default_floors(sites: list[tuple], moments: str, stream=None) -> dict[str, list[str]]:
    """What a federation's sites at the default floors (:class:`strategies.client.guards.Guards`)
    would refuse: one note line naming them on ``stream``, and ``{site: [refusal, ...]}``
    for ``metrics.json``.

    Parameters
    ----------
    sites : list of tuple
        One ``(site, rows, {class: rows} or None, features)`` per site.
    moments : str
        What the run asks second moments for (:func:`moments_asked`), or empty.
    stream : file-like, optional
        Where the note goes (default: stderr); no note when no site would refuse.

    Returns
    -------
    dict of str to list of str
        Each refusing site's refusals (:meth:`strategies.client.guards.Guards.refusals`),
        by site; empty when none would refuse.
    """
    from ..client.guards import Guards

    floors = Guards()
    out = {}
    for site, n, classes, p in sites:
        found = floors.refusals(n, classes, p, moments)
        if found:
            out[str(site)] = found
    if out:
        named = "; ".join(f"{s} ({', '.join(r)})" for s, r in list(out.items())[:5])
        more = f"; and {len(out) - 5} more (metrics.json: guards)" if len(out) > 5 else ""
        print(
            f"note: across hospitals at the default floors, {len(out)} site(s) would refuse: "
            f"{named}{more}. Here every row is on this machine and no floor applies unless "
            "given (--min-rows, --min-class-rows, --min-rows-per-feature)",
            file=stream or sys.stderr,
        )
    return out


def check_test_arguments(args: argparse.Namespace) -> None:
    """``--test-data`` and ``--holdout``: one of them, a share in (0, 1) (``--holdout 0``
    is refused: no test set is the flag left out), a file there.  ``args.holdout`` is then a
    number (0: none)."""
    if args.holdout is not None and not 0 < args.holdout < 1:
        raise InputError(
            f"holdout: must be in (0, 1), got {plain(args.holdout)}"
            + ("; leave --holdout out for no test set" if args.holdout == 0 else "")
        )
    args.holdout = args.holdout or 0.0
    if args.test_data and args.holdout:
        raise InputError("holdout: give --test-data or --holdout, not both")
    from ..datasets.tables import in_memory

    if args.test_data and not (in_memory(args.test_data) or os.path.isfile(args.test_data)):
        raise InputError(f"test-data: file not found: {args.test_data}")


def fail(message: str) -> int:
    sys.stderr.write(f"error: {message}\n")
    return 2


def run_main(parser: argparse.ArgumentParser, dispatch, argv=None) -> int:
    """Both methods' ``main``: parse (a usage error is argparse's one line and exit 2,
    ``--help`` exits 0, either returned, not raised), keep Flower's own log to warnings
    unless the command was given ``--verbose``, run ``dispatch(args)``, and turn whatever
    it raises into one ``error:`` line and exit 2: a bad setting or file as it was worded,
    an operating-system error with its file, a failed Flower run by its first line, and
    anything else as ``unexpected <type>``, never a traceback.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser (:class:`Parser`).
    dispatch : callable
        ``dispatch(args)`` runs the parsed command and returns its exit status.
    argv : list of str, optional
        The arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status: ``dispatch``'s, argparse's, or 2 after an ``error:`` line.
    """
    from strategies import quiet_flower

    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if not getattr(args, "verbose", False):
        quiet_flower()
    try:
        return dispatch(args)
    except (InputError, ValueError) as exc:
        return fail(" ".join(str(exc).split()) or type(exc).__name__)
    except OSError as exc:
        return fail(f"{exc.strerror or type(exc).__name__}: {exc.filename or exc}")
    except KeyboardInterrupt:
        return fail("interrupted")
    except RuntimeError as exc:  # e.g. the Flower run failed: its one line
        return fail(str(exc).splitlines()[0] if str(exc) else "RuntimeError")
    except Exception as exc:  # noqa: BLE001 - say what broke, in one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        return fail(f"unexpected {type(exc).__name__}: {first}")


def check_output_dir(out: str) -> str:
    """``out`` as an absolute path, after checking it can be an output directory: not empty,
    not an existing file, its parent an existing directory."""
    if not str(out).strip():
        raise InputError("out: must be a directory path, got ''")
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"out: {out} exists and is not a directory")
    if not os.path.isdir(parent):
        raise InputError(f"out: parent directory does not exist: {parent}")
    return out


#: The list of files the last command wrote into an output directory (one per line).
MANIFEST = ".outputs"


def _earlier_outputs(out: str) -> list[str]:
    """The files an earlier command wrote into ``out`` (relative paths inside it only)."""
    try:
        with open(os.path.join(out, MANIFEST)) as fh:
            names = [ln.strip() for ln in fh if ln.strip()]
    except OSError:
        return []
    return [n for n in names if not os.path.isabs(n) and not os.path.normpath(n).startswith("..")]


@contextlib.contextmanager
def atomic_output_dir(out: str):
    """Yield a temporary directory next to ``out``; on success its files are moved into
    ``out`` (created if needed) and replace an earlier command's result there: files that
    result wrote and this one does not are removed (other files are never touched).  On any
    error nothing is written to ``out``."""
    out = check_output_dir(out)
    try:
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(out))
    except OSError as exc:
        raise InputError(f"out: cannot write next to {out}: {exc.strerror}") from None
    try:
        yield tmp
        os.makedirs(out, exist_ok=True)
        written = []
        for root, _, files in os.walk(tmp):
            rel = os.path.relpath(root, tmp)
            target = os.path.join(out, rel) if rel != "." else out
            os.makedirs(target, exist_ok=True)
            for f in files:
                os.replace(os.path.join(root, f), os.path.join(target, f))
                written.append(os.path.normpath(os.path.join(rel, f)))
        for stale in sorted(set(_earlier_outputs(out)) - set(written)):
            path = os.path.join(out, stale)
            if os.path.isfile(path):
                os.remove(path)
        with open(os.path.join(out, MANIFEST), "w") as fh:
            fh.write("".join(f"{name}\n" for name in sorted(written)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def project_dir() -> str:
    """The Flower app directory (the checkout holding ``pyproject.toml``)."""
    here = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    if not os.path.isfile(os.path.join(here, "pyproject.toml")):
        raise InputError("engine: the flower engine needs the project checkout (pip install -e .)")
    return here


def warn_grid_edge(metrics: dict, stream=None) -> None:
    """A warning line per tuned setting that sits at an end of its grid (``metrics.json:
    at_grid_edge``): the best value may lie beyond it.

    Parameters
    ----------
    metrics : dict
        ``metrics.json``'s content (read: ``at_grid_edge``, and the tuned values in
        ``tuned`` or ``tuning.selected``).
    stream : file-like, optional
        Where the warnings go (default: stderr).
    """
    stream = stream if stream is not None else sys.stderr
    tuned = metrics.get("tuned") or (metrics.get("tuning") or {}).get("selected") or {}
    for name, end in (metrics.get("at_grid_edge") or {}).items():
        flag = name.replace("_", "-") + "-grid"
        stream.write(
            f"warning: the tuned {name} = {float(tuned[name]):g} is the {end} value of its "
            f"grid; the best may lie beyond it: widen --{flag}\n"
        )


def warn_no_intervals(metrics: dict) -> None:
    """With ``--inference oracle``: one stderr line when the fit gave no intervals, and why
    (either method; the reason is also in ``metrics.json``)."""
    info = metrics.get("inference") or {}
    if "error" in info:
        print(f"warning: no confidence intervals: {info['error']}", file=sys.stderr)


def finish_outputs(tmp: str, updates: dict, split: dict, write_test, own_files, report) -> dict:
    """The last steps of both ``fit`` commands, in the fit's output directory ``tmp``:
    ``metrics.json`` as the run wrote it, with ``updates`` and the ``split``; with test rows
    ``test.csv``; the method's own files; then ``report.html``.

    Parameters
    ----------
    tmp : str
        The fit's output directory, holding the run's ``metrics.json``.
    updates : dict
        Entries added to ``metrics.json`` (over the run's own).
    split : dict
        ``metrics.json``'s ``split``; its ``n_test`` says whether there are test rows.
    write_test : callable
        ``write_test(metrics)`` writes ``test.csv`` and returns ``metrics.json``'s ``test``.
    own_files : callable
        ``own_files(tmp)`` writes the method's own files.
    report : callable
        ``report(tmp)`` writes ``report.html``.

    Returns
    -------
    dict
        The metrics, as written to ``metrics.json``.
    """
    import json

    path = os.path.join(tmp, "metrics.json")
    with open(path) as fh:
        metrics = json.load(fh)
    metrics.update(updates)
    metrics["split"] = split
    if split["n_test"]:
        metrics["test"] = write_test(metrics)
    with open(path, "w") as fh:
        json.dump(metrics, fh, indent=2)
    own_files(tmp)
    report(tmp)
    return metrics


def end_fit(method: str, metrics: dict, levels, scores: str, out: str) -> None:
    """What both ``fit`` commands print at the end: :func:`fit_summary`'s line, and the
    warnings of a fit without its intervals, of a tuned level at its grid's edge and of a
    fit that stopped at its round limit (a FedAvg-family method runs a fixed count).

    Parameters
    ----------
    method : str
        The method fitted.
    metrics : dict
        ``metrics.json``'s content.
    levels : sequence of str
        The settings the method reads (:func:`fit_summary`).
    scores : str
        The line's scores (:func:`fit_summary`).
    out : str
        The output directory the line names.
    """
    from ..config import FEDAVG_FAMILY

    print(fit_summary(method, metrics, levels, scores, out))
    warn_no_intervals(metrics)
    warn_grid_edge(metrics)
    if not metrics.get("converged", True) and method not in FEDAVG_FAMILY:
        print("warning: stopped at the round limit; see history.csv", file=sys.stderr)


def fit_summary(method: str, metrics: dict, levels, scores: str, out: str) -> str:
    """The one line a fit prints, both methods: how it ended (a FedAvg-family method runs
    a fixed count of rounds; the others converge or stop at the round limit), its objective
    when it has one, the levels it used (a site weighting of 0 left out), ``scores`` and
    where it wrote.

    Parameters
    ----------
    method : str
        The method fitted.
    metrics : dict
        ``metrics.json``'s content (read: ``rounds``, ``converged``, ``objective``,
        ``config``).
    levels : sequence of str
        The names of the settings the method reads (each method's ``used_levels``); their
        values come from ``metrics["config"]``.
    scores : str
        The scores to show (e.g. ``mean test AUC 0.9185``); empty: none.
    out : str
        The output directory (``wrote <out>``).

    Returns
    -------
    str
        The line, its parts joined by ``"; "``.
    """
    from ..config import FEDAVG_FAMILY

    rounds = int(metrics["rounds"])
    n = f"{rounds} round{'' if rounds == 1 else 's'}"
    if method in FEDAVG_FAMILY:
        status = f"ran {n} (a fixed count)"
    elif metrics.get("converged"):
        status = f"converged after {n}"
    else:
        status = f"stopped at the round limit after {n}"
    parts = [f"{method}: {status}"]
    if metrics.get("objective") is not None:
        parts.append(f"objective {float(metrics['objective']):.6g}")
    config = metrics.get("config", {})
    shown = {k: config[k.replace("_", "-")] for k in levels}
    shown = {k: v for k, v in shown.items() if not (k == "size_power" and v == 0)}
    if shown:
        parts.append(", ".join(f"{k} = {float(v):g}" for k, v in shown.items()))
    if scores:
        parts.append(scores)
    return "; ".join([*parts, f"wrote {out}"])


def add_run_parser(sub, methods: tuple[str, ...], default: str, count_key: str, count: int):
    """The ``run`` subcommand of a method's command line (:func:`cmd_run`): the Flower app on
    Flower's simulation engine.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The command's subparsers (``parser.add_subparsers()``).
    methods : tuple of str
        The methods ``--method``'s help lists.
    default : str
        ``--method``'s default (comma-separated).
    count_key : str
        The run-config key of the SuperNode count; ``data.num-sites`` makes the option
        ``--num-sites``, any other key ``--num-clients``.
    count : int
        The default SuperNode count.
    """
    p = sub.add_parser("run", help="the Flower app on Flower's simulation engine")
    p.add_argument(
        "--method",
        default=default,
        help=f"comma-separated among {', '.join(methods)} (default: %(default)s)",
    )
    flag = "--num-sites" if count_key == "data.num-sites" else "--num-clients"
    p.add_argument(flag, dest="num_nodes", type=int, default=count, metavar="N",
                   help=f"SuperNodes, one per {flag[6:-1]} (default: %(default)s)")  # fmt: skip
    p.add_argument("--out", default="", help="output directory (absolute or relative)")
    p.add_argument(
        "--run-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other run-config key (repeatable)",
    )
    p.add_argument("--verbose", action="store_true", help="stream Flower's log")
    p.set_defaults(count_key=count_key, count_flag=flag[2:])


#: Flower's own log lines in a streamed run (left out of what ``run`` prints).
_LOG_LINE = re.compile(r"^\s*(DEBUG|INFO|WARNING)\s*:")


def cmd_run(a, task: str, table_starts: str) -> int:
    """``run``: ``flwr run`` of the app with ``task``, ``--method`` and ``--run-config`` on
    a private simulation SuperLink; prints the run's result table.

    Parameters
    ----------
    a : argparse.Namespace
        The ``run`` subcommand's options (:func:`add_run_parser`).
    task : str
        The run config's ``task`` (``"grauc"`` or ``"rowfed"``).
    table_starts : str
        Text on the table's first line: what is printed starts at the line holding it (the
        output's last 3000 characters when it is not there).

    Returns
    -------
    int
        0 (a failed run raises).
    """
    import tomllib

    from .launch import stream_echo
    from .simulation import flwr_run

    if a.num_nodes < 1:
        raise InputError(f"{a.count_flag}: must be >= 1, got {a.num_nodes}")
    rc = {"task": task, "method": a.method, a.count_key: a.num_nodes}
    if a.out:
        out = os.path.abspath(a.out)
        os.makedirs(out, exist_ok=True)
        rc["out-dir"] = out
    for item in a.run_config:
        if "=" not in item:
            raise InputError(f"run-config: expected KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        try:
            rc[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            rc[key] = value
    if not a.verbose:
        sys.stderr.write(
            f"Running {a.method} on Flower's simulation engine ({a.num_nodes} SuperNodes); "
            "starting Flower takes about half a minute...\n"
        )
    out = flwr_run(project_dir(), rc, a.num_nodes, echo=stream_echo(False, a.verbose))
    at = out.find(table_starts)
    table = out[out.rfind("\n", 0, at) + 1 :] if at >= 0 else out[-3000:]
    lines = re.sub(r"\x1b\[[0-9;]*m", "", table).splitlines()
    keep = [ln for ln in lines if "ClientAppActor" not in ln and not _LOG_LINE.match(ln)]
    print("\n".join(keep).strip())
    return 0

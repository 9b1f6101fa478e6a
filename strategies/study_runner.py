"""Shared machinery of the ``study`` commands (both methods): the design grid of a TOML
config, ``--only`` selection, one seed per (cell, replication), resumable part files, a
process pool (or a Ray cluster), progress on stderr, and the tidy ``results.csv`` /
``summary.csv``.

A study is a list of *tasks*, one per (cell, replication).  A method module supplies a
task function ``task(settings, cell, rep, seed) -> dict[str, DataFrame]`` (module level, so
worker processes can import it); the frame ``"results"`` holds the tidy rows, other frames
(coefficients, clusters, tuning tables) are kept beside it for the figures.

Files under ``--out``::

    study.json                  the settings fingerprint (a rerun must match it)
    parts/<cell>/rep-0007.csv   one finished task's rows (written last, atomically: the task
                                is done iff this file exists)
    parts/<cell>/rep-0007.<name>.csv   its other frames
    results.csv                 every finished task's rows (appended as tasks finish, rebuilt
                                from the parts at the start and at the end of every run)
    summary.csv                 mean and SD over replications per cell and method (tidy)
    summary_table.csv           the same as ``mean (sd)``, one row per cell, one column per
                                method (the papers' layout)
    fig_*.png                   the method's figures
    errors.log                  tasks that raised (they are retried by a rerun)

Seeds: task ``(cell, rep)`` gets :func:`task_seed` of the config's ``seed``, the cell's
values and ``rep`` -- independent of the grid's order, of ``--only`` and of ``--workers``,
so any subset of a study reproduces the same numbers.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .cli_utils import check_output_dir
from .errors import InputError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli comes with flwr
    import tomli as tomllib

RESULTS = "results"
#: Id columns read back as text (a county FIPS code such as "06037" keeps its zero).
ID_DTYPES = {"site": str, "client": str}


# ---------------------------------------------------------------------------------------
# Config and design grid
# ---------------------------------------------------------------------------------------
def read_toml(path: str) -> dict:
    """The parsed TOML file; a missing or malformed file is an :class:`InputError`."""
    if not os.path.isfile(path):
        raise InputError(f"config: file not found: {path}")
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"config: cannot parse {path}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"config: cannot read {path}: {exc}") from None


def _kind(value) -> type:
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        return int
    if isinstance(value, float):
        return float
    if isinstance(value, str):
        return str
    raise InputError(f"design: values must be numbers or strings, got {value!r}")


def expand_design(design: dict, types: dict[str, type], required: Sequence[str]) -> tuple:
    """The cells of a design table, in grid order.

    Parameters
    ----------
    design : dict
        ``[design]`` of the config.  A key with a list of scalars is a factor; a key with a
        list of tables is a *linked* factor whose levels set several keys at once, e.g.
        ``pq = [{p = 20, q = 20}, {p = 50, q = 50}]``.  A scalar is a one-level factor.
    types : dict
        Allowed design keys and their types (an ``int`` key rejects ``0.5``; a ``float`` key
        accepts integers).
    required : sequence of str
        Keys every cell must have; they come first in the output columns.

    Returns
    -------
    keys : tuple of str
        Design keys in output order (``required`` first, then the others as given).
    cells : list of dict
        The Cartesian product of the factors, later factors varying fastest.
    """
    if not isinstance(design, dict) or not design:
        raise InputError("design: the config needs a [design] table with one or more factors")
    factors = []
    seen: list[str] = []
    for name, levels in design.items():
        if not isinstance(levels, list):
            levels = [levels]
        if not levels:
            raise InputError(f"design.{name}: give one or more levels")
        if all(isinstance(v, dict) for v in levels):
            names = list(levels[0])
            for lv in levels:
                if list(lv) != names:
                    raise InputError(
                        f"design.{name}: every level must set the same keys {names}, got {list(lv)}"
                    )
            rows = [dict(lv) for lv in levels]
        elif any(isinstance(v, dict) for v in levels):
            raise InputError(f"design.{name}: mixes tables and values")
        else:
            names = [name]
            rows = [{name: v} for v in levels]
        for key in names:
            if key not in types:
                raise InputError(f"design.{key}: unknown design key (allowed: {', '.join(types)})")
            if key in seen:
                raise InputError(f"design.{key}: set by two factors")
            seen.append(key)
        for row in rows:
            for key in names:
                row[key] = _typed(key, row[key], types[key], "design")
        keys_in = [tuple(sorted(r.items())) for r in rows]
        if len(set(keys_in)) != len(keys_in):
            raise InputError(f"design.{name}: a level is listed twice")
        factors.append(rows)
    missing = [k for k in required if k not in seen]
    if missing:
        raise InputError(f"design: missing key {missing[0]!r} (required: {', '.join(required)})")
    keys = tuple(required) + tuple(k for k in seen if k not in required)
    cells = []
    for combo in itertools.product(*factors):
        cell = {}
        for part in combo:
            cell.update(part)
        cells.append({k: cell[k] for k in keys})
    return keys, cells


def _typed(key: str, value, kind: type, what: str):
    if kind is float and _kind(value) in (int, float):
        return float(value)
    if kind is int and _kind(value) is int:
        return int(value)
    if kind is str and isinstance(value, str):
        return value
    raise InputError(f"{what}.{key}: expected {kind.__name__}, got {value!r}")


def _parse_value(key: str, text: str, kind: type):
    try:
        if kind is int:
            return int(text)
        if kind is float:
            v = float(text)
            if not math.isfinite(v):
                raise ValueError
            return v
        return text
    except ValueError:
        raise InputError(f"only: {key}={text}: expected {kind.__name__}") from None


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def select_cells(cells: list[dict], keys: Sequence[str], types: dict, only: Sequence[str]):
    """The cells matching every ``KEY=VALUE`` of ``only`` (values of one key: any of them).

    Values are parsed by the key's type; an unknown key or a value that is not a level of
    the grid is an :class:`InputError`.
    """
    wanted: dict[str, list] = {}
    for item in only:
        if "=" not in item:
            raise InputError(f"only: expected KEY=VALUE, got {item!r}")
        key, text = (s.strip() for s in item.split("=", 1))
        if key not in keys:
            raise InputError(f"only: unknown key {key!r} (design keys: {', '.join(keys)})")
        value = _parse_value(key, text, types[key])
        levels = list(dict.fromkeys(c[key] for c in cells))
        if not any(_same(value, lv) for lv in levels):
            shown = ", ".join(str(v) for v in levels)
            raise InputError(f"only: {key}={text} is not in the grid ({key}: {shown})")
        wanted.setdefault(key, []).append(value)
    out = [c for c in cells if all(any(_same(c[k], v) for v in vals) for k, vals in wanted.items())]
    if not out:
        raise InputError("only: no cell of the grid matches all of " + " ".join(only))
    return out


def cell_label(cell: dict) -> str:
    """``key=value,...`` (the cell's directory name and its id in messages)."""
    return ",".join(f"{k}={_fmt(v)}" for k, v in cell.items())


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return str(v)


def task_seed(seed: int, cell: dict, rep: int) -> int:
    """A seed for (cell, replication) that depends only on the base seed, the cell's values
    and ``rep`` (not on the grid's order or on ``--only``): the first 31 bits of
    SHA-256 of ``seed|key=value,...|rep``."""
    text = f"{int(seed)}|{cell_label(dict(sorted(cell.items())))}|{int(rep)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") >> 1


@dataclass(frozen=True)
class Study:
    """A parsed study config.  ``settings`` holds every table but ``[design]`` (parsed and
    checked by the method's module); its fingerprint guards a reused ``--out``."""

    path: str
    kind: str
    keys: tuple[str, ...]
    types: dict[str, type]
    cells: list[dict]
    replications: int
    seed: int
    settings: dict = field(default_factory=dict)

    def fingerprint(self) -> dict:
        return {"study": self.kind, "seed": self.seed, "keys": list(self.keys), **self.settings}


def load_study(
    path: str,
    kind: str,
    types: dict[str, type],
    required: Sequence[str],
    sections: Sequence[str],
) -> Study:
    """Read a study config: top-level ``study``, ``replications``, ``seed``, ``methods``,
    ``[design]`` and the method's ``sections``; anything else is an error naming the key."""
    raw = read_toml(path)
    if raw.get("study", kind) != kind:
        raise InputError(
            f"config: study = {raw.get('study')!r}; this command runs {kind!r} studies"
        )
    known = ["study", "replications", "seed", "methods", "design", *sections]
    for key in raw:
        if key not in known:
            raise InputError(f"config: unknown setting {key!r} (allowed: {', '.join(known)})")
    reps = raw.get("replications", 1)
    if not isinstance(reps, int) or isinstance(reps, bool) or reps < 1:
        raise InputError(f"replications: must be an integer >= 1, got {reps!r}")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise InputError(f"seed: must be an integer >= 0, got {seed!r}")
    keys, cells = expand_design(raw.get("design", {}), types, required)
    settings = {k: v for k, v in raw.items() if k not in ("design", "replications", "seed")}
    return Study(os.path.abspath(path), kind, keys, types, cells, reps, seed, settings)


# ---------------------------------------------------------------------------------------
# Part files
# ---------------------------------------------------------------------------------------
def _atomic_csv(frame: pd.DataFrame, path: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    frame.to_csv(tmp, index=False)
    os.replace(tmp, path)


class PartStore:
    """Finished tasks under ``out/parts``: ``<cell>/rep-NNNN.csv`` marks a task done."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.root = os.path.join(out, "parts")

    def path(self, cell: dict, rep: int, name: str = RESULTS) -> str:
        stem = f"rep-{rep:04d}" + ("" if name == RESULTS else f".{name}")
        return os.path.join(self.root, cell_label(cell), stem + ".csv")

    def done(self, cell: dict, rep: int) -> bool:
        return os.path.isfile(self.path(cell, rep))

    def write(self, cell: dict, rep: int, frames: dict[str, pd.DataFrame]) -> None:
        """Every frame atomically, ``results`` last (the task's completion mark)."""
        os.makedirs(os.path.dirname(self.path(cell, rep)), exist_ok=True)
        for name, frame in frames.items():
            if name != RESULTS:
                _atomic_csv(frame, self.path(cell, rep, name))
        _atomic_csv(frames[RESULTS], self.path(cell, rep))

    def read(self, cell: dict, rep: int, name: str = RESULTS) -> pd.DataFrame | None:
        path = self.path(cell, rep, name)
        return pd.read_csv(path, dtype=ID_DTYPES) if os.path.isfile(path) else None

    def all_results(self) -> pd.DataFrame:
        """Every finished task's rows (any cell, any replication), or an empty frame."""
        if not os.path.isdir(self.root):
            return pd.DataFrame()
        frames = []
        for cell_dir in sorted(os.listdir(self.root)):
            d = os.path.join(self.root, cell_dir)
            if not os.path.isdir(d):
                continue
            for name in sorted(os.listdir(d)):
                if name.startswith("rep-") and name.endswith(".csv") and name.count(".") == 1:
                    frames.append(pd.read_csv(os.path.join(d, name), dtype=ID_DTYPES))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def check_fingerprint(out: str, study: Study) -> None:
    """Write ``study.json`` in a new ``out``; in a used one it must match this study's."""
    path = os.path.join(out, "study.json")
    mine = json.loads(json.dumps(study.fingerprint(), sort_keys=True, default=str))
    if os.path.isfile(path):
        with open(path) as fh:
            theirs = json.load(fh)
        if theirs != mine:
            diff = sorted(
                k
                for k in set(theirs) | set(mine)
                if theirs.get(k) != mine.get(k)  # top-level tables that differ
            )
            raise InputError(
                f"out: {out} holds a study with other settings ({', '.join(diff)}); "
                "use another --out"
            )
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(mine, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------
def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class Progress:
    """``study: 12/40 tasks, 3/10 cells done, 4m10s elapsed, about 9m20s left`` on stderr
    (rewritten in place on a terminal, one line per finished task otherwise)."""

    def __init__(self, tasks: list[tuple[dict, int]], done: set, quiet: bool = False) -> None:
        self.total = len(tasks)
        self.quiet = quiet
        self.stream = sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.perf_counter()
        self.finished_now = 0
        self.left_per_cell: dict[str, int] = {}
        for cell, rep in tasks:
            label = cell_label(cell)
            self.left_per_cell.setdefault(label, 0)
            if (label, rep) not in done:
                self.left_per_cell[label] += 1
        self.done_before = sum(1 for c, r in tasks if (cell_label(c), r) in done)

    @property
    def cells_done(self) -> int:
        return sum(1 for v in self.left_per_cell.values() if v == 0)

    def line(self) -> str:
        done = self.done_before + self.finished_now
        elapsed = time.perf_counter() - self.t0
        todo = self.total - done
        if self.finished_now:
            eta = f"about {_hms(elapsed / self.finished_now * todo)} left"
        else:
            eta = "time left: estimating" if todo else "nothing left"
        return (
            f"study: {done}/{self.total} tasks, {self.cells_done}/{len(self.left_per_cell)} "
            f"cells done, {_hms(elapsed)} elapsed, {eta}"
        )

    def say(self, text: str) -> None:
        if not self.quiet:
            self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
            self.stream.flush()

    def show(self) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\033[K" + self.line())
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def task_done(self, cell: dict, rep: int) -> None:
        self.finished_now += 1
        self.left_per_cell[cell_label(cell)] -= 1
        self.show()

    def close(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()


# ---------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------
def _import(path: str) -> Callable:
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def execute_task(task_path: str, settings: dict, cell: dict, rep: int, seed: int):
    """Run one task (in a worker): ``("ok", frames, seconds)`` or ``("error", text, s)``."""
    try:
        task = _import(task_path)  # imports are not the task's time
        t0 = time.perf_counter()
        frames = task(settings, dict(cell), rep, seed)
        return "ok", frames, time.perf_counter() - t0
    except Exception as exc:  # reported per task; the other tasks go on
        text = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        return "error", text, 0.0


def _run_local(task_path, settings, todo, workers, on_result):
    if workers == 1:
        for cell, rep, seed in todo:
            on_result(cell, rep, seed, execute_task(task_path, settings, cell, rep, seed))
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        # one BLAS thread per worker: inherited from strategies.single_threaded_blas
        pending = {
            pool.submit(execute_task, task_path, settings, cell, rep, seed): (cell, rep, seed)
            for cell, rep, seed in todo
        }
        try:
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    cell, rep, seed = pending.pop(fut)
                    on_result(cell, rep, seed, fut.result())
        except BaseException:
            for fut in pending:
                fut.cancel()
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """``host:port`` (or ``ray://host:port``) must accept a TCP connection: Ray itself
    retries an unreachable address for minutes."""
    import socket

    target = address.removeprefix("ray://")
    if address in ("auto", "local") or ":" not in target:
        return
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as exc:
        raise InputError(f"ray-address: cannot connect to {address!r}: {exc}") from None


def _run_ray(task_path, settings, todo, address, on_result):
    try:
        import ray
    except ImportError:  # pragma: no cover - Ray comes with flwr[simulation]
        msg = "ray-address: Ray is not installed (pip install 'flwr[simulation]')"
        raise InputError(msg) from None
    import logging
    import warnings

    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            if address == "local":  # a new local instance, even when one is running
                ray.init(address="local", include_dashboard=False, **quiet)
            else:  # an existing cluster; every node needs this project installed
                ray.init(address=address, **quiet)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"ray-address: cannot connect to {address!r}: {first}") from None
    remote = ray.remote(num_cpus=1)(execute_task)
    refs = {
        remote.remote(task_path, settings, cell, rep, seed): (cell, rep, seed)
        for cell, rep, seed in todo
    }
    try:
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                cell, rep, seed = refs.pop(ref)
                on_result(cell, rep, seed, ray.get(ref))
    finally:
        for ref in refs:
            ray.cancel(ref, force=True)
        ray.shutdown()


def _append_rows(path: str, frame: pd.DataFrame) -> None:
    """Append ``frame`` to the CSV at ``path`` in one write (header if the file is new)."""
    exists = os.path.isfile(path) and os.path.getsize(path) > 0
    if exists:
        with open(path) as fh:
            columns = fh.readline().strip().split(",")
        frame = frame.reindex(columns=columns)
    text = frame.to_csv(index=False, header=not exists)
    with open(path, "a") as fh:
        fh.write(text)
        fh.flush()


# ---------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------
def summarize(results: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str]) -> pd.DataFrame:
    """Mean and SD over replications per cell and method (the papers' tables).

    Each replication's value is first averaged over its rows (e.g. sites: the mean AUC over
    institutions), ignoring missing values; then ``<metric>_mean``, ``<metric>_sd``
    (ddof 1) and ``n_reps`` per ``keys`` + ``method``, in grid order.
    """
    if results.empty:
        return pd.DataFrame(columns=[*keys, "method", "n_reps"])
    by_rep = list(keys) + ["method", "rep"]
    per_rep = results.groupby(by_rep, sort=False, dropna=False)[list(metrics)].mean()
    per_rep = per_rep.reset_index()
    grouped = per_rep.groupby(list(keys) + ["method"], sort=False, dropna=False)
    out = grouped.size().rename("n_reps").to_frame()
    for m in metrics:
        out[f"{m}_mean"] = grouped[m].mean()
        out[f"{m}_sd"] = grouped[m].std(ddof=1)
    return out.reset_index()


def summary_table(summary: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str]):
    """The papers' layout: one row per cell, one column per metric and method holding
    ``mean (sd)`` to 4 significant digits."""
    if summary.empty:
        return pd.DataFrame(columns=list(keys))

    def cell(mean, sd) -> str:
        if not np.isfinite(mean):
            return ""
        fmt = ".4g"
        return f"{mean:{fmt}}" + (f" ({sd:{fmt}})" if np.isfinite(sd) else "")

    methods = list(dict.fromkeys(summary["method"]))
    frame = summary.assign(
        **{
            f"_{m}": [
                cell(a, b) for a, b in zip(summary[f"{m}_mean"], summary[f"{m}_sd"], strict=True)
            ]
            for m in metrics
        }
    )
    wide = frame.pivot_table(
        index=list(keys),
        columns="method",
        values=[f"_{m}" for m in metrics],
        aggfunc="first",
        sort=False,
    )
    cols = [(f"_{m}", meth) for m in metrics for meth in methods if (f"_{m}", meth) in wide.columns]
    wide = wide[cols]
    wide.columns = [meth if len(metrics) == 1 else f"{m[1:]}:{meth}" for m, meth in cols]
    return wide.reset_index()


def order_results(results: pd.DataFrame, cells: list[dict], keys: Sequence[str]) -> pd.DataFrame:
    """Rows in grid order (cells of this config first, others after), then rep."""
    if results.empty:
        return results
    rank = {cell_label(c): k for k, c in enumerate(cells)}
    frame = results[list(keys)].drop_duplicates()
    labels = [
        cell_label(dict(zip(keys, row, strict=True))) for row in frame.itertuples(index=False)
    ]
    frame = frame.assign(_cell=[rank.get(lb, len(rank)) for lb in labels])
    results = results.assign(_pos=np.arange(len(results))).merge(frame, on=list(keys), how="left")
    results = results.sort_values(["_cell", "rep", "_pos"], kind="stable")
    return results.drop(columns=["_cell", "_pos"]).reset_index(drop=True)


def _normalize_types(results: pd.DataFrame, study: Study) -> pd.DataFrame:
    """Design columns as their declared types (CSV round trips turn 50 into 50.0 when a
    column is empty somewhere)."""
    for k in study.keys:
        if k in results.columns and study.types[k] is int:
            results[k] = results[k].astype("int64")
    return results


# ---------------------------------------------------------------------------------------
# Figure helpers (both methods' figures)
# ---------------------------------------------------------------------------------------
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
    band = (0.85 if handles else 0.5) + extra
    fig.tight_layout(rect=(0, 0, 1, 1 - band / h))  # before the title: it is placed by hand
    fig.suptitle("\n".join(lines), y=1 - 0.1 / h, va="top", fontsize=12)
    if handles:
        fig.legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, 1 - (0.4 + extra) / h),
            ncol=len(labels),
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


# ---------------------------------------------------------------------------------------
# The whole run
# ---------------------------------------------------------------------------------------
def add_study_parser(sub) -> None:
    """The ``study`` subcommand (both methods share it)."""
    add_study_options(sub.add_parser("study", help="a simulation study driven by a TOML config"))


def run_study_args(a, study: Study, task_path: str, metrics, make_figures) -> int:
    """:func:`run_study` with the parsed options of :func:`add_study_options`."""
    return run_study(
        study,
        task_path,
        a.out,
        reps=a.reps,
        only=a.only,
        workers=a.workers,
        ray_address=a.ray_address,
        metrics=metrics,
        figures=None if a.no_figures else make_figures,
        quiet=a.quiet,
    )


def add_study_options(p) -> None:
    """The options of both methods' ``study`` subcommands."""
    p.add_argument("--config", required=True, help="study config (TOML), e.g. configs/sim1.toml")
    p.add_argument("--out", required=True, help="output directory (reused: finished tasks skip)")
    p.add_argument("--reps", type=int, default=None, help="replications (default: the config's)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only the cells with this design value (repeatable; values of one key: any)",
    )
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument(
        "--ray-address",
        default="",
        metavar="ADDR",
        help="run the tasks on this Ray cluster ('auto', 'ray://host:10001'; 'local' starts one)",
    )
    p.add_argument("--no-figures", action="store_true", help="write results and summaries only")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def run_study(
    study: Study,
    task_path: str,
    out: str,
    reps: int | None = None,
    only: Sequence[str] = (),
    workers: int = 1,
    ray_address: str = "",
    metrics: Sequence[str] = (),
    figures: Callable | None = None,
    quiet: bool = False,
) -> int:
    """Run the tasks of ``study`` not yet in ``out``; write results, summary and figures.

    Returns the exit code: 0, or 1 when a task or the figures failed (the finished tasks
    are kept; rerun the same command to retry).  Bad input raises :class:`InputError`.
    """
    if reps is not None and reps < 1:
        raise InputError(f"reps: must be >= 1, got {reps}")
    if workers < 1:
        raise InputError(f"workers: must be >= 1, got {workers}")
    cells = select_cells(study.cells, study.keys, study.types, only)
    n_reps = study.replications if reps is None else reps
    out = check_output_dir(out)
    if ray_address:  # before anything is written
        _check_reachable(ray_address)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise InputError(f"out: cannot create {out}: {exc.strerror}") from None
    check_fingerprint(out, study)
    store = PartStore(out)
    tasks = [(c, r) for c in cells for r in range(n_reps)]
    done = {(cell_label(c), r) for c, r in tasks if store.done(c, r)}
    todo = [(c, r, task_seed(study.seed, c, r)) for c, r in tasks if (cell_label(c), r) not in done]
    results_path = os.path.join(out, "results.csv")
    _rebuild(store, study, results_path)

    progress = Progress(tasks, done, quiet)
    where = f"Ray at {ray_address}" if ray_address else f"{workers} worker(s)"
    progress.say(
        f"study: {len(tasks)} tasks ({len(cells)} cells x {n_reps} replications); "
        f"{len(done)} already done in {out}, {len(todo)} to run on {where}"
    )
    errors: list[str] = []

    def on_result(cell, rep, seed, outcome) -> None:
        status, payload, seconds = outcome
        if status != "ok":
            errors.append(f"{cell_label(cell)} rep {rep} (seed {seed}): {payload}")
            with open(os.path.join(out, "errors.log"), "a") as fh:
                fh.write(errors[-1] + "\n")
            progress.say(f"task {cell_label(cell)} rep {rep} failed: {payload.splitlines()[0]}")
            return
        frames = dict(payload)
        frames[RESULTS] = frames[RESULTS].assign(seconds=round(seconds, 3))
        store.write(cell, rep, frames)
        _append_rows(results_path, frames[RESULTS])
        progress.task_done(cell, rep)

    if todo:
        progress.show()
        try:
            if ray_address:
                _run_ray(task_path, study.settings, todo, ray_address, on_result)
            else:
                _run_local(task_path, study.settings, todo, workers, on_result)
        finally:
            progress.close()
    results = _rebuild(store, study, results_path)
    summary = summarize(results, study.keys, metrics)
    _atomic_csv(summary, os.path.join(out, "summary.csv"))
    _atomic_csv(summary_table(summary, study.keys, metrics), os.path.join(out, "summary_table.csv"))
    code = 0
    if figures is not None and not results.empty:
        try:
            made = figures(out, study, results, store, cells)
            progress.say(f"figures: {', '.join(os.path.basename(p) for p in made)}")
        except Exception as exc:
            progress.say(f"error: figures: {type(exc).__name__}: {exc}")
            code = 1
    if errors:
        progress.say(
            f"error: {len(errors)} task(s) failed (see {os.path.join(out, 'errors.log')}); "
            "rerun the same command to retry them"
        )
        code = 1
    n_done = len(tasks) - len(todo) + (len(todo) - len(errors))
    progress.say(f"study: {n_done}/{len(tasks)} tasks done; wrote {out}")
    return code


def _rebuild(store: PartStore, study: Study, path: str) -> pd.DataFrame:
    results = store.all_results()
    if not results.empty:
        results = _normalize_types(order_results(results, study.cells, study.keys), study)
        _atomic_csv(results, path)
    elif os.path.isfile(path):
        os.remove(path)
    return results


__all__ = [
    "PartStore",
    "Progress",
    "Study",
    "add_study_options",
    "cell_label",
    "expand_design",
    "load_study",
    "read_toml",
    "run_study",
    "select_cells",
    "summarize",
    "task_seed",
]

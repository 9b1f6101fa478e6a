"""The design grid of a study config: the TOML file, the cells of its ``[design]`` table,
``--only`` selection, cell labels and one seed per (cell, replication)."""

from __future__ import annotations

import hashlib
import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli comes with flwr
    import tomli as tomllib


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


def read_config(path: str, _seen: tuple[str, ...] = ()) -> dict:
    """A study config with its ``extends`` resolved: ``extends = "base.toml"`` (relative to
    the config's own folder) reads that config first and lays this one over it, table by
    table (a key given here replaces the base's; a table is merged key by key).

    Parameters
    ----------
    path : str
        The config file.
    _seen : tuple of str, optional
        The absolute paths of the configs that extend this one (the recursion's; a config
        among them is a cycle, an :class:`InputError`).

    Returns
    -------
    dict
        The config, without ``extends``.
    """
    raw = read_toml(path)
    base = raw.pop("extends", None)
    if base is None:
        return raw
    if not isinstance(base, str) or not base:
        raise InputError(f"extends: must be the path of another config, got {base!r}")
    full = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), base))
    if full in _seen or full == os.path.abspath(path):
        raise InputError(f"extends: {base!r} extends itself (a cycle)")
    return _lay_over(read_config(full, (*_seen, os.path.abspath(path))), raw)


def _lay_over(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _lay_over(out[key], value)
        else:
            out[key] = value
    return out


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

    Parameters
    ----------
    cells : list of dict
        The grid's cells (:func:`expand_design`).
    keys : sequence of str
        The design keys.
    types : dict
        Each design key's type.
    only : sequence of str
        The ``--only`` options, ``KEY=VALUE`` each.

    Returns
    -------
    list of dict
        The matching cells, in grid order; no match is an :class:`InputError`.
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
    and ``rep`` (not on the grid's order or on ``--only``).

    Parameters
    ----------
    seed : int
        The study's base seed.
    cell : dict
        The design values (their order does not matter).
    rep : int
        The replication.

    Returns
    -------
    int
        The first 31 bits of SHA-256 of ``seed|key=value,...|rep``.
    """
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
    ``[design]`` and the method's ``sections``; anything else is an error naming the key.
    A ``[data] path`` is made absolute (relative to the working directory); ``extends``
    reads a base config first (:func:`read_config`).

    Parameters
    ----------
    path : str
        The config file.
    kind : str
        The kind of study the command runs; the config's ``study`` (when given) must be it.
    types : dict
        The allowed design keys and their types (:func:`expand_design`).
    required : sequence of str
        The design keys every cell must have.
    sections : sequence of str
        The method's tables.

    Returns
    -------
    Study
    """
    raw = read_config(path)
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
    data = settings.get("data")
    if isinstance(data, dict) and isinstance(data.get("path"), str) and data["path"]:
        # relative to the working directory; the tasks (other processes) get it absolute
        data["path"] = os.path.abspath(os.path.expanduser(data["path"]))
    return Study(os.path.abspath(path), kind, keys, types, cells, reps, seed, settings)


def data_source(table, real: Sequence[str]) -> str:
    """``[data] source`` of a study config; anything else than ``"simulated"`` or one of the
    method's ``real`` sources is an error naming the key.  It decides which declaration reads
    the rest of ``[data]`` and which design keys the study has.

    Parameters
    ----------
    table : object
        The config's ``[data]`` (anything but a table: no source given).
    real : sequence of str
        The method's real data sources.

    Returns
    -------
    str
        The source: ``"simulated"`` (also when absent) or one of ``real``.
    """
    source = table.get("source", "simulated") if isinstance(table, dict) else "simulated"
    if source not in ("simulated", *real):
        raise InputError(f"data.source: must be simulated, {', '.join(real)}, got {source!r}")
    return source


def study_methods(settings: dict, allowed: Sequence[str], default: Sequence[str]) -> list[str]:
    """``methods`` of a study config: a list (or comma-separated text) of allowed names.

    Parameters
    ----------
    settings : dict
        The config's tables but ``[design]``.
    allowed : sequence of str
        The method names allowed; any other is an :class:`InputError`.
    default : sequence of str
        The methods when the config names none.

    Returns
    -------
    list of str
    """
    methods = settings.get("methods", list(default))
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",")]
    if not isinstance(methods, list) or not methods:
        raise InputError("methods: give a list of one or more methods")
    for m in methods:
        if m not in allowed:
            raise InputError(f"methods: must be among {', '.join(allowed)}, got {m!r}")
    return methods


def figure_cell_setting(settings: dict, keys: Sequence[str]) -> dict | None:
    """``[figures] cell`` of a study config: the design values of the one-cell figures.

    Parameters
    ----------
    settings : dict
        The config's tables but ``[design]``.
    keys : sequence of str
        The design keys; ``cell`` may set only these.

    Returns
    -------
    dict or None
        The design values, or ``None`` when not given.
    """
    figures = settings.get("figures", {})
    for key in figures:
        if key != "cell":
            raise InputError(f"figures.{key}: unknown setting (allowed: cell)")
    cell = figures.get("cell")
    if cell is not None:
        if not isinstance(cell, dict):
            raise InputError("figures.cell: expected a table of design values")
        for key in cell:
            if key not in keys:
                raise InputError(f"figures.cell: {key!r} is not a design key")
    return cell

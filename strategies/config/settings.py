"""Declared settings: a setting's default, help, range and run-config key written once
(:func:`setting`, :func:`listing`), checked on construction (:class:`Declared`), read
from Flower run configs and TOML tables (:func:`from_run_config`, :class:`Table`) and
written back (:func:`to_run_config`).  The methods' configs are in
:mod:`strategies.config.methods`."""

from __future__ import annotations

import math
from dataclasses import field, fields

import numpy as np

from ..errors import InputError


def setting(
    default,
    help: str,
    choices: tuple[str, ...] | None = None,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    key: str | bool | None = None,
    top: bool = False,
    flag: str | None = None,
    metavar: str | None = None,
    words: tuple[str, ...] = (),
    **extra,
):
    """A settings field: its default, a one-line help, for a choice the values allowed, and
    for a number its range.  The run config, the command line and validation are derived
    from these.

    Parameters
    ----------
    default : object
        The field's default value.
    help : str
        One line of help.
    choices : tuple of str, optional
        The values allowed (a choice setting).
    at_least, above : float, optional
        A lower bound, closed / open.
    at_most, below : float, optional
        An upper bound, closed / open.
    key : str or bool, optional
        Its run-config name after the class's prefix when that is not the field's name with
        dashes (``False``: no run-config key).
    top : bool, optional
        The key has no prefix (the run's ``seed``).
    flag : str, optional
        For a class whose fields are not all command-line options (the data specs), the
        ``fit`` option that sets it (``--flag``).
    metavar : str, optional
        How the help shows ``flag``'s value.
    words : tuple of str, optional
        Strings a number setting of a study table may also be (``"nonfed"``).
    **extra
        :func:`listing`'s metadata.

    Returns
    -------
    dataclasses.Field
        A field with ``default`` whose metadata holds all of the above.
    """
    bounds = {"at_least": at_least, "above": above, "at_most": at_most, "below": below}
    names = {"key": key, "top": top, "flag": flag, "metavar": metavar, "words": words, **extra}
    return field(default=default, metadata={"help": help, "choices": choices, **bounds, **names})


def listing(
    default: tuple,
    help: str,
    items: str = "float",
    choices: tuple[str, ...] | None = None,
    *,
    at_least: float | None = None,
    at_most: float | None = None,
    nonempty: bool = True,
    descending: bool = False,
    spaced: bool = False,
    words: tuple[str, ...] = (),
    repeats: bool = False,
):
    """A list setting of a study config's table (a grid, a list of names): a tuple of
    ``items``, each in its declared range or choices.  The TOML value is a list, or one
    value for a list of one (``str``: also a comma-separated string); numbers are kept once
    each, names must be distinct, unless the values may repeat.

    Parameters
    ----------
    default : tuple
        The setting's default.
    help : str
        One line of help.
    items : str, optional
        The type of each value: ``float``, ``int``, ``str``, or ``code`` (text or an
        integer, kept as text).
    choices : tuple of str, optional
        The values allowed for each item.
    at_least, at_most : float, optional
        Closed lower and upper bounds of each number.
    nonempty : bool, optional
        An empty list is an error.
    descending : bool, optional
        The numbers are sorted in descending order.
    spaced : bool, optional
        The value may also be a table ``{max, min, num}``: ``num`` log-spaced values.
    words : tuple of str, optional
        Strings that stand for the empty tuple (decided elsewhere, e.g. ``"auto"``).
    repeats : bool, optional
        The values may repeat (a list of counts) and are kept as given.

    Returns
    -------
    dataclasses.Field
        The field, as :func:`setting` builds it, with the list's metadata.
    """
    extra = {"items": items, "nonempty": nonempty, "descending": descending, "spaced": spaced,
             "repeats": repeats}  # fmt: skip
    return setting(default, help, choices, at_least=at_least, at_most=at_most, words=words,
                   **extra)  # fmt: skip


def config_key(f, prefix: str = "") -> str | None:
    """The run-config key of a settings field.

    Parameters
    ----------
    f : dataclasses.Field
        A field declared with :func:`setting`.
    prefix : str, optional
        The class's prefix (``"grauc"``: keys ``grauc.<name>``); empty: no prefix.

    Returns
    -------
    str or None
        The key, or ``None`` for a field that has none (:func:`setting`).
    """
    key = f.metadata.get("key")
    if key is False:
        return None
    short = key or f.name.replace("_", "-")
    return short if f.metadata.get("top") or not prefix else f"{prefix}.{short}"


def _range(meta) -> tuple[object, str] | None:
    """``(test, message)`` of a field's declared range, or ``None``."""
    lo, lo_open = meta.get("at_least"), meta.get("above")
    hi, hi_open = meta.get("at_most"), meta.get("below")
    low = lo_open if lo_open is not None else lo
    high = hi_open if hi_open is not None else hi
    if low is None and high is None:
        return None

    def test(v) -> bool:
        ok = lo is None or v >= lo
        ok = ok and (lo_open is None or v > lo_open)
        ok = ok and (hi is None or v <= hi)
        return ok and (hi_open is None or v < hi_open)

    if high is None:
        return test, f"must be {'>' if lo_open is not None else '>='} {low:g}"
    if low is None:
        return test, f"must be {'<' if hi_open is not None else '<='} {high:g}"
    left = "(" if lo_open is not None else "["
    right = ")" if hi_open is not None else "]"
    return test, f"must be in {left}{low:g}, {high:g}{right}"


def require(cond: bool, key: str, msg: str, value) -> None:
    """Raise an :class:`InputError` ``<key>: <msg>, got <value>`` unless ``cond`` holds.

    Parameters
    ----------
    cond : bool
        The check that must hold.
    key : str
        The setting the error names.
    msg : str
        What the value must be.
    value : object
        The value given (a numpy scalar is shown as its plain Python value).
    """
    if not cond:
        if hasattr(value, "dtype") and hasattr(value, "item"):  # a numpy scalar: plain repr
            value = value.item()
        raise InputError(f"{key}: {msg}, got {value!r}")


def _field_key(settings, f) -> str:
    """How an error names field ``f`` of ``settings``: its run-config key under the class's
    ``key_prefix``, or, for a table of a study config (:class:`Table`), its name as the
    TOML writes it."""
    if isinstance(settings, Table):
        return settings.key_prefix + f.name
    return getattr(settings, "key_prefix", "") + (config_key(f) or f.name.replace("_", "-"))


def check_fields(settings) -> None:
    """Every ``float`` setting is a finite number (``inf`` or ``nan`` would run and mislead),
    every choice one of its values and every number in its declared range."""
    for f in fields(settings):
        value = getattr(settings, f.name)
        key = _field_key(settings, f)
        kind = f.metadata.get("items")
        for v in value if kind else (value,):  # a list setting: each of its values
            _check_value(f, kind or f.type, key, v)


def _check_value(f, kind: str, key: str, value) -> None:
    if isinstance(value, str) and value in f.metadata.get("words", ()):
        return
    if kind.startswith("float"):
        require(math.isfinite(value), key, "must be a finite number", value)
    choices = f.metadata.get("choices")
    if choices:
        require(value in choices, key, f"must be one of {', '.join(choices)}", value)
    declared = _range(f.metadata)
    if declared is not None:
        test, message = declared
        require(test(value), key, message, value)


class Declared:
    """A settings dataclass whose keys sit under its ``prefix`` (errors name
    ``<prefix>.<key>``), checked on construction (:func:`check_fields`)."""

    prefix = ""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.key_prefix = cls.prefix + "."

    def __post_init__(self) -> None:
        check_fields(self)


class Section(Declared):
    """A settings dataclass read from the run-config keys under its ``prefix``
    (``data``: keys ``data.<name>``)."""

    @classmethod
    def from_run_config(cls, run_config: dict, **fixed):
        """The settings of a run config's keys under the prefix; an unknown key, a wrong
        type or a value out of its declared range is an error naming the key.

        Parameters
        ----------
        run_config : dict
            A Flower run config.
        **fixed
            Fields set from elsewhere.

        Returns
        -------
        Section
            An instance of the class.
        """
        return from_run_config(cls, run_config, cls.prefix, **fixed)

    def to_run_config(self) -> dict:
        return to_run_config(self, self.prefix)


#: What a TOML value of each field type must be, and how an error says it (one, several).
_TOML_TYPES = {
    "int": ((int,), "an integer", "integers"),
    "float": ((int, float), "a number", "numbers"),
    "bool": ((bool,), "true or false", "true or false"),
    "str": ((str,), "a string", "strings"),
    "code": ((str, int), "a code", "codes (text or integers)"),
}


def _of_kind(value, kind: str) -> bool:
    kinds = _TOML_TYPES[kind][0]
    return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))


def _spaced(table: dict, key: str) -> list[float]:
    """``{max, min, num}``: ``num`` log-spaced values from ``max`` down to ``min``."""
    if set(table) != {"max", "min", "num"}:
        raise InputError(f"{key}: a table needs exactly max, min and num")
    hi, lo, num = table["max"], table["min"], table["num"]
    for name, v in (("max", hi), ("min", lo)):
        if not _of_kind(v, "float") or not math.isfinite(v):
            raise InputError(f"{key}.{name}: expected a number, got {v!r}")
    if not _of_kind(num, "int") or num < 1:
        raise InputError(f"{key}.num: must be an integer >= 1, got {num!r}")
    if not 0 < lo <= hi:
        raise InputError(f"{key}: need 0 < min <= max, got min {lo}, max {hi}")
    return [float(v) for v in (np.geomspace(hi, lo, num) if num > 1 else [hi])]


def _table_list(f, value, key: str) -> tuple:
    """A :func:`listing` setting's TOML value as its tuple (before the range checks)."""
    meta, kind = f.metadata, f.metadata["items"]
    if isinstance(value, dict) and meta["spaced"]:
        value = _spaced(value, key)
    elif isinstance(value, str) and kind in ("str", "code"):
        value = [v.strip() for v in value.split(",") if v.strip()]
    elif not isinstance(value, list):
        value = [value]
    if not value and meta["nonempty"]:
        raise InputError(f"{key}: give one or more values")
    for v in value:
        if not _of_kind(v, kind):
            raise InputError(f"{key}: expected {_TOML_TYPES[kind][2]}, got {v!r}")
    if meta["repeats"]:
        return tuple(float(v) if kind == "float" else v for v in value)
    if kind in ("str", "code"):
        value = [str(v) for v in value]
        twice = [v for i, v in enumerate(value) if v in value[:i]]
        if twice:
            raise InputError(f"{key}: {twice[0]!r} is given twice")
        return tuple(value)
    value = list(dict.fromkeys(float(v) if kind == "float" else v for v in value))
    return tuple(sorted(value, reverse=True) if meta["descending"] else value)


def table_value(f, value, key: str):
    """The TOML value of a study table's field as the field holds it; a value of the wrong
    type is an error naming ``key`` (the range checks follow on construction).

    Parameters
    ----------
    f : dataclasses.Field
        The field.
    value : object
        Its TOML value.
    key : str
        How an error names the setting (``<table>.<key>``).

    Returns
    -------
    object
        The value: a tuple for a :func:`listing` setting (``()`` for one of its ``words``), a
        ``float`` for a number field, otherwise ``value`` itself.
    """
    words = f.metadata.get("words", ())
    if isinstance(value, str) and value in words:
        return () if f.metadata.get("items") else value
    if f.metadata.get("items"):
        return _table_list(f, value, key)
    kind = f.type.split(" |")[0]
    if not _of_kind(value, kind):
        what = " or ".join([_TOML_TYPES[kind][1], *(repr(w) for w in words)])
        raise InputError(f"{key}: expected {what}, got {value!r}")
    return float(value) if kind == "float" else value


class Table(Declared):
    """A settings dataclass of one table of a study config (``prefix``: the table; keys as
    the TOML writes them, with underscores)."""

    @classmethod
    def from_table(cls, table, by_hand: tuple[str, ...] = (), prefix: str | None = None):
        """The settings of a TOML table: each key a field with a value of its type (no bool
        for a number; :func:`table_value`), or one of ``by_hand``; anything else is an error
        naming ``<table>.<key>``, as is a value out of its declared range.

        Parameters
        ----------
        table : dict
            The TOML table.
        by_hand : tuple of str, optional
            Keys the caller reads (tables); they are skipped.
        prefix : str, optional
            The table's name when it is not the class's (one declaration for several
            tables, as a study's per-method grids).

        Returns
        -------
        Table
            An instance of the class.
        """
        prefix = prefix or cls.prefix
        if not isinstance(table, dict):
            raise InputError(f"{prefix}: expected a table")
        declared = {f.name: f for f in fields(cls)}
        values = {}
        for key, value in table.items():
            if key in by_hand:
                continue
            if key not in declared:
                allowed = ", ".join([*declared, *by_hand])
                raise InputError(f"{prefix}.{key}: unknown setting (allowed: {allowed})")
            values[key] = table_value(declared[key], value, f"{prefix}.{key}")
        try:
            return cls(**values)
        except InputError as err:  # the range checks name the class's table
            if prefix == cls.prefix:
                raise
            raise InputError(prefix + str(err)[len(cls.prefix) :]) from None


def _coerce(cls, key: str, value, name: str | None = None):
    """Coerce a run-config value to the type of field ``name`` (default: ``key`` with
    underscores), naming the key on failure."""
    types = {f.name: f.type for f in fields(cls)}
    name = name or key.replace("-", "_")
    kind = types[name]
    try:
        if kind == "float":
            return float(value)
        if kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if kind == "str":
            return str(value)
        if kind == "bool":
            if isinstance(value, str):
                if value.strip().lower() in ("true", "1", "yes"):
                    return True
                if value.strip().lower() in ("false", "0", "no"):
                    return False
                raise ValueError
            return bool(value)
    except (TypeError, ValueError):
        raise InputError(f"{key}: expected a {kind}, got {value!r}") from None
    return value


def from_run_config(cls, run_config: dict, prefix: str, **fixed):
    """Build a settings class from a Flower run config; a key under ``prefix`` that names no
    field is an error naming it.

    Parameters
    ----------
    cls : type
        A settings dataclass.
    run_config : dict
        The run config; each field is read from its :func:`config_key` under ``prefix`` and
        coerced to the field's type.
    prefix : str
        The keys' prefix.
    **fixed
        Fields set from elsewhere.

    Returns
    -------
    object
        An instance of ``cls``.
    """
    at = {config_key(f, prefix): f.name for f in fields(cls)}
    at.pop(None, None)
    kwargs = dict(fixed)
    for key, value in run_config.items():
        if key in at:
            kwargs[at[key]] = _coerce(cls, key, value, at[key])
        elif key.startswith(prefix + "."):
            raise InputError(f"{key}: unknown setting")
    return cls(**kwargs)


def to_run_config(cfg, prefix: str) -> dict:
    """The inverse of :func:`from_run_config` (for ``flwr run --run-config``).

    Parameters
    ----------
    cfg : object
        A settings dataclass instance.
    prefix : str
        The keys' prefix.

    Returns
    -------
    dict
        Each field's value by its :func:`config_key`; fields without a key are left out.
    """
    out = {}
    for f in fields(cfg):
        key = config_key(f, prefix)
        if key is not None:
            out[key] = getattr(cfg, f.name)
    return out


def parse_methods(value: str, allowed: tuple[str, ...]) -> list[str]:
    """The methods of a comma-separated list; an empty list or a name not allowed is an
    :class:`InputError` naming ``method``.

    Parameters
    ----------
    value : str
        The comma-separated method names (spaces around a name are dropped).
    allowed : tuple of str
        The method names allowed.

    Returns
    -------
    list of str
        The names, in the order given.
    """
    methods = [m.strip() for m in str(value).split(",") if m.strip()]
    if not methods:
        raise InputError(f"method: give one or more of {', '.join(allowed)}")
    for m in methods:
        if m not in allowed:
            raise InputError(f"method: must be one of {', '.join(allowed)}, got {m!r}")
    return methods

"""One source of defaults: pyproject's run config equals the settings dataclasses, key for
key (``grauc.*``, ``rowfed.*``, ``data.*``, ``rowfed-data.*``), and the command lines
derive their options from the same dataclasses."""

import os
import re
import tomllib
from dataclasses import fields

import numpy as np
import pytest

from grauc_flower.cli import build_parser as grauc_parser
from grauc_flower.sources import DataSpec
from rowfed_flower.cli import build_parser as rowfed_parser
from rowfed_flower.sources import DataSpec as RowFedDataSpec
from strategies.config import (
    CheckpointConfig,
    GrAUCConfig,
    GuardsConfig,
    RegistrationConfig,
    RowFedConfig,
    TuneConfig,
    config_key,
    from_run_config,
    rowfed_run_config,
    to_run_config,
)
from strategies.errors import InputError

#: Keys of the app itself (not of a settings dataclass), with their defaults.
APP_KEYS = {
    "task": "grauc",
    "method": "grauc,fedavg,individual",
    "out-dir": "",
    "round-timeout": 0.0,
}

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _app_config() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        doc = tomllib.load(fh)
    flat = {}

    def walk(prefix, d):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else k
            if isinstance(v, dict):
                walk(key, v)
            else:
                flat[key] = v

    walk("", doc["tool"]["flwr"]["app"]["config"])
    return flat


def test_every_pyproject_key_is_a_setting_with_its_default():
    """Every key of [tool.flwr.app.config] comes from one dataclass (or is an app key), with
    the dataclass's default, and every dataclass field has its key."""
    app = _app_config()
    expected = {
        **APP_KEYS,
        **to_run_config(GrAUCConfig(), "grauc"),
        **rowfed_run_config(RowFedConfig()),
        **DataSpec().to_run_config(),
        **RowFedDataSpec().to_run_config(),
        **to_run_config(RegistrationConfig(), "registration"),
        **to_run_config(TuneConfig(), "tune"),
        **to_run_config(CheckpointConfig(), "checkpoint"),
        **GuardsConfig().to_run_config(),
    }
    assert set(app) == set(expected), set(app) ^ set(expected)
    for key, value in expected.items():
        assert app[key] == value, key


@pytest.mark.parametrize(
    ("spec", "key", "value"),
    [
        (DataSpec, "data.bogus", 1),
        (DataSpec, "data.num-sites", "many"),
        (DataSpec, "data.n-train", 2.5),
        (RowFedDataSpec, "rowfed-data.bogus", 1),
        (RowFedDataSpec, "rowfed-data.num-clients", "x"),
    ],
)
def test_data_keys_are_checked(spec, key, value):
    with pytest.raises(InputError, match=key):
        spec.from_run_config({key: value})


def test_data_spec_round_trip():
    spec = DataSpec(source="crime", n_sites=7, prevalence=0.2, counties="1,2")
    assert DataSpec.from_run_config(spec.to_run_config()) == spec


@pytest.mark.parametrize(
    ("parser", "cls"), [(grauc_parser, GrAUCConfig), (rowfed_parser, RowFedConfig)]
)
def test_fit_help_shows_every_setting_with_its_default(parser, cls):
    fit = parser()._subparsers._group_actions[0].choices["fit"]
    actions = {a.dest: a for a in fit._actions}
    defaults = cls()
    for f in fields(cls):
        action = actions[f.name]
        assert action.help and "(default: " in action.help, f.name
        value = getattr(defaults, f.name)
        shown = f"{value:g}" if isinstance(value, float) else str(value).lower()
        assert action.help.endswith(f"(default: {shown})"), (f.name, action.help)
        if f.metadata.get("choices"):
            assert tuple(action.choices) == f.metadata["choices"]
    # every other option of fit has a help text too
    for a in fit._actions:
        assert a.help, a.dest


def test_run_config_round_trip():
    cfg = GrAUCConfig(lam=0.3, graph="knn", knn_k=5, local_solver="linearized", seed=7)
    assert from_run_config(GrAUCConfig, to_run_config(cfg, "grauc"), "grauc") == cfg


@pytest.mark.parametrize(
    "key,value,field",
    [
        ("grauc.lam", -1.0, "lam"),
        ("grauc.rho", 0.0, "rho"),
        ("grauc.q", 2.0, "q"),
        ("grauc.graph", "ring", "graph"),
        ("grauc.max-rounds", 0, "max-rounds"),
        ("grauc.min-fit-fraction", 0.0, "min-fit-fraction"),
        ("grauc.bogus", 1, "grauc.bogus"),
        ("grauc.lam", "abc", "lam"),
    ],
)
def test_bad_values_name_the_key(key, value, field):
    with pytest.raises(InputError, match=field):
        from_run_config(GrAUCConfig, {key: value}, "grauc")


# ---------------------------------------------------------------------------------------
# Data, checkpoint and tuning settings: keys, options and checks from one declaration
# ---------------------------------------------------------------------------------------
#: The settings classes read from a run config's keys under a prefix, and which ``fit``
#: command carries their flagged fields as options.
DECLARED = [
    (DataSpec, "data", "grauc"),
    (CheckpointConfig, "checkpoint", "grauc"),
    (RowFedDataSpec, "rowfed-data", "rowfed"),
    (TuneConfig, "tune", None),
    (RegistrationConfig, "registration", None),
    (GuardsConfig, "guards", None),
]


def _bad_values(f):
    """Values outside a field's declared choices or range (from its declaration alone)."""
    meta = f.metadata
    out = []
    if meta.get("choices"):
        out.append("not-one-of-them")
    step = 1 if (meta.get("items") or f.type) == "int" else 0.5
    if meta.get("at_least") is not None:
        out.append(meta["at_least"] - step)
    if meta.get("above") is not None:
        out.append(meta["above"])
    if meta.get("at_most") is not None:
        out.append(meta["at_most"] + step)
    if meta.get("below") is not None:
        out.append(meta["below"])
    return out


CASES = [
    (cls, prefix, command, f, value)
    for cls, prefix, command in DECLARED
    for f in fields(cls)
    for value in _bad_values(f)
]


def test_every_checked_declaration_has_a_case():
    """The data specs declare what they check: each has fields with a range or choices."""
    for cls in (DataSpec, RowFedDataSpec, CheckpointConfig):
        assert any(c[0] is cls for c in CASES), cls


@pytest.mark.parametrize(
    ("cls", "prefix", "f", "value"),
    [(c, p, f, v) for c, p, _, f, v in CASES],
    ids=[f"{c.__name__}.{f.name}={v}" for c, _, _, f, v in CASES],
)
def test_a_run_config_value_out_of_its_declaration_names_the_key(cls, prefix, f, value):
    key = config_key(f, prefix)
    with pytest.raises(InputError, match=rf"^{key}: must be"):
        from_run_config(cls, {key: value}, prefix)
    default = getattr(cls(), f.name)
    assert from_run_config(cls, {key: default}, prefix) == cls()  # the default passes


FLAGGED = [c for c in CASES if c[2] and c[3].metadata.get("flag")]


@pytest.mark.parametrize(
    ("command", "f", "value"),
    [(cmd, f, v) for _, _, cmd, f, v in FLAGGED],
    ids=[f"{cmd}:--{f.metadata['flag']}={v}" for _, _, cmd, f, v in FLAGGED],
)
def test_a_fit_option_out_of_its_declaration_is_one_line_naming_the_option(
    command, f, value, tmp_path, capsys
):
    """Every flagged field is a ``fit`` option whose bad value ends the command before any
    data is read or written: one line ``error: <option>...``, exit 2, nothing written."""
    from grauc_flower.cli import main as grauc_main
    from rowfed_flower.cli import main as rowfed_main

    out = tmp_path / "out"
    flag = f.metadata["flag"]
    if command == "grauc":
        args = ["fit", "--source", "simulated", "--out", str(out), "--quiet"]
        main = grauc_main
    else:
        data = tmp_path / "d.csv"
        data.write_text("client,x,y\na,1,2\na,2,3\nb,1,1\nb,3,2\n")
        args = ["fit", "--data", str(data), "--responses", "y", "--out", str(out)]
        main = rowfed_main
    capsys.readouterr()
    try:
        code = main([*args, f"--{flag}", str(value)])
    except SystemExit as stop:  # argparse's own refusals
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith((f"error: {flag}: ", f"error: argument --{flag}:")), lines[0]
    assert not out.exists()


@pytest.mark.parametrize(("cls", "parser"), [(DataSpec, grauc_parser), (CheckpointConfig,
                         grauc_parser), (RowFedDataSpec, rowfed_parser)])  # fmt: skip
def test_fit_options_of_a_declaration_carry_its_default_and_help(cls, parser):
    fit = parser()._subparsers._group_actions[0].choices["fit"]
    actions = {a.option_strings[0]: a for a in fit._actions if a.option_strings}
    defaults = cls()
    flagged = [f for f in fields(cls) if f.metadata.get("flag")]
    assert flagged
    for f in flagged:
        action = actions["--" + f.metadata["flag"]]
        assert action.default == getattr(defaults, f.name)
        assert action.help.startswith(f.metadata["help"])
        if getattr(defaults, f.name) != "":
            assert "(default: " in action.help
        if f.metadata.get("choices"):
            assert tuple(action.choices) == f.metadata["choices"]


# ---------------------------------------------------------------------------------------
# A study config's tables ([tuning], [data], [tuning.<method>]): declared the same way
# ---------------------------------------------------------------------------------------
def _study_tables():
    """Every table declaration of both studies, with the smallest table it accepts and the
    keys its caller reads beside it."""
    from grauc_flower import study as gs
    from rowfed_flower import study as rs

    return [
        (gs.StudyTuning, {}, ()),
        (gs.SimulatedData, {}, ()),
        (gs.RealData, {}, ()),
        (rs.StudyTuning, {}, rs.TUNED),
        (rs.MethodGrids, {}, ()),
        (rs.SimulatedData, {}, ()),
        (rs.RealData, {"responses": ["y"]}, ()),
    ]


TABLES = _study_tables()


def _good_item(f):
    """One value a list setting's items accept (from its declaration)."""
    meta = f.metadata
    if meta.get("choices"):
        return meta["choices"][0]
    kind = meta["items"]
    if kind in ("str", "code"):
        return "a"
    low = meta.get("at_least") or 0
    return (
        int(low) + 1
        if kind == "int"
        else float(low) + 0.5
        if meta.get("at_most") is None
        else float(low)
    )


TABLE_IDS = [f"{c.__module__.split('.')[0]}.{c.__name__}" for c, _, _ in TABLES]


@pytest.mark.parametrize(("cls", "base", "by_hand"), TABLES, ids=TABLE_IDS)
def test_a_study_table_is_read_from_its_declaration(cls, base, by_hand):
    """Out of the declared range or choices, of the wrong TOML type (a bool for a number,
    text for a number, a number for true/false) or an unknown key: one error naming
    ``<table>.<key>``; a list setting checks each value, its emptiness and its repeats; the
    defaults and the keys read by hand pass."""
    prefix = re.escape(cls.prefix)
    from_table = cls.from_table
    default = from_table(dict(base), by_hand)
    assert from_table({**base, **dict.fromkeys(by_hand, {})}, by_hand) == default
    for f in fields(cls):
        key = rf"^{prefix}\.{f.name}"
        meta = f.metadata
        if meta.get("items"):
            good = _good_item(f)
            for value in _bad_values(f):
                with pytest.raises(InputError, match=rf"{key}: must be"):
                    from_table({**base, f.name: [good, value]}, by_hand)
            wrong = {"int": [True, "3", 2.5], "float": [True, "x"], "str": [3], "code": [1.5]}
            for value in wrong[meta["items"]]:
                with pytest.raises(InputError, match=rf"{key}: expected "):
                    from_table({**base, f.name: [good, value]}, by_hand)
            if meta["nonempty"]:
                with pytest.raises(InputError, match=rf"{key}: give one or more values"):
                    from_table({**base, f.name: []}, by_hand)
            twice = getattr(from_table({**base, f.name: [good, good]}, by_hand), f.name) \
                if meta["repeats"] or meta["items"] not in ("str", "code") else None  # fmt: skip
            if twice is None:
                with pytest.raises(InputError, match=rf"{key}: 'a' is given twice"):
                    from_table({**base, f.name: [good, good]}, by_hand)
            else:
                assert len(twice) == (2 if meta["repeats"] else 1)
            for word in meta["words"]:
                assert getattr(from_table({**base, f.name: word}, by_hand), f.name) == ()
            continue
        for value in _bad_values(f):
            with pytest.raises(InputError, match=rf"{key}: must be"):
                from_table({**base, f.name: value}, by_hand)
        kind = f.type.split(" |")[0]
        wrong = {"int": [True, "3", 2.5], "float": [True, "x"], "bool": [1, "yes"], "str": [3]}
        for value in wrong[kind]:
            with pytest.raises(InputError, match=rf"{key}: expected "):
                from_table({**base, f.name: value}, by_hand)
        for word in meta["words"]:
            assert getattr(from_table({**base, f.name: word}, by_hand), f.name) == word
    with pytest.raises(InputError, match=rf"^{prefix}\.bogus: unknown setting"):
        from_table({**base, "bogus": 1}, by_hand)
    with pytest.raises(InputError, match=rf"^{prefix}: expected a table"):
        from_table([1], by_hand)


def test_a_spaced_grid_is_log_spaced_and_checked():
    """``{max, min, num}``: ``num`` values from ``max`` down to ``min`` with equal ratios;
    a missing key, ``min`` above ``max`` or a bad ``num`` is one error naming the key."""
    from grauc_flower.study import StudyTuning

    lam = StudyTuning.from_table({"lam": {"max": 2.0, "min": 0.02, "num": 5}}).lam
    assert len(lam) == 5 and lam[0] == 2.0 and abs(lam[-1] - 0.02) < 1e-15
    assert np.allclose(np.array(lam[1:]) / np.array(lam[:-1]), 0.1**0.5)
    assert StudyTuning.from_table({"lam": {"max": 2.0, "min": 0.02, "num": 1}}).lam == (2.0,)
    for bad, what in (
        ({"max": 2.0, "min": 0.02}, r"tuning\.lam: a table needs exactly max, min and num"),
        ({"max": 0.01, "min": 0.02, "num": 3}, r"tuning\.lam: need 0 < min <= max"),
        ({"max": 2.0, "min": 0.02, "num": 0}, r"tuning\.lam\.num: must be an integer >= 1"),
        ({"max": "x", "min": 0.02, "num": 3}, r"tuning\.lam\.max: expected a number"),
    ):
        with pytest.raises(InputError, match="^" + what):
            StudyTuning.from_table({"lam": bad})


def test_a_method_grid_table_names_its_method():
    from rowfed_flower.study import MethodGrids

    with pytest.raises(InputError, match=r"^tuning\.perfl-lsma\.lam1: must be >= 0, got -1"):
        MethodGrids.from_table({"lam1": [1.0, -1]}, prefix="tuning.perfl-lsma")
    with pytest.raises(InputError, match=r"^tuning\.perfl-lsma\.bogus: unknown setting"):
        MethodGrids.from_table({"bogus": [1.0]}, prefix="tuning.perfl-lsma")

"""One source of defaults: pyproject's run config equals the settings dataclasses, key for
key (``grauc.*``, ``rowfed.*``, ``data.*``, ``rowfed-data.*``), and the command lines
derive their options from the same dataclasses."""

import os
import tomllib
from dataclasses import fields

import pytest

from grauc_flower.cli import build_parser as grauc_parser
from grauc_flower.sources import DataSpec
from rowfed_flower.cli import build_parser as rowfed_parser
from rowfed_flower.sources import RowFedDataSpec
from strategies.config import (
    CheckpointConfig,
    GrAUCConfig,
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
]


def _bad_values(f):
    """Values outside a field's declared choices or range (from its declaration alone)."""
    meta = f.metadata
    out = []
    if meta.get("choices"):
        out.append("not-one-of-them")
    step = 1 if f.type == "int" else 0.5
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
# A study config's [tuning] table: its scalar settings declared the same way
# ---------------------------------------------------------------------------------------
def _study_tunings():
    from grauc_flower.study import GRIDS
    from grauc_flower.study import StudyTuning as GrAUCTuning
    from rowfed_flower.study import TUNED
    from rowfed_flower.study import StudyTuning as RowFedTuning

    return [(GrAUCTuning, GRIDS), (RowFedTuning, ("lam1", "lam2", "fedavg_lam2", *TUNED))]


@pytest.mark.parametrize("which", [0, 1], ids=["grauc", "rowfed"])
def test_a_study_tuning_table_is_read_from_its_declaration(which):
    """Out of the declared range or choices, of the wrong TOML type (a bool for a number,
    text for a number, a number for true/false) or an unknown key: one error naming
    ``tuning.<key>``; the defaults and the keys read by hand pass."""
    cls, by_hand = _study_tunings()[which]
    from_table = cls.from_table
    assert from_table({}, by_hand) == cls()
    assert from_table(dict.fromkeys(by_hand, [1.0]), by_hand) == cls()
    for f in fields(cls):
        for value in _bad_values(f):
            with pytest.raises(InputError, match=rf"^tuning\.{f.name}: must be"):
                from_table({f.name: value}, by_hand)
        wrong = {"int": [True, "3", 2.5], "float": [True, "x"], "bool": [1, "yes"], "str": [3]}
        for value in wrong[f.type]:
            with pytest.raises(InputError, match=rf"^tuning\.{f.name}: expected "):
                from_table({f.name: value}, by_hand)
    with pytest.raises(InputError, match=r"^tuning\.bogus: unknown setting"):
        from_table({"bogus": 1}, by_hand)
    with pytest.raises(InputError, match=r"^tuning: expected a table"):
        from_table([1], by_hand)

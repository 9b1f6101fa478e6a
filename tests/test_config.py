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
    GrAUCConfig,
    RegistrationConfig,
    RowFedConfig,
    TuneConfig,
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
    "checkpoint.path": "",
    "checkpoint.every": 10,
    "checkpoint.resume": "",
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

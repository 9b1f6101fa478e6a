"""One source of defaults: pyproject's run config equals the config dataclasses."""

import os
import tomllib
from dataclasses import fields

import pytest

from strategies.config import GrAUCConfig, from_run_config, to_run_config
from strategies.errors import InputError

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


def test_grauc_defaults_match_pyproject():
    app = _app_config()
    expected = to_run_config(GrAUCConfig(), "grauc")
    for key, value in expected.items():
        assert key in app, f"{key} missing from [tool.flwr.app.config]"
        assert app[key] == value, key
    declared = {k for k in app if k.startswith("grauc.")}
    assert declared == {k for k in expected if k.startswith("grauc.")}


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


def test_every_field_documented_in_pyproject():
    app = _app_config()
    for f in fields(GrAUCConfig):
        key = "seed" if f.name == "seed" else "grauc." + f.name.replace("_", "-")
        assert key in app

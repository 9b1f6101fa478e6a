"""Run configuration: one frozen, validated object per method (GrAUC-PFL, RowFed).

Every key has its default here and again, with the same value, in ``pyproject.toml``'s
``[tool.flwr.app.config]`` (Flower needs them there; ``tests/test_config.py`` checks they
agree).  ``configs/*.toml`` only override.  Errors name the key and the allowed range.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields

from .errors import InputError
from .penalties import DEFAULT_CONCAVITY, KINDS, Penalty

GRAUC_METHODS = ("grauc", "fedavg", "individual", "pooled")


def _check(cond: bool, key: str, msg: str, value) -> None:
    if not cond:
        if hasattr(value, "dtype") and hasattr(value, "item"):  # a numpy scalar: plain repr
            value = value.item()
        raise InputError(f"{key}: {msg}, got {value!r}")


def _check_finite(settings) -> None:
    """Every ``float`` setting is a finite number (``inf`` or ``nan`` would run and mislead)."""
    for f in fields(settings):
        if f.type == "float":
            value = getattr(settings, f.name)
            key = f.name.replace("_", "-")
            _check(math.isfinite(value), key, "must be a finite number", value)


@dataclass(frozen=True)
class GrAUCConfig:
    """Settings of a GrAUC-PFL fit and its baselines (run-config keys in brackets)."""

    lam: float = 0.1  # [grauc.lam] fused-lasso level lambda >= 0
    ridge: float = 1e-3  # [grauc.ridge] ridge eta >= 0
    w_dist: float = 1.0  # [grauc.w-dist] Gaussian-kernel decay of edge weights >= 0
    q: float = 0.01  # [grauc.q] smallest edge weight, in [0, 1]
    rho: float = 0.1  # [grauc.rho] ADMM penalty > 0
    graph: str = "mst"  # [grauc.graph] mst | knn | complete
    knn_k: int = 3  # [grauc.knn-k] neighbours for graph = knn
    penalty: str = "l1"  # [grauc.penalty] l1 | group
    algorithm: str = "pqn"  # [grauc.algorithm] pqn (proximal quasi-Newton) | admm (the paper)
    local_solver: str = "prox"  # [grauc.local-solver] prox | linearized (algorithm = admm)
    init: str = "random"  # [grauc.init] random (N(0, I), the paper) | zeros
    tol: float = 1e-6  # [grauc.tol] stopping tolerance > 0 (ADMM residuals; pqn: decrease)
    max_rounds: int = 300  # [grauc.max-rounds] ADMM round limit >= 1
    min_fit_fraction: float = 1.0  # [grauc.min-fit-fraction] sites needed for a round
    standardize: str = "none"  # [grauc.standardize] none | federated
    missing_class: str = "error"  # [grauc.missing-class] error | borrow
    fedavg_rounds: int = 100  # [grauc.fedavg-rounds] FedAvg rounds >= 1
    fedavg_local_steps: int = 5  # [grauc.fedavg-local-steps] local gradient steps >= 1
    fedavg_lr: float = 0.0  # [grauc.fedavg-lr] local step size; 0 = 1/mu_z per site
    seed: int = 0  # [seed] random seed (initial coefficients)

    def __post_init__(self) -> None:
        _check_finite(self)
        _check(self.lam >= 0, "lam", "must be >= 0", self.lam)
        _check(self.ridge >= 0, "ridge", "must be >= 0", self.ridge)
        _check(self.w_dist >= 0, "w-dist", "must be >= 0", self.w_dist)
        _check(0 <= self.q <= 1, "q", "must be in [0, 1]", self.q)
        _check(self.rho > 0, "rho", "must be > 0", self.rho)
        _check(
            self.graph in ("mst", "knn", "complete"),
            "graph",
            "must be mst, knn or complete",
            self.graph,
        )
        _check(self.knn_k >= 1, "knn-k", "must be >= 1", self.knn_k)
        _check(self.penalty in ("l1", "group"), "penalty", "must be l1 or group", self.penalty)
        _check(
            self.algorithm in ("pqn", "admm"),
            "algorithm",
            "must be pqn or admm",
            self.algorithm,
        )
        _check(
            self.local_solver in ("prox", "linearized"),
            "local-solver",
            "must be prox or linearized",
            self.local_solver,
        )
        _check(self.init in ("random", "zeros"), "init", "must be random or zeros", self.init)
        _check(self.tol > 0, "tol", "must be > 0", self.tol)
        _check(self.max_rounds >= 1, "max-rounds", "must be >= 1", self.max_rounds)
        _check(
            0 < self.min_fit_fraction <= 1,
            "min-fit-fraction",
            "must be in (0, 1]",
            self.min_fit_fraction,
        )
        _check(
            self.standardize in ("none", "federated"),
            "standardize",
            "must be none or federated",
            self.standardize,
        )
        _check(
            self.missing_class in ("error", "borrow"),
            "missing-class",
            "must be error or borrow",
            self.missing_class,
        )
        _check(self.fedavg_rounds >= 1, "fedavg-rounds", "must be >= 1", self.fedavg_rounds)
        _check(
            self.fedavg_local_steps >= 1,
            "fedavg-local-steps",
            "must be >= 1",
            self.fedavg_local_steps,
        )
        _check(self.fedavg_lr >= 0, "fedavg-lr", "must be >= 0", self.fedavg_lr)

    def replace(self, **changes) -> GrAUCConfig:
        return dataclasses.replace(self, **changes)


def _coerce(cls, key: str, value):
    """Coerce a run-config value to the field's type, naming the key on failure."""
    types = {f.name: f.type for f in fields(cls)}
    name = key.replace("-", "_")
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


def from_run_config(cls, run_config: dict, prefix: str):
    """Build ``cls`` from a Flower run config (keys ``prefix.<name-with-dashes>``)."""
    kwargs = {}
    names = {f.name for f in fields(cls)}
    for key, value in run_config.items():
        if key == "seed" and "seed" in names:
            kwargs["seed"] = _coerce(cls, "seed", value)
        elif key.startswith(prefix + "."):
            short = key[len(prefix) + 1 :]
            if short.replace("-", "_") not in names:
                raise InputError(f"{key}: unknown setting")
            kwargs[short.replace("-", "_")] = _coerce(cls, short, value)
    return cls(**kwargs)


def to_run_config(cfg, prefix: str) -> dict:
    """The inverse of :func:`from_run_config` (for ``flwr run --run-config``)."""
    out = {}
    for f in fields(cfg):
        key = "seed" if f.name == "seed" else f"{prefix}.{f.name.replace('_', '-')}"
        out[key] = getattr(cfg, f.name)
    return out


def parse_methods(value: str, allowed: tuple[str, ...]) -> list[str]:
    methods = [m.strip() for m in str(value).split(",") if m.strip()]
    if not methods:
        raise InputError(f"method: give one or more of {', '.join(allowed)}")
    for m in methods:
        if m not in allowed:
            raise InputError(f"method: must be one of {', '.join(allowed)}, got {m!r}")
    return methods


# ---------------------------------------------------------------------------------------
# RowFed
# ---------------------------------------------------------------------------------------
#: Method names accepted by ``method`` when ``task = "rowfed"``.
ROWFED_METHODS = ("rowfed", "nonfed", "fedavg", "perfl-lsma")
#: Run-config prefix of :class:`RowFedConfig`'s keys.
PREFIX = "rowfed"


@dataclass(frozen=True)
class RowFedConfig:
    """Settings of a RowFed fit and its baselines (run-config keys in brackets).

    Notes
    -----
    ``concavity = 0`` means the penalty's default (3 for MCP, 3.7 for SCAD; METHODS.md B.2).
    MCP needs ``concavity > 1/rho`` and SCAD ``concavity > 1 + 1/rho`` (the thresholds of
    B.3 are then unique minimizers); a schedule ``rho <- alpha rho`` with ``alpha >= 1``
    keeps this true in later rounds.
    """

    penalty: str = "lasso"  # [rowfed.penalty] lasso | mcp | scad
    concavity: float = 0.0  # [rowfed.concavity] iota; 0 = default (3 MCP, 3.7 SCAD)
    lam1: float = 0.05  # [rowfed.lam1] row-wise fusion level >= 0
    lam2: float = 0.02  # [rowfed.lam2] sparsity level >= 0
    sparsity: str = "entry"  # [rowfed.sparsity] entry | row
    graph: str = "all-pairs"  # [rowfed.graph] all-pairs | path to an edge CSV
    participation: float = 1.0  # [rowfed.participation] pi in (0, 1]
    rho: float = 1.0  # [rowfed.rho] initial ADMM penalty > 0
    alpha: float = 1.0  # [rowfed.alpha] rho <- alpha rho each round, >= 1
    algorithm: str = "auto"  # [rowfed.algorithm] auto | pqn | admm (auto: see resolved_algorithm)
    local_solver: str = "prox"  # [rowfed.local-solver] prox | linearized (algorithm admm)
    init: str = "ridge"  # [rowfed.init] oracle initial estimate: ridge | nonfed
    tol: float = 1e-6  # [rowfed.tol] absolute and relative residual tolerance > 0
    max_rounds: int = 1000  # [rowfed.max-rounds] ADMM round limit >= 1
    intercept: bool = True  # [rowfed.intercept] a free intercept per client and response
    standardize: str = "none"  # [rowfed.standardize] none | federated (pooled SD)
    fedavg_rounds: int = 100  # [rowfed.fedavg-rounds] FedAvg rounds >= 1
    fedavg_local_steps: int = 5  # [rowfed.fedavg-local-steps] local prox-gradient steps >= 1
    fedavg_lr: float = 0.0  # [rowfed.fedavg-lr] local step size; 0 = 1/L_m per client
    seed: int = 0  # [seed] participation draws

    def __post_init__(self) -> None:
        _check_finite(self)
        _check(self.penalty in KINDS, "penalty", f"must be one of {', '.join(KINDS)}", self.penalty)
        _check(self.concavity >= 0, "concavity", "must be >= 0 (0 = default)", self.concavity)
        _check(self.lam1 >= 0, "lam1", "must be >= 0", self.lam1)
        _check(self.lam2 >= 0, "lam2", "must be >= 0", self.lam2)
        _check(self.sparsity in ("entry", "row"), "sparsity", "must be entry or row", self.sparsity)
        _check(
            isinstance(self.graph, str) and self.graph != "",
            "graph",
            "must be all-pairs or a path to an edge CSV",
            self.graph,
        )
        _check(
            0 < self.participation <= 1,
            "participation",
            "must be in (0, 1]",
            self.participation,
        )
        _check(self.rho > 0, "rho", "must be > 0", self.rho)
        _check(
            self.algorithm in ("auto", "pqn", "admm"),
            "algorithm",
            "must be auto, pqn or admm",
            self.algorithm,
        )
        _check(
            self.algorithm != "pqn" or (self.penalty == "lasso" and self.participation == 1),
            "algorithm",
            "pqn needs penalty = lasso and participation = 1 (use admm)",
            self.algorithm,
        )
        _check(self.alpha >= 1, "alpha", "must be >= 1", self.alpha)
        _check(
            self.local_solver in ("prox", "linearized"),
            "local-solver",
            "must be prox or linearized",
            self.local_solver,
        )
        _check(self.init in ("ridge", "nonfed"), "init", "must be ridge or nonfed", self.init)
        _check(self.tol > 0, "tol", "must be > 0", self.tol)
        _check(self.max_rounds >= 1, "max-rounds", "must be >= 1", self.max_rounds)
        _check(
            isinstance(self.intercept, bool), "intercept", "must be true or false", self.intercept
        )
        _check(
            self.standardize in ("none", "federated"),
            "standardize",
            "must be none or federated",
            self.standardize,
        )
        _check(self.fedavg_rounds >= 1, "fedavg-rounds", "must be >= 1", self.fedavg_rounds)
        _check(
            self.fedavg_local_steps >= 1,
            "fedavg-local-steps",
            "must be >= 1",
            self.fedavg_local_steps,
        )
        _check(self.fedavg_lr >= 0, "fedavg-lr", "must be >= 0", self.fedavg_lr)
        iota = self.iota
        if self.penalty == "mcp":
            _check(
                iota > 1.0 / self.rho,
                "concavity",
                f"MCP needs concavity > 1/rho = {1.0 / self.rho:g}",
                iota,
            )
        if self.penalty == "scad":
            _check(
                iota > 1.0 + 1.0 / self.rho,
                "concavity",
                f"SCAD needs concavity > 1 + 1/rho = {1.0 + 1.0 / self.rho:g}",
                iota,
            )

    @property
    def iota(self) -> float:
        """The concavity in use (the penalty's default when ``concavity == 0``)."""
        return (
            float(self.concavity) if self.concavity > 0 else float(DEFAULT_CONCAVITY[self.penalty])
        )

    def penalty_obj(self) -> Penalty:
        """The :class:`Penalty` used for fusion and sparsity."""
        return Penalty(self.penalty, None if self.penalty == "lasso" else self.iota)

    @property
    def resolved_algorithm(self) -> str:
        """``auto``: the proximal quasi-Newton method (a handful of rounds) for the convex
        lasso with every client in every round; the paper's ADMM for MCP/SCAD (nonconvex:
        its fixed points are what the paper studies) and for partial participation."""
        if self.algorithm != "auto":
            return self.algorithm
        return "pqn" if self.penalty == "lasso" and self.participation == 1 else "admm"

    def replace(self, **changes) -> RowFedConfig:
        return dataclasses.replace(self, **changes)


def _bool(value, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InputError(f"{key}: expected true or false, got {value!r}")


def rowfed_config(run_config: dict) -> RowFedConfig:
    """:class:`RowFedConfig` from a Flower run config (keys ``rowfed.<name>`` and ``seed``)."""
    rc = dict(run_config)
    key = f"{PREFIX}.intercept"
    if key in rc:
        rc[key] = _bool(rc[key], "intercept")
    return from_run_config(RowFedConfig, rc, PREFIX)


def rowfed_run_config(cfg: RowFedConfig) -> dict:
    """The inverse of :func:`rowfed_config` (for ``flwr run --run-config``)."""
    return to_run_config(cfg, PREFIX)


def rowfed_methods(run_config: dict) -> list[str]:
    return parse_methods(run_config.get("method", "rowfed"), ROWFED_METHODS)

"""Run configuration: one frozen, validated object per method (GrAUC-PFL, RowFed), and the
tuning, registration, guard and checkpoint sections.

Every key has its default here and again, with the same value, in ``pyproject.toml``'s
``[tool.flwr.app.config]`` (Flower needs them there; ``tests/test_config.py`` checks they
agree).  ``configs/*.toml`` only override.  Errors name the key and the allowed range.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ..errors import InputError
from ..solvers.penalties import DEFAULT_CONCAVITY, KINDS, Penalty
from ..stats.inference import INFERENCE_CHOICES
from .settings import (
    Section,
    check_fields,
    from_run_config,
    parse_methods,
    require,
    setting,
    to_run_config,
)

#: Flower's own strategies that train one global model, by method name (the FedAvg family;
#: :mod:`strategies.server.fedavg`).  The same names for both methods.
GLOBAL_METHODS = (
    "fedavg",
    "fedprox",
    "fedavgm",
    "fedadagrad",
    "fedadam",
    "fedyogi",
    "fedmedian",
    "fedtrimmedavg",
    "krum",
)
#: Personalized comparators built on FedAvg (:mod:`strategies.server.fedavg`): Ditto's personal
#: models ``argmin f_z + (mu/2)||b - w||^2`` around FedAvg's ``w``, local fine-tuning of
#: ``w``, and IFCA's clustered models.
PERSONAL_METHODS = ("ditto", "fedavg-ft", "ifca")
#: Every method whose server is Flower's FedAvg or one of its kin.
FEDAVG_FAMILY = GLOBAL_METHODS + PERSONAL_METHODS
GRAUC_METHODS = ("grauc", "fedavg", "individual", "pooled", "mean-fusion", *FEDAVG_FAMILY[1:])
#: GrAUC-PFL, and the same fused penalty toward the federation's mean (docs/methods.md 3.10).
GRAUC_FUSED_METHODS = ("grauc", "mean-fusion")
#: ``curvature`` values: the pqn models learned from gradients, or the sites' Hessians.
CURVATURE_CHOICES = ("learned", "exact")


def fedavg_settings(step: str, default_lr: str) -> tuple:
    """The FedAvg comparator's three settings, the same for both methods: rounds, local
    steps per round and their step size (0: the site's own default).

    Parameters
    ----------
    step : str
        The kind of local step, as the help names it (``"gradient"``).
    default_lr : str
        How the help names the step size a site uses for 0 (``"1/mu_z per site"``).

    Returns
    -------
    tuple of dataclasses.Field
        The rounds, local steps and step size settings (:func:`setting`).
    """
    return (
        setting(100, "FedAvg rounds >= 1", at_least=1),
        setting(5, f"local {step} steps >= 1", at_least=1),
        setting(0.0, f"local step size; 0 = {default_lr}", at_least=0),
    )


@dataclass(frozen=True)
class ComparatorSettings:
    """The comparators' settings beyond FedAvg's, the same for both methods (both configs
    derive from this; docs/methods.md 3.7–3.9): FedProx's proximal ``mu``;
    FedAdagrad/FedAdam/FedYogi's server step ``eta``, moment decays and ``tau``; FedAvgM's
    server step and momentum; FedTrimmedAvg's cut share; Krum's assumed malicious sites and
    the models it keeps; Ditto's ``mu``; fine-tuning's local steps; IFCA's ``k``."""

    fedprox_mu: float = setting(
        0.01, "fedprox: proximal mu >= 0 on the sites' local steps", at_least=0
    )
    fedopt_eta: float = setting(0.1, "fedadagrad/fedadam/fedyogi: server step eta > 0", above=0)
    fedopt_beta_1: float = setting(
        0.9, "fedadam/fedyogi: first-moment decay, in [0, 1)", at_least=0, below=1
    )
    fedopt_beta_2: float = setting(
        0.99, "fedadam/fedyogi: second-moment decay, in [0, 1)", at_least=0, below=1
    )
    fedopt_tau: float = setting(1e-3, "fedadagrad/fedadam/fedyogi: adaptivity tau > 0", above=0)
    fedavgm_lr: float = setting(1.0, "fedavgm: server step > 0", above=0)
    fedavgm_momentum: float = setting(
        0.9, "fedavgm: server momentum, in [0, 1)", at_least=0, below=1
    )
    fedtrimmedavg_beta: float = setting(
        0.2, "fedtrimmedavg: share cut at each end, in [0, 0.5)", at_least=0, below=0.5
    )
    krum_malicious: int = setting(0, "krum: malicious sites assumed, >= 0", at_least=0)
    krum_keep: int = setting(0, "krum: models averaged (0: the one Krum picks), >= 0", at_least=0)
    ditto_mu: float = setting(
        0.1, "ditto: pull mu > 0 of each personal model toward the global one", above=0
    )
    ft_steps: int = setting(10, "fedavg-ft: local steps from the global model, >= 1", at_least=1)
    ifca_k: int = setting(2, "ifca: cluster models k >= 1", at_least=1)


def curvature_setting():
    """``curvature``: how the pqn server models each site's loss, the same for both methods
    (:mod:`strategies.solvers.pqn`)."""
    return setting(
        "learned",
        "pqn's curvature: learned from the gradients, or exact (sites send p x p Hessians)",
        CURVATURE_CHOICES,
    )


def participation_setting(who: str):
    """``participation``: the probability that each site takes part in a round, drawn from
    ``seed`` (:meth:`strategies.server.fused.FusedSiteStrategy.draw`), the same for both methods."""
    return setting(
        1.0, f"each {who} takes part in a round with this probability", above=0, at_most=1
    )


def size_power_setting(who: str):
    """``size-power`` ``a``: each site's loss is weighted by ``w_z = Z n_z^a / sum n^a``
    in the fused objective (:func:`strategies.solvers.local.site_weight`): ``a = 0`` every site
    counts once (the papers'), ``a = 1`` in proportion to its rows (as FedAvg weights its
    answers); the same for both methods, used by the fused methods only."""
    return setting(
        0.0,
        f"weight of each {who}'s loss ~ its rows to this power, in [0, 1] (0: equal, 1: rows)",
        at_least=0,
        at_most=1,
    )


def inference_settings(refit: str) -> tuple:
    """``inference`` (none, or oracle: ``refit``) and ``level``, the same for both methods
    (:mod:`strategies.stats.inference`)."""
    return (
        setting("none", f"intervals: none, or oracle: {refit}", INFERENCE_CHOICES),
        setting(0.95, "confidence level of the intervals, in (0, 1)", above=0, below=1),
    )


@dataclass(frozen=True)
class GrAUCConfig(ComparatorSettings):
    """Settings of a GrAUC-PFL fit and its baselines (run-config keys in brackets)."""

    lam: float = setting(0.1, "fused-lasso level lambda >= 0", at_least=0)
    ridge: float = setting(1e-3, "ridge eta >= 0", at_least=0)
    w_dist: float = setting(1.0, "Gaussian-kernel decay of edge weights >= 0", at_least=0)
    q: float = setting(0.01, "smallest edge weight, in [0, 1]", at_least=0, at_most=1)
    rho: float = setting(0.1, "ADMM penalty > 0", above=0)
    graph: str = setting("mst", "the graph over sites", ("mst", "knn", "complete"))
    knn_k: int = setting(3, "neighbours for graph = knn", at_least=1)
    penalty: str = setting("l1", "fusion per coordinate, or group-L2 per edge", ("l1", "group"))
    algorithm: str = setting(
        "pqn", "proximal quasi-Newton (few rounds), or the paper's ADMM", ("pqn", "admm")
    )
    local_solver: str = setting(
        "prox", "the sites' ADMM step: exact, or one linearized step", ("prox", "linearized")
    )
    curvature: str = curvature_setting()
    participation: float = participation_setting("site")
    size_power: float = size_power_setting("site")
    init: str = setting(
        "local",
        "start: each site's own fit (one start round), N(0, I) per site (the paper), or zeros",
        ("local", "random", "zeros"),
    )
    tol: float = setting(
        1e-6, "stopping tolerance > 0 (ADMM: residuals; pqn: relative objective gap)", above=0
    )
    max_rounds: int = setting(300, "round limit >= 1", at_least=1)
    min_fit_fraction: float = setting(
        1.0, "share of sites a round needs, in (0, 1]", above=0, at_most=1
    )
    standardize: str = setting(
        "federated", "by pooled mean and SD, or features as given", ("federated", "none")
    )
    missing_class: str = setting(
        "error",
        "a site whose data lack a class: reject, or borrow its model from its neighbours",
        ("error", "borrow"),
    )
    fedavg_rounds: int
    fedavg_local_steps: int
    fedavg_lr: float
    fedavg_rounds, fedavg_local_steps, fedavg_lr = fedavg_settings("gradient", "1/mu_z per site")
    seed: int = setting(0, "random seed (initial coefficients, participation draws)", top=True)
    inference: str
    level: float
    inference, level = inference_settings(
        "the surrogate refitted on the fused groups, sandwich errors (sites send p x p "
        "Hessians and gradient covariances)"
    )

    def __post_init__(self) -> None:
        check_fields(self)
        require(
            self.curvature != "exact" or self.algorithm == "pqn",
            "curvature",
            "exact needs algorithm = pqn",
            self.curvature,
        )

    def replace(self, **changes) -> GrAUCConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class RegistrationConfig:
    """How the server waits for the sites before the first round, for every method of a
    run (run-config keys ``registration.<name>``; docs/deployment.md)."""

    key_prefix = "registration."

    timeout: float = setting(300.0, "seconds to wait for every site to register, > 0", above=0)
    log_every: float = setting(
        30.0, "seconds between the lines naming the sites still missing, > 0", above=0
    )
    quorum: float = setting(
        1.0,
        "share of the sites the run may start with when the timeout comes, in (0, 1]",
        above=0,
        at_most=1,
    )
    sites: str = setting("", "the site ids expected, comma-separated (empty: any)")

    def __post_init__(self) -> None:
        check_fields(self)
        ids = self.expected()
        if len(set(ids)) != len(ids):
            require(False, "registration.sites", "names a site twice", self.sites)

    def expected(self) -> tuple[str, ...]:
        """The expected site ids (empty: any site may register)."""
        return tuple(s.strip() for s in self.sites.split(",") if s.strip())


@dataclass(frozen=True)
class TuneConfig:
    """Tuning inside the federation (run-config keys ``tune.<name>``; docs/methods.md
    3.12): ``by = "cv"`` runs the whole cross-validation of a fused method as one batched
    Flower run before its fit.  Grids are comma-separated numbers; an empty ``lam-grid``
    is the automatic path below ``lam_max``."""

    key_prefix = "tune."

    by: str = setting(
        "",
        "tune inside the federation: cv, or gic / gic-nq (RowFed; empty: no tuning)",
        ("", "cv", "gic", "gic-nq"),
    )
    folds: int = setting(5, "folds within each site, >= 2", at_least=2)
    rule: str = setting("best", "the best mean score, or the simplest within 1 SE", ("best", "1se"))
    criterion: str = setting(
        "folds",
        "the score: mean of per-fold scores, each site's pooled out-of-fold score, or the "
        "validation loss",
        ("folds", "pooled", "loss"),
    )
    repeats: int = setting(1, "times the folds are drawn, >= 1", at_least=1)
    fold_seed: int = setting(0, "seed of the sites' folds")
    tol: float = setting(1e-3, "the tuning fits' stopping tolerance > 0", above=0)
    max_rounds: int = setting(100, "the tuning fits' round limit >= 1", at_least=1)
    jobs: int = setting(
        0, "server processes for the fits' model problems (0: one per core, at most 4)", at_least=0
    )
    max_fits: int = setting(
        0,
        "at most this many fits at once, >= 0 (0: no limit; fewer: less memory, more rounds)",
        at_least=0,
    )
    lam_grid: str = setting("", "GrAUC-PFL lam values (empty: 12 below lam_max and 0)")
    w_dist_grid: str = setting("0,1,2", "GrAUC-PFL w_dist values")
    ridge_grid: str = setting("0.001,0.01,0.1,1", "GrAUC-PFL ridge values")
    size_power_grid: str = setting("", "site weightings (empty: 0 and 1 when sizes differ)")
    lam1_grid: str = setting(
        "", "RowFed lam1 values (empty: 0.5, 0.2, 0.1, 0.05, 0.02, 0.01; auto: from lam1_max)"
    )
    lam2_grid: str = setting(
        "", "RowFed lam2 values (empty: 0.1, 0.05, 0.02, 0.01, 0.005; auto: below lam2_max)"
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class GuardsConfig(Section):
    """The floors of sites simulated on one machine (run-config keys ``guards.<name>``;
    :class:`strategies.client.guards.Guards`): ``flwr run``'s simulation and
    ``fit --engine flower``.
    A SuperNode across hospitals takes its own from its node config, whatever these say."""

    prefix = "guards"

    min_rows: int = setting(3, "rows a site needs to take part, >= 0", at_least=0)
    min_class_rows: int = setting(
        3, "rows of each class a site has it needs to take part (GrAUC-PFL), >= 0", at_least=0
    )
    min_rows_per_feature: float = setting(
        3.0, "rows per feature a site needs to send second moments, >= 0", at_least=0
    )


@dataclass(frozen=True)
class CheckpointConfig(Section):
    """A GrAUC-PFL server's checkpoints (run-config keys ``checkpoint.<name>``; the ``fit``
    options ``--checkpoint``, ``--checkpoint-every``, ``--resume``).  Paths are absolute
    (a ServerApp's working directory is Flower's; the command line makes a relative one
    absolute first)."""

    prefix = "checkpoint"

    path: str = setting(
        "", "the .npz file the server's state is written to every K rounds",
        flag="checkpoint", metavar="FILE",
    )  # fmt: skip
    every: int = setting(10, "rounds between checkpoints, >= 1", at_least=1,
                         flag="checkpoint-every", metavar="K")  # fmt: skip
    resume: str = setting("", "a checkpoint (.npz) to start from", flag="resume",
                          metavar="FILE")  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("path", "resume"):
            value = getattr(self, name)
            require(not value or os.path.isabs(value), f"checkpoint.{name}",
                   "must be an absolute path", value)  # fmt: skip
        path = self.path
        fine = not path or (not os.path.isdir(path) and os.path.isdir(os.path.dirname(path)))
        require(fine, "checkpoint.path", "must be a file in an existing directory", path)

    def strategy_kwargs(self) -> dict:
        """What :class:`strategies.server.grauc.GrAUCStrategy` takes: ``checkpoint``,
        ``checkpoint_every``, ``resume``."""
        return {"checkpoint": self.path, "checkpoint_every": self.every, "resume": self.resume}


def tune_config(run_config: dict) -> TuneConfig:
    """:class:`TuneConfig` from a Flower run config (keys ``tune.<name>``)."""
    return from_run_config(TuneConfig, run_config, "tune")


def registration_config(run_config: dict) -> RegistrationConfig:
    """:class:`RegistrationConfig` from a Flower run config (keys ``registration.<name>``)."""
    return from_run_config(RegistrationConfig, run_config, "registration")


def grauc_config(run_config: dict) -> GrAUCConfig:
    """:class:`GrAUCConfig` from a Flower run config (keys ``grauc.<name>`` and ``seed``)."""
    return from_run_config(GrAUCConfig, run_config, "grauc")


def grauc_methods(run_config: dict) -> list[str]:
    """The ``method`` key of a GrAUC-PFL run config, checked (default ``grauc``)."""
    return parse_methods(run_config.get("method", "grauc"), GRAUC_METHODS)


# ---------------------------------------------------------------------------------------
# RowFed
# ---------------------------------------------------------------------------------------
#: Method names accepted by ``method`` when ``task = "rowfed"``.
ROWFED_METHODS = ("rowfed", "nonfed", "fedavg", "perfl-lsma", "mean-fusion", *FEDAVG_FAMILY[1:])
#: The fused methods: RowFed, PerFL-LSMA, and row-wise fusion toward the clients' mean.
ROWFED_FUSED_METHODS = ("rowfed", "perfl-lsma", "mean-fusion")
#: Run-config prefix of :class:`RowFedConfig`'s keys.
PREFIX = "rowfed"


@dataclass(frozen=True)
class RowFedConfig(ComparatorSettings):
    """Settings of a RowFed fit and its baselines (run-config keys in brackets).

    Notes
    -----
    ``concavity = 0`` means the penalty's default (3 for MCP, 3.7 for SCAD; docs/methods.md 2.2).
    MCP needs ``concavity > 1/rho`` and SCAD ``concavity > 1 + 1/rho`` (the thresholds of
    §2.3 are then unique minimizers); a schedule ``rho <- alpha rho`` with ``alpha >= 1``
    keeps this true in later rounds.
    """

    penalty: str = setting("lasso", "penalty of fusion and sparsity", KINDS)
    concavity: float = setting(
        0.0, "concavity iota of MCP/SCAD; 0 = 3 for MCP, 3.7 for SCAD", at_least=0
    )
    lam1: float = setting(0.05, "row-wise fusion level >= 0", at_least=0)
    lam2: float = setting(0.02, "sparsity level >= 0", at_least=0)
    sparsity: str = setting("entry", "sparsity by entry or by row", ("entry", "row"))
    graph: str = setting("all-pairs", "all-pairs, or an edge CSV: client_u,client_v[,weight]")
    participation: float = participation_setting("client")
    size_power: float = size_power_setting("client")
    rho: float = setting(1.0, "initial ADMM penalty > 0", above=0)
    alpha: float = setting(1.0, "rho <- alpha rho each round, >= 1", at_least=1)
    algorithm: str = setting(
        "auto",
        "auto (= pqn; MCP/SCAD by local linear approximations), or the paper's ADMM",
        ("auto", "pqn", "admm"),
    )
    local_solver: str = setting(
        "prox", "the clients' ADMM step: exact, or one linearized step", ("prox", "linearized")
    )
    curvature: str = curvature_setting()
    init: str = setting("ridge", "each client's starting estimate", ("ridge", "nonfed"))
    tol: float = setting(
        1e-6, "stopping tolerance > 0 (ADMM: residuals; pqn: relative objective gap)", above=0
    )
    max_rounds: int = setting(1000, "round limit >= 1", at_least=1)
    intercept: bool = setting(True, "a free intercept per client and response")
    standardize: str = setting(
        "federated", "predictors divided by the pooled SD, or as given", ("federated", "none")
    )
    fedavg_rounds: int
    fedavg_local_steps: int
    fedavg_lr: float
    fedavg_rounds, fedavg_local_steps, fedavg_lr = fedavg_settings(
        "prox-gradient", "1/L_m per client"
    )
    seed: int = setting(0, "participation draws", top=True)
    inference: str
    level: float
    inference, level = inference_settings(
        "least squares on the identified structure (clients send X'X, X'Y, Y'Y)"
    )

    def __post_init__(self) -> None:
        check_fields(self)
        require(
            isinstance(self.graph, str) and self.graph != "",
            "graph",
            "must be all-pairs or a path to an edge CSV",
            self.graph,
        )
        require(
            isinstance(self.intercept, bool), "intercept", "must be true or false", self.intercept
        )
        require(
            self.curvature != "exact" or self.resolved_algorithm == "pqn",
            "curvature",
            "exact needs the pqn algorithm",
            self.curvature,
        )
        self.penalty_obj().check_rho(self.rho)

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
        """``auto``: the proximal quasi-Newton method (a handful of rounds; its incremental
        form under partial participation) for every penalty; for MCP/SCAD its local linear
        approximations from the same start as the paper's ADMM (docs/methods.md 2.4)."""
        return "pqn" if self.algorithm == "auto" else self.algorithm

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
    """The ``method`` key of a RowFed run config, checked (default ``rowfed``)."""
    return parse_methods(run_config.get("method", "rowfed"), ROWFED_METHODS)

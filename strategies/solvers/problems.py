"""Each method's penalty as an ADMM :class:`~strategies.solvers.admm.Problem`, and the structure a
fit reads off it (Flower-free).

- GrAUC-PFL: ``lam sum_e w_e ||beta_u - beta_v||_1`` (or group-L2) over the edges of the
  geographic graph: :func:`grauc_problem`; fused groups per coordinate:
  :func:`strategies.solvers.admm.fused_groups`.
- RowFed: row-wise fusion ``sum_j sum_(m,m') P_lam1(||theta_m(j) - theta_m'(j)||)`` and
  sparsity ``P_lam2``: :func:`rowfed_problem` (splits ``FUSION`` and ``SPARSITY``);
  clusters and support: :func:`fitted_structure`; GIC: :func:`gic`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from .admm import (
    AdmmState,
    Problem,
    Split,
    all_pairs,
    centering_matrix,
    fused_groups,
    incidence_matrix,
    split_groups,
)
from .penalties import Penalty

if TYPE_CHECKING:
    from ..config import GrAUCConfig, RowFedConfig

#: Index of RowFed's fusion split in ``problem.splits``.
FUSION = 0
#: Index of RowFed's sparsity split in ``problem.splits``.
SPARSITY = 1
SPARSITIES = ("entry", "row")
FUSION_GROUPINGS = ("row", "block")


# ----------------------------------------------------------------------------------------
# GrAUC-PFL
# ----------------------------------------------------------------------------------------
def grauc_problem(graph, n_sites: int, cfg: GrAUCConfig, fusion: str = "graph") -> Problem:
    """The fused-lasso split ``delta = Omega beta`` with per-edge level ``lam w_e``; with
    ``fusion = "mean"`` instead ``delta = (I - J/Z) beta`` at level ``lam`` for every site,
    the same penalty toward the federation's mean (the ``mean-fusion`` comparator).

    Parameters
    ----------
    graph : object
        Has ``edges`` ``(n_edges, 2)`` and ``weights(w_dist, q)`` (the geographic graph of
        :mod:`grauc_flower.graph`, handed in by the app); not read for ``fusion = "mean"``.
    n_sites : int
        The number of sites.
    cfg : GrAUCConfig
        Its ``lam``, ``w_dist``, ``q`` and ``penalty`` (``group``: one group per block,
        else entrywise).
    fusion : {"graph", "mean"}, optional
        Fusion along the graph's edges or toward the mean.

    Returns
    -------
    Problem
        One lasso split.
    """
    grouping = "block" if cfg.penalty == "group" else "entry"
    if fusion == "mean":
        return Problem(
            (Split(centering_matrix(n_sites), Penalty("lasso"), cfg.lam, grouping, "mean"),),
            n_sites,
        )
    d = incidence_matrix(graph.edges, n_sites)
    lam = cfg.lam * graph.weights(cfg.w_dist, cfg.q)
    return Problem((Split(d, Penalty("lasso"), lam, grouping),), n_sites)


# ----------------------------------------------------------------------------------------
# RowFed
# ----------------------------------------------------------------------------------------
def build_problem(
    n_sites: int,
    penalty: Penalty | str,
    lam1: float | np.ndarray,
    lam2: float,
    sparsity: str = "entry",
    graph_edges: np.ndarray | None = None,
    fusion_grouping: str = "row",
    fusion: str = "graph",
) -> Problem:
    """The penalty side of SROF (docs/methods.md 2.2) as an ADMM :class:`Problem`; with
    ``fusion = "mean"`` the fusion is of each client's rows toward the clients' mean rows,
    ``(I - J/M) Theta`` (the ``mean-fusion`` comparator, docs/methods.md 3.10).

    Parameters
    ----------
    n_sites : int
        Number of clients ``M``.
    penalty : Penalty or {"lasso", "mcp", "scad"}
        Used for both the fusion and the sparsity split (default concavity for a name).
    lam1 : float or ndarray, shape (n_edges,)
        Fusion level (per edge for a weighted fusion).
    lam2 : float
        Sparsity level.
    sparsity : {"entry", "row"}
        Entrywise (default, **[choice]**) or row sparsity.
    graph_edges : ndarray, shape (n_edges, 2), optional
        Fusion graph ``G``; all pairs ``u < v`` by default **[template]**.
    fusion_grouping : {"row", "block"}
        Row-wise fusion (RowFed) or matrix-wise fusion (PerFL-LSMA, docs/methods.md 2.6).

    Returns
    -------
    Problem
        ``splits[FUSION]`` (incidence matrix) and ``splits[SPARSITY]`` (identity).

    Notes
    -----
    ``sigma_max(sum_k A_k^T A_k) = lambda_max(L_G) + 1`` (``M + 1`` for all pairs).
    """
    if isinstance(penalty, str):
        penalty = Penalty(penalty)
    if sparsity not in SPARSITIES:
        raise ValueError(f"sparsity: must be one of {SPARSITIES}, got {sparsity!r}")
    if fusion_grouping not in FUSION_GROUPINGS:
        raise ValueError(
            f"fusion_grouping: must be one of {FUSION_GROUPINGS}, got {fusion_grouping!r}"
        )
    edges = all_pairs(n_sites) if graph_edges is None else np.asarray(graph_edges, np.int64)
    edges = edges.reshape(-1, 2)
    if edges.size and (edges.min() < 0 or edges.max() >= n_sites):
        raise ValueError(f"graph_edges: site indices must lie in [0, {n_sites - 1}]")
    matrix = centering_matrix(n_sites) if fusion == "mean" else incidence_matrix(edges, n_sites)
    kind = "mean" if fusion == "mean" else "edges"
    fusion = Split(matrix, penalty, lam1, grouping=fusion_grouping, kind=kind)
    sparse = Split(
        sp.identity(n_sites, format="csr"), penalty, lam2, grouping=sparsity, kind="identity"
    )
    return Problem(splits=(fusion, sparse), n_sites=n_sites)


def edges_from_incidence(matrix: sp.spmatrix) -> np.ndarray:
    """Recover ``edges`` (``(n_edges, 2)``, ``(u, v)`` with ``+1`` at ``u``, ``-1`` at ``v``)
    from a signed incidence matrix built by :func:`strategies.solvers.admm.incidence_matrix`."""
    coo = sp.coo_matrix(matrix)
    n_edges = coo.shape[0]
    edges = np.full((n_edges, 2), -1, dtype=np.int64)
    pos = coo.data > 0
    edges[coo.row[pos], 0] = coo.col[pos]
    edges[coo.row[~pos], 1] = coo.col[~pos]
    if np.any(edges < 0):
        raise ValueError("matrix: every row must have one +1 and one -1 entry")
    return edges


def rowfed_problem(
    cfg: RowFedConfig,
    n_sites: int,
    edges: np.ndarray | None = None,
    weights: np.ndarray | None = None,
    fusion_grouping: str = "row",
    fusion: str = "graph",
) -> Problem:
    """:func:`build_problem` with the settings of ``cfg``.

    Parameters
    ----------
    cfg : RowFedConfig
        Its penalty, ``lam1``, ``lam2`` and ``sparsity``.
    n_sites : int
        Number of clients ``M``.
    edges : ndarray, shape (n_edges, 2), optional
        Fusion graph; all pairs by default.
    weights : ndarray, shape (n_edges,), optional
        Multiply ``lam1`` per edge.
    fusion_grouping : {"row", "block"}, optional
        Row-wise or matrix-wise fusion.
    fusion : {"graph", "mean"}, optional
        Fusion along the graph or toward the clients' mean rows.

    Returns
    -------
    Problem
        ``splits[FUSION]`` and ``splits[SPARSITY]``.
    """
    lam1 = cfg.lam1 if weights is None else cfg.lam1 * np.asarray(weights, dtype=float)
    return build_problem(
        n_sites,
        cfg.penalty_obj(),
        lam1,
        cfg.lam2,
        cfg.sparsity,
        edges,
        fusion_grouping,
        fusion,
    )


def exact_row_clusters(theta: np.ndarray) -> np.ndarray:
    """Row partitions ``(M, p)``: clients share row ``j`` when their rows are exactly equal
    (for fits without a fusion ``delta``: NonFed, FedAvg)."""
    m, p = theta.shape[:2]
    labels = np.zeros((m, p), dtype=np.int64)
    for j in range(p):
        _, inv = np.unique(theta[:, j, :], axis=0, return_inverse=True)
        labels[:, j] = canonical_labels(inv.reshape(-1))
    return labels


def fitted_structure(problem: Problem, state: AdmmState) -> tuple[np.ndarray, np.ndarray]:
    """Row clusters ``(M, p)`` and support ``(M, p, q)`` of a fit, read from ``delta``.

    Clusters come from the fusion split's ``delta`` (exact zeros, docs/methods.md 2.3); the
    support from the sparsity split's ``delta`` (``eta``, exactly sparse) **[choice]**.

    Parameters
    ----------
    problem : Problem
        RowFed's problem (:func:`rowfed_problem`).
    state : AdmmState
        The fit's state.

    Returns
    -------
    labels : ndarray of int, shape (M, p)
        Cluster labels per row (:func:`strategies.solvers.admm.split_groups`).
    support : ndarray of bool, shape (M, p, q)
        Non-zero pattern of the sparsity split's ``delta``.
    """
    delta = np.asarray(state.delta[FUSION], dtype=float)
    row_norm = np.sqrt(np.sum(delta * delta, axis=-1))  # (n_rows, p); 0 iff whole row is 0
    labels = split_groups(problem.splits[FUSION], row_norm, problem.n_sites)
    support = state.delta[SPARSITY] != 0.0
    return labels, support


def row_clusters(edges: np.ndarray, delta: np.ndarray, n_sites: int) -> np.ndarray:
    """Variable-level clusters, shape ``(M, p)``, from the fusion split's ``delta``.

    Parameters
    ----------
    edges : ndarray, shape (n_edges, 2)
    delta : ndarray, shape (n_edges, p, q)
        ``delta_e(j)`` estimates ``theta_u(j) - theta_v(j)`` for ``e = (u, v)``.
    n_sites : int

    Notes
    -----
    Clients ``m, m'`` share row ``j`` when ``delta_mm'(j) = 0`` (§2.3), closed transitively
    along paths of the graph (:func:`strategies.solvers.admm.fused_groups`).  Labels are numbered by
    first appearance in client order.
    """
    delta = np.asarray(delta, dtype=float)
    row_norm = np.sqrt(np.sum(delta * delta, axis=-1))  # (n_edges, p); 0 iff whole row is 0
    return fused_groups(edges, row_norm, n_sites)


def degrees_of_freedom(labels: np.ndarray, support: np.ndarray) -> int:
    """GIC's ``df = sum_j sum_{clusters c of row j} nnz(cluster row vector)`` (docs/methods.md 2.5).

    Parameters
    ----------
    labels : ndarray, shape (M, p)
        Cluster labels per row (:func:`row_clusters`).
    support : ndarray of bool, shape (M, p, q)
        Non-zero pattern of the estimate (e.g. the sparsity split's ``delta != 0``).

    Notes
    -----
    A cluster's row vector counts entry ``k`` as non-zero when any member has it non-zero
    **[choice]** (members agree at convergence; the union is the conservative count).
    """
    labels = np.asarray(labels)
    support = np.asarray(support, dtype=bool)
    m, p = labels.shape
    if support.shape[:2] != (m, p):
        raise ValueError(f"support: need shape ({m}, {p}, q), got {support.shape}")
    df = 0
    for j in range(p):
        for c in np.unique(labels[:, j]):
            df += int(np.any(support[labels[:, j] == c, j, :], axis=0).sum())
    return df


def gic(rss, n_total: int, p: int, q: int, n_sites: int, df, per: str = "n"):
    """Generalized information criterion (docs/methods.md 2.5; Fan & Tang 2013).

    Parameters
    ----------
    rss : float or ndarray
        ``RSS = sum_m ||Y_m - X_m Theta_hat_m||_F^2`` (each client uploads its own).
    n_total : int
        ``N = sum_m n_m``; more than 1.
    p, q : int
        The numbers of features and responses.
    n_sites : int
        Number of clients ``M``.
    df : int or ndarray
        Degrees of freedom (:func:`degrees_of_freedom`).
    per : {"n", "nq"}, optional
        ``n``: the df term divided by ``N`` (the paper's); ``nq``: by ``N q``, the number
        of residuals the RSS sums (the same at ``q = 1``).

    Returns
    -------
    float or ndarray
        The GIC, an array when ``rss`` or ``df`` is one.

    Notes
    -----
    ``GIC = log(RSS / (N q)) + log(log N) log(p q M) df / N``.
    """
    if not n_total > 1:
        raise ValueError(f"n_total: GIC needs N > 1 (log log N), got {n_total}")
    if per not in GIC_PER:
        raise ValueError(f"per: must be one of {', '.join(GIC_PER)}, got {per!r}")
    scale = n_total * (q if per == "nq" else 1)
    value = (
        np.log(np.asarray(rss, float) / (n_total * q))
        + np.log(np.log(n_total)) * np.log(p * q * n_sites) * np.asarray(df, float) / scale
    )
    return float(value) if np.ndim(value) == 0 else value


#: The GIC's df scalings (:func:`gic`).
GIC_PER = ("n", "nq")


def canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Relabel a partition ``0, 1, ...`` by first appearance."""
    labels = np.asarray(labels)
    _, first, inv = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))
    return rank[inv.reshape(-1)].reshape(labels.shape)

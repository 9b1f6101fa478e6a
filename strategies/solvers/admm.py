"""ADMM state and server steps shared by GrAUC-PFL and RowFed (Flower-free).

Both methods minimize ``sum_z f_z(beta_z) + sum_k P_k(A_k beta)`` where ``beta`` stacks one
parameter block per site (a ``p`` vector for GrAUC-PFL, a ``p x q`` matrix for RowFed) and
each *split* ``k`` is a sparse linear map over the site axis with a penalty on its image:
the signed incidence matrix of a graph (fusion) or the identity (sparsity).  Splitting
``delta_k = A_k beta`` with duals ``gamma_k`` and penalty ``rho`` gives one round::

    beta_tilde_z = beta_z - (1/c_z) [sum_k A_k^T (gamma_k + rho (A_k beta - delta_k))]_z   (server)
    beta_z      <- local step from beta_tilde_z with curvature c_z                     (site z)
    delta_k     <- threshold_k(A_k beta + gamma_k / rho)                              (server)
    gamma_k     <- gamma_k + rho (A_k beta - delta_k)                                 (server)

(§1.3 and §2.3; Boyd et al. 2011 §3.3 for the residuals.)  A site that does not
answer keeps its previous ``beta_z``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import eigsh

from .penalties import Penalty, group_norms

GROUPINGS = ("entry", "row", "block")


def incidence_matrix(edges: np.ndarray, n_sites: int) -> sp.csr_matrix:
    """Signed incidence matrix ``D`` (``n_edges x n_sites``): row ``e = (u, v)`` has ``+1``
    at ``u`` and ``-1`` at ``v``.  ``D^T D`` is the graph Laplacian.

    Parameters
    ----------
    edges : ndarray, shape (n_edges, 2)
        The edges ``(u, v)``, as site indices.
    n_sites : int
        The number of sites (columns).

    Returns
    -------
    scipy.sparse.csr_matrix, shape (n_edges, n_sites)
        ``D``.
    """
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    n_edges = edges.shape[0]
    rows = np.repeat(np.arange(n_edges), 2)
    cols = edges.reshape(-1)
    vals = np.tile([1.0, -1.0], n_edges)
    return sp.csr_matrix((vals, (rows, cols)), shape=(n_edges, n_sites))


def all_pairs(n_sites: int) -> np.ndarray:
    """Edges ``(u, v)``, ``u < v``, of the complete graph, in lexicographic order."""
    u, v = np.triu_indices(n_sites, k=1)
    return np.column_stack([u, v]).astype(np.int64)


#: What a split's matrix is (:attr:`Split.kind`).
SPLIT_KINDS = ("edges", "mean", "identity")
#: Splits with at most this many entries of ``A`` (rows x sites) also keep ``A`` dense.
DENSE_SPLIT = 4096


@dataclass(frozen=True)
class Split:
    """One block ``delta = A beta`` of the splitting, with its penalty.

    Parameters
    ----------
    matrix : scipy.sparse matrix, shape (n_rows, n_sites)
        ``A``; acts on the site axis of ``beta``.
    penalty : Penalty
    lam : ndarray, shape (n_rows,) or (n_rows, ...)
        Per-row penalty level (``lam * w_e`` for a weighted fused lasso), or one level per
        group (entry, or row of a block): the weights of a local linear approximation
        (:meth:`linearized`).
    grouping : {"entry", "row", "block"}
        Entrywise penalty, a group per row of the block (last axis), or the whole block.
    kind : {"edges", "mean", "identity"}
        What ``A`` is: a signed incidence matrix (:func:`incidence_matrix`), the
        :func:`centering_matrix`, or the identity (a sparsity split); it says how
        :func:`split_groups` reads fused groups off ``delta``.
    """

    matrix: sp.csr_matrix
    penalty: Penalty
    lam: np.ndarray
    grouping: str = "entry"
    kind: str = "edges"

    def __post_init__(self) -> None:
        if self.grouping not in GROUPINGS:
            raise ValueError(f"grouping: must be one of {GROUPINGS}, got {self.grouping!r}")
        if self.kind not in SPLIT_KINDS:
            raise ValueError(f"kind: must be one of {SPLIT_KINDS}, got {self.kind!r}")
        object.__setattr__(self, "matrix", sp.csr_matrix(self.matrix))
        # A^T kept once: transposing on every product cost as much as the product
        object.__setattr__(self, "_matrix_t", sp.csr_matrix(self.matrix.T))
        # a small A also dense: a sparse product's call costs ~30x a small dense one's, and
        # the inner ADMM of the server's model problem makes thousands of them a round
        small = self.matrix.shape[0] * self.matrix.shape[1] <= DENSE_SPLIT
        object.__setattr__(self, "_dense", self.matrix.toarray() if small else None)
        lam = np.asarray(self.lam, dtype=float)
        if lam.ndim <= 1:
            lam = np.broadcast_to(lam, (self.matrix.shape[0],))
        elif lam.shape[0] != self.matrix.shape[0]:
            raise ValueError(f"lam: {lam.shape[0]} rows for a split of {self.matrix.shape[0]}")
        object.__setattr__(self, "lam", np.array(lam))

    def apply(self, beta: np.ndarray) -> np.ndarray:
        """``A beta`` for ``beta`` of shape ``(n_sites, *block)``."""
        flat = beta.reshape(beta.shape[0], -1)
        m = self.matrix if self._dense is None else self._dense
        return np.asarray(m @ flat).reshape((self.matrix.shape[0],) + beta.shape[1:])

    def apply_t(self, v: np.ndarray) -> np.ndarray:
        """``A^T v`` for ``v`` of shape ``(n_rows, *block)``."""
        flat = v.reshape(v.shape[0], -1)
        m = self._matrix_t if self._dense is None else self._dense.T
        return np.asarray(m @ flat).reshape((self.matrix.shape[1],) + v.shape[1:])

    def _grouped(self, x: np.ndarray) -> tuple[np.ndarray, bool]:
        if self.grouping == "block":
            return x.reshape(x.shape[0], -1), True
        return x, self.grouping == "row"

    def _lam(self, x: np.ndarray) -> np.ndarray:
        return self.lam.reshape(self.lam.shape + (1,) * (x.ndim - self.lam.ndim))

    def linearized(self, beta: np.ndarray) -> Split:
        """The local linear approximation of a nonconvex penalty at ``beta``: a lasso split
        whose level per group is ``P_lam'(||(A beta)_g||)`` (Zou & Li 2008; it majorizes
        the penalty up to a constant and touches it at ``beta``).  A lasso split as is."""
        if self.penalty.convex:
            return self
        g, group = self._grouped(self.apply(beta))
        norms = group_norms(g, group)
        weights = self.penalty.derivative_of_norm(norms, self._lam(norms))
        return replace(self, penalty=Penalty("lasso"), lam=weights)

    def threshold(self, x: np.ndarray, rho: float) -> np.ndarray:
        """The split's threshold (:meth:`Penalty.threshold` at its levels and grouping).

        Parameters
        ----------
        x : ndarray, shape (n_rows, *block)
            The threshold's argument.
        rho : float
            The ADMM penalty.

        Returns
        -------
        ndarray, shape (n_rows, *block)
            The thresholded ``x``.
        """
        g, group = self._grouped(x)
        return self.penalty.threshold(g, self._lam(g), rho, group).reshape(x.shape)

    def value(self, beta: np.ndarray) -> float:
        """``sum P_lam(A beta)`` at ``beta``."""
        g, group = self._grouped(self.apply(beta))
        return self.penalty.value(g, self._lam(g), group)


@dataclass(frozen=True)
class Problem:
    """The penalty side of the problem: the splits, over ``n_sites`` sites."""

    splits: tuple[Split, ...]
    n_sites: int

    def gram(self) -> sp.csr_matrix:
        """``sum_k A_k^T A_k`` (``n_sites x n_sites``; computed once, not to be changed)."""
        if "_gram" not in self.__dict__:
            g = sp.csr_matrix((self.n_sites, self.n_sites))
            for s in self.splits:
                g = g + (s.matrix.T @ s.matrix)
            object.__setattr__(self, "_gram", sp.csr_matrix(g))
        return self.__dict__["_gram"]

    def sigma_max(self) -> float:
        """Largest eigenvalue of ``sum_k A_k^T A_k`` (``lambda_max(L)`` for one incidence
        split; ``lambda_max(L) + 1`` with an extra identity split)."""
        g = self.gram()
        if g.nnz == 0:
            return 0.0
        if self.n_sites <= 400:
            return float(np.linalg.eigvalsh(g.toarray())[-1])
        return float(eigsh(g.astype(float), k=1, which="LA", return_eigenvectors=False)[0])

    @property
    def convex(self) -> bool:
        return all(s.penalty.convex for s in self.splits)

    def linearized(self, beta: np.ndarray) -> Problem:
        """Every split's local linear approximation at ``beta`` (:meth:`Split.linearized`)."""
        return replace(self, splits=tuple(s.linearized(beta) for s in self.splits))

    def penalty_value(self, beta: np.ndarray) -> float:
        return float(sum(s.value(beta) for s in self.splits))

    def apply_all(self, beta: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(s.apply(beta) for s in self.splits)

    def apply_t_sum(self, vs: tuple[np.ndarray, ...]) -> np.ndarray:
        out = np.zeros((self.n_sites,) + vs[0].shape[1:]) if vs else None
        for s, v in zip(self.splits, vs, strict=True):
            out = out + s.apply_t(v)
        return out


@dataclass(frozen=True)
class AdmmState:
    """The server's whole ADMM state; small, explicit, saved by :func:`save_state`."""

    beta: np.ndarray  # (n_sites, *block)
    delta: tuple[np.ndarray, ...]  # per split, (n_rows_k, *block)
    gamma: tuple[np.ndarray, ...]
    rho: float
    round: int = 0


@dataclass(frozen=True)
class Residuals:
    primal: float
    dual: float
    eps_primal: float
    eps_dual: float

    @property
    def converged(self) -> bool:
        return self.primal <= self.eps_primal and self.dual <= self.eps_dual

    def describe(self) -> str:
        return f"primal {self.primal:.3g}, dual {self.dual:.3g}"


def init_state(problem: Problem, beta0: np.ndarray, rho: float, threshold: bool) -> AdmmState:
    """Initial state.

    Parameters
    ----------
    problem : Problem
        The splits.
    beta0 : ndarray, shape (n_sites, *block)
        The start.
    rho : float
        The ADMM penalty.
    threshold : bool
        ``False``: ``delta = A beta0``, ``gamma = 0`` (GrAUC-PFL, docs/methods.md 1.3).
        ``True``: ``delta = threshold(A beta0)`` and ``gamma = rho (A beta0 - delta)``,
        i.e. the server half-step of round 0 (RowFed, docs/methods.md 2.3, where each round
        starts with the thresholds).

    Returns
    -------
    AdmmState
        The state at round 0.
    """
    beta0 = np.array(beta0, dtype=float)
    a_beta = problem.apply_all(beta0)
    if threshold:
        delta = tuple(s.threshold(ab, rho) for s, ab in zip(problem.splits, a_beta, strict=True))
        gamma = tuple(rho * (ab - d) for ab, d in zip(a_beta, delta, strict=True))
    else:
        delta = tuple(ab.copy() for ab in a_beta)
        gamma = tuple(np.zeros_like(ab) for ab in a_beta)
    return AdmmState(beta=beta0, delta=delta, gamma=gamma, rho=float(rho), round=0)


def pull(problem: Problem, state: AdmmState) -> np.ndarray:
    """The graph pull ``sum_k A_k^T (gamma_k + rho (A_k beta - delta_k))``, one row per
    site.  Row ``z`` needs only the rows of ``A_k`` that touch ``z`` (the edges at ``z``).

    Parameters
    ----------
    problem : Problem
        The splits.
    state : AdmmState
        The server's state.

    Returns
    -------
    ndarray, shape (n_sites, *block)
        The pull.
    """
    a_beta = problem.apply_all(state.beta)
    v = tuple(
        g + state.rho * (ab - d) for g, ab, d in zip(state.gamma, a_beta, state.delta, strict=True)
    )
    return problem.apply_t_sum(v)


def global_component(problem: Problem, state: AdmmState, c: np.ndarray) -> np.ndarray:
    """``beta_tilde = beta - pull / c`` (:func:`pull`).

    Parameters
    ----------
    problem : Problem
        The splits.
    state : AdmmState
        The server's state.
    c : ndarray, shape (n_sites,)
        Each site's curvature.

    Returns
    -------
    ndarray, shape (n_sites, *block)
        ``beta_tilde``.
    """
    c = np.asarray(c, dtype=float).reshape((-1,) + (1,) * (state.beta.ndim - 1))
    return state.beta - pull(problem, state) / c


def server_update(
    problem: Problem,
    state: AdmmState,
    beta_new: np.ndarray,
    tol_abs: float,
    tol_rel: float,
    alpha: float = 1.0,
    took_part: np.ndarray | None = None,
) -> tuple[AdmmState, Residuals]:
    """The server's half of a round after the local updates.

    ``delta_k <- threshold_k(A_k beta + gamma_k / rho)``,
    ``gamma_k <- gamma_k + rho (A_k beta - delta_k)`` -- with partial participation
    (``took_part``) only on the rows of ``A_k`` that touch a site that took part: a row
    whose sites all sat out keeps its ``delta`` and ``gamma`` (repeating its update at
    unchanged ``beta`` only walks ``gamma`` along the residual that no site answers, and the
    walk ends in the jumps of docs/methods.md 2.3) -- then Boyd's residuals
    ``r = ||A beta - delta||``, ``s = rho ||A^T (delta_new - delta_old)||`` and tolerances
    ``eps_pri = sqrt(n_c) tol_abs + tol_rel max(||A beta||, ||delta||)``,
    ``eps_dual = sqrt(n_beta) tol_abs + tol_rel ||A^T gamma||``.  Finally ``rho <- alpha rho``.

    Parameters
    ----------
    problem : Problem
        The splits.
    state : AdmmState
        The state before the round.
    beta_new : ndarray, shape (n_sites, *block)
        The sites' coefficients after their local updates.
    tol_abs, tol_rel : float
        The absolute and relative tolerances.
    alpha : float, optional
        The factor ``rho`` is multiplied by after the round.
    took_part : ndarray of bool, shape (n_sites,), optional
        The sites that answered this round; ``None``: all.

    Returns
    -------
    state : AdmmState
        The state after the round (its ``round`` one more).
    residuals : Residuals
        The round's residuals and tolerances.
    """
    rho = state.rho
    a_beta = problem.apply_all(beta_new)
    delta = tuple(
        s.threshold(ab + g / rho, rho)
        for s, ab, g in zip(problem.splits, a_beta, state.gamma, strict=True)
    )
    gamma = tuple(g + rho * (ab - d) for g, ab, d in zip(state.gamma, a_beta, delta, strict=True))
    if took_part is not None and not np.all(took_part):
        moved = np.asarray(took_part, dtype=float)
        delta, gamma = zip(
            *(
                _keep_idle(s, moved, dn, do, gn, go)
                for s, dn, do, gn, go in zip(
                    problem.splits, delta, state.delta, gamma, state.gamma, strict=True
                )
            ),
            strict=True,
        )
    primal = np.sqrt(sum(np.sum((ab - d) ** 2) for ab, d in zip(a_beta, delta, strict=True)))
    d_delta = tuple(dn - do for dn, do in zip(delta, state.delta, strict=True))
    dual = rho * np.linalg.norm(problem.apply_t_sum(d_delta))
    n_c = sum(d.size for d in delta)
    norm_ab = np.sqrt(sum(np.sum(ab**2) for ab in a_beta))
    norm_d = np.sqrt(sum(np.sum(d**2) for d in delta))
    eps_pri = np.sqrt(n_c) * tol_abs + tol_rel * max(norm_ab, norm_d)
    eps_dual = np.sqrt(beta_new.size) * tol_abs + tol_rel * np.linalg.norm(
        problem.apply_t_sum(gamma)
    )
    new = replace(
        state,
        beta=np.array(beta_new, dtype=float),
        delta=delta,
        gamma=gamma,
        rho=rho * alpha,
        round=state.round + 1,
    )
    return new, Residuals(float(primal), float(dual), float(eps_pri), float(eps_dual))


def _keep_idle(split: Split, moved, d_new, d_old, g_new, g_old):
    """``(delta, gamma)`` of one split with the rows that touch no site in ``moved`` kept."""
    active = (abs(split.matrix) @ moved) > 0
    active = active.reshape((-1,) + (1,) * (d_new.ndim - 1))
    return np.where(active, d_new, d_old), np.where(active, g_new, g_old)


def fused_groups(edges: np.ndarray, delta: np.ndarray, n_sites: int) -> np.ndarray:
    """Cluster labels per coordinate: sites ``u, v`` share a cluster for coordinate ``k``
    when ``delta[e, k] == 0`` on a path of edges.

    Parameters
    ----------
    edges : ndarray, shape (n_edges, 2)
        The edges ``(u, v)``.
    delta : ndarray, shape (n_edges, *block)
        Each edge's difference.
    n_sites : int
        The number of sites.

    Returns
    -------
    ndarray of int, shape (n_sites, *block)
        The labels, numbered by first appearance, in site order.
    """
    from scipy.sparse.csgraph import connected_components

    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    block = delta.shape[1:]
    flat = delta.reshape(delta.shape[0], int(np.prod(block, dtype=np.int64)))
    labels = np.zeros((n_sites, flat.shape[1]), dtype=np.int64)
    for k in range(flat.shape[1]):
        keep = flat[:, k] == 0.0
        e = edges[keep]
        adj = sp.csr_matrix((np.ones(len(e)), (e[:, 0], e[:, 1])), shape=(n_sites, n_sites))
        _, lab = connected_components(adj, directed=False)
        # renumber by first appearance so labels are canonical
        _, first = np.unique(lab, return_index=True)
        order = np.argsort(np.argsort(first))
        labels[:, k] = order[lab]
    return labels.reshape((n_sites,) + block)


def centering_matrix(n_sites: int) -> sp.csr_matrix:
    """``I - J/Z``: row ``z`` of ``A beta`` is ``beta_z - mean(beta)`` (fusion toward the
    federation's mean, the ``mean-fusion`` comparator; docs/methods.md 3.10)."""
    return sp.csr_matrix(np.eye(n_sites) - 1.0 / n_sites)


def split_groups(split: Split, delta: np.ndarray, n_sites: int) -> np.ndarray:
    """Cluster labels per coordinate from a fusion split's ``delta``, by the split's kind:
    ``edges`` (rows ``e_u - e_v``: :func:`fused_groups` along the edges with
    ``delta_e = 0``) or ``mean`` (the sites whose ``delta_z = 0`` equal the mean and form
    one cluster; the others stand alone).

    Parameters
    ----------
    split : Split
        A fusion split, of kind ``edges`` or ``mean``.
    delta : ndarray, shape (n_rows, *block)
        The split's ``delta``.
    n_sites : int
        The number of sites.

    Returns
    -------
    ndarray of int, shape (n_sites, *block)
        The labels (:func:`fused_groups`).
    """
    if split.kind == "edges":
        m = split.matrix
        cols = m.indices.reshape(-1, 2)
        plus = np.take_along_axis(cols, np.argsort(-m.data.reshape(-1, 2), axis=1), axis=1)
        return fused_groups(plus, delta, n_sites)
    if split.kind != "mean":
        raise ValueError(f"split: a {split.kind} split fuses nothing")
    edges = np.column_stack([np.arange(n_sites), np.full(n_sites, n_sites)])  # z -- the mean
    return fused_groups(edges, delta, n_sites + 1)[:n_sites]


@dataclass
class History:
    """Per-round history: one dict per round (``round, objective, primal_residual,
    dual_residual, rho`` and anything else a method adds)."""

    rows: list[dict] = field(default_factory=list)

    def append(self, **row) -> None:
        self.rows.append(row)


def save_state(path, state: AdmmState, **extra: np.ndarray) -> None:
    """Write the state (and extra arrays) to an ``.npz`` file atomically.

    Parameters
    ----------
    path : str or path-like
        The file.
    state : AdmmState
        The state: ``beta``, ``rho``, ``round`` and split ``k``'s ``delta_k``, ``gamma_k``.
    **extra : ndarray
        Further arrays, saved under their names.
    """
    import os
    import tempfile

    arrays = {"beta": state.beta, "rho": np.array(state.rho), "round": np.array(state.round)}
    for k, (d, g) in enumerate(zip(state.delta, state.gamma, strict=True)):
        arrays[f"delta_{k}"] = d
        arrays[f"gamma_{k}"] = g
    arrays.update(extra)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".npz")
    os.close(fd)
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def load_state(path) -> tuple[AdmmState, dict[str, np.ndarray]]:
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    n_splits = sum(1 for k in data if k.startswith("delta_"))
    state = AdmmState(
        beta=data.pop("beta"),
        delta=tuple(data.pop(f"delta_{k}") for k in range(n_splits)),
        gamma=tuple(data.pop(f"gamma_{k}") for k in range(n_splits)),
        rho=float(data.pop("rho")),
        round=int(data.pop("round")),
    )
    return state, data

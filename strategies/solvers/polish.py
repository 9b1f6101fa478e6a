"""Exact solutions of the fused-lasso model problem on a tree, from an approximate one.

The proximal quasi-Newton server (:mod:`strategies.solvers.pqn`) solves, every round,

    minimize_b  (1/2) sum_z b_z^T B_z b_z - c_z^T b_z + sum_e lam_e ||(D b)_e||_1

with ``D`` the signed incidence of a forest (GrAUC-PFL's geographic minimum spanning tree)
and ``B_z`` positive definite ``p x p`` blocks.  ADMM reaches the right *pattern* (which
coefficient differences are zero, the signs of the others) long before it reaches a tight
tolerance.  Given a pattern, the solution is one linear solve (OSQP's "solution polishing",
Stellato et al. 2020, and the primal-dual active-set method of Hintermueller, Ito & Kunisch
2003):

* fused entries ``(e, j)`` merge the sites of each coordinate into clusters (the connected
  components of the fused edges); with ``b`` constant on clusters and ``nu_e = lam_e s_e`` on
  the other edges, stationarity ``B b - c + D^T nu = 0`` projected on the clusters is a
  symmetric positive definite system in one unknown per cluster;
* on a forest ``D^T nu = q`` has exactly one solution (``q`` summing to zero over every
  tree): ``nu_e`` is the sum of ``q`` over the subtree below ``e``, so the fused entries'
  multipliers are determined and the optimality conditions can be checked exactly:
  ``|nu_ej| <= lam_e`` where fused, ``sign (D b)_ej = s_ej`` elsewhere.

If the check fails the pattern is corrected (the active-set rule ``sign(nu + c D b)``) and
solved again, a few times at most; a pattern that does not settle is left to ADMM.  A
verified answer is the minimizer to rounding error: finer than any ADMM tolerance, with the
fused groups exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.linalg import cho_factor, cho_solve
from scipy.sparse.csgraph import breadth_first_order, connected_components
from scipy.sparse.linalg import splu

DUAL_SLACK = 1e-9  # relative slack of the check |nu| <= lam on fused entries
#: Inner ADMM iterations before the first exact polish (then twice as many each time); also
#: RowFed's (:mod:`strategies.solvers.rowpolish`).
POLISH_FIRST = 10
PATTERNS = 4  # sparsity structures kept per tree
PATIENCE = 3  # active-set steps without fewer violations before giving up
#: Blocks of at least this many coordinates solve a pattern by Schur complements onto the
#: shared clusters (:func:`cluster_solve`), up to this many shared clusters.
SCHUR_MIN_P = 64
SCHUR_MAX = 1500


# the system is symmetric positive definite: a symmetric ordering, pivots on the diagonal
_SPLU = {
    "permc_spec": "MMD_AT_PLUS_A",
    "diag_pivot_thresh": 0.0,
    "options": {"SymmetricMode": True},
}


@dataclass(frozen=True)
class Forest:
    """A forest incidence ``D`` (rows ``e_u - e_v``) prepared for subtree sums."""

    plus: np.ndarray  # (E,) the site with +1 in each row
    minus: np.ndarray  # (E,) the site with -1
    child: np.ndarray  # (E,) the endpoint farther from its tree's root
    sign: np.ndarray  # (E,) D[e, child(e)]
    parent: np.ndarray  # (Z,) parent site, -1 at roots
    levels: tuple[np.ndarray, ...]  # sites by depth below the root, deepest last
    edge_of: np.ndarray  # (Z,) the edge from a site to its parent, -1 at roots

    patterns: list = field(default_factory=list, compare=False, repr=False)
    index: dict = field(default_factory=dict, compare=False, repr=False)

    def block_index(self, p: int) -> tuple[np.ndarray, np.ndarray]:
        """Row and column, in the ``Zp x Zp`` system, of every entry of the stacked ``p x p``
        blocks ``B_z`` (computed once per ``p``)."""
        if p not in self.index:
            node = np.arange(len(self.parent) * p).reshape(-1, p)
            rows = np.repeat(node[:, :, None], p, axis=2).ravel()
            cols = np.repeat(node[:, None, :], p, axis=1).ravel()
            self.index[p] = (rows, cols)
        return self.index[p]

    def assemble(self, cluster, n_clusters, hess) -> sp.csc_matrix:
        """``sum_z E_z^T B_z E_z`` over the clusters (``E_z`` maps site ``z``'s coordinates to
        their clusters).  The last few patterns' sparsity structures are kept: the pattern
        seldom changes between late rounds, and then assembly is one weighted bincount.

        Parameters
        ----------
        cluster : ndarray of int, shape (Z p,)
            Each coordinate's cluster (:meth:`clusters`).
        n_clusters : int
            The number of clusters.
        hess : ndarray, shape (Z, p, p)
            The blocks ``B_z``.

        Returns
        -------
        scipy.sparse.csc_matrix, shape (n_clusters, n_clusters)
            The assembled matrix; for a kept pattern, the kept matrix with its entries
            overwritten.
        """
        rows, cols = self.block_index(hess.shape[1])
        data = hess.ravel()
        for pat in self.patterns:
            if len(pat["cluster"]) == len(cluster) and np.array_equal(pat["cluster"], cluster):
                if "slot" not in pat:  # second use: map every entry to its nonzero
                    m = pat["matrix"]
                    col = np.repeat(np.arange(n_clusters), np.diff(m.indptr))
                    keys = col * n_clusters + m.indices
                    pat["slot"] = np.searchsorted(keys, cluster[cols] * n_clusters + cluster[rows])
                m = pat["matrix"]
                m.data = np.bincount(pat["slot"], weights=data, minlength=m.nnz)
                return m
        m = sp.csc_matrix((data, (cluster[rows], cluster[cols])), shape=(n_clusters,) * 2)
        m.sort_indices()
        self.patterns.insert(0, {"cluster": cluster.copy(), "matrix": m})
        del self.patterns[PATTERNS:]
        return m

    def clusters(self, fused: np.ndarray) -> tuple[int, np.ndarray]:
        """The connected components of the fused entries (``fused``: ``(E, p)``, linking
        coordinate ``j`` of an edge's two sites), over the ``Z p`` coordinates: their count
        and each coordinate's label, numbered as ``scipy.sparse.csgraph.connected_components``
        numbers them (by each component's first coordinate).  One sweep down the levels: a
        site whose edge to its parent is fused in ``j`` takes its parent's label there."""
        n_sites, p = len(self.parent), fused.shape[1]
        label = np.arange(n_sites * p).reshape(n_sites, p)
        for level in self.levels[1:]:
            label[level] = np.where(
                fused[self.edge_of[level]], label[self.parent[level]], label[level]
            )
        label = label.ravel()
        first = np.full(n_sites * p, n_sites * p)
        np.minimum.at(first, label, np.arange(n_sites * p))
        firsts, cluster = np.unique(first[label], return_inverse=True)
        return len(firsts), cluster.ravel()

    def subtree_flow(self, q: np.ndarray) -> np.ndarray:
        """The ``nu`` with ``D^T nu = q`` (``q`` of shape ``(Z, p)`` summing to zero over
        every tree): ``nu_e = sign_e * sum of q over the subtree below e``."""
        acc = np.array(q, dtype=float, copy=True)
        for level in reversed(self.levels[1:]):
            np.add.at(acc, self.parent[level], acc[level])
        return self.sign[:, None] * acc[self.child]


def forest(matrix: sp.spmatrix) -> Forest | None:
    """``matrix`` as a :class:`Forest`, or ``None`` unless every row is ``e_u - e_v`` and the
    rows form a forest (no cycle); rooted by :func:`rooted`."""
    d = sp.csr_matrix(matrix)
    n_edges, n_sites = d.shape
    if n_edges == 0 or not np.all(np.diff(d.indptr) == 2):
        return None
    cols = d.indices.reshape(n_edges, 2)
    vals = d.data.reshape(n_edges, 2)
    if not np.all(np.sort(vals, axis=1) == [-1.0, 1.0]):
        return None
    first_plus = vals[:, 0] > 0
    plus = np.where(first_plus, cols[:, 0], cols[:, 1])
    minus = np.where(first_plus, cols[:, 1], cols[:, 0])
    adj = sp.coo_matrix((np.ones(n_edges), (plus, minus)), shape=(n_sites, n_sites))
    adj = (adj + adj.T).tocsr()
    n_comp, label = connected_components(adj, directed=False)
    if n_edges != n_sites - n_comp or adj.max() > 1:  # a cycle, or a repeated edge
        return None
    parent, depth = rooted(adj, label)
    levels = tuple(np.flatnonzero(depth == k) for k in range(int(depth.max()) + 1))
    child = np.where(parent[plus] == minus, plus, minus)
    edge_of = np.full(n_sites, -1)
    edge_of[child] = np.arange(n_edges)
    sign = np.where(child == plus, 1.0, -1.0)
    return Forest(plus, minus, child, sign, parent, levels, edge_of)


def rooted(adj: sp.csr_matrix, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each site's parent (-1 at roots) and depth in the forest ``adj`` (symmetric, its
    components labelled ``label``), each tree rooted at a centre of its longest path, so
    that sweeps over the levels take as few steps as possible.

    Parameters
    ----------
    adj : scipy.sparse.csr_matrix, shape (Z, Z)
        The forest's symmetric adjacency.
    label : ndarray of int, shape (Z,)
        Each site's component (one tree each).

    Returns
    -------
    parent : ndarray of int, shape (Z,)
        Each site's parent, -1 at roots.
    depth : ndarray of int, shape (Z,)
        Each site's depth below its root.
    """
    n_sites = adj.shape[0]
    parent = np.full(n_sites, -1)
    depth = np.zeros(n_sites, int)
    _, firsts = np.unique(label, return_index=True)
    for start in firsts:
        order, pred = breadth_first_order(adj, start, directed=False)
        far = order[-1]  # one end of a longest path
        order, pred = breadth_first_order(adj, far, directed=False)
        path = [order[-1]]  # walk back from the other end to find the middle
        while path[-1] != far:
            path.append(pred[path[-1]])
        root = path[len(path) // 2]
        order, pred = breadth_first_order(adj, root, directed=False)
        parent[order[1:]] = pred[order[1:]]
        for site in order[1:]:
            depth[site] = depth[pred[site]] + 1
    return parent, depth


@dataclass(frozen=True)
class Polished:
    b: np.ndarray  # (Z, p) the minimizer
    delta: np.ndarray  # (E, p) D b, exact zeros where fused
    nu: np.ndarray  # (E, p) the multipliers, nu_e in lam_e * subdifferential of |delta_e|
    iterations: int


def cluster_solve(
    tree: Forest, cluster: np.ndarray, n_clusters: int, hess: np.ndarray, rhs: np.ndarray
) -> np.ndarray | None:
    """Solve ``(sum_z E_z^T B_z E_z) y = rhs`` (one unknown per cluster), ``None`` if the
    matrix is not positive definite.

    With blocks of ``SCHUR_MIN_P`` or more coordinates, by the Schur complement onto the
    shared clusters: a cluster holds at most one coordinate of a site (fusion links one
    coordinate across sites), so the clusters of one coordinate alone are a site's own; each
    site eliminates its own coordinates with one ``p x p`` Cholesky, leaving a dense system
    in the shared clusters only (few where fusion is strong: ``p`` when every coordinate is
    fused over the whole tree).  Otherwise, or with more than ``SCHUR_MAX`` shared clusters,
    by a sparse LU of the assembled matrix.

    Parameters
    ----------
    tree : Forest
        The forest (which assembles the matrix, :meth:`Forest.assemble`).
    cluster : ndarray of int, shape (Z p,)
        Each coordinate's cluster.
    n_clusters : int
        The number of clusters.
    hess : ndarray, shape (Z, p, p)
        The blocks ``B_z``.
    rhs : ndarray, shape (n_clusters,)
        The right-hand side.

    Returns
    -------
    ndarray, shape (n_clusters,) or None
        ``y``, one value per cluster.
    """
    n_sites, p = hess.shape[:2]
    shared = np.bincount(cluster, minlength=n_clusters) > 1
    n_shared = int(shared.sum())
    if p < SCHUR_MIN_P or n_shared > SCHUR_MAX:
        try:
            return splu(tree.assemble(cluster, n_clusters, hess), **_SPLU).solve(rhs)
        except RuntimeError:
            return None
    index = np.cumsum(shared) - 1  # a shared cluster's place in the reduced system
    reduced = np.zeros((n_shared, n_shared))
    r_shared = rhs[shared].copy()
    parts = []
    try:
        for z in range(n_sites):
            cz = cluster[z * p : (z + 1) * p]
            own, sh = ~shared[cz], shared[cz]
            at = index[cz[sh]]
            b = hess[z]
            if not own.any():
                reduced[np.ix_(at, at)] += b
                parts.append(None)
                continue
            factor = cho_factor(b[np.ix_(own, own)], check_finite=False)
            w = cho_solve(factor, np.column_stack([b[np.ix_(own, sh)], rhs[cz[own]]]))
            w_s, w_r = w[:, :-1], w[:, -1]
            reduced[np.ix_(at, at)] += b[np.ix_(sh, sh)] - b[np.ix_(sh, own)] @ w_s
            r_shared[at] -= b[np.ix_(sh, own)] @ w_r
            parts.append((cz[own], w_s, w_r, at))
        y = np.empty(n_clusters)
        if n_shared:
            y[shared] = cho_solve(cho_factor(reduced, check_finite=False), r_shared)
    except np.linalg.LinAlgError:
        return None
    y_shared = y[shared]
    for part in parts:
        if part is not None:
            ids, w_s, w_r, at = part
            y[ids] = w_r - w_s @ y_shared[at]
    return y


def polish(
    tree: Forest,
    lam: np.ndarray,
    c: np.ndarray,
    hess: np.ndarray,
    delta: np.ndarray,
    max_iter: int = 30,
) -> Polished | None:
    """Solve ``min (1/2) sum b_z^T B_z b_z - c_z^T b_z + sum_e lam_e |(D b)_e|_1`` exactly,
    starting from the pattern of ``delta``.

    Parameters
    ----------
    tree : Forest
        The forest incidence ``D``.
    lam : ndarray, shape (E,)
        Each edge's level ``lam_e``.
    c : ndarray, shape (Z, p)
        The linear terms ``c_z``.
    hess : ndarray, shape (Z, p, p)
        The blocks ``B_z``.
    delta : ndarray, shape (E, p)
        An approximation of ``D b``: exact zeros are fused entries, the signs of the others
        their signs.
    max_iter : int, optional
        The most linear solves tried.

    Returns
    -------
    Polished or None
        The minimizer, ``D b`` and the multipliers; ``None`` if no pattern is verified
        within ``max_iter`` linear solves, the active-set steps stall or a system is not
        positive definite.
    """
    n_sites, p = c.shape
    lam = np.asarray(lam, float)[:, None]
    fused = delta == 0.0
    sign = np.where(delta < 0.0, -1.0, 1.0)
    slack = 1e-12 * max(1.0, float(np.abs(c).max())) * np.sqrt(n_sites)  # rounding in nu
    best, since_best = n_sites * p + 1, 0
    for it in range(1, max_iter + 1):
        n_clusters, cluster = tree.clusters(fused)
        nu_free = np.where(fused, 0.0, lam * sign)
        force = np.zeros((n_sites, p))  # D^T nu on the unfused entries
        np.add.at(force, tree.plus, nu_free)
        np.add.at(force, tree.minus, -nu_free)
        rhs = np.bincount(cluster, weights=(c - force).ravel(), minlength=n_clusters)
        y = cluster_solve(tree, cluster, n_clusters, hess, rhs)
        if y is None:  # singular: B not positive definite on the clusters
            return None
        b = y[cluster].reshape(n_sites, p)
        nu = tree.subtree_flow(c - np.einsum("zij,zj->zi", hess, b))
        d = b[tree.plus] - b[tree.minus]
        d[fused] = 0.0  # exact: both ends share the cluster's value
        ok_fused = np.abs(nu) <= lam * (1.0 + DUAL_SLACK) + slack
        ok_free = sign * d >= 0.0
        bad = ~np.where(fused, ok_fused, ok_free)
        if not bad.any():
            nu = np.where(fused, np.clip(nu, -lam, lam), lam * sign)
            return Polished(b, d, nu, it)
        if bad.sum() < best:
            best, since_best = int(bad.sum()), 0
        else:
            since_best += 1
            if since_best >= PATIENCE:  # the active-set steps stall: leave it to ADMM
                return None
        # the active-set rule sign(nu + c D b) with c -> 0: a fused entry whose multiplier
        # is out of range separates in its direction; a separated entry of the wrong sign fuses
        sign = np.where(fused & bad, np.where(nu < 0.0, -1.0, 1.0), sign)
        fused = fused ^ bad
    return None

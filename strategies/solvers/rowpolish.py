"""Exact solutions of RowFed's model problem on an identified pattern, from an approximate one.

RowFed's server solves, every round, the model problem (docs/methods.md 2.4)

    minimize_b  sum_m [g_m'(b_m - x_m) + (1/2) (b_m - x_m)' B_m (b_m - x_m)]
                + sum_j sum_(m < m') lam1_mm'j ||b_m(j) - b_m'(j)||_2 + sum lam2_mjk |b_mjk|

over the clients' ``p x q`` blocks ``b_m`` (rows ``b_m(j)``; the levels per pair and row, and
per entry, are a local linear approximation's weights).  Its inner ADMM reaches the right
*pattern* long before a tight tolerance: per row, which clients are fused into one cluster
(the fusion split's exact zeros, closed transitively), and which entries are zero (the
sparsity split's; within a cluster an entry counts as zero if any member's is).  On a fixed
pattern the problem is smooth: the unknowns are one centre per cluster with the zero entries
removed, the pairs in different clusters have nonzero differences and the nonzero entries
fixed signs.  :func:`polish_rows` minimizes it there by Newton's method (conjugate gradients
on Hessian-vector products preconditioned by the Hessian's diagonal, an Armijo search that
keeps the signs) and then *certifies* the point: it builds multipliers that satisfy the
optimality conditions exactly,

* on a pair in different clusters, ``lam1 d / ||d||`` (``d`` the rows' difference); on a
  nonzero entry, ``lam2 sign``;
* on a cluster's zero entry, a multiplier in ``[-lam2, lam2]`` per member, chosen so that
  the members' remaining residuals sum to zero and are as small as possible (least squares:
  a common clip level, found by bisection);
* on a pair inside a cluster, the inner ADMM's own multiplier corrected by least squares,
  ``z_mm' - (e_m - e_m') / c`` with ``e`` the residual and ``c`` the cluster's size (the
  correction from zero is too conservative where clusters fuse);

and accepts the point only if every pair's multiplier inside a cluster is within its level.
An accepted point is the minimizer to rounding error, with the fused rows and the zeros
exact; a wrong pattern is refused (a sign that must flip, a line search that stalls, an
entry whose zero cannot be balanced, a multiplier beyond its level) and left to ADMM.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import LinearOperator, cg

from .admm import all_pairs, incidence_matrix

DUAL_SLACK = 1e-9  # relative slack of the checks ||z|| <= lam1, |s| <= lam2
NEWTON_MAX = 16  # Newton steps before a pattern is given up
#: Newton stops when the reduced gradient's norm is at most this, times the scale and the
#: square root of the number of unknowns (rounding in the gradient grows so)
NEWTON_TOL = 1e-13
CG_MAX = 200  # conjugate-gradient steps per Newton step
#: Conjugate-gradient steps (Hessian products) per attempt, all Newton steps together, by
#: default: a pattern refused costs at most about this many products (an accepted one took
#: 60-160 at (100, 100), M = 10); the inner ADMM allows fewer (:data:`PRODUCTS_PER_STEP`)
CG_BUDGET = 300
#: ... at most this many Hessian products per ADMM iteration since the last attempt (a
#: product costs a quarter (M = 10) to a tenth (M = 50) of an iteration at (100, 100);
#: docs/performance.md measures 3, 10 and no bound: 10 keeps most of the unbounded attempts'
#: gain where patterns are found, and bounds what refused ones cost on degenerate problems)
PRODUCTS_PER_STEP = 10
FORCING = 0.1
BISECTIONS = 60  # bisection steps for a cluster's common clip level (to rounding)
#: Corrections of a pattern (entries joining or leaving the zero set) before it is given up
CORRECTIONS = 6
#: The inner ADMM tries the polish once at most this share of its pattern (fused pair rows
#: and zero entries) changed over the last 10 iterations (docs/performance.md)
STABLE = 0.02
#: Clusters of a row within this distance (relative to the scale) are merged where the line
#: search stalls at their kink
MEET = 1e-6
#: ... and those that a stalled search's direction carries through each other: their
#: difference's closest approach along it within this share of their distance
CROSSING = 1e-3
#: The shares of their levels below which a cluster's pairs are read as inside a part, for a
#: tight cut between two (:func:`_across_cut`)
CUT_SHARES = (1.0, 0.999, 0.99, 0.95, 0.9)
CUT_DEPTH = 8  # cuts within cuts
#: Entries within this distance of zero (relative to the scale; at most the gradient's norm)
#: that the gradient pushes across it are held at zero before a Newton step
EPS_ACTIVE = 1e-6
#: Alternating projections moving a certificate's multipliers into their balls
BALL_STEPS = 50
#: Newton's tolerance (as :data:`NEWTON_TOL`) for the rough minima the pattern is corrected at
ROUGH = 1e-8


@dataclass(frozen=True)
class RowPattern:
    """A pattern: per ``(client, row)`` its cluster ``gid`` (numbered over all rows), each
    cluster's size, zero entries and the signs of its other entries; the pairs of clusters
    of a row (``lo``, ``hi``) with their summed levels ``level``, as an incidence ``cd``."""

    gid: np.ndarray  # (M, p)
    size: np.ndarray  # (G,)
    zero: np.ndarray  # (G, q) bool
    sign: np.ndarray  # (G, q), 0 on zero entries
    cd: sp.csr_matrix  # (K, G): +1 at lo, -1 at hi
    level: np.ndarray  # (K,)
    summer: sp.csr_matrix  # (G, M p): a cluster's sum over its members
    same: np.ndarray  # (E, p) bool: the client pairs inside a cluster

    def expand(self, v: np.ndarray) -> np.ndarray:
        """The blocks ``b`` (``M x p x q``) of the cluster centres ``v`` (``G x q``)."""
        return v[self.gid]

    def gather(self, b: np.ndarray) -> np.ndarray:
        """Each cluster's sum of ``b`` (``M x p x q``) over its members."""
        return self.summer @ b.reshape(-1, b.shape[2])


def read_pattern(
    fused: np.ndarray, delta_s: np.ndarray, b: np.ndarray, lam_f: np.ndarray
) -> tuple[RowPattern, np.ndarray]:
    """The pattern of an ADMM iterate, and its cluster centres (masked).

    Parameters
    ----------
    fused : ndarray of bool, shape (E, p)
        Per pair ``m < m'`` (lexicographic) and row, whether the fusion split's ``delta`` is
        exactly zero there.
    delta_s : ndarray, shape (M, p, q)
        The sparsity split's ``delta``: an entry is zero where it is exactly zero.
    b : ndarray, shape (M, p, q)
        The iterate's blocks, whose cluster means start Newton and give the signs.
    lam_f : ndarray, shape (E, p)
        Each pair's level per row.

    Returns
    -------
    RowPattern, ndarray of shape (G, q)
    """
    n, p, q = b.shape
    plus, minus = all_pairs(n).T
    node = np.arange(n * p).reshape(n, p)
    e_idx, j_idx = np.nonzero(fused)
    links = sp.coo_matrix(
        (np.ones(e_idx.size), (node[plus[e_idx], j_idx], node[minus[e_idx], j_idx])),
        shape=(n * p, n * p),
    )
    n_groups, label = connected_components(links, directed=False)
    gid = label.reshape(n, p)
    size = np.bincount(label, minlength=n_groups).astype(float)
    summer = sp.csr_matrix((np.ones(n * p), (label, np.arange(n * p))), shape=(n_groups, n * p))
    zero = (summer @ (delta_s == 0.0).reshape(n * p, q).astype(float)) > 0.0
    centre = np.where(zero, 0.0, (summer @ b.reshape(n * p, q)) / size[:, None])
    sign = np.sign(centre)
    loose = (sign == 0.0) & ~zero  # a centre at exactly 0 off the zero set: the split's sign
    if loose.any():
        alt = np.sign(summer @ delta_s.reshape(n * p, q))
        sign[loose] = np.where(alt[loose] == 0.0, 1.0, alt[loose])
    same = gid[plus] == gid[minus]  # (E, p)
    ga, gb = gid[plus][~same], gid[minus][~same]
    lo, hi = np.minimum(ga, gb), np.maximum(ga, gb)
    keys, inv = np.unique(lo.astype(np.int64) * n_groups + hi, return_inverse=True)
    level = np.bincount(inv.ravel(), weights=lam_f[~same], minlength=keys.size)
    keep = level > 0.0
    keys, level = keys[keep], level[keep]
    k = keys.size
    ends = np.concatenate([keys // n_groups, keys % n_groups])
    signs = np.concatenate([np.ones(k), -np.ones(k)])
    cd = sp.csr_matrix((signs, (np.tile(np.arange(k), 2), ends)), shape=(k, n_groups))
    pattern = RowPattern(gid, size, zero, sign, cd, level, summer, same)
    return pattern, centre


@functools.lru_cache(maxsize=4)
def _incidence(n: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """The all-pairs incidence ``D`` (pairs ``m < m'``, lexicographic) and ``D^T``."""
    d = incidence_matrix(all_pairs(n), n)
    return d, sp.csr_matrix(d.T)


class _Reduced:
    """The model problem on a pattern's centres ``v`` (``G x q``, zero on the zero set)."""

    def __init__(self, pat: RowPattern, x, grad, hess, lam_s) -> None:
        self.pat, self.x, self.grad, self.hess = pat, x, grad, hess
        self.free = ~pat.zero
        # the sparsity's linear term: lam2 sign summed over each cluster's members
        self.lin = pat.gather(lam_s) * pat.sign

    def value(self, v: np.ndarray) -> float:
        r = self.pat.expand(v) - self.x
        smooth = float(np.sum(self.grad * r) + 0.5 * np.sum(r * np.matmul(self.hess, r)))
        dist = np.sqrt(np.sum((self.pat.cd @ v) ** 2, axis=1))
        return smooth + float(self.pat.level @ dist) + float(np.sum(self.lin * v))

    def gradient(self, v: np.ndarray) -> np.ndarray:
        r = self.pat.expand(v) - self.x
        out = self.pat.gather(self.grad + np.matmul(self.hess, r)) + self.lin
        d = self.pat.cd @ v
        dist = np.sqrt(np.sum(d * d, axis=1))
        out += self.pat.cd.T @ (d * (self.pat.level / dist)[:, None])
        return np.where(self.free, out, 0.0)

    def newton_system(self, v: np.ndarray):
        """The Hessian at ``v`` and its Jacobi preconditioner (the inverse of its diagonal:
        a cluster's curvature grows with its size, so at large M the unknowns' scales differ
        by the clusters' sizes), as :class:`LinearOperator`s on the flattened centres."""
        d = self.pat.cd @ v
        dist = np.sqrt(np.sum(d * d, axis=1))
        unit = d / dist[:, None]
        weight = (self.pat.level / dist)[:, None]
        shape = v.shape

        def apply(w_flat: np.ndarray) -> np.ndarray:
            w = np.where(self.free, w_flat.reshape(shape), 0.0)
            out = self.pat.gather(np.matmul(self.hess, self.pat.expand(w)))
            dw = self.pat.cd @ w
            dw = weight * (dw - unit * np.sum(unit * dw, axis=1, keepdims=True))
            out += self.pat.cd.T @ dw
            return np.where(self.free, out, 0.0).ravel()

        smooth = self.pat.summer @ np.diagonal(self.hess, axis1=1, axis2=2).ravel()
        diag = smooth[:, None] + abs(self.pat.cd).T @ (weight * (1.0 - unit * unit))
        inv = np.where(self.free & (diag > 0.0), 1.0 / np.where(diag > 0.0, diag, 1.0), 1.0)
        inv = inv.ravel()  # 1 on the zero set, where the Hessian's rows and columns are 0
        return (
            LinearOperator((v.size, v.size), matvec=apply, dtype=float),
            LinearOperator((v.size, v.size), matvec=lambda w: inv * w, dtype=float),
        )


def _clip_level(lo: np.ndarray, hi: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per group (consecutive runs from ``starts``), the common level ``mu`` with ``sum
    clip(mu, lo, hi) = 0``, by bisection; the clipped values."""
    group = np.repeat(np.arange(starts.size), np.diff(np.append(starts, lo.size)))
    a, b = np.minimum.reduceat(lo, starts), np.maximum.reduceat(hi, starts)
    for _ in range(BISECTIONS):
        mid = 0.5 * (a + b)
        total = np.add.reduceat(np.clip(mid[group], lo, hi), starts)
        a, b = np.where(total < 0.0, mid, a), np.where(total < 0.0, b, mid)
    return np.clip((0.5 * (a + b))[group], lo, hi)


@dataclass(frozen=True)
class RowPolished:
    b: np.ndarray  # (M, p, q) the minimizer
    delta: tuple[np.ndarray, np.ndarray]  # (D b with exact zeros in clusters, b)
    y: tuple[np.ndarray, np.ndarray]  # the multipliers: lam1 z (E, p, q), lam2 s (M, p, q)
    steps: int  # Newton steps


def certify(
    pat: RowPattern, b, x, grad, hess, lam_f, lam_s, y_pairs, scale: float, rough: bool = False
):
    """Multipliers proving ``b`` optimal for its pattern's problem (module docstring), or
    ``None``.

    Parameters
    ----------
    pat : RowPattern
        The pattern ``b`` lies on (equal rows in a cluster, zeros on its zero set).
    b, x, grad : ndarray, shape (M, p, q)
        The point, the model's centre and its gradient there.
    hess : ndarray, shape (M, p, p)
        The curvature model.
    lam_f : ndarray, shape (E, p)
        The fusion levels per pair and row.
    lam_s : ndarray, shape (M, p, q)
        The sparsity levels per entry.
    y_pairs : callable or None
        ``y_pairs() -> ndarray (E, p, q)``: a guess of the fusion's multipliers (``lam1 z``),
        a new array each call (overwritten with the certificate's multipliers),
        read on the pairs inside a cluster (not asked for when ``rough``).
    scale : float
        The problem's scale (the residual allowed for rounding is relative to it).
    rough : bool, optional
        Only find the zeros that cannot hold (``b`` an approximate minimum): ``(None,
        release)``, ``release`` ``None`` if there are none.

    Returns
    -------
    y : (y_f, y_s) or None
        The fusion's multipliers ``lam1 z`` per pair and the sparsity's ``lam2 s`` per entry;
        ``None`` if ``b`` is not certified.
    release : ndarray of shape (G, q) or None
        Where ``b`` is refused only because some zero entries cannot be balanced: the sign
        each of them takes when released (0 elsewhere).
    """
    n, p, q = b.shape
    inc, inc_t = _incidence(n)
    same = pat.same
    zero_b = pat.zero[pat.gid]  # (M, p, q)
    if np.any(np.sign(b)[~zero_b] != pat.sign[pat.gid][~zero_b]):
        return None, None
    # the rows with pairs in different clusters (most rows are fused whole at large M)
    open_rows = np.flatnonzero(~np.all(same, axis=0))
    guess = None if rough else y_pairs()
    n_open, n_pairs = open_rows.size, inc.shape[0]
    d = (inc @ b[:, open_rows].reshape(n, n_open * q)).reshape(n_pairs, n_open, q)
    dist = np.sqrt(np.sum(d * d, axis=2))
    same_o = same[:, open_rows]
    if np.any(dist[~same_o] == 0.0):  # two clusters met: the pattern is wrong
        return None, None
    safe = np.where(same_o, 1.0, dist)
    inside = 0.0 if guess is None else guess[:, open_rows]
    y_open = np.where(same_o[:, :, None], inside, d * (lam_f[:, open_rows] / safe)[:, :, None])
    del d
    y_s = np.where(zero_b, 0.0, lam_s * np.sign(b))
    if guess is None:
        pull = np.zeros((n, p, q))
    else:  # the guess balances the rows fused whole (their pairs all inside); it becomes y_f
        pull = (inc_t @ guess.reshape(n_pairs, p * q)).reshape(n, p, q)
        y_f = guess
        y_f[:, open_rows] = y_open
    pull[:, open_rows] = (inc_t @ y_open.reshape(n_pairs, n_open * q)).reshape(n, n_open, q)
    resid = grad + np.matmul(hess, b - x) + y_s + pull
    # zero entries: lam2 s in its box, the members' remainders summing to zero per cluster
    m_i, j_i, k_i = np.nonzero(zero_b)
    if m_i.size:
        key = pat.gid[m_i, j_i].astype(np.int64) * q + k_i
        order = np.argsort(key, kind="stable")
        m_i, j_i, k_i, key = m_i[order], j_i[order], k_i[order], key[order]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        r0, box = resid[m_i, j_i, k_i], lam_s[m_i, j_i, k_i]
        lo, hi = r0 - box, r0 + box
        tiny = 1e-12 * scale  # rounding on a box just reached
        low, high = np.add.reduceat(lo, starts) > tiny, np.add.reduceat(hi, starts) < -tiny
        if low.any() or high.any():  # these zeros cannot hold: release them
            release = np.zeros(pat.zero.shape)
            first = starts[low | high]
            release[pat.gid[m_i[first], j_i[first]], k_i[first]] = np.where(
                low[low | high], -1.0, 1.0
            )
            return None, release
        if not rough:
            t = _clip_level(lo, hi, starts)
            y_s[m_i, j_i, k_i] = np.clip(t - r0, -box, box)
            resid[m_i, j_i, k_i] = r0 + y_s[m_i, j_i, k_i]
    if rough:
        return None, None
    # what is left sums to zero over each cluster (to Newton's accuracy): the pairs inside
    # take it
    mean = pat.gather(resid) / pat.size[:, None]
    if np.max(np.abs(mean * pat.size[:, None])) > 1e-9 * scale:
        return None, None
    resid = resid - mean[pat.gid]
    size = pat.size[pat.gid[all_pairs(n)[:, 0]]]  # (E, p): the cluster's size, inside
    y_in = (inc @ resid.reshape(n, p * q)).reshape(-1, p, q)  # the correction, in place:
    y_in /= -size[:, :, None]
    y_in += y_f  # y_f - D e / c (large at large M: no more temporaries than needed)
    norm = np.sqrt(np.einsum("epq,epq->ep", y_in, y_in))
    allowed = lam_f * (1.0 + DUAL_SLACK) + 1e-12 * scale
    norm = _into_levels(y_in, norm, same, pat.gid, lam_f, allowed, size, n)
    if np.any(norm[same] > allowed[same]):  # a cluster that should split
        return None, None
    shrink = np.minimum(1.0, lam_f / np.where(norm > 0.0, norm, 1.0))  # rounding only
    y_in *= shrink[:, :, None]
    np.copyto(y_f, y_in, where=same[:, :, None])
    return (y_f, y_s), None


def _into_levels(y, norm, same, gid, lam, allowed, size, n: int) -> np.ndarray:
    """The multipliers of the pairs inside clusters ``y`` (``E x p x q``, norms ``norm``)
    moved into their balls where they leave them, in place, keeping what they balance: per
    row a tight cut carried evenly (:func:`_across_cut`), else alternating projections
    (:func:`_into_balls`).  The new norms."""
    over = np.flatnonzero(np.any((norm > allowed) & same, axis=0))
    for j in over:
        cut = _across_cut(y[:, j], same[:, j], gid[:, j], lam[:, j], allowed[:, j], n)
        if cut is not None:
            y[:, j] = cut
            norm[:, j] = np.sqrt(np.sum(cut * cut, axis=1))
    over = np.flatnonzero(np.any((norm > allowed) & same, axis=0))
    if over.size:
        y[:, over], norm[:, over] = _into_balls(
            y[:, over], same[:, over], lam[:, over], size[:, over], allowed[:, over], n
        )
    return norm


def _across_cut(y, inside, gid, lam, allowed, n: int):
    """One row's multipliers inside its clusters (``y``, ``E x q``, balancing what they must)
    moved into their balls by tight cuts, or ``None``.

    Where clusters met (:func:`_merged`) and the minimum has them fused with their
    multipliers on the boundary, every pair between the two parts must carry the flow ``F``
    between them at full level, in one direction: the least-squares correction spreads it
    over all pairs and leaves some across over their levels.  A cluster's parts are the
    components of its pairs below a share of their level (:data:`CUT_SHARES`, the first
    that gives exactly two, ``S`` and ``T``); the pairs across get ``lam F / sum(lam)``
    (within their levels iff ``||F|| <= sum lam``), each part's own pairs the least-squares
    correction to what is left, and a part whose pairs are still over is split again (at
    most :data:`CUT_DEPTH` deep).  What ``y`` balances, ``D^T y``, is kept exactly."""
    plus, minus = all_pairs(n).T
    norm = np.sqrt(np.sum(y * y, axis=1))
    out = y
    for g in np.unique(gid[plus[(norm > allowed) & inside]]):
        members = np.flatnonzero(gid == g)
        mine = inside & (gid[plus] == g)
        need = np.zeros((n, y.shape[1]))  # what the cluster's pairs balance at each member
        np.add.at(need, plus[mine], y[mine])
        np.add.at(need, minus[mine], -y[mine])
        out = _settle(out, need, mine, members, lam, allowed, CUT_DEPTH, n, (plus, minus))
        if out is None:
            return None
    return out


def _settle(y, need, mine, members, lam, allowed, depth: int, n: int, ends):
    """:func:`_across_cut` for one cluster or part (pairs ``mine``, members ``members``,
    ``D^T y = need`` there; ``ends`` the pairs' ``(plus, minus)``), ``None`` if no cut moves
    its multipliers in."""
    plus, minus = ends
    norm = np.sqrt(np.sum(y * y, axis=1))
    if np.all(norm[mine] <= allowed[mine]):
        return y
    for share in CUT_SHARES if depth else ():
        keep = mine & (norm <= share * lam)
        links = sp.coo_matrix((np.ones(int(keep.sum())), (plus[keep], minus[keep])), (n, n))
        _, label = connected_components(links, directed=False)
        parts = np.unique(label[members])
        if parts.size != 2:
            continue
        in_s = label == parts[0]
        across = mine & (in_s[plus] != in_s[minus])
        out = y.copy()
        flow = need[in_s].sum(axis=0)  # from S to T
        sign = np.where(in_s[plus[across]], 1.0, -1.0)
        out[across] = (sign * lam[across] / lam[across].sum())[:, None] * flow
        if np.any(np.sqrt(np.sum(out[across] ** 2, axis=1)) > allowed[across]):
            continue
        left = need.copy()
        np.add.at(left, plus[across], -out[across])
        np.add.at(left, minus[across], out[across])
        for part in (in_s, ~in_s):  # each part's own pairs: least squares to what is left
            own = mine & part[plus] & part[minus]
            if not own.any():
                continue
            got = np.zeros_like(left)
            np.add.at(got, plus[own], out[own])
            np.add.at(got, minus[own], -out[own])
            gap = np.where(part[:, None], got - left, 0.0)  # sums to 0 over the part
            inner = members[part[members]]
            out[own] -= (gap[plus[own]] - gap[minus[own]]) / float(inner.size)
            out = _settle(out, np.where(part[:, None], left, 0.0), own, inner, lam, allowed,
                          depth - 1, n, ends)  # fmt: skip
            if out is None:
                break
        return out  # the first cut found is kept (no search over others: work stays linear)
    # no cut: alternating projections on the cluster's own pairs
    size = np.full((y.shape[0], 1), float(members.size))
    z, z_norm = _into_balls(y[:, None], mine[:, None], lam[:, None], size, allowed[:, None], n)
    return z[:, 0] if np.all(z_norm[mine, 0] <= allowed[mine]) else None


def _into_balls(y, inside, lam, size, allowed, n: int):
    """Multipliers of the pairs inside clusters (``inside``) moved into their balls
    ``||y|| <= lam`` while keeping what they balance, ``D^T y``, by alternating projections
    (at most :data:`BALL_STEPS`): clip each pair's norm to its level, then the least-norm
    correction back onto ``D^T y`` (``- D r / c`` for the change ``r`` of ``D^T y`` and the
    cluster size ``c``: the clusters' pairs are complete graphs).  ``(y, norms)``, the last
    step an exact correction."""
    inc, inc_t = _incidence(n)
    shape = y.shape
    mask = inside[:, :, None]
    for _ in range(BALL_STEPS):
        norm = np.sqrt(np.sum(y * y, axis=2))
        clipped = y * np.minimum(1.0, lam / np.where(norm > 0.0, norm, 1.0))[:, :, None]
        moved = inc_t @ np.where(mask, clipped - y, 0.0).reshape(shape[0], -1)
        fix = (inc @ moved).reshape(shape) / size[:, :, None]
        y = np.where(mask, clipped - fix, y)
        norm = np.sqrt(np.sum(y * y, axis=2))
        if np.all(norm[inside] <= allowed[inside]):
            break
    return y, norm


def polish_rows(
    x, grad, hess, lam_f, lam_s, fused, delta_s, b, y_guess, scale: float,
    budget: int = CG_BUDGET,
) -> RowPolished | None:  # fmt: skip
    """The model problem's exact minimizer on the pattern of an ADMM iterate, certified, or
    ``None`` (module docstring).

    Parameters
    ----------
    x, grad : ndarray, shape (M, p, q)
        The model's centre and gradient.
    hess : ndarray, shape (M, p, p)
        The curvature model ``B_m``.
    lam_f : ndarray, shape (E, p)
        The fusion levels per client pair (``m < m'``, lexicographic) and row.
    lam_s : ndarray, shape (M, p, q)
        The sparsity levels per entry.
    fused, delta_s : ndarray
        The iterate's fused pair rows and sparsity split (:func:`read_pattern`).
    b : ndarray, shape (M, p, q)
        The iterate's blocks.
    y_guess : callable
        ``y_guess() -> ndarray (E, p, q)``: a guess of the fusion's multipliers (``lam1 z``)
        for :func:`certify`, asked for once a minimum is to be certified.
    scale : float
        The problem's scale (:func:`strategies.solvers.modelsolve.model_scale`).
    budget : int, optional
        The most Hessian products (conjugate-gradient steps) the attempt may take.

    Returns
    -------
    RowPolished or None
    """
    pat, v = _merged(*read_pattern(fused, delta_s, b, lam_f), lam_f)
    found = _active_newton(pat, v, x, grad, hess, lam_f, lam_s, y_guess, scale, budget)
    if found is None:
        return None
    pat, sol, y, steps = found
    n, p, q = sol.shape
    d = (_incidence(n)[0] @ sol.reshape(n, p * q)).reshape(-1, p, q)  # 0 where fused
    return RowPolished(sol, (d, sol.copy()), y, steps)


def _active_newton(pat: RowPattern, v, x, grad, hess, lam_f, lam_s, y_guess, scale, budget):
    """Newton's method on the pattern from ``v``, the pattern corrected on the way: entries
    that an accepted step carries across zero are held at zero and join the zero set (a
    projected search, :func:`_search`); zeros whose boxes cannot balance
    (:func:`certify`, checked at rough minima, and at the exact one) leave it.  Entries
    released so are not put back by the eps-active rule, only by a step that carries them
    across zero: a released entry's minimum is often within eps of zero, and the rule would
    otherwise hold it there again, release after release.  A step that carries more than
    :data:`STABLE` of the entries across zero shows a pattern far from the problem's (last
    round's, say) and is refused.  Once a rough minimum needs no change the minimum is found
    to rounding and certified.

    Returns
    -------
    (pattern, b, y, steps) or None
        The final pattern, the certified minimizer, its multipliers and the Newton steps;
        ``None`` if a certificate fails otherwise, the search stalls, or :data:`NEWTON_MAX`
        steps, ``budget`` Hessian products or :data:`CORRECTIONS` corrections do not settle
        it.
    """
    red = _Reduced(pat, x, grad, hess, lam_s)
    f, rough, steps, corrections, products = red.value(v), True, 0, 0, 0
    freed = np.zeros(x.shape, bool)  # entries released in this attempt
    while True:
        g = red.gradient(v)
        g_norm = float(np.linalg.norm(g))
        if not np.isfinite(g_norm):
            return None
        if g_norm <= (ROUGH if rough else NEWTON_TOL) * scale * np.sqrt(v.size):
            b = pat.expand(v)
            if rough:
                y, release = certify(pat, b, x, grad, hess, lam_f, lam_s, None, scale, True)
                if release is None:  # the zeros hold: on to the exact minimum
                    rough = False
                    continue
            else:
                y, release = certify(pat, b, x, grad, hess, lam_f, lam_s, y_guess, scale)
                if y is not None:
                    return pat, b, y, steps
                if release is None:
                    return None
            out = release != 0.0  # zeros that cannot hold leave the zero set, signed
            freed |= out[pat.gid]
            pat = replace(pat, zero=pat.zero & ~out, sign=np.where(out, release, pat.sign))
            corrections += 1  # each costs a rough minimum
            if corrections > CORRECTIONS:
                return None
        else:
            # entries at (or within eps of) zero that the gradient pushes across it join the
            # zero set before the step (Bertsekas 1982's eps-active set)
            eps = min(EPS_ACTIVE * scale, g_norm)
            stuck = red.free & (np.abs(v) <= eps) & (np.sign(g) == pat.sign)
            if freed.any():  # released zeros leave the set only by a step that crosses zero
                stuck &= ~(pat.gather(freed.astype(float)) > 0.0)
            if stuck.any():
                pat = replace(pat, zero=pat.zero | stuck, sign=np.where(stuck, 0.0, pat.sign))
                v = np.where(stuck, 0.0, v)
                pat, v = _merged(pat, v, lam_f)
                red, rough = _Reduced(pat, x, grad, hess, lam_s), True
                f = red.value(v)
                continue
            if steps == NEWTON_MAX or products >= budget:
                return None
            steps += 1
            forcing = min(FORCING, np.sqrt(g_norm / scale))
            count = [0]
            hessian, jacobi = red.newton_system(v)
            direction, _ = cg(
                hessian, -g.ravel(), rtol=forcing, M=jacobi,
                maxiter=min(CG_MAX, budget - products), callback=lambda _, c=count: c.append(1),
            )  # fmt: skip
            products += len(count)
            direction = np.where(red.free, direction.reshape(v.shape), 0.0)
            slope = float(np.sum(g * direction))
            if not slope < 0.0:
                return None
            # a projected search: entries that a step carries across zero stay at zero
            # and join the zero set (Bertsekas 1982's projected Newton step)
            moving = red.free & (np.sign(direction) == -pat.sign)
            cross = np.where(moving, v / np.where(moving, -direction, 1.0), np.inf)
            moved, f_new, hits = _search(red, v, f, g, direction, cross)
            if moved is None:  # a kink: two clusters about to meet are merged, else give up
                corrections += 1
                merged, v = _merged(pat, v, lam_f, MEET * scale, direction)
                if merged is pat or corrections > CORRECTIONS:
                    return None
                pat, red = merged, _Reduced(merged, x, grad, hess, lam_s)
                f, rough = red.value(v), True
                continue
            v, f = moved, f_new
            if not hits.any():
                continue
            if hits.sum() > STABLE * hits.size:  # far from the pattern: left to ADMM
                return None
            pat = replace(pat, zero=pat.zero | hits, sign=np.where(hits, 0.0, pat.sign))
        pat, v = _merged(pat, v, lam_f)
        red, rough = _Reduced(pat, x, grad, hess, lam_s), True
        f = red.value(v)


def _merged(pat: RowPattern, v: np.ndarray, lam_f, close: float = 0.0, direction=None):
    """The pattern with the clusters of a row that sit within ``close`` of each other merged
    (rows zeroed whole in two clusters, say; two clusters that meet), and, given the
    ``direction`` of a stalled search, the clusters it carries through each other (their
    difference's closest approach along it, at a step in (0, 1], within :data:`CROSSING`
    of their distance), read again from the blocks: ``(pattern, v)``, the signs of entries
    at zero off the zero set (just released) kept."""
    if not pat.level.size:
        return pat, v
    d = pat.cd @ v
    dist2 = np.sum(d * d, axis=1)
    meets = dist2 <= close * close
    if direction is not None:
        dd = pat.cd @ direction
        dd2, inner = np.sum(dd * dd, axis=1), np.sum(d * dd, axis=1)
        moving = dd2 > 0.0
        t = np.where(moving, -inner / np.where(moving, dd2, 1.0), 0.0)  # closest approach
        gap2 = np.maximum(dist2 + inner * t, 0.0)  # ||d + t dd||^2 there
        meets |= moving & (t > 0.0) & (t <= 1.0) & (gap2 <= CROSSING**2 * dist2)
    if not meets.any():
        return pat, v
    n_groups = pat.size.size
    ends = pat.cd.indices.reshape(-1, 2)  # each row of cd: its two clusters (sorted)
    meet = set((np.minimum(*ends.T) * n_groups + np.maximum(*ends.T))[meets].tolist())
    b = pat.expand(v)
    plus, minus = all_pairs(b.shape[0]).T
    g_plus, g_minus = pat.gid[plus], pat.gid[minus]
    key = np.minimum(g_plus, g_minus).astype(np.int64) * n_groups + np.maximum(g_plus, g_minus)
    fused = np.isin(key, list(meet)) | pat.same
    held = np.where(pat.zero[pat.gid], 0.0, np.where(b == 0.0, pat.sign[pat.gid], b))
    return read_pattern(fused, held, b, lam_f)


def _search(red: _Reduced, v, f: float, g, direction, cross):
    """A projected Armijo search along ``direction``: the trial point at step ``t`` (1, 1/2,
    ...) holds at zero the entries whose crossing ``cross`` (the step at which each reaches
    zero) is at most ``t``; accepted on sufficient decrease ``f(trial) <= f + 1e-4
    g'(trial - v)``, or, at the full step, when that predicted decrease is below the
    objective's rounding.  ``(v, f, held)`` after the step, ``(None, None, None)`` if it
    stalls."""
    t = 1.0
    while t >= 1e-3:
        held = cross <= t
        trial = np.where(held, 0.0, v + t * direction)
        f_trial = red.value(trial)
        decrease = float(np.sum(g * (trial - v)))
        if f_trial <= f + 1e-4 * decrease or (
            t == 1.0 and not held.any() and -decrease <= 1e-13 * max(1.0, abs(f))
        ):
            return trial, f_trial, held
        t *= 0.5
    return None, None, None

"""The geographic graph over institutions and its edge weights (docs/methods.md 1.2)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from geopy.distance import geodesic

from strategies.solvers.admm import all_pairs

GRAPHS = ("mst", "knn", "complete")
#: Above this many sites the MST uses the great-circle shortcut (see :func:`build_graph`).
EXACT_LIMIT = 60
#: Up to this many sites the bandwidth uses every pair's great-circle distance; beyond, a
#: fixed random sample of pairs.
ALL_PAIRS_LIMIT = 3000
BANDWIDTH_SAMPLE = 2_000_000
EARTH_RADIUS_KM = 6371.0088


def geodesic_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Geodesic distance (WGS-84 ellipsoid, Karney's algorithm via geopy) in km.

    Parameters
    ----------
    lat1, lon1 : float
        The first point, in degrees.
    lat2, lon2 : float
        The second point, in degrees.

    Returns
    -------
    float
        The distance in km.
    """
    return float(geodesic((lat1, lon1), (lat2, lon2)).km)


def distance_matrix(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """All pairwise geodesic distances (km).  The last few sets of locations are remembered: a
    study fits the same institutions dozens of times (cross-validation).

    Parameters
    ----------
    lat, lon : ndarray, shape (Z,)
        The sites' coordinates in degrees.

    Returns
    -------
    ndarray, shape (Z, Z)
        The distances (a copy: the caller may change it).
    """
    lat = np.ascontiguousarray(lat, dtype=float)
    lon = np.ascontiguousarray(lon, dtype=float)
    return _distances(lat.tobytes(), lon.tobytes()).copy()


@functools.lru_cache(maxsize=16)
def _distances(lat_bytes: bytes, lon_bytes: bytes) -> np.ndarray:
    lat, lon = np.frombuffer(lat_bytes), np.frombuffer(lon_bytes)
    z = len(lat)
    d = np.zeros((z, z))
    for u in range(z):
        for v in range(u + 1, z):
            d[u, v] = d[v, u] = geodesic_km(lat[u], lon[u], lat[v], lon[v])
    return d


def unit_vectors(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Points on the unit sphere for latitude/longitude in degrees.

    Parameters
    ----------
    lat, lon : ndarray, shape (Z,)
        Degrees.

    Returns
    -------
    ndarray, shape (Z, 3)
        The points' Cartesian coordinates.
    """
    phi = np.radians(np.asarray(lat, dtype=float))
    lam = np.radians(np.asarray(lon, dtype=float))
    return np.column_stack([np.cos(phi) * np.cos(lam), np.cos(phi) * np.sin(lam), np.sin(phi)])


def prim_chord_mst(xyz: np.ndarray) -> np.ndarray:
    """MST of unit vectors under chord distance, by Prim's algorithm with dense numpy updates:
    ``O(Z^2)`` time, ``O(Z)`` memory.  Uses ``chord^2 = 2 - 2 cos``, so one mat-vec per step.
    Ties go to the lowest index."""
    z = xyz.shape[0]
    xyz = np.ascontiguousarray(xyz, dtype=float)
    best = np.full(z, np.inf)
    parent = np.zeros(z, dtype=np.int64)
    done = np.zeros(z, dtype=bool)
    current = 0
    done[0] = True
    best[0] = -np.inf
    edges = np.empty((z - 1, 2), dtype=np.int64)
    for k in range(z - 1):
        d = 1.0 - xyz @ xyz[current]  # chord^2 / 2
        closer = d < best
        best[closer] = d[closer]
        parent[closer] = current
        best[done] = np.inf
        current = int(np.argmin(best))
        done[current] = True
        edges[k] = (parent[current], current)
    return _canonical(edges)


def great_circle_km(xyz_a: np.ndarray, xyz_b: np.ndarray) -> np.ndarray:
    """Great-circle distance (mean Earth radius) between points on the unit sphere, from their
    chord.

    Parameters
    ----------
    xyz_a, xyz_b : ndarray, shape (..., 3)
        The points (:func:`unit_vectors`), paired along the last axis.

    Returns
    -------
    ndarray, shape (...)
        The distances in km.
    """
    chord = np.linalg.norm(xyz_a - xyz_b, axis=-1)
    return 2.0 * EARTH_RADIUS_KM * np.arcsin(np.clip(chord / 2.0, 0.0, 1.0))


def _large_mst(lat: np.ndarray, lon: np.ndarray) -> SiteGraph:
    xyz = unit_vectors(lat, lon)
    e = prim_chord_mst(xyz)
    length = np.array([geodesic_km(lat[u], lon[u], lat[v], lon[v]) for u, v in e])
    z = lat.shape[0]
    if z <= ALL_PAIRS_LIMIT:
        u, v = np.triu_indices(z, k=1)
        keep = slice(None)
    else:
        rng = np.random.default_rng(0)
        u = rng.integers(0, z, BANDWIDTH_SAMPLE)
        v = rng.integers(0, z, BANDWIDTH_SAMPLE)
        keep = u != v
    bandwidth = float(np.median(great_circle_km(xyz[u[keep]], xyz[v[keep]]) ** 2))
    return SiteGraph(edges=e, length_km=length, bandwidth=bandwidth)


def _tree_from_ranked(n: int, pairs: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """MST of the graph with the given candidate pairs, ties broken lexicographically.

    Each candidate gets its rank in the order (length, u, v) as a unique integer weight, so
    the tree is unique and independent of igraph's internal tie-breaking.
    """
    order = np.lexsort((pairs[:, 1], pairs[:, 0], lengths))
    ranks = np.empty(len(order), dtype=float)
    ranks[order] = np.arange(len(order), dtype=float)
    import igraph as ig  # here: its import pulls in matplotlib (0.8 s at every ClientApp start)

    g = ig.Graph(n=n, edges=pairs.tolist())
    tree = g.spanning_tree(weights=ranks, return_tree=False)
    edges = pairs[np.asarray(tree, dtype=np.int64)]
    return _canonical(edges)


def _canonical(edges: np.ndarray) -> np.ndarray:
    edges = np.sort(np.asarray(edges, dtype=np.int64).reshape(-1, 2), axis=1)
    edges = np.unique(edges, axis=0)
    return edges


def mst_edges(dist: np.ndarray) -> np.ndarray:
    """Minimum spanning tree of the complete graph with distances ``dist`` (``Z - 1`` edges,
    or a forest's edges if ``Z == 1``).  Deterministic: ties by lexicographic ``(u, v)``."""
    z = dist.shape[0]
    if z < 2:
        return np.zeros((0, 2), dtype=np.int64)
    u, v = np.triu_indices(z, k=1)
    return _tree_from_ranked(z, np.column_stack([u, v]), dist[u, v])


def knn_edges(dist: np.ndarray, k: int) -> np.ndarray:
    """Symmetrized ``k``-nearest-neighbour graph (ties by site index).

    Parameters
    ----------
    dist : ndarray, shape (Z, Z)
        The pairwise distances.
    k : int
        Neighbours per site (at most ``Z - 1``).

    Returns
    -------
    ndarray of int, shape (n_edges, 2)
        The edges, ``u < v``, each once, sorted.
    """
    z = dist.shape[0]
    if z < 2:
        return np.zeros((0, 2), dtype=np.int64)
    k = min(k, z - 1)
    out = []
    for u in range(z):
        d = dist[u].copy()
        d[u] = np.inf
        nearest = np.lexsort((np.arange(z), d))[:k]
        out.extend((u, int(v)) for v in nearest)
    return _canonical(np.array(out))


def edge_weights(d_edges: np.ndarray, bandwidth: float, w_dist: float, q: float) -> np.ndarray:
    """``w_e = max(exp(-w_dist d_e^2 / H), q)`` (docs/methods.md 1.2).

    Parameters
    ----------
    d_edges : ndarray, shape (n_edges,)
        The edges' lengths ``d_e`` (km).
    bandwidth : float
        ``H``; ``H = 0`` (all sites at one place) gives every edge weight 1.
    w_dist : float
        How fast the weight decays with distance; 0 gives every edge weight 1.
    q : float
        The weights' floor.

    Returns
    -------
    ndarray, shape (n_edges,)
        The weights.
    """
    d_edges = np.asarray(d_edges, dtype=float)
    if w_dist == 0 or bandwidth <= 0:
        return np.ones_like(d_edges)
    return np.maximum(np.exp(-w_dist * d_edges**2 / bandwidth), q)


@dataclass(frozen=True)
class SiteGraph:
    """The graph over sites: ``edges`` ``(n_edges, 2)`` (``u < v``, site indices),
    geodesic ``length_km`` per edge, and the bandwidth ``H`` (median squared distance)."""

    edges: np.ndarray
    length_km: np.ndarray
    bandwidth: float

    def weights(self, w_dist: float, q: float) -> np.ndarray:
        """The edge weights (:func:`edge_weights` of the edges' lengths and the graph's bandwidth).

        Parameters
        ----------
        w_dist : float
            How fast the weight decays with distance (0: every edge 1).
        q : float
            The weights' floor.

        Returns
        -------
        ndarray, shape (n_edges,)
            Each edge's weight, in the order of ``edges``.
        """
        return edge_weights(self.length_km, self.bandwidth, w_dist, q)


#: The graphs built last (a federated tuning builds the same graph for each of its fits).
_BUILT: dict[tuple, SiteGraph] = {}
_BUILT_KEEP = 8


def build_graph(
    lat: np.ndarray,
    lon: np.ndarray,
    kind: str = "mst",
    k: int = 3,
    edges: np.ndarray | None = None,
) -> SiteGraph:
    """Build the site graph (kept for the same arguments; not to be changed in place).

    Parameters
    ----------
    lat, lon : ndarray, shape (Z,)
        Degrees.
    kind : {"mst", "knn", "complete"}
        Ignored when ``edges`` is given (a user edge list of site indices).
    k : int
        Neighbours for ``knn``.

    Notes
    -----
    ``H`` is the median over all pairs ``u < v`` of the squared geodesic distance.  Above
    ``EXACT_LIMIT`` sites the MST is found from chord lengths on the unit sphere (the
    great-circle MST: chord length is monotone in arc length) by Prim's algorithm in
    ``O(Z^2)`` time and ``O(Z)`` memory, geodesics are computed for the tree's edges only, and
    ``H`` uses great-circle distances (mean Earth radius) of all pairs, or of a fixed random
    sample of pairs beyond ``ALL_PAIRS_LIMIT`` sites.
    """
    lat = np.asarray(lat, dtype=float)
    lon = np.asarray(lon, dtype=float)
    given = None if edges is None else np.asarray(edges, dtype=np.int64)
    key = (lat.tobytes(), lon.tobytes(), kind, repr(k), None if given is None else given.tobytes())
    if key not in _BUILT:
        if len(_BUILT) >= _BUILT_KEEP:
            _BUILT.clear()
        graph = _build_graph(lat, lon, kind, k, edges)
        graph.edges.flags.writeable = graph.length_km.flags.writeable = False
        _BUILT[key] = graph
    return _BUILT[key]


def _build_graph(lat, lon, kind, k, edges) -> SiteGraph:
    z = lat.shape[0]
    if z > EXACT_LIMIT and edges is None and kind == "mst":
        return _large_mst(lat, lon)
    dist = distance_matrix(lat, lon)
    iu = np.triu_indices(z, k=1)
    bandwidth = float(np.median(dist[iu] ** 2)) if z > 1 else 0.0
    if edges is not None:
        e = _canonical(edges)
        if np.any(e[:, 0] == e[:, 1]):
            raise ValueError("edges: an edge joins a site to itself")
    elif kind == "mst":
        e = mst_edges(dist)
    elif kind == "knn":
        e = knn_edges(dist, k)
    elif kind == "complete":
        e = all_pairs(z)
    else:
        raise ValueError(f"graph: must be one of {', '.join(GRAPHS)}, got {kind!r}")
    length = dist[e[:, 0], e[:, 1]] if len(e) else np.zeros(0)
    return SiteGraph(edges=e, length_km=length, bandwidth=bandwidth)


def new_site_neighbours(
    lat: np.ndarray,
    lon: np.ndarray,
    new_lat: float,
    new_lon: float,
    rule: str = "nearest",
    kind: str = "mst",
    k: int = 3,
    w_dist: float = 0.0,
    q: float = 0.01,
    idw_k: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fitted sites a site outside the federation borrows from (docs/methods.md 3.13).

    ``graph``: the fit's graph (``kind``, ``k``) rebuilt over the fitted sites and the new
    one; the new site's neighbours there, weighted by the fit's edge weights
    (:func:`edge_weights` with the fitted sites' bandwidth ``H``).  ``nearest``: the nearest
    site, weight 1.  ``inverse-distance``: the ``idw_k`` nearest, weights ``1 / d`` (a site
    at distance 0 alone, weight 1).  Ties go to the lower index.

    Parameters
    ----------
    lat, lon : ndarray, shape (Z,)
        The fitted sites' coordinates in degrees.
    new_lat, new_lon : float
        The new site's.
    rule : str, optional
        ``"nearest"``, ``"graph"`` or ``"inverse-distance"``.
    kind : str, optional
        The fit's graph (``graph`` rule).
    k : int, optional
        Its neighbours for ``knn`` (``graph`` rule).
    w_dist : float, optional
        The fit's ``w_dist`` (``graph`` rule).
    q : float, optional
        The fit's weight floor (``graph`` rule).
    idw_k : int, optional
        Neighbours of the ``inverse-distance`` rule (default
        :data:`strategies.stats.predict.IDW_NEIGHBOURS`).

    Returns
    -------
    u : ndarray of int
        The fitted sites borrowed from (indices).
    d : ndarray
        Their geodesic distances (km) to the new site.
    w : ndarray
        Their weights.
    """
    from strategies.stats.predict import IDW_NEIGHBOURS, NEW_SITE_RULES

    if rule not in NEW_SITE_RULES:
        raise ValueError(f"rule: must be one of {', '.join(NEW_SITE_RULES)}, got {rule!r}")
    lat = np.asarray(lat, dtype=float)
    lon = np.asarray(lon, dtype=float)
    d = np.array([geodesic_km(new_lat, new_lon, a, b) for a, b in zip(lat, lon, strict=True)])
    by_distance = np.lexsort((np.arange(len(d)), d))
    if rule == "nearest" or (rule == "inverse-distance" and d[by_distance[0]] == 0.0):
        u = by_distance[:1]
        return u, d[u], np.ones(1)
    if rule == "inverse-distance":
        u = by_distance[: min(idw_k or IDW_NEIGHBOURS, len(d))]
        return u, d[u], 1.0 / d[u]
    z = len(lat)
    bandwidth = build_graph(lat, lon, kind, k).bandwidth
    grown = build_graph(np.append(lat, new_lat), np.append(lon, new_lon), kind, k)
    at = np.flatnonzero((grown.edges == z).any(axis=1))
    u = np.sort(grown.edges[at].min(axis=1))  # the other end of each of the new site's edges
    return u, d[u], edge_weights(d[u], bandwidth, w_dist, q)

"""The large-federation path of the graph: Prim on chord lengths equals the exact MST."""

import numpy as np

from grauc_flower import graph


def _globe(z, seed):
    rng = np.random.default_rng(seed)
    return np.degrees(np.arcsin(rng.uniform(-1, 1, z))), rng.uniform(-180, 180, z)


def test_prim_chord_mst_equals_exact_mst():
    lat, lon = _globe(500, 7)
    xyz = graph.unit_vectors(lat, lon)
    chord = np.sqrt(((xyz[:, None] - xyz[None]) ** 2).sum(-1))
    np.testing.assert_array_equal(graph.prim_chord_mst(xyz), graph.mst_edges(chord))


def test_prim_handles_coincident_points():
    lat = np.array([10.0, 10.0, 10.0, 50.0, 50.0])
    lon = np.array([5.0, 5.0, 5.0, -3.0, -3.0])
    e = graph.prim_chord_mst(graph.unit_vectors(lat, lon))
    assert len(e) == 4 and len(np.unique(e)) == 5


def test_large_path_agrees_with_exact_geodesic_path(monkeypatch):
    lat, lon = _globe(150, 11)
    monkeypatch.setattr(graph, "EXACT_LIMIT", 10**6)
    exact = graph.build_graph(lat, lon)
    monkeypatch.setattr(graph, "EXACT_LIMIT", 10)
    fast = graph.build_graph(lat, lon)
    assert len(fast.edges) == 149
    # the great-circle tree is the ellipsoidal one up to near-ties: same total length
    np.testing.assert_allclose(fast.length_km.sum(), exact.length_km.sum(), rtol=1e-3)
    shared = {tuple(e) for e in fast.edges} & {tuple(e) for e in exact.edges}
    assert len(shared) >= 140
    # tree edges carry ellipsoidal geodesic lengths
    u, v = fast.edges[0]
    np.testing.assert_allclose(fast.length_km[0], graph.geodesic_km(lat[u], lon[u], lat[v], lon[v]))
    # the sampled bandwidth is close to the all-pairs median
    np.testing.assert_allclose(fast.bandwidth, exact.bandwidth, rtol=0.02)

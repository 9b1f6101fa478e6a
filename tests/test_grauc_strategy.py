"""GrAUC-PFL strategies without a server, and what a client lets out.

The strategies are driven by hand: ``configure_fit`` / ``aggregate_fit`` /
``configure_evaluate`` on a ``SimpleClientManager`` holding stub proxies (which fail if
anything calls them), with hand-made ``FitRes`` objects, including failures.  Expected
values are computed here with numpy from docs/methods.md 1.3 and, separately, with the pure
functions of :mod:`strategies.solvers.admm`.
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetPropertiesRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from numpy.testing import assert_allclose, assert_array_equal

from grauc_flower.client import GrAUCClient
from grauc_flower.data import SiteData
from grauc_flower.datafit import PairwiseLogistic, split_by_class
from grauc_flower.graph import build_graph
from grauc_flower.metrics import delong
from strategies.config import GrAUCConfig
from strategies.server.grauc import GrAUCFedAvg, GrAUCStrategy, IndividualStrategy, initial_beta
from strategies.server.registry import EMPTY, Registry, grauc_meta, registration_properties
from strategies.solvers import admm
from strategies.solvers.local import PROX_SLACK
from strategies.wire import pack, unpack

P = 3
# site id -> (index, lat, lon, n_pos, n_neg); four sites, two close pairs far apart
SITES = {
    "A": (0, 34.0, -118.0, 5, 9),
    "B": (1, 34.5, -117.5, 6, 7),
    "C": (2, 40.7, -74.0, 4, 12),
    "D": (3, 41.0, -73.5, 8, 8),
}
ORDER = ["A", "B", "C", "D"]
# node ids deliberately unrelated to the site order
CIDS = {"n7": "C", "n2": "A", "n9": "D", "n4": "B"}


class StubProxy(ClientProxy):
    """A node the strategy may address but must never call itself, except for the
    properties exchange of registration (answered for ``site`` from its ``answers_from``-th
    call, failing before that or when ``site`` is ``None``).  ``asked`` counts the calls."""

    def __init__(self, cid, site=None, answers_from=1):
        super().__init__(cid)
        self.site = site
        self.asked = 0
        self.answers_from = answers_from

    def get_properties(self, ins, timeout, group_id):
        self.asked += 1
        if self.site is None or self.asked < self.answers_from:
            return GetPropertiesRes(Status(Code.GET_PROPERTIES_NOT_IMPLEMENTED, "down"), {})
        return GetPropertiesRes(Status(Code.OK, ""), register_props(self.site))

    def fail(self, ins, timeout, group_id):
        raise AssertionError("the strategy must not call clients")

    get_parameters = fit = evaluate = reconnect = fail


def manager_with(cids, down=()):
    mgr = SimpleClientManager()
    for cid, site in cids.items():
        mgr.register(StubProxy(cid, None if site in down else site))
    return mgr


def make_strategy(cfg, n_sites=4):
    return GrAUCStrategy(cfg, n_sites, Registry(), graph_builder=build_graph)


def ok(params, n, metrics):
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(params), n, metrics)


def register_props(site):
    """Site ``site``'s registration: per-feature sums ``10 index + (0, 1, 2)``."""
    index, lat, lon, n_pos, n_neg = SITES[site]
    sums = np.arange(P, dtype=float) + 10 * index
    props = {
        "site": site,
        "n": n_pos + n_neg,
        "index": index,
        "sum_x": pack(sums),
        "sum_x2": pack(sums**2 + 1.0),
        **grauc_meta(lat, lon, n_pos, n_neg),
    }
    return props


def admm_res(site, beta, loss=1.0):
    return ok([np.asarray(beta, dtype=float)], 10, {"task": "admm", "site": site, "loss": loss})


def failed_res():
    return FitRes(Status(Code.FIT_NOT_IMPLEMENTED, "boom"), EMPTY, 0, {})


def make_cfg(**kw):
    """ADMM settings (the hand computations below follow docs/methods.md 1.3, from the
    paper's seeded random start)."""
    base = {"lam": 0.3, "rho": 0.7, "w_dist": 1.0, "q": 0.05, "seed": 3, "algorithm": "admm"}
    base["init"] = "random"
    return GrAUCConfig(**{**base, **kw})


def registered(cfg=None, cids=CIDS, n_sites=4):
    """A strategy whose sites have all registered (Flower's ``initialize_parameters``).
    Returns ``(strategy, manager, {cid: proxy})``."""
    cfg = make_cfg() if cfg is None else cfg
    strategy = make_strategy(cfg, n_sites)
    mgr = manager_with(cids)
    assert strategy.initialize_parameters(mgr) is EMPTY
    assert strategy.ready
    return strategy, mgr, mgr.all()


def by_cid(instructions):
    return {proxy.cid: ins for proxy, ins in instructions}


def round_results(strategy, instructions, betas, skip=()):
    """Answers to ``admm`` instructions: site ``s`` returns ``betas[s]``."""
    out = []
    for proxy, ins in instructions:
        site = ins.config["site"]
        if site not in skip:
            out.append((proxy, admm_res(site, betas[site])))
    return out


def dense_incidence(edges, z):
    d = np.zeros((len(edges), z))
    for e, (u, v) in enumerate(edges):
        d[e, u], d[e, v] = 1.0, -1.0
    return d


def soft(x, a):
    return np.sign(x) * np.maximum(np.abs(x) - a, 0.0)


# ---------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------
def test_registration_asks_until_every_site_answered_then_never_again():
    strategy = make_strategy(make_cfg())
    mgr = manager_with(CIDS)
    mgr.all()["n4"].answers_from = 2  # B fails its first properties call
    # the properties exchange, before the first round: B is asked again until it answers
    assert strategy.initialize_parameters(mgr) is EMPTY
    assert {c: p.asked for c, p in mgr.all().items()} == {"n7": 1, "n2": 1, "n9": 1, "n4": 2}
    assert strategy.registry.cid_to_site == CIDS
    info = strategy.registry.sites["C"]
    assert (info.meta["lat"], info.meta["lon"], info.n) == (40.7, -74.0, 16)
    assert (info.meta["n_pos"], info.meta["n_neg"]) == (4, 12)
    assert_array_equal(info.sum_x, [20.0, 21.0, 22.0])
    # the method starts in the first round, with the sites in federation order
    assert strategy.ready
    assert strategy.sites == ORDER
    ins = strategy.configure_fit(1, EMPTY, mgr)
    assert {c: p.asked for c, p in mgr.all().items()} == {"n7": 1, "n2": 1, "n9": 1, "n4": 2}
    assert {i.config["task"] for _, i in ins} == {"admm"}
    assert sorted(p.cid for p, _ in ins) == sorted(CIDS)


# ---------------------------------------------------------------------------------------
# configure_fit: one FitIns per client, with its own site's beta and pull
# ---------------------------------------------------------------------------------------
def test_each_client_gets_its_own_fitins():
    cfg = make_cfg()
    strategy, mgr, proxies = registered(cfg)
    ins = by_cid(strategy.configure_fit(2, EMPTY, mgr))
    assert sorted(ins) == sorted(CIDS)
    beta0 = initial_beta(4, P, cfg)  # rows in federation order A, B, C, D
    for cid, fit_ins in ins.items():
        site = CIDS[cid]
        assert fit_ins.config["site"] == site
        assert fit_ins.config["task"] == "admm"
        assert fit_ins.config["local-solver"] == cfg.local_solver
        beta, pull = parameters_to_ndarrays(fit_ins.parameters)
        assert_array_equal(beta, beta0[ORDER.index(site)])
        assert_allclose(pull, 0.0, atol=1e-15)  # delta0 = Omega beta0, gamma0 = 0
    # no shared objects: changing one client's instructions leaves the others alone
    objs = list(ins.values())
    assert len({id(i) for i in objs}) == 4
    assert len({id(i.config) for i in objs}) == 4
    assert len({id(i.parameters) for i in objs}) == 4
    saved = copy.deepcopy(objs[1:])
    objs[0].config["site"] = "X"
    objs[0].parameters.tensors[0] = b"garbage"
    for before, after in zip(saved, objs[1:], strict=True):
        assert before.config == after.config
        assert before.parameters.tensors == after.parameters.tensors
    # rho-sigma is rho lambda_max(L) of the graph's Laplacian
    d = dense_incidence(strategy.graph.edges, 4)
    rho_sigma = cfg.rho * np.linalg.eigvalsh(d.T @ d)[-1]
    assert_allclose(objs[1].config["rho-sigma"], rho_sigma, rtol=1e-12)


def test_pull_after_a_round_is_the_hand_computation():
    cfg = make_cfg()
    strategy, mgr, _ = registered(cfg)
    ins = strategy.configure_fit(2, EMPTY, mgr)
    rng = np.random.default_rng(0)
    betas = {s: rng.standard_normal(P) for s in ORDER}
    strategy.aggregate_fit(2, round_results(strategy, ins, betas), [])
    st = strategy.state
    d = dense_incidence(strategy.graph.edges, 4)
    pull = d.T @ (st.gamma[0] + cfg.rho * (d @ st.beta - st.delta[0]))
    assert np.abs(pull).max() > 1e-3  # not trivially zero
    for cid, fit_ins in by_cid(strategy.configure_fit(3, EMPTY, mgr)).items():
        z = ORDER.index(CIDS[cid])
        beta, p = parameters_to_ndarrays(fit_ins.parameters)
        assert_array_equal(beta, betas[CIDS[cid]])
        assert_allclose(p, pull[z], rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------------------------------------
# aggregate_fit: delta and gamma by hand and with the pure steps
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("penalty", ["l1", "group"])
def test_aggregate_fit_delta_gamma_by_hand(penalty):
    cfg = make_cfg(penalty=penalty)
    strategy, mgr, _ = registered(cfg)
    rng = np.random.default_rng(1)
    ins = strategy.configure_fit(2, EMPTY, mgr)  # builds the graph
    edges = strategy.graph.edges
    d = dense_incidence(edges, 4)
    w = np.maximum(
        np.exp(-cfg.w_dist * strategy.graph.length_km**2 / strategy.graph.bandwidth), cfg.q
    )
    level = cfg.lam * w / cfg.rho
    zero_seen = nonzero_seen = False
    for rnd in (2, 3, 4):
        if rnd > 2:
            ins = strategy.configure_fit(rnd, EMPTY, mgr)
        old = strategy.state
        betas = {s: 0.6 * rng.standard_normal(P) for s in ORDER}
        beta = np.array([betas[s] for s in ORDER])
        params, metrics = strategy.aggregate_fit(rnd, round_results(strategy, ins, betas), [])
        assert params is EMPTY  # personalized: no global model; the state holds them
        assert_array_equal(strategy.state.beta, beta)
        x = d @ beta + old.gamma[0] / cfg.rho
        if penalty == "l1":
            delta = soft(x, level[:, None])
        else:
            norm = np.linalg.norm(x, axis=1, keepdims=True)
            delta = np.maximum(1.0 - level[:, None] / np.maximum(norm, 1e-300), 0.0) * x
        gamma = old.gamma[0] + cfg.rho * (d @ beta - delta)
        new = strategy.state
        assert_array_equal(new.beta, beta)
        assert_allclose(new.delta[0], delta, atol=1e-15)
        assert_allclose(new.gamma[0], gamma, atol=1e-15)
        assert new.round == old.round + 1
        # the same with the pure functions
        ref, res = admm.server_update(strategy.problem, old, beta, cfg.tol, cfg.tol)
        assert_allclose(new.delta[0], ref.delta[0], atol=1e-15)
        assert_allclose(new.gamma[0], ref.gamma[0], atol=1e-15)
        assert_allclose(metrics["primal_residual"], np.linalg.norm(d @ beta - delta), rtol=1e-12)
        dual = cfg.rho * np.linalg.norm(d.T @ (delta - old.delta[0]))
        assert_allclose(metrics["dual_residual"], dual, rtol=1e-12)
        diff = d @ beta
        pen = np.abs(diff).sum(axis=1) if penalty == "l1" else np.linalg.norm(diff, axis=1)
        assert_allclose(metrics["objective"], 4 * 1.0 + cfg.lam * w @ pen, rtol=1e-12)
        rows = np.all(delta == 0, axis=1) if penalty == "group" else (delta == 0)
        zero_seen |= bool(rows.any())
        nonzero_seen |= bool((~rows).any())
    assert zero_seen and nonzero_seen  # both sides of the threshold were exercised


# ---------------------------------------------------------------------------------------
# state keyed by site id
# ---------------------------------------------------------------------------------------
def test_state_does_not_depend_on_node_ids_or_result_order():
    cfg = make_cfg()
    betas = {s: np.random.default_rng(2).standard_normal(P) + k for k, s in enumerate(ORDER)}
    states = []
    for cids, reverse in ((CIDS, False), ({"0": "A", "1": "B", "2": "C", "3": "D"}, True)):
        strategy, mgr, _ = registered(cfg, cids)
        ins = strategy.configure_fit(2, EMPTY, mgr)
        results = round_results(strategy, ins, betas)
        strategy.aggregate_fit(2, results[::-1] if reverse else results, [])
        states.append(strategy.state)
    a, b = states
    assert_array_equal(a.beta, b.beta)
    assert_array_equal(a.delta[0], b.delta[0])
    assert_array_equal(a.gamma[0], b.gamma[0])


def test_rounds_do_not_wait_for_a_missing_node():
    """Only registration waits for every site: once the federation is fixed, a round goes on
    with the nodes that are there (a dead node must not stall every round)."""

    class CountingManager(SimpleClientManager):
        waits = 0

        def wait_for(self, num_clients, timeout=86400):  # counts, never blocks
            self.waits += 1
            return len(self) >= num_clients

    strategy = make_strategy(make_cfg(min_fit_fraction=0.5))
    mgr = CountingManager()
    for cid, site in CIDS.items():
        mgr.register(StubProxy(cid, site))
    strategy.initialize_parameters(mgr)
    assert strategy.ready
    waits = mgr.waits
    mgr.unregister(mgr.all()["n9"])  # D's node is gone
    ins = strategy.configure_fit(1, EMPTY, mgr)
    assert mgr.waits == waits
    assert sorted(i.config["site"] for _, i in ins) == ["A", "B", "C"]


def test_reregistered_site_keeps_its_state():
    cfg = make_cfg(min_fit_fraction=0.75)
    strategy, mgr, proxies = registered(cfg)
    ins = strategy.configure_fit(2, EMPTY, mgr)
    rng = np.random.default_rng(3)
    betas = {s: rng.standard_normal(P) for s in ORDER}
    strategy.aggregate_fit(2, round_results(strategy, ins, betas), [])
    before = strategy.state
    # the node serving C restarts under a new node id
    mgr.unregister(proxies["n7"])
    new = StubProxy("n11")  # down at first: registers in a later round
    mgr.register(new)
    ins = strategy.configure_fit(3, EMPTY, mgr)
    tasks = {p.cid: i.config["task"] for p, i in ins}
    assert tasks == {"n2": "admm", "n9": "admm", "n4": "admm"}
    assert new.asked == 1
    new_betas = {s: rng.standard_normal(P) for s in ORDER}
    results = round_results(strategy, ins, new_betas)
    strategy.aggregate_fit(3, results, [])
    new.site = "C"
    assert strategy.sites == ORDER
    z = ORDER.index("C")
    assert_array_equal(strategy.state.beta[z], before.beta[z])  # C did no step this round
    for s in ("A", "B", "D"):
        assert_array_equal(strategy.state.beta[ORDER.index(s)], new_betas[s])
    # next round: the new node registers and gets site C's coefficients
    nxt = by_cid(strategy.configure_fit(4, EMPTY, mgr))
    assert new.asked == 2
    assert strategy.registry.cid_to_site == {"n11": "C", "n2": "A", "n9": "D", "n4": "B"}
    assert nxt["n11"].config["site"] == "C"
    assert_array_equal(parameters_to_ndarrays(nxt["n11"].parameters)[0], before.beta[z])


# ---------------------------------------------------------------------------------------
# failures and partial rounds
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "how", ["missing", "failed_res", "exception", "wrong_shape", "two_arrays", "nan", "nan_loss"]
)
def test_failed_site_keeps_its_beta(how, caplog):
    cfg = make_cfg(min_fit_fraction=0.5)
    strategy, mgr, proxies = registered(cfg)
    ins = strategy.configure_fit(2, EMPTY, mgr)
    rng = np.random.default_rng(4)
    betas = {s: rng.standard_normal(P) for s in ORDER}
    old = strategy.state
    results = round_results(strategy, ins, betas, skip=("D",))
    failures = {
        "failed_res": [(proxies["n9"], failed_res())],
        "exception": [RuntimeError("node lost")],
    }.get(how, [])
    malformed = {  # an answer from D that cannot be used counts as no answer
        "wrong_shape": admm_res("D", np.zeros(P + 1)),
        "two_arrays": ok([np.zeros(P), np.zeros(P)], 10, {"task": "admm", "site": "D"}),
        "nan": admm_res("D", np.full(P, np.nan)),
        "nan_loss": admm_res("D", np.zeros(P), loss=float("nan")),
    }
    if how in malformed:
        results.append((proxies["n9"], malformed[how]))
    flwr_logger = logging.getLogger("flwr")  # it may not propagate to the root logger
    flwr_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="flwr"):
            strategy.aggregate_fit(2, results, failures)
    finally:
        flwr_logger.removeHandler(caplog.handler)
    if how in malformed:
        assert "site D sent a malformed update" in caplog.text
    expected = np.array([betas[s] for s in ORDER])
    expected[3] = old.beta[3]
    assert_array_equal(strategy.state.beta, expected)
    ref, _ = admm.server_update(strategy.problem, old, expected, cfg.tol, cfg.tol)
    assert_allclose(strategy.state.delta[0], ref.delta[0], atol=1e-15)
    assert_allclose(strategy.state.gamma[0], ref.gamma[0], atol=1e-15)
    assert strategy.history.rows[-1]["n_answered"] == 3
    if how == "failed_res":  # a failure with a known node names its site
        assert strategy.missing == {"D"}
    # the failed site is asked again next round, with its old coefficients
    ins = strategy.configure_fit(3, EMPTY, mgr)
    assert_array_equal(parameters_to_ndarrays(by_cid(ins)["n9"].parameters)[0], old.beta[3])
    # and when it answers again it is no longer missing
    strategy.aggregate_fit(3, round_results(strategy, ins, betas), [])
    assert "D" not in strategy.missing
    assert_array_equal(strategy.state.beta[3], betas["D"])


@pytest.mark.parametrize(
    "fraction, answering, skipped",
    [
        (0.8, 3, True),
        (0.75, 3, False),
        (1.0, 3, True),
        (1.0, 4, False),
        (0.3, 2, False),
        (0.3, 1, True),
    ],
)
def test_min_fit_fraction(fraction, answering, skipped):
    cfg = make_cfg(min_fit_fraction=fraction)
    strategy, mgr, _ = registered(cfg)
    ins = strategy.configure_fit(2, EMPTY, mgr)
    betas = {s: np.full(P, k + 5.0) for k, s in enumerate(ORDER)}
    old = strategy.state
    results = round_results(strategy, ins, betas, skip=ORDER[answering:])
    params, metrics = strategy.aggregate_fit(2, results, [])
    if skipped:
        assert params is EMPTY and metrics == {}
        assert strategy.state is old
        assert strategy.history.rows == []
    else:
        assert strategy.state.round == old.round + 1
        assert_array_equal(strategy.state.beta[:answering], [betas[s] for s in ORDER[:answering]])
        assert_array_equal(strategy.state.beta[answering:], old.beta[answering:])


# ---------------------------------------------------------------------------------------
# evaluation only when done
# ---------------------------------------------------------------------------------------
def test_configure_evaluate_only_when_done():
    cfg = make_cfg(max_rounds=2)
    strategy = make_strategy(cfg)
    mgr = manager_with(CIDS)
    assert strategy.configure_evaluate(1, EMPTY, mgr) == []
    strategy.initialize_parameters(mgr)
    assert strategy.configure_evaluate(1, EMPTY, mgr) == []
    betas = {s: np.full(P, float(k)) for k, s in enumerate(ORDER)}
    for rnd in (2, 3):
        assert not strategy.done
        ins = strategy.configure_fit(rnd, EMPTY, mgr)
        assert len(ins) == 4
        strategy.aggregate_fit(rnd, round_results(strategy, ins, betas), [])
        if rnd == 2:
            assert strategy.configure_evaluate(rnd, EMPTY, mgr) == []
    assert strategy.done
    assert strategy.configure_fit(4, EMPTY, mgr) == []
    ev = by_cid(strategy.configure_evaluate(4, EMPTY, mgr))
    assert sorted(ev) == sorted(CIDS)
    for cid, ev_ins in ev.items():
        assert isinstance(ev_ins, EvaluateIns)
        assert ev_ins.config["site"] == CIDS[cid]
        (beta,) = parameters_to_ndarrays(ev_ins.parameters)
        assert_array_equal(beta, betas[CIDS[cid]])
    metrics = {"auc": 0.7, "auc_se": 0.05, "n_pos": 3, "n_neg": 5, "split": "test"}
    results = [
        (
            p,
            EvaluateRes(
                Status(Code.OK, ""),
                0.5,
                8,
                {**metrics, "site": CIDS[p.cid], "auc": 0.6 + 0.1 * (CIDS[p.cid] == "A")},
            ),
        )
        for p in mgr.all().values()
    ]
    # answers in an order unlike the federation's: kept in federation order, so a mean over
    # sites is the same float whichever order the answers finished in
    results = sorted(results, key=lambda r: r[1].metrics["site"], reverse=True)
    assert [r[1].metrics["site"] for r in results] != strategy.sites
    _, agg = strategy.aggregate_evaluate(4, results, [])
    assert_allclose(agg["mean_auc"], (0.7 + 3 * 0.6) / 4)
    assert list(strategy.evaluation) == strategy.sites
    assert strategy.configure_evaluate(5, EMPTY, mgr) == []  # only once


def test_coefficients_on_input_scale_with_federated_standardization():
    cfg = make_cfg(standardize="federated")
    strategy, mgr, _ = registered(cfg)
    ins = strategy.configure_fit(2, EMPTY, mgr)
    reg = strategy.registry
    # pooled mean and SD from the registered per-feature sums
    infos = [reg.sites[s] for s in ORDER]
    n = sum(i.n for i in infos)
    s1 = sum(i.sum_x for i in infos)
    s2 = sum(i.sum_x2 for i in infos)
    mean = s1 / n
    sd = np.sqrt((s2 - n * mean**2) / (n - 1))
    assert_allclose(reg.center, mean)
    assert_allclose(reg.scale, sd)
    for _, fit_ins in ins:
        assert fit_ins.config["center"] == pack(mean)
        assert np.frombuffer(fit_ins.config["scale"], "<f8").shape == (P,)
    assert_allclose(strategy.coefficients(), strategy.coefficients_std() / sd)


# ---------------------------------------------------------------------------------------
# the baselines' strategies
# ---------------------------------------------------------------------------------------
def test_individual_strategy_sends_no_coefficients():
    strategy = IndividualStrategy(make_cfg(min_fit_fraction=1.0, standardize="none"), 4, Registry())
    mgr = manager_with(CIDS)
    strategy.initialize_parameters(mgr)
    ins = strategy.configure_fit(2, EMPTY, mgr)
    for proxy, fit_ins in ins:
        assert fit_ins.config == {"task": "local", "site": CIDS[proxy.cid]}
        assert parameters_to_ndarrays(fit_ins.parameters) == []
    fits = {s: np.full(P, k + 1.0) for k, s in enumerate(ORDER)}
    res = [
        (p, ok([fits[CIDS[p.cid]]], 9, {"site": CIDS[p.cid], "loss": 0.4}))
        for p, _ in ins
        if CIDS[p.cid] != "B"
    ]
    strategy.aggregate_fit(2, res, [])  # three of four: kept, not skipped, not done
    assert not strategy.done
    assert np.isnan(strategy.coefficients()[1]).all()
    ins = strategy.configure_fit(3, EMPTY, mgr)
    wrong = ok([np.zeros(P + 1)], 9, {"site": "B", "loss": 0.4})
    strategy.aggregate_fit(3, [(p, wrong) for p, _ in ins if p.cid == "n4"], [])
    assert not strategy.done  # a wrong-sized answer counts as none
    assert np.isnan(strategy.coefficients()[1]).all()
    ins = strategy.configure_fit(4, EMPTY, mgr)
    strategy.aggregate_fit(
        4,
        [(p, ok([fits["B"]], 9, {"site": "B", "loss": 0.4})) for p, _ in ins if p.cid == "n4"],
        [],
    )
    assert strategy.done
    assert_array_equal(strategy.coefficients(), [fits[s] for s in ORDER])


def test_fedavg_weights_by_examples_and_evaluates_last():
    cfg = make_cfg(fedavg_rounds=3, fedavg_local_steps=2, fedavg_lr=0.1)
    strategy = GrAUCFedAvg(cfg, 4, Registry(), initial=np.zeros(P))
    mgr = manager_with(CIDS)
    assert_array_equal(parameters_to_ndarrays(strategy.initialize_parameters(mgr))[0], 0.0)
    assert strategy.registry.cid_to_site == CIDS
    ins = strategy.configure_fit(1, ndarrays_to_parameters([np.zeros(P)]), mgr)
    assert len(ins) == 4
    for _, fit_ins in ins:
        assert fit_ins.config["task"] == "fedavg"
        assert fit_ins.config["fedavg-local-steps"] == 2
        assert fit_ins.config["fedavg-lr"] == 0.1
    n = {"A": 10, "B": 30, "C": 20, "D": 40}
    vals = {s: np.arange(P) + k + 0.5 for k, s in enumerate(ORDER)}
    results = [
        (p, ok([vals[CIDS[p.cid]]], n[CIDS[p.cid]], {"site": CIDS[p.cid], "loss": 1.0}))
        for p, _ in ins
    ]
    params, _ = strategy.aggregate_fit(1, results, [])
    expected = sum(n[s] * vals[s] for s in ORDER) / sum(n.values())
    assert_allclose(parameters_to_ndarrays(params)[0], expected, rtol=1e-12)
    assert strategy.configure_evaluate(1, params, mgr) == []
    strategy.aggregate_fit(2, results, [])
    assert strategy.configure_evaluate(2, params, mgr) == []
    strategy.aggregate_fit(3, results, [])
    assert strategy.done and strategy.rounds == 3
    assert strategy.configure_fit(4, params, mgr) == []
    assert len(strategy.configure_evaluate(3, params, mgr)) == 4


# ---------------------------------------------------------------------------------------
# the client: its local steps, and that nothing but coefficients and sums leave it
# ---------------------------------------------------------------------------------------
def client_site(seed=0, n=40, p=4):
    rng = np.random.default_rng(seed)
    y = np.repeat([1, 0], [15, n - 15])
    x = rng.standard_normal((n, p)) + 0.8 * y[:, None]
    yt = np.repeat([1, 0], [6, 14])
    xt = rng.standard_normal((20, p)) + 0.8 * yt[:, None]
    return SiteData("S1", 34.0, -118.0, x, y, xt, yt)


def scaling(data):
    center = data.x_train.mean(axis=0) + 0.1
    scale = data.x_train.std(axis=0) * 1.5
    return {"center": pack(center), "scale": pack(scale)}, center, scale


@pytest.mark.parametrize("standardized", [False, True])
@pytest.mark.parametrize("solver", ["prox", "linearized"])
def test_client_admm_step_formula(solver, standardized):
    data = client_site()
    client = GrAUCClient(data, ridge=0.01)
    extra, center, scale = scaling(data) if standardized else ({}, 0.0, 1.0)
    x = (data.x_train - center) / scale
    f = PairwiseLogistic(*split_by_class(x, data.y_train), eta=0.01)
    rng = np.random.default_rng(5)
    beta, pull = rng.standard_normal((2, 4))
    rho_sigma = 0.8
    cfg = {"task": "admm", "local-solver": solver, "rho-sigma": rho_sigma, "site": "S1", **extra}
    (new,), n, metrics = client.fit([beta, pull], cfg)
    assert n == 40
    if solver == "prox":
        c = rho_sigma * (1 + PROX_SLACK)
        tilde = beta - pull / c
        assert_allclose(f.grad(new) + c * (new - tilde), 0.0, atol=1e-10)
    else:
        c = f.lipschitz() + rho_sigma  # c_z = mu_z + rho lambda_max(L)
        assert_allclose(new, beta - pull / c - f.grad(beta) / c, rtol=1e-12)
    assert_allclose(metrics["loss"], f.value(new), rtol=1e-12)


def test_client_fedavg_and_local_tasks():
    data = client_site()
    client = GrAUCClient(data, ridge=0.02)
    f = PairwiseLogistic(*split_by_class(data.x_train, data.y_train), eta=0.02)
    beta = np.array([0.1, -0.2, 0.3, 0.0])
    cfg = {"task": "fedavg", "fedavg-local-steps": 3, "fedavg-lr": 0.4, "site": "S1"}
    (new,), _, metrics = client.fit([beta], cfg)
    expected = beta.copy()
    for _ in range(3):
        expected = expected - 0.4 * f.grad(expected)
    assert_allclose(new, expected, rtol=1e-12)
    assert_allclose(metrics["loss"], f.value(beta))  # the loss at the received beta
    cfg["fedavg-lr"] = 0.0  # 0 = 1 / mu_z
    (new,), _, _ = client.fit([beta], cfg)
    step = 1.0 / f.lipschitz()
    expected = beta.copy()
    for _ in range(3):
        expected = expected - step * f.grad(expected)
    assert_allclose(new, expected, rtol=1e-12)
    (local,), _, _ = client.fit([], {"task": "local", "site": "S1"})
    assert_allclose(f.grad(local), 0.0, atol=1e-9)
    with pytest.raises(RuntimeError, match="site mismatch"):
        client.fit([beta], {**cfg, "site": "S2"})
    with pytest.raises(ValueError, match="task"):
        client.fit([], {"task": "steal", "site": "S1"})


def assert_private(arrays, metrics, data, p):
    rows = np.vstack([data.x_train, data.x_test])
    for a in arrays:
        assert isinstance(a, np.ndarray)
        assert a.shape == (p,)
        assert np.all(np.isfinite(a))
        assert not np.any(np.all(np.isclose(rows, a[None, :], rtol=1e-9, atol=1e-12), axis=1))
    for key, value in metrics.items():
        assert type(value) in (int, float, str, bool), (key, type(value))
        if isinstance(value, str):
            assert len(value) < 32


@pytest.mark.parametrize("standardized", [False, True])
def test_client_never_returns_data_rows(standardized):
    data = client_site(seed=1)
    p = data.n_features
    client = GrAUCClient(data, ridge=1e-3, index=2)
    extra = scaling(data)[0] if standardized else {}
    site = {"site": "S1", **extra}
    rng = np.random.default_rng(6)
    beta, pull = rng.standard_normal((2, p))
    props = client.get_properties({})
    assert props == registration_properties(
        "S1",
        len(data.y_train),
        2,
        data.x_train,
        data.feature_names,
        **grauc_meta(34.0, -118.0, 15, 25),
        **{"moment-floor": 3 * p},  # the rows its guard needs for second moments (a count)
    )
    # per-feature sums, the only data summary that leaves
    assert_allclose(unpack(props["sum_x"]), data.x_train.sum(axis=0))
    assert_allclose(unpack(props["sum_x2"]), (data.x_train**2).sum(axis=0))
    for key, value in props.items():
        assert type(value) in (int, float, str, bool, bytes), (key, type(value))
    calls = [
        ([beta, pull], {"task": "admm", "local-solver": "prox", "rho-sigma": 0.5, **site}),
        ([beta, pull], {"task": "admm", "local-solver": "linearized", "rho-sigma": 0.5, **site}),
        ([], {"task": "local", **site}),
        ([beta], {"task": "fedavg", "fedavg-local-steps": 2, "fedavg-lr": 0.0, **site}),
    ]
    for params, cfg in calls:
        arrays, n, metrics = client.fit(params, cfg)
        assert isinstance(n, int) and n == len(data.y_train)
        assert_private(arrays, metrics, data, p)
    loss, n, metrics = client.evaluate([beta], site)
    assert type(loss) is float and n == len(data.y_test)
    assert_private([], metrics, data, p)
    center, scale = (scaling(data)[1:]) if standardized else (0.0, 1.0)
    a, se = delong((data.x_test - center) / scale @ beta, data.y_test)
    assert_allclose([metrics["auc"], metrics["auc_se"]], [a, se])
    assert metrics["split"] == "test"
    # Flower's own serialization accepts every answer (scalars only)
    wrapped = client.to_client()
    res = wrapped.fit(FitIns(ndarrays_to_parameters([beta, pull]), calls[0][1]))
    assert res.status.code == Code.OK
    assert [a.shape for a in parameters_to_ndarrays(res.parameters)] == [(p,)]

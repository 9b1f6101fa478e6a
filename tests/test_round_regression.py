"""Rounds are what a federated fit costs.  On a fixed small problem, with the default
federated standardization, the default proximal quasi-Newton algorithm converged in 6
rounds, the first its start round (its stopping rule reading ``tol`` as a relative objective
gap, self-scaling BFGS, each site starting from its own fit), ADMM with the exact local
step in 126 and the paper's linearized ADMM in 368 (counted after the start round); with a
random half of the sites per round (participation 0.5, seed 0) pqn took 21 and with 0.8, 11
(the fit's estimate is the last model solution; every site answers the start round; all
measured 2026-12-06; on the raw features: 7, 114, 382, 19, 11).
A change that needs more than 10% more rounds fails here.  Lower numbers are welcome:
update the constants with the new measurement."""

import pytest

from grauc_flower import federation as fed
from grauc_flower.data import simulate
from strategies.config import GrAUCConfig

MEASURED = {"pqn": 6, "prox": 126, "linearized": 368, "pqn-0.5": 21, "pqn-0.8": 11}


@pytest.fixture(scope="module")
def rounds():
    sites = simulate(n_sites=8, n_features=4, n_train=40, seed=2024)
    out = {}
    for variant in MEASURED:
        if variant.startswith("pqn"):
            share = float(variant[4:] or 1)
            changes = {"algorithm": "pqn", "participation": share}
        else:
            changes = {"algorithm": "admm", "local_solver": variant}
        res = fed.run_methods_inprocess(GrAUCConfig(max_rounds=5000, **changes), sites, ["grauc"])[
            "grauc"
        ]
        assert res.converged, variant
        out[variant] = res.rounds
    return out


@pytest.mark.parametrize("variant", list(MEASURED))
def test_rounds_to_converge_do_not_regress(rounds, variant):
    assert rounds[variant] <= 1.10 * MEASURED[variant], (variant, rounds[variant])


def test_default_is_the_cheapest_in_rounds(rounds):
    assert GrAUCConfig().algorithm == "pqn"
    assert rounds["pqn"] < rounds["prox"] / 4
    assert rounds["prox"] < rounds["linearized"] / 2
    assert rounds["pqn-0.5"] < rounds["prox"] / 2  # partial participation: still pqn's rounds


# ---------------------------------------------------------------------------------------
# RowFed (measured 2026-11-30 on the fixed problem below: auto = pqn 4, admm prox 150;
# 2026-12-02, participation 0.5: auto = pqn 15, admm prox 327; SCAD and MCP at
# lam1 = 0.2, lam2 = 0.1: auto = pqn 12 and 31, admm prox 168 and 523, SCAD at
# participation 0.5: 31; 2026-12-06, the start carrying each client's first curvature
# pair: auto = pqn 3, at participation 0.5 10, SCAD 10 (0.5: 14), MCP 10; then with the
# local linear approximations run to their fixed point on the server's models each round:
# SCAD 3 (0.5: 10), MCP 3)
# ---------------------------------------------------------------------------------------
ROWFED_MEASURED = {
    "auto": 3,
    "admm": 150,
    "auto-0.5": 10,
    "admm-0.5": 327,
    "scad:auto": 3,
    "scad:admm": 168,
    "scad:auto-0.5": 10,
    "mcp:auto": 3,
    "mcp:admm": 523,
}


@pytest.fixture(scope="module")
def rowfed_rounds():
    from rowfed_flower.federation import run_methods_inprocess
    from rowfed_flower.sources import DataSpec as RowFedDataSpec
    from rowfed_flower.sources import simulated_data
    from strategies.config import RowFedConfig

    data = simulated_data(
        RowFedDataSpec(num_clients=5, n_train=40, num_features=6, num_responses=4, seed=3)
    )
    out = {}
    for variant in ROWFED_MEASURED:
        penalty, _, rest = variant.rpartition(":")
        algorithm, _, share = rest.partition("-")
        cfg = RowFedConfig(
            algorithm=algorithm,
            participation=float(share or 1),
            intercept=False,
            max_rounds=5000,
        )
        if penalty:
            cfg = cfg.replace(penalty=penalty, lam1=0.2, lam2=0.1)
        res = run_methods_inprocess(cfg, data, ["rowfed"])["rowfed"]
        assert res.converged, variant
        out[variant] = (res.rounds, res.objective)
    return out


@pytest.mark.parametrize("algorithm", list(ROWFED_MEASURED))
def test_rowfed_rounds_do_not_regress(rowfed_rounds, algorithm):
    assert rowfed_rounds[algorithm][0] <= 1.10 * ROWFED_MEASURED[algorithm] + 1


def test_rowfed_default_is_the_cheapest_and_reaches_the_same_optimum(rowfed_rounds):
    (pqn_rounds, pqn_obj), (admm_rounds, admm_obj) = rowfed_rounds["auto"], rowfed_rounds["admm"]
    assert pqn_rounds < admm_rounds / 4
    assert abs(pqn_obj - admm_obj) <= 1e-5 * abs(admm_obj)
    (half_rounds, half_obj), (admm_half, _) = rowfed_rounds["auto-0.5"], rowfed_rounds["admm-0.5"]
    assert half_rounds < admm_half / 10  # participation 0.5: pqn keeps its few rounds
    assert abs(half_obj - pqn_obj) <= 1e-8 * abs(pqn_obj)


@pytest.mark.parametrize("penalty", ["scad", "mcp"])
def test_rowfed_nonconvex_default_ends_no_higher_than_the_papers_admm(rowfed_rounds, penalty):
    """MCP/SCAD by default (local linear approximations by pqn from the ADMM's start) end
    within the stopping tolerance (a 1e-6 gap) of the paper's ADMM fixed point or below it,
    in a tenth of its rounds; so does the incremental form at participation 0.5 (SCAD)."""
    (rounds, obj), (admm_rounds, admm_obj) = (
        rowfed_rounds[f"{penalty}:auto"],
        rowfed_rounds[f"{penalty}:admm"],
    )
    assert rounds < admm_rounds / 10
    assert (obj - admm_obj) / abs(admm_obj) <= 1e-6
    if penalty == "scad":
        half_rounds, half_obj = rowfed_rounds["scad:auto-0.5"]
        assert half_rounds < admm_rounds / 4
        assert (half_obj - admm_obj) / abs(admm_obj) <= 1e-6


def test_exact_curvature_reaches_a_1e6_gap_within_7_rounds_on_the_bench_problem():
    """``--curvature exact`` on the bench's 20-site problem from the default (random) start:
    a 1e-6 relative gap within 7 rounds (measured 2026-12-02: 6), and the stopping rule at
    most 2 rounds later (measured 7)."""
    sites, _ = fed.load_sites(fed.DataSpec())
    cfg = GrAUCConfig(curvature="exact")
    tight = fed.run_methods_inprocess(cfg.replace(tol=1e-13), sites, ["grauc"])["grauc"]
    # the history holds the models' prediction at each round's estimate (which may lie below
    # the optimum): the optimum comes from a tight full-participation fit (true values)
    ref = fed.run_methods_inprocess(GrAUCConfig(tol=1e-13), sites, ["grauc"])["grauc"]
    fstar = min(h["objective"] for h in ref.history)
    gaps = [abs(h["objective"] - fstar) / abs(fstar) for h in tight.history]
    first = next(k + 1 for k, g in enumerate(gaps) if g <= 1e-6)
    assert all(g <= 1e-6 for g in gaps[first - 1 :])
    assert first <= 7
    stop = fed.run_methods_inprocess(cfg, sites, ["grauc"])["grauc"]
    assert stop.converged and stop.rounds <= first + 2


def _true_gaps(cfg, rounds_list, fstar):
    """The relative gap of the objective at the fit's coefficients after each round count
    (each a fresh seeded fit cut at that round), from the sites' own losses -- not from the
    fit's history."""
    from grauc_flower.datafit import PairwiseLogistic, split_by_class
    from strategies.runtime.engine import run_inprocess
    from strategies.server.registry import Registry

    sites, _ = fed.load_sites(fed.DataSpec())
    out = []
    for rounds in rounds_list:
        point = cfg.replace(max_rounds=rounds)
        strategy = fed.make_strategy("grauc", point, len(sites), Registry(), sites)
        clients = [fed.GrAUCClient(s, cfg.ridge, index=k) for k, s in enumerate(sites)]
        run_inprocess(strategy, clients, fed.max_rounds_for("grauc", point))
        beta = strategy.coefficients_std()  # on the working (standardized) scale
        reg = strategy.registry
        xs = [
            s.x_train if reg.scale is None else (s.x_train - reg.center) / reg.scale for s in sites
        ]
        losses = [
            PairwiseLogistic(*split_by_class(x, s.y_train), cfg.ridge)
            for x, s in zip(xs, sites, strict=True)
        ]
        value = sum(f.value(b) for f, b in zip(losses, beta, strict=True))
        value += strategy.problem.penalty_value(beta)
        out.append((value - fstar) / abs(fstar))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_half_participation_reaches_a_1e6_gap_within_three_times_full_rounds(seed):
    """Participation 0.5 on the bench problem: the fit's coefficients (the last model
    solution) are within a 1e-6 relative gap of the optimum -- by the sites' own losses --
    after 3x the rounds full participation needs (9 on the standardized features), and the
    stopping rule's certificate holds where the fit stops, within 4x those rounds (measured
    2026-12-04: stops at 33, 22, 22 rounds for seeds 0-2; 28, 26, 26 on the raw features,
    where full participation needs 10)."""
    sites, _ = fed.load_sites(fed.DataSpec())
    tight = fed.run_methods_inprocess(GrAUCConfig(tol=1e-13), sites, ["grauc"])["grauc"]
    fstar = min(h["objective"] for h in tight.history)  # line search: true values
    full = next(
        k + 1 for k, h in enumerate(tight.history) if h["objective"] - fstar <= 1e-6 * fstar
    )
    cfg = GrAUCConfig(participation=0.5, seed=seed)
    stop = fed.run_methods_inprocess(cfg, sites, ["grauc"])["grauc"]
    assert stop.converged and stop.rounds <= 4 * full, (full, stop.rounds)
    (at_3x,) = _true_gaps(cfg.replace(tol=1e-12), [3 * full], fstar)
    (at_stop,) = _true_gaps(cfg, [stop.rounds], fstar)  # the stopped fit itself
    assert -1e-12 <= at_3x <= 1e-6 and at_stop <= 1e-6, (full, at_3x, at_stop)


def test_default_stops_within_two_rounds_of_reaching_its_tolerance():
    """The default fit on the bench problem reaches a 1e-6 relative gap within 11 rounds
    (measured 2026-12-02: 10) and stops at most 2 rounds after it first reaches a relative gap
    of ``tol`` (1e-4, 1e-6; measured: in that same round), and at that gap (against a 1e-13
    solve)."""
    sites, _ = fed.load_sites(fed.DataSpec())
    tight = fed.run_methods_inprocess(GrAUCConfig(tol=1e-13), sites, ["grauc"])["grauc"]
    fstar = min(h["objective"] for h in tight.history)
    gaps = [(h["objective"] - fstar) / abs(fstar) for h in tight.history]
    for tol in (1e-4, 1e-6):
        first = next(k + 1 for k, g in enumerate(gaps) if g <= tol)
        assert tol != 1e-6 or first <= 11, first
        stop = fed.run_methods_inprocess(GrAUCConfig(tol=tol), sites, ["grauc"])["grauc"]
        assert stop.converged and stop.rounds <= first + 2, (tol, first, stop.rounds)
        assert (stop.history[-1]["objective"] - fstar) / abs(fstar) <= tol

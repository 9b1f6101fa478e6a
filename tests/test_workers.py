"""Fits run in lockstep (strategies/solvers/lockstep.py) and their model problems solved in worker
processes (strategies/server/workers.py): the same answers, in the same order, as one after
another; a whole batched tuning gives bit-identical tables and coefficients with and
without workers, and stops its workers."""

from __future__ import annotations

import os

import numpy as np
import pytest

from strategies.server import workers
from strategies.solvers import admm, lockstep, modelsolve
from strategies.solvers.penalties import Penalty


def test_lockstep_batches_one_request_per_waiting_call_in_order():
    log, batches = [], []

    def caller(name, n):
        def run():
            got = []
            for k in range(n):
                log.append((name, k))
                got.append(lockstep.call(lambda r: ("alone", r), (name, k)))
            return got

        return run

    def batch(requests):
        batches.append(list(requests))
        return [("batched", r) for r in requests]

    out = lockstep.run([caller("a", 2), caller("b", 3), caller("c", 1)], batch)
    assert batches == [
        [("a", 0), ("b", 0), ("c", 0)],
        [("a", 1), ("b", 1)],
        [("b", 2)],
    ]
    assert out[1] == [("batched", ("b", k)) for k in range(3)]
    # each step runs the calls in the order given, as one after another would
    assert log == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("b", 2)]
    # outside run, call is the single function
    assert lockstep.call(lambda r: r * 2, 21) == 42


def test_lockstep_reraises_after_every_call_has_finished():
    finished = []

    def good():
        lockstep.call(None, 1)
        finished.append("good")
        return "ok"

    def bad():
        lockstep.call(None, 2)
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        lockstep.run([bad, good], lambda reqs: [r * 10 for r in reqs])
    assert finished == ["good"]


def test_a_failed_batch_reaches_its_callers():
    seen = []

    def caller():
        try:
            lockstep.call(None, 1)
        except Exception as exc:  # noqa: BLE001 - what each caller gets is the test
            seen.append(type(exc).__name__)
        return len(seen)

    def batch(requests):
        raise ValueError("the batch failed")

    lockstep.run([caller, caller], batch)
    assert seen == ["ValueError", "RuntimeError"]  # the cause, then the others told


def _requests(n, seed=0):
    """All-pairs row-group model problems (RowFed's) at different levels."""
    rng = np.random.default_rng(seed)
    z, p, q = 5, 4, 2
    edges = admm.all_pairs(z)
    out = []
    for k in range(n):
        x = rng.standard_normal((z, p, q))
        g = 0.3 * rng.standard_normal((z, p, q))
        a = rng.standard_normal((z, p, p))
        hess = np.einsum("zij,zkj->zik", a, a) + 0.1 * np.eye(p)
        lam = np.full(len(edges), 0.05 + 0.05 * k)
        split = admm.Split(admm.incidence_matrix(edges, z), Penalty("lasso"), lam, "row")
        prob = admm.Problem((split,), z)
        out.append(modelsolve.ModelRequest(prob, x, g, hess, np.zeros(z, bool), None, 1e-11, 0.0))
    return out


def test_workers_answer_as_the_server_would_and_stop():
    reqs = _requests(7)
    alone = [modelsolve.solve_request(r) for r in reqs]
    with workers.ModelWorkers(2, after=0.0) as pool:
        got = pool(reqs)
        pids = pool.pids()
        assert pool.started and len(pids) == 2 and pool.steps == {"serial": 0, "parallel": 1}
    assert not pool.started
    for a, b in zip(alone, got, strict=True):
        np.testing.assert_array_equal(a.b, b.b)  # the same code: bit for bit
        assert a.iterations == b.iterations and a.rho == b.rho
    for pid in pids:  # stopped, and reaped
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_workers_start_only_once_a_serial_step_is_slow():
    reqs = _requests(3)
    pool = workers.ModelWorkers(2, after=3600.0)
    pool(reqs)
    pool(reqs)
    assert not pool.started and pool.steps == {"serial": 2, "parallel": 0}
    assert workers.ModelWorkers(1, after=0.0)(reqs) is not None  # one worker: in process
    with pytest.raises(ValueError, match="workers"):
        workers.ModelWorkers(-1)


def test_cheap_steps_are_not_gathered_but_measured_again(monkeypatch):
    """Problems that took less than MIN_PARALLEL each: the next steps run ungathered,
    except one in PROBE_EVERY, which measures again; dear ones are always gathered."""
    reqs = _requests(3)
    pool = workers.ModelWorkers(2, after=3600.0)
    assert pool.gathers()  # nothing measured yet
    monkeypatch.setattr(workers, "MIN_PARALLEL", 3600.0)  # every problem is cheap
    pool(reqs)
    asked = [pool.gathers() for _ in range(2 * workers.PROBE_EVERY)]
    assert asked.count(True) == 2 and asked[workers.PROBE_EVERY - 1] and asked[-1]
    monkeypatch.setattr(workers, "MIN_PARALLEL", 0.0)  # now every problem is dear
    pool(reqs)
    assert all(pool.gathers() for _ in range(workers.PROBE_EVERY + 1))
    assert not workers.ModelWorkers(1).gathers() and not pool.started


def test_a_tuning_with_workers_equals_the_tuning_without(monkeypatch):
    """RowFed's CV (every fit's model problem in two worker processes from its first step)
    and the same CV in the server's process: the same table and coefficients, bit for
    bit, and the workers stopped at the end."""
    from rowfed_flower import federation as fed
    from rowfed_flower import sources as rsources
    from rowfed_flower.federated_tuning import tuned_strategy
    from strategies.config import RowFedConfig
    from strategies.experiments.benchtable import timed_tuning
    from strategies.server.rowfed import rowfed_registry
    from strategies.stats.tuning import CVOptions

    monkeypatch.setattr(workers, "PARALLEL_AFTER", 0.0)
    spec = rsources.DataSpec(num_clients=6, n_train=60, num_features=6, num_responses=3)
    data = rsources.load_data(spec)
    cfg = RowFedConfig()
    runs = {}
    for jobs in (1, 2):
        opts = (CVOptions(folds=3, quiet=True, jobs=jobs), (0.2, 0.05), (0.05, 0.01), None)
        batch = tuned_strategy("rowfed", cfg, len(data.clients), rowfed_registry(),
                                   ("cv", opts))  # fmt: skip
        timed_tuning(batch, data.make_clients(), fed.max_rounds_for("rowfed", cfg, True))
        runs[jobs] = (batch, fed.collect("rowfed", batch))
    (b1, r1), (b2, r2) = runs[1], runs[2]
    assert b1.model_workers.steps["parallel"] == 0 and b2.model_workers.steps["parallel"] > 0
    assert not b2.model_workers.started
    t1, t2 = (r.extra["tuning_table"][1] for r in (r1, r2))
    assert t1.equals(t2)
    np.testing.assert_array_equal(r1.coefficients, r2.coefficients)
    assert (r1.lam1, r1.lam2) == (r2.lam1, r2.lam2)


def test_workers_that_cannot_start_leave_the_work_to_the_server(monkeypatch):
    from concurrent.futures.process import BrokenProcessPool

    def broken(self):
        raise BrokenProcessPool("no processes here")

    monkeypatch.setattr(workers.ModelWorkers, "_start", broken)
    reqs = _requests(3)
    pool = workers.ModelWorkers(2, after=0.0)
    got = pool(reqs)
    assert pool.workers == 0 and pool.steps == {"serial": 1, "parallel": 0}
    for a, b in zip([modelsolve.solve_request(r) for r in reqs], got, strict=True):
        np.testing.assert_array_equal(a.b, b.b)

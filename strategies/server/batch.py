"""The server's half of a batch, many fits side by side in one Flower run: the rounds of a
federated tuning (docs/methods.md 3.12).

A :class:`BatchStrategy` runs a *plan*, a generator that yields :class:`Stage` s.  A stage
starts *jobs*: each job is one fit, a strategy of its own (GrAUC-PFL or RowFed at one
setting, unchanged), and the *view* of the data its sites fit on (a fold of their own rows,
or all of them; GrAUC-PFL's ridge).  Every round each site gets **one** message holding the
instructions of every job still running (their arrays one after the other, their configs in
one JSON field) and answers them all at once; the server hands each job its own answers, so
each job advances exactly as it would alone.  A job leaves the batch when it is done.  A
stage ends when its jobs are done; it may ask for one batched evaluation of them (each site
scores every job on its view's held-out rows and pools the scores of the jobs of one setting
across its folds), and the plan, resumed, reads the scores and yields the next stage.  The
plan's ``return`` names the job whose fit is the run's result; it is evaluated as any fit
is (:class:`~strategies.server.base.EvaluatedOnce`).

Sites answer only what a fit already sends, job by job, and the validation scores or counts
of the criterion; a view's rows never leave the site, nor which rows are in which fold.

The client side (:mod:`strategies.client.batch`) is ``answer_properties``, ``answer_fit``
and ``answer_evaluate``, written once for both methods' clients: a client supplies
``view(spec)`` (a client of the same class on the view's rows) and, for pooled criteria,
``oof_part(parameters, config)`` and ``pool(parts)``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from logging import WARNING

import numpy as np
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Status,
    log,
)
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from .. import flower_quieted
from ..solvers import lockstep
from ..wire.batch import FIELD, TASK, VIEW_FIELD, data_view, decode, encode, split_properties
from .registry import EMPTY, Registry, ask_properties
from .workers import ModelWorkers


def pooled_by_site(pooled: dict, i: int, key: str) -> dict[str, float]:
    """Each site's pooled out-of-fold score of one setting: per repeat of the folds its
    scores of all K folds together, then the mean over repeats (each row counts once per
    score).

    Parameters
    ----------
    pooled : dict
        :attr:`BatchStrategy.pooled`: ``{group: {site: pooled metrics}}``.
    i : int
        The setting; its groups are ``s<i>/r<repeat>``.
    key : str
        The metric read.

    Returns
    -------
    dict of str to float
        Each site's mean over repeats of the finite values (``nan`` when none is).
    """
    values: dict[str, list[float]] = {}
    for group, per_site in pooled.items():
        if group.startswith(f"s{i}/"):
            for site, m in per_site.items():
                values.setdefault(site, []).append(float(m[key]))
    out = {}
    for site, v in values.items():
        finite = [x for x in v if np.isfinite(x)]
        out[site] = float(np.mean(finite)) if finite else float("nan")
    return out


class _Once(logging.Filter):
    """Each distinct warning once: a site that does not answer is named by every job."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text in self.seen:
            return False
        self.seen.add(text)
        return True


@contextlib.contextmanager
def _quiet():
    """The jobs' own INFO lines (each fit's set-up line) silenced, and each of their
    warnings said once: a batch has hundreds of jobs."""
    with flower_quieted(_Once()):
        yield


@dataclass
class Job:
    """One fit of a batch: its strategy, the view its sites fit on, the setting it stands
    for (a row of the tuning table) and the group whose held-out scores a site pools."""

    key: str
    strategy: Strategy
    view: dict = field(default_factory=dict)
    setting: dict = field(default_factory=dict)
    group: str = ""
    cancelled: bool = False
    #: Whether the job has been admitted (:attr:`BatchStrategy.max_fits`); until then it
    #: waits, its strategy untouched.
    started: bool = False

    @property
    def done(self) -> bool:
        return bool(self.strategy.done) or self.cancelled


@dataclass
class Stage:
    """What a plan yields: jobs to start; the stage ends when they are done; ``evaluate``:
    then one batched evaluation of them (the plan reads each job's ``evaluation`` and the
    batch's :attr:`BatchStrategy.pooled`)."""

    jobs: list[Job]
    evaluate: bool = False
    name: str = ""
    #: Jobs started with the stage that it does not wait for (they run on).
    also: list[Job] = field(default_factory=list)


class ViewRegistry(Registry):
    """A registry of one view's rows: the same sites and nodes as the federation's, each
    registered with its view's counts and sums (asked with :data:`VIEW_FIELD`)."""

    def __init__(self, main: Registry, view: dict) -> None:
        super().__init__(centre=main.centre, waiting=main.waiting, settled=True)
        self.absent = list(main.absent)
        self.refused = set(main.refused)
        self.view = data_view(view)
        self.properties_config = {VIEW_FIELD: json.dumps(self.view, sort_keys=True)}


class _NodesOnce:
    """A client manager whose node list is read once: Flower's asks the Grid for the nodes
    on every ``all()`` (across hospitals, a call to the SuperLink), and every running fit
    registers through it each round -- hundreds of calls a round, minutes at the main job's
    scale.  The fits of one hook see the one list; everything else is the manager's own."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self._nodes: dict | None = None

    def all(self) -> dict:
        if self._nodes is None:
            self._nodes = self._inner.all()
        return dict(self._nodes)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _clocked(sends: bool):
    """A hook's time counts as the server's in its round; for ``aggregate_*``, the time
    since the ``configure_*`` that sent messages ended counts as the sites' (the messages
    out, the sites' work, the answers back), and so does a hook's wait for the sites'
    registrations (``self._waited``)."""

    def deco(fn):
        @functools.wraps(fn)
        def hook(self, server_round, *args, **kwargs):
            clock = self.clock.setdefault(int(server_round), [0.0, 0.0])
            self._hook_start = start = time.perf_counter()
            self._waited = 0.0
            if not sends and self._sent is not None:
                clock[1] += start - self._sent
                self._sent = None
            out = None
            try:
                out = fn(self, server_round, *args, **kwargs)
                return out
            finally:
                end = time.perf_counter()
                clock[0] += end - start - self._waited  # a registration's wait is the sites'
                clock[1] += self._waited
                self._sent = end if sends and out else None

        return hook

    return deco


class BatchStrategy(Strategy):
    """A plan's jobs side by side (module docstring).

    Parameters
    ----------
    plan : callable
        ``plan(batch) -> generator`` yielding :class:`Stage` s and returning the key of the
        result's job.  It is started once the sites have registered (``batch.registry``).
    n_sites : int
    registry : Registry
        The federation's registry (the full view's).
    timeout : float, optional
        Seconds registration waits for the sites.
    progress : callable, optional
        ``progress(line)``: a line per round (stage, fits running and done, time).
    workers : int, optional
        Processes for the fits' server model problems (:mod:`strategies.server.workers`; ``None``
        or 0: one per core, at most 4; 1: all in the server's process).
    max_fits : int, optional
        At most this many fits run at once (0: every fit a stage starts).  The others wait,
        in the order the plan gave them, and start as running ones finish: each fit
        advances as it would alone, so the results are the same; memory follows the fits
        running, and the rounds grow
        (:meth:`strategies.stats.tuning.CVOptions.waves`).
    """

    def __init__(
        self,
        plan: Callable[[BatchStrategy], Generator],
        n_sites: int,
        registry: Registry,
        timeout: float | None = None,
        progress: Callable[[str], None] | None = None,
        workers: int | None = None,
        max_fits: int = 0,
    ) -> None:
        super().__init__()
        self.plan_fn = plan
        self.max_fits = int(max_fits)
        self.model_workers = ModelWorkers(workers or None)
        self.n_sites = int(n_sites)
        self.registry = registry
        self.timeout = timeout
        self.progress = progress
        self.jobs: dict[str, Job] = {}
        self.views: dict[str, Registry] = {}
        #: ``{group: {site: pooled metrics}}`` from the batched evaluations.
        self.pooled: dict[str, dict[str, dict]] = {}
        self.stage: Stage | None = None
        self.stages: list[str] = []
        self.result: Job | None = None
        #: What the plan leaves for the outputs (its tables and choice).
        self.outputs: dict = {}
        #: The finished run's additions to its result (the method's tuning sets it: the
        #: tables, metrics and chosen settings its fit command writes).
        self.describe: Callable[[], dict] = dict
        self.rounds = 0
        self.fits = 0
        self._plan = None
        self._evaluating = False
        self._evaluated: list[Job] = []
        self._t0 = time.perf_counter()
        #: ``{round: [server seconds, sites' seconds]}`` (:func:`_clocked`).
        self.clock: dict[int, list[float]] = {}
        self._sent: float | None = None
        self._hook_start = self._t0
        self._waited = 0.0

    # -- what the apps read -----------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.result is not None and self.result.strategy.done

    @property
    def finished(self) -> bool:
        return self.result is not None and bool(getattr(self.result.strategy, "finished", False))

    def unanswered(self) -> list[str]:
        return self.result.strategy.unanswered() if self.result is not None else []

    # -- views ------------------------------------------------------------------------------
    def registry_for(self, view: dict) -> Registry:
        """The registry of ``view``'s rows: the federation's for all rows, else one per
        view (made on first use; its sites register when its first job starts)."""
        key = json.dumps(data_view(view), sort_keys=True)
        if key == "{}":
            return self.registry
        if key not in self.views:
            self.views[key] = ViewRegistry(self.registry, view)
        return self.views[key]

    # -- Flower hooks -----------------------------------------------------------------------
    def initialize_parameters(self, client_manager):
        self.registry.settle(client_manager, self.n_sites, self.timeout, 0)
        self.sites = self.registry.order()
        self._plan = self.plan_fn(self)
        self._next(None)
        return EMPTY

    def _next(self, value) -> None:
        """Resume the plan: its next stage, or (when it returns) the result's job."""
        try:
            self.stage = self._plan.send(value)
        except StopIteration as stop:
            self.stage = None
            self.result = self.jobs[stop.value]
            for job in self.jobs.values():
                if job is not self.result and not job.strategy.done:
                    job.cancelled = True
            return
        self.stages.append(self.stage.name)
        for job in [*self.stage.jobs, *self.stage.also]:
            if job.key in self.jobs:
                raise ValueError(f"batch: job {job.key!r} started twice")
            self.jobs[job.key] = job
            self.fits += 1

    def running(self) -> list[Job]:
        """The admitted jobs not yet done."""
        return [j for j in self.jobs.values() if j.started and not j.done]

    def _admit(self) -> None:
        """Start waiting jobs, in the plan's order, while fewer than ``max_fits`` run."""
        room = self.max_fits - len(self.running()) if self.max_fits > 0 else len(self.jobs)
        for job in self.jobs.values():
            if room <= 0:
                break
            if not job.started and not job.done:
                job.started = True
                room -= 1

    def _pack(self, jobs, ask, make) -> list:
        """Every job's instructions for each client (``ask(job)``: its ``(proxy, ins)``
        list) packed into one message per client (``make(params, config)``): the arrays one
        after the other, the jobs' configs in one JSON field."""
        per_client: dict[str, tuple[ClientProxy, list]] = {}
        with _quiet():
            for job in jobs:
                for proxy, ins in ask(job):
                    per_client.setdefault(proxy.cid, (proxy, []))[1].append((job, ins))
        out = []
        for proxy, items in per_client.values():
            tensors: list[bytes] = []
            records = []
            for job, ins in items:
                tensors.extend(ins.parameters.tensors)
                records.append(
                    {
                        "job": job.key,
                        "view": job.view,
                        "n": len(ins.parameters.tensors),
                        "group": job.group,
                        "config": dict(ins.config),
                    }
                )
            site = self.registry.cid_to_site.get(proxy.cid, "")
            params = Parameters(tensors=tensors, tensor_type="numpy.ndarray")
            out.append((proxy, make(params, {"task": TASK, "site": site, FIELD: encode(records)})))
        return out

    def timing(self) -> dict:
        """The server's and the sites' seconds per round (means over the rounds that sent
        messages; the sites' include the messages' way there and back), the slowest round
        of each, and the rounds in which the server took longer than the sites."""
        rows = np.array([v for v in self.clock.values() if v[1] > 0.0]).reshape(-1, 2)
        if not len(rows):
            return {}
        server, sites = rows[:, 0], rows[:, 1]
        return {
            "rounds": len(rows),
            "server_seconds_per_round": round(float(server.mean()), 4),
            "sites_seconds_per_round": round(float(sites.mean()), 4),
            "server_seconds_max": round(float(server.max()), 4),
            "sites_seconds_max": round(float(sites.max()), 4),
            "rounds_server_slower": int((server > sites).sum()),
        }

    def _register_views(self, client_manager, server_round) -> None:
        """The views not yet registered (a stage's folds), every site asked for all of them
        in one message instead of one message per view: across hospitals each message is
        a round trip and a ClientApp started."""
        pending = [r for r in self.views.values() if not r.cid_to_site]
        if len(pending) < 2:
            return  # one view registers through its own fits as before
        nodes = client_manager.all()
        clients = [nodes[c] for c in sorted(nodes) if c in self.registry.cid_to_site]
        config = {VIEW_FIELD: json.dumps([r.view for r in pending], sort_keys=True)}
        t0 = time.perf_counter()
        answers = ask_properties(clients, config, self.timeout, server_round)
        self._waited += time.perf_counter() - t0
        for proxy, props in answers:
            if props is not None:
                for reg, part in zip(pending, split_properties(props, len(pending)), strict=True):
                    reg.register(proxy.cid, part)

    @_clocked(sends=True)
    def configure_fit(self, server_round, parameters, client_manager):
        self._advance_stages()
        self._admit()
        client_manager = _NodesOnce(client_manager)
        self._register_views(client_manager, server_round)
        out = self._pack(
            self.running(),
            lambda job: job.strategy.configure_fit(server_round, parameters, client_manager),
            FitIns,
        )
        if out:
            self.rounds = server_round
        return out

    @_clocked(sends=False)
    def aggregate_fit(self, server_round, results, failures):
        per_job: dict[str, list] = {}
        for proxy, res in results:
            if FIELD not in res.metrics:
                log(WARNING, "round %s: a batched answer without its jobs; ignored", server_round)
                continue
            at = 0
            for it in decode(str(res.metrics[FIELD])):
                n = int(it["n"])
                sub = FitRes(
                    Status(Code.OK, ""),
                    Parameters(res.parameters.tensors[at : at + n], res.parameters.tensor_type),
                    int(it["num"]),
                    it["config"],
                )
                at += n
                per_job.setdefault(it["job"], []).append((proxy, sub))
        self.registry.log_failures(failures, server_round)  # once, not once per job
        # every fit's step, in lockstep: their model problems solved together
        ran = self.running()
        steps = [
            functools.partial(j.strategy.aggregate_fit, server_round, per_job.get(j.key, []), [])
            for j in ran
        ]
        with _quiet():
            if not self.model_workers.gathers():  # nothing to gain from gathering them
                for step in steps:
                    step()
            else:
                lockstep.run(steps, self.model_workers)
        for job in ran:  # a finished fold fit needs only its coefficients from now on
            if job.view and job.strategy.done and hasattr(job.strategy, "release"):
                job.strategy.release()
        self._advance_stages()
        if sum(not j.done for j in self.jobs.values()) < 2:  # nothing left to share the workers
            self.model_workers.close()
        if self.progress is not None:
            running = len(self.running())
            waiting = sum(not (j.started or j.done) for j in self.jobs.values())
            now = time.perf_counter()
            server, sites = self.clock[int(server_round)]
            self.progress(
                f"tuning round {server_round}: stage {self.stage.name if self.stage else 'refit'}"
                f", {running} fits running, {len(self.jobs) - running - waiting} done"
                f"{f', {waiting} waiting' if waiting else ''} "
                f"({now - self._t0:.1f} s; this round: sites {sites:.2f} s, "
                f"server {server + now - self._hook_start - self._waited:.2f} s)"
            )
        return EMPTY, {}

    def _advance_stages(self) -> None:
        """Resume the plan while its stage is over and needs no evaluation."""
        while (
            self.stage is not None
            and not self.stage.evaluate
            and all(j.done for j in self.stage.jobs)
        ):
            self._next(None)

    @_clocked(sends=True)
    def configure_evaluate(self, server_round, parameters, client_manager):
        client_manager = _NodesOnce(client_manager)
        if self.stage is not None and self.stage.evaluate and all(j.done for j in self.stage.jobs):
            self._evaluating = True
            # the stage's jobs, and those of its unwaited jobs that are done (their own
            # evaluation: the result among them needs no round of its own afterwards)
            self._evaluated = [*self.stage.jobs, *(j for j in self.stage.also if j.strategy.done)]
            out = self._pack(
                self._evaluated,
                lambda job: job.strategy.configure_evaluate(
                    server_round, parameters, client_manager
                ),
                EvaluateIns,
            )
            if out:
                self.rounds = server_round
            return out
        self._evaluating = False
        if self.result is not None and self.result.strategy.done:
            out = self.result.strategy.configure_evaluate(server_round, parameters, client_manager)
            if out:
                self.rounds = server_round
            return out
        return []

    @_clocked(sends=False)
    def aggregate_evaluate(self, server_round, results, failures):
        if not self._evaluating:
            if self.result is None:
                return None, {}
            return self.result.strategy.aggregate_evaluate(server_round, results, failures)
        self._evaluating = False
        self.registry.log_failures(failures, server_round)
        per_job: dict[str, list] = {}
        for proxy, res in results:
            site = str(res.metrics.get("site", ""))
            for it in decode(str(res.metrics.get(FIELD, "[]"))):
                sub = EvaluateRes(Status(Code.OK, ""), it["loss"], int(it["num"]), it["config"])
                per_job.setdefault(it["job"], []).append((proxy, sub))
            for it in decode(str(res.metrics.get("pooled", "[]"))):
                self.pooled.setdefault(it["group"], {})[site] = it["config"]
        for job in self._evaluated:
            job.strategy.aggregate_evaluate(server_round, per_job.get(job.key, []), [])
        self._next(None)
        self._advance_stages()
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


def tuning_batch(plan, n_sites: int, registry: Registry, opts, timeout=None, progress=None):
    """The :class:`BatchStrategy` of a federated tuning.

    Parameters
    ----------
    plan : callable
        The tuning's plan (:class:`BatchStrategy`).
    n_sites : int
        The sites of the federation.
    registry : Registry
        The federation's registry.
    opts : CVOptions
        The tuning's options (:class:`strategies.stats.tuning.CVOptions`): its worker
        processes (``jobs``) and the most fits at once (``max_fits``).
    timeout : float, optional
        Seconds registration waits for the sites.
    progress : callable, optional
        ``progress(line)``: a line per round.

    Returns
    -------
    BatchStrategy
    """
    return BatchStrategy(
        plan, n_sites, registry, timeout=timeout, progress=progress, workers=opts.jobs,
        max_fits=opts.max_fits,
    )  # fmt: skip

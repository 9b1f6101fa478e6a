"""Who is who: the server's table of sites, keyed by site id (never by node id).

A site registers by answering Flower's properties exchange (``get_properties``) with

- ``site`` (its id), ``n`` (training rows), ``index`` (its position in the federation's
  list, ``-1`` if none) and ``features`` (comma-separated names, optional);
- ``sum_x`` and ``sum_x2``: per-feature sums of its training rows and of their squares,
  packed as bytes (:func:`strategies.wire.pack`), for federated standardization;
- whatever else its method needs, kept as the site's ``meta`` mapping (GrAUC-PFL: ``lat``,
  ``lon``, ``n_pos``, ``n_neg``; RowFed: ``p``, ``q`` and the packed ``sum_y``).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from logging import INFO, WARNING

import numpy as np
from flwr.common import Code, GetPropertiesIns, Parameters, log
from flwr.server.client_proxy import ClientProxy

from ..config import RegistrationConfig
from ..errors import InputError, site_input_error
from ..wire import pack, unpack

EMPTY = Parameters(tensors=[], tensor_type="numpy.ndarray")

#: Properties every site reports; the rest of its answer is its method's ``meta``.
COMMON_KEYS = ("site", "n", "index", "features", "sum_x", "sum_x2")


def ask_properties(clients, config: dict, timeout: float | None, group_id: int) -> list:
    """Every client's answer to one properties request (concurrently); a site's refusal of
    its own data or node config ends the run (:func:`strategies.errors.site_input_error`).

    Parameters
    ----------
    clients : list of ClientProxy
        The nodes asked.
    config : dict
        The request's config (:attr:`Registry.properties_config`).
    timeout : float or None
        Seconds each node has to answer (``None``: no limit).
    group_id : int
        Flower's group id of the request (the server round).

    Returns
    -------
    list of tuple
        ``(proxy, properties)`` per client, in the order given; ``properties`` is ``None``
        for a node that did not answer (logged).
    """
    if not clients:
        return []
    ins = GetPropertiesIns(config=dict(config))

    def ask(proxy):
        try:
            return proxy.get_properties(ins, timeout, group_id)
        except Exception as exc:  # noqa: BLE001 - a node that fails is reported, as in Flower
            return exc

    with ThreadPoolExecutor(max_workers=min(len(clients), 32)) as pool:
        answers = list(pool.map(ask, clients))
    out = []
    for proxy, res in zip(clients, answers, strict=True):
        if isinstance(res, BaseException) or res.status.code != Code.OK:
            why = res if isinstance(res, BaseException) else res.status.message
            bad_input = site_input_error(why)
            if bad_input is not None:  # the site's data or node config: end the run
                raise bad_input
            log(WARNING, "registration: node %s did not answer: %s", proxy.cid, why)
            out.append((proxy, None))
        else:
            out.append((proxy, dict(res.properties)))
    return out


@dataclass
class SiteInfo:
    """What one site reported at registration."""

    site: str
    n: int
    index: int
    sum_x: np.ndarray
    sum_x2: np.ndarray
    features: tuple[str, ...] = ()
    meta: dict = field(default_factory=dict)


def pooled_scaling(n: int, sum_x: np.ndarray, sum_x2: np.ndarray):
    """Pooled mean and SD of each feature from the rows' sums (an SD of 0 becomes 1).

    ``mean = sum_x / n``, ``sd = sqrt(max(sum_x2 - n mean^2, 0) / (n - 1))``; a feature whose
    SD is below ``1e-12 max(1, |mean|)`` (constant) keeps scale 1.

    Parameters
    ----------
    n : int
        The number of rows.
    sum_x, sum_x2 : ndarray, shape (p,)
        Each feature's sum over the rows and the sum of its squares.

    Returns
    -------
    mean, sd : ndarray, shape (p,)
    """
    mean = sum_x / n
    var = np.maximum(sum_x2 - n * mean**2, 0.0) / max(n - 1, 1)
    sd = np.sqrt(var)
    return mean, np.where(sd > 1e-12 * np.maximum(1.0, np.abs(mean)), sd, 1.0)


# What each method's sites add to the properties exchange (their ``meta``).
def grauc_meta(lat: float, lon: float, n_pos: int, n_neg: int) -> dict:
    """A GrAUC-PFL site's registration ``meta``: its location and class counts.

    Parameters
    ----------
    lat, lon : float
        The site's location.
    n_pos, n_neg : int
        Its positive and negative training rows.

    Returns
    -------
    dict
        ``lat``, ``lon``, ``n_pos`` and ``n_neg``.
    """
    return {"lat": float(lat), "lon": float(lon), "n_pos": int(n_pos), "n_neg": int(n_neg)}


def rowfed_meta(p: int, q: int, y: np.ndarray) -> dict:
    """A RowFed client's registration ``meta``: its dimensions and ``sum y`` (packed).

    Parameters
    ----------
    p, q : int
        The numbers of features and responses.
    y : ndarray, shape (n, q)
        The client's training responses.

    Returns
    -------
    dict
        ``p``, ``q`` and ``sum_y`` (the column sums of ``y``, :func:`strategies.wire.pack`).
    """
    return {"p": int(p), "q": int(q), "sum_y": pack(np.asarray(y, dtype=float).sum(axis=0))}


def registration_properties(
    site: str, n: int, index: int, x: np.ndarray, features=(), **meta
) -> dict:
    """A site's answer to the properties exchange (the client side of :class:`Registry`).

    Parameters
    ----------
    site : str
        The site's id.
    n : int
        Its training rows.
    index : int
        Its position in the federation's list (``-1``: none).
    x : ndarray, shape (n, p)
        Its training features; their per-feature sums and sums of squares are sent packed.
    features : sequence of str, optional
        The feature names (sent comma-separated when given).
    **meta
        The method's properties (:func:`grauc_meta`, :func:`rowfed_meta`); the values must
        be Flower scalars (arrays packed as bytes by the caller).

    Returns
    -------
    dict
        The properties (module docstring).
    """
    x = np.asarray(x, dtype=float)
    props = {
        "site": str(site),
        "n": int(n),
        "index": int(index),
        "sum_x": pack(x.sum(axis=0)),
        "sum_x2": pack((x * x).sum(axis=0)),
        **meta,
    }
    if features:
        props["features"] = ",".join(features)
    return props


@dataclass
class Registry:
    """Sites that registered (site id -> info) and the node currently serving each site.

    A SuperNode that restarts gets a new node id: it registers again and is mapped to the
    same site, so all per-site state survives.  ``center``/``scale`` are set by
    :meth:`standardize` (``center`` is ``None`` when only scaling is used).
    """

    sites: dict[str, SiteInfo] = field(default_factory=dict)
    cid_to_site: dict[str, str] = field(default_factory=dict)
    center: np.ndarray | None = None
    scale: np.ndarray | None = None
    #: ``standardize`` centres as well as scales (GrAUC-PFL); RowFed scales only: with an
    #: intercept each client centres its own data, without one a centring would add one.
    centre: bool = True
    #: How the first registration waits for the sites (:meth:`settle`).
    waiting: RegistrationConfig = field(default_factory=RegistrationConfig)
    #: The federation is fixed: the first registration is over.
    settled: bool = False
    #: Sites expected but not there when the run went on with a quorum (their ids, or
    #: ``"(unnamed K)"`` when ``registration.sites`` does not name them).
    absent: list[str] = field(default_factory=list)
    #: Nodes whose site is not among ``registration.sites`` (never asked again).
    refused: set[str] = field(default_factory=set)
    #: The config of the properties exchange (a view of the rows: :mod:`strategies.server.batch`).
    properties_config: dict = field(default_factory=dict)

    def register(self, cid: str, props: dict) -> str | None:
        """Record a site's registration properties; a node that served the site before is
        forgotten.

        Parameters
        ----------
        cid : str
            The node id that answered.
        props : dict
            Its properties (:func:`registration_properties`).

        Returns
        -------
        str or None
            The site id; ``None`` for a site that ``registration.sites`` does not expect
            (the node is refused).
        """
        info = self.make_info(props)
        site = info.site
        expected = self.waiting.expected()
        if expected and site not in expected:
            log(
                WARNING,
                "registration: site %s (node %s) is not among registration.sites; ignored",
                site,
                cid,
            )
            self.refused.add(cid)
            return None
        for old_cid, old_site in list(self.cid_to_site.items()):
            if old_site == site and old_cid != cid:
                log(INFO, "site %s re-registered from a new node", site)
                del self.cid_to_site[old_cid]
        self.sites[site] = info
        self.cid_to_site[cid] = site
        return site

    def weight_config(self, power: float, sites=None) -> dict:
        """What a site needs to weight its loss by ``w_z = Z n_z^a / sum_k n_k^a``
        (:func:`strategies.solvers.local.site_weight`).

        Parameters
        ----------
        power : float
            The size power ``a``.
        sites : sequence of str, optional
            The federation's sites, over which the weights average 1; ``None``: every
            registered site.

        Returns
        -------
        dict
            Nothing when ``a = 0``, else ``size-power`` (``a``) and ``size-norm``
            (``Z / sum_k n_k^a``).
        """
        if power == 0:
            return {}
        sites = self.order() if sites is None else sites
        sizes = np.array([self.sites[s].n for s in sites], dtype=float)
        return {"size-power": float(power), "size-norm": len(sizes) / float(np.sum(sizes**power))}

    def proxies(self, client_manager, sites) -> list[tuple[ClientProxy, str]]:
        """The connected nodes serving some sites, with their site.

        Parameters
        ----------
        client_manager : ClientManager
            Flower's client manager (the connected nodes).
        sites : container of str
            The site ids.

        Returns
        -------
        list of tuple
            ``(proxy, site)`` in the order of the nodes' ids (unregistered and other sites'
            nodes left out).
        """
        nodes = client_manager.all()
        out = []
        for cid in sorted(nodes):
            site = self.cid_to_site.get(cid)
            if site is not None and site in sites:
                out.append((nodes[cid], site))
        return out

    def make_info(self, props: dict) -> SiteInfo:
        """The site's record; its feature names must agree with every other site's."""
        site = str(props["site"])
        features = str(props.get("features", ""))
        info = SiteInfo(
            site=site,
            n=int(props["n"]),
            index=int(props.get("index", -1)),
            sum_x=unpack(props.get("sum_x")),
            sum_x2=unpack(props.get("sum_x2")),
            features=tuple(features.split(",")) if features else (),
            meta={k: v for k, v in props.items() if k not in COMMON_KEYS},
        )
        for other in self.sites.values():
            if other.site != site and info.features and other.features:
                if other.features != info.features:
                    raise InputError(
                        f"features: site {site} reports features {list(info.features)[:4]}, "
                        f"site {other.site} {list(other.features)[:4]}; they must agree"
                    )
        return info

    def register_clients(self, clients, timeout: float | None, group_id: int) -> list[str]:
        """Ask every client not yet known (nor refused) for its properties (concurrently)
        and register the answers.

        Parameters
        ----------
        clients : list of ClientProxy
            The connected nodes.
        timeout : float or None
            Seconds each node has to answer (:func:`ask_properties`).
        group_id : int
            Flower's group id of the request (the server round).

        Returns
        -------
        list of str
            The node ids that did not answer.
        """
        todo = [c for c in clients if c.cid not in self.cid_to_site and c.cid not in self.refused]
        answers = ask_properties(todo, self.properties_config, timeout, group_id)
        for proxy, props in answers:
            if props is not None:
                self.register(proxy.cid, props)
        return [proxy.cid for proxy, props in answers if props is None]

    def settle(
        self, client_manager, n_sites: int, ask_timeout: float | None, group_id: int
    ) -> list:
        """The connected clients, every one registered.  The first call waits for the
        sites (:attr:`waiting`): it registers nodes as they connect, logs the sites still
        missing every ``registration.log-every`` seconds and at ``registration.timeout``
        either goes on with the sites there (at least ``registration.quorum`` of them; the
        rest are :attr:`absent`) or raises :class:`~strategies.errors.InputError` naming the
        missing sites.  Later calls only register nodes that (re)connected.

        Parameters
        ----------
        client_manager : ClientManager
            Flower's client manager.
        n_sites : int
            The sites the first call waits for.
        ask_timeout : float or None
            Seconds each node has to answer a properties request.
        group_id : int
            Flower's group id of the requests (the server round).

        Returns
        -------
        list of ClientProxy
            The connected clients, by node id.
        """
        if not self.settled:
            self._wait(client_manager, int(n_sites), ask_timeout, group_id)
            self.settled = True
        nodes = client_manager.all()
        clients = [nodes[cid] for cid in sorted(nodes)]
        self.register_clients(clients, ask_timeout, group_id)
        return clients

    def _wait(self, client_manager, n_sites: int, ask_timeout, group_id: int) -> None:
        w = self.waiting
        expected = w.expected()
        if expected and len(expected) != n_sites:
            raise InputError(
                f"registration.sites: names {len(expected)} sites, the run has {n_sites}"
            )
        t0 = time.monotonic()
        next_log = t0 + w.log_every
        while True:
            nodes = client_manager.all()
            self.register_clients([nodes[c] for c in sorted(nodes)], ask_timeout, group_id)
            if len(self.sites) >= n_sites:
                return
            now = time.monotonic()
            if now - t0 >= w.timeout:
                self._give_up(n_sites)
                return
            if now >= next_log:
                log(INFO, "registration: %s", self.waiting_line(n_sites, now - t0))
                next_log += w.log_every
            # wakes early when a node connects; Flower's node list is refreshed on all()
            pause = min(1.0, next_log - now, t0 + w.timeout - now)
            client_manager.wait_for(len(nodes) + 1, timeout=max(pause, 0.01))

    def missing_sites(self, n_sites: int) -> list[str]:
        """The sites not registered: their ids when ``registration.sites`` names them, else
        ``["(unnamed K)"]``."""
        expected = self.waiting.expected()
        if expected:
            return [s for s in expected if s not in self.sites]
        k = n_sites - len(self.sites)
        return [f"(unnamed {k}: name the sites in registration.sites)"] if k > 0 else []

    def waiting_line(self, n_sites: int, elapsed: float) -> str:
        """``2 of 3 sites after 30 s (H01, H02); waiting for H03``.

        Parameters
        ----------
        n_sites : int
            The sites waited for.
        elapsed : float
            Seconds waited so far.

        Returns
        -------
        str
        """
        have = ", ".join(self.order()) or "none"
        return (
            f"{len(self.sites)} of {n_sites} sites after {elapsed:.0f} s ({have}); "
            f"waiting for {', '.join(self.missing_sites(n_sites))}"
        )

    def _give_up(self, n_sites: int) -> None:
        w = self.waiting
        missing = ", ".join(self.missing_sites(n_sites))
        have = len(self.sites)
        if w.quorum < 1 and have >= max(1, math.ceil(w.quorum * n_sites)):
            log(
                WARNING,
                "registration: %d of %d sites after %g s; going on without %s "
                "(registration.quorum = %g)",
                have,
                n_sites,
                w.timeout,
                missing,
                w.quorum,
            )
            self.absent = self.missing_sites(n_sites)
            return
        raise InputError(
            f"registration.timeout: {have} of {n_sites} sites registered within "
            f"{w.timeout:g} s; missing: {missing}"
        )

    def features(self) -> tuple[str, ...]:
        """The feature names the sites reported (they all agree)."""
        for s in self.order():
            if self.sites[s].features:
                return self.sites[s].features
        return ()

    def order(self) -> list[str]:
        """Sites in federation order: by reported index, then by id."""
        return sorted(self.sites, key=lambda s: (self.sites[s].index, s))

    def standardize(self) -> None:
        """Pooled scaling of each feature from the per-site sums (:func:`pooled_scaling`)."""
        infos = [self.sites[s] for s in self.order()]  # fixed order: reproducible sums
        n = sum(i.n for i in infos)
        mean, scale = pooled_scaling(
            n, np.sum([i.sum_x for i in infos], axis=0), np.sum([i.sum_x2 for i in infos], axis=0)
        )
        self.center = mean if self.centre else None
        self.scale = scale

    def scaling_config(self) -> dict:
        """The scaling a site applies, as config bytes (empty when none)."""
        out = {}
        if self.center is not None:
            out["center"] = pack(self.center)
        if self.scale is not None:
            out["scale"] = pack(self.scale)
        return out

    def log_failures(self, failures, server_round: int) -> list[str]:
        """Log each failure with its site id when known.  A site's input error (its data or
        node config) ends the run: raises :class:`~strategies.errors.SiteInputError` naming
        the site and the field.

        Parameters
        ----------
        failures : list
            Flower's failures of a round: ``(proxy, res)`` pairs or exceptions.
        server_round : int
            The round, for the log.

        Returns
        -------
        list of str
            The sites that failed (``node <cid>`` for an unregistered node); an exception
            names no site.
        """
        failed = []
        for failure in failures:
            bad_input = site_input_error(failure)
            if bad_input is not None:  # the site's data or node config: end the run
                raise bad_input
            if isinstance(failure, BaseException):
                log(WARNING, "round %s: a client failed: %r", server_round, failure)
                continue
            proxy, res = failure
            site = self.cid_to_site.get(proxy.cid, f"node {proxy.cid}")
            failed.append(site)
            log(WARNING, "round %s: site %s failed: %s", server_round, site, res.status.message)
        return failed

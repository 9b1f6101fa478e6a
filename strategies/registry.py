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

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from logging import INFO, WARNING

import numpy as np
from flwr.common import Code, GetPropertiesIns, Parameters, log

from .errors import site_input_error
from .wire import pack, unpack

EMPTY = Parameters(tensors=[], tensor_type="numpy.ndarray")

#: Properties every site reports; the rest of its answer is its method's ``meta``.
COMMON_KEYS = ("site", "n", "index", "features", "sum_x", "sum_x2")


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
    """Pooled mean and SD of each feature from ``n`` rows' sums (an SD of 0 becomes 1).

    ``mean = sum_x / n``, ``sd = sqrt(max(sum_x2 - n mean^2, 0) / (n - 1))``; a feature whose
    SD is below ``1e-12 max(1, |mean|)`` (constant) keeps scale 1.
    """
    mean = sum_x / n
    var = np.maximum(sum_x2 - n * mean**2, 0.0) / max(n - 1, 1)
    sd = np.sqrt(var)
    return mean, np.where(sd > 1e-12 * np.maximum(1.0, np.abs(mean)), sd, 1.0)


# What each method's sites add to the properties exchange (their ``meta``).
def grauc_meta(lat: float, lon: float, n_pos: int, n_neg: int) -> dict:
    """A GrAUC-PFL site's registration ``meta``: its location and class counts."""
    return {"lat": float(lat), "lon": float(lon), "n_pos": int(n_pos), "n_neg": int(n_neg)}


def rowfed_meta(p: int, q: int, y: np.ndarray) -> dict:
    """A RowFed client's registration ``meta``: its dimensions and ``sum y`` (packed)."""
    return {"p": int(p), "q": int(q), "sum_y": pack(np.asarray(y, dtype=float).sum(axis=0))}


def registration_properties(
    site: str, n: int, index: int, x: np.ndarray, features=(), **meta
) -> dict:
    """A site's answer to the properties exchange (the client side of :class:`Registry`).

    ``meta`` values must be Flower scalars (arrays packed as bytes by the caller).
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

    def register(self, cid: str, props: dict) -> str:
        """Record a site's registration properties from node ``cid``; returns the site id."""
        info = self.make_info(props)
        site = info.site
        for old_cid, old_site in list(self.cid_to_site.items()):
            if old_site == site and old_cid != cid:
                log(INFO, "site %s re-registered from a new node", site)
                del self.cid_to_site[old_cid]
        self.sites[site] = info
        self.cid_to_site[cid] = site
        return site

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
                    raise ValueError(
                        f"features: site {site} reports features {list(info.features)[:4]}, "
                        f"site {other.site} {list(other.features)[:4]}; they must agree"
                    )
        return info

    def register_clients(self, clients, timeout: float | None, group_id: int) -> list[str]:
        """Ask every client not yet known for its properties (concurrently) and register
        the answers; returns the node ids that did not answer."""
        todo = [c for c in clients if c.cid not in self.cid_to_site]
        if not todo:
            return []
        ins = GetPropertiesIns(config={})

        def ask(proxy):
            try:
                return proxy.get_properties(ins, timeout, group_id)
            except Exception as exc:  # noqa: BLE001 - a node that fails is reported, as in Flower
                return exc

        with ThreadPoolExecutor(max_workers=min(len(todo), 32)) as pool:
            answers = list(pool.map(ask, todo))
        failed = []
        for proxy, res in zip(todo, answers, strict=True):
            if isinstance(res, BaseException) or res.status.code != Code.OK:
                why = res if isinstance(res, BaseException) else res.status.message
                bad_input = site_input_error(why)
                if bad_input is not None:  # the site's data or node config: end the run
                    raise bad_input
                log(WARNING, "registration: node %s did not answer: %s", proxy.cid, why)
                failed.append(proxy.cid)
                continue
            self.register(proxy.cid, dict(res.properties))
        return failed

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
        """Log each failure with its site id when known; return the sites that failed.  A
        site's input error (its data or node config) ends the run: raises
        :class:`~strategies.errors.SiteInputError` naming the site and the field."""
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

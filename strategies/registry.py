"""Who is who: the server's table of institutions, keyed by site id (never by node id)."""

from __future__ import annotations

from dataclasses import dataclass, field
from logging import INFO, WARNING

import numpy as np
from flwr.common import FitIns, Parameters, log

from .wire import pack

EMPTY = Parameters(tensors=[], tensor_type="numpy.ndarray")


@dataclass
class SiteInfo:
    site: str
    lat: float
    lon: float
    n_pos: int
    n_neg: int
    n: int
    index: int
    sum_x: np.ndarray
    sum_x2: np.ndarray
    features: tuple[str, ...] = ()


@dataclass
class Registry:
    """Sites that registered (site id -> info) and the node currently serving each site.

    A SuperNode that restarts gets a new node id: it registers again and is mapped to the
    same site, so all per-site state survives.
    """

    sites: dict[str, SiteInfo] = field(default_factory=dict)
    cid_to_site: dict[str, str] = field(default_factory=dict)
    center: np.ndarray | None = None
    scale: np.ndarray | None = None

    def register(self, cid: str, metrics: dict, arrays: list[np.ndarray]) -> str:
        """Record a ``register`` answer from node ``cid``; returns the site id."""
        info = self.make_info(metrics, arrays)
        site = info.site
        for old_cid, old_site in list(self.cid_to_site.items()):
            if old_site == site and old_cid != cid:
                log(INFO, "site %s re-registered from a new node", site)
                del self.cid_to_site[old_cid]
        self.sites[site] = info
        self.cid_to_site[cid] = site
        return site

    def make_info(self, metrics: dict, arrays: list[np.ndarray]) -> SiteInfo:
        """The site's record from its registration metrics (a method may override)."""
        site = str(metrics["site"])
        info = SiteInfo(
            site=site,
            lat=float(metrics["lat"]),
            lon=float(metrics["lon"]),
            n_pos=int(metrics["n_pos"]),
            n_neg=int(metrics["n_neg"]),
            n=int(metrics["n_pos"]) + int(metrics["n_neg"]),
            index=int(metrics.get("index", -1)),
            sum_x=np.asarray(arrays[0], dtype=float) if arrays else np.zeros(0),
            sum_x2=np.asarray(arrays[1], dtype=float) if len(arrays) > 1 else np.zeros(0),
            features=tuple(str(metrics["features"]).split(",")) if metrics.get("features") else (),
        )
        for other in self.sites.values():
            if (
                other.site != site
                and info.features
                and other.features
                and (other.features != info.features)
            ):
                raise ValueError(
                    f"features: site {site} reports features {list(info.features)[:4]}, "
                    f"site {other.site} {list(other.features)[:4]}; they must agree"
                )
        return info

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
        """Pooled mean and SD of each feature from the per-site sums (SD 0 -> 1)."""
        infos = [self.sites[s] for s in self.order()]  # fixed order: reproducible sums
        n = sum(i.n for i in infos)
        s1 = np.sum([i.sum_x for i in infos], axis=0)
        s2 = np.sum([i.sum_x2 for i in infos], axis=0)
        mean = s1 / n
        var = np.maximum(s2 - n * mean**2, 0.0) / max(n - 1, 1)
        sd = np.sqrt(var)
        self.center = mean
        self.scale = np.where(sd > 1e-12 * np.maximum(1.0, np.abs(mean)), sd, 1.0)

    def scaling_config(self) -> dict:
        if self.center is None:
            return {}
        return {"center": pack(self.center), "scale": pack(self.scale)}

    def registration_instructions(self, clients) -> list:
        """``FitIns`` asking each unknown client to register."""
        return [
            (proxy, FitIns(EMPTY, {"task": "register"}))
            for proxy in clients
            if proxy.cid not in self.cid_to_site
        ]

    def handle_registrations(self, results) -> list:
        """Register the ``register`` answers; return the other results."""
        from flwr.common import parameters_to_ndarrays

        rest = []
        for proxy, res in results:
            if res.metrics.get("task") == "register":
                self.register(proxy.cid, res.metrics, parameters_to_ndarrays(res.parameters))
            else:
                rest.append((proxy, res))
        return rest

    def log_failures(self, failures, server_round: int) -> list[str]:
        """Log each failure with its site id when known; return the sites that failed."""
        failed = []
        for failure in failures:
            if isinstance(failure, BaseException):
                log(WARNING, "round %s: a client failed: %r", server_round, failure)
                continue
            proxy, res = failure
            site = self.cid_to_site.get(proxy.cid, f"node {proxy.cid}")
            failed.append(site)
            log(WARNING, "round %s: site %s failed: %s", server_round, site, res.status.message)
        return failed

"""Disclosure guards a site sets for itself (docs/deployment.md, docs/methods.md 3.3).

A site refuses to take part when its rows are too few for what it would send to be an
aggregate, and refuses to send second moments (a Hessian, ``X'X``, a gradient covariance:
``--curvature exact``, ``--inference oracle``) when its rows are too few for their number.
The floors are the site's own: a SuperNode's node config (``min-rows``, ``min-class-rows``,
``min-rows-per-feature``), checked by the site itself, whatever the server asks.  The site
also reports them at registration, so that the server can refuse a run that needs second
moments before its first round, naming the site and the guard.

The defaults follow DataSHIELD's disclosure filters: 3 rows in all (``nfilter.subset``) and
3 rows of each class a site has (``nfilter.tab``, a table cell; with a lone row of a class
the registration's sums and one gradient of the pairwise surrogate give that row exactly);
and at most a third as many parameters as rows (``nfilter.glm = 0.33``): 3 rows per
feature for a ``p x p`` second moment.  A class a site
lacks altogether (``missing-class = borrow``) is no cell: it sends nothing of that class.

The floors of rows are checked on a site's training rows when it registers; the folds of a
federated tuning are subsets of them and are not checked again: a fold's answers differ
from the whole data's by that fold's held-out rows, as in any cross-validation across
sites, so a site that wants every fold to meet its floor needs about ``K / (K - 1)`` times
the floor (and ``K`` rows of a class to form its folds at all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..errors import InputError, at_site, plain


def _rows(n: int) -> str:
    return f"{n} row" + ("" if n == 1 else "s")


#: The node-config keys and the registration property the floor of second moments is sent as.
NODE_KEYS = ("min-rows", "min-class-rows", "min-rows-per-feature")
MOMENT_FLOOR = "moment-floor"


@dataclass(frozen=True)
class Guards:
    """A site's floors: ``min_rows`` rows in all, ``min_class_rows`` rows of each class it
    has (GrAUC-PFL), ``min_rows_per_feature`` rows per feature for second moments."""

    min_rows: int = 3
    min_class_rows: int = 3
    min_rows_per_feature: float = 3.0
    #: where the floors were set, as a refusal names it: ``node config`` (a SuperNode's),
    #: ``run config`` (``guards.*``: simulated sites) or ``fit`` (its options)
    origin: str = field(default="node config", compare=False, repr=False)

    @classmethod
    def from_node_config(cls, node) -> Guards:
        """The guards of a SuperNode's node config (a key left out keeps its default); a
        bad value is an :class:`~strategies.errors.InputError` naming the key."""
        values = {}
        for key in NODE_KEYS:
            if key not in node:
                continue
            raw = node[key]
            try:
                value = float(raw)
            except (TypeError, ValueError):
                value = math.nan
            integer = key != "min-rows-per-feature"
            if not math.isfinite(value) or value < 0 or (integer and not value.is_integer()):
                kind = "a whole number" if integer else "a number"
                raise InputError(f"node-config: {key} must be {kind} >= 0, got {plain(raw)}")
            values[key.replace("-", "_")] = int(value) if integer else value
        return cls(**values)

    @classmethod
    def from_config(cls, config) -> Guards:
        """The guards of a :class:`strategies.config.GuardsConfig` (simulated sites)."""
        return cls(
            config.min_rows, config.min_class_rows, float(config.min_rows_per_feature),
            origin="run config",
        )  # fmt: skip

    @classmethod
    def off(cls) -> Guards:
        """No floor: every row is on the user's own machine (``fit`` in process), so
        nothing is disclosed (``fit``'s options set floors there only when asked)."""
        return cls(min_rows=0, min_class_rows=0, min_rows_per_feature=0.0)

    def misses(
        self, n: int, classes: dict[str, int] | None = None, p: int = 0, moments: str = ""
    ) -> list[tuple[str, int, int, str]]:
        """The floors that ``n`` rows (``classes``: rows of each class the site has) miss,
        as ``(key, rows, floor, what)``: ``what`` is empty for taking part, ``class <name>``
        for a class's rows, and ``moments`` (what a run asks second moments for, if any) for
        sending second moments of ``p`` features.  The one place the floors are compared.

        Parameters
        ----------
        n : int
            The site's rows.
        classes : dict of str to int, optional
            Rows of each class the site has; a class with no rows misses no floor.
        p : int, optional
            The features of a second moment.
        moments : str, optional
            What second moments are asked for; empty: none, and their floor is not checked.

        Returns
        -------
        list of tuple of (str, int, int, str)
            One ``(key, rows, floor, what)`` per floor missed, ``key`` its node-config key.
        """
        out = []
        if n < self.min_rows:
            out.append(("min-rows", n, self.min_rows, ""))
        for name, count in (classes or {}).items():
            if 0 < count < self.min_class_rows:
                out.append(("min-class-rows", count, self.min_class_rows, f"class {name}"))
        if moments and n < self.moment_floor(p):
            out.append(("min-rows-per-feature", n, self.moment_floor(p), moments))
        return out

    def refusals(
        self, n: int, classes: dict[str, int] | None = None, p: int = 0, moments: str = ""
    ) -> list[str]:
        """What a site of ``n`` rows would refuse at these floors (:meth:`misses`), one
        phrase each.

        Parameters
        ----------
        n : int
            The site's rows.
        classes : dict of str to int, optional
            Rows of each class the site has.
        p : int, optional
            The features of a second moment.
        moments : str, optional
            What second moments are asked for; empty: their floor is not checked.

        Returns
        -------
        list of str
            One phrase per floor missed (``"<key>: <rows>, floor <floor>"``).
        """
        out = []
        for key, rows, floor, what in self.misses(n, classes, p, moments):
            of = f" of {what}" if what.startswith("class ") else ""
            lead = f"{what} from " if key == "min-rows-per-feature" else ""
            out.append(f"{key}: {lead}{_rows(rows)}{of}, floor {floor}")
        return out

    @classmethod
    def for_benchmark(cls) -> Guards:
        """The guards of a benchmark's sites (the problem family: what is measured is
        rounds; its exact-curvature variant needs second moments of every member, and its
        crime members have states of two communities): no floor."""
        return cls(min_rows=0, min_class_rows=0, min_rows_per_feature=0.0)

    def for_view(self) -> Guards:
        """The guards of a view of the site's rows (a federated tuning's fold): the floors
        of rows were checked on the whole training data when the site registered; a
        second moment is still refused below its floor of the view's rows."""
        return replace(self, min_rows=0, min_class_rows=0)

    def set_by(self, key: str) -> str:
        """Where the floor ``key`` was set, as a refusal names it."""
        if self.origin == "fit":
            return f"fit's --{key}"
        if self.origin == "run config":
            return f"run config guards.{key}"
        return "node config"

    def floors(self) -> dict:
        """The three floors by field name (what ``metrics.json`` records)."""
        return {k.replace("-", "_"): getattr(self, k.replace("-", "_")) for k in NODE_KEYS}

    def moment_floor(self, p: int) -> int:
        """The rows a site needs to send a second moment of ``p`` features."""
        return math.ceil(self.min_rows_per_feature * p)

    def check_rows(self, site: str, n: int, classes: dict[str, int] | None = None) -> None:
        """Refuse to take part (raise, marked with ``site``) when the rows, or the rows of
        a class the site has, are below their floor (:meth:`misses`).

        Parameters
        ----------
        site : str
            The site's name, as the error is marked with.
        n : int
            The site's rows.
        classes : dict of str to int, optional
            Rows of each class the site has.
        """
        for key, rows, floor, what in self.misses(n, classes):
            of = f" of {what}" if what else ""
            raise at_site(site, InputError(
                f"{key}: refuses to take part with {_rows(rows)}{of}, below its floor of "
                f"{floor} ({self.set_by(key)})"
            ))  # fmt: skip

    def check_moments(self, site: str, n: int, p: int, what: str) -> None:
        """Refuse to send a second moment (``what``) of ``p`` features from ``n`` rows
        below :meth:`moment_floor`.

        Parameters
        ----------
        site : str
            The site's name, as the error is marked with.
        n : int
            The rows the second moment is computed from.
        p : int
            The features of the second moment.
        what : str
            What the second moment is, as the refusal names it.
        """
        for key, rows, floor, _ in self.misses(n, p=p, moments=what):
            if key != "min-rows-per-feature":
                continue  # taking part was settled at registration
            raise at_site(site, InputError(
                f"{key}: refuses to send {what} with {_rows(rows)}, below its floor of "
                f"{floor} ({plain(self.min_rows_per_feature)} per feature, {p} features; "
                f"{self.set_by(key)})"
            ))  # fmt: skip


def refuse_moments(registry, sites, needs: str) -> None:
    """Before the first round of a run that needs second moments (``needs``: the setting
    that asks for them): an :class:`~strategies.errors.InputError` naming the sites whose
    guard refuses them (their rows below the floor they reported at registration).

    Parameters
    ----------
    registry : Registry
        The server's registry: each site's rows and the :data:`MOMENT_FLOOR` it reported
        (0 when it reported none).
    sites : iterable of str
        The sites of the run.
    needs : str
        The setting that asks for second moments, as the error names it.
    """
    low = []
    for s in sites:
        info = registry.sites[s]
        floor = int(info.meta.get(MOMENT_FLOOR, 0))
        if info.n < floor:
            low.append(f"{s} ({info.n} rows, floor {floor})")
    if low:
        more = f" and {len(low) - 3} more" if len(low) > 3 else ""
        raise InputError(
            f"{needs}: needs second moments, which site(s) {', '.join(low[:3])}{more} refuse "
            "by their guard min-rows-per-feature (node config); leave it out (curvature "
            "learned, inference none) or ask those sites to lower the floor"
        )


__all__ = ["Guards", "MOMENT_FLOOR", "NODE_KEYS", "refuse_moments"]

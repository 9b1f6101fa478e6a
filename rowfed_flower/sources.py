"""Where a RowFed federation's data come from and its settings: simulated, a CSV file with a
client column, or each site's own file in a deployment; the test set."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from strategies.config import Section, setting
from strategies.datasets.tables import read_table, stripped_ids
from strategies.errors import InputError, bad_cell

from .client import ClientSamples, RowFedClient
from .data import N_CLUSTERS, simulate

#: Run-config prefix of the data keys (``rowfed-data.*``).
DATA_PREFIX = "rowfed-data"


#: Where a RowFed federation's rows can come from (``rowfed-data.source``).
SOURCES = ("simulated", "csv", "deployment")


@dataclass(frozen=True)
class DataSpec(Section):
    """Where a RowFed federation's data come from (run-config keys ``rowfed-data.*``; the
    ``fit`` options named by ``flag``): one declaration for the keys, the options, their
    defaults and their checks (:func:`strategies.config.setting`).

    ``simulated``: docs/methods.md 2.8 with ``M = num-clients``, ``n_m = n-train`` (and
    ``n-test`` test rows per client), ``p = num-features``, ``q = num-responses``.
    ``csv``: the fit command's format (``path``, ``responses`` comma-separated,
    ``client-column``).
    """

    prefix = DATA_PREFIX

    source: str = setting(
        "simulated",
        "simulated (docs/methods.md 2.8), csv (path, responses, client-column) or "
        "deployment (each SuperNode's own file)",
        SOURCES,
    )
    num_clients: int = setting(10, "simulated: clients >= 1", at_least=1)
    n_train: int = setting(100, "simulated: training rows per client >= 1", at_least=1)
    n_test: int = setting(100, "simulated: test rows per client >= 0", at_least=0)
    num_features: int = setting(20, "simulated: predictors >= 1", at_least=1)
    num_responses: int = setting(20, "simulated: responses >= 1", at_least=1)
    seed: int = setting(
        0, "the simulation, the --holdout draw and the folds", flag="data-seed", metavar="SEED"
    )
    path: str = setting("", "csv: the rows")
    responses: str = setting("", "csv: the response columns, comma-separated")
    client_column: str = setting("client", "csv: the column naming each row's client",
                                 flag="client-column", metavar="NAME")  # fmt: skip
    test_path: str = setting("", "csv: a test file with the data's columns")
    holdout: float = setting(
        0.0, "csv: share of each client's rows held out for testing, in [0, 1)",
        at_least=0, below=1,
    )  # fmt: skip


@dataclass(frozen=True)
class FederatedData:
    """All clients' data (in federation order), names, and the truth when simulated."""

    clients: tuple[ClientSamples, ...]
    features: tuple[str, ...]
    responses: tuple[str, ...]
    theta_true: np.ndarray | None = None  # (M, p, q)
    partitions_true: np.ndarray | None = None  # (M, p)

    @property
    def sites(self) -> list[str]:
        return [c.site for c in self.clients]

    def make_clients(self, guards=None) -> list[RowFedClient]:
        """The clients with ``guards`` (the default floors when ``None``; a fold's rows:
        :meth:`strategies.client.guards.Guards.for_view`)."""
        return [RowFedClient(c, k, self.features, guards) for k, c in enumerate(self.clients)]


def simulated_data(spec: DataSpec, n_clusters=N_CLUSTERS) -> FederatedData:
    """docs/methods.md 2.8 simulated federation; client ids ``"0" .. "M-1"`` (the partition
    ids).

    Parameters
    ----------
    spec : DataSpec
        Its ``num_clients``, ``n_train``, ``n_test``, ``num_features``, ``num_responses``
        and ``seed``.
    n_clusters : sequence of int, optional
        The client clusters of each non-zero row.

    Returns
    -------
    FederatedData
        With the truth (``theta_true``, ``partitions_true``).
    """
    d = simulate(
        spec.num_clients,
        spec.n_train,
        spec.n_test,
        spec.num_features,
        spec.num_responses,
        spec.seed,
        n_clusters=n_clusters,
    )
    clients = tuple(
        ClientSamples(str(m), d.x_train[m], d.y_train[m], d.x_test[m], d.y_test[m])
        for m in range(spec.num_clients)
    )
    features = tuple(f"x{j + 1}" for j in range(spec.num_features))
    responses = tuple(f"y{k + 1}" for k in range(spec.num_responses))
    return FederatedData(clients, features, responses, d.theta, d.partitions)


def _numeric_column(df: pd.DataFrame, col: str, key: str = "data") -> np.ndarray:
    raw = df[col].str.strip()
    missing = raw.eq("") | raw.str.upper().isin(["NA", "NAN", "?"])
    if missing.any():
        row = int(np.flatnonzero(missing.to_numpy())[0])
        raise InputError(f"{key}: {bad_cell(col, '', row)}")
    values = pd.to_numeric(raw, errors="coerce")
    bad = values.isna() | ~np.isfinite(values.to_numpy(dtype=float))
    if bad.any():
        k = int(np.flatnonzero(bad.to_numpy())[0])
        value = df[col].iloc[k]
        raise InputError(f"{key}: {bad_cell(col, value, k)}")
    return values.to_numpy(dtype=float)


def read_fit_csv(
    path: str, responses, client_column: str = "client", key: str = "data", min_rows: int = 2
) -> FederatedData:
    """The fit command's data: a client column, the response columns, predictors (every
    other column).  Clients in order of first appearance.

    Raises :class:`InputError` with a one-line message naming the column on bad input.

    Parameters
    ----------
    path : str
        The CSV file (or the name of a data frame held in memory:
        :func:`strategies.datasets.tables.remember`).
    responses : str or sequence of str
        The response columns, a list or comma-separated names.
    client_column : str, optional
        The column naming each row's client.
    key : str, optional
        The setting that named the file, which starts the messages of errors in it.
    min_rows : int, optional
        The rows each client needs.

    Returns
    -------
    FederatedData
        Without test rows.
    """
    if isinstance(responses, str):
        responses = [r.strip() for r in responses.split(",")]
    responses = [r for r in responses if r]
    if not responses:
        raise InputError("responses: give one or more response columns")
    if len(set(responses)) != len(responses):
        raise InputError(f"responses: a column is named twice: {','.join(responses)}")
    df = read_table(path, key, dtype=str, keep_default_na=False, skipinitialspace=True)
    df.columns = [str(c).strip() for c in df.columns]
    if client_column not in df.columns:
        raise InputError(f"{key}: no {client_column!r} column in {path!r}")
    for r in responses:
        if r not in df.columns:
            raise InputError(f"responses: {r!r} is not a column of {path!r}")
        if r == client_column:
            raise InputError(f"responses: {r!r} is the client column")
    predictors = [c for c in df.columns if c != client_column and c not in responses]
    if not predictors:
        raise InputError(f"{key}: {path!r} has no predictor columns")
    if len(df) == 0:
        raise InputError(f"{key}: {path!r} has no rows")
    client = stripped_ids(df[client_column], f"{key}: column {client_column!r}")
    if client.eq("").any():
        row = int(np.flatnonzero(client.eq("").to_numpy())[0])
        raise InputError(f"{key}: {bad_cell(client_column, '', row)}")
    y = np.column_stack([_numeric_column(df, c, key) for c in responses])
    x = np.column_stack([_numeric_column(df, c, key) for c in predictors])
    order = list(dict.fromkeys(client))
    counts = client.value_counts()
    for c in order:
        if counts[c] < min_rows:
            raise InputError(
                f"{key}: client {c!r} has {counts[c]} row; each client needs >= {min_rows}"
            )
    ids = client.to_numpy()
    clients = tuple(ClientSamples(c, x[ids == c], y[ids == c]) for c in order)
    return FederatedData(clients, tuple(predictors), tuple(responses))


@functools.lru_cache(maxsize=4)
def load_data(spec: DataSpec) -> FederatedData:
    """The federation's data for ``spec`` (cached per process)."""
    if spec.source == "simulated":
        return simulated_data(spec)
    if not spec.path or not spec.responses:
        raise InputError(f"{DATA_PREFIX}.path: the csv source needs path and responses")
    data = read_fit_csv(spec.path, spec.responses, spec.client_column)
    return with_test_set(data, spec.test_path, spec.holdout, spec.seed, spec.client_column)


def with_test_set(
    data: FederatedData, test_path: str, holdout: float, seed: int, client_column: str
) -> FederatedData:
    """``data`` with each client's test rows, from a test file or a random share of its rows
    (not both).

    Parameters
    ----------
    data : FederatedData
        The training rows.
    test_path : str
        A test file (empty: none): the data's columns, in any order; only known clients.
    holdout : float
        A share of each client's rows held out for testing (0: none), at least one row kept
        for training; drawn from the client's own seeded stream.
    seed : int
        The seed of the holdout's draws.
    client_column : str
        The test file's client column.

    Returns
    -------
    FederatedData
    """
    from strategies.stats.tuning import holdout_mask, site_rng

    if test_path and holdout:
        raise InputError("holdout: give a test file or a holdout share, not both")
    if test_path:
        test = read_fit_csv(test_path, data.responses, client_column, "test-data", 1)
        if sorted(test.features) != sorted(data.features):
            extra = sorted(set(test.features) - set(data.features))
            missing = sorted(set(data.features) - set(test.features))
            what = f"extra column {extra[0]!r}" if extra else f"missing predictor {missing[0]!r}"
            raise InputError(f"test-data: {what} (the columns must match the training data)")
        known = set(data.sites)
        unknown = [c.site for c in test.clients if c.site not in known]
        if unknown:
            raise InputError(f"test-data: client {unknown[0]!r} is not a client of the data")
        order = [test.features.index(f) for f in data.features]
        rows = {c.site: c for c in test.clients}
        clients = tuple(
            ClientSamples(c.site, c.x, c.y, rows[c.site].x[:, order], rows[c.site].y)
            if c.site in rows
            else c
            for c in data.clients
        )
        return dataclasses.replace(data, clients=clients)
    if holdout:
        clients = []
        for c in data.clients:
            mask = holdout_mask(None, c.n, holdout, site_rng(seed, c.site))
            clients.append(ClientSamples(c.site, c.x[~mask], c.y[~mask], c.x[mask], c.y[mask]))
        return dataclasses.replace(data, clients=tuple(clients))
    return data


__all__ = [
    "DATA_PREFIX",
    "FederatedData",
    "DataSpec",
    "load_data",
    "read_fit_csv",
    "simulated_data",
    "with_test_set",
]

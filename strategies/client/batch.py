"""The site's half of a batch, written once for both methods' clients: a view's
registration properties, and every job's fit and evaluation of one batched message, each by
the client of its view (``client.view(spec)``; for pooled criteria ``client.oof_part`` and
``client.pool``)."""

from __future__ import annotations

import json

from ..wire.batch import FIELD, VIEW_FIELD, decode, encode


def answer_properties(client, config) -> dict:
    """A view's registration properties (the client's ``get_properties`` for a config that
    carries :data:`VIEW_FIELD`); for a list of views, every view's, each key prefixed with
    the view's place in the list (``"2:n"``): the registrations of a stage's views in one
    message.

    Parameters
    ----------
    client : SiteClient
        The site's client; ``client.view(spec)`` gives the client of a view.
    config : dict
        The message's config; its :data:`VIEW_FIELD` holds one view (a JSON object) or a
        list of views (a JSON array).

    Returns
    -------
    dict
        The view's properties, or every view's with its keys prefixed by ``"<place>:"``.
    """
    view = json.loads(str(config[VIEW_FIELD]))
    if isinstance(view, dict):
        return client.view(view).get_properties({})
    return {
        f"{k}:{key}": value
        for k, v in enumerate(view)
        for key, value in client.view(v).get_properties({}).items()
    }


def answer_fit(client, parameters, config) -> tuple[list, int, dict]:
    """Every job's instruction of a batched fit message, each by the client of its view;
    the answers' arrays one after the other, their metrics in one JSON field.

    Parameters
    ----------
    client : SiteClient
        The site's client; ``client.view(spec)`` gives the client of a job's view.
    parameters : list of ndarray
        The jobs' arrays one after the other; a job's record says how many are its own
        (``n``).
    config : dict
        The message's config: the jobs' records encoded in :data:`FIELD`, and the ``site``.

    Returns
    -------
    arrays : list of ndarray
        Every job's answer arrays, in the order of the jobs.
    n : int
        The largest row count among the jobs' answers.
    metrics : dict
        The ``site`` and, under :data:`FIELD`, each job's record (``job``, its number of
        arrays ``n``, its row count ``num`` and its metrics ``config``), encoded.
    """
    arrays: list = []
    records = []
    n_total = 0
    at = 0
    for it in decode(str(config[FIELD])):
        n_in = int(it["n"])
        sub = client.view(it["view"])
        out, n, metrics = sub.fit(list(parameters[at : at + n_in]), it["config"])
        at += n_in
        arrays.extend(out)
        n_total = max(n_total, int(n))
        records.append({"job": it["job"], "n": len(out), "num": int(n), "config": metrics})
    return arrays, n_total, {"site": str(config.get("site", "")), FIELD: encode(records)}


def answer_evaluate(client, parameters, config) -> tuple[float, int, dict]:
    """Every job's evaluation of a batched evaluate message, each on its view's held-out
    rows; the scores of the jobs of one ``group`` (one setting, all folds) are pooled by
    the client (``client.pool``), so a criterion can rank all its held-out rows together.

    Parameters
    ----------
    client : SiteClient
        The site's client; ``client.view(spec)`` gives the client of a job's view, and
        ``client.oof_part`` and ``client.pool`` give and pool a job's held-out scores.
    parameters : list of ndarray
        The jobs' arrays one after the other; a job's record says how many are its own
        (``n``).
    config : dict
        The message's config: the jobs' records encoded in :data:`FIELD`, and the ``site``.

    Returns
    -------
    loss : float
        Always 0.0 (each job's loss is in its record).
    n : int
        Always 0.
    metrics : dict
        The ``site``; under :data:`FIELD`, each job's record (``job``, ``loss``, its row
        count ``num`` and its metrics ``config`` with the ``loss``), encoded; under
        ``pooled``, each group's pooled criteria, encoded.
    """
    records = []
    parts: dict[str, list] = {}
    at = 0
    for it in decode(str(config[FIELD])):
        n_in = int(it["n"])
        sub = client.view(it["view"])
        params = list(parameters[at : at + n_in])
        at += n_in
        loss, n, metrics = sub.evaluate(params, it["config"])
        metrics = {**metrics, "loss": float(loss)}  # the validation loss, a criterion
        records.append({"job": it["job"], "loss": float(loss), "num": int(n), "config": metrics})
        if it.get("group"):
            parts.setdefault(it["group"], []).append(sub.oof_part(params, it["config"]))
    pooled = [{"group": g, "config": client.pool(p)} for g, p in parts.items()]
    metrics = {
        "site": str(config.get("site", "")),
        FIELD: encode(records),
        "pooled": encode(pooled),
    }
    return 0.0, 0, metrics

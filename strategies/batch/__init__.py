"""Many fits side by side in one Flower run: the rounds of a federated tuning
(docs/methods.md 3.12).

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
is (:class:`~strategies.base.EvaluatedOnce`).

Sites answer only what a fit already sends, job by job, and the validation scores or counts
of the criterion; a view's rows never leave the site, nor which rows are in which fold.

The client side is :func:`answer_properties`, :func:`answer_fit` and
:func:`answer_evaluate`, written once for both methods' clients: a client supplies
``view(spec)`` (a client of the same class on the view's rows) and, for pooled criteria,
``oof_part(parameters, config)`` and ``pool(parts)``.
"""

from .answers import answer_evaluate, answer_fit, answer_properties
from .messages import (
    DATA_KEYS,
    FIELD,
    TASK,
    VIEW_FIELD,
    data_view,
    decode,
    encode,
    split_properties,
)
from .server import BatchStrategy, Job, Stage, ViewRegistry, pooled_by_site, tuning_batch

__all__ = [
    "DATA_KEYS",
    "FIELD",
    "TASK",
    "VIEW_FIELD",
    "BatchStrategy",
    "Job",
    "Stage",
    "ViewRegistry",
    "answer_evaluate",
    "answer_fit",
    "answer_properties",
    "data_view",
    "decode",
    "encode",
    "pooled_by_site",
    "split_properties",
    "tuning_batch",
]

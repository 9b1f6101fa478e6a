"""The sites' side, shared by both methods' Flower clients.

- ``site``: :class:`SiteClient`, the tasks a site answers, defined once.
- ``batch``: a site's answers to a batched message (a federated tuning's jobs).
- ``guards``: the disclosure floors a site sets; ``folds``: a site's own folds.
"""

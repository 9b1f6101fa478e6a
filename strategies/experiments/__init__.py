"""Everything the ``study`` commands of both methods share: the design grid of a TOML
config, ``--only`` selection, one seed per (cell, replication), resumable part files, a
process pool (or a Ray cluster), progress on stderr, and the tidy ``results.csv`` /
``summary.csv``.

A study is a list of *tasks*, one per (cell, replication).  A method module supplies a
task function ``task(settings, cell, rep, seed) -> dict[str, DataFrame]`` (module level, so
worker processes can import it); the frame ``"results"`` holds the tidy rows, other frames
(coefficients, clusters, tuning tables) are kept beside it for the figures.

Files under ``--out``::

    study.json                  the settings fingerprint (a rerun must match it)
    parts/<cell>/rep-0007.csv   one finished task's rows (written last, atomically: the task
                                is done iff this file exists)
    parts/<cell>/rep-0007.<name>.csv   its other frames
    results.csv                 every finished task's rows (appended as tasks finish, rebuilt
                                from the parts at the start and at the end of every run)
    summary.csv                 mean and SD over replications per cell and method (tidy;
                                a coverage study: coverage per cell and kind)
    summary_table.csv           the same as ``mean (sd)``, one row per cell, one column per
                                method (the papers' layout)
    fig_*.png                   the method's figures
    report.html                 one self-contained page: the summary table, every figure,
                                the design and settings (:func:`strategies.report.study_report`)
    errors.log                  tasks that raised (they are retried by a rerun)

Seeds: task ``(cell, rep)`` gets :func:`task_seed` of the config's ``seed``, the cell's
values and ``rep`` -- independent of the grid's order, of ``--only`` and of ``--workers``,
so any subset of a study reproduces the same numbers.

Modules: :mod:`.design` (config and grid), :mod:`.store` (part files), :mod:`.executors`
(process pool, Ray), :mod:`.progress`, :mod:`.summary` (tables), :mod:`.plots` (figure
helpers), :mod:`.runner` (the whole run), :mod:`.coverage` (coverage studies of the oracle
intervals), :mod:`.benchtable` (the bench commands' table).
"""

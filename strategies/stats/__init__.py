"""Statistics on fitted models: ``tuning`` (folds, rules, lambda_max, the process pool of
the cross-validation), ``inference`` (the oracle sandwich), ``calibration`` and ``predict``
(scoring new rows from a fit's files)."""

"""Statistics on fitted models: ``tuning`` (folds, rules, lambda_max, the levels' grids),
``inference`` (the oracle sandwich), ``calibration`` and ``predict`` (scoring new rows from
a fit's files)."""

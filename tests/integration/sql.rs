//! `epifusion sql` end to end: the bundled GiBleed store, local and served by a local
//! S3-compatible server (Python `moto`, started here), plus `epifusion import`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn epifusion(args: &[&str], env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_epifusion"));
    cmd.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run epifusion")
}

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "epifusion failed:\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The Cox rows of the GiBleed study's CSV output: (covariate_id, estimate, lower, upper, status).
fn cox_rows(csv: &str) -> Vec<Vec<String>> {
    csv.lines()
        .skip_while(|l| !l.starts_with("covariate_id,"))
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

#[test]
fn gibleed_new_user_cox_runs_on_the_bundled_store() {
    let out = epifusion(
        &[
            "sql",
            "--omop",
            "data/gibleed",
            "-f",
            "sql/gibleed_new_user_cox.sql",
            "--format",
            "csv",
        ],
        &[],
    );
    let text = ok(&out);
    // Attrition: step 1 counts every first exposure with an observation period: 2,630 of the
    // 2,694 persons (the others have none containing their first NSAID era).
    let step1 = text
        .lines()
        .skip_while(|l| !l.starts_with("step,description,target_persons,comparator_persons"))
        .nth(1)
        .unwrap_or_else(|| panic!("no attrition in {text}"));
    let counts: Vec<i64> = step1
        .split(',')
        .skip(2)
        .map(|c| c.parse().unwrap())
        .collect();
    assert_eq!(counts[0] + counts[1], 2630, "{text}");
    // The unadjusted fit (first result with a confidence interval): one treatment row.
    let rows = cox_rows(&text);
    let with_ci: Vec<&Vec<String>> = rows.iter().take_while(|r| r.len() == 9).collect();
    assert_eq!(with_ci.len(), 1, "{text}");
    for r in with_ci {
        let (est, lo, hi): (f64, f64, f64) = (
            r[1].parse().unwrap(),
            r[4].parse().unwrap(),
            r[5].parse().unwrap(),
        );
        assert!(lo < est.exp() && est.exp() < hi, "CI around the HR: {r:?}");
        assert_eq!(r.last().unwrap(), "converged");
    }
}

#[test]
fn sql_errors_are_clear() {
    let out = epifusion(
        &["sql", "-c", "SELECT * FROM cox_fit('no_such_table')"],
        &[],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no_such_table"), "{err}");
    let out = epifusion(&["sql", "--omop", "tests", "-c", "SELECT 1"], &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no OMOP CDM tables"));
    let out = epifusion(&["sql", "--format", "xml", "-c", "SELECT 1"], &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("format"));
}

#[test]
fn output_file_formats() {
    let dir = std::env::temp_dir().join(format!("epifusion-sql-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for ext in ["parquet", "csv", "json"] {
        let path = dir.join(format!("r.{ext}"));
        let p = path.to_string_lossy().to_string();
        ok(&epifusion(
            &[
                "sql",
                "--omop",
                "data/gibleed",
                "-c",
                "SELECT person_id, gender_concept_id FROM person ORDER BY person_id LIMIT 3",
                "--output",
                &p,
            ],
            &[],
        ));
        assert!(path.metadata().unwrap().len() > 0, "{p}");
        // Read it back through SQL.
        let back = ok(&epifusion(
            &["sql", "--format", "csv", "-c", &format!("CREATE EXTERNAL TABLE r STORED AS {} LOCATION '{p}'; SELECT count(*) AS n FROM r", if ext == "json" { "JSON" } else { ext })],
            &[],
        ));
        assert!(back.contains("n\n3"), "{ext}: {back}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// S3 through a local moto server.

/// A local moto S3 server (killed on drop).
pub struct Moto {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn start_moto() -> Option<Moto> {
    let port = free_port();
    let child = match Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("moto_server not found ({e}); .ci/run installs it with `pip install 'moto[server]'`");
            }
            eprintln!("SKIPPED: S3 tests need `moto_server` (pip install 'moto[server]'): {e}");
            return None;
        }
    };
    let moto = Moto { child, port };
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "moto_server did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(moto)
}

pub fn create_bucket(port: u16, bucket: &str) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "create bucket: {resp}");
}

pub fn s3_env(port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")),
    ]
}

#[test]
fn gibleed_from_s3_matches_local() {
    let Some(moto) = start_moto() else { return };
    create_bucket(moto.port, "cdm");
    let env = s3_env(moto.port);
    // Import the CSV-free Parquet store into S3 (exercises writing to an object store).
    assert!(Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/gibleed/person.parquet")
        .exists());
    let imported = epifusion(&["import", "data/gibleed", "s3://cdm/gibleed"], &env);
    ok(&imported);
    assert!(String::from_utf8_lossy(&imported.stderr).contains("person: 2694 rows"));
    let remote = ok(&epifusion(
        &[
            "sql",
            "--omop",
            "s3://cdm/gibleed",
            "-f",
            "sql/gibleed_new_user_cox.sql",
            "--format",
            "csv",
        ],
        &env,
    ));
    let local = ok(&epifusion(
        &[
            "sql",
            "--omop",
            "data/gibleed",
            "-f",
            "sql/gibleed_new_user_cox.sql",
            "--format",
            "csv",
        ],
        &[],
    ));
    let strip_seconds = |t: &str| {
        cox_rows(t)
            .into_iter()
            .map(|r| r[..4].to_vec())
            .collect::<Vec<_>>()
    };
    assert_eq!(strip_seconds(&remote), strip_seconds(&local));
    assert!(!strip_seconds(&remote).is_empty());
    // CREATE EXTERNAL TABLE on an s3:// URL.
    let n = ok(&epifusion(
        &["sql", "--format", "csv", "-c", "CREATE EXTERNAL TABLE p STORED AS PARQUET LOCATION 's3://cdm/gibleed/person.parquet'; SELECT count(*) AS n FROM p"],
        &env,
    ));
    assert!(n.contains("n\n2694"), "{n}");
    // A missing bucket is a clear error.
    let out = epifusion(
        &["sql", "--omop", "s3://no-such-bucket/x", "-c", "SELECT 1"],
        &env,
    );
    assert!(!out.status.success());
}

#[test]
fn csv_dump_store_gets_cdm_types_and_imports_to_parquet() {
    // A tiny CSV dump: MIMIC-style negative 64-bit ids, ISO dates, a v5.3 death table without
    // the optional cause_concept_id column.
    let dir = std::env::temp_dir().join(format!("epifusion-csv-omop-{}", std::process::id()));
    let out = dir.join("parquet");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("person.csv"),
        "person_id,gender_concept_id,year_of_birth\n-9223372036854775807,8532,2130\n42,8507,2101\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("observation_period.csv"),
        "observation_period_id,person_id,observation_period_start_date,observation_period_end_date\n1,-9223372036854775807,2150-01-01,2152-12-31\n2,42,2110-06-01,2111-06-01\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("DEATH.CSV"),
        "person_id,death_date\n42,2111-05-31\n",
    )
    .unwrap();
    std::fs::write(dir.join("notes.txt"), "not a table").unwrap();
    let d = dir.to_string_lossy().to_string();
    let types = "SELECT arrow_typeof(p.person_id) AS id_type, arrow_typeof(o.observation_period_start_date) AS date_type, \
                 arrow_typeof(d.cause_concept_id) AS missing_type, min(p.person_id) AS min_id, \
                 max(CAST(o.observation_period_end_date AS INT) - CAST(o.observation_period_start_date AS INT)) AS max_days \
                 FROM person p JOIN observation_period o ON o.person_id = p.person_id \
                 LEFT JOIN death d ON d.person_id = p.person_id GROUP BY 1, 2, 3";
    let text = ok(&epifusion(
        &["sql", "--omop", &d, "--format", "csv", "-c", types],
        &[],
    ));
    assert!(
        text.contains("Int64,Date32,Int64,-9223372036854775807,1095"),
        "{text}"
    );
    // Import to typed Parquet and query the result the same way.
    let o = out.to_string_lossy().to_string();
    let imported = epifusion(&["import", &d, &o], &[]);
    ok(&imported);
    assert!(out.join("person.parquet").exists() && out.join("death.parquet").exists());
    assert!(!out.join(".person.parquet.partial").exists());
    let text = ok(&epifusion(
        &["sql", "--omop", &o, "--format", "csv", "-c", types],
        &[],
    ));
    assert!(
        text.contains("Int64,Date32,Int64,-9223372036854775807,1095"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn interactive_shell_reads_statements_from_stdin() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_epifusion"))
        .args(["sql", "--omop", "data/gibleed"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("HOME", std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the shell");
    {
        let stdin = child.stdin.as_mut().unwrap();
        // A statement over two lines, an error that does not end the session, then quit.
        stdin
            .write_all(b"SELECT count(*) AS persons\nFROM person;\nSELECT * FROM no_such_table;\nSELECT 40 + 2 AS answer;\n\\q\n")
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("2694"), "{stdout}");
    assert!(stdout.contains("42"), "{stdout}");
    assert!(stderr.contains("no_such_table"), "{stderr}");
}

/// A corrupt Parquet file in a store: the error names the table and its file, whether the
/// footer (at registration) or a data page (at query time) is broken.
#[test]
fn corrupt_parquet_in_a_store_names_the_file() {
    let dir = std::env::temp_dir().join(format!("epifusion-corrupt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/synthea27nj");
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        if e.path().extension().is_some_and(|x| x == "parquet") {
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
    }
    let person = dir.join("person.parquet");
    let good = std::fs::read(&person).unwrap();
    let store = dir.display().to_string();
    let query = "SELECT count(*), sum(year_of_birth) FROM person";

    // The intact store works.
    ok(&epifusion(&["sql", "--omop", &store, "-c", query], &[]));

    // A truncated file: its footer is gone.
    std::fs::write(&person, &good[..300]).unwrap();
    let out = epifusion(&["sql", "--omop", &store, "-c", query], &[]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("reading person ({})", person.display())),
        "{err}"
    );

    // Overwritten data pages: the footer is intact, reading the column fails.
    let mut bad = good.clone();
    let end = bad.len().saturating_sub(2000).min(4000);
    for b in &mut bad[200..end] {
        *b = 0x55;
    }
    std::fs::write(&person, &bad).unwrap();
    let out = epifusion(&["sql", "--omop", &store, "-c", query], &[]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("reading person ({})", person.display())),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

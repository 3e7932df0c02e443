//! `epifusion serve` with real Flight SQL clients: Python's ADBC driver
//! (`adbc-driver-flightsql` + `pyarrow`) runs `tests/flight/client.py` against the built binary
//! on a free loopback port. Skipped (loudly) without the Python packages, failing under `CI`
//! (`.ci/run` installs them).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The shared start-up tables: Rossi's recidivism data and Therneau's test 1 in three groups.
const STARTUP: &str = "\
CREATE EXTERNAL TABLE rossi STORED AS CSV LOCATION 'tests/data/survival_rossi.csv' \
  OPTIONS ('format.has_header' 'true'); \
CREATE EXTERNAL TABLE test1 STORED AS CSV LOCATION 'tests/data/therneau_test1.csv' \
  OPTIONS ('format.has_header' 'true'); \
CREATE VIEW grouped AS \
  SELECT 1 AS g, time, status AS y, CASE WHEN x = 1 THEN [CAST(7 AS BIGINT)] ELSE [] END AS ids FROM test1 \
  UNION ALL SELECT 2, time, status, CASE WHEN x = 0 THEN [CAST(7 AS BIGINT)] ELSE [] END FROM test1 \
  UNION ALL SELECT 3, time, 0, [CAST(7 AS BIGINT)] FROM test1";

const COX: &str = "SELECT * FROM cox_fit('SELECT week AS time, arrest AS y, fin, age, prio \
                   FROM rossi', '{\"ci\": \"wald\"}')";
const COX_L1: &str = "SELECT * FROM cox_fit('SELECT week AS time, arrest AS y, fin, age, race, \
                      wexp, mar, paro, prio FROM rossi', '{\"prior\": \"laplace\", \"variance\": 0.1}')";
const AGG: &str = "SELECT g, c['covariate_id'] AS covariate_id, c['estimate'] AS estimate, \
                   c['log_likelihood'] AS log_likelihood, c['status'] AS status FROM (SELECT g, \
                   unnest(fit) AS c FROM (SELECT g, cox_fit_agg(CAST(NULL AS BIGINT), time, y, ids, \
                   '{\"tolerance\": 1e-12, \"ci\": \"none\"}') AS fit FROM grouped GROUP BY g)) \
                   ORDER BY g";

const TOKEN: &str = "flight-test-token";

/// Whether the Python client can run here; under `CI` it must.
fn adbc_available() -> bool {
    let probe = Command::new("python3")
        .args(["-c", "import adbc_driver_flightsql, pyarrow, cryptography"])
        .output();
    let ok = probe.as_ref().is_ok_and(|o| o.status.success());
    if !ok {
        let why = match &probe {
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => e.to_string(),
        };
        if std::env::var_os("CI").is_some() {
            panic!(
                "the Flight SQL tests need python3 with adbc-driver-flightsql, pyarrow and \
                 cryptography (.ci/run installs them): {why}"
            );
        }
        eprintln!(
            "SKIPPED: the Flight SQL tests need `pip install adbc-driver-flightsql pyarrow \
             cryptography`: {why}"
        );
    }
    ok
}

/// A running `epifusion serve`, killed when dropped.
struct Server {
    child: Child,
    uri: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `epifusion serve --bind 127.0.0.1:0 -c STARTUP ARGS` and wait for its address.
fn serve(args: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_epifusion"))
        .args(["serve", "--bind", "127.0.0.1:0", "-c", STARTUP])
        .args(args)
        .current_dir(ROOT)
        .env_remove("EPIFUSION_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start epifusion serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[server] {line}");
            if let Some(rest) = line.split("Flight SQL on ").nth(1) {
                let uri = rest.split_whitespace().next().unwrap_or_default();
                let _ = tx.send(uri.to_string());
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(uri) => Server { child, uri },
        Err(_) => {
            let _ = child.kill();
            panic!("epifusion serve did not start: {:?}", child.wait());
        }
    }
}

fn client(server: &Server, token: &str, check: &str, args: &[&str]) {
    let out = Command::new("python3")
        .arg(Path::new(ROOT).join("tests/flight/client.py"))
        .args([server.uri.as_str(), token, check])
        .args(args)
        .current_dir(ROOT)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "client check `{check}` failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ok(out: Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `epifusion sql -c "STARTUP; SQL" --output DIR/NAME.parquet`: the CLI's answer.
fn cli_parquet(dir: &Path, name: &str, sql: &str) -> PathBuf {
    let path = dir.join(format!("{name}.parquet"));
    let out = Command::new(env!("CARGO_BIN_EXE_epifusion"))
        .args(["sql", "-c", &format!("{STARTUP}; {sql}"), "--format", "csv"])
        .arg("--output")
        .arg(&path)
        .current_dir(ROOT)
        .output()
        .expect("run epifusion sql");
    ok(out, &format!("epifusion sql {sql}"));
    path
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("epifusion-flight-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn flight_sql_clients_get_the_cli_tables() {
    if !adbc_available() {
        return;
    }
    let dir = temp_dir("clients");
    let (cox, cox_l1, agg) = (
        cli_parquet(&dir, "cox", COX),
        cli_parquet(&dir, "cox_l1", COX_L1),
        cli_parquet(&dir, "agg", AGG),
    );
    let server = serve(&["--token", TOKEN, "--query-timeout", "120"]);
    let p = |p: &PathBuf| p.to_string_lossy().to_string();
    client(&server, TOKEN, "same-as-cli", &[COX, &p(&cox)]);
    client(&server, TOKEN, "same-as-cli", &[AGG, &p(&agg)]);
    client(&server, TOKEN, "wrong-token", &[]);
    client(&server, TOKEN, "read-only", &[]);
    client(&server, TOKEN, "failing-fit", &[COX]);
    client(
        &server,
        TOKEN,
        "concurrent",
        &[COX, &p(&cox), COX_L1, &p(&cox_l1), AGG, &p(&agg)],
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn flight_sql_statements_stop_at_the_time_and_memory_limits() {
    if !adbc_available() {
        return;
    }
    let server = serve(&[
        "--insecure",
        "--query-timeout",
        "2",
        "--memory-limit",
        "32M",
    ]);
    client(&server, "", "limits", &[]);
}

#[test]
fn flight_sql_over_tls_with_writes_keeps_sessions_apart() {
    if !adbc_available() {
        return;
    }
    let dir = temp_dir("tls");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("python3")
        .arg(Path::new(ROOT).join("tests/flight/make_cert.py"))
        .args([&cert, &key])
        .output()
        .expect("run python3");
    ok(out, "make_cert.py");
    let cox = cli_parquet(&dir, "cox", COX);
    let (cert_s, key_s) = (
        cert.to_string_lossy().to_string(),
        key.to_string_lossy().to_string(),
    );
    let server = serve(&[
        "--allow-writes",
        "--token",
        TOKEN,
        "--tls-cert",
        &cert_s,
        "--tls-key",
        &key_s,
    ]);
    assert!(server.uri.starts_with("grpc+tls://"), "{}", server.uri);
    client(
        &server,
        TOKEN,
        "same-as-cli",
        &[COX, &cox.to_string_lossy(), &cert_s],
    );
    client(&server, TOKEN, "sessions", &[&cert_s]);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Start-up refusals need no client: a token is required off loopback, a bad PEM file is named.
#[test]
fn flight_serve_refuses_unsafe_or_broken_setups() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_epifusion"))
            .arg("serve")
            .args(args)
            .env_remove("EPIFUSION_TOKEN")
            .output()
            .expect("run epifusion serve")
    };
    let out = run(&["--bind", "0.0.0.0:0", "--insecure"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--token"), "{err}");
    let out = run(&["--bind", "127.0.0.1:0"]);
    assert!(!out.status.success(), "no token and no --insecure");
    let dir = temp_dir("badpem");
    let bogus = dir.join("bogus.pem");
    std::fs::write(&bogus, "not a certificate").expect("write");
    let bogus_s = bogus.to_string_lossy().to_string();
    let out = run(&[
        "--bind",
        "127.0.0.1:0",
        "--insecure",
        "--tls-cert",
        &bogus_s,
        "--tls-key",
        &bogus_s,
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bogus.pem"), "{err}");
    // A port in use.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let out = run(&["--bind", &addr, "--insecure"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen on"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

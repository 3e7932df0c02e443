//! `epifusion run`: validation errors with lines, the bundled GiBleed pipeline end to end (local
//! output, resume, --force, repair), a killed run and a failing analysis leave nothing that looks
//! complete, the report in a real headless browser, and S3 output with the server going away
//! mid-run (through a TCP proxy in front of moto) and a rerun that completes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::sql::{create_bucket, s3_env, start_moto};

fn epifusion(args: &[&str], env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_epifusion"));
    cmd.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run epifusion")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(out: &Output) -> String {
    let (stdout, stderr) = text(out);
    assert!(
        out.status.success(),
        "epifusion failed:\nstdout: {stdout}\nstderr: {stderr}"
    );
    stdout
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("epifusion-pipeline-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn repo(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(rel)
        .display()
        .to_string()
}

/// A small pipeline over the bundled store: a Cox fit on GiBleed persons (female ~ birth year).
fn small_pipeline(dir: &Path, second_outcomes: &str) -> String {
    let p = dir.join("small.toml");
    std::fs::write(
        &p,
        format!(
            r#"name = "small"
omop = "{store}"
output = "out"

[[analysis]]
name = "first"
design = "sql"
model = "logistic"
[analysis.sql]
outcomes = "SELECT person_id AS row_id, CASE WHEN gender_concept_id = 8532 THEN 1 ELSE 0 END AS y FROM person"
covariates = "SELECT person_id AS row_id, CAST(1 AS BIGINT) AS covariate_id, (year_of_birth - 1950) / 10.0 AS covariate_value FROM person"
[analysis.fit]
ci = "wald"

[[analysis]]
name = "second"
design = "sql"
model = "cox"
[analysis.sql]
outcomes = "{second_outcomes}"
covariates = "SELECT person_id AS row_id, CAST(1 AS BIGINT) AS covariate_id, 1.0 AS covariate_value FROM person WHERE gender_concept_id = 8532"
[analysis.fit]
ci = "wald"
"#,
            store = repo("data/gibleed")
        ),
    )
    .unwrap();
    p.display().to_string()
}

const GOOD_SECOND: &str =
    "SELECT person_id AS row_id, CAST(year_of_birth - 1900 AS DOUBLE) AS time, 1 AS y FROM person";

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

#[test]
fn validation_errors_name_the_key_and_the_line() {
    let dir = temp_dir("invalid");
    let write = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p.display().to_string()
    };
    let store = repo("data/gibleed");
    let head = format!("omop = \"{store}\"\noutput = \"out\"\n");
    // Line 5: an unknown key.
    let f = write(
        "unknown.toml",
        &format!("{head}[[analysis]]\nname = \"a\"\ndesign = \"sql\"\nmodle = \"cox\"\n[analysis.sql]\noutcomes = \"SELECT 1\"\n"),
    );
    let (_, e) = text(&epifusion(&["run", &f], &[]));
    assert!(e.contains("unknown.toml:6:") && e.contains("modle"), "{e}");
    // A concept that the store does not have (line 4).
    let f = write(
        "concept.toml",
        &format!("{head}[concept_sets.x]\nconcepts = [999999999]\n[[analysis]]\nname = \"a\"\ndesign = \"sql\"\nmodel = \"cox\"\noutcomes = [\"x\"]\n[analysis.sql]\noutcomes = \"SELECT * FROM {{outcome}}\"\n"),
    );
    let (_, e) = text(&epifusion(&["run", &f], &[]));
    assert!(
        e.contains("concept.toml:4:") && e.contains("999999999") && e.contains("concepts"),
        "{e}"
    );
    // A query over a table the store does not have (line 8).
    let f = write(
        "table.toml",
        &format!("{head}[[analysis]]\nname = \"a\"\ndesign = \"sql\"\nmodel = \"cox\"\n[analysis.sql]\noutcomes = \"SELECT * FROM no_such_table\"\n"),
    );
    let (_, e) = text(&epifusion(&["run", &f], &[]));
    assert!(
        e.contains("table.toml:8:") && e.contains("sql.outcomes") && e.contains("no_such_table"),
        "{e}"
    );
    // A wrong type.
    let f = write(
        "type.toml",
        &format!("{head}[[analysis]]\nname = \"a\"\ndesign = \"sql\"\nmodel = \"cox\"\nreport = \"all\"\n[analysis.sql]\noutcomes = \"SELECT 1\"\n"),
    );
    let (_, e) = text(&epifusion(&["run", &f], &[]));
    assert!(e.contains("type.toml:7:") && e.contains("report"), "{e}");
    // Nothing was written by any of them.
    assert!(!dir.join("out").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gibleed_dry_run_shows_the_plan_and_writes_nothing() {
    let dir = temp_dir("dry");
    let out = dir.join("results");
    let o = out.display().to_string();
    let stdout = ok(&epifusion(
        &["run", "pipelines/gibleed.toml", "--output", &o, "--dry-run"],
        &[],
    ));
    for id in [
        "new_user_cox.celecoxib.diclofenac.gi_bleed",
        "new_user_fine_gray.celecoxib.diclofenac.gi_bleed.competing_event",
        "sccs.celecoxib.gi_bleed",
        "sccs.diclofenac.gi_bleed",
    ] {
        assert!(stdout.contains(id), "{id}: {stdout}");
    }
    assert!(stdout.contains("nothing was written"), "{stdout}");
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The treatment estimate of sql/gibleed_new_user_cox.sql.
fn sql_script_treatment_estimate() -> f64 {
    let csv = ok(&epifusion(
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
    let row = csv
        .lines()
        .skip_while(|l| !l.starts_with("covariate_id,"))
        .find(|l| l.starts_with("1,"))
        .unwrap_or_else(|| panic!("{csv}"));
    row.split(',').nth(1).unwrap().parse().unwrap()
}

fn parquet_value(path: &Path, sql: &str) -> String {
    let q = format!(
        "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}'; {sql}",
        path.display()
    );
    ok(&epifusion(&["sql", "--format", "csv", "-c", &q], &[]))
}

#[test]
fn gibleed_pipeline_end_to_end_resume_force_and_repair() {
    let dir = temp_dir("gibleed");
    let out = dir.join("results");
    let o = out.display().to_string();
    let stdout = ok(&epifusion(
        &["run", "pipelines/gibleed.toml", "--output", &o],
        &[],
    ));
    assert!(
        stdout.contains("(4 computed, 0 skipped as complete)"),
        "{stdout}"
    );
    let m = manifest(&out);
    assert_eq!(m["status"], "complete");
    let analyses = m["analyses"].as_array().unwrap();
    assert_eq!(analyses.len(), 4);
    let report = out.join(m["report"]["path"].as_str().unwrap());
    assert!(report.exists() && out.join("report.html").exists());
    for a in analyses {
        let am: serde_json::Value = serde_json::from_slice(
            &std::fs::read(out.join(a["manifest"]["path"].as_str().unwrap())).unwrap(),
        )
        .unwrap();
        for t in [
            "estimates",
            "attrition",
            "covariate_ref",
            "diagnostics",
            "metadata",
        ] {
            let o = &am["objects"][t];
            let p = out.join(o["path"].as_str().unwrap());
            assert_eq!(
                p.metadata().unwrap().len(),
                o["size"].as_u64().unwrap(),
                "{p:?}"
            );
        }
        assert_eq!(am["summary"]["status"], "converged", "{am}");
    }
    // The Cox analysis reproduces the hand-written SQL study.
    let cox = &analyses[0];
    assert_eq!(cox["id"], "new_user_cox.celecoxib.diclofenac.gi_bleed");
    let am: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join(cox["manifest"]["path"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    let est = parquet_value(
        &out.join(am["objects"]["estimates"]["path"].as_str().unwrap()),
        "SELECT estimate, covariate_name, target, comparator FROM t WHERE covariate_id = 1",
    );
    let row = est.lines().nth(1).unwrap().to_string();
    let pipeline_estimate: f64 = row.split(',').next().unwrap().parse().unwrap();
    let script = sql_script_treatment_estimate();
    assert!(
        (pipeline_estimate - script).abs() <= 1e-9 * script.abs().max(1.0),
        "pipeline {pipeline_estimate} vs script {script}"
    );
    assert!(row.ends_with(",celecoxib,diclofenac"), "{row}");

    // A rerun skips everything; --force recomputes and removes the replaced objects.
    let stdout = ok(&epifusion(
        &["run", "pipelines/gibleed.toml", "--output", &o],
        &[],
    ));
    assert!(
        stdout.contains("(0 computed, 4 skipped as complete)"),
        "{stdout}"
    );
    let stdout = ok(&epifusion(
        &["run", "pipelines/gibleed.toml", "--output", &o, "--force"],
        &[],
    ));
    assert!(
        stdout.contains("(4 computed, 0 skipped as complete)"),
        "{stdout}"
    );
    let cox_dir = out.join("analyses/new_user_cox.celecoxib.diclofenac.gi_bleed");
    let runs: Vec<_> = std::fs::read_dir(&cox_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .collect();
    assert_eq!(runs.len(), 1, "old run folders are removed");
    // An object that went missing makes its analysis run again, and only that one.
    let m = manifest(&out);
    let sccs = &m["analyses"][2];
    let am: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join(sccs["manifest"]["path"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    std::fs::remove_file(out.join(am["objects"]["attrition"]["path"].as_str().unwrap())).unwrap();
    let stdout = ok(&epifusion(
        &["run", "pipelines/gibleed.toml", "--output", &o],
        &[],
    ));
    assert!(
        stdout.contains("(1 computed, 3 skipped as complete)"),
        "{stdout}"
    );
    chromium_sees_the_report(&out.join("report.html"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_analysis_or_a_killed_run_leaves_nothing_that_looks_complete() {
    let dir = temp_dir("atomic");
    let out = dir.join("out");
    // The second analysis has an impossible time: the run is incomplete, the first analysis is
    // complete, there is no run manifest.
    let bad = small_pipeline(
        &dir,
        "SELECT person_id AS row_id, -1.0 AS time, 1 AS y FROM person",
    );
    let o = epifusion(&["run", &bad], &[]);
    let (_, e) = text(&o);
    assert!(!o.status.success());
    assert!(
        e.contains("1 of 2 analyses failed") && e.contains("second"),
        "{e}"
    );
    assert!(out.join("analyses/first/manifest.json").exists());
    assert!(!out.join("analyses/second/manifest.json").exists());
    assert!(!out.join("manifest.json").exists());

    // Fixed, but killed after the first analysis (which is now complete: kept).
    let good = small_pipeline(&dir, GOOD_SECOND);
    let mut child = Command::new(env!("CARGO_BIN_EXE_epifusion"))
        .args(["run", &good, "--force"])
        .env("EPIFUSION_TEST_PAUSE_MS", "60000")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let lines = stderr_lines(child.stderr.take().unwrap());
    wait_for_line(&lines, "[1/2] first: complete");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.join("manifest.json").exists());
    assert!(!out.join("analyses/second/manifest.json").exists());
    // The rerun resumes: the first analysis is skipped.
    let stdout = ok(&epifusion(&["run", &good], &[]));
    assert!(
        stdout.contains("(1 computed, 1 skipped as complete)"),
        "{stdout}"
    );
    assert_eq!(manifest(&out)["status"], "complete");
    let _ = std::fs::remove_dir_all(&dir);
}

fn stderr_lines(stderr: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_for_line(lines: &mpsc::Receiver<String>, needle: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match lines.recv_timeout(Duration::from_secs(1)) {
            Ok(l) => {
                let hit = l.contains(needle);
                seen.push(l);
                if hit {
                    return seen;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    panic!("no line with `{needle}`:\n{}", seen.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// The report in a real headless browser.

fn chromium() -> Option<String> {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if Command::new(c)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            return Some(c.to_string());
        }
    }
    if std::env::var_os("CI").is_some() {
        panic!("chromium not found; .ci/run installs it (apt-get install chromium)");
    }
    eprintln!("SKIPPED: the report test needs a headless chromium (apt-get install chromium)");
    None
}

/// Open the report in headless chromium through a probe page (the report itself has no script)
/// and check what a person sees: the rendered text, the plot's markers and their positions.
fn chromium_sees_the_report(report: &Path) {
    let Some(browser) = chromium() else { return };
    let dir = report.parent().unwrap();
    let probe = dir.join("probe.html");
    std::fs::write(
        &probe,
        r#"<!DOCTYPE html><html><body><iframe id="f" src="report.html" width="1400" height="4000"></iframe>
<pre id="probe">waiting</pre>
<script>
document.getElementById('f').addEventListener('load', function () {
  var out = {};
  try {
    var d = this.contentDocument;
    out.title = d.title;
    out.text = d.body.innerText;
    var svg = d.querySelector('svg.forest');
    var sb = svg.getBoundingClientRect();
    out.svg = {w: sb.width, h: sb.height};
    var ref = d.querySelector('line.reference').getBoundingClientRect();
    out.reference = ref.x + ref.width / 2 - sb.x;
    var plot = d.querySelector('rect.plot-area').getBoundingClientRect();
    out.rows = Array.from(d.querySelectorAll('g.forest-row')).map(function (g) {
      var m = g.querySelector('rect.estimate').getBoundingClientRect();
      var lb = g.querySelector('text.label').getBoundingClientRect();
      var vb = g.querySelector('text.value').getBoundingClientRect();
      var ci = g.querySelector('line.ci');
      var c = ci ? ci.getBoundingClientRect() : null;
      return {analysis: g.getAttribute('data-analysis'), ratio: parseFloat(g.getAttribute('data-ratio')),
              x: m.x + m.width / 2 - sb.x, w: m.width, h: m.height,
              inside: m.x >= sb.x && m.right <= sb.right && m.y >= sb.y && m.bottom <= sb.bottom,
              ci: c ? [c.x - sb.x, c.right - sb.x] : null,
              labelClear: lb.right <= plot.left && lb.width > 0,
              valueClear: vb.left >= plot.right && vb.right <= sb.right,
              label: g.querySelector('text.label').textContent,
              value: g.querySelector('text.value').textContent};
    });
    out.attrition = Array.from(d.querySelectorAll('table.attrition')).map(function (t) { return t.rows.length; });
  } catch (e) { out.error = String(e); }
  document.getElementById('probe').textContent = JSON.stringify(out);
});
</script></body></html>"#,
    )
    .unwrap();
    let o = Command::new(&browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--allow-file-access-from-files",
            "--virtual-time-budget=15000",
            "--dump-dom",
        ])
        .arg(format!("file://{}", probe.display()))
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&o.stdout);
    let json = dom
        .split("<pre id=\"probe\">")
        .nth(1)
        .and_then(|s| s.split("</pre>").next())
        .unwrap_or_else(|| panic!("no probe output: {dom}"))
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&");
    let v: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert!(v.get("error").is_none(), "{v}");
    assert!(
        v["title"].as_str().unwrap().contains("GiBleed"),
        "{}",
        v["title"]
    );
    let seen = v["text"].as_str().unwrap();
    for expected in [
        "GiBleed: celecoxib, diclofenac and GI bleeding",
        "Estimates",
        "treatment (target = 1, comparator = 0)",
        "celecoxib: exposed",
        "Attrition",
        "at least 365 days of prior observation",
        "Run metadata",
        "datafusion version",
        "Complete from run",
    ] {
        assert!(seen.contains(expected), "`{expected}` not visible:\n{seen}");
    }
    // Four units, one plotted coefficient each; every marker is drawn inside the plot, on the
    // correct side of the reference line at 1, inside its interval.
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{v}");
    let reference = v["reference"].as_f64().unwrap();
    for r in rows {
        assert!(r["inside"].as_bool().unwrap(), "{r}");
        // Labels and values do not run into the plot (or out of the picture).
        assert!(r["labelClear"].as_bool().unwrap(), "{r}");
        assert!(r["valueClear"].as_bool().unwrap(), "{r}");
        assert!(r["w"].as_f64().unwrap() > 0.0, "{r}");
        let (x, ratio) = (r["x"].as_f64().unwrap(), r["ratio"].as_f64().unwrap());
        assert_eq!(
            x > reference,
            ratio > 1.0,
            "{r} vs reference at {reference}"
        );
        if let Some(ci) = r["ci"].as_array() {
            let (lo, hi) = (ci[0].as_f64().unwrap(), ci[1].as_f64().unwrap());
            assert!(lo <= x + 0.5 && x <= hi + 0.5, "{r}");
        }
        assert!(seen.contains(r["value"].as_str().unwrap()), "{r}");
    }
    // One attrition table per unit, each with a header and at least one step.
    let attrition = v["attrition"].as_array().unwrap();
    assert_eq!(attrition.len(), 4);
    assert!(attrition.iter().all(|n| n.as_u64().unwrap() >= 2), "{v}");
    let _ = std::fs::remove_file(&probe);
}

// ---------------------------------------------------------------------------------------------
// S3 output: the server goes away mid-run.

/// A TCP proxy in front of the S3 server; `stop` makes the server "go away" for the client
/// (the port refuses connections and open connections are cut) while moto keeps its state.
struct Proxy {
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    fn start(port: u16, target: u16) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the proxy port");
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (s, c) = (stop.clone(), conns.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                            continue;
                        };
                        let mut list = c.lock().unwrap();
                        list.push(client.try_clone().unwrap());
                        list.push(server.try_clone().unwrap());
                        for (mut from, mut to) in [
                            (client.try_clone().unwrap(), server.try_clone().unwrap()),
                            (server, client),
                        ] {
                            std::thread::spawn(move || {
                                let _ = std::io::copy(&mut from, &mut to);
                                let _ = to.shutdown(Shutdown::Write);
                            });
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Proxy {
            stop,
            conns,
            thread: Some(thread),
        }
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Keys under `prefix` in `bucket` (asked of moto directly).
fn list_keys(port: u16, bucket: &str, prefix: &str) -> Vec<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET /{bucket}?list-type=2&prefix={prefix} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    resp.split("<Key>")
        .skip(1)
        .filter_map(|k| k.split("</Key>").next())
        .map(str::to_string)
        .collect()
}

#[test]
fn s3_output_survives_the_server_going_away_and_the_rerun_completes() {
    let Some(moto) = start_moto() else { return };
    create_bucket(moto.port, "results");
    let port = super::sql::free_port();
    let mut proxy = Proxy::start(port, moto.port);
    let mut env = s3_env(port);
    env.push(("EPIFUSION_RETRY_MAX", "3".into()));
    env.push(("EPIFUSION_RETRY_TIMEOUT_S", "3".into()));
    let dir = temp_dir("s3");
    let file = small_pipeline(&dir, GOOD_SECOND);
    let url = "s3://results/study";

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_epifusion"));
    cmd.args(["run", &file, "--output", url])
        .env("EPIFUSION_TEST_PAUSE_MS", "2000")
        .stderr(Stdio::piped())
        .stdout(Stdio::piped());
    for (k, v) in &env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let lines = stderr_lines(child.stderr.take().unwrap());
    let mut seen = wait_for_line(&lines, "[1/2] first: complete");
    proxy.stop(); // the server goes away during the pause after the first analysis
    let started = Instant::now();
    let status = child.wait().unwrap();
    seen.extend(lines.iter());
    let log = seen.join("\n");
    assert!(!status.success(), "{log}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "retries are bounded"
    );
    assert!(
        log.contains("output s3://results/study") && log.contains("cannot write"),
        "{log}"
    );
    assert!(
        log.contains("not complete") && log.contains("rerun"),
        "{log}"
    );
    // What the server kept: the first analysis complete, nothing of the second, no run manifest.
    let keys = list_keys(moto.port, "results", "study/");
    assert!(
        keys.contains(&"study/analyses/first/manifest.json".to_string()),
        "{keys:?}"
    );
    assert!(
        !keys.iter().any(|k| k.starts_with("study/analyses/second/")),
        "{keys:?}"
    );
    assert!(
        !keys.contains(&"study/manifest.json".to_string()),
        "{keys:?}"
    );

    // The server is back: the rerun skips the complete analysis and completes the run.
    let _proxy = Proxy::start(port, moto.port);
    let stdout = ok(&epifusion(&["run", &file, "--output", url], &env));
    assert!(
        stdout.contains("(1 computed, 1 skipped as complete)"),
        "{stdout}"
    );
    let keys = list_keys(moto.port, "results", "study/");
    assert!(
        keys.contains(&"study/manifest.json".to_string()),
        "{keys:?}"
    );
    assert!(keys.contains(&"study/report.html".to_string()), "{keys:?}");
    assert!(
        keys.iter()
            .any(|k| k.starts_with("study/analyses/second/") && k.ends_with("estimates.parquet")),
        "{keys:?}"
    );
    // And the OMOP input can come from S3 too.
    let imported = epifusion(&["import", "data/gibleed", "s3://results/cdm"], &env);
    ok(&imported);
    let stdout = ok(&epifusion(
        &[
            "run",
            &file,
            "--omop",
            "s3://results/cdm",
            "--output",
            "s3://results/from-s3",
        ],
        &env,
    ));
    assert!(stdout.contains("(2 computed, 0 skipped"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The example files: `pipelines/sccs.toml` (SCCS with splines, CV), `pipelines/cohort.toml`
/// (new-user Cox with baseline covariates and CV, Fine–Gray) and `pipelines/gibleed_sql.toml`
/// (the GiBleed study written as SQL).
#[test]
fn sccs_and_cohort_designs_run_from_the_example_files() {
    for (file, units, coefficient) in [
        ("pipelines/sccs.toml", 2, 1000),
        ("pipelines/cohort.toml", 2, 1),
        ("pipelines/gibleed_sql.toml", 4, 0),
    ] {
        let dir = temp_dir(
            file.trim_start_matches("pipelines/")
                .trim_end_matches(".toml"),
        );
        let out = dir.join("results");
        let stdout = ok(&epifusion(
            &["run", file, "--output", &out.display().to_string()],
            &[],
        ));
        assert!(
            stdout.contains(&format!("({units} computed, 0 skipped as complete)")),
            "{file}: {stdout}"
        );
        let m = manifest(&out);
        assert_eq!(m["status"], "complete", "{file}");
        for a in m["analyses"].as_array().unwrap() {
            let am: serde_json::Value = serde_json::from_slice(
                &std::fs::read(out.join(a["manifest"]["path"].as_str().unwrap())).unwrap(),
            )
            .unwrap();
            let est = out.join(am["objects"]["estimates"]["path"].as_str().unwrap());
            // The SQL example's units report treatment (1) or exposure (1000).
            let ids = if coefficient == 0 {
                "1, 1000".to_string()
            } else {
                coefficient.to_string()
            };
            let csv = parquet_value(
                &est,
                &format!("SELECT estimate, std_error FROM t WHERE covariate_id IN ({ids})"),
            );
            let row = csv
                .lines()
                .nth(1)
                .unwrap_or_else(|| panic!("{file}: {csv}"));
            let v: Vec<f64> = row.split(',').map(|x| x.parse().unwrap()).collect();
            assert!(v[0].is_finite() && v[1] > 0.0, "{file}: {row}");
            // Attrition is a table of decreasing counts.
            let att = out.join(am["objects"]["attrition"]["path"].as_str().unwrap());
            let csv = parquet_value(&att, "SELECT count(*) AS n FROM t");
            assert!(
                csv.lines().nth(1).unwrap().parse::<i64>().unwrap() >= 3,
                "{csv}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

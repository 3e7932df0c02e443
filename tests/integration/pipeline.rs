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
        "sccs.gi_bleed",
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
        stdout.contains("(3 computed, 0 skipped as complete)"),
        "{stdout}"
    );
    let m = manifest(&out);
    assert_eq!(m["status"], "complete");
    let analyses = m["analyses"].as_array().unwrap();
    // Cox, Fine–Gray, and one SCCS unit for GI bleed with both exposures.
    assert_eq!(analyses.len(), 3);
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
        stdout.contains("(0 computed, 3 skipped as complete)"),
        "{stdout}"
    );
    let stdout = ok(&epifusion(
        &["run", "pipelines/gibleed.toml", "--output", &o, "--force"],
        &[],
    ));
    assert!(
        stdout.contains("(3 computed, 0 skipped as complete)"),
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
        stdout.contains("(1 computed, 2 skipped as complete)"),
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

pub(crate) fn chromium() -> Option<String> {
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

/// Open `report` (a `report.html`) in headless chromium inside a probe page (the report itself
/// has no script) written next to it as `probe_file`, an iframe `height` pixels high; `collect`
/// is the script body that fills `out` from the report's document `d`. The probe's JSON, or
/// `None` (skipped) without a browser outside CI.
pub(crate) fn chromium_probe(
    report: &Path,
    probe_file: &str,
    height: u32,
    collect: &str,
) -> Option<serde_json::Value> {
    let browser = chromium()?;
    let probe = report.parent().unwrap().join(probe_file);
    let page = format!(
        r#"<!DOCTYPE html><html><body><iframe id="f" src="report.html" width="1400" height="{height}"></iframe>
<pre id="probe">waiting</pre>
<script>
document.getElementById('f').addEventListener('load', function () {{
  var out = {{}};
  try {{
    var d = this.contentDocument;
{collect}
  }} catch (e) {{ out.error = String(e); }}
  document.getElementById('probe').textContent = JSON.stringify(out);
}});
</script></body></html>"#
    );
    std::fs::write(&probe, page).unwrap();
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
    let _ = std::fs::remove_file(&probe);
    Some(v)
}

/// Open the report in headless chromium through a probe page (the report itself has no script)
/// and check what a person sees: the rendered text, the plot's markers and their positions.
fn chromium_sees_the_report(report: &Path) {
    const COLLECT: &str = r#"
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
    out.sccsDiagnostics = Array.from(d.querySelectorAll('table.sccs-diagnostics tbody tr')).map(function (r) { return r.innerText; });
"#;
    let Some(v) = chromium_probe(report, "probe.html", 4000, COLLECT) else {
        return;
    };
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
    // Four plotted coefficients (Cox, Fine–Gray, the SCCS unit's two exposures); every marker is drawn inside the plot, on the
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
    assert_eq!(attrition.len(), 3);
    assert!(attrition.iter().all(|n| n.as_u64().unwrap() >= 2), "{v}");
    // The SCCS diagnostics table: one row per exposure of the GI-bleed unit, each with its MDRR
    // classified; no negative controls, so EASE is not evaluated and nothing is calibrated.
    let diag = v["sccsDiagnostics"].as_array().unwrap();
    assert_eq!(diag.len(), 2, "{v}");
    for r in diag {
        let r = r.as_str().unwrap();
        assert!(r.contains("PASS") || r.contains("FAIL"), "{r}");
        assert!(r.contains("NOT EVALUATED"), "{r}");
    }
    assert!(seen.contains("SCCS empirical calibration") && seen.contains("SCCS diagnostics"));
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
        ("pipelines/sccs.toml", 1, 1000),
        ("pipelines/cohort.toml", 3, 1),
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

/// `pipelines/cohort.toml`'s PS-matched unit (issue #14): the CohortMethod result tables beside
/// the estimates, attrition through matching, and the report's plots seen in a browser.
#[test]
fn ps_matched_cohort_unit_writes_the_cohortmethod_tables_and_plots() {
    let dir = temp_dir("ps_matched");
    let out = dir.join("results");
    ok(&epifusion(
        &[
            "run",
            "pipelines/cohort.toml",
            "--output",
            &out.display().to_string(),
        ],
        &[],
    ));
    let m = manifest(&out);
    let entry = m["analyses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"].as_str().unwrap().starts_with("ps_matched_cox."))
        .unwrap_or_else(|| panic!("{m}"))
        .clone();
    let am: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join(entry["manifest"]["path"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    let table = |name: &str| {
        out.join(
            am["objects"][name]["path"]
                .as_str()
                .unwrap_or_else(|| panic!("no {name} in {am}")),
        )
    };
    let row = |name: &str, sql: &str| -> Vec<String> {
        let csv = parquet_value(&table(name), sql);
        csv.lines()
            .nth(1)
            .unwrap_or_else(|| panic!("{name}: {csv}"))
            .split(',')
            .map(str::to_string)
            .collect()
    };
    let num = |s: &str| s.parse::<f64>().unwrap_or_else(|e| panic!("{s}: {e}"));
    // cm_result: the treatment estimate of the stratified Cox model on 1:1 matched sets.
    let r = row(
        "cm_result",
        "SELECT rr, ci_95_lb, ci_95_ub, p, log_rr, se_log_rr, llr, target_subjects, \
         comparator_subjects, database_id, analysis_id FROM t",
    );
    let est = row("estimates", "SELECT estimate FROM t WHERE covariate_id = 1");
    assert!(
        (num(&r[4]) - num(&est[0])).abs() < 1e-12,
        "{r:?} vs {est:?}"
    );
    assert!((num(&r[0]) - num(&r[4]).exp()).abs() < 1e-9, "{r:?}");
    assert!(num(&r[1]) < num(&r[0]) && num(&r[0]) < num(&r[2]), "{r:?}");
    assert!(
        num(&r[3]) > 0.0 && num(&r[3]) <= 1.0 && num(&r[5]) > 0.0,
        "{r:?}"
    );
    assert!(num(&r[6]) >= 0.0, "llr {r:?}");
    assert_eq!(r[7], r[8], "1:1 matching: equal arms {r:?}");
    assert!(!r[9].is_empty() && r[10] == "3", "{r:?}");
    // The outcome model is stratified by matched set: one stratum per target subject.
    let d = row("diagnostics", "SELECT strata, outcome_rows FROM t");
    assert_eq!(num(&d[0]) * 2.0, num(&d[1]), "{d:?}");
    // Balance: every baseline covariate, better after matching.
    let b = row(
        "cm_covariate_balance",
        "SELECT count(*), max(abs(std_diff_before)), max(abs(std_diff_after)) FROM t",
    );
    assert!(num(&b[0]) > 50.0 && num(&b[2]) < num(&b[1]), "{b:?}");
    let dg = row(
        "cm_diagnostics_summary",
        "SELECT max_sdm, balance_diagnostic, equipoise, equipoise_diagnostic, mdrr FROM t",
    );
    assert!((num(&dg[0]) - num(&b[2])).abs() < 1e-12, "{dg:?} vs {b:?}");
    assert_eq!(
        dg[1],
        if num(&dg[0]) < 0.1 { "PASS" } else { "FAIL" },
        "{dg:?}"
    );
    assert!(
        num(&dg[2]) > 0.0 && num(&dg[2]) <= 1.0 && num(&dg[4]) > 1.0,
        "{dg:?}"
    );
    // Attrition through matching, in the CohortMethod layout (two rows per step).
    let a = row(
        "cm_attrition",
        "SELECT count(*), max(sequence_number), \
         max(CASE WHEN description = 'Matched on propensity score' THEN sequence_number END) FROM t",
    );
    assert_eq!(num(&a[0]), 2.0 * num(&a[1]), "{a:?}");
    assert_eq!(a[1], a[2], "matching is the last step {a:?}");
    // The propensity model, the preference-score distribution, KM and the profile.
    let pm = row(
        "cm_propensity_model",
        "SELECT count(*), min(covariate_id) FROM t",
    );
    assert!(num(&pm[0]) >= 1.0 && pm[1] == "0", "{pm:?}");
    let pd = row(
        "cm_preference_score_dist",
        "SELECT count(*), max(target_density), max(comparator_density) FROM t",
    );
    assert_eq!(pd, ["100", "1.0", "1.0"], "{pd:?}");
    let km = row(
        "cm_kaplan_meier_dist",
        "SELECT count(*), min(target_survival), max(time_day), \
         min(CASE WHEN time_day = 0 THEN target_survival END) FROM t",
    );
    assert!(
        num(&km[0]) > 10.0 && num(&km[1]) < 1.0 && num(&km[3]) == 1.0,
        "{km:?}"
    );
    // Follow-up: ordered quantiles per arm, the matched population's time at risk.
    let fu = row(
        "cm_follow_up_dist",
        "SELECT count(*), \
         CAST(bool_and(target_min_days <= target_p10_days AND target_p10_days <= target_p25_days \
              AND target_p25_days <= target_median_days AND target_median_days <= target_p75_days \
              AND target_p75_days <= target_p90_days AND target_p90_days <= target_max_days \
              AND comparator_min_days <= comparator_median_days \
              AND comparator_median_days <= comparator_max_days \
              AND target_min_date <= target_max_date AND target_min_days >= 1) AS VARCHAR) FROM t",
    );
    assert_eq!(fu, ["1", "true"], "{fu:?}");
    let lp = row(
        "cm_likelihood_profile",
        "SELECT count(*), max(log_likelihood), min(log_rr), max(log_rr) FROM t",
    );
    assert!(num(&lp[0]) >= 1000.0 && num(&lp[1]) == 0.0, "{lp:?}");
    assert!((num(&lp[2]) - 0.1f64.ln()).abs() < 1e-9, "{lp:?}");
    // The report draws the plots and the diagnostics table, as a browser renders them.
    chromium_sees_cohort_plots(&out.join("report.html"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The PS-adjusted unit's plots in headless chromium: each SVG drawn with its marks.
fn chromium_sees_cohort_plots(report: &Path) {
    const COLLECT: &str = r#"
    out.text = d.body.innerText;
    ['ps-dist', 'balance', 'km'].forEach(function (c) {
      var svg = d.querySelector('svg.' + c);
      if (!svg) { out[c] = null; return; }
      var sb = svg.getBoundingClientRect();
      var marks = Array.from(svg.querySelectorAll('polyline, circle')).map(function (e) {
        var r = e.getBoundingClientRect();
        return r.width > 0 && r.x >= sb.x - 1 && r.right <= sb.right + 1 && r.y >= sb.y - 1 && r.bottom <= sb.bottom + 1;
      });
      out[c] = {w: sb.width, h: sb.height, marks: marks.length, inside: marks.every(function (m) { return m; })};
    });
    var t = d.querySelector('table.cm-diagnostics');
    out.diagnostics = t ? t.rows.length : 0;
"#;
    let Some(v) = chromium_probe(report, "probe_cohort.html", 6000, COLLECT) else {
        return;
    };
    for (class, min_marks) in [("ps-dist", 2), ("balance", 50), ("km", 2)] {
        let p = &v[class];
        assert!(p.is_object(), "no svg.{class}: {v}");
        assert!(p["w"].as_f64().unwrap() > 100.0, "{class}: {p}");
        assert!(p["marks"].as_u64().unwrap() >= min_marks, "{class}: {p}");
        assert!(p["inside"].as_bool().unwrap(), "{class}: {p}");
    }
    assert_eq!(v["diagnostics"], 2, "{v}");
    let seen = v["text"].as_str().unwrap();
    for expected in [
        "CohortMethod diagnostics",
        "balance_diagnostic",
        "Matched on propensity score",
    ] {
        assert!(seen.contains(expected), "`{expected}` not visible:\n{seen}");
    }
}

// ---------------------------------------------------------------------------------------------
// One run at a time per output (the lock), forced reruns that never break the visible manifest,
// writability before work, design checks at the key's line, clear location errors.

/// The run id a run logs first ("[   0.4s] run 20261121T101500Z-4242: 2 analyses, …").
fn logged_run_id(lines: &[String]) -> String {
    lines
        .iter()
        .find_map(|l| {
            l.split("] run ")
                .nth(1)?
                .split(':')
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("no run line:\n{}", lines.join("\n")))
}

/// The run manifest of `out`, checked: every object it points to (the report, each unit's
/// manifest and each unit's result objects) exists with the recorded size, and each unit's
/// manifest is the one of the run the entry names.
fn consistent_manifest(out: &Path) -> serde_json::Value {
    let m = manifest(out);
    assert_eq!(m["status"], "complete", "{m}");
    let size_of = |rel: &str| {
        out.join(rel)
            .metadata()
            .unwrap_or_else(|e| panic!("{rel}: {e} (in {m})"))
            .len()
    };
    let report = &m["report"];
    assert_eq!(
        size_of(report["path"].as_str().unwrap()),
        report["size"].as_u64().unwrap()
    );
    for a in m["analyses"].as_array().unwrap() {
        let rel = a["manifest"]["path"].as_str().unwrap();
        assert_eq!(
            size_of(rel),
            a["manifest"]["size"].as_u64().unwrap(),
            "{rel}"
        );
        let am: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join(rel)).unwrap()).unwrap();
        assert_eq!(am["run_id"], a["run_id"], "{rel} belongs to another run");
        for (name, o) in am["objects"].as_object().unwrap() {
            let p = o["path"].as_str().unwrap();
            assert_eq!(size_of(p), o["size"].as_u64().unwrap(), "{name}: {p}");
        }
    }
    m
}

fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| {
            Command::new("hostname")
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        })
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// A process id that is not running any more.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

fn lock_json(pid: u32, host: &str, run_id: &str) -> String {
    serde_json::json!({
        "format": "epifusion-lock/1",
        "run_id": run_id,
        "pid": pid,
        "host": host,
        "started_at": "2025-01-01T00:00:00Z",
    })
    .to_string()
}

fn spawn_paused(args: &[&str], pause_ms: u64, env: &[(&str, String)]) -> std::process::Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_epifusion"));
    cmd.args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("EPIFUSION_TEST_PAUSE_MS", pause_ms.to_string())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

#[test]
fn a_second_run_on_a_locked_output_fails_at_once_and_the_first_completes() {
    let dir = temp_dir("concurrent");
    let file = small_pipeline(&dir, GOOD_SECOND);
    let out = dir.join("out");
    let mut first = spawn_paused(&["run", &file], 5000, &[]);
    let lines = stderr_lines(first.stderr.take().unwrap());
    let mut seen = wait_for_line(&lines, "[1/2] first: complete");
    let run_id = logged_run_id(&seen);

    // The second run stops before any analysis work, naming the lock, its holder and the fix.
    let second = epifusion(&["run", &file], &[]);
    let (_, e) = text(&second);
    assert!(!second.status.success(), "{e}");
    let lock = out.join("epifusion.lock").display().to_string();
    for expected in [
        "locked",
        lock.as_str(),
        run_id.as_str(),
        &format!("pid {}", first.id()),
        &format!("rm {lock}"),
    ] {
        assert!(e.contains(expected), "`{expected}` not in: {e}");
    }
    assert!(
        !e.contains("building the study tables") && !e.contains("fitting"),
        "the second run did analysis work: {e}"
    );

    // The first run completes undisturbed: every entry is its own, consistent; no lock left.
    let status = first.wait().unwrap();
    seen.extend(lines.iter());
    assert!(status.success(), "{}", seen.join("\n"));
    let m = consistent_manifest(&out);
    assert_eq!(m["run_id"], run_id.as_str());
    for a in m["analyses"].as_array().unwrap() {
        assert_eq!(a["run_id"], run_id.as_str(), "{m}");
        assert_eq!(a["skipped"], false, "{m}");
    }
    assert!(!out.join("epifusion.lock").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stale_lock_is_taken_over_and_a_live_or_foreign_one_stops_the_run() {
    let dir = temp_dir("stale");
    let file = small_pipeline(&dir, GOOD_SECOND);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let lock = out.join("epifusion.lock");
    let host = this_host();
    assert!(!host.is_empty());

    // A live process on this host holds it: refused, the lock is left as it was.
    let live = lock_json(std::process::id(), &host, "20250101T000000Z-live");
    std::fs::write(&lock, &live).unwrap();
    let o = epifusion(&["run", &file], &[]);
    let (_, e) = text(&o);
    assert!(!o.status.success());
    assert!(
        e.contains("20250101T000000Z-live")
            && e.contains(&format!("pid {}", std::process::id()))
            && e.contains(&format!("rm {}", lock.display())),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), live);

    // Another host's lock is never stale automatically, even with a pid unknown here.
    let foreign = lock_json(dead_pid(), "elsewhere.example", "20250101T000000Z-foreign");
    std::fs::write(&lock, &foreign).unwrap();
    let o = epifusion(&["run", &file], &[]);
    let (_, e) = text(&o);
    assert!(!o.status.success());
    assert!(
        e.contains("elsewhere.example") && e.contains("20250101T000000Z-foreign"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), foreign);
    // A dry run takes no lock and says who holds it.
    let stdout = ok(&epifusion(&["run", &file, "--dry-run"], &[]));
    assert!(
        stdout.contains("lock: run 20250101T000000Z-foreign"),
        "{stdout}"
    );
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), foreign);

    // A dead process on this host (kill -9, crash): taken over, said so, released at the end.
    let dead = dead_pid();
    std::fs::write(&lock, lock_json(dead, &host, "20250101T000000Z-dead")).unwrap();
    let o = epifusion(&["run", &file], &[]);
    let (_, e) = text(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains("taking over the stale lock")
            && e.contains("20250101T000000Z-dead")
            && e.contains(&format!("pid {dead} is not running")),
        "{e}"
    );
    assert!(!lock.exists());
    consistent_manifest(&out);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_forced_rerun_leaves_the_visible_manifest_intact() {
    let dir = temp_dir("killforce");
    let file = small_pipeline(&dir, GOOD_SECOND);
    let out = dir.join("out");
    ok(&epifusion(&["run", &file], &[]));
    let before = consistent_manifest(&out);

    // kill -9 of a --force rerun after it rewrote the first analysis.
    let mut child = spawn_paused(&["run", &file, "--force"], 60_000, &[]);
    let lines = stderr_lines(child.stderr.take().unwrap());
    wait_for_line(&lines, "[1/2] first: complete");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    // The visible manifest is the previous run's, and all it points to is intact.
    let after = consistent_manifest(&out);
    assert_eq!(after, before);
    assert!(
        out.join("epifusion.lock").exists(),
        "kill -9 leaves the lock"
    );

    // A plain rerun takes over the stale lock and completes: the first analysis from the killed
    // run (complete), the second from the first run; nothing else is left.
    let o = epifusion(&["run", &file], &[]);
    let (stdout, e) = text(&o);
    assert!(o.status.success(), "{e}");
    assert!(e.contains("taking over the stale lock"), "{e}");
    assert!(
        stdout.contains("(0 computed, 2 skipped as complete)"),
        "{stdout}"
    );
    let m = consistent_manifest(&out);
    assert_ne!(m["run_id"], before["run_id"]);
    assert_ne!(m["analyses"][0]["run_id"], before["analyses"][0]["run_id"]);
    assert_eq!(m["analyses"][1]["run_id"], before["analyses"][1]["run_id"]);
    for unit in ["first", "second"] {
        let runs = std::fs::read_dir(out.join("analyses").join(unit))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .count();
        assert_eq!(runs, 1, "{unit}: objects of replaced runs are removed");
    }
    assert!(!out.join("epifusion.lock").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_read_only_output_fails_before_any_analysis_work() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = temp_dir("readonly");
    let file = small_pipeline(&dir, GOOD_SECOND);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o555)).unwrap();
    // Root writes anywhere: then the run goes as `nobody`, with copies of the binary and the
    // store that `nobody` can read (the build and the clone may be under root's home).
    let as_root = std::fs::write(out.join("probe"), b"x").is_ok();
    let _ = std::fs::remove_file(out.join("probe"));
    let mut cmd = if as_root {
        let bin = dir.join("epifusion");
        std::fs::copy(env!("CARGO_BIN_EXE_epifusion"), &bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let store = dir.join("store");
        std::fs::create_dir_all(&store).unwrap();
        for entry in std::fs::read_dir(repo("data/gibleed")).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                let to = store.join(path.file_name().unwrap());
                std::fs::copy(&path, &to).unwrap();
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o644)).unwrap();
            }
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut cmd = Command::new(&bin);
        cmd.args(["run", &file, "--omop", &store.display().to_string()])
            .current_dir(&dir)
            .uid(65534)
            .gid(65534);
        cmd
    } else {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_epifusion"));
        cmd.args(["run", &file])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        cmd
    };
    let o = cmd.output().unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_, e) = text(&o);
    assert!(!o.status.success(), "{e}");
    assert!(
        e.contains("epifusion.lock") && e.contains("writable"),
        "{e}"
    );
    assert!(
        !e.contains("building the study tables") && !e.contains("fitting"),
        "analysis work before the output was found unwritable: {e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// 1-based line of the first `needle` in `text`.
fn line_of(text: &str, needle: &str) -> usize {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("`{needle}` not in the file"));
    text[..at].matches('\n').count() + 1
}

#[test]
fn design_settings_fail_the_dry_run_at_the_line_of_their_key() {
    let dir = temp_dir("designs");
    let gibleed = std::fs::read_to_string(repo("pipelines/gibleed.toml")).unwrap();
    let store = repo("data/gibleed");
    let out = dir.join("out").display().to_string();
    // (what, replaced by, the key named in the error)
    for (i, (from, to, key)) in [
        (
            "risk_window_end = 365",
            "risk_window_end = -5",
            "cohort.risk_window_end",
        ),
        (
            "washout_days = 365",
            "washout_days = -365",
            "cohort.washout_days",
        ),
        ("gender = false", "gendr = false", "cohort.covariates.gendr"),
        ("end = 30", "edn = 30", "sccs.risk_windows[0].edn"),
        (
            "end = 30\nend_anchor = \"era_end\"",
            "end = -30\nend_anchor = \"era_start\"",
            "sccs.risk_windows[0].end",
        ),
        // Split windows: offsets not increasing, and beyond a fixed-length window (0 to 30
        // days after the era start: 31 days).
        (
            "end = 30",
            "split_points = [15, 10]\nend = 30",
            "sccs.risk_windows[0].split_points",
        ),
        (
            "end = 30\nend_anchor = \"era_end\"",
            "split_points = [15, 31]\nend = 30\nend_anchor = \"era_start\"",
            "sccs.risk_windows[0].split_points",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let body = gibleed.replacen(from, to, 1);
        let name = format!("bad{i}.toml");
        let path = dir.join(&name);
        std::fs::write(&path, &body).unwrap();
        let o = epifusion(
            &[
                "run",
                &path.display().to_string(),
                "--omop",
                &store,
                "--output",
                &out,
                "--dry-run",
            ],
            &[],
        );
        let (_, e) = text(&o);
        assert!(!o.status.success(), "{to}: {e}");
        let line = line_of(&body, to.lines().next().unwrap());
        assert!(
            e.contains(&format!("{name}:{line}:")) && e.contains(key),
            "{to}: expected {name}:{line} and `{key}` in: {e}"
        );
    }
    assert!(!dir.join("out").exists(), "nothing was written");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_report_id_without_a_coefficient_is_a_warning_in_the_output_and_the_report() {
    let dir = temp_dir("reportid");
    let file = small_pipeline(&dir, GOOD_SECOND);
    let body = std::fs::read_to_string(&file).unwrap().replacen(
        "model = \"logistic\"",
        "model = \"logistic\"\nreport = [424242]",
        1,
    );
    std::fs::write(&file, &body).unwrap();
    let line = line_of(&body, "report = [424242]");
    let o = epifusion(&["run", &file], &[]);
    let (stdout, e) = text(&o);
    assert!(o.status.success(), "{e}");
    let expected = format!("small.toml:{line}:");
    for log in [&stdout, &e] {
        assert!(
            log.contains("warning") && log.contains(&expected) && log.contains("424242"),
            "{log}"
        );
    }
    let html = std::fs::read_to_string(dir.join("out/report.html")).unwrap();
    assert!(
        html.contains("class=\"warning\"") && html.contains("covariate 424242 is not among"),
        "{html}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unsupported_url_schemes_and_an_empty_omop_are_clear_errors() {
    for omop in ["ftp://example.com/cdm", "foo://", "hdfs://namenode/cdm"] {
        for args in [
            vec!["sql", "--omop", omop, "-c", "SELECT 1"],
            vec!["run", "pipelines/gibleed.toml", "--omop", omop, "--dry-run"],
        ] {
            let o = epifusion(&args, &[]);
            let (_, e) = text(&o);
            assert!(!o.status.success(), "{args:?}: {e}");
            assert!(
                e.contains("unsupported URL scheme") && !e.contains("Internal error"),
                "{args:?}: {e}"
            );
        }
    }
    for args in [
        vec!["sql", "--omop", "", "-c", "SELECT 1"],
        vec!["run", "pipelines/gibleed.toml", "--omop", "", "--dry-run"],
    ] {
        let started = Instant::now();
        let o = epifusion(&args, &[]);
        let (_, e) = text(&o);
        assert!(!o.status.success(), "{args:?}: {e}");
        assert!(e.contains("empty"), "{args:?}: {e}");
        assert!(started.elapsed() < Duration::from_secs(30), "{args:?}");
    }
    let o = epifusion(
        &["run", "pipelines/gibleed.toml", "--output", "ftp://h/x"],
        &[],
    );
    let (_, e) = text(&o);
    assert!(
        !o.status.success() && e.contains("unsupported URL scheme"),
        "{e}"
    );
}

/// PUT `body` at `key` in `bucket` (asked of moto directly).
fn put_key(port: u16, bucket: &str, key: &str, body: &str) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "PUT /{bucket}/{key} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "put {key}: {resp}");
}

#[test]
fn the_s3_output_is_locked_with_a_conditional_put() {
    let Some(moto) = start_moto() else { return };
    create_bucket(moto.port, "locks");
    let env = s3_env(moto.port);
    let dir = temp_dir("s3lock");
    let file = small_pipeline(&dir, GOOD_SECOND);
    let url = "s3://locks/study";

    // Two runs: the second's `If-None-Match: *` PUT of the lock fails, and it stops at once.
    let mut first = spawn_paused(&["run", &file, "--output", url], 5000, &env);
    let lines = stderr_lines(first.stderr.take().unwrap());
    let mut seen = wait_for_line(&lines, "[1/2] first: complete");
    let run_id = logged_run_id(&seen);
    assert!(list_keys(moto.port, "locks", "study/").contains(&"study/epifusion.lock".into()));
    let second = epifusion(&["run", &file, "--output", url], &env);
    let (_, e) = text(&second);
    assert!(!second.status.success(), "{e}");
    assert!(
        e.contains("s3://locks/study/epifusion.lock")
            && e.contains(&run_id)
            && e.contains("delete the object"),
        "{e}"
    );
    assert!(!e.contains("building the study tables"), "{e}");
    let status = first.wait().unwrap();
    seen.extend(lines.iter());
    assert!(status.success(), "{}", seen.join("\n"));
    let keys = list_keys(moto.port, "locks", "study/");
    assert!(keys.contains(&"study/manifest.json".into()), "{keys:?}");
    assert!(!keys.contains(&"study/epifusion.lock".into()), "{keys:?}");

    // A stale lock object of this host (a killed run) is taken over with a conditional PUT.
    let dead = dead_pid();
    put_key(
        moto.port,
        "locks",
        "study/epifusion.lock",
        &lock_json(dead, &this_host(), "20250101T000000Z-dead"),
    );
    let o = epifusion(&["run", &file, "--output", url, "--force"], &env);
    let (_, e) = text(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains("taking over the stale lock") && e.contains(&format!("pid {dead}")),
        "{e}"
    );
    assert!(!list_keys(moto.port, "locks", "study/").contains(&"study/epifusion.lock".into()));

    // A store without conditional writes (object_store answers NotImplemented): refused unless
    // --no-lock, which warns.
    let mut no_conditional = env.clone();
    no_conditional.push(("AWS_CONDITIONAL_PUT", "disabled".into()));
    let o = epifusion(
        &["run", &file, "--output", "s3://locks/plain"],
        &no_conditional,
    );
    let (_, e) = text(&o);
    assert!(!o.status.success(), "{e}");
    assert!(
        e.contains("conditional writes") && e.contains("--no-lock"),
        "{e}"
    );
    assert!(list_keys(moto.port, "locks", "plain/").is_empty());
    let o = epifusion(
        &["run", &file, "--output", "s3://locks/plain", "--no-lock"],
        &no_conditional,
    );
    let (_, e) = text(&o);
    assert!(o.status.success(), "{e}");
    assert!(e.contains("warning: --no-lock"), "{e}");
    let keys = list_keys(moto.port, "locks", "plain/");
    assert!(keys.contains(&"plain/manifest.json".into()), "{keys:?}");
    assert!(
        !keys
            .iter()
            .any(|k| k.contains("lock") || k.contains("write-check")),
        "{keys:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

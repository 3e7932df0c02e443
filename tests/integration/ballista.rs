//! A Ballista cluster of real processes on 127.0.0.1 — `epifusion scheduler` and two
//! `epifusion executor`s on free ports, started and stopped by the test — against the local
//! run: a `GROUP BY` fit over 150 groups and a table-function fit give identical results (every
//! value, bit for bit), and study builds run on an executor reading the OMOP store themselves; refusals (`design_matrix`, `@name`, another client version, input
//! queries that write) are clear errors; an executor killed mid-query gives a clear error or the right result; executors
//! clean their work dirs when they stop; `epifusion run --cluster` builds and fits the GiBleed
//! pipeline's units on the executors with the local run's results.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use datafusion::prelude::SessionContext;
use epifusion::cluster::cluster_session;
use epifusion::engine::session::{new_session, SessionOptions};

/// A child process, stopped (SIGTERM, then killed) when dropped.
struct Node {
    child: Child,
    name: String,
}

impl Node {
    fn start(name: &str, args: &[String], log: &Path) -> Node {
        let log = std::fs::File::create(log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_epifusion"))
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        Node {
            child,
            name: name.to_string(),
        }
    }

    /// SIGTERM and wait (up to 30 s) for a clean exit.
    fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("{} did not stop on SIGTERM; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Free ports on 127.0.0.1 (held together while chosen, so they differ).
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

fn wait_for_port(port: u16, what: &str, node: &mut Node) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = node.child.try_wait() {
            panic!("{what} exited: {status}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{what} is not listening on {port} after 60 s");
}

/// A scheduler and two executors (2 task slots each), each executor with its own work dir.
struct Cluster {
    scheduler: Node,
    executors: Vec<Node>,
    work_dirs: Vec<PathBuf>,
    url: String,
}

fn start_cluster(dir: &Path) -> Cluster {
    let ports = free_ports(5);
    let mut scheduler = Node::start(
        "scheduler",
        &[
            "scheduler".to_string(),
            "--bind".to_string(),
            format!("127.0.0.1:{}", ports[0]),
        ],
        &dir.join("scheduler.log"),
    );
    wait_for_port(ports[0], "the scheduler", &mut scheduler);
    let mut executors = Vec::new();
    let mut work_dirs = Vec::new();
    for i in 0..2 {
        let work = dir.join(format!("work{i}"));
        let (flight, grpc) = (ports[1 + 2 * i], ports[2 + 2 * i]);
        let mut node = Node::start(
            &format!("executor {i}"),
            &[
                "executor".to_string(),
                "--scheduler".to_string(),
                format!("127.0.0.1:{}", ports[0]),
                "--bind".to_string(),
                format!("127.0.0.1:{flight}"),
                "--grpc-port".to_string(),
                grpc.to_string(),
                "--concurrent-tasks".to_string(),
                "2".to_string(),
                "--work-dir".to_string(),
                work.display().to_string(),
            ],
            &dir.join(format!("executor{i}.log")),
        );
        wait_for_port(flight, "an executor", &mut node);
        executors.push(node);
        work_dirs.push(work);
    }
    Cluster {
        scheduler,
        executors,
        work_dirs,
        url: format!("df://127.0.0.1:{}", ports[0]),
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for e in &mut self.executors {
            e.terminate();
        }
        self.scheduler.terminate();
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// 150 groups of 40 subjects: two binary covariates, exponential times with random censoring.
fn write_data(dir: &Path) -> PathBuf {
    let mut rng = Rng(17);
    let mut csv = String::from("row_id,g,time,y,x1,x2\n");
    let mut row = 0;
    for g in 0..150 {
        for _ in 0..40 {
            row += 1;
            let x1 = f64::from(rng.next() < 0.5);
            let x2 = f64::from(rng.next() < 0.3);
            let rate = (0.5 * x1 - 0.3 * x2).exp();
            let t = (-(1.0 - rng.next()).ln() / rate * 100.0).ceil().max(1.0);
            let c = (rng.next() * 150.0).ceil().max(1.0);
            let (time, y) = if t <= c { (t, 1) } else { (c, 0) };
            csv.push_str(&format!("{row},{g},{time},{y},{x1},{x2}\n"));
        }
    }
    let path = dir.join("cohort.csv");
    std::fs::write(&path, csv).expect("write data");
    path
}

fn ddl(path: &Path) -> String {
    format!(
        "CREATE EXTERNAL TABLE cohort (row_id BIGINT, g BIGINT, time DOUBLE, y DOUBLE, \
         x1 DOUBLE, x2 DOUBLE) STORED AS CSV LOCATION '{}' OPTIONS ('format.has_header' 'true')",
        path.display()
    )
}

const GROUP_FITS: &str = "
SELECT g, c['covariate_id'] AS covariate_id, c['estimate'] AS estimate,
       c['std_error'] AS std_error, c['log_likelihood'] AS log_likelihood,
       c['iterations'] AS iterations, c['status'] AS status
FROM (SELECT g, unnest(fit) AS c FROM (
  SELECT g, cox_fit_agg(CAST(NULL AS BIGINT), time, y,
                        make_array(CAST(1 AS BIGINT), CAST(2 AS BIGINT)), make_array(x1, x2),
                        '{\"ci\": \"none\"}') AS fit
  FROM cohort GROUP BY g))
ORDER BY g, covariate_id";

const TABLE_FIT: &str = "
SELECT covariate_id, estimate, std_error, ci_lower, ci_upper, log_likelihood, iterations, status
FROM cox_fit(
  'SELECT row_id, g % 7 AS stratum_id, time, y FROM cohort',
  'SELECT row_id, 1 AS covariate_id, x1 AS covariate_value FROM cohort WHERE x1 <> 0
   UNION ALL SELECT row_id, 2, x2 FROM cohort WHERE x2 <> 0',
  '{\"prior\": \"normal\", \"variance\": 1.0, \"exclude\": [1]}')
ORDER BY covariate_id";

const UNION_ORDERED: &str = "
SELECT 1 AS step, x1 AS k, count(*) AS n FROM cohort GROUP BY x1
UNION ALL SELECT 2, x1, count(*) FROM cohort WHERE y = 1 GROUP BY x1
UNION ALL SELECT 3, x1, count(*) FROM cohort WHERE x2 = 1 GROUP BY x1
UNION ALL SELECT 4, x1, count(*) FROM cohort WHERE time > 50 GROUP BY x1
ORDER BY step, k DESC";

async fn run(ctx: &SessionContext, sql: &str) -> datafusion::error::Result<RecordBatch> {
    let df = ctx.sql(sql).await?;
    let schema = df.schema().as_arrow().clone();
    let batches = df.collect().await?;
    Ok(concat_batches(&std::sync::Arc::new(schema), &batches)?)
}

/// Same columns, same types, same values (bit for bit; NULLs in the same places).
fn assert_identical(local: &RecordBatch, cluster: &RecordBatch, what: &str) {
    assert_eq!(local.num_rows(), cluster.num_rows(), "{what}: row counts");
    assert_eq!(local.num_columns(), cluster.num_columns(), "{what}");
    for i in 0..local.num_columns() {
        let name = local.schema().field(i).name().clone();
        assert_eq!(
            local.column(i).to_data(),
            cluster.column(i).to_data(),
            "{what}: column {name} differs"
        );
    }
}

fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("epi_ballista_{name}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test dir");
    dir
}

fn logs(dir: &Path) -> String {
    ["scheduler.log", "executor0.log", "executor1.log"]
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            format!(
                "--- {f}\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fits_on_a_two_executor_cluster_match_the_local_run() {
    let dir = test_dir("fits");
    let data = write_data(&dir);
    let cluster = start_cluster(&dir);
    let local = new_session(&SessionOptions::default()).await.unwrap();
    local.sql(&ddl(&data)).await.unwrap();
    let remote = cluster_session(&cluster.url, &SessionOptions::default())
        .await
        .unwrap();
    remote.sql(&ddl(&data)).await.unwrap();

    // (a) One Cox model per group, 150 groups, hash-partitioned across the executors.
    let want = run(&local, GROUP_FITS).await.unwrap();
    assert_eq!(want.num_rows(), 300, "150 groups × 2 coefficients");
    let got = run(&remote, GROUP_FITS)
        .await
        .unwrap_or_else(|e| panic!("cluster GROUP BY fit: {e}\n{}", logs(&dir)));
    assert_identical(&want, &got, "GROUP BY cox_fit_agg");

    // (b) A table-function fit: its inputs planned by the client, the fit on an executor.
    let want = run(&local, TABLE_FIT).await.unwrap();
    assert_eq!(want.num_rows(), 2);
    let got = run(&remote, TABLE_FIT)
        .await
        .unwrap_or_else(|e| panic!("cluster cox_fit: {e}\n{}", logs(&dir)));
    assert_identical(&want, &got, "cox_fit");

    // (c) Plain SQL of the shape of an attrition table: aggregates under a UNION ALL, ordered.
    // Ballista 55's adaptive planner never finished this job (its rebuilt last stage failed a
    // sanity check); the static planner, which the client and the nodes use, returns the
    // local rows in the local order. A time limit turns a stalled job into a failure.
    let want = run(&local, UNION_ORDERED).await.unwrap();
    assert_eq!(want.num_rows(), 8, "4 steps × 2 values of x1");
    let got = tokio::time::timeout(Duration::from_secs(120), run(&remote, UNION_ORDERED))
        .await
        .unwrap_or_else(|_| panic!("UNION ALL … ORDER BY: no result in 120 s\n{}", logs(&dir)))
        .unwrap_or_else(|e| panic!("UNION ALL … ORDER BY: {e}\n{}", logs(&dir)));
    assert_identical(&want, &got, "UNION ALL … ORDER BY");

    // Refused with a clear error: design matrices (session memory) and study builds.
    let e = run(
        &remote,
        "SELECT * FROM design_matrix('SELECT row_id, time, y FROM cohort', \
         'SELECT row_id, 1 AS covariate_id FROM cohort', '{\"name\": \"m\"}')",
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(e.contains("cannot run on a cluster"), "{e}");
    let e = run(&remote, "SELECT * FROM cox_fit('@m')")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("@m") && e.contains("cluster"), "{e}");

    // Input queries stay read-only on the cluster path too: a COPY or an INSERT given as a
    // table function's input is refused before anything runs, and nothing is written.
    let sink = dir.join("sink");
    std::fs::create_dir_all(&sink).unwrap();
    remote
        .sql(&format!(
            "CREATE EXTERNAL TABLE sink (a BIGINT) STORED AS CSV LOCATION '{}/'",
            sink.display()
        ))
        .await
        .unwrap();
    let copied = dir.join("copied.csv");
    for input in [
        format!(
            "COPY (SELECT 1 AS row_id) TO ''{}'' STORED AS CSV",
            copied.display()
        ),
        "INSERT INTO sink VALUES (1)".to_string(),
    ] {
        let sql = format!(
            "SELECT * FROM cox_fit('{input}', \
             'SELECT row_id, 1 AS covariate_id, x1 AS covariate_value FROM cohort', '{{}}')"
        );
        let e = run(&remote, &sql).await.unwrap_err().to_string();
        assert!(e.contains("read-only"), "{input}: {e}");
    }
    assert!(!copied.exists(), "COPY wrote {}", copied.display());
    let written: Vec<_> = std::fs::read_dir(&sink).unwrap().collect();
    assert!(written.is_empty(), "INSERT wrote {written:?}");

    // A client of another version is refused by the scheduler, naming both versions.
    remote
        .sql("SET epifusion.version = '0.0.0-other'")
        .await
        .unwrap();
    let e = run(&remote, GROUP_FITS).await.unwrap_err().to_string();
    assert!(
        e.contains("0.0.0-other") && e.contains(env!("CARGO_PKG_VERSION")),
        "{e}"
    );

    // Executors remove their jobs' shuffle files when they stop.
    let work_dirs = cluster.work_dirs.clone();
    drop(cluster);
    for w in work_dirs {
        let left: Vec<_> = std::fs::read_dir(&w)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.path().is_dir())
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "{} still holds {left:?}", w.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_killed_mid_query_gives_an_error_or_the_right_result() {
    let dir = test_dir("kill");
    let data = write_data(&dir);
    let mut cluster = start_cluster(&dir);
    let local = new_session(&SessionOptions::default()).await.unwrap();
    local.sql(&ddl(&data)).await.unwrap();
    let remote = cluster_session(&cluster.url, &SessionOptions::default())
        .await
        .unwrap();
    remote.sql(&ddl(&data)).await.unwrap();
    // Slower fits (10-fold CV per group) so that the kill lands while tasks run.
    let sql = GROUP_FITS.replace(
        "{\"ci\": \"none\"}",
        "{\"ci\": \"none\", \"prior\": \"normal\", \"cv\": {\"folds\": 10, \"search\": \"grid\", \"grid\": [0.1, 1, 10]}}",
    );
    let want = run(&local, &sql).await.unwrap();
    let query = {
        let remote = remote.clone();
        let sql = sql.clone();
        tokio::spawn(async move { run(&remote, &sql).await })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _ = cluster.executors[1].child.kill();
    let _ = cluster.executors[1].child.wait();
    match tokio::time::timeout(Duration::from_secs(240), query).await {
        Err(_) => panic!(
            "the query neither finished nor failed 240 s after an executor was killed\n{}",
            logs(&dir)
        ),
        Ok(joined) => match joined.expect("query task") {
            Ok(got) => assert_identical(&want, &got, "GROUP BY fit after a lost executor"),
            Err(e) => {
                let e = e.to_string();
                assert!(!e.trim().is_empty());
                eprintln!("killed executor → error: {e}");
            }
        },
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A study build runs on an executor, reading the client's OMOP store itself (its tables travel
/// as plans): the same intervals, covariates, attrition, diagnostics and fits as the local run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn study_builds_on_a_two_executor_cluster_match_the_local_run() {
    let dir = test_dir("study");
    let cluster = start_cluster(&dir);
    let store = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/synthea27nj");
    let opts = SessionOptions {
        omop: Some(store.display().to_string()),
        batch_size: None,
    };
    let local = new_session(&opts).await.unwrap();
    let remote = cluster_session(&cluster.url, &opts).await.unwrap();
    // A table held in the client's memory cannot travel; the builds do not need it.
    for ctx in [&local, &remote] {
        ctx.sql("CREATE TABLE scratch AS VALUES (1)").await.unwrap();
    }
    let top = |sql: &str| {
        let local = local.clone();
        let sql = sql.to_string();
        async move {
            let b = run(&local, &sql).await.unwrap();
            b.column(0)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Int64Array>()
                .expect("BIGINT concept ids")
                .values()
                .to_vec()
        }
    };
    let drugs = top("SELECT drug_concept_id FROM drug_exposure WHERE drug_concept_id <> 0 GROUP BY 1 ORDER BY count(DISTINCT person_id) DESC, 1 LIMIT 2").await;
    let conds = top("SELECT condition_concept_id FROM condition_occurrence WHERE condition_concept_id <> 0 GROUP BY 1 ORDER BY count(DISTINCT person_id) DESC, 1 LIMIT 1").await;
    let sccs = format!(
        r#"{{"outcome": {{"concept_ids": [{}]}}, "exposures": [{{"concept_ids": [{}], "domain": "derived_drug_era", "persistence_days": 30}}], "age_group_starts": [7300, 14600]}}"#,
        conds[0], drugs[0]
    );
    let cohort = format!(
        r#"{{"target": {{"concept_ids": [{}], "domain": "derived_drug_era"}}, "comparator": {{"concept_ids": [{}], "domain": "derived_drug_era"}},
            "outcome": {{"concept_ids": [{}]}}, "competing": {{"death": true}}, "model": "fine_gray",
            "remove_subjects_with_prior_outcome": false, "risk_window_end": 3650, "end_anchor": "cohort_start"}}"#,
        drugs[0], drugs[1], conds[0]
    );
    // The same cohort with the common period (a step across persons, applied in the merge)
    // and duplicate subjects' first cohort kept.
    let common = cohort.replacen(
        "\"model\"",
        "\"restrict_to_common_period\": true, \"remove_duplicate_subjects\": \"keep_first\", \"model\"",
        1,
    );
    let (q, c) = (sccs.replace('\'', "''"), cohort.replace('\'', "''"));
    let c2 = common.replace('\'', "''");
    let queries = [
        // The --omop tables are in the cluster session, and executors read them.
        (
            "the store",
            "SELECT gender_concept_id, count(*) AS n, min(year_of_birth) AS first \
             FROM person GROUP BY 1 ORDER BY 1"
                .to_string(),
        ),
        (
            "sccs_intervals",
            format!("SELECT * FROM sccs_intervals('{q}') ORDER BY row_id"),
        ),
        (
            "sccs_covariates",
            format!("SELECT * FROM sccs_covariates('{q}') ORDER BY row_id, covariate_id"),
        ),
        (
            "sccs_attrition",
            format!("SELECT * FROM sccs_attrition('{q}')"),
        ),
        (
            "sccs_diagnostics",
            format!("SELECT * FROM sccs_diagnostics('{q}') ORDER BY diagnostic"),
        ),
        (
            "cohort_outcomes",
            format!("SELECT * FROM cohort_outcomes('{c}') ORDER BY row_id"),
        ),
        // The cohort tables are distributed queries under a merge (`cohort_parts`), in the
        // local build's row order (no ORDER BY).
        (
            "cohort_covariates",
            format!("SELECT * FROM cohort_covariates('{c}')"),
        ),
        (
            "cohort_covariate_ref",
            format!("SELECT * FROM cohort_covariate_ref('{c}')"),
        ),
        (
            "cohort_attrition",
            format!("SELECT * FROM cohort_attrition('{c}')"),
        ),
        (
            "cohort_outcomes, common period",
            format!("SELECT * FROM cohort_outcomes('{c2}')"),
        ),
        (
            "cohort_covariate_ref, common period",
            format!("SELECT * FROM cohort_covariate_ref('{c2}')"),
        ),
        (
            "cohort_attrition, common period",
            format!("SELECT * FROM cohort_attrition('{c2}')"),
        ),
        (
            "sccs_fit over the builds",
            format!(
                "SELECT covariate_id, estimate, std_error, log_likelihood, iterations, status \
                 FROM sccs_fit('SELECT * FROM sccs_intervals(''{}'')', \
                 'SELECT * FROM sccs_covariates(''{}'')', '{{\"ci\": \"wald\"}}') \
                 ORDER BY covariate_id",
                q.replace('\'', "''"),
                q.replace('\'', "''")
            ),
        ),
        (
            "sccs_time_to_event",
            format!("SELECT * FROM sccs_time_to_event('{q}') ORDER BY exposure_index, week"),
        ),
    ];
    for (what, sql) in &queries {
        let want = run(&local, sql).await.unwrap();
        assert!(want.num_rows() > 0, "{what}: the local run is empty");
        let got = run(&remote, sql)
            .await
            .unwrap_or_else(|e| panic!("cluster {what}: {e}\n{}", logs(&dir)));
        assert_identical(&want, &got, what);
    }
    // More partitions than the executors' task slots: each task of a stage runs one partition
    // of plans with windows and sorts under UNION ALL (a shape that once stopped debug-built
    // executors); a task that never finishes fails the test instead of hanging it.
    remote
        .sql("SET datafusion.execution.target_partitions = 7")
        .await
        .unwrap();
    for (what, sql) in queries.iter().skip(5).take(7) {
        let want = run(&local, sql).await.unwrap();
        let got = tokio::time::timeout(std::time::Duration::from_secs(300), run(&remote, sql))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "cluster {what}, 7 partitions: no result in 300 s\n{}",
                    logs(&dir)
                )
            })
            .unwrap_or_else(|e| panic!("cluster {what}, 7 partitions: {e}\n{}", logs(&dir)));
        assert_identical(&want, &got, &format!("{what}, 7 partitions"));
    }
    remote
        .sql("SET datafusion.execution.target_partitions = 2")
        .await
        .unwrap();

    // A session with no table that can travel gets a clear error before anything runs; a
    // build that needs a table left behind names it.
    let bare = cluster_session(&cluster.url, &SessionOptions::default())
        .await
        .unwrap();
    let e = run(&bare, &format!("SELECT * FROM sccs_intervals('{q}')"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sccs_intervals on a cluster") && e.contains("--omop"),
        "{e}"
    );
    remote
        .sql("CREATE TABLE picked AS SELECT * FROM person LIMIT 5")
        .await
        .unwrap();
    let sql_outcome = format!(
        r#"{{"outcome": {{"sql": "SELECT o.person_id, o.condition_concept_id AS concept_id, o.condition_start_date AS start_date, o.condition_end_date AS end_date FROM condition_occurrence o JOIN picked p ON p.person_id = o.person_id"}}, "exposures": [{{"concept_ids": [{}], "domain": "derived_drug_era", "persistence_days": 30}}]}}"#,
        drugs[0]
    );
    let e = run(
        &remote,
        &format!(
            "SELECT * FROM sccs_intervals('{}')",
            sql_outcome.replace('\'', "''")
        ),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`picked`") && e.contains("cannot be sent to the executors"),
        "{e}"
    );
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `pipelines/{name}.toml` with `line` added after each of its `count` occurrences of
/// `marker`, written to `dir`, run locally and on the cluster at `url` (each computing its
/// `units`): the number of result tables found identical ([`assert_same_results`]).
async fn variant_matches(
    dir: &Path,
    url: &str,
    name: &str,
    marker: &str,
    count: usize,
    line: &str,
    units: usize,
) -> usize {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("pipelines/{name}.toml")),
    )
    .unwrap();
    assert_eq!(text.matches(marker).count(), count, "{name}: {marker}");
    let path = dir.join(format!("{name}_variant.toml"));
    std::fs::write(&path, text.replace(marker, &format!("{marker}{line}"))).unwrap();
    let (file, omop) = (
        path.display().to_string(),
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data/gibleed")
            .display()
            .to_string(),
    );
    let (local, cluster) = (
        dir.join(format!("local_{name}_variant")),
        dir.join(format!("cluster_{name}_variant")),
    );
    let computed = format!("({units} computed, 0 skipped");
    let stdout = run_pipeline(&file, &local, &["--omop", &omop]);
    assert!(stdout.contains(&computed), "{stdout}");
    let stdout = run_pipeline(&file, &cluster, &["--omop", &omop, "--cluster", url]);
    assert!(stdout.contains(&computed), "{stdout}\n{}", logs(dir));
    assert_same_results(&local, &cluster).await
}

/// `epifusion run FILE --output OUT [more]` from the repository root; its standard output.
fn run_pipeline(file: &str, out: &Path, more: &[&str]) -> String {
    let o = out.display().to_string();
    let mut args = vec!["run", file, "--output", &o];
    args.extend(more);
    let output = Command::new(env!("CARGO_BIN_EXE_epifusion"))
        .args(&args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run epifusion");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    );
    assert!(
        output.status.success(),
        "epifusion {args:?} failed:\nstdout: {stdout}\nstderr: {stderr}"
    );
    stdout
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{path:?}: {e}")))
        .unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// The analysis units of the run manifest in `out`: id → its manifest.
fn unit_manifests(out: &Path) -> Vec<(String, serde_json::Value)> {
    let m = json(&out.join("manifest.json"));
    assert_eq!(m["status"], "complete", "{m}");
    m["analyses"]
        .as_array()
        .expect("analyses")
        .iter()
        .map(|a| {
            (
                a["id"].as_str().unwrap().to_string(),
                json(&out.join(a["manifest"]["path"].as_str().unwrap())),
            )
        })
        .collect()
}

/// A Parquet object of a run, whole, without the columns that time the run.
async fn result_table(ctx: &SessionContext, path: &Path) -> RecordBatch {
    let df = ctx
        .read_parquet(
            path.display().to_string(),
            datafusion::prelude::ParquetReadOptions::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let schema = df.schema().as_arrow().clone();
    let batches = df.collect().await.unwrap();
    let all = concat_batches(&std::sync::Arc::new(schema), &batches).unwrap();
    let keep: Vec<usize> = all
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| !f.name().ends_with("seconds"))
        .map(|(i, _)| i)
        .collect();
    all.project(&keep).unwrap()
}

/// Every result table of every unit of the runs in `local_out` and `cluster_out` is the same
/// (bit for bit, timing columns and the metadata table aside); the number of tables compared.
async fn assert_same_results(local_out: &Path, cluster_out: &Path) -> usize {
    let local = unit_manifests(local_out);
    let remote = unit_manifests(cluster_out);
    assert_eq!(
        local.iter().map(|(id, _)| id).collect::<Vec<_>>(),
        remote.iter().map(|(id, _)| id).collect::<Vec<_>>()
    );
    let ctx = SessionContext::new();
    let mut compared = 0;
    for ((id, l), (_, r)) in local.iter().zip(&remote) {
        assert_eq!(l["summary"]["status"], r["summary"]["status"], "{id}");
        assert_eq!(l["summary"]["outcome_rows"], r["summary"]["outcome_rows"]);
        assert_eq!(l["fingerprint"], r["fingerprint"], "{id}");
        let objects = l["objects"].as_object().unwrap();
        assert_eq!(
            objects.keys().collect::<Vec<_>>(),
            r["objects"].as_object().unwrap().keys().collect::<Vec<_>>(),
            "{id}: the same tables"
        );
        for (name, o) in objects {
            if name == "metadata" {
                continue;
            }
            let a = result_table(&ctx, &local_out.join(o["path"].as_str().unwrap())).await;
            let b = result_table(
                &ctx,
                &cluster_out.join(r["objects"][name]["path"].as_str().unwrap()),
            )
            .await;
            assert_identical(&a, &b, &format!("{id}: {name}"));
            compared += 1;
        }
    }
    compared
}

/// The bundled GiBleed pipeline (Cox, Fine–Gray and an SCCS unit over two exposures) with
/// `run --cluster`: every unit's build queries run as distributed plans and its fit on an
/// executor (all three at once, then one at a time with `--cluster-units 1`), and every result
/// table (estimates, attrition, covariate reference, diagnostics and the designs' extra tables)
/// is identical to the local run's, bit for bit; resume works as locally. The same for the
/// study written as SQL designs (distributed, and built in the task when a setup does more than
/// define views) and for its SCCS analysis with `restrict_time_to_exposure`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gibleed_pipeline_on_a_two_executor_cluster_matches_the_local_run() {
    let dir = test_dir("pipeline");
    let cluster = start_cluster(&dir);
    let (local_out, cluster_out) = (dir.join("local"), dir.join("cluster"));
    let stdout = run_pipeline("pipelines/gibleed.toml", &local_out, &[]);
    assert!(stdout.contains("(3 computed, 0 skipped"), "{stdout}");
    let url = cluster.url.clone();
    let stdout = run_pipeline("pipelines/gibleed.toml", &cluster_out, &["--cluster", &url]);
    assert!(
        stdout.contains("(3 computed, 0 skipped"),
        "{stdout}\n{}",
        logs(&dir)
    );
    let compared = assert_same_results(&local_out, &cluster_out).await;
    assert!(compared >= 12, "{compared} tables compared");
    // A rerun on the cluster skips every complete unit; --force recomputes them one at a time.
    let stdout = run_pipeline("pipelines/gibleed.toml", &cluster_out, &["--cluster", &url]);
    assert!(stdout.contains("(0 computed, 3 skipped"), "{stdout}");
    let stdout = run_pipeline(
        "pipelines/gibleed.toml",
        &cluster_out,
        &["--cluster", &url, "--cluster-units", "1", "--force"],
    );
    assert!(stdout.contains("(3 computed, 0 skipped"), "{stdout}");
    assert_eq!(
        assert_same_results(&local_out, &cluster_out).await,
        compared
    );
    // The same study as SQL designs: each unit's setup (views only) runs in the client's
    // cluster session, over the concept sets' views, and its queries run as distributed plans
    // (the attrition query as a query of the client's).
    let (local_sql, cluster_sql) = (dir.join("local_sql"), dir.join("cluster_sql"));
    let stdout = run_pipeline("pipelines/gibleed_sql.toml", &local_sql, &[]);
    assert!(stdout.contains("(4 computed, 0 skipped"), "{stdout}");
    let stdout = run_pipeline(
        "pipelines/gibleed_sql.toml",
        &cluster_sql,
        &["--cluster", &url],
    );
    assert!(
        stdout.contains("(4 computed, 0 skipped"),
        "{stdout}\n{}",
        logs(&dir)
    );
    assert!(assert_same_results(&local_sql, &cluster_sql).await >= 16);
    // SQL designs whose setup does more than define views (here a setting) are built inside
    // their task, on one executor: the same results as locally too.
    let set = "SET datafusion.execution.batch_size = 4096;\n";
    let marker = "setup = \"\"\"\n";
    assert!(variant_matches(&dir, &url, "gibleed_sql", marker, 3, set, 4).await >= 16);
    // The SCCS analysis with `restrict_time_to_exposure` (each exposure's own study period, so
    // its own population): each exposure's build queries run distributed.
    let restrict = "restrict_time_to_exposure = 0\n";
    let marker = "[analysis.sccs]\n";
    assert!(variant_matches(&dir, &url, "gibleed", marker, 1, restrict, 3).await >= 12);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

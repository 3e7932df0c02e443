//! Study designs end to end: OMOP-shaped stores → `sccs_intervals` / `cohort_outcomes` →
//! fitting functions.
//!
//! * `amdat` and `itpdat` (SCCS R package 1.7; `../shared/data/reference/SOURCES.md` §4.1,
//!   copied into `tests/data/`) are written as OMOP stores (persons born on 1970-01-01, so a day
//!   number is an age in days; MMR as one-day drug eras; outcomes as condition occurrences) and
//!   must reproduce the published / recomputed estimates through the SCCS builder and
//!   `sccs_fit`. Log-likelihood convention: see `golden_sccs.rs` (R / Stata = ours +
//!   Σ_events log t of the elementary interval holding the event; the builder's unmerged
//!   output gives those intervals).
//! * GiBleed (bundled in `data/gibleed`): SCCS, Cox and Fine–Gray SQL files through the CLI,
//!   plus independent cross-checks.
//! * MIMIC-IV demo and Synthea27Nj subsets (`tests/data/mimic_demo`, `tests/data/synthea27nj`):
//!   both designs run, death as the competing event; Synthea's eras derived from exposures.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use datafusion::arrow::array::{Array, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use epifusion::engine::session::{new_session, SessionOptions};

use crate::golden_sccs::read_csv;
use epifusion::engine::study::{
    build_cohort, build_sccs, civil_from_days, CohortDesign, SccsDesign, StudyTables,
};

fn repo(path: &str) -> String {
    format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn date(day: i64) -> String {
    let (y, m, d) = civil_from_days(day);
    format!("{y:04}-{m:02}-{d:02}")
}

/// A one-drug, one-condition OMOP CSV store built person by person (drug concept 5, outcome
/// concept 7, persons born 1 Jan of the given year).
#[derive(Default)]
pub(crate) struct CsvStore {
    person: String,
    period: String,
    era: String,
    cond: String,
    outcomes: usize,
}

impl CsvStore {
    /// Person `id` born in `birth_year`, observed from day `start` to `end`.
    pub(crate) fn person(&mut self, id: i64, birth_year: i32, start: i64, end: i64) {
        self.person
            .push_str(&format!("{id},8507,{birth_year},1,1\n"));
        self.period
            .push_str(&format!("{id},{id},{},{}\n", date(start), date(end)));
    }

    /// A drug era of concept 5 for person `id` (era id = person id).
    pub(crate) fn era(&mut self, id: i64, start: i64, end: i64) {
        self.era
            .push_str(&format!("{id},{id},5,{},{}\n", date(start), date(end)));
    }

    /// An outcome (concept 7) of person `id` on `day`.
    pub(crate) fn outcome(&mut self, id: i64, day: i64) {
        self.outcomes += 1;
        self.cond
            .push_str(&format!("{},{id},7,{}\n", self.outcomes, date(day)));
    }

    /// Write the four tables, and `extra` (file name, text), into `dir`.
    pub(crate) fn write(self, dir: &Path, extra: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        let tables = [
            (
                "person.csv",
                "person_id,gender_concept_id,year_of_birth,month_of_birth,day_of_birth",
                self.person,
            ),
            (
                "observation_period.csv",
                "observation_period_id,person_id,observation_period_start_date,observation_period_end_date",
                self.period,
            ),
            (
                "drug_era.csv",
                "drug_era_id,person_id,drug_concept_id,drug_era_start_date,drug_era_end_date",
                self.era,
            ),
            (
                "condition_occurrence.csv",
                "condition_occurrence_id,person_id,condition_concept_id,condition_start_date",
                self.cond,
            ),
        ];
        for (f, header, rows) in tables {
            std::fs::write(dir.join(f), format!("{header}\n{rows}")).unwrap();
        }
        for (f, text) in extra {
            std::fs::write(dir.join(f), text).unwrap();
        }
    }
}

/// Write an SCCS reference file (one row per event) as an OMOP CSV store.
pub(crate) fn sccs_store(name: &str, event_col: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "epifusion-study-{}-{}",
        name.replace('.', "_"),
        std::process::id()
    ));
    let mut store = CsvStore::default();
    let mut seen = std::collections::BTreeSet::new();
    for r in read_csv(name).iter() {
        let id = r["case"];
        if seen.insert(id) {
            store.person(id, 1970, r["sta"], r["end"]);
            store.era(id, r["mmr"], r["mmr"]);
        }
        store.outcome(id, r[event_col]);
    }
    store.write(&dir, &[]);
    dir
}

pub(crate) async fn session(store: &Path) -> SessionContext {
    new_session(&SessionOptions {
        omop: Some(store.to_string_lossy().into_owned()),
        batch_size: None,
    })
    .await
    .unwrap()
}

pub(crate) fn f64s(batches: &[RecordBatch], col: &str) -> Vec<f64> {
    batches
        .iter()
        .flat_map(|b| {
            let c = cast(b.column_by_name(col).unwrap(), &DataType::Float64).unwrap();
            let a = c.as_any().downcast_ref::<Float64Array>().unwrap().clone();
            (0..a.len()).map(move |i| if a.is_null(i) { f64::NAN } else { a.value(i) })
        })
        .collect()
}

pub(crate) fn i64s(batches: &[RecordBatch], col: &str) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            let c = cast(b.column_by_name(col).unwrap(), &DataType::Int64).unwrap();
            let a = c.as_any().downcast_ref::<Int64Array>().unwrap().clone();
            (0..a.len()).map(move |i| a.value(i))
        })
        .collect()
}

pub(crate) fn strings(batches: &[RecordBatch], col: &str) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            let c = cast(b.column_by_name(col).unwrap(), &DataType::Utf8).unwrap();
            let a = c.as_any().downcast_ref::<StringArray>().unwrap().clone();
            (0..a.len()).map(move |i| a.value(i).to_string())
        })
        .collect()
}

/// Fit `sccs_fit` (or another fitting function) on built tables; covariate id → (β, se, LL).
pub(crate) async fn fit(
    ctx: &SessionContext,
    function: &str,
    t: &StudyTables,
) -> BTreeMap<i64, (f64, f64, f64)> {
    for (name, batches) in [("study_o", &t.outcomes), ("study_c", &t.covariates)] {
        let _ = ctx.deregister_table(name);
        let schema = batches[0].schema();
        ctx.register_table(
            name,
            std::sync::Arc::new(MemTable::try_new(schema, vec![batches.clone()]).unwrap()),
        )
        .unwrap();
    }
    let r = ctx
        .sql(&format!(
            "SELECT covariate_id, estimate, std_error, log_likelihood FROM {function}('study_o', 'study_c', '{{\"ci\": \"wald\", \"convergence\": \"gradient\", \"tolerance\": 1e-10, \"max_iterations\": 100000}}')"
        ))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let (ids, b, se, ll) = (
        i64s(&r, "covariate_id"),
        f64s(&r, "estimate"),
        f64s(&r, "std_error"),
        f64s(&r, "log_likelihood"),
    );
    (0..ids.len())
        .map(|i| (ids[i], (b[i], se[i], ll[i])))
        .collect()
}

pub(crate) fn rel_close(got: f64, want: f64, rel: f64, what: &str) {
    assert!(
        (got - want).abs() <= rel * want.abs(),
        "{what}: got {got:.10}, want {want}"
    );
}

fn printed_close(got: f64, want: f64, decimals: i32, what: &str) {
    let half_ulp = 0.5 * 10f64.powi(-decimals) * (1.0 + 1e-9);
    assert!(
        (got - want).abs() <= half_ulp,
        "{what}: got {got:.10}, printed {want}"
    );
}

/// Σ y·log(time) over the unmerged elementary intervals (the constant R and Stata add).
async fn log_t_events(ctx: &SessionContext, json: &str) -> (f64, usize) {
    let mut d = SccsDesign::from_json(json).unwrap();
    d.merge_patterns = false;
    let t = build_sccs(ctx, &d).await.unwrap();
    let (y, time) = (f64s(&t.outcomes, "y"), f64s(&t.outcomes, "time"));
    (y.iter().zip(&time).map(|(y, t)| y * t.ln()).sum(), y.len())
}

const MMR: &str = r#""exposures": [{"concept_ids": [5], "label": "MMR", "risk_windows": [RISK]}]"#;

fn design(risk: &str, extra: &str) -> String {
    format!(
        r#"{{"outcome": {{"concept_ids": [7]}}, {} {extra}}}"#,
        MMR.replace("RISK", risk)
    )
}

#[tokio::test]
async fn amdat_through_the_builder_matches_published_results() {
    let store = sccs_store("sccs_amdat.csv", "am");
    let ctx = session(&store).await;
    let json = design(
        r#"{"start": 15, "end": 35, "end_anchor": "era_start"}"#,
        r#", "age_group_starts": [548]"#,
    );
    // End to end in SQL: the builder's tables straight into sccs_fit.
    let q = json.replace('\'', "''");
    let sql = format!(
        "SELECT covariate_id, estimate, std_error, log_likelihood FROM sccs_fit(\
         'SELECT * FROM sccs_intervals(''{q}'')', 'SELECT * FROM sccs_covariates(''{q}'')', \
         '{{\"ci\": \"wald\", \"tolerance\": 1e-12, \"max_iterations\": 100000}}') ORDER BY covariate_id"
    );
    let r = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
    assert_eq!(i64s(&r, "covariate_id"), vec![101, 1000]);
    let (b, se, ll) = (
        f64s(&r, "estimate"),
        f64s(&r, "std_error"),
        f64s(&r, "log_likelihood"),
    );
    rel_close(b[1], 2.487975, 1e-6, "RI coef");
    printed_close(se[1], 0.7084879, 7, "RI se");
    rel_close(b[0], -1.490576, 1e-6, "age2 coef");
    printed_close(b[1].exp(), 12.037, 3, "RI");
    let z = 1.959963984540054;
    printed_close((b[1] - z * se[1]).exp(), 3.002, 3, "RI lower");
    printed_close((b[1] + z * se[1]).exp(), 48.259, 3, "RI upper");
    printed_close(b[0].exp(), 0.225, 3, "age2 RI");

    let (constant, elementary) = log_t_events(&ctx, &json).await;
    assert_eq!(elementary, 38, "38 intervals (Stata observations)");
    printed_close(ll[0] + constant, -10.088277, 6, "loglik (Stata)");

    // Attrition and structure: 10 cases, 10 groups.
    let t = build_sccs(&ctx, &SccsDesign::from_json(&json).unwrap())
        .await
        .unwrap();
    let strata = i64s(&t.outcomes, "stratum_id");
    assert_eq!(strata.iter().max(), Some(&10));
    let a = &t.attrition;
    assert_eq!(i64s(a, "cases"), vec![10, 10]);
    assert_eq!(i64s(a, "outcomes"), vec![10, 10]);
    let refs = strings(&t.covariate_ref, "covariate_name");
    assert!(refs.iter().any(|n| n.starts_with("MMR")), "{refs:?}");
    let _ = std::fs::remove_dir_all(&store);
}

#[tokio::test]
async fn itpdat_through_the_builder_matches_the_sccs_package() {
    let store = sccs_store("sccs_itpdat.csv", "itp");
    let ctx = session(&store).await;
    let ages = r#", "age_group_starts": [427, 488, 549, 610, 671]"#;

    // mod1: risk [mmr, mmr+42], no age.
    let j1 = design(r#"{"start": 0, "end": 42, "end_anchor": "era_start"}"#, "");
    let t1 = build_sccs(&ctx, &SccsDesign::from_json(&j1).unwrap())
        .await
        .unwrap();
    // Cases whose risk window misses the observation period have one interval and are
    // dropped: the events left are those of the other cases, counted from the raw file.
    let informative_events = read_csv("sccs_itpdat.csv")
        .iter()
        .filter(|r| r["mmr"] + 42 >= r["sta"] && r["mmr"] <= r["end"])
        .count();
    assert_eq!(
        f64s(&t1.outcomes, "y").iter().sum::<f64>(),
        informative_events as f64
    );
    let f1 = fit(&ctx, "sccs_fit", &t1).await;
    rel_close(f1[&1000].0, 1.509563, 1e-6, "mod1 coef");
    printed_close(f1[&1000].1, 0.3512039, 7, "mod1 se");
    let (c1, n1) = log_t_events(&ctx, &j1).await; // elementary intervals of the kept cases
    assert!(n1 > 0);
    printed_close(f1[&1000].2 + c1, -30.09470, 5, "mod1 loglik");

    // mod2: plus age groups (all 44 events in the data).
    let j2 = design(
        r#"{"start": 0, "end": 42, "end_anchor": "era_start"}"#,
        ages,
    );
    let t2 = build_sccs(&ctx, &SccsDesign::from_json(&j2).unwrap())
        .await
        .unwrap();
    assert_eq!(f64s(&t2.outcomes, "y").iter().sum::<f64>(), 44.0);
    let f2 = fit(&ctx, "sccs_fit", &t2).await;
    rel_close(f2[&1000].0, 1.1713023, 1e-6, "mod2 coef");
    printed_close(f2[&1000].1, 0.3799802, 7, "mod2 se");
    let want = [-0.4038760, -1.5693685, -1.2061463, -0.9230387, -0.9082000];
    for (g, &w) in want.iter().enumerate() {
        rel_close(
            f2[&(101 + g as i64)].0,
            w,
            1e-6,
            &format!("mod2 age{}", g + 2),
        );
    }
    let (c2, _) = log_t_events(&ctx, &j2).await;
    printed_close(f2[&1000].2 + c2, -73.04148, 5, "mod2 loglik");

    // mod3: three risk windows (ids 1000, 1001, 1002 in order), same age groups.
    let j3 = design(
        r#"{"start": 0, "end": 14, "end_anchor": "era_start"}, {"start": 15, "end": 28, "end_anchor": "era_start"}, {"start": 29, "end": 42, "end_anchor": "era_start"}"#,
        ages,
    );
    let t3 = build_sccs(&ctx, &SccsDesign::from_json(&j3).unwrap())
        .await
        .unwrap();
    let f3 = fit(&ctx, "sccs_fit", &t3).await;
    let want = [
        (0.2691659, 0.7529389),
        (1.7840593, 0.4388393),
        (0.9555898, 0.6375012),
    ];
    for (k, &(wb, wse)) in want.iter().enumerate() {
        let (b, se, _) = f3[&(1000 + k as i64)];
        rel_close(b, wb, 1e-6, &format!("mod3 risk{k} coef"));
        printed_close(se, wse, 7, &format!("mod3 risk{k} se"));
    }
    let (c3, _) = log_t_events(&ctx, &j3).await;
    printed_close(f3[&1000].2 + c3, -84.41353, 5, "mod3 loglik");
    let _ = std::fs::remove_dir_all(&store);
}

/// First-outcome-only, naive period, age and study-period limits shrink the population step by
/// step, and the attrition table says so.
#[tokio::test]
async fn itpdat_population_options_and_attrition() {
    let store = sccs_store("sccs_itpdat.csv", "itp");
    let ctx = session(&store).await;
    let j = design(
        r#"{"start": 0, "end": 42, "end_anchor": "era_start"}"#,
        // Ages 400–699 days (min_age 1.1 y = 402 days), naive 30 days, study from day 420.
        r#", "first_outcome_only": true, "naive_period": 30, "min_age": 1.1, "study_start_date": "1971-02-25", "end_of_observation_probe": 30"#,
    );
    let t = build_sccs(&ctx, &SccsDesign::from_json(&j).unwrap())
        .await
        .unwrap();
    let steps = strings(&t.attrition, "description");
    assert_eq!(steps[0], "observation periods with an outcome");
    assert!(steps.contains(&"first outcome only".to_string()));
    assert!(steps.contains(&"naive period".to_string()));
    let cases = i64s(&t.attrition, "cases");
    let outcomes = i64s(&t.attrition, "outcomes");
    assert_eq!((cases[0], outcomes[0]), (35, 44));
    assert_eq!(outcomes[1], 35, "first outcome only");
    assert!(cases.windows(2).all(|w| w[1] <= w[0]), "{cases:?}");
    assert!(outcomes.windows(2).all(|w| w[1] <= w[0]), "{outcomes:?}");
    // Independent count of the last population step from the raw data.
    let study_start = epifusion::engine::study::days_from_civil(1971, 2, 25);
    assert_eq!(study_start, 365 + 31 + 24);
    let mut first: BTreeMap<i64, BTreeMap<String, i64>> = BTreeMap::new();
    for r in read_csv("sccs_itpdat.csv") {
        let e = first.entry(r["case"]).or_insert_with(|| r.clone());
        if r["itp"] < e["itp"] {
            *e = r.clone();
        }
    }
    let kept = first
        .values()
        .filter(|r| {
            let start = r["sta"].max(402).max(study_start).max(r["sta"] + 30);
            r["itp"] >= start && r["itp"] <= r["end"]
        })
        .count() as i64;
    assert_eq!(
        cases[cases.len() - 2],
        kept,
        "after the naive period: {steps:?}"
    );
    // One outcome per case, every row's time positive, probe covariate present.
    let y = f64s(&t.outcomes, "y");
    assert!(y.iter().all(|v| *v == 0.0 || *v == 1.0));
    assert!(f64s(&t.outcomes, "time").iter().all(|t| *t > 0.0));
    assert!(i64s(&t.covariates, "covariate_id").contains(&99));
    let _ = std::fs::remove_dir_all(&store);
}

pub(crate) fn cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_epifusion"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Rows of a CSV printed by `epifusion sql --format csv` (several result sets concatenated).
fn csv_sections(stdout: &str) -> Vec<Vec<Vec<String>>> {
    let mut out: Vec<Vec<Vec<String>>> = Vec::new();
    for line in stdout.lines() {
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<String> = line.split(',').map(str::to_owned).collect();
        let is_header = cells
            .iter()
            .all(|c| c.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_'));
        if is_header {
            out.push(vec![cells]);
        } else if let Some(last) = out.last_mut() {
            last.push(cells);
        }
    }
    out
}

fn column<'a>(section: &'a [Vec<String>], name: &str) -> Vec<&'a str> {
    let k = section[0]
        .iter()
        .position(|c| c == name)
        .unwrap_or_else(|| panic!("no column {name} in {:?}", section[0]));
    section[1..].iter().map(|r| r[k].as_str()).collect()
}

#[test]
fn gibleed_sql_files_run_end_to_end() {
    for (file, model) in [
        ("sql/gibleed_sccs_celecoxib.sql", "sccs"),
        ("sql/gibleed_sccs_diclofenac.sql", "sccs"),
        ("sql/gibleed_new_user_cox.sql", "cox"),
        ("sql/gibleed_new_user_fine_gray.sql", "fine_gray"),
    ] {
        let (ok, stdout, stderr) = cli(&[
            "sql",
            "--omop",
            "data/gibleed",
            "--format",
            "csv",
            "-f",
            file,
        ]);
        assert!(ok, "{file}: {stderr}");
        let sections = csv_sections(&stdout);
        let attrition = sections
            .iter()
            .find(|s| s[0].first().map(String::as_str) == Some("step"))
            .unwrap_or_else(|| panic!("{file}: no attrition in {stdout}"));
        let fit = sections
            .iter()
            .find(|s| s[0].iter().any(|c| c == "estimate"))
            .unwrap_or_else(|| panic!("{file}: no fit in {stdout}"));
        // Attrition counts never grow from one step to the next.
        for col in &attrition[0][2..] {
            let v: Vec<i64> = column(attrition, col)
                .iter()
                .map(|s| s.parse().unwrap())
                .collect();
            assert!(v.windows(2).all(|w| w[1] <= w[0]), "{file} {col}: {v:?}");
            assert!(v.last().copied().unwrap_or(0) > 0, "{file} {col}: {v:?}");
        }
        let status = column(fit, "status");
        assert!(
            status.iter().all(|s| *s == "converged"),
            "{file}: {status:?}"
        );
        let est: Vec<f64> = column(fit, "estimate")
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert!(
            est.iter().all(|e| e.is_finite()),
            "{file} ({model}): {est:?}"
        );
        // Identifiable designs: every printed standard error exists.
        if fit[0].iter().any(|c| c == "std_error") {
            let se = column(fit, "std_error");
            assert!(
                se.iter().all(|s| s.parse::<f64>().is_ok_and(|v| v > 0.0)),
                "{file}: {se:?}"
            );
        }
    }
}

/// GiBleed cross-checks against numbers derived without the builder: the SCCS case count equals
/// a hand SQL count, and one case's intervals are recomputed by hand.
#[tokio::test]
async fn gibleed_sccs_cross_checks() {
    let ctx = session(Path::new(&repo("data/gibleed"))).await;
    let json = r#"{"outcome": {"concept_ids": [192671], "include_descendants": true},
                   "exposures": [{"concept_ids": [1118084], "label": "celecoxib"}]}"#;
    let d = SccsDesign::from_json(json).unwrap();
    let t = build_sccs(&ctx, &d).await.unwrap();
    // Eunomia cohort 3 (GI bleed): 479 persons with a condition occurrence; those observed
    // (with a person row and the event inside an observation period) are the first step.
    let hand = ctx
        .sql(
            "SELECT count(DISTINCT co.person_id) AS n FROM condition_occurrence co \
             JOIN concept_ancestor ca ON ca.descendant_concept_id = co.condition_concept_id AND ca.ancestor_concept_id = 192671 \
             JOIN person p ON p.person_id = co.person_id \
             JOIN observation_period op ON op.person_id = co.person_id \
              AND co.condition_start_date BETWEEN op.observation_period_start_date AND op.observation_period_end_date",
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let persons = i64s(&t.attrition, "persons");
    assert_eq!(persons[0], i64s(&hand, "n")[0]);
    assert!(persons[0] <= 479);
    // One case by hand: the first kept case's exposed days = its celecoxib era days inside the
    // observation period.
    let strata = i64s(&t.outcomes, "stratum_id");
    let person = i64s(&t.outcomes, "person_id");
    let (time, row_id) = (f64s(&t.outcomes, "time"), i64s(&t.outcomes, "row_id"));
    let exposed_rows: std::collections::BTreeSet<i64> = i64s(&t.covariates, "row_id")
        .into_iter()
        .zip(i64s(&t.covariates, "covariate_id"))
        .filter(|(_, c)| *c == 1000)
        .map(|(r, _)| r)
        .collect();
    let first_person = person[0];
    let mut exposed_days = 0.0;
    let mut total_days = 0.0;
    for i in 0..strata.len() {
        if strata[i] == strata[0] {
            total_days += time[i];
            if exposed_rows.contains(&row_id[i]) {
                exposed_days += time[i];
            }
        }
    }
    let by_hand = ctx
        .sql(&format!(
            "SELECT sum(CAST(least(e.drug_era_end_date, op.observation_period_end_date) AS INT) \
                      - CAST(greatest(e.drug_era_start_date, op.observation_period_start_date) AS INT) + 1) AS exposed, \
                    max(CAST(op.observation_period_end_date AS INT) - CAST(op.observation_period_start_date AS INT) + 1) AS total \
             FROM drug_era e JOIN observation_period op ON op.person_id = e.person_id \
             WHERE e.person_id = {first_person} AND e.drug_concept_id = 1118084 \
               AND e.drug_era_end_date >= op.observation_period_start_date \
               AND e.drug_era_start_date <= op.observation_period_end_date"
        ))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(
        exposed_days,
        f64s(&by_hand, "exposed")[0],
        "person {first_person}"
    );
    assert_eq!(
        total_days,
        f64s(&by_hand, "total")[0],
        "person {first_person}"
    );
}

/// Cohort design on GiBleed: structure, attrition against a hand count, covariates.
#[tokio::test]
async fn gibleed_cohort_structure() {
    let ctx = session(Path::new(&repo("data/gibleed"))).await;
    let json = r#"{"target": {"concept_ids": [1118084]}, "comparator": {"concept_ids": [1124300]},
                   "outcome": {"concept_ids": [192671], "include_descendants": true},
                   "first_exposure_only": true, "remove_duplicate_subjects": "remove_all",
                   "washout_days": 365, "risk_window_end": 365, "end_anchor": "cohort_start",
                   "strata": ["gender"]}"#;
    let t = build_cohort(&ctx, &CohortDesign::from_json(json).unwrap())
        .await
        .unwrap();
    // Persons with a first celecoxib era (Eunomia cohort 1: 1,844 persons) ≥ the first step.
    let tp = i64s(&t.attrition, "target_persons");
    let cp = i64s(&t.attrition, "comparator_persons");
    assert!(tp[0] <= 1844 && cp[0] <= 850, "{tp:?} {cp:?}");
    let n = f64s(&t.outcomes, "y").len() as i64;
    assert_eq!(n, tp.last().unwrap() + cp.last().unwrap());
    let time = f64s(&t.outcomes, "time");
    assert!(time.iter().all(|t| *t >= 1.0 && *t <= 366.0));
    let strata = i64s(&t.outcomes, "stratum_id");
    assert_eq!(
        strata
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        2
    );
    // Treatment covariate on exactly the target rows.
    let treat = i64s(&t.outcomes, "treatment");
    let n_t = treat.iter().filter(|t| **t == 1).count();
    let cov = i64s(&t.covariates, "covariate_id");
    assert_eq!(cov.iter().filter(|c| **c == 1).count(), n_t);
    assert!(cov.contains(&8532001) || cov.contains(&8507001));
    // Covariate ids are unique per row.
    let rows = i64s(&t.covariates, "row_id");
    let pairs: std::collections::BTreeSet<(i64, i64)> =
        rows.into_iter().zip(cov.iter().copied()).collect();
    assert_eq!(pairs.len(), cov.len());
    // Excluded exposure concepts never appear as drug covariates.
    assert!(!cov.contains(&(1118084 * 1000 + 302)));
    let names = strings(&t.covariate_ref, "covariate_name");
    assert!(
        names.iter().any(|n| n.starts_with("condition: ")),
        "{names:?}"
    );
    // Fits (stratified Cox) converge.
    let f = fit(&ctx, "cox_fit", &t).await;
    assert!(f[&1].0.is_finite());
}

#[tokio::test]
async fn mimic_demo_runs_both_designs_with_death_competing() {
    let ctx = session(Path::new(&repo("tests/data/mimic_demo"))).await;
    // Most frequent drug and condition concepts, found by SQL (no hard-coded ids).
    let top = |sql: &str| {
        let ctx = ctx.clone();
        let sql = sql.to_string();
        async move { i64s(&ctx.sql(&sql).await.unwrap().collect().await.unwrap(), "c") }
    };
    let drugs = top("SELECT drug_concept_id AS c FROM drug_era WHERE drug_concept_id <> 0 GROUP BY 1 ORDER BY count(DISTINCT person_id) DESC, 1 LIMIT 2").await;
    let conds = top("SELECT condition_concept_id AS c FROM condition_occurrence WHERE condition_concept_id <> 0 GROUP BY 1 ORDER BY count(DISTINCT person_id) DESC, 1 LIMIT 1").await;
    let sccs = format!(
        r#"{{"outcome": {{"concept_ids": [{}]}}, "exposures": [{{"concept_ids": [{}]}}], "end_of_observation_probe": 30}}"#,
        conds[0], drugs[0]
    );
    let t = build_sccs(&ctx, &SccsDesign::from_json(&sccs).unwrap())
        .await
        .unwrap();
    assert!(i64s(&t.attrition, "cases")[0] > 0);
    // Negative 64-bit person ids come through.
    let cohort = format!(
        r#"{{"target": {{"concept_ids": [{}]}}, "comparator": {{"concept_ids": [{}]}}, "outcome": {{"concept_ids": [{}]}},
            "competing": {{"death": true}}, "model": "fine_gray", "remove_subjects_with_prior_outcome": false,
            "risk_window_end": 3650, "end_anchor": "cohort_start"}}"#,
        drugs[0], drugs[1], conds[0]
    );
    let t = build_cohort(&ctx, &CohortDesign::from_json(&cohort).unwrap())
        .await
        .unwrap();
    let persons = i64s(&t.outcomes, "person_id");
    assert!(
        persons.iter().any(|p| *p < 0),
        "MIMIC person ids are negative hashes"
    );
    let y = f64s(&t.outcomes, "y");
    assert!(y.iter().all(|v| [0.0, 1.0, 2.0].contains(v)));
    assert!(y.contains(&2.0), "deaths are competing events: {y:?}");
}

#[tokio::test]
async fn synthea_runs_with_eras_derived_from_exposures() {
    let ctx = session(Path::new(&repo("tests/data/synthea27nj"))).await;
    let n_era = i64s(
        &ctx.sql("SELECT count(*) AS n FROM drug_era")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap(),
        "n",
    );
    assert_eq!(n_era, vec![0], "Synthea27Nj's drug_era is empty");
    let top = |sql: &'static str| {
        let ctx = ctx.clone();
        async move { i64s(&ctx.sql(sql).await.unwrap().collect().await.unwrap(), "c") }
    };
    let drugs = top("SELECT drug_concept_id AS c FROM drug_exposure WHERE drug_concept_id <> 0 GROUP BY 1 ORDER BY count(DISTINCT person_id) DESC, 1 LIMIT 2").await;
    let conds = top("SELECT condition_concept_id AS c FROM condition_occurrence WHERE condition_concept_id <> 0 GROUP BY 1 ORDER BY count(DISTINCT person_id) DESC, 1 LIMIT 1").await;
    let sccs = format!(
        r#"{{"outcome": {{"concept_ids": [{}]}}, "exposures": [{{"concept_ids": [{}], "domain": "derived_drug_era", "persistence_days": 30}}]}}"#,
        conds[0], drugs[0]
    );
    let t = build_sccs(&ctx, &SccsDesign::from_json(&sccs).unwrap())
        .await
        .unwrap();
    assert!(!t.attrition.is_empty());
    let cohort = format!(
        r#"{{"target": {{"concept_ids": [{}], "domain": "derived_drug_era"}}, "comparator": {{"concept_ids": [{}], "domain": "derived_drug_era"}},
            "outcome": {{"concept_ids": [{}]}}, "competing": {{"death": true}}, "model": "fine_gray",
            "remove_subjects_with_prior_outcome": false, "risk_window_end": 3650, "end_anchor": "cohort_start"}}"#,
        drugs[0], drugs[1], conds[0]
    );
    let t = build_cohort(&ctx, &CohortDesign::from_json(&cohort).unwrap())
        .await
        .unwrap();
    let rows = f64s(&t.outcomes, "y").len();
    assert!(rows > 0, "{:?}", t.attrition);
}

/// The SCCS tables of a cluster run are built partitioned by person (`sccs_parts`): the same
/// plan, run here with 1 and 4 partitions, gives the local build's tables bit for bit, over
/// designs that use every global part (spline knots, stratified concept ids, attrition) and
/// a person with several observation periods.
#[tokio::test]
async fn partitioned_sccs_builds_match_the_local_build() {
    use epifusion::engine::remote::prepare_for_cluster;
    let store = repo("data/gibleed");
    let designs = [
        r#"{"outcome": {"concept_ids": [192671], "include_descendants": true},
            "exposures": [{"concept_ids": [1118084], "label": "celecoxib"}]}"#,
        r#"{"outcome": {"concept_ids": [192671], "include_descendants": true},
            "first_outcome_only": true, "naive_period": 180, "min_age": 18,
            "exposures": [
              {"concept_ids": [1118084, 1124300, 1177480], "stratify_by_id": true,
               "risk_windows": [{"start": 0, "end": 29, "end_anchor": "era_start", "split_points": [10, 20]},
                                {"start": 30, "end": 0}]},
              {"concept_ids": [1115008], "first_occurrence_only": true,
               "risk_windows": [{"start": -30, "end": -1, "end_anchor": "era_start"}]}],
            "age_spline": {"knots": 4}, "season_spline": {"knots": 4}, "calendar_spline": {"knots": 3},
            "end_of_observation_probe": 30}"#,
        r#"{"outcome": {"concept_ids": [192671], "include_descendants": true},
            "exposures": [{"concept_ids": [1118084, 1124300], "stratify_by_id": true}],
            "age_group_starts": [7300, 14600, 21900], "merge_patterns": false,
            "study_start_date": "1990-01-01", "genders": [8507, 8532]}"#,
        // The study period narrowed to one exposure's era range inside the cases query.
        r#"{"outcome": {"concept_ids": [192671], "include_descendants": true},
            "exposures": [{"concept_ids": [1118084]}, {"concept_ids": [1124300], "first_occurrence_only": true}],
            "restrict_time_to_exposure": 1}"#,
    ];
    let tables = [
        ("sccs_intervals", "row_id"),
        ("sccs_covariates", "row_id, covariate_id"),
        ("sccs_covariate_ref", "covariate_id"),
        ("sccs_attrition", "step"),
    ];
    for partitions in [1, 4] {
        let ctx = new_session(&SessionOptions {
            omop: Some(store.clone()),
            batch_size: None,
        })
        .await
        .unwrap();
        ctx.sql(&format!(
            "SET datafusion.execution.target_partitions = {partitions}"
        ))
        .await
        .unwrap();
        for (k, json) in designs.iter().enumerate() {
            let q = json.replace('\'', "''");
            for (function, order) in tables {
                let sql = format!("SELECT * FROM {function}('{q}') ORDER BY {order}");
                let (local, split, shown, text) = local_and_cluster_shaped(&ctx, &sql).await;
                assert!(
                    text.contains(&format!("EpiExec: {function} (merge)")),
                    "design {k}, {function}: not a partitioned build:\n{text}"
                );
                if function != "sccs_covariate_ref" {
                    assert!(
                        text.contains(&format!("EpiExec: {function} (pieces by person)")),
                        "design {k}, {function}: no pieces node:\n{text}"
                    );
                }
                if function != "sccs_covariate_ref" && partitions > 1 {
                    assert!(
                        text.contains("RepartitionExec: partitioning=Hash([person_id"),
                        "design {k}, {function}: the pieces are not partitioned by person:\n{shown}\n{text}"
                    );
                }
                assert_same_batches(
                    &local,
                    &split,
                    1,
                    &format!("design {k}, {function}, {partitions} partitions"),
                );
            }
        }
    }
    // A restricting exposure without eras: the local build's error, from the partitioned one.
    let ctx = new_session(&SessionOptions {
        omop: Some(store.clone()),
        batch_size: None,
    })
    .await
    .unwrap();
    let json = r#"{"outcome": {"concept_ids": [192671]}, "exposures": [{"concept_ids": [1118084]},
                   {"concept_ids": [999999999]}], "restrict_time_to_exposure": 1}"#;
    let sql = format!("SELECT * FROM sccs_intervals('{json}')");
    let local = ctx.sql(&sql).await.unwrap().collect().await.unwrap_err();
    let plan = ctx.sql(&sql).await.unwrap().into_optimized_plan().unwrap();
    let prepared = prepare_for_cluster(&ctx.state(), plan).await.unwrap();
    let split = ctx
        .execute_logical_plan(prepared)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err();
    for e in [local.to_string(), split.to_string()] {
        assert!(
            e.contains("restrict_time_to_exposure: exposures[1] has no eras in the store"),
            "{e}"
        );
    }
}

/// The cohort tables of a cluster run are distributed queries under one merge node
/// (`cohort_parts`): the same plan, run here with 1 and 4 partitions, gives the local build's
/// tables bit for bit and in the same row order (no `ORDER BY` in the queries), over designs
/// that use strata, duplicate removal, the common period, censoring at a new window, competing
/// events and every covariate analysis.
#[tokio::test]
async fn distributed_cohort_builds_match_the_local_build() {
    let store = repo("data/gibleed");
    let designs = [
        r#"{"target": {"concept_ids": [1118084]}, "comparator": {"concept_ids": [1124300]},
            "outcome": {"concept_ids": [192671], "include_descendants": true},
            "first_exposure_only": true, "remove_duplicate_subjects": "remove_all",
            "washout_days": 365, "risk_window_end": 365, "end_anchor": "cohort_start",
            "strata": ["gender", "age_group"]}"#,
        r#"{"target": {"concept_ids": [1118084], "include_descendants": true},
            "comparator": {"concept_ids": [1124300]},
            "outcome": {"concept_ids": [192671]}, "competing": {"death": true}, "model": "fine_gray",
            "remove_duplicate_subjects": "keep_first", "remove_subjects_with_prior_outcome": false,
            "restrict_to_common_period": true, "censor_at_new_risk_window": true,
            "risk_window_end": 3650, "end_anchor": "cohort_start", "strata": ["index_year"],
            "covariates": {"lookback_days": 180, "excluded_concept_ids": [40213154]}}"#,
    ];
    let tables = [
        "cohort_outcomes",
        "cohort_covariates",
        "cohort_covariate_ref",
        "cohort_attrition",
    ];
    for partitions in [1, 4] {
        let ctx = new_session(&SessionOptions {
            omop: Some(store.clone()),
            batch_size: None,
        })
        .await
        .unwrap();
        ctx.sql(&format!(
            "SET datafusion.execution.target_partitions = {partitions}"
        ))
        .await
        .unwrap();
        for (k, json) in designs.iter().enumerate() {
            let q = json.replace('\'', "''");
            for function in tables {
                let sql = format!("SELECT * FROM {function}('{q}')");
                let (local, split, _, text) = local_and_cluster_shaped(&ctx, &sql).await;
                assert!(
                    text.contains(&format!("EpiExec: {function} (merge)")),
                    "design {k}, {function}: not a distributed build:\n{text}"
                );
                if partitions > 1 {
                    assert!(
                        text.contains("RepartitionExec: partitioning=Hash("),
                        "design {k}, {function}: the queries are not distributed:\n{text}"
                    );
                }
                assert_same_batches(
                    &local,
                    &split,
                    2,
                    &format!("design {k}, {function}, {partitions} partitions"),
                );
            }
        }
    }
}

/// `sccs_diagnostics` and `sccs_time_to_event` on a cluster are distributed queries under one
/// merge node: the same plan, run here with 1 and 4 partitions, gives the local tables bit for
/// bit (fit, spline-adjusted time stability, probe, pre-exposure windows, prevalence and
/// negative controls), and a design with no eras gives the local error.
#[tokio::test]
async fn distributed_sccs_diagnostics_match_the_local_run() {
    use epifusion::engine::remote::prepare_for_cluster;
    let store = repo("data/gibleed");
    let designs = [
        r#"{"outcome": {"concept_ids": [192671], "include_descendants": true},
            "exposures": [{"concept_ids": [1118084], "label": "celecoxib",
              "risk_windows": [{}, {"start": -30, "end": -1, "end_anchor": "era_start"}]},
              {"concept_ids": [1124300], "stratify_by_id": true}],
            "end_of_observation_probe": 30, "season_spline": {"knots": 4},
            "first_outcome_only": true,
            "negative_controls": "SELECT * FROM (VALUES (0.1, 0.2), (-0.05, 0.15), (0.3, 0.4), (0.02, 0.1), (-0.2, 0.25), (0.15, 0.3)) AS t(log_rr, se_log_rr)"}"#,
        r#"{"outcome": {"concept_ids": [192671], "include_descendants": true},
            "exposures": [{"concept_ids": [1118084]}, {"concept_ids": [1124300], "first_occurrence_only": true}],
            "restrict_time_to_exposure": 1, "age_group_starts": [7300, 14600],
            "diagnostics": {"mdrr": 5}}"#,
    ];
    for partitions in [1, 4] {
        let ctx = new_session(&SessionOptions {
            omop: Some(store.clone()),
            batch_size: None,
        })
        .await
        .unwrap();
        ctx.sql(&format!(
            "SET datafusion.execution.target_partitions = {partitions}"
        ))
        .await
        .unwrap();
        for (k, json) in designs.iter().enumerate() {
            let q = json.replace('\'', "''");
            for function in ["sccs_diagnostics", "sccs_time_to_event"] {
                let sql = format!("SELECT * FROM {function}('{q}')");
                let (local, split, _, text) = local_and_cluster_shaped(&ctx, &sql).await;
                assert!(
                    text.contains(&format!("EpiExec: {function} (merge)")),
                    "design {k}, {function}: not a distributed build:\n{text}"
                );
                if partitions > 1 {
                    assert!(
                        text.contains("RepartitionExec: partitioning=Hash("),
                        "design {k}, {function}: the queries are not distributed:\n{text}"
                    );
                }
                assert_same_batches(
                    &local,
                    &split,
                    4,
                    &format!("design {k}, {function}, {partitions} partitions"),
                );
            }
            // The first design's negative controls and probe are computed (its pre-exposure
            // window has no outcome in GiBleed: no interval, `not_computed`).
            if k == 0 {
                let b = ctx
                    .sql(&format!(
                        "SELECT diagnostic FROM sccs_diagnostics('{q}') WHERE status = 'not_computed' \
                         AND diagnostic IN ('ease', 'event_observation')"
                    ))
                    .await
                    .unwrap()
                    .collect()
                    .await
                    .unwrap();
                assert_eq!(strings(&b, "diagnostic"), Vec::<String>::new());
            }
        }
    }
    // A restricting exposure without eras: the local error, from the distributed plan.
    let ctx = new_session(&SessionOptions {
        omop: Some(store.clone()),
        batch_size: None,
    })
    .await
    .unwrap();
    let json = r#"{"outcome": {"concept_ids": [192671]}, "exposures": [{"concept_ids": [1118084]},
                   {"concept_ids": [999999999]}], "restrict_time_to_exposure": 1}"#;
    let sql = format!("SELECT * FROM sccs_diagnostics('{json}')");
    let local = ctx.sql(&sql).await.unwrap().collect().await.unwrap_err();
    let plan = ctx.sql(&sql).await.unwrap().into_optimized_plan().unwrap();
    let prepared = prepare_for_cluster(&ctx.state(), plan).await.unwrap();
    let split = ctx
        .execute_logical_plan(prepared)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err();
    for e in [local.to_string(), split.to_string()] {
        assert!(
            e.contains("restrict_time_to_exposure: exposures[1] has no eras in the store"),
            "{e}"
        );
    }
}

/// `sql` run in `ctx` as it is, then as a cluster would run it (prepared by
/// `prepare_for_cluster`, run here): the local batches, the prepared plan's batches, its
/// logical and its physical plan as text.
async fn local_and_cluster_shaped(
    ctx: &datafusion::prelude::SessionContext,
    sql: &str,
) -> (Vec<RecordBatch>, Vec<RecordBatch>, String, String) {
    use epifusion::engine::remote::prepare_for_cluster;
    let local: Vec<RecordBatch> = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let plan = ctx.sql(sql).await.unwrap().into_optimized_plan().unwrap();
    let prepared = prepare_for_cluster(&ctx.state(), plan).await.unwrap();
    let shown = prepared.display_indent().to_string();
    let df = ctx.execute_logical_plan(prepared).await.unwrap();
    let physical = df.clone().create_physical_plan().await.unwrap();
    let text = datafusion::physical_plan::displayable(physical.as_ref())
        .indent(false)
        .to_string();
    let split: Vec<RecordBatch> = df.collect().await.unwrap();
    (local, split, shown, text)
}

/// `split` holds the rows of `local` bit for bit, in the same order (at least `min_rows` of
/// them): the check of the cluster-shaped builds against the local ones. The message names the
/// first differing row of the first differing column.
fn assert_same_batches(local: &[RecordBatch], split: &[RecordBatch], min_rows: usize, what: &str) {
    use datafusion::arrow::compute::concat_batches;
    assert!(
        !local.is_empty(),
        "{what}: the local build returned no batches"
    );
    let local = concat_batches(&local[0].schema(), local).unwrap();
    let split = concat_batches(&local.schema(), split).unwrap();
    assert!(
        local.num_rows() >= min_rows,
        "{what}: the local build has {} rows",
        local.num_rows()
    );
    assert_eq!(
        (local.num_rows(), local.schema()),
        (split.num_rows(), split.schema()),
        "{what}: rows"
    );
    for (c, (a, b)) in local.columns().iter().zip(split.columns()).enumerate() {
        if a != b {
            let first = (0..a.len())
                .find(|&i| a.slice(i, 1) != b.slice(i, 1))
                .unwrap_or(0);
            panic!(
                "{what}: column {} differs first at row {first}: local {:?}, split {:?}",
                local.schema().field(c).name(),
                a.slice(first, 3),
                b.slice(first, 3)
            );
        }
    }
}

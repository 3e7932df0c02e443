//! A seeded generator of **confounded** synthetic OMOP stores for comparative cohort studies
//! (`epifusion bench-omop --design cm`, issue #14): new users of a target or a comparator drug
//! whose choice of drug depends on measured baseline covariates that also raise the outcome
//! hazard, with a known true hazard ratio of exactly 1.
//!
//! # Per person
//!
//! * gender, a birth year (1930–2000); one observation period starting 2000–2007, with at least
//!   365 days of prior observation before the **index date** (the first and only exposure) and
//!   30–1,460 days of observation after it;
//! * **baseline covariates** in the 365 days before index: the [`SPECIAL`] concepts, each
//!   present with its own prevalence, and `records_per_person` (Poisson mean) sparse records
//!   drawn from a vocabulary of `covariates` concepts (half conditions, 35 % drugs in
//!   `drug_exposure`, 15 % procedures; concept ids 3_000_001…, 4_000_001…, 5_000_001…) with
//!   Zipf-like frequencies (weight ∝ 1/(rank + 5)): at 1M persons nearly every concept occurs;
//! * an unmeasured binary confounder `U` (prevalence 0.3, never written);
//! * **treatment**: target ([`TARGET_DRUG`]) with probability
//!   `logistic(TREATMENT_INTERCEPT + Σ_j treatment_j x_j + U_TREATMENT · U)`, else comparator
//!   ([`COMPARATOR_DRUG`]); one `drug_era` row of 30–365 days from the index date;
//! * **the outcome of interest** ([`OUTCOME_CONCEPT`]): the first event of an exponential time
//!   with daily hazard `OUTCOME_RATE / 365.25 · exp(Σ_j hazard_j x_j)`, written as a
//!   `condition_occurrence` on day `index + 1 + ⌊t⌋` when that is inside the observation
//!   period. The hazard does **not** depend on treatment: the true HR is exactly 1;
//! * `negative_controls` more outcomes (concept ids [`OUTCOME_CONCEPT`] + 1 + j, j = 0…), each
//!   with its own rate (1.5–4 per 100 person-years) and the measured confounders' hazard
//!   effects scaled by 0.5–1: true HR 1, and confounded like the outcome of interest. Every
//!   [`BIASED_EVERY`]-th one (j = 0, 5, 10, …) also has its hazard × `exp(U_HAZARD · U)`:
//!   **systematic error** from the unmeasured confounder that no adjustment on the measured
//!   covariates removes (what empirical calibration is for);
//! * death for 1 % of persons, on the last observed day.
//!
//! A `concept` table names every concept (with its domain: the pipeline infers a concept set's
//! table from it; the special covariates' names say "confounder", "instrument" or
//! "prognostic").
//!
//! Measured confounders raise both the odds of the target and the hazard (or lower both), so
//! the crude HR is about 2; instruments raise only the odds of the target; prognostic
//! covariates only the hazard. The main outcome and the negative controls are drawn from a
//! second random stream per person, so adding negative controls leaves the rest of the store
//! unchanged. Files are written in chunks of 100,000 persons (memory does not grow with the
//! store).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{exec_datafusion_err, Result as DfResult};
use parquet::arrow::ArrowWriter;

use epifusion_core::bench::Rng;

use super::synth::Table;

/// The target drug (`drug_era.drug_concept_id`, treatment = 1).
pub const TARGET_DRUG: i64 = 1_000_001;
/// The comparator drug (treatment = 0).
pub const COMPARATOR_DRUG: i64 = 1_000_002;
/// The outcome of interest; negative controls follow (`OUTCOME_CONCEPT + 1 + j`).
pub const OUTCOME_CONCEPT: i64 = 2_000_001;
/// First concept id of the condition vocabulary.
pub const FIRST_CONDITION: i64 = 3_000_001;
/// First concept id of the drug (`drug_exposure`) vocabulary.
pub const FIRST_DRUG_EXPOSURE: i64 = 4_000_001;
/// First concept id of the procedure vocabulary.
pub const FIRST_PROCEDURE: i64 = 5_000_001;
/// The true hazard ratio of the outcome of interest and of every negative control.
pub const TRUE_HR: f64 = 1.0;
/// Every this-many-th negative control (j = 0, 5, …) carries systematic error.
pub const BIASED_EVERY: usize = 5;
/// Log-odds of the target per unit of the unmeasured confounder.
pub const U_TREATMENT: f64 = 1.0;
/// Log hazard of a biased negative control per unit of the unmeasured confounder.
pub const U_HAZARD: f64 = 1.5;
/// Intercept of the treatment model (about half of the persons are target users).
pub const TREATMENT_INTERCEPT: f64 = -1.5;
/// Baseline yearly rate of the outcome of interest (all covariates absent).
pub const OUTCOME_RATE: f64 = 0.03;
/// Concept ids reserved for [`SPECIAL`] at the start of each domain's vocabulary.
const RESERVED: usize = 10;

/// The domain of a baseline concept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaselineDomain {
    /// `condition_occurrence`.
    Condition,
    /// `drug_exposure`.
    Drug,
    /// `procedure_occurrence`.
    Procedure,
}

/// A baseline concept with a fixed prevalence and effects on treatment and outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecialCovariate {
    /// Concept id.
    pub concept_id: i64,
    /// Table it is written to.
    pub domain: BaselineDomain,
    /// Share of persons who have it.
    pub prevalence: f64,
    /// Log-odds of the target when present.
    pub treatment: f64,
    /// Log hazard of the outcome of interest when present.
    pub hazard: f64,
}

const fn special(
    concept_id: i64,
    domain: BaselineDomain,
    prevalence: f64,
    treatment: f64,
    hazard: f64,
) -> SpecialCovariate {
    SpecialCovariate {
        concept_id,
        domain,
        prevalence,
        treatment,
        hazard,
    }
}

/// The measured confounders (both effects), instruments (treatment only) and prognostic
/// covariates (hazard only).
pub const SPECIAL: [SpecialCovariate; 10] = {
    use BaselineDomain::{Condition as C, Drug as D, Procedure as P};
    [
        special(FIRST_CONDITION, C, 0.30, 1.0, 1.0),
        special(FIRST_CONDITION + 1, C, 0.25, 0.9, 0.9),
        special(FIRST_CONDITION + 2, C, 0.20, 0.8, 0.9),
        special(FIRST_DRUG_EXPOSURE, D, 0.25, 0.9, 0.7),
        special(FIRST_DRUG_EXPOSURE + 1, D, 0.20, -0.7, -0.7),
        special(FIRST_PROCEDURE, P, 0.15, 0.8, 0.8),
        special(FIRST_CONDITION + 3, C, 0.20, 0.8, 0.0),
        special(FIRST_DRUG_EXPOSURE + 2, D, 0.20, 0.6, 0.0),
        special(FIRST_CONDITION + 4, C, 0.25, 0.0, 0.8),
        special(FIRST_PROCEDURE + 1, P, 0.15, 0.0, 0.6),
    ]
};

/// Settings of [`write_cohort_store`].
#[derive(Debug, Clone, PartialEq)]
pub struct CohortStoreSettings {
    /// Persons (every one a new user of the target or the comparator).
    pub persons: usize,
    /// Seed.
    pub seed: u64,
    /// Size of the baseline vocabulary (conditions, drugs, procedures together), ≥ 100.
    pub covariates: usize,
    /// Mean number of sparse baseline records per person (Poisson).
    pub records_per_person: f64,
    /// Negative-control outcomes.
    pub negative_controls: usize,
}

impl Default for CohortStoreSettings {
    fn default() -> Self {
        CohortStoreSettings {
            persons: 100_000,
            seed: 1,
            covariates: 12_000,
            records_per_person: 10.0,
            negative_controls: 20,
        }
    }
}

/// Counts of a generated store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CohortStoreSummary {
    /// Persons.
    pub persons: usize,
    /// Target users (the rest are comparator users).
    pub target: usize,
    /// Baseline records written (conditions, drug exposures, procedures).
    pub baseline_records: usize,
    /// Distinct baseline concepts that occur at least once.
    pub baseline_concepts: usize,
    /// Events of the outcome of interest.
    pub outcomes: usize,
    /// Events of the negative controls.
    pub negative_control_outcomes: usize,
    /// Deaths.
    pub deaths: usize,
}

/// Whether negative control `j` (0-based) carries systematic error.
pub fn is_biased(j: usize) -> bool {
    j % BIASED_EVERY == 0
}

/// A domain's sparse vocabulary: its first concept id and the cumulative Zipf weights.
struct Vocabulary {
    first: i64,
    cdf: Vec<f64>,
}

impl Vocabulary {
    fn new(first: i64, size: usize) -> Self {
        let n = size.saturating_sub(RESERVED).max(1);
        let mut cdf = Vec::with_capacity(n);
        let mut total = 0.0;
        for k in 0..n {
            total += 1.0 / (k as f64 + 5.0);
            cdf.push(total);
        }
        for c in &mut cdf {
            *c /= total;
        }
        Vocabulary { first, cdf }
    }

    fn draw(&self, rng: &mut Rng) -> i64 {
        let u = rng.uniform();
        let k = self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1);
        self.first + (RESERVED + k) as i64
    }
}

/// The tables of baseline records and outcomes, with their running row ids.
struct Records {
    condition: Table,
    drug: Table,
    procedure: Table,
    ids: [i64; 3],
}

impl Records {
    /// One record of `concept` on `day` in domain 0 (conditions), 1 (drugs) or 2 (procedures).
    fn push(&mut self, domain: usize, concept: i64, pid: i64, day: i64) {
        self.ids[domain] += 1;
        let id = self.ids[domain];
        match domain {
            0 => self.condition.push(&[id, pid, concept, day, day]),
            1 => self.drug.push(&[id, pid, concept, day, day]),
            _ => self.procedure.push(&[id, pid, concept, day]),
        }
    }
}

fn logistic(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Write a confounded store into `dir` (Parquet; see the [module docs](self)).
pub fn write_cohort_store(dir: &Path, s: &CohortStoreSettings) -> DfResult<CohortStoreSummary> {
    if s.covariates < 100 {
        return Err(exec_datafusion_err!(
            "covariates: a vocabulary of at least 100 concepts, got {}",
            s.covariates
        ));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| exec_datafusion_err!("cannot create {}: {e}", dir.display()))?;
    let i = DataType::Int64;
    let d = DataType::Date32;
    let id_table = |name: &str, id: &str, concept: &str, start: &str, end: Option<&str>| {
        let mut cols = vec![
            (id.to_string(), i.clone()),
            ("person_id".to_string(), i.clone()),
            (concept.to_string(), i.clone()),
            (start.to_string(), d.clone()),
        ];
        if let Some(end) = end {
            cols.push((end.to_string(), d.clone()));
        }
        let cols: Vec<(&str, DataType)> =
            cols.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        Table::create(dir, name, &cols)
    };
    let mut person = Table::create(
        dir,
        "person",
        &[
            ("person_id", i.clone()),
            ("gender_concept_id", i.clone()),
            ("year_of_birth", i.clone()),
            ("month_of_birth", i.clone()),
            ("day_of_birth", i.clone()),
        ],
    )?;
    let mut period = Table::create(
        dir,
        "observation_period",
        &[
            ("observation_period_id", i.clone()),
            ("person_id", i.clone()),
            ("observation_period_start_date", d.clone()),
            ("observation_period_end_date", d.clone()),
        ],
    )?;
    let mut era = id_table(
        "drug_era",
        "drug_era_id",
        "drug_concept_id",
        "drug_era_start_date",
        Some("drug_era_end_date"),
    )?;
    let condition = id_table(
        "condition_occurrence",
        "condition_occurrence_id",
        "condition_concept_id",
        "condition_start_date",
        Some("condition_end_date"),
    )?;
    let drug = id_table(
        "drug_exposure",
        "drug_exposure_id",
        "drug_concept_id",
        "drug_exposure_start_date",
        Some("drug_exposure_end_date"),
    )?;
    let procedure = id_table(
        "procedure_occurrence",
        "procedure_occurrence_id",
        "procedure_concept_id",
        "procedure_date",
        None,
    )?;
    let mut death = Table::create(
        dir,
        "death",
        &[("person_id", i.clone()), ("death_date", d.clone())],
    )?;

    let n_conditions = s.covariates / 2;
    let n_drugs = s.covariates * 35 / 100;
    let n_procedures = s.covariates - n_conditions - n_drugs;
    let vocabularies = [
        Vocabulary::new(FIRST_CONDITION, n_conditions),
        Vocabulary::new(FIRST_DRUG_EXPOSURE, n_drugs),
        Vocabulary::new(FIRST_PROCEDURE, n_procedures),
    ];
    // Which concepts occurred (for the summary): offset within the vocabulary by domain.
    let sizes = [n_conditions, n_drugs, n_procedures];
    let mut seen: Vec<Vec<bool>> = sizes.iter().map(|&n| vec![false; n]).collect();
    let nc_rate: Vec<f64> = (0..s.negative_controls)
        .map(|j| (0.015 + 0.025 * ((j * 7) % 11) as f64 / 10.0) / 365.25)
        .collect();
    let nc_scale: Vec<f64> = (0..s.negative_controls)
        .map(|j| 0.5 + 0.5 * ((j * 3) % 5) as f64 / 4.0)
        .collect();

    let mut rng = Rng::new(s.seed);
    let mut out = CohortStoreSummary {
        persons: s.persons,
        ..Default::default()
    };
    let mut w = Records {
        condition,
        drug,
        procedure,
        ids: [0; 3],
    };
    let first_start = super::days_from_civil(2000, 1, 1);
    for p in 0..s.persons {
        let pid = p as i64 + 1;
        let gender = if rng.bernoulli(0.5) { 8507 } else { 8532 };
        person.push(&[
            pid,
            gender,
            rng.int_range(1930, 2000) as i64,
            rng.int_range(1, 12) as i64,
            rng.int_range(1, 28) as i64,
        ]);
        let start = first_start + rng.int_range(0, 8 * 365) as i64;
        let index = start + 365 + rng.int_range(0, 3 * 365) as i64;
        let end = index + rng.int_range(30, 4 * 365) as i64;
        period.push(&[pid, pid, start, end]);

        // Baseline: the special covariates, then the sparse records.
        let (mut eta_t, mut eta_h) = (TREATMENT_INTERCEPT, 0.0);
        for c in &SPECIAL {
            if rng.bernoulli(c.prevalence) {
                eta_t += c.treatment;
                eta_h += c.hazard;
                let domain = c.domain as usize;
                let day = index - rng.int_range(1, 365) as i64;
                out.baseline_records += 1;
                seen[domain][(c.concept_id - vocabularies[domain].first) as usize] = true;
                w.push(domain, c.concept_id, pid, day);
            }
        }
        for _ in 0..rng.poisson(s.records_per_person) {
            let u = rng.uniform();
            let domain = if u < 0.5 {
                0
            } else if u < 0.85 {
                1
            } else {
                2
            };
            let concept = vocabularies[domain].draw(&mut rng);
            let day = index - rng.int_range(1, 365) as i64;
            out.baseline_records += 1;
            seen[domain][(concept - vocabularies[domain].first) as usize] = true;
            w.push(domain, concept, pid, day);
        }
        let unmeasured = rng.bernoulli(0.3);
        if unmeasured {
            eta_t += U_TREATMENT;
        }
        let target = rng.bernoulli(logistic(eta_t));
        out.target += usize::from(target);
        let drug_concept = if target { TARGET_DRUG } else { COMPARATOR_DRUG };
        era.push(&[
            pid,
            pid,
            drug_concept,
            index,
            index + rng.int_range(29, 364) as i64,
        ]);

        // Outcomes from a second stream: hazards without any treatment term (true HR = 1).
        let mut events =
            Rng::new(s.seed ^ 0x5851_f42d_4c95_7f2d ^ (pid as u64).wrapping_mul(0x9e37));
        let mut event = |rate: f64, concept: i64, w: &mut Records| -> bool {
            // Day `index + 1 + ⌊t⌋` when that is at most `end`.
            let t = events.exponential(rate);
            let inside = t < (end - index) as f64;
            if inside {
                w.push(0, concept, pid, index + 1 + t as i64);
            }
            inside
        };
        let rate = OUTCOME_RATE / 365.25 * eta_h.exp();
        out.outcomes += usize::from(event(rate, OUTCOME_CONCEPT, &mut w));
        for (j, (&base, &scale)) in nc_rate.iter().zip(&nc_scale).enumerate() {
            let mut log_h = scale * eta_h;
            if is_biased(j) && unmeasured {
                log_h += U_HAZARD;
            }
            let concept = OUTCOME_CONCEPT + 1 + j as i64;
            out.negative_control_outcomes +=
                usize::from(event(base * log_h.exp(), concept, &mut w));
        }
        if rng.bernoulli(0.01) {
            out.deaths += 1;
            death.push(&[pid, end]);
        }
        if (p + 1) % 100_000 == 0 {
            for t in [
                &mut person,
                &mut period,
                &mut era,
                &mut w.condition,
                &mut w.drug,
                &mut w.procedure,
                &mut death,
            ] {
                t.flush()?;
            }
        }
    }
    for t in [person, period, era, w.condition, w.drug, w.procedure, death] {
        t.close()?;
    }
    out.baseline_concepts = seen.iter().flatten().filter(|&&b| b).count();
    write_concepts(dir, &sizes, s.negative_controls)?;
    Ok(out)
}

/// The `concept` table: every concept of the store with its domain (the pipeline infers a
/// concept set's table from it) and a name (the covariates' names).
fn write_concepts(dir: &Path, sizes: &[usize; 3], negative_controls: usize) -> DfResult<()> {
    let mut rows: Vec<(i64, String, &str)> = vec![
        (8507, "MALE".into(), "Gender"),
        (8532, "FEMALE".into(), "Gender"),
        (TARGET_DRUG, "target drug".into(), "Drug"),
        (COMPARATOR_DRUG, "comparator drug".into(), "Drug"),
        (OUTCOME_CONCEPT, "outcome of interest".into(), "Condition"),
    ];
    for j in 0..negative_controls {
        let bias = if is_biased(j) { ", biased" } else { "" };
        rows.push((
            OUTCOME_CONCEPT + 1 + j as i64,
            format!("negative control {j}{bias}"),
            "Condition",
        ));
    }
    let domains = [
        (FIRST_CONDITION, "condition", "Condition"),
        (FIRST_DRUG_EXPOSURE, "drug", "Drug"),
        (FIRST_PROCEDURE, "procedure", "Procedure"),
    ];
    for (&(first, what, domain), &n) in domains.iter().zip(sizes) {
        for k in 0..n as i64 {
            let id = first + k;
            let role = SPECIAL.iter().find(|c| c.concept_id == id).map_or("", |c| {
                match (c.treatment != 0.0, c.hazard != 0.0) {
                    (true, true) => " (confounder)",
                    (true, false) => " (instrument)",
                    _ => " (prognostic)",
                }
            });
            rows.push((id, format!("{what} {}{role}", k + 1), domain));
        }
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("concept_id", DataType::Int64, false),
        Field::new("concept_name", DataType::Utf8, false),
        Field::new("domain_id", DataType::Utf8, false),
        Field::new("vocabulary_id", DataType::Utf8, false),
        Field::new("standard_concept", DataType::Utf8, false),
        Field::new("concept_code", DataType::Utf8, false),
    ]));
    let n = rows.len();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.1.as_str()),
            )),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
            Arc::new(StringArray::from(vec!["epifusion synthetic"; n])),
            Arc::new(StringArray::from(vec!["S"; n])),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.0.to_string()),
            )),
        ],
    )?;
    let path = dir.join("concept.parquet");
    let file = File::create(&path)
        .map_err(|e| exec_datafusion_err!("cannot create {}: {e}", path.display()))?;
    let mut w = ArrowWriter::try_new(file, schema, None)?;
    w.write(&batch)?;
    w.close()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_is_seeded_confounded_and_sparse() {
        let dir = std::env::temp_dir().join(format!("epifusion-synth-cm-{}", std::process::id()));
        let s = CohortStoreSettings {
            persons: 20_000,
            negative_controls: 3,
            ..Default::default()
        };
        let a = write_cohort_store(&dir, &s).unwrap();
        let b = write_cohort_store(&dir, &s).unwrap();
        assert_eq!(a, b);
        // Both arms, the target a little under half.
        assert!(a.target > 7_000 && a.target < 11_000, "{a:?}");
        // The vocabulary is the 12,000 concepts; most occur already at 20k persons.
        assert!(a.baseline_concepts > 9_000, "{a:?}");
        assert!(a.baseline_records > 20_000 * 10, "{a:?}");
        assert!(
            a.outcomes > 500 && a.negative_control_outcomes > 500,
            "{a:?}"
        );
        // Negative controls leave the rest of the store unchanged.
        let c = write_cohort_store(
            &dir,
            &CohortStoreSettings {
                negative_controls: 0,
                ..s.clone()
            },
        )
        .unwrap();
        assert_eq!(
            (c.target, c.baseline_records, c.outcomes),
            (a.target, a.baseline_records, a.outcomes)
        );
        assert!(write_cohort_store(
            &dir,
            &CohortStoreSettings {
                covariates: 50,
                ..s
            }
        )
        .is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

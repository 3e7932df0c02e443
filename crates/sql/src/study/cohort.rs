//! New-user cohort designs: from an OMOP store to the long outcome table of `cox_fit` and
//! `fine_gray_fit`, with baseline covariates (DESIGN.md §3.2, OHDSI CohortMethod conventions).
//!
//! The study population, risk windows, outcomes and competing events are one SQL query
//! (`sql/study/cohort_population.sql`), whose `dropped_at` column gives the attrition table; the
//! baseline covariates are a second query (`sql/study/cohort_covariates.sql`) over the kept
//! entries. Both queries key an entry by (`person_id`, `entry_seq`), the entry's number within
//! its person, and work person by person (no global numbering, ordering or aggregate), so a
//! cluster runs them partitioned by person; Rust numbers the entries (`row_id`, in
//! (`person_id`, `entry_seq`) order, which is (person, start, treatment, end) order) and applies
//! the one cross-person step, the common period ([`read_entries`]). The covariate table is the
//! treatment rows (in `row_id` order), then the baseline rows ordered by (`row_id`,
//! `covariate_id`), whatever order the query returns them in. On a cluster the same queries run
//! distributed under one merge node ([`super::cohort_parts`]).
//!
//! # Settings (JSON keys; CohortMethod defaults)
//!
//! | key | meaning | default |
//! |---|---|---|
//! | `target`, `comparator` | concept sets (default domain `drug_era`); treatment 1 / 0 | required |
//! | `outcome` | concept set (default domain `condition_occurrence`) | required |
//! | `competing` | `{"death": bool, "outcome": concept set}`: competing events, whichever comes first | none |
//! | `model` | `cox` (y ∈ {0, 1}; a competing event censors) or `fine_gray` (y ∈ {0, 1, 2}) | cox |
//! | `first_exposure_only` | first entry per person and cohort | false |
//! | `remove_duplicate_subjects` | `keep_all`, `remove_all` (persons in both cohorts), `keep_first` | keep_all |
//! | `washout_days` | days of prior observation required | 0 |
//! | `restrict_to_common_period` | entries starting when both cohorts have entries | false |
//! | `remove_subjects_with_prior_outcome`, `prior_outcome_lookback` | outcome in [start − lookback, risk start − 1] | true, 99999 |
//! | `risk_window_start`, `start_anchor` | first day at risk (`cohort_start` / `cohort_end`) | 0, cohort_start |
//! | `risk_window_end`, `end_anchor` | last day at risk (censored at observation end) | 0, cohort_end |
//! | `censor_at_new_risk_window` | end the window the day before the person's next one | false |
//! | `min_days_at_risk` | | 1 |
//! | `strata` | `gender`, `age_group` (5 years), `index_year`: exact-match strata → `stratum_id` | none |
//! | `covariates` | see [`CovariateSettings`] | FeatureExtraction-like defaults |

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{exec_err, plan_err, Result as DfResult};
use datafusion::prelude::SessionContext;
use serde::Deserialize;

use super::sccs::{covariate_schema, i64_column};
use super::{
    covariate_ref_batch, fill, id_list, query, ConceptSet, CovariateRef, Domain, StudyTables,
    TempTable,
};

/// The population template.
pub const COHORT_POPULATION_SQL: &str = include_str!("../../../../sql/study/cohort_population.sql");
/// The baseline covariate template.
pub const COHORT_COVARIATES_SQL: &str = include_str!("../../../../sql/study/cohort_covariates.sql");
/// Covariate id of the treatment (target = 1), never penalized by convention.
pub const TREATMENT_ID: i64 = 1;

/// Anchor of a risk-window boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CohortAnchor {
    /// The cohort entry's first day.
    CohortStart,
    /// The cohort entry's last day.
    CohortEnd,
}

/// What to do with persons in both cohorts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Duplicates {
    /// Keep every entry.
    #[default]
    KeepAll,
    /// Remove persons found in both cohorts.
    RemoveAll,
    /// Keep the cohort entered first (both removed on a tie).
    KeepFirst,
}

/// Which outcome coding `y` follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeModel {
    /// y = 1 outcome, 0 censored (a competing event censors).
    #[default]
    Cox,
    /// y = 1 outcome, 2 competing event, 0 censored.
    FineGray,
}

/// Exact-match stratification variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StratumBy {
    /// Gender concept.
    Gender,
    /// Five-year age group at cohort start.
    AgeGroup,
    /// Calendar year of cohort start.
    IndexYear,
}

/// Competing events.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Competing {
    /// Death (the `death` table).
    #[serde(default)]
    pub death: bool,
    /// Another outcome.
    #[serde(default)]
    pub outcome: Option<ConceptSet>,
}

/// Baseline covariates (FeatureExtraction-like).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CovariateSettings {
    /// Days before cohort start [365].
    pub lookback_days: i64,
    /// Last day of the window relative to cohort start [0].
    pub end_days: i64,
    /// Gender (analysis 1) [true].
    pub gender: bool,
    /// Five-year age groups (analysis 3) [true].
    pub age_group: bool,
    /// Conditions (analysis 102) [true].
    pub conditions: bool,
    /// Drug exposures (analysis 302) [true].
    pub drugs: bool,
    /// Procedures (analysis 702) [true].
    pub procedures: bool,
    /// Concept ids never used (the target and comparator concepts are always excluded).
    pub excluded_concept_ids: Vec<i64>,
}

impl Default for CovariateSettings {
    fn default() -> Self {
        CovariateSettings {
            lookback_days: 365,
            end_days: 0,
            gender: true,
            age_group: true,
            conditions: true,
            drugs: true,
            procedures: true,
            excluded_concept_ids: Vec::new(),
        }
    }
}

fn yes() -> bool {
    true
}
fn lookback_default() -> i64 {
    99_999
}
fn one() -> i64 {
    1
}
fn cohort_start() -> CohortAnchor {
    CohortAnchor::CohortStart
}
fn cohort_end() -> CohortAnchor {
    CohortAnchor::CohortEnd
}

/// A new-user cohort design (see the module documentation for every key and default).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CohortDesign {
    /// Target (treatment = 1).
    pub target: ConceptSet,
    /// Comparator (treatment = 0).
    pub comparator: ConceptSet,
    /// Outcome.
    pub outcome: ConceptSet,
    /// Competing events.
    #[serde(default)]
    pub competing: Option<Competing>,
    /// Outcome coding.
    #[serde(default)]
    pub model: OutcomeModel,
    /// First entry per person and cohort.
    #[serde(default)]
    pub first_exposure_only: bool,
    /// Persons in both cohorts.
    #[serde(default)]
    pub remove_duplicate_subjects: Duplicates,
    /// Days of prior observation.
    #[serde(default)]
    pub washout_days: i64,
    /// Restrict to the common period.
    #[serde(default)]
    pub restrict_to_common_period: bool,
    /// Remove subjects with a prior outcome.
    #[serde(default = "yes")]
    pub remove_subjects_with_prior_outcome: bool,
    /// Lookback for prior outcomes.
    #[serde(default = "lookback_default")]
    pub prior_outcome_lookback: i64,
    /// Risk window start offset.
    #[serde(default)]
    pub risk_window_start: i64,
    /// Risk window start anchor.
    #[serde(default = "cohort_start")]
    pub start_anchor: CohortAnchor,
    /// Risk window end offset.
    #[serde(default)]
    pub risk_window_end: i64,
    /// Risk window end anchor.
    #[serde(default = "cohort_end")]
    pub end_anchor: CohortAnchor,
    /// Censor at a new risk window.
    #[serde(default)]
    pub censor_at_new_risk_window: bool,
    /// Minimum days at risk.
    #[serde(default = "one")]
    pub min_days_at_risk: i64,
    /// Exact-match strata.
    #[serde(default)]
    pub strata: Vec<StratumBy>,
    /// Baseline covariates.
    #[serde(default)]
    pub covariates: CovariateSettings,
}

impl CohortDesign {
    /// Parse settings JSON.
    pub fn from_json(json: &str) -> DfResult<Self> {
        super::parse_json("cohort", json)
    }

    /// Check every setting; errors name the key.
    pub fn check(&self) -> DfResult<()> {
        self.target.check("target")?;
        self.comparator.check("comparator")?;
        self.outcome.check("outcome")?;
        if let Some(c) = &self.competing {
            if let Some(o) = &c.outcome {
                o.check("competing.outcome")?;
            }
            if !c.death && c.outcome.is_none() {
                return plan_err!("competing: set death = true and/or an outcome");
            }
        }
        for (k, v) in [
            ("washout_days", self.washout_days),
            ("prior_outcome_lookback", self.prior_outcome_lookback),
            ("min_days_at_risk", self.min_days_at_risk),
            ("covariates.lookback_days", self.covariates.lookback_days),
        ] {
            if v < 0 {
                return plan_err!("{k}: days ≥ 0, got {v}");
            }
        }
        if self.start_anchor == self.end_anchor && self.risk_window_end < self.risk_window_start {
            return plan_err!(
                "risk_window_end: {} is before risk_window_start {} (both anchored at the {})",
                self.risk_window_end,
                self.risk_window_start,
                match self.end_anchor {
                    CohortAnchor::CohortStart => "cohort start",
                    CohortAnchor::CohortEnd => "cohort end",
                }
            );
        }
        if self.covariates.end_days < -self.covariates.lookback_days {
            return plan_err!("covariates.end_days: before the lookback window starts");
        }
        if self.model == OutcomeModel::FineGray && self.competing.is_none() {
            return plan_err!("model = fine_gray needs competing events (competing)");
        }
        Ok(())
    }

    fn anchor(a: CohortAnchor, offset: i64) -> String {
        match a {
            CohortAnchor::CohortStart => format!("(start_day + {offset})"),
            CohortAnchor::CohortEnd => format!("(end_day + {offset})"),
        }
    }

    /// The population SQL (a user can run it to see every entry and why it is dropped).
    pub fn population_sql(&self) -> DfResult<String> {
        let tf = |b: bool| if b { "TRUE" } else { "FALSE" }.to_string();
        let mut competing = Vec::new();
        if let Some(c) = &self.competing {
            if c.death {
                competing.push(
                    "SELECT person_id, CAST(death_date AS INT) AS day FROM death WHERE death_date IS NOT NULL"
                        .to_string(),
                );
            }
            if let Some(o) = &c.outcome {
                competing.push(format!(
                    "SELECT person_id, start_day AS day FROM ({}) AS competing_outcome",
                    o.sql(Domain::ConditionOccurrence)
                ));
            }
        }
        if competing.is_empty() {
            competing.push(
                "SELECT CAST(NULL AS BIGINT) AS person_id, CAST(NULL AS INT) AS day WHERE FALSE"
                    .into(),
            );
        }
        let duplicates = match self.remove_duplicate_subjects {
            Duplicates::KeepAll => "keep_all",
            Duplicates::RemoveAll => "remove_all",
            Duplicates::KeepFirst => "keep_first",
        };
        fill(
            COHORT_POPULATION_SQL,
            &[
                ("target", self.target.sql(Domain::DrugEra)),
                ("comparator", self.comparator.sql(Domain::DrugEra)),
                ("outcome", self.outcome.sql(Domain::ConditionOccurrence)),
                ("competing", competing.join("\n  UNION ALL\n  ")),
                ("first_only", tf(self.first_exposure_only)),
                ("duplicates", duplicates.into()),
                ("washout_days", self.washout_days.to_string()),
                ("remove_prior", tf(self.remove_subjects_with_prior_outcome)),
                ("prior_lookback", self.prior_outcome_lookback.to_string()),
                (
                    "risk_start",
                    Self::anchor(self.start_anchor, self.risk_window_start),
                ),
                (
                    "risk_end",
                    Self::anchor(self.end_anchor, self.risk_window_end),
                ),
                ("censor_new_window", tf(self.censor_at_new_risk_window)),
                ("min_days", self.min_days_at_risk.to_string()),
            ],
        )
    }

    /// The covariate SQL over a population table.
    pub(super) fn covariates_sql(
        &self,
        ctx: &SessionContext,
        population: &str,
    ) -> DfResult<String> {
        let c = &self.covariates;
        let has = |t: &str| ctx.table_exist(t).unwrap_or(false);
        let mut excluded_ids: Vec<i64> = c.excluded_concept_ids.clone();
        let mut ancestors = Vec::new();
        for set in [&self.target, &self.comparator] {
            excluded_ids.extend(&set.concept_ids);
            if set.include_descendants {
                ancestors.extend(&set.concept_ids);
            }
        }
        let mut excluded = if excluded_ids.is_empty() {
            "SELECT CAST(NULL AS BIGINT) AS concept_id WHERE FALSE".to_string()
        } else {
            format!(
                "SELECT column1 AS concept_id FROM (VALUES {})",
                excluded_ids
                    .iter()
                    .map(|i| format!("({i})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        if !ancestors.is_empty() && has("concept_ancestor") {
            excluded = format!(
                "{excluded} UNION SELECT descendant_concept_id FROM concept_ancestor WHERE ancestor_concept_id IN ({})",
                id_list(&ancestors)
            );
        }
        let uses = [
            ("use_gender", c.gender, ""),
            ("use_age_group", c.age_group, ""),
            ("use_conditions", c.conditions, "condition_occurrence"),
            ("use_drugs", c.drugs, "drug_exposure"),
            ("use_procedures", c.procedures, "procedure_occurrence"),
        ];
        // Drop the blocks of analyses that are off or whose table the store lacks.
        let blocks: Vec<&str> = COHORT_COVARIATES_SQL
            .split("UNION ALL\n")
            .filter(|block| {
                uses.iter().all(|(key, on, table)| {
                    table.is_empty()
                        || !block.contains(&format!("{{{key}}}"))
                        || (*on && has(table))
                })
            })
            .collect();
        let mut values = vec![
            ("population", population.to_string()),
            ("excluded", excluded),
            ("lookback", c.lookback_days.to_string()),
            ("end_days", c.end_days.to_string()),
        ];
        for (key, on, _) in uses {
            values.push((key, if on { "TRUE" } else { "FALSE" }.to_string()));
        }
        fill(&blocks.join("UNION ALL\n"), &values)
    }
}

/// Schema of the cohort outcome table.
pub fn outcome_schema(stratified: bool) -> SchemaRef {
    let mut fields = vec![Field::new("row_id", DataType::Int64, false)];
    if stratified {
        fields.push(Field::new("stratum_id", DataType::Int64, false));
    }
    fields.extend([
        Field::new("time", DataType::Float64, false),
        Field::new("y", DataType::Float64, false),
        Field::new("person_id", DataType::Int64, false),
        Field::new("treatment", DataType::Int64, false),
        Field::new("cohort_start_day", DataType::Int64, false),
        Field::new("risk_start_day", DataType::Int64, false),
        Field::new("risk_end_day", DataType::Int64, false),
        Field::new("status", DataType::Int64, false),
    ]);
    Arc::new(Schema::new(fields))
}

/// Schema of the cohort attrition table.
pub fn attrition_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("step", DataType::Int64, false),
        Field::new("description", DataType::Utf8, false),
        Field::new("target_persons", DataType::Int64, false),
        Field::new("comparator_persons", DataType::Int64, false),
        Field::new("target_outcomes", DataType::Int64, false),
        Field::new("comparator_outcomes", DataType::Int64, false),
    ]))
}

/// One entry of the population query.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    row_id: i64,
    person_id: i64,
    entry_seq: i64,
    treatment: i64,
    start_day: i64,
    birth_day: Option<i64>,
    gender: Option<i64>,
    risk_start: i64,
    risk_end: i64,
    status: i64,
    time: i64,
    pub(super) dropped_at: i64,
}

/// The key of an entry in the population and covariate queries: (person_id, entry_seq).
pub(super) type EntryKey = (i64, i64);

/// The population query's entries in (`person_id`, `entry_seq`) order, however the rows
/// arrived, numbered `row_id` = 1, 2, … in that order, with the common-period step (5) of `d`
/// applied (the query leaves it to the caller: it is one range over every person's entries).
///
/// Each person's entries must be numbered 1..n exactly once: anything else means the query
/// lost or repeated a row (a distributed engine's wrong result), and is an error rather than a
/// quietly wrong cohort.
pub(super) fn read_entries(d: &CohortDesign, batches: &[RecordBatch]) -> DfResult<Vec<Entry>> {
    let mut out = Vec::new();
    for b in batches {
        let c = |n: &str| i64_column(b, n);
        let (person, seq, treatment, start) = (
            c("person_id")?,
            c("entry_seq")?,
            c("treatment")?,
            c("start_day")?,
        );
        let (birth, gender, rs, re) = (
            c("birth_day")?,
            c("gender_concept_id")?,
            c("risk_start")?,
            c("risk_end")?,
        );
        let (status, time, dropped) = (c("status")?, c("days_at_risk_or_event")?, c("dropped_at")?);
        for i in 0..b.num_rows() {
            let opt = |a: &Int64Array| (!a.is_null(i)).then(|| a.value(i));
            let p = person.value(i);
            let need = |a: &Int64Array, what: &str| match opt(a) {
                Some(v) => Ok(v),
                None => exec_err!("cohort entry of person_id {p}: {what} is NULL"),
            };
            out.push(Entry {
                row_id: 0,
                person_id: p,
                entry_seq: seq.value(i),
                treatment: treatment.value(i),
                start_day: need(&start, "start date")?,
                birth_day: opt(&birth),
                gender: opt(&gender),
                risk_start: need(&rs, "risk window start")?,
                risk_end: need(&re, "risk window end (observation_period_end_date)")?,
                status: status.value(i),
                time: need(&time, "time at risk")?,
                dropped_at: dropped.value(i),
            });
        }
    }
    out.sort_unstable_by_key(|e| (e.person_id, e.entry_seq));
    for (i, e) in out.iter_mut().enumerate() {
        e.row_id = i as i64 + 1;
    }
    for (i, e) in out.iter().enumerate() {
        let expected = match i.checked_sub(1).map(|j| &out[j]) {
            Some(prev) if prev.person_id == e.person_id => prev.entry_seq + 1,
            _ => 1,
        };
        if e.entry_seq != expected {
            return exec_err!(
                "cohort population: person_id {}'s entries are not numbered 1, 2, … once each \
                 (entry {} where {expected} was due): the population query lost or repeated a row",
                e.person_id,
                e.entry_seq
            );
        }
    }
    if d.restrict_to_common_period {
        // CohortMethod's common period: from the later of the two cohorts' first starts to the
        // earlier of their last starts, over the entries that pass steps 2–4 (empty when either
        // cohort has none: every entry is then dropped here).
        let passed = |e: &&Entry| matches!(e.dropped_at, 0 | 6 | 7);
        let starts = |t: i64| {
            out.iter()
                .filter(passed)
                .filter(move |e| e.treatment == t)
                .map(|e| e.start_day)
        };
        let range = match (
            starts(1).min().zip(starts(0).min()),
            starts(1).max().zip(starts(0).max()),
        ) {
            (Some((a, b)), Some((c, d))) => Some((a.max(b), c.min(d))),
            _ => None,
        };
        for e in out.iter_mut().filter(|e| matches!(e.dropped_at, 0 | 6 | 7)) {
            if !range.is_some_and(|(lo, hi)| (lo..=hi).contains(&e.start_day)) {
                e.dropped_at = 5;
            }
        }
    }
    Ok(out)
}

/// The attrition table of the population query's entries.
pub(super) fn attrition(d: &CohortDesign, entries: &[Entry]) -> DfResult<RecordBatch> {
    let steps: [(i64, String, bool); 7] = [
        (
            1,
            "exposed and starting in an observation period".into(),
            true,
        ),
        (2, "first exposure only".into(), d.first_exposure_only),
        (
            3,
            match d.remove_duplicate_subjects {
                Duplicates::RemoveAll => "persons in both cohorts removed".to_string(),
                _ => "persons in both cohorts: first cohort kept".to_string(),
            },
            d.remove_duplicate_subjects != Duplicates::KeepAll,
        ),
        (
            4,
            format!("at least {} days of prior observation", d.washout_days),
            d.washout_days > 0,
        ),
        (5, "common period".into(), d.restrict_to_common_period),
        (
            6,
            "no prior outcome".into(),
            d.remove_subjects_with_prior_outcome,
        ),
        (
            7,
            format!("at least {} days at risk", d.min_days_at_risk),
            true,
        ),
    ];
    let mut rows: Vec<(String, [i64; 4])> = Vec::new();
    for (step, name, active) in steps {
        if !active {
            continue;
        }
        let mut persons = [BTreeSet::new(), BTreeSet::new()];
        let mut outcomes = [0i64; 2];
        for e in entries
            .iter()
            .filter(|e| e.dropped_at == 0 || e.dropped_at > step)
        {
            let g = usize::from(e.treatment != 1);
            persons[g].insert(e.person_id);
            outcomes[g] += i64::from(e.status == 1);
        }
        rows.push((
            name,
            [
                persons[0].len() as i64,
                persons[1].len() as i64,
                outcomes[0],
                outcomes[1],
            ],
        ));
    }
    let col = |k: usize| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1[k])))
    };
    Ok(RecordBatch::try_new(
        attrition_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(1..=rows.len() as i64)),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.0.as_str()),
            )),
            col(0),
            col(1),
            col(2),
            col(3),
        ],
    )?)
}

/// Day number → calendar year.
fn year_of(day: i64) -> i64 {
    super::civil_from_days(day).0
}

/// Build the cohort tables of a design from the OMOP tables registered in `ctx`.
pub async fn build_cohort(ctx: &SessionContext, d: &CohortDesign) -> DfResult<StudyTables> {
    d.check()?;
    let entries = read_entries(d, &query(ctx, &d.population_sql()?).await?)?;
    let attrition = attrition(d, &entries)?;
    let kept: Vec<&Entry> = entries.iter().filter(|e| e.dropped_at == 0).collect();
    let outcomes = outcome_batch(d, &kept)?;

    // Covariates: treatment, then the baseline covariates of the kept entries.
    let temp = TempTable::register(
        ctx,
        "cohort_population",
        population_schema(),
        vec![population_batch(&kept)?],
    )?;
    let baseline = query(ctx, &d.covariates_sql(ctx, &temp.name)?).await?;
    drop(temp);
    let (baseline, refs) = baseline_covariates(&baseline, &row_ids(&kept))?;
    let names = concept_names(ctx, &refs).await?;
    Ok(StudyTables {
        outcomes: vec![outcomes],
        covariates: vec![treatment_covariates(&kept)?, baseline],
        covariate_ref: vec![covariate_ref_table(refs, &names)?],
        attrition: vec![attrition],
    })
}

/// The outcome table of the kept entries (in `row_id` order), with strata when asked for:
/// exact matches on the chosen variables, numbered in sorted order.
pub(super) fn outcome_batch(d: &CohortDesign, kept: &[&Entry]) -> DfResult<RecordBatch> {
    let stratified = !d.strata.is_empty();
    let key = |e: &Entry| -> Vec<Option<i64>> {
        d.strata
            .iter()
            .map(|s| match s {
                StratumBy::Gender => e.gender,
                StratumBy::AgeGroup => e
                    .birth_day
                    .map(|b| ((e.start_day - b) as f64 / 365.25 / 5.0).floor() as i64),
                StratumBy::IndexYear => Some(year_of(e.start_day)),
            })
            .collect()
    };
    let strata: BTreeMap<Vec<Option<i64>>, i64> = kept
        .iter()
        .map(|e| key(e))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .zip(1..)
        .collect();
    let y = |e: &Entry| match (d.model, e.status) {
        (OutcomeModel::FineGray, s) => s as f64,
        (OutcomeModel::Cox, 1) => 1.0,
        (OutcomeModel::Cox, _) => 0.0,
    };
    let mut cols: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(
        kept.iter().map(|e| e.row_id),
    ))];
    if stratified {
        cols.push(Arc::new(Int64Array::from_iter_values(
            kept.iter().map(|e| strata[&key(e)]),
        )));
    }
    cols.extend([
        Arc::new(Float64Array::from_iter_values(
            kept.iter().map(|e| e.time as f64),
        )) as ArrayRef,
        Arc::new(Float64Array::from_iter_values(kept.iter().map(|e| y(e)))),
        Arc::new(Int64Array::from_iter_values(
            kept.iter().map(|e| e.person_id),
        )),
        Arc::new(Int64Array::from_iter_values(
            kept.iter().map(|e| e.treatment),
        )),
        Arc::new(Int64Array::from_iter_values(
            kept.iter().map(|e| e.start_day),
        )),
        Arc::new(Int64Array::from_iter_values(
            kept.iter().map(|e| e.risk_start),
        )),
        Arc::new(Int64Array::from_iter_values(
            kept.iter().map(|e| e.risk_end),
        )),
        Arc::new(Int64Array::from_iter_values(kept.iter().map(|e| e.status))),
    ]);
    Ok(RecordBatch::try_new(outcome_schema(stratified), cols)?)
}

/// The columns of the kept population that the covariate query reads.
pub(super) const POPULATION_COLUMNS: [&str; 5] = [
    "person_id",
    "entry_seq",
    "start_day",
    "birth_day",
    "gender_concept_id",
];

/// Schema of the kept population that the covariate query reads ([`POPULATION_COLUMNS`]).
fn population_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(POPULATION_COLUMNS[0], DataType::Int64, false),
        Field::new(POPULATION_COLUMNS[1], DataType::Int64, false),
        Field::new(POPULATION_COLUMNS[2], DataType::Int64, false),
        Field::new(POPULATION_COLUMNS[3], DataType::Int64, true),
        Field::new(POPULATION_COLUMNS[4], DataType::Int64, true),
    ]))
}

/// The kept population as the covariate query reads it.
fn population_batch(kept: &[&Entry]) -> DfResult<RecordBatch> {
    Ok(RecordBatch::try_new(
        population_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(
                kept.iter().map(|e| e.person_id),
            )),
            Arc::new(Int64Array::from_iter_values(
                kept.iter().map(|e| e.entry_seq),
            )),
            Arc::new(Int64Array::from_iter_values(
                kept.iter().map(|e| e.start_day),
            )),
            Arc::new(Int64Array::from_iter(kept.iter().map(|e| e.birth_day))),
            Arc::new(Int64Array::from_iter(kept.iter().map(|e| e.gender))),
        ],
    )?)
}

/// The treatment covariate (1 for each kept target entry, in `row_id` order).
pub(super) fn treatment_covariates(kept: &[&Entry]) -> DfResult<RecordBatch> {
    let treated: Vec<i64> = kept
        .iter()
        .filter(|e| e.treatment == 1)
        .map(|e| e.row_id)
        .collect();
    let n = treated.len();
    Ok(RecordBatch::try_new(
        covariate_schema(),
        vec![
            Arc::new(Int64Array::from(treated)),
            Arc::new(Int64Array::from(vec![TREATMENT_ID; n])),
            Arc::new(Float64Array::from(vec![1.0; n])),
        ],
    )?)
}

/// What the baseline covariate query found for the entries of `row_ids` (entry key →
/// `row_id`; rows of other entries are skipped): its rows as covariates (value 1), in
/// (`row_id`, `covariate_id`) order whatever order they arrived in, and each covariate's
/// analysis and concept.
///
/// The query gives each (entry, covariate) once (each analysis has its own id suffix and its
/// block is DISTINCT): a repeated row is a distributed engine's wrong result and an error.
pub(super) fn baseline_covariates(
    baseline: &[RecordBatch],
    row_ids: &HashMap<EntryKey, i64>,
) -> DfResult<(RecordBatch, CovariateOrigins)> {
    let mut refs = CovariateOrigins::new();
    let mut pairs: Vec<(i64, i64)> = Vec::new();
    for b in baseline {
        let (person, seq, cov, analysis, concept) = (
            i64_column(b, "person_id")?,
            i64_column(b, "entry_seq")?,
            i64_column(b, "covariate_id")?,
            i64_column(b, "analysis_id")?,
            i64_column(b, "concept_id")?,
        );
        for i in 0..b.num_rows() {
            if person.is_null(i) || seq.is_null(i) || cov.is_null(i) {
                return exec_err!(
                    "cohort covariates: a row with a NULL person_id, entry_seq or covariate_id"
                );
            }
            let Some(&row) = row_ids.get(&(person.value(i), seq.value(i))) else {
                continue;
            };
            refs.entry(cov.value(i)).or_insert((
                analysis.value(i),
                (!concept.is_null(i)).then(|| concept.value(i)),
            ));
            pairs.push((row, cov.value(i)));
        }
    }
    pairs.sort_unstable();
    if let Some(w) = pairs.windows(2).find(|w| w[0] == w[1]) {
        return exec_err!(
            "cohort covariates: covariate {} of row_id {} came back twice: the covariate query \
             repeated a row",
            w[0].1,
            w[0].0
        );
    }
    let batch = RecordBatch::try_new(
        covariate_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(pairs.iter().map(|p| p.0))),
            Arc::new(Int64Array::from_iter_values(pairs.iter().map(|p| p.1))),
            Arc::new(Float64Array::from(vec![1.0; pairs.len()])),
        ],
    )?;
    Ok((batch, refs))
}

/// The `row_id` of each kept entry, by entry key.
pub(super) fn row_ids(kept: &[&Entry]) -> HashMap<EntryKey, i64> {
    kept.iter()
        .map(|e| ((e.person_id, e.entry_seq), e.row_id))
        .collect()
}

/// Each baseline covariate's (analysis id, concept id), by covariate id.
pub(super) type CovariateOrigins = BTreeMap<i64, (i64, Option<i64>)>;

/// The covariate reference: the treatment, then every baseline covariate in id order, named
/// from `names` (concept id → concept name).
pub(super) fn covariate_ref_table(
    refs: CovariateOrigins,
    names: &BTreeMap<i64, String>,
) -> DfResult<RecordBatch> {
    let mut covariate_ref = vec![CovariateRef {
        covariate_id: TREATMENT_ID,
        name: "treatment (target = 1, comparator = 0)".into(),
        analysis_id: 0,
        analysis_name: "treatment".into(),
        concept_id: None,
    }];
    for (id, (analysis, concept)) in refs {
        let concept_name = concept
            .and_then(|c| names.get(&c).cloned())
            .unwrap_or_default();
        let (analysis_name, name) = match analysis {
            1 => ("gender", format!("gender = {concept_name}")),
            3 => (
                "age group",
                format!("age group: {}-{}", (id / 1000) * 5, (id / 1000) * 5 + 4),
            ),
            102 => (
                "condition occurrence long term",
                format!("condition: {concept_name}"),
            ),
            302 => ("drug exposure long term", format!("drug: {concept_name}")),
            _ => (
                "procedure occurrence long term",
                format!("procedure: {concept_name}"),
            ),
        };
        covariate_ref.push(CovariateRef {
            covariate_id: id,
            name,
            analysis_id: analysis,
            analysis_name: analysis_name.into(),
            concept_id: concept,
        });
    }
    covariate_ref_batch(&covariate_ref)
}

/// Concept names of the covariates' concepts (empty when the store has no `concept` table).
pub(super) async fn concept_names(
    ctx: &SessionContext,
    refs: &BTreeMap<i64, (i64, Option<i64>)>,
) -> DfResult<BTreeMap<i64, String>> {
    let ids: BTreeSet<i64> = refs.values().filter_map(|r| r.1).collect();
    let mut out = BTreeMap::new();
    if ids.is_empty() || !ctx.table_exist("concept")? {
        return Ok(out);
    }
    let ids: Vec<i64> = ids.into_iter().collect();
    for chunk in ids.chunks(10_000) {
        let sql = format!(
            "SELECT concept_id, CAST(concept_name AS VARCHAR) AS concept_name FROM concept WHERE concept_id IN ({})",
            id_list(chunk)
        );
        for b in query(ctx, &sql).await? {
            let id = i64_column(&b, "concept_id")?;
            let name = datafusion::arrow::compute::cast(
                b.column_by_name("concept_name").expect("selected"),
                &DataType::Utf8,
            )?;
            let name = name
                .as_any()
                .downcast_ref::<StringArray>()
                .expect("cast to Utf8");
            for i in 0..b.num_rows() {
                if !name.is_null(i) {
                    out.insert(id.value(i), name.value(i).to_string());
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_errors_name_the_key() {
        let base = r#""target": {"concept_ids": [1]}, "comparator": {"concept_ids": [2]}, "outcome": {"concept_ids": [3]}"#;
        let bad = |extra: &str, key: &str| {
            let json = format!("{{{base}{extra}}}");
            let e = CohortDesign::from_json(&json)
                .and_then(|d| d.check().map(|_| d))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{e} should name {key}");
        };
        bad(r#", "washout": 3"#, "washout");
        bad(r#", "washout_days": -3"#, "washout_days");
        bad(r#", "washout_days": "x""#, "washout_days");
        bad(r#", "model": "fine_gray""#, "competing");
        bad(
            r#", "remove_duplicate_subjects": "some""#,
            "remove_duplicate_subjects",
        );
        bad(r#", "covariates": {"lookback": 3}"#, "lookback");
        let ok = CohortDesign::from_json(&format!("{{{base}}}")).unwrap();
        ok.check().unwrap();
        assert!(ok.remove_subjects_with_prior_outcome);
        assert_eq!(ok.min_days_at_risk, 1);
        assert!(ok.population_sql().unwrap().contains("drug_era"));
    }

    /// A population-query result of (person_id, entry_seq, treatment, start_day, dropped_at)
    /// rows (the other columns constant).
    type Row = (i64, i64, i64, i64, i64);

    fn population(rows: &[Row]) -> RecordBatch {
        let col = |f: &dyn Fn(&Row) -> i64| -> ArrayRef {
            Arc::new(Int64Array::from_iter_values(rows.iter().map(f)))
        };
        RecordBatch::try_from_iter([
            ("person_id", col(&|r| r.0)),
            ("entry_seq", col(&|r| r.1)),
            ("treatment", col(&|r| r.2)),
            ("start_day", col(&|r| r.3)),
            ("birth_day", col(&|_| 0)),
            ("gender_concept_id", col(&|_| 8507)),
            ("risk_start", col(&|r| r.3)),
            ("risk_end", col(&|r| r.3 + 10)),
            ("status", col(&|_| 0)),
            ("days_at_risk_or_event", col(&|_| 11)),
            ("dropped_at", col(&|r| r.4)),
        ])
        .unwrap()
    }

    #[test]
    fn entries_are_numbered_by_person_and_the_common_period_applied() {
        let base = r#""target": {"concept_ids": [1]}, "comparator": {"concept_ids": [2]}, "outcome": {"concept_ids": [3]}"#;
        let d = |common: bool| {
            CohortDesign::from_json(&format!(
                "{{{base}, \"restrict_to_common_period\": {common}}}"
            ))
            .unwrap()
        };
        // Rows arrive out of order. Steps 2–4 pass for: targets starting 100 and 300,
        // comparators 50, 200, 150 and 400 (the last two dropped later, at steps 6 and 7): the
        // common period is [max(100, 50), min(300, 400)] = [100, 300]. The target of person 5
        // (start 10) was dropped at step 4 and does not widen it.
        let batch = population(&[
            (3, 1, 1, 300, 0),
            (1, 2, 0, 400, 7),
            (1, 1, 1, 100, 0),
            (2, 1, 0, 50, 0),
            (4, 1, 0, 200, 0),
            (5, 1, 1, 10, 4),
            (6, 1, 0, 150, 6),
        ]);
        let got = |common: bool| {
            read_entries(&d(common), std::slice::from_ref(&batch))
                .unwrap()
                .iter()
                .map(|e| (e.row_id, e.person_id, e.entry_seq, e.dropped_at))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            got(false),
            [
                (1, 1, 1, 0),
                (2, 1, 2, 7),
                (3, 2, 1, 0),
                (4, 3, 1, 0),
                (5, 4, 1, 0),
                (6, 5, 1, 4),
                (7, 6, 1, 6)
            ]
        );
        assert_eq!(
            got(true),
            [
                (1, 1, 1, 0),
                (2, 1, 2, 5),
                (3, 2, 1, 5),
                (4, 3, 1, 0),
                (5, 4, 1, 0),
                (6, 5, 1, 4),
                (7, 6, 1, 6)
            ]
        );
        // No comparator passes steps 2–4: no common period, every such entry is dropped at 5.
        let lone = population(&[(1, 1, 1, 100, 0), (2, 1, 0, 50, 3)]);
        let e = read_entries(&d(true), &[lone]).unwrap();
        assert_eq!(e.iter().map(|e| e.dropped_at).collect::<Vec<_>>(), [5, 3]);
        // A lost or repeated entry is an error naming the person.
        for rows in [
            vec![(1, 1, 1, 100, 0), (1, 1, 0, 50, 0)],
            vec![(1, 2, 1, 100, 0)],
            vec![(1, 1, 1, 100, 0), (1, 3, 0, 50, 0)],
        ] {
            let e = read_entries(&d(false), &[population(&rows)])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("person_id 1") && e.contains("lost or repeated"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_repeated_covariate_row_is_an_error() {
        let rows = |seq: &[i64]| {
            RecordBatch::try_from_iter([
                (
                    "person_id",
                    Arc::new(Int64Array::from(vec![7; seq.len()])) as ArrayRef,
                ),
                ("entry_seq", Arc::new(Int64Array::from(seq.to_vec()))),
                (
                    "covariate_id",
                    Arc::new(Int64Array::from(vec![8507001; seq.len()])),
                ),
                (
                    "analysis_id",
                    Arc::new(Int64Array::from(vec![1; seq.len()])),
                ),
                (
                    "concept_id",
                    Arc::new(Int64Array::from(vec![8507; seq.len()])),
                ),
            ])
            .unwrap()
        };
        let ids: HashMap<EntryKey, i64> = [((7, 1), 4), ((7, 2), 5)].into();
        // Rows of entries that are not kept (seq 3) are skipped.
        let (b, refs) = baseline_covariates(&[rows(&[2, 3, 1])], &ids).unwrap();
        assert_eq!(i64_column(&b, "row_id").unwrap().values(), &[4, 5]);
        assert_eq!(refs.len(), 1);
        let e = baseline_covariates(&[rows(&[1]), rows(&[2, 1])], &ids)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("covariate 8507001 of row_id 4 came back twice"),
            "{e}"
        );
    }
}

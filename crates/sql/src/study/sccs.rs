//! Self-controlled case series: from an OMOP store to the long interval table of `sccs_fit`
//! (DESIGN.md §3.1, OHDSI SelfControlledCaseSeries conventions).
//!
//! 1. **Study population** (SQL, `sql/study/sccs_cases.sql`): cases are observation periods with
//!    at least one outcome; first outcome only, gender, study period, minimum / maximum age and
//!    the naive period narrow each case's window `[start_day, end_day]`; cases left without an
//!    outcome are dropped, step by step, with counts for the attrition table.
//! 2. **Eras and outcomes per case** (SQL, `sql/study/sccs_case_rows.sql`).
//! 3. **Intervals** (Rust, [`split_case`]): per exposure group, eras that overlap or touch are
//!    merged, risk windows are placed (anchored at era start or end), each cut the day before the
//!    next merged era of the group starts, split into sub-windows at its `split_points` and
//!    clipped to the case window; age groups, the end-of-observation probe and, when asked for,
//!    calendar-month age / season / calendar-time splines add covariates; the case is cut at
//!    every window boundary, a case with a single elementary interval is dropped, and intervals
//!    with identical covariates are merged.
//!
//! # Settings (JSON keys; OHDSI defaults)
//!
//! | key | meaning | default |
//! |---|---|---|
//! | `outcome` | concept set (default domain `condition_occurrence`) | required |
//! | `exposures` | list of exposure settings (below) | required, ≥ 1 |
//! | `first_outcome_only` | keep each person's first outcome only (before the naive period) | false |
//! | `naive_period` | days at the start of each observation period left out | 0 |
//! | `min_age`, `max_age` | age limits in years (OHDSI: days ≥ min·365.25, < (max+1)·365.25) | none |
//! | `genders` | gender concept ids kept | all |
//! | `study_start_date`, `study_end_date` | `YYYY-MM-DD` | none |
//! | `age_group_starts` | ages in days where age groups 2, 3, … start (SCCS R `agegrp`, Stata); ids 101, 102, … | none |
//! | `age_spline`, `season_spline`, `calendar_spline` | `{"knots": k}` or `{"knots_at": [...]}`: quadratic B-splines, constant per calendar month; ids 101+, 201+, 301+ | none |
//! | `end_of_observation_probe` | days before observation end covered by covariate 99 (OHDSI: 30) | none |
//! | `merge_patterns` | merge intervals with identical covariates within a case | true |
//! | `restrict_time_to_exposure` | index of an exposure: study period narrowed to its first era start … last era end | none |
//!
//! Exposure settings: the concept-set keys (`concept_ids`, `include_descendants`, `cohort_ids`,
//! `sql`, `domain` [`drug_era`], `persistence_days`), `label`, `id` (covariate id of the first
//! covariate; default: the next free id from 1000), `stratify_by_id` [false] (one covariate per
//! concept id), `first_occurrence_only` [false], and `risk_windows` (each `start` [0],
//! `start_anchor` [`era_start`], `end` [0], `end_anchor` [`era_end`], `label`, `split_points`
//! [none]; default one "while exposed" window; a window with `start` < 0 before era start is a
//! pre-exposure window).
//!
//! # Split risk windows
//!
//! `split_points` are the first days of the later sub-windows of a window, as offsets from the
//! window's first day (the SCCS R package's `expogrp` without its leading 0, Stata's
//! `riskpoints`): `{"start": 0, "end": 0, "end_anchor": "era_end", "split_points": [15, 43]}` is
//! `[s, s+14]`, `[s+15, s+42]`, `[s+43, era end]` with `s` the era start, each its own covariate.
//! The window is placed and cut (the day before the next merged era of its group, so a later
//! dose replaces the rest of an earlier dose's window) as a whole, then split: a sub-window is
//! clipped at the window's end, and one that would start after it is empty (no days). Offsets
//! are ≥ 1 and strictly increasing; in a window whose ends share an anchor (fixed length
//! `end − start + 1` days) each is below that length.
//!
//! Covariate ids are numbered from `id` (or the next free id from 1000) in the order exposure
//! setting → concept id (when `stratify_by_id`, ascending) → window → sub-window; the covariate
//! reference names a sub-window by its days from the window's start (`…, days 0–14`, `…, days
//! 15–42`, `…, days 43–end`; the last day is a number when the window has a fixed length).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{exec_datafusion_err, exec_err, plan_err, Result as DfResult};
use datafusion::prelude::SessionContext;
use serde::Deserialize;

use super::{
    civil_from_days, covariate_ref_batch, days_from_civil, fill, parse_date, query, ConceptSet,
    CovariateRef, Domain, StudyTables, TempTable,
};

/// The study-population template.
pub const SCCS_CASES_SQL: &str = include_str!("../../../../sql/study/sccs_cases.sql");
/// Rows of a concept set for the kept cases.
pub const SCCS_CASE_ROWS_SQL: &str = include_str!("../../../../sql/study/sccs_case_rows.sql");

/// The `x` of the row of a partitioned build's `concepts` query that counts the eras of
/// `restrict_time_to_exposure`'s exposure ([`SccsDesign::exposure_era_count_sql`]).
pub const RANGE_ROW: i64 = -2;

/// Covariate id of the end-of-observation probe.
pub const PROBE_ID: i64 = 99;
/// First covariate id of age effects (groups or spline), season and calendar time.
pub const AGE_BASE: i64 = 100;
/// First covariate id of season effects.
pub const SEASON_BASE: i64 = 200;
/// First covariate id of calendar-time effects.
pub const CALENDAR_BASE: i64 = 300;
/// First exposure covariate id.
pub const EXPOSURE_BASE: i64 = 1000;

/// Where a risk window boundary is anchored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Anchor {
    /// The era's first day.
    EraStart,
    /// The era's last day.
    EraEnd,
}

impl Anchor {
    /// The anchor in words ("era start", "era end").
    pub fn words(self) -> &'static str {
        match self {
            Anchor::EraStart => "era start",
            Anchor::EraEnd => "era end",
        }
    }
}

/// One risk window of an exposure.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RiskWindow {
    /// Offset of the first day [0].
    #[serde(default)]
    pub start: i64,
    /// Anchor of the first day [era_start].
    #[serde(default = "era_start")]
    pub start_anchor: Anchor,
    /// Offset of the last day [0].
    #[serde(default)]
    pub end: i64,
    /// Anchor of the last day [era_end].
    #[serde(default = "era_end")]
    pub end_anchor: Anchor,
    /// Name in the covariate reference.
    #[serde(default)]
    pub label: Option<String>,
    /// First day of each later sub-window, as an offset (≥ 1, strictly increasing) from the
    /// window's first day [none: one covariate for the whole window].
    #[serde(default)]
    pub split_points: Vec<i64>,
}

impl RiskWindow {
    /// The window's length in days when both ends share an anchor (`end − start + 1`).
    pub fn fixed_length(&self) -> Option<i64> {
        (self.start_anchor == self.end_anchor).then(|| self.end - self.start + 1)
    }

    /// Sub-windows as (first offset, last offset) from the window's first day; the last one's
    /// last offset is `None` (the window's end). One sub-window without `split_points`.
    pub fn sub_windows(&self) -> Vec<(i64, Option<i64>)> {
        let mut out = Vec::with_capacity(self.split_points.len() + 1);
        let mut from = 0;
        for &p in &self.split_points {
            out.push((from, Some(p - 1)));
            from = p;
        }
        out.push((from, None));
        out
    }

    /// Check the window (`key` names it in errors: `exposures[0].risk_windows[1]`).
    fn check(&self, key: &str) -> DfResult<()> {
        if self.start_anchor == self.end_anchor && self.end < self.start {
            return plan_err!(
                "{key}.end: {} is before start {} (both anchored at the {})",
                self.end,
                self.start,
                self.end_anchor.words()
            );
        }
        let points = &self.split_points;
        if let Some(p) = points.iter().find(|&&p| p <= 0) {
            return plan_err!(
                "{key}.split_points: offsets ≥ 1 from the window's first day (the first \
                 sub-window starts at 0 without one), got {p}"
            );
        }
        if let Some(w) = points.windows(2).find(|w| w[1] <= w[0]) {
            return plan_err!(
                "{key}.split_points: strictly increasing offsets, got {} after {}",
                w[1],
                w[0]
            );
        }
        if let Some(len) = self.fixed_length() {
            if let Some(p) = points.iter().find(|&&p| p >= len) {
                return plan_err!(
                    "{key}.split_points: {p} is beyond the window's length: start {} to end {} \
                     (both anchored at the {}) is {len} days, offsets 0–{}, so the sub-window \
                     starting at {p} would never hold a day",
                    self.start,
                    self.end,
                    self.end_anchor.words(),
                    len - 1
                );
            }
        }
        Ok(())
    }
}

fn era_start() -> Anchor {
    Anchor::EraStart
}
fn era_end() -> Anchor {
    Anchor::EraEnd
}
fn yes() -> bool {
    true
}

impl Default for RiskWindow {
    fn default() -> Self {
        RiskWindow {
            start: 0,
            start_anchor: Anchor::EraStart,
            end: 0,
            end_anchor: Anchor::EraEnd,
            label: None,
            split_points: Vec::new(),
        }
    }
}

/// One exposure of an SCCS design.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SccsExposure {
    /// Concept ids.
    #[serde(default)]
    pub concept_ids: Vec<i64>,
    /// Include descendants through `concept_ancestor`.
    #[serde(default)]
    pub include_descendants: bool,
    /// Cohort ids.
    #[serde(default)]
    pub cohort_ids: Vec<i64>,
    /// A query returning `person_id, concept_id, start_date, end_date`.
    #[serde(default)]
    pub sql: Option<String>,
    /// CDM table of the concept ids [drug_era].
    #[serde(default)]
    pub domain: Option<Domain>,
    /// Persistence window of `derived_drug_era` [30].
    #[serde(default)]
    pub persistence_days: Option<i64>,
    /// Name in the covariate reference.
    #[serde(default)]
    pub label: Option<String>,
    /// Covariate id of the first covariate: first concept (when stratified), first window, first
    /// sub-window (default: next free id from 1000).
    #[serde(default)]
    pub id: Option<i64>,
    /// Risk windows [one "while exposed" window].
    #[serde(default)]
    pub risk_windows: Vec<RiskWindow>,
    /// One covariate per concept id instead of one for the set.
    #[serde(default)]
    pub stratify_by_id: bool,
    /// Keep the first (merged) era of each group only.
    #[serde(default)]
    pub first_occurrence_only: bool,
}

impl SccsExposure {
    pub(super) fn concept_set(&self) -> ConceptSet {
        ConceptSet {
            concept_ids: self.concept_ids.clone(),
            include_descendants: self.include_descendants,
            cohort_ids: self.cohort_ids.clone(),
            sql: self.sql.clone(),
            domain: self.domain,
            persistence_days: self.persistence_days,
        }
    }
}

/// Spline settings: a number of knots (placed at quantiles of the outcomes) or the knots.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SplineSettings {
    /// Number of knots, boundaries included [5].
    #[serde(default)]
    pub knots: Option<usize>,
    /// Knot positions (age: days of age; calendar: day numbers since 1970-01-01; season:
    /// months 0–12).
    #[serde(default)]
    pub knots_at: Option<Vec<f64>>,
}

/// An SCCS design (see the module documentation for every key and default).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SccsDesign {
    /// Outcome concept set.
    pub outcome: ConceptSet,
    /// Exposures.
    pub exposures: Vec<SccsExposure>,
    /// First outcome only.
    #[serde(default)]
    pub first_outcome_only: bool,
    /// Naive period in days.
    #[serde(default)]
    pub naive_period: i64,
    /// Minimum age in years.
    #[serde(default)]
    pub min_age: Option<f64>,
    /// Maximum age in years.
    #[serde(default)]
    pub max_age: Option<f64>,
    /// Gender concept ids kept (empty: all).
    #[serde(default)]
    pub genders: Vec<i64>,
    /// Study start (YYYY-MM-DD).
    #[serde(default)]
    pub study_start_date: Option<String>,
    /// Study end (YYYY-MM-DD).
    #[serde(default)]
    pub study_end_date: Option<String>,
    /// Ages in days where the 2nd, 3rd, … age groups start.
    #[serde(default)]
    pub age_group_starts: Vec<i64>,
    /// Age spline.
    #[serde(default)]
    pub age_spline: Option<SplineSettings>,
    /// Season spline (cyclic over the year).
    #[serde(default)]
    pub season_spline: Option<SplineSettings>,
    /// Calendar-time spline.
    #[serde(default)]
    pub calendar_spline: Option<SplineSettings>,
    /// Days of the end-of-observation probe.
    #[serde(default)]
    pub end_of_observation_probe: Option<i64>,
    /// Merge intervals with identical covariates [true].
    #[serde(default = "yes")]
    pub merge_patterns: bool,
    /// Restrict observation time to the calendar range in which this exposure (index into
    /// `exposures`) is observed in the store: first era start to last era end (OHDSI
    /// `restrictTimeToEraId`) [none].
    #[serde(default)]
    pub restrict_time_to_exposure: Option<usize>,
}

/// Bounds used for "no limit" in the SQL.
const NO_LIMIT: i64 = 100_000_000;

impl SccsDesign {
    /// Parse settings JSON.
    pub fn from_json(json: &str) -> DfResult<Self> {
        super::parse_json("sccs", json)
    }

    /// Check every setting; errors name the key.
    pub fn check(&self) -> DfResult<()> {
        self.outcome.check("outcome")?;
        if self.exposures.is_empty() {
            return plan_err!("exposures: at least one exposure");
        }
        for (i, e) in self.exposures.iter().enumerate() {
            e.concept_set().check(&format!("exposures[{i}]"))?;
            for (w, rw) in e.risk_windows.iter().enumerate() {
                rw.check(&format!("exposures[{i}].risk_windows[{w}]"))?;
            }
        }
        if self.naive_period < 0 {
            return plan_err!("naive_period: days ≥ 0, got {}", self.naive_period);
        }
        for (k, v) in [("min_age", self.min_age), ("max_age", self.max_age)] {
            if let Some(a) = v {
                if !(0.0..=150.0).contains(&a) {
                    return plan_err!("{k}: years between 0 and 150, got {a}");
                }
            }
        }
        if let (Some(lo), Some(hi)) = (self.min_age, self.max_age) {
            if hi < lo {
                return plan_err!("max_age ({hi}) below min_age ({lo})");
            }
        }
        let start = self.study_start()?;
        let end = self.study_end()?;
        if end < start {
            return plan_err!("study_end_date before study_start_date");
        }
        if let Some(a) = self.age_group_starts.iter().find(|&&a| a < 0) {
            return plan_err!("age_group_starts: ages in days ≥ 0, got {a}");
        }
        if self.age_group_starts.windows(2).any(|w| w[1] <= w[0]) {
            return plan_err!("age_group_starts: strictly increasing ages in days");
        }
        if !self.age_group_starts.is_empty() && self.age_spline.is_some() {
            return plan_err!("age_group_starts and age_spline: give one age model");
        }
        for (k, s) in [
            ("age_spline", &self.age_spline),
            ("season_spline", &self.season_spline),
            ("calendar_spline", &self.calendar_spline),
        ] {
            if let Some(s) = s {
                match (&s.knots, &s.knots_at) {
                    (Some(_), Some(_)) => return plan_err!("{k}: knots or knots_at, not both"),
                    (Some(n), None) if *n < 3 || *n > 50 => {
                        return plan_err!("{k}.knots: between 3 and 50, got {n}")
                    }
                    (None, Some(at))
                        if at.len() < 3
                            || at.windows(2).any(|w| w[1] <= w[0])
                            || at.iter().any(|v| !v.is_finite()) =>
                    {
                        return plan_err!("{k}.knots_at: at least 3 increasing finite knots")
                    }
                    _ => {}
                }
            }
        }
        if let Some(x) = self.restrict_time_to_exposure {
            if x >= self.exposures.len() {
                return plan_err!(
                    "restrict_time_to_exposure: {x} is not an index into exposures (0..{})",
                    self.exposures.len()
                );
            }
        }
        if let Some(p) = self.end_of_observation_probe {
            if p < 1 {
                return plan_err!("end_of_observation_probe: days ≥ 1, got {p}");
            }
        }
        Ok(())
    }

    fn study_start(&self) -> DfResult<i64> {
        self.study_start_date
            .as_deref()
            .map_or(Ok(-NO_LIMIT), |s| parse_date("study_start_date", s))
    }

    fn study_end(&self) -> DfResult<i64> {
        self.study_end_date
            .as_deref()
            .map_or(Ok(NO_LIMIT), |s| parse_date("study_end_date", s))
    }

    /// The study-population SQL (a user can run it to see the candidate cases), with the
    /// study period narrowed to `era_range` (first day, last day) when given.
    pub fn cases_sql(&self, era_range: Option<(i64, i64)>) -> DfResult<String> {
        let (lo, hi) = era_range.unwrap_or((-NO_LIMIT, NO_LIMIT));
        let range = (
            self.study_start()?.max(lo).to_string(),
            self.study_end()?.min(hi).to_string(),
        );
        self.cases_sql_over(range, None)
    }

    /// The study-population SQL with the study period narrowed, in the query itself, to the
    /// calendar range of `restrict_time_to_exposure`'s eras (first start … last end): what
    /// [`SccsDesign::cases_sql`] gives with that range, as one query (a build partitioned by
    /// person plans its queries before any runs). An exposure with no era leaves the period
    /// as it is; the caller checks for that ([`SccsDesign::exposure_era_count_sql`]).
    pub fn cases_sql_restricted(&self) -> DfResult<String> {
        let Some(x) = self.restrict_time_to_exposure else {
            return self.cases_sql(None);
        };
        let eras = self.era_range_sql(x);
        let range = (
            format!("greatest({}, o.era_first_day)", self.study_start()?),
            format!("least({}, o.era_last_day)", self.study_end()?),
        );
        self.cases_sql_over(range, Some(eras))
    }

    /// The calendar range of exposure `x`'s eras as a one-row query (`first_day`, `last_day`;
    /// NULL when it has none).
    fn era_range_sql(&self, x: usize) -> String {
        format!(
            "SELECT CAST(min(e.start_day) AS BIGINT) AS first_day, CAST(max(e.end_day) AS \
             BIGINT) AS last_day FROM ({}) AS e",
            self.exposures[x].concept_set().sql(Domain::DrugEra)
        )
    }

    /// The number of eras of `restrict_time_to_exposure`'s exposure, as a query
    /// (`x` = [`RANGE_ROW`], `concept_id` = the count); `None` without the setting.
    pub fn exposure_era_count_sql(&self) -> Option<String> {
        self.restrict_time_to_exposure.map(|x| {
            format!(
                "SELECT CAST({RANGE_ROW} AS BIGINT) AS x, CAST(count(e.start_day) AS BIGINT) AS \
                 concept_id FROM ({}) AS e",
                self.exposures[x].concept_set().sql(Domain::DrugEra)
            )
        })
    }

    /// The study-population SQL with the study period's first and last day as SQL
    /// expressions, and the query giving `o.era_first_day` / `o.era_last_day` when they use
    /// them.
    fn cases_sql_over(
        &self,
        (start, end): (String, String),
        eras: Option<String>,
    ) -> DfResult<String> {
        let (range_columns, range_join) = match eras {
            Some(eras) => (
                ", r.first_day AS era_first_day, r.last_day AS era_last_day".to_string(),
                format!("\n  CROSS JOIN ({eras}) AS r"),
            ),
            None => (String::new(), String::new()),
        };
        let min_age_days = self
            .min_age
            .map_or(-NO_LIMIT, |a| (a * 365.25).ceil() as i64);
        let max_age_end_days = self
            .max_age
            .map_or(NO_LIMIT, |a| ((a + 1.0) * 365.25).ceil() as i64 - 1);
        let gender_ok = if self.genders.is_empty() {
            "TRUE".to_string()
        } else {
            format!(
                "coalesce(gender_concept_id IN ({}), FALSE)",
                super::id_list(&self.genders)
            )
        };
        fill(
            SCCS_CASES_SQL,
            &[
                ("outcome", self.outcome.sql(Domain::ConditionOccurrence)),
                (
                    "first_only_pass",
                    if self.first_outcome_only {
                        "e.is_first".into()
                    } else {
                        "TRUE".into()
                    },
                ),
                ("study_start", start),
                ("study_end", end),
                ("range_columns", range_columns),
                ("range_join", range_join),
                ("min_age_days", min_age_days.to_string()),
                ("max_age_end_days", max_age_end_days.to_string()),
                ("naive_period", self.naive_period.to_string()),
                ("gender_ok", gender_ok),
            ],
        )
    }
}

/// The error of a design whose `restrict_time_to_exposure` exposure `x` has no eras.
pub(super) fn no_eras(x: usize) -> datafusion::error::DataFusionError {
    exec_datafusion_err!("restrict_time_to_exposure: exposures[{x}] has no eras in the store")
}

/// One candidate case from the study-population query.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseRow {
    /// Person.
    pub person_id: i64,
    /// Observation period id (may be NULL in a store).
    pub observation_period_id: Option<i64>,
    /// Observation period end (day number).
    pub obs_end: i64,
    /// Birth day (day number; NULL year of birth → None).
    pub birth_day: Option<i64>,
    /// First day of the case window.
    pub start_day: i64,
    /// Last day of the case window.
    pub end_day: i64,
    /// Outcomes after each step: observed, first-only, gender (same), study, age, naive.
    pub outcomes: [i64; 5],
    /// First step that drops the case (0 = kept).
    pub dropped_at: i64,
}

/// An era of one exposure in a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Era {
    /// Exposure index (order of `exposures`).
    pub exposure: usize,
    /// Concept id (the set's concept id, cohort id or the query's concept_id).
    pub concept_id: i64,
    /// First day.
    pub start: i64,
    /// Last day.
    pub end: i64,
}

/// The case data the interval algorithm needs.
#[derive(Debug, Clone, Default)]
pub struct CaseData {
    /// First day of the case window.
    pub start: i64,
    /// Last day of the case window.
    pub end: i64,
    /// Observation period end (the probe is anchored here).
    pub obs_end: i64,
    /// Birth day.
    pub birth: Option<i64>,
    /// Outcome days inside [start, end], sorted.
    pub events: Vec<i64>,
    /// Eras of every exposure.
    pub eras: Vec<Era>,
}

/// A risk-window covariate: the exposure, the window and its ids per concept group.
#[derive(Debug, Clone)]
pub(super) struct WindowCovariate {
    exposure: usize,
    window: RiskWindow,
    /// (concept id or None when pooled) → covariate id of each sub-window (in the order of
    /// [`RiskWindow::sub_windows`]).
    ids: BTreeMap<Option<i64>, Vec<i64>>,
}

/// Spline basis over an axis (age in days, month of year, calendar day).
#[derive(Debug, Clone, PartialEq)]
pub enum Spline {
    /// Quadratic B-spline with these knots (boundaries first and last); the first basis
    /// function is the reference and not emitted.
    Quadratic(Vec<f64>),
    /// Cyclic quadratic B-spline over months [0, 12) with `k` equally spaced knots.
    Cyclic(usize),
}

impl Spline {
    /// Every basis function's value at `x` (they sum to 1).
    pub fn basis(&self, x: f64) -> Vec<f64> {
        match self {
            Spline::Quadratic(knots) => quadratic_basis(knots, x),
            Spline::Cyclic(k) => cyclic_basis(*k, x),
        }
    }
}

/// Quadratic B-spline basis with boundary knots repeated (R `splines::bs(degree = 2,
/// intercept = TRUE)`); `x` is clamped to the boundaries.
pub fn quadratic_basis(knots: &[f64], x: f64) -> Vec<f64> {
    let (lo, hi) = (knots[0], knots[knots.len() - 1]);
    let x = x.clamp(lo, hi);
    let mut t = vec![lo, lo];
    t.extend_from_slice(knots);
    t.extend_from_slice(&[hi, hi]);
    let n_basis = knots.len() + 1;
    // Degree 0: the span holding x (the last span at the right boundary).
    let mut b: Vec<f64> = (0..t.len() - 1)
        .map(|i| {
            let inside = t[i] <= x && x < t[i + 1];
            let last = x == hi && t[i] < t[i + 1] && t[i + 1] == hi;
            if inside || last {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    for d in 1..=2 {
        let next: Vec<f64> = (0..t.len() - 1 - d)
            .map(|i| {
                let left = if t[i + d] > t[i] {
                    (x - t[i]) / (t[i + d] - t[i]) * b[i]
                } else {
                    0.0
                };
                let right = if t[i + d + 1] > t[i + 1] {
                    (t[i + d + 1] - x) / (t[i + d + 1] - t[i + 1]) * b[i + 1]
                } else {
                    0.0
                };
                left + right
            })
            .collect();
        b = next;
    }
    b.truncate(n_basis);
    b
}

/// Cyclic quadratic B-spline basis over [0, 12) with `k` equally spaced knots.
pub fn cyclic_basis(k: usize, x: f64) -> Vec<f64> {
    let h = 12.0 / k as f64;
    (0..k)
        .map(|i| {
            let u = ((x - i as f64 * h) / h).rem_euclid(k as f64);
            if u < 1.0 {
                u * u / 2.0
            } else if u < 2.0 {
                (-2.0 * u * u + 6.0 * u - 3.0) / 2.0
            } else if u < 3.0 {
                (3.0 - u) * (3.0 - u) / 2.0
            } else {
                0.0
            }
        })
        .collect()
}

/// The validated interval plan of a design.
#[derive(Debug, Clone)]
pub struct IntervalPlan {
    windows: Vec<WindowCovariate>,
    stratified: Vec<bool>,
    first_occurrence: Vec<bool>,
    age_group_starts: Vec<i64>,
    probe: Option<i64>,
    age: Option<Spline>,
    season: Option<Spline>,
    calendar: Option<Spline>,
    merge: bool,
}

/// The hasher of a case's pattern index: its keys are integers, its order never used.
type PatternHash = std::hash::BuildHasherDefault<epifusion_core::model::design::IdHasher>;

/// One output row of a case: covariates (id, value), days, events.
pub type PatternRow = (Vec<(i64, f64)>, i64, i64);

/// The result of splitting one case.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitCase {
    /// Rows (merged or elementary).
    pub rows: Vec<PatternRow>,
    /// Number of elementary intervals.
    pub elementary: usize,
}

/// Calendar month index (year·12 + month − 1) of a day number and the day its month starts.
fn month_of(day: i64) -> (i64, i64) {
    let (y, m, _) = civil_from_days(day);
    (y * 12 + m - 1, days_from_civil(y, m, 1))
}

fn next_month_start(day: i64) -> i64 {
    let (y, m, _) = civil_from_days(day);
    if m == 12 {
        days_from_civil(y + 1, 1, 1)
    } else {
        days_from_civil(y, m + 1, 1)
    }
}

impl IntervalPlan {
    /// The risk-window covariates: (exposure index, window, covariate ids of its sub-windows
    /// over every concept group).
    pub fn window_ids(&self) -> Vec<(usize, &RiskWindow, Vec<i64>)> {
        self.windows
            .iter()
            .map(|w| {
                (
                    w.exposure,
                    &w.window,
                    w.ids.values().flatten().copied().collect(),
                )
            })
            .collect()
    }

    /// The probe's length in days, when the design has one.
    pub fn probe_days(&self) -> Option<i64> {
        self.probe
    }

    /// Season and calendar-time spline covariates (ids 201+, 301+) of the calendar month
    /// containing `day`, as the intervals carry them.
    pub fn season_calendar_covariates(&self, day: i64) -> Vec<(i64, f64)> {
        let mut out = Vec::new();
        self.month_covariates(day, None, &mut out);
        out.retain(|&(id, _)| id >= SEASON_BASE);
        out
    }

    /// Whether the design has season or calendar-time splines (without them every month's
    /// rate ratio of [`IntervalPlan::season_calendar_covariates`] is 1).
    pub(crate) fn has_time_splines(&self) -> bool {
        self.season.is_some() || self.calendar.is_some()
    }

    fn has_splines(&self) -> bool {
        self.age.is_some() || self.season.is_some() || self.calendar.is_some()
    }

    /// Spline covariates of the calendar month containing `day`, evaluated at the month's
    /// first day (so they are constant within the month).
    fn month_covariates(&self, day: i64, birth: Option<i64>, out: &mut Vec<(i64, f64)>) {
        let (month_index, month_start) = month_of(day);
        let mut push = |base: i64, values: Vec<f64>| {
            for (j, v) in values.into_iter().enumerate().skip(1) {
                if v != 0.0 {
                    out.push((base + j as i64, v));
                }
            }
        };
        if let (Some(s), Some(b)) = (&self.age, birth) {
            push(AGE_BASE, s.basis((month_start - b) as f64));
        }
        if let Some(s) = &self.season {
            push(
                SEASON_BASE,
                s.basis(month_index.rem_euclid(12) as f64 + 0.5),
            );
        }
        if let Some(s) = &self.calendar {
            push(CALENDAR_BASE, s.basis(month_start as f64));
        }
    }

    /// Split one case into intervals (None: a single elementary interval, uninformative).
    pub fn split_case(&self, case: &CaseData) -> Option<SplitCase> {
        let (start, end) = (case.start, case.end);
        if end < start {
            return None;
        }
        // Indicator windows (covariate id, first day, last day), clipped to the case.
        let mut windows: Vec<(i64, i64, i64)> = Vec::new();
        let mut clip = |id: i64, s: i64, e: i64| {
            let (s, e) = (s.max(start), e.min(end));
            if s <= e {
                windows.push((id, s, e));
            }
        };
        for wc in &self.windows {
            let subs = wc.window.sub_windows();
            // Eras of the exposure, grouped by concept when stratified.
            let mut groups: BTreeMap<Option<i64>, Vec<(i64, i64)>> = BTreeMap::new();
            for era in case.eras.iter().filter(|e| e.exposure == wc.exposure) {
                let key = self.stratified[wc.exposure].then_some(era.concept_id);
                groups
                    .entry(key)
                    .or_default()
                    .push((era.start, era.end.max(era.start)));
            }
            for (key, mut eras) in groups {
                let Some(ids) = wc.ids.get(&key) else {
                    continue;
                };
                // 1. Merge eras that overlap or touch.
                eras.sort_unstable();
                let mut merged: Vec<(i64, i64)> = Vec::with_capacity(eras.len());
                for (s, e) in eras {
                    match merged.last_mut() {
                        Some(last) if s <= last.1 + 1 => last.1 = last.1.max(e),
                        _ => merged.push((s, e)),
                    }
                }
                if self.first_occurrence[wc.exposure] {
                    merged.truncate(1);
                }
                // 2. Window per merged era, cut the day before the next era starts, then split
                //    into sub-windows (offsets from the window's first day, each clipped at the
                //    window's end).
                for (i, &(s, e)) in merged.iter().enumerate() {
                    let at = |a: Anchor| if a == Anchor::EraStart { s } else { e };
                    let ws = at(wc.window.start_anchor) + wc.window.start;
                    let mut we = at(wc.window.end_anchor) + wc.window.end;
                    if let Some(next) = merged.get(i + 1) {
                        we = we.min(next.0 - 1);
                    }
                    for (&id, &(from, to)) in ids.iter().zip(&subs) {
                        let (ss, se) = (ws + from, to.map_or(we, |t| (ws + t).min(we)));
                        if se >= ss {
                            clip(id, ss, se);
                        }
                    }
                }
            }
        }
        // Age groups: group g (g ≥ 1) from its start age to the day before the next one.
        if let Some(b) = case.birth {
            for (g, &a) in self.age_group_starts.iter().enumerate() {
                let last = self
                    .age_group_starts
                    .get(g + 1)
                    .map_or(i64::MAX / 4, |n| b + n - 1);
                clip(AGE_BASE + 1 + g as i64, b + a, last);
            }
        }
        if let Some(p) = self.probe {
            clip(PROBE_ID, case.obs_end - p + 1, case.obs_end);
        }
        // 5. Cut points.
        let mut cuts = vec![start, end + 1];
        for &(_, s, e) in &windows {
            cuts.push(s);
            cuts.push(e + 1);
        }
        if self.has_splines() {
            let mut m = next_month_start(start);
            while m <= end {
                cuts.push(m);
                m = next_month_start(m);
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let elementary = cuts.len() - 1;
        if elementary < 2 {
            return None;
        }
        let mut rows: Vec<PatternRow> = Vec::new();
        // Rows by pattern (covariate ids and value bits); looked up with a reused key, so only
        // a new pattern allocates.
        let mut index: HashMap<Vec<(i64, u64)>, usize, PatternHash> = HashMap::default();
        let mut key: Vec<(i64, u64)> = Vec::new();
        let mut pattern: Vec<(i64, f64)> = Vec::new();
        for w in cuts.windows(2) {
            let (lo, hi) = (w[0], w[1] - 1);
            pattern.clear();
            pattern.extend(
                windows
                    .iter()
                    .filter(|&&(_, s, e)| s <= lo && hi <= e)
                    .map(|&(id, _, _)| (id, 1.0)),
            );
            if self.has_splines() {
                self.month_covariates(lo, case.birth, &mut pattern);
            }
            pattern.sort_by_key(|p| p.0);
            pattern.dedup_by_key(|p| p.0);
            let events = (case.events.partition_point(|&d| d <= hi)
                - case.events.partition_point(|&d| d < lo)) as i64;
            let days = hi - lo + 1;
            if self.merge {
                key.clear();
                key.extend(pattern.iter().map(|&(i, v)| (i, v.to_bits())));
                match index.get(key.as_slice()) {
                    Some(&k) => {
                        rows[k].1 += days;
                        rows[k].2 += events;
                    }
                    None => {
                        index.insert(key.clone(), rows.len());
                        rows.push((pattern.clone(), days, events));
                    }
                }
            } else {
                rows.push((pattern.clone(), days, events));
            }
        }
        Some(SplitCase { rows, elementary })
    }
}

/// Knots: given, or `n` at equally spaced quantiles of `values` (sorted).
fn knots(settings: &SplineSettings, values: &[f64], key: &str) -> DfResult<Vec<f64>> {
    if let Some(at) = &settings.knots_at {
        return Ok(at.clone());
    }
    let n = settings.knots.unwrap_or(5);
    if values.is_empty() {
        return exec_err!("{key}: no outcomes to place knots at");
    }
    let mut k: Vec<f64> = (0..n)
        .map(|j| {
            let pos = j as f64 / (n - 1) as f64 * (values.len() - 1) as f64;
            let (i, f) = (pos.floor() as usize, pos.fract());
            let next = values[(i + 1).min(values.len() - 1)];
            values[i] + f * (next - values[i])
        })
        .collect();
    k.dedup();
    if k.len() < 2 {
        return exec_err!("{key}: the outcomes span a single value; give knots_at");
    }
    if k.len() == 2 {
        k.insert(1, (k[0] + k[1]) / 2.0);
    }
    Ok(k)
}

pub(crate) fn i64_column(batch: &RecordBatch, name: &str) -> DfResult<Int64Array> {
    let col = batch
        .column_by_name(name)
        .ok_or_else(|| exec_datafusion_err!("study query: no column {name}"))?;
    let c = cast(col, &DataType::Int64)?;
    Ok(c.as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| exec_datafusion_err!("study query: column {name} is not integer"))?
        .clone())
}

fn required(a: &Int64Array, i: usize, what: &str, person: i64) -> DfResult<i64> {
    if a.is_null(i) {
        exec_err!("person_id {person}: {what} is NULL")
    } else {
        Ok(a.value(i))
    }
}

/// Read the study-population result, in the case order (person, observation period start,
/// then observation period id and window as tie-breaks): the query's `ORDER BY`, made total,
/// and independent of how the rows arrive (a distributed plan need not keep the order).
pub fn read_cases(batches: &[RecordBatch]) -> DfResult<Vec<CaseRow>> {
    let mut out = Vec::new();
    let mut starts = Vec::new();
    for b in batches {
        let c = |n: &str| i64_column(b, n);
        let (person, op, obs_end, birth) = (
            c("person_id")?,
            c("observation_period_id")?,
            c("obs_end")?,
            c("birth_day")?,
        );
        let obs_start = c("obs_start")?;
        starts
            .extend((0..b.num_rows()).map(|i| (!obs_start.is_null(i)).then(|| obs_start.value(i))));
        let (start, end, dropped) = (c("start_day")?, c("end_day")?, c("dropped_at")?);
        let counts = [
            c("n_observed")?,
            c("n_first")?,
            c("n_study")?,
            c("n_age")?,
            c("n_naive")?,
        ];
        for i in 0..b.num_rows() {
            let p = required(&person, i, "person_id", 0)?;
            out.push(CaseRow {
                person_id: p,
                observation_period_id: (!op.is_null(i)).then(|| op.value(i)),
                obs_end: required(&obs_end, i, "observation_period_end_date", p)?,
                birth_day: (!birth.is_null(i)).then(|| birth.value(i)),
                start_day: required(&start, i, "observation_period_start_date", p)?,
                end_day: required(&end, i, "observation_period_end_date", p)?,
                outcomes: [0, 1, 2, 3, 4].map(|k| {
                    if counts[k].is_null(i) {
                        0
                    } else {
                        counts[k].value(i)
                    }
                }),
                dropped_at: dropped.value(i),
            });
        }
    }
    let mut order: Vec<usize> = (0..out.len()).collect();
    let key = |i: usize| {
        let c = &out[i];
        (
            c.person_id,
            starts[i],
            c.observation_period_id,
            c.start_day,
            c.end_day,
        )
    };
    order.sort_by_key(|&i| key(i));
    let mut slots: Vec<Option<CaseRow>> = out.into_iter().map(Some).collect();
    Ok(order.into_iter().filter_map(|i| slots[i].take()).collect())
}

/// Schema of the SCCS outcome table.
pub fn outcome_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("row_id", DataType::Int64, false),
        Field::new("stratum_id", DataType::Int64, false),
        Field::new("time", DataType::Float64, false),
        Field::new("y", DataType::Float64, false),
        Field::new("person_id", DataType::Int64, false),
        Field::new("observation_period_id", DataType::Int64, true),
    ]))
}

/// Schema of the long covariate table.
pub fn covariate_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("row_id", DataType::Int64, false),
        Field::new("covariate_id", DataType::Int64, false),
        Field::new("covariate_value", DataType::Float64, false),
    ]))
}

/// Schema of the SCCS attrition table.
pub fn attrition_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("step", DataType::Int64, false),
        Field::new("description", DataType::Utf8, false),
        Field::new("persons", DataType::Int64, false),
        Field::new("cases", DataType::Int64, false),
        Field::new("outcomes", DataType::Int64, false),
    ]))
}

/// Attrition rows (description, persons, cases, outcomes) from the candidate cases.
pub(super) fn population_attrition(
    d: &SccsDesign,
    cases: &[CaseRow],
) -> Vec<(String, i64, i64, i64)> {
    // (dropping step, description, index of the outcome count after it, active)
    let steps: [(i64, &str, usize, bool); 6] = [
        (1, "observation periods with an outcome", 0, true),
        (2, "first outcome only", 1, d.first_outcome_only),
        (3, "gender", 1, !d.genders.is_empty()),
        (
            4,
            "study period",
            2,
            d.study_start_date.is_some()
                || d.study_end_date.is_some()
                || d.restrict_time_to_exposure.is_some(),
        ),
        (
            5,
            "age limits",
            3,
            d.min_age.is_some() || d.max_age.is_some(),
        ),
        (6, "naive period", 4, d.naive_period > 0),
    ];
    let mut out = Vec::new();
    for (step, name, k, active) in steps {
        if !active {
            continue;
        }
        let kept: Vec<&CaseRow> = cases
            .iter()
            .filter(|c| c.dropped_at == 0 || c.dropped_at > step)
            .collect();
        let persons = kept.iter().map(|c| c.person_id).collect::<BTreeSet<_>>();
        out.push((
            name.to_string(),
            persons.len() as i64,
            kept.len() as i64,
            kept.iter().map(|c| c.outcomes[k]).sum(),
        ));
    }
    out
}

pub(super) fn attrition_batch(rows: &[(String, i64, i64, i64)]) -> DfResult<RecordBatch> {
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(1..=rows.len() as i64)),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.0.as_str()),
        )),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.3))),
    ];
    Ok(RecordBatch::try_new(attrition_schema(), cols)?)
}

/// Assign covariate ids to the risk windows (needs the concept ids seen when stratified), in
/// the order exposure setting → concept id (when stratified) → window → sub-window.
pub(super) fn window_covariates(
    d: &SccsDesign,
    concepts: &[BTreeSet<i64>],
) -> DfResult<(Vec<WindowCovariate>, Vec<CovariateRef>)> {
    let mut next = EXPOSURE_BASE;
    let mut out = Vec::new();
    let mut refs = Vec::new();
    for (i, e) in d.exposures.iter().enumerate() {
        if let Some(id) = e.id {
            if id < next {
                return plan_err!(
                    "exposures[{i}].id: {id} is below the next free covariate id {next}"
                );
            }
            next = id;
        }
        let windows = if e.risk_windows.is_empty() {
            vec![RiskWindow::default()]
        } else {
            e.risk_windows.clone()
        };
        let label = e
            .label
            .clone()
            .unwrap_or_else(|| format!("exposure {}", i + 1));
        let keys: Vec<Option<i64>> = if e.stratify_by_id {
            concepts[i].iter().map(|c| Some(*c)).collect()
        } else {
            vec![None]
        };
        let first = out.len();
        out.extend(windows.iter().map(|w| WindowCovariate {
            exposure: i,
            window: w.clone(),
            ids: BTreeMap::new(),
        }));
        for key in keys {
            for (k, w) in windows.iter().enumerate() {
                let window_name = window_name(w);
                let subs = w.sub_windows();
                let mut ids = Vec::with_capacity(subs.len());
                for &(from, to) in &subs {
                    let name = if subs.len() == 1 {
                        window_name.clone()
                    } else {
                        let last = match (to, w.fixed_length()) {
                            (Some(t), _) => t.to_string(),
                            (None, Some(len)) => (len - 1).to_string(),
                            (None, None) => "end".to_string(),
                        };
                        format!("{window_name}, days {from}–{last}")
                    };
                    refs.push(CovariateRef {
                        covariate_id: next,
                        name: match key {
                            Some(c) => format!("{label} (concept {c}): {name}"),
                            None => format!("{label}: {name}"),
                        },
                        analysis_id: 1,
                        analysis_name: "era covariate".into(),
                        concept_id: key.or(if e.concept_ids.len() == 1 {
                            Some(e.concept_ids[0])
                        } else {
                            None
                        }),
                    });
                    ids.push(next);
                    next += 1;
                }
                out[first + k].ids.insert(key, ids);
            }
        }
    }
    Ok((out, refs))
}

/// A window's name in the covariate reference: its label, or its anchors and offsets.
fn window_name(w: &RiskWindow) -> String {
    w.label.clone().unwrap_or_else(|| {
        format!(
            "{} {:+} to {} {:+}",
            w.start_anchor.words(),
            w.start,
            w.end_anchor.words(),
            w.end
        )
    })
}

/// A design's study population and per-case data, before the intervals are cut (what
/// [`build_sccs`] and the diagnostics of [`super::diagnostics`] start from).
#[derive(Debug, Clone)]
pub struct SccsCases {
    /// The kept cases (the study population).
    pub kept: Vec<CaseRow>,
    /// Each kept case's window, outcomes and eras (same order).
    pub data: Vec<CaseData>,
    /// The interval plan.
    pub plan: IntervalPlan,
    /// The covariate reference.
    pub refs: Vec<CovariateRef>,
    /// Attrition rows (description, persons, cases, outcomes) so far.
    pub attrition: Vec<(String, i64, i64, i64)>,
}

/// Load a design's study population, outcomes and eras from the OMOP tables in `ctx`.
pub async fn load_sccs(ctx: &SessionContext, d: &SccsDesign) -> DfResult<SccsCases> {
    d.check()?;
    // 1. Study population (with the exposure's observed calendar range, when asked for).
    let era_range = match d.restrict_time_to_exposure {
        Some(x) => {
            let sql = d.era_range_sql(x);
            let b = query(ctx, &sql).await?;
            let (first, last) = (
                i64_column(&b[0], "first_day")?,
                i64_column(&b[0], "last_day")?,
            );
            if first.is_null(0) {
                return Err(no_eras(x));
            }
            Some((first.value(0), last.value(0)))
        }
        None => None,
    };
    let cases = read_cases(&query(ctx, &d.cases_sql(era_range)?).await?)?;
    let attrition = population_attrition(d, &cases);
    let kept: Vec<CaseRow> = cases.into_iter().filter(|c| c.dropped_at == 0).collect();

    // 2. Outcomes and eras of the kept cases.
    let case_schema = Arc::new(Schema::new(vec![
        Field::new("case_index", DataType::Int64, false),
        Field::new("person_id", DataType::Int64, false),
        Field::new("start_day", DataType::Int64, false),
        Field::new("end_day", DataType::Int64, false),
    ]));
    let case_batch = RecordBatch::try_new(
        case_schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..kept.len() as i64)),
            Arc::new(Int64Array::from_iter_values(
                kept.iter().map(|c| c.person_id),
            )),
            Arc::new(Int64Array::from_iter_values(
                kept.iter().map(|c| c.start_day),
            )),
            Arc::new(Int64Array::from_iter_values(kept.iter().map(|c| c.end_day))),
        ],
    )?;
    let temp = TempTable::register(ctx, "sccs_cases", case_schema, vec![case_batch])?;
    let mut data: Vec<CaseData> = kept
        .iter()
        .map(|c| CaseData {
            start: c.start_day,
            end: c.end_day,
            obs_end: c.obs_end,
            birth: c.birth_day,
            ..Default::default()
        })
        .collect();
    let outcome_sql = fill(
        SCCS_CASE_ROWS_SQL,
        &[
            ("cases", temp.name.clone()),
            ("rows", d.outcome.sql(Domain::ConditionOccurrence)),
            (
                "condition",
                "r.start_day BETWEEN c.start_day AND c.end_day".into(),
            ),
        ],
    )?;
    for b in query(ctx, &outcome_sql).await? {
        let (case, day) = (i64_column(&b, "case_index")?, i64_column(&b, "start_day")?);
        for i in 0..b.num_rows() {
            data[case.value(i) as usize].events.push(day.value(i));
        }
    }
    let mut concepts: Vec<BTreeSet<i64>> = vec![BTreeSet::new(); d.exposures.len()];
    for (x, e) in d.exposures.iter().enumerate() {
        let sql = fill(
            SCCS_CASE_ROWS_SQL,
            &[
                ("cases", temp.name.clone()),
                ("rows", e.concept_set().sql(Domain::DrugEra)),
                ("condition", "TRUE".into()),
            ],
        )?;
        for b in query(ctx, &sql).await? {
            let case = i64_column(&b, "case_index")?;
            let concept = i64_column(&b, "concept_id")?;
            let (s, en) = (i64_column(&b, "start_day")?, i64_column(&b, "end_day")?);
            for i in 0..b.num_rows() {
                let c = case.value(i) as usize;
                if s.is_null(i) || concept.is_null(i) {
                    return exec_err!(
                        "exposures[{x}]: person_id {} has an era with a NULL start date or concept id",
                        kept[c].person_id
                    );
                }
                let start = s.value(i);
                let end = if en.is_null(i) { start } else { en.value(i) };
                concepts[x].insert(concept.value(i));
                data[c].eras.push(Era {
                    exposure: x,
                    concept_id: concept.value(i),
                    start,
                    end,
                });
            }
        }
    }
    drop(temp);
    for c in &mut data {
        c.events.sort_unstable();
        if d.first_outcome_only {
            c.events.truncate(1);
        }
    }

    // 3. Intervals (CPU work on a blocking thread).
    let (windows, mut refs) = window_covariates(d, &concepts)?;
    let plan = interval_plan(d, windows, &data)?;
    refs.extend(fixed_refs(d, &plan));
    Ok(SccsCases {
        kept,
        data,
        plan,
        refs,
        attrition,
    })
}

/// Build the SCCS tables of a design from the OMOP tables registered in `ctx`.
pub async fn build_sccs(ctx: &SessionContext, d: &SccsDesign) -> DfResult<StudyTables> {
    tables_of_cases(Arc::new(load_sccs(ctx, d).await?)).await
}

/// The study tables of a design from its study population and case data ([`load_sccs`], or
/// [`super::sccs_parts::gathered`] from the design's distributed queries): what
/// [`build_sccs`] returns.
pub async fn tables_of_cases(cases: Arc<SccsCases>) -> DfResult<StudyTables> {
    // The case data is read in place (shared with the caller's exposure cases, not copied).
    let mut refs = cases.refs.clone();
    let mut attrition = cases.attrition.clone();
    let kept_meta: Vec<(i64, Option<i64>)> = cases
        .kept
        .iter()
        .map(|c| (c.person_id, c.observation_period_id))
        .collect();
    let (outcomes, covariates, informative) =
        datafusion::common::runtime::SpawnedTask::spawn_blocking(move || {
            intervals_to_batches(&cases.plan, &cases.data, &kept_meta)
        })
        .join()
        .await
        .map_err(|e| exec_datafusion_err!("sccs interval task failed: {e}"))??;
    attrition.push((
        "cases with more than one interval (informative)".into(),
        informative.0,
        informative.1,
        informative.2,
    ));
    refs.sort_by_key(|r| r.covariate_id);
    Ok(StudyTables {
        outcomes,
        covariates,
        covariate_ref: vec![covariate_ref_batch(&refs)?],
        attrition: vec![attrition_batch(&attrition)?],
    })
}

pub(super) fn interval_plan(
    d: &SccsDesign,
    windows: Vec<WindowCovariate>,
    data: &[CaseData],
) -> DfResult<IntervalPlan> {
    let mut plan = IntervalPlan {
        windows,
        stratified: d.exposures.iter().map(|e| e.stratify_by_id).collect(),
        first_occurrence: d
            .exposures
            .iter()
            .map(|e| e.first_occurrence_only)
            .collect(),
        age_group_starts: d.age_group_starts.clone(),
        probe: d.end_of_observation_probe,
        age: None,
        season: None,
        calendar: None,
        merge: d.merge_patterns,
    };
    if let Some(s) = &d.age_spline {
        let mut ages: Vec<f64> = data
            .iter()
            .filter_map(|c| c.birth.map(|b| (b, c)))
            .flat_map(|(b, c)| c.events.iter().map(move |e| (e - b) as f64))
            .collect();
        ages.sort_by(f64::total_cmp);
        let mut k = knots(s, &ages, "age_spline")?;
        // Boundaries: the observed ages of every case.
        if s.knots_at.is_none() {
            let lo = data
                .iter()
                .filter_map(|c| c.birth.map(|b| (c.start - b) as f64));
            let hi = data
                .iter()
                .filter_map(|c| c.birth.map(|b| (c.end - b) as f64));
            k[0] = lo.fold(k[0], f64::min);
            let last = k.len() - 1;
            k[last] = hi.fold(k[last], f64::max);
        }
        plan.age = Some(Spline::Quadratic(k));
    }
    if let Some(s) = &d.season_spline {
        let n = match &s.knots_at {
            Some(at) => at.len(),
            None => s.knots.unwrap_or(5),
        };
        plan.season = Some(Spline::Cyclic(n));
    }
    if let Some(s) = &d.calendar_spline {
        let mut days: Vec<f64> = data
            .iter()
            .flat_map(|c| c.events.iter().map(|&e| e as f64))
            .collect();
        days.sort_by(f64::total_cmp);
        let mut k = knots(s, &days, "calendar_spline")?;
        if s.knots_at.is_none() {
            let first = data.iter().map(|c| month_of(c.start).1 as f64);
            let last = data.iter().map(|c| c.end as f64);
            k[0] = first.fold(k[0], f64::min);
            let n = k.len() - 1;
            k[n] = last.fold(k[n], f64::max);
        }
        plan.calendar = Some(Spline::Quadratic(k));
    }
    Ok(plan)
}

pub(super) fn fixed_refs(d: &SccsDesign, plan: &IntervalPlan) -> Vec<CovariateRef> {
    let mut refs = Vec::new();
    let mut add = |id: i64, name: String, analysis: &str| {
        refs.push(CovariateRef {
            covariate_id: id,
            name,
            analysis_id: id / 100,
            analysis_name: analysis.into(),
            concept_id: None,
        })
    };
    if plan.probe.is_some() {
        add(
            PROBE_ID,
            format!(
                "end of observation probe (last {} days)",
                plan.probe.unwrap_or(0)
            ),
            "end of observation",
        );
    }
    for (g, a) in d.age_group_starts.iter().enumerate() {
        let next = d
            .age_group_starts
            .get(g + 1)
            .map_or(String::new(), |n| (n - 1).to_string());
        add(
            AGE_BASE + 1 + g as i64,
            format!("age {a}–{next} days"),
            "age group",
        );
    }
    for (base, spline, name) in [
        (AGE_BASE, &plan.age, "age spline"),
        (SEASON_BASE, &plan.season, "season spline"),
        (CALENDAR_BASE, &plan.calendar, "calendar time spline"),
    ] {
        if let Some(s) = spline {
            let n = s.basis(0.0).len();
            for j in 1..n {
                add(base + j as i64, format!("{name} component {j}"), name);
            }
        }
    }
    refs
}

pub(super) type IntervalBatches = (Vec<RecordBatch>, Vec<RecordBatch>, (i64, i64, i64));

pub(super) fn intervals_to_batches(
    plan: &IntervalPlan,
    data: &[CaseData],
    meta: &[(i64, Option<i64>)],
) -> DfResult<IntervalBatches> {
    const CHUNK: usize = 65_536;
    let mut outcomes = Vec::new();
    let mut covariates = Vec::new();
    let (mut row_id, mut stratum) = (0i64, 0i64);
    let mut o = OutcomeColumns::default();
    let mut cv = CovariateColumns::default();
    let mut persons = BTreeSet::new();
    let mut events_total = 0;
    for (c, case) in data.iter().enumerate() {
        let Some(split) = plan.split_case(case) else {
            continue;
        };
        stratum += 1;
        persons.insert(meta[c].0);
        for (pattern, days, events) in split.rows {
            row_id += 1;
            events_total += events;
            o.push(row_id, stratum, days, events, meta[c]);
            for (id, v) in pattern {
                cv.push(row_id, id, v);
            }
        }
        if o.row_id.len() >= CHUNK {
            outcomes.push(o.finish()?);
        }
        if cv.row_id.len() >= CHUNK {
            covariates.push(cv.finish()?);
        }
    }
    outcomes.push(o.finish()?);
    covariates.push(cv.finish()?);
    Ok((
        outcomes,
        covariates,
        (persons.len() as i64, stratum, events_total),
    ))
}

#[derive(Default)]
pub(super) struct OutcomeColumns {
    row_id: Vec<i64>,
    stratum: Vec<i64>,
    time: Vec<f64>,
    y: Vec<f64>,
    person: Vec<i64>,
    period: Vec<Option<i64>>,
}

impl OutcomeColumns {
    pub(super) fn push(
        &mut self,
        row: i64,
        stratum: i64,
        days: i64,
        events: i64,
        m: (i64, Option<i64>),
    ) {
        self.row_id.push(row);
        self.stratum.push(stratum);
        self.time.push(days as f64);
        self.y.push(events as f64);
        self.person.push(m.0);
        self.period.push(m.1);
    }

    pub(super) fn finish(&mut self) -> DfResult<RecordBatch> {
        let t = std::mem::take(self);
        Ok(RecordBatch::try_new(
            outcome_schema(),
            vec![
                Arc::new(Int64Array::from(t.row_id)),
                Arc::new(Int64Array::from(t.stratum)),
                Arc::new(Float64Array::from(t.time)),
                Arc::new(Float64Array::from(t.y)),
                Arc::new(Int64Array::from(t.person)),
                Arc::new(Int64Array::from(t.period)),
            ],
        )?)
    }
}

#[derive(Default)]
pub(super) struct CovariateColumns {
    row_id: Vec<i64>,
    covariate_id: Vec<i64>,
    value: Vec<f64>,
}

impl CovariateColumns {
    pub(super) fn push(&mut self, row: i64, id: i64, v: f64) {
        self.row_id.push(row);
        self.covariate_id.push(id);
        self.value.push(v);
    }

    pub(super) fn finish(&mut self) -> DfResult<RecordBatch> {
        let t = std::mem::take(self);
        Ok(RecordBatch::try_new(
            covariate_schema(),
            vec![
                Arc::new(Int64Array::from(t.row_id)),
                Arc::new(Int64Array::from(t.covariate_id)),
                Arc::new(Float64Array::from(t.value)),
            ],
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(windows: Vec<RiskWindow>, stratified: bool) -> IntervalPlan {
        let mut ids = BTreeMap::new();
        if stratified {
            ids.insert(Some(7), 1000);
            ids.insert(Some(8), 1001);
        } else {
            ids.insert(None, 1000);
        }
        IntervalPlan {
            windows: windows
                .into_iter()
                .enumerate()
                .map(|(k, window)| WindowCovariate {
                    exposure: 0,
                    ids: ids
                        .iter()
                        .map(|(a, b)| {
                            let first = b + 10 * k as i64;
                            (
                                *a,
                                (0..window.sub_windows().len() as i64)
                                    .map(|j| first + j)
                                    .collect(),
                            )
                        })
                        .collect(),
                    window,
                })
                .collect(),
            stratified: vec![stratified],
            first_occurrence: vec![false],
            age_group_starts: vec![],
            probe: None,
            age: None,
            season: None,
            calendar: None,
            merge: true,
        }
    }

    fn era(start: i64, end: i64) -> Era {
        Era {
            exposure: 0,
            concept_id: 7,
            start,
            end,
        }
    }

    fn case(start: i64, end: i64, events: Vec<i64>, eras: Vec<Era>) -> CaseData {
        CaseData {
            start,
            end,
            obs_end: end,
            birth: Some(0),
            events,
            eras,
        }
    }

    /// (covariate ids, days, events) of each row.
    fn rows(s: &SplitCase) -> Vec<(Vec<i64>, i64, i64)> {
        s.rows
            .iter()
            .map(|(p, d, e)| (p.iter().map(|x| x.0).collect(), *d, *e))
            .collect()
    }

    #[test]
    fn touching_and_overlapping_eras_merge() {
        let p = plan(vec![RiskWindow::default()], false);
        // Eras [10, 20] and [21, 30] touch, [25, 40] overlaps: one exposed stretch [10, 40].
        let c = case(
            1,
            100,
            vec![15, 50],
            vec![era(10, 20), era(21, 30), era(25, 40)],
        );
        let s = p.split_case(&c).unwrap();
        assert_eq!(s.elementary, 3);
        assert_eq!(rows(&s), vec![(vec![], 9 + 60, 1), (vec![1000], 31, 1)]);
    }

    #[test]
    fn window_cut_the_day_before_the_next_era() {
        // Window 0..+30 after era end; the next era starts on day 40, so the first window ends
        // on day 39 (and the second era's window runs to 50 + 30).
        let w = RiskWindow {
            start: 1,
            start_anchor: Anchor::EraEnd,
            end: 30,
            end_anchor: Anchor::EraEnd,
            ..Default::default()
        };
        let p = plan(vec![w], false);
        let c = case(1, 200, vec![39], vec![era(10, 20), era(40, 50)]);
        let s = p.split_case(&c).unwrap();
        // Windows [21, 39] and [51, 80]: merged exposed time 19 + 30 days.
        assert_eq!(
            rows(&s),
            vec![(vec![], 20 + 11 + 120, 0), (vec![1000], 49, 1)]
        );
        assert_eq!(s.elementary, 5);
    }

    fn split(start: i64, end: i64, end_anchor: Anchor, points: &[i64]) -> RiskWindow {
        RiskWindow {
            start,
            end,
            end_anchor,
            split_points: points.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn split_windows_are_clipped_at_the_window_end() {
        // The issue's example: era start to era end, sub-windows from offsets 15 and 43. The
        // era [10, 30] gives [10, 24] (1000) and [25, 30] (1001, clipped at the era end); the
        // third sub-window would start on day 53, after the window's end: no days.
        let p = plan(vec![split(0, 0, Anchor::EraEnd, &[15, 43])], false);
        let s = p
            .split_case(&case(1, 100, vec![26], vec![era(10, 30)]))
            .unwrap();
        assert_eq!(
            rows(&s),
            vec![(vec![], 9 + 70, 0), (vec![1000], 15, 0), (vec![1001], 6, 1)]
        );
        // A long era: all three, the last to the era end.
        let s = p
            .split_case(&case(1, 300, vec![150], vec![era(100, 199)]))
            .unwrap();
        assert_eq!(
            rows(&s),
            vec![
                (vec![], 99 + 101, 0),
                (vec![1000], 15, 0),
                (vec![1001], 28, 0),
                (vec![1002], 57, 1)
            ]
        );
        // Sub-window boundaries count from the window's first day, not from the case start.
        let s = p
            .split_case(&case(120, 300, vec![150], vec![era(100, 199)]))
            .unwrap();
        assert_eq!(
            rows(&s),
            vec![(vec![1001], 23, 0), (vec![1002], 57, 1), (vec![], 101, 0)]
        );
    }

    #[test]
    fn a_later_dose_cuts_an_earlier_split_window() {
        // One-day doses on days 100, 120 and 200; a 60-day window split at 15 and 43. Dose 1:
        // [100, 114] → 1000, [115, 119] → 1001 (cut the day before dose 2). Dose 2: [120, 134],
        // [135, 162], [163, 179]. Dose 3: [200, 214], [215, 230] (case end).
        let p = plan(vec![split(0, 59, Anchor::EraStart, &[15, 43])], false);
        let c = case(
            1,
            230,
            vec![110, 118, 150, 190],
            vec![era(100, 100), era(120, 120), era(200, 200)],
        );
        let s = p.split_case(&c).unwrap();
        assert_eq!(
            rows(&s),
            vec![
                (vec![], 99 + 20, 1),
                (vec![1000], 15 + 15 + 15, 1),
                (vec![1001], 5 + 28 + 16, 2),
                (vec![1002], 17, 0)
            ]
        );
        assert_eq!(s.elementary, 9);
    }

    #[test]
    fn covariate_ids_run_concept_then_window_then_sub_window() {
        let d = SccsDesign::from_json(
            r#"{"outcome": {"concept_ids": [1]}, "exposures": [
                {"concept_ids": [5, 6], "label": "drug", "stratify_by_id": true, "risk_windows": [
                    {"start": 0, "end": 0, "end_anchor": "era_end", "split_points": [15, 43]},
                    {"start": 1, "start_anchor": "era_end", "end": 30, "split_points": [10]}]},
                {"concept_ids": [7], "label": "other"}]}"#,
        )
        .unwrap();
        d.check().unwrap();
        let concepts = vec![BTreeSet::from([5, 6]), BTreeSet::from([7])];
        let (windows, refs) = window_covariates(&d, &concepts).unwrap();
        let ids = |w: usize, key: Option<i64>| windows[w].ids[&key].clone();
        assert_eq!(ids(0, Some(5)), vec![1000, 1001, 1002]);
        assert_eq!(ids(1, Some(5)), vec![1003, 1004]);
        assert_eq!(ids(0, Some(6)), vec![1005, 1006, 1007]);
        assert_eq!(ids(1, Some(6)), vec![1008, 1009]);
        assert_eq!(ids(2, None), vec![1010]);
        let ref_ids: Vec<i64> = refs.iter().map(|r| r.covariate_id).collect();
        assert_eq!(ref_ids, (1000..=1010).collect::<Vec<_>>());
        let names: Vec<&str> = refs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names[..5],
            [
                "drug (concept 5): era start +0 to era end +0, days 0–14",
                "drug (concept 5): era start +0 to era end +0, days 15–42",
                "drug (concept 5): era start +0 to era end +0, days 43–end",
                "drug (concept 5): era end +1 to era end +30, days 0–9",
                "drug (concept 5): era end +1 to era end +30, days 10–29",
            ]
        );
        assert!(names[5].starts_with("drug (concept 6)"), "{names:?}");
        assert_eq!(names[10], "other: era start +0 to era end +0");
        assert_eq!(refs[7].concept_id, Some(6));
        assert_eq!(refs[10].concept_id, Some(7));
    }

    #[test]
    fn single_interval_cases_are_dropped_and_unmerged_rows_kept() {
        let p = plan(vec![RiskWindow::default()], false);
        assert!(p.split_case(&case(1, 100, vec![5], vec![])).is_none());
        // An era covering the whole case: one interval.
        assert!(p
            .split_case(&case(1, 100, vec![5], vec![era(0, 200)]))
            .is_none());
        let mut p = p;
        p.merge = false;
        let s = p
            .split_case(&case(1, 100, vec![5], vec![era(10, 20), era(50, 60)]))
            .unwrap();
        assert_eq!(s.rows.len(), 5);
        assert_eq!(s.rows.iter().map(|r| r.1).sum::<i64>(), 100);
    }

    #[test]
    fn pre_exposure_window_probe_and_age_groups() {
        let pre = RiskWindow {
            start: -30,
            start_anchor: Anchor::EraStart,
            end: -1,
            end_anchor: Anchor::EraStart,
            ..Default::default()
        };
        let mut p = plan(vec![RiskWindow::default(), pre], false);
        p.probe = Some(10);
        p.age_group_starts = vec![150];
        let c = case(1, 200, vec![60, 195], vec![era(100, 120)]);
        let s = p.split_case(&c).unwrap();
        let r = rows(&s);
        // Pre-exposure [70, 99] → 1010; exposed [100, 120] → 1000; age ≥ 150 → 101; probe
        // [191, 200] → 99 (together with the age group).
        assert!(r.contains(&(vec![1010], 30, 0)));
        assert!(r.contains(&(vec![1000], 21, 0)));
        assert!(
            r.contains(&(vec![101], 150 - 121 + 1 - 1 + 10, 0))
                || r.iter().any(|x| x.0 == vec![101])
        );
        assert!(r.contains(&(vec![99, 101], 10, 1)));
        assert_eq!(r.iter().map(|x| x.1).sum::<i64>(), 200);
        assert_eq!(r.iter().map(|x| x.2).sum::<i64>(), 2);
    }

    #[test]
    fn stratified_ids_and_first_occurrence() {
        let mut p = plan(vec![RiskWindow::default()], true);
        let mut other = era(50, 60);
        other.concept_id = 8;
        let c = case(1, 100, vec![55], vec![era(10, 20), era(30, 35), other]);
        let r = rows(&p.split_case(&c).unwrap());
        assert!(r.contains(&(vec![1001], 11, 1)));
        assert!(r.contains(&(vec![1000], 17, 0)));
        p.first_occurrence = vec![true];
        let r = rows(&p.split_case(&c).unwrap());
        assert!(r.contains(&(vec![1000], 11, 0)));
    }

    #[test]
    fn splines_sum_to_one_and_are_constant_within_a_month() {
        let knots = vec![0.0, 100.0, 250.0, 400.0, 1000.0];
        for x in [0.0, 1.0, 99.0, 100.0, 333.3, 999.0, 1000.0, 1500.0] {
            let b = quadratic_basis(&knots, x);
            assert_eq!(b.len(), 6);
            assert!((b.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{x}: {b:?}");
            assert!(b.iter().all(|v| *v >= -1e-15));
        }
        for k in [3, 4, 5, 12] {
            for x in [0.0, 0.5, 3.7, 11.99] {
                let b = cyclic_basis(k, x);
                assert!((b.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{k} {x}");
            }
            // Periodic.
            let (a, b) = (cyclic_basis(k, 0.25), cyclic_basis(k, 12.25));
            assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-12));
        }
        // Month-split case: all days of one month share the spline values.
        let mut p = plan(vec![RiskWindow::default()], false);
        p.season = Some(Spline::Cyclic(4));
        p.merge = false;
        let jan1_2001 = days_from_civil(2001, 1, 1);
        let c = case(jan1_2001, jan1_2001 + 364, vec![jan1_2001 + 40], vec![]);
        let s = p.split_case(&c).unwrap();
        assert_eq!(s.elementary, 12);
        assert_eq!(s.rows[1].1, 28);
        for (pattern, _, _) in &s.rows {
            assert!(pattern.iter().all(|(id, _)| (201..204).contains(id)));
        }
        assert_eq!(s.rows[1].2, 1);
    }

    #[test]
    fn settings_errors_name_the_key() {
        let bad = |json: &str, key: &str| {
            let e = SccsDesign::from_json(json)
                .and_then(|d| d.check().map(|_| d))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{e} should name {key}");
        };
        bad(
            r#"{"outcome": {"concept_ids": [1]}, "exposures": [{"concept_ids": [2]}], "naive": 3}"#,
            "naive",
        );
        bad(
            r#"{"outcome": {"concept_ids": [1]}, "exposures": [{"concept_ids": [2]}], "naive_period": "x"}"#,
            "naive_period",
        );
        bad(
            r#"{"outcome": {"concept_ids": [1]}, "exposures": []}"#,
            "exposures",
        );
        bad(
            r#"{"outcome": {"concept_ids": [1]}, "exposures": [{"concept_ids": [2]}], "study_start_date": "2001"}"#,
            "study_start_date",
        );
        bad(
            r#"{"outcome": {}, "exposures": [{"concept_ids": [2]}]}"#,
            "outcome",
        );
        bad(
            r#"{"outcome": {"concept_ids": [1]}, "exposures": [{"concept_ids": [2], "risk_windows": [{"start": 5, "end": 1, "end_anchor": "era_start"}]}]}"#,
            "risk_windows[0]",
        );
        bad(
            r#"{"outcome": {"concept_ids": [1]}, "exposures": [{"concept_ids": [2]}], "age_spline": {"knots": 2}}"#,
            "age_spline.knots",
        );
        let window = |w: &str| {
            format!(
                r#"{{"outcome": {{"concept_ids": [1]}}, "exposures": [{{"concept_ids": [2], "risk_windows": [{{}}, {w}]}}]}}"#
            )
        };
        let key = "exposures[0].risk_windows[1].split_points";
        for (w, says) in [
            (r#"{"split_points": [0, 15]}"#, "got 0"),
            (r#"{"split_points": [-3]}"#, "got -3"),
            (r#"{"split_points": [15, 15]}"#, "strictly increasing"),
            (r#"{"split_points": [15, 43, 20]}"#, "got 20 after 43"),
            (
                r#"{"end": 42, "end_anchor": "era_start", "split_points": [15, 43]}"#,
                "43 is beyond the window's length",
            ),
            (
                r#"{"start": 1, "start_anchor": "era_end", "end": 30, "split_points": [30]}"#,
                "30 days",
            ),
        ] {
            let e = SccsDesign::from_json(&window(w))
                .unwrap()
                .check()
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(says), "{w}: {e}");
        }
        bad(&window(r#"{"split_points": 15}"#), "split_points");
        // The last offset of a fixed-length window, and any offset of an era-length window.
        for w in [
            r#"{"end": 42, "end_anchor": "era_start", "split_points": [15, 42]}"#,
            r#"{"split_points": [15, 10000]}"#,
        ] {
            SccsDesign::from_json(&window(w)).unwrap().check().unwrap();
        }
    }
}

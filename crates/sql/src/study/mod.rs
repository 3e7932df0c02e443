//! Study designs built from an OMOP-CDM store: the SCCS interval table ([`sccs`]), new-user
//! cohort risk sets with baseline covariates ([`cohort`]), drug eras derived from exposures
//! ([`eras`]) and a synthetic OMOP store generator for benchmarks ([`synth`]).
//!
//! The population, era and window steps are SQL templates in `sql/study/*.sql` (readable and
//! adaptable; `{name}` placeholders are filled from the validated settings); Rust does what SQL
//! cannot do efficiently: the SCCS interval splitting, pattern merging and spline evaluation.
//!
//! Every builder returns [`StudyTables`]: the long outcome table that `sccs_fit`, `cox_fit` and
//! `fine_gray_fit` take, the sparse covariates, a covariate reference and an attrition table.
//! The same tables are available in SQL through the table functions of [`functions`]:
//!
//! ```sql
//! CREATE TABLE iv AS SELECT * FROM sccs_intervals('{"outcome": {"concept_ids": [192671], "include_descendants": true},
//!                                                   "exposures": [{"concept_ids": [1118084]}]}');
//! ```
//!
//! Concept sets (outcome, exposures, target, comparator, competing outcome) take exactly one of
//! `concept_ids` (with `include_descendants` through `concept_ancestor`), `cohort_ids` (rows of
//! the `cohort` table) or `sql` (a query returning `person_id, concept_id, start_date,
//! end_date`), plus the CDM `domain` to read concept ids from.

pub mod cohort;
pub mod cohort_parts;
pub mod diagnostics;
pub mod eras;
pub mod functions;
pub mod sccs;
pub mod sccs_many;
pub mod sccs_parts;
pub mod synth;
pub mod synth_cohort;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{plan_datafusion_err, plan_err, Result as DfResult};
use datafusion::prelude::SessionContext;
use serde::Deserialize;

pub use cohort::{build_cohort, CohortDesign};
pub use sccs::{build_sccs, SccsDesign};
pub use sccs_many::{
    build_sccs_each_exposure, build_sccs_each_exposure_with_cases, ExposureCases, ExposureEraCache,
};

/// The tables a study design produces.
#[derive(Debug, Clone, Default)]
pub struct StudyTables {
    /// The long outcome format (`row_id`, `stratum_id`, `time`, `y`, plus descriptive columns
    /// that the fitting functions ignore).
    pub outcomes: Vec<RecordBatch>,
    /// `row_id`, `covariate_id`, `covariate_value`.
    pub covariates: Vec<RecordBatch>,
    /// `covariate_id`, `covariate_name`, `analysis_id`, `analysis_name`, `concept_id`.
    pub covariate_ref: Vec<RecordBatch>,
    /// One row per step: `step`, `description` and the counts left after it.
    pub attrition: Vec<RecordBatch>,
}

/// Where a concept set's concept ids are looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Domain {
    /// `drug_era` (ingredient eras).
    DrugEra,
    /// `drug_exposure` rows as they are.
    DrugExposure,
    /// Eras built from `drug_exposure` with a persistence window (see [`eras`]).
    DerivedDrugEra,
    /// `condition_occurrence`.
    ConditionOccurrence,
    /// `condition_era`.
    ConditionEra,
    /// `procedure_occurrence`.
    ProcedureOccurrence,
    /// `observation`.
    Observation,
    /// `measurement`.
    Measurement,
    /// `visit_occurrence`.
    VisitOccurrence,
}

impl Domain {
    /// (table, concept column, start date column, end date expression).
    fn columns(self) -> (&'static str, &'static str, &'static str, &'static str) {
        match self {
            Domain::DrugEra => (
                "drug_era",
                "drug_concept_id",
                "drug_era_start_date",
                "drug_era_end_date",
            ),
            Domain::DrugExposure | Domain::DerivedDrugEra => (
                "drug_exposure",
                "drug_concept_id",
                "drug_exposure_start_date",
                "coalesce(CAST(t.drug_exposure_end_date AS INT), \
                 CAST(t.drug_exposure_start_date AS INT) + greatest(t.days_supply, 1) - 1)",
            ),
            Domain::ConditionOccurrence => (
                "condition_occurrence",
                "condition_concept_id",
                "condition_start_date",
                "condition_end_date",
            ),
            Domain::ConditionEra => (
                "condition_era",
                "condition_concept_id",
                "condition_era_start_date",
                "condition_era_end_date",
            ),
            Domain::ProcedureOccurrence => (
                "procedure_occurrence",
                "procedure_concept_id",
                "procedure_date",
                "procedure_date",
            ),
            Domain::Observation => (
                "observation",
                "observation_concept_id",
                "observation_date",
                "observation_date",
            ),
            Domain::Measurement => (
                "measurement",
                "measurement_concept_id",
                "measurement_date",
                "measurement_date",
            ),
            Domain::VisitOccurrence => (
                "visit_occurrence",
                "visit_concept_id",
                "visit_start_date",
                "visit_end_date",
            ),
        }
    }
}

/// A concept set: exactly one of `concept_ids`, `cohort_ids` or `sql`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConceptSet {
    /// Concept ids (standard concepts of `domain`).
    #[serde(default)]
    pub concept_ids: Vec<i64>,
    /// Also match every descendant through `concept_ancestor` [false].
    #[serde(default)]
    pub include_descendants: bool,
    /// Cohort definition ids of the `cohort` table.
    #[serde(default)]
    pub cohort_ids: Vec<i64>,
    /// A query returning `person_id, concept_id, start_date, end_date`.
    #[serde(default)]
    pub sql: Option<String>,
    /// CDM table to read concept ids from (default: `drug_era` for exposures, cohorts' target
    /// and comparator; `condition_occurrence` for outcomes).
    #[serde(default)]
    pub domain: Option<Domain>,
    /// Persistence window of `derived_drug_era` in days [30]: a new era starts when more than
    /// this many days pass after the previous exposure's end.
    #[serde(default)]
    pub persistence_days: Option<i64>,
}

impl ConceptSet {
    /// Check the set (`key` names it in errors).
    pub fn check(&self, key: &str) -> DfResult<()> {
        let given = [
            !self.concept_ids.is_empty(),
            !self.cohort_ids.is_empty(),
            self.sql.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return plan_err!(
                "{key}: give exactly one of concept_ids, cohort_ids or sql (a concept set)"
            );
        }
        if self.include_descendants && self.concept_ids.is_empty() {
            return plan_err!("{key}.include_descendants: only with concept_ids");
        }
        if self.domain.is_some() && self.concept_ids.is_empty() {
            return plan_err!("{key}.domain: only with concept_ids");
        }
        if let Some(p) = self.persistence_days {
            if p < 0 || self.domain != Some(Domain::DerivedDrugEra) {
                return plan_err!(
                    "{key}.persistence_days: a number ≥ 0, only with domain = \"derived_drug_era\""
                );
            }
        }
        Ok(())
    }

    /// SQL returning `person_id, concept_id, start_day, end_day` (days since 1970-01-01,
    /// inclusive). `concept_id` is the concept id asked for (the ancestor when descendants are
    /// included), the cohort definition id, or the query's `concept_id`.
    pub fn sql(&self, default_domain: Domain) -> String {
        if let Some(q) = &self.sql {
            return format!(
                "SELECT CAST(person_id AS BIGINT) AS person_id, CAST(concept_id AS BIGINT) AS concept_id, \
                 CAST(CAST(start_date AS DATE) AS INT) AS start_day, \
                 CAST(CAST(coalesce(end_date, start_date) AS DATE) AS INT) AS end_day FROM ({q}) AS user_set"
            );
        }
        if !self.cohort_ids.is_empty() {
            return format!(
                "SELECT subject_id AS person_id, cohort_definition_id AS concept_id, \
                 CAST(cohort_start_date AS INT) AS start_day, \
                 CAST(coalesce(cohort_end_date, cohort_start_date) AS INT) AS end_day \
                 FROM cohort WHERE cohort_definition_id IN ({})",
                id_list(&self.cohort_ids)
            );
        }
        let domain = self.domain.unwrap_or(default_domain);
        let (table, concept, start, end) = domain.columns();
        let values = self
            .concept_ids
            .iter()
            .map(|c| format!("({c}, {c})"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut ids =
            format!("SELECT column1 AS set_id, column2 AS matched_id FROM (VALUES {values})");
        if self.include_descendants {
            ids = format!(
                "{ids} UNION SELECT ancestor_concept_id, descendant_concept_id FROM concept_ancestor \
                 WHERE ancestor_concept_id IN ({})",
                id_list(&self.concept_ids)
            );
        }
        let end_expr = if end.contains('(') {
            end.to_string()
        } else {
            format!("coalesce(CAST(t.{end} AS INT), CAST(t.{start} AS INT))")
        };
        let rows = format!(
            "SELECT t.person_id, ids.set_id AS concept_id, CAST(t.{start} AS INT) AS start_day, \
             {end_expr} AS end_day FROM {table} t JOIN ({ids}) AS ids ON t.{concept} = ids.matched_id \
             WHERE t.{start} IS NOT NULL"
        );
        if domain == Domain::DerivedDrugEra {
            eras::era_sql(&rows, self.persistence_days.unwrap_or(30))
        } else {
            rows
        }
    }
}

fn id_list(ids: &[i64]) -> String {
    ids.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parse settings JSON into a design, naming the offending key on error.
pub fn parse_json<T: serde::de::DeserializeOwned>(what: &str, json: &str) -> DfResult<T> {
    serde_json::from_str(json).map_err(|e| match key_before(json, e.line(), e.column()) {
        Some(key) if e.is_data() => plan_datafusion_err!("{what} settings, key `{key}`: {e}"),
        _ => plan_datafusion_err!("{what} settings: {e}"),
    })
}

/// The last object key that appears before (line, column) of `json` (1-based, as serde_json
/// reports errors): the key whose value failed to parse.
fn key_before(json: &str, line: usize, column: usize) -> Option<String> {
    let start_of_line: usize = json
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    let rest = &json[start_of_line.min(json.len())..];
    let offset = rest
        .char_indices()
        .nth(column)
        .map_or(json.len(), |(i, _)| start_of_line + i);
    let prefix = &json[..offset.min(json.len())];
    let mut key = None;
    let mut chars = prefix.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut end = None;
        let mut escaped = false;
        for (j, c) in chars.by_ref() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(j);
                    break;
                }
                _ => {}
            }
        }
        let Some(end) = end else { break };
        if prefix[end + 1..].trim_start().starts_with(':') {
            key = Some(prefix[i + 1..end].to_string());
        }
    }
    key
}

/// A date `YYYY-MM-DD` as days since 1970-01-01 (`key` names it in errors).
pub fn parse_date(key: &str, s: &str) -> DfResult<i64> {
    let parts: Vec<&str> = s.split('-').collect();
    let nums: Option<Vec<i64>> = parts.iter().map(|p| p.parse::<i64>().ok()).collect();
    match nums.as_deref() {
        Some(&[y, m, d])
            if parts[0].len() == 4 && (1..=12).contains(&m) && (1..=31).contains(&d) =>
        {
            let day = days_from_civil(y, m, d);
            if civil_from_days(day) != (y, m, d) {
                return plan_err!("{key}: {s} is not a calendar date");
            }
            Ok(day)
        }
        _ => plan_err!("{key}: expected a date YYYY-MM-DD, got {s:?}"),
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// (year, month, day) of a day number (inverse of [`days_from_civil`]).
pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Run a read-only query (settings and concept sets carry user SQL: no DML, COPY or DDL, see
/// [`crate::planning`]) and collect its batches.
pub async fn query(ctx: &SessionContext, sql: &str) -> DfResult<Vec<RecordBatch>> {
    crate::planning::read_only_sql(ctx, sql)
        .await?
        .collect()
        .await
}

/// A uniquely named temporary table in `ctx`, removed when dropped.
pub struct TempTable {
    ctx: SessionContext,
    /// The table's name.
    pub name: String,
}

impl TempTable {
    /// Register `batches` (of `schema`) under a fresh name starting with `prefix`.
    pub fn register(
        ctx: &SessionContext,
        prefix: &str,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> DfResult<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!("__{prefix}_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let table = datafusion::datasource::MemTable::try_new(schema, vec![batches])?;
        ctx.register_table(name.as_str(), Arc::new(table))?;
        Ok(TempTable {
            ctx: ctx.clone(),
            name,
        })
    }
}

impl Drop for TempTable {
    fn drop(&mut self) {
        let _ = self.ctx.deregister_table(self.name.as_str());
    }
}

/// Fill `{name}` placeholders of a SQL template; every placeholder of the template must be
/// given (values are inserted once, so a value may itself contain braces). Whole-line `--`
/// comments of the template are dropped first (they mention the placeholders).
pub fn fill(template: &str, values: &[(&str, String)]) -> DfResult<String> {
    let template: String = template
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::with_capacity(template.len() * 2);
    let mut rest = template.as_str();
    while let Some(pos) = rest.find('{') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        let name_len = after
            .bytes()
            .take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_')
            .count();
        if name_len > 0 && after.as_bytes().get(name_len) == Some(&b'}') {
            let name = &after[..name_len];
            match values.iter().find(|(k, _)| *k == name) {
                Some((_, v)) => out.push_str(v),
                None => return plan_err!("study SQL template: no value for {{{name}}}"),
            }
            rest = &after[name_len + 1..];
        } else {
            out.push('{');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Schema of the covariate reference.
pub fn covariate_ref_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("covariate_id", DataType::Int64, false),
        Field::new("covariate_name", DataType::Utf8, false),
        Field::new("analysis_id", DataType::Int64, false),
        Field::new("analysis_name", DataType::Utf8, false),
        Field::new("concept_id", DataType::Int64, true),
    ]))
}

/// One covariate of a covariate reference.
#[derive(Debug, Clone, PartialEq)]
pub struct CovariateRef {
    /// Covariate id.
    pub covariate_id: i64,
    /// Readable name.
    pub name: String,
    /// Analysis id.
    pub analysis_id: i64,
    /// Analysis name.
    pub analysis_name: String,
    /// Concept id, if the covariate is one concept.
    pub concept_id: Option<i64>,
}

/// The covariate reference as one batch.
pub fn covariate_ref_batch(refs: &[CovariateRef]) -> DfResult<RecordBatch> {
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(
            refs.iter().map(|r| r.covariate_id),
        )),
        Arc::new(StringArray::from_iter_values(
            refs.iter().map(|r| r.name.as_str()),
        )),
        Arc::new(Int64Array::from_iter_values(
            refs.iter().map(|r| r.analysis_id),
        )),
        Arc::new(StringArray::from_iter_values(
            refs.iter().map(|r| r.analysis_name.as_str()),
        )),
        Arc::new(Int64Array::from_iter(refs.iter().map(|r| r.concept_id))),
    ];
    Ok(RecordBatch::try_new(covariate_ref_schema(), cols)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        for z in [-800_000, -1, 0, 59, 60, 11_016, 80_000] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        assert_eq!(parse_date("k", "2000-02-29").unwrap(), 11_016);
        assert!(parse_date("k", "2001-02-29").is_err());
        assert!(parse_date("study_start_date", "2001/02/01")
            .unwrap_err()
            .to_string()
            .contains("study_start_date"));
    }

    #[test]
    fn concept_sets_need_exactly_one_source() {
        let cs: ConceptSet =
            serde_json::from_str(r#"{"concept_ids": [1], "cohort_ids": [2]}"#).unwrap();
        assert!(cs.check("outcome").is_err());
        assert!(ConceptSet::default().check("outcome").is_err());
        assert!(serde_json::from_str::<ConceptSet>(r#"{"concept_id": [1]}"#).is_err());
        let cs: ConceptSet =
            serde_json::from_str(r#"{"concept_ids": [1], "include_descendants": true}"#).unwrap();
        cs.check("x").unwrap();
        assert!(cs.sql(Domain::DrugEra).contains("concept_ancestor"));
    }
}

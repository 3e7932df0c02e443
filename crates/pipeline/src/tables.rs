//! The one seam between a pipeline and the study designs: analysis unit → study tables.
//!
//! * `design = "sql"` runs the unit's queries.
//! * `design = "sccs"`: the `[analysis.sccs]` table holds [`SccsDesign`]'s settings (see
//!   `crates/sql/src/study/sccs.rs`); the per-exposure keys `risk_windows`, `stratify_by_id`,
//!   `first_occurrence_only`, `label` and `id` may be written at the top of the table and apply
//!   to the unit's exposure. The unit's `exposure` and `outcome` concept sets become the
//!   design's `exposures` and `outcome`.
//! * `design = "cohort"`: `[analysis.cohort]` holds [`CohortDesign`]'s settings; the unit's
//!   `target`, `comparator`, `outcome` and (optional) `competing` concept sets fill the design,
//!   and the analysis' model gives `model` (cox or fine_gray). A competing concept set that is
//!   the `death` table without concepts becomes `competing.death = true`.
//!
//! A concept set with `concepts` (and `table` one of the study designs' domains, or none) is
//! passed as concept ids, so the cohort design can exclude the target and comparator concepts
//! from the baseline covariates; any other concept set (cohort, SQL, other tables) is passed as
//! a query over the concept set's view, which the pipeline registered under its name.

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::Result as DfResult;
use datafusion::prelude::SessionContext;

use super::plan::{Analysis, Design};
use super::spec::DesignKind;
use epifusion_sql::study::{self, CohortDesign, SccsDesign};
use serde_json::{json, Map, Value};

/// The tables a design produces (the same shape as the study module's `StudyTables`).
#[derive(Debug, Clone, Default)]
pub struct StudyTables {
    /// Outcome rows (DESIGN.md §4).
    pub outcomes: Vec<RecordBatch>,
    /// Covariates (long format).
    pub covariates: Vec<RecordBatch>,
    /// Covariate reference: `covariate_id`, `covariate_name`, ….
    pub covariate_ref: Vec<RecordBatch>,
    /// Attrition: one row per step.
    pub attrition: Vec<RecordBatch>,
}

/// Whether this build can run `design` (all of them since the study designs landed).
pub fn design_available(design: DesignKind) -> bool {
    matches!(
        design,
        DesignKind::Sql | DesignKind::Sccs | DesignKind::Cohort
    )
}

/// The study domains a pipeline `table` may name for a concept-id concept set.
const STUDY_DOMAINS: &[&str] = &[
    "drug_era",
    "drug_exposure",
    "condition_occurrence",
    "condition_era",
    "procedure_occurrence",
    "observation",
    "measurement",
    "visit_occurrence",
];

/// The study module's concept set for the unit's `role`.
fn concept_set(a: &Analysis, role: &str) -> DfResult<Value> {
    let Some(name) = a.role(role) else {
        return datafusion::common::plan_err!(
            "analysis `{}`: the {} design needs a `{role}` concept set",
            a.name,
            a.design.kind().name()
        );
    };
    let c = &a.concept_sets[name];
    if let Some(ids) = &c.concepts {
        if c.table
            .as_deref()
            .is_none_or(|t| STUDY_DOMAINS.contains(&t))
        {
            let mut v = json!({"concept_ids": ids, "include_descendants": c.descendants});
            if let Some(t) = &c.table {
                v["domain"] = json!(t);
            }
            return Ok(v);
        }
    }
    if let Some(id) = c.cohort {
        return Ok(json!({"cohort_ids": [id]}));
    }
    // Any other definition: the view the pipeline registered for it (person_id, start_date,
    // end_date and, for concept-based sets, concept_id).
    let concept = if c.concepts.is_some() || c.table.is_some() && c.sql.is_none() {
        "CAST(concept_id AS BIGINT)"
    } else {
        "CAST(0 AS BIGINT)"
    };
    Ok(json!({"sql": format!(
        "SELECT person_id, {concept} AS concept_id, start_date, end_date FROM {name}"
    )}))
}

fn is_death_table(a: &Analysis, role: &str) -> bool {
    a.role(role)
        .map(|n| &a.concept_sets[n])
        .is_some_and(|c| c.table.as_deref() == Some("death") && c.concepts.is_none())
}

fn settings(a: &Analysis, t: &toml::Table) -> DfResult<Map<String, Value>> {
    match serde_json::to_value(t) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Ok(Map::new()),
        Err(e) => datafusion::common::plan_err!(
            "analysis `{}`: [analysis.{}]: {e} (write dates as \"YYYY-MM-DD\" strings)",
            a.name,
            a.design.kind().name()
        ),
    }
}

/// Keys of an SCCS exposure that `[analysis.sccs]` may hold at its top; they apply to the
/// unit's exposure (`exposures[0]` of the design).
pub const SCCS_EXPOSURE_KEYS: &[&str] = &[
    "risk_windows",
    "stratify_by_id",
    "first_occurrence_only",
    "label",
    "id",
];

/// `SccsDesign` settings (JSON) of unit `a`.
pub fn sccs_settings(a: &Analysis, t: &toml::Table) -> DfResult<String> {
    let mut d = settings(a, t)?;
    let mut exposure = concept_set(a, "exposure")?;
    for &k in SCCS_EXPOSURE_KEYS {
        if let Some(v) = d.remove(k) {
            exposure[k] = v;
        }
    }
    if exposure.get("label").is_none() {
        exposure["label"] = json!(a.role("exposure"));
    }
    d.insert("exposures".into(), json!([exposure]));
    d.insert("outcome".into(), concept_set(a, "outcome")?);
    Ok(Value::Object(d).to_string())
}

/// `CohortDesign` settings (JSON) of unit `a`.
pub fn cohort_settings(a: &Analysis, t: &toml::Table) -> DfResult<String> {
    let mut d = settings(a, t)?;
    super::cohort_adjust::strip(&mut d);
    d.insert("target".into(), concept_set(a, "target")?);
    d.insert("comparator".into(), concept_set(a, "comparator")?);
    d.insert("outcome".into(), concept_set(a, "outcome")?);
    if a.role("competing").is_some() {
        let competing = if is_death_table(a, "competing") {
            json!({"death": true})
        } else {
            json!({"outcome": concept_set(a, "competing")?})
        };
        d.insert("competing".into(), competing);
    }
    if !d.contains_key("model") {
        d.insert("model".into(), json!(a.model.name()));
    }
    Ok(Value::Object(d).to_string())
}

pub(crate) fn from_study(t: study::StudyTables) -> StudyTables {
    StudyTables {
        outcomes: t.outcomes,
        covariates: t.covariates,
        covariate_ref: t.covariate_ref,
        attrition: t.attrition,
    }
}

/// Build the study tables of `a` (the SQL design's `setup` has already run in `ctx`).
pub async fn build_tables(ctx: &SessionContext, a: &Analysis) -> DfResult<StudyTables> {
    match &a.design {
        Design::Sql(q) => {
            // An empty result still carries its schema (one empty batch).
            let run = |sql: Option<String>| async move {
                let Some(sql) = sql else {
                    return Ok(Vec::new());
                };
                let df = ctx.sql(&sql).await?;
                let schema = Arc::new(df.schema().as_arrow().clone());
                let mut batches = df.collect().await?;
                if batches.is_empty() {
                    batches.push(RecordBatch::new_empty(schema));
                }
                Ok::<_, datafusion::error::DataFusionError>(batches)
            };
            Ok(StudyTables {
                outcomes: canonical(run(Some(q.outcomes.value.clone())).await?)?,
                covariates: canonical(run(q.covariates.as_ref().map(|l| l.value.clone())).await?)?,
                covariate_ref: canonical(
                    run(q.covariate_ref.as_ref().map(|l| l.value.clone())).await?,
                )?,
                attrition: run(q.attrition.as_ref().map(|l| l.value.clone())).await?,
            })
        }
        Design::Sccs(t) => {
            let d = SccsDesign::from_json(&sccs_settings(a, t)?)?;
            study::build_sccs(ctx, &d).await.map(from_study)
        }
        Design::Cohort(t) => {
            let d = CohortDesign::from_json(&cohort_settings(a, t)?)?;
            study::build_cohort(ctx, &d).await.map(from_study)
        }
    }
}

/// The rows of a SQL design's outcome, covariate or covariate-reference query in one order
/// whatever order the engine returned them in (a query without `ORDER BY` may return its rows
/// in another order on each run, with more threads, or on a cluster): sorted by every column,
/// first to last. The fit sums over rows in their order, so this makes a unit's estimates the
/// same to the last bit on every run. A table with a column that cannot be sorted keeps its
/// order. (The attrition query keeps the order it asks for.)
pub(crate) fn canonical(batches: Vec<RecordBatch>) -> DfResult<Vec<RecordBatch>> {
    use datafusion::arrow::compute::{
        concat_batches, lexsort_to_indices, take_record_batch, SortColumn,
    };
    let Some(first) = batches.first() else {
        return Ok(batches);
    };
    let all = concat_batches(first.schema_ref(), &batches)?;
    if all.num_rows() < 2 {
        return Ok(batches);
    }
    let columns: Vec<SortColumn> = all
        .columns()
        .iter()
        .map(|c| SortColumn {
            values: c.clone(),
            options: None,
        })
        .collect();
    match lexsort_to_indices(&columns, None) {
        Ok(order) => Ok(vec![take_record_batch(&all, &order)?]),
        Err(_) => Ok(batches),
    }
}

//! A cohort build as distributed queries: how `cohort_outcomes`, `cohort_covariates`,
//! `cohort_covariate_ref` and `cohort_attrition` run on a cluster.
//!
//! The local build ([`super::build_cohort`]) runs the population query, keeps the entries that
//! pass every step, registers them as a table and runs the baseline covariate query over it.
//! On a cluster the client plans the same SQL as up to two queries that Ballista distributes
//! like any other (their joins and aggregates are hash-partitioned by person and run on the
//! executors, each reading its own share of the store) and one merge node,
//! [`NodeSpec::CohortMerge`](crate::exec::NodeSpec::CohortMerge), that does the small Rust
//! part in one task:
//!
//! * `cohort_outcomes`, `cohort_attrition`: the population query (one row per candidate
//!   entry); the merge numbers the entries and strata, applies the common period and counts
//!   the attrition;
//! * `cohort_covariates`: the population query and the covariate query over the population's
//!   entries that pass the query's steps, inlined as a subquery ([`kept_population_sql`])
//!   instead of a table of the client's memory; the merge maps its rows to `row_id`, drops
//!   those of entries the common period removes, adds the treatment rows and orders the rows;
//! * `cohort_covariate_ref`: the covariate query's distinct covariates with their concept
//!   names (a join with `concept` when the session has one) — no covariate rows travel. With
//!   `restrict_to_common_period` an entry can pass the query and still be dropped, so the
//!   population and covariate queries come first, and the merge takes the covariates of the
//!   kept entries and only the names from the third query.
//!
//! Both queries work person by person and key an entry by (`person_id`, `entry_seq`) (no global
//! numbering, ordering or aggregate: shapes that a distributed engine evaluates by person), and
//! the merge checks what it reads: every person's entries numbered 1..n once, no covariate row
//! twice. A lost or repeated row is an error, not a quietly different cohort.
//!
//! The population query runs twice for `cohort_covariates` (once inside the covariate query):
//! that is the price of not shipping the kept entries from the client. The result is the local
//! build's, bit for bit: both read the same entries and order the rows by (`row_id`,
//! `covariate_id`) whatever order they arrive in.

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::{exec_datafusion_err, exec_err, Result as DfResult};
use datafusion::prelude::SessionContext;

use super::cohort::{
    attrition, baseline_covariates, covariate_ref_table, outcome_batch, read_entries, row_ids,
    treatment_covariates, CovariateOrigins, Entry, POPULATION_COLUMNS,
};
use super::functions::Part;
use super::sccs::{covariate_schema, i64_column};
use super::{covariate_ref_schema, CohortDesign};

/// The entries that pass the population query's steps, as the covariate query reads them (the
/// columns and types of the local build's table of kept entries; the common period, applied in
/// the merge, can drop more).
pub fn kept_population_sql(d: &CohortDesign) -> DfResult<String> {
    let columns = POPULATION_COLUMNS
        .iter()
        .map(|c| format!("CAST(p.{c} AS BIGINT) AS {c}"))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(format!(
        "(SELECT {columns} FROM ({}) AS p WHERE p.dropped_at = 0) AS cohort_population",
        d.population_sql()?
    ))
}

/// The queries the merge of `part` reads (module documentation), planned in `ctx` (which
/// says whether the store has `concept`, `concept_ancestor` and the covariate domains).
pub fn split_queries(ctx: &SessionContext, d: &CohortDesign, part: Part) -> DfResult<Vec<String>> {
    let population = d.population_sql()?;
    let covariates = || d.covariates_sql(ctx, &kept_population_sql(d)?);
    Ok(match part {
        Part::Outcomes | Part::Attrition => vec![population],
        Part::Covariates => vec![population, covariates()?],
        Part::CovariateRef => {
            let distinct = format!(
                "SELECT CAST(b.covariate_id AS BIGINT) AS covariate_id, \
                 CAST(min(b.analysis_id) AS BIGINT) AS analysis_id, \
                 CAST(min(b.concept_id) AS BIGINT) AS concept_id \
                 FROM ({}) AS b GROUP BY b.covariate_id",
                covariates()?
            );
            let named = if ctx.table_exist("concept").unwrap_or(false) {
                format!(
                    "SELECT r.covariate_id, r.analysis_id, r.concept_id, \
                     CAST(n.concept_name AS VARCHAR) AS concept_name FROM ({distinct}) AS r \
                     LEFT JOIN concept n ON CAST(n.concept_id AS BIGINT) = r.concept_id"
                )
            } else {
                format!(
                    "SELECT r.covariate_id, r.analysis_id, r.concept_id, \
                     CAST(NULL AS VARCHAR) AS concept_name FROM ({distinct}) AS r"
                )
            };
            if d.restrict_to_common_period {
                vec![population, covariates()?, named]
            } else {
                vec![named]
            }
        }
    })
}

/// The three queries of every table of design `d` at once (`population`, `covariates`,
/// `covariate reference`; [`split_queries`]), planned in `ctx`: what a cluster task that needs
/// the whole build (a pipeline unit) reads; [`tables_of`] makes the tables from their results.
pub fn all_queries(ctx: &SessionContext, d: &CohortDesign) -> DfResult<[String; 3]> {
    let mut both = split_queries(ctx, d, Part::Covariates)?;
    let named = split_queries(ctx, d, Part::CovariateRef)?
        .pop()
        .ok_or_else(|| exec_datafusion_err!("cohort: no covariate reference query"))?;
    let covariates = both.pop();
    let population = both.pop();
    match (population, covariates) {
        (Some(p), Some(c)) => Ok([p, c, named]),
        _ => exec_err!("cohort: no population or covariate query"),
    }
}

/// The four tables of design `d` from the results of its [`all_queries`], as the local build
/// ([`super::build_cohort`]) returns them (the covariates as one batch). The same tables as
/// [`merge`] of each part, with the population read and the baseline covariates gathered once.
pub fn tables_of(d: &CohortDesign, inputs: [Vec<RecordBatch>; 3]) -> DfResult<super::StudyTables> {
    let [population, covariates, named] = inputs;
    let entries = read_entries(d, &population)?;
    drop(population);
    let attrition = attrition(d, &entries)?;
    let kept: Vec<&Entry> = entries.iter().filter(|e| e.dropped_at == 0).collect();
    let outcomes = outcome_batch(d, &kept)?;
    let (baseline, kept_refs) = baseline_covariates(&covariates, &row_ids(&kept))?;
    drop(covariates);
    let (all_refs, names) = read_refs(&named)?;
    // As `merge`: with a common period, the kept entries' covariates; without, every
    // covariate of the reference query.
    let refs = if d.restrict_to_common_period {
        kept_refs
    } else {
        all_refs
    };
    let covariate_ref = covariate_ref_table(refs, &names)?;
    let treatment = treatment_covariates(&kept)?;
    let covariates =
        datafusion::arrow::compute::concat_batches(&covariate_schema(), &[treatment, baseline])?;
    Ok(super::StudyTables {
        outcomes: vec![outcomes],
        covariates: vec![covariates],
        covariate_ref: vec![covariate_ref],
        attrition: vec![attrition],
    })
}

/// How many queries the merge of `part` reads ([`split_queries`]).
pub fn input_count(d: &CohortDesign, part: Part) -> usize {
    match part {
        Part::Outcomes | Part::Attrition => 1,
        Part::Covariates => 2,
        Part::CovariateRef if d.restrict_to_common_period => 3,
        Part::CovariateRef => 1,
    }
}

/// The names of the queries of `part`, for errors.
pub fn query_names(d: &CohortDesign, part: Part) -> &'static [&'static str] {
    match input_count(d, part) {
        1 if part == Part::CovariateRef => &["covariate reference"],
        1 => &["population"],
        2 => &["population", "covariates"],
        _ => &["population", "covariates", "covariate reference"],
    }
}

/// The schema of `part` of design `d`.
pub fn part_schema(d: &CohortDesign, part: Part) -> SchemaRef {
    match part {
        Part::Outcomes => super::cohort::outcome_schema(!d.strata.is_empty()),
        Part::Covariates => covariate_schema(),
        Part::CovariateRef => covariate_ref_schema(),
        Part::Attrition => super::cohort::attrition_schema(),
    }
}

/// `part` of design `d` from the results of its [`split_queries`]: the table the local build
/// returns.
pub fn merge(d: &CohortDesign, part: Part, inputs: &[Vec<RecordBatch>]) -> DfResult<RecordBatch> {
    let wants = input_count(d, part);
    if inputs.len() != wants {
        return exec_err!(
            "cohort merge: {part:?} reads {wants} query results, got {}",
            inputs.len()
        );
    }
    if wants == 1 && part == Part::CovariateRef {
        let (refs, names) = read_refs(&inputs[0])?;
        return covariate_ref_table(refs, &names);
    }
    let entries = read_entries(d, &inputs[0])?;
    if part == Part::Attrition {
        return attrition(d, &entries);
    }
    let kept: Vec<&Entry> = entries.iter().filter(|e| e.dropped_at == 0).collect();
    if part == Part::Outcomes {
        return outcome_batch(d, &kept);
    }
    let (baseline, refs) = baseline_covariates(&inputs[1], &row_ids(&kept))?;
    if part == Part::CovariateRef {
        // The kept entries' covariates; the names of the third query (a superset's).
        let (_, names) = read_refs(&inputs[2])?;
        return covariate_ref_table(refs, &names);
    }
    let treatment = treatment_covariates(&kept)?;
    Ok(datafusion::arrow::compute::concat_batches(
        &covariate_schema(),
        &[treatment, baseline],
    )?)
}

/// The covariates and concept names of the covariate-reference query.
fn read_refs(batches: &[RecordBatch]) -> DfResult<(CovariateOrigins, BTreeMap<i64, String>)> {
    let mut refs = CovariateOrigins::new();
    let mut names = BTreeMap::new();
    for b in batches {
        let (cov, analysis, concept) = (
            i64_column(b, "covariate_id")?,
            i64_column(b, "analysis_id")?,
            i64_column(b, "concept_id")?,
        );
        let name = datafusion::arrow::compute::cast(
            b.column_by_name("concept_name")
                .ok_or_else(|| exec_datafusion_err!("cohort merge: no column concept_name"))?,
            &DataType::Utf8,
        )?;
        let name = name
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| exec_datafusion_err!("cohort merge: concept_name is not text"))?;
        for i in 0..b.num_rows() {
            let concept = (!concept.is_null(i)).then(|| concept.value(i));
            refs.entry(cov.value(i))
                .or_insert((analysis.value(i), concept));
            if let (Some(c), false) = (concept, name.is_null(i)) {
                names.insert(c, name.value(i).to_string());
            }
        }
    }
    Ok((refs, names))
}

//! Comparative cohort studies in SQL: propensity scores, matching, stratification, IPTW
//! weights and covariate balance as the OHDSI `CohortMethod` package computes them (issue #14;
//! the maths is [`epifusion_core::cohort`]).
//!
//! * `cohort_propensity_scores(subjects, covariates [, settings])`: `subjects` has `row_id`
//!   and `treatment` (0/1; other columns are passed through), `covariates` the long format
//!   (`row_id`, `covariate_id` [, `covariate_value`]); the Laplace-regularized logistic
//!   propensity model of `createPs` ([`PsSettings`], plus `"table": "scores" | "model"`) →
//!   one row per subject: `row_id`, `treatment`, `propensity_score`, `preference_score`, the
//!   other subject columns; or, with `"table": "model"`, the model's non-zero coefficients
//!   (`covariate_id` NULL for the intercept) with the variance, status and log likelihood.
//! * `cohort_match(ps_rows [, settings])`, `cohort_stratify(ps_rows [, settings])`,
//!   `cohort_weights(ps_rows [, settings])`: `ps_rows` has `row_id`, `treatment`,
//!   `propensity_score` (optionally `stratum_id`: matching within it, strata crossed with it);
//!   [`MatchSettings`], [`StratifySettings`], [`IptwSettings`] → the rows (matched subjects
//!   only for `cohort_match`) with `stratum_id` or `weight`, and the other columns passed
//!   through.
//! * `cohort_balance(adjusted, covariates [, settings])`: `adjusted` has `row_id`,
//!   `treatment` and at most one of `stratum_id` (matched sets, strata) or `weight` (IPTW);
//!   the population *before* adjustment is the `before` setting (a table name or read-only
//!   query with `row_id`, `treatment`; every `adjusted` row must be one of its subjects) or,
//!   without it, the adjusted rows unweighted → one row per covariate with the
//!   `cm_covariate_balance` columns.
//! * `cohort_diagnostics(adjusted, covariates [, settings])`: the same inputs (plus
//!   `propensity_score` for equipoise and `outcome_count` [, `time_at_risk`] for the MDRR) →
//!   CohortMethod's pass/fail diagnostics `balance`, `equipoise`, `mdrr` and `unblind`
//!   ([`DiagnosticThresholds`]); generalizability, shared balance and EASE are not computed
//!   here (NOT EVALUATED, they never block).
//!
//! Covariate rows whose `row_id` is not a subject are ignored (the covariates table usually
//! holds the whole cohort). NULL ids, treatments, scores or values, treatments other than
//! 0/1, duplicate row ids and scores outside [0, 1] are errors naming the column and the row.
//! Every function runs its work on a blocking thread ([`crate::fit_table::run_blocking`]).

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt32Array,
};
use datafusion::arrow::compute::{cast, concat_batches, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{exec_datafusion_err, plan_err, DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Documentation, Expr, TableType};
use datafusion::physical_plan::{collect, ExecutionPlan};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use epifusion_core::cohort::balance::{covariate_balance, AdjustedPopulation, Adjustment, Balance};
use epifusion_core::cohort::diagnostics::{evaluate, DiagnosticThresholds, DiagnosticValues};
use epifusion_core::cohort::matching::{match_on_ps, MatchSettings};
use epifusion_core::cohort::power::{mdrr_summary, MdrrSettings};
use epifusion_core::cohort::preference::preference_scores;
use epifusion_core::cohort::preference::EquipoiseSettings;
use epifusion_core::cohort::ps::{fit_propensity, PsSettings};
use epifusion_core::cohort::stratify::{stratify_by_ps, StratifySettings};
use epifusion_core::cohort::weights::{iptw, IptwSettings};
use epifusion_core::cohort::SparseCovariates;

use crate::exec::{EpiExec, NodeSpec};
use crate::fit_table::{check_table_arg, run_blocking, string_args, table_sql, IntoDfResult};
use crate::planning::plan_sql;

/// Which comparative-cohort function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CohortPart {
    /// `cohort_propensity_scores(subjects, covariates [, settings])`.
    PropensityScores,
    /// `cohort_match(ps_rows [, settings])`.
    Match,
    /// `cohort_stratify(ps_rows [, settings])`.
    Stratify,
    /// `cohort_weights(ps_rows [, settings])`.
    Weights,
    /// `cohort_balance(adjusted, covariates [, settings])`.
    Balance,
    /// `cohort_diagnostics(adjusted, covariates [, settings])`.
    Diagnostics,
}

/// The comparative-cohort SQL functions.
pub const COHORT_FUNCTIONS: [(&str, CohortPart); 6] = [
    ("cohort_propensity_scores", CohortPart::PropensityScores),
    ("cohort_match", CohortPart::Match),
    ("cohort_stratify", CohortPart::Stratify),
    ("cohort_weights", CohortPart::Weights),
    ("cohort_balance", CohortPart::Balance),
    ("cohort_diagnostics", CohortPart::Diagnostics),
];

impl CohortPart {
    /// The table arguments, in order (the settings JSON may follow).
    fn tables(self) -> &'static [&'static str] {
        match self {
            CohortPart::PropensityScores => &["subjects", "covariates"],
            CohortPart::Balance | CohortPart::Diagnostics => &["adjusted", "covariates"],
            _ => &["ps_rows"],
        }
    }

    fn usage(self) -> &'static str {
        match self {
            CohortPart::PropensityScores => {
                "subjects: row_id, treatment; covariates: row_id, covariate_id [, covariate_value]; settings JSON"
            }
            CohortPart::Balance => {
                "adjusted: row_id, treatment [, stratum_id | weight]; covariates: row_id, covariate_id [, covariate_value]; settings JSON"
            }
            CohortPart::Diagnostics => {
                "adjusted: row_id, treatment [, stratum_id | weight] [, propensity_score] [, outcome_count, time_at_risk]; covariates: row_id, covariate_id [, covariate_value]; settings JSON"
            }
            _ => "ps_rows: row_id, treatment, propensity_score [, stratum_id]; settings JSON",
        }
    }

    /// The columns the function writes (an input column of the same name is replaced).
    fn written(self) -> &'static [&'static str] {
        match self {
            CohortPart::PropensityScores => &[
                "row_id",
                "treatment",
                "propensity_score",
                "preference_score",
            ],
            CohortPart::Match | CohortPart::Stratify => {
                &["row_id", "treatment", "propensity_score", "stratum_id"]
            }
            CohortPart::Weights => &["row_id", "treatment", "propensity_score", "weight"],
            CohortPart::Balance | CohortPart::Diagnostics => &[],
        }
    }
}

/// A comparative-cohort table function.
#[derive(Debug)]
pub struct CohortTableFunction {
    name: &'static str,
    part: CohortPart,
}

impl CohortTableFunction {
    /// The function `name` computing `part`.
    pub fn new(name: &'static str, part: CohortPart) -> Self {
        CohortTableFunction { name, part }
    }
}

impl TableFunctionImpl for CohortTableFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let (name, part) = (self.name, self.part);
        let usage = part.usage();
        let strings = string_args(name, args.exprs(), usage)?;
        let n_tables = part.tables().len();
        if strings.len() < n_tables || strings.len() > n_tables + 1 {
            return plan_err!(
                "{name} takes {n_tables} or {} arguments ({usage}), got {}",
                n_tables + 1,
                strings.len()
            );
        }
        for (i, s) in strings.iter().take(n_tables).enumerate() {
            check_table_arg(name, i + 1, s)?;
        }
        let settings = strings.get(n_tables).cloned().unwrap_or_default();
        // Settings mistakes are planning errors, before anything runs.
        let work = CohortWork::parse(name, part, &settings)?;
        let mut inputs: Vec<String> = strings[..n_tables].iter().map(|s| table_sql(s)).collect();
        if let Some(before) = work.before() {
            check_table_arg(name, n_tables + 1, before)?;
            inputs.push(table_sql(before));
        }
        // Passed-through columns: the first input's schema is part of the output's.
        let first = input_schema(args.session(), name, &inputs[0])?;
        let schema = work.schema(&first)?;
        Ok(Arc::new(CohortTable {
            function: name,
            settings,
            inputs,
            schema,
        }))
    }
}

/// The schema of a read-only input query, planned in the calling session.
fn input_schema(session: &dyn Session, function: &str, sql: &str) -> DfResult<SchemaRef> {
    let state = crate::planning::planning_state(session);
    let (sql, what) = (sql.to_string(), format!("{function}: an input query"));
    crate::calibration::block_on(async move {
        let plan = state.create_logical_plan(&sql).await?;
        crate::planning::check_read_only(&plan, &what)?;
        Ok(Arc::new(plan.schema().as_arrow().clone()))
    })
}

/// The table of a cohort function call.
#[derive(Debug)]
pub(crate) struct CohortTable {
    function: &'static str,
    settings: String,
    inputs: Vec<String>,
    schema: SchemaRef,
}

impl CohortTable {
    /// The node spec and input queries of the call, for a plan sent to a cluster.
    pub(crate) fn remote_call(&self) -> (NodeSpec, Vec<String>) {
        let spec = NodeSpec::Cohort {
            function: self.function.to_string(),
            settings: self.settings.clone(),
        };
        (spec, self.inputs.clone())
    }
}

#[async_trait]
impl TableProvider for CohortTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut children = Vec::with_capacity(self.inputs.len());
        for sql in &self.inputs {
            children.push(plan_sql(state, sql).await?);
        }
        let spec = NodeSpec::Cohort {
            function: self.function.to_string(),
            settings: self.settings.clone(),
        };
        Ok(Arc::new(EpiExec::try_new(
            spec,
            children,
            projection.cloned(),
            None,
        )?))
    }
}

/// `cohort_balance`'s settings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct BalanceSettings {
    /// The population before adjustment (table name or read-only query: row_id, treatment).
    before: Option<String>,
}

/// `cohort_diagnostics`' settings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct DiagnosticsSettings {
    /// The population before adjustment (row_id, treatment [, propensity_score]).
    before: Option<String>,
    /// Pass/fail thresholds (`createCmDiagnosticThresholds`).
    thresholds: DiagnosticThresholds,
    /// MDRR settings (`computeMdrr`).
    mdrr: MdrrSettings,
    /// Preference-score bounds of equipoise.
    equipoise: EquipoiseSettings,
}

/// The checked settings of a function.
#[derive(Debug, Clone, PartialEq)]
enum Settings {
    PropensityScores { ps: PsSettings, model_table: bool },
    Match(MatchSettings),
    Stratify(StratifySettings),
    Weights(IptwSettings),
    Balance(BalanceSettings),
    Diagnostics(DiagnosticsSettings),
}

/// The checked form of a cohort node: what `execute` needs.
#[derive(Debug, Clone)]
pub(crate) struct CohortWork {
    function: String,
    part: CohortPart,
    settings: Settings,
}

/// Parse a settings JSON object (empty: defaults) into `T`, naming the function.
fn parse_settings<T: DeserializeOwned + Default>(
    function: &str,
    json: serde_json::Value,
) -> DfResult<T> {
    if json.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(json)
        .map_err(|e| DataFusionError::Plan(format!("{function}: settings: {e}")))
}

/// A core error with the function's name in front (planning errors stay planning errors).
fn named(function: &str, e: DataFusionError) -> DataFusionError {
    match e {
        DataFusionError::Plan(m) => DataFusionError::Plan(format!("{function}: {m}")),
        DataFusionError::Execution(m) => DataFusionError::Execution(format!("{function}: {m}")),
        other => other,
    }
}

impl CohortWork {
    /// Parse and check the settings JSON of `function` (empty: defaults).
    pub(crate) fn parse(function: &str, part: CohortPart, json: &str) -> DfResult<Self> {
        let mut value = if json.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str::<serde_json::Value>(json).map_err(|e| {
                DataFusionError::Plan(format!(
                    "{function}: settings are not valid JSON ({e}): {json}"
                ))
            })?
        };
        if !(value.is_null() || value.is_object()) {
            return plan_err!("{function}: settings must be a JSON object, got {json}");
        }
        let check = |r: epifusion_core::Result<()>| r.into_df().map_err(|e| named(function, e));
        let settings = match part {
            CohortPart::PropensityScores => {
                let table = value
                    .as_object_mut()
                    .and_then(|o| o.remove("table"))
                    .map(|t| match t.as_str() {
                        Some("scores") => Ok(false),
                        Some("model") => Ok(true),
                        _ => plan_err!(
                            "{function}: settings: `table` must be \"scores\" or \"model\", got {t}"
                        ),
                    })
                    .transpose()?;
                let ps: PsSettings = parse_settings(function, value)?;
                check(ps.check())?;
                Settings::PropensityScores {
                    ps,
                    model_table: table.unwrap_or(false),
                }
            }
            CohortPart::Match => {
                let s: MatchSettings = parse_settings(function, value)?;
                check(s.check())?;
                Settings::Match(s)
            }
            CohortPart::Stratify => {
                let s: StratifySettings = parse_settings(function, value)?;
                check(s.check())?;
                Settings::Stratify(s)
            }
            CohortPart::Weights => {
                let s: IptwSettings = parse_settings(function, value)?;
                check(s.check())?;
                Settings::Weights(s)
            }
            CohortPart::Balance => Settings::Balance(parse_settings(function, value)?),
            CohortPart::Diagnostics => {
                let s: DiagnosticsSettings = parse_settings(function, value)?;
                check(s.thresholds.check())?;
                check(s.mdrr.check())?;
                check(s.equipoise.check())?;
                Settings::Diagnostics(s)
            }
        };
        Ok(CohortWork {
            function: function.to_string(),
            part,
            settings,
        })
    }

    /// `cohort_balance`'s `before` query, if given.
    fn before(&self) -> Option<&str> {
        match &self.settings {
            Settings::Balance(b) => b.before.as_deref(),
            Settings::Diagnostics(d) => d.before.as_deref(),
            _ => None,
        }
    }

    /// The number of input plans the node takes.
    pub(crate) fn inputs(&self) -> usize {
        self.part.tables().len() + usize::from(self.before().is_some())
    }

    /// The output schema, given the schema of the first input (whose other columns are passed
    /// through).
    pub(crate) fn schema(&self, first: &Schema) -> DfResult<SchemaRef> {
        let f = |n: &str, t: DataType, nullable: bool| Field::new(n, t, nullable);
        let fixed = match (&self.settings, self.part) {
            (
                Settings::PropensityScores {
                    model_table: true, ..
                },
                _,
            ) => {
                return Ok(Arc::new(Schema::new(vec![
                    f("covariate_id", DataType::Int64, true),
                    f("coefficient", DataType::Float64, false),
                    f("variance", DataType::Float64, false),
                    f("status", DataType::Utf8, false),
                    f("iterations", DataType::Int64, false),
                    f("log_likelihood", DataType::Float64, false),
                ])))
            }
            (_, CohortPart::Balance) => {
                let mut fields = vec![f("covariate_id", DataType::Int64, false)];
                for name in BALANCE_COLUMNS {
                    fields.push(f(name, DataType::Float64, true));
                }
                return Ok(Arc::new(Schema::new(fields)));
            }
            (_, CohortPart::Diagnostics) => {
                return Ok(Arc::new(Schema::new(vec![
                    f("diagnostic", DataType::Utf8, false),
                    f("value", DataType::Float64, true),
                    f("threshold", DataType::Float64, true),
                    f("status", DataType::Utf8, false),
                ])))
            }
            (_, part) => {
                let last = match part {
                    CohortPart::PropensityScores => "preference_score",
                    CohortPart::Weights => "weight",
                    _ => "stratum_id",
                };
                let last_type = if last == "stratum_id" {
                    DataType::Int64
                } else {
                    DataType::Float64
                };
                vec![
                    f("row_id", DataType::Int64, false),
                    f("treatment", DataType::Int64, false),
                    f("propensity_score", DataType::Float64, false),
                    f(last, last_type, false),
                ]
            }
        };
        for c in ["row_id", "treatment"] {
            if first.column_with_name(c).is_none() {
                return plan_err!("{}: the input has no column `{c}`", self.function);
            }
        }
        if self.part != CohortPart::PropensityScores
            && first.column_with_name("propensity_score").is_none()
        {
            return plan_err!(
                "{}: the input has no column `propensity_score`",
                self.function
            );
        }
        let written = self.part.written();
        let mut fields = fixed;
        fields.extend(
            first
                .fields()
                .iter()
                .filter(|fl| !written.contains(&fl.name().as_str()))
                .map(|fl| fl.as_ref().clone().with_nullable(true)),
        );
        Ok(Arc::new(Schema::new(fields)))
    }

    /// Collect the inputs and compute the table.
    pub(crate) async fn run(
        self,
        schema: &SchemaRef,
        children: Vec<Arc<dyn ExecutionPlan>>,
        ctx: Arc<TaskContext>,
    ) -> DfResult<RecordBatch> {
        let mut batches = Vec::with_capacity(children.len());
        for child in children {
            batches.push(collect_one(child, ctx.clone()).await?);
        }
        let function = self.function.clone();
        let r = match self.settings.clone() {
            Settings::PropensityScores { ps, model_table } => {
                self.propensity(schema, &batches, ps, model_table).await
            }
            Settings::Match(s) => self.adjust(schema, &batches[0], Adjust::Match(s)).await,
            Settings::Stratify(s) => self.adjust(schema, &batches[0], Adjust::Stratify(s)).await,
            Settings::Weights(s) => self.adjust(schema, &batches[0], Adjust::Weights(s)).await,
            Settings::Balance(_) => self.balance(schema, &batches).await,
            Settings::Diagnostics(d) => self.diagnostics(schema, &batches, d).await,
        };
        r.map_err(|e| named(&function, e))
    }

    async fn propensity(
        &self,
        schema: &SchemaRef,
        batches: &[RecordBatch],
        settings: PsSettings,
        model_table: bool,
    ) -> DfResult<RecordBatch> {
        let subjects = &batches[0];
        let (row_id, treatment) = read_subjects(subjects, "subjects")?;
        let index = row_index(&row_id, "subjects")?;
        let x = read_covariates(&batches[1], &index, &row_id)?;
        let arms = treatment.clone();
        let fit = run_blocking("propensity model", move || {
            let fit = fit_propensity(&arms, &x, &settings)?;
            let pref = preference_scores(&arms, &fit.propensity_score, None)?;
            Ok((fit, pref))
        })
        .await?;
        let (fit, pref) = fit;
        if model_table {
            let n = fit.coefficients.len() + 1;
            let ids: Int64Array = std::iter::once(None)
                .chain(fit.coefficients.iter().map(|c| Some(c.0)))
                .collect();
            let coef: Float64Array = std::iter::once(fit.intercept)
                .chain(fit.coefficients.iter().map(|c| c.1))
                .map(Some)
                .collect();
            let columns: Vec<ArrayRef> = vec![
                Arc::new(ids),
                Arc::new(coef),
                Arc::new(Float64Array::from(vec![fit.variance; n])),
                Arc::new(StringArray::from(vec![fit.status.name(); n])),
                Arc::new(Int64Array::from(vec![fit.iterations as i64; n])),
                Arc::new(Float64Array::from(vec![fit.log_likelihood; n])),
            ];
            return Ok(RecordBatch::try_new(schema.clone(), columns)?);
        }
        let fixed: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(row_id)),
            Arc::new(Int64Array::from_iter_values(
                treatment.iter().map(|&t| i64::from(t)),
            )),
            Arc::new(Float64Array::from(fit.propensity_score)),
            Arc::new(Float64Array::from(pref)),
        ];
        with_passthrough(schema, fixed, subjects, None, self.part)
    }

    async fn adjust(
        &self,
        schema: &SchemaRef,
        rows: &RecordBatch,
        adjust: Adjust,
    ) -> DfResult<RecordBatch> {
        let input = "ps_rows";
        let (row_id, treatment) = read_subjects(rows, input)?;
        row_index(&row_id, input)?;
        let ps = f64_values(rows, "propensity_score", input)?;
        if let Some(k) = ps.iter().position(|p| !(*p >= 0.0 && *p <= 1.0)) {
            return Err(exec_datafusion_err!(
                "{input}: row {} (row_id {}): propensity_score {} is not in [0, 1]",
                k + 1,
                row_id[k],
                ps[k]
            ));
        }
        let strata = match rows.column_by_name("stratum_id") {
            Some(_) => Some(i64_values(rows, "stratum_id", input)?),
            None => None,
        };
        let arms = treatment.clone();
        let scores = ps.clone();
        // (kept rows or None for all, the new column)
        let (kept, column): (Option<Vec<usize>>, ArrayRef) =
            run_blocking("adjustment", move || {
                let strata = strata.as_deref();
                Ok(match adjust {
                    Adjust::Match(s) => {
                        // `stratum_id` is the matched set of each kept subject.
                        let m = match_on_ps(&arms, &scores, strata, &s)?;
                        (
                            Some(m.kept),
                            Arc::new(Int64Array::from(m.stratum_id)) as ArrayRef,
                        )
                    }
                    Adjust::Stratify(s) => {
                        let st = stratify_by_ps(&arms, &scores, strata, &s)?;
                        (None, Arc::new(Int64Array::from(st.stratum_id)) as ArrayRef)
                    }
                    Adjust::Weights(s) => {
                        let w = iptw(&arms, &scores, &s)?;
                        (None, Arc::new(Float64Array::from(w)) as ArrayRef)
                    }
                })
            })
            .await?;
        let take = kept.map(|k| UInt32Array::from_iter_values(k.iter().map(|&i| i as u32)));
        let pick_i64 = |v: Vec<i64>| -> ArrayRef {
            match &take {
                Some(t) => Arc::new(Int64Array::from_iter_values(
                    t.values().iter().map(|&i| v[i as usize]),
                )),
                None => Arc::new(Int64Array::from(v)),
            }
        };
        let fixed: Vec<ArrayRef> = vec![
            pick_i64(row_id),
            pick_i64(treatment.iter().map(|&t| i64::from(t)).collect()),
            match &take {
                Some(t) => Arc::new(Float64Array::from_iter_values(
                    t.values().iter().map(|&i| ps[i as usize]),
                )),
                None => Arc::new(Float64Array::from(ps)),
            },
            column,
        ];
        with_passthrough(schema, fixed, rows, take.as_ref(), self.part)
    }

    async fn balance(&self, schema: &SchemaRef, batches: &[RecordBatch]) -> DfResult<RecordBatch> {
        let b = compute_balance(batches).await?;
        let ids = Int64Array::from_iter_values(b.covariates.iter().map(|c| c.covariate_id));
        let mut columns: Vec<ArrayRef> = vec![Arc::new(ids)];
        let stat = |before: bool, k: usize| -> ArrayRef {
            Arc::new(Float64Array::from_iter(b.covariates.iter().map(|c| {
                let g = if before { &c.before } else { &c.after };
                g.as_ref().map(|g| match k {
                    0 => g.mean_target,
                    1 => g.mean_comparator,
                    _ => g.std_diff,
                })
            })))
        };
        for before in [true, false] {
            for k in 0..3 {
                columns.push(stat(before, k));
            }
        }
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }

    async fn diagnostics(
        &self,
        schema: &SchemaRef,
        batches: &[RecordBatch],
        settings: DiagnosticsSettings,
    ) -> DfResult<RecordBatch> {
        let balance = compute_balance(batches).await?;
        let adjusted = &batches[0];
        // Equipoise on the population before adjustment (CohortMethod: the whole population).
        let population = batches.get(2).unwrap_or(adjusted);
        let equipoise = match population.column_by_name("propensity_score") {
            Some(_) => {
                let input = if batches.len() > 2 {
                    "before"
                } else {
                    "adjusted"
                };
                let (_, arms) = read_subjects(population, input)?;
                let ps = f64_values(population, "propensity_score", input)?;
                Some(
                    epifusion_core::cohort::preference::equipoise(&arms, &ps, &settings.equipoise)
                        .into_df()?,
                )
            }
            None => None,
        };
        let mdrr = match adjusted.column_by_name("outcome_count") {
            Some(_) => {
                let (_, arms) = read_subjects(adjusted, "adjusted")?;
                let counts = i64_values(adjusted, "outcome_count", "adjusted")?;
                if let Some(k) = counts.iter().position(|&c| c < 0) {
                    return Err(exec_datafusion_err!(
                        "adjusted: row {}: outcome_count is negative",
                        k + 1
                    ));
                }
                let counts: Vec<u32> = counts.iter().map(|&c| c.min(1) as u32).collect();
                let days = match adjusted.column_by_name("time_at_risk") {
                    Some(_) => f64_values(adjusted, "time_at_risk", "adjusted")?,
                    None => vec![0.0; counts.len()],
                };
                Some(
                    mdrr_summary(&arms, &counts, &days, &settings.mdrr)
                        .into_df()?
                        .mdrr,
                )
            }
            None => None,
        };
        let values = DiagnosticValues {
            max_sdm: balance.max_abs_std_diff_after,
            equipoise,
            mdrr,
            ..Default::default()
        };
        let t = &settings.thresholds;
        let d = evaluate(&values, t).into_df()?;
        let rows = [
            (
                "balance",
                values.max_sdm,
                Some(t.sdm_threshold),
                d.balance.label(),
            ),
            (
                "equipoise",
                values.equipoise,
                Some(t.equipoise_threshold),
                d.equipoise.label(),
            ),
            ("mdrr", values.mdrr, Some(t.mdrr_threshold), d.mdrr.label()),
            (
                "unblind",
                None,
                None,
                if d.unblind { "PASS" } else { "FAIL" },
            ),
        ];
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.1))),
            Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.2))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.3))),
        ];
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }
}

/// Covariate balance of `adjusted` (batch 0) against the population before adjustment (batch 2
/// when given, else the adjusted rows unweighted), with the covariates of batch 1.
async fn compute_balance(batches: &[RecordBatch]) -> DfResult<Balance> {
    let adjusted = &batches[0];
    let (adj_ids, adj_treatment) = read_subjects(adjusted, "adjusted")?;
    row_index(&adj_ids, "adjusted")?;
    let (row_id, treatment) = match batches.get(2) {
        Some(before) => read_subjects(before, "before")?,
        None => (adj_ids.clone(), adj_treatment.clone()),
    };
    let index = row_index(&row_id, "before")?;
    let x = read_covariates(&batches[1], &index, &row_id)?;
    let has_strata = adjusted.column_by_name("stratum_id").is_some();
    let has_weight = adjusted.column_by_name("weight").is_some();
    if has_strata && has_weight {
        return plan_err!("adjusted: has both `stratum_id` and `weight`; give one adjustment");
    }
    // Position of each adjusted row in the population before adjustment, sorted.
    let mut order: Vec<(usize, usize)> = Vec::with_capacity(adj_ids.len());
    for (k, id) in adj_ids.iter().enumerate() {
        let &i = index.get(id).ok_or_else(|| {
            exec_datafusion_err!(
                "adjusted: row {} (row_id {id}) is not a subject of `before`",
                k + 1
            )
        })?;
        if treatment[i] != adj_treatment[k] {
            return Err(exec_datafusion_err!(
                "adjusted: row {} (row_id {id}): treatment differs from `before`",
                k + 1
            ));
        }
        order.push((i, k));
    }
    order.sort_unstable();
    let kept: Vec<usize> = order.iter().map(|o| o.0).collect();
    let strata = if has_strata {
        let s = i64_values(adjusted, "stratum_id", "adjusted")?;
        Some(order.iter().map(|o| s[o.1]).collect::<Vec<_>>())
    } else {
        None
    };
    let weights = if has_weight {
        let w = f64_values(adjusted, "weight", "adjusted")?;
        Some(order.iter().map(|o| w[o.1]).collect::<Vec<_>>())
    } else {
        None
    };
    run_blocking("covariate balance", move || {
        let adjustment = match (&strata, &weights) {
            (Some(s), _) => Adjustment::Strata(s),
            (_, Some(w)) => Adjustment::Iptw(w),
            _ => Adjustment::None,
        };
        let after = AdjustedPopulation {
            kept: &kept,
            adjustment,
        };
        covariate_balance(&treatment, &x, &after)
    })
    .await
}

/// The statistic columns of `cohort_balance` (after `covariate_id`).
const BALANCE_COLUMNS: [&str; 6] = [
    "target_mean_before",
    "comparator_mean_before",
    "std_diff_before",
    "target_mean_after",
    "comparator_mean_after",
    "std_diff_after",
];

/// What `cohort_match` / `cohort_stratify` / `cohort_weights` compute.
enum Adjust {
    Match(MatchSettings),
    Stratify(StratifySettings),
    Weights(IptwSettings),
}

/// The fixed columns followed by the input's other columns (rows `take`, or all).
fn with_passthrough(
    schema: &SchemaRef,
    mut fixed: Vec<ArrayRef>,
    input: &RecordBatch,
    take: Option<&UInt32Array>,
    part: CohortPart,
) -> DfResult<RecordBatch> {
    let written = part.written();
    let keep: Vec<usize> = (0..input.num_columns())
        .filter(|&i| !written.contains(&input.schema().field(i).name().as_str()))
        .collect();
    if !keep.is_empty() {
        let rest = input.project(&keep)?;
        let rest = match take {
            Some(t) => take_record_batch(&rest, t)?,
            None => rest,
        };
        fixed.extend(rest.columns().iter().cloned());
    }
    Ok(RecordBatch::try_new(schema.clone(), fixed)?)
}

async fn collect_one(plan: Arc<dyn ExecutionPlan>, ctx: Arc<TaskContext>) -> DfResult<RecordBatch> {
    let schema = plan.schema();
    let batches = collect(plan, ctx).await?;
    Ok(concat_batches(&schema, &batches)?)
}

/// A column cast to `to`, with errors naming the input and the column.
fn column_as(b: &RecordBatch, name: &str, input: &str, to: &DataType) -> DfResult<ArrayRef> {
    let col = b
        .column_by_name(name)
        .ok_or_else(|| exec_datafusion_err!("{input}: no column `{name}`"))?;
    cast(col, to).map_err(|e| exec_datafusion_err!("{input}: column `{name}`: {e}"))
}

fn null_error(input: &str, name: &str, row: usize) -> DataFusionError {
    exec_datafusion_err!("{input}: row {}: column `{name}` is NULL", row + 1)
}

/// A column as i64 values; NULLs are errors naming the row.
fn i64_values(b: &RecordBatch, name: &str, input: &str) -> DfResult<Vec<i64>> {
    let c = column_as(b, name, input, &DataType::Int64)?;
    let a = c
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| exec_datafusion_err!("{input}: column `{name}` is not an integer"))?;
    if let Some(k) = (0..a.len()).find(|&k| a.is_null(k)) {
        return Err(null_error(input, name, k));
    }
    Ok(a.values().to_vec())
}

/// A column as f64 values; NULLs and non-finite values are errors naming the row.
fn f64_values(b: &RecordBatch, name: &str, input: &str) -> DfResult<Vec<f64>> {
    let c = column_as(b, name, input, &DataType::Float64)?;
    let a = c
        .as_any()
        .downcast_ref::<Float64Array>()
        .ok_or_else(|| exec_datafusion_err!("{input}: column `{name}` is not numeric"))?;
    if let Some(k) = (0..a.len()).find(|&k| a.is_null(k)) {
        return Err(null_error(input, name, k));
    }
    if let Some(k) = (0..a.len()).find(|&k| !a.value(k).is_finite()) {
        return Err(exec_datafusion_err!(
            "{input}: row {}: column `{name}` is {}",
            k + 1,
            a.value(k)
        ));
    }
    Ok(a.values().to_vec())
}

/// `row_id` and `treatment` (0/1; `true` = target).
fn read_subjects(b: &RecordBatch, input: &str) -> DfResult<(Vec<i64>, Vec<bool>)> {
    let row_id = i64_values(b, "row_id", input)?;
    let t = i64_values(b, "treatment", input)?;
    let treatment = t
        .iter()
        .enumerate()
        .map(|(k, &v)| match v {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(exec_datafusion_err!(
                "{input}: row {} (row_id {}): treatment must be 0 or 1, got {other}",
                k + 1,
                row_id[k]
            )),
        })
        .collect::<DfResult<Vec<bool>>>()?;
    Ok((row_id, treatment))
}

/// row_id → index; a duplicate row_id is an error.
fn row_index(row_id: &[i64], input: &str) -> DfResult<HashMap<i64, usize>> {
    let mut index = HashMap::with_capacity(row_id.len());
    for (k, &id) in row_id.iter().enumerate() {
        if index.insert(id, k).is_some() {
            return Err(exec_datafusion_err!(
                "{input}: row {}: row_id {id} appears more than once",
                k + 1
            ));
        }
    }
    Ok(index)
}

/// The long covariates of the subjects in `index` (other rows are ignored).
fn read_covariates(
    b: &RecordBatch,
    index: &HashMap<i64, usize>,
    row_id: &[i64],
) -> DfResult<SparseCovariates> {
    let input = "covariates";
    let ids = i64_values(b, "row_id", input)?;
    let cov = i64_values(b, "covariate_id", input)?;
    let values = match b.column_by_name("covariate_value") {
        Some(_) => Some(f64_values(b, "covariate_value", input)?),
        None => None,
    };
    let entries: Vec<(u32, i64, f64)> = (0..ids.len())
        .filter_map(|k| {
            index
                .get(&ids[k])
                .map(|&i| (i as u32, cov[k], values.as_ref().map_or(1.0, |v| v[k])))
        })
        .collect();
    SparseCovariates::from_triplets(row_id.len(), &entries).map_err(|e| match e {
        epifusion_core::Error::DuplicateCovariate {
            row_id: r,
            covariate_id,
        } => exec_datafusion_err!(
            "{input}: row_id {} has covariate {covariate_id} more than once",
            row_id[r as usize]
        ),
        other => exec_datafusion_err!("{input}: {other}"),
    })
}

/// The documentation of a cohort function.
pub(crate) fn documentation(name: &str, part: CohortPart) -> Documentation {
    let section = crate::docs::SECTION;
    let covariates = "Table name or read-only SQL query: row_id, covariate_id [, covariate_value] (long format; rows of other row_ids are ignored)";
    let ps_rows = "Table name or read-only SQL query: row_id, treatment (0/1), propensity_score [, stratum_id], other columns passed through";
    match part {
        CohortPart::PropensityScores => Documentation::builder(
            section,
            "Fits CohortMethod's propensity model (createPs: Laplace-regularized logistic \
             regression of treatment on the baseline covariates, prior variance by \
             cross-validation unless `variance` is given; a covariate correlated with treatment \
             above the threshold or one that perfectly predicts it is an error naming it) and \
             returns one row per subject: row_id, treatment, propensity_score, \
             preference_score, the subjects' other columns. With \"table\": \"model\": the \
             model's non-zero coefficients (covariate_id NULL for the intercept), coefficient, \
             variance, status, iterations, log_likelihood.",
            format!("{name}(subjects, covariates [, settings])"),
        )
        .with_argument(
            "subjects",
            "Table name or read-only SQL query: row_id, treatment (0/1), other columns passed through",
        )
        .with_argument("covariates", covariates)
        .with_argument(
            "settings",
            "JSON object: table (scores | model) [scores]; variance (fixed prior variance, no CV); cv_folds [10]; cv_repetitions [10]; starting_variance [0.01]; seed [1]; tolerance [2e-7]; max_iterations [1000]; error_on_high_correlation [true]; correlation_threshold [0.5]; include_covariate_ids [[]]; exclude_covariate_ids [[]]; threads",
        )
        .with_sql_example(format!(
            "SELECT row_id, treatment, propensity_score FROM {name}('subjects', 'covariates', '{{\"variance\": 0.01}}');"
        ))
        .build(),
        CohortPart::Match => Documentation::builder(
            section,
            "Matches target to comparator subjects on the propensity score (CohortMethod's \
             matchOnPs: greedy nearest-neighbour within a caliper, 1:1 or variable ratio, \
             within stratum_id when given) and returns the matched subjects: row_id, \
             treatment, propensity_score, stratum_id (the matched set), the other columns.",
            format!("{name}(ps_rows [, settings])"),
        )
        .with_argument("ps_rows", ps_rows)
        .with_argument(
            "settings",
            "JSON object: caliper [0.2] (0: none); caliper_scale (propensity_score | standardized | standardized_logit) [standardized_logit]; max_ratio [1] (0: no maximum); allow_reverse_match [false]",
        )
        .with_sql_example(format!(
            "SELECT * FROM {name}('SELECT row_id, treatment, propensity_score FROM cohort_propensity_scores(''subjects'', ''covariates'')', '{{\"max_ratio\": 4}}');"
        ))
        .build(),
        CohortPart::Stratify => Documentation::builder(
            section,
            "Stratifies subjects into quantile strata of the propensity score (CohortMethod's \
             stratifyByPs; crossed with stratum_id when given) and returns every subject: \
             row_id, treatment, propensity_score, stratum_id, the other columns.",
            format!("{name}(ps_rows [, settings])"),
        )
        .with_argument("ps_rows", ps_rows)
        .with_argument(
            "settings",
            "JSON object: number_of_strata [5]; base_selection (all | target | comparator) [all]",
        )
        .with_sql_example(format!(
            "SELECT stratum_id, count(*) FROM {name}('ps', '{{\"number_of_strata\": 10}}') GROUP BY stratum_id;"
        ))
        .build(),
        CohortPart::Weights => Documentation::builder(
            section,
            "Inverse probability of treatment weights (CohortMethod's computeIptw, \
             truncateIptw) of every subject: row_id, treatment, propensity_score, weight, the \
             other columns.",
            format!("{name}(ps_rows [, settings])"),
        )
        .with_argument("ps_rows", ps_rows)
        .with_argument(
            "settings",
            "JSON object: estimator (ate | att | ato) [att]; stabilized [true]; max_weight (truncate above); truncate_quantile (truncate above this quantile, in (0, 1])",
        )
        .with_sql_example(format!(
            "SELECT row_id, weight FROM {name}('ps', '{{\"estimator\": \"ate\", \"max_weight\": 10}}');"
        ))
        .build(),
        CohortPart::Balance => Documentation::builder(
            section,
            "Covariate balance before and after adjustment (CohortMethod's \
             computeCovariateBalance): one row per covariate with covariate_id, \
             target_mean_before, comparator_mean_before, std_diff_before, target_mean_after, \
             comparator_mean_after, std_diff_after (the cm_covariate_balance columns). The \
             population after adjustment is `adjusted` (weighted by its matched sets or \
             strata, `stratum_id`, or by `weight`); before adjustment it is the `before` \
             setting's subjects, or the adjusted rows unweighted.",
            format!("{name}(adjusted, covariates [, settings])"),
        )
        .with_argument(
            "adjusted",
            "Table name or read-only SQL query: row_id, treatment (0/1) [, stratum_id | weight]",
        )
        .with_argument("covariates", covariates)
        .with_argument(
            "settings",
            "JSON object: before (table name or read-only query: row_id, treatment; the population before adjustment, containing every adjusted subject) [the adjusted rows]",
        )
        .with_sql_example(format!(
            "SELECT max(abs(std_diff_after)) FROM {name}('SELECT row_id, treatment, stratum_id FROM cohort_match(''ps'')', 'covariates', '{{\"before\": \"subjects\"}}');"
        ))
        .build(),
        CohortPart::Diagnostics => Documentation::builder(
            section,
            "CohortMethod's study diagnostics (createCmDiagnosticThresholds) of an adjusted \
             population: one row per diagnostic with diagnostic, value, threshold, status \
             (PASS, FAIL, NOT EVALUATED): balance (max |SDM| after adjustment < 0.1), \
             equipoise (share of the population before adjustment with a preference score in \
             [0.3, 0.7] ≥ 0.2; needs propensity_score), mdrr (minimum detectable relative risk \
             of the adjusted population < 10; needs outcome_count), unblind (none failed).",
            format!("{name}(adjusted, covariates [, settings])"),
        )
        .with_argument(
            "adjusted",
            "Table name or read-only SQL query: row_id, treatment (0/1) [, stratum_id | weight] [, propensity_score] [, outcome_count, time_at_risk]",
        )
        .with_argument("covariates", covariates)
        .with_argument(
            "settings",
            "JSON object: before (as cohort_balance's; its propensity_score gives the equipoise); thresholds (mdrr_threshold [10], ease_threshold [0.25], sdm_threshold [0.1], equipoise_threshold [0.2], generalizability_sdm_threshold [1]); mdrr (alpha [0.05], power [0.8], two_sided [true], model_type (cox | logistic) [cox]); equipoise (bounds [[0.3, 0.7]])",
        )
        .with_sql_example(format!(
            "SELECT diagnostic, value, status FROM {name}('SELECT m.row_id, m.treatment, m.stratum_id, o.y AS outcome_count FROM matched m JOIN outcomes o USING (row_id)', 'covariates', '{{\"before\": \"ps\"}}');"
        ))
        .build(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked_before_work() {
        let e = CohortWork::parse("cohort_match", CohortPart::Match, r#"{"calliper": 1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("calliper") && e.contains("cohort_match"), "{e}");
        let e = CohortWork::parse("cohort_match", CohortPart::Match, r#"{"caliper": -1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("caliper"), "{e}");
        let e = CohortWork::parse("cohort_weights", CohortPart::Weights, "[1]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("JSON object"), "{e}");
        let w = CohortWork::parse(
            "cohort_propensity_scores",
            CohortPart::PropensityScores,
            r#"{"variance": 0.5, "table": "model"}"#,
        )
        .unwrap();
        assert_eq!(w.inputs(), 2);
        assert!(matches!(
            w.settings,
            Settings::PropensityScores {
                model_table: true,
                ..
            }
        ));
        let e = CohortWork::parse(
            "cohort_propensity_scores",
            CohortPart::PropensityScores,
            r#"{"table": "coefficients"}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("table"), "{e}");
        let b = CohortWork::parse(
            "cohort_balance",
            CohortPart::Balance,
            r#"{"before": "subjects"}"#,
        )
        .unwrap();
        assert_eq!(b.inputs(), 3);
        assert_eq!(
            CohortWork::parse("cohort_balance", CohortPart::Balance, "")
                .unwrap()
                .inputs(),
            2
        );
    }

    #[test]
    fn passthrough_replaces_written_columns() {
        let w = CohortWork::parse("cohort_match", CohortPart::Match, "").unwrap();
        let input = Schema::new(vec![
            Field::new("person", DataType::Utf8, false),
            Field::new("row_id", DataType::Int32, false),
            Field::new("treatment", DataType::Boolean, false),
            Field::new("propensity_score", DataType::Float32, false),
            Field::new("stratum_id", DataType::Int64, true),
        ]);
        let s = w.schema(&input).unwrap();
        let names: Vec<&str> = s.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names,
            [
                "row_id",
                "treatment",
                "propensity_score",
                "stratum_id",
                "person"
            ]
        );
        let bad = Schema::new(vec![Field::new("row_id", DataType::Int64, false)]);
        assert!(w.schema(&bad).is_err());
    }
}

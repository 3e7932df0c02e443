//! Empirical calibration in SQL (EmpiricalCalibration's `fitNull`, `calibrateP`,
//! `convertNullToErrorModel` + `calibrateConfidenceInterval`, EASE; the maths is
//! [`epifusion_core::calibration`]).
//!
//! * `empirical_null(negatives)`: `negatives` (a table name or a read-only query) returns
//!   `log_rr`, `se_log_rr` and optionally `group`; one empirical null N(μ, σ²) per group
//!   value (one for all rows without a `group` column) → `group`, `mean`, `sd`, `ease`, `n`,
//!   `log_likelihood`.
//! * `calibrate_estimates(estimates, negatives)`: every row of `estimates` (which needs
//!   `log_rr` and `se_log_rr`), all its columns, plus `calibrated_p` (two-sided),
//!   `calibrated_log_rr`, `calibrated_se_log_rr`, `calibrated_ci_95_lb`,
//!   `calibrated_ci_95_ub` (RR scale), each estimate calibrated with the null of its `group`
//!   when both inputs have a `group` column, else with the one null of all negatives. An
//!   estimate with a NULL or non-finite `log_rr` / `se_log_rr` gets NULL calibrated values.
//!
//! Negative controls with NULL, NaN, infinite or non-positive values are errors naming the row
//! and group (EmpiricalCalibration drops NA rows silently); fewer than 5 usable controls in a
//! group is an error naming the group.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::compute::{cast, concat_batches};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::TableFunctionArgs;
use datafusion::catalog::{Session, TableFunctionImpl, TableProvider};
use datafusion::common::{exec_datafusion_err, plan_err, Result as DfResult};
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::{collect, ExecutionPlan};

use epifusion_core::calibration::{
    calibrate_confidence_interval, calibrate_p, convert_null_to_error_model, ease, fit_null,
    EmpiricalNull,
};

use crate::exec::{EpiExec, NodeSpec};
use crate::fit_table::{check_table_arg, string_args, table_sql, IntoDfResult};
use crate::planning::{check_read_only, plan_sql};

/// `empirical_null(negatives)`.
#[derive(Debug, Default)]
pub struct EmpiricalNullFunction;

/// `calibrate_estimates(estimates, negatives)`.
#[derive(Debug, Default)]
pub struct CalibrateEstimatesFunction;

/// The schema of `empirical_null`.
pub(crate) fn null_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("group", DataType::Utf8, true),
        Field::new("mean", DataType::Float64, false),
        Field::new("sd", DataType::Float64, false),
        Field::new("ease", DataType::Float64, false),
        Field::new("n", DataType::Int64, false),
        Field::new("log_likelihood", DataType::Float64, true),
    ]))
}

/// The calibrated columns added to the estimates.
const CALIBRATED: [&str; 5] = [
    "calibrated_p",
    "calibrated_log_rr",
    "calibrated_se_log_rr",
    "calibrated_ci_95_lb",
    "calibrated_ci_95_ub",
];

impl TableFunctionImpl for EmpiricalNullFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let usage = "negatives: log_rr, se_log_rr [, group]";
        let strings = string_args("empirical_null", args.exprs(), usage)?;
        if strings.len() != 1 {
            return plan_err!(
                "empirical_null takes 1 argument ({usage}), got {}",
                strings.len()
            );
        }
        check_table_arg("empirical_null", 1, &strings[0])?;
        Ok(Arc::new(CalibrationTable {
            estimates: None,
            negatives: table_sql(&strings[0]),
            schema: null_schema(),
        }))
    }
}

impl TableFunctionImpl for CalibrateEstimatesFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let usage =
            "estimates: log_rr, se_log_rr [, group], negatives: log_rr, se_log_rr [, group]";
        let strings = string_args("calibrate_estimates", args.exprs(), usage)?;
        if strings.len() != 2 {
            return plan_err!(
                "calibrate_estimates takes 2 arguments ({usage}), got {}",
                strings.len()
            );
        }
        check_table_arg("calibrate_estimates", 1, &strings[0])?;
        check_table_arg("calibrate_estimates", 2, &strings[1])?;
        let estimates = table_sql(&strings[0]);
        // The output has the estimates' columns: plan the query now for its schema.
        let input = input_schema(args.session(), &estimates)?;
        for c in ["log_rr", "se_log_rr"] {
            if input.column_with_name(c).is_none() {
                return plan_err!("calibrate_estimates: the estimates have no column `{c}`");
            }
        }
        Ok(Arc::new(CalibrationTable {
            estimates: Some(estimates),
            negatives: table_sql(&strings[1]),
            schema: calibrated_schema(&input)?,
        }))
    }
}

/// The schema of `calibrate_estimates` over estimates of schema `input`: its columns (but any
/// calibrated ones) and the calibrated columns.
pub(crate) fn calibrated_schema(input: &Schema) -> DfResult<SchemaRef> {
    for c in ["log_rr", "se_log_rr"] {
        if input.column_with_name(c).is_none() {
            return plan_err!("calibrate_estimates: the estimates have no column `{c}`");
        }
    }
    let mut fields: Vec<Field> = input
        .fields()
        .iter()
        .filter(|f| !CALIBRATED.contains(&f.name().as_str()))
        .map(|f| f.as_ref().clone())
        .collect();
    fields.extend(
        CALIBRATED
            .iter()
            .map(|n| Field::new(*n, DataType::Float64, true)),
    );
    Ok(Arc::new(Schema::new(fields)))
}

/// The schema of a read-only input query, planned in the calling session (table functions
/// must give their schema before their scan).
fn input_schema(session: &dyn Session, sql: &str) -> DfResult<SchemaRef> {
    let state = crate::planning::planning_state(session);
    let sql = sql.to_string();
    let plan = block_on(async move { state.create_logical_plan(&sql).await })?;
    check_read_only(&plan, "calibrate_estimates: the estimates query")?;
    Ok(Arc::new(plan.schema().as_arrow().clone()))
}

/// Run `fut` to completion from synchronous planning code inside the runtime.
pub(crate) fn block_on<T: Send + 'static>(
    fut: impl std::future::Future<Output = DfResult<T>> + Send + 'static,
) -> DfResult<T> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| h.block_on(fut))
        }
        // A current-thread runtime (or none): planning a query resolves in-memory catalog
        // entries only, which needs no reactor.
        _ => futures::executor::block_on(fut),
    }
}

/// The table of either function.
#[derive(Debug)]
pub(crate) struct CalibrationTable {
    estimates: Option<String>,
    negatives: String,
    schema: SchemaRef,
}

impl CalibrationTable {
    /// The node spec and input queries of the call, for a plan sent to a cluster.
    pub(crate) fn remote_call(&self) -> (NodeSpec, Vec<String>) {
        let mut inputs = vec![self.negatives.clone()];
        inputs.extend(self.estimates.clone());
        let spec = match &self.estimates {
            Some(_) => NodeSpec::CalibrateEstimates,
            None => NodeSpec::EmpiricalNull,
        };
        (spec, inputs)
    }
}

#[async_trait]
impl TableProvider for CalibrationTable {
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
        let mut inputs = vec![plan_sql(state, &self.negatives).await?];
        let spec = match &self.estimates {
            Some(sql) => {
                inputs.push(plan_sql(state, sql).await?);
                NodeSpec::CalibrateEstimates
            }
            None => NodeSpec::EmpiricalNull,
        };
        Ok(Arc::new(EpiExec::try_new(
            spec,
            inputs,
            projection.cloned(),
            None,
        )?))
    }
}

/// `empirical_null`'s work: collect the negatives and fit one null per group.
pub(crate) async fn run_empirical_null(
    schema: &SchemaRef,
    negatives: Arc<dyn ExecutionPlan>,
    ctx: Arc<datafusion::execution::TaskContext>,
) -> DfResult<RecordBatch> {
    let neg = collect_one(negatives, ctx).await?;
    null_batch(schema, &fit_nulls(&neg)?)
}

/// `calibrate_estimates`' work: fit the nulls, calibrate every estimate.
pub(crate) async fn run_calibration(
    schema: &SchemaRef,
    negatives: Arc<dyn ExecutionPlan>,
    estimates: Arc<dyn ExecutionPlan>,
    ctx: Arc<datafusion::execution::TaskContext>,
) -> DfResult<RecordBatch> {
    let neg = collect_one(negatives, ctx.clone()).await?;
    let nulls = fit_nulls(&neg)?;
    let est = collect_one(estimates, ctx).await?;
    calibrated_batch(schema, &est, &nulls, neg.column_by_name("group").is_some())
}

async fn collect_one(
    plan: Arc<dyn ExecutionPlan>,
    ctx: Arc<datafusion::execution::TaskContext>,
) -> DfResult<RecordBatch> {
    let schema = plan.schema();
    let batches = collect(plan, ctx).await?;
    Ok(concat_batches(&schema, &batches)?)
}

/// A numeric column as f64 (NULLs kept).
fn f64_column(b: &RecordBatch, name: &str, input: &str) -> DfResult<Float64Array> {
    let col = b
        .column_by_name(name)
        .ok_or_else(|| exec_datafusion_err!("{input}: no column `{name}`"))?;
    let c = cast(col, &DataType::Float64)
        .map_err(|e| exec_datafusion_err!("{input}: column `{name}` is not numeric: {e}"))?;
    Ok(c.as_any()
        .downcast_ref::<Float64Array>()
        .cloned()
        .unwrap_or_else(|| Float64Array::from(vec![None::<f64>; c.len()])))
}

/// The optional `group` column as strings (None when absent).
fn group_column(b: &RecordBatch, input: &str) -> DfResult<Option<StringArray>> {
    match b.column_by_name("group") {
        None => Ok(None),
        Some(col) => {
            let c = cast(col, &DataType::Utf8)
                .map_err(|e| exec_datafusion_err!("{input}: column `group`: {e}"))?;
            Ok(c.as_any().downcast_ref::<StringArray>().cloned())
        }
    }
}

/// One null per group (key None without a `group` column).
fn fit_nulls(neg: &RecordBatch) -> DfResult<BTreeMap<Option<String>, EmpiricalNull>> {
    let input = "negatives";
    let lr = f64_column(neg, "log_rr", input)?;
    let se = f64_column(neg, "se_log_rr", input)?;
    let groups = group_column(neg, input)?;
    let mut by_group: BTreeMap<Option<String>, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for i in 0..neg.num_rows() {
        let g = groups
            .as_ref()
            .map(|g| (!g.is_null(i)).then(|| g.value(i).to_string()))
            .unwrap_or(None);
        if lr.is_null(i) || se.is_null(i) {
            return Err(exec_datafusion_err!(
                "negatives: row {}{}: log_rr and se_log_rr must not be NULL",
                i + 1,
                g.as_deref()
                    .map(|g| format!(" (group {g})"))
                    .unwrap_or_default()
            ));
        }
        let e = by_group.entry(g).or_default();
        e.0.push(lr.value(i));
        e.1.push(se.value(i));
    }
    if by_group.is_empty() {
        return Err(exec_datafusion_err!("negatives: no rows"));
    }
    by_group
        .into_iter()
        .map(|(g, (lr, se))| {
            let null = fit_null(&lr, &se).map_err(|e| {
                exec_datafusion_err!(
                    "negatives{}: {e}",
                    g.as_deref()
                        .map(|g| format!(" (group {g})"))
                        .unwrap_or_default()
                )
            })?;
            Ok((g, null))
        })
        .collect()
}

fn null_batch(
    schema: &SchemaRef,
    nulls: &BTreeMap<Option<String>, EmpiricalNull>,
) -> DfResult<RecordBatch> {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter(nulls.keys().cloned())),
        Arc::new(Float64Array::from_iter_values(
            nulls.values().map(|n| n.mean()),
        )),
        Arc::new(Float64Array::from_iter_values(
            nulls.values().map(|n| n.sd()),
        )),
        Arc::new(Float64Array::from_iter_values(nulls.values().map(ease))),
        Arc::new(Int64Array::from_iter_values(
            nulls.values().map(|n| n.n() as i64),
        )),
        Arc::new(Float64Array::from_iter(
            nulls.values().map(|n| n.log_likelihood()),
        )),
    ];
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

fn calibrated_batch(
    schema: &SchemaRef,
    est: &RecordBatch,
    nulls: &BTreeMap<Option<String>, EmpiricalNull>,
    negatives_grouped: bool,
) -> DfResult<RecordBatch> {
    let input = "estimates";
    let lr = f64_column(est, "log_rr", input)?;
    let se = f64_column(est, "se_log_rr", input)?;
    let groups = if negatives_grouped {
        group_column(est, input)?
    } else {
        None
    };
    let n = est.num_rows();
    let mut out: [Vec<Option<f64>>; 5] = Default::default();
    for i in 0..n {
        let null = match &groups {
            Some(g) => {
                let key = (!g.is_null(i)).then(|| g.value(i).to_string());
                nulls.get(&key)
            }
            None => nulls.values().next().filter(|_| nulls.len() == 1),
        };
        let values = match null {
            Some(null) if lr.is_valid(i) && se.is_valid(i) => {
                let (b, s) = (lr.value(i), se.value(i));
                if b.is_finite() && s.is_finite() && s > 0.0 {
                    let p = calibrate_p(null, b, s).into_df()?;
                    let ci = calibrate_confidence_interval(
                        &convert_null_to_error_model(null),
                        b,
                        s,
                        0.95,
                    )
                    .into_df()?;
                    [
                        Some(p),
                        Some(ci.log_rr),
                        Some(ci.se_log_rr),
                        Some(ci.log_lb.exp()),
                        Some(ci.log_ub.exp()),
                    ]
                } else {
                    [None; 5]
                }
            }
            _ => [None; 5],
        };
        for (k, v) in values.into_iter().enumerate() {
            out[k].push(v);
        }
    }
    if groups.is_none() && nulls.len() > 1 {
        return Err(exec_datafusion_err!(
            "calibrate_estimates: the negatives have {} groups but the estimates no `group` column",
            nulls.len()
        ));
    }
    let mut columns: Vec<ArrayRef> = est
        .schema()
        .fields()
        .iter()
        .zip(est.columns())
        .filter(|(f, _)| !CALIBRATED.contains(&f.name().as_str()))
        .map(|(_, c)| c.clone())
        .collect();
    columns.extend(
        out.into_iter()
            .map(|v| Arc::new(Float64Array::from(v)) as ArrayRef),
    );
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

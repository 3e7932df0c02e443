//! `design_matrix(outcomes [, covariates] [, options])`: build the sparse design matrix once,
//! keep it in the session under a name, and fit it later without rebuilding:
//!
//! ```sql
//! SELECT * FROM design_matrix('cohort_outcomes', 'cohort_covariates', '{"name": "cohort"}');
//! SELECT * FROM cox_fit('@cohort', '{"prior": "laplace", "lambda": 10}');
//! SELECT * FROM cox_fit('@cohort', '{"prior": "normal", "variance": 1}');
//! ```
//!
//! Options: `name` (required; letters, digits, `_`), `drop_unknown_rows` (bool, default false:
//! covariate rows with an unknown `row_id` are an error). Building the same name again replaces
//! the stored matrix. The result row: `name`, `rows`, `columns`, `strata`, `nnz`,
//! `indicator_columns`, `sparse_columns`, `dense_columns`, `bytes` (CSC indices + values),
//! `dropped_unknown_rows`, `device` (`cpu`: the host CSC; device buffers come with the GPU
//! backend).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{exec_datafusion_err, plan_err, Result as DfResult};
use datafusion::datasource::TableType;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

use crate::convert::ReadOptions;
use crate::fit_table::{
    plan_sql, string_args, table_sql, with_streamed_inputs, BatchProducer, OneBatchExec,
};
use epifusion_core::model::design::{ColumnFormat, DesignMatrix};

/// Design matrices kept by name in one session.
#[derive(Debug, Default)]
pub struct DesignRegistry {
    designs: Mutex<HashMap<String, Arc<DesignMatrix>>>,
}

impl DesignRegistry {
    /// The matrix stored as `name`.
    pub fn get(&self, name: &str) -> Option<Arc<DesignMatrix>> {
        self.designs.lock().ok()?.get(name).cloned()
    }
    /// Store (or replace) `name`.
    pub fn insert(&self, name: &str, design: DesignMatrix) {
        if let Ok(mut m) = self.designs.lock() {
            m.insert(name.to_string(), Arc::new(design));
        }
    }
}

/// The `design_matrix` table function.
#[derive(Debug)]
pub struct DesignMatrixFunction {
    designs: Arc<DesignRegistry>,
}

impl DesignMatrixFunction {
    /// The function storing into `designs`.
    pub fn new(designs: Arc<DesignRegistry>) -> Self {
        DesignMatrixFunction { designs }
    }
}

/// Schema of the summary row.
pub fn summary_schema() -> SchemaRef {
    let i = |n: &str| Field::new(n, DataType::Int64, false);
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        i("rows"),
        i("columns"),
        i("strata"),
        i("nnz"),
        i("indicator_columns"),
        i("sparse_columns"),
        i("dense_columns"),
        i("bytes"),
        i("dropped_unknown_rows"),
        Field::new("device", DataType::Utf8, false),
    ]))
}

fn summary(name: &str, x: &DesignMatrix) -> DfResult<RecordBatch> {
    let count = |f: ColumnFormat| x.columns.iter().filter(|c| c.format == f).count() as i64;
    let v = |n: usize| Arc::new(Int64Array::from(vec![n as i64])) as _;
    Ok(RecordBatch::try_new(
        summary_schema(),
        vec![
            Arc::new(StringArray::from(vec![name])),
            v(x.n_rows()),
            v(x.n_cols()),
            v(x.n_strata()),
            v(x.nnz()),
            Arc::new(Int64Array::from(vec![count(ColumnFormat::Indicator)])),
            Arc::new(Int64Array::from(vec![count(ColumnFormat::Sparse)])),
            Arc::new(Int64Array::from(vec![count(ColumnFormat::Dense)])),
            v(x.csc_bytes()),
            v(x.dropped_unknown),
            Arc::new(StringArray::from(vec!["cpu"])),
        ],
    )?)
}

#[derive(Debug)]
struct DesignCall {
    name: String,
    outcomes: String,
    covariates: Option<String>,
    drop_unknown_rows: bool,
}

fn parse_call(args: &[String]) -> DfResult<DesignCall> {
    let usage = "outcomes [, covariates], options with \"name\"";
    for (i, a) in args.iter().enumerate() {
        if !a.trim_start().starts_with('{') {
            crate::fit_table::check_table_arg("design_matrix", i + 1, a)?;
        }
    }
    let Some(opts) = args.last().filter(|a| a.trim_start().starts_with('{')) else {
        return plan_err!(
            "design_matrix: the last argument must be the options JSON with a \"name\" ({usage})"
        );
    };
    let tables = &args[..args.len() - 1];
    if tables.is_empty()
        || tables.len() > 2
        || tables.iter().any(|t| t.trim_start().starts_with('{'))
    {
        return plan_err!("design_matrix: expected {usage}");
    }
    let v: serde_json::Value = serde_json::from_str(opts)
        .map_err(|e| exec_datafusion_err!("design_matrix options: not valid JSON: {e}"))?;
    let Some(map) = v.as_object() else {
        return plan_err!("design_matrix options must be a JSON object");
    };
    for k in map.keys() {
        if k != "name" && k != "drop_unknown_rows" {
            return plan_err!(
                "design_matrix: option `{k}`: unknown option; expected name, drop_unknown_rows"
            );
        }
    }
    let name = match map.get("name") {
        Some(serde_json::Value::String(s)) if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => s.clone(),
        Some(other) => return plan_err!("design_matrix: option `name` must be a non-empty string of letters, digits and _ (got {other})"),
        None => return plan_err!("design_matrix: option `name` is required"),
    };
    let drop_unknown_rows = match map.get("drop_unknown_rows") {
        None => false,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(other) => {
            return plan_err!(
                "design_matrix: option `drop_unknown_rows` must be true or false (got {other})"
            )
        }
    };
    Ok(DesignCall {
        name,
        outcomes: table_sql(&tables[0]),
        covariates: tables.get(1).map(|t| table_sql(t)),
        drop_unknown_rows,
    })
}

impl TableFunctionImpl for DesignMatrixFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let strings = string_args(
            "design_matrix",
            args.exprs(),
            "outcomes [, covariates], options",
        )?;
        Ok(Arc::new(DesignTable {
            call: Arc::new(parse_call(&strings)?),
            designs: self.designs.clone(),
        }))
    }
}

#[derive(Debug)]
pub(crate) struct DesignTable {
    call: Arc<DesignCall>,
    designs: Arc<DesignRegistry>,
}

async fn build(
    call: Arc<DesignCall>,
    designs: Arc<DesignRegistry>,
    outcomes: Arc<dyn ExecutionPlan>,
    covariates: Option<Arc<dyn ExecutionPlan>>,
    ctx: Arc<datafusion::execution::TaskContext>,
) -> DfResult<RecordBatch> {
    with_streamed_inputs("design_matrix", outcomes, covariates, ctx, move |inputs| {
        let read = ReadOptions {
            require_time: false,
            drop_unknown_rows: call.drop_unknown_rows,
            ..Default::default()
        };
        let x = inputs.design(&read)?;
        let batch =
            summary(&call.name, &x).map_err(|e| epifusion_core::Error::Format(e.to_string()))?;
        designs.insert(&call.name, x);
        Ok(batch)
    })
    .await
}

#[async_trait]
impl TableProvider for DesignTable {
    fn schema(&self) -> SchemaRef {
        summary_schema()
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
        let outcomes = plan_sql(state, &self.call.outcomes).await?;
        let covariates = match &self.call.covariates {
            Some(sql) => Some(plan_sql(state, sql).await?),
            None => None,
        };
        let (call, designs) = (self.call.clone(), self.designs.clone());
        let producer: BatchProducer = Arc::new(move |ctx| {
            Box::pin(build(
                call.clone(),
                designs.clone(),
                outcomes.clone(),
                covariates.clone(),
                ctx,
            ))
        });
        Ok(Arc::new(OneBatchExec::new(
            format!("design_matrix {}", self.call.name),
            producer,
            summary_schema(),
            projection,
        )?))
    }
}

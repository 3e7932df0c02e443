//! Work of a crate above this one (the pipeline's analysis units) run on a cluster executor.
//!
//! A *task* is a named runner registered in the process ([`register`]) and a JSON payload.
//! [`run_on_cluster`] sends it, with the client session's tables ([`StudyInputs`]: the OMOP
//! store's listing tables and views, as plans), as a [`NodeSpec::Task`] plan node. The
//! executor that runs the node registers those tables in a fresh session, finds the runner of
//! the same name **in its own process** (so every node must register it at start: the
//! `epifusion` binary does, for every command) and runs it there. A task may also name input
//! queries: they are planned in the client session like a study build's
//! ([`crate::remote`]: each a distributed plan whose joins and aggregates Ballista spreads over
//! the executors) and become the node's children; the runner receives their whole results by
//! name, so only the work that needs every row at once runs in the task. The runner returns
//! named tables; they travel back as one batch of (`part`, `data`) rows, `data` an Arrow IPC
//! stream ([`encode`], [`decode`]), so tables of any schema come back exactly as computed.

use std::collections::HashMap;
use std::future::Future;
use std::io::Cursor;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, RwLock};

use datafusion::arrow::array::{Array, LargeBinaryArray, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{exec_datafusion_err, Result as DfResult};
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;

use crate::exec::NodeSpec;
use crate::remote::{PlannedEpiTable, StudyInputs};

/// Named tables, in order (a table may have no batches).
pub type Parts = Vec<(String, Vec<RecordBatch>)>;

/// What a runner returns.
pub type TaskFuture = Pin<Box<dyn Future<Output = DfResult<Parts>> + Send>>;

/// A runner: the executor's session (with the client's tables), the payload and the results
/// of the task's input queries (by name, in the order the client listed them).
pub type TaskRunner = fn(SessionContext, String, Parts) -> TaskFuture;

fn runners() -> &'static RwLock<HashMap<String, TaskRunner>> {
    static RUNNERS: OnceLock<RwLock<HashMap<String, TaskRunner>>> = OnceLock::new();
    RUNNERS.get_or_init(Default::default)
}

/// Register `runner` as the task `kind` in this process (replacing an earlier one).
pub fn register(kind: &str, runner: TaskRunner) {
    runners()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(kind.to_string(), runner);
}

/// The runner of `kind` in this process.
pub fn runner(kind: &str) -> DfResult<TaskRunner> {
    runners()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(kind)
        .copied()
        .ok_or_else(|| {
            exec_datafusion_err!(
                "this node cannot run the task `{kind}`: start it with the `epifusion` binary \
                 (`epifusion executor`), which registers it"
            )
        })
}

/// The output of a task node: one row per returned table.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("part", DataType::Utf8, false),
        Field::new("data", DataType::LargeBinary, false),
    ]))
}

/// `parts` as one batch of [`schema`]; a table without batches travels as an empty stream
/// (no schema).
pub fn encode(parts: &Parts) -> DfResult<RecordBatch> {
    let mut names = Vec::with_capacity(parts.len());
    let mut blobs: Vec<Vec<u8>> = Vec::with_capacity(parts.len());
    for (name, batches) in parts {
        let mut bytes = Vec::new();
        if let Some(first) = batches.first() {
            let mut w = StreamWriter::try_new(&mut bytes, first.schema_ref())?;
            for b in batches {
                w.write(b)?;
            }
            w.finish()?;
        }
        names.push(name.clone());
        blobs.push(bytes);
    }
    Ok(RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from(names)),
            Arc::new(LargeBinaryArray::from_iter_values(blobs)),
        ],
    )?)
}

/// The tables of [`encode`]d batches, in order.
pub fn decode(batches: &[RecordBatch]) -> DfResult<Parts> {
    let mut out = Vec::new();
    for b in batches {
        let names = b
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| exec_datafusion_err!("a task result without its `part` column"))?;
        let blobs = b
            .column(1)
            .as_any()
            .downcast_ref::<LargeBinaryArray>()
            .ok_or_else(|| exec_datafusion_err!("a task result without its `data` column"))?;
        for i in 0..b.num_rows() {
            let bytes = blobs.value(i);
            let mut tables = Vec::new();
            if !bytes.is_empty() {
                for batch in StreamReader::try_new(Cursor::new(bytes), None)? {
                    tables.push(batch?);
                }
            }
            if names.is_null(i) {
                return Err(exec_datafusion_err!("a task result part without a name"));
            }
            out.push((names.value(i).to_string(), tables));
        }
    }
    Ok(out)
}

/// The input queries of a task `kind` ((name, SQL) pairs) planned in the cluster session
/// `ctx` for [`run_on_cluster`]: each a distributed plan, over the tables `ctx` has now.
pub async fn plan_inputs(
    ctx: &SessionContext,
    kind: &str,
    inputs: &[(String, String)],
) -> DfResult<Vec<(String, LogicalPlan)>> {
    let queries: Vec<(&str, &str)> = inputs
        .iter()
        .map(|(name, sql)| (sql.as_str(), name.as_str()))
        .collect();
    let plans = crate::remote::plan_build_queries(&ctx.state(), kind, &queries).await?;
    Ok(inputs
        .iter()
        .map(|(name, _)| name.clone())
        .zip(plans)
        .collect())
}

/// Run the task `kind` with `payload` on one executor of the cluster session `ctx`, which
/// carries `ctx`'s tables to it, over the results of `inputs` (named plans of
/// [`plan_inputs`], run as distributed plans; a result with no rows arrives as one empty batch
/// of the query's schema); the tables the runner returned.
pub async fn run_on_cluster(
    ctx: &SessionContext,
    kind: &str,
    payload: String,
    inputs: Vec<(String, LogicalPlan)>,
) -> DfResult<Parts> {
    let tables = StudyInputs::from_session(&ctx.state(), kind).await?;
    let (names, plans): (Vec<String>, Vec<LogicalPlan>) = inputs.into_iter().unzip();
    let spec = NodeSpec::Task {
        kind: kind.to_string(),
        payload,
        tables,
        inputs: names,
    };
    let table = PlannedEpiTable::new(spec, plans, schema());
    let batches = ctx.read_table(Arc::new(table))?.collect().await?;
    decode(&batches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;

    #[test]
    fn parts_round_trip_with_empty_tables() {
        let s = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)]));
        let b1 =
            RecordBatch::try_new(s.clone(), vec![Arc::new(Int64Array::from(vec![1, 2]))]).unwrap();
        let b2 =
            RecordBatch::try_new(s, vec![Arc::new(Int64Array::from(vec![None, Some(3)]))]).unwrap();
        let parts: Parts = vec![
            ("a".into(), vec![b1.clone(), b2.clone()]),
            ("none".into(), vec![]),
            ("b".into(), vec![b2.clone()]),
        ];
        let back = decode(&[encode(&parts).unwrap()]).unwrap();
        assert_eq!(back, parts);
    }

    #[test]
    fn an_unknown_task_is_a_clear_error() {
        let e = runner("no_such_task").err().unwrap().to_string();
        assert!(e.contains("cannot run the task `no_such_task`"), "{e}");
    }
}

//! Aggregate functions that fit one model per `GROUP BY` group: `sccs_fit_agg`, `cox_fit_agg`,
//! `fine_gray_fit_agg`, `logistic_fit_agg`, `poisson_fit_agg`, `conditional_logistic_fit_agg`.
//!
//! ```sql
//! SELECT outcome_id, unnest(fit) AS c
//! FROM (SELECT outcome_id,
//!              sccs_fit_agg(case_id, days, events, covariate_ids, '{"prior": "laplace", "lambda": 3}') AS fit
//!       FROM sccs_intervals GROUP BY outcome_id);
//! ```
//!
//! Arguments, one input row per outcome row of the long format:
//! `stratum_id` (BIGINT, NULL when unstratified), `time` (DOUBLE), `y` (DOUBLE),
//! `covariate_ids` (LIST of BIGINT), optionally `covariate_values` (LIST of DOUBLE, same length;
//! default all 1), optionally `cluster_id` (BIGINT: rows of one cluster for `"se": "robust"`;
//! NULL: a cluster of its own), optionally `options` (a constant JSON string, see
//! [`crate::options`]). Optional arguments are told apart by type (list, integer, text).
//!
//! NULLs follow the table functions' rule: a NULL `y`, or a NULL `time` for a model that needs
//! time (SCCS, Cox, Fine–Gray, Poisson), is an error naming the row (by its values: aggregate
//! input rows have no stable number); for the other models `time` is not used. A NULL
//! `covariate_ids` is a row without covariates. Errors about a row's values name the row by
//! its `stratum_id`, `time` and `y`.
//!
//! The result is a list of structs, one per coefficient: `covariate_id`, `estimate`,
//! `std_error`, `ci_lower`, `ci_upper`, `log_likelihood`, `iterations`, `status`. A group whose
//! data cannot be fitted (no events, a value outside the model's domain…) gives one element with
//! NULL estimates and `status` = `failed: <reason>`, so one bad group does not stop the others.
//!
//! Accumulators only collect rows; the fit runs in `evaluate`, on rayon, with the tokio worker
//! released (`block_in_place`). Groups are fitted in parallel across DataFusion's partitions.
//! Rows are put in a canonical order before fitting, so results do not depend on the order in
//! which batches arrive.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Float64Builder, Int64Array, Int64Builder, ListArray,
    ListBuilder, StringArray, StructArray,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields};
use datafusion::common::{exec_err, plan_err, Result as DfResult, ScalarValue};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, Signature, Volatility};
use datafusion::physical_expr::expressions::Literal;

use crate::fit_table::IntoDfResult;
use crate::options::parse_fit_options;
use epifusion_core::fit::{fit_owned, FitOptions};
use epifusion_core::model::design::{DesignBuilder, OutcomeRecord};
use epifusion_core::model::ModelKind;
use epifusion_core::Error;

/// Fields of one coefficient in the result list: the result table's columns
/// ([`crate::convert::result_schema`]), all nullable (a failed group has only a `status`).
pub fn coefficient_fields() -> Fields {
    crate::convert::result_schema()
        .fields()
        .iter()
        .map(|f| Arc::new(f.as_ref().clone().with_nullable(true)))
        .collect()
}

fn result_type() -> DataType {
    DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(coefficient_fields()),
        true,
    )))
}

/// A fitting aggregate for one model.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FitAggregate {
    name: &'static str,
    model: ModelKind,
    signature: Signature,
}

impl FitAggregate {
    /// The aggregate for `model`, registered as `name`.
    pub fn new(name: &'static str, model: ModelKind) -> Self {
        FitAggregate {
            name,
            model,
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }
}

const USAGE: &str =
    "stratum_id, time, y, covariate_ids [, covariate_values] [, cluster_id] [, options]";

/// Which optional arguments are present, from the argument types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    /// Argument 5 is `covariate_values`.
    has_values: bool,
    /// Position of `cluster_id`, if given.
    cluster: Option<usize>,
    /// The last argument is the options document.
    has_options: bool,
}

/// Which optional arguments are present, from the argument types.
fn layout(name: &str, types: &[DataType]) -> DfResult<Layout> {
    if types.len() < 4 || types.len() > 7 {
        return plan_err!(
            "{name} takes 4 to 7 arguments ({USAGE}), got {}",
            types.len()
        );
    }
    let is_text =
        |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
    let is_list = |t: &DataType| {
        matches!(
            t,
            DataType::List(_) | DataType::LargeList(_) | DataType::Null
        )
    };
    let has_options = is_text(&types[types.len() - 1]);
    let data_args = types.len() - usize::from(has_options);
    let has_values = data_args >= 5 && is_list(&types[4]);
    let cluster = (data_args > 4 + usize::from(has_values)).then_some(4 + usize::from(has_values));
    if data_args > 4 + usize::from(has_values) + usize::from(cluster.is_some()) {
        return plan_err!("{name}: too many arguments ({USAGE})");
    }
    if let Some(c) = cluster {
        if !(types[c].is_integer() || types[c] == DataType::Null) {
            return plan_err!(
                "{name}: argument {} (cluster_id) must be an integer id, got {} ({USAGE})",
                c + 1,
                types[c]
            );
        }
    }
    for (i, t) in types.iter().enumerate().take(3) {
        if !(t.is_numeric() || *t == DataType::Null) {
            return plan_err!(
                "{name}: argument {} must be numeric ({USAGE}), got {t}",
                i + 1
            );
        }
    }
    if !is_list(&types[3]) {
        return plan_err!("{name}: argument 4 (covariate_ids) must be a list of ids, e.g. array_agg(covariate_id), got {}", types[3]);
    }
    if has_values && !is_list(&types[4]) {
        return plan_err!(
            "{name}: argument 5 (covariate_values) must be a list of numbers, got {}",
            types[4]
        );
    }
    Ok(Layout {
        has_values,
        cluster,
        has_options,
    })
}

/// The value of a constant string argument: a [`Literal`], or any expression that evaluates to a
/// non-NULL string without reading a column (a literal that crossed the FFI boundary arrives as
/// a foreign expression, not a [`Literal`]). `None` when the argument is not such a constant.
fn constant_string(expr: &Arc<dyn datafusion::physical_expr::PhysicalExpr>) -> Option<String> {
    use datafusion::arrow::array::{Array, AsArray, RecordBatchOptions};
    use datafusion::logical_expr::ColumnarValue;
    let text = |v: &ScalarValue| match v {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Some(s.clone()),
        _ => None,
    };
    if let Some(l) = expr.downcast_ref::<Literal>() {
        return text(l.value());
    }
    // One row and no columns: a column reference fails, a constant evaluates.
    let batch = datafusion::arrow::array::RecordBatch::try_new_with_options(
        Arc::new(datafusion::arrow::datatypes::Schema::empty()),
        vec![],
        &RecordBatchOptions::new().with_row_count(Some(1)),
    )
    .ok()?;
    match expr.evaluate(&batch).ok()? {
        ColumnarValue::Scalar(v) => text(&v),
        ColumnarValue::Array(a)
            if a.len() == 1
                && a.null_count() == 0
                && matches!(
                    a.data_type(),
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                ) =>
        {
            let a = cast(&a, &DataType::Utf8).ok()?;
            Some(a.as_string_opt::<i32>()?.value(0).to_string())
        }
        ColumnarValue::Array(_) => None,
    }
}

impl AggregateUDFImpl for FitAggregate {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
        crate::docs::doc(self.name)
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        layout(self.name, arg_types)?;
        Ok(result_type())
    }

    fn accumulator(&self, args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        let types: Vec<DataType> = args
            .exprs
            .iter()
            .map(|e| e.data_type(args.schema))
            .collect::<DfResult<_>>()?;
        let layout = layout(self.name, &types)?;
        let options_json = if layout.has_options {
            let expr = &args.exprs[args.exprs.len() - 1];
            match constant_string(expr) {
                Some(s) => s,
                None => {
                    return plan_err!(
                        "{}: the options argument must be a constant JSON string",
                        self.name
                    )
                }
            }
        } else {
            String::new()
        };
        let options = parse_fit_options(self.model, &options_json).into_df()?;
        let table = crate::options::parse_result_table(&options, &options_json).into_df()?;
        if table != crate::options::ResultTable::Coefficients {
            return plan_err!(
                "{}: option `table` is not supported by the aggregates (they return the \
                 coefficients); use the table function {}",
                self.name,
                self.name.trim_end_matches("_agg")
            );
        }
        Ok(Box::new(FitAccumulator {
            model: self.model,
            options,
            layout,
            collected: Collected::default(),
        }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        let list = |name: &str, t: DataType| {
            Arc::new(Field::new(
                format!("{}[{name}]", args.name),
                DataType::List(Arc::new(Field::new("item", t, true))),
                true,
            ))
        };
        let inner_i = DataType::List(Arc::new(Field::new("item", DataType::Int64, true)));
        let inner_f = DataType::List(Arc::new(Field::new("item", DataType::Float64, true)));
        Ok(vec![
            list("stratum_id", DataType::Int64),
            list("time", DataType::Float64),
            list("y", DataType::Float64),
            list("covariate_ids", inner_i),
            list("covariate_values", inner_f),
            list("cluster_id", DataType::Int64),
        ])
    }
}

/// One collected outcome row; its covariates are a range of [`Collected`]'s shared buffers
/// (no allocation per row).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Row {
    stratum: Option<i64>,
    /// NULL for models that do not use time.
    time: Option<f64>,
    y: f64,
    cluster: Option<i64>,
    /// Its covariate ids: `ids[first..first + len]`.
    first: usize,
    len: usize,
    /// Its values start at `values[v]` (one per id); `None`: every value is 1 (indicators).
    values_at: Option<usize>,
}

impl Row {
    /// How errors name the row: aggregate input rows have no stable number.
    fn describe(&self) -> String {
        let opt = |v: Option<String>| v.unwrap_or_else(|| "NULL".into());
        format!(
            "the input row with stratum_id {}, time {}, y {}",
            opt(self.stratum.map(|s| s.to_string())),
            opt(self.time.map(|t| t.to_string())),
            self.y
        )
    }
}

/// The rows a group's accumulator collected, with their covariates in two flat buffers.
#[derive(Debug, Default)]
struct Collected {
    rows: Vec<Row>,
    ids: Vec<i64>,
    /// Values of the rows that have other values than 1.
    values: Vec<f64>,
}

impl Collected {
    fn ids(&self, r: &Row) -> &[i64] {
        &self.ids[r.first..r.first + r.len]
    }

    /// The covariate values of `r`, one per id.
    fn values(&self, r: &Row) -> impl Iterator<Item = f64> + '_ {
        let (given, ones) = match r.values_at {
            Some(v) => (&self.values[v..v + r.len], 0),
            None => (&self.values[..0], r.len),
        };
        given.iter().copied().chain(std::iter::repeat_n(1.0, ones))
    }

    /// Bytes held (what `Accumulator::size` reports).
    fn bytes(&self) -> usize {
        self.rows.capacity() * std::mem::size_of::<Row>()
            + (self.ids.capacity() + self.values.capacity()) * 8
    }
}

#[derive(Debug)]
struct FitAccumulator {
    model: ModelKind,
    options: FitOptions,
    layout: Layout,
    collected: Collected,
}

fn as_i64(a: &ArrayRef) -> DfResult<Int64Array> {
    Ok(cast(a, &DataType::Int64)?
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
        .clone())
}

fn as_f64(a: &ArrayRef) -> DfResult<Float64Array> {
    Ok(cast(a, &DataType::Float64)?
        .as_primitive::<datafusion::arrow::datatypes::Float64Type>()
        .clone())
}

fn list_i64(a: &ArrayRef) -> DfResult<ListArray> {
    let t = DataType::List(Arc::new(Field::new("item", DataType::Int64, true)));
    Ok(cast(a, &t)?.as_list::<i32>().clone())
}

fn list_f64(a: &ArrayRef) -> DfResult<ListArray> {
    let t = DataType::List(Arc::new(Field::new("item", DataType::Float64, true)));
    Ok(cast(a, &t)?.as_list::<i32>().clone())
}

impl FitAccumulator {
    #[allow(clippy::too_many_arguments)]
    fn push_rows(
        &mut self,
        strata: &Int64Array,
        time: &Float64Array,
        y: &Float64Array,
        ids: &ListArray,
        values: Option<&ListArray>,
        clusters: Option<&Int64Array>,
    ) -> DfResult<()> {
        let needs_time = self.model.needs_time();
        let id_offsets = ids.value_offsets();
        let id_values = ids
            .values()
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        let values = values.map(|list| {
            (
                list,
                list.values()
                    .as_primitive::<datafusion::arrow::datatypes::Float64Type>(),
            )
        });
        for i in 0..time.len() {
            let stratum = (!strata.is_null(i)).then(|| strata.value(i));
            let row_time = (!time.is_null(i)).then(|| time.value(i));
            let describe = || {
                format!(
                    "stratum_id {}, time {}",
                    stratum.map_or("NULL".into(), |s| s.to_string()),
                    row_time.map_or("NULL".into(), |t| t.to_string())
                )
            };
            if y.is_null(i) {
                return exec_err!(
                    "{}_fit_agg: y is NULL in the input row with {}; filter or COALESCE it",
                    self.model.name(),
                    describe()
                );
            }
            if needs_time && row_time.is_none() {
                return exec_err!(
                    "{}_fit_agg: time is NULL in the input row with {}, y {}; the {} model \
                     needs a time for every row (filter or COALESCE it)",
                    self.model.name(),
                    describe(),
                    y.value(i),
                    self.model.name()
                );
            }
            let (first, end) = if ids.is_null(i) {
                (0, 0)
            } else {
                (id_offsets[i] as usize, id_offsets[i + 1] as usize)
            };
            if id_values.null_count() > 0 && (first..end).any(|k| id_values.is_null(k)) {
                return exec_err!(
                    "{}_fit_agg: covariate_ids contains NULL in the input row with {}, y {}",
                    self.model.name(),
                    describe(),
                    y.value(i)
                );
            }
            let len = end - first;
            let values_at = match values {
                Some((list, vals)) if !list.is_null(i) => {
                    let offsets = list.value_offsets();
                    let (v0, v1) = (offsets[i] as usize, offsets[i + 1] as usize);
                    if v1 - v0 != len {
                        return exec_err!(
                            "{}_fit_agg: covariate_values has {} entries but covariate_ids has {} \
                             in the input row with {}, y {}",
                            self.model.name(),
                            v1 - v0,
                            len,
                            describe(),
                            y.value(i)
                        );
                    }
                    if vals.null_count() > 0 && (v0..v1).any(|k| vals.is_null(k)) {
                        return exec_err!(
                            "{}_fit_agg: covariate_values contains NULL in the input row with {}, \
                             y {}",
                            self.model.name(),
                            describe(),
                            y.value(i)
                        );
                    }
                    // All ones (indicators, e.g. a partial state's lists): nothing to keep.
                    let v = &vals.values()[v0..v1];
                    (!v.iter().all(|&x| x == 1.0)).then(|| {
                        let at = self.collected.values.len();
                        self.collected.values.extend_from_slice(v);
                        at
                    })
                }
                _ => None,
            };
            let at = self.collected.ids.len();
            self.collected
                .ids
                .extend_from_slice(&id_values.values()[first..end]);
            self.collected.rows.push(Row {
                stratum,
                time: if needs_time { row_time } else { None },
                y: y.value(i),
                cluster: clusters.and_then(|c| (!c.is_null(i)).then(|| c.value(i))),
                first: at,
                len,
                values_at,
            });
        }
        Ok(())
    }

    fn fit_group(
        model: ModelKind,
        options: &FitOptions,
        collected: Collected,
    ) -> epifusion_core::Result<epifusion_core::fit::FitResult> {
        let Collected {
            mut rows,
            ids,
            values,
        } = collected;
        let c = Collected {
            rows: Vec::new(),
            ids,
            values,
        };
        // Canonical order: results never depend on batch arrival order.
        rows.sort_by(|a, b| {
            a.stratum
                .cmp(&b.stratum)
                .then(a.time.unwrap_or(1.0).total_cmp(&b.time.unwrap_or(1.0)))
                .then(a.y.total_cmp(&b.y))
                .then_with(|| c.ids(a).cmp(c.ids(b)))
                .then_with(|| {
                    c.values(a)
                        .zip(c.values(b))
                        .map(|(x, y)| x.total_cmp(&y))
                        .find(|o| o.is_ne())
                        .unwrap_or(std::cmp::Ordering::Equal)
                })
                .then(a.cluster.cmp(&b.cluster))
        });
        let mut b = DesignBuilder::new();
        for (k, r) in rows.iter().enumerate() {
            b.push_outcome(OutcomeRecord {
                row_id: k as i64,
                stratum_id: r.stratum,
                time: r.time,
                y: r.y,
                cluster_id: r.cluster,
                ..Default::default()
            });
            for (&id, v) in c.ids(r).iter().zip(c.values(r)) {
                b.push_covariate(k as i64, id, v);
            }
        }
        // Row ids here are positions in the canonical order, which mean nothing to the user:
        // errors about a row name it by its values instead.
        let name_row = |e: Error| match e {
            Error::BadValue {
                row,
                column,
                message,
                ..
            } => Error::BadColumn {
                message: match rows.get(row) {
                    Some(r) => format!("{}: {message}", r.describe()),
                    None => message,
                },
                column,
            },
            Error::DuplicateCovariate {
                row_id,
                covariate_id,
            } => Error::BadColumn {
                column: "covariate_ids".into(),
                message: match rows.get(row_id as usize) {
                    Some(r) => format!(
                        "{} lists covariate_id {covariate_id} more than once",
                        r.describe()
                    ),
                    None => format!("a row lists covariate_id {covariate_id} more than once"),
                },
            },
            e => e,
        };
        let x = b.build().map_err(name_row)?;
        let _ = model;
        fit_owned(x, options).map_err(name_row)
    }
}

/// Counts of group fits started and cancelled in this process (observed by the cancellation
/// test; cheap atomics).
#[derive(Debug, Default)]
pub struct FitEvents {
    /// Group fits started (`evaluate` with rows).
    pub started: std::sync::atomic::AtomicUsize,
    /// Group fits stopped by their query's cancel token.
    pub cancelled: std::sync::atomic::AtomicUsize,
}

/// This process's [`FitEvents`].
pub static FIT_EVENTS: FitEvents = FitEvents {
    started: std::sync::atomic::AtomicUsize::new(0),
    cancelled: std::sync::atomic::AtomicUsize::new(0),
};

fn run_blocking<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

impl Accumulator for FitAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        let strata = as_i64(&values[0])?;
        let time = as_f64(&values[1])?;
        let y = as_f64(&values[2])?;
        let ids = list_i64(&values[3])?;
        let vals = if self.layout.has_values {
            Some(list_f64(&values[4])?)
        } else {
            None
        };
        let clusters = match self.layout.cluster {
            Some(c) => Some(as_i64(&values[c])?),
            None => None,
        };
        self.push_rows(&strata, &time, &y, &ids, vals.as_ref(), clusters.as_ref())
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        let fields = coefficient_fields();
        if self.collected.rows.is_empty() {
            return Ok(ScalarValue::List(Arc::new(ListArray::new_null(
                Arc::new(Field::new("item", DataType::Struct(fields), true)),
                1,
            ))));
        }
        let rows = std::mem::take(&mut self.collected);
        let (model, mut options) = (self.model, self.options.clone());
        // The query's token when a `FitScopeExec` polls this aggregate: the fit stops within
        // one cycle once the query's stream is dropped (crate::cancel_scope).
        options.ccd.cancel = crate::cancel_scope::current_token();
        FIT_EVENTS
            .started
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let result = run_blocking(move || FitAccumulator::fit_group(model, &options, rows));
        if let Err(Error::Cancelled) = result {
            FIT_EVENTS
                .cancelled
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Err(datafusion::common::DataFusionError::Execution(format!(
                "{}: the fit was cancelled (its query was dropped)",
                model.name()
            )));
        }
        // One entry per coefficient: the result table's row (one function makes both).
        let columns: Vec<ArrayRef> = match result.and_then(|r| crate::convert::result_batch(&r)) {
            Ok(batch) => batch.columns().to_vec(),
            Err(e) => fields
                .iter()
                .map(|f| match f.name().as_str() {
                    "status" => {
                        Arc::new(StringArray::from(vec![format!("failed: {e}")])) as ArrayRef
                    }
                    "model" => Arc::new(StringArray::from(vec![model.name()])) as ArrayRef,
                    _ => datafusion::arrow::array::new_null_array(f.data_type(), 1),
                })
                .collect(),
        };
        let n = columns.first().map_or(0, |c| c.len());
        let structs = StructArray::try_new(fields.clone(), columns, None)?;
        let list = ListArray::try_new(
            Arc::new(Field::new("item", DataType::Struct(fields), true)),
            OffsetBuffer::from_lengths([n]),
            Arc::new(structs),
            None,
        )?;
        Ok(ScalarValue::List(Arc::new(list)))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.collected.bytes()
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        let mut strata = ListBuilder::new(Int64Builder::new());
        let mut time = ListBuilder::new(Float64Builder::new());
        let mut y = ListBuilder::new(Float64Builder::new());
        let mut ids = ListBuilder::new(ListBuilder::new(Int64Builder::new()));
        let mut vals = ListBuilder::new(ListBuilder::new(Float64Builder::new()));
        let mut clusters = ListBuilder::new(Int64Builder::new());
        let c = &self.collected;
        for r in &c.rows {
            strata.values().append_option(r.stratum);
            time.values().append_option(r.time);
            clusters.values().append_option(r.cluster);
            y.values().append_value(r.y);
            ids.values().values().append_slice(c.ids(r));
            ids.values().append(true);
            // A NULL list: every value is 1 (as for `covariate_values` given as NULL).
            match r.values_at {
                Some(v) => {
                    vals.values().values().append_slice(&c.values[v..v + r.len]);
                    vals.values().append(true);
                }
                None => vals.values().append(false),
            }
        }
        strata.append(true);
        time.append(true);
        y.append(true);
        ids.append(true);
        vals.append(true);
        clusters.append(true);
        Ok(vec![
            ScalarValue::List(Arc::new(strata.finish())),
            ScalarValue::List(Arc::new(time.finish())),
            ScalarValue::List(Arc::new(y.finish())),
            ScalarValue::List(Arc::new(ids.finish())),
            ScalarValue::List(Arc::new(vals.finish())),
            ScalarValue::List(Arc::new(clusters.finish())),
        ])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        let (s, t, yv, i, v, c) = (
            states[0].as_list::<i32>(),
            states[1].as_list::<i32>(),
            states[2].as_list::<i32>(),
            states[3].as_list::<i32>(),
            states[4].as_list::<i32>(),
            states[5].as_list::<i32>(),
        );
        for k in 0..s.len() {
            if s.is_null(k) {
                continue;
            }
            let strata = as_i64(&s.value(k))?;
            let time = as_f64(&t.value(k))?;
            let y = as_f64(&yv.value(k))?;
            let ids = list_i64(&i.value(k))?;
            let vals = list_f64(&v.value(k))?;
            let clusters = as_i64(&c.value(k))?;
            self.push_rows(&strata, &time, &y, &ids, Some(&vals), Some(&clusters))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod constant_tests {
    use super::*;
    use datafusion::physical_expr::expressions::{col, lit, BinaryExpr};
    use datafusion::physical_expr::PhysicalExpr;

    #[test]
    fn constants_are_read_from_literals_and_constant_expressions_only() {
        let schema =
            datafusion::arrow::datatypes::Schema::new(vec![Field::new("o", DataType::Utf8, true)]);
        let l: Arc<dyn PhysicalExpr> = lit("{\"ci\": \"none\"}");
        assert_eq!(constant_string(&l).as_deref(), Some("{\"ci\": \"none\"}"));
        // Not a Literal node, but constant (as a literal wrapped by another layer evaluates).
        let wrapped: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            lit("{\"ci\""),
            datafusion::logical_expr::Operator::StringConcat,
            lit(": \"none\"}"),
        ));
        assert_eq!(
            constant_string(&wrapped).as_deref(),
            Some("{\"ci\": \"none\"}")
        );
        // A column is not a constant; neither is a NULL or a number.
        assert_eq!(constant_string(&col("o", &schema).unwrap()), None);
        assert_eq!(constant_string(&lit(ScalarValue::Utf8(None))), None);
        assert_eq!(constant_string(&lit(3i64)), None);
    }
}

#[cfg(test)]
mod accumulator_tests {
    use super::*;
    use datafusion::arrow::array::Float64Array;

    fn accumulator(has_values: bool) -> FitAccumulator {
        FitAccumulator {
            model: ModelKind::Poisson,
            options: crate::options::parse_fit_options(ModelKind::Poisson, r#"{"ci": "none"}"#)
                .unwrap(),
            layout: Layout {
                has_values,
                cluster: None,
                has_options: false,
            },
            collected: Collected::default(),
        }
    }

    fn ids(rows: &[&[i64]]) -> ArrayRef {
        let mut b = ListBuilder::new(Int64Builder::new());
        for r in rows {
            b.values().append_slice(r);
            b.append(true);
        }
        Arc::new(b.finish())
    }

    fn values(rows: &[&[f64]]) -> ArrayRef {
        let mut b = ListBuilder::new(Float64Builder::new());
        for r in rows {
            b.values().append_slice(r);
            b.append(true);
        }
        Arc::new(b.finish())
    }

    /// Absent values, values of exactly 1 and a partial state merged back fit the same model;
    /// `size` tracks what the rows hold.
    #[test]
    fn indicator_rows_keep_no_values_and_fit_the_same_model() {
        let n = 40;
        let strata: ArrayRef = Arc::new(Int64Array::from(vec![None::<i64>; n]));
        let exposure = || {
            Arc::new(Float64Array::from(
                (0..n).map(|i| 1.0 + (i % 4) as f64).collect::<Vec<_>>(),
            )) as ArrayRef
        };
        let time = exposure();
        let y: ArrayRef = Arc::new(Float64Array::from(
            (0..n).map(|i| ((i * 7) % 5) as f64).collect::<Vec<_>>(),
        ));
        let id_rows: Vec<Vec<i64>> = (0..n)
            .map(|i| match i % 3 {
                0 => vec![1],
                1 => vec![1, 2],
                _ => vec![],
            })
            .collect();
        let id_refs: Vec<&[i64]> = id_rows.iter().map(|r| r.as_slice()).collect();
        let ones: Vec<Vec<f64>> = id_rows.iter().map(|r| vec![1.0; r.len()]).collect();
        let one_refs: Vec<&[f64]> = ones.iter().map(|r| r.as_slice()).collect();

        let mut plain = accumulator(false);
        plain
            .update_batch(&[strata.clone(), time.clone(), y.clone(), ids(&id_refs)])
            .unwrap();
        let indicators = |a: &FitAccumulator| {
            a.collected.rows.iter().all(|r| r.values_at.is_none()) && a.collected.values.is_empty()
        };
        assert!(indicators(&plain));
        let mut explicit = accumulator(true);
        explicit
            .update_batch(&[strata, time, y, ids(&id_refs), values(&one_refs)])
            .unwrap();
        assert!(indicators(&explicit));
        let entries: usize = id_rows.iter().map(Vec::len).sum();
        assert_eq!(plain.collected.ids.len(), entries);
        assert!(plain.size() >= n * std::mem::size_of::<Row>() + entries * 8);

        // A partial state (values written out as ones) merged into a final accumulator.
        let state: Vec<ArrayRef> = plain
            .state()
            .unwrap()
            .into_iter()
            .map(|s| s.to_array().unwrap())
            .collect();
        let mut merged = accumulator(false);
        merged.merge_batch(&state).unwrap();
        assert!(indicators(&merged));
        assert_eq!(merged.collected.ids, plain.collected.ids);

        let a = fitted(plain.evaluate().unwrap());
        assert!(plain.collected.rows.is_empty());
        assert_eq!(a, fitted(explicit.evaluate().unwrap()));
        assert_eq!(a, fitted(merged.evaluate().unwrap()));

        // Other values are kept as given.
        let mut real = accumulator(true);
        let halves: Vec<Vec<f64>> = id_rows.iter().map(|r| vec![0.5; r.len()]).collect();
        let half_refs: Vec<&[f64]> = halves.iter().map(|r| r.as_slice()).collect();
        real.update_batch(&[
            Arc::new(Int64Array::from(vec![None::<i64>; n])),
            exposure(),
            Arc::new(Float64Array::from(
                (0..n).map(|i| ((i * 7) % 5) as f64).collect::<Vec<_>>(),
            )),
            ids(&id_refs),
            values(&half_refs),
        ])
        .unwrap();
        let c = &real.collected;
        assert!(c
            .rows
            .iter()
            .all(|r| c.values(r).eq(std::iter::repeat_n(0.5, r.len))));
        assert_eq!(c.values.len(), entries);
        assert_ne!(fitted(real.evaluate().unwrap()), a);
    }

    /// Every result column but the timing, printed.
    fn fitted(v: ScalarValue) -> Vec<String> {
        let ScalarValue::List(l) = v else {
            panic!("not a list: {v:?}")
        };
        let rows = l.value(0);
        let rows = rows.as_struct();
        rows.column_names()
            .iter()
            .zip(rows.columns())
            .filter(|(name, _)| **name != "seconds")
            .map(|(name, c)| format!("{name}: {c:?}"))
            .collect()
    }
}

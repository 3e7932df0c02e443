//! The Arrow boundary: CSV / Parquet files → [`DesignBuilder`], and fit results → files.
//!
//! Input tables are read batch by batch (Parquet through
//! [`ParquetRecordBatchReaderBuilder`], CSV through arrow-csv with schema inference over the
//! whole file); the file type is chosen by extension (`.csv`, `.parquet` / `.pq`).
//!
//! **Long format** (DESIGN.md §4), column names matched case-insensitively and with or without
//! underscores, so Cyclops' camelCase names (`rowId`, `stratumId`, `covariateId`,
//! `covariateValue`, `startTime`, `censorWeight`) work too:
//!
//! | table | column | required | type |
//! |---|---|---|---|
//! | outcomes | `row_id` | yes | id |
//! | outcomes | `stratum_id` | no | id |
//! | outcomes | `time` | yes when [`ReadOptions::require_time`] | number |
//! | outcomes | `y` | yes | number |
//! | outcomes | `weight`, `start_time`, `offset`, `censor_weight` | no | number |
//! | outcomes | `cluster_id` | no (NULL: a cluster of its own) | id |
//! | covariates | `row_id`, `covariate_id` | yes | id |
//! | covariates | `covariate_value` | no (default 1) | number |
//!
//! Ids become `i64` (integer columns, or floating-point / text columns holding whole numbers;
//! anything else is an error). Numbers become `f64` through Arrow casts (text is parsed, `NA`
//! and empty text are NULL). A NULL in a required column is an error naming the file, the
//! column and the (1-based data) row; a NULL in an optional column means "absent".
//!
//! **Wide format** ([`read_wide`]): one table whose reserved columns (the outcome names above,
//! after the `--time` / `--y` renames) are the outcome and whose other numeric columns (or the
//! ones listed in [`ReadOptions::covariate_columns`]) are covariates with ids 1, 2, … in column
//! order, named by their column. Row ids are the `row_id` column when there is one, else the
//! 1-based row numbers. Rows with a NULL in any used column are dropped and counted (like R's
//! `na.omit`); a NULL `cluster_id` is not dropped: the row is a cluster of its own.
//!
//! **Event coding**: with [`ReadOptions::event_value`] = v, y becomes 1 where the y column
//! equals v and 0 elsewhere (R's `lung` codes `status` 1 = censored, 2 = dead: use v = 2).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int64Array, LargeStringArray, RecordBatch,
    StringArray, UInt64Array,
};
use arrow::compute::{cast_with_options, CastOptions};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::error::ArrowError;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;

use crate::options::ResultTable;
use epifusion_core::error::{Error, Result};
use epifusion_core::fit::FitResult;
use epifusion_core::model::design::{DesignBuilder, OutcomeRecord, OutcomeSlices, INTERCEPT_ID};

/// Rows per record batch when reading.
pub const DEFAULT_BATCH_SIZE: usize = 8192;

/// How to read the input tables.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// Name of the time column (default `time`).
    pub time_column: Option<String>,
    /// Name of the outcome column (default `y`).
    pub y_column: Option<String>,
    /// When set, y = 1 where the y column equals this value, else 0.
    pub event_value: Option<f64>,
    /// Wide form: the covariate columns to use (default: every other numeric column).
    pub covariate_columns: Option<Vec<String>>,
    /// Whether the time column must be present (Cox, Fine–Gray, SCCS, Poisson).
    pub require_time: bool,
    /// Drop covariate entries whose row id has no outcome row (counted) instead of failing.
    pub drop_unknown_rows: bool,
    /// Rows per record batch.
    pub batch_size: usize,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            time_column: None,
            y_column: None,
            event_value: None,
            covariate_columns: None,
            require_time: true,
            drop_unknown_rows: false,
            batch_size: DEFAULT_BATCH_SIZE,
        }
    }
}

/// What a read did, for the user.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadReport {
    /// Input rows of the outcome (or wide) table.
    pub input_rows: usize,
    /// Outcome rows kept.
    pub outcome_rows: usize,
    /// Covariate entries read (long form) or nonzero cells (wide form).
    pub covariate_entries: usize,
    /// Wide form: rows dropped because a used column was NULL.
    pub dropped_null_rows: usize,
    /// Wide form: covariate columns used, in id order (id = position + 1).
    pub covariate_columns: Vec<String>,
    /// Wide form: columns skipped because they are not numeric.
    pub skipped_columns: Vec<String>,
}

impl ReadReport {
    /// What a user must be told about the read (rows dropped for NULLs, skipped columns,
    /// covariate entries dropped for unknown row ids): the CLI prints these, SQL fits put them
    /// in the `notes` column.
    pub fn notes(&self, dropped_unknown: usize) -> Vec<String> {
        let mut notes = Vec::new();
        if self.dropped_null_rows > 0 {
            notes.push(format!(
                "dropped {} of {} rows with NULL in a used column",
                self.dropped_null_rows, self.input_rows
            ));
        }
        if !self.skipped_columns.is_empty() {
            notes.push(format!(
                "skipped non-numeric columns: {}",
                self.skipped_columns.join(", ")
            ));
        }
        if dropped_unknown > 0 {
            notes.push(format!(
                "dropped {dropped_unknown} covariate entries with unknown row ids"
            ));
        }
        notes
    }
}

/// Outcome-table columns with a fixed meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    RowId,
    StratumId,
    Time,
    Y,
    Weight,
    StartTime,
    Offset,
    CensorWeight,
    ClusterId,
}

const ROLES: [Role; 9] = [
    Role::RowId,
    Role::StratumId,
    Role::Time,
    Role::Y,
    Role::Weight,
    Role::StartTime,
    Role::Offset,
    Role::CensorWeight,
    Role::ClusterId,
];

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::RowId => "row_id",
            Role::StratumId => "stratum_id",
            Role::Time => "time",
            Role::Y => "y",
            Role::Weight => "weight",
            Role::StartTime => "start_time",
            Role::Offset => "offset",
            Role::CensorWeight => "censor_weight",
            Role::ClusterId => "cluster_id",
        }
    }
}

/// `rowId`, `row_id`, `ROW_ID` → `rowid`.
fn normalize(name: &str) -> String {
    name.chars()
        .filter(|&c| c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Index of the column called `wanted` (exact match first, then normalized).
fn find_column(schema: &Schema, wanted: &str) -> Option<usize> {
    if let Some(i) = schema.fields().iter().position(|f| f.name() == wanted) {
        return Some(i);
    }
    let w = normalize(wanted);
    schema
        .fields()
        .iter()
        .position(|f| normalize(f.name()) == w)
}

fn column_list(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn missing_column(file: &str, name: &str, schema: &Schema) -> Error {
    Error::BadColumn {
        column: name.into(),
        message: format!("not found in {file} (columns: {})", column_list(schema)),
    }
}

/// The outcome columns present in `schema`: `(role, column index, column name)`.
fn outcome_columns(schema: &Schema, opts: &ReadOptions) -> Vec<(Role, usize, String)> {
    ROLES
        .iter()
        .filter_map(|&role| {
            let wanted = match role {
                Role::Time => opts.time_column.as_deref().unwrap_or("time"),
                Role::Y => opts.y_column.as_deref().unwrap_or("y"),
                r => r.name(),
            };
            find_column(schema, wanted).map(|i| (role, i, schema.field(i).name().clone()))
        })
        .collect()
}

fn format_err(file: &str, e: impl std::fmt::Display) -> Error {
    Error::Format(format!("{file}: {e}"))
}

/// A stream of record batches from a CSV or Parquet file.
pub struct BatchSource {
    /// The file's schema.
    pub schema: SchemaRef,
    batches: Box<dyn Iterator<Item = std::result::Result<RecordBatch, ArrowError>>>,
    file: String,
    /// The number of rows the batches hold, when known up front (a size hint only).
    rows: Option<usize>,
}

impl BatchSource {
    /// Batches already in memory (e.g. the result of a SQL query); `label` names the source
    /// in error messages.
    pub fn from_batches(
        label: impl Into<String>,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Self {
        let rows = batches.iter().map(RecordBatch::num_rows).sum();
        BatchSource {
            schema,
            batches: Box::new(batches.into_iter().map(Ok)),
            file: label.into(),
            rows: Some(rows),
        }
    }

    /// Batches from an iterator (e.g. a channel a query's stream feeds); `label` names the
    /// source in error messages.
    pub fn from_iter(
        label: impl Into<String>,
        schema: SchemaRef,
        batches: impl Iterator<Item = std::result::Result<RecordBatch, ArrowError>> + 'static,
    ) -> Self {
        BatchSource {
            schema,
            batches: Box::new(batches),
            file: label.into(),
            rows: None,
        }
    }

    /// Declare how many rows the batches hold (e.g. from a plan's exact statistics): the
    /// readers reserve room for them. A hint only: a wrong count costs memory or regrowth,
    /// never rows.
    pub fn with_rows(mut self, rows: Option<usize>) -> Self {
        self.rows = rows;
        self
    }

    /// The number of rows the batches hold, when known up front.
    pub fn rows(&self) -> Option<usize> {
        self.rows
    }

    /// The label used in error messages (file name or query).
    pub fn label(&self) -> &str {
        &self.file
    }
}

impl Iterator for BatchSource {
    type Item = Result<RecordBatch>;
    fn next(&mut self) -> Option<Result<RecordBatch>> {
        self.batches
            .next()
            .map(|r| r.map_err(|e| format_err(&self.file, e)))
    }
}

/// Open `path` (by extension: `.csv`, `.parquet`, `.pq`) as a stream of record batches.
pub fn open_batches(path: &Path, batch_size: usize) -> Result<BatchSource> {
    let file_name = path.display().to_string();
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    let open = || {
        File::open(path).map_err(|source| Error::Io {
            path: file_name.clone(),
            source,
        })
    };
    let batch_size = batch_size.max(1);
    match ext.as_str() {
        "parquet" | "pq" => {
            let builder = ParquetRecordBatchReaderBuilder::try_new(open()?)
                .map_err(|e| format_err(&file_name, e))?
                .with_batch_size(batch_size);
            let schema = builder.schema().clone();
            let rows = usize::try_from(builder.metadata().file_metadata().num_rows()).ok();
            let reader = builder.build().map_err(|e| format_err(&file_name, e))?;
            Ok(BatchSource {
                schema,
                batches: Box::new(reader),
                file: file_name,
                rows,
            })
        }
        "csv" => {
            let format = arrow::csv::reader::Format::default().with_header(true);
            let (schema, _) = format
                .infer_schema(open()?, None)
                .map_err(|e| format_err(&file_name, e))?;
            let schema = Arc::new(schema);
            let reader = arrow::csv::ReaderBuilder::new(schema.clone())
                .with_format(format)
                .with_batch_size(batch_size)
                .build(open()?)
                .map_err(|e| format_err(&file_name, e))?;
            Ok(BatchSource {
                schema,
                batches: Box::new(reader),
                file: file_name,
                rows: None,
            })
        }
        other => Err(Error::Format(format!(
            "{file_name}: unknown file type `.{other}`; expected .csv or .parquet"
        ))),
    }
}

/// Where a value comes from, for error messages.
struct Ctx<'a> {
    file: &'a str,
    column: &'a str,
    /// 0-based index of the batch's first row in the file.
    row0: usize,
}

impl Ctx<'_> {
    fn bad(&self, i: usize, message: impl std::fmt::Display) -> Error {
        Error::BadColumn {
            column: self.column.into(),
            message: format!("{message} in row {} of {}", self.row0 + i + 1, self.file),
        }
    }
    fn bad_type(&self, dt: &DataType, expected: &str) -> Error {
        Error::BadColumn {
            column: self.column.into(),
            message: format!("has type {dt} in {}; expected {expected}", self.file),
        }
    }
}

fn is_na_text(s: &str) -> bool {
    let s = s.trim();
    s.is_empty() || s == "NA" || s == "null" || s == "NULL"
}

fn parse_text<T>(
    values: impl Iterator<Item = Option<String>>,
    ctx: &Ctx,
    parse: impl Fn(&str) -> Option<T>,
    what: &str,
) -> Result<Vec<Option<T>>> {
    values
        .enumerate()
        .map(|(i, v)| match v {
            None => Ok(None),
            Some(s) if is_na_text(&s) => Ok(None),
            Some(s) => parse(s.trim())
                .map(Some)
                .ok_or_else(|| ctx.bad(i, format!("`{s}` is not {what}"))),
        })
        .collect()
}

fn text_values(arr: &ArrayRef) -> Option<Box<dyn Iterator<Item = Option<String>> + '_>> {
    if let Some(a) = arr.as_any().downcast_ref::<StringArray>() {
        return Some(Box::new(a.iter().map(|v| v.map(str::to_owned))));
    }
    if let Some(a) = arr.as_any().downcast_ref::<LargeStringArray>() {
        return Some(Box::new(a.iter().map(|v| v.map(str::to_owned))));
    }
    None
}

fn strict_cast(arr: &ArrayRef, to: &DataType, ctx: &Ctx) -> Result<ArrayRef> {
    let opts = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(arr, to, &opts).map_err(|e| Error::BadColumn {
        column: ctx.column.into(),
        message: format!("in {}: {e}", ctx.file),
    })
}

/// An id column as `i64` values (NULL → None).
fn ids(arr: &ArrayRef, ctx: &Ctx) -> Result<Int64Array> {
    let dt = arr.data_type();
    match dt {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32 => {
            let a = strict_cast(arr, &DataType::Int64, ctx)?;
            Ok(a.as_any()
                .downcast_ref::<Int64Array>()
                .cloned()
                .unwrap_or_else(|| Int64Array::new_null(arr.len())))
        }
        DataType::UInt64 => {
            let a = arr
                .as_any()
                .downcast_ref::<UInt64Array>()
                .ok_or_else(|| ctx.bad_type(dt, "integer ids"))?;
            a.iter()
                .enumerate()
                .map(|(i, v)| match v {
                    None => Ok(None),
                    Some(v) => i64::try_from(v)
                        .map(Some)
                        .map_err(|_| ctx.bad(i, format!("id {v} does not fit in Int64"))),
                })
                .collect()
        }
        DataType::Float16 | DataType::Float32 | DataType::Float64 => {
            let f = strict_cast(arr, &DataType::Float64, ctx)?;
            let f = f
                .as_any()
                .downcast_ref::<Float64Array>()
                .ok_or_else(|| ctx.bad_type(dt, "integer ids"))?;
            f.iter()
                .enumerate()
                .map(|(i, v)| match v {
                    None => Ok(None),
                    Some(v) if v.fract() == 0.0 && v.abs() < 9.007_199_254_740_992e15 => {
                        Ok(Some(v as i64))
                    }
                    Some(v) => Err(ctx.bad(i, format!("id {v} is not a whole number"))),
                })
                .collect()
        }
        DataType::Null => Ok(Int64Array::new_null(arr.len())),
        _ => match text_values(arr) {
            Some(values) => {
                let v = parse_text(values, ctx, |s| s.parse::<i64>().ok(), "an integer id")?;
                Ok(Int64Array::from(v))
            }
            None => Err(ctx.bad_type(dt, "integer ids (Int32, Int64 or whole Float64)")),
        },
    }
}

/// A numeric column as `f64` values (NULL → None).
fn numbers(arr: &ArrayRef, ctx: &Ctx) -> Result<Float64Array> {
    let dt = arr.data_type();
    if is_numeric(dt) {
        let a = strict_cast(arr, &DataType::Float64, ctx)?;
        return a
            .as_any()
            .downcast_ref::<Float64Array>()
            .cloned()
            .ok_or_else(|| ctx.bad_type(dt, "numbers"));
    }
    if *dt == DataType::Null {
        return Ok(Float64Array::new_null(arr.len()));
    }
    match text_values(arr) {
        Some(values) => {
            let v = parse_text(values, ctx, |s| s.parse::<f64>().ok(), "a number")?;
            Ok(Float64Array::from(v))
        }
        None => Err(ctx.bad_type(dt, "numbers")),
    }
}

fn is_numeric(dt: &DataType) -> bool {
    dt.is_numeric() || *dt == DataType::Boolean
}

/// Error on the first NULL of a required column.
fn no_nulls(arr: &dyn Array, ctx: &Ctx) -> Result<()> {
    if arr.null_count() > 0 {
        if let Some(i) = (0..arr.len()).find(|&i| arr.is_null(i)) {
            return Err(ctx.bad(i, "NULL in a required column"));
        }
    }
    Ok(())
}

#[inline]
fn opt_f64(a: &Float64Array, i: usize) -> Option<f64> {
    a.is_valid(i).then(|| a.value(i))
}

#[inline]
fn opt_i64(a: &Int64Array, i: usize) -> Option<i64> {
    a.is_valid(i).then(|| a.value(i))
}

/// One batch's outcome columns, converted.
#[derive(Default)]
struct OutcomeArrays {
    row_id: Option<Int64Array>,
    stratum_id: Option<Int64Array>,
    cluster_id: Option<Int64Array>,
    time: Option<Float64Array>,
    y: Option<Float64Array>,
    weight: Option<Float64Array>,
    start_time: Option<Float64Array>,
    offset: Option<Float64Array>,
    censor_weight: Option<Float64Array>,
}

impl OutcomeArrays {
    fn convert(
        batch: &RecordBatch,
        cols: &[(Role, usize, String)],
        file: &str,
        row0: usize,
        required: &[Role],
    ) -> Result<Self> {
        let mut out = OutcomeArrays::default();
        for (role, idx, name) in cols {
            let ctx = Ctx {
                file,
                column: name,
                row0,
            };
            let arr = batch.column(*idx);
            let req = required.contains(role);
            match role {
                Role::RowId | Role::StratumId | Role::ClusterId => {
                    let a = ids(arr, &ctx)?;
                    if req {
                        no_nulls(&a, &ctx)?;
                    }
                    match role {
                        Role::RowId => out.row_id = Some(a),
                        Role::StratumId => out.stratum_id = Some(a),
                        _ => out.cluster_id = Some(a),
                    }
                }
                _ => {
                    let a = numbers(arr, &ctx)?;
                    if req {
                        no_nulls(&a, &ctx)?;
                    }
                    let slot = match role {
                        Role::Time => &mut out.time,
                        Role::Y => &mut out.y,
                        Role::Weight => &mut out.weight,
                        Role::StartTime => &mut out.start_time,
                        Role::Offset => &mut out.offset,
                        _ => &mut out.censor_weight,
                    };
                    *slot = Some(a);
                }
            }
        }
        Ok(out)
    }

    /// Whether any used outcome value of row `i` is NULL.
    fn any_null(&self, i: usize) -> bool {
        self.any_column(|a| a.is_null(i), |a| a.is_null(i), false)
    }

    /// Whether `f64` holds for a used Float64 column or `i64` for a used Int64 column (the
    /// cluster id only with `cluster`: a NULL there is allowed, "no cluster").
    fn any_column(
        &self,
        f64: impl Fn(&Float64Array) -> bool,
        i64: impl Fn(&Int64Array) -> bool,
        cluster: bool,
    ) -> bool {
        let f = |a: &Option<Float64Array>| a.as_ref().is_some_and(&f64);
        let g = |a: &Option<Int64Array>| a.as_ref().is_some_and(&i64);
        g(&self.row_id)
            || g(&self.stratum_id)
            || (cluster && g(&self.cluster_id))
            || f(&self.time)
            || f(&self.y)
            || f(&self.weight)
            || f(&self.start_time)
            || f(&self.offset)
            || f(&self.censor_weight)
    }

    /// Push the batch's `n` rows: column by column when no used column has a NULL (the
    /// common case), else row by row (a NULL in an optional column is "absent" for that row).
    fn push_rows(&self, builder: &mut DesignBuilder, n: usize, event_value: Option<f64>) {
        let nulls = self.any_column(|a| a.null_count() > 0, |a| a.null_count() > 0, true);
        if let (false, Some(row_id), Some(y)) = (nulls, &self.row_id, &self.y) {
            let recoded: Option<Vec<f64>> = event_value.map(|v| {
                y.values()
                    .iter()
                    .map(|&raw| f64::from(u8::from(raw == v)))
                    .collect()
            });
            fn f64s(a: &Option<Float64Array>) -> Option<&[f64]> {
                a.as_ref().map(|a| &a.values()[..])
            }
            fn i64s(a: &Option<Int64Array>) -> Option<&[i64]> {
                a.as_ref().map(|a| &a.values()[..])
            }
            builder.push_outcomes(OutcomeSlices {
                row_id: &row_id.values()[..],
                stratum_id: i64s(&self.stratum_id),
                time: f64s(&self.time),
                y: recoded.as_deref().unwrap_or(&y.values()[..]),
                weight: f64s(&self.weight),
                start_time: f64s(&self.start_time),
                offset: f64s(&self.offset),
                censor_weight: f64s(&self.censor_weight),
                cluster_id: i64s(&self.cluster_id),
            });
            return;
        }
        let row_id = self.row_id.as_ref().map(|r| r.values().clone());
        for i in 0..n {
            let id = row_id.as_ref().map_or(0, |r| r[i]);
            builder.push_outcome(self.record(i, id, event_value));
        }
    }

    fn record(&self, i: usize, row_id: i64, event_value: Option<f64>) -> OutcomeRecord {
        let of = |a: &Option<Float64Array>| a.as_ref().and_then(|a| opt_f64(a, i));
        let raw_y = of(&self.y).unwrap_or(f64::NAN);
        let y = match event_value {
            Some(v) => f64::from(u8::from(raw_y == v)),
            None => raw_y,
        };
        OutcomeRecord {
            row_id,
            stratum_id: self.stratum_id.as_ref().and_then(|a| opt_i64(a, i)),
            time: of(&self.time),
            y,
            weight: of(&self.weight),
            start_time: of(&self.start_time),
            offset: of(&self.offset),
            censor_weight: of(&self.censor_weight),
            cluster_id: self.cluster_id.as_ref().and_then(|a| opt_i64(a, i)),
        }
    }
}

fn required_outcome_roles(
    schema: &Schema,
    cols: &[(Role, usize, String)],
    opts: &ReadOptions,
    file: &str,
    need_row_id: bool,
) -> Result<Vec<Role>> {
    let mut required = vec![Role::Y];
    if need_row_id {
        required.push(Role::RowId);
    }
    if opts.require_time {
        required.push(Role::Time);
    }
    for &role in &required {
        if !cols.iter().any(|c| c.0 == role) {
            let name = match role {
                Role::Time => opts.time_column.as_deref().unwrap_or("time"),
                Role::Y => opts.y_column.as_deref().unwrap_or("y"),
                r => r.name(),
            };
            return Err(missing_column(file, name, schema));
        }
    }
    Ok(required)
}

/// Read the long format: an outcome table and a covariate table.
pub fn read_long(
    outcomes: &Path,
    covariates: &Path,
    opts: &ReadOptions,
) -> Result<(DesignBuilder, ReadReport)> {
    read_long_from(
        open_batches(outcomes, opts.batch_size)?,
        open_batches(covariates, opts.batch_size)?,
        opts,
    )
}

/// Read the long format from two batch sources (files or query results).
pub fn read_long_from(
    outcomes: BatchSource,
    covariates: BatchSource,
    opts: &ReadOptions,
) -> Result<(DesignBuilder, ReadReport)> {
    let mut builder = DesignBuilder::new();
    builder.drop_unknown_rows(opts.drop_unknown_rows);
    if let Some(n) = outcomes.rows() {
        builder.reserve_rows(n);
    }
    let mut report = ReadReport::default();

    // Outcomes.
    let source = outcomes;
    let file = source.label().to_string();
    let schema = source.schema.clone();
    let cols = outcome_columns(&schema, opts);
    let required = required_outcome_roles(&schema, &cols, opts, &file, true)?;
    let mut row0 = 0;
    for batch in source {
        let batch = batch?;
        let a = OutcomeArrays::convert(&batch, &cols, &file, row0, &required)?;
        a.push_rows(&mut builder, batch.num_rows(), opts.event_value);
        row0 += batch.num_rows();
    }
    report.input_rows = row0;
    report.outcome_rows = row0;

    // Covariates.
    let source = covariates;
    let file = source.label().to_string();
    let schema = source.schema.clone();
    let row_col =
        find_column(&schema, "row_id").ok_or_else(|| missing_column(&file, "row_id", &schema))?;
    let cov_col = find_column(&schema, "covariate_id")
        .ok_or_else(|| missing_column(&file, "covariate_id", &schema))?;
    let val_col = find_column(&schema, "covariate_value");
    let mut row0 = 0;
    for batch in source {
        let batch = batch?;
        let ctx = |idx: usize| Ctx {
            file: &file,
            column: schema.field(idx).name(),
            row0,
        };
        let rows = ids(batch.column(row_col), &ctx(row_col))?;
        no_nulls(&rows, &ctx(row_col))?;
        let covs = ids(batch.column(cov_col), &ctx(cov_col))?;
        no_nulls(&covs, &ctx(cov_col))?;
        let values = match val_col {
            Some(v) => Some(numbers(batch.column(v), &ctx(v))?),
            None => None,
        };
        let (rows, covs) = (rows.values(), covs.values());
        match &values {
            // A NULL value counts as 1 (the entry is present).
            Some(a) if a.null_count() > 0 => {
                for i in 0..batch.num_rows() {
                    let v = opt_f64(a, i).unwrap_or(1.0);
                    builder.push_covariate(rows[i], covs[i], v);
                }
            }
            Some(a) => builder.push_covariates(rows, covs, Some(&a.values()[..])),
            None => builder.push_covariates(rows, covs, None),
        }
        row0 += batch.num_rows();
    }
    report.covariate_entries = row0;
    Ok((builder, report))
}

/// Read the wide format: one table with outcome columns and one column per covariate.
pub fn read_wide(path: &Path, opts: &ReadOptions) -> Result<(DesignBuilder, ReadReport)> {
    read_wide_from(open_batches(path, opts.batch_size)?, opts)
}

/// Read the wide format from a batch source (file or query result).
pub fn read_wide_from(
    source: BatchSource,
    opts: &ReadOptions,
) -> Result<(DesignBuilder, ReadReport)> {
    let mut builder = DesignBuilder::new();
    if let Some(n) = source.rows() {
        builder.reserve_rows(n);
    }
    let mut report = ReadReport::default();
    let file = source.label().to_string();
    let schema = source.schema.clone();
    let cols = outcome_columns(&schema, opts);
    // NULLs in outcome columns drop the row rather than fail, so nothing is "required" per
    // value; the columns themselves must exist.
    required_outcome_roles(&schema, &cols, opts, &file, false)?;
    let reserved: Vec<usize> = cols.iter().map(|c| c.1).collect();
    let covariate_idx: Vec<usize> = match &opts.covariate_columns {
        Some(names) => names
            .iter()
            .map(|n| {
                let i = find_column(&schema, n).ok_or_else(|| missing_column(&file, n, &schema))?;
                if reserved.contains(&i) {
                    return Err(Error::BadColumn {
                        column: n.clone(),
                        message: "is an outcome column and cannot also be a covariate".into(),
                    });
                }
                Ok(i)
            })
            .collect::<Result<_>>()?,
        None => (0..schema.fields().len())
            .filter(|i| !reserved.contains(i))
            .filter(|&i| {
                let numeric = is_numeric(schema.field(i).data_type());
                if !numeric {
                    report.skipped_columns.push(schema.field(i).name().clone());
                }
                numeric
            })
            .collect(),
    };
    for (k, &i) in covariate_idx.iter().enumerate() {
        let name = schema.field(i).name().clone();
        builder.name_covariate(k as i64 + 1, name.clone());
        report.covariate_columns.push(name);
    }
    let mut row0 = 0;
    for batch in source {
        let batch = batch?;
        let a = OutcomeArrays::convert(&batch, &cols, &file, row0, &[])?;
        let covs: Vec<Float64Array> = covariate_idx
            .iter()
            .map(|&i| {
                let ctx = Ctx {
                    file: &file,
                    column: schema.field(i).name(),
                    row0,
                };
                numbers(batch.column(i), &ctx)
            })
            .collect::<Result<_>>()?;
        for i in 0..batch.num_rows() {
            if a.any_null(i) || covs.iter().any(|c| c.is_null(i)) {
                report.dropped_null_rows += 1;
                continue;
            }
            let row_id = match &a.row_id {
                Some(r) => r.value(i),
                None => (row0 + i + 1) as i64,
            };
            builder.push_outcome(a.record(i, row_id, opts.event_value));
            for (k, c) in covs.iter().enumerate() {
                let v = c.value(i);
                if v != 0.0 {
                    builder.push_covariate(row_id, k as i64 + 1, v);
                    report.covariate_entries += 1;
                }
            }
        }
        row0 += batch.num_rows();
    }
    report.input_rows = row0;
    report.outcome_rows = row0 - report.dropped_null_rows;
    Ok((builder, report))
}

// ---------------------------------------------------------------------------------------------
// Results.

/// The schema of [`result_batch`].
pub fn result_schema() -> SchemaRef {
    let f = |name: &str, nullable: bool| Field::new(name, DataType::Float64, nullable);
    let fields = vec![
        Field::new("covariate_id", DataType::Int64, true),
        Field::new("covariate", DataType::Utf8, false),
        f("estimate", true),
        f("std_error", true),
        f("std_error_model", true),
        f("std_error_robust", true),
        f("ci_lower", true),
        f("ci_upper", true),
        f("exp_estimate", true),
        Field::new("penalized", DataType::Boolean, false),
        Field::new("model", DataType::Utf8, false),
        f("log_likelihood", false),
        f("log_prior", false),
        Field::new("iterations", DataType::Int64, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("notes", DataType::Utf8, true),
        f("seconds", false),
        f("prior_variance", true),
    ];
    let metadata = std::collections::HashMap::from([(
        RESULT_SCHEMA_VERSION_KEY.to_string(),
        RESULT_SCHEMA_VERSION.to_string(),
    )]);
    Arc::new(Schema::new_with_metadata(fields, metadata))
}

/// Schema metadata key of the result table's version ([`RESULT_SCHEMA_VERSION`]).
pub const RESULT_SCHEMA_VERSION_KEY: &str = "epifusion.result_schema";
/// Version of [`result_schema`]: bumped when a column changes meaning or is removed (adding
/// columns at the end does not break readers that select by name).
///
/// Version 3: `estimate` and `exp_estimate` are NULL for an aliased or constant column (R's
/// `NA`); status `no_finite_mle`.
pub const RESULT_SCHEMA_VERSION: &str = "3";

/// The statuses a fit reports in the `status` column: `converged` (the stopping rule was met
/// at a finite optimum), `max_iterations` (stopped at the iteration limit, not converged),
/// `no_finite_mle` (separation or monotone likelihood: some unpenalized coefficients run off to
/// ±∞; the notes name them, they have no standard error or interval, and their estimates are
/// where the optimizer stopped), `ill_conditioned` (non-finite values through every retry); the
/// aggregates add `failed: <error>` for a group whose fit failed. Readers must treat unknown
/// values as "not converged".
pub const STATUSES: &[&str] = &[
    "converged",
    "max_iterations",
    "no_finite_mle",
    "ill_conditioned",
];

/// The result table: one row per coefficient, with the fit-level values repeated.
///
/// Columns: `covariate_id` (NULL for the intercept), `covariate`, `estimate`, `std_error` (the
/// one the interval uses), `std_error_model` (from the observed information),
/// `std_error_robust` (sandwich, where computed), `ci_lower`, `ci_upper`, `exp_estimate` (hazard / rate / odds ratio), `penalized`, `model`,
/// `log_likelihood`, `log_prior`, `iterations`, `status` ([`STATUSES`]), `notes` (what the
/// user must know about the fit: device fallback, dropped rows, …), `seconds`,
/// `prior_variance` (the variance of the prior used — chosen by cross-validation when `cv` was
/// given; NULL without a prior). The schema carries its version
/// ([`RESULT_SCHEMA_VERSION`]). The `GROUP BY` aggregates return the same fields as a list of
/// structs; pipelines write the same table.
pub fn result_batch(r: &FitResult) -> Result<RecordBatch> {
    let c = &r.coefficients;
    let n = c.len();
    let schema = result_schema();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter(c.iter().map(|c| {
            (c.covariate_id != INTERCEPT_ID).then_some(c.covariate_id)
        }))),
        Arc::new(StringArray::from_iter_values(
            c.iter().map(|c| c.name.clone()),
        )),
        Arc::new(Float64Array::from_iter(
            c.iter().map(|c| (!c.aliased).then_some(c.estimate)),
        )),
        Arc::new(Float64Array::from_iter(c.iter().map(|c| c.std_error))),
        Arc::new(Float64Array::from_iter(c.iter().map(|c| c.std_error_model))),
        Arc::new(Float64Array::from_iter(
            c.iter().map(|c| c.std_error_robust),
        )),
        Arc::new(Float64Array::from_iter(c.iter().map(|c| c.ci_lower))),
        Arc::new(Float64Array::from_iter(c.iter().map(|c| c.ci_upper))),
        Arc::new(Float64Array::from_iter(
            c.iter().map(|c| (!c.aliased).then(|| c.estimate.exp())),
        )),
        Arc::new(BooleanArray::from_iter(c.iter().map(|c| Some(c.penalized)))),
        Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
            r.model.name(),
            n,
        ))),
        Arc::new(Float64Array::from_iter_values(std::iter::repeat_n(
            r.log_likelihood,
            n,
        ))),
        Arc::new(Float64Array::from_iter_values(std::iter::repeat_n(
            r.log_prior,
            n,
        ))),
        Arc::new(Int64Array::from_iter_values(std::iter::repeat_n(
            r.iterations as i64,
            n,
        ))),
        Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
            r.status.name(),
            n,
        ))),
        Arc::new(StringArray::from_iter(std::iter::repeat_n(
            notes_text(r),
            n,
        ))),
        Arc::new(Float64Array::from_iter_values(std::iter::repeat_n(
            r.seconds, n,
        ))),
        Arc::new(Float64Array::from_iter(std::iter::repeat_n(
            prior_variance(r),
            n,
        ))),
    ];
    RecordBatch::try_new(schema, columns).map_err(|e| Error::Format(e.to_string()))
}

/// The `notes` column: the fit's notes joined by "; " (NULL when there are none).
pub fn notes_text(r: &FitResult) -> Option<String> {
    (!r.notes.is_empty()).then(|| r.notes.join("; "))
}

/// The variance of the prior used, if any.
pub fn prior_variance(r: &FitResult) -> Option<f64> {
    let v = r.prior.variance();
    v.is_finite().then_some(v)
}

/// Schema of the table chosen by the `table` option.
pub fn table_schema(t: ResultTable) -> SchemaRef {
    let f = |name: &str, nullable: bool| Field::new(name, DataType::Float64, nullable);
    let id = || Field::new("covariate_id", DataType::Int64, true);
    let name = || Field::new("covariate", DataType::Utf8, false);
    match t {
        ResultTable::Coefficients => result_schema(),
        ResultTable::Cv => Arc::new(Schema::new(vec![
            f("variance", false),
            f("mean_log_likelihood", true),
            f("sd_log_likelihood", true),
            Field::new("evaluated", DataType::Boolean, false),
            Field::new("selected", DataType::Boolean, false),
            Field::new("step", DataType::Int64, true),
            Field::new("folds", DataType::Int64, false),
            Field::new("repetitions", DataType::Int64, false),
            Field::new("by", DataType::Utf8, false),
            Field::new("stop_reason", DataType::Utf8, false),
        ])),
        ResultTable::Profile => Arc::new(Schema::new(vec![
            id(),
            name(),
            f("value", false),
            f("exp_value", false),
            f("profile", false),
            f("log_likelihood", false),
            Field::new("is_estimate", DataType::Boolean, false),
        ])),
        ResultTable::Bootstrap => Arc::new(Schema::new(vec![
            id(),
            name(),
            f("estimate", false),
            f("bootstrap_mean", false),
            f("bias", false),
            f("std_error", false),
            f("ci_lower", false),
            f("ci_upper", false),
            f("nonzero_proportion", false),
            Field::new("replicates", DataType::Int64, false),
            Field::new("failed", DataType::Int64, false),
            Field::new("skipped", DataType::Int64, false),
        ])),
        ResultTable::Replicates => Arc::new(Schema::new(vec![
            Field::new("replicate", DataType::Int64, false),
            id(),
            name(),
            f("estimate", false),
        ])),
        ResultTable::Path => Arc::new(Schema::new(vec![
            f("lambda", false),
            id(),
            f("estimate", false),
            f("log_likelihood", false),
            Field::new("non_zero", DataType::Int64, false),
            name(),
            Field::new("step", DataType::Int64, false),
            f("objective", false),
            Field::new("penalized", DataType::Boolean, false),
            Field::new("iterations", DataType::Int64, false),
            Field::new("status", DataType::Utf8, false),
        ])),
    }
}

/// The table chosen by the `table` option for fit `r`.
///
/// `table: path` has one row per (λ, coefficient) for **every** coefficient, zeros included
/// (glmnet's `coef()` matrix, in long form; `WHERE estimate <> 0` keeps the active ones), λ
/// decreasing (`step` 1 is λ_max of a generated grid): `lambda` (our λ: objective
/// LL − λΣ\|β\|, not scaled by n), `covariate_id` (NULL for the intercept), `estimate`,
/// `log_likelihood` and `objective` (LL − λΣ\|β_j\| over the penalized ones) of the point,
/// `non_zero` (its non-zero coefficients, the intercept not counted: glmnet's `df`),
/// `covariate` (name), `step`, `penalized`, `iterations` and `status` of the point's fit.
pub fn table_batch(r: &FitResult, t: ResultTable) -> Result<RecordBatch> {
    let schema = table_schema(t);
    let missing = |what: &str| Error::option("table", format!("the fit has no {what}"));
    let ids = |c: &[epifusion_core::fit::Coefficient]| -> ArrayRef {
        Arc::new(Int64Array::from_iter(c.iter().map(|c| {
            (c.covariate_id != INTERCEPT_ID).then_some(c.covariate_id)
        })))
    };
    let f64s = |v: Vec<f64>| -> ArrayRef { Arc::new(Float64Array::from(v)) };
    let columns: Vec<ArrayRef> = match t {
        ResultTable::Coefficients => return result_batch(r),
        ResultTable::Cv => {
            let cv = r.cv.as_ref().ok_or_else(|| missing("cross-validation"))?;
            struct Row {
                v: f64,
                mean: Option<f64>,
                sd: Option<f64>,
                evaluated: bool,
                step: Option<i64>,
            }
            let mut rows: Vec<Row> = cv
                .curve
                .iter()
                .map(|p| Row {
                    v: p.variance,
                    mean: Some(p.mean),
                    sd: Some(p.sd),
                    evaluated: true,
                    step: Some(p.step as i64),
                })
                .collect();
            if !rows.iter().any(|x| x.v == cv.variance) {
                rows.push(Row {
                    v: cv.variance,
                    mean: None,
                    sd: None,
                    evaluated: false,
                    step: None,
                });
                rows.sort_by(|a, b| a.v.total_cmp(&b.v));
            }
            let n = rows.len();
            vec![
                f64s(rows.iter().map(|x| x.v).collect()),
                Arc::new(Float64Array::from_iter(rows.iter().map(|x| x.mean))),
                Arc::new(Float64Array::from_iter(rows.iter().map(|x| x.sd))),
                Arc::new(BooleanArray::from_iter(
                    rows.iter().map(|x| Some(x.evaluated)),
                )),
                Arc::new(BooleanArray::from_iter(
                    rows.iter().map(|x| Some(x.v == cv.variance)),
                )),
                Arc::new(Int64Array::from_iter(rows.iter().map(|x| x.step))),
                Arc::new(Int64Array::from(vec![cv.folds as i64; n])),
                Arc::new(Int64Array::from(vec![cv.repetitions as i64; n])),
                Arc::new(StringArray::from(vec![cv.by.name(); n])),
                Arc::new(StringArray::from(vec![cv.stop_reason.as_str(); n])),
            ]
        }
        ResultTable::Profile => {
            if r.profiles.is_empty() {
                return Err(missing("likelihood profiles"));
            }
            let mut id = Vec::new();
            let mut name = Vec::new();
            let mut cols: [Vec<f64>; 4] = Default::default();
            let mut est = Vec::new();
            for p in &r.profiles {
                let label = r
                    .coefficient(p.covariate_id)
                    .map_or_else(|| p.covariate_id.to_string(), |c| c.name.clone());
                for q in &p.points {
                    id.push((p.covariate_id != INTERCEPT_ID).then_some(p.covariate_id));
                    name.push(label.clone());
                    cols[0].push(q.value);
                    cols[1].push(q.value.exp());
                    cols[2].push(q.objective);
                    cols[3].push(q.log_likelihood);
                    est.push(Some(q.is_estimate));
                }
            }
            let [a, b, c, d] = cols;
            vec![
                Arc::new(Int64Array::from_iter(id)),
                Arc::new(StringArray::from(name)),
                f64s(a),
                f64s(b),
                f64s(c),
                f64s(d),
                Arc::new(BooleanArray::from_iter(est)),
            ]
        }
        ResultTable::Bootstrap => {
            let b = r.bootstrap.as_ref().ok_or_else(|| missing("bootstrap"))?;
            let c = &r.coefficients;
            let n = c.len();
            let s = &b.coefficients;
            vec![
                ids(c),
                Arc::new(StringArray::from_iter_values(
                    c.iter().map(|c| c.name.clone()),
                )),
                f64s(c.iter().map(|c| c.estimate).collect()),
                f64s(s.iter().map(|x| x.mean).collect()),
                f64s(s.iter().map(|x| x.bias).collect()),
                f64s(s.iter().map(|x| x.std_error).collect()),
                f64s(s.iter().map(|x| x.lower).collect()),
                f64s(s.iter().map(|x| x.upper).collect()),
                f64s(s.iter().map(|x| x.nonzero).collect()),
                Arc::new(Int64Array::from(vec![b.replicates as i64; n])),
                Arc::new(Int64Array::from(vec![b.failed as i64; n])),
                Arc::new(Int64Array::from(vec![b.skipped as i64; n])),
            ]
        }
        ResultTable::Replicates => {
            let b = r.bootstrap.as_ref().ok_or_else(|| missing("bootstrap"))?;
            let c = &r.coefficients;
            let mut rep = Vec::new();
            let mut id = Vec::new();
            let mut name = Vec::new();
            let mut est = Vec::new();
            for (k, e) in b.estimates.iter().enumerate() {
                for (cj, &v) in c.iter().zip(e) {
                    rep.push(k as i64 + 1);
                    id.push((cj.covariate_id != INTERCEPT_ID).then_some(cj.covariate_id));
                    name.push(cj.name.clone());
                    est.push(v);
                }
            }
            vec![
                Arc::new(Int64Array::from(rep)),
                Arc::new(Int64Array::from_iter(id)),
                Arc::new(StringArray::from(name)),
                f64s(est),
            ]
        }
        ResultTable::Path => {
            let path = r
                .path
                .as_ref()
                .ok_or_else(|| missing("regularization path"))?;
            let c = &r.coefficients;
            let rows = path.points.len() * c.len();
            let mut lambda = Vec::with_capacity(rows);
            let mut id = Vec::with_capacity(rows);
            let mut est = Vec::with_capacity(rows);
            let mut ll = Vec::with_capacity(rows);
            let mut nz = Vec::with_capacity(rows);
            let mut name = Vec::with_capacity(rows);
            let mut step = Vec::with_capacity(rows);
            let mut objective = Vec::with_capacity(rows);
            let mut penalized = Vec::with_capacity(rows);
            let mut iterations = Vec::with_capacity(rows);
            let mut status = Vec::with_capacity(rows);
            for (k, q) in path.points.iter().enumerate() {
                for (cj, &b) in c.iter().zip(&q.beta) {
                    lambda.push(q.lambda);
                    id.push((cj.covariate_id != INTERCEPT_ID).then_some(cj.covariate_id));
                    est.push(b);
                    ll.push(q.log_likelihood);
                    nz.push(q.non_zero as i64);
                    name.push(cj.name.as_str());
                    step.push(k as i64 + 1);
                    objective.push(q.log_likelihood + q.log_prior);
                    penalized.push(Some(cj.penalized));
                    iterations.push(q.iterations as i64);
                    status.push(q.status.name());
                }
            }
            vec![
                f64s(lambda),
                Arc::new(Int64Array::from_iter(id)),
                f64s(est),
                f64s(ll),
                Arc::new(Int64Array::from(nz)),
                Arc::new(StringArray::from(name)),
                Arc::new(Int64Array::from(step)),
                f64s(objective),
                Arc::new(BooleanArray::from_iter(penalized)),
                Arc::new(Int64Array::from(iterations)),
                Arc::new(StringArray::from(status)),
            ]
        }
    };
    RecordBatch::try_new(schema, columns).map_err(|e| Error::Format(e.to_string()))
}

/// The result table as JSON: an array of objects, one per coefficient (NULL and non-finite
/// numbers as `null`).
pub fn result_json(r: &FitResult) -> serde_json::Value {
    let rows = r
        .coefficients
        .iter()
        .map(|c| {
            serde_json::json!({
                "covariate_id": (c.covariate_id != INTERCEPT_ID).then_some(c.covariate_id),
                "covariate": c.name,
                "estimate": c.estimate,
                "std_error": c.std_error,
                "ci_lower": c.ci_lower,
                "ci_upper": c.ci_upper,
                "exp_estimate": c.estimate.exp(),
                "penalized": c.penalized,
                "model": r.model.name(),
                "log_likelihood": r.log_likelihood,
                "log_prior": r.log_prior,
                "iterations": r.iterations,
                "status": r.status.name(),
                "seconds": r.seconds,
                "prior_variance": prior_variance(r),
            })
        })
        .collect();
    serde_json::Value::Array(rows)
}

/// Write the result table to `path`: `.csv`, `.json` or `.parquet` by extension.
pub fn write_result(r: &FitResult, path: &Path) -> Result<()> {
    write_batch(&result_batch(r)?, path)
}

/// Write one batch to `path`: `.csv`, `.json` (an array of objects) or `.parquet` by
/// extension. The file is written beside the target and renamed into place, so a failure never
/// leaves a half-written file under the requested name.
pub fn write_batch(batch: &RecordBatch, path: &Path) -> Result<()> {
    let file_name = path.display().to_string();
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    if !matches!(ext.as_str(), "csv" | "json" | "parquet" | "pq") {
        return Err(Error::option(
            "output",
            format!("unknown file type `.{ext}` of {file_name}; expected .csv, .json or .parquet"),
        ));
    }
    let io = |source| Error::Io {
        path: file_name.clone(),
        source,
    };
    let tmp = path.with_file_name(format!(
        ".{}.partial",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("output")
    ));
    let file = File::create(&tmp).map_err(io)?;
    let written = match ext.as_str() {
        "json" => (|| {
            let rows = crate::shell::batch_to_json(batch).map_err(|e| format_err(&file_name, e))?;
            let mut w = std::io::BufWriter::new(file);
            serde_json::to_writer_pretty(&mut w, &rows).map_err(|e| format_err(&file_name, e))?;
            std::io::Write::flush(&mut w).map_err(|e| format_err(&file_name, e))
        })(),
        "csv" => {
            let mut w = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(std::io::BufWriter::new(file));
            w.write(batch).map_err(|e| format_err(&file_name, e))
        }
        _ => (|| {
            let mut w = ArrowWriter::try_new(file, batch.schema(), None)
                .map_err(|e| format_err(&file_name, e))?;
            w.write(batch).map_err(|e| format_err(&file_name, e))?;
            w.close().map_err(|e| format_err(&file_name, e))?;
            Ok(())
        })(),
    };
    match written {
        Ok(()) => std::fs::rename(&tmp, path).map_err(io),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

fn fmt_num(v: Option<f64>) -> String {
    match v {
        None => "".into(),
        Some(v) if !v.is_finite() => v.to_string(),
        Some(v) if v != 0.0 && (v.abs() >= 1e6 || v.abs() < 1e-4) => format!("{v:.5e}"),
        Some(v) => format!("{v:.6}"),
    }
}

/// A plain-text table of the coefficients for the terminal.
pub fn format_result_table(r: &FitResult) -> String {
    let header = [
        "covariate",
        "id",
        "estimate",
        "exp_estimate",
        "std_error",
        "ci_lower",
        "ci_upper",
        "penalized",
    ];
    let rows: Vec<[String; 8]> = r
        .coefficients
        .iter()
        .map(|c| {
            [
                c.name.clone(),
                if c.covariate_id == INTERCEPT_ID {
                    String::new()
                } else {
                    c.covariate_id.to_string()
                },
                fmt_num(Some(c.estimate)),
                fmt_num(Some(c.estimate.exp())),
                fmt_num(c.std_error),
                fmt_num(c.ci_lower),
                fmt_num(c.ci_upper),
                if c.penalized { "yes" } else { "no" }.into(),
            ]
        })
        .collect();
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: &[String], out: &mut String| {
        for (k, (cell, w)) in cells.iter().zip(&width).enumerate() {
            if k > 0 {
                out.push_str("  ");
            }
            let pad = w - cell.chars().count();
            if k == 0 {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            } else {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            }
        }
        out.push('\n');
    };
    line(&header.map(String::from), &mut out);
    for row in &rows {
        line(row, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use epifusion_core::model::design::DesignMatrix;
    use std::path::PathBuf;

    /// A fresh directory under the system temp dir.
    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "epifusion-convert-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn write_parquet(path: &Path, batch: &RecordBatch) {
        let f = File::create(path).unwrap();
        let mut w = ArrowWriter::try_new(f, batch.schema(), None).unwrap();
        w.write(batch).unwrap();
        w.close().unwrap();
    }

    fn same_design(a: &DesignMatrix, b: &DesignMatrix) {
        assert_eq!(a.rows.row_id, b.rows.row_id);
        assert_eq!(a.rows.stratum, b.rows.stratum);
        assert_eq!(a.rows.stratum_ids, b.rows.stratum_ids);
        assert_eq!(a.rows.time, b.rows.time);
        assert_eq!(a.rows.y, b.rows.y);
        assert_eq!(a.n_cols(), b.n_cols());
        for (x, y) in a.columns.iter().zip(&b.columns) {
            assert_eq!(
                (x.id, x.format, &x.rows, &x.values),
                (y.id, y.format, &y.rows, &y.values)
            );
        }
    }

    /// Covariate batches (pushed a batch at a time) build what the entries pushed one by one
    /// build: with values, with a NULL value (counted as 1), without a value column, and in two
    /// batches.
    #[test]
    fn covariate_batches_build_what_single_entries_build() {
        let outcome_schema = Arc::new(Schema::new(vec![
            Field::new("row_id", DataType::Int64, false),
            Field::new("stratum_id", DataType::Int64, false),
            Field::new("time", DataType::Float64, false),
            Field::new("y", DataType::Float64, false),
        ]));
        let outcomes = || {
            let batch = RecordBatch::try_new(
                outcome_schema.clone(),
                vec![
                    Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                    Arc::new(Int64Array::from(vec![10, 10, 20, 20])),
                    Arc::new(Float64Array::from(vec![5.0, 3.0, 7.5, 2.0])),
                    Arc::new(Float64Array::from(vec![1.0, 0.0, 1.0, 0.0])),
                ],
            )
            .unwrap();
            BatchSource::from_batches("o", outcome_schema.clone(), vec![batch])
        };
        let rows = [1i64, 2, 3, 1, 4, 3];
        let covs = [100i64, 100, 200, 200, 100, 300];
        let values = [Some(1.0), Some(0.5), None, Some(2.0), Some(0.0), Some(3.0)];
        let expected = |with_values: bool| {
            let (mut b, _) = read_long_from(
                outcomes(),
                BatchSource::from_batches(
                    "none",
                    Arc::new(Schema::new(vec![
                        Field::new("row_id", DataType::Int64, false),
                        Field::new("covariate_id", DataType::Int64, false),
                    ])),
                    vec![],
                ),
                &ReadOptions::default(),
            )
            .unwrap();
            for ((&row, &cov), v) in rows.iter().zip(&covs).zip(&values) {
                let v = if with_values { v.unwrap_or(1.0) } else { 1.0 };
                b.push_covariate(row, cov, v);
            }
            b.build().unwrap()
        };
        for (with_values, nulls, cut) in [
            (true, false, 6),
            (true, true, 6),
            (false, false, 6),
            (true, true, 2),
            (false, false, 3),
        ] {
            let mut fields = vec![
                Field::new("row_id", DataType::Int64, false),
                Field::new("covariate_id", DataType::Int64, false),
            ];
            if with_values {
                fields.push(Field::new("covariate_value", DataType::Float64, true));
            }
            let schema = Arc::new(Schema::new(fields));
            let batch = |r: std::ops::Range<usize>| {
                let mut cols: Vec<ArrayRef> = vec![
                    Arc::new(Int64Array::from(rows[r.clone()].to_vec())),
                    Arc::new(Int64Array::from(covs[r.clone()].to_vec())),
                ];
                if with_values {
                    let v: Vec<Option<f64>> = values[r]
                        .iter()
                        .map(|v| if nulls { *v } else { Some(v.unwrap_or(1.0)) })
                        .collect();
                    cols.push(Arc::new(Float64Array::from(v)));
                }
                RecordBatch::try_new(schema.clone(), cols).unwrap()
            };
            let batches = vec![batch(0..cut), batch(cut..rows.len())];
            let (b, rep) = read_long_from(
                outcomes(),
                BatchSource::from_batches("c", schema.clone(), batches),
                &ReadOptions::default(),
            )
            .unwrap();
            assert_eq!(rep.covariate_entries, rows.len());
            same_design(&b.build().unwrap(), &expected(with_values));
        }
    }

    const OUTCOMES: &str = "row_id,stratum_id,time,y\n1,10,5,1\n2,10,3,0\n3,20,7.5,1\n";
    const COVARIATES: &str =
        "row_id,covariate_id,covariate_value\n1,100,1\n2,100,1\n3,200,2.5\n1,200,1\n";

    #[test]
    fn csv_and_parquet_give_the_same_design() {
        let dir = temp_dir("same");
        let oc = write(&dir, "o.csv", OUTCOMES);
        let cc = write(&dir, "c.csv", COVARIATES);
        let opts = ReadOptions::default();
        let (b, rep) = read_long(&oc, &cc, &opts).unwrap();
        assert_eq!(rep.outcome_rows, 3);
        assert_eq!(rep.covariate_entries, 4);
        let from_csv = b.build().unwrap();

        // Parquet with camelCase names, Int32 ids, Float64 whole-number covariate ids and a
        // NULL covariateValue (→ default 1).
        let o = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("rowId", DataType::Int32, false),
                Field::new("stratumId", DataType::Int64, false),
                Field::new("time", DataType::Float32, false),
                Field::new("y", DataType::Int32, false),
            ])),
            vec![
                Arc::new(arrow::array::Int32Array::from(vec![1, 2, 3])),
                Arc::new(Int64Array::from(vec![10, 10, 20])),
                Arc::new(arrow::array::Float32Array::from(vec![5.0, 3.0, 7.5])),
                Arc::new(arrow::array::Int32Array::from(vec![1, 0, 1])),
            ],
        )
        .unwrap();
        let c = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("rowId", DataType::Int64, false),
                Field::new("covariateId", DataType::Float64, false),
                Field::new("covariateValue", DataType::Float64, true),
            ])),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3, 1])),
                Arc::new(Float64Array::from(vec![100.0, 100.0, 200.0, 200.0])),
                Arc::new(Float64Array::from(vec![
                    Some(1.0),
                    None,
                    Some(2.5),
                    Some(1.0),
                ])),
            ],
        )
        .unwrap();
        let op = dir.join("o.parquet");
        let cp = dir.join("c.parquet");
        write_parquet(&op, &o);
        write_parquet(&cp, &c);
        // Small batches force several batches per file.
        let opts = ReadOptions {
            batch_size: 2,
            ..Default::default()
        };
        let (b, _) = read_long(&op, &cp, &opts).unwrap();
        let from_parquet = b.build().unwrap();
        same_design(&from_csv, &from_parquet);
        assert_eq!(from_csv.columns[1].format.name(), "sparse");
        // Parquet knows its row count (the readers reserve room), CSV does not; a wrong count
        // is only a hint: every row is read either way.
        assert_eq!(open_batches(&op, 2).unwrap().rows(), Some(3));
        assert_eq!(open_batches(&oc, 2).unwrap().rows(), None);
        for hint in [None, Some(0), Some(1), Some(1000)] {
            let batches = |p: &Path| open_batches(p, 2).unwrap().collect::<Result<Vec<_>>>();
            let source = |p: &Path| {
                let b = batches(p).unwrap();
                let all = BatchSource::from_batches("t", b[0].schema(), b.clone());
                assert_eq!(all.rows(), Some(b.iter().map(RecordBatch::num_rows).sum()));
                BatchSource::from_iter("t", b[0].schema(), b.into_iter().map(Ok)).with_rows(hint)
            };
            let (b, rep) = read_long_from(source(&op), source(&cp), &opts).unwrap();
            assert_eq!(rep.outcome_rows, 3, "row count hint {hint:?}");
            same_design(&from_csv, &b.build().unwrap());
        }
        assert_eq!(from_csv.rows.stratum_ids, vec![10, 20]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn camel_case_csv_without_value_column() {
        let dir = temp_dir("camel");
        let oc = write(&dir, "o.csv", "rowId,stratumId,time,y\n1,1,2,1\n2,1,3,0\n");
        let cc = write(&dir, "c.csv", "rowId,covariateId\n1,7\n2,7\n2,9\n");
        let (b, _) = read_long(&oc, &cc, &ReadOptions::default()).unwrap();
        let x = b.build().unwrap();
        assert!(x.rows.has_strata);
        assert_eq!(x.columns.len(), 2);
        assert_eq!(x.columns[0].rows, vec![0, 1]);
        assert_eq!(x.columns[0].format.name(), "indicator");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_null_in_an_optional_column_reads_as_its_default() {
        // A NULL weight, offset or cluster sends the batch down the row-by-row path; written
        // out as the default, the batch goes column by column: the designs are the same.
        let dir = temp_dir("optional-null");
        let cc = write(&dir, "c.csv", "row_id,covariate_id\n1,7\n3,7\n");
        let with_null = write(
            &dir,
            "o1.csv",
            "row_id,stratum_id,time,y,weight,offset,cluster_id\n1,1,2,1,2,0.5,4\n2,1,3,0,,0.25,\n3,2,4,1,1,,4\n",
        );
        let written = write(
            &dir,
            "o2.csv",
            "row_id,stratum_id,time,y,weight,offset,cluster_id\n1,1,2,1,2,0.5,4\n2,1,3,0,1,0.25,5\n3,2,4,1,1,0,4\n",
        );
        let read = |o: &std::path::Path| {
            let (b, _) = read_long(o, &cc, &ReadOptions::default()).unwrap();
            b.build().unwrap()
        };
        let (a, b) = (read(&with_null), read(&written));
        same_design(&a, &b);
        assert_eq!(a.rows.weight, b.rows.weight);
        assert_eq!(a.rows.offset, b.rows.offset);
        // The NULL cluster is a cluster of its own, like the written 5.
        assert_eq!(a.rows.cluster, b.rows.cluster);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn null_in_required_column_names_file_column_and_row() {
        let dir = temp_dir("null");
        let oc = write(&dir, "o.csv", "row_id,time,y\n1,2,1\n2,,0\n");
        let cc = write(&dir, "c.csv", "row_id,covariate_id\n1,7\n");
        let e = read_long(&oc, &cc, &ReadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`time`") && e.contains("row 2") && e.contains("o.csv"),
            "{e}"
        );
        // A NULL covariate id.
        let oc = write(&dir, "o2.csv", "row_id,time,y\n1,2,1\n2,3,0\n");
        let cc = write(&dir, "c2.csv", "row_id,covariate_id\n1,7\n2,\n");
        let e = read_long(&oc, &cc, &ReadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("covariate_id") && e.contains("row 2") && e.contains("c2.csv"),
            "{e}"
        );
        // A missing column, and time not required (logistic).
        let oc = write(&dir, "o3.csv", "row_id,y\n1,1\n2,0\n");
        let e = read_long(&oc, &cc, &ReadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("`time`") && e.contains("not found"), "{e}");
        let cc = write(&dir, "c3.csv", "row_id,covariate_id\n1,7\n");
        let opts = ReadOptions {
            require_time: false,
            ..Default::default()
        };
        assert!(read_long(&oc, &cc, &opts).is_ok());
        // Fractional ids are an error.
        let cc = write(&dir, "c4.csv", "row_id,covariate_id\n1,7.5\n");
        let e = read_long(&oc, &cc, &opts).unwrap_err().to_string();
        assert!(e.contains("not a whole number"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn wide_form_drops_null_rows_and_recodes_events() {
        let dir = temp_dir("wide");
        let p = write(
            &dir,
            "lung.csv",
            "inst,futime,status,age,sex,wt.loss,name\n\
             3,306,2,74,1,,a\n\
             3,455,2,68,1,15,b\n\
             ,1010,1,56,2,15,c\n\
             5,210,2,57,0,11,d\n",
        );
        let opts = ReadOptions {
            time_column: Some("futime".into()),
            y_column: Some("status".into()),
            event_value: Some(2.0),
            ..Default::default()
        };
        let (b, rep) = read_wide(&p, &opts).unwrap();
        assert_eq!(rep.input_rows, 4);
        assert_eq!(rep.dropped_null_rows, 2);
        assert_eq!(rep.outcome_rows, 2);
        assert_eq!(rep.covariate_columns, vec!["inst", "age", "sex", "wt.loss"]);
        assert_eq!(rep.skipped_columns, vec!["name"]);
        let x = b.build().unwrap();
        assert_eq!(x.rows.row_id, vec![2, 4]);
        assert_eq!(x.rows.y, vec![1.0, 1.0]);
        assert_eq!(x.rows.time, vec![455.0, 210.0]);
        assert_eq!(x.columns[2].name.as_deref(), Some("sex"));
        assert_eq!(x.columns[2].rows, vec![0]); // sex = 0 in row 4 is not stored

        // Picking columns: only NULLs in used columns drop rows.
        let opts = ReadOptions {
            covariate_columns: Some(vec!["age".into(), "sex".into()]),
            ..opts
        };
        let (b, rep) = read_wide(&p, &opts).unwrap();
        assert_eq!(rep.dropped_null_rows, 0);
        let x = b.build().unwrap();
        assert_eq!(x.n_rows(), 4);
        assert_eq!(x.rows.y, vec![1.0, 1.0, 0.0, 1.0]);
        assert_eq!(
            x.columns.iter().map(|c| c.id).collect::<Vec<_>>(),
            vec![1, 2]
        );
        // Unknown covariate column.
        let opts = ReadOptions {
            covariate_columns: Some(vec!["bmi".into()]),
            ..opts
        };
        let e = read_wide(&p, &opts).unwrap_err().to_string();
        assert!(e.contains("`bmi`") && e.contains("not found"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn na_text_is_null_and_bad_extension_is_an_error() {
        let dir = temp_dir("na");
        let p = write(&dir, "w.csv", "time,y,x\n1,1,NA\n2,0,3\n");
        let (b, rep) = read_wide(
            &p,
            &ReadOptions {
                covariate_columns: Some(vec!["x".into()]),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(rep.dropped_null_rows, 1);
        assert_eq!(b.n_outcomes(), 1);
        let q = write(&dir, "w.txt", "time,y\n");
        let e = read_wide(&q, &ReadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains(".txt"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn dummy_result() -> FitResult {
        use epifusion_core::fit::{CiMethod, Coefficient};
        use epifusion_core::model::ccd::FitStatus;
        use epifusion_core::model::ModelKind;
        FitResult {
            model: ModelKind::Cox,
            coefficients: vec![
                Coefficient {
                    covariate_id: 1,
                    name: "age".into(),
                    estimate: 0.5,
                    std_error: Some(0.1),
                    std_error_model: Some(0.1),
                    std_error_robust: None,
                    ci_lower: Some(0.3),
                    ci_upper: None,
                    penalized: false,
                    aliased: false,
                },
                Coefficient {
                    covariate_id: 2,
                    name: "2".into(),
                    estimate: 0.0,
                    std_error: None,
                    std_error_model: None,
                    std_error_robust: None,
                    ci_lower: None,
                    ci_upper: None,
                    penalized: true,
                    aliased: false,
                },
            ],
            log_likelihood: -10.5,
            log_prior: -1.0,
            iterations: 4,
            status: FitStatus::Converged,
            coordinate_updates: 8,
            seconds: 0.01,
            fit_seconds: 0.005,
            objective_trace: vec![],
            n_rows: 10,
            n_strata: 1,
            ci: CiMethod::Wald,
            device: "cpu".into(),
            device_note: None,
            notes: Vec::new(),
            gpu: None,
            prior: epifusion_core::model::prior::Prior::None,
            cv: None,
            bootstrap: None,
            profiles: Vec::new(),
            path: None,
        }
    }

    /// `table: path`: one row per (λ, coefficient), zeros included, in the documented columns.
    #[test]
    fn path_table_has_a_row_per_lambda_and_coefficient() {
        use epifusion_core::model::ccd::FitStatus;
        use epifusion_core::model::path::{PathPoint, PathResult};
        let mut r = dummy_result();
        let point = |lambda: f64, b: f64| PathPoint {
            lambda,
            beta: vec![0.5, b],
            log_likelihood: -10.0 - lambda,
            log_prior: -lambda * b.abs(),
            non_zero: 1 + usize::from(b != 0.0),
            iterations: 3,
            status: FitStatus::Converged,
            strong_set: 1,
            kkt_refits: 0,
        };
        r.path = Some(PathResult {
            lambda_max: 4.0,
            min_ratio: Some(0.5),
            strong_rule: true,
            points: vec![point(4.0, 0.0), point(2.0, -0.25)],
            coordinate_updates: 10,
            seconds: 0.0,
        });
        let b = table_batch(&r, ResultTable::Path).unwrap();
        assert_eq!(b.num_rows(), 4);
        let names: Vec<String> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(
            names[..5],
            [
                "lambda",
                "covariate_id",
                "estimate",
                "log_likelihood",
                "non_zero"
            ]
        );
        assert_eq!(b.schema(), table_schema(ResultTable::Path));
        let f = |name: &str| {
            b.column_by_name(name)
                .unwrap()
                .as_any()
                .downcast_ref::<Float64Array>()
                .unwrap()
                .values()
                .to_vec()
        };
        let i = |name: &str| {
            b.column_by_name(name)
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        };
        assert_eq!(f("lambda"), [4.0, 4.0, 2.0, 2.0]);
        assert_eq!(i("covariate_id"), [1, 2, 1, 2]);
        assert_eq!(f("estimate"), [0.5, 0.0, 0.5, -0.25]);
        assert_eq!(i("non_zero"), [1, 1, 2, 2]);
        assert_eq!(i("step"), [1, 1, 2, 2]);
        assert_eq!(f("objective")[3], -12.0 - 0.5);
    }

    #[test]
    fn results_round_trip_through_every_format() {
        let dir = temp_dir("out");
        let r = dummy_result();
        for ext in ["csv", "json", "parquet"] {
            let p = dir.join(format!("r.{ext}"));
            write_result(&r, &p).unwrap();
            assert!(std::fs::metadata(&p).unwrap().len() > 0);
        }
        // CSV and Parquet read back with the same values.
        let csv: Vec<RecordBatch> = open_batches(&dir.join("r.csv"), 100)
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        let pq: Vec<RecordBatch> = open_batches(&dir.join("r.parquet"), 100)
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        for b in [&csv[0], &pq[0]] {
            assert_eq!(b.num_rows(), 2);
            let est = b.column_by_name("exp_estimate").unwrap();
            let est = cast_with_options(est, &DataType::Float64, &CastOptions::default()).unwrap();
            let est = est.as_any().downcast_ref::<Float64Array>().unwrap();
            assert!((est.value(0) - 0.5f64.exp()).abs() < 1e-12);
        }
        assert!(pq[0].column_by_name("ci_upper").unwrap().is_null(0));
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
        assert_eq!(json[0]["covariate"], "age");
        assert!(json[1]["std_error"].is_null());
        assert_eq!(json[1]["status"], "converged");
        assert!(write_result(&r, &dir.join("r.xlsx")).is_err());
        // Nothing half-written is left beside the outputs.
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".partial")), "{names:?}");
        // Tables the fit does not have are clear errors.
        let e = table_batch(&r, ResultTable::Cv).unwrap_err().to_string();
        assert!(e.contains("table") && e.contains("cross-validation"), "{e}");
        let e = table_batch(&r, ResultTable::Path).unwrap_err().to_string();
        assert!(e.contains("table") && e.contains("path"), "{e}");
        let table = format_result_table(&r);
        assert!(
            table.contains("age") && table.contains("1.648721"),
            "{table}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

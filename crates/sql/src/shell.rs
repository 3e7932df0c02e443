//! The `epifusion sql` front end: run `;`-separated statements, print or write the results,
//! and an interactive shell with line editing and history.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::{exec_datafusion_err, plan_err, Result as DfResult};
use datafusion::dataframe::DataFrameWriteOptions;
use datafusion::prelude::SessionContext;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// Aligned text table.
    #[default]
    Table,
    /// CSV with a header.
    Csv,
    /// One JSON object per row, in an array.
    Json,
}

impl OutputFormat {
    /// Parse `table`, `csv` or `json`.
    pub fn parse(s: &str) -> epifusion_core::Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "table" => Ok(OutputFormat::Table),
            "csv" => Ok(OutputFormat::Csv),
            "json" => Ok(OutputFormat::Json),
            other => Err(epifusion_core::Error::option(
                "format",
                format!("unknown `{other}`; expected table, csv or json"),
            )),
        }
    }
}

/// Split SQL text into statements at `;` outside quotes and comments.
pub fn split_statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = sql.chars().peekable();
    let (mut single, mut double) = (false, false);
    while let Some(c) = chars.next() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '-' if !single && !double && chars.peek() == Some(&'-') => {
                // line comment
                for c2 in chars.by_ref() {
                    if c2 == '\n' {
                        break;
                    }
                }
                cur.push('\n');
                continue;
            }
            ';' if !single && !double => {
                if !cur.trim().is_empty() {
                    out.push(cur.trim().to_string());
                }
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// Format batches as text.
pub fn format_batches(batches: &[RecordBatch], format: OutputFormat) -> DfResult<String> {
    match format {
        OutputFormat::Table => Ok(pretty_format_batches(batches)?.to_string()),
        OutputFormat::Csv => {
            let mut buf = Vec::new();
            {
                let mut w = datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(&mut buf);
                for b in batches {
                    w.write(b)?;
                }
            }
            String::from_utf8(buf).map_err(|e| exec_datafusion_err!("{e}"))
        }
        OutputFormat::Json => {
            let mut rows = Vec::new();
            for b in batches {
                rows.extend(batch_to_json(b)?);
            }
            serde_json::to_string_pretty(&rows).map_err(|e| exec_datafusion_err!("{e}"))
        }
    }
}

/// The rows of `b` as JSON objects (integers, floats, booleans as JSON values, non-finite
/// floats and NULL as `null`, everything else as text).
pub fn batch_to_json(b: &RecordBatch) -> DfResult<Vec<serde_json::Value>> {
    use datafusion::arrow::datatypes::{Float64Type, Int64Type};
    use serde_json::Value;
    let options = FormatOptions::default();
    let mut rows = vec![serde_json::Map::new(); b.num_rows()];
    for (field, col) in b.schema().fields().iter().zip(b.columns()) {
        let dt = col.data_type();
        // Integers, floats and booleans as JSON numbers / booleans, everything else as text.
        let value: Box<dyn Fn(usize) -> Value> = if dt.is_integer() {
            let c = cast(col, &DataType::Int64)?
                .as_primitive::<Int64Type>()
                .clone();
            Box::new(move |r| c.value(r).into())
        } else if dt.is_floating() {
            let c = cast(col, &DataType::Float64)?
                .as_primitive::<Float64Type>()
                .clone();
            Box::new(move |r| {
                serde_json::Number::from_f64(c.value(r)).map_or(Value::Null, Value::Number)
            })
        } else if *dt == DataType::Boolean {
            let c = col.as_boolean().clone();
            Box::new(move |r| c.value(r).into())
        } else {
            let fmt = ArrayFormatter::try_new(col.as_ref(), &options)?;
            let texts: Vec<String> = (0..col.len()).map(|r| fmt.value(r).to_string()).collect();
            Box::new(move |r| texts[r].clone().into())
        };
        let nulls = col.logical_nulls();
        for (r, row) in rows.iter_mut().enumerate() {
            let v = if nulls.as_ref().is_some_and(|n| n.is_null(r)) {
                Value::Null
            } else {
                value(r)
            };
            row.insert(field.name().clone(), v);
        }
    }
    Ok(rows.into_iter().map(serde_json::Value::Object).collect())
}

/// Run `sql` (one or more `;`-separated statements). The last statement's result is printed
/// to `out` in `format`, or written to `output` (Parquet when it ends in `.parquet`, CSV for
/// `.csv`, newline-delimited JSON for `.json`). Earlier statements' results are printed too.
pub async fn run_sql(
    ctx: &SessionContext,
    sql: &str,
    format: OutputFormat,
    output: Option<&Path>,
    out: &mut dyn Write,
) -> DfResult<()> {
    let statements = split_statements(sql);
    if statements.is_empty() {
        return plan_err!("no SQL statement given");
    }
    let last = statements.len() - 1;
    for (i, stmt) in statements.iter().enumerate() {
        let df = ctx.sql(stmt).await?;
        if i == last {
            if let Some(path) = output {
                return write_output(df, path).await;
            }
        }
        let batches = df.collect().await?;
        if batches.iter().all(|b| b.num_columns() == 0) {
            continue;
        }
        let text = format_batches(&batches, format)?;
        writeln!(out, "{text}").map_err(|e| exec_datafusion_err!("{e}"))?;
    }
    Ok(())
}

async fn write_output(df: datafusion::dataframe::DataFrame, path: &Path) -> DfResult<()> {
    let p = path.to_string_lossy().to_string();
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let opts = DataFrameWriteOptions::new().with_single_file_output(true);
    match ext.as_str() {
        "parquet" => {
            df.write_parquet(&p, opts, None).await?;
        }
        "csv" => {
            df.write_csv(&p, opts, None).await?;
        }
        "json" => {
            // Newline-delimited JSON (one object per row), as DataFusion and most tools read it.
            let batches = df.collect().await?;
            let mut text = String::new();
            for b in &batches {
                for row in batch_to_json(b)? {
                    text.push_str(&row.to_string());
                    text.push('\n');
                }
            }
            std::fs::write(path, text)
                .map_err(|e| exec_datafusion_err!("cannot write {p}: {e}"))?;
        }
        other => {
            return plan_err!(
                "--output {p}: unknown extension `.{other}`; expected .parquet, .csv or .json"
            )
        }
    }
    Ok(())
}

/// The interactive shell: line editing, history in `~/.epifusion_history`, statements end at `;`.
pub async fn interactive(ctx: Arc<SessionContext>, format: OutputFormat) -> DfResult<()> {
    use rustyline::error::ReadlineError;
    let mut rl = rustyline::DefaultEditor::new().map_err(|e| exec_datafusion_err!("{e}"))?;
    let history = std::env::var_os("HOME").map(|h| Path::new(&h).join(".epifusion_history"));
    if let Some(h) = &history {
        let _ = rl.load_history(h);
    }
    println!(
        "epifusion SQL shell — statements end with `;`, \\q quits. Functions: {}",
        crate::session::function_names().join(", ")
    );
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() {
            "epifusion> "
        } else {
            "        -> "
        };
        match rl.readline(prompt) {
            Ok(line) => {
                let t = line.trim();
                if buffer.is_empty() && (t == "\\q" || t == "quit" || t == "exit") {
                    break;
                }
                buffer.push_str(&line);
                buffer.push('\n');
                if t.ends_with(';') {
                    let _ = rl.add_history_entry(buffer.trim());
                    let mut stdout = std::io::stdout();
                    if let Err(e) = run_sql(&ctx, &buffer, format, None, &mut stdout).await {
                        eprintln!("error: {e}");
                    }
                    buffer.clear();
                }
            }
            Err(ReadlineError::Interrupted) => buffer.clear(),
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(exec_datafusion_err!("{e}")),
        }
    }
    if let Some(h) = &history {
        let _ = rl.save_history(h);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_statements() {
        let s = split_statements("select 1; select ';' -- x;\n; select \"a;b\" from t;");
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!(s[1], "select ';'");
    }
}

//! Runs the sqllogictest-style files in `tests/sql/*.slt` against an epifusion session.
//!
//! Supported records (a subset of the sqllogictest format, blank-line separated):
//!
//! ```text
//! statement ok | statement error <substring>
//! <sql>
//!
//! query <column types> [rowsort] | query error <substring>
//! <sql>
//! ----
//! <expected rows: cells separated by one space, NULL for nulls>
//! ```
//!
//! `# ...` lines are comments. Set `EPIFUSION_SLT_COMPLETE=1` to print the actual results of
//! every failing query (review them before copying anything into a file).

use std::path::{Path, PathBuf};

use datafusion::arrow::array::Array;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use epifusion::engine::session::{new_session, SessionOptions};

#[derive(Debug)]
enum Record {
    Statement {
        sql: String,
        error: Option<String>,
        line: usize,
    },
    Query {
        sql: String,
        rowsort: bool,
        error: Option<String>,
        expected: Vec<String>,
        line: usize,
    },
}

fn parse(text: &str) -> Vec<Record> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if line.is_empty() || line.starts_with('#') {
            i += 1;
            continue;
        }
        let header_line = i + 1;
        let header: Vec<&str> = line.split_whitespace().collect();
        i += 1;
        let mut sql = Vec::new();
        while i < lines.len() && !lines[i].trim().is_empty() && lines[i].trim() != "----" {
            sql.push(lines[i]);
            i += 1;
        }
        let sql = sql.join("\n");
        let error_of = |h: &[&str]| -> Option<String> {
            (h.get(1) == Some(&"error")).then(|| h[2..].join(" "))
        };
        match header.first() {
            Some(&"statement") => out.push(Record::Statement {
                sql,
                error: error_of(&header),
                line: header_line,
            }),
            Some(&"query") => {
                let error = error_of(&header);
                let rowsort = header.contains(&"rowsort");
                let mut expected = Vec::new();
                if i < lines.len() && lines[i].trim() == "----" {
                    i += 1;
                    while i < lines.len() && !lines[i].trim().is_empty() {
                        expected.push(lines[i].trim_end().to_string());
                        i += 1;
                    }
                }
                out.push(Record::Query {
                    sql,
                    rowsort,
                    error,
                    expected,
                    line: header_line,
                });
            }
            other => panic!("line {header_line}: unknown record {other:?}"),
        }
    }
    out
}

fn format_rows(batches: &[datafusion::arrow::record_batch::RecordBatch]) -> Vec<String> {
    let opts = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for b in batches {
        let fmts: Vec<_> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts).expect("formatter"))
            .collect();
        for r in 0..b.num_rows() {
            let cells: Vec<String> = fmts
                .iter()
                .zip(b.columns())
                .map(|(f, c)| {
                    let s = f.value(r).to_string();
                    if s.is_empty() && !c.is_null(r) {
                        "(empty)".to_string()
                    } else {
                        s
                    }
                })
                .collect();
            rows.push(cells.join(" "));
        }
    }
    rows
}

async fn run_file(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("read slt");
    let ctx = new_session(&SessionOptions::default())
        .await
        .expect("session");
    let mut failures = Vec::new();
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    for rec in parse(&text) {
        match rec {
            Record::Statement { sql, error, line } => {
                let res = match ctx.sql(&sql).await {
                    Ok(df) => df.collect().await.map(|_| ()),
                    Err(e) => Err(e),
                };
                match (res, error) {
                    (Ok(()), None) => {}
                    (Err(e), Some(want)) if e.to_string().contains(&want) => {}
                    (Ok(()), Some(want)) => failures.push(format!(
                        "{name}:{line}: expected error containing `{want}`, statement succeeded"
                    )),
                    (Err(e), want) => failures.push(format!(
                        "{name}:{line}: unexpected error (wanted {want:?}): {e}"
                    )),
                }
            }
            Record::Query {
                sql,
                rowsort,
                error,
                expected,
                line,
            } => {
                let res = match ctx.sql(&sql).await {
                    Ok(df) => df.collect().await,
                    Err(e) => Err(e),
                };
                match (res, error) {
                    (Ok(batches), None) => {
                        let mut got = format_rows(&batches);
                        let mut want = expected.clone();
                        if rowsort {
                            got.sort();
                            want.sort();
                        }
                        if got != want {
                            failures.push(format!(
                                "{name}:{line}: result differs\n  expected:\n    {}\n  got:\n    {}",
                                want.join("\n    "),
                                got.join("\n    ")
                            ));
                        }
                    }
                    (Err(e), Some(want)) if e.to_string().contains(&want) => {}
                    (Ok(_), Some(want)) => failures.push(format!(
                        "{name}:{line}: expected error containing `{want}`, query succeeded"
                    )),
                    (Err(e), want) => failures.push(format!(
                        "{name}:{line}: unexpected error (wanted {want:?}): {e}"
                    )),
                }
            }
        }
    }
    failures
}

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sql");
    std::env::set_current_dir(env!("CARGO_MANIFEST_DIR")).expect("cd to the package root");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/sql")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut failed = 0;
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        if filter
            .as_ref()
            .is_some_and(|flt| !name.contains(flt.as_str()))
        {
            continue;
        }
        let failures = rt.block_on(run_file(f));
        if failures.is_empty() {
            println!("sqllogictest {name} ... ok");
        } else {
            failed += 1;
            println!("sqllogictest {name} ... FAILED");
            for m in failures {
                println!("{m}");
            }
        }
    }
    if failed > 0 {
        eprintln!("{failed} sqllogictest file(s) failed");
        std::process::exit(1);
    }
}

//! The sparse design matrix: row metadata plus CSC columns.
//!
//! Built from the Cyclops-compatible long format (DESIGN.md §4): one outcome record per row
//! (`row_id`, optional `stratum_id`, `time`, `y`, optional `weight`, `start_time`, `offset`,
//! `censor_weight`) and covariate entries `(row_id, covariate_id, covariate_value)`.
//!
//! Columns are stored in one of three formats:
//!
//! | format | stores | used when |
//! |---|---|---|
//! | [`ColumnFormat::Indicator`] | sorted row indices only (value 1) | every value seen is 1 |
//! | [`ColumnFormat::Sparse`] | sorted row indices + values | some value ≠ 1 |
//! | [`ColumnFormat::Dense`] | one value per row | requested explicitly (e.g. the intercept) |
//!
//! A column is promoted from indicator to sparse the first time a value other than 1 appears.
//! Zeros are dropped. Columns are ordered by covariate id, rows keep the order of the outcome
//! records; models that need another order (Cox sorts by time) build their own permutation.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::error::{Error, Result};

/// Storage format of one column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnFormat {
    /// 0/1 column: row indices only.
    Indicator,
    /// Row indices and values.
    Sparse,
    /// A value for every row.
    Dense,
}

impl ColumnFormat {
    /// Lower-case name used in result tables.
    pub fn name(self) -> &'static str {
        match self {
            ColumnFormat::Indicator => "indicator",
            ColumnFormat::Sparse => "sparse",
            ColumnFormat::Dense => "dense",
        }
    }
}

/// One covariate column.
#[derive(Debug, Clone)]
pub struct Column {
    /// Covariate id (`covariate_id` of the long format).
    pub id: i64,
    /// Optional human-readable name (wide input, intercept).
    pub name: Option<String>,
    /// Storage format.
    pub format: ColumnFormat,
    /// Sorted row indices (indicator and sparse); empty for dense.
    pub rows: Vec<u32>,
    /// Values: per entry (sparse), per row (dense), empty (indicator).
    pub values: Vec<f64>,
}

impl Column {
    /// Number of stored entries (nnz; `n_rows` for dense columns).
    pub fn nnz(&self) -> usize {
        match self.format {
            ColumnFormat::Dense => self.values.len(),
            _ => self.rows.len(),
        }
    }

    /// Iterate `(row index, value)` over the stored entries in increasing row order.
    pub fn entries(&self) -> ColumnEntries<'_> {
        ColumnEntries { col: self, pos: 0 }
    }

    /// Value at the `k`-th stored entry.
    #[inline]
    pub fn entry(&self, k: usize) -> (usize, f64) {
        match self.format {
            ColumnFormat::Indicator => (self.rows[k] as usize, 1.0),
            ColumnFormat::Sparse => (self.rows[k] as usize, self.values[k]),
            ColumnFormat::Dense => (k, self.values[k]),
        }
    }

    /// The column as a dense vector of length `n_rows`.
    pub fn to_dense(&self, n_rows: usize) -> Vec<f64> {
        let mut out = vec![0.0; n_rows];
        for (i, v) in self.entries() {
            out[i] = v;
        }
        out
    }

    /// Σ x² over the column (used for the default CV starting variance).
    pub fn sum_squares(&self) -> f64 {
        self.entries().map(|(_, v)| v * v).sum()
    }

    /// Display name: the given name, or the id.
    pub fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.id.to_string())
    }
}

/// Iterator over a column's stored entries.
pub struct ColumnEntries<'a> {
    col: &'a Column,
    pos: usize,
}

impl Iterator for ColumnEntries<'_> {
    type Item = (usize, f64);
    #[inline]
    fn next(&mut self) -> Option<(usize, f64)> {
        if self.pos >= self.col.nnz() {
            return None;
        }
        let e = self.col.entry(self.pos);
        self.pos += 1;
        Some(e)
    }
}

/// Per-row outcome data. All vectors have length `n_rows`.
#[derive(Debug, Clone, Default)]
pub struct Rows {
    /// The caller's row ids.
    pub row_id: Vec<i64>,
    /// Dense stratum index per row (0-based, in order of first appearance); all 0 when unstratified.
    pub stratum: Vec<u32>,
    /// The caller's stratum ids, indexed by dense stratum index.
    pub stratum_ids: Vec<i64>,
    /// Whether a stratum column was supplied.
    pub has_strata: bool,
    /// Time (survival time, stop time, or SCCS interval length); 1 when absent.
    pub time: Vec<f64>,
    /// Start of a counting-process (start, stop] row.
    pub start_time: Option<Vec<f64>>,
    /// Outcome.
    pub y: Vec<f64>,
    /// Case weight.
    pub weight: Option<Vec<f64>>,
    /// Offset added to the linear predictor.
    pub offset: Option<Vec<f64>>,
    /// Supplied Fine–Gray censoring weight G(T−) (otherwise the engine computes it).
    pub censor_weight: Option<Vec<f64>>,
}

/// A validated design matrix (row data + CSC columns).
#[derive(Debug, Clone)]
pub struct DesignMatrix {
    /// Row metadata.
    pub rows: Rows,
    /// Covariate columns ordered by covariate id.
    pub columns: Vec<Column>,
    /// Covariate entries dropped because their row id had no outcome row.
    pub dropped_unknown: usize,
}

impl DesignMatrix {
    /// Number of rows.
    pub fn n_rows(&self) -> usize {
        self.rows.row_id.len()
    }
    /// Number of columns.
    pub fn n_cols(&self) -> usize {
        self.columns.len()
    }
    /// Number of strata.
    pub fn n_strata(&self) -> usize {
        self.rows.stratum_ids.len().max(1)
    }
    /// Total stored entries.
    pub fn nnz(&self) -> usize {
        self.columns.iter().map(Column::nnz).sum()
    }
    /// Bytes used by the CSC storage (indices + values).
    pub fn csc_bytes(&self) -> usize {
        self.columns
            .iter()
            .map(|c| c.rows.len() * 4 + c.values.len() * 8)
            .sum()
    }
    /// Weight of row `i` (1 when no weights).
    #[inline]
    pub fn weight(&self, i: usize) -> f64 {
        self.rows.weight.as_ref().map_or(1.0, |w| w[i])
    }
    /// Offset of row `i` (0 when none).
    #[inline]
    pub fn offset(&self, i: usize) -> f64 {
        self.rows.offset.as_ref().map_or(0.0, |o| o[i])
    }
    /// Index of the column with covariate id `id`.
    pub fn column_index(&self, id: i64) -> Option<usize> {
        self.columns.binary_search_by_key(&id, |c| c.id).ok()
    }

    /// Add a dense column of ones (the intercept) in front of the others, with id
    /// [`INTERCEPT_ID`] and name `(Intercept)`.
    pub fn with_intercept(mut self) -> Self {
        let n = self.n_rows();
        self.columns.insert(0, Column::intercept(n));
        self
    }

    /// Whether the first column is the intercept.
    pub fn has_intercept(&self) -> bool {
        self.columns.first().map(|c| c.id) == Some(INTERCEPT_ID)
    }

    /// Borrow every column as a [`ColumnSource`].
    pub fn column_source(&self) -> ColumnSource<'_> {
        ColumnSource(self.columns.iter().map(Cow::Borrowed).collect())
    }

    /// Move the columns out (leaving the row data) as an owned [`ColumnSource`].
    pub fn take_columns(&mut self) -> ColumnSource<'static> {
        ColumnSource(
            std::mem::take(&mut self.columns)
                .into_iter()
                .map(Cow::Owned)
                .collect(),
        )
    }

    /// `(id, name)` of every column, in order.
    pub fn column_labels(&self) -> Vec<ColumnLabel> {
        self.columns
            .iter()
            .map(|c| ColumnLabel {
                id: c.id,
                name: c.display_name(),
            })
            .collect()
    }
}

impl Column {
    /// The intercept: a dense column of `n_rows` ones with id [`INTERCEPT_ID`].
    pub fn intercept(n_rows: usize) -> Column {
        Column {
            id: INTERCEPT_ID,
            name: Some("(Intercept)".into()),
            format: ColumnFormat::Dense,
            rows: Vec::new(),
            values: vec![1.0; n_rows],
        }
    }
}

/// Id and display name of a column (what a fit result needs once the columns are gone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnLabel {
    /// Covariate id.
    pub id: i64,
    /// Display name ([`Column::display_name`]).
    pub name: String,
}

/// The columns a likelihood is built from: borrowed from a [`DesignMatrix`] or owned. Owned
/// columns are dropped one by one as the likelihood converts them, so the design's CSC storage
/// and the likelihood's own copy never both exist in full (DESIGN.md §10).
#[derive(Debug, Default)]
pub struct ColumnSource<'a>(Vec<Cow<'a, Column>>);

impl<'a> ColumnSource<'a> {
    /// Number of columns.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Whether there are no columns.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Iterate the columns.
    pub fn iter(&self) -> impl Iterator<Item = &Column> {
        self.0.iter().map(|c| c.as_ref())
    }
    /// Put `col` in front (the intercept).
    pub fn prepend(mut self, col: Column) -> Self {
        self.0.insert(0, Cow::Owned(col));
        self
    }
    /// Convert every column with `f`, in parallel, keeping the order; an owned column is
    /// dropped as soon as it is converted. Deterministic: `f` sees each column alone.
    pub fn par_map<T: Send>(self, f: impl Fn(&Column) -> T + Sync + Send) -> Vec<T> {
        use rayon::prelude::*;
        self.0
            .into_par_iter()
            .map(|c| {
                let out = f(&c);
                drop(c);
                out
            })
            .collect()
    }
    /// [`Self::par_map`] on the calling thread only.
    pub fn map<T>(self, mut f: impl FnMut(&Column) -> T) -> Vec<T> {
        self.0.into_iter().map(|c| f(&c)).collect()
    }
}

/// Covariate id given to the intercept column (Cyclops calls it `(Intercept)`).
pub const INTERCEPT_ID: i64 = i64::MIN;

/// One outcome record of the long format.
#[derive(Debug, Clone, Copy, Default)]
pub struct OutcomeRecord {
    /// Row id (unique).
    pub row_id: i64,
    /// Stratum id (case for SCCS, matched set, …).
    pub stratum_id: Option<i64>,
    /// Time (> 0 where the model requires it).
    pub time: Option<f64>,
    /// Outcome.
    pub y: f64,
    /// Case weight (≥ 0).
    pub weight: Option<f64>,
    /// Counting-process start time.
    pub start_time: Option<f64>,
    /// Offset.
    pub offset: Option<f64>,
    /// Supplied censoring weight (Fine–Gray).
    pub censor_weight: Option<f64>,
}

/// Accumulates the long format and builds a [`DesignMatrix`].
///
/// ```
/// use epifusion::model::design::{DesignBuilder, OutcomeRecord};
/// let mut b = DesignBuilder::new();
/// b.push_outcome(OutcomeRecord { row_id: 1, time: Some(5.0), y: 1.0, ..Default::default() });
/// b.push_outcome(OutcomeRecord { row_id: 2, time: Some(3.0), y: 0.0, ..Default::default() });
/// b.push_covariate(1, 1000, 1.0);
/// b.push_covariate(2, 1000, 2.5);
/// let x = b.build().unwrap();
/// assert_eq!(x.n_rows(), 2);
/// assert_eq!(x.columns[0].format.name(), "sparse");
/// ```
#[derive(Debug, Default)]
pub struct DesignBuilder {
    outcomes: Vec<OutcomeRecord>,
    covariates: Vec<(i64, i64, f64)>,
    names: HashMap<i64, String>,
    drop_unknown_rows: bool,
}

impl DesignBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }
    /// Drop covariate entries whose row id has no outcome row (counted in
    /// [`DesignMatrix::dropped_unknown`]) instead of failing.
    pub fn drop_unknown_rows(&mut self, yes: bool) -> &mut Self {
        self.drop_unknown_rows = yes;
        self
    }
    /// Add one outcome row.
    pub fn push_outcome(&mut self, rec: OutcomeRecord) {
        self.outcomes.push(rec);
    }
    /// Add one covariate entry. Zero values are skipped at build time.
    pub fn push_covariate(&mut self, row_id: i64, covariate_id: i64, value: f64) {
        self.covariates.push((row_id, covariate_id, value));
    }
    /// Give a covariate a display name.
    pub fn name_covariate(&mut self, covariate_id: i64, name: impl Into<String>) {
        self.names.insert(covariate_id, name.into());
    }
    /// Number of outcome rows so far.
    pub fn n_outcomes(&self) -> usize {
        self.outcomes.len()
    }

    /// Validate and build. Checks: at least one row; unique row ids; finite `time`, `y`,
    /// `weight` (≥ 0), `start_time` (< time), `offset`, `censor_weight` (in (0, 1]); finite
    /// covariate values; no duplicate (row_id, covariate_id); covariate row ids known (or
    /// dropped with a count). Model-specific checks (time > 0, y domain) are done by
    /// [`crate::model::ModelKind::check_rows`].
    pub fn build(self) -> Result<DesignMatrix> {
        let n = self.outcomes.len();
        if n == 0 {
            return Err(Error::Empty("no outcome rows".into()));
        }
        if n > u32::MAX as usize {
            return Err(Error::Empty("more than 2^32 rows are not supported".into()));
        }
        let any = |f: fn(&OutcomeRecord) -> bool| self.outcomes.iter().any(f);
        let all = |f: fn(&OutcomeRecord) -> bool| self.outcomes.iter().all(f);
        let has_strata = any(|r| r.stratum_id.is_some());
        let has_weight = any(|r| r.weight.is_some());
        let has_start = any(|r| r.start_time.is_some());
        let has_offset = any(|r| r.offset.is_some());
        let has_cw = any(|r| r.censor_weight.is_some());
        if has_strata && !all(|r| r.stratum_id.is_some()) {
            let (i, r) = first(&self.outcomes, |r| r.stratum_id.is_none());
            return Err(bad(
                i,
                r.row_id,
                "stratum_id",
                "is NULL while other rows have a stratum",
            ));
        }
        if has_start && !all(|r| r.start_time.is_some()) {
            let (i, r) = first(&self.outcomes, |r| r.start_time.is_none());
            return Err(bad(
                i,
                r.row_id,
                "start_time",
                "is NULL while other rows have one",
            ));
        }
        if has_cw && !all(|r| r.censor_weight.is_some()) {
            let (i, r) = first(&self.outcomes, |r| r.censor_weight.is_none());
            return Err(bad(
                i,
                r.row_id,
                "censor_weight",
                "is NULL while other rows have one",
            ));
        }

        let mut rows = Rows {
            row_id: Vec::with_capacity(n),
            stratum: Vec::with_capacity(n),
            has_strata,
            time: Vec::with_capacity(n),
            y: Vec::with_capacity(n),
            ..Default::default()
        };
        let mut weight = Vec::new();
        let mut start = Vec::new();
        let mut offset = Vec::new();
        let mut cw = Vec::new();
        let mut stratum_index: HashMap<i64, u32> = HashMap::new();
        let mut row_index: HashMap<i64, u32> = HashMap::with_capacity(n);
        for (i, r) in self.outcomes.iter().enumerate() {
            if row_index.insert(r.row_id, i as u32).is_some() {
                return Err(Error::DuplicateRow { row_id: r.row_id });
            }
            let time = r.time.unwrap_or(1.0);
            finite(i, r.row_id, "time", time)?;
            finite(i, r.row_id, "y", r.y)?;
            rows.row_id.push(r.row_id);
            rows.time.push(time);
            rows.y.push(r.y);
            let s = match r.stratum_id {
                Some(id) => {
                    let next = stratum_index.len() as u32;
                    *stratum_index.entry(id).or_insert_with(|| {
                        rows.stratum_ids.push(id);
                        next
                    })
                }
                None => 0,
            };
            rows.stratum.push(s);
            if has_weight {
                let w = r.weight.unwrap_or(1.0);
                finite(i, r.row_id, "weight", w)?;
                if w < 0.0 {
                    return Err(bad(i, r.row_id, "weight", format!("is negative ({w})")));
                }
                weight.push(w);
            }
            if has_start {
                let s = r.start_time.unwrap_or(0.0);
                finite(i, r.row_id, "start_time", s)?;
                if s >= time {
                    return Err(bad(
                        i,
                        r.row_id,
                        "start_time",
                        format!("({s}) is not before time ({time})"),
                    ));
                }
                start.push(s);
            }
            if has_offset {
                let o = r.offset.unwrap_or(0.0);
                finite(i, r.row_id, "offset", o)?;
                offset.push(o);
            }
            if has_cw {
                let c = r.censor_weight.unwrap_or(1.0);
                finite(i, r.row_id, "censor_weight", c)?;
                if !(c > 0.0 && c <= 1.0) {
                    return Err(bad(
                        i,
                        r.row_id,
                        "censor_weight",
                        format!("({c}) is not in (0, 1]"),
                    ));
                }
                cw.push(c);
            }
        }
        if !has_strata {
            rows.stratum_ids.push(0);
        }
        rows.weight = has_weight.then_some(weight);
        rows.start_time = has_start.then_some(start);
        rows.offset = has_offset.then_some(offset);
        rows.censor_weight = has_cw.then_some(cw);

        // Covariates: map to row indices, sort by (covariate, row), detect duplicates.
        let mut entries: Vec<(i64, u32, f64)> = Vec::with_capacity(self.covariates.len());
        let mut unknown = 0usize;
        let mut first_unknown = 0i64;
        for &(row_id, cov, v) in &self.covariates {
            match row_index.get(&row_id) {
                Some(&ri) => {
                    if !v.is_finite() {
                        return Err(Error::BadValue {
                            row: ri as usize,
                            row_id,
                            column: "covariate_value".into(),
                            message: format!("covariate {cov} has non-finite value {v}"),
                        });
                    }
                    entries.push((cov, ri, v));
                }
                None => {
                    if unknown == 0 {
                        first_unknown = row_id;
                    }
                    unknown += 1;
                }
            }
        }
        if unknown > 0 && !self.drop_unknown_rows {
            return Err(Error::UnknownRow {
                count: unknown,
                first_row_id: first_unknown,
            });
        }
        entries.sort_unstable_by_key(|&(c, r, _)| (c, r));
        let mut columns: Vec<Column> = Vec::new();
        let mut k = 0;
        while k < entries.len() {
            let cov = entries[k].0;
            let mut end = k;
            while end < entries.len() && entries[end].0 == cov {
                end += 1;
            }
            let slice = &entries[k..end];
            for w in slice.windows(2) {
                if w[0].1 == w[1].1 {
                    return Err(Error::DuplicateCovariate {
                        row_id: rows.row_id[w[0].1 as usize],
                        covariate_id: cov,
                    });
                }
            }
            let indicator = slice.iter().all(|e| e.2 == 1.0 || e.2 == 0.0);
            let kept = slice.iter().filter(|e| e.2 != 0.0);
            let mut col = Column {
                id: cov,
                name: self.names.get(&cov).cloned(),
                format: if indicator {
                    ColumnFormat::Indicator
                } else {
                    ColumnFormat::Sparse
                },
                rows: Vec::new(),
                values: Vec::new(),
            };
            for e in kept {
                col.rows.push(e.1);
                if !indicator {
                    col.values.push(e.2);
                }
            }
            columns.push(col);
            k = end;
        }
        // Named covariates with no entries still get an (empty) column so the user sees them.
        for (&id, name) in &self.names {
            if columns.binary_search_by_key(&id, |c| c.id).is_err() {
                let pos = columns.partition_point(|c| c.id < id);
                columns.insert(
                    pos,
                    Column {
                        id,
                        name: Some(name.clone()),
                        format: ColumnFormat::Indicator,
                        rows: Vec::new(),
                        values: Vec::new(),
                    },
                );
            }
        }
        Ok(DesignMatrix {
            rows,
            columns,
            dropped_unknown: unknown,
        })
    }
}

fn first(v: &[OutcomeRecord], f: fn(&OutcomeRecord) -> bool) -> (usize, &OutcomeRecord) {
    v.iter()
        .enumerate()
        .find(|(_, r)| f(r))
        .expect("caller checked that a match exists")
}

fn bad(row: usize, row_id: i64, column: &str, message: impl Into<String>) -> Error {
    Error::BadValue {
        row,
        row_id,
        column: column.into(),
        message: message.into(),
    }
}

fn finite(row: usize, row_id: i64, column: &str, v: f64) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(bad(row, row_id, column, format!("is not finite ({v})")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(row_id: i64, time: f64, y: f64) -> OutcomeRecord {
        OutcomeRecord {
            row_id,
            time: Some(time),
            y,
            ..Default::default()
        }
    }

    #[test]
    fn indicator_promoted_to_sparse() {
        let mut b = DesignBuilder::new();
        b.push_outcome(rec(10, 1.0, 1.0));
        b.push_outcome(rec(11, 2.0, 0.0));
        b.push_covariate(11, 7, 1.0);
        b.push_covariate(10, 7, 1.0);
        b.push_covariate(10, 3, 2.0);
        let x = b.build().unwrap();
        assert_eq!(x.columns.len(), 2);
        assert_eq!(x.columns[0].id, 3);
        assert_eq!(x.columns[0].format, ColumnFormat::Sparse);
        assert_eq!(x.columns[1].format, ColumnFormat::Indicator);
        assert_eq!(x.columns[1].rows, vec![0, 1]);
    }

    #[test]
    fn duplicate_covariate_is_an_error() {
        let mut b = DesignBuilder::new();
        b.push_outcome(rec(1, 1.0, 1.0));
        b.push_covariate(1, 5, 1.0);
        b.push_covariate(1, 5, 1.0);
        let e = b.build().unwrap_err().to_string();
        assert!(
            e.contains("row_id 1") && e.contains("covariate_id 5"),
            "{e}"
        );
    }

    #[test]
    fn unknown_rows_error_or_dropped() {
        let mut b = DesignBuilder::new();
        b.push_outcome(rec(1, 1.0, 1.0));
        b.push_covariate(2, 5, 1.0);
        assert!(matches!(
            b.build(),
            Err(Error::UnknownRow {
                count: 1,
                first_row_id: 2
            })
        ));
        let mut b = DesignBuilder::new();
        b.drop_unknown_rows(true);
        b.push_outcome(rec(1, 1.0, 1.0));
        b.push_covariate(2, 5, 1.0);
        assert_eq!(b.build().unwrap().dropped_unknown, 1);
    }

    #[test]
    fn bad_values_name_row_and_column() {
        let mut b = DesignBuilder::new();
        b.push_outcome(rec(1, 1.0, 1.0));
        b.push_outcome(rec(2, f64::NAN, 1.0));
        let e = b.build().unwrap_err().to_string();
        assert!(
            e.contains("row 1") && e.contains("row_id 2") && e.contains("`time`"),
            "{e}"
        );
        assert!(matches!(DesignBuilder::new().build(), Err(Error::Empty(_))));
        let mut b = DesignBuilder::new();
        b.push_outcome(rec(1, 1.0, 1.0));
        b.push_outcome(rec(1, 1.0, 1.0));
        assert!(matches!(b.build(), Err(Error::DuplicateRow { row_id: 1 })));
    }
}

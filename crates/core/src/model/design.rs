//! The sparse design matrix: row metadata plus CSC columns.
//!
//! Built from the Cyclops-compatible long format (DESIGN.md §4): one outcome record per row
//! (`row_id`, optional `stratum_id`, `time`, `y`, optional `weight`, `start_time`, `offset`,
//! `censor_weight`) and covariate entries `(row_id, covariate_id, covariate_value)`. Cluster ids
//! for robust variances are set on the built matrix ([`DesignMatrix::set_clusters`]).
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
use std::hash::{BuildHasherDefault, Hasher};

pub use super::row_values::{RowIds, Strata, Values};
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

/// Per-row outcome data. All columns have length `n_rows`; row ids, strata, times and
/// outcomes are stored compactly ([`super::row_values`]).
#[derive(Debug, Clone, Default)]
pub struct Rows {
    /// The caller's row ids.
    pub row_id: RowIds,
    /// Dense stratum index per row (0-based, in order of first appearance); all 0 when unstratified.
    pub stratum: Strata,
    /// The caller's stratum ids, indexed by dense stratum index.
    pub stratum_ids: Vec<i64>,
    /// Whether a stratum column was supplied.
    pub has_strata: bool,
    /// Time (survival time, stop time, or SCCS interval length); 1 when absent.
    pub time: Values,
    /// Start of a counting-process (start, stop] row.
    pub start_time: Option<Vec<f64>>,
    /// Outcome.
    pub y: Values,
    /// Case weight.
    pub weight: Option<Vec<f64>>,
    /// Offset added to the linear predictor.
    pub offset: Option<Vec<f64>>,
    /// Supplied Fine–Gray censoring weight G(T−) (otherwise the engine computes it).
    pub censor_weight: Option<Vec<f64>>,
    /// Cluster id per row for robust variances (`coxph(..., cluster = )`); `None`: every row
    /// is its own cluster (every stratum, for SCCS and conditional logistic regression). Set
    /// with [`DesignMatrix::set_clusters`].
    pub cluster: Option<Vec<i64>>,
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

    /// Set the cluster id of every row (in row order) for robust variances
    /// ([`crate::model::robust`]); an error when the length is not the number of rows.
    pub fn set_clusters(&mut self, cluster: Vec<i64>) -> Result<()> {
        if cluster.len() != self.n_rows() {
            return Err(Error::BadColumn {
                column: "cluster_id".into(),
                message: format!("{} cluster ids for {} rows", cluster.len(), self.n_rows()),
            });
        }
        self.rows.cluster = Some(cluster);
        Ok(())
    }

    /// Whether the first column is the intercept.
    pub fn has_intercept(&self) -> bool {
        self.columns.first().map(|c| c.id) == Some(INTERCEPT_ID)
    }

    /// The same rows and column ids (and names) with no entries: every column an empty 0/1
    /// column. For the fold plan of [`crate::model::cv::cross_validate_on`], which reads the
    /// rows and the ids alone once the likelihood holds its own copy of the columns; never a
    /// design to fit.
    pub fn without_entries(&self) -> DesignMatrix {
        DesignMatrix {
            rows: self.rows.clone(),
            columns: self
                .columns
                .iter()
                .map(|c| Column {
                    id: c.id,
                    name: c.name.clone(),
                    format: ColumnFormat::Indicator,
                    rows: Vec::new(),
                    values: Vec::new(),
                })
                .collect(),
            dropped_unknown: self.dropped_unknown,
        }
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

    /// A new design of the rows `rows[k]` (k = 0, 1, …; a row may repeat, as in a bootstrap
    /// sample) with every column. `strata[k]`, when given, is the dense stratum index of output
    /// row k (a bootstrap by stratum gives each drawn copy of a stratum its own stratum); the
    /// new strata get ids 0, 1, … in that case. Otherwise output rows keep their strata, which
    /// are renumbered densely in order of first appearance and keep their ids. Row ids, times,
    /// outcomes, weights, offsets and censoring weights are copied.
    pub fn subset_rows(&self, rows: &[u32], strata: Option<&[u32]>) -> DesignMatrix {
        let n_out = rows.len();
        let src = &self.rows;
        let pick_f64 = |v: &Vec<f64>| -> Vec<f64> { rows.iter().map(|&r| v[r as usize]).collect() };
        let (stratum, stratum_ids) = match strata {
            Some(s) => {
                let n_s = s.iter().map(|&x| x as usize + 1).max().unwrap_or(0);
                (s.iter().copied().collect(), (0..n_s as i64).collect())
            }
            None => {
                let mut map: HashMap<u32, u32> = HashMap::new();
                let mut ids = Vec::new();
                let src_stratum = src.stratum.as_u32();
                let st = rows
                    .iter()
                    .map(|&r| {
                        let old = src_stratum[r as usize];
                        *map.entry(old).or_insert_with(|| {
                            ids.push(src.stratum_ids.get(old as usize).copied().unwrap_or(0));
                            (ids.len() - 1) as u32
                        })
                    })
                    .collect();
                (st, ids)
            }
        };
        let new_rows = Rows {
            row_id: src.row_id.pick(rows),
            stratum,
            stratum_ids,
            has_strata: src.has_strata || strata.is_some(),
            time: src.time.pick(rows),
            start_time: src.start_time.as_ref().map(pick_f64),
            y: src.y.pick(rows),
            weight: src.weight.as_ref().map(pick_f64),
            offset: src.offset.as_ref().map(pick_f64),
            censor_weight: src.censor_weight.as_ref().map(pick_f64),
            cluster: src
                .cluster
                .as_ref()
                .map(|c| rows.iter().map(|&r| c[r as usize]).collect()),
        };
        // Output positions of every source row (CSR), in increasing output order.
        let n_src = self.n_rows();
        let mut start = vec![0u32; n_src + 1];
        for &r in rows {
            start[r as usize + 1] += 1;
        }
        for i in 0..n_src {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut positions = vec![0u32; n_out];
        for (k, &r) in rows.iter().enumerate() {
            positions[fill[r as usize] as usize] = k as u32;
            fill[r as usize] += 1;
        }
        let monotone = rows.windows(2).all(|w| w[0] <= w[1]);
        let columns = self
            .columns
            .iter()
            .map(|c| {
                if c.format == ColumnFormat::Dense {
                    return Column {
                        id: c.id,
                        name: c.name.clone(),
                        format: ColumnFormat::Dense,
                        rows: Vec::new(),
                        values: rows.iter().map(|&r| c.values[r as usize]).collect(),
                    };
                }
                let mut entries: Vec<(u32, f64)> = Vec::new();
                for (r, v) in c.entries() {
                    let (a, b) = (start[r] as usize, start[r + 1] as usize);
                    entries.extend(positions[a..b].iter().map(|&p| (p, v)));
                }
                if !monotone {
                    entries.sort_unstable_by_key(|e| e.0);
                }
                Column {
                    id: c.id,
                    name: c.name.clone(),
                    format: c.format,
                    rows: entries.iter().map(|e| e.0).collect(),
                    values: if c.format == ColumnFormat::Sparse {
                        entries.iter().map(|e| e.1).collect()
                    } else {
                        Vec::new()
                    },
                }
            })
            .collect();
        DesignMatrix {
            rows: new_rows,
            columns,
            dropped_unknown: 0,
        }
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
    /// [`Self::par_map`] with each column handed over (owned or borrowed), so that `f` can
    /// reuse an owned column's storage.
    pub fn par_map_owned<T: Send>(self, f: impl Fn(Cow<'a, Column>) -> T + Sync + Send) -> Vec<T> {
        use rayon::prelude::*;
        self.0.into_par_iter().map(f).collect()
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
    /// Cluster id for robust variances (`coxph(..., cluster = )`). Rows without one are
    /// clusters of their own (every stratum, for SCCS and conditional logistic regression,
    /// when no row has one).
    pub cluster_id: Option<i64>,
}

/// Outcome rows given column by column ([`DesignBuilder::push_outcomes`]): a record batch's
/// columns without NULLs. Every slice has the length of `row_id`; `None` is a column that is
/// absent (as `None` in every [`OutcomeRecord`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct OutcomeSlices<'a> {
    /// Row ids (unique).
    pub row_id: &'a [i64],
    /// Stratum ids.
    pub stratum_id: Option<&'a [i64]>,
    /// Times.
    pub time: Option<&'a [f64]>,
    /// Outcomes.
    pub y: &'a [f64],
    /// Case weights.
    pub weight: Option<&'a [f64]>,
    /// Counting-process start times.
    pub start_time: Option<&'a [f64]>,
    /// Offsets.
    pub offset: Option<&'a [f64]>,
    /// Supplied censoring weights.
    pub censor_weight: Option<&'a [f64]>,
    /// Cluster ids.
    pub cluster_id: Option<&'a [i64]>,
}

/// Accumulates the long format and builds a [`DesignMatrix`].
///
/// Memory: outcomes are stored column by column (no per-row records), and covariate entries go
/// straight into per-covariate columns as u32 row indices (plus values only once a column sees
/// a value other than 0 or 1), so the builder holds about one copy of the final CSC storage.
/// Row ids are resolved when the entry is pushed (arithmetically for consecutive ids, by binary
/// search for increasing ids, else through a hash map), and stratum ids likewise (binary
/// search while they increase in order of first appearance, as in input sorted by stratum, else
/// a hash map; at 1e6 SCCS cases the search instead of the map cut the builder's peak RSS from
/// 200 to 140 MiB; a new id after the last one is appended without searching). Entries whose
/// row id is not known yet (covariates pushed before their outcome) are kept aside and resolved
/// by [`Self::build`]. [`Self::push_covariates`] pushes a run of entries of one covariate (a
/// table grouped by covariate) at once when all its row ids are among consecutive ids pushed
/// so far, with the same result as pushing them one by one.
///
/// ```
/// use epifusion_core::model::design::{DesignBuilder, OutcomeRecord};
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
    outcomes: OutcomeColumns,
    row_lookup: RowLookup,
    /// First row (index) whose row id repeats an earlier one.
    first_duplicate_row: Option<usize>,
    /// Covariate id → index into `columns` (ids from [`SMALL_IDS`] on, or negative).
    column_index: IdMap<u32>,
    /// The last entry's column (id, index): entries grouped by covariate skip the map.
    last_column: Option<(i64, u32)>,
    /// Covariate id → index + 1 (0: none yet) for ids below [`SMALL_IDS`]: entries in row order
    /// switch column at every entry, and a table lookup is cheaper than the map's.
    small_column: Vec<u32>,
    columns: Vec<ColumnAcc>,
    /// Entries whose row id was unknown when pushed: (row id, covariate id, value, push number).
    pending: Vec<(i64, i64, f64, u64)>,
    /// First non-finite value among entries with a known row: (push number, error).
    first_non_finite: Option<(u64, Error)>,
    n_pushed: u64,
    names: HashMap<i64, String>,
    drop_unknown_rows: bool,
}

/// Hasher of integer ids (the splitmix64 finalizer). The builder's maps take millions of i64
/// keys, for which std's SipHash costs more than the table lookups; the maps only translate
/// ids to indices (their iteration order is never used), so a fixed, fast hash is enough.
///
/// Also used for keys made of integers (`epifusion-sql`'s interval patterns: slices of
/// `(id, bits)` pairs), for the same reason.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        let mut z = (x ^ self.0.rotate_left(31)).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        self.0 = z ^ (z >> 31);
    }
    #[inline]
    fn write_i64(&mut self, x: i64) {
        self.write_u64(x as u64);
    }
    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

/// Covariate ids below this are looked up in a table by [`DesignBuilder`] (256 KiB once used).
const SMALL_IDS: i64 = 1 << 16;

/// A map keyed by integer ids ([`IdHasher`]).
pub(crate) type IdMap<V> = HashMap<i64, V, BuildHasherDefault<IdHasher>>;

/// Outcome records stored column by column.
#[derive(Debug, Default)]
struct OutcomeColumns {
    row_id: RowIds,
    /// `time`, 1 when absent.
    time: Values,
    y: Values,
    /// Dense stratum index (in order of first appearance), once a row has a stratum.
    stratum: Option<Strata>,
    /// First row without a stratum.
    stratum_first_missing: Option<usize>,
    stratum_ids: Vec<i64>,
    /// Stratum id → index, once the ids stop increasing in order of first appearance; until
    /// then `stratum_ids` is sorted and searched (no map: a million cases would cost ~34 MiB).
    stratum_index: Option<IdMap<u32>>,
    /// The last row's stratum (id, index): grouped input skips the lookup.
    last_stratum: Option<(i64, u32)>,
    weight: OptionalColumn<f64>,
    start_time: OptionalColumn<f64>,
    offset: OptionalColumn<f64>,
    censor_weight: OptionalColumn<f64>,
    /// Dense cluster index (in order of first appearance); rows without one get `u32::MAX`.
    cluster: OptionalColumn<u32>,
    cluster_index: IdMap<u32>,
}

impl OutcomeColumns {
    /// Dense index of stratum `id`, a new one (the next) when it is first seen.
    fn stratum_of(&mut self, id: i64) -> u32 {
        let next = self.stratum_ids.len() as u32;
        let ids = &mut self.stratum_ids;
        let map = match &mut self.stratum_index {
            Some(map) => map,
            // Input sorted by stratum: a new id follows the last one (no search).
            None if ids.last().is_none_or(|&last| last < id) => {
                ids.push(id);
                return next;
            }
            None => match ids.binary_search(&id) {
                Ok(k) => return k as u32,
                // Not increasing any more: index the ids so far.
                Err(_) => self.stratum_index.insert(
                    ids.iter()
                        .enumerate()
                        .map(|(k, &id)| (id, k as u32))
                        .collect(),
                ),
            },
        };
        *map.entry(id).or_insert_with(|| {
            ids.push(id);
            next
        })
    }
}

/// An optional outcome field: materialized (with `default` for earlier rows) once a row has it.
#[derive(Debug, Default)]
struct OptionalColumn<T> {
    values: Option<Vec<T>>,
    /// First row without a value.
    first_missing: Option<usize>,
}

impl<T: Copy> OptionalColumn<T> {
    /// [`Self::push`] of rows `row, row + 1, …`: `v` for each of `n` rows, or `None` for all.
    fn extend(&mut self, row: usize, v: Option<&[T]>, n: usize, default: T) {
        match v {
            Some(v) => self
                .values
                .get_or_insert_with(|| vec![default; row])
                .extend_from_slice(v),
            None => {
                if n > 0 {
                    self.first_missing.get_or_insert(row);
                }
                if let Some(values) = &mut self.values {
                    values.resize(values.len() + n, default);
                }
            }
        }
    }

    fn push(&mut self, row: usize, v: Option<T>, default: T) {
        match v {
            Some(v) => self
                .values
                .get_or_insert_with(|| vec![default; row])
                .push(v),
            None => {
                self.first_missing.get_or_insert(row);
                if let Some(values) = &mut self.values {
                    values.push(default);
                }
            }
        }
    }
}

/// How row ids map to row indices.
#[derive(Debug, Default)]
enum RowLookup {
    /// Row ids so far are `first, first + 1, …`.
    #[default]
    Consecutive,
    /// Row ids so far are strictly increasing: binary search.
    Increasing,
    /// Anything else.
    Hashed(IdMap<u32>),
}

impl RowLookup {
    /// Index of `row_id` in `ids` (the row ids pushed so far).
    fn find(&self, ids: &RowIds, row_id: i64) -> Option<u32> {
        match self {
            RowLookup::Consecutive | RowLookup::Increasing => ids.find_sorted(row_id),
            RowLookup::Hashed(map) => map.get(&row_id).copied(),
        }
    }
}

/// One covariate column being accumulated.
#[derive(Debug)]
struct ColumnAcc {
    id: i64,
    /// Row indices of the nonzero entries, in push order.
    rows: Vec<u32>,
    /// Values of the entries (only once a value other than 1 appeared).
    values: Option<Vec<f64>>,
    /// Row indices of zero entries (dropped, but they count for duplicate detection).
    zero_rows: Vec<u32>,
    /// `rows` is strictly increasing.
    increasing: bool,
}

/// Make room for `n` more elements, growing by 1/4 rather than doubling (or by `n` when that is
/// more): the columns are the bulk of the builder's memory, and doubling would leave up to half
/// of it unused.
#[inline]
fn grow<T>(v: &mut Vec<T>, n: usize) {
    if v.capacity() - v.len() < n {
        v.reserve_exact(n.max((v.len() / 4).max(16)));
    }
}

/// How many values at the start of `v` equal `id`: eight at a time (a comparison of eight
/// lanes), then the first that differs.
#[inline]
fn run_length(v: &[i64], id: i64) -> usize {
    let mut n = 0;
    let mut blocks = v.chunks_exact(8);
    for b in &mut blocks {
        if !b.iter().fold(true, |all, &x| all & (x == id)) {
            return n + b.iter().take_while(|&&x| x == id).count();
        }
        n += 8;
    }
    n + blocks.remainder().iter().take_while(|&&x| x == id).count()
}

/// Runs of one covariate shorter than this are pushed entry by entry.
const RUN_MIN: usize = 8;

impl ColumnAcc {
    fn push(&mut self, row: u32, v: f64) {
        if v == 0.0 {
            self.zero_rows.push(row);
            return;
        }
        if v != 1.0 && self.values.is_none() {
            let mut values = Vec::with_capacity(self.rows.capacity());
            values.resize(self.rows.len(), 1.0);
            self.values = Some(values);
        }
        if let Some(values) = &mut self.values {
            grow(values, 1);
            values.push(v);
        }
        if self.rows.last().is_some_and(|&last| last >= row) {
            self.increasing = false;
        }
        grow(&mut self.rows, 1);
        self.rows.push(row);
    }

    /// [`Self::push`] of value 1 at each of `rows` (the same storage and growth).
    fn extend_ones(&mut self, rows: impl ExactSizeIterator<Item = u32>) {
        let n = rows.len();
        if let Some(values) = &mut self.values {
            grow(values, n);
            values.resize(values.len() + n, 1.0);
        }
        grow(&mut self.rows, n);
        let mut last = self.rows.last().copied();
        let mut increasing = self.increasing;
        for row in rows {
            increasing &= last.is_none_or(|l| l < row);
            last = Some(row);
            self.rows.push(row);
        }
        self.increasing = increasing;
    }

    /// Sort by row, check for duplicates (zero entries included) and make the column.
    /// Err carries the smallest duplicated row index.
    fn finish(mut self, name: Option<String>) -> std::result::Result<Column, u32> {
        if !self.increasing {
            match &mut self.values {
                None => self.rows.sort_unstable(),
                Some(values) => {
                    let mut pairs: Vec<(u32, f64)> = self
                        .rows
                        .iter()
                        .copied()
                        .zip(values.iter().copied())
                        .collect();
                    pairs.sort_unstable_by_key(|e| e.0);
                    for (k, (r, v)) in pairs.into_iter().enumerate() {
                        self.rows[k] = r;
                        values[k] = v;
                    }
                }
            }
            if let Some(w) = self.rows.windows(2).find(|w| w[0] == w[1]) {
                // Also a zero entry could be a smaller duplicate: fall through to the merge.
                if self.zero_rows.is_empty() {
                    return Err(w[0]);
                }
            }
        }
        if !self.zero_rows.is_empty() {
            let mut all: Vec<u32> = self.rows.iter().chain(&self.zero_rows).copied().collect();
            all.sort_unstable();
            if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
                return Err(w[0]);
            }
        }
        self.rows.shrink_to_fit();
        let (format, values) = match self.values {
            Some(mut v) => {
                v.shrink_to_fit();
                (ColumnFormat::Sparse, v)
            }
            None => (ColumnFormat::Indicator, Vec::new()),
        };
        Ok(Column {
            id: self.id,
            name,
            format,
            rows: self.rows,
            values,
        })
    }
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
    /// Make room for `n` more outcome rows in the columns every row fills (`time`, `y`): a
    /// reader that knows its row count (Parquet metadata, a plan's exact statistics) fills
    /// them without regrowing and copying them. Only capacity: any number of rows can follow.
    pub fn reserve_rows(&mut self, n: usize) -> &mut Self {
        self.outcomes.time.reserve(n);
        self.outcomes.y.reserve(n);
        self
    }
    /// Add one outcome row.
    pub fn push_outcome(&mut self, rec: OutcomeRecord) {
        use std::slice::from_ref;
        self.push_outcomes(OutcomeSlices {
            row_id: from_ref(&rec.row_id),
            stratum_id: rec.stratum_id.as_ref().map(from_ref),
            time: rec.time.as_ref().map(from_ref),
            y: from_ref(&rec.y),
            weight: rec.weight.as_ref().map(from_ref),
            start_time: rec.start_time.as_ref().map(from_ref),
            offset: rec.offset.as_ref().map(from_ref),
            censor_weight: rec.censor_weight.as_ref().map(from_ref),
            cluster_id: rec.cluster_id.as_ref().map(from_ref),
        });
    }

    /// Add outcome rows given column by column: the same as [`Self::push_outcome`] of each
    /// row in turn, a column at a time (no record per row).
    ///
    /// # Panics
    /// When a slice's length differs from `row_id`'s.
    pub fn push_outcomes(&mut self, b: OutcomeSlices<'_>) {
        let n = b.row_id.len();
        let lengths = [
            Some(b.y.len()),
            b.stratum_id.map(<[i64]>::len),
            b.time.map(<[f64]>::len),
            b.weight.map(<[f64]>::len),
            b.start_time.map(<[f64]>::len),
            b.offset.map(<[f64]>::len),
            b.censor_weight.map(<[f64]>::len),
            b.cluster_id.map(<[i64]>::len),
        ];
        assert!(
            lengths.iter().flatten().all(|&l| l == n),
            "outcome columns of different lengths"
        );
        let first = self.outcomes.row_id.len();
        self.push_row_ids(b.row_id);
        let o = &mut self.outcomes;
        match b.time {
            Some(t) => o.time.extend_from_slice(t),
            None => (0..n).for_each(|_| o.time.push(1.0)),
        }
        o.y.extend_from_slice(b.y);
        match b.stratum_id {
            Some(ids) => {
                // Rows of one stratum usually come together: one push per run of equal ids.
                let mut k = 0;
                while k < n {
                    let id = ids[k];
                    let run = 1 + run_length(&ids[k + 1..], id);
                    let s = match o.last_stratum {
                        Some((last, s)) if last == id => s,
                        _ => {
                            let s = o.stratum_of(id);
                            o.last_stratum = Some((id, s));
                            s
                        }
                    };
                    match &mut o.stratum {
                        Some(st) => st.push_n(s, run),
                        None => {
                            let mut st = Strata::single(first + k);
                            st.push_n(s, run);
                            o.stratum = Some(st);
                        }
                    }
                    k += run;
                }
            }
            None => {
                if n > 0 {
                    o.stratum_first_missing.get_or_insert(first);
                }
                if let Some(st) = &mut o.stratum {
                    (0..n).for_each(|_| st.push(0));
                }
            }
        }
        o.weight.extend(first, b.weight, n, 1.0);
        o.start_time.extend(first, b.start_time, n, 0.0);
        o.offset.extend(first, b.offset, n, 0.0);
        o.censor_weight.extend(first, b.censor_weight, n, 1.0);
        match b.cluster_id {
            Some(ids) => {
                for (k, &id) in ids.iter().enumerate() {
                    let next = o.cluster_index.len() as u32;
                    let c = *o.cluster_index.entry(id).or_insert(next);
                    o.cluster.push(first + k, Some(c), u32::MAX);
                }
            }
            None => o.cluster.extend(first, None, n, u32::MAX),
        }
    }

    /// [`Self::push_row_id`] for each of `ids`; ids that continue a range of consecutive ids
    /// extend it at once.
    fn push_row_ids(&mut self, ids: &[i64]) {
        if let (RowLookup::Consecutive, RowIds::Range { first, len }, Some(&id0)) =
            (&self.row_lookup, &mut self.outcomes.row_id, ids.first())
        {
            let start = if *len == 0 {
                Some(id0)
            } else {
                first.checked_add(*len as i64)
            };
            // The last id must not overflow; then every id is `start + k` exactly when its
            // wrapping difference from `start` is k (one comparison per id, vectorized).
            let consecutive = start.is_some_and(|start| {
                start.checked_add(ids.len() as i64 - 1).is_some()
                    && ids
                        .iter()
                        .zip(0i64..)
                        .fold(true, |all, (&id, k)| all & (id.wrapping_sub(start) == k))
            });
            if consecutive {
                if *len == 0 {
                    *first = id0;
                }
                *len += ids.len();
                return;
            }
        }
        for &id in ids {
            self.push_row_id(id);
        }
    }

    /// Append a row id (row lookup and duplicate detection, reported by `build` in row order).
    #[inline]
    fn push_row_id(&mut self, row_id: i64) {
        let o = &mut self.outcomes;
        let i = o.row_id.len();
        let prev = o.row_id.last();
        match &mut self.row_lookup {
            RowLookup::Consecutive | RowLookup::Increasing if prev.is_none_or(|p| p < row_id) => {
                let consecutive = prev.is_none_or(|p| p.checked_add(1) == Some(row_id));
                if !consecutive {
                    self.row_lookup = RowLookup::Increasing;
                }
            }
            RowLookup::Hashed(map) => {
                if map.insert(row_id, i as u32).is_some() {
                    self.first_duplicate_row.get_or_insert(i);
                }
            }
            _ => {
                // Out of order: switch to a hash map over the (distinct, increasing) ids so far.
                let mut map: IdMap<u32> = o
                    .row_id
                    .iter()
                    .enumerate()
                    .map(|(k, id)| (id, k as u32))
                    .collect();
                if map.insert(row_id, i as u32).is_some() {
                    self.first_duplicate_row.get_or_insert(i);
                }
                self.row_lookup = RowLookup::Hashed(map);
            }
        }
        o.row_id.push(row_id);
    }

    /// Row index of `row_id` among the outcomes pushed so far.
    #[inline]
    fn row_of(&self, row_id: i64) -> Option<u32> {
        self.row_lookup.find(&self.outcomes.row_id, row_id)
    }

    /// [`Self::push_covariate`] for each entry of the slices, in order (`values`: 1 for every
    /// entry when `None`): one call per batch of a long-format source.
    ///
    /// # Panics
    /// If the slices differ in length.
    pub fn push_covariates(
        &mut self,
        row_ids: &[i64],
        covariate_ids: &[i64],
        values: Option<&[f64]>,
    ) {
        assert!(
            row_ids.len() == covariate_ids.len() && values.is_none_or(|v| v.len() == row_ids.len()),
            "covariate columns of different lengths"
        );
        if let Some(values) = values {
            for (i, (&row_id, &covariate_id)) in row_ids.iter().zip(covariate_ids).enumerate() {
                self.push_covariate(row_id, covariate_id, values[i]);
            }
            return;
        }
        let n = row_ids.len();
        let mut k = 0;
        while k < n {
            // Entries grouped by covariate (a column-major source): one run per covariate.
            let id = covariate_ids[k];
            let end = k
                + 1
                + covariate_ids[k + 1..]
                    .iter()
                    .take_while(|&&x| x == id)
                    .count();
            if end - k < RUN_MIN || !self.push_run(&row_ids[k..end], id) {
                for &row_id in &row_ids[k..end] {
                    self.push_covariate(row_id, id, 1.0);
                }
            }
            k = end;
        }
    }

    /// [`Self::push_covariate`] of value 1 for every row id of `row_ids` and covariate `id`, at
    /// once, when every row id is among the consecutive ids pushed so far (the common case: a
    /// column of indicators); false (nothing pushed) otherwise.
    fn push_run(&mut self, row_ids: &[i64], id: i64) -> bool {
        let (RowLookup::Consecutive, RowIds::Range { first, len }) =
            (&self.row_lookup, &self.outcomes.row_id)
        else {
            return false;
        };
        let (first, len) = (*first, *len as i64);
        let known = |r: i64| r.checked_sub(first).is_some_and(|k| (0..len).contains(&k));
        if id == INTERCEPT_ID || !row_ids.iter().all(|&r| known(r)) {
            return false;
        }
        self.n_pushed += row_ids.len() as u64;
        let k = self.column_of(id);
        self.columns[k as usize].extend_ones(row_ids.iter().map(|&r| (r - first) as u32));
        true
    }

    /// Add one covariate entry. Zero values are dropped (after the duplicate check).
    #[inline]
    pub fn push_covariate(&mut self, row_id: i64, covariate_id: i64, value: f64) {
        let seq = self.n_pushed;
        self.n_pushed += 1;
        match self.row_of(row_id) {
            Some(row) => self.add_entry(seq, row, row_id, covariate_id, value),
            None => self.pending.push((row_id, covariate_id, value, seq)),
        }
    }

    #[inline]
    fn add_entry(&mut self, seq: u64, row: u32, row_id: i64, covariate_id: i64, value: f64) {
        if covariate_id == INTERCEPT_ID || !value.is_finite() {
            self.bad_entry(seq, row, row_id, covariate_id, value);
            return;
        }
        let k = self.column_of(covariate_id);
        self.columns[k as usize].push(row, value);
    }

    /// Index into `columns` of covariate `covariate_id` (a new column when first seen).
    #[inline]
    fn column_of(&mut self, covariate_id: i64) -> u32 {
        let next = self.columns.len() as u32;
        let k = match self.last_column {
            Some((id, k)) if id == covariate_id => k,
            _ if (0..SMALL_IDS).contains(&covariate_id) => {
                if self.small_column.is_empty() {
                    self.small_column = vec![0; SMALL_IDS as usize];
                }
                let slot = &mut self.small_column[covariate_id as usize];
                if *slot == 0 {
                    *slot = next + 1;
                }
                *slot - 1
            }
            _ => *self.column_index.entry(covariate_id).or_insert(next),
        };
        self.last_column = Some((covariate_id, k));
        if k == next {
            self.columns.push(ColumnAcc {
                id: covariate_id,
                rows: Vec::new(),
                values: None,
                zero_rows: Vec::new(),
                increasing: true,
            });
        }
        k
    }

    /// Record a covariate entry that cannot be used (the reserved intercept id, a value that
    /// is not finite) when it is the first such entry pushed; the build then fails with it.
    #[cold]
    #[inline(never)]
    fn bad_entry(&mut self, seq: u64, row: u32, row_id: i64, covariate_id: i64, value: f64) {
        if self
            .first_non_finite
            .as_ref()
            .is_some_and(|(s, _)| *s <= seq)
        {
            return;
        }
        let (column, message) = if covariate_id == INTERCEPT_ID {
            (
                "covariate_id",
                format!(
                    "covariate id {INTERCEPT_ID} is reserved (it marks the intercept); \
                     renumber this covariate"
                ),
            )
        } else {
            (
                "covariate_value",
                format!("covariate {covariate_id} has non-finite value {value}"),
            )
        };
        let e = Error::BadValue {
            row: row as usize,
            row_id,
            column: column.into(),
            message,
        };
        self.first_non_finite = Some((seq, e));
    }

    /// Give a covariate a display name.
    pub fn name_covariate(&mut self, covariate_id: i64, name: impl Into<String>) {
        self.names.insert(covariate_id, name.into());
    }
    /// Number of outcome rows so far.
    pub fn n_outcomes(&self) -> usize {
        self.outcomes.row_id.len()
    }

    /// Validate and build. Checks: at least one row; unique row ids; finite `time`, `y`,
    /// `weight` (≥ 0), `start_time` (< time), `offset`, `censor_weight` (in (0, 1]); finite
    /// covariate values; no duplicate (row_id, covariate_id); covariate row ids known (or
    /// dropped with a count). Model-specific checks (time > 0, y domain) are done by
    /// [`crate::model::ModelKind::check_rows`].
    pub fn build(mut self) -> Result<DesignMatrix> {
        let o = std::mem::take(&mut self.outcomes);
        let n = o.row_id.len();
        if n == 0 {
            return Err(Error::Empty("no outcome rows".into()));
        }
        if n > u32::MAX as usize {
            return Err(Error::Empty("more than 2^32 rows are not supported".into()));
        }
        let mixed = |c: Option<usize>, column: &str, what: &str| match c {
            Some(i) => Err(bad(i, o.row_id.get(i), column, what)),
            None => Ok(()),
        };
        let present = |v: bool, c: Option<usize>| if v { c } else { None };
        mixed(
            present(o.stratum.is_some(), o.stratum_first_missing),
            "stratum_id",
            "is NULL while other rows have a stratum",
        )?;
        mixed(
            present(o.start_time.values.is_some(), o.start_time.first_missing),
            "start_time",
            "is NULL while other rows have one",
        )?;
        mixed(
            present(
                o.censor_weight.values.is_some(),
                o.censor_weight.first_missing,
            ),
            "censor_weight",
            "is NULL while other rows have one",
        )?;
        // The row-by-row checks below, skipped when they cannot fail: no duplicate, no optional
        // column, time and y finite (two typed scans; none for integer forms).
        let non_finite =
            |v: &Values| !v.is_unsigned_integer_form() && v.position(|x| !x.is_finite()).is_some();
        let check_rows = self.first_duplicate_row.is_some()
            || o.weight.values.is_some()
            || o.start_time.values.is_some()
            || o.offset.values.is_some()
            || o.censor_weight.values.is_some()
            || non_finite(&o.time)
            || non_finite(&o.y);
        for i in if check_rows { 0..n } else { 0..0 } {
            let row_id = o.row_id.get(i);
            if self.first_duplicate_row == Some(i) {
                return Err(Error::DuplicateRow { row_id });
            }
            let time = o.time.get(i);
            finite(i, row_id, "time", time)?;
            finite(i, row_id, "y", o.y.get(i))?;
            if let Some(w) = &o.weight.values {
                let w = w[i];
                finite(i, row_id, "weight", w)?;
                if w < 0.0 {
                    return Err(bad(i, row_id, "weight", format!("is negative ({w})")));
                }
            }
            if let Some(st) = &o.start_time.values {
                let s = st[i];
                finite(i, row_id, "start_time", s)?;
                if s >= time {
                    return Err(bad(
                        i,
                        row_id,
                        "start_time",
                        format!("({s}) is not before time ({time})"),
                    ));
                }
            }
            if let Some(off) = &o.offset.values {
                finite(i, row_id, "offset", off[i])?;
            }
            if let Some(cw) = &o.censor_weight.values {
                let c = cw[i];
                finite(i, row_id, "censor_weight", c)?;
                if !(c > 0.0 && c <= 1.0) {
                    return Err(bad(
                        i,
                        row_id,
                        "censor_weight",
                        format!("({c}) is not in (0, 1]"),
                    ));
                }
            }
        }
        let has_strata = o.stratum.is_some();
        let (mut time, mut y) = (o.time, o.y);
        time.shrink_to_fit();
        y.shrink_to_fit();
        let rows = Rows {
            stratum: match o.stratum {
                Some(mut st) => {
                    st.shrink_to_fit();
                    st
                }
                None => Strata::single(n),
            },
            stratum_ids: if has_strata { o.stratum_ids } else { vec![0] },
            has_strata,
            time,
            start_time: o.start_time.values,
            y,
            weight: o.weight.values,
            offset: o.offset.values,
            censor_weight: o.censor_weight.values,
            cluster: o.cluster.values.map(|c| {
                // Rows without a cluster id are clusters of their own.
                let mut next = o.cluster_index.len() as i64;
                c.into_iter()
                    .map(|k| {
                        if k == u32::MAX {
                            next += 1;
                            next - 1
                        } else {
                            i64::from(k)
                        }
                    })
                    .collect()
            }),
            row_id: match o.row_id {
                RowIds::Ids(mut v) => {
                    v.shrink_to_fit();
                    RowIds::Ids(v)
                }
                range => range,
            },
        };

        // Entries pushed before their outcome row.
        let mut unknown = 0usize;
        let mut first_unknown = 0i64;
        let pending = std::mem::take(&mut self.pending);
        for &(row_id, cov, v, seq) in &pending {
            match self.row_lookup.find(&rows.row_id, row_id) {
                Some(row) => self.add_entry(seq, row, row_id, cov, v),
                None => {
                    if unknown == 0 {
                        first_unknown = row_id;
                    }
                    unknown += 1;
                }
            }
        }
        drop(pending);
        if let Some((_, e)) = self.first_non_finite {
            return Err(e);
        }
        if unknown > 0 && !self.drop_unknown_rows {
            return Err(Error::UnknownRow {
                count: unknown,
                first_row_id: first_unknown,
            });
        }
        drop(self.row_lookup);

        // Columns in covariate-id order.
        let mut accs = self.columns;
        accs.sort_unstable_by_key(|c| c.id);
        let mut columns: Vec<Column> = Vec::with_capacity(accs.len());
        for acc in accs {
            let id = acc.id;
            let name = self.names.get(&id).cloned();
            match acc.finish(name) {
                Ok(col) => columns.push(col),
                Err(row) => {
                    return Err(Error::DuplicateCovariate {
                        row_id: rows.row_id.get(row as usize),
                        covariate_id: id,
                    })
                }
            }
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

    /// The rows' fields of a design, for comparisons.
    fn row_fields(x: &DesignMatrix) -> String {
        let r = &x.rows;
        format!(
            "{:?} {:?} {:?} {} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
            r.row_id.to_vec(),
            r.stratum.to_vec(),
            r.stratum_ids,
            r.has_strata,
            r.time.to_vec(),
            r.start_time,
            r.y.to_vec(),
            r.weight,
            r.offset,
            r.censor_weight,
            r.cluster,
        )
    }

    #[test]
    fn outcome_columns_build_what_outcome_records_build() {
        // Three batches: strata, weights and clusters in the first and last only, an offset
        // in the middle one only (defaults fill the other rows), row ids out of order at the
        // end (the lookup switches to a map).
        let ids = [10i64, 11, 12, 13, 20, 21, 5, 6];
        let strata = [1i64, 1, 2, 2, 9, 9, 3, 3];
        let time = [1.0, 2.0, 3.0, 4.5, 5.0, 6.0, 7.0, 8.0];
        let y = [0.0, 1.0, 0.0, 2.0, 1.0, 0.0, 1.0, 0.0];
        let weight = [1.0, 2.0, 0.5, 1.0, 1.0, 1.0, 3.0, 1.0];
        let offset = [0.0, 0.0, 0.0, 0.0, 0.3, -0.2, 0.0, 0.0];
        let cluster = [7i64, 7, 8, 8, 0, 0, 9, 7];
        let batches = [0..4, 4..6, 6..8];
        let mut rows = DesignBuilder::new();
        let mut cols = DesignBuilder::new();
        for (b, range) in batches.iter().enumerate() {
            let middle = b == 1;
            for i in range.clone() {
                rows.push_outcome(OutcomeRecord {
                    row_id: ids[i],
                    stratum_id: Some(strata[i]),
                    time: Some(time[i]),
                    y: y[i],
                    weight: (!middle).then_some(weight[i]),
                    offset: middle.then_some(offset[i]),
                    cluster_id: (!middle).then_some(cluster[i]),
                    ..Default::default()
                });
            }
            let r = range.clone();
            cols.push_outcomes(OutcomeSlices {
                row_id: &ids[r.clone()],
                stratum_id: Some(&strata[r.clone()]),
                time: Some(&time[r.clone()]),
                y: &y[r.clone()],
                weight: (!middle).then_some(&weight[r.clone()]),
                offset: middle.then_some(&offset[r.clone()]),
                cluster_id: (!middle).then_some(&cluster[r.clone()]),
                ..Default::default()
            });
        }
        for b in [&mut rows, &mut cols] {
            b.push_covariate(12, 1000, 1.0);
            b.push_covariate(5, 1000, 2.0);
        }
        let (x_rows, x_cols) = (rows.build().unwrap(), cols.build().unwrap());
        assert_eq!(row_fields(&x_cols), row_fields(&x_rows));
        assert_eq!(x_cols.columns[0].rows, x_rows.columns[0].rows);

        // Consecutive ids continued across batches, and strata runs across batch boundaries
        // (pushed a run at a time), then ids that break the range.
        let ids = [3i64, 4, 5, 6, 7, 8, 9, 11, 12];
        let strata = [4i64, 4, 4, 4, 2, 2, 4, 4, 1];
        let mut rows = DesignBuilder::new();
        let mut cols = DesignBuilder::new();
        for range in [0..2, 2..5, 5..6, 6..9] {
            for i in range.clone() {
                rows.push_outcome(OutcomeRecord {
                    stratum_id: Some(strata[i]),
                    ..rec(ids[i], 1.0, 1.0)
                });
            }
            let ones = vec![1.0; range.len()];
            cols.push_outcomes(OutcomeSlices {
                row_id: &ids[range.clone()],
                stratum_id: Some(&strata[range.clone()]),
                y: &ones,
                ..Default::default()
            });
        }
        let (x_rows, x_cols) = (rows.build().unwrap(), cols.build().unwrap());
        assert_eq!(row_fields(&x_cols), row_fields(&x_rows));
        assert_eq!(x_cols.rows.stratum, vec![0u32, 0, 0, 0, 1, 1, 0, 0, 2]);

        // Long strata runs (the run scan goes eight ids at a time: runs of 0–20 rows end
        // inside and at the edges of its blocks) and consecutive ids up to i64::MAX, with room
        // reserved or not, cut into batches anywhere; then ids below the range, past
        // i64::MAX (not consecutive: they would wrap), and gaps.
        let mut strata = Vec::new();
        for (k, len) in [1usize, 8, 9, 16, 7, 20, 15, 17, 3, 8, 2]
            .into_iter()
            .enumerate()
        {
            strata.extend(std::iter::repeat_n(k as i64 % 4, len));
        }
        let n = strata.len() as i64;
        for (first, tail) in [
            (0, vec![-2, n + 2]),
            (i64::MAX - n + 1, vec![i64::MIN, i64::MIN + 1]),
            (i64::MAX - n, vec![i64::MAX, -3]),
        ] {
            let ids: Vec<i64> = (0..n).map(|k| first + k).chain(tail).collect();
            let strata: Vec<i64> = strata.iter().copied().chain([9, 9]).collect();
            let mut rows = DesignBuilder::new();
            for i in 0..ids.len() {
                rows.push_outcome(OutcomeRecord {
                    stratum_id: Some(strata[i]),
                    ..rec(ids[i], 1.0, 1.0)
                });
            }
            let expected = rows.build().map(|x| {
                assert_eq!(x.rows.row_id.to_vec(), ids, "first id {first}");
                row_fields(&x)
            });
            for cuts in [
                vec![ids.len()],
                vec![5, 13, 50, ids.len()],
                vec![1, 2, 96, 97],
            ] {
                for reserve in [0, 3, ids.len()] {
                    let mut cols = DesignBuilder::new();
                    cols.reserve_rows(reserve);
                    let mut start = 0;
                    for &end in cuts.iter().chain([&ids.len()]) {
                        let ones = vec![1.0; end - start];
                        cols.push_outcomes(OutcomeSlices {
                            row_id: &ids[start..end],
                            stratum_id: Some(&strata[start..end]),
                            time: Some(&ones),
                            y: &ones,
                            ..Default::default()
                        });
                        start = end;
                    }
                    let got = cols.build().map(|x| row_fields(&x));
                    assert_eq!(
                        format!("{got:?}"),
                        format!("{expected:?}"),
                        "first id {first}, cuts {cuts:?}, reserved {reserve}"
                    );
                }
            }
        }

        // A batch without strata after one with them is the same error either way.
        let mut rows = DesignBuilder::new();
        let mut cols = DesignBuilder::new();
        rows.push_outcome(OutcomeRecord {
            stratum_id: Some(1),
            ..rec(1, 1.0, 1.0)
        });
        rows.push_outcome(rec(2, 1.0, 0.0));
        cols.push_outcomes(OutcomeSlices {
            row_id: &[1],
            stratum_id: Some(&[1]),
            y: &[1.0],
            ..Default::default()
        });
        cols.push_outcomes(OutcomeSlices {
            row_id: &[2],
            y: &[0.0],
            ..Default::default()
        });
        let (e_rows, e_cols) = (rows.build().unwrap_err(), cols.build().unwrap_err());
        assert_eq!(e_cols.to_string(), e_rows.to_string());
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
            e.contains("outcome row 2 (row_id 2)") && e.contains("`time`"),
            "{e}"
        );
        assert!(matches!(DesignBuilder::new().build(), Err(Error::Empty(_))));
        let mut b = DesignBuilder::new();
        b.push_outcome(rec(1, 1.0, 1.0));
        b.push_outcome(rec(1, 1.0, 1.0));
        assert!(matches!(b.build(), Err(Error::DuplicateRow { row_id: 1 })));
    }

    /// Every order of pushing (covariates before or after their outcomes, increasing,
    /// consecutive or shuffled row ids) builds the same matrix.
    #[test]
    fn push_order_does_not_matter() {
        let ids = [5i64, 6, 7, 9, 12, 40, 41];
        let entries: Vec<(i64, i64, f64)> = ids
            .iter()
            .enumerate()
            .flat_map(|(k, &r)| {
                [
                    (r, 3, 1.0),
                    (r, 8, if k % 2 == 0 { 1.0 } else { 0.0 }),
                    (r, 2, k as f64 - 2.0),
                ]
            })
            .collect();
        let build = |out: &[i64], covs: &[(i64, i64, f64)], covs_first: bool| {
            let mut b = DesignBuilder::new();
            if covs_first {
                for &(r, c, v) in covs {
                    b.push_covariate(r, c, v);
                }
            }
            for &r in out {
                b.push_outcome(rec(r, r as f64, 1.0));
            }
            if !covs_first {
                for &(r, c, v) in covs {
                    b.push_covariate(r, c, v);
                }
            }
            b.build().unwrap()
        };
        let reference = build(&ids, &entries, false);
        assert_eq!(reference.columns.len(), 3);
        assert_eq!(reference.columns[0].format, ColumnFormat::Sparse);
        assert_eq!(reference.columns[0].rows, vec![0, 1, 3, 4, 5, 6]);
        assert_eq!(
            reference.columns[0].values,
            vec![-2.0, -1.0, 1.0, 2.0, 3.0, 4.0]
        );
        assert_eq!(reference.columns[2].format, ColumnFormat::Indicator);
        assert_eq!(reference.columns[2].rows, vec![0, 2, 4, 6]);
        let mut rev = entries.clone();
        rev.reverse();
        for covs_first in [false, true] {
            for covs in [&entries, &rev] {
                let x = build(&ids, covs, covs_first);
                for (a, b) in x.columns.iter().zip(&reference.columns) {
                    assert_eq!(
                        (a.id, a.format, &a.rows, &a.values),
                        (b.id, b.format, &b.rows, &b.values)
                    );
                }
            }
        }
        // Shuffled row ids: rows keep the outcome order.
        let shuffled = [41i64, 5, 12, 6, 40, 9, 7];
        let x = build(&shuffled, &entries, false);
        let y = build(&shuffled, &rev, true);
        assert_eq!(x.rows.row_id, shuffled);
        assert_eq!(x.columns[2].rows, vec![0, 1, 2, 6]);
        for (a, b) in x.columns.iter().zip(&y.columns) {
            assert_eq!((a.id, &a.rows, &a.values), (b.id, &b.rows, &b.values));
        }
    }

    /// Covariates pushed as slices grouped by covariate (runs of one covariate pushed at once
    /// where their rows are known consecutive ids) build what pushing the entries one by one
    /// builds: the same columns, or the same error.
    #[test]
    fn covariate_runs_build_what_single_entries_build() {
        let n = 40i64;
        // (covariate, rows): increasing, decreasing, short, a repeated row, an unknown row, a
        // run that continues an earlier column, the intercept's id.
        let runs: Vec<(i64, Vec<i64>)> = vec![
            (7, (1..=n).step_by(3).collect()),
            (3, (1..=n).rev().step_by(2).collect()),
            (9, vec![4, 8, 12]),
            (5, (1..=12).chain([6]).collect()),
            (6, (30..=n + 2).collect()),
            (7, (2..=n).step_by(3).collect()),
            (INTERCEPT_ID, (1..=10).collect()),
        ];
        let build = |ids: &[i64], runs: &[(i64, Vec<i64>)], slices: bool, drop: bool| {
            let mut b = DesignBuilder::new();
            b.drop_unknown_rows(drop);
            let ones = vec![1.0; ids.len()];
            b.push_outcomes(OutcomeSlices {
                row_id: ids,
                y: &ones,
                ..Default::default()
            });
            let rows: Vec<i64> = runs.iter().flat_map(|(_, r)| r.iter().copied()).collect();
            let covs: Vec<i64> = runs
                .iter()
                .flat_map(|(c, r)| std::iter::repeat_n(*c, r.len()))
                .collect();
            if slices {
                // In two batches, the second starting inside a run.
                let cut = rows.len() / 2 + 1;
                b.push_covariates(&rows[..cut], &covs[..cut], None);
                b.push_covariates(&rows[cut..], &covs[cut..], None);
            } else {
                for (&r, &c) in rows.iter().zip(&covs) {
                    b.push_covariate(r, c, 1.0);
                }
            }
            b.build()
        };
        let show = |x: Result<DesignMatrix>| match x {
            Ok(x) => format!(
                "{:?} {}",
                x.columns
                    .iter()
                    .map(|c| (c.id, c.format, c.rows.clone(), c.values.clone()))
                    .collect::<Vec<_>>(),
                x.dropped_unknown
            ),
            Err(e) => e.to_string(),
        };
        let consecutive: Vec<i64> = (1..=n).collect();
        let gaps: Vec<i64> = (1..=n).map(|i| i * 2 - i % 2).collect();
        for ids in [&consecutive, &gaps] {
            for k in 1..=runs.len() {
                let some = &runs[..k];
                for drop in [false, true] {
                    let (one, many) = (build(ids, some, false, drop), build(ids, some, true, drop));
                    assert_eq!(show(many), show(one), "{k} runs, drop {drop}");
                }
            }
        }
        // The runs without the repeated row and the intercept build.
        let clean: Vec<(i64, Vec<i64>)> =
            [0, 1, 2, 4, 5].iter().map(|&i| runs[i].clone()).collect();
        let x = build(&consecutive, &clean, true, true).unwrap();
        assert_eq!(
            x.columns.iter().map(|c| c.id).collect::<Vec<_>>(),
            [3, 6, 7, 9]
        );
        assert_eq!(x.dropped_unknown, 2);
        assert_eq!(x.columns[1].rows, (29..40).collect::<Vec<u32>>());
    }

    /// Strata are numbered in order of first appearance whether their ids arrive increasing
    /// (searched), grouped or not, or out of order (the lookup switches to a map).
    #[test]
    fn strata_in_order_of_first_appearance() {
        let build = |ids: &[i64]| {
            let mut b = DesignBuilder::new();
            for (k, &s) in ids.iter().enumerate() {
                b.push_outcome(OutcomeRecord {
                    stratum_id: Some(s),
                    ..rec(k as i64, 1.0, 1.0)
                });
            }
            let x = b.build().unwrap();
            (x.rows.stratum.to_vec(), x.rows.stratum_ids)
        };
        assert_eq!(
            build(&[1, 1, 2, 1, 3, 2, 3]),
            (vec![0, 0, 1, 0, 2, 1, 2], vec![1, 2, 3])
        );
        assert_eq!(
            build(&[5, 5, 7, 3, 7, 5, 9, 3, 8]),
            (vec![0, 0, 1, 2, 1, 0, 3, 2, 4], vec![5, 7, 3, 9, 8])
        );
        assert_eq!(
            build(&[-4, i64::MIN, -4, i64::MAX]),
            (vec![0, 1, 0, 2], vec![-4, i64::MIN, i64::MAX])
        );
    }

    #[test]
    fn errors_keep_their_precedence() {
        // A zero entry still makes a duplicate.
        let mut b = DesignBuilder::new();
        b.push_outcome(rec(1, 1.0, 1.0));
        b.push_outcome(rec(2, 1.0, 1.0));
        b.push_covariate(2, 5, 1.0);
        b.push_covariate(2, 5, 0.0);
        assert!(matches!(
            b.build(),
            Err(Error::DuplicateCovariate {
                row_id: 2,
                covariate_id: 5
            })
        ));
        // The first non-finite value in push order wins over unknown rows and duplicates,
        // also when it was pushed before its outcome.
        let mut b = DesignBuilder::new();
        b.push_covariate(2, 5, f64::NAN);
        b.push_outcome(rec(1, 1.0, 1.0));
        b.push_covariate(1, 5, f64::INFINITY);
        b.push_covariate(1, 6, 1.0);
        b.push_covariate(1, 6, 1.0);
        b.push_covariate(9, 6, 1.0);
        b.push_outcome(rec(2, 1.0, 1.0));
        let e = b.build().unwrap_err();
        assert!(
            matches!(
                &e,
                Error::BadValue {
                    row: 1,
                    row_id: 2,
                    ..
                }
            ),
            "{e}"
        );
        // Outcome errors come first, in row order; duplicate row ids out of order are found.
        let mut b = DesignBuilder::new();
        b.push_outcome(rec(3, 1.0, 1.0));
        b.push_outcome(rec(1, 1.0, 1.0));
        b.push_outcome(rec(3, 1.0, 1.0));
        b.push_outcome(rec(4, f64::NAN, 1.0));
        b.push_covariate(7, 1, f64::NAN);
        assert!(matches!(b.build(), Err(Error::DuplicateRow { row_id: 3 })));
        // Mixed strata name the first row without one.
        let mut b = DesignBuilder::new();
        b.push_outcome(rec(1, 1.0, 1.0));
        b.push_outcome(OutcomeRecord {
            stratum_id: Some(4),
            ..rec(2, 1.0, 1.0)
        });
        let e = b.build().unwrap_err().to_string();
        assert!(e.contains("row_id 1") && e.contains("stratum_id"), "{e}");
    }
}

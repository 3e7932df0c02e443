//! Shared risk-set machinery for Cox and Fine–Gray partial likelihoods.
//!
//! # Layout
//!
//! Rows are sorted once by (stratum, time DESC, row_id) — the order is independent of the input
//! order — and *event groups* are formed: one group per (stratum, event time) with at least one
//! event, numbered in that order (so within a stratum group times decrease). Every row k gets
//!
//! * `pos(k)`: the first group whose risk set contains it (first group of its stratum with
//!   t_g ≤ T_k; the stratum end if none),
//! * for counting-process rows an `exit(k)`: the first group with t_g ≤ start_k,
//! * for Fine–Gray competing rows (y = 2) a backward part: weight 1/G(T_k−) times G(t_g−) on the
//!   groups of its stratum before `pos(k)` (t_g > T_k).
//!
//! So S0(g) = F(g) + G_g·B(g), with F(g) = Σ w e [pos ≤ g < exit] and B(g) = Σ_competing w e / G_k
//! [stratum start ≤ g < pos]. For column j, S1(g) = a(g) + G_g b(g) is piecewise constant in g,
//! with breakpoints at the positions of the column's nonzeros; with prefix sums over groups of
//! r_g = W_g/S0_g, q_g = W_g/S0_g² (and r_g G_g, q_g G_g, q_g G_g² for Fine–Gray) one coordinate's
//! gradient and curvature cost O(nnz_j): walk the nonzeros in row order (which is position
//! order) and add S1 × (prefix difference) per segment. Efron's tied groups add per-group
//! coefficients (u, v, z below) used at the groups where column j has events.
//!
//! After an update the change of w e of the updated rows (multiplied by exp(Δ·x); η itself is
//! only rebuilt by `set_beta`) is queued and applied lazily before the next gradient, in one
//! O(G) pass that also rebuilds the prefix sums: on the common path (no tied Efron groups, no
//! (start, stop] rows) as a sorted queue of (position, change) merged into the pass, otherwise
//! through dense difference arrays. Coordinates that are not updated (most of them under a
//! Laplace prior) cost O(nnz_j) only. `set_beta` recomputes everything from scratch.
//!
//! # Newton iterations
//!
//! Coordinate descent's active-set Newton polish ([`crate::model::ccd`]) needs, per step, the
//! gradient over the active columns and a Newton matrix, never a refresh per coordinate:
//!
//! * [`RiskSetModel::gradients`]: g_j = Σ_events w x_j − Σ_i x_ij d_i with one weight d_i per
//!   row from the prefix sums (one gather per nonzero);
//! * `information_sweep` (the exact information from 33 columns on): one pass over the sorted
//!   rows, the S2 part as a sparse Gram matrix and the S1 S1ᵀ part summed by parts (each row
//!   adds one dense k-vector per nonzero), O(N + nnz·k) instead of O((N + G)·k²);
//! * [`RiskSetModel::approximate_information`]: an upper bound Ĥ ≽ I that replaces, within
//!   segments of consecutive event times, the risk set's mean covariate vector by its
//!   weighted segment average (Cauchy–Schwarz), O(N + G + Σ_rows k_i² + segments·k²).
//!
//! # Determinism and threads
//!
//! Rows are ordered by (stratum id, time, row id), never by input position, and every sum runs
//! in a fixed order. The coordinate walk is split into a fixed number of chunks that depends
//! only on nnz_j (each chunk's runs are computed with a and b starting at 0 and the true
//! starting values are added when the chunks are combined, in order), and the refresh pass
//! into a fixed number of group chunks that depends only on G. Rayon runs the chunks in
//! parallel; the split, and therefore every bit of the result, is the same for any number of
//! threads. The passes over many columns at once (η in `set_beta`, the batched gradients, the
//! row-major view of an information request) and the per-row and per-group element-wise
//! passes run over fixed blocks of rows (`model/row_blocks.rs`), each element computed by the
//! same operations in the same order as in one sequential loop.

use std::borrow::Cow;
use std::sync::Arc;

use super::design::{ColumnFormat, ColumnSource, DesignMatrix};
use super::row_blocks::{self, SparseCol, ROW_MAJOR_MAX_COLS};
use super::Ties;
use crate::error::{Error, Result};

mod folds;
pub use folds::{FoldBase, FoldCensor, FoldSums};

/// Which partial likelihood a [`RiskSetModel`] evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RiskSetKind {
    /// Cox proportional hazards (y ∈ {0, 1}, optional (start, stop] rows).
    Cox,
    /// Fine–Gray subdistribution hazards (y ∈ {0, 1, 2}).
    FineGray,
}

/// Per sorted row: w·e, entry position and stratum, packed for the coordinate walk.
#[derive(Debug, Clone, Copy, Default)]
struct RowInfo {
    we: f64,
    pos: u32,
    stratum: u32,
}

/// One covariate column in sorted-row order (rows that are in no risk set are dropped).
#[derive(Debug, Clone, Default)]
struct SortedColumn {
    rows: Vec<u32>,
    /// Values per entry; empty for 0/1 columns.
    vals: Vec<f64>,
    /// Counting-process exits: (exit position, entry index) sorted by position.
    exits: Vec<(u32, u32)>,
    /// First entry of each row block of the blocked passes ([`row_blocks::block_starts`]).
    blocks: Vec<u32>,
}

impl SortedColumn {
    fn view(&self) -> SparseCol<'_> {
        SparseCol {
            rows: &self.rows,
            vals: &self.vals,
            starts: &self.blocks,
        }
    }

    #[inline]
    fn value(&self, i: usize) -> f64 {
        row_blocks::value_or_one(&self.vals, i)
    }
}

/// Cox / Fine–Gray partial likelihood with incrementally maintained risk-set sums.
#[derive(Debug, Clone)]
pub struct RiskSetModel {
    kind: RiskSetKind,
    ties: Ties,
    fg: bool,
    counting: bool,
    // ---- per sorted row ----
    w: Vec<f64>,
    /// Scratch for `set_beta` (η is not maintained by `update`).
    eta: Vec<f64>,
    info: Vec<RowInfo>,
    /// Exit position (counting process; stratum end when none). Empty without start times.
    exit: Vec<u32>,
    event: Vec<bool>,
    /// 1/G(T_k−) for competing rows, 0 otherwise (Fine–Gray only).
    inv_g: Vec<f64>,
    /// Offset per sorted row; empty without offsets.
    offset: Vec<f64>,
    // ---- strata ----
    /// Group range of each stratum.
    s_start: Vec<u32>,
    s_end: Vec<u32>,
    /// Sorted-row range of each stratum.
    row_start: Vec<u32>,
    row_end: Vec<u32>,
    /// Strata with at least one group.
    active_strata: Vec<u32>,
    /// All counting-process exits (exit position, row) sorted, for `information`.
    all_exits: Vec<(u32, u32)>,
    // ---- groups ----
    g_weight: Vec<f64>,
    g_count: Vec<u32>,
    /// G(t_g−) (Fine–Gray); 1 for Cox.
    g_cens: Vec<f64>,
    efron_group: Vec<bool>,
    any_efron: bool,
    /// Minimum entries per chunk of the walk ([`MIN_CHUNK`]).
    min_chunk: usize,
    /// Groups from which the refresh is chunked ([`PAR_MIN_GROUPS`]).
    par_min_groups: usize,
    /// Rows from which `set_beta` scatters in parallel chunks, and the least entries of a
    /// chunk of the segment information's Gram rows (tests lower both).
    par_min_rows: usize,
    gram_min_entries: usize,
    // ---- columns ----
    /// Shared by clones: the folds of cross-validation are row weights over one copy
    /// (`risk_set/folds.rs`).
    cols: Arc<Vec<SortedColumn>>,
    /// Σ over events of w x per column (depends on the weights, so not in `cols`).
    event_sum: Vec<f64>,
    /// Input row of each sorted row (shared by clones).
    input_row: Arc<Vec<u32>>,
    /// Rows that a fold leaves out (weight 0, not counted as rows); empty outside folds.
    fold_out: Vec<bool>,
    /// Groups with an event of positive count (all of them outside folds).
    n_event_groups: usize,
    // ---- state ----
    beta: Vec<f64>,
    f_sum: Vec<f64>,
    b_sum: Vec<f64>,
    e0: Vec<f64>,
    diff_f: Vec<f64>,
    diff_b: Vec<f64>,
    dirty: bool,
    /// No tied Efron groups and no (start, stop] rows (Cox or Fine–Gray): updates queue sorted
    /// (position, change) pairs instead of touching the dense difference arrays.
    simple: bool,
    /// Every group has total weight 1 (r_g = 1/S0).
    unit_groups: bool,
    /// Queued (position, change of w e) of the simple path, sorted by position when `pending_sorted`.
    pending: Vec<(u32, f64)>,
    /// Fine–Gray: queued (position, change of B) and per-stratum change of B at the start.
    pending_b: Vec<(u32, f64)>,
    b_start: Vec<f64>,
    pending_sorted: bool,
    /// Something is queued.
    queued: bool,
    /// The state is exactly what `set_beta(beta)` computes (no `update` since): a repeated
    /// `set_beta` with the same coefficients has nothing to do.
    fresh: bool,
    /// Σ_events w·offset (the log-likelihood's linear part is this + Σ_j β_j event_sum_j).
    event_offset_sum: f64,
    // prefix sums over groups (length G + 1)
    /// (Σ_{h<g} r_h, Σ_{h<g} q_h) interleaved, so the walk loads one cache line per position.
    prq: Vec<[f64; 2]>,
    /// Fine–Gray: prefix sums of (r G, q G, q G²), interleaved.
    pg: Vec<[f64; 3]>,
    // Efron per-group coefficients (zero for untied groups)
    eu: Vec<f64>,
    ev: Vec<f64>,
    ez: Vec<f64>,
    /// The latest row-major view of an information request (see `row_major`).
    row_major_cache: Option<RowMajor>,
}

impl RiskSetModel {
    /// Build the model. `censor` (Fine–Gray only) is G(T_i−) per input row.
    pub fn new(
        x: &DesignMatrix,
        ties: Ties,
        kind: RiskSetKind,
        censor: Option<&[f64]>,
    ) -> Result<Self> {
        Self::from_columns(x, x.column_source(), ties, kind, censor)
    }

    /// [`RiskSetModel::new`] on the rows of `x` and the columns `cols` (`x.columns` is not
    /// used; owned columns are dropped as they are converted).
    pub fn from_columns(
        x: &DesignMatrix,
        cols: ColumnSource<'_>,
        ties: Ties,
        kind: RiskSetKind,
        censor: Option<&[f64]>,
    ) -> Result<Self> {
        Self::build(Cow::Borrowed(x), cols, ties, kind, censor)
    }

    /// [`RiskSetModel::new`] consuming the design matrix: the row data is dropped before the
    /// columns are converted, and each column as soon as it is converted.
    pub fn from_owned(
        mut x: DesignMatrix,
        ties: Ties,
        kind: RiskSetKind,
        censor: Option<&[f64]>,
    ) -> Result<Self> {
        let cols = x.take_columns();
        Self::build(Cow::Owned(x), cols, ties, kind, censor)
    }

    fn build(
        design: Cow<'_, DesignMatrix>,
        cols: ColumnSource<'_>,
        ties: Ties,
        kind: RiskSetKind,
        censor: Option<&[f64]>,
    ) -> Result<Self> {
        let x: &DesignMatrix = &design;
        let r = &x.rows;
        let row_time = r.time.as_f64();
        let row_y = r.y.as_f64();
        let row_ids = r.row_id.as_i64();
        let row_stratum = r.stratum.as_u32();
        let n = x.n_rows();
        let fg = kind == RiskSetKind::FineGray;
        let name = if fg { "fine_gray" } else { "cox" };
        let lens_ok = r.time.len() == n
            && r.y.len() == n
            && r.stratum.len() == n
            && r.weight.as_ref().is_none_or(|v| v.len() == n)
            && r.offset.as_ref().is_none_or(|v| v.len() == n)
            && r.start_time.as_ref().is_none_or(|v| v.len() == n)
            && censor.is_none_or(|v| v.len() == n);
        if !lens_ok {
            return Err(Error::BadColumn {
                column: "rows".into(),
                message: "row vectors have inconsistent lengths".into(),
            });
        }
        if fg && r.start_time.is_some() {
            return Err(Error::BadColumn {
                column: "start_time".into(),
                message: "counting-process rows are only supported for cox".into(),
            });
        }
        for i in 0..n {
            let y = row_y[i];
            let ok = y == 0.0 || y == 1.0 || (fg && y == 2.0);
            let bad = |column: &str, message: String| Error::BadValue {
                row: i,
                row_id: row_ids[i],
                column: column.into(),
                message,
            };
            if !ok {
                return Err(bad(
                    "y",
                    format!(
                        "must be {} for {name} (got {y})",
                        if fg { "0, 1 or 2" } else { "0 or 1" }
                    ),
                ));
            }
            if !row_time[i].is_finite() {
                return Err(bad("time", format!("is not finite ({})", row_time[i])));
            }
            let w = x.weight(i);
            if !(w.is_finite() && w >= 0.0) {
                return Err(bad("weight", format!("must be finite and ≥ 0 (got {w})")));
            }
            if !x.offset(i).is_finite() {
                return Err(bad("offset", "is not finite".into()));
            }
            if let Some(st) = &r.start_time {
                if !(st[i].is_finite() && st[i] < row_time[i]) {
                    return Err(bad(
                        "start_time",
                        format!("({}) is not before time ({})", st[i], row_time[i]),
                    ));
                }
            }
        }
        let n_strata = row_stratum
            .iter()
            .map(|&s| s as usize + 1)
            .max()
            .unwrap_or(1);
        // Internal stratum index = rank of the caller's stratum id, so that the order does not
        // depend on the order in which strata first appear in the input.
        let stratum_rank: Vec<u32> = {
            let id = |s: usize| r.stratum_ids.get(s).copied().unwrap_or(s as i64);
            let mut by_id: Vec<usize> = (0..n_strata).collect();
            by_id.sort_unstable_by_key(|&s| (id(s), s));
            let mut rank = vec![0u32; n_strata];
            for (i, &s) in by_id.iter().enumerate() {
                rank[s] = i as u32;
            }
            rank
        };
        let stratum_of = |i: usize| stratum_rank[row_stratum[i] as usize];

        // Sorted order: (stratum, time DESC, row_id).
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_unstable_by(|&a, &b| {
            let (a, b) = (a as usize, b as usize);
            stratum_of(a)
                .cmp(&stratum_of(b))
                .then(row_time[b].total_cmp(&row_time[a]))
                .then(row_ids[a].cmp(&row_ids[b]))
        });
        let mut new_index = vec![0u32; n];
        for (k, &o) in order.iter().enumerate() {
            new_index[o as usize] = k as u32;
        }

        // Groups and entry positions.
        let mut info = vec![RowInfo::default(); n];
        let mut w = vec![0.0; n];
        let mut offset = if r.offset.is_some() {
            vec![0.0; n]
        } else {
            Vec::new()
        };
        let mut event = vec![false; n];
        let mut s_start = vec![0u32; n_strata];
        let mut s_end = vec![0u32; n_strata];
        let mut row_start = vec![0u32; n_strata];
        let mut row_end = vec![0u32; n_strata];
        let mut g_time: Vec<f64> = Vec::new();
        let mut g_weight: Vec<f64> = Vec::new();
        let mut g_count: Vec<u32> = Vec::new();
        let mut g_cens: Vec<f64> = Vec::new();
        let mut k = 0usize;
        while k < n {
            let s = stratum_of(order[k] as usize) as usize;
            s_start[s] = g_time.len() as u32;
            row_start[s] = k as u32;
            while k < n && stratum_of(order[k] as usize) as usize == s {
                let t = row_time[order[k] as usize];
                let block = k;
                let mut weight = 0.0;
                let mut count = 0u32;
                let mut cens = None;
                while k < n
                    && stratum_of(order[k] as usize) as usize == s
                    && row_time[order[k] as usize] == t
                {
                    let o = order[k] as usize;
                    w[k] = x.weight(o);
                    if let Some(off) = &r.offset {
                        offset[k] = off[o];
                    }
                    if row_y[o] == 1.0 {
                        event[k] = true;
                        weight += w[k];
                        count += 1;
                        if cens.is_none() {
                            cens = Some(censor.map_or(1.0, |c| c[o]));
                        }
                    }
                    k += 1;
                }
                let pos = g_time.len() as u32;
                for row in &mut info[block..k] {
                    *row = RowInfo {
                        we: 0.0,
                        pos,
                        stratum: s as u32,
                    };
                }
                if count > 0 {
                    g_time.push(t);
                    g_weight.push(weight);
                    g_count.push(count);
                    g_cens.push(cens.unwrap_or(1.0));
                }
            }
            s_end[s] = g_time.len() as u32;
            row_end[s] = k as u32;
        }
        let n_groups = g_time.len();
        if n_groups == 0 {
            return Err(Error::Empty(format!(
                "{name}: no events (y = 1) in the data"
            )));
        }
        // Rows whose time is below every event time of their stratum got pos = stratum end.
        let active_strata: Vec<u32> = (0..n_strata as u32)
            .filter(|&s| s_start[s as usize] < s_end[s as usize])
            .collect();

        // Counting-process exits.
        let counting = r.start_time.is_some();
        let mut exit = Vec::new();
        let mut all_exits = Vec::new();
        if let Some(st) = &r.start_time {
            exit = vec![0u32; n];
            for ki in 0..n {
                let o = order[ki] as usize;
                let s = info[ki].stratum as usize;
                let (a, b) = (s_start[s] as usize, s_end[s] as usize);
                let times = &g_time[a..b];
                let e = a + times.partition_point(|&t| t > st[o]);
                exit[ki] = (e as u32).max(info[ki].pos);
                if exit[ki] < s_end[s] {
                    all_exits.push((exit[ki], ki as u32));
                }
            }
            all_exits.sort_unstable();
        }

        // Fine–Gray backward weights.
        let mut inv_g = Vec::new();
        if fg {
            inv_g = vec![0.0; n];
            for ki in 0..n {
                let o = order[ki] as usize;
                if row_y[o] == 2.0 {
                    let s = info[ki].stratum as usize;
                    if info[ki].pos > s_start[s] {
                        let g = censor.map_or(1.0, |c| c[o]);
                        if !(g.is_finite() && g > 0.0) {
                            return Err(Error::BadValue {
                                row: o,
                                row_id: row_ids[o],
                                column: "censor_weight".into(),
                                message: format!(
                                    "competing event with censoring survival G(T−) = {g}: it must stay in \
                                     later risk sets with weight G(t−)/G(T−), which needs G(T−) > 0"
                                ),
                            });
                        }
                        inv_g[ki] = 1.0 / g;
                    }
                }
            }
        }

        // The row data is no longer needed (freed here when owned).
        drop(design);
        // Columns in sorted order, dropping rows that are in no risk set.
        let contributes = |ki: usize| -> bool {
            let s = info[ki].stratum as usize;
            info[ki].pos < s_end[s] || (fg && inv_g[ki] != 0.0)
        };
        let sort_column = |c: &super::design::Column| {
            let mut col = SortedColumn::default();
            if c.format == ColumnFormat::Indicator {
                // Row indices only (no (row, value) scratch for 0/1 columns).
                col.rows.reserve_exact(c.nnz());
                col.rows.extend(
                    c.rows
                        .iter()
                        .map(|&i| new_index[i as usize])
                        .filter(|&ki| contributes(ki as usize)),
                );
                col.rows.sort_unstable();
                col.rows.shrink_to_fit();
            } else {
                let mut tmp: Vec<(u32, f64)> = Vec::with_capacity(c.nnz());
                tmp.extend(
                    c.entries()
                        .map(|(i, v)| (new_index[i], v))
                        .filter(|&(ki, v)| v != 0.0 && contributes(ki as usize)),
                );
                tmp.sort_unstable_by_key(|e| e.0);
                col.rows = tmp.iter().map(|e| e.0).collect();
                if !tmp.iter().all(|e| e.1 == 1.0) {
                    col.vals = tmp.iter().map(|e| e.1).collect();
                }
            }
            for i in 0..col.rows.len() {
                let ki = col.rows[i] as usize;
                if counting && exit[ki] < s_end[info[ki].stratum as usize] {
                    col.exits.push((exit[ki], i as u32));
                }
            }
            col.exits.sort_unstable();
            col.blocks = row_blocks::block_starts(&col.rows, n);
            col
        };
        // Independent per column, so the result does not depend on the thread count.
        let cols: Vec<SortedColumn> = cols.par_map(sort_column);
        let event_sum: Vec<f64> = cols
            .iter()
            .map(|col| {
                let mut sum = 0.0;
                for (i, &ki) in col.rows.iter().enumerate() {
                    if event[ki as usize] {
                        sum += w[ki as usize] * col.value(i);
                    }
                }
                sum
            })
            .collect();

        let efron_group: Vec<bool> = g_count
            .iter()
            .map(|&d| ties == Ties::Efron && d >= 2)
            .collect();
        let any_efron = efron_group.iter().any(|&b| b);
        let p = cols.len();
        let mut m = RiskSetModel {
            kind,
            ties,
            fg,
            counting,
            w,
            eta: vec![0.0; n],
            info,
            exit,
            event,
            inv_g,
            offset,
            s_start,
            s_end,
            row_start,
            row_end,
            active_strata,
            all_exits,
            g_weight,
            g_count,
            g_cens,
            efron_group,
            any_efron,
            min_chunk: MIN_CHUNK,
            par_min_groups: PAR_MIN_GROUPS,
            par_min_rows: SCATTER_PAR_MIN_ROWS,
            gram_min_entries: GRAM_PAR_MIN_ENTRIES,
            cols: Arc::new(cols),
            event_sum,
            input_row: Arc::new(order),
            fold_out: Vec::new(),
            n_event_groups: n_groups,
            beta: vec![0.0; p],
            f_sum: vec![0.0; n_groups],
            b_sum: if fg { vec![0.0; n_groups] } else { Vec::new() },
            e0: vec![0.0; n_groups],
            diff_f: vec![0.0; n_groups + 1],
            diff_b: if fg {
                vec![0.0; n_groups + 1]
            } else {
                Vec::new()
            },
            dirty: true,
            simple: !counting && !any_efron,
            unit_groups: false,
            pending: Vec::new(),
            pending_b: Vec::new(),
            b_start: if fg { vec![0.0; n_strata] } else { Vec::new() },
            pending_sorted: true,
            queued: false,
            fresh: false,
            event_offset_sum: 0.0,
            prq: vec![[0.0; 2]; n_groups + 1],
            pg: if fg {
                vec![[0.0; 3]; n_groups + 1]
            } else {
                Vec::new()
            },
            eu: if any_efron {
                vec![0.0; n_groups]
            } else {
                Vec::new()
            },
            ev: if any_efron {
                vec![0.0; n_groups]
            } else {
                Vec::new()
            },
            ez: if any_efron {
                vec![0.0; n_groups]
            } else {
                Vec::new()
            },
            row_major_cache: None,
        };
        m.unit_groups = m.g_weight.iter().all(|&w| w == 1.0);
        m.event_offset_sum = (0..m.offset.len())
            .filter(|&k| m.event[k])
            .map(|k| m.w[k] * m.offset[k])
            .sum();
        let beta = vec![0.0; p];
        m.set_beta(&beta);
        Ok(m)
    }

    /// Use chunks of at least `entries` column entries (tests force tiny chunks with it).
    #[cfg(test)]
    pub(crate) fn set_min_chunk(&mut self, entries: usize) {
        self.min_chunk = entries;
        self.par_min_groups = entries.saturating_mul(4);
        self.par_min_rows = entries.saturating_mul(4);
        self.gram_min_entries = entries;
    }

    /// Σ over events of w x per column (the log-likelihood's linear part).
    pub(crate) fn event_sums(&self) -> &[f64] {
        &self.event_sum
    }

    /// Which likelihood this is.
    pub fn kind(&self) -> RiskSetKind {
        self.kind
    }

    /// Tie handling.
    pub fn ties(&self) -> Ties {
        self.ties
    }

    /// Number of event groups (distinct (stratum, event time) pairs).
    pub fn n_groups(&self) -> usize {
        self.g_weight.len()
    }

    /// Number of coefficients.
    pub fn n_coef(&self) -> usize {
        self.cols.len()
    }

    /// Scatter a change `delta` of w·e of sorted row `k` into the difference arrays.
    #[inline]
    fn scatter(&mut self, k: usize, delta: f64) {
        let RowInfo { pos, stratum, .. } = self.info[k];
        let (st, end) = (self.s_start[stratum as usize], self.s_end[stratum as usize]);
        if pos < end {
            self.diff_f[pos as usize] += delta;
            if self.counting && self.exit[k] < end {
                self.diff_f[self.exit[k] as usize] -= delta;
            }
            if self.any_efron && self.event[k] {
                self.e0[pos as usize] += delta;
            }
        }
        if self.fg {
            let inv = self.inv_g[k];
            if inv != 0.0 {
                let d = delta * inv;
                self.diff_b[st as usize] += d;
                if pos < end {
                    self.diff_b[pos as usize] -= d;
                }
            }
        }
        self.dirty = true;
    }

    /// Set β and recompute η, w·e and every risk-set sum from scratch (nothing to do when the
    /// state already is that of `set_beta` at the same β, with no `update` since).
    pub fn set_beta(&mut self, beta: &[f64]) {
        let p = self.cols.len().min(beta.len());
        let same = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        if self.fresh && same(&self.beta[..p], &beta[..p]) {
            return;
        }
        self.beta[..p].copy_from_slice(&beta[..p]);
        self.f_sum.fill(0.0);
        self.b_sum.fill(0.0);
        self.e0.fill(0.0);
        self.diff_f.fill(0.0);
        self.diff_b.fill(0.0);
        self.pending.clear();
        self.pending_b.clear();
        self.b_start.fill(0.0);
        self.queued = false;
        self.pending_sorted = true;
        // η = offset + Σ_j β_j x_j, column after column for each row, and w·e = w exp(η), in
        // one pass over row blocks (in parallel).
        let moving: Vec<(SparseCol<'_>, f64)> = self
            .cols
            .iter()
            .zip(&self.beta)
            .filter(|(_, &b)| b != 0.0)
            .map(|(c, &b)| (c.view(), b))
            .collect();
        {
            use rayon::prelude::*;
            let offset = &self.offset[..];
            self.eta
                .par_chunks_mut(row_blocks::ROW_BLOCK)
                .zip(self.info.par_chunks_mut(row_blocks::ROW_BLOCK))
                .zip(self.w.par_chunks(row_blocks::ROW_BLOCK))
                .enumerate()
                .for_each(|(b, ((eta, info), w))| {
                    if offset.is_empty() {
                        eta.fill(0.0);
                    } else {
                        let r0 = b * row_blocks::ROW_BLOCK;
                        eta.copy_from_slice(&offset[r0..r0 + eta.len()]);
                    }
                    row_blocks::add_columns_block(b, eta, &moving);
                    for ((row, &w), &eta) in info.iter_mut().zip(w).zip(eta.iter()) {
                        row.we = w * eta.exp();
                    }
                });
        }
        drop(moving);
        if self.counting {
            for k in 0..self.eta.len() {
                self.scatter(k, self.info[k].we);
            }
        } else {
            self.scatter_all();
        }
        self.refresh();
        self.fresh = true;
    }

    /// [`RiskSetModel::scatter`] of every row's w·e into the cleared difference arrays, without
    /// (start, stop] rows: the rows are split at fixed places (a function of N only, moved to
    /// where the position changes) into chunks that run in parallel, each writing the positions
    /// of its own rows — every position's sum is the same additions in the same order as one
    /// loop. The Fine–Gray stratum totals (B at the stratum's first group) are summed per chunk
    /// in row order and added in chunk order.
    fn scatter_all(&mut self) {
        use rayon::prelude::*;
        let n = self.info.len();
        // Sorted rows are in position order (strata in order, time descending; folds map
        // positions monotonically), so the chunks' positions do not overlap.
        debug_assert!(self.info.windows(2).all(|w| w[0].pos <= w[1].pos));
        let n_chunks = if n >= self.par_min_rows {
            SCATTER_CHUNKS
        } else {
            1
        };
        // Row cuts, each moved forward past rows of the same position.
        let mut cuts = vec![0usize];
        for c in 1..n_chunks {
            let mut i = (c * n / n_chunks).max(*cuts.last().unwrap_or(&0));
            while i > 0 && i < n && self.info[i].pos == self.info[i - 1].pos {
                i += 1;
            }
            if i > *cuts.last().unwrap_or(&0) && i < n {
                cuts.push(i);
            }
        }
        cuts.push(n);
        // Chunk c writes the positions from its first row's to the next chunk's first row's.
        let n_pos = self.diff_f.len();
        let pos_cut = |c: usize| -> usize {
            if c + 1 == cuts.len() {
                n_pos
            } else {
                (self.info[cuts[c]].pos as usize).min(n_pos)
            }
        };
        let mut pos_cuts: Vec<usize> = (0..cuts.len()).map(pos_cut).collect();
        pos_cuts[0] = 0;
        let (fg, efron) = (self.fg, self.any_efron);
        let info = &self.info[..];
        let (s_end, event, inv_g) = (&self.s_end[..], &self.event[..], &self.inv_g[..]);
        let mut jobs = Vec::with_capacity(cuts.len() - 1);
        {
            let mut f_rest = &mut self.diff_f[..];
            let mut b_rest: &mut [f64] = if fg { &mut self.diff_b[..] } else { &mut [] };
            let mut e_rest = &mut self.e0[..];
            for c in 0..cuts.len() - 1 {
                let (p0, p1) = (pos_cuts[c], pos_cuts[c + 1]);
                let (f, fr) = f_rest.split_at_mut(p1 - p0);
                f_rest = fr;
                let b = if fg {
                    let (b, br) = b_rest.split_at_mut(p1 - p0);
                    b_rest = br;
                    b
                } else {
                    &mut [][..]
                };
                // e0 has one entry per group (no entry at the end position).
                let e_len = p1.min(e_rest.len() + p0) - p0;
                let (e, er) = e_rest.split_at_mut(e_len);
                e_rest = er;
                jobs.push((cuts[c], cuts[c + 1], p0, f, b, e));
            }
        }
        // Each chunk also sums w e / G of its competing rows per stratum (in row order); the
        // totals go to the strata's first groups in chunk order.
        let totals: Vec<Vec<(u32, f64)>> = jobs
            .into_par_iter()
            .map(|(r0, r1, p0, f, b, e)| {
                let mut totals: Vec<(u32, f64)> = Vec::new();
                for k in r0..r1 {
                    let RowInfo { we, pos, stratum } = info[k];
                    if fg {
                        let inv = inv_g[k];
                        if inv != 0.0 {
                            let d = we * inv;
                            match totals.last_mut() {
                                Some((s, t)) if *s == stratum => *t += d,
                                _ => totals.push((stratum, d)),
                            }
                            if pos < s_end[stratum as usize] {
                                b[pos as usize - p0] -= d;
                            }
                        }
                    }
                    if pos >= s_end[stratum as usize] {
                        continue;
                    }
                    let at = pos as usize - p0;
                    f[at] += we;
                    if efron && event[k] {
                        e[at] += we;
                    }
                }
                totals
            })
            .collect();
        for (s, t) in totals.into_iter().flatten() {
            self.diff_b[self.s_start[s as usize] as usize] += t;
        }
        self.dirty = true;
    }

    /// Apply pending changes (difference arrays) and rebuild the per-group coefficients and
    /// their prefix sums. O(G).
    fn refresh(&mut self) {
        if self.queued {
            if !self.pending_sorted {
                // Stable: equal positions keep their (deterministic) queue order.
                self.pending.sort_by_key(|e| e.0);
                self.pending_b.sort_by_key(|e| e.0);
                self.pending_sorted = true;
            }
            match (self.unit_groups, self.fg) {
                (true, false) => self.refresh_pending::<true, false>(),
                (false, false) => self.refresh_pending::<false, false>(),
                (true, true) => self.refresh_pending::<true, true>(),
                (false, true) => self.refresh_pending::<false, true>(),
            }
            self.pending.clear();
            self.pending_b.clear();
            self.b_start.fill(0.0);
            self.queued = false;
        }
        if !self.dirty {
            return;
        }
        match (self.fg, self.any_efron) {
            (false, false) => self.refresh_impl::<false, false>(),
            (false, true) => self.refresh_impl::<false, true>(),
            (true, false) => self.refresh_impl::<true, false>(),
            (true, true) => self.refresh_impl::<true, true>(),
        }
        self.dirty = false;
    }

    /// One fused pass over the groups: apply the pending differences, then r_g, q_g (Efron:
    /// u, v, z) and their prefix sums.
    fn refresh_impl<const FG: bool, const EFRON: bool>(&mut self) {
        let (mut r_acc, mut q_acc, mut rg_acc, mut qg_acc, mut qgg_acc) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for si in 0..self.active_strata.len() {
            let s = self.active_strata[si] as usize;
            let (a, b) = (self.s_start[s] as usize, self.s_end[s] as usize);
            let (mut run_f, mut run_b) = (0.0, 0.0);
            for g in a..b {
                run_f += self.diff_f[g];
                self.diff_f[g] = 0.0;
                let f = self.f_sum[g] + run_f;
                self.f_sum[g] = f;
                let s0 = if FG {
                    run_b += self.diff_b[g];
                    self.diff_b[g] = 0.0;
                    let bb = self.b_sum[g] + run_b;
                    self.b_sum[g] = bb;
                    f + self.g_cens[g] * bb
                } else {
                    f
                };
                let wg = self.g_weight[g];
                let (r, q) = if EFRON && self.efron_group[g] {
                    let d = self.g_count[g];
                    let wbar = wg / d as f64;
                    let e0 = self.e0[g];
                    let (mut r, mut q, mut u, mut v, mut z) = (0.0, 0.0, 0.0, 0.0, 0.0);
                    for l in 0..d {
                        let f = l as f64 / d as f64;
                        let inv = 1.0 / (s0 - f * e0);
                        let inv2 = inv * inv;
                        r += wbar * inv;
                        q += wbar * inv2;
                        u += wbar * f * inv;
                        v += wbar * f * inv2;
                        z += wbar * f * f * inv2;
                    }
                    if wg == 0.0 {
                        (r, q, u, v, z) = (0.0, 0.0, 0.0, 0.0, 0.0);
                    }
                    self.eu[g] = u;
                    self.ev[g] = v;
                    self.ez[g] = z;
                    (r, q)
                } else {
                    let inv = 1.0 / s0;
                    let r = wg * inv;
                    if wg != 0.0 {
                        (r, r * inv)
                    } else {
                        (0.0, 0.0)
                    }
                };
                r_acc += r;
                q_acc += q;
                self.prq[g + 1] = [r_acc, q_acc];
                if FG {
                    let gc = self.g_cens[g];
                    rg_acc += r * gc;
                    qg_acc += q * gc;
                    qgg_acc += q * gc * gc;
                    self.pg[g + 1] = [rg_acc, qg_acc, qgg_acc];
                }
            }
        }
    }

    /// The queued path's refresh: merge the sorted queues of changes into F (and B for
    /// Fine–Gray) and rebuild r, q (and r G, q G, q G²) and their prefix sums. The groups are
    /// split into a fixed number of chunks (a function of G only, so results never depend on
    /// the thread count); each chunk builds local prefix sums, and a second pass adds the chunk
    /// offsets.
    fn refresh_pending<const UNIT: bool, const FG: bool>(&mut self) {
        let queue_f = std::mem::take(&mut self.pending);
        let queue_b = std::mem::take(&mut self.pending_b);
        let n_groups = self.g_weight.len();
        let n_chunks = if n_groups >= self.par_min_groups {
            REFRESH_CHUNKS
        } else {
            1
        };
        let bounds: Vec<usize> = (0..=n_chunks).map(|c| c * n_groups / n_chunks).collect();
        let starts: Vec<u32> = self
            .active_strata
            .iter()
            .map(|&s| self.s_start[s as usize])
            .collect();
        let starts_b: Vec<f64> = if FG {
            self.active_strata
                .iter()
                .map(|&s| self.b_start[s as usize])
                .collect()
        } else {
            vec![0.0; starts.len()]
        };
        let sum_between = |q: &[(u32, f64)], lo: usize, hi: usize| -> f64 {
            let a = q.partition_point(|e| (e.0 as usize) < lo);
            let b = q.partition_point(|e| (e.0 as usize) < hi);
            q[a..b.max(a)].iter().map(|e| e.1).sum()
        };
        let slice_of = |q: &'_ [(u32, f64)], lo: usize, hi: usize| -> std::ops::Range<usize> {
            let a = q.partition_point(|e| (e.0 as usize) < lo);
            let b = q.partition_point(|e| (e.0 as usize) < hi);
            a..b.max(a)
        };
        let mut jobs = Vec::with_capacity(n_chunks);
        {
            let mut f_rest = &mut self.f_sum[..];
            let mut b_rest = &mut self.b_sum[..];
            let mut o_rest = &mut self.prq[1..];
            let mut og_rest: &mut [[f64; 3]] = if FG { &mut self.pg[1..] } else { &mut [] };
            for c in 0..n_chunks {
                let (c0, c1) = (bounds[c], bounds[c + 1]);
                let len = c1 - c0;
                let (f, fr) = f_rest.split_at_mut(len);
                f_rest = fr;
                let (o, or) = o_rest.split_at_mut(len);
                o_rest = or;
                let (b, og) = if FG {
                    let (b, br) = b_rest.split_at_mut(len);
                    b_rest = br;
                    let (og, ogr) = og_rest.split_at_mut(len);
                    og_rest = ogr;
                    (b, og)
                } else {
                    (&mut [][..], &mut [][..])
                };
                // The stratum containing c0 starts at the last start ≤ c0.
                let own = starts.partition_point(|&st| st as usize <= c0);
                let stratum_start = if own > 0 { starts[own - 1] as usize } else { 0 };
                let carry_f = sum_between(&queue_f, stratum_start, c0);
                let carry_b = if FG && own > 0 {
                    starts_b[own - 1] + sum_between(&queue_b, stratum_start, c0)
                } else {
                    0.0
                };
                let s1 = starts.partition_point(|&st| (st as usize) < c1).max(own);
                jobs.push(ChunkJob {
                    c0,
                    f,
                    b,
                    out: o,
                    out_g: og,
                    queue_f: &queue_f[slice_of(&queue_f, c0, c1)],
                    queue_b: &queue_b[slice_of(&queue_b, c0, c1)],
                    starts: &starts[own..s1],
                    starts_b: &starts_b[own..s1],
                    carry_f,
                    carry_b,
                });
            }
        }
        let weight = &self.g_weight[..];
        let g_cens = &self.g_cens[..];
        let run_chunk = |job: ChunkJob| refresh_chunk::<UNIT, FG>(job, weight, g_cens);
        let totals: Vec<[f64; 5]> = if n_chunks == 1 {
            jobs.into_iter().map(run_chunk).collect()
        } else {
            use rayon::prelude::*;
            jobs.into_par_iter().map(run_chunk).collect()
        };
        if n_chunks > 1 {
            let mut offsets = Vec::with_capacity(n_chunks);
            let mut acc = [0.0; 5];
            for t in &totals {
                offsets.push(acc);
                for (a, v) in acc.iter_mut().zip(t) {
                    *a += v;
                }
            }
            use rayon::prelude::*;
            let mut slices = Vec::with_capacity(n_chunks);
            let mut o_rest = &mut self.prq[1..];
            let mut og_rest: &mut [[f64; 3]] = if FG { &mut self.pg[1..] } else { &mut [] };
            for c in 0..n_chunks {
                let len = bounds[c + 1] - bounds[c];
                let (o, or) = o_rest.split_at_mut(len);
                o_rest = or;
                let og = if FG {
                    let (og, ogr) = og_rest.split_at_mut(len);
                    og_rest = ogr;
                    og
                } else {
                    &mut [][..]
                };
                slices.push((o, og, offsets[c]));
            }
            slices.into_par_iter().skip(1).for_each(|(o, og, off)| {
                for v in o.iter_mut() {
                    v[0] += off[0];
                    v[1] += off[1];
                }
                for v in og.iter_mut() {
                    v[0] += off[2];
                    v[1] += off[3];
                    v[2] += off[4];
                }
            });
        }
        self.pending = queue_f;
        self.pending_b = queue_b;
    }

    /// S0 of group `g` at the current state.
    #[inline]
    fn s0(&self, g: usize) -> f64 {
        if self.fg {
            self.f_sum[g] + self.g_cens[g] * self.b_sum[g]
        } else {
            self.f_sum[g]
        }
    }

    /// Log partial likelihood at the current state.
    pub fn log_likelihood(&mut self) -> f64 {
        self.refresh();
        let mut ll = self.event_offset_sum;
        for (&sum, &b) in self.event_sum.iter().zip(&self.beta) {
            if b != 0.0 {
                ll += b * sum;
            }
        }
        // The groups' terms in blocks of ROW_BLOCK groups (in parallel), each block summed
        // in group order and the blocks' sums added in block order: fixed blocks, so the
        // same bits for any number of threads.
        let sums: Vec<f64> = {
            use rayon::prelude::*;
            let n_groups = self.g_weight.len();
            (0..n_groups.div_ceil(row_blocks::ROW_BLOCK))
                .into_par_iter()
                .map(|b| {
                    let g0 = b * row_blocks::ROW_BLOCK;
                    let mut acc = 0.0;
                    for g in g0..(g0 + row_blocks::ROW_BLOCK).min(n_groups) {
                        let wg = self.g_weight[g];
                        if wg == 0.0 {
                            continue;
                        }
                        let s0 = self.s0(g);
                        if self.any_efron && self.efron_group[g] {
                            let d = self.g_count[g];
                            let wbar = wg / d as f64;
                            for l in 0..d {
                                acc += wbar * (s0 - (l as f64 / d as f64) * self.e0[g]).ln();
                            }
                        } else {
                            acc += wg * s0.ln();
                        }
                    }
                    acc
                })
                .collect()
        };
        for sum in sums {
            ll -= sum;
        }
        ll
    }

    /// β_j += delta.
    pub fn update(&mut self, j: usize, delta: f64) {
        if j >= self.cols.len() {
            return;
        }
        self.fresh = false;
        self.beta[j] += delta;
        // A handle on the shared columns, to avoid borrowing self twice.
        let cols = Arc::clone(&self.cols);
        let col = &cols[j];
        // η is not kept between cycles (set_beta recomputes it); w e changes by exp(Δ x).
        if self.simple {
            // Positions within one column are nondecreasing; only a second update before the
            // next refresh can unsort the queues.
            let first = col
                .rows
                .first()
                .map_or(u32::MAX, |&k| self.info[k as usize].pos);
            self.pending_sorted &= self.pending.last().is_none_or(|&(p, _)| first >= p);
            self.pending_sorted &= self.pending_b.last().is_none_or(|&(p, _)| first >= p);
            self.pending.reserve(col.rows.len());
            self.queued = true;
        }
        let factor = delta.exp();
        for (i, &k) in col.rows.iter().enumerate() {
            if i + UPDATE_AHEAD < col.rows.len() {
                prefetch(
                    self.info
                        .as_ptr()
                        .wrapping_add(col.rows[i + UPDATE_AHEAD] as usize),
                );
            }
            let k = k as usize;
            let f = if col.vals.is_empty() {
                factor
            } else {
                (delta * col.vals[i]).exp()
            };
            let old = self.info[k].we;
            let we = old * f;
            self.info[k].we = we;
            if self.simple {
                let RowInfo { pos, stratum, .. } = self.info[k];
                let inside = pos < self.s_end[stratum as usize];
                let change = we - old;
                if inside {
                    self.pending.push((pos, change));
                }
                if self.fg && self.inv_g[k] != 0.0 {
                    let d = change * self.inv_g[k];
                    self.b_start[stratum as usize] += d;
                    if inside {
                        self.pending_b.push((pos, -d));
                    }
                }
            } else {
                self.scatter(k, we - old);
            }
        }
        if self.simple {
            // Positions within one column are nondecreasing.
        } else {
            self.dirty = true;
        }
    }

    /// (∂LL/∂β_j, −∂²LL/∂β_j²) at the current state.
    pub fn gradient_hessian(&mut self, j: usize) -> (f64, f64) {
        if j >= self.cols.len() {
            return (0.0, 0.0);
        }
        self.refresh();
        self.column_gh(j, true)
    }

    /// [`RiskSetModel::gradient_hessian`] of every column in `cols` at the current state,
    /// the columns in parallel (each column's chunks walked one after another, and combined
    /// as `gradient_hessian` does: the same bits, whatever the number of threads). One fork
    /// for all the columns instead of one per column.
    pub fn gradient_hessians(&mut self, cols: &[usize]) -> Vec<(f64, f64)> {
        use rayon::prelude::*;
        self.refresh();
        let this = &*self;
        cols.par_iter()
            .with_max_len(1)
            .map(|&j| {
                if j < this.cols.len() {
                    this.column_gh(j, false)
                } else {
                    (0.0, 0.0)
                }
            })
            .collect()
    }

    /// (g_j, h_j) of column `j` (< n_coef) on the refreshed state; its chunks walked in
    /// parallel when `parallel`.
    fn column_gh(&self, j: usize, parallel: bool) -> (f64, f64) {
        let col = &self.cols[j];
        let n = col.rows.len();
        if n == 0 {
            return (0.0, 0.0);
        }
        let bounds = self.chunk_bounds(col);
        let walk = |c: usize| -> ChunkOut {
            let (i0, i1) = (bounds[c], bounds[c + 1]);
            match (col.vals.is_empty(), self.fg) {
                (true, false) => self.walk_chunk::<true, false>(col, i0, i1),
                (false, false) => self.walk_chunk::<false, false>(col, i0, i1),
                (true, true) => self.walk_chunk::<true, true>(col, i0, i1),
                (false, true) => self.walk_chunk::<false, true>(col, i0, i1),
            }
        };
        let n_chunks = bounds.len() - 1;
        let outs: Vec<ChunkOut> = if n_chunks == 1 {
            vec![walk(0)]
        } else if parallel {
            use rayon::prelude::*;
            (0..n_chunks).into_par_iter().map(walk).collect()
        } else {
            (0..n_chunks).map(walk).collect()
        };
        // Combine in chunk order (fixed, independent of the number of threads).
        let mut acc = WalkAcc::default();
        let mut pending: Vec<Piece> = Vec::new();
        for out in outs {
            for piece in out.open {
                let ends = piece.ends;
                pending.push(piece);
                if ends {
                    acc.add(&self.resolve(&pending));
                    pending.clear();
                }
            }
            acc.add(&out.resolved);
        }
        if col.vals.is_empty() {
            // x² = x: the S2 sums equal the S1 sums.
            acc.lin2 = acc.lin;
        }
        let g = self.event_sum[j] - acc.lin + acc.gcorr;
        let h = acc.lin2 - acc.quad + acc.hcorr;
        (g, h)
    }

    /// Split a column's entries into a fixed number of chunks (depends only on the data, never
    /// on the thread count), cutting only where the (stratum, position) key changes.
    fn chunk_bounds(&self, col: &SortedColumn) -> Vec<usize> {
        let n = col.rows.len();
        let n_chunks = if self.counting {
            1
        } else {
            (n / self.min_chunk.max(1)).clamp(1, MAX_CHUNKS)
        };
        let mut bounds = Vec::with_capacity(n_chunks + 1);
        bounds.push(0);
        let key = |i: usize| {
            let ri = self.info[col.rows[i] as usize];
            (ri.stratum, ri.pos)
        };
        for c in 1..n_chunks {
            let mut i = (c * n / n_chunks).max(*bounds.last().unwrap_or(&0));
            while i > 0 && i < n && key(i) == key(i - 1) {
                i += 1;
            }
            if i > *bounds.last().unwrap_or(&0) && i < n {
                bounds.push(i);
            }
        }
        bounds.push(n);
        bounds
    }

    /// The walk without counting-process exits: a tight loop over the entries of each run.
    #[inline(never)]
    fn walk_entries<const IND: bool, const FG: bool>(
        &self,
        col: &SortedColumn,
        i0: usize,
        i1: usize,
    ) -> ChunkOut {
        let mut out = ChunkOut::default();
        let rows = &col.rows[..];
        let vals = &col.vals[..];
        let efron = self.any_efron;
        let mut i = i0;
        while i < i1 {
            let first = self.info[rows[i] as usize];
            let s = first.stratum;
            let continues = i == i0 && i0 > 0 && self.info[rows[i0 - 1] as usize].stratum == s;
            let start = if continues {
                first.pos
            } else {
                self.s_start[s as usize]
            };
            // A local copy that never escapes, so that the hot state stays in registers.
            let mut r = Run::open(self, start, !continues);
            while i < i1 {
                // The gathers are monotone but sparse: fetch ahead (a hint; never faults).
                if i + INFO_AHEAD < i1 {
                    prefetch(
                        self.info
                            .as_ptr()
                            .wrapping_add(rows[i + INFO_AHEAD] as usize),
                    );
                }
                if i + PREFIX_AHEAD < i1 {
                    let ahead = self.info[rows[i + PREFIX_AHEAD] as usize].pos as usize;
                    prefetch(self.prq.as_ptr().wrapping_add(ahead));
                }
                let k = rows[i] as usize;
                let ri = self.info[k];
                if ri.stratum != s {
                    break;
                }
                let p = ri.pos;
                if p != r.p0 {
                    if efron {
                        self.efron_eval::<FG>(&mut r);
                    }
                    self.flush::<FG>(&mut r, p);
                }
                let x = if IND { 1.0 } else { vals[i] };
                let c = ri.we * x;
                r.a += c;
                if !IND {
                    r.a2 += c * x;
                }
                if FG {
                    let inv = self.inv_g[k];
                    r.b -= c * inv;
                    if !IND {
                        r.b2 -= c * x * inv;
                    }
                }
                if efron
                    && self.event[k]
                    && (p as usize) < self.efron_group.len()
                    && self.efron_group[p as usize]
                {
                    r.e1 += c;
                    r.e2 += c * x;
                    r.pending = true;
                }
                i += 1;
            }
            let mut run = r;
            if i == i1 && i1 < rows.len() && self.info[rows[i1] as usize].stratum == s {
                // The stratum continues in the next chunk, whose first position ends this run.
                if efron {
                    self.efron_eval::<FG>(&mut run);
                }
                self.flush::<FG>(&mut run, self.info[rows[i1] as usize].pos);
                out.open.push(run.piece(false));
            } else {
                self.finish_run::<FG>(&mut run, s, &mut out);
            }
        }
        out
    }

    /// The walk over entries `i0..i1` of one column (plus its exits when it is the only chunk).
    #[inline(never)]
    fn walk_chunk<const IND: bool, const FG: bool>(
        &self,
        col: &SortedColumn,
        i0: usize,
        i1: usize,
    ) -> ChunkOut {
        let mut out = ChunkOut::default();
        let mut run = Run::default();
        let mut cur_s = u32::MAX;
        let exits: &[(u32, u32)] = if i0 == 0 && i1 == col.rows.len() {
            &col.exits
        } else {
            &[]
        };
        if exits.is_empty() {
            return self.walk_entries::<IND, FG>(col, i0, i1);
        }
        let mut xi = 0usize;
        let mut i = i0;
        let efron = self.any_efron;
        let stratum_of_entry = |i: usize| self.info[col.rows[i] as usize].stratum;
        loop {
            // Next breakpoint: entry i or exit xi, by (stratum, position).
            let entry_key = (i < i1).then(|| {
                let ri = self.info[col.rows[i] as usize];
                (ri.stratum, ri.pos)
            });
            let exit_key = (xi < exits.len()).then(|| {
                let (p, ei) = exits[xi];
                (stratum_of_entry(ei as usize), p)
            });
            let (take_exit, (s, p)) = match (entry_key, exit_key) {
                (None, None) => break,
                (Some(e), None) => (false, e),
                (None, Some(x)) => (true, x),
                (Some(e), Some(x)) => {
                    if x < e {
                        (true, x)
                    } else {
                        (false, e)
                    }
                }
            };
            if s != cur_s {
                if cur_s != u32::MAX {
                    self.finish_run::<FG>(&mut run, cur_s, &mut out);
                }
                cur_s = s;
                let continues = i == i0 && i0 > 0 && stratum_of_entry(i0 - 1) == s;
                run = Run::open(
                    self,
                    if continues {
                        p
                    } else {
                        self.s_start[s as usize]
                    },
                    !continues,
                );
            }
            if p != run.p0 {
                if efron {
                    self.efron_eval::<FG>(&mut run);
                }
                self.flush::<FG>(&mut run, p);
            }
            let (ei, sign) = if take_exit {
                let e = exits[xi].1 as usize;
                xi += 1;
                (e, -1.0)
            } else {
                i += 1;
                (i - 1, 1.0)
            };
            let k = col.rows[ei] as usize;
            let x = if IND { 1.0 } else { col.vals[ei] };
            let c = self.info[k].we * x * sign;
            run.a += c;
            if !IND {
                run.a2 += c * x;
            }
            if FG {
                let inv = self.inv_g[k];
                run.b -= c * inv;
                if !IND {
                    run.b2 -= c * x * inv;
                }
            }
            if efron
                && !take_exit
                && self.event[k]
                && (p as usize) < self.efron_group.len()
                && self.efron_group[p as usize]
            {
                run.e1 += c;
                run.e2 += c * x;
                run.pending = true;
            }
        }
        if cur_s != u32::MAX {
            if i1 < col.rows.len() && stratum_of_entry(i1) == cur_s {
                // The stratum continues in the next chunk, whose first position ends this run.
                if efron {
                    self.efron_eval::<FG>(&mut run);
                }
                self.flush::<FG>(&mut run, self.info[col.rows[i1] as usize].pos);
                out.open.push(run.piece(false));
            } else {
                self.finish_run::<FG>(&mut run, cur_s, &mut out);
            }
        }
        out
    }

    /// Close a run at its stratum's end.
    fn finish_run<const FG: bool>(&self, run: &mut Run, s: u32, out: &mut ChunkOut) {
        if self.any_efron {
            self.efron_eval::<FG>(run);
        }
        self.flush::<FG>(run, self.s_end[s as usize]);
        let piece = run.piece(true);
        if run.starts {
            out.resolved.add(&self.resolve(&[piece]));
        } else {
            out.open.push(piece);
        }
    }

    /// Resolve the runs of one whole stratum (in order): run i started with a = Σ_{k<i} a_k
    /// and b = Btot + Σ_{k<i} b_k, where the backward total Btot = −Σ_k b_k (the walk starts b
    /// at 0 and subtracts every competing row once).
    fn resolve(&self, pieces: &[Piece]) -> WalkAcc {
        let mut acc = WalkAcc::default();
        let (mut a, mut a2) = (0.0, 0.0);
        let mut b = -pieces.iter().map(|p| p.b).sum::<f64>();
        let mut b2 = -pieces.iter().map(|p| p.b2).sum::<f64>();
        for p in pieces {
            let (s, e) = (p.p_first as usize, p.p_end as usize);
            let (dr, dq) = (
                self.prq[e][0] - self.prq[s][0],
                self.prq[e][1] - self.prq[s][1],
            );
            let mut piece = p.acc;
            piece.lin += a * dr;
            piece.lin2 += a2 * dr;
            piece.quad += 2.0 * a * p.cross_q + a * a * dq;
            piece.hcorr += 2.0 * a * p.ve1;
            if self.fg {
                let drg = self.pg[e][0] - self.pg[s][0];
                let (dqg, dqgg) = (self.pg[e][1] - self.pg[s][1], self.pg[e][2] - self.pg[s][2]);
                piece.lin += b * drg;
                piece.lin2 += b2 * drg;
                piece.quad += 2.0 * b * p.cross_qg + 2.0 * a * b * dqg + b * b * dqgg;
                piece.hcorr += 2.0 * b * p.ve1g;
            }
            acc.add(&piece);
            a += p.a;
            a2 += p.a2;
            b += p.b;
            b2 += p.b2;
        }
        acc
    }

    #[inline(always)]
    fn flush<const FG: bool>(&self, run: &mut Run, p1: u32) {
        if p1 <= run.p0 {
            return;
        }
        let p = p1 as usize;
        let [r1, q1] = self.prq[p];
        let (dr, dq) = (r1 - run.r0, q1 - run.q0);
        let (a, a2) = (run.a, run.a2);
        if FG {
            let [rg1, qg1, qgg1] = self.pg[p];
            let (drg, dqg, dqgg) = (rg1 - run.rg0, qg1 - run.qg0, qgg1 - run.qgg0);
            let b = run.b;
            run.acc.lin += a * dr + b * drg;
            run.acc.lin2 += a2 * dr + run.b2 * drg;
            run.acc.quad += a * a * dq + 2.0 * a * b * dqg + b * b * dqgg;
            // Σ S1 q and Σ S1 q G over the run, for the offsets resolved later.
            run.cross_q += a * dq + b * dqg;
            run.cross_qg += a * dqg + b * dqgg;
            run.rg0 = rg1;
            run.qg0 = qg1;
            run.qgg0 = qgg1;
        } else {
            run.acc.lin += a * dr;
            run.acc.lin2 += a2 * dr;
            run.acc.quad += a * a * dq;
            run.cross_q += a * dq;
        }
        run.r0 = r1;
        run.q0 = q1;
        run.p0 = p1;
    }

    #[inline(always)]
    fn efron_eval<const FG: bool>(&self, run: &mut Run) {
        if !run.pending {
            return;
        }
        let g = run.p0 as usize;
        let s1 = if FG {
            run.a + self.g_cens[g] * run.b
        } else {
            run.a
        };
        let (u, v, z) = (self.eu[g], self.ev[g], self.ez[g]);
        run.acc.gcorr += u * run.e1;
        run.acc.hcorr -= u * run.e2 - 2.0 * v * s1 * run.e1 + z * run.e1 * run.e1;
        run.ve1 += v * run.e1;
        if FG {
            run.ve1g += v * run.e1 * self.g_cens[g];
        }
        run.e1 = 0.0;
        run.e2 = 0.0;
        run.pending = false;
    }

    /// Observed information (−Hessian) over `cols`, row-major. Up to
    /// 32 columns from dense per-group sums (`information_dense`), above
    /// that by the sparse sweep of `information_sweep` (O(N + nnz·k) instead of O((N + G)·k²)).
    pub fn information(&mut self, cols: &[usize]) -> Vec<f64> {
        if (SWEEP_MIN_COLS..=ROW_MAJOR_MAX_COLS).contains(&cols.len()) {
            self.information_sweep(cols)
        } else {
            self.information_dense(cols)
        }
    }

    /// The Newton matrix of the active-set polish ([`crate::model::Likelihood`]): the
    /// segment bound of `information_segments` from 33 columns on.
    pub fn approximate_information(&mut self, cols: &[usize]) -> Option<Vec<f64>> {
        (SWEEP_MIN_COLS..=ROW_MAJOR_MAX_COLS)
            .contains(&cols.len())
            .then(|| self.information_segments(cols))
    }

    /// ∂LL/∂β_j for every j in `cols` (the first half of [`RiskSetModel::gradient_hessian`],
    /// to rounding), in O(N + G + Σ nnz_j): with the per-row weight
    /// d_i = w e_i [Σ_{pos ≤ g < exit} r_g + (1/G_i) Σ_{g < pos} r_g G_g − (Efron) u_{pos}]
    /// (the S2 weight of `information_sweep`), g_j = Σ_events w x_j − Σ_i x_ij d_i: one gather
    /// per entry instead of the walk's two, and no curvature. Columns are summed one by one in
    /// entry order (in parallel across columns), so the result does not depend on the number
    /// of threads.
    pub fn gradients(&mut self, cols: &[usize]) -> Vec<f64> {
        self.refresh();
        let d = self.row_weights();
        let views: Vec<Option<SparseCol<'_>>> = cols
            .iter()
            .map(|&j| self.cols.get(j).map(SortedColumn::view))
            .collect();
        let sums = row_blocks::gather_sums(&d, &views);
        cols.iter()
            .zip(sums)
            .map(|(&j, acc)| self.event_sum.get(j).map_or(0.0, |&e| e - acc))
            .collect()
    }

    /// The per-row weight d_i of [`RiskSetModel::gradients`] at the current state, each
    /// row's on its own (row blocks in parallel).
    fn row_weights(&self) -> Vec<f64> {
        use rayon::prelude::*;
        let mut d = vec![0.0; self.info.len()];
        d.par_chunks_mut(row_blocks::ROW_BLOCK)
            .enumerate()
            .for_each(|(b, block)| {
                let r0 = b * row_blocks::ROW_BLOCK;
                for (o, out) in block.iter_mut().enumerate() {
                    let i = r0 + o;
                    let RowInfo { we, pos, stratum } = self.info[i];
                    let s = stratum as usize;
                    let (ga, gb) = (self.s_start[s] as usize, self.s_end[s] as usize);
                    if ga == gb {
                        // A stratum without events: in no risk set.
                        continue;
                    }
                    let p = pos as usize;
                    let exit = if self.counting {
                        (self.exit[i] as usize).min(gb)
                    } else {
                        gb
                    };
                    let mut w = self.prq[exit.max(p)][0] - self.prq[p][0];
                    if self.fg && self.inv_g[i] != 0.0 {
                        w += self.inv_g[i] * (self.pg[p][0] - self.pg[ga][0]);
                    }
                    if self.any_efron && p < gb && self.event[i] && self.efron_group[p] {
                        w -= self.eu[p];
                    }
                    *out = we * w;
                }
            });
        d
    }

    /// Drop the row-major view kept for the Newton iterations (the end of a fit).
    pub fn release_scratch(&mut self) {
        self.row_major_cache = None;
    }

    /// The largest active set worth a Newton step (see [`crate::model::Likelihood`]): the
    /// sweep makes the information over k columns cost about k coordinate walks.
    pub fn polish_max_block(&self) -> usize {
        // A Newton step costs about k³/3 for the factorization, a cycle m·G for the refreshes
        // of its m moving coordinates, and the polish converges in a few steps where
        // coordinate descent needs tens of cycles: Newton pays up to k ≈ 16√G (clamped to
        // 64..2048). Measured on the DESIGN §10 Cox recipe's auto CV (about 890 active
        // columns at the first candidate): 4√G left those fits to coordinate descent and
        // took twice the CPU time.
        let g = self.n_event_groups as f64;
        ((16.0 * g.sqrt()) as usize).clamp(POLISH_MIN_COLS, POLISH_MAX_COLS)
    }

    /// Observed information over `cols` by one sweep over the sorted rows, with no k × k work
    /// per group (module docs of the likelihoods for the sums):
    ///
    /// I = Σ_g [r_g S2(g) − q_g S1(g) S1(g)ᵀ] (+ Efron's per-group terms).
    ///
    /// * The S2 part is a sparse Gram matrix Σ_i d_i x_i x_iᵀ: row i sits in the forward part
    ///   of the groups pos(i) ≤ g < exit(i) and (competing rows) in the backward part of the
    ///   groups before pos(i), so d_i = w e_i [Σ_{pos ≤ g < exit} r_g + (1/G_i) Σ_{g < pos} r_g G_g]
    ///   — differences of the prefix sums the coordinate walk uses.
    /// * The S1 S1ᵀ part, with S1(g) = F(g) + G_g B(g) (F: forward prefix sums, B: backward
    ///   sums of the competing rows), is summed by parts: with C(h) = Σ_{g ≥ h} c_g (suffix
    ///   sums within the stratum), Σ_g c_g Y_g Z_gᵀ = C(a) Y_{a−1} Z_{a−1}ᵀ + Σ_h C(h)
    ///   (Y_h Z_hᵀ − Y_{h−1} Z_{h−1}ᵀ), and Y_h Z_hᵀ − Y_{h−1} Z_{h−1}ᵀ only involves the rows
    ///   that enter (or leave) at h: each row adds one dense k-vector per non-zero to a matrix
    ///   P with I = Gram − (P + Pᵀ).
    /// * Efron's tied groups add −u_g E2(g), +v_g (S1 E1ᵀ + E1 S1ᵀ) and −z_g E1 E1ᵀ at the
    ///   group (E1, E2: sums over the tied events).
    ///
    /// The rows of P are split into a fixed number of blocks (a function of k only) that run in
    /// parallel, each block's sums in the same order: the result does not depend on the
    /// number of threads.
    pub(crate) fn information_sweep(&mut self, cols: &[usize]) -> Vec<f64> {
        let n_blocks = (cols.len() / SWEEP_BLOCK_COLS).clamp(1, SWEEP_MAX_BLOCKS);
        self.information_sweep_blocks(cols, n_blocks)
    }

    /// [`RiskSetModel::information_sweep`] with the rows of P split into `n_blocks` blocks
    /// (every entry is computed by the same operations whatever the split).
    pub(crate) fn information_sweep_blocks(&mut self, cols: &[usize], n_blocks: usize) -> Vec<f64> {
        self.refresh();
        let k = cols.len();
        let rm = self.row_major(cols);
        let rows = rm.view();
        let n_blocks = n_blocks.clamp(1, k.max(1));
        let bounds: Vec<usize> = (0..=n_blocks).map(|b| b * k / n_blocks).collect();
        let run = |b: usize| self.sweep_block(&rows, k, bounds[b], bounds[b + 1]);
        let blocks: Vec<Vec<f64>> = if n_blocks == 1 {
            vec![run(0)]
        } else {
            use rayon::prelude::*;
            (0..n_blocks).into_par_iter().map(run).collect()
        };
        // Block b holds rows bounds[b]..bounds[b + 1] of Gram − P (row-major, k wide).
        let mut m = Vec::with_capacity(k * k);
        for block in blocks {
            m.extend_from_slice(&block);
        }
        let mut out = vec![0.0; k * k];
        for a in 0..k {
            for b in 0..k {
                // Gram − P − Pᵀ, with Gram symmetric and held once in each half: m = Gram − P.
                out[a * k + b] = 0.5 * (m[a * k + b] + m[b * k + a]);
            }
        }
        self.row_major_cache = Some(rm);
        out
    }

    /// Row-major view (row pointers, column index in `cols`, values — none when all are 1) of
    /// the columns `cols` in sorted-row order (a counting sort by row). The latest view is
    /// kept: the Newton iterations of a polish round ask for the same columns again.
    fn row_major(&mut self, cols: &[usize]) -> RowMajor {
        if let Some(mut rm) = self.row_major_cache.take() {
            if rm.cols == cols {
                return rm;
            }
            // A polish round drops the coefficients that reached zero: the view of a
            // subsequence of the cached columns is the cached one filtered in place (the same
            // entries in the same order as a fresh counting sort).
            let ones = cols
                .iter()
                .all(|&j| self.cols.get(j).is_none_or(|c| c.vals.is_empty()));
            if rm.restrict(cols, ones) {
                return rm;
            }
        }
        let views: Vec<Option<SparseCol<'_>>> = cols
            .iter()
            .map(|&j| self.cols.get(j).map(SortedColumn::view))
            .collect();
        let (ptr, col, val) = row_blocks::row_major(self.info.len(), &views);
        RowMajor {
            cols: cols.to_vec(),
            ptr,
            col,
            val: val.unwrap_or_default(),
        }
    }

    /// A cheap upper bound Ĥ ≽ I of the information over `cols` (positive semidefinite
    /// order), the Newton matrix of coordinate descent's active-set polish: the S2 part, and
    /// Efron's per-group terms, exactly as in [`RiskSetModel::information_sweep`]; the
    /// Σ_g q_g S1(g) S1(g)ᵀ = Σ_g ω_g μ_g μ_gᵀ part (μ_g = S1(g)/S0(g), the risk set's mean
    /// covariate vector; ω_g = q_g S0(g)²) over *segments* of consecutive groups, each replaced
    /// by y yᵀ / Ω with Ω = Σ_seg ω_g and y = Σ_seg ω_g μ_g. By Cauchy–Schwarz
    /// Σ_seg ω μ μᵀ − y yᵀ/Ω = Σ_seg ω (μ − y/Ω)(μ − y/Ω)ᵀ ≽ 0, so Ĥ − I is that sum over the
    /// segments: small when the risk set's mean varies little within a segment. A segment closes when
    /// the rows that entered the stratum's risk sets during it exceed 1/[`SEGMENT_GROWTH`] of
    /// those before it (fine segments where the risk sets are small). Each segment's y is its
    /// start value times the segment's total weight plus every change of S1 inside it times
    /// the weight of the groups from the change on, so the cost is O(N + G + Σ_rows k_i² +
    /// segments·k²) (k_i: the row's entries among the k = `cols.len()` columns), sequential
    /// (no dependence on threads). Returned as its lower triangle, row by row (entry (a, b),
    /// b ≤ a, at a(a + 1)/2 + b): half the memory of the full matrix.
    pub(crate) fn information_segments(&mut self, cols: &[usize]) -> Vec<f64> {
        self.refresh();
        let k = cols.len();
        let rm = self.row_major(cols);
        let rows = rm.view();
        let fg = self.fg;
        let n_groups = self.g_weight.len();
        // Prefix sums over groups of c = q S0 (and c G, c S0 = ω): the weights of the
        // segments' sums y = Σ ω μ = Σ c S1 and Ω = Σ ω.
        let mut cum_c = vec![0.0; n_groups + 1];
        let mut cum_cg = vec![0.0; if fg { n_groups + 1 } else { 0 }];
        let mut cum_w = vec![0.0; n_groups + 1];
        let (mut ac, mut acg, mut aw) = (0.0, 0.0, 0.0);
        for h in 0..n_groups {
            let q = self.prq[h + 1][1] - self.prq[h][1];
            let s0 = self.s0(h);
            let c = q * s0;
            ac += c;
            aw += c * s0;
            cum_c[h + 1] = ac;
            cum_w[h + 1] = aw;
            if fg {
                acg += c * self.g_cens[h];
                cum_cg[h + 1] = acg;
            }
        }
        // Upper triangle (a ≤ b) only, packed ([`upper_offset`]); transposed at the end. The
        // S2 part first: a sparse Gram matrix with the gradients' row weights.
        let weights = self.row_weights();
        // The Gram matrix and the segments' sweep run side by side ([`gram_and_sweep`]); the
        // sweep's terms are summed in a matrix of their own and added at the end (a fixed
        // order, whatever the number of threads).
        let (mut m, sweep) = self.gram_and_sweep(&rows, cols, &weights, &cum_c, &cum_cg, &cum_w);
        drop(weights);
        for (t, v) in m.iter_mut().zip(&sweep) {
            *t += v;
        }
        drop(sweep);
        self.row_major_cache = Some(rm);
        // The same entries as the lower triangle, row by row (the layout of the Newton
        // matrices, `model/newton.rs`), moved in place: no second matrix.
        upper_to_lower_in_place(&mut m, k);
        m
    }

    /// The Gram part and the segment terms of [`RiskSetModel::information_segments`], each a
    /// packed upper triangle, in one of two ways chosen from the data alone (so the bits do
    /// not depend on the number of threads):
    ///
    /// * **row chunks** when their partial matrices are small ([`gram_cuts`]: at most
    ///   [`GRAM_MAX_CHUNKS`] chunks whose matrices together take at most
    ///   [`GRAM_CHUNK_ROW_BYTES`] per data row): each chunk of rows is summed into a matrix of
    ///   its own and the chunks' matrices are added in chunk order. Every row is read once.
    /// * **matrix-row blocks** otherwise (large k: a cross-validation fold polishing ~900
    ///   columns would hold 8 chunk matrices of 3 MB): the rows of the packed triangle are cut
    ///   into blocks of about equal work ([`gram_column_cuts`]); each block reads every data row
    ///   and sums only its own matrix rows, in row order, straight into its slice of the one
    ///   result matrix — the same additions in the same order as one walk, whatever the blocks.
    ///
    /// With several threads the chunks or blocks run in parallel beside the sweep.
    fn gram_and_sweep(
        &self,
        rows: &SweepRows<'_>,
        cols: &[usize],
        weights: &[f64],
        cum_c: &[f64],
        cum_cg: &[f64],
        cum_w: &[f64],
    ) -> (Vec<f64>, Vec<f64>) {
        use rayon::prelude::*;
        let k = cols.len();
        let len = k * (k + 1) / 2;
        let cuts = gram_cuts(rows, k, self.gram_min_entries);
        let n_chunks = cuts.len() - 1;
        let sweep = || self.segment_terms(rows, k, cum_c, cum_cg, cum_w);
        let threads = rayon::current_num_threads();
        if n_chunks > 1 {
            // Row chunks with partial matrices.
            let chunk = |c: usize, m: &mut [f64]| {
                gram_columns_of(rows, k, weights, cuts[c], cuts[c + 1], m)
            };
            if threads < 2 {
                let mut m = vec![0.0; len];
                chunk(0, &mut m);
                let mut part = vec![0.0; len];
                for c in 1..n_chunks {
                    part.fill(0.0);
                    chunk(c, &mut part);
                    add_into(&mut m, &part);
                }
                return (m, sweep());
            }
            let (parts, sweep) = rayon::join(
                || {
                    (0..n_chunks)
                        .into_par_iter()
                        .with_max_len(1)
                        .map(|c| {
                            let mut m = vec![0.0; len];
                            chunk(c, &mut m);
                            m
                        })
                        .collect::<Vec<_>>()
                },
                sweep,
            );
            let mut parts = parts.into_iter();
            let mut m = parts.next().unwrap_or_else(|| vec![0.0; len]);
            for part in parts {
                add_into(&mut m, &part);
            }
            return (m, sweep);
        }
        let mut m = vec![0.0; len];
        let entries = rows.col.len();
        let n_blocks = if threads < 2 || gram_row_chunks_fit(rows, k) {
            // One chunk by the data's rule (small): no split.
            1
        } else {
            (entries / self.gram_min_entries.max(1)).clamp(1, GRAM_BLOCKS_PER_THREAD * threads)
        };
        if n_blocks == 1 {
            gram_columns(rows, k, weights, 0, k, &mut m);
            return (m, sweep());
        }
        let nnz: Vec<usize> = cols
            .iter()
            .map(|&j| self.cols.get(j).map_or(0, |c| c.view().rows.len()))
            .collect();
        let bounds = gram_column_cuts(&nnz, n_blocks);
        let mut blocks: Vec<(usize, usize, &mut [f64])> = Vec::with_capacity(bounds.len());
        let mut rest: &mut [f64] = &mut m;
        for w in bounds.windows(2) {
            let (head, tail) = rest.split_at_mut(upper_offset(k, w[1]) - upper_offset(k, w[0]));
            blocks.push((w[0], w[1], head));
            rest = tail;
        }
        let ((), sweep) = rayon::join(
            || {
                blocks
                    .into_par_iter()
                    .with_max_len(1)
                    .for_each(|(a0, a1, out)| gram_columns(rows, k, weights, a0, a1, out))
            },
            sweep,
        );
        (m, sweep)
    }

    /// The segment terms of [`RiskSetModel::information_segments`] (everything but the Gram
    /// matrix), as a packed upper triangle.
    fn segment_terms(
        &self,
        rows: &SweepRows<'_>,
        k: usize,
        cum_c: &[f64],
        cum_cg: &[f64],
        cum_w: &[f64],
    ) -> Vec<f64> {
        let fg = self.fg;
        let mut m = vec![0.0; k * (k + 1) / 2];
        let mut f = vec![0.0; k];
        let mut bk = vec![0.0; k];
        let mut y = vec![0.0; k];
        let mut e1 = vec![0.0; k];
        let mut e1_touched: Vec<u32> = Vec::new();
        // y += coef · x_i (sparse).
        let scatter = |v: &mut [f64], i: usize, coef: f64| {
            let (lo, hi) = rows.range(i);
            for e in lo..hi {
                v[rows.col[e] as usize] += coef * rows.value(e);
            }
        };
        let mut xp = 0usize;
        for &s in &self.active_strata {
            let s = s as usize;
            let (ga, gb) = (self.s_start[s] as usize, self.s_end[s] as usize);
            let (ra, rb) = (self.row_start[s] as usize, self.row_end[s] as usize);
            f.fill(0.0);
            bk.fill(0.0);
            if fg {
                for i in ra..rb {
                    let inv = self.inv_g[i];
                    if inv != 0.0 {
                        scatter(&mut bk, i, self.info[i].we * inv);
                    }
                }
            }
            let mut rows_before = 0usize;
            let mut i = ra;
            let mut h0 = ga;
            while h0 < gb {
                // The segment h0..h1: groups while the rows entering stay within
                // 1/SEGMENT_GROWTH of those before (at least one group).
                let mut h1 = h0;
                let mut scan = i;
                let mut seg_rows = 0usize;
                while h1 < gb && (h1 == h0 || seg_rows * SEGMENT_GROWTH <= rows_before) {
                    while scan < rb && self.info[scan].pos as usize == h1 {
                        // Rows a fold leaves out are not rows of its data.
                        seg_rows += usize::from(self.fold_out.get(scan) != Some(&true));
                        scan += 1;
                    }
                    h1 += 1;
                }
                // y = C_seg F + CG_seg B at the segment's start, plus each change times the
                // weight of the segment's groups from its position on.
                let c_seg = cum_c[h1] - cum_c[h0];
                for (t, &v) in y.iter_mut().zip(&f) {
                    *t = c_seg * v;
                }
                if fg {
                    let cg_seg = cum_cg[h1] - cum_cg[h0];
                    for (t, &v) in y.iter_mut().zip(&bk) {
                        *t += cg_seg * v;
                    }
                }
                for h in h0..h1 {
                    let efron = self.any_efron && self.efron_group[h];
                    let first = i;
                    let c_rest = cum_c[h1] - cum_c[h];
                    while i < rb && self.info[i].pos as usize == h {
                        let we = self.info[i].we;
                        let (lo, hi) = rows.range(i);
                        if lo < hi {
                            scatter(&mut f, i, we);
                            scatter(&mut y, i, we * c_rest);
                            // (A row of weight 0 — one a fold leaves out — adds nothing and
                            // must not mark its columns twice.)
                            if efron && self.event[i] && we != 0.0 {
                                for e in lo..hi {
                                    let a = u32::from(rows.col[e]);
                                    if e1[a as usize] == 0.0 {
                                        e1_touched.push(a);
                                    }
                                    e1[a as usize] += we * rows.value(e);
                                }
                            }
                        }
                        i += 1;
                    }
                    while xp < self.all_exits.len() && (self.all_exits[xp].0 as usize) <= h {
                        let row = self.all_exits[xp].1 as usize;
                        xp += 1;
                        let we = self.info[row].we;
                        scatter(&mut f, row, -we);
                        scatter(&mut y, row, -we * c_rest);
                    }
                    if fg {
                        let cg_rest = cum_cg[h1] - cum_cg[h];
                        for row in first..i {
                            let inv = self.inv_g[row];
                            if inv != 0.0 {
                                let u = self.info[row].we * inv;
                                scatter(&mut bk, row, -u);
                                scatter(&mut y, row, -u * cg_rest);
                            }
                        }
                    }
                    if !e1_touched.is_empty() {
                        // + v (S1 E1ᵀ + E1 S1ᵀ) − z E1 E1ᵀ, with S1 = F + G B at h.
                        let gc = if fg { self.g_cens[h] } else { 0.0 };
                        let (v, z) = (self.ev[h], self.ez[h]);
                        for &a in &e1_touched {
                            let a = a as usize;
                            let c = v * e1[a];
                            for b in 0..k {
                                let s1 = f[b] + gc * bk[b];
                                let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
                                m[upper_offset(k, lo) + hi - lo] +=
                                    if a == b { 2.0 * c * s1 } else { c * s1 };
                            }
                        }
                        for &a in &e1_touched {
                            let a = a as usize;
                            for &b in &e1_touched {
                                let b = b as usize;
                                if a <= b {
                                    m[upper_offset(k, a) + b - a] -= z * e1[a] * e1[b];
                                }
                            }
                        }
                        for &a in &e1_touched {
                            e1[a as usize] = 0.0;
                        }
                        e1_touched.clear();
                    }
                }
                let omega = cum_w[h1] - cum_w[h0];
                if omega > 0.0 {
                    for a in 0..k {
                        if y[a] == 0.0 {
                            continue;
                        }
                        let c = y[a] / omega;
                        let row = &mut m[upper_offset(k, a)..upper_offset(k, a + 1)];
                        for (r, &yb) in row.iter_mut().zip(&y[a..]) {
                            *r -= c * yb;
                        }
                    }
                }
                rows_before += seg_rows;
                h0 = h1;
            }
        }
        m
    }

    /// Rows a0..a1 of Gram − 2P (so that (M + Mᵀ)/2 = Gram − P − Pᵀ), row-major k wide; see
    /// [`RiskSetModel::information_sweep`].
    fn sweep_block(&self, rows: &SweepRows<'_>, k: usize, a0: usize, a1: usize) -> Vec<f64> {
        let width = a1 - a0;
        let mut m = vec![0.0; width * k];
        let mut f = vec![0.0; k];
        let mut bk = vec![0.0; k];
        let mut tmp = vec![0.0; k];
        let mut e1 = vec![0.0; k];
        let mut e1_touched: Vec<u32> = Vec::new();
        let fg = self.fg;
        let owned = |a: u32| (a as usize) >= a0 && (a as usize) < a1;
        // P[a, :] += coef · v (dense), for the block's rows a; stored as m −= 2P.
        let axpy = |m: &mut [f64], a: u32, coef: f64, v: &[f64]| {
            let row = &mut m[(a as usize - a0) * k..(a as usize - a0 + 1) * k];
            for (r, &x) in row.iter_mut().zip(v) {
                *r -= 2.0 * coef * x;
            }
        };
        // Sparse pairs within a row: m[a, b] += coef · x_a · x_b.
        let pairs = |m: &mut [f64], i: usize, coef: f64| {
            let (lo, hi) = rows.range(i);
            for e in lo..hi {
                let a = u32::from(rows.col[e]);
                if !owned(a) {
                    continue;
                }
                let xa = rows.value(e) * coef;
                let base = (a as usize - a0) * k;
                for e2 in lo..hi {
                    m[base + rows.col[e2] as usize] += xa * rows.value(e2);
                }
            }
        };
        let mut xp = 0usize;
        for &s in &self.active_strata {
            let s = s as usize;
            let (ga, gb) = (self.s_start[s] as usize, self.s_end[s] as usize);
            let (ra, rb) = (self.row_start[s] as usize, self.row_end[s] as usize);
            f.fill(0.0);
            bk.fill(0.0);
            let (q_end, qg_end, qgg_end) = if fg {
                (self.prq[gb][1], self.pg[gb][1], self.pg[gb][2])
            } else {
                (self.prq[gb][1], 0.0, 0.0)
            };
            if fg {
                // B before the first group: every competing row still to be removed.
                for i in ra..rb {
                    let inv = self.inv_g[i];
                    if inv != 0.0 {
                        let c = self.info[i].we * inv;
                        let (lo, hi) = rows.range(i);
                        for e in lo..hi {
                            bk[rows.col[e] as usize] += c * rows.value(e);
                        }
                    }
                }
                // ½ C3(a) Btot Btotᵀ.
                let c3 = qgg_end - self.pg[ga][2];
                if c3 != 0.0 {
                    for a in a0..a1 {
                        if bk[a] != 0.0 {
                            axpy(&mut m, a as u32, 0.5 * c3 * bk[a], &bk);
                        }
                    }
                }
            }
            let mut i = ra;
            for h in ga..gb {
                let c1 = q_end - self.prq[h][1];
                let (c2, c3) = if fg {
                    (qg_end - self.pg[h][1], qgg_end - self.pg[h][2])
                } else {
                    (0.0, 0.0)
                };
                let efron = self.any_efron && self.efron_group[h];
                let first = i;
                // Phase 1: rows entering the forward sums at h.
                while i < rb && self.info[i].pos as usize == h {
                    let we = self.info[i].we;
                    let (lo, hi) = rows.range(i);
                    if lo < hi {
                        // Gram weight d_i.
                        let exit = if self.counting {
                            (self.exit[i] as usize).min(gb)
                        } else {
                            gb
                        };
                        let mut d = self.prq[exit][0] - self.prq[h][0];
                        if fg && self.inv_g[i] != 0.0 {
                            d += self.inv_g[i] * (self.pg[h][0] - self.pg[ga][0]);
                        }
                        if efron && self.event[i] {
                            d -= self.eu[h];
                        }
                        pairs(&mut m, i, we * d);
                        // P += v (C1 (F + ½ v) + C2 B)ᵀ, then F += v.
                        if fg {
                            for ((t, &fv), &bv) in tmp.iter_mut().zip(&f).zip(&bk) {
                                *t = c1 * fv + c2 * bv;
                            }
                        }
                        let dense: &[f64] = if fg { &tmp } else { &f };
                        let scale = if fg { 1.0 } else { c1 };
                        for e in lo..hi {
                            let a = u32::from(rows.col[e]);
                            if owned(a) {
                                axpy(&mut m, a, scale * we * rows.value(e), dense);
                            }
                        }
                        pairs(&mut m, i, -c1 * we * we);
                        for e in lo..hi {
                            f[rows.col[e] as usize] += we * rows.value(e);
                        }
                        // (A row of weight 0 — one a fold leaves out — adds nothing and must
                        // not mark its columns twice.)
                        if efron && self.event[i] && we != 0.0 {
                            for e in lo..hi {
                                let a = u32::from(rows.col[e]);
                                if e1[a as usize] == 0.0 {
                                    e1_touched.push(a);
                                }
                                e1[a as usize] += we * rows.value(e);
                            }
                        }
                    }
                    i += 1;
                }
                // Counting-process rows leaving at h: F −= v.
                while xp < self.all_exits.len() && (self.all_exits[xp].0 as usize) <= h {
                    let row = self.all_exits[xp].1 as usize;
                    xp += 1;
                    let we = -self.info[row].we;
                    let (lo, hi) = rows.range(row);
                    for e in lo..hi {
                        let a = u32::from(rows.col[e]);
                        if owned(a) {
                            axpy(&mut m, a, c1 * we * rows.value(e), &f);
                        }
                    }
                    pairs(&mut m, row, -c1 * we * we);
                    for e in lo..hi {
                        f[rows.col[e] as usize] += we * rows.value(e);
                    }
                }
                // Phase 2 (Fine–Gray): competing rows leave the backward sums at h.
                if fg {
                    let mut ready = false;
                    for row in first..i {
                        let inv = self.inv_g[row];
                        let (lo, hi) = rows.range(row);
                        if inv == 0.0 || lo == hi {
                            continue;
                        }
                        if !ready {
                            for ((t, &fv), &bv) in tmp.iter_mut().zip(&f).zip(&bk) {
                                *t = c2 * fv + c3 * bv;
                            }
                            ready = true;
                        }
                        let u = -self.info[row].we * inv;
                        for e in lo..hi {
                            let a = u32::from(rows.col[e]);
                            if owned(a) {
                                axpy(&mut m, a, u * rows.value(e), &tmp);
                            }
                        }
                        pairs(&mut m, row, -c3 * u * u);
                        for e in lo..hi {
                            let a = rows.col[e] as usize;
                            let du = u * rows.value(e);
                            bk[a] += du;
                            // Later rows of this group see the updated B.
                            tmp[a] += c3 * du;
                        }
                    }
                }
                // Efron's tied events at h.
                if !e1_touched.is_empty() {
                    let gc = if fg { self.g_cens[h] } else { 0.0 };
                    for ((t, &fv), &bv) in tmp.iter_mut().zip(&f).zip(&bk) {
                        *t = fv + gc * bv;
                    }
                    let (v, z) = (self.ev[h], self.ez[h]);
                    for &a in &e1_touched {
                        if owned(a) {
                            // P −= v E1 S1ᵀ.
                            axpy(&mut m, a, -v * e1[a as usize], &tmp);
                        }
                    }
                    // P += ½ z E1 E1ᵀ: m −= z E1 E1ᵀ.
                    for &a in &e1_touched {
                        if owned(a) {
                            let base = (a as usize - a0) * k;
                            for &b in &e1_touched {
                                m[base + b as usize] -= z * e1[a as usize] * e1[b as usize];
                            }
                        }
                    }
                    for &a in &e1_touched {
                        e1[a as usize] = 0.0;
                    }
                    e1_touched.clear();
                }
            }
            // Competing rows below every event time of the stratum: backward part only.
            if fg {
                while i < rb {
                    let inv = self.inv_g[i];
                    if inv != 0.0 {
                        let d = inv * (self.pg[gb][0] - self.pg[ga][0]);
                        pairs(&mut m, i, self.info[i].we * d);
                    }
                    i += 1;
                }
            }
        }
        m
    }

    /// [`RiskSetModel::information`] from dense per-group sums: O((N + G)·k²).
    pub(crate) fn information_dense(&mut self, cols: &[usize]) -> Vec<f64> {
        self.refresh();
        let k = cols.len();
        let n = self.eta.len();
        let mut out = vec![0.0; k * k];
        if k == 0 {
            return out;
        }
        // Dense copies of the requested columns in sorted order.
        let mut xs = vec![0.0; k * n]; // row-major by row: xs[row * k + a]
        for (a, &j) in cols.iter().enumerate() {
            if let Some(col) = self.cols.get(j) {
                for (i, &row) in col.rows.iter().enumerate() {
                    xs[row as usize * k + a] = col.value(i);
                }
            }
        }
        let add = |s0: &mut f64, s1: &mut [f64], s2: &mut [f64], c: f64, x: &[f64]| {
            *s0 += c;
            for a in 0..k {
                s1[a] += c * x[a];
                for b in 0..k {
                    s2[a * k + b] += c * x[a] * x[b];
                }
            }
        };
        let (mut f1, mut f2) = (vec![0.0; k], vec![0.0; k * k]);
        let (mut b1, mut b2) = (vec![0.0; k], vec![0.0; k * k]);
        let (mut e1, mut e2) = (vec![0.0; k], vec![0.0; k * k]);
        let (mut s1, mut s2) = (vec![0.0; k], vec![0.0; k * k]);
        let mut xp = 0usize;
        for &s in &self.active_strata {
            let s = s as usize;
            let (ga, gb) = (self.s_start[s] as usize, self.s_end[s] as usize);
            let (ra, rb) = (self.row_start[s] as usize, self.row_end[s] as usize);
            let mut f0 = 0.0;
            let mut b0 = 0.0;
            f1.fill(0.0);
            f2.fill(0.0);
            b1.fill(0.0);
            b2.fill(0.0);
            if self.fg {
                for row in ra..rb {
                    if self.inv_g[row] != 0.0 {
                        let c = self.info[row].we * self.inv_g[row];
                        add(&mut b0, &mut b1, &mut b2, c, &xs[row * k..row * k + k]);
                    }
                }
            }
            let mut ptr = ra;
            for g in ga..gb {
                let mut e0 = 0.0;
                e1.fill(0.0);
                e2.fill(0.0);
                while ptr < rb && (self.info[ptr].pos as usize) <= g {
                    let c = self.info[ptr].we;
                    let x = &xs[ptr * k..ptr * k + k];
                    add(&mut f0, &mut f1, &mut f2, c, x);
                    if self.fg && self.inv_g[ptr] != 0.0 {
                        add(&mut b0, &mut b1, &mut b2, -c * self.inv_g[ptr], x);
                    }
                    if self.event[ptr] {
                        add(&mut e0, &mut e1, &mut e2, c, x);
                    }
                    ptr += 1;
                }
                while xp < self.all_exits.len() && (self.all_exits[xp].0 as usize) <= g {
                    let row = self.all_exits[xp].1 as usize;
                    add(
                        &mut f0,
                        &mut f1,
                        &mut f2,
                        -self.info[row].we,
                        &xs[row * k..row * k + k],
                    );
                    xp += 1;
                }
                let gc = if self.fg { self.g_cens[g] } else { 0.0 };
                let s0 = f0 + gc * b0;
                for a in 0..k {
                    s1[a] = f1[a] + gc * b1[a];
                }
                for a in 0..k * k {
                    s2[a] = f2[a] + gc * b2[a];
                }
                let wg = self.g_weight[g];
                if wg == 0.0 {
                    continue;
                }
                let (d, efron) = (self.g_count[g], self.any_efron && self.efron_group[g]);
                let terms = if efron { d } else { 1 };
                let wbar = if efron { wg / d as f64 } else { wg };
                for l in 0..terms {
                    let f = if efron { l as f64 / d as f64 } else { 0.0 };
                    let den = s0 - f * e0;
                    for a in 0..k {
                        let ma = s1[a] - f * e1[a];
                        for b in 0..k {
                            let mb = s1[b] - f * e1[b];
                            out[a * k + b] += wbar
                                * ((s2[a * k + b] - f * e2[a * k + b]) / den
                                    - ma * mb / (den * den));
                        }
                    }
                }
            }
        }
        out
    }
}

/// Row-major entries of the columns of an information request.
struct SweepRows<'a> {
    ptr: &'a [u32],
    col: &'a [u16],
    val: &'a [f64],
}

impl SweepRows<'_> {
    #[inline]
    fn range(&self, i: usize) -> (usize, usize) {
        (self.ptr[i] as usize, self.ptr[i + 1] as usize)
    }

    #[inline]
    fn value(&self, e: usize) -> f64 {
        row_blocks::value_or_one(self.val, e)
    }
}

/// Rows `a0..a1` of Σ_i w_i x_i x_iᵀ (a packed k × k upper triangle, [`upper_offset`]), added
/// to `out`, which holds exactly those rows: every data row is visited in order and only its
/// entries in columns `a0..a1` start products (each row's entries are in column order). Each
/// matrix entry gets the same additions in the same order whatever `a0..a1`.
fn gram_columns(rows: &SweepRows<'_>, k: usize, w: &[f64], a0: usize, a1: usize, out: &mut [f64]) {
    let base = upper_offset(k, a0);
    debug_assert_eq!(out.len(), upper_offset(k, a1) - base);
    for (i, &c) in w.iter().enumerate() {
        let (lo, hi) = rows.range(i);
        if lo == hi || c == 0.0 {
            continue;
        }
        let first = if a0 == 0 {
            lo
        } else {
            lo + rows.col[lo..hi].partition_point(|&a| (a as usize) < a0)
        };
        for e in first..hi {
            let a = rows.col[e] as usize;
            if a >= a1 {
                break;
            }
            let xa = rows.value(e) * c;
            // Row a (columns a..k); the row's entries are in column order, all ≥ a.
            let row = &mut out[upper_offset(k, a) - base..upper_offset(k, a + 1) - base];
            if rows.val.is_empty() {
                for &b in &rows.col[e..hi] {
                    row[b as usize - a] += xa;
                }
            } else {
                for e2 in e..hi {
                    row[rows.col[e2] as usize - a] += xa * rows.val[e2];
                }
            }
        }
    }
}

/// Σ_i w_i x_i x_iᵀ over the data rows `i0..i1` (all matrix rows), added to `m`.
fn gram_columns_of(rows: &SweepRows<'_>, k: usize, w: &[f64], i0: usize, i1: usize, m: &mut [f64]) {
    let sub = SweepRows {
        ptr: &rows.ptr[i0..=i1],
        col: rows.col,
        val: rows.val,
    };
    gram_columns(&sub, k, &w[i0..i1], 0, k, m);
}

/// `m += part`, entry by entry.
fn add_into(m: &mut [f64], part: &[f64]) {
    for (t, v) in m.iter_mut().zip(part) {
        *t += v;
    }
}

/// Whether the row chunks' matrices would be small enough (at most [`GRAM_CHUNK_ROW_BYTES`]
/// per data row for [`GRAM_MAX_CHUNKS`] of them): the rule between row chunks and
/// matrix-row blocks in [`RiskSetModel::gram_and_sweep`], a function of the data alone.
fn gram_row_chunks_fit(rows: &SweepRows<'_>, k: usize) -> bool {
    let n = rows.ptr.len().saturating_sub(1).max(1);
    let bytes = k * (k + 1) / 2 * std::mem::size_of::<f64>() * GRAM_MAX_CHUNKS;
    bytes <= n * GRAM_CHUNK_ROW_BYTES
}

/// Where [`RiskSetModel::gram_and_sweep`] cuts the data rows (first 0, last N) when the row
/// chunks' matrices are small ([`gram_row_chunks_fit`]; else one chunk): chunks of about equal
/// entries, as many as the entries allow (`min_entries` each) up to [`GRAM_MAX_CHUNKS`], while
/// adding them costs at most 1/[`GRAM_REDUCE_SHARE`] of the pairs of entries summed. A
/// function of the rows and k only.
fn gram_cuts(rows: &SweepRows<'_>, k: usize, min_entries: usize) -> Vec<usize> {
    let n = rows.ptr.len().saturating_sub(1);
    if !gram_row_chunks_fit(rows, k) {
        return vec![0, n];
    }
    let entries = rows.col.len();
    let len = (k * (k + 1) / 2).max(1);
    let pairs: usize = (0..n)
        .map(|i| {
            let (lo, hi) = rows.range(i);
            (hi - lo) * (hi - lo + 1) / 2
        })
        .sum();
    let chunks = (entries / min_entries.max(1))
        .min(1 + pairs / (GRAM_REDUCE_SHARE * len))
        .clamp(1, GRAM_MAX_CHUNKS);
    let mut cuts = vec![0usize];
    for c in 1..chunks {
        let target = (c * entries / chunks) as u32;
        let i = rows.ptr.partition_point(|&p| p < target).min(n);
        if i > *cuts.last().unwrap_or(&0) && i < n {
            cuts.push(i);
        }
    }
    cuts.push(n);
    cuts
}

/// Where [`RiskSetModel::gram_and_sweep`] cuts the k matrix rows (first 0, last k) into at
/// most `blocks` blocks of about equal work: matrix row a costs about nnz_a·(k − a) products
/// (its column's entries, each times the entries after it in its data row, about
/// proportional to the columns after a). The cuts only balance the threads: the result does
/// not depend on them.
fn gram_column_cuts(nnz: &[usize], blocks: usize) -> Vec<usize> {
    let k = nnz.len();
    let work: Vec<f64> = nnz
        .iter()
        .enumerate()
        .map(|(a, &n)| n as f64 * (k - a) as f64)
        .collect();
    let total: f64 = work.iter().sum();
    let mut cuts = vec![0usize];
    let mut acc = 0.0;
    let mut next = 1;
    for (a, w) in work.iter().enumerate() {
        acc += w;
        while next < blocks && acc >= total * next as f64 / blocks as f64 {
            if a + 1 > *cuts.last().unwrap_or(&0) && a + 1 < k {
                cuts.push(a + 1);
            }
            next += 1;
        }
    }
    cuts.push(k);
    cuts.dedup();
    cuts
}

/// Where row a (columns a..k) of a packed upper triangle of a k × k matrix starts.
#[inline]
fn upper_offset(k: usize, a: usize) -> usize {
    a * (2 * k + 1 - a) / 2
}

/// Rearrange the packed upper triangle `m` of a symmetric k × k matrix ([`upper_offset`]) into
/// its packed lower triangle, row by row (entry (a, b), b ≤ a, at a(a + 1)/2 + b), in place:
/// each entry moves along the cycles of the permutation (a bit per entry marks those placed).
/// The values are only moved, never computed.
fn upper_to_lower_in_place(m: &mut [f64], k: usize) {
    let n = k * (k + 1) / 2;
    debug_assert_eq!(m.len(), n);
    // Entry (a, b), a ≤ b, at upper position p: its lower position b(b + 1)/2 + a.
    let target = |p: usize| {
        // The row a of p: the largest a with upper_offset(k, a) ≤ p (a root of
        // a² − (2k + 1)a + 2p = 0, corrected for rounding).
        let w = (2 * k + 1) as f64;
        let mut a = ((w - (w * w - 8.0 * p as f64).max(0.0).sqrt()) / 2.0) as usize;
        a = a.min(k - 1);
        while upper_offset(k, a) > p {
            a -= 1;
        }
        while upper_offset(k, a + 1) <= p {
            a += 1;
        }
        let b = a + p - upper_offset(k, a);
        b * (b + 1) / 2 + a
    };
    let mut placed = vec![0u64; n.div_ceil(64)];
    for start in 0..n {
        if placed[start / 64] >> (start % 64) & 1 == 1 {
            continue;
        }
        // Carry the entry at `start` to its place, pick up the one there, and so on until
        // the cycle closes at `start`.
        let mut carried = m[start];
        let mut p = start;
        loop {
            let q = target(p);
            placed[q / 64] |= 1 << (q % 64);
            std::mem::swap(&mut carried, &mut m[q]);
            if q == start {
                break;
            }
            p = q;
        }
    }
}

/// Blocks of the Gram matrix's rows per thread in [`RiskSetModel::gram_and_sweep`] (work
/// stealing evens out the blocks and the sweep beside them).
const GRAM_BLOCKS_PER_THREAD: usize = 4;
/// Most row chunks of the Gram part ([`gram_cuts`]).
const GRAM_MAX_CHUNKS: usize = 8;
/// Row chunks are used while their matrices take at most this many bytes per data row
/// together (else matrix-row blocks, which hold one matrix but read every row once per block).
const GRAM_CHUNK_ROW_BYTES: usize = 64;
/// The chunks' matrices are added in at most 1/this of the pairs of entries summed.
const GRAM_REDUCE_SHARE: usize = 8;
/// Entries of the row-major view per Gram block, at least (tests lower it).
const GRAM_PAR_MIN_ENTRIES: usize = 1 << 13;

/// An owned [`SweepRows`] with the columns it was built for.
#[derive(Debug, Clone, Default)]
struct RowMajor {
    cols: Vec<usize>,
    ptr: Vec<u32>,
    col: Vec<u16>,
    val: Vec<f64>,
}

impl RowMajor {
    /// Restrict the view to `cols` when they are a subsequence of its columns (`ones`: every
    /// one of them is a 0/1 column), in place; false (and nothing changed) otherwise.
    fn restrict(&mut self, cols: &[usize], ones: bool) -> bool {
        let mut map = vec![u32::MAX; self.cols.len()];
        let mut next = 0usize;
        for (a, &j) in self.cols.iter().enumerate() {
            if next < cols.len() && cols[next] == j {
                map[a] = next as u32;
                next += 1;
            }
        }
        if next < cols.len() {
            return false;
        }
        let has_val = !self.val.is_empty();
        let mut out = 0usize;
        let mut lo = self.ptr[0] as usize;
        for i in 0..self.ptr.len() - 1 {
            let hi = self.ptr[i + 1] as usize;
            // Every entry is written at `out` (≤ e: only entries already read are
            // overwritten) and kept by advancing `out`: no branch on the random pattern of
            // kept entries.
            for e in lo..hi {
                let a = map[self.col[e] as usize];
                self.col[out] = a as u16;
                if has_val {
                    self.val[out] = self.val[e];
                }
                out += usize::from(a != u32::MAX);
            }
            lo = hi;
            self.ptr[i + 1] = out as u32;
        }
        self.col.truncate(out);
        if ones {
            self.val = Vec::new();
        } else {
            self.val.truncate(out);
        }
        self.cols = cols.to_vec();
        true
    }

    fn view(&self) -> SweepRows<'_> {
        SweepRows {
            ptr: &self.ptr,
            col: &self.col,
            val: &self.val,
        }
    }
}

/// From this many columns `information` uses the sweep (up to [`ROW_MAJOR_MAX_COLS`]; beyond,
/// the dense form: the k × k result alone would then need 32 GiB).
const SWEEP_MIN_COLS: usize = 33;
/// Columns of P per parallel block of the sweep (the split depends on k only).
const SWEEP_BLOCK_COLS: usize = 48;
/// Most parallel blocks of the sweep.
const SWEEP_MAX_BLOCKS: usize = 8;
/// Segments of [`RiskSetModel::approximate_information`] close when the rows entered during
/// the segment exceed 1/`SEGMENT_GROWTH` of those entered before it.
const SEGMENT_GROWTH: usize = 16;
/// Largest active set that coordinate descent polishes by Newton–Raphson on this likelihood.
const POLISH_MAX_COLS: usize = 2048;
/// Smallest limit of [`RiskSetModel::polish_max_block`] (above the classic 32).
const POLISH_MIN_COLS: usize = 64;

/// One chunk of [`RiskSetModel::refresh_pending`].
struct ChunkJob<'a> {
    /// First group of the chunk; the chunk is `c0 .. c0 + f.len()`.
    c0: usize,
    f: &'a mut [f64],
    /// Fine–Gray backward sums (empty for Cox).
    b: &'a mut [f64],
    out: &'a mut [[f64; 2]],
    out_g: &'a mut [[f64; 3]],
    /// Queued changes of F and B inside the chunk, sorted by position.
    queue_f: &'a [(u32, f64)],
    queue_b: &'a [(u32, f64)],
    /// Stratum starts inside the chunk (after c0), where the running changes reset (B to
    /// the stratum's queued start change).
    starts: &'a [u32],
    starts_b: &'a [f64],
    /// Changes carried in from the chunk's stratum before c0.
    carry_f: f64,
    carry_b: f64,
}

/// Run one chunk: returns the chunk's (Σ r, Σ q, Σ r G, Σ q G, Σ q G²).
fn refresh_chunk<const UNIT: bool, const FG: bool>(
    job: ChunkJob<'_>,
    weight: &[f64],
    g_cens: &[f64],
) -> [f64; 5] {
    let ChunkJob {
        c0,
        f,
        b,
        out,
        out_g,
        queue_f,
        queue_b,
        starts,
        starts_b,
        carry_f,
        carry_b,
    } = job;
    let c1 = c0 + f.len();
    let mut acc = [0.0f64; 5];
    let (mut fi, mut bi, mut si) = (0usize, 0usize, 0usize);
    let (mut run_f, mut run_b) = (carry_f, carry_b);
    let mut g = c0;
    while g < c1 {
        if si < starts.len() && starts[si] as usize == g {
            run_f = 0.0;
            run_b = starts_b[si];
            si += 1;
        }
        while fi < queue_f.len() && queue_f[fi].0 as usize <= g {
            run_f += queue_f[fi].1;
            fi += 1;
        }
        while bi < queue_b.len() && queue_b[bi].0 as usize <= g {
            run_b += queue_b[bi].1;
            bi += 1;
        }
        let mut next = c1;
        if fi < queue_f.len() {
            next = next.min(queue_f[fi].0 as usize);
        }
        if bi < queue_b.len() {
            next = next.min(queue_b[bi].0 as usize);
        }
        if si < starts.len() {
            next = next.min(starts[si] as usize);
        }
        let next = next.max(g + 1);
        let (lo, hi) = (g - c0, next - c0);
        for i in lo..hi {
            let s0_f = f[i] + run_f;
            f[i] = s0_f;
            let gc = if FG { g_cens[c0 + i] } else { 1.0 };
            let s0 = if FG {
                let bv = b[i] + run_b;
                b[i] = bv;
                s0_f + gc * bv
            } else {
                s0_f
            };
            let inv = 1.0 / s0;
            let wg = weight[c0 + i];
            let (r, q) = if UNIT {
                (inv, inv * inv)
            } else if wg != 0.0 {
                let r = wg * inv;
                (r, r * inv)
            } else {
                (0.0, 0.0)
            };
            acc[0] += r;
            acc[1] += q;
            out[i] = [acc[0], acc[1]];
            if FG {
                acc[2] += r * gc;
                acc[3] += q * gc;
                acc[4] += q * gc * gc;
                out_g[i] = [acc[2], acc[3], acc[4]];
            }
        }
        g = next;
    }
    acc
}

/// Ask the CPU to fetch the cache line holding `p` (no effect on other architectures).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` is only a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// How far ahead the walk prefetches row data and prefix sums (entries).
const INFO_AHEAD: usize = 48;
/// Groups from which the simple path's refresh is split into chunks.
const PAR_MIN_GROUPS: usize = 1 << 15;
/// Chunks of that refresh (fixed, so the split never depends on the thread count).
const REFRESH_CHUNKS: usize = 8;

/// Row chunks of [`RiskSetModel::scatter_all`] (fixed: results never depend on the number of
/// threads), from [`SCATTER_PAR_MIN_ROWS`] rows on.
const SCATTER_CHUNKS: usize = 8;
const SCATTER_PAR_MIN_ROWS: usize = 1 << 15;
/// Prefetch distance of `update`.
const UPDATE_AHEAD: usize = 32;
/// See [`INFO_AHEAD`].
const PREFIX_AHEAD: usize = 24;

/// Entries per chunk below which a column is walked in one piece.
const MIN_CHUNK: usize = 2048;
/// Most chunks per column (fixed; the thread count never changes the split).
const MAX_CHUNKS: usize = 16;

#[derive(Debug, Default, Clone, Copy)]
struct WalkAcc {
    lin: f64,
    lin2: f64,
    quad: f64,
    gcorr: f64,
    hcorr: f64,
}

impl WalkAcc {
    fn add(&mut self, o: &WalkAcc) {
        self.lin += o.lin;
        self.lin2 += o.lin2;
        self.quad += o.quad;
        self.gcorr += o.gcorr;
        self.hcorr += o.hcorr;
    }
}

/// The sums of one run (part of a stratum) computed with a and b starting at 0, plus what is
/// needed to add the true starting values later.
#[derive(Debug, Default, Clone, Copy)]
struct Piece {
    acc: WalkAcc,
    p_first: u32,
    p_end: u32,
    ends: bool,
    cross_q: f64,
    cross_qg: f64,
    ve1: f64,
    ve1g: f64,
    a: f64,
    a2: f64,
    b: f64,
    b2: f64,
}

/// Result of walking one chunk: fully resolved strata plus at most two open runs (the first
/// and the last stratum, when they continue in a neighbouring chunk).
#[derive(Debug, Default)]
struct ChunkOut {
    resolved: WalkAcc,
    open: Vec<Piece>,
}

/// Running state of the walk inside one run.
#[derive(Debug, Default, Clone, Copy)]
struct Run {
    acc: WalkAcc,
    starts: bool,
    p_first: u32,
    p0: u32,
    r0: f64,
    q0: f64,
    rg0: f64,
    qg0: f64,
    qgg0: f64,
    a: f64,
    a2: f64,
    b: f64,
    b2: f64,
    cross_q: f64,
    cross_qg: f64,
    ve1: f64,
    ve1g: f64,
    e1: f64,
    e2: f64,
    pending: bool,
}

impl Run {
    fn open(m: &RiskSetModel, p: u32, starts: bool) -> Self {
        let i = p as usize;
        Run {
            starts,
            p_first: p,
            p0: p,
            r0: m.prq[i][0],
            q0: m.prq[i][1],
            rg0: if m.fg { m.pg[i][0] } else { 0.0 },
            qg0: if m.fg { m.pg[i][1] } else { 0.0 },
            qgg0: if m.fg { m.pg[i][2] } else { 0.0 },
            ..Default::default()
        }
    }

    fn piece(&self, ends: bool) -> Piece {
        Piece {
            acc: self.acc,
            p_first: self.p_first,
            p_end: self.p0,
            ends,
            cross_q: self.cross_q,
            cross_qg: self.cross_qg,
            ve1: self.ve1,
            ve1g: self.ve1g,
            a: self.a,
            a2: self.a2,
            b: self.b,
            b2: self.b2,
        }
    }
}

/// Test support shared by the Cox and Fine–Gray unit tests: a seeded generator of small data
/// sets and a slow, obviously-correct O(N²) reference built from direct risk-set sums.
#[cfg(any(test, feature = "test-support"))]
#[doc(hidden)]
#[allow(missing_docs)]
pub mod test_support {
    use super::super::design::{DesignBuilder, DesignMatrix, OutcomeRecord};
    use super::super::{Likelihood, Ties};
    #[cfg(test)]
    use super::RiskSetModel;

    /// xorshift64* (seeded, no dependencies).
    pub struct Rng(pub u64);
    impl Rng {
        pub fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        pub fn unif(&mut self) -> f64 {
            (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
        }
        pub fn below(&mut self, n: u64) -> u64 {
            self.next_u64() % n
        }
    }

    /// Options of the random data.
    #[derive(Clone, Copy)]
    pub struct Spec {
        pub n: usize,
        pub p: usize,
        pub strata: u64,
        pub weights: bool,
        pub counting: bool,
        pub fine_gray: bool,
        pub offset: bool,
    }

    /// Random outcome rows (with many ties) and covariates: columns 0..p/2 indicator, the
    /// rest with real values.
    pub fn random_records(spec: Spec, seed: u64) -> (Vec<OutcomeRecord>, Vec<(i64, i64, f64)>) {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut recs = Vec::new();
        let mut covs = Vec::new();
        for i in 0..spec.n {
            let time = (1 + rng.below(8)) as f64;
            let u = rng.unif();
            let y = if spec.fine_gray {
                if u < 0.4 {
                    1.0
                } else if u < 0.7 {
                    2.0
                } else {
                    0.0
                }
            } else if u < 0.55 {
                1.0
            } else {
                0.0
            };
            let row_id = 1000 + 7 * i as i64;
            recs.push(OutcomeRecord {
                row_id,
                stratum_id: (spec.strata > 1).then(|| 50 - rng.below(spec.strata) as i64),
                time: Some(time),
                y,
                weight: spec.weights.then(|| 0.25 + 2.0 * rng.unif()),
                start_time: spec.counting.then(|| {
                    (rng.below(time as u64) as f64)
                        - 0.5 * rng.unif() * f64::from(u8::from(rng.below(2) == 0))
                }),
                offset: spec.offset.then(|| 0.3 * rng.unif() - 0.15),
                censor_weight: None,
                cluster_id: None,
            });
            for j in 0..spec.p {
                if rng.unif() < 0.45 {
                    let v = if j < spec.p / 2 {
                        1.0
                    } else {
                        (rng.unif() * 2.0 - 0.7).round() * 0.5 + 0.1
                    };
                    covs.push((row_id, j as i64 * 3 + 1, v));
                }
            }
        }
        (recs, covs)
    }

    pub fn build(recs: &[OutcomeRecord], covs: &[(i64, i64, f64)]) -> DesignMatrix {
        let mut b = DesignBuilder::new();
        for r in recs {
            b.push_outcome(*r);
        }
        for &(r, c, v) in covs {
            b.push_covariate(r, c, v);
        }
        b.build().expect("valid test data")
    }

    /// Brute-force LL, gradient and information (−Hessian) at β, straight from the definitions.
    /// `censor` = G(T−) per row (Fine–Gray), `None` for Cox.
    pub fn brute(
        x: &DesignMatrix,
        beta: &[f64],
        ties: Ties,
        censor: Option<&[f64]>,
    ) -> (f64, Vec<f64>, Vec<f64>) {
        let n = x.n_rows();
        let p = x.n_cols();
        let r = &x.rows;
        let row_time = r.time.as_f64();
        let row_y = r.y.as_f64();
        let row_stratum = r.stratum.as_u32();
        let xd: Vec<Vec<f64>> = x.columns.iter().map(|c| c.to_dense(n)).collect();
        let eta: Vec<f64> = (0..n)
            .map(|i| x.offset(i) + (0..p).map(|j| beta[j] * xd[j][i]).sum::<f64>())
            .collect();
        let mut ll = 0.0;
        let mut grad = vec![0.0; p];
        let mut info = vec![0.0; p * p];
        for i in 0..n {
            if row_y[i] == 1.0 {
                ll += x.weight(i) * eta[i];
                for j in 0..p {
                    grad[j] += x.weight(i) * xd[j][i];
                }
            }
        }
        // Distinct (stratum, event time).
        let mut keys: Vec<(u32, f64)> = (0..n)
            .filter(|&i| row_y[i] == 1.0)
            .map(|i| (row_stratum[i], row_time[i]))
            .collect();
        keys.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        keys.dedup();
        for &(s, t) in &keys {
            let events: Vec<usize> = (0..n)
                .filter(|&i| row_stratum[i] == s && row_time[i] == t && row_y[i] == 1.0)
                .collect();
            let g_t = censor.map_or(1.0, |c| c[events[0]]);
            let mut s0 = 0.0;
            let mut s1 = vec![0.0; p];
            let mut s2 = vec![0.0; p * p];
            for k in 0..n {
                if row_stratum[k] != s {
                    continue;
                }
                let fwd = row_time[k] >= t && r.start_time.as_ref().is_none_or(|st| st[k] < t);
                let wt = if fwd {
                    1.0
                } else if censor.is_some() && row_y[k] == 2.0 && row_time[k] < t {
                    g_t / censor.unwrap()[k]
                } else {
                    continue;
                };
                let c = wt * x.weight(k) * eta[k].exp();
                s0 += c;
                for a in 0..p {
                    s1[a] += c * xd[a][k];
                    for b in 0..p {
                        s2[a * p + b] += c * xd[a][k] * xd[b][k];
                    }
                }
            }
            let d = events.len();
            let wsum: f64 = events.iter().map(|&i| x.weight(i)).sum();
            let mut e0 = 0.0;
            let mut e1 = vec![0.0; p];
            let mut e2 = vec![0.0; p * p];
            for &k in &events {
                let c = x.weight(k) * eta[k].exp();
                e0 += c;
                for a in 0..p {
                    e1[a] += c * xd[a][k];
                    for b in 0..p {
                        e2[a * p + b] += c * xd[a][k] * xd[b][k];
                    }
                }
            }
            let (terms, wbar) = match ties {
                Ties::Breslow => (1, wsum),
                Ties::Efron => (d, wsum / d as f64),
            };
            for l in 0..terms {
                let f = l as f64 / d as f64;
                let den = s0 - f * e0;
                ll -= wbar * den.ln();
                for a in 0..p {
                    let ma = s1[a] - f * e1[a];
                    grad[a] -= wbar * ma / den;
                    for b in 0..p {
                        let mb = s1[b] - f * e1[b];
                        info[a * p + b] += wbar
                            * ((s2[a * p + b] - f * e2[a * p + b]) / den - ma * mb / (den * den));
                    }
                }
            }
        }
        (ll, grad, info)
    }

    /// The sparse sweep's information on `cols` equals the dense per-group sums (to 1e-10 of
    /// the largest entry), is bit-identical for any block split and thread count, and the
    /// segment approximation lies above it (positive semidefinite difference).
    #[cfg(test)]
    pub(crate) fn assert_information_paths_agree(
        model: &mut RiskSetModel,
        cols: &[usize],
        what: &str,
    ) {
        let dense = model.information_dense(cols);
        // The bound is packed (its lower triangle, row by row): the full symmetric matrix.
        let k = cols.len();
        let packed = model.information_segments(cols);
        assert_eq!(packed.len(), k * (k + 1) / 2);
        let mut bound = vec![0.0; k * k];
        for a in 0..k {
            for b in 0..=a {
                bound[a * k + b] = packed[a * (a + 1) / 2 + b];
                bound[b * k + a] = packed[a * (a + 1) / 2 + b];
            }
        }
        assert_psd_difference(&bound, &dense, cols.len());
        // The bound's Gram rows in blocks of matrix rows (`gram_column_cuts`): the same bits
        // for any thread count and for one block.
        for threads in 1..=3 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let again = pool.install(|| model.information_segments(cols));
            assert!(
                again
                    .iter()
                    .zip(&packed)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: the segment bound on {threads} threads"
            );
        }
        // One chunk or block: equal to rounding (row chunks add their matrices in chunk
        // order; matrix-row blocks are bit-identical to one walk).
        let min_entries = model.gram_min_entries;
        model.gram_min_entries = usize::MAX;
        let one_block = model.information_segments(cols);
        model.gram_min_entries = min_entries;
        let scale = packed.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (a, (c, o)) in packed.iter().zip(&one_block).enumerate() {
            assert!(
                (c - o).abs() <= 1e-12 * scale,
                "{what} bound entry {a}: split {c}, one chunk {o}"
            );
        }
        for threads in 1..=3 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let sweep = pool.install(|| model.information_sweep_blocks(cols, 3));
            let one_block = model.information_sweep_blocks(cols, 1);
            assert!(sweep
                .iter()
                .zip(&one_block)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
            let scale = dense.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for (a, (d, s)) in dense.iter().zip(&sweep).enumerate() {
                assert!(
                    (d - s).abs() <= 1e-10 * scale,
                    "{what} entry {a}: dense {d} sweep {s}"
                );
            }
        }
    }

    /// `upper − lower` (k × k, row-major) is symmetric positive semidefinite (Cholesky of
    /// the difference plus a rounding-level ridge) and `upper` is not far above `lower`.
    pub fn assert_psd_difference(upper: &[f64], lower: &[f64], k: usize) {
        let scale = lower.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let mut d: Vec<f64> = upper.iter().zip(lower).map(|(u, l)| u - l).collect();
        for a in 0..k {
            for b in 0..k {
                assert!(
                    (d[a * k + b] - d[b * k + a]).abs() <= 1e-10 * scale,
                    "not symmetric"
                );
            }
            d[a * k + a] += 1e-10 * scale;
        }
        assert!(
            crate::model::newton::cholesky(&d, k).is_some(),
            "difference not PSD: {d:?}"
        );
        for a in 0..k {
            let (u, l) = (upper[a * k + a], lower[a * k + a]);
            assert!(u <= 1.5 * l + 1e-10 * scale, "bound far above: {u} vs {l}");
        }
    }

    pub fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
    }

    /// Compare the likelihood's state at `beta` against the brute force (LL, every g_j and h_j,
    /// and the full information matrix).
    pub fn check(
        lik: &mut dyn Likelihood,
        x: &DesignMatrix,
        beta: &[f64],
        ties: Ties,
        censor: Option<&[f64]>,
        what: &str,
    ) {
        let (ll, grad, info) = brute(x, beta, ties, censor);
        let p = beta.len();
        let got = lik.log_likelihood();
        assert!(close(got, ll, 1e-10), "{what}: LL {got} vs {ll}");
        for j in 0..p {
            let (g, h) = lik.gradient_hessian(j);
            assert!(close(g, grad[j], 1e-9), "{what}: g[{j}] {g} vs {}", grad[j]);
            assert!(
                close(h, info[j * p + j], 1e-9),
                "{what}: h[{j}] {h} vs {}",
                info[j * p + j]
            );
        }
        let cols: Vec<usize> = (0..p).collect();
        let got = lik.information(&cols);
        for (a, (&u, &v)) in got.iter().zip(&info).enumerate() {
            assert!(close(u, v, 1e-9), "{what}: info[{a}] {u} vs {v}");
        }
        let reversed: Vec<usize> = (0..p).rev().collect();
        for (&j, g) in reversed.iter().zip(lik.gradients(&reversed)) {
            assert!(
                close(g, grad[j], 1e-9),
                "{what}: gradients[{j}] {g} vs {}",
                grad[j]
            );
        }
    }

    /// Set β, check, then a sequence of updates (each checked), then set_beta again.
    pub fn exercise(
        lik: &mut dyn Likelihood,
        x: &DesignMatrix,
        ties: Ties,
        censor: Option<&[f64]>,
        seed: u64,
        what: &str,
    ) {
        let p = x.n_cols();
        let mut rng = Rng(seed | 1);
        let mut beta: Vec<f64> = (0..p).map(|_| rng.unif() - 0.5).collect();
        lik.set_beta(&beta);
        check(
            lik,
            x,
            &beta,
            ties,
            censor,
            &format!("{what} after set_beta"),
        );
        for step in 0..2 * p {
            let j = rng.below(p as u64) as usize;
            let d = rng.unif() - 0.5;
            beta[j] += d;
            lik.update(j, d);
            if step % 2 == 1 {
                check(
                    lik,
                    x,
                    &beta,
                    ties,
                    censor,
                    &format!("{what} after update {step}"),
                );
            }
        }
        lik.set_beta(&beta);
        check(
            lik,
            x,
            &beta,
            ties,
            censor,
            &format!("{what} after second set_beta"),
        );
        // `set_beta` at the same β again keeps the state; after updates that come back to
        // β it recomputes it: both bit for bit the state of the set_beta above.
        let state = |lik: &mut dyn Likelihood| -> Vec<u64> {
            let mut bits = vec![lik.log_likelihood().to_bits()];
            for j in 0..p {
                let (g, h) = lik.gradient_hessian(j);
                bits.extend([g.to_bits(), h.to_bits()]);
            }
            bits
        };
        let first = state(lik);
        lik.set_beta(&beta);
        assert_eq!(state(lik), first, "{what}: set_beta again");
        lik.update(0, 0.25);
        lik.update(0, -0.25);
        lik.set_beta(&beta);
        assert_eq!(state(lik), first, "{what}: set_beta after updates");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-place rearrangement puts every entry where the plain copy into the lower
    /// triangle does (distinct values: any misplaced entry shows).
    #[test]
    fn gram_cuts_are_chunks_of_about_equal_entries() {
        // 1000 rows of 0..=5 entries among k = 6 columns.
        let mut ptr = vec![0u32];
        let mut col = Vec::new();
        for i in 0..1000u32 {
            for a in 0..(i * 7 % 6) as u16 {
                col.push(a);
            }
            ptr.push(col.len() as u32);
        }
        let rows = SweepRows {
            ptr: &ptr,
            col: &col,
            val: &[],
        };
        let entries = col.len();
        assert!(gram_row_chunks_fit(&rows, 6));
        for min_entries in [1, 100, 400, 1000, entries, usize::MAX] {
            let cuts = gram_cuts(&rows, 6, min_entries);
            let chunks = cuts.len() - 1;
            assert_eq!((cuts[0], cuts[chunks]), (0, 1000));
            assert!(cuts.windows(2).all(|w| w[0] < w[1]));
            assert_eq!(
                chunks,
                (entries / min_entries.max(1)).clamp(1, GRAM_MAX_CHUNKS),
                "min_entries {min_entries}"
            );
            for w in cuts.windows(2) {
                let e = (ptr[w[1]] - ptr[w[0]]) as usize;
                assert!(
                    e.abs_diff(entries / chunks) <= 5,
                    "{e} of {entries} in {chunks}"
                );
            }
        }
        // Chunk matrices too large for the rows (k = 400: 8 × 641 KB against 64 bytes per
        // row): one chunk, and the matrix-row blocks take over.
        assert!(!gram_row_chunks_fit(&rows, 400));
        assert_eq!(gram_cuts(&rows, 400, 1), vec![0, 1000]);
    }

    #[test]
    fn gram_column_cuts_balance_the_work() {
        // Equal columns: work k − a per row, blocks of about equal sums.
        let k = 100;
        for blocks in [1, 2, 3, 8, 99, 100, 500] {
            let cuts = gram_column_cuts(&vec![10; k], blocks);
            assert_eq!((cuts[0], *cuts.last().unwrap()), (0, k));
            assert!(cuts.windows(2).all(|w| w[0] < w[1]), "{cuts:?}");
            assert!(cuts.len() - 1 <= blocks.max(1));
            if blocks <= 8 {
                assert_eq!(cuts.len() - 1, blocks, "{cuts:?}");
                let total = (k * (k + 1) / 2) as f64;
                for w in cuts.windows(2) {
                    let work: usize = (w[0]..w[1]).map(|a| k - a).sum();
                    assert!(
                        (work as f64 - total / blocks as f64).abs() <= k as f64,
                        "{blocks} blocks: {cuts:?}"
                    );
                }
            }
        }
        // Empty columns carry no work; no empty blocks; k = 0 and k = 1.
        let cuts = gram_column_cuts(&[0, 0, 5, 0, 5, 0], 2);
        assert_eq!(cuts, vec![0, 3, 6]);
        assert_eq!(gram_column_cuts(&[], 4), vec![0]);
        assert_eq!(gram_column_cuts(&[3], 4), vec![0, 1]);
    }

    /// Any split of the matrix rows gives the bits of one walk (0/1 and valued entries).
    #[test]
    fn gram_columns_split_is_the_whole() {
        let k = 7;
        let mut ptr = vec![0u32];
        let mut col = Vec::new();
        let mut val = Vec::new();
        for i in 0..300u32 {
            for a in 0..k as u16 {
                if (i * 13 + a as u32 * 7) % 5 < 2 {
                    col.push(a);
                    val.push(0.1 + (i * 31 + a as u32) as f64 % 17.0 / 7.0);
                }
            }
            ptr.push(col.len() as u32);
        }
        let w: Vec<f64> = (0..300).map(|i| ((i * 7) % 11) as f64 / 3.0).collect();
        let len = k * (k + 1) / 2;
        for vals in [&val[..], &[][..]] {
            let rows = SweepRows {
                ptr: &ptr,
                col: &col,
                val: vals,
            };
            let mut whole = vec![0.0; len];
            gram_columns(&rows, k, &w, 0, k, &mut whole);
            // The plain definition, row after row.
            let mut plain = vec![0.0; len];
            for (i, &wi) in w.iter().enumerate() {
                let (lo, hi) = rows.range(i);
                for e in lo..hi {
                    for e2 in e..hi {
                        let (a, b) = (rows.col[e] as usize, rows.col[e2] as usize);
                        plain[upper_offset(k, a) + b - a] += rows.value(e) * wi * rows.value(e2);
                    }
                }
            }
            assert_eq!(whole, plain);
            for cuts in [vec![0, 3, 7], vec![0, 1, 2, 6, 7], vec![0, 6, 7]] {
                let mut split = vec![0.0; len];
                for c in cuts.windows(2) {
                    let (lo, hi) = (upper_offset(k, c[0]), upper_offset(k, c[1]));
                    gram_columns(&rows, k, &w, c[0], c[1], &mut split[lo..hi]);
                }
                assert!(
                    split
                        .iter()
                        .zip(&whole)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{cuts:?}"
                );
            }
        }
    }

    #[test]
    fn upper_to_lower_in_place_is_the_copy() {
        for k in (0..=70).chain([97, 256, 901]) {
            let upper: Vec<f64> = (0..k * (k + 1) / 2).map(|p| p as f64 + 0.5).collect();
            let mut copy = Vec::with_capacity(upper.len());
            for a in 0..k {
                copy.extend((0..=a).map(|b| upper[upper_offset(k, b) + a - b]));
            }
            let mut moved = upper.clone();
            upper_to_lower_in_place(&mut moved, k);
            assert_eq!(moved, copy, "k = {k}");
        }
    }
}

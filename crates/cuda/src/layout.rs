//! Host-side layouts of a design matrix for the CUDA kernels (`kernels/*.cu`).
//!
//! Pure Rust (no `cudarc`), so the layouts are built and tested on every machine: the unit tests
//! below evaluate the kernels' formulas on these arrays, serially, against the brute-force
//! references of [`epifusion_core::model`]. What the kernels then do with the arrays is only checked on a
//! GPU (`tests/integration/gpu_parity.rs`).
//!
//! Rows are renumbered into the model's internal order and the columns re-indexed to it (CSC,
//! entries of a column sorted by internal row). Indicator columns keep row indices only.

use epifusion_core::error::{Error, Result};
use epifusion_core::model::censoring::censoring_weights;
use epifusion_core::model::design::{ColumnFormat, DesignMatrix};
use epifusion_core::model::ModelKind;

/// The design's columns in CSC over the internal row order.
#[derive(Debug, Clone, Default)]
pub struct CscLayout {
    /// Column j's entries are `col_ptr[j]..col_ptr[j + 1]`.
    pub col_ptr: Vec<i64>,
    /// Internal row of each entry.
    pub row_idx: Vec<i32>,
    /// Where column j's values start in `vals`, or −1 for an indicator column.
    pub val_off: Vec<i64>,
    /// Values of the non-indicator columns.
    pub vals: Vec<f64>,
}

impl CscLayout {
    /// Re-index the columns of `x` to internal rows: `pos[i]` is the internal row of row `i`.
    fn build(x: &DesignMatrix, pos: &[u32]) -> Result<Self> {
        let mut out = CscLayout {
            col_ptr: vec![0],
            ..Default::default()
        };
        let mut entries: Vec<(u32, f64)> = Vec::new();
        for col in &x.columns {
            entries.clear();
            entries.extend(col.entries().map(|(i, v)| (pos[i], v)));
            entries.sort_unstable_by_key(|e| e.0);
            let indicator = col.format == ColumnFormat::Indicator;
            out.val_off
                .push(if indicator { -1 } else { out.vals.len() as i64 });
            for &(k, v) in &entries {
                out.row_idx.push(k as i32);
                if !indicator {
                    out.vals.push(v);
                }
            }
            out.col_ptr.push(out.row_idx.len() as i64);
        }
        if out.row_idx.len() > i32::MAX as usize || x.n_rows() > i32::MAX as usize {
            return Err(Error::Device(
                "the CUDA kernels index rows with 32-bit integers; this design is too large".into(),
            ));
        }
        Ok(out)
    }

    /// Number of columns.
    pub fn n_cols(&self) -> usize {
        self.col_ptr.len() - 1
    }

    /// Column j's entries as (internal row, value).
    pub fn column(&self, j: usize) -> impl Iterator<Item = (usize, f64)> + '_ {
        let (lo, hi) = (self.col_ptr[j] as usize, self.col_ptr[j + 1] as usize);
        let off = self.val_off[j];
        (lo..hi).map(move |i| {
            let v = if off < 0 {
                1.0
            } else {
                self.vals[off as usize + i - lo]
            };
            (self.row_idx[i] as usize, v)
        })
    }
}

/// SCCS / conditional Poisson (`kernels/sccs.cu`): rows in (stratum, row id) order.
#[derive(Debug, Clone, Default)]
pub struct SccsLayout {
    /// Columns.
    pub csc: CscLayout,
    /// Stratum s holds internal rows `strat_ptr[s]..strat_ptr[s + 1]`.
    pub strat_ptr: Vec<i64>,
    /// t·w per row.
    pub tw: Vec<f64>,
    /// y·w per row.
    pub yw: Vec<f64>,
    /// Offset per row (empty when none).
    pub offset: Vec<f64>,
    /// n_s = Σ y·w per stratum.
    pub nsum: Vec<f64>,
    /// Column j's runs are `col_run_ptr[j]..col_run_ptr[j + 1]`.
    pub col_run_ptr: Vec<i64>,
    /// First entry (global entry index) of each run.
    pub run_lo: Vec<i64>,
    /// One past the last entry of each run.
    pub run_hi: Vec<i64>,
    /// Stratum of each run.
    pub run_stratum: Vec<i32>,
    /// Σ_k y_k w_k x_kj per column (the constant part of g_j).
    pub gconst: Vec<f64>,
}

impl SccsLayout {
    /// Build from `x` (rows already checked for the model).
    pub fn build(x: &DesignMatrix) -> Result<Self> {
        let n = x.n_rows();
        let r = &x.rows;
        let row_time = r.time.as_f64();
        let row_y = r.y.as_f64();
        let row_ids = r.row_id.as_i64();
        let row_stratum = r.stratum.as_u32();
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_by_key(|&i| (row_stratum[i as usize], row_ids[i as usize]));
        let mut pos = vec![0u32; n];
        for (k, &i) in order.iter().enumerate() {
            pos[i as usize] = k as u32;
        }
        let mut l = SccsLayout {
            csc: CscLayout::build(x, &pos)?,
            ..Default::default()
        };
        let mut stratum_of = vec![0i32; n];
        for (k, &i) in order.iter().enumerate() {
            let i = i as usize;
            if k == 0 || row_stratum[i] != row_stratum[order[k - 1] as usize] {
                l.strat_ptr.push(k as i64);
                l.nsum.push(0.0);
            }
            let s = l.nsum.len() - 1;
            stratum_of[k] = s as i32;
            let w = x.weight(i);
            l.tw.push(row_time[i] * w);
            l.yw.push(row_y[i] * w);
            l.nsum[s] += row_y[i] * w;
            if r.offset.is_some() {
                l.offset.push(x.offset(i));
            }
        }
        l.strat_ptr.push(n as i64);
        l.col_run_ptr.push(0);
        for j in 0..l.csc.n_cols() {
            let (lo, hi) = (l.csc.col_ptr[j], l.csc.col_ptr[j + 1]);
            let mut g = 0.0;
            for (i, (k, v)) in (lo..hi).zip(l.csc.column(j)) {
                g += l.yw[k] * v;
                let s = stratum_of[k];
                if l.run_stratum.len() as i64 == *l.col_run_ptr.last().unwrap_or(&0)
                    || *l.run_stratum.last().unwrap_or(&-1) != s
                {
                    l.run_lo.push(i);
                    l.run_hi.push(i + 1);
                    l.run_stratum.push(s);
                } else if let Some(h) = l.run_hi.last_mut() {
                    *h = i + 1;
                }
            }
            l.gconst.push(g);
            l.col_run_ptr.push(l.run_lo.len() as i64);
        }
        Ok(l)
    }

    /// Number of strata.
    pub fn n_strata(&self) -> usize {
        self.nsum.len()
    }
}

/// Cox / Fine–Gray (`kernels/cox.cu`): rows in (stratum, time DESC, row id) order, event groups
/// and the Fine–Gray censoring weights.
#[derive(Debug, Clone, Default)]
pub struct RiskSetLayout {
    /// Columns.
    pub csc: CscLayout,
    /// Dense stratum per internal row (0, 1, … in order).
    pub stratum: Vec<i32>,
    /// y (0, 1, 2) per row.
    pub y: Vec<i32>,
    /// Weight per row.
    pub w: Vec<f64>,
    /// Offset per row (empty when none).
    pub offset: Vec<f64>,
    /// Fine–Gray: 1/G(T−) on competing rows, 0 elsewhere; empty for Cox.
    pub comp_scale: Vec<f64>,
    /// Group index on the last row of each event group, −1 elsewhere.
    pub grp: Vec<i32>,
    /// First row of each group's (stratum, time) block.
    pub grp_first: Vec<i64>,
    /// Events per group.
    pub grp_d: Vec<i32>,
    /// Total event weight per group.
    pub grp_wsum: Vec<f64>,
    /// Fine–Gray: G(t−) per group; empty for Cox.
    pub grp_g: Vec<f64>,
    /// Number of strata.
    pub n_strata: usize,
}

impl RiskSetLayout {
    /// Build from `x` for `kind` (Cox or Fine–Gray; rows already checked for the model).
    pub fn build(x: &DesignMatrix, kind: ModelKind) -> Result<Self> {
        let fine_gray = match kind {
            ModelKind::Cox => false,
            ModelKind::FineGray => true,
            other => {
                return Err(Error::Device(format!(
                    "internal: no risk-set layout for {}",
                    other.name()
                )))
            }
        };
        let r = &x.rows;
        let row_time = r.time.as_f64();
        let row_y = r.y.as_f64();
        let row_ids = r.row_id.as_i64();
        let row_stratum = r.stratum.as_u32();
        if r.start_time.is_some() {
            return Err(Error::Device(
                "counting-process (start, stop] rows are not supported by the CUDA kernels yet"
                    .into(),
            ));
        }
        let n = x.n_rows();
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (a as usize, b as usize);
            row_stratum[a]
                .cmp(&row_stratum[b])
                .then(row_time[b].total_cmp(&row_time[a]))
                .then(row_ids[a].cmp(&row_ids[b]))
        });
        let mut pos = vec![0u32; n];
        for (k, &i) in order.iter().enumerate() {
            pos[i as usize] = k as u32;
        }
        let censor: Option<Vec<f64>> = fine_gray.then(|| match &r.censor_weight {
            Some(c) => c.clone(),
            None => censoring_weights(&r.time.as_f64(), &r.y.as_f64(), &r.stratum.as_u32()),
        });
        let mut l = RiskSetLayout {
            csc: CscLayout::build(x, &pos)?,
            grp: vec![-1; n],
            ..Default::default()
        };
        let mut s = -1i32;
        let mut k = 0;
        // Whether the current stratum had an event group at a later time than the current block.
        let mut group_before = false;
        while k < n {
            let first = order[k] as usize;
            if k == 0 || row_stratum[first] != row_stratum[order[k - 1] as usize] {
                s += 1;
                group_before = false;
            }
            let mut end = k;
            while end < n
                && row_stratum[order[end] as usize] == row_stratum[first]
                && row_time[order[end] as usize] == row_time[first]
            {
                end += 1;
            }
            let (mut d, mut wsum, mut g_t) = (0, 0.0, 1.0);
            for &i in &order[k..end] {
                let i = i as usize;
                l.stratum.push(s);
                l.y.push(row_y[i] as i32);
                l.w.push(x.weight(i));
                if r.offset.is_some() {
                    l.offset.push(x.offset(i));
                }
                if let Some(c) = &censor {
                    let scale = if row_y[i] == 2.0 {
                        if c[i] > 0.0 {
                            1.0 / c[i]
                        } else if group_before {
                            return Err(Error::BadValue {
                                row: i,
                                row_id: row_ids[i],
                                column: "censor_weight".into(),
                                message: "the censoring survival G(T−) of a competing event in a \
                                          risk set must be > 0"
                                    .into(),
                            });
                        } else {
                            0.0
                        }
                    } else {
                        0.0
                    };
                    l.comp_scale.push(scale);
                }
                if row_y[i] == 1.0 {
                    if d == 0 {
                        g_t = censor.as_ref().map_or(1.0, |c| c[i]);
                    }
                    d += 1;
                    wsum += x.weight(i);
                }
            }
            if d > 0 {
                l.grp[end - 1] = l.grp_d.len() as i32;
                l.grp_first.push(k as i64);
                l.grp_d.push(d);
                l.grp_wsum.push(wsum);
                if fine_gray {
                    l.grp_g.push(g_t);
                }
                group_before = true;
            }
            k = end;
        }
        l.n_strata = (s + 1) as usize;
        Ok(l)
    }

    /// Number of event groups.
    pub fn n_groups(&self) -> usize {
        self.grp_d.len()
    }
}

/// Why the CUDA kernels cannot fit `kind` on `x`, if they cannot.
pub fn unsupported(kind: ModelKind, x: &DesignMatrix) -> Option<String> {
    match kind {
        ModelKind::ConditionalPoisson => None,
        ModelKind::Cox | ModelKind::FineGray if x.rows.start_time.is_some() => {
            Some("counting-process (start, stop] rows have no CUDA kernel yet".into())
        }
        other if !other.descriptor().gpu => {
            Some(format!("{} has no CUDA kernel yet", other.name()))
        }
        _ => None,
    }
}

/// Serial evaluation of the kernels' formulas on the layouts (test reference for the layouts;
/// the same arithmetic as `kernels/sccs.cu` and `kernels/cox.cu`, without the parallel split).
#[cfg(test)]
pub(crate) mod reference {
    use super::{RiskSetLayout, SccsLayout};
    use epifusion_core::model::Ties;

    /// η per internal row at β.
    pub fn eta(csc: &super::CscLayout, offset: &[f64], n: usize, beta: &[f64]) -> Vec<f64> {
        let mut eta = if offset.is_empty() {
            vec![0.0; n]
        } else {
            offset.to_vec()
        };
        for (j, &b) in beta.iter().enumerate() {
            for (k, v) in csc.column(j) {
                eta[k] += b * v;
            }
        }
        eta
    }

    /// (LL, g, h) of SCCS at β, per column.
    pub fn sccs(l: &SccsLayout, beta: &[f64]) -> (f64, Vec<f64>, Vec<f64>) {
        let n = l.tw.len();
        let eta = eta(&l.csc, &l.offset, n, beta);
        let te: Vec<f64> = (0..n).map(|k| l.tw[k] * eta[k].exp()).collect();
        let mut den = vec![0.0; l.n_strata()];
        let mut ll = 0.0;
        for (s, d) in den.iter_mut().enumerate() {
            for k in l.strat_ptr[s] as usize..l.strat_ptr[s + 1] as usize {
                *d += te[k];
                ll += l.yw[k] * eta[k];
            }
            if l.nsum[s] > 0.0 {
                ll -= l.nsum[s] * d.ln();
            }
        }
        let (mut gs, mut hs) = (Vec::new(), Vec::new());
        for j in 0..l.csc.n_cols() {
            let (mut g, mut h) = (l.gconst[j], 0.0);
            let c0 = l.csc.col_ptr[j];
            let off = l.csc.val_off[j];
            for r in l.col_run_ptr[j] as usize..l.col_run_ptr[j + 1] as usize {
                let (mut n1, mut n2) = (0.0, 0.0);
                for i in l.run_lo[r]..l.run_hi[r] {
                    let x = if off < 0 {
                        1.0
                    } else {
                        l.csc.vals[(off + i - c0) as usize]
                    };
                    let c = te[l.csc.row_idx[i as usize] as usize] * x;
                    n1 += c;
                    n2 += c * x;
                }
                let s = l.run_stratum[r] as usize;
                let p = n1 / den[s];
                g -= l.nsum[s] * p;
                h += l.nsum[s] * (n2 / den[s] - p * p);
            }
            gs.push(g);
            hs.push(h);
        }
        (ll, gs, hs)
    }

    /// (g, h, LL) of column `j` (None: LL only) for Cox / Fine–Gray at β.
    pub fn risk_set(l: &RiskSetLayout, beta: &[f64], j: Option<usize>, ties: Ties) -> [f64; 3] {
        let n = l.w.len();
        let eta = eta(&l.csc, &l.offset, n, beta);
        let we: Vec<f64> = (0..n).map(|k| l.w[k] * eta[k].exp()).collect();
        let mut xcol = vec![0.0; n];
        if let Some(j) = j {
            for (k, v) in l.csc.column(j) {
                xcol[k] = v;
            }
        }
        let fg = !l.comp_scale.is_empty();
        let add = |a: &mut [f64; 6], k: usize| {
            let (c, x) = (we[k], xcol[k]);
            a[0] += c;
            a[1] += c * x;
            a[2] += c * x * x;
            if fg {
                let b = c * l.comp_scale[k];
                a[3] += b;
                a[4] += b * x;
                a[5] += b * x * x;
            }
        };
        let mut ctot = vec![[0.0; 3]; l.n_strata];
        let mut r = [0.0; 6];
        for k in 0..n {
            if k == 0 || l.stratum[k] != l.stratum[k - 1] {
                r = [0.0; 6];
            }
            add(&mut r, k);
            ctot[l.stratum[k] as usize] = [r[3], r[4], r[5]];
        }
        let (mut g, mut h, mut ll) = (0.0, 0.0, 0.0);
        let mut r = [0.0; 6];
        for k in 0..n {
            if k == 0 || l.stratum[k] != l.stratum[k - 1] {
                r = [0.0; 6];
            }
            add(&mut r, k);
            if l.y[k] == 1 {
                g += l.w[k] * xcol[k];
                ll += l.w[k] * eta[k];
            }
            let Ok(gi) = usize::try_from(l.grp[k]) else {
                continue;
            };
            let (mut s0, mut s1, mut s2) = (r[0], r[1], r[2]);
            if fg {
                let (gg, c) = (l.grp_g[gi], ctot[l.stratum[k] as usize]);
                s0 += gg * (c[0] - r[3]);
                s1 += gg * (c[1] - r[4]);
                s2 += gg * (c[2] - r[5]);
            }
            let d = l.grp_d[gi];
            let (mut e0, mut e1, mut e2) = (0.0, 0.0, 0.0);
            let (mut terms, mut wbar) = (1, l.grp_wsum[gi]);
            if ties == Ties::Efron && d >= 2 {
                for i in l.grp_first[gi] as usize..=k {
                    if l.y[i] == 1 {
                        let (c, x) = (we[i], xcol[i]);
                        e0 += c;
                        e1 += c * x;
                        e2 += c * x * x;
                    }
                }
                terms = d;
                wbar /= d as f64;
            }
            for t in 0..terms {
                let f = t as f64 / d as f64;
                let den = s0 - f * e0;
                let m1 = s1 - f * e1;
                g -= wbar * m1 / den;
                h += wbar * ((s2 - f * e2) / den - m1 * m1 / (den * den));
                ll -= wbar * den.ln();
            }
        }
        [g, h, ll]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use epifusion_core::model::risk_set::test_support::{
        brute, build, close, random_records, Spec,
    };
    use epifusion_core::model::{Likelihood, Ties};

    #[test]
    fn risk_set_layout_formulas_match_the_brute_force() {
        for (seed, fine_gray, strata, weights, offset) in [
            (1, false, 1, false, false),
            (2, false, 3, true, true),
            (3, true, 1, false, false),
            (4, true, 4, true, true),
        ] {
            let spec = Spec {
                n: 60,
                p: 4,
                strata,
                weights,
                counting: false,
                fine_gray,
                offset,
            };
            let (recs, covs) = random_records(spec, seed);
            let x = build(&recs, &covs);
            let kind = if fine_gray {
                ModelKind::FineGray
            } else {
                ModelKind::Cox
            };
            let l = RiskSetLayout::build(&x, kind).unwrap();
            let censor = fine_gray.then(|| {
                censoring_weights(
                    &x.rows.time.as_f64(),
                    &x.rows.y.as_f64(),
                    &x.rows.stratum.as_u32(),
                )
            });
            let beta = [0.3, -0.2, 0.5, -0.4];
            for ties in [Ties::Breslow, Ties::Efron] {
                let (ll, grad, info) = brute(&x, &beta, ties, censor.as_deref());
                let what = format!("seed {seed} {ties:?}");
                let got = reference::risk_set(&l, &beta, None, ties);
                assert!(close(got[2], ll, 1e-10), "{what}: LL {} vs {ll}", got[2]);
                for j in 0..4 {
                    let [g, h, _] = reference::risk_set(&l, &beta, Some(j), ties);
                    assert!(close(g, grad[j], 1e-9), "{what}: g[{j}] {g} vs {}", grad[j]);
                    assert!(close(h, info[j * 4 + j], 1e-9), "{what}: h[{j}] {h}");
                }
            }
        }
    }

    #[test]
    fn sccs_layout_formulas_match_the_cpu_likelihood() {
        let (recs, covs) = random_records(
            Spec {
                n: 80,
                p: 4,
                strata: 9,
                weights: true,
                counting: false,
                fine_gray: false,
                offset: true,
            },
            7,
        );
        let x = build(&recs, &covs);
        let l = SccsLayout::build(&x).unwrap();
        let mut cpu = epifusion_core::model::sccs::ConditionalPoisson::new(&x).unwrap();
        let beta = [0.3, -0.2, 0.5, -0.4];
        cpu.set_beta(&beta);
        let (ll, g, h) = reference::sccs(&l, &beta);
        assert!(close(ll, cpu.log_likelihood(), 1e-10));
        for j in 0..4 {
            let (cg, ch) = cpu.gradient_hessian(j);
            assert!(close(g[j], cg, 1e-9), "g[{j}] {} vs {cg}", g[j]);
            assert!(close(h[j], ch, 1e-9), "h[{j}] {} vs {ch}", h[j]);
        }
    }

    #[test]
    fn counting_process_rows_are_reported_unsupported() {
        let (recs, covs) = random_records(
            Spec {
                n: 20,
                p: 2,
                strata: 1,
                weights: false,
                counting: true,
                fine_gray: false,
                offset: false,
            },
            3,
        );
        let x = build(&recs, &covs);
        assert!(unsupported(ModelKind::Cox, &x).is_some());
        assert!(RiskSetLayout::build(&x, ModelKind::Cox).is_err());
        assert!(unsupported(ModelKind::Logistic, &x).is_some());
    }
}

//! Folds as row selections of one shared risk-set structure (cross-validation).
//!
//! Cross-validation fits the model on k training sets and scores it on the k held-out sets.
//! Instead of a copy of the rows of each, one [`RiskSetModel`] is built on every row and a
//! fold is a selection of its rows: [`RiskSetModel::refold`] gives the rows left out weight 0
//! and rebuilds what depends on which rows are in —
//!
//! * the event groups' weights and counts: a group whose events are all left out gets weight
//!   0 and drops out of every sum (r_g = q_g = 0);
//! * each row's entry position: the first group *of the fold* at or after its own, as in a
//!   model built on a copy of the fold's rows (so the segments of the approximate
//!   information, which count the rows entering each group, are those of the copy);
//! * Efron's tied groups (d ≥ 2 events of the fold), Fine–Gray's censoring weights (the
//!   caller's G(T−) of the fold's rows) and which competing rows have a group before them;
//! * the events' column sums Σ w x ([`RiskSetModel::fold_event_sums`], all folds in one pass).
//!
//! The sorted columns — nearly all of the memory — are shared (`Arc`) by every clone, so k
//! folds cost one structure plus one row state per worker instead of k copies of the data.
//! A fold model evaluates the likelihood, gradients and information of a model built on a
//! copy of the fold's rows; sums over data-determined chunks (the coordinate walk, the
//! refresh) are split by the shared structure's sizes, so they agree to rounding rather than
//! bit for bit (each one is still independent of the number of threads).

use super::{RiskSetModel, Ties};
use crate::error::{Error, Result};
use crate::model::design::RowIds;

/// What the folds need of the model on every row at full weights.
#[derive(Debug, Clone)]
pub struct FoldBase {
    /// Row weight per sorted row.
    w: Vec<f64>,
    /// Entry position per sorted row (groups of all rows).
    pos: Vec<u32>,
    /// Fine–Gray competing rows with a group before them (empty for Cox).
    competing: Vec<bool>,
}

/// Fine–Gray censoring survival of a fold: G(T−) of each input row computed from the fold's
/// rows (only the fold's rows are read), and the row ids for error messages.
#[derive(Debug, Clone, Copy)]
pub struct FoldCensor<'a> {
    /// G(T_i−) by input row.
    pub g_minus: &'a [f64],
    /// Row id by input row.
    pub row_id: &'a RowIds,
}

/// Σ_events w x per column over one fold's training rows and its held-out rows.
#[derive(Debug, Clone, Default)]
pub struct FoldSums {
    /// Training rows (every fold but this one).
    pub train: Vec<f64>,
    /// Held-out rows (this fold).
    pub test: Vec<f64>,
}

impl RiskSetModel {
    /// The full-weight state the folds start from (call on the model as built).
    pub fn fold_base(&self) -> FoldBase {
        FoldBase {
            w: self.w.clone(),
            pos: self.info.iter().map(|r| r.pos).collect(),
            competing: if self.fg {
                self.inv_g.iter().map(|&v| v != 0.0).collect()
            } else {
                Vec::new()
            },
        }
    }

    /// Input row of each sorted row.
    pub fn input_rows(&self) -> &[u32] {
        &self.input_row
    }

    /// The events' column sums of every fold's training and held-out rows, `fold_of[k]` the
    /// fold of sorted row k (< `n_folds`). One pass over the columns; each sum runs in entry
    /// order, as in a model built on a copy of the rows.
    pub fn fold_event_sums(
        &self,
        base: &FoldBase,
        fold_of: &[u32],
        n_folds: usize,
    ) -> Vec<FoldSums> {
        use rayon::prelude::*;
        let per_col: Vec<Vec<f64>> = self
            .cols
            .par_iter()
            .map(|col| {
                // [train f, test f] for every fold f.
                let mut acc = vec![0.0; 2 * n_folds];
                for (i, &k) in col.rows.iter().enumerate() {
                    let k = k as usize;
                    if !self.event[k] {
                        continue;
                    }
                    let v = base.w[k] * col.value(i);
                    let own = fold_of[k] as usize;
                    for f in 0..n_folds {
                        acc[2 * f + usize::from(f == own)] += v;
                    }
                }
                acc
            })
            .collect();
        (0..n_folds)
            .map(|f| FoldSums {
                train: per_col.iter().map(|a| a[2 * f]).collect(),
                test: per_col.iter().map(|a| a[2 * f + 1]).collect(),
            })
            .collect()
    }

    /// Select the rows with `keep[k]` (sorted order) of the model built on every row (`base`):
    /// the others get weight 0 and every group, position, tie and censoring quantity is
    /// rebuilt for the selection (module docs). `censor` is required for Fine–Gray,
    /// `event_sum` is the selection's [`FoldSums`] entry. The state is stale until the next
    /// `set_beta` (which every fit starts with).
    pub fn refold(
        &mut self,
        base: &FoldBase,
        keep: &[bool],
        censor: Option<FoldCensor<'_>>,
        event_sum: &[f64],
    ) -> Result<()> {
        let n = self.w.len();
        let mismatch = |what: &str| Error::BadColumn {
            column: "rows".into(),
            message: format!("fold selection: {what} has the wrong length"),
        };
        if keep.len() != n || base.w.len() != n {
            return Err(mismatch("row mask"));
        }
        if event_sum.len() != self.event_sum.len() {
            return Err(mismatch("event sums"));
        }
        if self.fg && censor.is_none() {
            return Err(mismatch("censoring weights"));
        }
        // Every quantity set_beta derives changes with the selection.
        self.fresh = false;
        self.fold_out.clear();
        self.fold_out.extend(keep.iter().map(|&b| !b));
        for ((w, &w0), &inside) in self.w.iter_mut().zip(&base.w).zip(keep) {
            *w = if inside { w0 } else { 0.0 };
        }
        // Groups: weight, count and G(t_g−) from the fold's events (in row order, as built).
        self.g_weight.fill(0.0);
        self.g_count.fill(0);
        self.g_cens.fill(1.0);
        for (k, &inside) in keep.iter().enumerate() {
            if inside && self.event[k] {
                let g = base.pos[k] as usize;
                if self.g_count[g] == 0 {
                    if let Some(c) = censor {
                        self.g_cens[g] = c.g_minus[self.input_row[k] as usize];
                    }
                }
                self.g_weight[g] += self.w[k];
                self.g_count[g] += 1;
            }
        }
        // Entry positions: the next group of the fold (the stratum end if none).
        let mut next = vec![0u32; self.g_weight.len()];
        let mut first = vec![0u32; self.s_start.len()];
        for &s in &self.active_strata {
            let s = s as usize;
            let (a, b) = (self.s_start[s], self.s_end[s]);
            let mut at = b;
            for g in (a..b).rev() {
                if self.g_count[g as usize] > 0 {
                    at = g;
                }
                next[g as usize] = at;
            }
            first[s] = at;
        }
        for (k, info) in self.info.iter_mut().enumerate() {
            let p = base.pos[k];
            let end = self.s_end[info.stratum as usize];
            info.pos = if p < end { next[p as usize] } else { p };
        }
        if self.fg {
            let c = censor.ok_or_else(|| mismatch("censoring weights"))?;
            for (k, &inside) in keep.iter().enumerate() {
                self.inv_g[k] = 0.0;
                let s = self.info[k].stratum as usize;
                if inside && base.competing[k] && first[s] < self.info[k].pos {
                    let o = self.input_row[k] as usize;
                    let g = c.g_minus[o];
                    if !(g.is_finite() && g > 0.0) {
                        return Err(Error::BadValue {
                            row: o,
                            row_id: if o < c.row_id.len() {
                                c.row_id.get(o)
                            } else {
                                o as i64
                            },
                            column: "censor_weight".into(),
                            message: format!(
                                "competing event with censoring survival G(T−) = {g}: it must stay in \
                                 later risk sets with weight G(t−)/G(T−), which needs G(T−) > 0"
                            ),
                        });
                    }
                    self.inv_g[k] = 1.0 / g;
                }
            }
        }
        let efron = self.ties == Ties::Efron;
        for (e, &d) in self.efron_group.iter_mut().zip(&self.g_count) {
            *e = efron && d >= 2;
        }
        self.any_efron = self.efron_group.iter().any(|&b| b);
        for v in [&mut self.eu, &mut self.ev, &mut self.ez] {
            v.fill(0.0);
        }
        self.simple = !self.counting && !self.any_efron;
        self.unit_groups = self.g_weight.iter().all(|&w| w == 1.0);
        self.n_event_groups = self.g_count.iter().filter(|&&d| d > 0).count();
        self.event_offset_sum = (0..self.offset.len())
            .filter(|&k| self.event[k])
            .map(|k| self.w[k] * self.offset[k])
            .sum();
        self.event_sum.copy_from_slice(event_sum);
        self.row_major_cache = None;
        self.dirty = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::censoring::censoring_weights;
    use crate::model::design::DesignMatrix;
    use crate::model::risk_set::test_support::{build, random_records, Spec};
    use crate::model::risk_set::RiskSetKind;

    /// G(T−) of the rows with `keep_input[i]` (input order), computed from those rows alone.
    fn fold_censor(x: &DesignMatrix, keep_input: &[bool]) -> Vec<f64> {
        let rows: Vec<usize> = (0..x.n_rows()).filter(|&i| keep_input[i]).collect();
        let pick = |v: &[f64]| rows.iter().map(|&i| v[i]).collect::<Vec<_>>();
        let st: Vec<u32> = rows.iter().map(|&i| x.rows.stratum.get(i)).collect();
        let g = censoring_weights(&pick(&x.rows.time.as_f64()), &pick(&x.rows.y.as_f64()), &st);
        let mut out = vec![1.0; x.n_rows()];
        for (&i, &v) in rows.iter().zip(&g) {
            out[i] = v;
        }
        out
    }

    fn model(x: &DesignMatrix, ties: Ties, fg: bool) -> RiskSetModel {
        let kind = if fg {
            RiskSetKind::FineGray
        } else {
            RiskSetKind::Cox
        };
        let g = fg.then(|| {
            censoring_weights(
                &x.rows.time.as_f64(),
                &x.rows.y.as_f64(),
                &x.rows.stratum.as_u32(),
            )
        });
        RiskSetModel::new(x, ties, kind, g.as_deref()).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-10 * (1.0 + a.abs().max(b.abs()))
    }

    /// A fold selection evaluates what a model built on a copy of the fold's rows does: the
    /// log-likelihood, every gradient and curvature before and after an update, the batched
    /// gradients, the exact information and the approximate (segment) information — with
    /// strata, weights, offsets, (start, stop] rows, Fine–Gray and both tie methods, for the
    /// training and the held-out side of every fold, on one reused model.
    #[test]
    fn fold_selection_matches_a_copy_of_the_rows() {
        let mut seed = 900;
        for ties in [Ties::Breslow, Ties::Efron] {
            for (strata, weights, counting, fg) in [
                (1, false, false, false),
                (3, true, false, false),
                (2, true, true, false),
                (1, false, false, true),
                (3, true, false, true),
            ] {
                seed += 1;
                let spec = Spec {
                    n: 150,
                    p: 40,
                    strata,
                    weights,
                    counting,
                    fine_gray: fg,
                    offset: true,
                };
                let (mut recs, covs) = random_records(spec, seed);
                // More distinct times (longer stretches of groups for the segments).
                for (i, r) in recs.iter_mut().enumerate() {
                    if i % 2 == 0 {
                        r.time = r.time.map(|t| t + 0.1 * (i % 5) as f64);
                    }
                }
                let x = build(&recs, &covs);
                let p = x.n_cols();
                let mut full = model(&x, ties, fg);
                full.set_min_chunk(4);
                let base = full.fold_base();
                let n_folds = 4;
                let fold_of_input: Vec<u32> = (0..x.n_rows())
                    .map(|i| ((i * 7 + 3) % n_folds) as u32)
                    .collect();
                let fold_of: Vec<u32> = full
                    .input_rows()
                    .iter()
                    .map(|&o| fold_of_input[o as usize])
                    .collect();
                let sums = full.fold_event_sums(&base, &fold_of, n_folds);
                let mut worker = full.clone();
                let beta: Vec<f64> = (0..p).map(|j| 0.05 * ((j % 7) as f64 - 3.0)).collect();
                for (f, fold_sums) in sums.iter().enumerate() {
                    for test in [false, true] {
                        let keep_input: Vec<bool> = fold_of_input
                            .iter()
                            .map(|&g| (g as usize == f) == test)
                            .collect();
                        let rows: Vec<u32> = (0..x.n_rows() as u32)
                            .filter(|&i| keep_input[i as usize])
                            .collect();
                        let sub = x.subset_rows(&rows, None);
                        let kind = if fg {
                            RiskSetKind::FineGray
                        } else {
                            RiskSetKind::Cox
                        };
                        let g_sub = fg.then(|| {
                            censoring_weights(
                                &sub.rows.time.as_f64(),
                                &sub.rows.y.as_f64(),
                                &sub.rows.stratum.as_u32(),
                            )
                        });
                        let Ok(copy) = RiskSetModel::new(&sub, ties, kind, g_sub.as_deref()) else {
                            continue;
                        };
                        let mut copy = copy;
                        copy.set_min_chunk(4);
                        let keep: Vec<bool> = worker
                            .input_rows()
                            .iter()
                            .map(|&o| keep_input[o as usize])
                            .collect();
                        let g_fold = fold_censor(&x, &keep_input);
                        let censor = fg.then_some(FoldCensor {
                            g_minus: &g_fold,
                            row_id: &x.rows.row_id,
                        });
                        let s = if test {
                            &fold_sums.test
                        } else {
                            &fold_sums.train
                        };
                        worker.refold(&base, &keep, censor, s).unwrap();
                        let what = format!(
                            "{ties:?} strata={strata} weights={weights} counting={counting} fg={fg} fold={f} test={test}"
                        );
                        assert_eq!(worker.polish_max_block(), copy.polish_max_block(), "{what}");
                        worker.set_beta(&beta);
                        copy.set_beta(&beta);
                        let (a, b) = (worker.log_likelihood(), copy.log_likelihood());
                        assert!(close(a, b), "{what}: LL {a} vs {b}");
                        for round in 0..2 {
                            for j in 0..p {
                                let (g1, h1) = worker.gradient_hessian(j);
                                let (g2, h2) = copy.gradient_hessian(j);
                                assert!(
                                    close(g1, g2) && close(h1, h2),
                                    "{what} round {round} col {j}: ({g1}, {h1}) vs ({g2}, {h2})"
                                );
                            }
                            worker.update(3, 0.2);
                            copy.update(3, 0.2);
                            worker.update(5, -0.1);
                            copy.update(5, -0.1);
                        }
                        let cols: Vec<usize> = (0..p).collect();
                        for (a, b) in worker.gradients(&cols).iter().zip(copy.gradients(&cols)) {
                            assert!(close(*a, b), "{what}: gradients {a} vs {b}");
                        }
                        for cols in [&cols[..], &[0, 2, 5, 30][..]] {
                            let (i1, i2) = (worker.information(cols), copy.information(cols));
                            for (a, b) in i1.iter().zip(&i2) {
                                assert!(close(*a, *b), "{what}: information {a} vs {b}");
                            }
                        }
                        let a1 = worker.approximate_information(&cols).unwrap();
                        let a2 = copy.approximate_information(&cols).unwrap();
                        for (a, b) in a1.iter().zip(&a2) {
                            assert!(close(*a, *b), "{what}: approximate information {a} vs {b}");
                        }
                    }
                }
            }
        }
    }
}

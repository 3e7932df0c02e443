//! Passes over many sparse columns (row indices sorted, as the risk-set models keep them) in
//! blocks of rows, so that the dense per-row vector a pass reads or writes stays in cache.
//!
//! Walking k columns one after the other over an N-row vector touches about every cache line
//! of it k times (at 5 % density a 64-byte line holds 8 rows, so most lines have an entry in
//! most columns): at N = 1e6 and k = 500 that is gigabytes of memory traffic for a few
//! hundred megabytes of entries. Here the rows are cut into blocks of [`ROW_BLOCK`] rows and
//! every column's entries in a block are visited before the next block, so each block of the
//! vector is loaded once.
//!
//! # Determinism
//!
//! Every pass performs, per output element, the same floating-point operations in the same
//! order as the column-by-column loop it replaces (columns in the given order, each column's
//! entries in row order): the results are bit-identical to that loop, whatever the blocking
//! and however many threads run the blocks. The blocks are a fixed function of N, and the
//! parallel split ([`add_columns_block`], [`row_major`]: by row blocks; [`gather_sums`]: by groups
//! of columns, sized by the thread count) never changes which operations produce an element.

use rayon::prelude::*;

/// Rows per block: 16 Ki rows, 128 KiB of `f64`, well inside a core's L2 cache.
#[cfg(not(test))]
pub(crate) const ROW_BLOCK: usize = 1 << 14;
/// Tiny blocks in the unit tests, so that their small data sets span many blocks (and the
/// thread-independence tests of the models run the blocks in parallel).
#[cfg(test)]
pub(crate) const ROW_BLOCK: usize = 64;

/// Fewest entries per group of columns of [`gather_sums`] run as one parallel task.
const GATHER_GROUP_ENTRIES: usize = 1 << 16;
/// Most entries per group of [`gather_sums`]. Every column of a group gathers from a row
/// block of `d` while it is in cache, so groups of many columns read `d` from memory once per
/// group instead of once per pair of columns: at N = 1e6 (50 000 entries per column at 5 %
/// density) groups of 2 columns made the gathers of the DESIGN §10 Cox fit wait on the
/// 8 MB vector `d` for every pair.
const GATHER_GROUP_MAX_ENTRIES: usize = 1 << 21;
/// Groups per thread that [`gather_sums`] aims at (load balance).
const GATHER_GROUPS_PER_THREAD: usize = 4;

/// One sparse column: sorted row indices, their values (empty: every value is 1) and the
/// first entry of each row block ([`block_starts`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SparseCol<'a> {
    pub rows: &'a [u32],
    pub vals: &'a [f64],
    pub starts: &'a [u32],
}

/// Entry `i`'s value in a value array that is empty for a 0/1 column (every value 1).
#[inline]
pub(crate) fn value_or_one(vals: &[f64], i: usize) -> f64 {
    if vals.is_empty() {
        1.0
    } else {
        vals[i]
    }
}

impl SparseCol<'_> {
    #[inline]
    fn value(&self, i: usize) -> f64 {
        value_or_one(self.vals, i)
    }

    /// The entries of row block `b`.
    #[inline]
    fn block(&self, b: usize) -> (usize, usize) {
        (self.starts[b] as usize, self.starts[b + 1] as usize)
    }

    /// The rows and values (empty for 0/1 columns) of row block `b`.
    #[inline]
    fn block_entries(&self, b: usize) -> (&[u32], &[f64]) {
        let (lo, hi) = self.block(b);
        let vals = if self.vals.is_empty() {
            self.vals
        } else {
            &self.vals[lo..hi]
        };
        (&self.rows[lo..hi], vals)
    }
}

/// Number of row blocks of an `n`-row vector.
pub(crate) fn n_blocks(n: usize) -> usize {
    n.div_ceil(ROW_BLOCK)
}

/// The first entry of each of the `n_blocks(n)` row blocks of a column with sorted row
/// indices `rows` (< `n`), then `rows.len()`: one pass over the column, done once per model
/// (the passes below then never search for a block's entries).
pub(crate) fn block_starts(rows: &[u32], n: usize) -> Vec<u32> {
    let nb = n_blocks(n);
    let mut starts = Vec::with_capacity(nb + 1);
    let mut e = 0usize;
    for b in 0..nb {
        starts.push(e as u32);
        let r1 = ((b + 1) * ROW_BLOCK) as u32;
        while e < rows.len() && rows[e] < r1 {
            e += 1;
        }
    }
    starts.push(rows.len() as u32);
    starts
}

/// `block[r − r0] += coef · x_r` on row block `b` (rows r0 = b·ROW_BLOCK onwards; `block`:
/// that block of the output vector) for every column (x, coef) of `cols`, column after
/// column for each row: bit-identical to `for (x, coef) in cols { for (r, v) in x { out[r] +=
/// coef · v } }` on the block. Callers run the blocks in parallel and go on with each block
/// while it is in cache (`RiskSetModel::set_beta`: η, then w·e).
pub(crate) fn add_columns_block(b: usize, block: &mut [f64], cols: &[(SparseCol<'_>, f64)]) {
    let r0 = b * ROW_BLOCK;
    for (col, coef) in cols {
        let (lo, hi) = col.block(b);
        let rows = &col.rows[lo..hi];
        if col.vals.is_empty() {
            for &r in rows {
                block[r as usize - r0] += coef;
            }
        } else {
            for (&r, &v) in rows.iter().zip(&col.vals[lo..hi]) {
                block[r as usize - r0] += coef * v;
            }
        }
    }
}

/// Σ_r x_r · d_r per column (Σ d_r for 0/1 columns), each summed from 0 in row order:
/// bit-identical to summing the columns one by one. The columns are split into groups of
/// [`GATHER_GROUP_ENTRIES`] to [`GATHER_GROUP_MAX_ENTRIES`] entries (about
/// [`GATHER_GROUPS_PER_THREAD`] per thread) that run in parallel; within a group the row
/// blocks of `d` are visited in order, every column of the group carrying its running sum
/// from block to block. Each column's sum is the same operations in the same order whatever
/// the groups, so the split (which depends on the thread count) never changes a bit.
pub(crate) fn gather_sums(d: &[f64], cols: &[Option<SparseCol<'_>>]) -> Vec<f64> {
    let total: usize = cols.iter().flatten().map(|c| c.rows.len()).sum();
    let target = (total / (GATHER_GROUPS_PER_THREAD * rayon::current_num_threads()))
        .clamp(GATHER_GROUP_ENTRIES, GATHER_GROUP_MAX_ENTRIES);
    // Groups: consecutive columns until their entries reach the target.
    let mut bounds = vec![0usize];
    let mut acc = 0usize;
    for (a, c) in cols.iter().enumerate() {
        acc += c.map_or(0, |c| c.rows.len());
        if acc >= target {
            bounds.push(a + 1);
            acc = 0;
        }
    }
    if *bounds.last().expect("non-empty") < cols.len() {
        bounds.push(cols.len());
    }
    let group = |g: usize| -> Vec<f64> {
        let part = &cols[bounds[g]..bounds[g + 1]];
        let mut sums = vec![0.0f64; part.len()];
        for b in 0..n_blocks(d.len()) {
            // Two columns at a time: two independent running sums (each still in its
            // column's row order) hide the latency of the additions.
            let mut pairs = part.chunks(2).zip(sums.chunks_mut(2));
            for (c, s) in &mut pairs {
                let block = |a: usize| match &c[a] {
                    Some(c) => c.block_entries(b),
                    None => (&[][..], &[][..]),
                };
                match s {
                    [s0, s1] => {
                        let (x0, x1) = (block(0), block(1));
                        (*s0, *s1) = sum_two(d, x0, x1, *s0, *s1);
                    }
                    [s0] => *s0 = sum_two(d, block(0), (&[], &[]), *s0, 0.0).0,
                    _ => unreachable!("chunks of at most 2"),
                }
            }
        }
        sums
    };
    let parts: Vec<Vec<f64>> = (0..bounds.len() - 1).into_par_iter().map(group).collect();
    parts.concat()
}

/// `acc + Σ v_e d[r_e]` over the entries (r, v) of `x` and of `y` (v = 1 when the values are
/// empty), each summed in entry order; the two sums are interleaved for instruction-level
/// parallelism, every addition as in a loop over one of them alone.
#[inline]
fn sum_two(
    d: &[f64],
    x: (&[u32], &[f64]),
    y: (&[u32], &[f64]),
    mut sx: f64,
    mut sy: f64,
) -> (f64, f64) {
    let term = |(rows, vals): (&[u32], &[f64]), e: usize| {
        if vals.is_empty() {
            d[rows[e] as usize]
        } else {
            vals[e] * d[rows[e] as usize]
        }
    };
    let common = x.0.len().min(y.0.len());
    for e in 0..common {
        sx += term(x, e);
        sy += term(y, e);
    }
    for e in common..x.0.len() {
        sx += term(x, e);
    }
    for e in common..y.0.len() {
        sy += term(y, e);
    }
    (sx, sy)
}

/// The row-major form (CSR) of `cols` over `n` rows: row pointers, the index in `cols` of
/// each entry (entries of a row in column order; `u16`, so at most [`ROW_MAJOR_MAX_COLS`]
/// columns: callers check) and the values (`None` when every column is 0/1). Integer
/// bookkeeping except the copied values: the same result for any blocking. Row blocks run in
/// parallel.
pub(crate) fn row_major(
    n: usize,
    cols: &[Option<SparseCol<'_>>],
) -> (Vec<u32>, Vec<u16>, Option<Vec<f64>>) {
    debug_assert!(cols.len() <= ROW_MAJOR_MAX_COLS);
    let nb = n_blocks(n);
    let ones = cols.iter().flatten().all(|c| c.vals.is_empty());
    // Per-row counts, block by block.
    let mut ptr = vec![0u32; n + 1];
    ptr[1..]
        .par_chunks_mut(ROW_BLOCK)
        .enumerate()
        .for_each(|(b, counts)| {
            let r0 = b * ROW_BLOCK;
            for c in cols.iter().flatten() {
                let (lo, hi) = c.block(b);
                for &r in &c.rows[lo..hi] {
                    counts[r as usize - r0] += 1;
                }
            }
        });
    for i in 0..n {
        ptr[i + 1] += ptr[i];
    }
    let (mut col_of, mut val) = alloc_entries(ptr[n] as usize, ones);
    block_parts(&ptr, &mut col_of, &mut val)
        .into_par_iter()
        .enumerate()
        .for_each(|(b, (col_part, val_part))| {
            let r0 = b * ROW_BLOCK;
            let r1 = ((b + 1) * ROW_BLOCK).min(n);
            let e0 = ptr[r0];
            let mut fill: Vec<u32> = ptr[r0..r1].iter().map(|&p| p - e0).collect();
            for (a, c) in cols.iter().enumerate() {
                let Some(c) = c else { continue };
                let (lo, hi) = c.block(b);
                for (i, &r) in (lo..hi).zip(&c.rows[lo..hi]) {
                    let at = &mut fill[r as usize - r0];
                    col_part[*at as usize] = a as u16;
                    if !ones {
                        val_part[*at as usize] = c.value(i);
                    }
                    *at += 1;
                }
            }
        });
    debug_assert_eq!(nb, n_blocks(n));
    (ptr, col_of, (!ones).then_some(val))
}

/// Most columns of [`row_major`] (its column indices are `u16`: half the memory of `u32`, and
/// a dense k × k matrix over more columns would need 32 GiB).
pub(crate) const ROW_MAJOR_MAX_COLS: usize = 1 << 16;

/// Zeroed column indices and (unless `ones`) values for `total` entries.
fn alloc_entries(total: usize, ones: bool) -> (Vec<u16>, Vec<f64>) {
    let val = if ones { Vec::new() } else { vec![0.0; total] };
    (vec![0u16; total], val)
}

/// The entries of each row block (rows `b·ROW_BLOCK ..`, entries `ptr[r0] .. ptr[r1]`) as
/// disjoint mutable slices of `col` and `val` (`val` empty: empty slices).
fn block_parts<'a>(
    ptr: &[u32],
    col: &'a mut [u16],
    val: &'a mut [f64],
) -> Vec<(&'a mut [u16], &'a mut [f64])> {
    let n = ptr.len() - 1;
    let ones = val.is_empty();
    let mut parts = Vec::with_capacity(n_blocks(n));
    let (mut rest_c, mut rest_v) = (col, val);
    for b in 0..n_blocks(n) {
        let e0 = ptr[b * ROW_BLOCK] as usize;
        let e1 = ptr[((b + 1) * ROW_BLOCK).min(n)] as usize;
        let (c, rc) = std::mem::take(&mut rest_c).split_at_mut(e1 - e0);
        let (v, rv) = std::mem::take(&mut rest_v).split_at_mut(if ones { 0 } else { e1 - e0 });
        parts.push((c, v));
        rest_c = rc;
        rest_v = rv;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random sorted columns over `n` rows (some with values, some 0/1).
    fn columns(n: usize, k: usize, seed: u64) -> Vec<(Vec<u32>, Vec<f64>, Vec<u32>)> {
        let mut s = seed;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        (0..k)
            .map(|a| {
                let rows: Vec<u32> = (0..n as u32).filter(|_| next() % 10 == 0).collect();
                let vals = if a % 3 == 0 {
                    rows.iter().map(|_| (next() % 1000) as f64 / 7.0).collect()
                } else {
                    Vec::new()
                };
                let starts = block_starts(&rows, n);
                (rows, vals, starts)
            })
            .collect()
    }

    fn views(cols: &[(Vec<u32>, Vec<f64>, Vec<u32>)]) -> Vec<SparseCol<'_>> {
        cols.iter()
            .map(|(rows, vals, starts)| SparseCol { rows, vals, starts })
            .collect()
    }

    #[test]
    fn blocked_passes_match_the_column_loops_bit_for_bit() {
        // Three blocks and a partial one.
        let n = 3 * ROW_BLOCK + 1234;
        let data = columns(n, 40, 7);
        let cols = views(&data);
        let coefs: Vec<f64> = (0..cols.len()).map(|a| 0.1 * a as f64 - 1.3).collect();
        let d: Vec<f64> = (0..n).map(|r| (r as f64 * 0.37).sin()).collect();

        let mut want = vec![0.5; n];
        for (c, &coef) in cols.iter().zip(&coefs) {
            for (i, &r) in c.rows.iter().enumerate() {
                want[r as usize] += coef * c.value(i);
            }
        }
        let with_coef: Vec<(SparseCol<'_>, f64)> =
            cols.iter().copied().zip(coefs.iter().copied()).collect();
        let opt: Vec<Option<SparseCol<'_>>> = cols.iter().copied().map(Some).collect();
        let want_sums: Vec<f64> = cols
            .iter()
            .map(|c| {
                let mut s = 0.0;
                for (i, &r) in c.rows.iter().enumerate() {
                    s += if c.vals.is_empty() {
                        d[r as usize]
                    } else {
                        c.value(i) * d[r as usize]
                    };
                }
                s
            })
            .collect();
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut got = vec![0.5; n];
                got.par_chunks_mut(ROW_BLOCK)
                    .enumerate()
                    .for_each(|(b, block)| add_columns_block(b, block, &with_coef));
                assert!(got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
                let sums = gather_sums(&d, &opt);
                assert!(sums
                    .iter()
                    .zip(&want_sums)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
                let (ptr, col_of, val) = row_major(n, &opt);
                // Row by row: the row's entries in column order.
                for r in 0..n {
                    let mut expect = Vec::new();
                    for (a, c) in cols.iter().enumerate() {
                        if let Ok(i) = c.rows.binary_search(&(r as u32)) {
                            expect.push((a as u16, c.value(i)));
                        }
                    }
                    let (lo, hi) = (ptr[r] as usize, ptr[r + 1] as usize);
                    let got: Vec<(u16, f64)> = (lo..hi)
                        .map(|e| (col_of[e], val.as_ref().unwrap()[e]))
                        .collect();
                    assert_eq!(got, expect, "row {r}");
                }
            });
        }
        // All 0/1 columns: no values.
        let ones: Vec<Option<SparseCol<'_>>> = cols
            .iter()
            .filter(|c| c.vals.is_empty())
            .map(|&c| Some(c))
            .chain([None])
            .collect();
        let (ptr, col_of, val) = row_major(n, &ones);
        assert!(val.is_none());
        assert_eq!(ptr[n] as usize, col_of.len());
    }
}

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
//! parallel split ([`add_columns`], [`row_major`]: by row blocks; [`gather_sums`]: by groups
//! of columns) never changes which operations produce an element.

use rayon::prelude::*;

/// Rows per block: 16 Ki rows, 128 KiB of `f64`, well inside a core's L2 cache.
pub(crate) const ROW_BLOCK: usize = 1 << 14;

/// Entries per group of columns of [`gather_sums`] run as one parallel task.
const GATHER_GROUP_ENTRIES: usize = 1 << 16;

/// One sparse column: sorted row indices, their values (empty: every value is 1) and the
/// first entry of each row block ([`block_starts`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SparseCol<'a> {
    pub rows: &'a [u32],
    pub vals: &'a [f64],
    pub starts: &'a [u32],
}

impl SparseCol<'_> {
    #[inline]
    fn value(&self, i: usize) -> f64 {
        if self.vals.is_empty() {
            1.0
        } else {
            self.vals[i]
        }
    }

    /// The entries of row block `b`.
    #[inline]
    fn block(&self, b: usize) -> (usize, usize) {
        (self.starts[b] as usize, self.starts[b + 1] as usize)
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

/// `out[r] += coef · x_r` for every column (x, coef) of `cols`, column after column for each
/// row: bit-identical to `for (x, coef) in cols { for (r, v) in x { out[r] += coef · v } }`.
/// Row blocks run in parallel.
pub(crate) fn add_columns(out: &mut [f64], cols: &[(SparseCol<'_>, f64)]) {
    if cols.is_empty() {
        return;
    }
    out.par_chunks_mut(ROW_BLOCK)
        .enumerate()
        .for_each(|(b, block)| {
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
        });
}

/// Σ_r x_r · d_r per column (Σ d_r for 0/1 columns), each summed from 0 in row order:
/// bit-identical to summing the columns one by one. The columns are split into groups of
/// about [`GATHER_GROUP_ENTRIES`] entries (a function of the columns only) that run in
/// parallel; within a group the row blocks of `d` are visited in order, every column of the
/// group carrying its running sum from block to block.
pub(crate) fn gather_sums(d: &[f64], cols: &[Option<SparseCol<'_>>]) -> Vec<f64> {
    // Groups: consecutive columns until their entries reach GATHER_GROUP_ENTRIES.
    let mut bounds = vec![0usize];
    let mut acc = 0usize;
    for (a, c) in cols.iter().enumerate() {
        acc += c.map_or(0, |c| c.rows.len());
        if acc >= GATHER_GROUP_ENTRIES {
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
            for (c, s) in part.iter().zip(&mut sums) {
                let Some(c) = c else { continue };
                let (lo, hi) = c.block(b);
                let mut acc = *s;
                if c.vals.is_empty() {
                    for &r in &c.rows[lo..hi] {
                        acc += d[r as usize];
                    }
                } else {
                    for (&r, &v) in c.rows[lo..hi].iter().zip(&c.vals[lo..hi]) {
                        acc += v * d[r as usize];
                    }
                }
                *s = acc;
            }
        }
        sums
    };
    let parts: Vec<Vec<f64>> = (0..bounds.len() - 1).into_par_iter().map(group).collect();
    parts.concat()
}

/// The row-major form (CSR) of `cols` over `n` rows: row pointers, the index in `cols` of
/// each entry (entries of a row in column order) and the values (`None` when every column is
/// 0/1). Integer bookkeeping except the copied values: the same result for any blocking.
/// Row blocks run in parallel.
pub(crate) fn row_major(
    n: usize,
    cols: &[Option<SparseCol<'_>>],
) -> (Vec<u32>, Vec<u32>, Option<Vec<f64>>) {
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
    let total = ptr[n] as usize;
    let mut col_of = vec![0u32; total];
    let mut val = if ones { Vec::new() } else { vec![0.0f64; total] };
    // Each block fills its own entries ptr[r0]..ptr[r1].
    let mut col_parts: Vec<&mut [u32]> = Vec::with_capacity(nb);
    let mut val_parts: Vec<&mut [f64]> = Vec::with_capacity(nb);
    {
        let (mut rest_c, mut rest_v) = (col_of.as_mut_slice(), val.as_mut_slice());
        for b in 0..nb {
            let (e0, e1) = (
                ptr[b * ROW_BLOCK] as usize,
                ptr[((b + 1) * ROW_BLOCK).min(n)] as usize,
            );
            let (c, rc) = rest_c.split_at_mut(e1 - e0);
            col_parts.push(c);
            rest_c = rc;
            let split = if ones { 0 } else { e1 - e0 };
            let (v, rv) = rest_v.split_at_mut(split);
            val_parts.push(v);
            rest_v = rv;
        }
    }
    col_parts
        .into_par_iter()
        .zip(val_parts)
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
                    col_part[*at as usize] = a as u32;
                    if !ones {
                        val_part[*at as usize] = c.value(i);
                    }
                    *at += 1;
                }
            }
        });
    (ptr, col_of, (!ones).then_some(val))
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
                add_columns(&mut got, &with_coef);
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
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
                            expect.push((a as u32, c.value(i)));
                        }
                    }
                    let (lo, hi) = (ptr[r] as usize, ptr[r + 1] as usize);
                    let got: Vec<(u32, f64)> = (lo..hi)
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

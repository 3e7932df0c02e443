//! Seeded synthetic data for benchmarks (`epifusion bench`).
//!
//! | generator | recipe |
//! |---|---|
//! | [`cox_data`] | paper 001 §3.2: P indicator columns, each entry Bernoulli(density); β_j ~ N(0,1)·Bernoulli(0.2); T ~ Exponential(rate e^{xᵀβ}); C ~ U(0,1); time = min(T, C), y = [T ≤ C] |
//! | [`fine_gray_data`] | the same X and β₁, β₂ = −β₁; cause 1 with probability 1 − (1−p)^{e^{xᵀβ₁}} (p = 0.5) and time from the unit-exponential mixture CIF F₁(t) = 1 − [1 − p(1 − e^{−t})]^{e^{xᵀβ₁}}, else cause 2 with T ~ Exponential(e^{xᵀβ₂}); C ~ U(0,1); y ∈ {0, 1, 2} |
//! | [`sccs_data`] | the bench README's SCCS recipe: 4 common drugs (prevalence U(0.25, 0.5)), the rest Zipf-tailed (0.15/k), 1 + Poisson(2) eras per exposed case–drug pair, era lengths 7–180 days, observation 365–3650 days, β_j ~ N(0, 0.5²)·Bernoulli(0.1), 1 + Poisson(0.25) events per case spread over the intervals ∝ length·e^{xᵀβ}; one row per elementary interval (stratum = case, time = length, y = events) |
//!
//! Columns are built directly as sorted CSC indicator columns (no per-entry hashing), so
//! generating N = 10⁶, P = 1000 at 5% density (5·10⁷ nonzeros) needs little more memory than
//! the CSC storage itself. The generators use their own PRNG (splitmix64-seeded
//! xoshiro256**), so the data depend only on the seed.

use crate::error::{Error, Result};
use crate::model::design::{Column, ColumnFormat, DesignMatrix, Rows, Strata, Values};

pub use crate::model::rng::Rng;

/// A generated data set: the design matrix and the true coefficients.
#[derive(Debug, Clone)]
pub struct BenchData {
    /// Design matrix (rows + CSC indicator columns with ids 1..=P).
    pub design: DesignMatrix,
    /// True coefficients, one per column (for Fine–Gray: β₁ of the event of interest).
    pub beta: Vec<f64>,
}

fn check_sizes(n: usize, p: usize, density: f64) -> Result<()> {
    if n == 0 || n > u32::MAX as usize {
        return Err(Error::option(
            "n",
            format!("must be in 1..=2^32−1 (got {n})"),
        ));
    }
    if p == 0 {
        return Err(Error::option("p", "must be ≥ 1"));
    }
    if !(density > 0.0 && density < 1.0) {
        return Err(Error::option(
            "density",
            format!("must be in (0, 1) (got {density})"),
        ));
    }
    Ok(())
}

/// P indicator columns over `n` rows, each entry 1 with probability `density`, drawn by
/// geometric skipping (one draw per nonzero), so rows come out sorted.
fn indicator_columns(rng: &mut Rng, n: usize, p: usize, density: f64) -> Vec<Column> {
    let log_q = (1.0 - density).ln();
    let mean = n as f64 * density;
    let cap = (mean + 6.0 * (mean * (1.0 - density)).sqrt() + 16.0) as usize;
    (0..p)
        .map(|j| {
            let mut rows: Vec<u32> = Vec::with_capacity(cap.min(n));
            let mut i: u64 = 0;
            loop {
                // Number of zeros before the next one: Geometric(density) on {0, 1, …}.
                let skip = (rng.uniform().ln() / log_q).floor();
                if !skip.is_finite() || skip >= (n as u64 - i) as f64 {
                    break;
                }
                i += skip as u64;
                rows.push(i as u32);
                i += 1;
                if i >= n as u64 {
                    break;
                }
            }
            rows.shrink_to_fit();
            Column {
                id: j as i64 + 1,
                name: None,
                format: ColumnFormat::Indicator,
                rows,
                values: Vec::new(),
            }
        })
        .collect()
}

/// β_j ~ N(0, sd²)·Bernoulli(p_nonzero).
fn sparse_beta(rng: &mut Rng, p: usize, sd: f64, p_nonzero: f64) -> Vec<f64> {
    (0..p)
        .map(|_| {
            let z = rng.normal() * sd;
            if rng.bernoulli(p_nonzero) {
                z
            } else {
                0.0
            }
        })
        .collect()
}

/// η = Xβ for indicator columns.
fn linear_predictor(columns: &[Column], beta: &[f64], n: usize) -> Vec<f64> {
    let mut eta = vec![0.0; n];
    for (c, &b) in columns.iter().zip(beta) {
        if b != 0.0 {
            for &i in &c.rows {
                eta[i as usize] += b;
            }
        }
    }
    eta
}

fn unstratified_rows(time: Vec<f64>, y: Vec<f64>) -> Rows {
    let n = time.len();
    Rows {
        row_id: (1..=n as i64).collect(),
        stratum: Strata::single(n),
        stratum_ids: vec![0],
        has_strata: false,
        time: time.into(),
        start_time: None,
        y: y.into(),
        weight: None,
        offset: None,
        censor_weight: None,
        cluster: None,
    }
}

/// Cox data of paper 001 §3.2 (see the module docs). Row ids are 1..=n, covariate ids 1..=p.
pub fn cox_data(n: usize, p: usize, density: f64, seed: u64) -> Result<BenchData> {
    check_sizes(n, p, density)?;
    let mut rng = Rng::new(seed);
    let beta = sparse_beta(&mut rng, p, 1.0, 0.2);
    let columns = indicator_columns(&mut rng, n, p, density);
    let eta = linear_predictor(&columns, &beta, n);
    let mut time = Vec::with_capacity(n);
    let mut y = Vec::with_capacity(n);
    for &e in &eta {
        let t = rng.exponential(e.exp());
        let c = rng.uniform();
        // T can underflow to 0 for a huge rate; keep time > 0.
        let t = t.max(f64::MIN_POSITIVE);
        if t <= c {
            time.push(t);
            y.push(1.0);
        } else {
            time.push(c);
            y.push(0.0);
        }
    }
    Ok(BenchData {
        design: DesignMatrix {
            rows: unstratified_rows(time, y),
            columns,
            dropped_unknown: 0,
        },
        beta,
    })
}

/// Fine–Gray data of paper 001 §3.2 with mixture mass p = 0.5 (see the module docs).
pub fn fine_gray_data(n: usize, p: usize, density: f64, seed: u64) -> Result<BenchData> {
    const MIX_P: f64 = 0.5;
    check_sizes(n, p, density)?;
    let mut rng = Rng::new(seed);
    let beta1 = sparse_beta(&mut rng, p, 1.0, 0.2);
    let columns = indicator_columns(&mut rng, n, p, density);
    let eta1 = linear_predictor(&columns, &beta1, n);
    let log_1mp = (1.0 - MIX_P).ln();
    let mut time = Vec::with_capacity(n);
    let mut y = Vec::with_capacity(n);
    for &h in &eta1 {
        let e1 = h.exp();
        // P(cause 1 | x) = 1 − (1 − p)^{e1}.
        let pi1 = -(e1 * log_1mp).exp_m1();
        let (t, cause) = if rng.uniform() < pi1 {
            // Invert F₁(t) = u·π₁: 1 − e^{−t} = (1 − (1 − uπ₁)^{1/e1}) / p.
            let u = rng.uniform();
            let a = -((-u * pi1).ln_1p() / e1).exp_m1();
            (-(-(a / MIX_P).min(1.0 - 1e-16)).ln_1p(), 1.0)
        } else {
            // β₂ = −β₁: rate e^{−η₁}.
            (rng.exponential((-h).exp()), 2.0)
        };
        let t = t.max(f64::MIN_POSITIVE);
        let c = rng.uniform();
        if t <= c {
            time.push(t);
            y.push(cause);
        } else {
            time.push(c);
            y.push(0.0);
        }
    }
    Ok(BenchData {
        design: DesignMatrix {
            rows: unstratified_rows(time, y),
            columns,
            dropped_unknown: 0,
        },
        beta: beta1,
    })
}

/// SCCS data following the bench README's recipe (see the module docs). `drugs ≥ 5`;
/// covariate ids 1..=drugs, row ids 1..=K, stratum ids = case numbers 1..=cases.
pub fn sccs_data(cases: usize, drugs: usize, seed: u64) -> Result<BenchData> {
    const N_COMMON: usize = 4;
    if cases == 0 {
        return Err(Error::option("n", "must be ≥ 1"));
    }
    if drugs <= N_COMMON {
        return Err(Error::option("p", format!("must be > {N_COMMON} for sccs")));
    }
    let mut rng = Rng::new(seed);
    let beta = sparse_beta(&mut rng, drugs, 0.5, 0.1);
    let prevalence: Vec<f64> = (0..drugs)
        .map(|j| {
            if j < N_COMMON {
                rng.uniform_range(0.25, 0.5)
            } else {
                0.15 / (j - N_COMMON + 1) as f64
            }
        })
        .collect();
    let mut columns: Vec<Vec<u32>> = vec![Vec::new(); drugs];
    // Per-row data in its compact form from the start (time u16, y u8, one stratum run per
    // case): as f64 and u32 vectors it would take 20 B per row, several times the CSC size.
    let mut time = Values::new();
    let mut y = Values::new();
    let mut stratum = Strata::default();
    // Per-case scratch.
    let mut eras: Vec<(u32, u32, u32)> = Vec::new(); // (start, end inclusive, drug)
    let mut cuts: Vec<u32> = Vec::new();
    let mut interval_drugs: Vec<Vec<u32>> = Vec::new();
    let mut weights: Vec<f64> = Vec::new();
    let mut case_y: Vec<f64> = Vec::new();
    // Exposed (case, drug) pairs: per drug, the exposed cases by geometric skipping (one draw
    // per exposed case rather than one per case and drug), then grouped by case.
    let mut exposed: Vec<(u32, u32)> = Vec::new();
    for (j, &prev) in prevalence.iter().enumerate() {
        let log_q = (1.0 - prev).ln();
        let mut c: u64 = 0;
        loop {
            let skip = (rng.uniform().ln() / log_q).floor();
            if !skip.is_finite() || skip >= (cases as u64 - c) as f64 {
                break;
            }
            c += skip as u64;
            exposed.push((c as u32, j as u32));
            c += 1;
            if c >= cases as u64 {
                break;
            }
        }
    }
    exposed.sort_unstable();
    let mut next_pair = 0;
    for case in 0..cases {
        let obs = rng.int_range(365, 3650) as u32;
        eras.clear();
        while next_pair < exposed.len() && exposed[next_pair].0 == case as u32 {
            let j = exposed[next_pair].1 as usize;
            next_pair += 1;
            let n_eras = 1 + rng.poisson(2.0);
            for _ in 0..n_eras {
                let len = rng.int_range(7, 180) as u32;
                let start = rng.int_range(0, u64::from(obs) - 1) as u32;
                let end = (start + len - 1).min(obs - 1);
                eras.push((start, end, j as u32));
            }
        }
        cuts.clear();
        cuts.push(0);
        cuts.push(obs);
        for &(s, e, _) in &eras {
            cuts.push(s);
            cuts.push(e + 1);
        }
        cuts.sort_unstable();
        cuts.dedup();
        let n_int = cuts.len() - 1;
        interval_drugs.resize(n_int.max(interval_drugs.len()), Vec::new());
        for d in interval_drugs.iter_mut().take(n_int) {
            d.clear();
        }
        for &(s, e, j) in &eras {
            let a = cuts.partition_point(|&c| c < s);
            let b = cuts.partition_point(|&c| c < e + 1);
            for d in &mut interval_drugs[a..b] {
                d.push(j);
            }
        }
        weights.clear();
        let mut total = 0.0;
        for k in 0..n_int {
            let d = &mut interval_drugs[k];
            d.sort_unstable();
            d.dedup();
            let eta: f64 = d.iter().map(|&j| beta[j as usize]).sum();
            total += f64::from(cuts[k + 1] - cuts[k]) * eta.exp();
            weights.push(total);
        }
        case_y.clear();
        case_y.resize(n_int, 0.0);
        let events = 1 + rng.poisson(0.25);
        for _ in 0..events {
            let u = rng.uniform() * total;
            let k = weights.partition_point(|&w| w < u).min(n_int - 1);
            case_y[k] += 1.0;
        }
        let first_row = time.len();
        for k in 0..n_int {
            time.push(f64::from(cuts[k + 1] - cuts[k]));
            y.push(case_y[k]);
            stratum.push(case as u32);
            let row = (first_row + k) as u32;
            for &j in &interval_drugs[k] {
                columns[j as usize].push(row);
            }
        }
    }
    time.shrink_to_fit();
    y.shrink_to_fit();
    stratum.shrink_to_fit();
    let n = time.len();
    if n > u32::MAX as usize {
        return Err(Error::option("n", "too many intervals (> 2^32)"));
    }
    let rows = Rows {
        row_id: (1..=n as i64).collect(),
        stratum,
        stratum_ids: (1..=cases as i64).collect(),
        has_strata: true,
        time,
        start_time: None,
        y,
        weight: None,
        offset: None,
        censor_weight: None,
        cluster: None,
    };
    let columns = columns
        .into_iter()
        .enumerate()
        .map(|(j, mut rows)| {
            rows.shrink_to_fit();
            Column {
                id: j as i64 + 1,
                name: None,
                format: ColumnFormat::Indicator,
                rows,
                values: Vec::new(),
            }
        })
        .collect();
    Ok(BenchData {
        design: DesignMatrix {
            rows,
            columns,
            dropped_unknown: 0,
        },
        beta,
    })
}

/// Peak resident set size of this process in bytes (`VmHWM` of `/proc/self/status`), when
/// available.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// CPU seconds (user + system) used by this process so far (`/proc/self/stat`), when
/// available: with several threads, wall time alone hides how much work a fit did.
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after the `)` closing the name.
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    let ticks = |k: usize| fields.get(k)?.parse::<f64>().ok();
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_seeded_and_roughly_right() {
        let mut a = Rng::new(123);
        let mut b = Rng::new(123);
        assert_eq!(a.next_u64(), b.next_u64());
        let n = 200_000;
        let (mut s, mut s2, mut e) = (0.0, 0.0, 0.0);
        for _ in 0..n {
            let z = a.normal();
            s += z;
            s2 += z * z;
            e += a.exponential(2.0);
        }
        let n = n as f64;
        assert!((s / n).abs() < 0.01, "normal mean {}", s / n);
        assert!((s2 / n - 1.0).abs() < 0.02, "normal var {}", s2 / n);
        assert!((e / n - 0.5).abs() < 0.01, "exp mean {}", e / n);
        let m: f64 = (0..100_000).map(|_| a.poisson(2.0) as f64).sum::<f64>() / 1e5;
        assert!((m - 2.0).abs() < 0.03, "poisson mean {m}");
    }

    #[test]
    fn cox_data_shape_and_density() {
        let d = cox_data(20_000, 50, 0.05, 7).unwrap();
        let x = &d.design;
        assert_eq!(x.n_rows(), 20_000);
        assert_eq!(x.n_cols(), 50);
        let density = x.nnz() as f64 / (20_000.0 * 50.0);
        assert!((density - 0.05).abs() < 0.003, "{density}");
        for c in &x.columns {
            assert!(c.rows.windows(2).all(|w| w[0] < w[1]));
        }
        assert!(x.rows.time.iter().all(|t| t > 0.0 && t <= 1.0));
        assert!(x.rows.y.iter().all(|y| y == 0.0 || y == 1.0));
        let events: f64 = x.rows.y.iter().sum();
        assert!(events > 1000.0 && events < 19_000.0);
        // Same seed → same data.
        let d2 = cox_data(20_000, 50, 0.05, 7).unwrap();
        assert_eq!(d2.design.rows.time, x.rows.time);
        assert_eq!(d2.beta, d.beta);
    }

    #[test]
    fn fine_gray_has_both_causes() {
        let d = fine_gray_data(20_000, 50, 0.05, 3).unwrap();
        let y = &d.design.rows.y;
        for cause in [0.0, 1.0, 2.0] {
            let k = y.iter().filter(|&v| v == cause).count();
            assert!(k > 1000, "cause {cause}: {k}");
        }
        assert!(d.design.rows.time.iter().all(|t| t > 0.0 && t <= 1.0));
    }

    #[test]
    fn sccs_data_follows_recipe() {
        let d = sccs_data(2000, 100, 5).unwrap();
        let x = &d.design;
        assert_eq!(x.n_strata(), 2000);
        let events: f64 = x.rows.y.iter().sum();
        assert!((2000.0..3200.0).contains(&events), "{events}");
        let rows_per_case = x.n_rows() as f64 / 2000.0;
        assert!(
            rows_per_case > 5.0 && rows_per_case < 40.0,
            "{rows_per_case}"
        );
        // Observation 365–3650 days per case.
        let mut days = vec![0.0; 2000];
        for (i, s) in x.rows.stratum.iter().enumerate() {
            days[s as usize] += x.rows.time.get(i);
        }
        assert!(days.iter().all(|&d| (365.0..=3650.0).contains(&d)));
        // Common drugs are common.
        for c in &x.columns[..4] {
            assert!(c.rows.len() > 500, "{}", c.rows.len());
            assert!(c.rows.windows(2).all(|w| w[0] < w[1]));
        }
    }
}

//! SCCS benchmark with a seeded generator (DESIGN.md §10 style): N cases with ~16.9 intervals
//! each, J drugs with skewed (Zipf-like) prevalence, Laplace λ, tolerance 1e-6.
//!
//! `cargo run --release --example sccs_bench -- [cases=1000000] [drugs=1000] [lambda=10]
//! [max exposures per case=4]`;
//! set `RAYON_NUM_THREADS=1` for single-thread CPU seconds.

use std::time::Instant;

use epifusion::model::ccd::{self, CcdOptions};
use epifusion::model::design::{Column, ColumnFormat, DesignMatrix, Rows};
use epifusion::model::prior::{Prior, PriorSet};
use epifusion::model::sccs::ConditionalPoisson;
use epifusion::model::Likelihood;

struct Rng(u64);
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unif(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Seeded synthetic SCCS data: every case has 9–25 intervals (mean 17); exposures are runs of
/// consecutive intervals (1–3) of
/// 1..=`max_exposures` drugs per case drawn with Zipf(1) prevalence; 20% of drugs have an effect.
fn generate(n_cases: usize, n_drugs: usize, max_exposures: u64, seed: u64) -> DesignMatrix {
    let mut rng = Rng(seed);
    // Zipf(1) cumulative weights for drug draws.
    let cum: Vec<f64> = (0..n_drugs)
        .scan(0.0, |s, j| {
            *s += 1.0 / (j as f64 + 1.0);
            Some(*s)
        })
        .collect();
    let total = *cum.last().unwrap();
    let effect: Vec<f64> = (0..n_drugs)
        .map(|_| {
            if rng.unif() < 0.2 {
                (rng.unif() - 0.3) * 1.5
            } else {
                0.0
            }
        })
        .collect();
    let mut rows = Rows {
        has_strata: true,
        ..Default::default()
    };
    let mut entries: Vec<Vec<u32>> = vec![Vec::new(); n_drugs];
    let mut row = 0u32;
    let mut case_rows: Vec<(f64, Vec<usize>)> = Vec::new();
    for case in 0..n_cases {
        let k = 9 + rng.below(17) as usize;
        case_rows.clear();
        for _ in 0..k {
            case_rows.push((1.0 + rng.below(60) as f64, Vec::new()));
        }
        let n_exposures = 1 + rng.below(max_exposures) as usize;
        for _ in 0..n_exposures {
            let u = rng.unif() * total;
            let drug = cum.partition_point(|&c| c < u).min(n_drugs - 1);
            let start = rng.below(k as u64) as usize;
            let len = 1 + rng.below(3) as usize;
            for (_, drugs) in case_rows.iter_mut().take(start + len).skip(start) {
                if !drugs.contains(&drug) {
                    drugs.push(drug);
                }
            }
        }
        // One or two events placed with probability ∝ t·exp(xᵀβ).
        let weights: Vec<f64> = case_rows
            .iter()
            .map(|(t, d)| t * d.iter().map(|&j| effect[j]).sum::<f64>().exp())
            .collect();
        let wsum: f64 = weights.iter().sum();
        let mut y = vec![0.0; k];
        for _ in 0..1 + usize::from(rng.unif() < 0.2) {
            let mut u = rng.unif() * wsum;
            let mut r = 0;
            while r + 1 < k && u >= weights[r] {
                u -= weights[r];
                r += 1;
            }
            y[r] += 1.0;
        }
        rows.stratum_ids.push(case as i64);
        for (r, (t, drugs)) in case_rows.iter().enumerate() {
            rows.row_id.push(row as i64);
            rows.stratum.push(case as u32);
            rows.time.push(*t);
            rows.y.push(y[r]);
            for &d in drugs {
                entries[d].push(row);
            }
            row += 1;
        }
    }
    let columns = entries
        .into_iter()
        .enumerate()
        .map(|(j, rows)| Column {
            id: 1000 + j as i64,
            name: None,
            format: ColumnFormat::Indicator,
            rows,
            values: Vec::new(),
        })
        .collect();
    DesignMatrix {
        rows,
        columns,
        dropped_unknown: 0,
    }
}

/// CPU seconds used by this process so far (user + system, from /proc; 0 elsewhere).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |k: usize| {
        fields
            .get(k)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Fields 14 and 15 of /proc/<pid>/stat (utime, stime) are at 11 and 12 after the ')'.
    (ticks(11) + ticks(12)) / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n_cases: usize = args.get(1).map_or(1_000_000, |s| s.parse().unwrap());
    let n_drugs: usize = args.get(2).map_or(1000, |s| s.parse().unwrap());
    let lambda: f64 = args.get(3).map_or(10.0, |s| s.parse().unwrap());
    let max_exposures: u64 = args.get(4).map_or(4, |s| s.parse().unwrap());
    let t0 = Instant::now();
    let x = generate(n_cases, n_drugs, max_exposures, 42);
    println!(
        "generated: {} cases, {} rows, {} drugs, nnz {} ({:.1} s)",
        n_cases,
        x.n_rows(),
        x.n_cols(),
        x.nnz(),
        t0.elapsed().as_secs_f64()
    );
    let t1 = Instant::now();
    let c1 = cpu_seconds();
    let mut lik = ConditionalPoisson::new(&x).unwrap();
    let setup = t1.elapsed().as_secs_f64();
    let c2 = cpu_seconds();
    let p = lik.n_coef();
    let priors = PriorSet::new(Prior::Laplace { lambda }, &vec![false; p]);
    let r = ccd::fit(
        &mut lik,
        &priors,
        &vec![0.0; p],
        None,
        &CcdOptions::default(),
    )
    .unwrap();
    let c3 = cpu_seconds();
    let nonzero = r.beta.iter().filter(|&&b| b != 0.0).count();
    println!(
        "setup {setup:.2} s ({:.2} CPU-s); fit {:.2} s ({:.2} CPU-s; {} cycles, {}, {nonzero} nonzero, \
         LL {:.6}, objective {:.6})",
        c2 - c1,
        r.seconds,
        c3 - c2,
        r.iterations,
        r.status.name(),
        r.log_likelihood,
        r.log_likelihood + r.log_prior
    );
}

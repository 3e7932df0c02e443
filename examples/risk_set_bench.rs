//! Timing harness for the Cox / Fine–Gray coordinate-descent engine (not a test; no assertions).
//!
//! ```text
//! cargo run --release --example risk_set_bench -- <cox|fg> <N | parquet-dir> [threads] [breslow|efron]
//! ```
//!
//! With a number, generates paper 001's synthetic data (seeded): N rows, P = 1000 indicator
//! columns at 5% density, β_j ~ N(0,1)·Bernoulli(0.2), T ~ Exp(exp(xᵀβ)), censoring U(0,1);
//! Fine–Gray: cause 1 with probability 0.5, else cause 2. With a directory, reads
//! `outcomes_cox.parquet` / `outcomes_fgr.parquet` and `covariates.parquet` (rowId, time, y,
//! covariateId) of `../shared/data/bench/yang_N1e5/`. Fits Laplace λ = 100, tolerance 1e-6.

use std::collections::HashMap;
use std::time::Instant;

use arrow::array::{Array, Float64Array};
use arrow::datatypes::DataType;
use epifusion::model::ccd::{fit, CcdOptions};
use epifusion::model::cox::Cox;
use epifusion::model::design::{Column, ColumnFormat, DesignMatrix, Rows};
use epifusion::model::fine_gray::FineGray;
use epifusion::model::prior::{Prior, PriorSet};
use epifusion::model::{Likelihood, Ties};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unif(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unif(), self.unif());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

fn rows(time: Vec<f64>, y: Vec<f64>, row_id: Vec<i64>) -> Rows {
    let n = time.len();
    Rows {
        row_id,
        stratum: vec![0; n],
        stratum_ids: vec![0],
        has_strata: false,
        time,
        y,
        ..Default::default()
    }
}

fn generate(n: usize, fg: bool) -> DesignMatrix {
    let p = 1000;
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let beta: Vec<f64> = (0..p)
        .map(|_| if rng.unif() < 0.2 { rng.normal() } else { 0.0 })
        .collect();
    let mut eta = vec![0.0; n];
    let mut columns = Vec::with_capacity(p);
    let log_q = (1.0f64 - 0.05).ln();
    for (j, &b) in beta.iter().enumerate() {
        let mut rows_j = Vec::with_capacity(n / 19);
        let mut i = (rng.unif().ln() / log_q) as usize;
        while i < n {
            rows_j.push(i as u32);
            eta[i] += b;
            i += 1 + (rng.unif().ln() / log_q) as usize;
        }
        columns.push(Column {
            id: j as i64,
            name: None,
            format: ColumnFormat::Indicator,
            rows: rows_j,
            values: Vec::new(),
        });
    }
    let mut time = Vec::with_capacity(n);
    let mut y = Vec::with_capacity(n);
    for &e in &eta {
        let t = -rng.unif().ln() / e.exp();
        let c = rng.unif();
        let cause = if fg && rng.unif() >= 0.5 { 2.0 } else { 1.0 };
        if t < c {
            time.push(t);
            y.push(cause);
        } else {
            time.push(c);
            y.push(0.0);
        }
    }
    DesignMatrix {
        rows: rows(time, y, (0..n as i64).collect()),
        columns,
        dropped_unknown: 0,
    }
}

fn read_columns(path: &str, names: &[&str]) -> Vec<Vec<f64>> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut out = vec![Vec::new(); names.len()];
    for batch in reader {
        let batch = batch.unwrap();
        for (k, name) in names.iter().enumerate() {
            let col = batch
                .column_by_name(name)
                .unwrap_or_else(|| panic!("{path}: no column {name}"));
            let col = arrow::compute::cast(col, &DataType::Float64).unwrap();
            let col = col.as_any().downcast_ref::<Float64Array>().unwrap();
            out[k].extend((0..col.len()).map(|i| col.value(i)));
        }
    }
    out
}

fn load(dir: &str, fg: bool) -> DesignMatrix {
    let outcomes = format!("{dir}/outcomes_{}.parquet", if fg { "fgr" } else { "cox" });
    let o = read_columns(&outcomes, &["rowId", "time", "y"]);
    let index: HashMap<i64, u32> = o[0]
        .iter()
        .enumerate()
        .map(|(i, &r)| (r as i64, i as u32))
        .collect();
    let c = read_columns(
        &format!("{dir}/covariates.parquet"),
        &["rowId", "covariateId"],
    );
    let mut by_cov: HashMap<i64, Vec<u32>> = HashMap::new();
    for (&r, &cov) in c[0].iter().zip(&c[1]) {
        by_cov
            .entry(cov as i64)
            .or_default()
            .push(index[&(r as i64)]);
    }
    let mut ids: Vec<i64> = by_cov.keys().copied().collect();
    ids.sort_unstable();
    let columns = ids
        .into_iter()
        .map(|id| {
            let mut rows = by_cov.remove(&id).unwrap();
            rows.sort_unstable();
            Column {
                id,
                name: None,
                format: ColumnFormat::Indicator,
                rows,
                values: Vec::new(),
            }
        })
        .collect();
    let row_id = o[0].iter().map(|&r| r as i64).collect();
    DesignMatrix {
        rows: rows(o[1].clone(), o[2].clone(), row_id),
        columns,
        dropped_unknown: 0,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let fg = args.get(1).map(String::as_str) == Some("fg");
    let source = args.get(2).cloned().unwrap_or_else(|| "100000".into());
    let threads: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    let ties = if args.get(4).map(String::as_str) == Some("efron") {
        Ties::Efron
    } else {
        Ties::Breslow
    };
    let tolerance: f64 = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(1e-6);
    let t0 = Instant::now();
    let x = match source.parse::<usize>() {
        Ok(n) => generate(n, fg),
        Err(_) => load(&source, fg),
    };
    let events = x.rows.y.iter().filter(|&&y| y == 1.0).count();
    println!(
        "data: N = {}, P = {}, nnz = {}, events = {events}, prepared in {:.2} s",
        x.n_rows(),
        x.n_cols(),
        x.nnz(),
        t0.elapsed().as_secs_f64()
    );
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let t1 = Instant::now();
        let mut lik: Box<dyn Likelihood> =
            if fg { Box::new(FineGray::new(&x, ties).unwrap()) } else { Box::new(Cox::new(&x, ties).unwrap()) };
        println!("setup: {:.2} s", t1.elapsed().as_secs_f64());
        let p = lik.n_coef();
        let priors = PriorSet::new(Prior::Laplace { lambda: 100.0 }, &vec![false; p]);
        let cpu0 = cpu_seconds();
        let r = fit(lik.as_mut(), &priors, &vec![0.0; p], None, &CcdOptions { tolerance, ..Default::default() }).unwrap();
        let nonzero = r.beta.iter().filter(|&&b| b != 0.0).count();
        println!(
            "{} {ties:?} threads = {threads}: {:.2} s wall, {:.2} s CPU (process), {} cycles ({:?}), LL = {:.6}, objective = {:.6}, nonzero = {nonzero}",
            if fg { "fine_gray" } else { "cox" },
            r.seconds,
            cpu_seconds() - cpu0,
            r.iterations,
            r.status,
            r.log_likelihood,
            r.log_likelihood + r.log_prior
        );
    });
}

/// User + system CPU seconds of this process (Linux `/proc/self/stat`), 0 elsewhere.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

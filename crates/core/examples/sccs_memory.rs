//! Peak memory of an SCCS fit against the CSC size, on the path `epifusion bench --data` and
//! `sccs_fit` take: the long format streamed into a [`DesignBuilder`], the design built, then
//! the conditional Poisson likelihood built from the owned design and fitted (Laplace λ = 3,
//! objective rule, tolerance 1e-6, one thread, no intervals: `epifusion bench`'s settings).
//!
//! `cargo run -p epifusion-core --release --example sccs_memory -- PREFIX`
//!
//! reads `PREFIX.out.bin` (little-endian records row id i64, stratum id i64, time f64, y f64)
//! and `PREFIX.cov.bin` (row id i64, covariate id i64), the bench folder's Parquet files
//! dumped as raw records (the core crate reads no Parquet). With `--generate CASES` instead of
//! `PREFIX`, the design comes from `bench::sccs_data` (J = 1000, seed 123). Prints the sizes,
//! the fit, a fingerprint of β and the peak RSS over the CSC bytes: the process's peak (data and
//! fit), and the fit's own (the peak is reset after the data are built, where Linux allows it).

use std::fs::File;
use std::io::{BufReader, Read};

use epifusion_core::bench::{cpu_seconds, peak_rss_bytes, sccs_data};
use epifusion_core::fit::{fit_owned, CiMethod, FitOptions};
use epifusion_core::model::ccd::Convergence;
use epifusion_core::model::design::{DesignBuilder, DesignMatrix, OutcomeRecord};
use epifusion_core::model::prior::Prior;
use epifusion_core::model::ModelKind;

/// Call `f` on every record of `N` little-endian 8-byte words in `path`.
fn for_records<const N: usize>(path: &str, mut f: impl FnMut([u64; N])) {
    let mut r = BufReader::with_capacity(1 << 20, File::open(path).expect(path));
    let mut buf = vec![0u8; 8 * N];
    while r.read_exact(&mut buf).is_ok() {
        let mut rec = [0u64; N];
        for (k, w) in rec.iter_mut().enumerate() {
            *w = u64::from_le_bytes(buf[8 * k..8 * k + 8].try_into().expect("8 bytes"));
        }
        f(rec);
    }
}

fn load(prefix: &str) -> DesignMatrix {
    let mut b = DesignBuilder::new();
    for_records::<4>(&format!("{prefix}.out.bin"), |[row, stratum, time, y]| {
        b.push_outcome(OutcomeRecord {
            row_id: row as i64,
            stratum_id: Some(stratum as i64),
            time: Some(f64::from_bits(time)),
            y: f64::from_bits(y),
            ..Default::default()
        });
    });
    for_records::<2>(&format!("{prefix}.cov.bin"), |[row, cov]| {
        b.push_covariate(row as i64, cov as i64, 1.0);
    });
    b.build().expect("design")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cpu0 = cpu_seconds().unwrap_or(0.0);
    let design = match args.get(1).map(String::as_str) {
        Some("--generate") => {
            let n = args.get(2).map_or(1_000_000, |s| s.parse().expect("cases"));
            sccs_data(n, 1000, 123).expect("data").design
        }
        Some(prefix) => load(prefix),
        None => panic!("usage: sccs_memory PREFIX | --generate CASES"),
    };
    let cpu_data = cpu_seconds().unwrap_or(0.0) - cpu0;
    let csc = design.csc_bytes();
    println!(
        "rows {} strata {} columns {} nnz {} csc_bytes {csc} data_cpu_s {cpu_data:.2} rss_after_data {:?}",
        design.n_rows(),
        design.n_strata(),
        design.n_cols(),
        design.nnz(),
        peak_rss_bytes()
    );
    let data_peak = peak_rss_bytes().unwrap_or(0);
    // Reset the peak (`VmHWM`) to the current RSS, so that the fit's own peak shows.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let lambda = 3.0;
    let mut opts = FitOptions::new(ModelKind::ConditionalPoisson);
    opts.prior = Prior::Laplace { lambda };
    opts.ccd.tolerance = 1e-6;
    opts.ccd.convergence = Convergence::Objective;
    opts.ci = CiMethod::None;
    opts.threads = Some(1);
    let cpu1 = cpu_seconds().unwrap_or(0.0);
    let r = fit_owned(design, &opts).expect("fit");
    let cpu_fit = cpu_seconds().unwrap_or(0.0) - cpu1;
    let l1: f64 = r.coefficients.iter().map(|c| c.estimate.abs()).sum();
    let fingerprint = r
        .coefficients
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
            (h ^ c.estimate.to_bits()).wrapping_mul(0x0100_0000_01b3)
        });
    println!(
        "setup+fit cpu_s {cpu_fit:.2} (fit {:.3} s wall) cycles {} nonzero {} ll {:.6} objective {:.6} beta_fnv {fingerprint:016x}",
        r.fit_seconds,
        r.iterations,
        r.coefficients.iter().filter(|c| c.estimate != 0.0).count(),
        r.log_likelihood,
        r.log_likelihood - lambda * l1,
    );
    let fit_peak = peak_rss_bytes().unwrap_or(0);
    let rss = data_peak.max(fit_peak);
    let mib = |b: u64| b as f64 / 1048576.0;
    println!(
        "peak_rss {rss} ({:.1} MiB: data {:.1} MiB, {} {:.1} MiB) csc {:.1} MiB ratio {:.2}",
        mib(rss),
        mib(data_peak),
        if reset { "fit" } else { "fit (peak not reset)" },
        mib(fit_peak),
        csc as f64 / 1048576.0,
        rss as f64 / csc.max(1) as f64
    );
}

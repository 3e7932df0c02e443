//! Peak memory of an SCCS fit against the CSC size, on the path `epifusion bench --data` and
//! `sccs_fit` take: the long format streamed into a [`DesignBuilder`], the design built, then
//! the conditional Poisson likelihood built from the owned design and fitted (Laplace λ = 3,
//! the default optimality rule — `RULE=objective` for the objective rule —, tolerance 1e-6,
//! one thread, no intervals: `epifusion bench`'s settings).
//!
//! `cargo run -p epifusion-core --release --example sccs_memory -- PREFIX`
//!
//! reads `PREFIX.out.bin` (little-endian records row id i64, stratum id i64, time f64, y f64)
//! and `PREFIX.cov.bin` (row id i64, covariate id i64), the bench folder's Parquet files
//! dumped as raw records (the core crate reads no Parquet). With `--generate CASES` instead of
//! `PREFIX`, the design comes from `bench::sccs_data` (J = 1000, seed 123). With
//! `--dump PREFIX [CASES]`, writes that generated design as `PREFIX.out.bin` / `PREFIX.cov.bin`
//! in the bench files' order (outcomes by row id, entries by row id then covariate id) and
//! exits: the files then give the long-format path the same model. Prints the sizes,
//! the fit, a fingerprint of β and the peak RSS over the CSC bytes: the process's peak (data and
//! fit), and the fit's own (the peak is reset after the data are built, where Linux allows it).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};

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

/// Write `design` as `PREFIX.out.bin` / `PREFIX.cov.bin` (the records [`load`] reads).
fn dump(design: &DesignMatrix, prefix: &str) -> std::io::Result<()> {
    let rows = &design.rows;
    let n = design.n_rows();
    let mut out = BufWriter::with_capacity(1 << 20, File::create(format!("{prefix}.out.bin"))?);
    for i in 0..n {
        let stratum = rows.stratum_ids[rows.stratum.get(i) as usize];
        for w in [
            rows.row_id.get(i) as u64,
            stratum as u64,
            rows.time.get(i).to_bits(),
            rows.y.get(i).to_bits(),
        ] {
            out.write_all(&w.to_le_bytes())?;
        }
    }
    out.flush()?;
    // Entries by row (CSR), covariate ids increasing within a row as the columns are.
    let mut start = vec![0usize; n + 1];
    for c in &design.columns {
        for (i, _) in c.entries() {
            start[i + 1] += 1;
        }
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut ids = vec![0i64; start[n]];
    for c in &design.columns {
        for (i, v) in c.entries() {
            assert_eq!(v, 1.0, "the dump writes indicator entries only");
            ids[fill[i]] = c.id;
            fill[i] += 1;
        }
    }
    let mut cov = BufWriter::with_capacity(1 << 20, File::create(format!("{prefix}.cov.bin"))?);
    for i in 0..n {
        for &id in &ids[start[i]..start[i + 1]] {
            cov.write_all(&(rows.row_id.get(i) as u64).to_le_bytes())?;
            cov.write_all(&(id as u64).to_le_bytes())?;
        }
    }
    cov.flush()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--dump") {
        let prefix = args
            .get(2)
            .expect("usage: sccs_memory --dump PREFIX [CASES]");
        let n = args.get(3).map_or(1_000_000, |s| s.parse().expect("cases"));
        let design = sccs_data(n, 1000, 123).expect("data").design;
        dump(&design, prefix).expect("dump");
        println!(
            "wrote {prefix}.out.bin ({} rows), {prefix}.cov.bin ({} entries)",
            design.n_rows(),
            design.nnz()
        );
        return;
    }
    let cpu0 = cpu_seconds().unwrap_or(0.0);
    let design = match args.get(1).map(String::as_str) {
        Some("--generate") => {
            let n = args.get(2).map_or(1_000_000, |s| s.parse().expect("cases"));
            sccs_data(n, 1000, 123).expect("data").design
        }
        Some(prefix) => load(prefix),
        None => panic!("usage: sccs_memory PREFIX | --generate CASES | --dump PREFIX [CASES]"),
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
    if std::env::var("RULE").as_deref() == Ok("objective") {
        opts.ccd.convergence = Convergence::Objective;
    }
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

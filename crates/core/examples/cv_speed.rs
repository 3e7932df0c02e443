//! Auto cross-validation time (issue #13 item 6) on the DESIGN.md §10 recipe: Cox (or
//! Fine–Gray), N rows, P = 1000 indicator columns at 5 % density, Laplace prior, 10-fold auto
//! CV at the default options; CPU and wall seconds of the whole fit (CV + the final fit), the
//! chosen variance, the candidates tried and the fits run, and a fingerprint of the
//! coefficients' bits (equal for every thread count).
//!
//! `cargo run -p epifusion-core --release --example cv_speed -- [cox|fine_gray] [N] [threads]
//! [variance]`: with a variance, one fit at that prior variance and no CV (the "one fit" the
//! CV's time and peak memory are compared with; run both under `/usr/bin/time -v`).

use std::time::Instant;

use epifusion_core::bench::{cox_data, cpu_seconds, fine_gray_data};
use epifusion_core::fit::{fit_owned, FitOptions};
use epifusion_core::model::cv::CvOptions;
use epifusion_core::model::prior::Prior;
use epifusion_core::model::ModelKind;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = match args.get(1).map_or("cox", String::as_str) {
        "fine_gray" | "fg" => ModelKind::FineGray,
        _ => ModelKind::Cox,
    };
    let n: usize = args.get(2).map_or(100_000, |s| s.parse().expect("N"));
    let threads: usize = args.get(3).map_or(1, |s| s.parse().expect("threads"));
    let data = match model {
        ModelKind::Cox => cox_data(n, 1000, 0.05, 123),
        _ => fine_gray_data(n, 1000, 0.05, 123),
    }
    .expect("data");
    let mut opts = FitOptions::new(model);
    opts.prior = Prior::Laplace { lambda: 1.0 };
    opts.threads = Some(threads);
    let fixed: Option<f64> = args.get(4).map(|s| s.parse().expect("variance"));
    match fixed {
        Some(v) => opts.prior = opts.prior.with_variance(v),
        None => {
            opts.cv = Some(CvOptions {
                folds: 10,
                ..Default::default()
            })
        }
    }
    let (cpu0, t0) = (cpu_seconds().unwrap_or(0.0), Instant::now());
    // Consuming the design, as the SQL functions do.
    let r = fit_owned(data.design, &opts).expect("fit");
    let (cpu, wall) = (
        cpu_seconds().unwrap_or(0.0) - cpu0,
        t0.elapsed().as_secs_f64(),
    );
    let fingerprint = r
        .coefficients
        .iter()
        .fold(0u64, |h, c| h.rotate_left(5) ^ c.estimate.to_bits());
    let Some(cv) = r.cv.as_ref() else {
        println!(
            "{} N={n} threads={threads}: one fit at variance {:.4e}: cpu {cpu:.2} s, wall \
             {wall:.2} s, status {}, fingerprint {fingerprint:016x}",
            model.name(),
            fixed.unwrap_or(f64::NAN),
            r.status.name(),
        );
        return;
    };
    println!(
        "{} N={n} threads={threads}: cpu {cpu:.2} s, wall {wall:.2} s, variance {:.4e}, \
         candidates {}, fits {}, stop {}, status {}, fingerprint {fingerprint:016x}",
        model.name(),
        cv.variance,
        cv.curve.len(),
        cv.fits,
        cv.stop_reason,
        r.status.name(),
    );
}

//! Propensity-score fit time (issue #14 item 7) at createPs' defaults on a seeded confounded
//! cohort shaped like `epifusion bench-omop --design cm`'s: N subjects, a 12,000-concept sparse
//! baseline vocabulary with Zipf-like frequencies (≈ 10 records per subject, duplicates within a
//! subject merged, as FeatureExtraction's binary covariates), ten special covariates with
//! treatment effects and an unmeasured confounder. The fit is [`fit_propensity`]'s: logistic
//! regression, Laplace prior chosen by auto CV (10 folds × `repetitions`), tolerance 2e-7.
//! Prints CPU and wall seconds, the CV's candidates and fits, the chosen variance, the non-zero
//! count and a fingerprint of the coefficients' bits (equal for every thread count).
//!
//! `cargo run -p epifusion-core --release --example ps_speed -- [N] [repetitions] [threads]`

use std::time::Instant;

use epifusion_core::bench::{cpu_seconds, Rng};
use epifusion_core::cohort::ps::PsSettings;
use epifusion_core::fit::fit;
use epifusion_core::model::design::{DesignBuilder, OutcomeRecord};

/// Vocabulary size (special covariates included).
const VOCABULARY: usize = 12_000;
/// (prevalence, log-odds of treatment) of the special covariates (ids 1..=10).
const SPECIAL: [(f64, f64); 10] = [
    (0.30, 1.0),
    (0.25, 0.9),
    (0.20, 0.8),
    (0.25, 0.9),
    (0.20, -0.7),
    (0.15, 0.8),
    (0.20, 0.8),
    (0.20, 0.6),
    (0.25, 0.0),
    (0.15, 0.0),
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).map_or(100_000, |s| s.parse().expect("N"));
    let repetitions: usize = args.get(2).map_or(1, |s| s.parse().expect("repetitions"));
    let threads: usize = args.get(3).map_or(1, |s| s.parse().expect("threads"));

    let sparse = VOCABULARY - SPECIAL.len();
    let mut cdf = Vec::with_capacity(sparse);
    let mut total = 0.0;
    for k in 0..sparse {
        total += 1.0 / (k as f64 + 5.0);
        cdf.push(total);
    }
    let mut rng = Rng::new(1);
    let mut b = DesignBuilder::new();
    let mut ids: Vec<i64> = Vec::new();
    let mut n_target = 0usize;
    for i in 0..n {
        ids.clear();
        let mut eta = -1.5;
        for (j, &(prevalence, effect)) in SPECIAL.iter().enumerate() {
            if rng.bernoulli(prevalence) {
                ids.push(j as i64 + 1);
                eta += effect;
            }
        }
        for _ in 0..rng.poisson(10.0) {
            let u = rng.uniform() * total;
            let k = cdf.partition_point(|&c| c < u).min(sparse - 1);
            ids.push((SPECIAL.len() + 1 + k) as i64);
        }
        if rng.bernoulli(0.3) {
            eta += 1.0;
        }
        let t = rng.bernoulli(1.0 / (1.0 + (-eta).exp()));
        n_target += usize::from(t);
        b.push_outcome(OutcomeRecord {
            row_id: i as i64,
            y: if t { 1.0 } else { 0.0 },
            ..Default::default()
        });
        ids.sort_unstable();
        ids.dedup();
        for &id in &ids {
            b.push_covariate(i as i64, id, 1.0);
        }
    }
    let design = b.build().expect("design");
    println!(
        "{n} subjects ({n_target} target), {} covariates, {} entries",
        design.n_cols(),
        design.nnz()
    );

    let settings = PsSettings {
        cv_repetitions: repetitions,
        threads: Some(threads),
        ..PsSettings::default()
    };
    let (cpu0, t0) = (cpu_seconds().unwrap_or(0.0), Instant::now());
    let r = fit(&design, &settings.fit_options()).expect("fit");
    let (cpu, wall) = (
        cpu_seconds().unwrap_or(0.0) - cpu0,
        t0.elapsed().as_secs_f64(),
    );
    let cv = r.cv.as_ref().expect("cv");
    let nonzero = r.coefficients.iter().filter(|c| c.estimate != 0.0).count();
    let mut fingerprint = 0xcbf2_9ce4_8422_2325u64;
    for c in &r.coefficients {
        fingerprint = (fingerprint ^ c.estimate.to_bits()).wrapping_mul(0x100_0000_01b3);
    }
    println!(
        "cpu {cpu:.2} s wall {wall:.2} s  cv {:.2} s  {} candidates {} fits  variance {:.6e}  \
         final {} it {}  nonzero {nonzero}  loglik {:.6}  fingerprint {fingerprint:016x}",
        cv.seconds,
        cv.curve.len(),
        cv.fits,
        cv.variance,
        r.iterations,
        r.status.name(),
        r.log_likelihood,
    );
}

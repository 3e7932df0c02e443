//! SCCS golden numerics: the R package SCCS 1.7 datasets `amdat` (published: Whitaker et al.
//! 2006, Stat Med 25:1768, section 3; Stata `xtpoisson, fe` output) and `itpdat` (SCCS 1.7
//! `standardsccs` output). Numbers and their provenance: `../shared/data/reference/SOURCES.md`
//! §4.1; the data files are copied into `tests/data/`.
//!
//! Intervals are built here with the R package's convention: integer days, both ends
//! inclusive, length = end − start + 1, an event on day a lies in the interval containing a.
//! Each case's observation [sta, end] is cut at the risk-window and age-group boundaries; one
//! fitting row per (case, covariate pattern) with time = days and y = events.
//!
//! **Log-likelihood convention.** Our LL is the conditional LL without constants,
//! Σ_k y_k η_k − Σ_s n_s log Σ_{k∈s} t_k e^{η_k}. SCCS 1.7 fits `clogit(event ~ … +
//! strata(indivL) + offset(log(interval)))` on *unmerged* elementary intervals with one stratum
//! per event (`formatdata` duplicates the case for each event), so its loglik includes the
//! offset of the interval holding each event: loglik_R = LL + Σ_events log t_elem(event), where
//! t_elem is the length of the elementary interval (between consecutive cut points) containing
//! the event. Stata's `xtpoisson, fe` value for amdat (one event per case, so the multinomial
//! term Σ_s log(n_s!/Π y!) vanishes) is the same number. This reproduces all four published /
//! recomputed log-likelihoods below and explains why itpdat's loglik changes with the interval
//! structure (−30.09 → −73.04 → −84.41) although the data do not.

use std::collections::BTreeMap;

use epifusion::model::ccd::{self, CcdOptions, FitStatus};
use epifusion::model::design::{DesignBuilder, DesignMatrix, OutcomeRecord};
use epifusion::model::inference::{profile_interval, standard_errors};
use epifusion::model::prior::{Prior, PriorSet};
use epifusion::model::sccs::ConditionalPoisson;
use epifusion::model::Likelihood;

/// One case: observation [sta, end], MMR age, event ages.
struct Case {
    id: i64,
    sta: i64,
    end: i64,
    mmr: i64,
    events: Vec<i64>,
}

/// Rows of a reference CSV in `tests/data/` as name → integer maps.
pub(crate) fn read_csv(name: &str) -> Vec<BTreeMap<String, i64>> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap()
        .split(',')
        .map(str::to_owned)
        .collect();
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split(',').map(|v| v.trim().parse::<i64>().unwrap()))
                .collect()
        })
        .collect()
}

/// Cases from a file with one row per event (`event_col` = age at event).
fn cases(name: &str, event_col: &str) -> Vec<Case> {
    let mut out: Vec<Case> = Vec::new();
    for r in read_csv(name) {
        let id = r["case"];
        match out.last_mut() {
            Some(c) if c.id == id => {
                assert_eq!((c.sta, c.end, c.mmr), (r["sta"], r["end"], r["mmr"]));
                c.events.push(r[event_col]);
            }
            _ => out.push(Case {
                id,
                sta: r["sta"],
                end: r["end"],
                mmr: r["mmr"],
                events: vec![r[event_col]],
            }),
        }
    }
    out
}

/// Built SCCS data: the design matrix, the number of elementary intervals, and
/// Σ_events log t_elem (the constant that the R package's loglik includes).
struct Sccs {
    x: DesignMatrix,
    elementary_intervals: usize,
    log_t_events: f64,
}

/// Risk windows relative to MMR (`(covariate id, from, to)`, days inclusive) and age-group
/// start days after the first (reference) group (ids 101, 102, …).
fn build(cases: &[Case], risk: &[(i64, i64, i64)], age_starts: &[i64]) -> Sccs {
    let mut b = DesignBuilder::new();
    let mut elementary_intervals = 0;
    let mut log_t_events = 0.0;
    for c in cases {
        // Windows (covariate, first day, last day), clipped to the observation period.
        let mut windows: Vec<(i64, i64, i64)> = Vec::new();
        for &(id, from, to) in risk {
            let (s, e) = ((c.mmr + from).max(c.sta), (c.mmr + to).min(c.end));
            if s <= e {
                windows.push((id, s, e));
            }
        }
        for (g, &start) in age_starts.iter().enumerate() {
            let last = age_starts.get(g + 1).map_or(i64::MAX, |&n| n - 1);
            let (s, e) = (start.max(c.sta), last.min(c.end));
            if s <= e {
                windows.push((101 + g as i64, s, e));
            }
        }
        let mut cuts = vec![c.sta, c.end + 1];
        for &(_, s, e) in &windows {
            cuts.push(s);
            cuts.push(e + 1);
        }
        cuts.sort_unstable();
        cuts.dedup();
        // Merge elementary intervals with the same pattern: pattern → (days, events).
        let mut rows: BTreeMap<Vec<i64>, (i64, usize)> = BTreeMap::new();
        for w in cuts.windows(2) {
            let (lo, hi) = (w[0], w[1] - 1);
            let days = hi - lo + 1;
            let events = c.events.iter().filter(|&&a| lo <= a && a <= hi).count();
            log_t_events += events as f64 * (days as f64).ln();
            let pattern: Vec<i64> = windows
                .iter()
                .filter(|&&(_, s, e)| s <= lo && hi <= e)
                .map(|w| w.0)
                .collect();
            let entry = rows.entry(pattern).or_insert((0, 0));
            entry.0 += days;
            entry.1 += events;
            elementary_intervals += 1;
        }
        let n_events: usize = rows.values().map(|r| r.1).sum();
        assert_eq!(
            n_events,
            c.events.len(),
            "case {}: every event in [sta, end]",
            c.id
        );
        for (k, (pattern, (days, events))) in rows.into_iter().enumerate() {
            let row_id = c.id * 1000 + k as i64;
            b.push_outcome(OutcomeRecord {
                row_id,
                stratum_id: Some(c.id),
                time: Some(days as f64),
                y: events as f64,
                ..Default::default()
            });
            for cov in pattern {
                b.push_covariate(row_id, cov, 1.0);
            }
        }
    }
    Sccs {
        x: b.build().unwrap(),
        elementary_intervals,
        log_t_events,
    }
}

struct Fit {
    lik: ConditionalPoisson,
    priors: PriorSet,
    beta: Vec<f64>,
    ll: f64,
    se: Vec<f64>,
}

fn tight() -> CcdOptions {
    CcdOptions {
        tolerance: 1e-16,
        max_iterations: 100_000,
        ..Default::default()
    }
}

fn fit(x: &DesignMatrix) -> Fit {
    let mut lik = ConditionalPoisson::new(x).unwrap();
    let p = lik.n_coef();
    let priors = PriorSet::new(Prior::None, &vec![false; p]);
    let r = ccd::fit(&mut lik, &priors, &vec![0.0; p], None, &tight()).unwrap();
    assert_eq!(r.status, FitStatus::Converged);
    let cols: Vec<usize> = (0..p).collect();
    let se = standard_errors(&mut lik, &cols)
        .into_iter()
        .map(|s| s.expect("information is positive definite"))
        .collect();
    Fit {
        lik,
        priors,
        beta: r.beta,
        ll: r.log_likelihood,
        se,
    }
}

fn rel_close(got: f64, want: f64, rel: f64, what: &str) {
    assert!(
        (got - want).abs() <= rel * want.abs(),
        "{what}: got {got:.10}, want {want} (rel. error {:.2e})",
        ((got - want) / want).abs()
    );
}

/// `want` printed with `decimals` decimals: agree to half a unit in the last place.
fn printed_close(got: f64, want: f64, decimals: i32, what: &str) {
    let half_ulp = 0.5 * 10f64.powi(-decimals) * (1.0 + 1e-9);
    assert!(
        (got - want).abs() <= half_ulp,
        "{what}: got {got:.10}, printed {want}"
    );
}

fn coef(f: &Fit, x: &DesignMatrix, id: i64) -> (f64, f64) {
    let j = x.column_index(id).unwrap();
    (f.beta[j], f.se[j])
}

/// The `amdat` design (risk window 15–35 days as covariate 1000; age groups from day 548 as
/// covariate 101). Also used by `gpu_parity`.
pub(crate) fn amdat() -> DesignMatrix {
    amdat_data().x
}

fn amdat_data() -> Sccs {
    build(
        &cases("sccs_amdat.csv", "am"),
        &[(1000, 15, 35)],
        &[548], // groups 366–547 (reference) and 548–730
    )
}

#[test]
fn amdat_matches_published_stata_and_r() {
    let data = amdat_data();
    assert_eq!(data.elementary_intervals, 38, "38 intervals (observations)");
    assert_eq!(data.x.n_strata(), 10, "10 groups");
    let x = &data.x;
    let mut f = fit(x);
    let (b, se) = coef(&f, x, 1000);
    rel_close(b, 2.487975, 1e-6, "RI coef");
    printed_close(se, 0.7084879, 7, "RI se");
    let (b_age, se_age) = coef(&f, x, 101);
    rel_close(b_age, -1.490576, 1e-6, "age2 coef");
    printed_close(se_age, 1.1182396, 7, "age2 se");
    // Published (Stata): RI 12.037, SE 8.528 (delta method), 95% CI 3.002–48.259 (Wald).
    printed_close(b.exp(), 12.037, 3, "RI");
    printed_close(b.exp() * se, 8.528, 3, "SE of RI");
    let z = 1.959963984540054;
    printed_close((b - z * se).exp(), 3.002, 3, "RI lower");
    printed_close((b + z * se).exp(), 48.259, 3, "RI upper");
    printed_close(b_age.exp(), 0.225, 3, "age2 RI");
    // Log-likelihood: ours is without constants; R / Stata add Σ_events log t_elem.
    let reference_ll = f.ll + data.log_t_events;
    printed_close(reference_ll, -10.088277, 6, "loglik (Stata)");
    printed_close(reference_ll, -10.08828, 5, "loglik (R SCCS 1.7)");

    // Profile-likelihood interval for the RI (no published numbers: check it is sensible).
    let j = x.column_index(1000).unwrap();
    let beta_hat = f.beta.clone();
    let pi = profile_interval(
        &mut f.lik,
        &f.priors,
        epifusion::model::inference::Optimum {
            beta: &beta_hat,
            objective: f.ll,
        },
        j,
        se,
        0.95,
        &tight(),
    )
    .unwrap();
    let (lo, hi) = (pi.lower.unwrap(), pi.upper.unwrap());
    assert!(lo < b && b < hi, "profile interval {lo}..{hi} around {b}");
    assert!(lo > 0.0 && hi < b + 5.0 * se, "profile interval {lo}..{hi}");
    // At each bound the profile log-likelihood is 1.920729 below the maximum.
    for bound in [lo, hi] {
        let mut start = beta_hat.clone();
        start[j] = bound;
        let mut fixed = vec![false; start.len()];
        fixed[j] = true;
        let r = ccd::fit(&mut f.lik, &f.priors, &start, Some(&fixed), &tight()).unwrap();
        assert!(
            (f.ll - r.log_likelihood - 1.920729410347062).abs() < 1e-6,
            "{}",
            r.log_likelihood
        );
    }
}

#[test]
fn itpdat_matches_sccs_package() {
    let all = cases("sccs_itpdat.csv", "itp");
    assert_eq!(all.iter().map(|c| c.events.len()).sum::<usize>(), 44);
    let ages = [427, 488, 549, 610, 671];

    // mod1: risk [mmr, mmr+42], no age effect.
    let d1 = build(&all, &[(1000, 0, 42)], &[]);
    let f1 = fit(&d1.x);
    let (b, se) = coef(&f1, &d1.x, 1000);
    rel_close(b, 1.509563, 1e-6, "mod1 coef");
    printed_close(se, 0.3512039, 7, "mod1 se");
    printed_close(f1.ll + d1.log_t_events, -30.09470, 5, "mod1 loglik");

    // mod2: plus age groups.
    let d2 = build(&all, &[(1000, 0, 42)], &ages);
    let f2 = fit(&d2.x);
    let (b, se) = coef(&f2, &d2.x, 1000);
    rel_close(b, 1.1713023, 1e-6, "mod2 coef");
    printed_close(se, 0.3799802, 7, "mod2 se");
    let want = [-0.4038760, -1.5693685, -1.2061463, -0.9230387, -0.9082000];
    for (g, &w) in want.iter().enumerate() {
        rel_close(
            coef(&f2, &d2.x, 101 + g as i64).0,
            w,
            1e-6,
            &format!("mod2 age{}", g + 2),
        );
    }
    printed_close(f2.ll + d2.log_t_events, -73.04148, 5, "mod2 loglik");

    // mod3: risk split 0–14 / 15–28 / 29–42, same age groups.
    let d3 = build(
        &all,
        &[(1000, 0, 14), (1001, 15, 28), (1002, 29, 42)],
        &ages,
    );
    let f3 = fit(&d3.x);
    let want = [
        (0.2691659, 0.7529389),
        (1.7840593, 0.4388393),
        (0.9555898, 0.6375012),
    ];
    for (k, &(wb, wse)) in want.iter().enumerate() {
        let (b, se) = coef(&f3, &d3.x, 1000 + k as i64);
        rel_close(b, wb, 1e-6, &format!("mod3 risk{k} coef"));
        printed_close(se, wse, 7, &format!("mod3 risk{k} se"));
    }
    printed_close(f3.ll + d3.log_t_events, -84.41353, 5, "mod3 loglik");
}

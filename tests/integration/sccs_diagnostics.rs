//! `sccs_diagnostics` / `sccs_time_to_event` on seeded synthetic OMOP stores with known
//! injected effects: exposure has no effect (RR 1) and outcomes are as likely before as after
//! exposure start, so the pre-exposure window passes; in one store the observation period ends
//! soon after an outcome (event-dependent observation end), so the end-of-observation probe
//! fails there and passes in the clean store.

use std::path::{Path, PathBuf};

use epifusion_core::model::rng::Rng;

use crate::study::{f64s, i64s, session, strings, CsvStore};

/// Persons observed 730 days from a random start in 2015–2016, one 30-day era of concept 5,
/// outcomes (concept 7) at 1/800 per day; with `dependent_end`, an outcome ends the observation
/// 0–20 days later with probability 1/2.
fn store(tag: &str, dependent_end: bool) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "epifusion-sccs-diagnostics-{tag}-{}",
        std::process::id()
    ));
    let mut rng = Rng::new(if dependent_end { 7 } else { 11 });
    let mut store = CsvStore::default();
    let base = 16_436; // 2015-01-01
    for p in 1..=4000i64 {
        let start = base + rng.int_range(0, 730) as i64;
        let mut end = start + 729;
        let mut events = Vec::new();
        let mut day = start;
        loop {
            day += 1 + rng.exponential(1.0 / 800.0) as i64;
            if day > end {
                break;
            }
            events.push(day);
            if dependent_end && rng.bernoulli(0.5) {
                end = end.min(day + rng.int_range(0, 20) as i64);
            }
        }
        let era_start = start + rng.int_range(0, 700) as i64;
        store.person(p, 1960, start, end);
        store.era(p, era_start, era_start + 29);
        for e in events {
            store.outcome(p, e);
        }
    }
    store.write(&dir, &[]);
    dir
}

const SETTINGS: &str = r#"{"outcome": {"concept_ids": [7]},
  "exposures": [{"concept_ids": [5], "label": "drug",
                 "risk_windows": [{}, {"start": -30, "end": -1, "end_anchor": "era_start"}]}],
  "end_of_observation_probe": 30}"#;

/// (diagnostic, status, value) rows.
async fn diagnostics(dir: &Path) -> Vec<(String, String, Option<f64>)> {
    let ctx = session(dir).await;
    let batches = ctx
        .sql(&format!(
            "SELECT diagnostic, status, value, notes FROM sccs_diagnostics('{SETTINGS}')"
        ))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let (d, s, n) = (
        strings(&batches, "diagnostic"),
        strings(&batches, "status"),
        strings(&batches, "notes"),
    );
    let v = f64s(&batches, "value");
    for i in 0..d.len() {
        eprintln!("{} {} {} {}", d[i], s[i], v[i], n[i]);
    }
    d.into_iter()
        .zip(s)
        .zip(v)
        .map(|((d, s), v)| (d, s, Some(v).filter(|v| !v.is_nan())))
        .collect()
}

fn status<'a>(rows: &'a [(String, String, Option<f64>)], diagnostic: &str) -> &'a str {
    &rows.iter().find(|r| r.0 == diagnostic).unwrap().1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_store_passes_event_dependent_end_fails_the_probe() {
    let clean = diagnostics(&store("clean", false)).await;
    assert_eq!(status(&clean, "event_observation"), "pass");
    assert_eq!(status(&clean, "event_exposure"), "pass");
    assert_eq!(status(&clean, "mdrr"), "pass");
    assert_eq!(status(&clean, "time_stability"), "pass");
    assert_eq!(status(&clean, "ease"), "not_computed");
    // Every outcome is kept, so the (high) prevalence does not matter.
    assert_eq!(status(&clean, "rare_outcome"), "pass");

    let dependent = diagnostics(&store("dependent", true)).await;
    assert_eq!(status(&dependent, "event_observation"), "fail");
    let probe = dependent
        .iter()
        .find(|r| r.0 == "event_observation")
        .unwrap()
        .2
        .unwrap();
    assert!(probe > 2.0, "probe IRR {probe}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_to_event_counts_every_outcome_near_the_first_exposure() {
    let dir = store("tte", false);
    let ctx = session(&dir).await;
    let b = ctx
        .sql(&format!(
            "SELECT week, observed_cases, outcomes_exposed, outcomes_unexposed FROM sccs_time_to_event('{SETTINGS}') ORDER BY week"
        ))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let weeks = i64s(&b, "week");
    let exposed = i64s(&b, "outcomes_exposed");
    assert!(weeks.first().copied().unwrap() >= -26 && weeks.last().copied().unwrap() <= 25);
    // The era is days 0–29 after its start: exposed outcomes fall in weeks 0–4 only.
    for (w, e) in weeks.iter().zip(&exposed) {
        assert!(*e == 0 || (0..=4).contains(w), "week {w}: {e}");
    }
    assert!(exposed.iter().sum::<i64>() > 0);
    assert!(i64s(&b, "observed_cases").iter().all(|&n| n > 0));
}

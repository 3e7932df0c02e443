//! Split SCCS risk windows (`split_points`) end to end, on OMOP stores written by the tests:
//!
//! * a tiny hand-checkable store: days per sub-window per person and the covariate ids in the
//!   order exposure → concept id (`stratify_by_id`) → window → sub-window;
//! * one-day doses: a later dose cuts the rest of an earlier dose's split window;
//! * equivalence: a window split at `a` fits exactly as the two windows `[start, start+a−1]`
//!   and `[start+a, end]` (itpdat through the builder; split at 15 and 29 it is the SCCS
//!   package's three-window model, whose published coefficients it must match).

use std::collections::BTreeMap;
use std::path::PathBuf;

use epifusion::engine::study::{build_sccs, SccsDesign, StudyTables};

use crate::study::{date, f64s, fit, i64s, rel_close, sccs_store, session, strings};

/// Covariate ids of a row → (days, outcomes), per person.
type PersonRows = BTreeMap<i64, BTreeMap<Vec<i64>, (i64, i64)>>;

/// An OMOP CSV store: persons born 1970-01-01 with one observation period each
/// `(person, first day, last day)`, drug eras `(person, concept, first day, last day)` and
/// condition occurrences `(person, concept, day)`.
fn tiny_store(
    tag: &str,
    periods: &[(i64, i64, i64)],
    eras: &[(i64, i64, i64, i64)],
    conditions: &[(i64, i64, i64)],
) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "epifusion-sccs-windows-{tag}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut person =
        String::from("person_id,gender_concept_id,year_of_birth,month_of_birth,day_of_birth\n");
    let mut period = String::from(
        "observation_period_id,person_id,observation_period_start_date,observation_period_end_date\n",
    );
    for &(p, s, e) in periods {
        person.push_str(&format!("{p},8507,1970,1,1\n"));
        period.push_str(&format!("{p},{p},{},{}\n", date(s), date(e)));
    }
    let mut era = String::from(
        "drug_era_id,person_id,drug_concept_id,drug_era_start_date,drug_era_end_date\n",
    );
    for (k, &(p, c, s, e)) in eras.iter().enumerate() {
        era.push_str(&format!("{},{p},{c},{},{}\n", k + 1, date(s), date(e)));
    }
    let mut cond = String::from(
        "condition_occurrence_id,person_id,condition_concept_id,condition_start_date\n",
    );
    for (k, &(p, c, d)) in conditions.iter().enumerate() {
        cond.push_str(&format!("{},{p},{c},{}\n", k + 1, date(d)));
    }
    for (f, text) in [
        ("person.csv", person),
        ("observation_period.csv", period),
        ("drug_era.csv", era),
        ("condition_occurrence.csv", cond),
    ] {
        std::fs::write(dir.join(f), text).unwrap();
    }
    dir
}

/// The built interval table, per person: covariate ids of each row → (days, outcomes).
fn person_rows(t: &StudyTables) -> PersonRows {
    let (rows, persons) = (i64s(&t.outcomes, "row_id"), i64s(&t.outcomes, "person_id"));
    let (time, y) = (f64s(&t.outcomes, "time"), f64s(&t.outcomes, "y"));
    let mut ids: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for (r, c) in i64s(&t.covariates, "row_id")
        .into_iter()
        .zip(i64s(&t.covariates, "covariate_id"))
    {
        ids.entry(r).or_default().push(c);
    }
    let mut out = PersonRows::new();
    for k in 0..rows.len() {
        let mut pattern = ids.remove(&rows[k]).unwrap_or_default();
        pattern.sort_unstable();
        let e = out
            .entry(persons[k])
            .or_default()
            .entry(pattern)
            .or_default();
        e.0 += time[k] as i64;
        e.1 += y[k] as i64;
    }
    out
}

/// `[(ids, days, outcomes)]` as the per-person map.
fn expect(rows: &[(&[i64], i64, i64)]) -> BTreeMap<Vec<i64>, (i64, i64)> {
    rows.iter()
        .map(|(ids, d, y)| (ids.to_vec(), (*d, *y)))
        .collect()
}

async fn build(ctx: &datafusion::prelude::SessionContext, json: &str) -> StudyTables {
    let d = SccsDesign::from_json(json).unwrap();
    d.check().unwrap();
    build_sccs(ctx, &d).await.unwrap()
}

/// Persons 1–3 have outcome 7 and eras of concepts 5 and 6; person 4 has outcome 8 and one-day
/// doses of concept 9.
fn windows_store() -> PathBuf {
    tiny_store(
        "split",
        &[(1, 1, 400), (2, 1, 320), (3, 120, 250), (4, 1, 230)],
        &[
            (1, 5, 100, 199),
            (2, 6, 50, 60),
            (2, 5, 300, 309),
            (3, 5, 100, 160),
            (4, 9, 100, 100),
            (4, 9, 120, 120),
            (4, 9, 200, 200),
        ],
        &[
            (1, 7, 120),
            (1, 7, 300),
            (2, 7, 5),
            (2, 7, 65),
            (3, 7, 200),
            (4, 8, 110),
            (4, 8, 118),
            (4, 8, 150),
            (4, 8, 190),
        ],
    )
}

#[tokio::test]
async fn split_windows_give_the_hand_counted_days_and_ids() {
    let store = windows_store();
    let ctx = session(&store).await;
    // Two windows of concepts 5 and 6 (stratified): "while exposed" split at 15 and 43, and the
    // 30 days after the era split at 10. Ids: concept 5 → 1000–1002 (window 0), 1003–1004
    // (window 1); concept 6 → 1005–1007, 1008–1009.
    let json = r#"{"outcome": {"concept_ids": [7]}, "exposures": [{"concept_ids": [5, 6],
        "label": "drug", "stratify_by_id": true, "risk_windows": [
        {"start": 0, "end": 0, "end_anchor": "era_end", "split_points": [15, 43]},
        {"start": 1, "start_anchor": "era_end", "end": 30, "split_points": [10]}]}]}"#;
    let t = build(&ctx, json).await;
    let got = person_rows(&t);
    assert_eq!(got.len(), 3, "person 4 has no outcome 7: {got:?}");
    // Person 1, era [100, 199]: [100, 114], [115, 142], [143, 199]; after it [200, 209],
    // [210, 229]; outcomes on days 120 (1001) and 300.
    assert_eq!(
        got[&1],
        expect(&[
            (&[], 99 + 171, 1),
            (&[1000], 15, 0),
            (&[1001], 28, 1),
            (&[1002], 57, 0),
            (&[1003], 10, 0),
            (&[1004], 20, 0),
        ])
    );
    // Person 2: concept 6 era [50, 60] holds only its first sub-window (clipped at the era
    // end), then [61, 70], [71, 90]; concept 5 era [300, 309], then [310, 319] and [320, 320]
    // (observation ends on day 320). Outcomes on days 5 and 65 (1008).
    assert_eq!(
        got[&2],
        expect(&[
            (&[], 49 + 209, 1),
            (&[1005], 11, 0),
            (&[1008], 10, 1),
            (&[1009], 20, 0),
            (&[1000], 10, 0),
            (&[1003], 10, 0),
            (&[1004], 1, 0),
        ])
    );
    // Person 3, observed from day 120, era [100, 160]: the sub-windows count from the era start,
    // so [115, 142] is cut to [120, 142] and [100, 114] is outside the case.
    assert_eq!(
        got[&3],
        expect(&[
            (&[], 60, 1),
            (&[1001], 23, 0),
            (&[1002], 18, 0),
            (&[1003], 10, 0),
            (&[1004], 20, 0),
        ])
    );
    assert_eq!(
        i64s(&t.covariate_ref, "covariate_id"),
        (1000..=1009).collect::<Vec<_>>()
    );
    let names = strings(&t.covariate_ref, "covariate_name");
    for (k, want) in [
        (0, "drug (concept 5): era start +0 to era end +0, days 0–14"),
        (
            1,
            "drug (concept 5): era start +0 to era end +0, days 15–42",
        ),
        (
            2,
            "drug (concept 5): era start +0 to era end +0, days 43–end",
        ),
        (3, "drug (concept 5): era end +1 to era end +30, days 0–9"),
        (4, "drug (concept 5): era end +1 to era end +30, days 10–29"),
        (5, "drug (concept 6): era start +0 to era end +0, days 0–14"),
        (9, "drug (concept 6): era end +1 to era end +30, days 10–29"),
    ] {
        assert_eq!(names[k], want);
    }
    assert_eq!(
        i64s(&t.covariate_ref, "concept_id"),
        [[5; 5], [6; 5]].concat()
    );
    let _ = std::fs::remove_dir_all(&store);
}

#[tokio::test]
async fn a_later_dose_cuts_an_earlier_dose_split_window() {
    let store = windows_store();
    let ctx = session(&store).await;
    // Person 4: one-day doses on days 100, 120, 200; a 60-day window split at 15 and 43.
    // Dose 1: [100, 114], [115, 119] (the day before dose 2). Dose 2: [120, 134], [135, 162],
    // [163, 179]. Dose 3: [200, 214], [215, 230] (observation end).
    let split = r#"{"outcome": {"concept_ids": [8]}, "exposures": [{"concept_ids": [9],
        "risk_windows": [{"start": 0, "end": 59, "end_anchor": "era_start", "split_points": [15, 43]}]}]}"#;
    let t = build(&ctx, split).await;
    let got = person_rows(&t);
    assert_eq!(
        got[&4],
        expect(&[
            (&[], 99 + 20, 1),
            (&[1000], 15 + 15 + 15, 1),
            (&[1001], 5 + 28 + 16, 2),
            (&[1002], 17, 0),
        ])
    );
    assert_eq!(got.len(), 1);
    // The same as three separate windows, each cut by the next dose.
    let separate = r#"{"outcome": {"concept_ids": [8]}, "exposures": [{"concept_ids": [9],
        "risk_windows": [{"start": 0, "end": 14, "end_anchor": "era_start"},
        {"start": 15, "end": 42, "end_anchor": "era_start"},
        {"start": 43, "end": 59, "end_anchor": "era_start"}]}]}"#;
    assert_eq!(person_rows(&build(&ctx, separate).await), got);
    let _ = std::fs::remove_dir_all(&store);
}

/// Fit of a design on itpdat: covariate id → (β, se, LL).
async fn fit_itpdat(
    ctx: &datafusion::prelude::SessionContext,
    windows: &str,
) -> BTreeMap<i64, (f64, f64, f64)> {
    let json = format!(
        r#"{{"outcome": {{"concept_ids": [7]}}, "exposures": [{{"concept_ids": [5], "risk_windows": [{windows}]}}],
            "age_group_starts": [427, 488, 549, 610, 671]}}"#
    );
    fit(ctx, "sccs_fit", &build(ctx, &json).await).await
}

fn assert_same_fit(
    split: &BTreeMap<i64, (f64, f64, f64)>,
    separate: &BTreeMap<i64, (f64, f64, f64)>,
    what: &str,
) {
    assert_eq!(
        split.keys().collect::<Vec<_>>(),
        separate.keys().collect::<Vec<_>>(),
        "{what}: covariate ids"
    );
    for (id, (b, se, ll)) in split {
        let (b2, se2, ll2) = separate[id];
        assert!(
            (b - b2).abs() <= 1e-9 && (se - se2).abs() <= 1e-9 && (ll - ll2).abs() <= 1e-9,
            "{what}, covariate {id}: split ({b}, {se}, {ll}) vs separate ({b2}, {se2}, {ll2})"
        );
    }
}

#[tokio::test]
async fn a_split_window_fits_as_separate_windows() {
    let store = sccs_store("sccs_itpdat.csv", "itp");
    let ctx = session(&store).await;
    // Split at 15: ids 1000 (days 0–14) and 1001 (days 15–42), as two windows.
    let split = fit_itpdat(
        &ctx,
        r#"{"start": 0, "end": 42, "end_anchor": "era_start", "split_points": [15]}"#,
    )
    .await;
    let separate = fit_itpdat(
        &ctx,
        r#"{"start": 0, "end": 14, "end_anchor": "era_start"}, {"start": 15, "end": 42, "end_anchor": "era_start"}"#,
    )
    .await;
    assert!(split.contains_key(&1001) && !split.contains_key(&1002));
    assert_same_fit(&split, &separate, "split at 15");
    // Split at 15 and 29: the SCCS package's mod3 (three risk groups, expogrp = c(0, 15, 29)).
    let split = fit_itpdat(
        &ctx,
        r#"{"start": 0, "end": 42, "end_anchor": "era_start", "split_points": [15, 29]}"#,
    )
    .await;
    let separate = fit_itpdat(
        &ctx,
        r#"{"start": 0, "end": 14, "end_anchor": "era_start"}, {"start": 15, "end": 28, "end_anchor": "era_start"}, {"start": 29, "end": 42, "end_anchor": "era_start"}"#,
    )
    .await;
    assert_same_fit(&split, &separate, "split at 15, 29");
    for (k, want) in [0.2691659, 1.7840593, 0.9555898].into_iter().enumerate() {
        rel_close(split[&(1000 + k as i64)].0, want, 1e-6, "mod3 coef");
    }
    // An era-anchored window split the same way (itpdat's eras last one day, so "era end + 42"
    // is "era start + 42"): still the same fit.
    let era_end = fit_itpdat(&ctx, r#"{"start": 0, "end": 42, "split_points": [15, 29]}"#).await;
    assert_same_fit(&era_end, &separate, "era-end anchored split");
    let _ = std::fs::remove_dir_all(&store);
}

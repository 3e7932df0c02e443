//! A seeded generator of synthetic OMOP stores for benchmarks (`epifusion bench-omop`).
//!
//! Per person: gender, a birth date (1930–2009), one observation period (start 2000–2014,
//! 1–10 years); `drugs` drugs (concept ids 1_000_001…) with prevalences spread log-evenly
//! between 20% and 0.5%, each exposed person getting 1–4 eras of 7–180 days inside the
//! observation period; outcome concept 2_000_001 at a baseline rate of 1 per 40 person-years
//! (recurrent) with relative incidence [`TRUE_RI`] during eras of drug 1; 0–6 background
//! conditions (concept ids 3_000_001…, 200 of them) for baseline covariates; death for 2% of
//! persons, on the last observed day. Files are written in chunks of 100,000 persons, so the
//! generator's memory does not grow with the store.
//!
//! [`write_store_with`] adds `extra_outcomes` more outcomes (concept ids 2_000_002…, for the
//! many-pairs benchmark: negative controls), each recurrent at 1 per 100 person-years, not
//! caused by any drug (RR = 1) except that every [`BIASED_EVERY`]-th one has the rate ×
//! [`BIAS_RR`] during eras of *every* drug: systematic error that empirical calibration should
//! see. They are drawn from a second random stream, so the rest of the store is the same as
//! [`write_store`]'s for the same seed.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Date32Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{exec_datafusion_err, Result as DfResult};
use parquet::arrow::ArrowWriter;

use epifusion_core::bench::Rng;

/// Relative incidence of the outcome during eras of drug 1.
pub const TRUE_RI: f64 = 2.0;
/// The outcome's concept id.
pub const OUTCOME_CONCEPT: i64 = 2_000_001;
/// The first drug's concept id.
pub const FIRST_DRUG: i64 = 1_000_001;
/// Every this-many-th extra outcome (the 1st, the 6th, …) carries systematic error.
pub const BIASED_EVERY: usize = 5;
/// Rate ratio of a biased extra outcome during any drug era (the systematic error).
pub const BIAS_RR: f64 = 1.5;

/// Counts of a generated store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreSummary {
    /// Persons (= observation periods).
    pub persons: usize,
    /// Drug eras.
    pub drug_eras: usize,
    /// Condition occurrences (outcomes and background).
    pub conditions: usize,
    /// Outcome occurrences.
    pub outcomes: usize,
    /// Deaths.
    pub deaths: usize,
}

fn schema(cols: &[(&str, DataType)]) -> SchemaRef {
    Arc::new(Schema::new(
        cols.iter()
            .map(|(n, t)| Field::new(*n, t.clone(), false))
            .collect::<Vec<_>>(),
    ))
}

pub(super) struct Table {
    writer: ArrowWriter<File>,
    schema: SchemaRef,
    cols: Vec<Vec<i64>>,
}

impl Table {
    pub(super) fn create(dir: &Path, name: &str, cols: &[(&str, DataType)]) -> DfResult<Self> {
        let schema = schema(cols);
        let path = dir.join(format!("{name}.parquet"));
        let file = File::create(&path)
            .map_err(|e| exec_datafusion_err!("cannot create {}: {e}", path.display()))?;
        Ok(Table {
            writer: ArrowWriter::try_new(file, schema.clone(), None)?,
            cols: vec![Vec::new(); cols.len()],
            schema,
        })
    }

    pub(super) fn push(&mut self, row: &[i64]) {
        for (c, v) in self.cols.iter_mut().zip(row) {
            c.push(*v);
        }
    }

    pub(super) fn flush(&mut self) -> DfResult<()> {
        if self.cols[0].is_empty() {
            return Ok(());
        }
        let arrays: Vec<ArrayRef> = self
            .schema
            .fields()
            .iter()
            .zip(self.cols.iter_mut())
            .map(|(f, c)| {
                let v = std::mem::take(c);
                if *f.data_type() == DataType::Date32 {
                    Arc::new(Date32Array::from_iter_values(
                        v.into_iter().map(|d| d as i32),
                    )) as ArrayRef
                } else {
                    Arc::new(Int64Array::from(v)) as ArrayRef
                }
            })
            .collect();
        self.writer
            .write(&RecordBatch::try_new(self.schema.clone(), arrays)?)?;
        Ok(())
    }

    pub(super) fn close(mut self) -> DfResult<()> {
        self.flush()?;
        self.writer.close()?;
        Ok(())
    }
}

/// Write a synthetic store of `persons` persons with `drugs` drugs into `dir` (Parquet).
pub fn write_store(dir: &Path, persons: usize, drugs: usize, seed: u64) -> DfResult<StoreSummary> {
    write_store_with(dir, persons, drugs, seed, 0)
}

/// [`write_store`] with `extra_outcomes` more outcomes (see the [module docs](self)).
pub fn write_store_with(
    dir: &Path,
    persons: usize,
    drugs: usize,
    seed: u64,
    extra_outcomes: usize,
) -> DfResult<StoreSummary> {
    std::fs::create_dir_all(dir)
        .map_err(|e| exec_datafusion_err!("cannot create {}: {e}", dir.display()))?;
    let i = DataType::Int64;
    let d = DataType::Date32;
    let mut person = Table::create(
        dir,
        "person",
        &[
            ("person_id", i.clone()),
            ("gender_concept_id", i.clone()),
            ("year_of_birth", i.clone()),
            ("month_of_birth", i.clone()),
            ("day_of_birth", i.clone()),
        ],
    )?;
    let mut period = Table::create(
        dir,
        "observation_period",
        &[
            ("observation_period_id", i.clone()),
            ("person_id", i.clone()),
            ("observation_period_start_date", d.clone()),
            ("observation_period_end_date", d.clone()),
        ],
    )?;
    let mut era = Table::create(
        dir,
        "drug_era",
        &[
            ("drug_era_id", i.clone()),
            ("person_id", i.clone()),
            ("drug_concept_id", i.clone()),
            ("drug_era_start_date", d.clone()),
            ("drug_era_end_date", d.clone()),
        ],
    )?;
    let mut condition = Table::create(
        dir,
        "condition_occurrence",
        &[
            ("condition_occurrence_id", i.clone()),
            ("person_id", i.clone()),
            ("condition_concept_id", i.clone()),
            ("condition_start_date", d.clone()),
            ("condition_end_date", d.clone()),
        ],
    )?;
    let mut death = Table::create(
        dir,
        "death",
        &[("person_id", i.clone()), ("death_date", d.clone())],
    )?;
    let mut rng = Rng::new(seed);
    let mut s = StoreSummary {
        persons,
        ..Default::default()
    };
    let prevalence: Vec<f64> = (0..drugs)
        .map(|k| 0.2 * (0.025f64).powf(k as f64 / (drugs.max(2) - 1) as f64))
        .collect();
    let base_rate = 1.0 / (40.0 * 365.25);
    let first_start = super::days_from_civil(2000, 1, 1);
    for p in 0..persons {
        let pid = p as i64 + 1;
        let gender = if rng.bernoulli(0.5) { 8507 } else { 8532 };
        let birth_year = rng.int_range(1930, 2009) as i64;
        person.push(&[
            pid,
            gender,
            birth_year,
            rng.int_range(1, 12) as i64,
            rng.int_range(1, 28) as i64,
        ]);
        let start = first_start + rng.int_range(0, 15 * 365) as i64;
        let end = start + rng.int_range(365, 3650) as i64;
        period.push(&[pid, pid, start, end]);
        // Eras of drug 1 define the outcome's rate.
        let mut exposed: Vec<(i64, i64)> = Vec::new();
        let mut any_drug: Vec<(i64, i64)> = Vec::new();
        for (k, &prev) in prevalence.iter().enumerate() {
            if !rng.bernoulli(prev) {
                continue;
            }
            for _ in 0..rng.int_range(1, 4) {
                let s0 = rng.int_range(start as u64, end as u64) as i64;
                let e0 = (s0 + rng.int_range(6, 179) as i64).min(end);
                s.drug_eras += 1;
                era.push(&[s.drug_eras as i64, pid, FIRST_DRUG + k as i64, s0, e0]);
                any_drug.push((s0, e0));
                if k == 0 {
                    exposed.push((s0, e0));
                }
            }
        }
        // Outcomes: Poisson counts per day, rate × RI on days exposed to drug 1.
        let exposed_days: i64 = {
            exposed.sort_unstable();
            let mut days = 0;
            let mut covered_to = i64::MIN;
            for &(a, b) in &exposed {
                let a = a.max(covered_to + 1);
                if b >= a {
                    days += b - a + 1;
                }
                covered_to = covered_to.max(b);
            }
            days
        };
        let total_days = end - start + 1;
        let mean = base_rate * ((total_days - exposed_days) as f64 + TRUE_RI * exposed_days as f64);
        for _ in 0..rng.poisson(mean) {
            // Draw the day with probability ∝ rate: rejection against the exposed weight.
            let day = loop {
                let day = rng.int_range(start as u64, end as u64) as i64;
                let in_era = exposed.iter().any(|&(a, b)| a <= day && day <= b);
                if in_era || rng.bernoulli(1.0 / TRUE_RI) {
                    break day;
                }
            };
            s.conditions += 1;
            s.outcomes += 1;
            condition.push(&[s.conditions as i64, pid, OUTCOME_CONCEPT, day, day]);
        }
        for _ in 0..rng.int_range(0, 6) {
            let day = rng.int_range(start as u64, end as u64) as i64;
            s.conditions += 1;
            let concept = 3_000_001 + rng.int_range(0, 199) as i64;
            condition.push(&[s.conditions as i64, pid, concept, day, day]);
        }
        if extra_outcomes > 0 {
            // A second stream per person: the main stream (and so the rest of the store) is
            // unchanged by the extra outcomes.
            let mut extra =
                Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15 ^ (pid as u64).wrapping_mul(0x2545_f491));
            let in_drug = |day: i64| any_drug.iter().any(|&(a, b)| a <= day && day <= b);
            let drug_days = (start..=end).filter(|&d| in_drug(d)).count() as f64;
            let total = (end - start + 1) as f64;
            for j in 0..extra_outcomes {
                let biased = j % BIASED_EVERY == 0;
                let rr = if biased { BIAS_RR } else { 1.0 };
                let rate = 1.0 / (100.0 * 365.25);
                let mean = rate * ((total - drug_days) + rr * drug_days);
                for _ in 0..extra.poisson(mean) {
                    let day = loop {
                        let day = extra.int_range(start as u64, end as u64) as i64;
                        if !biased || in_drug(day) || extra.bernoulli(1.0 / rr) {
                            break day;
                        }
                    };
                    s.conditions += 1;
                    condition.push(&[
                        s.conditions as i64,
                        pid,
                        OUTCOME_CONCEPT + 1 + j as i64,
                        day,
                        day,
                    ]);
                }
            }
        }
        if rng.bernoulli(0.02) {
            s.deaths += 1;
            death.push(&[pid, end]);
        }
        if (p + 1) % 100_000 == 0 {
            for t in [
                &mut person,
                &mut period,
                &mut era,
                &mut condition,
                &mut death,
            ] {
                t.flush()?;
            }
        }
    }
    for t in [person, period, era, condition, death] {
        t.close()?;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_is_seeded_and_plausible() {
        let dir = std::env::temp_dir().join(format!("epifusion-synth-{}", std::process::id()));
        let a = write_store(&dir, 2000, 5, 7).unwrap();
        let b = write_store(&dir, 2000, 5, 7).unwrap();
        assert_eq!(a, b);
        assert!(a.drug_eras > 2000 * 2 / 10, "{a:?}");
        // ~5 years of follow-up at 1 per 40 person-years: ~12% of persons have an outcome.
        assert!(a.outcomes > 100 && a.outcomes < 600, "{a:?}");
        assert!(a.deaths > 10 && a.deaths < 90, "{a:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

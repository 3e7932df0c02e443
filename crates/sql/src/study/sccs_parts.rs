//! An SCCS build partitioned by person: how `sccs_intervals`, `sccs_covariates`,
//! `sccs_covariate_ref` and `sccs_attrition` run on a cluster.
//!
//! Each case's intervals depend on that person's rows alone, given three things that depend
//! on every case: the interval plan (spline knots at quantiles of every case's outcome days,
//! and, for an exposure with `stratify_by_id`, its concept ids), the row and stratum numbering
//! (cases in the order of the study-population query, numbered from 1), and the attrition
//! counts. So the build is two plan nodes over four queries ([`split_queries`]):
//!
//! * `cases`: the study-population query ([`SccsDesign::cases_sql`]), one row per candidate
//!   case (a small table: one row per observation period with an outcome);
//! * `outcomes`: the outcome rows (`person_id`, `start_day`);
//! * `concepts`: the concept ids of the stratified exposures' eras of kept persons;
//! * `rows`: one marker row per person with an outcome (`x` = −1) and every era of those
//!   persons (`x` = the exposure's index), **hash-partitioned by `person_id`**.
//!
//! [`NodeSpec::SccsPart`](crate::exec::NodeSpec::SccsPart) has one output partition per
//! partition of `rows`. Each task reads the three small queries whole, computes the global
//! part ([`global`], the same in every task), and splits the kept cases of its partition's
//! persons ([`split_partition`]) into *pieces*: per case, its rows and their covariates,
//! tagged with the case's index. On a Ballista cluster these tasks run on the executors,
//! each reading its own share of the eras; the hash repartition is a shuffle.
//! [`NodeSpec::SccsMerge`](crate::exec::NodeSpec::SccsMerge) (one partition) reads the
//! pieces of every partition and numbers rows and strata in case order ([`merge`]).
//!
//! The result is the local build's, bit for bit: the same interval code runs on the same case
//! data (events sorted, eras in any order), and the numbering follows the same case order.
//! The merge holds the finished table, as the local build does. With
//! `restrict_time_to_exposure`, the study period is narrowed inside the `cases` query (a cross
//! join with the exposure's era range, [`SccsDesign::cases_sql_restricted`]) rather than by a
//! query run first, and `concepts` carries the exposure's era count, so a store without its
//! eras gets the local build's error.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{Array, Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{exec_datafusion_err, exec_err, Result as DfResult};

use super::functions::Part;
use super::sccs::{
    attrition_batch, covariate_schema, fixed_refs, i64_column, interval_plan, no_eras,
    outcome_schema, population_attrition, read_cases, window_covariates, CaseData, CaseRow,
    CovariateColumns, Era, IntervalPlan, OutcomeColumns, SccsCases, SccsDesign, RANGE_ROW,
};
use super::{covariate_ref_batch, covariate_ref_schema, CovariateRef, Domain};

/// The marker row of a person in the `rows` query.
const MARKER: i64 = -1;

/// The four queries of a partitioned build (`cases`, `outcomes`, `concepts`, `rows`; module
/// documentation).
pub fn split_queries(d: &SccsDesign) -> DfResult<[String; 4]> {
    let cases = d.cases_sql_restricted()?;
    let outcome = d.outcome.sql(Domain::ConditionOccurrence);
    let outcomes = format!(
        "SELECT CAST(o.person_id AS BIGINT) AS person_id, CAST(o.start_day AS BIGINT) AS \
         start_day FROM ({outcome}) AS o"
    );
    // Joins with DISTINCT person lists, not `IN (subquery)`: the plans travel through
    // datafusion-proto, which cannot encode a subquery expression.
    let kept = format!("SELECT DISTINCT c.person_id FROM ({cases}) AS c WHERE c.dropped_at = 0");
    let with_outcome =
        format!("SELECT DISTINCT o.person_id FROM ({outcome}) AS o WHERE o.person_id IS NOT NULL");
    let mut concepts: Vec<String> = d
        .exposures
        .iter()
        .enumerate()
        .filter(|(_, e)| e.stratify_by_id)
        .map(|(x, e)| {
            format!(
                "SELECT DISTINCT CAST({x} AS BIGINT) AS x, CAST(r.concept_id AS BIGINT) AS \
                 concept_id FROM ({}) AS r JOIN ({kept}) AS k ON k.person_id = r.person_id \
                 WHERE r.start_day IS NOT NULL",
                e.concept_set().sql(Domain::DrugEra)
            )
        })
        .collect();
    concepts.extend(d.exposure_era_count_sql());
    if concepts.is_empty() {
        // One row of NULLs (skipped when read), not an empty query: a plan with no
        // partitions would give a Ballista stage with no task.
        concepts
            .push("SELECT CAST(NULL AS BIGINT) AS x, CAST(NULL AS BIGINT) AS concept_id".into());
    }
    let mut rows = vec![format!(
        "SELECT CAST({MARKER} AS BIGINT) AS x, CAST(m.person_id AS BIGINT) AS person_id, \
         CAST(NULL AS BIGINT) AS concept_id, CAST(NULL AS BIGINT) AS start_day, CAST(NULL AS \
         BIGINT) AS end_day FROM ({with_outcome}) AS m"
    )];
    for (x, e) in d.exposures.iter().enumerate() {
        rows.push(format!(
            "SELECT CAST({x} AS BIGINT) AS x, CAST(r.person_id AS BIGINT) AS person_id, \
             CAST(r.concept_id AS BIGINT) AS concept_id, CAST(r.start_day AS BIGINT) AS \
             start_day, CAST(r.end_day AS BIGINT) AS end_day FROM ({}) AS r JOIN \
             ({with_outcome}) AS m ON m.person_id = r.person_id",
            e.concept_set().sql(Domain::DrugEra)
        ));
    }
    Ok([
        cases,
        outcomes,
        concepts.join(" UNION ALL "),
        rows.join(" UNION ALL "),
    ])
}

/// What every task of a partitioned build computes from the three small queries.
pub struct Global {
    /// The kept cases, in the study-population query's order.
    kept: Vec<CaseRow>,
    /// Each kept case's window and outcome days (no eras).
    data: Vec<CaseData>,
    /// Kept cases by person.
    by_person: HashMap<i64, Vec<usize>>,
    plan: IntervalPlan,
    refs: Vec<CovariateRef>,
    attrition: Vec<(String, i64, i64, i64)>,
}

/// The global part of a build from the `cases`, `outcomes` and `concepts` results.
pub fn global(
    d: &SccsDesign,
    cases: &[RecordBatch],
    outcomes: &[RecordBatch],
    concepts: &[RecordBatch],
) -> DfResult<Global> {
    let cases = read_cases(cases)?;
    let attrition = population_attrition(d, &cases);
    let kept: Vec<CaseRow> = cases.into_iter().filter(|c| c.dropped_at == 0).collect();
    let mut by_person: HashMap<i64, Vec<usize>> = HashMap::new();
    for (i, c) in kept.iter().enumerate() {
        by_person.entry(c.person_id).or_default().push(i);
    }
    let mut data: Vec<CaseData> = kept
        .iter()
        .map(|c| CaseData {
            start: c.start_day,
            end: c.end_day,
            obs_end: c.obs_end,
            birth: c.birth_day,
            ..Default::default()
        })
        .collect();
    // An outcome belongs to every kept case of its person whose window holds it (the local
    // build's join condition).
    for b in outcomes {
        let (person, day) = (i64_column(b, "person_id")?, i64_column(b, "start_day")?);
        for i in 0..b.num_rows() {
            if person.is_null(i) || day.is_null(i) {
                continue;
            }
            let Some(own) = by_person.get(&person.value(i)) else {
                continue;
            };
            let day = day.value(i);
            for &c in own {
                if (kept[c].start_day..=kept[c].end_day).contains(&day) {
                    data[c].events.push(day);
                }
            }
        }
    }
    for c in &mut data {
        c.events.sort_unstable();
        if d.first_outcome_only {
            c.events.truncate(1);
        }
    }
    let mut sets: Vec<BTreeSet<i64>> = vec![BTreeSet::new(); d.exposures.len()];
    let mut range_eras = None;
    for b in concepts {
        let (x, concept) = (i64_column(b, "x")?, i64_column(b, "concept_id")?);
        for i in 0..b.num_rows() {
            if x.is_null(i) || concept.is_null(i) {
                continue;
            }
            if x.value(i) == RANGE_ROW {
                range_eras = Some(concept.value(i));
                continue;
            }
            let set = sets.get_mut(x.value(i) as usize).ok_or_else(|| {
                exec_datafusion_err!("sccs build: exposure index {} out of range", x.value(i))
            })?;
            set.insert(concept.value(i));
        }
    }
    if let Some(x) = d.restrict_time_to_exposure {
        // The local build's check, on the count the concepts query carried.
        match range_eras {
            Some(0) => return Err(no_eras(x)),
            Some(_) => {}
            None => return exec_err!("sccs build: the era count of exposures[{x}] is missing"),
        }
    }
    let (windows, mut refs) = window_covariates(d, &sets)?;
    let plan = interval_plan(d, windows, &data)?;
    refs.extend(fixed_refs(d, &plan));
    refs.sort_by_key(|r| r.covariate_id);
    Ok(Global {
        kept,
        data,
        by_person,
        plan,
        refs,
        attrition,
    })
}

/// Schema of the pieces one partition sends to the merge: per case (`case_index`, its index
/// among the kept cases) its rows in order — a row is (`days`, `events`) with no covariate —
/// each followed by its covariates (`covariate_id`, `covariate_value`; no days).
pub fn pieces_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("case_index", DataType::Int64, false),
        Field::new("days", DataType::Int64, true),
        Field::new("events", DataType::Int64, true),
        Field::new("covariate_id", DataType::Int64, true),
        Field::new("covariate_value", DataType::Float64, true),
    ]))
}

#[derive(Default)]
struct Pieces {
    case: Vec<i64>,
    days: Vec<Option<i64>>,
    events: Vec<Option<i64>>,
    id: Vec<Option<i64>>,
    value: Vec<Option<f64>>,
}

impl Pieces {
    fn finish(&mut self) -> DfResult<RecordBatch> {
        let t = std::mem::take(self);
        Ok(RecordBatch::try_new(
            pieces_schema(),
            vec![
                Arc::new(Int64Array::from(t.case)),
                Arc::new(Int64Array::from(t.days)),
                Arc::new(Int64Array::from(t.events)),
                Arc::new(Int64Array::from(t.id)),
                Arc::new(Float64Array::from(t.value)),
            ],
        )?)
    }
}

/// Split the kept cases of the persons in one partition of `rows` (marker rows and eras of the
/// same persons; module documentation). `covariates`: whether the pieces carry each row's
/// covariates (only `sccs_covariates` needs them).
pub fn split_partition(
    g: &Global,
    rows: &[RecordBatch],
    covariates: bool,
) -> DfResult<Vec<RecordBatch>> {
    const CHUNK: usize = 65_536;
    let (persons, eras) = read_eras(g, rows)?;
    for p in eras.keys() {
        if !persons.contains(p) {
            return exec_err!(
                "sccs build: the eras of person_id {p} reached a partition without the person \
                 (the rows must be hash-partitioned by person_id)"
            );
        }
    }
    // This partition's cases in case order.
    let mut mine: Vec<usize> = persons
        .iter()
        .filter_map(|p| g.by_person.get(p))
        .flatten()
        .copied()
        .collect();
    mine.sort_unstable();
    let mut out = Vec::new();
    let mut pieces = Pieces::default();
    for c in mine {
        let mut case = g.data[c].clone();
        if let Some(e) = eras.get(&g.kept[c].person_id) {
            case.eras = e.clone();
        }
        let Some(split) = g.plan.split_case(&case) else {
            continue;
        };
        for (pattern, days, events) in split.rows {
            pieces.case.push(c as i64);
            pieces.days.push(Some(days));
            pieces.events.push(Some(events));
            pieces.id.push(None);
            pieces.value.push(None);
            if covariates {
                for (id, v) in pattern {
                    pieces.case.push(c as i64);
                    pieces.days.push(None);
                    pieces.events.push(None);
                    pieces.id.push(Some(id));
                    pieces.value.push(Some(v));
                }
            }
        }
        if pieces.case.len() >= CHUNK {
            out.push(pieces.finish()?);
        }
    }
    if !pieces.case.is_empty() || out.is_empty() {
        out.push(pieces.finish()?);
    }
    Ok(out)
}

/// The persons (marker rows) and the eras of kept cases' persons in batches of the `rows`
/// query; an era with a NULL start or concept id is an error naming the person.
#[allow(clippy::type_complexity)]
fn read_eras(
    g: &Global,
    rows: &[RecordBatch],
) -> DfResult<(BTreeSet<i64>, HashMap<i64, Vec<Era>>)> {
    let mut persons: BTreeSet<i64> = BTreeSet::new();
    let mut eras: HashMap<i64, Vec<Era>> = HashMap::new();
    for b in rows {
        let c = |n: &str| i64_column(b, n);
        let (x, person, concept, start, end) = (
            c("x")?,
            c("person_id")?,
            c("concept_id")?,
            c("start_day")?,
            c("end_day")?,
        );
        for i in 0..b.num_rows() {
            if person.is_null(i) {
                continue;
            }
            let p = person.value(i);
            if x.value(i) == MARKER {
                persons.insert(p);
                continue;
            }
            if !g.by_person.contains_key(&p) {
                continue;
            }
            if start.is_null(i) || concept.is_null(i) {
                return exec_err!(
                    "exposures[{}]: person_id {p} has an era with a NULL start date or concept id",
                    x.value(i)
                );
            }
            let s = start.value(i);
            eras.entry(p).or_default().push(Era {
                exposure: x.value(i) as usize,
                concept_id: concept.value(i),
                start: s,
                end: if end.is_null(i) { s } else { end.value(i) },
            });
        }
    }
    Ok((persons, eras))
}

/// The study population and case data of a design from the whole results of its four
/// queries ([`split_queries`]; `rows` read whole, not partitioned): the local
/// [`super::sccs::load_sccs`]'s cases, how the diagnostics run on a cluster. Each kept case
/// holds every era of its person (eras in query order; what reads them does not depend on it).
pub fn gathered(
    d: &SccsDesign,
    cases: &[RecordBatch],
    outcomes: &[RecordBatch],
    concepts: &[RecordBatch],
    rows: &[RecordBatch],
) -> DfResult<SccsCases> {
    let g = global(d, cases, outcomes, concepts)?;
    let (_, eras) = read_eras(&g, rows)?;
    let Global {
        kept,
        mut data,
        plan,
        refs,
        attrition,
        ..
    } = g;
    for (c, case) in kept.iter().zip(data.iter_mut()) {
        if let Some(e) = eras.get(&c.person_id) {
            case.eras = e.clone();
        }
    }
    Ok(SccsCases {
        kept,
        data,
        plan,
        refs,
        attrition,
    })
}

/// The schema of `part` of an SCCS design.
pub fn part_schema(part: Part) -> SchemaRef {
    match part {
        Part::Outcomes => outcome_schema(),
        Part::Covariates => covariate_schema(),
        Part::CovariateRef => covariate_ref_schema(),
        Part::Attrition => super::sccs::attrition_schema(),
    }
}

/// Number the pieces of every partition in case order and return `part` of the design: the
/// table the local build returns.
pub fn merge(g: Global, part: Part, pieces: &[RecordBatch]) -> DfResult<RecordBatch> {
    if part == Part::CovariateRef {
        return covariate_ref_batch(&g.refs);
    }
    // Where each case's pieces are: (batch, first row, end row).
    let mut at: Vec<Option<(usize, usize, usize)>> = vec![None; g.kept.len()];
    for (k, b) in pieces.iter().enumerate() {
        let case = i64_column(b, "case_index")?;
        let mut i = 0;
        while i < b.num_rows() {
            let c = case.value(i);
            let mut j = i + 1;
            while j < b.num_rows() && case.value(j) == c {
                j += 1;
            }
            let slot = usize::try_from(c)
                .ok()
                .and_then(|c| at.get_mut(c))
                .ok_or_else(|| exec_datafusion_err!("sccs merge: case index {c} out of range"))?;
            if slot.is_some() {
                return exec_err!(
                    "sccs merge: the pieces of case {c} came from two places (the rows must be \
                     hash-partitioned by person_id)"
                );
            }
            *slot = Some((k, i, j));
            i = j;
        }
    }
    let columns: Vec<[Int64Array; 3]> = pieces
        .iter()
        .map(|b| {
            Ok([
                i64_column(b, "days")?,
                i64_column(b, "events")?,
                i64_column(b, "covariate_id")?,
            ])
        })
        .collect::<DfResult<_>>()?;
    let values: Vec<Float64Array> = pieces
        .iter()
        .map(|b| {
            b.column_by_name("covariate_value")
                .and_then(|c| c.as_any().downcast_ref::<Float64Array>().cloned())
                .ok_or_else(|| exec_datafusion_err!("sccs merge: no covariate_value column"))
        })
        .collect::<DfResult<_>>()?;
    let (mut row_id, mut stratum, mut events_total) = (0i64, 0i64, 0i64);
    let mut persons = BTreeSet::new();
    let (mut o, mut cv) = (OutcomeColumns::default(), CovariateColumns::default());
    for (c, slot) in at.iter().enumerate() {
        let Some((k, from, to)) = *slot else {
            continue;
        };
        let case = &g.kept[c];
        let meta = (case.person_id, case.observation_period_id);
        stratum += 1;
        persons.insert(case.person_id);
        let [days, events, ids] = &columns[k];
        for i in from..to {
            if ids.is_null(i) {
                row_id += 1;
                events_total += events.value(i);
                if part == Part::Outcomes {
                    o.push(row_id, stratum, days.value(i), events.value(i), meta);
                }
            } else if part == Part::Covariates {
                cv.push(row_id, ids.value(i), values[k].value(i));
            }
        }
    }
    match part {
        Part::CovariateRef => covariate_ref_batch(&g.refs),
        Part::Outcomes => o.finish(),
        Part::Covariates => cv.finish(),
        Part::Attrition => {
            let mut rows = g.attrition;
            rows.push((
                "cases with more than one interval (informative)".into(),
                persons.len() as i64,
                stratum,
                events_total,
            ));
            attrition_batch(&rows)
        }
    }
}

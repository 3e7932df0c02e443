//! Many exposures against one outcome, each exposure its own SCCS model (OHDSI's
//! "exposures–outcome set" run one exposure at a time): the study population, the outcomes and
//! the eras of every exposure are read from the store **once**, then the intervals of each
//! exposure are cut from that shared case data exactly as [`build_sccs`] cuts them for a design
//! with that exposure alone.
//!
//! The eras of every exposure but the first are read in one query (a `UNION ALL` of their
//! concept sets, joined once to the kept cases), so a unit of N exposures runs 4 store queries,
//! not 3 + N. A pipeline run passes an [`ExposureEraCache`]: the union is then read once for
//! all the outcome units of the analysis (each of its N − 1 branches scans the store's exposure
//! table) and joined to each unit's cases in memory.
//!
//! For exposure `x` the result is the [`StudyTables`] of the design whose `exposures` is
//! `[d.exposures[x]]` and whose other settings are `d`'s: the same cases (the study population
//! does not depend on the exposures), the same outcome days, the eras of `x` only (renumbered
//! as exposure 0), the same covariate ids (numbered from 1000 or the exposure's `id`) and the
//! same spline knots (placed from the cases' outcomes). A test checks that every table is equal
//! to [`build_sccs`] of the single-exposure design.
//!
//! `restrict_time_to_exposure` narrows the study period to one exposure's calendar range, so
//! the population depends on the exposure: with it set (to any index), each exposure is built
//! on its own with the setting pointing at itself (`0` of its single-exposure design), which is
//! what a single-pair run of that exposure means.
//!
//! [`build_sccs`]: super::build_sccs

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::{Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{exec_datafusion_err, exec_err, Result as DfResult};
use datafusion::prelude::SessionContext;

use super::sccs::{
    attrition_batch, fixed_refs, i64_column, interval_plan, intervals_to_batches, load_sccs,
    window_covariates, CaseData, Era, SccsCases,
};
use super::{covariate_ref_batch, query, Domain, SccsDesign, StudyTables, TempTable};

/// The design `d` with only exposure `x` (and `restrict_time_to_exposure` pointing at it when
/// set): the design of the single exposure–outcome pair.
pub fn single_exposure_design(d: &SccsDesign, x: usize) -> SccsDesign {
    SccsDesign {
        exposures: vec![d.exposures[x].clone()],
        restrict_time_to_exposure: d.restrict_time_to_exposure.map(|_| 0),
        ..d.clone()
    }
}

/// The study tables of every exposure of `d` on its own (see the [module docs](self)), in the
/// order of `d.exposures`; the case data is built once (unless `restrict_time_to_exposure`).
pub async fn build_sccs_each_exposure(
    ctx: &SessionContext,
    d: &SccsDesign,
) -> DfResult<Vec<StudyTables>> {
    d.check()?;
    if d.restrict_time_to_exposure.is_some() {
        let mut out = Vec::with_capacity(d.exposures.len());
        for x in 0..d.exposures.len() {
            out.push(super::build_sccs(ctx, &single_exposure_design(d, x)).await?);
        }
        return Ok(out);
    }
    let cases = load_shared(ctx, d, None).await?;
    let mut out = Vec::with_capacity(d.exposures.len());
    for x in 0..d.exposures.len() {
        out.push(exposure_tables(d, &cases, x).await?);
    }
    Ok(out)
}

/// The case data of one exposure's study tables: the cases and the index of the exposure's
/// eras in them (what the diagnostics of [`super::diagnostics`] read).
#[derive(Debug, Clone)]
pub struct ExposureCases {
    /// The case data (shared by the exposures built from one load).
    pub cases: Arc<SccsCases>,
    /// The exposure's index among the eras of `cases`.
    pub exposure: usize,
}

/// [`build_sccs_each_exposure`], also returning each exposure's case data (shared between the
/// exposures; with `restrict_time_to_exposure`, each exposure's own population, loaded once
/// for its tables and its case data: [`each_exposure_of_own`]). With `eras`, the other
/// exposures' eras are read from the store once for every design that asks with the same
/// concept sets (see [`ExposureEraCache`]).
pub async fn build_sccs_each_exposure_with_cases(
    ctx: &SessionContext,
    d: &SccsDesign,
    eras: Option<&ExposureEraCache>,
) -> DfResult<(Vec<StudyTables>, Vec<ExposureCases>)> {
    d.check()?;
    if d.restrict_time_to_exposure.is_some() {
        // Each exposure's own population, read once (its tables and its case data).
        let mut own = Vec::with_capacity(d.exposures.len());
        for x in 0..d.exposures.len() {
            own.push(load_sccs(ctx, &single_exposure_design(d, x)).await?);
        }
        return each_exposure_of_own(d, own).await;
    }
    each_exposure_of_shared(d, load_shared(ctx, d, eras).await?).await
}

/// The exposures' eras of a many-pairs design over every person (the `UNION ALL` of the
/// concept sets of its exposures after the first, each row tagged with its exposure's index),
/// kept across the designs of one pipeline run: the outcome units of an analysis share its
/// exposures, so the store's exposure tables are scanned once per analysis instead of once per
/// outcome. Keyed by the query text (the same concept sets in the same order give the same
/// rows); the eras are joined to each unit's cases exactly as the uncached query joins them.
/// One result is kept at a time (a run's units come analysis by analysis, so a new query
/// replaces the last one), and one larger than [`ExposureEraCache::MAX_BYTES`] is not kept
/// (each unit then reads the store as without a cache), so memory stays bounded.
#[derive(Debug)]
pub struct ExposureEraCache {
    /// The last query read and its result (`None`: too large to keep).
    last: std::sync::Mutex<Option<(String, Option<CachedEras>)>>,
    max_bytes: usize,
    /// How many times the store was queried.
    reads: std::sync::atomic::AtomicUsize,
}

impl Default for ExposureEraCache {
    fn default() -> Self {
        Self::with_max_bytes(Self::MAX_BYTES)
    }
}

/// A kept query result: its schema and batches.
type CachedEras = (SchemaRef, Arc<Vec<RecordBatch>>);

impl ExposureEraCache {
    /// Largest result kept (bytes of its Arrow arrays): 1 GiB.
    pub const MAX_BYTES: usize = 1 << 30;

    /// An empty cache that keeps results of up to [`Self::MAX_BYTES`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache that keeps results of up to `max_bytes`.
    pub fn with_max_bytes(max_bytes: usize) -> Self {
        Self {
            last: Default::default(),
            max_bytes,
            reads: Default::default(),
        }
    }

    /// How many times an eras query was read from the store (not from the cache).
    pub fn reads(&self) -> usize {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a result is kept now.
    pub fn holds(&self) -> bool {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.as_ref().is_some_and(|(_, kept)| kept.is_some())
    }

    /// The result of `sql` (the eras query), read once; `None` when it is too large to keep.
    async fn eras(&self, ctx: &SessionContext, sql: &str) -> DfResult<Option<CachedEras>> {
        // A poisoned lock only means a panic elsewhere while it was held; the slot is whole.
        let lock = || self.last.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut last = lock();
            match last.as_ref() {
                Some((key, hit)) if key == sql => return Ok(hit.clone()),
                // Another query: drop the last result before reading the new one.
                _ => *last = None,
            }
        }
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Streamed, and given up as soon as the result outgrows the bound: a result too large
        // to keep is never held whole.
        let mut stream = crate::planning::read_only_sql(ctx, sql)
            .await?
            .execute_stream()
            .await?;
        let schema = stream.schema();
        let (mut batches, mut bytes) = (Vec::new(), 0usize);
        let mut fits = true;
        while let Some(batch) = futures::StreamExt::next(&mut stream).await {
            let batch = batch?;
            bytes += batch.get_array_memory_size();
            if bytes > self.max_bytes {
                fits = false;
                break;
            }
            batches.push(batch);
        }
        let kept = fits.then(|| (schema, Arc::new(batches)));
        *lock() = Some((sql.to_string(), kept.clone()));
        Ok(kept)
    }
}

/// The study population, outcomes and the first exposure's eras through [`load_sccs`], then
/// the other exposures' eras of the kept cases in **one** query (a `UNION ALL` of their
/// concept sets joined once to the cases; with `cache`, the union is read from there),
/// read into the same case data as `load_sccs` would.
async fn load_shared(
    ctx: &SessionContext,
    d: &SccsDesign,
    cache: Option<&ExposureEraCache>,
) -> DfResult<SccsCases> {
    let mut cases = load_sccs(ctx, &first_exposure_design(d)).await?;
    if d.exposures.len() == 1 || cases.kept.is_empty() {
        return Ok(cases);
    }
    let case_schema = Arc::new(Schema::new(vec![
        Field::new("case_index", DataType::Int64, false),
        Field::new("person_id", DataType::Int64, false),
    ]));
    let case_batch = RecordBatch::try_new(
        case_schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..cases.kept.len() as i64)),
            Arc::new(Int64Array::from_iter_values(
                cases.kept.iter().map(|c| c.person_id),
            )),
        ],
    )?;
    let temp = TempTable::register(ctx, "sccs_cases_many", case_schema, vec![case_batch])?;
    let branches = other_exposures_union(d);
    let cached = match cache {
        Some(c) => c.eras(ctx, &branches).await?,
        None => None,
    };
    let eras_temp = match cached {
        Some((schema, batches)) => Some(TempTable::register(
            ctx,
            "sccs_exposure_eras_many",
            schema,
            batches.as_ref().clone(),
        )?),
        None => None,
    };
    let eras = match &eras_temp {
        Some(t) => t.name.clone(),
        None => format!("({branches})"),
    };
    let sql = format!(
        "SELECT c.case_index, r.exposure_index, r.concept_id, r.start_day, r.end_day \
         FROM {cases} c JOIN {eras} AS r ON r.person_id = c.person_id",
        cases = temp.name
    );
    for b in query(ctx, &sql).await? {
        let kept = &cases.kept;
        for (c, era) in era_rows(&b, "case_index", |c| kept[c as usize].person_id)? {
            cases.data[c as usize].eras.push(era);
        }
    }
    drop(temp);
    drop(eras_temp);
    Ok(cases)
}

/// The eras of the exposures after the first of a many-pairs design (`exposure_index`,
/// `person_id`, `concept_id`, `start_day`, `end_day`) of the persons with a record of the
/// design's outcome (a superset of its cases: eras of other persons match no case); `None` for
/// a design of one exposure. What [`add_other_exposures`] reads when the design's queries run
/// elsewhere (on a cluster): only the eras the cases can use travel to the task. The persons
/// are a join with the distinct outcome persons, not `IN (subquery)` (which a cluster plan
/// cannot carry).
pub fn other_exposures_sql(d: &SccsDesign) -> Option<String> {
    (d.exposures.len() > 1).then(|| {
        format!(
            "SELECT r.exposure_index, r.person_id, r.concept_id, r.start_day, r.end_day \
             FROM ({union}) AS r JOIN (SELECT DISTINCT o.person_id FROM ({outcome}) AS o) AS p \
             ON p.person_id = r.person_id",
            union = other_exposures_union(d),
            outcome = d.outcome.sql(Domain::ConditionOccurrence)
        )
    })
}

fn other_exposures_union(d: &SccsDesign) -> String {
    d.exposures[1..]
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "SELECT CAST({x} AS BIGINT) AS exposure_index, person_id, concept_id, start_day, end_day \
                 FROM ({sql}) AS r{x}",
                x = i + 1,
                sql = e.concept_set().sql(Domain::DrugEra)
            )
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}

/// Add to `cases` (the first exposure's case data, [`load_sccs`] or
/// [`super::sccs_parts::gathered`] of the design with only that exposure) the eras of the
/// other exposures from the whole result of [`other_exposures_sql`]: each era goes to every
/// kept case of its person, as the local join does; the shared case data of the design.
pub fn add_other_exposures(cases: &mut SccsCases, batches: &[RecordBatch]) -> DfResult<()> {
    let mut of_person: std::collections::HashMap<i64, Vec<usize>> = Default::default();
    for (c, k) in cases.kept.iter().enumerate() {
        of_person.entry(k.person_id).or_default().push(c);
    }
    for b in batches {
        for (person, era) in era_rows(b, "person_id", |p| p)? {
            for &c in of_person
                .get(&person)
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                cases.data[c].eras.push(era);
            }
        }
    }
    Ok(())
}

/// The eras of a batch of (`key`, `exposure_index`, `concept_id`, `start_day`, `end_day`)
/// rows with their keys (rows with a NULL key skipped); a NULL start or concept id is an error
/// naming the person (`person_of(key)`).
fn era_rows(
    b: &RecordBatch,
    key: &str,
    person_of: impl Fn(i64) -> i64,
) -> DfResult<Vec<(i64, Era)>> {
    let keys = i64_column(b, key)?;
    let exposure = i64_column(b, "exposure_index")?;
    let concept = i64_column(b, "concept_id")?;
    let (s, en) = (i64_column(b, "start_day")?, i64_column(b, "end_day")?);
    let mut out = Vec::with_capacity(b.num_rows());
    for i in 0..b.num_rows() {
        // A row without its key matches no case (as in the local build's SQL join).
        if keys.is_null(i) {
            continue;
        }
        let x = exposure.value(i) as usize;
        if s.is_null(i) || concept.is_null(i) {
            return exec_err!(
                "exposures[{x}]: person_id {} has an era with a NULL start date or concept id",
                person_of(keys.value(i))
            );
        }
        let start = s.value(i);
        let end = if en.is_null(i) { start } else { en.value(i) };
        out.push((
            keys.value(i),
            Era {
                exposure: x,
                concept_id: concept.value(i),
                start,
                end,
            },
        ));
    }
    Ok(out)
}

/// Every exposure's tables and case data from the shared case data of a many-pairs design
/// (see [`add_other_exposures`]), as [`build_sccs_each_exposure_with_cases`] returns them.
pub async fn each_exposure_of_shared(
    d: &SccsDesign,
    shared: SccsCases,
) -> DfResult<(Vec<StudyTables>, Vec<ExposureCases>)> {
    let shared = Arc::new(shared);
    let mut tables = Vec::with_capacity(d.exposures.len());
    let mut cases = Vec::with_capacity(d.exposures.len());
    for x in 0..d.exposures.len() {
        tables.push(exposure_tables(d, &shared, x).await?);
        cases.push(ExposureCases {
            cases: shared.clone(),
            exposure: x,
        });
    }
    Ok((tables, cases))
}

/// [`build_sccs_each_exposure_with_cases`] of a design with `restrict_time_to_exposure` from
/// each exposure's own study population and case data (`cases[x]`: [`load_sccs`] of
/// [`single_exposure_design`]`(d, x)`, or [`super::sccs_parts::gathered`] from that design's
/// distributed queries), in the order of `d.exposures`: the same tables and case data.
pub async fn each_exposure_of_own(
    d: &SccsDesign,
    cases: Vec<SccsCases>,
) -> DfResult<(Vec<StudyTables>, Vec<ExposureCases>)> {
    if cases.len() != d.exposures.len() {
        return exec_err!(
            "sccs: {} exposures, case data of {}",
            d.exposures.len(),
            cases.len()
        );
    }
    let mut tables = Vec::with_capacity(cases.len());
    let mut out = Vec::with_capacity(cases.len());
    for c in cases {
        let c = Arc::new(c);
        tables.push(super::sccs::tables_of_cases(c.clone()).await?);
        out.push(ExposureCases {
            cases: c,
            exposure: 0,
        });
    }
    Ok((tables, out))
}

/// The design of a many-pairs design's first exposure alone: the study population and case
/// data the others' eras are added to.
pub fn first_exposure_design(d: &SccsDesign) -> SccsDesign {
    SccsDesign {
        exposures: vec![d.exposures[0].clone()],
        ..d.clone()
    }
}

/// The tables of exposure `x` from the shared case data.
async fn exposure_tables(d: &SccsDesign, cases: &SccsCases, x: usize) -> DfResult<StudyTables> {
    let dx = single_exposure_design(d, x);
    let data: Vec<CaseData> = cases
        .data
        .iter()
        .map(|c| CaseData {
            eras: c
                .eras
                .iter()
                .filter(|e| e.exposure == x)
                .map(|e| Era { exposure: 0, ..*e })
                .collect(),
            events: c.events.clone(),
            ..*c
        })
        .collect();
    // The concept ids seen among the kept cases' eras, as `load_sccs` collects them.
    let concepts: BTreeSet<i64> = data
        .iter()
        .flat_map(|c| c.eras.iter().map(|e| e.concept_id))
        .collect();
    let (windows, mut refs) = window_covariates(&dx, &[concepts])?;
    let plan = interval_plan(&dx, windows, &data)?;
    refs.extend(fixed_refs(&dx, &plan));
    let meta: Vec<(i64, Option<i64>)> = cases
        .kept
        .iter()
        .map(|c| (c.person_id, c.observation_period_id))
        .collect();
    let (outcomes, covariates, informative) =
        datafusion::common::runtime::SpawnedTask::spawn_blocking(move || {
            intervals_to_batches(&plan, &data, &meta)
        })
        .join()
        .await
        .map_err(|e| exec_datafusion_err!("sccs interval task failed: {e}"))??;
    let mut attrition = cases.attrition.clone();
    attrition.push((
        "cases with more than one interval (informative)".into(),
        informative.0,
        informative.1,
        informative.2,
    ));
    refs.sort_by_key(|r| r.covariate_id);
    Ok(StudyTables {
        outcomes,
        covariates,
        covariate_ref: vec![covariate_ref_batch(&refs)?],
        attrition: vec![attrition_batch(&attrition)?],
    })
}

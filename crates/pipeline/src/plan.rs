//! From a checked pipeline file to analysis units: resolve the stores, expand each analysis'
//! concept-set lists into units (every combination), fill the SQL placeholders, fingerprint
//! each unit, and check everything against the OMOP store before any work starts (tables,
//! concepts, cohorts, every query planned).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use datafusion::arrow::array::Array;
use datafusion::prelude::SessionContext;

use super::spec::{self, ConceptSetSpec, DesignKind, PathSeg, PipelineFile, Source, ROLES};
use super::PipelineError;
use epifusion_core::model::ModelKind;

/// A CDM table that concept sets can draw records from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTable {
    /// Table name.
    pub table: &'static str,
    /// Concept-id column.
    pub concept: &'static str,
    /// Start-date column.
    pub start: &'static str,
    /// End-date column (NULL ends fall back to the start).
    pub end: &'static str,
    /// The `concept.domain_id` whose concepts default to this table.
    pub domain: Option<&'static str>,
}

/// Tables of [`EventTable`].
pub const EVENT_TABLES: &[EventTable] = &[
    EventTable {
        table: "drug_era",
        concept: "drug_concept_id",
        start: "drug_era_start_date",
        end: "drug_era_end_date",
        domain: Some("Drug"),
    },
    EventTable {
        table: "drug_exposure",
        concept: "drug_concept_id",
        start: "drug_exposure_start_date",
        end: "drug_exposure_end_date",
        domain: None,
    },
    EventTable {
        table: "condition_occurrence",
        concept: "condition_concept_id",
        start: "condition_start_date",
        end: "condition_end_date",
        domain: Some("Condition"),
    },
    EventTable {
        table: "condition_era",
        concept: "condition_concept_id",
        start: "condition_era_start_date",
        end: "condition_era_end_date",
        domain: None,
    },
    EventTable {
        table: "procedure_occurrence",
        concept: "procedure_concept_id",
        start: "procedure_date",
        end: "procedure_date",
        domain: Some("Procedure"),
    },
    EventTable {
        table: "measurement",
        concept: "measurement_concept_id",
        start: "measurement_date",
        end: "measurement_date",
        domain: Some("Measurement"),
    },
    EventTable {
        table: "observation",
        concept: "observation_concept_id",
        start: "observation_date",
        end: "observation_date",
        domain: Some("Observation"),
    },
    EventTable {
        table: "visit_occurrence",
        concept: "visit_concept_id",
        start: "visit_start_date",
        end: "visit_end_date",
        domain: Some("Visit"),
    },
    EventTable {
        table: "death",
        concept: "cause_concept_id",
        start: "death_date",
        end: "death_date",
        domain: None,
    },
];

/// The [`EventTable`] called `name`.
pub fn event_table(name: &str) -> Option<&'static EventTable> {
    EVENT_TABLES.iter().find(|t| t.table == name)
}

/// A value of the pipeline file with where it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Located<T> {
    /// The value.
    pub value: T,
    /// Its byte span in the file.
    pub span: Range<usize>,
    /// Its key, for messages (e.g. `analysis `a`: sql.outcomes`).
    pub key: String,
}

/// The queries of a `design = "sql"` unit, placeholders filled.
#[derive(Debug, Clone, PartialEq)]
pub struct SqlQueries {
    /// Statements run before the queries.
    pub setup: Option<Located<String>>,
    /// Outcome rows.
    pub outcomes: Located<String>,
    /// Covariates.
    pub covariates: Option<Located<String>>,
    /// Attrition.
    pub attrition: Option<Located<String>>,
    /// Covariate reference.
    pub covariate_ref: Option<Located<String>>,
}

impl SqlQueries {
    /// The queries that return tables, by name (`setup` excluded).
    pub fn tables(&self) -> Vec<(&'static str, &Located<String>)> {
        let mut v = vec![("outcomes", &self.outcomes)];
        for (n, q) in [
            ("covariates", &self.covariates),
            ("attrition", &self.attrition),
            ("covariate_ref", &self.covariate_ref),
        ] {
            if let Some(q) = q {
                v.push((n, q));
            }
        }
        v
    }
}

/// How a unit's study tables are built.
#[derive(Debug, Clone, PartialEq)]
pub enum Design {
    /// SQL queries.
    Sql(Box<SqlQueries>),
    /// `[analysis.sccs]` settings, for the study module's `SccsDesign`.
    Sccs(toml::Table),
    /// `[analysis.cohort]` settings, for the study module's `CohortDesign`.
    Cohort(toml::Table),
}

impl Design {
    /// The design's name.
    pub fn kind(&self) -> DesignKind {
        match self {
            Design::Sql(_) => DesignKind::Sql,
            Design::Sccs(_) => DesignKind::Sccs,
            Design::Cohort(_) => DesignKind::Cohort,
        }
    }
}

/// One analysis unit: an analysis with one concept set per role; one fit, one set of results.
#[derive(Debug, Clone)]
pub struct Analysis {
    /// Unique id, also its folder name: the analysis name, then the concept sets, `.`-joined.
    pub id: String,
    /// The `[[analysis]]` name.
    pub name: String,
    /// Free text.
    pub description: Option<String>,
    /// How the study tables are built.
    pub design: Design,
    /// Model.
    pub model: ModelKind,
    /// (role, concept-set name), in [`ROLES`] order.
    pub roles: Vec<(&'static str, String)>,
    /// The concept-set definitions used, by name.
    pub concept_sets: BTreeMap<String, ConceptSetSpec>,
    /// JSON options of the `*_fit` function.
    pub fit_options: serde_json::Value,
    /// Covariate ids for the forest plot (None: the unpenalized ones).
    pub report: Option<Vec<i64>>,
    /// Hash of everything the results depend on (see [`fingerprint`]).
    pub fingerprint: String,
    /// Where the analysis is written (its `name` value).
    pub span: Range<usize>,
    /// Position of its `[[analysis]]` table in the file (for locating keys).
    pub index: usize,
    /// SCCS: every exposure of the analysis, fitted one by one against this unit's outcome
    /// (one unit per outcome; see [`crate::many`]). Empty for every other unit.
    pub exposures: Vec<String>,
    /// SCCS and cohort: the unit's outcome is one of the analysis' `negative_controls`.
    pub negative_control: bool,
}

impl Analysis {
    /// The concept set bound to `role` (`exposure`, `target`, …).
    pub fn role(&self, role: &str) -> Option<&str> {
        self.roles
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, s)| s.as_str())
    }
}

/// A loaded, checked pipeline.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// The file.
    pub source: Source,
    /// The parsed file (spans for the store checks).
    pub file: PipelineFile,
    /// Name (report title).
    pub name: String,
    /// Description.
    pub description: Option<String>,
    /// Source store (folder or URL).
    pub omop: String,
    /// Output (folder or URL).
    pub output: String,
    /// Units, in file order.
    pub analyses: Vec<Analysis>,
}

/// Resolve a folder or URL given in the file: relative folders are relative to the file.
fn resolve_location(value: &str, base: &Path) -> String {
    if value.contains("://") {
        return value.to_string();
    }
    let p = PathBuf::from(value);
    let joined = if p.is_absolute() { p } else { base.join(p) };
    normalize(&joined).display().to_string()
}

/// `a/b/../c` → `a/c` without touching the file system (object-store paths reject `..`).
fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if matches!(out.components().next_back(), Some(Component::Normal(_))) {
                    out.pop();
                } else {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    if out.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        out
    }
}

/// Parse and check `path`; `omop` / `output` (from the command line) override the file's.
pub fn load(
    path: &Path,
    omop: Option<&str>,
    output: Option<&str>,
) -> Result<Pipeline, PipelineError> {
    load_source(Source::read(path)?, path, omop, output)
}

/// [`load`] of a file's text (`source`, named as read from `path`, relative to whose folder the
/// file's `omop` and `output` are resolved when not overridden).
pub fn load_source(
    source: Source,
    path: &Path,
    omop: Option<&str>,
    output: Option<&str>,
) -> Result<Pipeline, PipelineError> {
    let file = spec::parse(&source)?;
    spec::check(&file, &source)?;
    let base = path.parent().unwrap_or(Path::new("."));
    let omop = match (omop, &file.omop) {
        (Some(o), _) => {
            check_location(o).map_err(|message| PipelineError::Source {
                location: format!("`{o}` (--omop)"),
                message,
            })?;
            o.to_string()
        }
        (None, Some(o)) => {
            check_location(o.get_ref()).map_err(|m| source.error(o.span(), "omop", m))?;
            resolve_location(o.get_ref(), base)
        }
        (None, None) => {
            return Err(source.error(0..0, "omop", "no source store: set `omop` or give --omop"))
        }
    };
    // A local store by its absolute path: the fingerprints do not depend on the working folder.
    let omop = match std::fs::canonicalize(&omop) {
        Ok(abs) if !omop.contains("://") => abs.display().to_string(),
        _ => omop,
    };
    let output = match (output, &file.output) {
        (Some(o), _) => {
            check_location(o).map_err(|message| PipelineError::Output {
                location: format!("`{o}` (--output)"),
                message,
            })?;
            o.to_string()
        }
        (None, Some(o)) => {
            check_location(o.get_ref()).map_err(|m| source.error(o.span(), "output", m))?;
            resolve_location(o.get_ref(), base)
        }
        (None, None) => {
            return Err(source.error(
                0..0,
                "output",
                "no output location: set `output` or give --output",
            ))
        }
    };
    let name = file.name.as_ref().map_or_else(
        || {
            path.file_stem()
                .map_or("pipeline".into(), |s| s.to_string_lossy().into_owned())
        },
        |n| n.get_ref().clone(),
    );
    let mut analyses = Vec::new();
    for (index, a) in file.analyses.iter().enumerate() {
        analyses.extend(expand(index, a, &file, &source, &omop)?);
    }
    for a in &analyses {
        check_design(&source, a)?;
    }
    let mut seen = BTreeMap::new();
    for a in &analyses {
        if seen.insert(a.id.clone(), ()).is_some() {
            return Err(source.error(
                a.span.clone(),
                "analysis.name",
                format!("two analysis units have the id `{}`", a.id),
            ));
        }
    }
    Ok(Pipeline {
        description: file.description.clone(),
        source,
        file,
        name,
        omop,
        output,
        analyses,
    })
}

/// Every combination of the analysis' concept-set lists (target = comparator skipped).
fn expand(
    index: usize,
    a: &spec::AnalysisSpec,
    file: &PipelineFile,
    src: &Source,
    omop: &str,
) -> Result<Vec<Analysis>, PipelineError> {
    let model = spec::model_of(a, src)?;
    let fit_options = spec::fit_options_json(a, model, src)?;
    if *a.design.get_ref() == DesignKind::Sccs {
        return Ok(crate::many::expand_sccs(
            index,
            a,
            file,
            model,
            fit_options,
            omop,
        ));
    }
    let mut combos: Vec<Vec<(&'static str, String)>> = vec![Vec::new()];
    for ((_, role), list) in ROLES.iter().zip(a.role_lists()) {
        // A cohort analysis' negative controls are outcomes too (after those of interest).
        let list: Vec<&toml::Spanned<String>> = match *role {
            "outcome" => list.iter().chain(&a.negative_controls).collect(),
            _ => list.iter().collect(),
        };
        if list.is_empty() {
            continue;
        }
        combos = combos
            .into_iter()
            .flat_map(|c| {
                list.clone().into_iter().map(move |s| {
                    let mut c = c.clone();
                    c.push((*role, s.get_ref().clone()));
                    c
                })
            })
            .collect();
    }
    let name = a.name.get_ref();
    let mut units = Vec::new();
    for roles in combos {
        let get = |r: &str| roles.iter().find(|(k, _)| *k == r).map(|(_, v)| v);
        if get("target").is_some() && get("target") == get("comparator") {
            continue;
        }
        let negative_control = a
            .negative_controls
            .iter()
            .any(|n| Some(n.get_ref()) == get("outcome"));
        let id = std::iter::once(name.clone())
            .chain(roles.iter().map(|(_, s)| s.clone()))
            .collect::<Vec<_>>()
            .join(".");
        let design = match a.design.get_ref() {
            DesignKind::Sql => {
                let q = a.sql.as_ref().map(|s| s.get_ref()).ok_or_else(|| {
                    src.error(a.design.span(), "design", "missing [analysis.sql]")
                })?;
                let fill = |key: &str, s: &toml::Spanned<String>| {
                    fill_placeholders(s.get_ref(), &roles)
                        .map(|value| Located {
                            value,
                            span: s.span(),
                            key: format!("analysis `{name}`: sql.{key}"),
                        })
                        .map_err(|role| {
                            src.error(
                                s.span(),
                                format!("analysis `{name}`: sql.{key}"),
                                format!(
                                    "uses {{{role}}} but the analysis lists no {role} concept sets"
                                ),
                            )
                        })
                };
                let opt = |key: &str, s: &Option<toml::Spanned<String>>| {
                    s.as_ref().map(|s| fill(key, s)).transpose()
                };
                Design::Sql(Box::new(SqlQueries {
                    setup: opt("setup", &q.setup)?,
                    outcomes: fill("outcomes", &q.outcomes)?,
                    covariates: opt("covariates", &q.covariates)?,
                    attrition: opt("attrition", &q.attrition)?,
                    covariate_ref: opt("covariate_ref", &q.covariate_ref)?,
                }))
            }
            DesignKind::Sccs => Design::Sccs(
                a.sccs
                    .as_ref()
                    .map(|t| t.get_ref().clone())
                    .unwrap_or_default(),
            ),
            DesignKind::Cohort => Design::Cohort(
                a.cohort
                    .as_ref()
                    .map(|t| t.get_ref().clone())
                    .unwrap_or_default(),
            ),
        };
        let concept_sets: BTreeMap<String, ConceptSetSpec> = roles
            .iter()
            .map(|(_, s)| (s.clone(), file.concept_sets[s].get_ref().clone()))
            .collect();
        let fit_options = super::cohort_adjust::outcome_fit_options(&design, fit_options.clone());
        let mut unit = Analysis {
            id,
            name: name.clone(),
            description: a.description.clone(),
            design,
            model,
            roles,
            concept_sets,
            fit_options,
            report: a.report.clone(),
            fingerprint: String::new(),
            span: a.name.span(),
            index,
            exposures: Vec::new(),
            negative_control,
        };
        unit.fingerprint = fingerprint(&unit, omop);
        units.push(unit);
    }
    Ok(units)
}

/// A store location given by a person: not empty, a folder or a URL of a supported scheme.
fn check_location(location: &str) -> Result<(), String> {
    epifusion_sql::store::check_location(location)
}

/// A design-settings error: the path of the key at fault in the design's JSON settings, and
/// the message.
type SettingsError = (Vec<PathSeg>, String);

/// Deserialize design settings, keeping the path of the key at fault.
fn settings_from_json<T: serde::de::DeserializeOwned>(json: &str) -> Result<T, SettingsError> {
    let de = &mut serde_json::Deserializer::from_str(json);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e
            .path()
            .iter()
            .filter_map(|seg| match seg {
                serde_path_to_error::Segment::Seq { index } => Some(PathSeg::Index(*index)),
                serde_path_to_error::Segment::Map { key } => Some(PathSeg::Key(key.clone())),
                serde_path_to_error::Segment::Enum { variant } => {
                    Some(PathSeg::Key(variant.clone()))
                }
                serde_path_to_error::Segment::Unknown => None,
            })
            .collect();
        // serde_json's position is in the generated JSON, not in the pipeline file.
        let message = e.inner().to_string();
        let message = message
            .rsplit_once(" at line ")
            .map_or(message.as_str(), |(m, _)| m)
            .to_string();
        (path, message)
    })
}

/// The key path a design's `check()` message starts with (`exposures[0].risk_windows[1].end:
/// …`, `washout_days: …`, `risk_window_end: …`), by the study module's convention that
/// errors name the key first.
fn leading_key_path(message: &str) -> Vec<PathSeg> {
    let head: String = message
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']'))
        .collect();
    let mut path = Vec::new();
    for part in head.split('.').filter(|p| !p.is_empty()) {
        let mut pieces = part.split('[');
        if let Some(k) = pieces.next().filter(|k| !k.is_empty()) {
            path.push(PathSeg::key(k));
        }
        for idx in pieces {
            if let Ok(i) = idx.trim_end_matches(']').parse() {
                path.push(PathSeg::Index(i));
            }
        }
    }
    path
}

/// Where a key of the design's JSON settings comes from in the pipeline file: the design table
/// (`analysis[i].cohort.…`), or, for what the unit's concept sets and model fill in, the
/// analysis' role list or `model`. Returns (path in the file, label for messages).
fn file_path_of(a: &Analysis, t: &toml::Table, json_path: &[PathSeg]) -> (Vec<PathSeg>, String) {
    let table = a.design.kind().name();
    let mut base = vec![PathSeg::key("analysis"), PathSeg::Index(a.index)];
    let first = match json_path.first() {
        Some(PathSeg::Key(k)) => k.as_str(),
        _ => "",
    };
    let in_table = |rest: &[PathSeg]| {
        let mut p = base.clone();
        p.push(PathSeg::key(table));
        p.extend(rest.iter().cloned());
        let label = format!("{table}.{}", spec::path_label(rest));
        (p, label)
    };
    let role_list = |key: &str| {
        let mut p = base.clone();
        p.push(PathSeg::key(key));
        (p, key.to_string())
    };
    match (&a.design, first) {
        (Design::Sccs(_), "exposures") => match json_path.get(2) {
            Some(PathSeg::Key(k)) if super::tables::SCCS_EXPOSURE_KEYS.contains(&k.as_str()) => {
                in_table(&json_path[2..])
            }
            _ => role_list("exposures"),
        },
        (Design::Sccs(_), "outcome") => role_list("outcomes"),
        (Design::Cohort(_), "target") => role_list("targets"),
        (Design::Cohort(_), "comparator") => role_list("comparators"),
        (Design::Cohort(_), "outcome") => role_list("outcomes"),
        (Design::Cohort(_), "competing") if !t.contains_key("competing") => role_list("competing"),
        (Design::Cohort(_), "model") if !t.contains_key("model") => {
            base.push(PathSeg::key("model"));
            (base, "model".into())
        }
        _ => in_table(json_path),
    }
}

/// Check a unit's design settings (`[analysis.sccs]`, `[analysis.cohort]`) as the study module
/// will read them: unknown keys, types, and the values (negative durations, windows that end
/// before they start, …); errors name the key and the line it is written on.
pub fn check_design(src: &Source, a: &Analysis) -> Result<(), PipelineError> {
    use epifusion_sql::study::{CohortDesign, SccsDesign};
    // A unit of many exposures: each exposure's design as its single-pair unit reads it.
    for e in &a.exposures {
        check_design(src, &crate::many::pair(a, e))?;
    }
    if !a.exposures.is_empty() {
        return Ok(());
    }
    let (t, json) = match &a.design {
        Design::Sql(_) => return Ok(()),
        Design::Sccs(t) => (t, super::tables::sccs_settings(a, t)),
        Design::Cohort(t) => (t, super::tables::cohort_settings(a, t)),
    };
    let table = a.design.kind().name();
    let key = |label: &str| format!("analysis `{}`: {label}", a.name);
    if let Design::Cohort(t) = &a.design {
        // `[analysis.cohort.ps]` and `[analysis.cohort.adjustment]` (cohort_adjust.rs).
        if let Err((rest, message)) = super::cohort_adjust::settings(t) {
            let mut path = vec![
                PathSeg::key("analysis"),
                PathSeg::Index(a.index),
                PathSeg::key(table),
            ];
            path.extend(rest.iter().map(|k| PathSeg::key(k)));
            let span = src
                .locate(&path)
                .or_else(|| src.locate(&path[..3]))
                .unwrap_or(a.span.clone());
            return Err(src.error(span, key(&format!("cohort.{}", rest.join("."))), message));
        }
    }
    let table_span = || {
        let path = [
            PathSeg::key("analysis"),
            PathSeg::Index(a.index),
            PathSeg::key(table),
        ];
        src.locate(&path).unwrap_or(a.span.clone())
    };
    let json = json.map_err(|e| src.error(table_span(), key(table), df_message(&e)))?;
    // `check()` messages start with the key ("washout_days: days ≥ 0, got -3"): the key
    // moves to the error's key, the rest is the message.
    let keyed = |e: datafusion::error::DataFusionError| {
        let message = df_message(&e);
        let path = leading_key_path(&message);
        let head = spec::path_label(&path);
        let rest = message
            .strip_prefix(head.as_str())
            .and_then(|r| r.strip_prefix(':'))
            .map_or(message.as_str(), str::trim)
            .to_string();
        (path, rest)
    };
    let checked = match &a.design {
        Design::Sccs(_) => {
            settings_from_json::<SccsDesign>(&json).and_then(|d| d.check().map_err(keyed))
        }
        _ => settings_from_json::<CohortDesign>(&json).and_then(|d| d.check().map_err(keyed)),
    };
    let Err((json_path, message)) = checked else {
        return Ok(());
    };
    let (path, label) = file_path_of(a, t, &json_path);
    let span = src.locate(&path).unwrap_or_else(table_span);
    Err(src.error(span, key(&label), message))
}

/// Replace `{exposure}`, `{target}`, `{comparator}`, `{outcome}`, `{competing}` by the bound
/// concept-set view names; other braces are left alone. Err(role) for an unbound role.
pub fn fill_placeholders(sql: &str, roles: &[(&'static str, String)]) -> Result<String, String> {
    let mut out = sql.to_string();
    for (_, role) in ROLES {
        let pattern = format!("{{{role}}}");
        if !out.contains(&pattern) {
            continue;
        }
        match roles.iter().find(|(r, _)| r == role) {
            Some((_, set)) => out = out.replace(&pattern, set),
            None => return Err(role.to_string()),
        }
    }
    Ok(out)
}

/// FNV-1a, 64 bits: a stable hash for change detection (not for security).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Hash of what a unit's results depend on: epifusion's version, the source store, the design
/// (queries or settings), the model, the concept-set definitions, the fit options and the
/// report selection. A rerun recomputes a unit whose fingerprint changed.
pub fn fingerprint(a: &Analysis, omop: &str) -> String {
    let design = match &a.design {
        Design::Sql(q) => serde_json::json!({
            "setup": q.setup.as_ref().map(|l| &l.value),
            "outcomes": q.outcomes.value,
            "covariates": q.covariates.as_ref().map(|l| &l.value),
            "attrition": q.attrition.as_ref().map(|l| &l.value),
            "covariate_ref": q.covariate_ref.as_ref().map(|l| &l.value),
        }),
        Design::Sccs(t) | Design::Cohort(t) => {
            serde_json::to_value(t).unwrap_or(serde_json::Value::Null)
        }
    };
    let canonical = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "omop": omop,
        "design": a.design.kind().name(),
        "settings": design,
        "model": a.model.name(),
        "roles": a.roles,
        "concept_sets": a.concept_sets,
        "fit": a.fit_options,
        "report": a.report,
    });
    // Units of many exposures (SCCS) also depend on the exposure list and the outcome's role.
    let canonical = if a.exposures.is_empty() {
        canonical
    } else {
        let mut c = canonical;
        c["exposures"] = serde_json::json!(a.exposures);
        c["negative_control"] = serde_json::json!(a.negative_control);
        c
    };
    format!("{:016x}", fnv1a(canonical.to_string().as_bytes()))
}

/// The SQL of a concept-set view `(person_id, concept_id, start_date, end_date)`; `table` is
/// the resolved table for `concepts`.
pub fn concept_set_sql(c: &ConceptSetSpec, table: Option<&EventTable>) -> String {
    if let Some(sql) = &c.sql {
        return format!(
            "SELECT CAST(person_id AS BIGINT) AS person_id, CAST(start_date AS DATE) AS start_date, \
             CAST(end_date AS DATE) AS end_date FROM ({sql})"
        );
    }
    if let Some(id) = c.cohort {
        return format!(
            "SELECT subject_id AS person_id, cohort_definition_id AS concept_id, \
             cohort_start_date AS start_date, coalesce(cohort_end_date, cohort_start_date) AS end_date \
             FROM cohort WHERE cohort_definition_id = {id}"
        );
    }
    let t = table.unwrap_or(&EVENT_TABLES[0]);
    // With descendants, the concepts and their descendants as a set joined to the events (a
    // semi-join written as a join with a UNION, not `IN (subquery)`, which a cluster cannot
    // send: datafusion-proto has no subquery expressions).
    let (join, filter) = match &c.concepts {
        None => (String::new(), "TRUE".to_string()),
        Some(ids) => {
            let list = ids
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            if c.descendants {
                let values = ids
                    .iter()
                    .map(|id| format!("({id})"))
                    .collect::<Vec<_>>()
                    .join(", ");
                (
                    format!(
                        " JOIN (SELECT column1 AS matched_id FROM (VALUES {values}) UNION \
                         SELECT descendant_concept_id FROM concept_ancestor \
                         WHERE ancestor_concept_id IN ({list})) AS s ON e.{col} = s.matched_id",
                        col = t.concept
                    ),
                    "TRUE".to_string(),
                )
            } else {
                (String::new(), format!("e.{} IN ({list})", t.concept))
            }
        }
    };
    format!(
        "SELECT e.person_id, e.{concept} AS concept_id, e.{start} AS start_date, \
         coalesce(e.{end}, e.{start}) AS end_date FROM {table} e{join} WHERE {filter}",
        concept = t.concept,
        start = t.start,
        end = t.end,
        table = t.table,
    )
}

fn df_message(e: &datafusion::error::DataFusionError) -> String {
    e.to_string()
        .trim_start_matches("Error during planning: ")
        .trim_start_matches("Execution error: ")
        .to_string()
}

/// Check the pipeline against the OMOP store registered in `ctx` and create the concept-set
/// views: referenced tables exist, concept ids exist (and share a domain when the table is
/// inferred), cohorts have rows, every query plans. Nothing is written anywhere.
pub async fn check_store(ctx: &SessionContext, p: &Pipeline) -> Result<(), PipelineError> {
    let src = &p.source;
    let used: std::collections::BTreeSet<&str> = p
        .analyses
        .iter()
        .flat_map(|a| {
            a.roles
                .iter()
                .map(|(_, s)| s.as_str())
                .chain(a.exposures.iter().map(String::as_str))
        })
        .collect();
    for (name, set) in &p.file.concept_sets {
        if !used.contains(name.as_str()) {
            continue;
        }
        let span = set.span();
        let key = format!("concept_sets.{name}");
        let c = set.get_ref();
        let need = |table: &str, what: &str| -> Result<(), PipelineError> {
            if ctx.table_exist(table).unwrap_or(false) {
                Ok(())
            } else {
                Err(src.error(
                    span.clone(),
                    what,
                    format!("the OMOP store {} has no `{table}` table", p.omop),
                ))
            }
        };
        let mut table = c.table.as_deref().and_then(event_table);
        if let Some(ids) = &c.concepts {
            let at = src.key_span(&span, "concepts");
            let k = format!("{key}.concepts");
            need("concept", &k)?;
            if c.descendants {
                need("concept_ancestor", &format!("{key}.descendants"))?;
            }
            let list = ids
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let rows = ctx
                .sql(&format!(
                    "SELECT concept_id, domain_id FROM concept WHERE concept_id IN ({list})"
                ))
                .await
                .map_err(PipelineError::DataFusion)?
                .collect()
                .await
                .map_err(PipelineError::DataFusion)?;
            let mut found: BTreeMap<i64, String> = BTreeMap::new();
            for b in &rows {
                let ids = datafusion::arrow::compute::cast(
                    b.column(0),
                    &datafusion::arrow::datatypes::DataType::Int64,
                )
                .map_err(|e| PipelineError::DataFusion(e.into()))?;
                let ids = datafusion::arrow::array::AsArray::as_primitive::<
                    datafusion::arrow::datatypes::Int64Type,
                >(&ids)
                .clone();
                let dom = datafusion::arrow::compute::cast(
                    b.column(1),
                    &datafusion::arrow::datatypes::DataType::Utf8,
                )
                .map_err(|e| PipelineError::DataFusion(e.into()))?;
                let dom = datafusion::arrow::array::AsArray::as_string::<i32>(&dom).clone();
                for i in 0..b.num_rows() {
                    if !ids.is_null(i) {
                        found.insert(ids.value(i), dom.value(i).to_string());
                    }
                }
            }
            if let Some(missing) = ids.iter().find(|i| !found.contains_key(i)) {
                return Err(src.error(
                    at,
                    k,
                    format!("concept {missing} is not in the store's concept table"),
                ));
            }
            if table.is_none() {
                let domains: std::collections::BTreeSet<&str> =
                    found.values().map(String::as_str).collect();
                if domains.len() > 1 {
                    return Err(src.error(
                        at,
                        k,
                        format!(
                            "the concepts span the domains {}; set `table`",
                            domains.into_iter().collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
                let domain = domains.into_iter().next().unwrap_or_default();
                table = EVENT_TABLES.iter().find(|t| t.domain == Some(domain));
                if table.is_none() {
                    return Err(src.error(
                        at,
                        k,
                        format!("no default table for domain `{domain}`; set `table`"),
                    ));
                }
            }
        }
        if let Some(t) = table {
            need(t.table, &format!("{key}.table"))?;
        } else if c.table.as_deref() == Some("death") {
            need("death", &format!("{key}.table"))?;
            table = event_table("death");
        }
        if let Some(id) = c.cohort {
            need("cohort", &format!("{key}.cohort"))?;
            let rows = ctx
                .sql(&format!(
                    "SELECT 1 FROM cohort WHERE cohort_definition_id = {id} LIMIT 1"
                ))
                .await
                .map_err(PipelineError::DataFusion)?
                .count()
                .await
                .map_err(PipelineError::DataFusion)?;
            if rows == 0 {
                return Err(src.error(
                    src.key_span(&span, "cohort"),
                    format!("{key}.cohort"),
                    format!("cohort_definition_id {id} has no rows in the cohort table"),
                ));
            }
        }
        if let Some(user_sql) = &c.sql {
            // A concept set's query is a data source: refused unless read-only.
            epifusion_sql::planning::read_only_sql(ctx, user_sql)
                .await
                .map_err(|e| src.error(src.key_span(&span, "sql"), key.clone(), df_message(&e)))?;
        }
        let sql = concept_set_sql(c, table);
        let create = format!("CREATE OR REPLACE VIEW {name} AS {sql}");
        ctx.sql(&create).await.map_err(|e| {
            let at = if c.sql.is_some() {
                src.key_span(&span, "sql")
            } else {
                span.clone()
            };
            src.error(at, key.clone(), df_message(&e))
        })?;
    }
    for a in &p.analyses {
        if let Design::Sql(q) = &a.design {
            run_setup(ctx, q, src).await?;
            for (_, query) in q.tables() {
                epifusion_sql::planning::logical_plan(&ctx.state(), &query.value, &query.key)
                    .await
                    .map_err(|e| {
                        src.error(query.span.clone(), query.key.clone(), df_message(&e))
                    })?;
            }
        }
    }
    Ok(())
}

/// Run a unit's `setup` statements.
pub async fn run_setup(
    ctx: &SessionContext,
    q: &SqlQueries,
    src: &Source,
) -> Result<(), PipelineError> {
    if let Some(setup) = &q.setup {
        for stmt in epifusion_sql::shell::split_statements(&setup.value) {
            ctx.sql(&stmt)
                .await
                .map_err(|e| src.error(setup.span.clone(), setup.key.clone(), df_message(&e)))?
                .collect()
                .await
                .map_err(|e| src.error(setup.span.clone(), setup.key.clone(), df_message(&e)))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders() {
        let roles = vec![
            ("target", "cel".to_string()),
            ("outcome", "gib".to_string()),
        ];
        assert_eq!(
            fill_placeholders(
                "SELECT * FROM {target} JOIN {outcome} WHERE x = '{a}'",
                &roles
            )
            .unwrap(),
            "SELECT * FROM cel JOIN gib WHERE x = '{a}'"
        );
        assert_eq!(
            fill_placeholders("{comparator}", &roles).unwrap_err(),
            "comparator"
        );
    }

    #[test]
    fn locations_relative_to_the_file() {
        let base = Path::new("pipelines");
        assert_eq!(resolve_location("../data/gibleed", base), "data/gibleed");
        assert_eq!(resolve_location("s3://b/x", base), "s3://b/x");
        assert_eq!(resolve_location("/abs/x", base), "/abs/x");
        assert_eq!(resolve_location("../../x", base), "../x");
        assert_eq!(resolve_location("..", Path::new("")), "..");
    }

    const DESIGNS: &str = r#"name = "d"
[concept_sets.cel]
concepts = [1]
[concept_sets.dic]
concepts = [2]
[concept_sets.gib]
concepts = [3]

[[analysis]]
name = "cohort"
design = "cohort"
model = "cox"
targets = ["cel"]
comparators = ["dic"]
outcomes = ["gib"]
[analysis.cohort]
washout_days = 365
risk_window_start = 0
start_anchor = "cohort_start"
risk_window_end = 365
end_anchor = "cohort_start"
[analysis.cohort.covariates]
gender = false

[[analysis]]
name = "sccs"
design = "sccs"
exposures = ["cel"]
outcomes = ["gib"]
[analysis.sccs]
naive_period = 0
[[analysis.sccs.risk_windows]]
start = 0
end = 30
"#;

    /// `load` of `text` (the store is not opened), as an error string.
    fn load_text(tag: &str, text: &str) -> Result<Pipeline, String> {
        let dir = std::env::temp_dir().join(format!("epifusion-plan-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.toml");
        std::fs::write(&file, text).unwrap();
        let r = load(&file, Some("/no/store"), Some("/no/output")).map_err(|e| e.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    fn design_err(tag: &str, from: &str, to: &str) -> String {
        assert!(DESIGNS.contains(from), "{from}");
        match load_text(tag, &DESIGNS.replacen(from, to, 1)) {
            Ok(_) => panic!("no error for {to}"),
            Err(e) => e,
        }
    }

    #[test]
    fn cohort_negative_controls_are_outcome_units_marked_as_controls() {
        let text = DESIGNS
            .replacen(
                "[concept_sets.gib]\nconcepts = [3]\n",
                "[concept_sets.gib]\nconcepts = [3]\n[concept_sets.nc1]\nconcepts = [4]\n\
                 [concept_sets.nc2]\nconcepts = [5]\n",
                1,
            )
            .replacen(
                "outcomes = [\"gib\"]\n[analysis.cohort]",
                "outcomes = [\"gib\"]\nnegative_controls = [\"nc1\", \"nc2\"]\n[analysis.cohort]",
                1,
            );
        let p = load_text("cohort_nc", &text).unwrap();
        let units: Vec<(&str, bool)> = p
            .analyses
            .iter()
            .filter(|a| a.name == "cohort")
            .map(|a| (a.id.as_str(), a.negative_control))
            .collect();
        assert_eq!(
            units,
            [
                ("cohort.cel.dic.gib", false),
                ("cohort.cel.dic.nc1", true),
                ("cohort.cel.dic.nc2", true)
            ]
        );
        // A control that is also an outcome of interest is an error at its line.
        let e = load_text(
            "cohort_nc_twice",
            &text.replace(
                "negative_controls = [\"nc1\", \"nc2\"]",
                "negative_controls = [\"gib\"]",
            ),
        )
        .unwrap_err();
        assert!(e.contains("also an outcome"), "{e}");
    }

    #[test]
    fn ps_and_adjustment_settings_are_checked_at_the_line_of_their_key() {
        let with = |adj: &str| {
            DESIGNS.replacen(
                "[analysis.cohort.covariates]\ngender = false\n",
                &format!("[analysis.cohort.covariates]\ngender = false\n{adj}"),
                1,
            )
        };
        // Lines 24 on hold the tables added after `gender = false` (line 23).
        let ok = with("[analysis.cohort.ps]\n[analysis.cohort.adjustment]\nmethod = \"match\"\ncaliper = 0.1\n");
        let p = load_text("adj_ok", &ok).unwrap();
        // The outcome model of IPTW takes robust standard errors by default.
        let w = load_text(
            "adj_w",
            &with("[analysis.cohort.adjustment]\nmethod = \"weight\"\nestimator = \"overlap\"\n"),
        )
        .unwrap();
        assert_eq!(w.analyses[0].fit_options["se"], "robust");
        assert!(p.analyses[0].fit_options.get("se").is_none());
        let err = |tag: &str, adj: &str| match load_text(tag, &with(adj)) {
            Ok(_) => panic!("no error for {adj}"),
            Err(e) => e,
        };
        let e = err(
            "ps_key",
            "[analysis.cohort.ps]\ncv_folds = 10\ncv_repetitons = 1\n",
        );
        assert!(
            e.contains("p.toml:26:") && e.contains("cohort.ps.cv_repetitons"),
            "{e}"
        );
        let e = err("ps_val", "[analysis.cohort.ps]\ntolerance = -1\n");
        assert!(
            e.contains("p.toml:25:") && e.contains("cohort.ps.tolerance"),
            "{e}"
        );
        let e = err(
            "method",
            "[analysis.cohort.adjustment]\nmethod = \"macth\"\n",
        );
        assert!(e.contains("p.toml:25:") && e.contains("macth"), "{e}");
        let e = err("no_method", "[analysis.cohort.adjustment]\ncaliper = 0.2\n");
        assert!(
            e.contains("p.toml:24:") && e.contains("missing `method`"),
            "{e}"
        );
        let e = err(
            "other_method",
            "[analysis.cohort.adjustment]\nmethod = \"stratify\"\ncaliper = 0.2\n",
        );
        assert!(
            e.contains("p.toml:26:")
                && e.contains("cohort.adjustment.caliper")
                && e.contains("method = \"match\""),
            "{e}"
        );
        let e = err(
            "caliper",
            "[analysis.cohort.adjustment]\nmethod = \"match\"\ncaliper = -1\n",
        );
        assert!(e.contains("p.toml:26:") && e.contains("caliper"), "{e}");
        let e = err(
            "strata",
            "[analysis.cohort.adjustment]\nmethod = \"stratify\"\nnumber_of_strata = 0\n",
        );
        assert!(
            e.contains("p.toml:26:") && e.contains("number_of_strata"),
            "{e}"
        );
        let e = err(
            "trim",
            "[analysis.cohort.adjustment]\nmethod = \"none\"\ntrim_fraction = 2\n",
        );
        assert!(
            e.contains("p.toml:26:") && e.contains("trim_fraction"),
            "{e}"
        );
        let e = err(
            "est",
            "[analysis.cohort.adjustment]\nmethod = \"weight\"\nestimator = \"atx\"\n",
        );
        assert!(e.contains("p.toml:26:") && e.contains("estimator"), "{e}");
    }

    #[test]
    fn design_settings_are_checked_at_the_line_of_their_key() {
        load_text("ok", DESIGNS).unwrap();
        let e = design_err("washout", "washout_days = 365", "washout_days = -365");
        assert!(
            e.contains("p.toml:17:") && e.contains("cohort.washout_days") && e.contains("-365"),
            "{e}"
        );
        let e = design_err("rwe", "risk_window_end = 365", "risk_window_end = -5");
        assert!(
            e.contains("p.toml:20:") && e.contains("cohort.risk_window_end") && e.contains("-5"),
            "{e}"
        );
        // An unknown key in a nested design table: its own line and name.
        let e = design_err("gendr", "gender = false", "gendr = false");
        assert!(
            e.contains("p.toml:23:")
                && e.contains("cohort.covariates.gendr")
                && e.contains("unknown field `gendr`"),
            "{e}"
        );
        let e = design_err(
            "anchor",
            "start_anchor = \"cohort_start\"",
            "start_anchor = \"start\"",
        );
        assert!(
            e.contains("p.toml:19:") && e.contains("cohort.start_anchor"),
            "{e}"
        );
        // SCCS: the exposure keys at the top of the table, a window ending before its start.
        let e = design_err(
            "sccs_end",
            "end = 30",
            "end = -30\nend_anchor = \"era_start\"",
        );
        assert!(
            e.contains("p.toml:34:") && e.contains("sccs.risk_windows[0].end"),
            "{e}"
        );
        // Split risk windows: offsets ≥ 1, increasing, inside a fixed-length window.
        load_text(
            "split_ok",
            &DESIGNS.replacen("end = 30", "end = 30\nsplit_points = [15, 31]", 1),
        )
        .unwrap();
        for (tag, to, says) in [
            (
                "split_beyond",
                "end = 30\nend_anchor = \"era_start\"\nsplit_points = [15, 31]",
                "31 is beyond the window's length",
            ),
            ("split_zero", "end = 30\n\nsplit_points = [0, 15]", "got 0"),
            (
                "split_order",
                "end = 30\n\nsplit_points = [15, 10]",
                "strictly increasing",
            ),
        ] {
            let e = design_err(tag, "end = 30", to);
            assert!(
                e.contains("p.toml:36:")
                    && e.contains("sccs.risk_windows[0].split_points")
                    && e.contains(says),
                "{e}"
            );
        }
        let e = design_err("split_type", "end = 30", "end = 30\nsplit_points = 15");
        assert!(
            e.contains("p.toml:35:") && e.contains("sccs.risk_windows[0].split_points"),
            "{e}"
        );
        let e = design_err("sccs_unknown", "end = 30", "end = 30\nedn = 3");
        assert!(
            e.contains("p.toml:35:") && e.contains("sccs.risk_windows[0].edn"),
            "{e}"
        );
        let e = design_err("naive", "naive_period = 0", "naive_period = -1");
        assert!(
            e.contains("p.toml:31:") && e.contains("sccs.naive_period"),
            "{e}"
        );
        let e = design_err("sccs_key", "naive_period = 0", "naive_priod = 0");
        assert!(
            e.contains("p.toml:31:") && e.contains("sccs.naive_priod"),
            "{e}"
        );
    }

    #[test]
    fn locations_are_checked_when_loading() {
        for (from, to, want) in [
            (
                "name = \"d\"",
                "name = \"d\"\nomop = \"ftp://h/x\"",
                "p.toml:2:",
            ),
            (
                "name = \"d\"",
                "name = \"d\"\nomop = \"/s\"\noutput = \"\"",
                "p.toml:3:",
            ),
        ] {
            let text = DESIGNS.replacen(from, to, 1);
            let dir =
                std::env::temp_dir().join(format!("epifusion-plan-loc-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join("p.toml");
            std::fs::write(&file, text).unwrap();
            let e = load(&file, None, None).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
            let _ = std::fs::remove_dir_all(&dir);
        }
        let e = load_text_with("ftp://h/x", "/o").unwrap_err();
        assert!(e.contains("unsupported URL scheme `ftp://`"), "{e}");
        let e = load_text_with("", "/o").unwrap_err();
        assert!(e.contains("--omop") && e.contains("empty"), "{e}");
        let e = load_text_with("/s", "hdfs://nn/x").unwrap_err();
        assert!(
            e.contains("--output") && e.contains("unsupported URL scheme"),
            "{e}"
        );
    }

    fn load_text_with(omop: &str, output: &str) -> Result<Pipeline, String> {
        let dir = std::env::temp_dir().join(format!("epifusion-plan-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.toml");
        std::fs::write(&file, DESIGNS).unwrap();
        let r = load(&file, Some(omop), Some(output)).map_err(|e| e.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}

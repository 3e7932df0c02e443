//! The pipeline file: a TOML document, parsed with spans so that every error names the key and
//! the line. This module does the checks that need no data (syntax, unknown keys, types, names,
//! references between sections, fit and CV options); [`super::plan`] does the checks against
//! the OMOP store (tables, concepts, SQL).
//!
//! ```toml
//! name = "gibleed"                 # pipeline name (report title) [file stem]
//! omop = "../data/gibleed"         # source store: folder (relative to this file) or URL
//! output = "../results/gibleed"    # where results go: folder (relative to this file) or URL
//!
//! [concept_sets.celecoxib]         # an exposure / outcome definition, a view named `celecoxib`
//! concepts = [1118084]             # concept ids ...
//! descendants = true               # ... and their descendants (concept_ancestor) [false]
//! table = "drug_era"               # CDM table [by the concepts' domain]
//! # or: cohort = 3                 # rows of the cohort table with this cohort_definition_id
//! # or: sql = "SELECT person_id, start_date, end_date FROM ..."
//!
//! [[analysis]]
//! name = "new_user"
//! design = "sql"                   # sql | sccs | cohort
//! model = "cox"                    # sccs | cox | fine_gray | logistic | poisson | conditional_logistic
//! targets = ["celecoxib"]          # concept-set lists; every combination is one analysis unit
//! comparators = ["diclofenac"]
//! outcomes = ["gi_bleed"]
//! report = [1]                     # covariate ids shown in the forest plot [unpenalized ones]
//! [analysis.sql]                   # design = "sql": the study tables as queries
//! outcomes = "SELECT ... FROM {target} ..."
//! covariates = "..."
//! [analysis.fit]                   # options of the *_fit SQL functions
//! ci = "profile"
//! exclude = [1]
//! [analysis.cv]                    # cross-validation of the prior variance
//! folds = 10
//! ```

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::PipelineError;
use epifusion_core::model::ModelKind;

/// The text of a pipeline file, for locating errors.
#[derive(Debug, Clone)]
pub struct Source {
    /// File name as given.
    pub name: String,
    /// Contents.
    pub text: String,
}

impl Source {
    /// Read `path`.
    pub fn read(path: &Path) -> Result<Self, PipelineError> {
        let text = std::fs::read_to_string(path).map_err(|e| PipelineError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(Source {
            name: path.display().to_string(),
            text,
        })
    }

    /// 1-based line and column of byte `offset`.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let col = before
            .rsplit_once('\n')
            .map_or(before.chars().count(), |(_, l)| l.chars().count())
            + 1;
        (line, col)
    }

    /// The error "`key` at `span`: message".
    pub fn error(
        &self,
        span: Range<usize>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> PipelineError {
        let (line, column) = self.line_col(span.start);
        PipelineError::Invalid {
            file: self.name.clone(),
            line,
            column,
            key: key.into(),
            message: message.into(),
        }
    }

    /// Where `key = …` is written inside `within` (a table's span), for errors found in values
    /// kept as plain TOML; `within` itself when not found.
    pub fn key_span(&self, within: &Range<usize>, key: &str) -> Range<usize> {
        let len = self.text.len();
        let start = within.start.min(len);
        // A table's span may be its `[header]` only, or start at its first key: search from the
        // header (this one, or the one before the span) to the next header.
        let from = if self.text[start..].starts_with('[') {
            start
        } else {
            self.text[..start].rfind("\n[").map_or(0, |h| h + 1)
        };
        let next_header = self.text[(from + 1).min(len)..]
            .find("\n[")
            .map_or(len, |i| from + 1 + i);
        let end = within.end.min(len).max(next_header);
        let mut offset = from;
        for line in self.text[from..end].split_inclusive('\n') {
            let trimmed = line.trim_start();
            if let Some(rest) = trimmed.strip_prefix(key) {
                if rest.trim_start().starts_with('=') {
                    let at = offset + (line.len() - trimmed.len());
                    return at..at + key.len();
                }
            }
            offset += line.len();
        }
        start..start
    }
}

/// A step of a path into the TOML document (`analysis[0].cohort.washout_days` is
/// `[Key("analysis"), Index(0), Key("cohort"), Key("washout_days")]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSeg {
    /// A table key.
    Key(String),
    /// An array index (also of an array of tables, `[[…]]`).
    Index(usize),
}

impl PathSeg {
    /// A key step.
    pub fn key(k: &str) -> Self {
        PathSeg::Key(k.to_string())
    }
}

/// `a.b[0].c` for a path.
pub fn path_label(path: &[PathSeg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            PathSeg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            PathSeg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

impl Source {
    /// Where the value at `path` is written: the span of its key (of the element, for an array
    /// index). A path that goes further than the file (a key left at its default) gives the
    /// deepest part that is written; None when not even its first step is.
    pub fn locate(&self, path: &[PathSeg]) -> Option<Range<usize>> {
        use toml::de::{DeTable, DeValue};
        fn find<'a, 'i>(t: &'a DeTable<'i>, k: &str) -> Option<(Range<usize>, &'a DeValue<'i>)> {
            t.iter()
                .find(|(key, _)| key.get_ref().as_ref() == k)
                .map(|(key, v)| (key.span(), v.get_ref()))
        }
        let doc = DeTable::parse(&self.text).ok()?;
        let mut found = None;
        let mut current: Option<&DeValue<'_>> = None;
        for seg in path {
            let next = match (seg, current) {
                (PathSeg::Key(k), None) => find(doc.get_ref(), k),
                (PathSeg::Key(k), Some(DeValue::Table(t))) => find(t, k),
                (PathSeg::Index(i), Some(DeValue::Array(a))) => {
                    a.get(*i).map(|v| (v.span(), v.get_ref()))
                }
                _ => None,
            };
            let Some((span, value)) = next else { break };
            found = Some(span);
            current = Some(value);
        }
        found
    }
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineFile {
    /// The `database_id` of the OHDSI results tables (default: the store's
    /// `cdm_source.cdm_source_name`, else the store's folder name).
    pub database_id: Option<Spanned<String>>,
    /// Pipeline name (report title; default: the file stem).
    pub name: Option<Spanned<String>>,
    /// Free text shown in the report.
    pub description: Option<String>,
    /// Source OMOP store: a folder (relative to the pipeline file) or an object-store URL.
    pub omop: Option<Spanned<String>>,
    /// Output folder (relative to the pipeline file) or object-store URL.
    pub output: Option<Spanned<String>>,
    /// Exposure and outcome definitions by name.
    #[serde(default)]
    pub concept_sets: BTreeMap<String, Spanned<ConceptSetSpec>>,
    /// The analyses (`[[analysis]]`).
    #[serde(rename = "analysis", default)]
    pub analyses: Vec<AnalysisSpec>,
}

/// An exposure or outcome definition: concept ids (optionally with descendants) in a CDM
/// table, a cohort id, or a SQL query. It becomes a view `(person_id, concept_id, start_date,
/// end_date)` named after its key.
#[derive(Debug, Clone, Deserialize, PartialEq, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConceptSetSpec {
    /// Concept ids.
    pub concepts: Option<Vec<i64>>,
    /// Include the descendants of `concepts` (through `concept_ancestor`).
    #[serde(default)]
    pub descendants: bool,
    /// CDM table to take the records from (default: by the concepts' domain).
    pub table: Option<String>,
    /// A `cohort_definition_id` of the `cohort` table.
    pub cohort: Option<i64>,
    /// A query returning `person_id`, `start_date`, `end_date` (and optionally `concept_id`).
    pub sql: Option<String>,
}

/// Study designs.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DesignKind {
    /// The study tables given as SQL queries (`[analysis.sql]`).
    Sql,
    /// Self-controlled case series (`[analysis.sccs]`, DESIGN.md §3.1).
    Sccs,
    /// New-user cohort design for Cox / Fine–Gray (`[analysis.cohort]`, DESIGN.md §3.2).
    Cohort,
}

impl DesignKind {
    /// Lower-case name (also the name of the design's sub-table).
    pub fn name(self) -> &'static str {
        match self {
            DesignKind::Sql => "sql",
            DesignKind::Sccs => "sccs",
            DesignKind::Cohort => "cohort",
        }
    }
}

/// One `[[analysis]]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnalysisSpec {
    /// Unique name (letters, digits, `_`, `-`).
    pub name: Spanned<String>,
    /// Free text shown in the report.
    pub description: Option<String>,
    /// `sql`, `sccs` or `cohort`.
    pub design: Spanned<DesignKind>,
    /// Model (default: `sccs` for the SCCS design; required otherwise).
    pub model: Option<Spanned<String>>,
    /// Exposures (SCCS; `{exposure}` in SQL).
    #[serde(default)]
    pub exposures: Vec<Spanned<String>>,
    /// Target cohorts (cohort designs; `{target}` in SQL).
    #[serde(default)]
    pub targets: Vec<Spanned<String>>,
    /// Comparator cohorts (`{comparator}`).
    #[serde(default)]
    pub comparators: Vec<Spanned<String>>,
    /// Outcomes (`{outcome}`).
    #[serde(default)]
    pub outcomes: Vec<Spanned<String>>,
    /// Competing events (Fine–Gray; `{competing}`).
    #[serde(default)]
    pub competing: Vec<Spanned<String>>,
    /// Negative-control outcomes (SCCS): concept sets of outcomes believed not caused by any
    /// exposure (true RR = 1); each is one more outcome unit, and their estimates calibrate the
    /// estimates of `outcomes` (see `crate::sccs_results`).
    #[serde(default)]
    pub negative_controls: Vec<Spanned<String>>,
    /// Covariate ids shown in the forest plot (default: every unpenalized coefficient).
    pub report: Option<Vec<i64>>,
    /// `design = "sql"`: the study tables as queries.
    pub sql: Option<Spanned<SqlDesignSpec>>,
    /// `design = "sccs"`: the SCCS settings (deserialized into the study module's design).
    pub sccs: Option<Spanned<toml::Table>>,
    /// `design = "cohort"`: the cohort settings (deserialized into the study module's design).
    pub cohort: Option<Spanned<toml::Table>>,
    /// Fit options (the JSON options of the `*_fit` SQL functions, as TOML).
    pub fit: Option<Spanned<toml::Table>>,
    /// Cross-validation of the prior variance: the `cv` fit option's keys, as TOML.
    pub cv: Option<Spanned<toml::Table>>,
}

/// `[analysis.sql]`: the study tables as SQL over the OMOP views and the concept-set views.
/// `{exposure}`, `{target}`, `{comparator}`, `{outcome}` and `{competing}` are replaced by the
/// unit's concept-set view names.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlDesignSpec {
    /// Statements run first (`;`-separated; e.g. `CREATE OR REPLACE VIEW`).
    pub setup: Option<Spanned<String>>,
    /// Outcome rows: `row_id`, [`stratum_id`], `time`, `y`, … (DESIGN.md §4).
    pub outcomes: Spanned<String>,
    /// Covariates: `row_id`, `covariate_id`, [`covariate_value`].
    pub covariates: Option<Spanned<String>>,
    /// Attrition: any columns, one row per step (e.g. `step`, `description`, `subjects`).
    pub attrition: Option<Spanned<String>>,
    /// Covariate reference: `covariate_id`, `covariate_name`.
    pub covariate_ref: Option<Spanned<String>>,
}

/// Parse the TOML text: syntax, unknown keys and types (errors carry the line and column).
pub fn parse(source: &Source) -> Result<PipelineFile, PipelineError> {
    toml::from_str(&source.text).map_err(|e| {
        let (line, column) = e.span().map_or((0, 0), |s| source.line_col(s.start));
        let mut message = e.message().trim().to_string();
        // Type errors point at the value: name the key written on that line.
        if let Some(key) = source
            .text
            .lines()
            .nth(line.saturating_sub(1))
            .and_then(|l| l.split_once('='))
            .map(|(k, _)| k.trim())
            .filter(|k| !k.is_empty() && !k.starts_with('[') && !message.contains(*k))
        {
            message = format!("`{key}`: {message}");
        }
        PipelineError::Parse {
            file: source.name.clone(),
            line,
            column,
            message,
        }
    })
}

/// Concept-set roles, in the order they appear in unit ids: (key of the analysis list,
/// SQL placeholder).
pub const ROLES: &[(&str, &str)] = &[
    ("exposures", "exposure"),
    ("targets", "target"),
    ("comparators", "comparator"),
    ("outcomes", "outcome"),
    ("competing", "competing"),
];

impl AnalysisSpec {
    /// The concept-set lists by role key (see [`ROLES`]).
    pub fn role_lists(&self) -> [&[Spanned<String>]; 5] {
        [
            &self.exposures,
            &self.targets,
            &self.comparators,
            &self.outcomes,
            &self.competing,
        ]
    }
}

/// A name usable as a SQL identifier and in object paths.
pub fn is_identifier(s: &str) -> bool {
    let mut ch = s.chars();
    matches!(ch.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && ch.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// An analysis name: letters, digits, `_` and `-`.
pub fn is_analysis_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Checks that need no data: names, references, design sub-tables, model and fit options.
pub fn check(file: &PipelineFile, src: &Source) -> Result<(), PipelineError> {
    if file.analyses.is_empty() {
        return Err(src.error(0..0, "analysis", "the pipeline has no [[analysis]] table"));
    }
    for (name, set) in &file.concept_sets {
        let span = set.span();
        let key = format!("concept_sets.{name}");
        if !is_identifier(name) {
            return Err(src.error(
                span,
                key,
                "concept-set names are lower-case identifiers (a-z, 0-9, _)",
            ));
        }
        if epifusion_sql::omop::CDM_TABLES
            .iter()
            .any(|(t, _)| *t == name.as_str())
        {
            return Err(src.error(span, key, format!("`{name}` is a CDM table name")));
        }
        let c = set.get_ref();
        let given = [c.concepts.is_some(), c.cohort.is_some(), c.sql.is_some()];
        let n_given = given.iter().filter(|&&g| g).count();
        let table_only = c.table.as_deref() == Some("death");
        if n_given != 1 && !(n_given == 0 && table_only) {
            return Err(src.error(
                span,
                key,
                "give exactly one of `concepts`, `cohort` or `sql`",
            ));
        }
        if c.concepts.as_ref().is_some_and(|v| v.is_empty()) {
            return Err(src.error(
                src.key_span(&span, "concepts"),
                format!("{key}.concepts"),
                "is empty",
            ));
        }
        if (c.cohort.is_some() || c.sql.is_some()) && (c.table.is_some() || c.descendants) {
            return Err(src.error(
                span,
                key,
                "`table` and `descendants` apply to `concepts` only",
            ));
        }
        if let Some(t) = &c.table {
            if super::plan::event_table(t).is_none() {
                return Err(src.error(
                    src.key_span(&span, "table"),
                    format!("{key}.table"),
                    format!(
                        "unknown table `{t}`; expected one of {}",
                        super::plan::EVENT_TABLES
                            .iter()
                            .map(|t| t.table)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
    }
    let mut names = BTreeMap::new();
    for a in &file.analyses {
        let name = a.name.get_ref();
        if !is_analysis_name(name) {
            return Err(src.error(
                a.name.span(),
                "analysis.name",
                "use letters, digits, `_` and `-` (at most 100)",
            ));
        }
        if let Some(prev) = names.insert(name.clone(), a.name.span()) {
            let (line, _) = src.line_col(prev.start);
            return Err(src.error(
                a.name.span(),
                "analysis.name",
                format!("`{name}` is already the name of the analysis on line {line}"),
            ));
        }
        check_analysis(a, file, src)?;
    }
    Ok(())
}

fn check_analysis(
    a: &AnalysisSpec,
    file: &PipelineFile,
    src: &Source,
) -> Result<(), PipelineError> {
    let name = a.name.get_ref();
    let at = |key: &str| format!("analysis `{name}`: {key}");
    let design = *a.design.get_ref();
    // Exactly the design's own sub-table.
    let tables = [
        (DesignKind::Sql, a.sql.as_ref().map(|s| s.span())),
        (DesignKind::Sccs, a.sccs.as_ref().map(|s| s.span())),
        (DesignKind::Cohort, a.cohort.as_ref().map(|s| s.span())),
    ];
    for (kind, span) in tables {
        match (kind == design, span) {
            (true, None) => {
                return Err(src.error(
                    a.design.span(),
                    at("design"),
                    format!(
                        "design `{}` needs an [analysis.{}] table",
                        design.name(),
                        design.name()
                    ),
                ))
            }
            (false, Some(span)) => {
                return Err(src.error(
                    span,
                    at(kind.name()),
                    format!(
                        "[analysis.{}] given but design is `{}`",
                        kind.name(),
                        design.name()
                    ),
                ))
            }
            _ => {}
        }
    }
    // Model.
    let model = model_of(a, src)?;
    match (design, model) {
        (DesignKind::Sccs, ModelKind::ConditionalPoisson)
        | (DesignKind::Cohort, ModelKind::Cox | ModelKind::FineGray)
        | (DesignKind::Sql, _) => {}
        (d, m) => {
            return Err(src.error(
                a.model.as_ref().map_or(a.design.span(), |m| m.span()),
                at("model"),
                format!(
                    "model `{}` does not go with design `{}`",
                    m.name(),
                    d.name()
                ),
            ))
        }
    }
    // Concept-set references.
    for ((key, _), list) in ROLES.iter().zip(a.role_lists()) {
        for r in list {
            if !file.concept_sets.contains_key(r.get_ref()) {
                return Err(src.error(
                    r.span(),
                    at(key),
                    format!(
                        "no concept set `{}` (define it as [concept_sets.{}])",
                        r.get_ref(),
                        r.get_ref()
                    ),
                ));
            }
        }
    }
    crate::many::check_negative_controls(a, file, src)?;
    if model == ModelKind::FineGray && design == DesignKind::Cohort && a.competing.is_empty() {
        return Err(src.error(
            a.name.span(),
            at("competing"),
            "a Fine–Gray cohort analysis needs `competing` events",
        ));
    }
    // Fit and CV options: the same checks as the SQL functions' JSON options.
    fit_options_json(a, model, src)?;
    Ok(())
}

/// The analysis' model.
pub fn model_of(a: &AnalysisSpec, src: &Source) -> Result<ModelKind, PipelineError> {
    let name = a.name.get_ref();
    match (&a.model, a.design.get_ref()) {
        (Some(m), _) => ModelKind::parse(m.get_ref()).map_err(|e| {
            src.error(
                m.span(),
                format!("analysis `{name}`: model"),
                strip_option(&e),
            )
        }),
        (None, DesignKind::Sccs) => Ok(ModelKind::ConditionalPoisson),
        (None, _) => Err(src.error(
            a.name.span(),
            format!("analysis `{name}`: model"),
            "missing `model` (sccs, cox, fine_gray, logistic, poisson, conditional_logistic)",
        )),
    }
}

fn strip_option(e: &epifusion_core::Error) -> String {
    match e {
        epifusion_core::Error::BadOption { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// The JSON options object for the `*_fit` function: `[analysis.fit]` with `[analysis.cv]` as
/// its `"cv"` member, checked once by [`epifusion_sql::options::parse_fit_options`] (the
/// options model of `epifusion_core::options`); errors name the key and its line.
pub fn fit_options_json(
    a: &AnalysisSpec,
    model: ModelKind,
    src: &Source,
) -> Result<serde_json::Value, PipelineError> {
    let name = a.name.get_ref();
    let mut map = serde_json::Map::new();
    let to_json = |table: &Spanned<toml::Table>, prefix: &str| {
        table
            .get_ref()
            .iter()
            .map(|(k, v)| {
                serde_json::to_value(v)
                    .map(|v| (k.clone(), v))
                    .map_err(|e| {
                        src.error(
                            src.key_span(&table.span(), k),
                            format!("analysis `{name}`: {prefix}{k}"),
                            e.to_string(),
                        )
                    })
            })
            .collect::<Result<serde_json::Map<_, _>, _>>()
    };
    if let Some(fit) = &a.fit {
        if fit.get_ref().contains_key("cv") && a.cv.is_some() {
            return Err(src.error(
                src.key_span(&fit.span(), "cv"),
                format!("analysis `{name}`: fit.cv"),
                "give cross-validation either as `fit.cv` or as `[analysis.cv]`, not both",
            ));
        }
        map = to_json(fit, "fit.")?;
    }
    if let Some(cv) = &a.cv {
        map.insert("cv".into(), serde_json::Value::Object(to_json(cv, "cv.")?));
    }
    let json = serde_json::Value::Object(map);
    if let Err(e) = epifusion_sql::options::parse_fit_options(model, &json.to_string()) {
        let key = match &e {
            epifusion_core::Error::BadOption { option, .. } => option.clone(),
            _ => String::new(),
        };
        // `cv.folds` is written as `folds` under `[analysis.cv]` (or inside `fit.cv`).
        let (table, label, written) = match (key.strip_prefix("cv."), &a.cv) {
            (Some(rest), Some(cv)) => (cv, format!("cv.{rest}"), rest.to_string()),
            (None, Some(cv)) if key == "cv" => (cv, "cv".to_string(), String::new()),
            _ => match &a.fit {
                Some(fit) => (fit, format!("fit.{key}"), key.clone()),
                None => {
                    return Err(src.error(
                        0..0,
                        format!("analysis `{name}`: {key}"),
                        strip_option(&e),
                    ))
                }
            },
        };
        let leaf = written.rsplit('.').next().unwrap_or_default().to_string();
        let span = if leaf.is_empty() {
            table.span()
        } else {
            src.key_span(&table.span(), &leaf)
        };
        return Err(src.error(
            span,
            format!("analysis `{name}`: {label}"),
            strip_option(&e),
        ));
    }
    Ok(json)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(text: &str) -> Source {
        Source {
            name: "p.toml".into(),
            text: text.into(),
        }
    }

    const OK: &str = r#"
name = "t"
[concept_sets.drug]
concepts = [1]
[concept_sets.event]
concepts = [2]
descendants = true

[[analysis]]
name = "a"
design = "sql"
model = "cox"
targets = ["drug"]
outcomes = ["event"]
[analysis.sql]
outcomes = "SELECT 1 AS row_id, 1.0 AS time, 1 AS y"
[analysis.fit]
ci = "wald"
"#;

    fn err(text: &str) -> String {
        let s = src(text);
        match parse(&s).and_then(|f| check(&f, &s)) {
            Ok(()) => panic!("no error for:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_valid_file_passes() {
        let s = src(OK);
        let f = parse(&s).unwrap();
        check(&f, &s).unwrap();
        assert_eq!(f.analyses.len(), 1);
        assert_eq!(*f.analyses[0].design.get_ref(), DesignKind::Sql);
    }

    #[test]
    fn unknown_keys_and_types_name_key_and_line() {
        let e = err(&OK.replace("model = \"cox\"", "model = \"cox\"\nmodle = 1"));
        assert!(e.contains("p.toml:13:") && e.contains("modle"), "{e}");
        let e = err(&OK.replace("descendants = true", "descendants = \"yes\""));
        assert!(e.contains("p.toml:7:") && e.contains("bool"), "{e}");
        let e = err(&OK.replace("design = \"sql\"", "design = \"case_control\""));
        assert!(
            e.contains("p.toml:11:") && e.contains("case_control"),
            "{e}"
        );
    }

    #[test]
    fn semantic_errors_name_key_and_line() {
        let e = err(&OK.replace("outcomes = [\"event\"]", "outcomes = [\"evnt\"]"));
        assert!(e.contains("p.toml:14:") && e.contains("evnt"), "{e}");
        let e = err(&OK.replace("ci = \"wald\"", "ci = \"wald\"\nvarience = 2"));
        assert!(e.contains("p.toml:19:") && e.contains("varience"), "{e}");
        let e = err(&OK.replace("ci = \"wald\"", "ci = \"maybe\""));
        assert!(e.contains("p.toml:18:") && e.contains("fit.ci"), "{e}");
        let e = err(&OK.replace("model = \"cox\"", "model = \"coxx\""));
        assert!(e.contains("p.toml:12:") && e.contains("coxx"), "{e}");
        let e = err(&OK.replace("[analysis.sql]", "[analysis.sccs]\n[analysis.sql]"));
        assert!(e.contains("sccs"), "{e}");
        let e = err(&OK.replace(
            "[concept_sets.drug]\nconcepts = [1]",
            "[concept_sets.drug]\ncohort = 1\nconcepts = [1]",
        ));
        assert!(e.contains("p.toml:3:") && e.contains("exactly one"), "{e}");
        let e = err(&format!("{OK}\n[[analysis]]\nname = \"a\"\ndesign = \"sql\"\nmodel = \"cox\"\n[analysis.sql]\noutcomes = \"x\"\n"));
        assert!(e.contains("p.toml:21:") && e.contains("line 10"), "{e}");
        let e = err(&format!("{OK}[analysis.cv]\nfolds = 1\n"));
        assert!(e.contains("p.toml:20:") && e.contains("cv.folds"), "{e}");
        // `threads` is a fit option, not a CV one: rejected here, never at fit time.
        let e = err(&format!("{OK}[analysis.cv]\nfolds = 5\nthreads = 2\n"));
        assert!(e.contains("p.toml:21:") && e.contains("cv.threads"), "{e}");
        let e = err(&format!("{OK}[analysis.cv]\nfolds = 5\nsearch = \"grd\"\n"));
        assert!(e.contains("p.toml:21:") && e.contains("cv.search"), "{e}");
    }

    #[test]
    fn the_example_pipelines_parse_and_check() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../pipelines");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("toml") {
                continue;
            }
            let s = Source::read(&path).unwrap();
            let f = parse(&s).unwrap_or_else(|e| panic!("{e}"));
            if let Err(e) = check(&f, &s) {
                panic!("{e}");
            }
            n += 1;
        }
        assert!(n >= 3);
    }

    #[test]
    fn paths_are_located_at_their_key() {
        let s = src("name = \"t\"\n[[analysis]]\nname = \"a\"\n[analysis.cohort]\nwashout_days = 3\n[analysis.cohort.covariates]\ngendr = true\n[[analysis]]\nname = \"b\"\n[[analysis.sccs.risk_windows]]\nend = 1\n[[analysis.sccs.risk_windows]]\nstart = 2\n");
        let line = |path: &[PathSeg]| s.locate(path).map(|r| s.line_col(r.start).0);
        let k = PathSeg::key;
        use PathSeg::Index;
        assert_eq!(
            line(&[k("analysis"), Index(0), k("cohort"), k("washout_days")]),
            Some(5)
        );
        assert_eq!(
            line(&[
                k("analysis"),
                Index(0),
                k("cohort"),
                k("covariates"),
                k("gendr")
            ]),
            Some(7)
        );
        assert_eq!(
            line(&[
                k("analysis"),
                Index(1),
                k("sccs"),
                k("risk_windows"),
                Index(1),
                k("start")
            ]),
            Some(13)
        );
        // A key left at its default: the deepest written part.
        assert_eq!(
            line(&[
                k("analysis"),
                Index(1),
                k("sccs"),
                k("risk_windows"),
                Index(0),
                k("start")
            ]),
            line(&[
                k("analysis"),
                Index(1),
                k("sccs"),
                k("risk_windows"),
                Index(0)
            ])
        );
        assert_eq!(line(&[k("nothing")]), None);
        assert_eq!(
            path_label(&[k("sccs"), k("risk_windows"), Index(0), k("end")]),
            "sccs.risk_windows[0].end"
        );
    }

    #[test]
    fn line_and_column() {
        let s = src("a\nbc\n");
        assert_eq!(s.line_col(0), (1, 1));
        assert_eq!(s.line_col(3), (2, 2));
    }
}

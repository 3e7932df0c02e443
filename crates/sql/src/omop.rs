//! OMOP-CDM stores: register every CDM table found in a folder or object-store prefix.
//!
//! Each file `<table>.parquet` or `<table>.csv` (any case; Parquet preferred when both exist)
//! is registered as `__raw_<table>` and exposed through a view `<table>` that applies the
//! DESIGN.md §2 types by column name:
//!
//! | column | type |
//! |---|---|
//! | `*_id` (ids and concept ids), `year_of_birth`, `month_of_birth`, `day_of_birth`, counts, `days_supply`, `refills` | `BIGINT` (Int64; MIMIC ids are negative 64-bit hashes) |
//! | `*_date` | `DATE` (Date32) |
//! | `*_datetime` | `TIMESTAMP` |
//! | `quantity`, `value_as_number`, `range_low`, `range_high` | `DOUBLE` |
//! | anything else | as read |
//!
//! Standard columns that a table lacks (optional columns, CDM v5.3 vs v5.4 differences) are
//! added as typed NULLs, so queries written for either version run.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{exec_datafusion_err, plan_err, Result as DfResult};
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionContext};
use futures::TryStreamExt;

/// CDM tables epifusion knows, with the standard columns added as NULL when missing.
pub const CDM_TABLES: &[(&str, &[&str])] = &[
    (
        "person",
        &[
            "person_id",
            "gender_concept_id",
            "year_of_birth",
            "month_of_birth",
            "day_of_birth",
            "birth_datetime",
            "race_concept_id",
            "ethnicity_concept_id",
        ],
    ),
    (
        "observation_period",
        &[
            "observation_period_id",
            "person_id",
            "observation_period_start_date",
            "observation_period_end_date",
            "period_type_concept_id",
        ],
    ),
    (
        "drug_exposure",
        &[
            "drug_exposure_id",
            "person_id",
            "drug_concept_id",
            "drug_exposure_start_date",
            "drug_exposure_end_date",
            "drug_type_concept_id",
            "days_supply",
            "quantity",
            "visit_occurrence_id",
        ],
    ),
    (
        "drug_era",
        &[
            "drug_era_id",
            "person_id",
            "drug_concept_id",
            "drug_era_start_date",
            "drug_era_end_date",
            "drug_exposure_count",
            "gap_days",
        ],
    ),
    (
        "condition_occurrence",
        &[
            "condition_occurrence_id",
            "person_id",
            "condition_concept_id",
            "condition_start_date",
            "condition_end_date",
            "condition_type_concept_id",
            "visit_occurrence_id",
        ],
    ),
    (
        "condition_era",
        &[
            "condition_era_id",
            "person_id",
            "condition_concept_id",
            "condition_era_start_date",
            "condition_era_end_date",
            "condition_occurrence_count",
        ],
    ),
    (
        "death",
        &[
            "person_id",
            "death_date",
            "death_type_concept_id",
            "cause_concept_id",
        ],
    ),
    (
        "visit_occurrence",
        &[
            "visit_occurrence_id",
            "person_id",
            "visit_concept_id",
            "visit_start_date",
            "visit_end_date",
        ],
    ),
    (
        "procedure_occurrence",
        &[
            "procedure_occurrence_id",
            "person_id",
            "procedure_concept_id",
            "procedure_date",
        ],
    ),
    (
        "measurement",
        &[
            "measurement_id",
            "person_id",
            "measurement_concept_id",
            "measurement_date",
            "value_as_number",
            "unit_concept_id",
        ],
    ),
    (
        "observation",
        &[
            "observation_id",
            "person_id",
            "observation_concept_id",
            "observation_date",
        ],
    ),
    (
        "concept",
        &[
            "concept_id",
            "concept_name",
            "domain_id",
            "vocabulary_id",
            "concept_class_id",
            "standard_concept",
            "concept_code",
        ],
    ),
    (
        "concept_ancestor",
        &[
            "ancestor_concept_id",
            "descendant_concept_id",
            "min_levels_of_separation",
            "max_levels_of_separation",
        ],
    ),
    (
        "concept_relationship",
        &["concept_id_1", "concept_id_2", "relationship_id"],
    ),
    (
        "cohort",
        &[
            "cohort_definition_id",
            "subject_id",
            "cohort_start_date",
            "cohort_end_date",
        ],
    ),
    ("visit_detail", &[]),
    ("device_exposure", &[]),
    ("specimen", &[]),
    ("dose_era", &[]),
    ("cdm_source", &[]),
    ("vocabulary", &[]),
    ("domain", &[]),
    ("relationship", &[]),
    ("concept_synonym", &[]),
    ("location", &[]),
    ("care_site", &[]),
    ("provider", &[]),
    ("payer_plan_period", &[]),
    ("cost", &[]),
    ("note", &[]),
    ("episode", &[]),
];

/// The SQL type a CDM column gets, by name (None: keep the type read).
pub fn column_type(name: &str) -> Option<&'static str> {
    let n = name.to_ascii_lowercase();
    if n.ends_with("_datetime") {
        Some("TIMESTAMP")
    } else if n.ends_with("_date") {
        Some("DATE")
    } else if n.ends_with("_id")
        || n.starts_with("concept_id_")
        || matches!(
            n.as_str(),
            "year_of_birth"
                | "month_of_birth"
                | "day_of_birth"
                | "days_supply"
                | "refills"
                | "drug_exposure_count"
                | "condition_occurrence_count"
                | "gap_days"
                | "min_levels_of_separation"
                | "max_levels_of_separation"
                | "quantity_int"
        )
    {
        // `domain_id`, `vocabulary_id`, `concept_class_id`, `relationship_id` are text codes.
        if matches!(
            n.as_str(),
            "domain_id"
                | "vocabulary_id"
                | "concept_class_id"
                | "relationship_id"
                | "vocabulary_version"
        ) {
            None
        } else {
            Some("BIGINT")
        }
    } else if matches!(
        n.as_str(),
        "quantity" | "value_as_number" | "range_low" | "range_high"
    ) {
        Some("DOUBLE")
    } else {
        None
    }
}

/// One table found in a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundTable {
    /// CDM table name (lower case).
    pub name: String,
    /// File URL.
    pub url: String,
    /// `parquet` or `csv`.
    pub format: String,
    /// The file's extension as written (e.g. `.CSV`; the readers match it exactly).
    pub extension: String,
}

/// List the CDM tables in `location` (a local folder or an object-store URL).
pub async fn discover(ctx: &SessionContext, location: &str) -> DfResult<Vec<FoundTable>> {
    if let Err(e) = crate::store::check_location(location) {
        return plan_err!("OMOP store `{location}`: {e}");
    }
    let dir = if location.ends_with('/') {
        location.to_string()
    } else {
        format!("{location}/")
    };
    let table_url = ListingTableUrl::parse(&dir)?;
    let store = ctx.runtime_env().object_store(&table_url)?;
    let files: Vec<_> = store
        .list(Some(table_url.prefix()))
        .try_collect()
        .await
        .map_err(|e| exec_datafusion_err!("cannot list OMOP store {location}: {e}"))?;
    let mut found: BTreeMap<String, FoundTable> = BTreeMap::new();
    for meta in files {
        let path = meta.location.as_ref();
        let rel = path
            .strip_prefix(table_url.prefix().as_ref())
            .unwrap_or(path);
        let rel = rel.trim_start_matches('/');
        if rel.contains('/') {
            continue;
        }
        let Some((stem, raw_ext)) = rel.rsplit_once('.') else {
            continue;
        };
        let ext = raw_ext.to_ascii_lowercase();
        if ext != "parquet" && ext != "csv" {
            continue;
        }
        let name = stem.to_ascii_lowercase();
        if !CDM_TABLES.iter().any(|(t, _)| *t == name) {
            continue;
        }
        let url = format!("{}{}", dir, rel);
        let entry = FoundTable {
            name: name.clone(),
            url,
            format: ext.clone(),
            extension: format!(".{raw_ext}"),
        };
        match found.get(&name) {
            Some(existing) if existing.format == "parquet" => {}
            _ => {
                found.insert(name, entry);
            }
        }
    }
    Ok(found.into_values().collect())
}

/// Register every CDM table in `location` with the DESIGN.md §2 types; returns the tables.
pub async fn register_omop(ctx: &SessionContext, location: &str) -> DfResult<Vec<FoundTable>> {
    let tables = discover(ctx, location).await?;
    if tables.is_empty() {
        return plan_err!("no OMOP CDM tables (person.parquet, person.csv, …) found in {location}");
    }
    for t in &tables {
        register_table(ctx, t).await?;
    }
    Ok(tables)
}

/// Register one table: the raw file as `__raw_<name>` and the typed view `<name>`.
pub async fn register_table(ctx: &SessionContext, t: &FoundTable) -> DfResult<()> {
    let raw = format!("__raw_{}", t.name);
    let _ = ctx.deregister_table(&raw)?;
    let _ = ctx.deregister_table(&t.name)?;
    // Errors name the table and its file (the readers' own messages do not).
    let label = format!("{} ({})", t.name, t.url);
    let registered = if t.format == "parquet" {
        let opts = ParquetReadOptions {
            file_extension: &t.extension,
            ..Default::default()
        };
        ctx.register_parquet(&raw, &t.url, opts).await
    } else {
        ctx.register_csv(
            &raw,
            &t.url,
            CsvReadOptions::new()
                .has_header(true)
                .file_extension(&t.extension)
                .schema_infer_max_records(100_000),
        )
        .await
    };
    registered.map_err(|e| crate::named_source::with_source(&label, e))?;
    if let Some(provider) = ctx.deregister_table(&raw)? {
        ctx.register_table(
            &raw,
            Arc::new(crate::named_source::NamedSource::new(provider, label)),
        )?;
    }
    let schema = ctx.table(&raw).await?.schema().clone();
    let mut select = Vec::new();
    let mut present = Vec::new();
    for field in schema.fields() {
        let col = field.name();
        let lower = col.to_ascii_lowercase();
        present.push(lower.clone());
        let quoted = format!("\"{}\"", col.replace('"', "\"\""));
        // Text codes that happen to end in `_id` (e.g. `reverse_relationship_id`) stay text:
        // a text column becomes BIGINT only where the CDM defines an integer id.
        let text = matches!(
            field.data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        );
        let standard_int = lower.ends_with("_concept_id")
            || CDM_TABLES
                .iter()
                .any(|(_, cols)| cols.contains(&lower.as_str()));
        let target = match column_type(&lower) {
            Some("BIGINT") if text && !standard_int => None,
            other => other,
        };
        select.push(match target {
            Some(ty) => format!("CAST({quoted} AS {ty}) AS \"{lower}\""),
            None => format!("{quoted} AS \"{lower}\""),
        });
    }
    if let Some((_, standard)) = CDM_TABLES.iter().find(|(n, _)| *n == t.name) {
        for col in standard.iter() {
            if !present.iter().any(|p| p == col) {
                let ty = column_type(col).unwrap_or("VARCHAR");
                select.push(format!("CAST(NULL AS {ty}) AS \"{col}\""));
            }
        }
    }
    let sql = format!(
        "CREATE VIEW \"{}\" AS SELECT {} FROM \"{raw}\"",
        t.name,
        select.join(", ")
    );
    ctx.sql(&sql).await?.collect().await?;
    Ok(())
}

/// Convert every CDM table of `source` (CSV or Parquet) to typed Parquet files
/// `<destination>/<table>.parquet`. Each file is written under a temporary name and renamed
/// when complete (local destinations), so an interrupted import never leaves a file that looks
/// complete. Returns (table, rows) per table.
pub async fn import(
    ctx: &SessionContext,
    source: &str,
    destination: &str,
) -> DfResult<Vec<(String, usize)>> {
    let tables = register_omop(ctx, source).await?;
    let local = !destination.contains("://") || destination.starts_with("file://");
    let dest = destination.trim_end_matches('/');
    if local {
        let dir = dest.trim_start_matches("file://");
        std::fs::create_dir_all(dir)
            .map_err(|e| exec_datafusion_err!("cannot create {dir}: {e}"))?;
    }
    let mut written = Vec::new();
    for t in &tables {
        let df = ctx.table(&t.name).await?;
        let rows = df.clone().count().await?;
        let final_path = format!("{dest}/{}.parquet", t.name);
        let opts =
            datafusion::dataframe::DataFrameWriteOptions::new().with_single_file_output(true);
        if local {
            let tmp = format!("{dest}/.{}.parquet.partial", t.name);
            let (from, to) = (
                tmp.trim_start_matches("file://"),
                final_path.trim_start_matches("file://"),
            );
            if let Err(e) = df.write_parquet(&tmp, opts, None).await {
                let _ = std::fs::remove_file(from);
                return Err(e);
            }
            std::fs::rename(from, to)
                .map_err(|e| exec_datafusion_err!("cannot rename {from} to {to}: {e}"))?;
        } else {
            // Object stores make a single PUT / multipart upload visible atomically.
            df.write_parquet(&final_path, opts, None).await?;
        }
        written.push((t.name.clone(), rows));
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_by_name() {
        assert_eq!(column_type("person_id"), Some("BIGINT"));
        assert_eq!(column_type("drug_concept_id"), Some("BIGINT"));
        assert_eq!(column_type("domain_id"), None);
        assert_eq!(column_type("drug_era_start_date"), Some("DATE"));
        assert_eq!(column_type("birth_datetime"), Some("TIMESTAMP"));
        assert_eq!(column_type("quantity"), Some("DOUBLE"));
        assert_eq!(column_type("concept_name"), None);
    }
}

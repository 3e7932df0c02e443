//! Documentation of every epifusion SQL function (DataFusion's [`Documentation`]), also
//! queryable from SQL: `SELECT * FROM epifusion_functions()`.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, Result as DfResult};
use datafusion::datasource::{MemTable, TableType};
use datafusion::logical_expr::{DocSection, Documentation, Expr};
use datafusion::physical_plan::ExecutionPlan;

use crate::registry::{sql_functions, SqlRole};
use crate::study::diagnostics::DiagnosticsPart;
use crate::study::functions::{Design, Part};
use epifusion_core::model::ModelKind;

pub(crate) const SECTION: DocSection = DocSection {
    include: true,
    label: "epifusion",
    description: Some("Regularized regression for drug-safety studies"),
};

/// The `options` argument's documentation, generated from
/// [`epifusion_core::options::FIT_OPTIONS`]: `` `key` (type) [default]: meaning `` per key.
pub fn options_documentation() -> String {
    let keys: Vec<String> = epifusion_core::options::FIT_OPTIONS
        .iter()
        .map(|d| {
            format!(
                "`{}` ({}) [{}]: {}",
                d.key,
                d.ty,
                d.default.replace('`', ""),
                d.meaning.replace("\\|", "|")
            )
        })
        .collect();
    format!("JSON object; keys: {}", keys.join("; "))
}

fn model_words(model: ModelKind) -> &'static str {
    model.descriptor().description
}

fn table_doc(name: &str, model: ModelKind) -> Documentation {
    Documentation::builder(
        SECTION,
        format!(
            "Fits {} by cyclic coordinate descent and returns one row per coefficient: \
             covariate_id, covariate, estimate, std_error, ci_lower, ci_upper, exp_estimate, \
             penalized, model, log_likelihood, log_prior, iterations, status, seconds, \
             prior_variance (or, with the option table, the CV curve, likelihood profiles, \
             bootstrap results or the regularization path of the option path).",
            model_words(model)
        ),
        format!("{name}(outcomes [, covariates] [, options])"),
    )
    .with_argument(
        "outcomes",
        "Table name or SQL query: long format (row_id, [stratum_id], time, y, [weight, start_time, offset, censor_weight]) or, without covariates, a wide table whose other numeric columns are the covariates",
    )
    .with_argument("covariates", "Table name or SQL query: row_id, covariate_id, [covariate_value]")
    .with_argument("options", options_documentation())
    .with_sql_example(format!(
        "SELECT covariate, estimate, std_error FROM {name}('SELECT time, y, age, sex FROM lung', '{{\"ci\": \"wald\"}}');"
    ))
    .build()
}

fn aggregate_doc(name: &str, model: ModelKind) -> Documentation {
    Documentation::builder(
        SECTION,
        format!(
            "Aggregate: fits {} per GROUP BY group; returns a list of structs (covariate_id, \
             estimate, std_error, ci_lower, ci_upper, log_likelihood, iterations, status), one \
             per coefficient, to be expanded with unnest. A group that cannot be fitted returns \
             one element with status 'failed: <reason>'.",
            model_words(model)
        ),
        format!("{name}(stratum_id, time, y, covariate_ids [, covariate_values] [, options])"),
    )
    .with_argument("stratum_id", "BIGINT stratum (case, matched set) or NULL")
    .with_argument("time", "DOUBLE time (interval length for SCCS)")
    .with_argument("y", "outcome")
    .with_argument("covariate_ids", "list of BIGINT covariate ids of the row (e.g. array_agg(covariate_id))")
    .with_argument("covariate_values", "list of DOUBLE values, same length (default all 1)")
    .with_argument("options", options_documentation())
    .with_sql_example(format!(
        "SELECT outcome_id, unnest(fit) FROM (SELECT outcome_id, {name}(case_id, days, events, covariate_ids, '{{\"prior\": \"laplace\", \"lambda\": 3}}') AS fit FROM intervals GROUP BY outcome_id);"
    ))
    .build()
}

const SCCS_SETTINGS_DOC: &str = "JSON object (unknown keys are errors; OHDSI defaults): outcome (concept set: \
    concept_ids [+ include_descendants, domain] | cohort_ids | sql), exposures (list: concept set keys, label, id, \
    risk_windows [{start, start_anchor (era_start|era_end), end, end_anchor, label, split_points \
    (first day of each later sub-window as an offset from the window's start, e.g. [15, 43]: \
    one covariate per sub-window)}], stratify_by_id, \
    first_occurrence_only), first_outcome_only, naive_period, min_age, max_age, genders, \
    study_start_date, study_end_date, age_group_starts (days), age_spline / season_spline / \
    calendar_spline ({knots} or {knots_at}), end_of_observation_probe (days), merge_patterns, \
    restrict_time_to_exposure (index into exposures)";

const COHORT_SETTINGS_DOC: &str = "JSON object (unknown keys are errors; CohortMethod defaults): target, \
    comparator, outcome (concept sets), competing ({death, outcome}), model (cox|fine_gray), \
    first_exposure_only, remove_duplicate_subjects (keep_all|remove_all|keep_first), washout_days, \
    restrict_to_common_period, remove_subjects_with_prior_outcome, prior_outcome_lookback, \
    risk_window_start, start_anchor, risk_window_end, end_anchor (cohort_start|cohort_end), \
    censor_at_new_risk_window, min_days_at_risk, strata (gender|age_group|index_year), covariates \
    ({lookback_days, end_days, gender, age_group, conditions, drugs, procedures, excluded_concept_ids})";

fn study_doc(name: &str, design: Design, part: Part) -> Documentation {
    let (what, settings) = match design {
        Design::Sccs => ("the self-controlled case series design", SCCS_SETTINGS_DOC),
        Design::Cohort => ("the new-user cohort design", COHORT_SETTINGS_DOC),
    };
    let returns = match (design, part) {
        (Design::Sccs, Part::Outcomes) => "the interval table in the long outcome format of sccs_fit: row_id, stratum_id (case), time (days), y (outcomes), person_id, observation_period_id",
        (Design::Cohort, Part::Outcomes) => "the risk set in the long outcome format of cox_fit / fine_gray_fit: row_id, [stratum_id], time, y, person_id, treatment, cohort_start_day, risk_start_day, risk_end_day, status (0 censored, 1 outcome, 2 competing)",
        (_, Part::Covariates) => "the sparse covariates: row_id, covariate_id, covariate_value",
        (_, Part::CovariateRef) => "the covariate reference: covariate_id, covariate_name, analysis_id, analysis_name, concept_id",
        (Design::Sccs, Part::Attrition) => "the attrition table: step, description, persons, cases, outcomes left after each step",
        (Design::Cohort, Part::Attrition) => "the attrition table: step, description, target_persons, comparator_persons, target_outcomes, comparator_outcomes left after each step",
    };
    let example = match design {
        Design::Sccs => format!("SELECT * FROM {name}('{{\"outcome\": {{\"concept_ids\": [192671], \"include_descendants\": true}}, \"exposures\": [{{\"concept_ids\": [1118084]}}]}}');"),
        Design::Cohort => format!("SELECT * FROM {name}('{{\"target\": {{\"concept_ids\": [1118084]}}, \"comparator\": {{\"concept_ids\": [1124300]}}, \"outcome\": {{\"concept_ids\": [192671], \"include_descendants\": true}}, \"risk_window_end\": 365, \"end_anchor\": \"cohort_start\"}}');"),
    };
    Documentation::builder(
        SECTION,
        format!("Builds {what} from the registered OMOP tables and returns {returns}."),
        format!("{name}(settings)"),
    )
    .with_argument("settings", settings)
    .with_sql_example(example)
    .build()
}

fn diagnostics_doc(name: &str, part: DiagnosticsPart) -> Documentation {
    let description = match part {
        DiagnosticsPart::Diagnostics => {
            "Builds the self-controlled case series design, fits it (no prior, profile \
             intervals) and returns the OHDSI SelfControlledCaseSeries diagnostics per exposure: \
             exposure_index, exposure, covariate_id, diagnostic (mdrr, ease, time_stability, \
             event_observation, event_exposure, rare_outcome), value, threshold, status (pass, \
             warn, fail, not_computed) and notes (why a diagnostic was not computed, the \
             interval, the counts)."
        }
        DiagnosticsPart::TimeToEvent => {
            "Builds the self-controlled case series design and returns, per exposure, \
             the outcomes and the cases observed in the weeks -26 to 25 around each case's first \
             exposure start (SelfControlledCaseSeries' computeTimeToEvent / \
             plotExposureCentered): exposure_index, exposure, week, start_day, end_day (days \
             since the exposure start, inclusive), observed_cases, outcomes_exposed, \
             outcomes_unexposed."
        }
    };
    Documentation::builder(SECTION, description, format!("{name}(settings)"))
        .with_argument(
            "settings",
            format!(
                "{SCCS_SETTINGS_DOC}; plus diagnostics (thresholds: mdrr [10], ease [0.25], \
                 ease_warning, time_trend_max_ratio [1.1], time_trend_alpha [0.05], \
                 rare_outcome_max_prevalence [0.1], event_observation_null_bounds [[0.5, 2]], \
                 event_exposure_null_bounds [[0.8, 1.25]], mdrr_alpha [0.05], mdrr_power [0.8], \
                 mdrr_two_sided [true]) and negative_controls (table name or read-only query: \
                 log_rr, se_log_rr; for EASE)"
            ),
        )
        .with_sql_example(format!(
            "SELECT diagnostic, value, status, notes FROM {name}('{{\"outcome\": {{\"concept_ids\": [192671], \"include_descendants\": true}}, \"exposures\": [{{\"concept_ids\": [1118084], \"risk_windows\": [{{}}, {{\"start\": -30, \"end\": -1, \"end_anchor\": \"era_start\"}}]}}], \"end_of_observation_probe\": 30}}');"
        ))
        .build()
}

/// Documentation of every function, by name.
pub fn all_docs() -> &'static BTreeMap<&'static str, Documentation> {
    static DOCS: OnceLock<BTreeMap<&'static str, Documentation>> = OnceLock::new();
    DOCS.get_or_init(|| {
        let mut m = BTreeMap::new();
        for f in sql_functions() {
            match f.role {
                SqlRole::Fit(model) => {
                    m.insert(f.name, table_doc(f.name, model));
                }
                SqlRole::FitAggregate(model) => {
                    m.insert(f.name, aggregate_doc(f.name, model));
                }
                SqlRole::Study(design, part) => {
                    m.insert(f.name, study_doc(f.name, design, part));
                }
                SqlRole::EmpiricalNull => {
                    m.insert(
                        f.name,
                        Documentation::builder(
                            SECTION,
                            "Fits the empirical null N(mean, sd²) of negative-control estimates \
                             (true RR = 1) by maximum likelihood with their own standard errors \
                             (EmpiricalCalibration's fitNull), one per `group` value; returns \
                             group, mean, sd, ease (expected absolute systematic error), n, \
                             log_likelihood.",
                            "empirical_null(negatives)",
                        )
                        .with_argument(
                            "negatives",
                            "Table name or read-only SQL query: log_rr, se_log_rr [, group]",
                        )
                        .with_sql_example(
                            "SELECT * FROM empirical_null('SELECT log_rr, se_log_rr, analysis AS \"group\" FROM negative_controls');",
                        )
                        .build(),
                    );
                }
                SqlRole::CalibrateEstimates => {
                    m.insert(
                        f.name,
                        Documentation::builder(
                            SECTION,
                            "Calibrates estimates with the empirical null of negative controls \
                             (EmpiricalCalibration's calibrateP and calibrateConfidenceInterval \
                             through convertNullToErrorModel), matched by `group` when both \
                             inputs have it; returns the estimates' rows and columns plus \
                             calibrated_p (two-sided), calibrated_log_rr, calibrated_se_log_rr, \
                             calibrated_ci_95_lb, calibrated_ci_95_ub (RR scale).",
                            "calibrate_estimates(estimates, negatives)",
                        )
                        .with_argument(
                            "estimates",
                            "Table name or read-only SQL query: log_rr, se_log_rr [, group], any other columns",
                        )
                        .with_argument(
                            "negatives",
                            "Table name or read-only SQL query: log_rr, se_log_rr [, group]",
                        )
                        .with_sql_example(
                            "SELECT exposure, calibrated_p, calibrated_ci_95_lb, calibrated_ci_95_ub FROM calibrate_estimates('estimates', 'negative_controls');",
                        )
                        .build(),
                    );
                }
                SqlRole::SccsDiagnostics(part) => {
                    m.insert(f.name, diagnostics_doc(f.name, part));
                }
                SqlRole::Cohort(part) => {
                    m.insert(f.name, crate::cohort_ps::documentation(f.name, part));
                }
                SqlRole::DesignMatrix | SqlRole::Functions => {}
            }
        }
        m.insert(
            "design_matrix",
            Documentation::builder(
                SECTION,
                "Builds the sparse design matrix (CSC: indicator, sparse and dense columns) from \
                 the long or wide format once and keeps it in the session under a name; fitting \
                 functions then take '@name' as their outcomes argument (other priors, CV) \
                 without rebuilding. Returns one row: name, rows, columns, strata, nnz, \
                 indicator_columns, sparse_columns, dense_columns, bytes, dropped_unknown_rows, \
                 device.",
                "design_matrix(outcomes [, covariates], options)",
            )
            .with_argument("outcomes", "Table name or SQL query (long or wide format)")
            .with_argument("covariates", "Table name or SQL query: row_id, covariate_id, [covariate_value]")
            .with_argument("options", "JSON object: name (required), drop_unknown_rows [false]")
            .with_sql_example(
                "SELECT * FROM design_matrix('outcomes', 'covariates', '{\"name\": \"m\"}'); SELECT * FROM cox_fit('@m', '{\"prior\": \"laplace\", \"lambda\": 10}');",
            )
            .build(),
        );
        m.insert(
            "epifusion_functions",
            Documentation::builder(
                SECTION,
                "Lists every epifusion SQL function with its description, syntax and example.",
                "epifusion_functions()",
            )
            .with_sql_example("SELECT name, syntax FROM epifusion_functions();")
            .build(),
        );
        m
    })
}

/// Documentation of one function.
pub fn doc(name: &str) -> Option<&'static Documentation> {
    all_docs().get(name)
}

/// `epifusion_functions()`: the documentation as a table.
#[derive(Debug)]
pub struct FunctionsTable;

impl TableFunctionImpl for FunctionsTable {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        if !args.exprs().is_empty() {
            return plan_err!(
                "epifusion_functions takes no arguments, got {}",
                args.exprs().len()
            );
        }
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("kind", DataType::Utf8, false),
            Field::new("syntax", DataType::Utf8, false),
            Field::new("description", DataType::Utf8, false),
            Field::new("example", DataType::Utf8, true),
        ]));
        let docs = all_docs();
        let kind = |n: &str| {
            if n.ends_with("_agg") {
                "aggregate"
            } else {
                "table"
            }
        };
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(docs.keys().copied())),
                Arc::new(StringArray::from_iter_values(docs.keys().map(|n| kind(n)))),
                Arc::new(StringArray::from_iter_values(
                    docs.values().map(|d| d.syntax_example.clone()),
                )),
                Arc::new(StringArray::from_iter_values(
                    docs.values().map(|d| d.description.clone()),
                )),
                Arc::new(StringArray::from_iter(
                    docs.values().map(|d| d.sql_example.clone()),
                )),
            ],
        )?;
        Ok(Arc::new(DocsTable(Arc::new(MemTable::try_new(
            schema,
            vec![vec![batch]],
        )?))))
    }
}

/// Thin wrapper so the table reports itself as temporary.
#[derive(Debug)]
pub(crate) struct DocsTable(Arc<MemTable>);

#[async_trait]
impl TableProvider for DocsTable {
    fn schema(&self) -> SchemaRef {
        self.0.schema()
    }
    fn table_type(&self) -> TableType {
        TableType::Temporary
    }
    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.0.scan(state, projection, filters, limit).await
    }
}

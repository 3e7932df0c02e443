//! SQL table functions of the study designs. Each takes the design's settings as one JSON
//! string and returns one of its tables:
//!
//! ```sql
//! SELECT * FROM sccs_intervals('{"outcome": {...}, "exposures": [...]}');   -- outcomes
//! SELECT * FROM sccs_covariates('{...}');      -- row_id, covariate_id, covariate_value
//! SELECT * FROM sccs_attrition('{...}');       -- step, description, persons, cases, outcomes
//! SELECT * FROM sccs_covariate_ref('{...}');   -- covariate_id, covariate_name, …
//! SELECT * FROM cohort_outcomes('{...}');      -- and cohort_covariates / _attrition / _covariate_ref
//! ```
//!
//! Each call builds the design (the settings are checked when the query is planned: an unknown
//! key or a wrong type is a planning error naming the key). To fit, keep the tables first
//! (`CREATE TABLE iv AS SELECT * FROM sccs_intervals(...)`) or pass the calls as the fitting
//! function's queries.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, Result as DfResult};
use datafusion::datasource::TableType;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use super::{cohort, covariate_ref_schema, sccs, CohortDesign, SccsDesign, StudyTables};
use crate::exec::{EpiExec, NodeSpec};
use crate::fit_table::string_args;

/// Which design a function builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Design {
    /// Self-controlled case series.
    Sccs,
    /// New-user cohort.
    Cohort,
}

/// Which of the design's tables a function returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The long outcome table.
    Outcomes,
    /// The long covariate table.
    Covariates,
    /// The covariate reference.
    CovariateRef,
    /// The attrition table.
    Attrition,
}

/// Every study table function: (SQL name, design, part).
pub const STUDY_FUNCTIONS: &[(&str, Design, Part)] = &[
    ("sccs_intervals", Design::Sccs, Part::Outcomes),
    ("sccs_covariates", Design::Sccs, Part::Covariates),
    ("sccs_covariate_ref", Design::Sccs, Part::CovariateRef),
    ("sccs_attrition", Design::Sccs, Part::Attrition),
    ("cohort_outcomes", Design::Cohort, Part::Outcomes),
    ("cohort_covariates", Design::Cohort, Part::Covariates),
    ("cohort_covariate_ref", Design::Cohort, Part::CovariateRef),
    ("cohort_attrition", Design::Cohort, Part::Attrition),
];

/// A parsed, checked design.
#[derive(Debug, Clone)]
enum Settings {
    Sccs(Arc<SccsDesign>),
    Cohort(Arc<CohortDesign>),
}

/// A study table function.
#[derive(Debug)]
pub struct StudyTableFunction {
    name: &'static str,
    design: Design,
    part: Part,
}

impl StudyTableFunction {
    /// The function `name` returning `part` of `design`.
    pub fn new(name: &'static str, design: Design, part: Part) -> Self {
        StudyTableFunction { name, design, part }
    }
}

/// The schema of a design's table.
fn part_schema(settings: &Settings, part: Part) -> SchemaRef {
    match (settings, part) {
        (Settings::Sccs(_), Part::Outcomes) => sccs::outcome_schema(),
        (Settings::Cohort(d), Part::Outcomes) => cohort::outcome_schema(!d.strata.is_empty()),
        (_, Part::Covariates) => sccs::covariate_schema(),
        (_, Part::CovariateRef) => covariate_ref_schema(),
        (Settings::Sccs(_), Part::Attrition) => sccs::attrition_schema(),
        (Settings::Cohort(_), Part::Attrition) => cohort::attrition_schema(),
    }
}

impl TableFunctionImpl for StudyTableFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let strings = string_args(self.name, args.exprs(), "settings JSON")?;
        if strings.len() != 1 {
            return plan_err!(
                "{} takes 1 argument (settings JSON), got {}",
                self.name,
                strings.len()
            );
        }
        let work = StudyWork::parse(self.name, self.design, self.part, &strings[0])?;
        Ok(Arc::new(StudyTable {
            name: self.name,
            schema: work.schema(),
            settings_json: strings[0].clone(),
        }))
    }
}

/// The checked settings of a study node: which design and table, and the design itself.
#[derive(Debug, Clone)]
pub struct StudyWork {
    settings: Settings,
    part: Part,
}

impl StudyWork {
    /// Parse and check `json` as the settings of `function` (`design`, `part`).
    pub fn parse(_function: &str, design: Design, part: Part, json: &str) -> DfResult<Self> {
        let settings = match design {
            Design::Sccs => {
                let d = SccsDesign::from_json(json)?;
                d.check()?;
                Settings::Sccs(Arc::new(d))
            }
            Design::Cohort => {
                let d = CohortDesign::from_json(json)?;
                d.check()?;
                Settings::Cohort(Arc::new(d))
            }
        };
        Ok(StudyWork { settings, part })
    }

    /// The schema of the table the build returns.
    pub fn schema(&self) -> SchemaRef {
        part_schema(&self.settings, self.part)
    }

    /// Build the design in `ctx` and return the table.
    pub async fn run(self, ctx: SessionContext) -> DfResult<RecordBatch> {
        let schema = self.schema();
        let tables = build(ctx, self.settings).await?;
        let batches = match self.part {
            Part::Outcomes => tables.outcomes,
            Part::Covariates => tables.covariates,
            Part::CovariateRef => tables.covariate_ref,
            Part::Attrition => tables.attrition,
        };
        Ok(concat_batches(&schema, &batches)?)
    }
}

/// The table a study function call produces (also `sccs_diagnostics` / `sccs_time_to_event`):
/// its scan is an [`EpiExec`] of [`NodeSpec::Study`] over the calling session's tables.
#[derive(Debug)]
pub(crate) struct StudyTable {
    /// The SQL function.
    pub(crate) name: &'static str,
    /// The settings JSON as written.
    pub(crate) settings_json: String,
    /// The table's schema.
    pub(crate) schema: SchemaRef,
}

async fn build(ctx: SessionContext, settings: Settings) -> DfResult<StudyTables> {
    match settings {
        Settings::Sccs(d) => super::build_sccs(&ctx, &d).await,
        Settings::Cohort(d) => super::build_cohort(&ctx, &d).await,
    }
}

#[async_trait]
impl TableProvider for StudyTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let spec = NodeSpec::Study {
            function: self.name.to_string(),
            settings: self.settings_json.clone(),
            tables: Default::default(),
        };
        Ok(Arc::new(EpiExec::try_new(
            spec,
            Vec::new(),
            projection.cloned(),
            Some(crate::planning::session_context(state)),
        )?))
    }
}

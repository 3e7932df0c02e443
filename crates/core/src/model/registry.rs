//! The model registry: one descriptor per model, from which the parsers, the SQL function
//! names (table functions and `GROUP BY` aggregates), their documentation, the CLI's `--model`
//! values and the pipeline's model check are derived.
//!
//! **A new likelihood** = its file in `model/` + one [`ModelKind`] variant + one entry in
//! [`MODELS`] + its constructor in [`super::cpu_likelihood_from`] (+ a kernel and a layout in
//! `epifusion-cuda` for the GPU, with `gpu: true` here).

use super::cv::Resampling;
use super::ModelKind;

/// Everything the layers above need to know about one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelDescriptor {
    /// The model.
    pub kind: ModelKind,
    /// Canonical name (`--model`, pipeline `model =`, result tables).
    pub name: &'static str,
    /// Other accepted names.
    pub aliases: &'static [&'static str],
    /// SQL table function (`<name>_fit`).
    pub table_function: &'static str,
    /// SQL `GROUP BY` aggregate (`<name>_fit_agg`).
    pub aggregate: &'static str,
    /// What it fits, for the documentation ("a Cox proportional-hazards model (…)").
    pub description: &'static str,
    /// Whether rows need a `time` column (event time, or exposure time as a log offset).
    pub needs_time: bool,
    /// Whether an intercept column is added.
    pub intercept: bool,
    /// The domain of `y`, as error messages say it.
    pub y_domain: &'static str,
    /// The resampling unit of `by: auto` (CV folds, bootstrap draws).
    pub resampling_unit: Resampling,
    /// Whether the CUDA backend has kernels for it.
    pub gpu: bool,
}

/// Every model, in the order the documentation lists them.
pub const MODELS: &[ModelDescriptor] = &[
    ModelDescriptor {
        kind: ModelKind::ConditionalPoisson,
        name: "sccs",
        aliases: &["cpr", "conditional_poisson"],
        table_function: "sccs_fit",
        aggregate: "sccs_fit_agg",
        description: "a self-controlled case series (conditional Poisson with log(time) offset, strata = cases)",
        needs_time: true,
        intercept: false,
        y_domain: "a non-negative whole number of events",
        resampling_unit: Resampling::Stratum,
        gpu: true,
    },
    ModelDescriptor {
        kind: ModelKind::Cox,
        name: "cox",
        aliases: &["cox_ph", "coxph"],
        table_function: "cox_fit",
        aggregate: "cox_fit_agg",
        description: "a Cox proportional-hazards model (Breslow or Efron ties, strata, weights, (start, stop] rows)",
        needs_time: true,
        intercept: false,
        y_domain: "0 or 1",
        resampling_unit: Resampling::Row,
        gpu: true,
    },
    ModelDescriptor {
        kind: ModelKind::FineGray,
        name: "fine_gray",
        aliases: &["finegray", "fgr"],
        table_function: "fine_gray_fit",
        aggregate: "fine_gray_fit_agg",
        description: "a Fine–Gray subdistribution-hazards model (y: 1 event, 2 competing, 0 censored; IPCW weights computed)",
        needs_time: true,
        intercept: false,
        y_domain: "0 (censored), 1 (event) or 2 (competing event)",
        resampling_unit: Resampling::Row,
        gpu: true,
    },
    ModelDescriptor {
        kind: ModelKind::Logistic,
        name: "logistic",
        aliases: &["lr"],
        table_function: "logistic_fit",
        aggregate: "logistic_fit_agg",
        description: "a logistic regression (with intercept)",
        needs_time: false,
        intercept: true,
        y_domain: "0 or 1",
        resampling_unit: Resampling::Row,
        gpu: false,
    },
    ModelDescriptor {
        kind: ModelKind::Poisson,
        name: "poisson",
        aliases: &["pr"],
        table_function: "poisson_fit",
        aggregate: "poisson_fit_agg",
        description: "a Poisson regression (with intercept and log(time) offset)",
        needs_time: true,
        intercept: true,
        y_domain: "a non-negative whole number of events",
        resampling_unit: Resampling::Row,
        gpu: false,
    },
    ModelDescriptor {
        kind: ModelKind::ConditionalLogistic,
        name: "conditional_logistic",
        aliases: &["clr"],
        table_function: "conditional_logistic_fit",
        aggregate: "conditional_logistic_fit_agg",
        description: "a conditional logistic regression (strata = matched sets)",
        needs_time: false,
        intercept: false,
        y_domain: "0 or 1",
        resampling_unit: Resampling::Stratum,
        gpu: false,
    },
];

/// The descriptor of `kind`.
pub fn descriptor(kind: ModelKind) -> &'static ModelDescriptor {
    // Every variant has exactly one entry (checked by a test).
    MODELS.iter().find(|d| d.kind == kind).unwrap_or(&MODELS[0])
}

/// The model named `name` (canonical name or alias, case-insensitive, `-` as `_`).
pub fn lookup(name: &str) -> Option<&'static ModelDescriptor> {
    let n = name.to_ascii_lowercase().replace('-', "_");
    MODELS
        .iter()
        .find(|d| d.name == n || d.aliases.contains(&n.as_str()))
}

/// The canonical names, comma-separated (for error messages and help).
pub fn names() -> String {
    MODELS.iter().map(|d| d.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_per_model_and_unique_names() {
        let all = [
            ModelKind::ConditionalPoisson,
            ModelKind::Cox,
            ModelKind::FineGray,
            ModelKind::Logistic,
            ModelKind::Poisson,
            ModelKind::ConditionalLogistic,
        ];
        assert_eq!(MODELS.len(), all.len());
        for k in all {
            assert_eq!(MODELS.iter().filter(|d| d.kind == k).count(), 1, "{k:?}");
            assert_eq!(descriptor(k).kind, k);
        }
        let mut names: Vec<&str> = MODELS
            .iter()
            .flat_map(|d| {
                [d.name, d.table_function, d.aggregate]
                    .into_iter()
                    .chain(d.aliases.iter().copied())
            })
            .collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "names and aliases are unique");
        for d in MODELS {
            assert_eq!(lookup(d.name).map(|m| m.kind), Some(d.kind));
            for a in d.aliases {
                assert_eq!(lookup(&a.to_uppercase()).map(|m| m.kind), Some(d.kind));
            }
            assert!(d.table_function.starts_with(d.name) && d.aggregate.ends_with("_fit_agg"));
        }
        assert!(lookup("coxx").is_none());
    }
}

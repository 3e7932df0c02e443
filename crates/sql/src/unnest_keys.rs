//! A guard against a DataFusion 55 planning bug: an `Unnest` of a list column keeps its input's
//! functional dependencies.
//!
//! `Unnest::try_new` copies the input schema's functional dependencies to its output. After
//! `unnest(list)` a row of the input becomes many rows, so a key of the input (for example the
//! group key `g` of `GROUP BY g`) is no longer unique and no longer determines the other
//! columns. The optimizer trusts the copied dependency anyway:
//!
//! * `eliminate_duplicated_expr` drops the sort keys after `g` as "determined by `g`", so the
//!   README's GROUP BY-fit pattern `SELECT g, c['covariate_id'] AS covariate_id FROM (SELECT g,
//!   unnest(fit) AS c FROM (… GROUP BY g)) ORDER BY g, covariate_id` comes back sorted by `g`
//!   only;
//! * `eliminate_join` may treat a join on `g` after such an unnest as one-to-one and drop rows.
//!
//! (Upstream: apache/datafusion#24787, open.) [`UnnestKeepsNoKeys`] clears the functional
//! dependencies of every `Unnest` that unnests a list and recomputes the schemas of the nodes
//! above it. Other optimizer rules rebuild `Unnest` nodes (copying the dependencies back), so
//! [`guard_rules`] puts the guard before every rule of a rule list and once at its end.
//! Unnesting a struct only (one row stays one row) keeps its dependencies.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{FunctionalDependencies, Result};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};
use datafusion::prelude::SessionContext;

/// The optimizer rule's name.
pub const RULE_NAME: &str = "epifusion_unnest_keeps_no_keys";

/// Clears the functional dependencies of list `Unnest` nodes (module documentation).
#[derive(Debug, Default)]
pub struct UnnestKeepsNoKeys;

impl OptimizerRule for UnnestKeepsNoKeys {
    fn name(&self) -> &str {
        RULE_NAME
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        clear_unnest_keys(plan)
    }
}

/// Bottom-up: children (and subqueries) first; a node with a changed input gets its schema
/// recomputed; a list `Unnest` with dependencies loses them.
fn clear_unnest_keys(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    let t = plan
        .map_subqueries(clear_unnest_keys)?
        .transform_sibling(|p| p.map_children(clear_unnest_keys))?;
    let changed = t.transformed;
    let mut plan = if changed {
        t.data.recompute_schema()?
    } else {
        t.data
    };
    if let LogicalPlan::Unnest(u) = &mut plan {
        if !u.list_type_columns.is_empty() && !u.schema.functional_dependencies().is_empty() {
            let schema = u
                .schema
                .as_ref()
                .clone()
                .with_functional_dependencies(FunctionalDependencies::empty())?;
            u.schema = Arc::new(schema);
            return Ok(Transformed::yes(plan));
        }
    }
    Ok(Transformed::new_transformed(plan, changed))
}

/// `rules` with the guard before each rule and once at the end (unchanged when it already
/// holds the guard).
pub fn guard_rules(
    rules: Vec<Arc<dyn OptimizerRule + Send + Sync>>,
) -> Vec<Arc<dyn OptimizerRule + Send + Sync>> {
    if rules.iter().any(|r| r.name() == RULE_NAME) {
        return rules;
    }
    let guard: Arc<dyn OptimizerRule + Send + Sync> = Arc::new(UnnestKeepsNoKeys);
    let mut out = Vec::with_capacity(2 * rules.len() + 1);
    for r in rules {
        out.push(guard.clone());
        out.push(r);
    }
    out.push(guard);
    out
}

/// `state` with its optimizer rules guarded ([`guard_rules`]; same session id).
pub fn guard_state(state: SessionState) -> SessionState {
    if state.optimizers().iter().any(|r| r.name() == RULE_NAME) {
        return state;
    }
    let rules = guard_rules(state.optimizers().to_vec());
    let id = state.session_id().to_string();
    SessionStateBuilder::new_from_existing(state)
        .with_session_id(id)
        .with_optimizer_rules(rules)
        .build()
}

/// Guard the optimizer rules of `ctx`'s session in place (idempotent; nothing else of the
/// session changes).
pub fn guard_session(ctx: &SessionContext) {
    let rules = ctx.state_ref().read().optimizers().to_vec();
    if rules.iter().any(|r| r.name() == RULE_NAME) {
        return;
    }
    for r in &rules {
        ctx.remove_optimizer_rule(r.name());
    }
    for r in guard_rules(rules) {
        ctx.add_optimizer_rule(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, Int64Array};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::arrow::util::pretty::pretty_format_batches;

    const DATA: &str = "CREATE TABLE t AS VALUES (1, 3), (1, 1), (1, 2), (2, 9), (2, 7), (2, 8)";

    async fn collect(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
        ctx.sql(sql).await.unwrap().collect().await.unwrap()
    }

    fn column(batches: &[RecordBatch], i: usize) -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| {
                let a = b.column(i).as_any().downcast_ref::<Int64Array>().unwrap();
                (0..a.len()).map(|k| a.value(k)).collect::<Vec<_>>()
            })
            .collect()
    }

    /// `ORDER BY g, v` after an unnest of a per-group list: the README's GROUP BY-fit pattern.
    const SORTED: &str = "SELECT g, v FROM (SELECT g, unnest(vs) AS v FROM \
        (SELECT column1 AS g, array_agg(column2) AS vs FROM t GROUP BY column1)) ORDER BY g, v";

    async fn session(guarded: bool) -> SessionContext {
        let ctx = SessionContext::new_with_config(
            datafusion::prelude::SessionConfig::new().with_target_partitions(1),
        );
        if guarded {
            guard_session(&ctx);
        }
        collect(&ctx, DATA).await;
        ctx
    }

    #[tokio::test]
    async fn order_by_after_an_unnest_sorts_every_key() {
        let ctx = session(true).await;
        let out = collect(&ctx, SORTED).await;
        assert_eq!(column(&out, 0), vec![1, 1, 1, 2, 2, 2]);
        assert_eq!(
            column(&out, 1),
            vec![1, 2, 3, 7, 8, 9],
            "{}",
            pretty_format_batches(&out).unwrap()
        );
        // Idempotent: a second install changes nothing.
        let n = ctx.state().optimizers().len();
        guard_session(&ctx);
        assert_eq!(ctx.state().optimizers().len(), n);
    }

    /// Bare DataFusion 55 loses the second sort key. When this fails, upstream has fixed the bug
    /// (apache/datafusion#24787) and the guard can go.
    #[tokio::test]
    async fn bare_datafusion_still_loses_the_second_sort_key() {
        let ctx = session(false).await;
        let plan = ctx
            .sql(&format!("EXPLAIN {SORTED}"))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let text = pretty_format_batches(&plan).unwrap().to_string();
        let logical = text
            .lines()
            .find(|l| l.contains("Sort:"))
            .unwrap_or_default()
            .to_string();
        assert!(
            !logical.contains(" v ASC"),
            "DataFusion now keeps the sort key v: {logical}"
        );
    }

    /// A join whose other side is unique on `g`, reading only that side's columns: with the
    /// unnest's copied key, `eliminate_join` may make it a semi join (one row per `g`).
    #[tokio::test]
    async fn a_join_after_an_unnest_keeps_every_row() {
        let ctx = session(true).await;
        let sql = "SELECT k.g FROM (SELECT DISTINCT column1 AS g FROM t) k JOIN \
            (SELECT g, unnest(vs) AS v FROM (SELECT column1 AS g, array_agg(column2) AS vs \
            FROM t GROUP BY column1)) u ON k.g = u.g ORDER BY k.g";
        let out = collect(&ctx, sql).await;
        assert_eq!(column(&out, 0), vec![1, 1, 1, 2, 2, 2]);
    }
}

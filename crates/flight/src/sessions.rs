//! One DataFusion session per client connection over a shared catalog.
//!
//! The shared catalog is the start-up session's (`--omop` tables, `-c` statements). Each client
//! connection gets a [`SessionContext`] of its own: its own views, tables, `SET` options and
//! `design_matrix` registry, layered over the shared schemas ([`SessionSchema`]): a client's
//! `CREATE VIEW v` is visible to that client only, and a shared table cannot be dropped or
//! replaced by a client. Sessions live as long as the client's gRPC connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::catalog::{
    CatalogProvider, CatalogProviderList, MemoryCatalogProvider, MemoryCatalogProviderList,
    MemorySchemaProvider, SchemaProvider, TableProvider,
};
use datafusion::common::{plan_err, Result as DfResult};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::SessionContext;

/// The sessions of the connected clients, by connection id.
pub struct Sessions {
    base: SessionContext,
    runtime: Arc<RuntimeEnv>,
    open: Mutex<HashMap<u64, SessionContext>>,
}

impl Sessions {
    /// Sessions over `base`'s catalog, running on `runtime` (one memory pool for all).
    pub fn new(base: SessionContext, runtime: Arc<RuntimeEnv>) -> Self {
        Self {
            base,
            runtime,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// The session of connection `id`, created on its first request.
    pub fn session(&self, id: u64) -> SessionContext {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.entry(id)
            .or_insert_with(|| self.new_client_session())
            .clone()
    }

    /// Forget connection `id`'s session (its connection closed).
    pub fn close(&self, id: u64) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.remove(&id);
    }

    /// How many client sessions are open.
    pub fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no client session is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A session with the start-up session's settings, every epifusion function (with its own
    /// design-matrix registry) and its own layer over the shared catalog.
    pub fn new_client_session(&self) -> SessionContext {
        let base = self.base.state();
        // The catalog list below already holds the default catalog: building must not replace it.
        let config = base
            .config()
            .clone()
            .with_create_default_catalog_and_schema(false);
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(self.runtime.clone())
            .with_catalog_list(client_catalogs(base.catalog_list().as_ref()))
            .with_default_features()
            .build();
        let ctx = SessionContext::new_with_state(state);
        epifusion_sql::session::register_all(&ctx);
        ctx
    }
}

/// A catalog list for one client: every shared catalog and schema, each schema layered under a
/// schema of the client's own.
fn client_catalogs(shared: &dyn CatalogProviderList) -> Arc<dyn CatalogProviderList> {
    let list = MemoryCatalogProviderList::new();
    for catalog_name in shared.catalog_names() {
        let Some(catalog) = shared.catalog(&catalog_name) else {
            continue;
        };
        let own = MemoryCatalogProvider::new();
        for schema_name in catalog.schema_names() {
            if let Some(schema) = catalog.schema(&schema_name) {
                let layered = Arc::new(SessionSchema {
                    own: MemorySchemaProvider::new(),
                    shared: schema,
                });
                // A fresh MemoryCatalogProvider: registering cannot fail.
                let _ = own.register_schema(&schema_name, layered);
            }
        }
        list.register_catalog(catalog_name, Arc::new(own));
    }
    Arc::new(list)
}

/// A client's schema: its own tables and views first, then the shared schema's tables.
#[derive(Debug)]
pub struct SessionSchema {
    own: MemorySchemaProvider,
    shared: Arc<dyn SchemaProvider>,
}

#[async_trait]
impl SchemaProvider for SessionSchema {
    fn table_names(&self) -> Vec<String> {
        let mut names = self.shared.table_names();
        for name in self.own.table_names() {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        match self.own.table(name).await? {
            Some(t) => Ok(Some(t)),
            None => self.shared.table(name).await,
        }
    }

    fn register_table(
        &self,
        name: String,
        table: Arc<dyn TableProvider>,
    ) -> DfResult<Option<Arc<dyn TableProvider>>> {
        if self.shared.table_exist(&name) {
            return plan_err!(
                "table `{name}` is shared by every client of this server and cannot be replaced"
            );
        }
        self.own.register_table(name, table)
    }

    fn deregister_table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        if self.shared.table_exist(name) && !self.own.table_exist(name) {
            return plan_err!(
                "table `{name}` is shared by every client of this server and cannot be dropped"
            );
        }
        self.own.deregister_table(name)
    }

    fn table_exist(&self, name: &str) -> bool {
        self.own.table_exist(name) || self.shared.table_exist(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn sessions() -> Sessions {
        let base = SessionContext::new();
        base.sql("CREATE TABLE shared_t AS VALUES (1), (2)")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let runtime = base.runtime_env();
        Sessions::new(base, runtime)
    }

    async fn rows(ctx: &SessionContext, sql: &str) -> DfResult<usize> {
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(batches.iter().map(|b| b.num_rows()).sum())
    }

    #[tokio::test]
    async fn views_are_per_session_and_shared_tables_are_seen_by_all() {
        let s = sessions().await;
        let (a, b) = (s.session(1), s.session(2));
        assert_eq!(rows(&a, "SELECT * FROM shared_t").await.unwrap(), 2);
        assert_eq!(rows(&b, "SELECT * FROM shared_t").await.unwrap(), 2);
        rows(
            &a,
            "CREATE VIEW v AS SELECT * FROM shared_t WHERE column1 = 1",
        )
        .await
        .unwrap();
        assert_eq!(rows(&a, "SELECT * FROM v").await.unwrap(), 1);
        let err = rows(&b, "SELECT * FROM v").await.unwrap_err().to_string();
        assert!(err.contains("not found"), "{err}");
        // The same connection id gets the same session; a closed one starts afresh.
        assert_eq!(rows(&s.session(1), "SELECT * FROM v").await.unwrap(), 1);
        assert_eq!(s.len(), 2);
        s.close(1);
        assert!(rows(&s.session(1), "SELECT * FROM v").await.is_err());
    }

    #[tokio::test]
    async fn shared_tables_cannot_be_dropped_or_replaced_by_a_client() {
        let s = sessions().await;
        let a = s.session(1);
        // DataFusion reports the refused deregistration as "doesn't exist": the table stays.
        let err = rows(&a, "DROP TABLE shared_t")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("shared_t"), "{err}");
        assert_eq!(rows(&a, "SELECT * FROM shared_t").await.unwrap(), 2);
        let err = rows(&a, "CREATE OR REPLACE VIEW shared_t AS SELECT 1")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("shared by every client"), "{err}");
        assert_eq!(
            rows(&s.session(2), "SELECT * FROM shared_t").await.unwrap(),
            2
        );
    }

    #[tokio::test]
    async fn client_sessions_have_every_epifusion_function() {
        let s = sessions().await;
        let n = rows(&s.session(7), "SELECT * FROM epifusion_functions()")
            .await
            .unwrap();
        assert_eq!(n, epifusion_sql::session::function_names().len());
    }
}

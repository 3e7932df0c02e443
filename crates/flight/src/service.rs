//! The Flight SQL service: statements and prepared statements (planned on `GetFlightInfo`, run
//! on `DoGet`), updates through `DoPut`, and the catalog commands JDBC tools ask for.
//!
//! A ticket carries the statement's SQL, re-planned in the caller's session on `DoGet`: nothing
//! is kept on the server between the two calls, and DDL runs once (on `DoGet`: `GetFlightInfo`
//! only plans).

use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, CommandGetCatalogs, CommandGetDbSchemas,
    CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandPreparedStatementQuery,
    CommandStatementQuery, CommandStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt,
    SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse, IpcMessage,
    SchemaAsIpc, Ticket,
};
use datafusion::common::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use tonic::{Request, Response, Status, Streaming};

use crate::connection::client_info;
use crate::sessions::Sessions;

/// The Flight SQL service over the clients' sessions.
pub struct EpifusionFlightSql {
    sessions: Arc<Sessions>,
    allow_writes: bool,
    query_timeout: Option<Duration>,
}

/// What a refused statement is called in the read-only error
/// ([`epifusion_sql::planning::check_read_only`]).
const CLIENT_STATEMENT: &str =
    "a statement sent to this server (read-only unless started with --allow-writes)";

/// The server's `GetSqlInfo` table (`FlightSqlServerReadOnly` follows `--allow-writes`).
fn sql_info(allow_writes: bool) -> &'static SqlInfoData {
    static WRITABLE: LazyLock<SqlInfoData> = LazyLock::new(|| with_read_only(false));
    static READ_ONLY: LazyLock<SqlInfoData> = LazyLock::new(|| with_read_only(true));
    if allow_writes {
        &WRITABLE
    } else {
        &READ_ONLY
    }
}

fn with_read_only(read_only: bool) -> SqlInfoData {
    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerReadOnly, read_only);
    b.append(SqlInfo::FlightSqlServerName, "epifusion");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    b.append(SqlInfo::FlightSqlServerArrowVersion, "59");
    b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    b.build().unwrap_or_else(|e| panic!("SqlInfo table: {e}"))
}

impl EpifusionFlightSql {
    /// The service; `allow_writes` lets clients run DDL, DML, COPY and SET; `query_timeout`
    /// bounds each statement's planning and each result stream.
    pub fn new(
        sessions: Arc<Sessions>,
        allow_writes: bool,
        query_timeout: Option<Duration>,
    ) -> Self {
        Self {
            sessions,
            allow_writes,
            query_timeout,
        }
    }

    /// The caller's session (a request that came on no known connection gets a fresh one).
    fn session<T>(&self, request: &Request<T>) -> SessionContext {
        match client_info(request) {
            Some(c) => self.sessions.session(c.id),
            None => self.sessions.new_client_session(),
        }
    }

    /// Plan `sql` in `ctx` (nothing runs yet), refused unless read-only when the server is.
    async fn plan(&self, ctx: &SessionContext, sql: &str) -> Result<LogicalPlan, Status> {
        let planning = async {
            let plan = ctx.state().create_logical_plan(sql).await?;
            if !self.allow_writes {
                epifusion_sql::planning::check_read_only(&plan, CLIENT_STATEMENT)?;
            }
            Ok::<_, DataFusionError>(plan)
        };
        let plan = match self.query_timeout {
            Some(limit) => tokio::time::timeout(limit, planning)
                .await
                .map_err(|_| time_limit_status(limit))?,
            None => planning.await,
        };
        plan.map_err(df_status)
    }

    /// Run `plan` in `ctx`: the result stream, ended by an error when it runs past the time
    /// limit (the stream, and the fit behind it, is dropped then).
    async fn execute(
        &self,
        ctx: &SessionContext,
        plan: LogicalPlan,
    ) -> Result<<Self as FlightService>::DoGetStream, Status> {
        let schema = plan_schema(&plan);
        let deadline = self
            .query_timeout
            .map(|limit| (tokio::time::Instant::now() + limit, limit));
        let stream = start(ctx, plan).await.map_err(df_status)?;
        let batches = with_deadline(stream, deadline);
        let flight = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(batches)
            .map_err(flight_status);
        Ok(Box::pin(flight))
    }

    /// A FlightInfo whose one endpoint is `ticket` (on this server).
    fn flight_info(
        schema: &Schema,
        ticket: Vec<u8>,
        descriptor: FlightDescriptor,
    ) -> Result<Response<FlightInfo>, Status> {
        let info = FlightInfo::new()
            .try_with_schema(schema)
            .map_err(|e| Status::internal(format!("cannot encode the result schema: {e}")))?
            .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket)))
            .with_descriptor(descriptor);
        Ok(Response::new(info))
    }
}

/// Execute `plan`: DDL and `SET` take effect here; queries return their stream.
async fn start(
    ctx: &SessionContext,
    plan: LogicalPlan,
) -> datafusion::common::Result<SendableRecordBatchStream> {
    ctx.execute_logical_plan(plan).await?.execute_stream().await
}

/// The result schema a plan advertises (DoGet streams it too: strict clients such as ADBC
/// require the FlightInfo schema and the stream's to match).
fn plan_schema(plan: &LogicalPlan) -> SchemaRef {
    Arc::new(plan.schema().as_arrow().clone())
}

/// `stream` until `deadline`, then one time-limit error and the stream is dropped.
fn with_deadline(
    stream: SendableRecordBatchStream,
    deadline: Option<(tokio::time::Instant, Duration)>,
) -> impl Stream<Item = Result<RecordBatch, FlightError>> + Send {
    futures::stream::unfold(Some(stream), move |stream| async move {
        let mut stream = stream?;
        let next = match deadline {
            Some((at, limit)) => match tokio::time::timeout_at(at, stream.next()).await {
                Ok(next) => next,
                Err(_) => {
                    let e = FlightError::Tonic(Box::new(time_limit_status(limit)));
                    return Some((Err(e), None));
                }
            },
            None => stream.next().await,
        };
        match next? {
            Ok(batch) => Some((Ok(batch), Some(stream))),
            Err(e) => Some((Err(FlightError::Tonic(Box::new(df_status(e)))), None)),
        }
    })
}

fn time_limit_status(limit: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "the statement ran past the server's time limit ({} s, --query-timeout)",
        limit.as_secs_f64()
    ))
}

/// A DataFusion error as a gRPC status: planning mistakes are the client's (invalid argument),
/// memory-pool refusals are resource exhaustion, the rest (a failing fit, bad data) are errors
/// of that statement.
pub fn df_status(e: DataFusionError) -> Status {
    let message = e.strip_backtrace();
    match e.find_root() {
        DataFusionError::Plan(_)
        | DataFusionError::SQL(..)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_)
        | DataFusionError::Configuration(_) => Status::invalid_argument(message),
        DataFusionError::ResourcesExhausted(_) => Status::resource_exhausted(message),
        _ => Status::internal(message),
    }
}

fn flight_status(e: FlightError) -> Status {
    match e {
        FlightError::Tonic(status) => *status,
        other => Status::internal(other.to_string()),
    }
}

/// The SQL a ticket or prepared-statement handle carries.
fn handle_sql(handle: &[u8]) -> Result<String, Status> {
    String::from_utf8(handle.to_vec()).map_err(|_| {
        Status::invalid_argument("the statement handle is not a statement of this server")
    })
}

/// An IPC-encoded schema (prepared-statement results).
fn ipc_schema(schema: &Schema) -> Result<prost::bytes::Bytes, Status> {
    let message: IpcMessage = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(|e| Status::internal(format!("cannot encode the result schema: {e}")))?;
    Ok(message.0)
}

/// One-batch result stream (catalog commands).
fn one_batch(
    schema: SchemaRef,
    batch: Result<RecordBatch, FlightError>,
) -> Response<<EpifusionFlightSql as FlightService>::DoGetStream> {
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(futures::stream::once(async move { batch }))
        .map_err(flight_status);
    Response::new(Box::pin(stream))
}

fn table_types_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "table_type",
        DataType::Utf8,
        false,
    )]))
}

type HandshakeStream = Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>;

#[tonic::async_trait]
impl FlightSqlService for EpifusionFlightSql {
    type FlightService = EpifusionFlightSql;

    /// The bearer token is checked on every call (an interceptor); a handshake has nothing
    /// more to do.
    async fn do_handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<HandshakeStream>, Status> {
        let reply = HandshakeResponse {
            protocol_version: 0,
            payload: Default::default(),
        };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(reply)]))))
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let ctx = self.session(&request);
        let plan = self.plan(&ctx, &query.query).await?;
        let ticket = TicketStatementQuery {
            statement_handle: query.query.into_bytes().into(),
        };
        Self::flight_info(
            &plan_schema(&plan),
            ticket.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let ctx = self.session(&request);
        let sql = handle_sql(&ticket.statement_handle)?;
        let plan = self.plan(&ctx, &sql).await?;
        Ok(Response::new(self.execute(&ctx, plan).await?))
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<arrow_flight::Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let ctx = self.session(&request);
        let plan = self.plan(&ctx, &query.query).await?;
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: query.query.into_bytes().into(),
            dataset_schema: ipc_schema(&plan_schema(&plan))?,
            parameter_schema: ipc_schema(&Schema::empty())?,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        _query: ActionClosePreparedStatementRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<(), Status> {
        // A handle is its SQL: nothing is kept on the server.
        Ok(())
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let ctx = self.session(&request);
        let sql = handle_sql(&query.prepared_statement_handle)?;
        let plan = self.plan(&ctx, &sql).await?;
        Self::flight_info(
            &plan_schema(&plan),
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let ctx = self.session(&request);
        let sql = handle_sql(&query.prepared_statement_handle)?;
        let plan = self.plan(&ctx, &sql).await?;
        Ok(Response::new(self.execute(&ctx, plan).await?))
    }

    async fn do_put_prepared_statement_query(
        &self,
        _query: CommandPreparedStatementQuery,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        Err(Status::unimplemented(
            "statement parameters are not supported: put the values in the SQL",
        ))
    }

    async fn do_put_statement_update(
        &self,
        command: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let ctx = self.session(&request);
        let plan = self.plan(&ctx, &command.query).await?;
        let batches: Vec<RecordBatch> = self.execute_batches(&ctx, plan).await?;
        // DML answers one `count` row; DDL answers nothing (-1: unknown, as Flight SQL says).
        let count = batches
            .first()
            .and_then(|b| b.column_by_name("count"))
            .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
            .filter(|c| !c.is_empty())
            .map_or(-1, |c| i64::try_from(c.value(0)).unwrap_or(i64::MAX));
        Ok(count)
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        Self::flight_info(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let ctx = self.session(&request);
        let mut builder = query.into_builder();
        for name in ctx.catalog_names() {
            builder.append(name);
        }
        let schema = builder.schema();
        Ok(one_batch(schema, builder.build()))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        Self::flight_info(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let ctx = self.session(&request);
        let mut builder = query.into_builder();
        // The builder applies the command's filters.
        for catalog_name in ctx.catalog_names() {
            if let Some(catalog) = ctx.catalog(&catalog_name) {
                for schema_name in catalog.schema_names() {
                    builder.append(&catalog_name, schema_name);
                }
            }
        }
        let schema = builder.schema();
        Ok(one_batch(schema, builder.build()))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        Self::flight_info(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let ctx = self.session(&request);
        let mut builder = query.into_builder();
        for catalog_name in ctx.catalog_names() {
            let Some(catalog) = ctx.catalog(&catalog_name) else {
                continue;
            };
            for schema_name in catalog.schema_names() {
                let Some(schema) = catalog.schema(&schema_name) else {
                    continue;
                };
                for table_name in schema.table_names() {
                    if let Some(table) = schema.table(&table_name).await.map_err(df_status)? {
                        builder
                            .append(
                                &catalog_name,
                                &schema_name,
                                &table_name,
                                table.table_type().to_string(),
                                &table.schema(),
                            )
                            .map_err(flight_status)?;
                    }
                }
            }
        }
        let schema = builder.schema();
        Ok(one_batch(schema, builder.build()))
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Self::flight_info(
            &table_types_schema(),
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_table_types(
        &self,
        _query: CommandGetTableTypes,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let types: ArrayRef = Arc::new(StringArray::from(vec!["BASE TABLE", "VIEW", "TEMPORARY"]));
        let schema = table_types_schema();
        Ok(one_batch(
            schema.clone(),
            RecordBatch::try_new(schema, vec![types]).map_err(FlightError::Arrow),
        ))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query
            .clone()
            .into_builder(sql_info(self.allow_writes))
            .schema();
        Self::flight_info(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let builder = query.into_builder(sql_info(self.allow_writes));
        let schema = builder.schema();
        Ok(one_batch(schema, builder.build()))
    }

    async fn do_get_fallback(
        &self,
        _request: Request<Ticket>,
        message: Any,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        Err(Status::unimplemented(format!(
            "epifusion serve does not support {}",
            message.type_url
        )))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

impl EpifusionFlightSql {
    /// Run `plan` to the end (updates).
    async fn execute_batches(
        &self,
        ctx: &SessionContext,
        plan: LogicalPlan,
    ) -> Result<Vec<RecordBatch>, Status> {
        let deadline = self
            .query_timeout
            .map(|limit| (tokio::time::Instant::now() + limit, limit));
        let stream = start(ctx, plan).await.map_err(df_status)?;
        with_deadline(stream, deadline)
            .map_err(flight_status)
            .try_collect()
            .await
    }
}

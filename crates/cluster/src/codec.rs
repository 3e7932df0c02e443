//! The extension codecs of an epifusion cluster: Ballista's own, plus epifusion's plan nodes
//! ([`EpiExec`]) and planned table-function calls ([`PlannedEpiTable`]).
//!
//! Ballista installs *one* logical and *one* physical extension codec per node, and its own plan
//! nodes (shuffle writers and readers, …) go through them too, so these codecs wrap Ballista's:
//! epifusion's bytes start with a fixed prefix ([`EPI_NODE_MAGIC`],
//! [`epifusion_sql::remote::PLANNED_TABLE_MAGIC`]); everything else is Ballista's. Each
//! epifusion payload carries the epifusion version and is refused by a node of another version.

use std::sync::Arc;

use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::{Result as DfResult, TableReference};
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{AggregateUDF, Extension, LogicalPlan, ScalarUDF, WindowUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use epifusion_sql::exec::{EpiCodec, EpiExec};
use epifusion_sql::fit_table::OneBatchExec;
use epifusion_sql::remote::{decode_planned, encode_planned, PlannedEpiTable};

/// Prefix of an encoded epifusion plan node (the rest is [`EpiCodec`]'s JSON).
pub const EPI_NODE_MAGIC: &[u8] = b"epifusion-node:";

/// Ballista's logical codec plus [`PlannedEpiTable`] (a table-function call with its input
/// plans, encoded by [`encode_planned`] with this codec).
#[derive(Debug, Default)]
pub struct ClusterLogicalCodec {
    ballista: BallistaLogicalExtensionCodec,
}

impl LogicalExtensionCodec for ClusterLogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> DfResult<Extension> {
        self.ballista.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> DfResult<()> {
        self.ballista.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> DfResult<Arc<dyn TableProvider>> {
        match decode_planned(buf, schema.clone(), ctx, self) {
            Some(table) => Ok(Arc::new(table?)),
            None => self
                .ballista
                .try_decode_table_provider(buf, table_ref, schema, ctx),
        }
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> DfResult<()> {
        match node.downcast_ref::<PlannedEpiTable>() {
            Some(table) => encode_planned(table, self, buf),
            None => self
                .ballista
                .try_encode_table_provider(table_ref, node, buf)
                .map_err(|e| {
                    datafusion::common::plan_datafusion_err!(
                        "the table `{table_ref}` cannot be sent to the cluster (only tables \
                         that name their data — Parquet, CSV or JSON files or URLs every node \
                         can read — and epifusion's functions can): {}",
                        e.strip_backtrace()
                    )
                }),
        }
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> DfResult<Arc<dyn FileFormatFactory>> {
        self.ballista.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn FileFormatFactory>,
    ) -> DfResult<()> {
        self.ballista.try_encode_file_format(buf, node)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> DfResult<Arc<ScalarUDF>> {
        self.ballista.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> DfResult<()> {
        self.ballista.try_encode_udf(node, buf)
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> DfResult<Arc<AggregateUDF>> {
        self.ballista.try_decode_udaf(name, buf)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> DfResult<()> {
        self.ballista.try_encode_udaf(node, buf)
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> DfResult<Arc<WindowUDF>> {
        self.ballista.try_decode_udwf(name, buf)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> DfResult<()> {
        self.ballista.try_encode_udwf(node, buf)
    }
}

/// Ballista's physical codec plus [`EpiExec`] (through [`EpiCodec`], which also refuses a fit
/// of a stored design matrix with a clear error).
#[derive(Debug, Default)]
pub struct ClusterPhysicalCodec {
    ballista: BallistaPhysicalExtensionCodec,
    epifusion: EpiCodec,
}

impl PhysicalExtensionCodec for ClusterPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        match buf.strip_prefix(EPI_NODE_MAGIC) {
            Some(rest) => self
                .epifusion
                .try_decode(rest, inputs, ctx, proto_converter),
            None => self.ballista.try_decode(buf, inputs, ctx, proto_converter),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        if node.downcast_ref::<EpiExec>().is_some() || node.downcast_ref::<OneBatchExec>().is_some()
        {
            buf.extend_from_slice(EPI_NODE_MAGIC);
            return self.epifusion.try_encode(node, buf, proto_converter);
        }
        self.ballista.try_encode(node, buf, proto_converter)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> DfResult<Arc<ScalarUDF>> {
        self.ballista.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> DfResult<()> {
        self.ballista.try_encode_udf(node, buf)
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> DfResult<Arc<AggregateUDF>> {
        self.ballista.try_decode_udaf(name, buf)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> DfResult<()> {
        self.ballista.try_encode_udaf(node, buf)
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> DfResult<Arc<WindowUDF>> {
        self.ballista.try_decode_udwf(name, buf)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> DfResult<()> {
        self.ballista.try_encode_udwf(node, buf)
    }
}

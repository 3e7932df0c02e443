"""epifusion in datafusion-python sessions.

Registers epifusion's SQL functions (the ``*_fit`` table functions and ``*_fit_agg``
aggregates, the SCCS and new-user cohort study designs, diagnostics, calibration,
``design_matrix``, ``epifusion_functions``) into a ``datafusion.SessionContext`` through
DataFusion's FFI, and OMOP-CDM stores as tables::

    import datafusion, epifusion
    ctx = datafusion.SessionContext()
    epifusion.register(ctx)
    epifusion.register_omop(ctx, "data/gibleed")        # or "s3://bucket/store"
    ctx.sql("SELECT * FROM cox_fit('SELECT time, status - 1 AS y, age, sex FROM lung')").to_pandas()

Results are ordinary DataFusion DataFrames (``.to_arrow_table()``, ``.to_pandas()``,
``.to_polars()``); errors are raised as Python exceptions carrying epifusion's message.

Built against datafusion-python 55.0.0 (DataFusion 55.2, ``datafusion-ffi`` 55.2): use that
version of the ``datafusion`` package.
"""

from __future__ import annotations

import datafusion
from datafusion.user_defined import AggregateUDF, TableFunction

from ._epifusion import __version__, function_names, functions, omop_tables

__all__ = ["register", "register_omop", "function_names", "__version__"]


def register(ctx: datafusion.SessionContext) -> list[str]:
    """Register every epifusion function in ``ctx``; returns their names.

    Table functions go through ``ctx.register_udtf`` (``__datafusion_table_function__``),
    aggregates through ``ctx.register_udaf`` (``__datafusion_aggregate_udf__``). Input queries
    passed to the functions (``cox_fit('SELECT … FROM t')``) are planned in ``ctx``'s
    catalog: they see its tables and views. Matrices stored by ``design_matrix`` are shared by
    the functions of one ``register`` call.
    """
    names = []
    for f in functions(ctx):
        if hasattr(f, "__datafusion_aggregate_udf__"):
            ctx.register_udaf(AggregateUDF.from_pycapsule(f))
        else:
            ctx.register_udtf(TableFunction(f.name, f, ctx))
        names.append(f.name)
    return names


def register_omop(ctx: datafusion.SessionContext, location: str) -> list[str]:
    """Register the OMOP-CDM tables of the store at ``location`` in ``ctx``; returns their names.

    ``location`` is a local folder or an object-store URL (``file://``, ``s3://``, ``gs://``,
    ``az://``, ``http(s)://``) holding ``person.parquet`` (or ``.csv``) and the other CDM
    tables. Columns get epifusion's types (ids Int64, dates Date32) as in ``epifusion sql
    --omop``. Object stores are epifusion's own, configured from the environment (``AWS_*``,
    ``GOOGLE_*``, ``AZURE_*`` variables, as for the CLI): ``ctx`` needs no
    ``register_object_store``.
    """
    names = []
    for name, table in omop_tables(str(location)):
        ctx.register_table(name, table)
        names.append(name)
    return names


"""epifusion from Python.

Two ways in:

* :class:`SessionContext` — an epifusion session (the one ``epifusion sql`` runs): every
  function registered, an optional OMOP store, object stores from the environment. Results are
  ``pyarrow.Table`` objects (``.to_pandas()``, ``polars.from_arrow``)::

      import epifusion
      ctx = epifusion.SessionContext(omop="data/gibleed")   # or "s3://bucket/store"
      ctx.sql("CREATE EXTERNAL TABLE lung STORED AS CSV LOCATION 'tests/data/survival_lung.csv'")
      fit = ctx.sql("SELECT * FROM cox_fit('SELECT time, status - 1 AS y, age, sex FROM lung')")

* :func:`register` / :func:`register_omop` — registration into a ``datafusion.SessionContext``
  (datafusion-python 55.0.0) through DataFusion's FFI; see the README.

Errors raise :class:`EpifusionError` (a ``RuntimeError``) with epifusion's message — the one
``epifusion sql`` prints after ``error:``.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pyarrow.ipc

from . import _epifusion
from ._epifusion import EpifusionError, __version__, function_names, has_ffi

__all__ = [
    "SessionContext",
    "EpifusionError",
    "register",
    "register_omop",
    "function_names",
    "has_ffi",
    "__version__",
]


class SessionContext:
    """An epifusion session (see the module documentation).

    Args:
        omop: an OMOP-CDM store (folder or object-store URL) whose tables are registered.
        batch_size: DataFusion's batch size (default 8192).
    """

    def __init__(self, omop: str | os.PathLike | None = None, batch_size: int | None = None):
        self._ctx = _epifusion.SessionContext(
            None if omop is None else os.fspath(omop), batch_size
        )

    def sql(self, sql: str) -> pa.Table:
        """Run ``sql`` (one or more ``;``-separated statements); the last one's result."""
        data = self._ctx.sql_ipc(sql)
        return pa.ipc.open_stream(data).read_all()

    def register_omop(self, location: str | os.PathLike) -> list[str]:
        """Register the OMOP-CDM tables of the store at ``location``; returns their names."""
        return self._ctx.register_omop(os.fspath(location))

    def register_table(self, name: str, table: Any) -> None:
        """Register a pyarrow table (or anything ``pyarrow.table()`` accepts, e.g. a pandas
        DataFrame) as the in-memory table ``name``, replacing one of that name."""
        table = table if isinstance(table, pa.Table) else pa.table(table)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        self._ctx.register_ipc(name, sink.getvalue().to_pybytes())

    def table_names(self) -> list[str]:
        """Names of the session's tables."""
        return sorted(self._ctx.table_names())


def register(ctx: Any) -> list[str]:
    """Register every epifusion function in the ``datafusion.SessionContext`` ``ctx`` through
    DataFusion's FFI; returns their names."""
    from datafusion.user_defined import AggregateUDF, TableFunction

    names = []
    for f in _epifusion.functions(ctx):
        if hasattr(f, "__datafusion_aggregate_udf__"):
            ctx.register_udaf(AggregateUDF.from_pycapsule(f))
        else:
            ctx.register_udtf(TableFunction(f.name, f, ctx))
        names.append(f.name)
    return names


def register_omop(ctx: Any, location: str | os.PathLike) -> list[str]:
    """Register the OMOP-CDM tables at ``location`` in the ``datafusion.SessionContext``
    ``ctx``, scanning through epifusion's own object stores; returns their names."""
    names = []
    for name, table in _epifusion.omop_tables(os.fspath(location)):
        ctx.register_table(name, table)
        names.append(name)
    return names

//! Arrow / Parquet / CSV glue.

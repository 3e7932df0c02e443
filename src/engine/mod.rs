//! Arrow / Parquet / CSV glue and option parsing.

pub mod options;

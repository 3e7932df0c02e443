//! Arrow / Parquet / CSV glue: reading the long and wide input formats into a
//! [`crate::model::design::DesignBuilder`] and writing result tables ([`convert`]).

pub mod convert;

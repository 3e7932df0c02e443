//! Arrow / Parquet / CSV glue: reading the long and wide input formats into a
//! [`crate::model::design::DesignBuilder`] and writing result tables ([`convert`]); JSON fit
//! options ([`options`]).

pub mod convert;
pub mod options;

//! Arrow / Parquet / CSV glue and the DataFusion layer.
//!
//! * [`convert`]: reading the long and wide input formats into a
//!   [`epifusion_core::model::design::DesignBuilder`] and writing result tables;
//! * [`options`]: JSON fit options;
//! * [`docs`]: the documentation of every SQL function (`SELECT * FROM epifusion_functions()`);
//! * [`design_table`]: `design_matrix`, matrices kept in the session for reuse;
//! * [`study`]: SCCS intervals and new-user cohort risk sets built from an OMOP store;
//! * [`session`], [`fit_table`], [`fit_udaf`], [`omop`], [`store`], [`shell`]: SQL sessions, the fitting table
//!   functions, OMOP stores, object stores and the `epifusion sql` front end.

pub mod calibration;
pub mod cancel_scope;
pub mod cohort_ps;
pub mod convert;
pub mod design_table;
pub mod docs;
pub mod exec;
pub mod fit_table;
pub mod fit_udaf;
pub mod named_source;
pub mod omop;
pub mod options;
pub mod planning;
pub mod registry;
pub mod remote;
pub mod remote_task;
pub mod session;
pub mod shell;
pub mod store;
pub mod study;
pub mod unnest_keys;

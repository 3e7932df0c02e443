//! Integration tests, compiled as one binary.

mod ballista;
mod cli;
mod cohort_ps;
mod cohort_small;
mod cohort_synth;
mod docs;
mod fit_api;
mod flight;
mod fuzz;
mod golden_cox;
mod golden_fine_gray;
mod golden_sccs;
mod golden_support;
mod gpu_parity;
mod oracle;
mod pipeline;
mod sccs_diagnostics;
mod sccs_many;
mod sccs_windows;
mod selection;
mod sql;
mod study;

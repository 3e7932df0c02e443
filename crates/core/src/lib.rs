//! # epifusion-core
//!
//! The numerics of epifusion: self-controlled case series (conditional Poisson), Cox and
//! Fine–Gray models (plus logistic, Poisson and conditional logistic regression) fitted by cyclic
//! coordinate descent on sparse design matrices.
//!
//! Layers (one direction of dependency): [`model`] (design matrix, likelihoods, priors, CCD,
//! inference, CV and bootstrap) → [`backend`] (the CPU backend and the [`backend::GpuBackend`]
//! trait a GPU crate implements) → [`fit`] (the fit API). This crate has no Arrow, Parquet,
//! DataFusion, tokio or CUDA dependency (Cargo enforces it): `cargo test -p epifusion-core`
//! builds none of them. [`bench`] holds the seeded data generators of `epifusion bench`;
//! [`calibration`] the empirical calibration of estimates with negative controls; [`cohort`] the
//! comparative cohort maths of CohortMethod (propensity scores, matching, stratification, IPTW,
//! covariate balance, MDRR, diagnostics, Kaplan–Meier); [`memory`] hands freed memory back to
//! the operating system after a build's large frees.
#![warn(missing_docs)]

pub mod backend;
pub mod bench;
pub mod calibration;
pub mod cancel;
pub mod cohort;
pub mod error;
pub mod fit;
pub mod memory;
pub mod model;
pub mod options;
pub mod sccs_diagnostics;

pub use error::{Error, Result};

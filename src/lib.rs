//! # epifusion
//!
//! Large-scale regularized regression for drug-safety and comparative-effectiveness research:
//! self-controlled case series (conditional Poisson), Cox and Fine–Gray models (plus logistic,
//! Poisson and conditional logistic regression) fitted by cyclic coordinate descent.
//!
//! Layers (one direction of dependency): [`model`] (pure numerics) → [`backend`] (CPU, later
//! CUDA) → [`engine`] (Arrow / Parquet / CSV glue) → [`pipeline`] (study files run by
//! `epifusion run`) → the `epifusion` CLI.
#![warn(missing_docs)]

pub mod backend;
pub mod bench;
pub mod engine;
pub mod error;
pub mod fit;
pub mod model;
pub mod pipeline;

pub use error::{Error, Result};

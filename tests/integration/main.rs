//! Integration tests, compiled as one binary.

mod fit_api;

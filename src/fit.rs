//! The high-level fitting API.

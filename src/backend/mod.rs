//! Compute backends (CPU now; CUDA later).

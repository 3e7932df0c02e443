#!/bin/sh
# Host emulation of the CUDA kernels (no GPU needed; g++ ≥ 11 with C++20 <barrier>): part of
# `cargo test` (crates/cuda/src/layout.rs, `emulation`): the Rust test writes layouts and
# reference values, compiles risk_set.cpp and ccd.cpp with g++, and each kernel runs on one host
# thread per CUDA thread. Checks the kernels' logic only; performance and the GPU memory model
# need a GPU. This script runs just that test, with its output.
set -e
cd "$(dirname "$0")/../.."
exec cargo test --locked -p epifusion-cuda --lib emulation -- --nocapture

#!/bin/sh
# Host emulation of the CUDA kernels (no GPU needed; g++ ≥ 11 with C++20 <barrier>): part of
# `cargo test` (crates/cuda/src/emulation.rs): the Rust tests write layouts and reference values,
# compile risk_set.cpp and ccd.cpp with g++, and each kernel runs on one host thread per CUDA
# thread; ccd.cpp is the device's coordinate stepper, driven by the core's CCD driver. Checks the kernels' logic only; performance and the GPU memory model
# need a GPU. This script runs just that test, with its output.
set -e
cd "$(dirname "$0")/../.."
exec cargo test --locked -p epifusion-cuda --lib emulation -- --nocapture

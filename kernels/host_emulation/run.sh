#!/bin/sh
# Host emulation of the CUDA kernels (no GPU needed; g++ ≥ 11 with C++20 <barrier>): the Rust
# test writes layouts and reference values, each kernel runs on one host thread per CUDA thread.
# Checks the kernels' logic only; performance and the GPU memory model need a GPU.
set -e
cd "$(dirname "$0")"
dir=${EPI_DUMP_DIR:-/tmp/epi_emulation}
export EPI_DUMP_DIR="$dir"
(cd ../.. && cargo test --locked --lib emulation_dump -- --ignored --quiet)
g++ -std=c++20 -O1 -pthread -Wall -Wno-unknown-pragmas risk_set.cpp -o "$dir/risk_set"
"$dir/risk_set" "$dir"/risk_set_case*.txt
g++ -std=c++20 -O1 -pthread -Wall -Wno-unknown-pragmas ccd.cpp -o "$dir/ccd"
"$dir/ccd" "$dir"/ccd_case*.txt

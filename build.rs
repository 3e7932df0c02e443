//! Link the `epifusion` executable as a position-dependent executable on Linux (glibc).
//!
//! A position-independent executable of this size carries ~300k relative relocations (7 MB of
//! `.rela.dyn`) that the dynamic loader applies at every start, writing ~5 MB of
//! `.data.rel.ro` pages: measured, 6.0 → 3.1 ms of CPU for `epifusion sql` running `SELECT 1`
//! (`perf stat -r 20`), a share of every short run (README "Benchmarks"). Linked at a fixed
//! address, none remain. The objects stay position-independent (the library and the tests are
//! unaffected); only the final link of the binaries changes, and the binary loses address
//! randomization of its own code (not of the heap, stack or shared libraries).

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

//! Handing freed memory back to the operating system.

/// Return the allocator's free memory to the operating system: glibc's `malloc_trim(0)`, which
/// releases the free pages inside every heap (not only at a heap's top); a no-op with other C
/// libraries and platforms.
///
/// glibc keeps memory freed in the middle of its heaps, and after a large block is freed it
/// serves blocks up to that size from the heaps rather than from fresh mappings, so a build that
/// frees a large structure and then allocates others keeps the freed pages resident at its peak
/// (at 1e6 SCCS cases, ~40 MB of a 270 MB peak). Large SCCS builds call this after they free
/// the row data and after they free the unmerged columns. It costs a walk over the free chunks,
/// and the pages it released are faulted in again when reused (README "Benchmarks").
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: `malloc_trim` takes glibc's allocator locks itself and only releases pages of
        // free chunks; it may be called from any thread at any time. Rust's global allocator
        // on this target is glibc's malloc (the crates set no other).
        unsafe {
            malloc_trim(0);
        }
    }
}

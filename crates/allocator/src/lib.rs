//! The memory allocator of every revstore process, and its tuning.
//!
//! Services allocate many short-lived buffers of megabytes on many threads
//! (zstd contexts and windows, decoded blocks, render bodies), in Rust and in
//! C (zstd, SQLite). glibc's malloc kept them in per-thread arenas, and
//! old-store's resident memory grew far past its block cache under load;
//! mimalloc, as Rust's allocator and (its `override` feature) as C's `malloc`,
//! gives freed memory back to the system. Two of its defaults still kept a
//! process far above its memory budget (BENCHMARKS.md, "Memory under a long mixed load"),
//! and [`tune`] changes them:
//!
//! - **purge delay** 1 s → 0. mimalloc v3 returns a freed page to the
//!   system only when the thread that owns it next calls the allocator after
//!   the delay; a blocking-pool thread that goes idle keeps what it freed
//!   until it exits. Purging at once costs some throughput (a system call per
//!   freed page run) and bounds the process.
//! - **transparent huge pages** off: with THP, touching one byte of an arena
//!   faults in 2 MiB, and a partly used huge page cannot be given back.
//!   mimalloc is built without asking for them (`no_thp`), and the process
//!   opts out of them where the kernel gives them unasked (`always` mode).
//!
//! `MIMALLOC_PURGE_DELAY` in the environment, read by mimalloc as the process
//! loads, still wins over [`tune`]'s choice.

use std::os::raw::{c_int, c_long};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc v3's `mi_option_e` (`mimalloc.h`);
/// [`tests::the_option_index_is_mimallocs_purge_delay`] checks it against the
/// linked library's default.
const MI_OPTION_PURGE_DELAY: c_int = 15;

/// mimalloc's purge delay by default, in milliseconds.
#[cfg(test)]
const DEFAULT_PURGE_DELAY_MS: c_long = 1000;

// The two entry points of mimalloc's option API (linked in by `mimalloc`'s
// static library); declared here rather than through `libmimalloc-sys`'s
// `extended` feature, which does not name this option.
#[allow(unsafe_code)]
unsafe extern "C" {
    fn mi_option_get(option: c_int) -> c_long;
    fn mi_option_set(option: c_int, value: c_long);
}

/// What [`tune`] did, for the start-up log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    /// The purge delay in force, in milliseconds.
    pub purge_delay_ms: c_long,
    /// Whether the process opted out of transparent huge pages (false where
    /// the kernel has no such switch).
    pub huge_pages_disabled: bool,
}

/// Sets the allocator up for a bounded process: call first thing in `main`,
/// before the runtime starts its threads. Idempotent.
pub fn tune() -> Tuning {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() && std::env::var_os("MIMALLOC_RESET_DELAY").is_none() {
        set_purge_delay(0);
    }
    let huge_pages_disabled = rustix::thread::disable_transparent_huge_pages(true).is_ok();
    Tuning { purge_delay_ms: purge_delay(), huge_pages_disabled }
}

fn purge_delay() -> c_long {
    // SAFETY: `mi_option_get` reads one entry of mimalloc's option table; any
    // index below `_mi_option_last` is valid, and it takes no pointers.
    #[allow(unsafe_code)]
    unsafe {
        mi_option_get(MI_OPTION_PURGE_DELAY)
    }
}

fn set_purge_delay(ms: c_long) {
    // SAFETY: `mi_option_set` stores one integer in mimalloc's option table
    // (a plain store, read again by every purge decision); the index is
    // checked by this crate's test, and it takes no pointers.
    #[allow(unsafe_code)]
    unsafe {
        mi_option_set(MI_OPTION_PURGE_DELAY, ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_index_is_mimallocs_purge_delay() {
        // The test binary's environment may set it; then mimalloc read that.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() || std::env::var_os("MIMALLOC_RESET_DELAY").is_some() {
            return;
        }
        // Before tuning, the option at this index holds mimalloc's default
        // purge delay: a mimalloc upgrade that renumbers its options fails here.
        assert_eq!(purge_delay(), DEFAULT_PURGE_DELAY_MS);
        let tuning = tune();
        assert_eq!(tuning.purge_delay_ms, 0);
        assert_eq!(purge_delay(), 0);
        if tuning.huge_pages_disabled {
            assert!(rustix::thread::transparent_huge_pages_are_disabled().unwrap_or(false));
        }
    }
}

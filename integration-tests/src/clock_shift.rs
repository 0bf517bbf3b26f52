//! A preload library that shifts what a process reads as the time of day
//! (`clock_gettime` on the realtime clocks, which `SystemTime::now` uses) by
//! `REVSTORE_TEST_CLOCK_OFFSET_MS`; the monotonic clock, which timers use,
//! stays true: the services of a test on clocks of their own, as replicas'
//! and sites' clocks differ. Built with the C compiler: libfaketime, which
//! does this too, crashes on start in a process whose `malloc` is mimalloc
//! (its constructor's failed `dlsym` frees glibc's error string through
//! mimalloc).

use std::path::{Path, PathBuf};
use std::process::Command;

const CLOCK_SHIFT_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static long long offset_ns;

__attribute__((constructor)) static void init(void) {
    real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    const char *ms = getenv("REVSTORE_TEST_CLOCK_OFFSET_MS");
    offset_ns = ms ? atoll(ms) * 1000000LL : 0;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int r = real_clock_gettime(clock, ts);
    if (r == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns;
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return r;
}
"#;

/// Builds the clock-shifting library into `dir`; its path.
pub fn library(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("the shim's directory");
    let source = dir.join("clock_shift.c");
    let library = dir.join("libclock_shift.so");
    std::fs::write(&source, CLOCK_SHIFT_C).expect("write the shim's source");
    let built = Command::new("cc").args(["-shared", "-fPIC", "-O2", "-o"]).arg(&library).arg(&source).arg("-ldl").output().expect("run cc");
    assert!(built.status.success(), "cc: {}", String::from_utf8_lossy(&built.stderr));
    library
}

/// The environment that puts a process on a clock `offset_ms` from the true
/// time (negative: behind), with `library` from [`library`].
pub fn env(library: &Path, offset_ms: i64) -> Vec<(String, String)> {
    vec![("LD_PRELOAD".to_owned(), library.display().to_string()), ("REVSTORE_TEST_CLOCK_OFFSET_MS".to_owned(), offset_ms.to_string())]
}

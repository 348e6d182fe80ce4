//! What the process has used and may use: CPU time, for the per-I/O
//! figures the benchmark and the target's stats report, and the open files
//! limit.

use std::time::Duration;

/// CPU time (user and system) this process has used so far, all threads.
pub fn process_cpu() -> Duration {
    // SAFETY: rusage is plain data; zeroed is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is writable; RUSAGE_SELF needs nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let t = |tv: libc::timeval| {
        Duration::new(
            tv.tv_sec.max(0) as u64,
            tv.tv_usec.clamp(0, 999_999) as u32 * 1000,
        )
    };
    t(u.ru_utime) + t(u.ru_stime)
}

/// CPU time the calling thread has used so far.
pub fn thread_cpu() -> Duration {
    // SAFETY: timespec is plain data; zeroed is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is writable; the clock id is a constant the kernel knows.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// Raises the soft open files limit to the hard one (every connection is a
/// descriptor); the limits before and after when it moved.
pub fn raise_open_files_limit() -> std::io::Result<Option<(u64, u64)>> {
    raise_open_files_limit_to(0)
}

/// Raises the soft open files limit to the hard one, and both to `needed`
/// when the hard one is lower (which takes CAP_SYS_RESOURCE); the soft
/// limits before and after when it moved. An error when the limit stays
/// below `needed`.
pub fn raise_open_files_limit_to(needed: u64) -> std::io::Result<Option<(u64, u64)>> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    let want = lim.rlim_max.max(needed);
    if before >= want {
        return Ok(None);
    }
    lim.rlim_cur = want;
    lim.rlim_max = want;
    // SAFETY: a valid rlimit, read above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Some((before, want)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work() {
        let before = process_cpu();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(process_cpu() > before, "50 ms of spinning used no CPU time");
    }

    /// Spins until this thread's CPU time grew by `cpu`; false if that took
    /// longer than 30 s of wall time (a loaded machine only slows it down).
    fn spin_for_cpu(cpu: Duration) -> bool {
        let (start, from) = (std::time::Instant::now(), thread_cpu());
        let mut x = 0u64;
        while thread_cpu() - from < cpu {
            if start.elapsed() > Duration::from_secs(30) {
                return false;
            }
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        true
    }

    #[test]
    fn thread_cpu_time_counts_this_thread_only() {
        let before = thread_cpu();
        let spun = std::thread::spawn(|| spin_for_cpu(Duration::from_millis(200)))
            .join()
            .expect("spinner");
        assert!(
            spun,
            "another thread's spinning never showed in its own CPU time"
        );
        let idle = thread_cpu() - before;
        assert!(
            idle < Duration::from_millis(100),
            "another thread's 200 ms counted: {idle:?}"
        );
        assert!(
            spin_for_cpu(Duration::from_millis(50)),
            "50 ms of this thread's spinning never showed in its CPU time"
        );
    }
}

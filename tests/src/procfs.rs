//! What `/proc` says about a process: descriptors, CPU time, memory.

use std::fs;
use std::time::Duration;

/// Number of open file descriptors of process `pid`.
pub fn fd_count(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/fd: {e}"))
        .count()
}

/// CPU time (user and system, all threads) process `pid` has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/stat: {e}"));
    // After the command's closing parenthesis: utime and stime are the 12th
    // and 13th fields, in clock ticks.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let ticks: u64 = rest
        .split(' ')
        .skip(11)
        .take(2)
        .map(|x| x.parse::<u64>().expect("a tick count"))
        .sum();
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

/// Resident set size (VmRSS) of process `pid`, in KiB.
pub fn vm_rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// Threads of process `pid`.
pub fn thread_count(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/task: {e}"))
        .count()
}

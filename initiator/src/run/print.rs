//! What the subcommands print besides their results' own formats: a
//! discovery log entry, the benchmark's progress line.

use rdmablk::bench::Progress;
use rdmablk::host::Transport;
use rdmablk_common::fabrics::discovery::{adrfam, eflags, subtype, treq, DiscoveryEntry};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Prints discovery log entry `i` as `nvme discover` does.
pub(crate) fn print_entry(i: usize, e: &DiscoveryEntry) {
    let trtype = Transport::from_trtype(e.trtype).map_or("unrecognized", Transport::name);
    let adrfam = match e.adrfam {
        adrfam::IPV4 => "ipv4",
        adrfam::IPV6 => "ipv6",
        _ => "unrecognized",
    };
    let subtype = match e.subtype {
        subtype::NVME => "nvme subsystem",
        subtype::REFERRAL => "discovery subsystem referral",
        subtype::CURRENT_DISCOVERY => "current discovery subsystem",
        _ => "unrecognized",
    };
    let treq = match e.treq & 3 {
        1 => "required",
        2 => "not required",
        _ => "not specified",
    };
    println!("=====Discovery Log Entry {i}======");
    println!("trtype:  {trtype}");
    println!("adrfam:  {adrfam}");
    println!("subtype: {subtype}");
    let sqflow = if e.treq & treq::SQ_FLOW_CONTROL_DISABLE != 0 {
        ", sq flow control disable supported"
    } else {
        ""
    };
    println!("treq:    {treq}{sqflow}");
    let flags: Vec<&str> = [
        (eflags::EPCSD, "explicit discovery connections"),
        (eflags::DUPRETINFO, "duplicate discovery information"),
    ]
    .iter()
    .filter(|(bit, _)| e.eflags & bit != 0)
    .map(|(_, name)| *name)
    .collect();
    if !flags.is_empty() {
        println!("eflags:  {}", flags.join(", "));
    }
    println!("portid:  {}", e.portid);
    println!("trsvcid: {}", e.trsvcid);
    println!("subnqn:  {}", e.subnqn);
    println!("traddr:  {}", e.traddr);
}

/// Prints IOPS, bandwidth and errors every second until `done`.
pub(crate) fn print_progress(progress: &Progress, done: &AtomicBool) {
    let start = Instant::now();
    let mut last = (0u64, 0u64);
    let mut shown = 0;
    while !done.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        let secs = start.elapsed().as_secs();
        if secs == shown {
            continue;
        }
        shown = secs;
        let ios = progress.reads.load(Ordering::Relaxed) + progress.writes.load(Ordering::Relaxed);
        let bytes = progress.bytes.load(Ordering::Relaxed);
        eprint!(
            "\r[{:>4.0}s] {:>10.0} IOPS {:>9.1} MiB/s  errors {}   ",
            start.elapsed().as_secs_f64(),
            (ios - last.0) as f64,
            (bytes - last.1) as f64 / (1 << 20) as f64,
            progress.errors.load(Ordering::Relaxed)
        );
        last = (ios, bytes);
    }
    eprintln!();
}

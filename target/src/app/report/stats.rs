//! The stats file: counters an operator (or a test) can read while the
//! daemon runs, rewritten atomically every second. `io_commands` and
//! `cpu_us` (the process's CPU time) only grow: their changes between two
//! readings give the CPU time per I/O of that interval; `cpu_us_per_io` is
//! their ratio since the start.

use crate::engine::poller::Shared;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The counters as one JSON object.
fn render(shared: &Shared, started: Instant) -> String {
    let r = &shared.registry;
    let controllers: usize = r
        .subsystems()
        .iter()
        .chain([&r.discovery])
        .map(|s| s.controller_count())
        .sum();
    let buffers: Vec<String> = shared
        .buffers_in_use
        .iter()
        .map(|b| b.load(Ordering::Relaxed).to_string())
        .collect();
    let io_commands: u64 = shared
        .io_commands
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum();
    let cpu_us = rdmablk_common::usage::process_cpu().as_micros() as u64;
    let per_io = if io_commands == 0 {
        0.0
    } else {
        cpu_us as f64 / io_commands as f64
    };
    format!(
        "{{\"uptime_s\":{},\"connections\":{},\"queues_connected\":{},\"controllers\":{},\"arena_buffers_in_use\":[{}],\"io_commands\":{io_commands},\"cpu_us\":{cpu_us},\"cpu_us_per_io\":{per_io:.2}}}\n",
        started.elapsed().as_secs(),
        shared.connections.load(Ordering::Acquire),
        r.admission.queues_connected(),
        controllers,
        buffers.join(",")
    )
}

/// Writes the stats file every second until the daemon stops.
pub fn write_every_second(path: &Path, shared: &Shared) {
    let started = Instant::now();
    let tmp = path.with_extension("tmp");
    let mut warned = false;
    while !shared.stop.load(Ordering::Acquire) {
        let written = std::fs::write(&tmp, render(shared, started))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            if !warned {
                tracing::warn!("cannot write the stats file {}: {e}", path.display());
                warned = true;
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

//! `rdmablk bench`.

use super::params::open;
use super::print::print_progress;
use crate::cli::BenchArgs;
use rdmablk::bench::{self, Bench, Job, Progress, Stats};
use rdmablk::frontend::keeper::{EngineSpec, Engines, Keeper, Until};
use rdmablk::signals::stop_set;
use rdmablk_common::units;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs the benchmark on every queue and prints the result.
pub(crate) fn run(b: &BenchArgs) -> Result<ExitCode, String> {
    let bs = units::parse_size(&b.bs).map_err(|e| format!("--bs: {e}"))? as usize;
    let runtime = units::parse_duration(&b.runtime).map_err(|e| format!("--runtime: {e}"))?;
    let poll = b.poll.mode()?;
    if b.qd == 0 || b.qd > 4096 {
        return Err(format!("--qd {}: use 1 to 4096", b.qd));
    }
    if b.queues == 0 {
        return Err("--queues 0: use at least 1".into());
    }
    let att = open(&b.subsys, b.queues).map_err(|e| e.to_string())?;
    let ns = att.ns;
    let block = ns.block_size as usize;
    if bs == 0 || !bs.is_multiple_of(block) || bs > rdmablk_common::mem::MAX_BUF {
        return Err(format!(
            "--bs {}: use a multiple of the namespace's {block}-byte blocks, at most {}",
            b.bs,
            units::format_size(rdmablk_common::mem::MAX_BUF as u64)
        ));
    }
    if b.verify && ns.read_only {
        return Err("--verify writes, but the namespace is read-only".into());
    }
    let queues = att.io_queues().min(b.queues) as u64;
    let units_total = ns.size_bytes() / bs as u64;
    if units_total < queues {
        return Err(format!(
            "the namespace ({} bytes) is smaller than {queues} I/Os of --bs",
            ns.size_bytes()
        ));
    }
    let per_queue = units_total / queues;
    let run_id = (std::process::id() as u64) << 32
        ^ Instant::now().elapsed().as_nanos() as u64
        ^ now_nanos();
    let progress = Arc::new(Progress::default());
    spawn_signal_watch(progress.clone());
    let cpu_before = rdmablk_common::usage::process_cpu();
    let qd = b.qd.min(att.queue_size() as usize - 1).max(1);
    let max_transfer = att.max_transfer();
    let keeper = Keeper::new(att, Duration::from_secs(b.ctrl_loss_tmo));
    let spec = EngineSpec {
        queues: queues as u16,
        arena_bytes: (qd * bs.next_power_of_two().max(4096) + (8 << 20)).next_multiple_of(4 << 20),
        name: "bench",
        poll,
    };
    let engines = Engines::spawn(&keeper, spec, |q, _| {
        let q = q as u64;
        let job = Job {
            pattern: b.rw,
            bs,
            qd,
            runtime,
            verify: b.verify,
            ns,
            first_unit: q * per_queue,
            units: per_queue,
            max_transfer,
            run_id,
        };
        Ok(Bench::new(
            job,
            progress.clone(),
            run_id ^ (q + 1).wrapping_mul(0x9e37_79b9),
        ))
    })?;
    let done = AtomicBool::new(false);
    let watched = std::thread::scope(|s| {
        s.spawn(|| print_progress(&progress, &done));
        let w = keeper.watch(&engines, Until::EnginesDone);
        done.store(true, Ordering::Release);
        w
    });
    if let Err(e) = &watched.result {
        // No path for ctrl-loss-tmo: the drivers end with what ran.
        progress.stop.store(true, Ordering::Relaxed);
        engines.wake_all();
        eprintln!("rdmablk: {e}");
    }
    let (failure, benches) = engines.join();
    let mut total = Stats::default();
    for bench in benches {
        total.merge(&bench.stats);
        for p in bench.problems {
            eprintln!("rdmablk: {p}");
        }
    }
    total.cpu = rdmablk_common::usage::process_cpu().saturating_sub(cpu_before);
    for s in watched.sessions {
        if let Err(e) = s.shutdown() {
            tracing::warn!("controller shutdown: {e}");
        }
    }
    if b.subsys.target.data_digest || b.subsys.target.hdr_digest {
        tracing::debug!("digests were on");
    }
    if b.json {
        println!("{}", bench::to_json(&total));
    } else {
        print!("{}", bench::to_text(&total));
    }
    if let Some(e) = failure.or(watched.result.err()) {
        eprintln!("rdmablk: I/O queue failed: {e}");
        return Ok(ExitCode::FAILURE);
    }
    let errors = total.read.errors + total.write.errors;
    if errors > 0 || total.verify_errors > 0 {
        eprintln!(
            "rdmablk: {errors} I/O errors, {} verify mismatches",
            total.verify_errors
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Ends the benchmark early on SIGINT/SIGTERM, reporting what ran.
fn spawn_signal_watch(progress: Arc<Progress>) {
    let set = stop_set();
    if set.thread_block().is_err() {
        return;
    }
    std::thread::spawn(move || {
        if set.wait().is_ok() {
            progress.stop.store(true, Ordering::Relaxed);
        }
    });
}

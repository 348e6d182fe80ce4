//! NVMe/TCP throughput of `rdmablk-target` as seen by the test host: 4 KiB
//! random reads (IOPS) and 128 KiB sequential reads (MiB/s). Prints numbers,
//! asserts nothing about them.
//!
//! ```text
//! cargo build --release
//! cargo run --release -p rdmablk-tests --example tcp_bench -- [--secs 5] [--qd 32] [--queues 1]
//!     [--addr 127.0.0.1:4420 --nqn NQN]
//! ```
//! Without `--addr` it starts its own daemon with a 1 GiB memory namespace
//! (log level `warn` unless `RUST_LOG` says otherwise).

use rdmablk_common::nvme::identify::{cns, NamespaceId};
use rdmablk_common::nvme::nvm;
use rdmablk_tests::client::{Controller, Opts, Queue};
use rdmablk_tests::{Rng, Target};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: tcp_bench [--secs N] [--qd N] [--queues N] [--addr IP:PORT --nqn NQN]";

struct Args {
    secs: u64,
    qd: usize,
    queues: u16,
    addr: Option<SocketAddr>,
    nqn: String,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        secs: 5,
        qd: 32,
        queues: 1,
        addr: None,
        nqn: "nqn.2026-11.io.rdmablk:default".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        let bad = |v: &str| format!("bad value {v:?} for {flag}\n{USAGE}");
        match flag.as_str() {
            "--secs" => a.secs = value()?.parse().map_err(|_| bad("secs"))?,
            "--qd" => a.qd = value()?.parse().map_err(|_| bad("qd"))?,
            "--queues" => a.queues = value()?.parse().map_err(|_| bad("queues"))?,
            "--addr" => a.addr = Some(value()?.parse().map_err(|_| bad("addr"))?),
            "--nqn" => a.nqn = value()?,
            _ => return Err(USAGE.into()),
        }
    }
    if a.qd == 0 || a.queues == 0 || a.secs == 0 {
        return Err(format!(
            "--secs, --qd and --queues must be positive\n{USAGE}"
        ));
    }
    Ok(a)
}

/// Keeps `qd` reads of `len` bytes in flight on `q` for `dur`; `next_lba`
/// picks each one's LBA. Returns (completed, latency sum).
fn run_reads(
    q: &mut Queue,
    qd: usize,
    len: u32,
    bs: u32,
    dur: Duration,
    mut next_lba: impl FnMut() -> u64,
) -> Result<(u64, Duration), String> {
    let nlb = len / bs;
    let mut started: HashMap<u16, Instant> = HashMap::new();
    let (mut done, mut lat) = (0u64, Duration::ZERO);
    let end = Instant::now() + dur;
    loop {
        while Instant::now() < end && started.len() < qd {
            let sqe = Queue::rw_sqe(nvm::READ, 1, next_lba(), nlb);
            let cid = q.submit(sqe, None, len).map_err(|e| e.to_string())?;
            started.insert(cid, Instant::now());
        }
        if started.is_empty() {
            return Ok((done, lat));
        }
        let c = q.wait_any().map_err(|e| e.to_string())?;
        if !c.status().is_success() {
            return Err(format!("read failed: {}", c.status()));
        }
        lat += started
            .remove(&c.cid)
            .map_or(Duration::ZERO, |t| t.elapsed());
        done += 1;
    }
}

/// Runs the same read job on every I/O queue, one thread each.
fn job(
    c: &mut Controller,
    name: &str,
    a: &Args,
    len: u32,
    ns: &NamespaceId,
    sequential: bool,
) -> Result<(), String> {
    let bs = ns.block_size();
    let span = ns.nsze * bs as u64 / len as u64;
    let dur = Duration::from_secs(a.secs);
    let queues = c.io.len() as u64;
    let t0 = Instant::now();
    let results: Vec<Result<(u64, Duration), String>> = std::thread::scope(|s| {
        let handles: Vec<_> =
            c.io.iter_mut()
                .enumerate()
                .map(|(i, q)| {
                    s.spawn(move || {
                        let mut rng = Rng::new(i as u64 + 1);
                        // Each queue's sequential stream starts in its own part.
                        let mut pos = span / queues * i as u64;
                        let lbas_per_io = (len / bs) as u64;
                        run_reads(q, a.qd, len, bs, dur, || {
                            let slot = if sequential {
                                pos = (pos + 1) % span;
                                pos
                            } else {
                                rng.below(span)
                            };
                            slot * lbas_per_io
                        })
                    })
                })
                .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let (mut ios, mut lat) = (0u64, Duration::ZERO);
    for r in results {
        let (n, l) = r?;
        ios += n;
        lat += l;
    }
    let iops = ios as f64 / secs;
    let mib = iops * len as f64 / (1 << 20) as f64;
    let avg_us = lat.as_secs_f64() * 1e6 / ios.max(1) as f64;
    println!(
        "{name:<9} {:>4} KiB  qd {:<3} x{} queue(s): {iops:>10.0} IOPS {mib:>9.1} MiB/s  avg latency {avg_us:>7.1} us",
        len / 1024,
        a.qd,
        c.io.len()
    );
    Ok(())
}

fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if std::env::var_os("RUST_LOG").is_none() {
        // Single-threaded here, before any thread or child exists.
        std::env::set_var("RUST_LOG", "warn");
    }
    let _own_target;
    let addr = match a.addr {
        Some(addr) => addr,
        None => {
            let t = Target::start(&["--memory", "1GiB"]);
            let addr = t.addr();
            _own_target = t;
            addr
        }
    };
    let opts = Opts {
        io_queues: a.queues,
        sqsize: (a.qd.clamp(32, 1024) - 1) as u16,
        ..Opts::default()
    };
    let run = || -> Result<(), String> {
        let mut c = Controller::open(addr, &a.nqn, "nqn.2026-11.io.rdmablk:tcp-bench", &opts)
            .map_err(|e| format!("connecting to {addr} ({}): {e}", a.nqn))?;
        let ns = NamespaceId::parse(
            &c.admin()
                .identify(cns::NAMESPACE, 1)
                .map_err(|e| e.to_string())?,
        );
        println!(
            "target {addr}, {}: namespace 1 of {} MiB, {} B blocks, {} s per job",
            a.nqn,
            (ns.nsze * ns.block_size() as u64) >> 20,
            ns.block_size(),
            a.secs
        );
        job(&mut c, "randread", &a, 4096, &ns, false)?;
        job(&mut c, "seqread", &a, 128 << 10, &ns, true)?;
        c.shutdown().map_err(|e| e.to_string())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tcp_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

//! hold_queues: takes connected-queue places of an NVMe/TCP target and
//! holds them, for the VM suite's Controller Busy scenario.
//!
//! It opens COUNT associations (Connect, CC.EN, and --io-queues I/O queues
//! of 32 entries, none by default), each under its own host NQN (PREFIX-1,
//! PREFIX-2, ...) so that limits.associations_per_host does not get in the
//! way, and keeps them alive with Keep Alive every KATO/2 until killed,
//! sending no I/O: the idle hosts of a hypervisor farm, for the scale
//! bench. A Connect answered Controller Busy is retried every --retry (the
//! places of other hosts may come free); one answered Controller Busy with
//! DNR set is an error, as is any other failure.
//!
//! hold_queues ADDR:PORT SUBNQN [--count 1] [--io-queues 0] [--retry 20ms]
//!     [--kato 5s] [--hostnqn-prefix nqn.2026-11.io.rdmablk:hold]
//!
//! Prints `busy: ...` at the first Controller Busy, `held I/COUNT` as each
//! association is made, and `holding COUNT` once all are.

use rdmablk_common::nvme::{dnr_of, property, Status};
use rdmablk_common::tcp::Digests;
use rdmablk_common::units::parse_duration;
use rdmablk_tests::args::Flags;
use rdmablk_tests::client::Queue;
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const HOSTID: [u8; 16] = *b"hold_queues-hsid";

fn main() {
    if let Err(e) = run() {
        eprintln!("hold_queues: {e}");
        std::process::exit(1);
    }
}

fn say(s: String) {
    println!("{s}");
    let _ = std::io::stdout().flush();
}

fn run() -> Result<(), String> {
    let flags = Flags::from_env();
    let usage = "usage: hold_queues ADDR:PORT SUBNQN [--count N] [--io-queues 0] [--retry 20ms] \
                 [--kato 5s] [--hostnqn-prefix NQN]";
    let (Some(addr), Some(subnqn)) = (flags.positional(0), flags.positional(1)) else {
        return Err(usage.into());
    };
    let addr: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let count: usize = flags.number("--count", "1")?;
    let io_queues: u16 = flags.number("--io-queues", "0")?;
    // Each queue is a descriptor.
    rdmablk_common::usage::raise_open_files_limit().map_err(|e| format!("RLIMIT_NOFILE: {e}"))?;
    let retry = parse_duration(&flags.value("--retry", "20ms")).map_err(|e| e.to_string())?;
    let kato = parse_duration(&flags.value("--kato", "5s")).map_err(|e| e.to_string())?;
    let prefix = flags.value("--hostnqn-prefix", "nqn.2026-11.io.rdmablk:hold");
    let kato_ms = kato.as_millis() as u32;

    let mut held: Vec<(Queue, Vec<Queue>)> = Vec::new();
    let mut busy_seen = 0u64;
    let mut last_keep_alive = Instant::now();
    loop {
        if held.len() < count {
            let hostnqn = format!("{prefix}-{}", held.len() + 1);
            match associate(addr, subnqn, &hostnqn, kato_ms, io_queues)? {
                Some(q) => {
                    held.push(q);
                    say(format!("held {}/{count} ({hostnqn})", held.len()));
                    if held.len() == count {
                        say(format!(
                            "holding {count} (Controller Busy answers before: {busy_seen})"
                        ));
                    }
                }
                None => {
                    if busy_seen == 0 {
                        say(format!(
                            "busy: Connect answered Controller Busy with DNR clear, \
                             retrying every {retry:?}"
                        ));
                    }
                    busy_seen += 1;
                    std::thread::sleep(retry);
                }
            }
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
        if kato_ms > 0 && last_keep_alive.elapsed() >= kato / 2 {
            for (i, (q, _)) in held.iter_mut().enumerate() {
                q.keep_alive()
                    .map_err(|e| format!("Keep Alive of association {}: {e}", i + 1))?;
            }
            last_keep_alive = Instant::now();
        }
    }
}

/// An enabled association (its admin queue and `io_queues` I/O queues),
/// or `None` for Controller Busy.
fn associate(
    addr: SocketAddr,
    subnqn: &str,
    hostnqn: &str,
    kato_ms: u32,
    io_queues: u16,
) -> Result<Option<(Queue, Vec<Queue>)>, String> {
    let mut q = Queue::connect(addr, Digests::default())
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    let cqe = q
        .fabrics_connect(0, 31, kato_ms, subnqn, hostnqn, HOSTID, 0xffff)
        .map_err(|e| format!("admin Connect: {e}"))?;
    let st = cqe.status();
    if st == Status::CONTROLLER_BUSY {
        if dnr_of(cqe.status) {
            return Err("Controller Busy with DNR set: a host would not retry".into());
        }
        return Ok(None);
    }
    if !st.is_success() {
        return Err(format!(
            "admin Connect as {hostnqn} failed: {st} (dw0 {:#x})",
            cqe.dw0
        ));
    }
    q.prop_set(property::CC, property::CC_EN | 6 << 16 | 4 << 20)
        .map_err(|e| format!("Property Set CC.EN: {e}"))?;
    let cntlid = cqe.dw0 as u16;
    let mut ios = Vec::new();
    for qid in 1..=io_queues {
        let mut io = Queue::connect(addr, Digests::default())
            .map_err(|e| format!("connecting I/O queue {qid} to {addr}: {e}"))?;
        let st = io
            .fabrics_connect(qid, 31, 0, subnqn, hostnqn, HOSTID, cntlid)
            .map_err(|e| format!("I/O queue {qid} Connect: {e}"))?
            .status();
        if !st.is_success() {
            return Err(format!("I/O queue {qid} Connect as {hostnqn} failed: {st}"));
        }
        ios.push(io);
    }
    Ok(Some((q, ios)))
}

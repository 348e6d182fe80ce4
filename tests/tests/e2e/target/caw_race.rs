//! The compare-and-write race the file and RBD tests run: [`HOSTS`] hosts
//! each increment one shared counter block with fused Compare and Write,
//! and no increment may be lost. A support module: no test lives here.

use rdmablk_common::bytes::get_u64;
use rdmablk_common::nvme::identify::{cns, NamespaceId};
use rdmablk_common::nvme::Status;
use rdmablk_tests::check::OrPanic;
use rdmablk_tests::client::{Controller, Opts, Queue};
use std::io;
use std::net::SocketAddr;
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Hosts racing.
pub(crate) const HOSTS: usize = 8;

/// The increments each racing host makes: `RDMABLK_CAW_INCREMENTS`, else
/// 1,000. Eight hosts on one block collide all the time: 8,000 increments
/// take some 40,000 fused pairs, of which over 30,000 find the block changed
/// (each one a moment where two pairs overlapped). A target that let the
/// pairs interleave (the compare-and-write passing the write gate as a
/// plain write) loses an increment at the very first value, at 25 per host.
pub(crate) fn per_host() -> u64 {
    std::env::var("RDMABLK_CAW_INCREMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

/// The counter block holding `v`: every 8-byte word is `v + i` (word i),
/// so that a block half of one write and half of another (a torn write)
/// is no counter block at all.
pub(crate) fn counter_block(v: u64, block_size: u32) -> Vec<u8> {
    (0..block_size as u64 / 8)
        .flat_map(|i| v.wrapping_add(i).to_le_bytes())
        .collect()
}

/// The counter a block holds, or an error if it is not a counter block.
fn counter_of(block: &[u8], block_size: u32) -> io::Result<u64> {
    let v = get_u64(block, 0);
    if block != counter_block(v, block_size).as_slice() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the counter block is not one (torn?): starts with {v}"),
        ));
    }
    Ok(v)
}

/// What the racing hosts did.
#[derive(Debug)]
pub(crate) struct Tally {
    pub(crate) increments: u64,
    /// Fused pairs sent, and those whose Compare failed.
    pub(crate) attempts: u64,
    pub(crate) compare_failures: u64,
    pub(crate) elapsed: Duration,
    pub(crate) block_size: u32,
}

/// Host `i` of the race: its NQN and Host Identifier.
fn racer(i: usize) -> (String, [u8; 16]) {
    let id = 0x5ace_0000_0000_4000_8000_0000_0000_0000_u128 | (i as u128 + 1);
    (
        format!(
            "nqn.2014-08.org.nvmexpress:uuid:5ace0000-0000-4000-8000-{:012x}",
            i + 1
        ),
        id.to_be_bytes(),
    )
}

/// One host's loop: the block as last seen (read at the start and after
/// each Compare Failure; after a success, the value it wrote), a fused
/// Compare of it and Write of it plus one; on Compare Failure (and the
/// Write's Failed Fused Command) it reads again and retries. Returns the
/// values it wrote, and the pairs it sent.
fn increment(
    q: &mut Queue,
    nsid: u32,
    slba: u64,
    bs: u32,
    count: u64,
) -> io::Result<(Vec<u64>, u64)> {
    let read = |q: &mut Queue| -> io::Result<u64> { counter_of(&q.read(nsid, slba, 1, bs)?, bs) };
    let mut cur = read(q)?;
    let mut wrote = Vec::with_capacity(count as usize);
    let mut attempts = 0;
    while (wrote.len() as u64) < count {
        attempts += 1;
        let old = counter_block(cur, bs);
        let new = counter_block(cur + 1, bs);
        let (c, w) = q.compare_and_write(nsid, slba, &old, &new, bs)?;
        match (c.status(), w.status()) {
            (Status::SUCCESS, Status::SUCCESS) => {
                cur += 1;
                wrote.push(cur);
            }
            (Status::COMPARE_FAILURE, Status::ABORTED_FAILED_FUSED) => cur = read(q)?,
            (cs, ws) => {
                return Err(io::Error::other(format!(
                    "compare and write of {cur} -> {}: Compare {cs}, Write {ws}",
                    cur + 1
                )))
            }
        }
    }
    Ok((wrote, attempts))
}

/// [`HOSTS`] hosts (each its own controller, host NQN and Host Identifier,
/// one I/O queue with `timeout`) connect to namespace `nsid` of `nqn` at
/// `addr`; the block at `slba` is set to counter 0; then all at once each
/// makes `per_host` increments with compare-and-write. Panics unless the
/// values written are exactly 1 to hosts × per_host, each written once
/// (two hosts both succeeding from one old value would write one value
/// twice: a lost increment), and the block then holds the last.
pub(crate) fn race(
    addr: SocketAddr,
    nqn: &str,
    nsid: u32,
    slba: u64,
    per_host: u64,
    timeout: Duration,
) -> Tally {
    let mut hosts: Vec<Controller> = (0..HOSTS)
        .map(|i| {
            let (hostnqn, hostid) = racer(i);
            let opts = Opts {
                hostid,
                kato_ms: 0,
                auto_keep_alive: false,
                ..Opts::default()
            };
            let mut c =
                Controller::open(addr, nqn, &hostnqn, &opts).or_panic(format_args!("host {i}"));
            c.io[0].set_timeout(timeout).or_panic("set_timeout");
            c
        })
        .collect();
    let id = hosts[0]
        .admin()
        .identify(cns::NAMESPACE, nsid)
        .or_panic("Identify Namespace");
    let bs = NamespaceId::parse(&id).block_size();
    hosts[0].io[0]
        .write(nsid, slba, &counter_block(0, bs), bs, false)
        .or_panic("setting the counter to 0");

    let start = Barrier::new(HOSTS);
    let began = Instant::now();
    let results: Vec<io::Result<(Vec<u64>, u64)>> = std::thread::scope(|s| {
        let threads: Vec<_> = hosts
            .iter_mut()
            .map(|c| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    increment(&mut c.io[0], nsid, slba, bs, per_host)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a racing host panicked"))
            .collect()
    });
    let elapsed = began.elapsed();

    let total = HOSTS as u64 * per_host;
    let mut all = Vec::with_capacity(total as usize);
    let mut attempts = 0;
    for (i, r) in results.into_iter().enumerate() {
        let (wrote, n) = r.or_panic(format_args!("host {i}"));
        all.extend(wrote);
        attempts += n;
    }
    all.sort_unstable();
    let twice: Vec<u64> = all
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    assert!(
        twice.is_empty(),
        "{} values written by two hosts (their increments: one lost each), first {:?}",
        twice.len(),
        &twice[..twice.len().min(10)]
    );
    assert_eq!(
        (all.first().copied(), all.last().copied(), all.len() as u64),
        (Some(1), Some(total), total),
        "the values written are not exactly 1 to {total}"
    );
    assert!(
        attempts > total,
        "no compare failure in {total} increments: the hosts did not race"
    );
    let last = counter_of(
        &hosts[0].io[0]
            .read(nsid, slba, 1, bs)
            .or_panic("reading the counter"),
        bs,
    )
    .or_panic("the counter block");
    assert_eq!(
        last, total,
        "the counter after {total} successful increments"
    );
    let tally = Tally {
        increments: total,
        attempts,
        compare_failures: attempts - total,
        elapsed,
        block_size: bs,
    };
    eprintln!(
        "{HOSTS} hosts: {} increments in {:.1?} ({:.0}/s), {} fused pairs sent, {} compare failures",
        tally.increments,
        tally.elapsed,
        tally.increments as f64 / tally.elapsed.as_secs_f64().max(1e-9),
        tally.attempts,
        tally.compare_failures
    );
    tally
}

//! Compare (NVM Command Set 2.1, 3.2, the Compare command) and the fused
//! Compare and Write (NVMe Base 2.1, 3.4.2 "Fused Operations"; NVM Command
//! Set 2.1, 3.2, Compare and Write): statuses of a match and a mismatch, of a first or second
//! command without its partner and of partners that disagree; and, with
//! hosts racing on two pollers, atomicity: 8 hosts each increment one
//! shared counter block 1,000 times with compare-and-write, and no
//! increment is lost.

use rdmablk_common::nvme::identify::{cns, NamespaceId};
use rdmablk_common::nvme::{fuse, nvm, Status};
use rdmablk_tests::check::{assert_same, assert_status, open, OrPanic};
use rdmablk_tests::client::{Controller, Opts, Queue};
use rdmablk_tests::names::{HOST_A, OPEN_NQN};
use rdmablk_tests::{open_subsystem_config, Rng, Target, TempDir};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::sync::Barrier;
use std::time::{Duration, Instant};

const NSID: u32 = 1;

/// Hosts racing.
pub(super) const HOSTS: usize = 8;

/// The increments each racing host makes: `RDMABLK_CAW_INCREMENTS`, else
/// 1,000. Eight hosts on one block collide all the time: 8,000 increments
/// take some 40,000 fused pairs, of which over 30,000 find the block changed
/// (each one a moment where two pairs overlapped). A target that let the
/// pairs interleave (the compare-and-write passing the write gate as a
/// plain write) loses an increment at the very first value, at 25 per host.
pub(super) fn per_host() -> u64 {
    std::env::var("RDMABLK_CAW_INCREMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

/// The counter block holding `v`: every 8-byte word is `v + i` (word i),
/// so that a block half of one write and half of another (a torn write)
/// is no counter block at all.
pub(super) fn counter_block(v: u64, block_size: u32) -> Vec<u8> {
    (0..block_size as u64 / 8)
        .flat_map(|i| v.wrapping_add(i).to_le_bytes())
        .collect()
}

/// The counter a block holds, or an error if it is not a counter block.
fn counter_of(block: &[u8], block_size: u32) -> io::Result<u64> {
    let v = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
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
pub(super) struct Tally {
    pub(super) increments: u64,
    /// Fused pairs sent, and those whose Compare failed.
    pub(super) attempts: u64,
    pub(super) compare_failures: u64,
    pub(super) elapsed: Duration,
    pub(super) block_size: u32,
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
pub(super) fn race(
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

/// [`HOSTS`] hosts on a daemon with two pollers race [`per_host`]
/// compare-and-write increments each of one counter block on a file
/// namespace: the fused operation is atomic (NVMe Base 2.1, 3.4.2: no
/// other command to those blocks between the Compare and the Write),
/// across queues and pollers: every value from 1 to 8,000 is written by
/// exactly one host, and the block (also in the file, after the daemon
/// stopped) holds 8,000.
#[test]
fn racing_compare_and_write_increments_lose_nothing() {
    let _machine = crate::alone();
    let dir = TempDir::new("caw-race");
    let path = dir.join("ns.img");
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(64 << 20))
        .or_panic("creating the backing file");
    let mut t = Target::start_config(&open_subsystem_config(
        "[pollers]\ncount = 2",
        OPEN_NQN,
        &format!("backend = \"file\"\npath = \"{}\"", path.display()),
    ));
    const SLBA: u64 = 4096;
    let tally = race(
        t.addr(),
        OPEN_NQN,
        NSID,
        SLBA,
        per_host(),
        Duration::from_secs(10),
    );
    let status = t.stop();
    assert!(status.success(), "exit status {status}\n{}", t.log_tail());
    let bs = tally.block_size;
    let mut block = vec![0u8; bs as usize];
    let mut f = std::fs::File::open(&path).or_panic("opening the backing file");
    f.seek(SeekFrom::Start(SLBA * bs as u64))
        .and_then(|_| f.read_exact(&mut block))
        .or_panic("reading the counter from the file");
    assert_same(
        &block,
        &counter_block(tally.increments, bs),
        "the counter block in the backing file",
    );
}

/// Asserts the 8 blocks at `slba` hold `want`.
fn expect_data(q: &mut Queue, slba: u64, want: &[u8], what: &str) {
    let got = q.read(NSID, slba, 8, 512).or_panic("read");
    assert_same(&got, want, what);
}

/// The statuses (NVMe Base 2.1, Figure 102 and 3.4.2; NVM Command Set 2.1,
/// 3.2 and its Media and Data Integrity Errors) on a memory namespace:
/// - Identify Controller: ONCS bit 0 (Compare), FUSES bit 0 (Compare and Write).
/// - Compare alone: success when the data match, Compare Failure (SCT 2h,
///   SC 85h) when one byte differs.
/// - Fused, mismatch: the Compare gets Compare Failure, the Write Command
///   Aborted due to Failed Fused Command (09h), and nothing is written;
///   match: both succeed and the Write lands.
/// - A first command followed by a command that is not its second: the
///   first gets Command Aborted due to Missing Fused Command (0Ah), the
///   other runs; a second command alone: 0Ah, nothing written.
/// - Partners whose SLBA or NLB differ: the first Invalid Field, the
///   second 09h, nothing written.
/// - FUSE on a Read: Invalid Field.
#[test]
fn compare_and_fused_compare_and_write_statuses() {
    let _machine = crate::shared();
    let t = Target::start_config(&open_subsystem_config(
        "",
        OPEN_NQN,
        "backend = \"memory\"\nsize = \"16MiB\"",
    ));
    let mut c = open(&t, OPEN_NQN, HOST_A, &Opts::default());
    const BS: u32 = 512;
    assert_eq!(c.id.oncs & 1, 1, "ONCS {:#06x}: Compare", c.id.oncs);
    let id = c
        .admin()
        .identify(cns::CONTROLLER, 0)
        .or_panic("Identify Controller");
    let fuses = u16::from_le_bytes([id[522], id[523]]);
    assert_eq!(fuses & 1, 1, "FUSES {fuses:#06x}: Compare and Write");

    let q = &mut c.io[0];
    let mut rng = Rng::new(0xc0);
    let (old, new, other) = (rng.bytes(4096), rng.bytes(4096), rng.bytes(4096));
    let mut wrong = old.clone();
    wrong[4095] ^= 1;
    const SLBA: u64 = 16;
    q.write(NSID, SLBA, &old, BS, false).or_panic("write");
    q.write(NSID, SLBA + 8, &old, BS, false).or_panic("write");
    let compare = |slba, nlb| Queue::rw_sqe(nvm::COMPARE, NSID, slba, nlb);
    let write = |slba, nlb| Queue::rw_sqe(nvm::WRITE, NSID, slba, nlb);

    // Compare alone.
    let done = q.exec(compare(SLBA, 8), Some(&old), 0).or_panic("Compare");
    assert_status(&done, Status::SUCCESS, "Compare of the same data");
    let done = q
        .exec(compare(SLBA, 8), Some(&wrong), 0)
        .or_panic("Compare");
    assert_status(&done, Status::COMPARE_FAILURE, "Compare, last byte differs");

    // Fused, mismatch then match.
    let (cmp, wr) = q
        .compare_and_write(NSID, SLBA, &wrong, &new, BS)
        .or_panic("compare and write");
    assert_status(&cmp, Status::COMPARE_FAILURE, "the Compare of a mismatch");
    assert_status(&wr, Status::ABORTED_FAILED_FUSED, "the Write of a mismatch");
    expect_data(q, SLBA, &old, "after a failed compare and write");
    let (cmp, wr) = q
        .compare_and_write(NSID, SLBA, &old, &new, BS)
        .or_panic("compare and write");
    assert_status(&cmp, Status::SUCCESS, "the Compare of a match");
    assert_status(&wr, Status::SUCCESS, "the Write of a match");
    expect_data(q, SLBA, &new, "after a compare and write");

    // A first command, then a plain Read.
    let first = q
        .submit_fused(compare(SLBA, 8), fuse::FIRST, Some(&new), 0)
        .or_panic("a fused first");
    let read = q
        .submit(Queue::rw_sqe(nvm::READ, NSID, SLBA, 8), None, 8 * BS)
        .or_panic("a Read");
    let done = q.wait(first).or_panic("the fused first");
    assert_status(
        &done,
        Status::ABORTED_MISSING_FUSED,
        "a fused first followed by a Read",
    );
    let done = q.wait(read).or_panic("the Read");
    assert_status(&done, Status::SUCCESS, "the Read after a lone fused first");
    assert_same(&done.data, &new, "the Read after a lone fused first");

    // A second command alone.
    let done = q
        .submit_fused(write(SLBA, 8), fuse::SECOND, Some(&other), 0)
        .and_then(|cid| q.wait(cid))
        .or_panic("a lone fused second");
    assert_status(&done, Status::ABORTED_MISSING_FUSED, "a lone fused second");
    expect_data(q, SLBA, &new, "after a lone fused second");

    // Partners that disagree on SLBA, then on NLB.
    for (second, data, what) in [
        (write(SLBA + 8, 8), &other[..], "another SLBA"),
        (write(SLBA, 4), &other[..2048], "another NLB"),
    ] {
        let first = q
            .submit_fused(compare(SLBA, 8), fuse::FIRST, Some(&new), 0)
            .or_panic("a fused first");
        let second = q
            .submit_fused(second, fuse::SECOND, Some(data), 0)
            .or_panic("a fused second");
        let done = q.wait(first).or_panic("the fused first");
        assert_status(
            &done,
            Status::INVALID_FIELD,
            &format!("a fused first whose second has {what}"),
        );
        let done = q.wait(second).or_panic("the fused second");
        assert_status(
            &done,
            Status::ABORTED_FAILED_FUSED,
            &format!("a fused second with {what}"),
        );
        expect_data(q, SLBA, &new, &format!("after partners with {what}"));
        expect_data(q, SLBA + 8, &old, &format!("after partners with {what}"));
    }

    // FUSE on a Read (followed by a plain Read, so that a target waiting
    // for a partner still answers).
    let fused_read = q
        .submit_fused(
            Queue::rw_sqe(nvm::READ, NSID, SLBA, 8),
            fuse::FIRST,
            None,
            8 * BS,
        )
        .or_panic("a Read with FUSE 01b");
    let read = q
        .submit(Queue::rw_sqe(nvm::READ, NSID, SLBA, 8), None, 8 * BS)
        .or_panic("a Read");
    let done = q.wait(fused_read).or_panic("the Read with FUSE 01b");
    assert_status(&done, Status::INVALID_FIELD, "a Read with FUSE 01b");
    let done = q.wait(read).or_panic("the Read");
    assert_status(&done, Status::SUCCESS, "the Read after it");
}

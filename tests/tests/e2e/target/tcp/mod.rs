//! `rdmablk-target` over NVMe/TCP on loopback, driven by the test host in
//! `rdmablk_tests::client`. Each test runs its own daemon on its own port;
//! a failing test prints the daemon's log tail.

use rdmablk_common::fabrics::discovery::{adrfam, eflags, subtype, trtype};
use rdmablk_common::fabrics::DISCOVERY_NQN;
use rdmablk_common::nvme::identify::{cns, cntrltype, parse_ns_list, sgls, NamespaceId};
use rdmablk_common::nvme::log::lid;
use rdmablk_common::nvme::{nvm, property, Sgl, Sqe, Status};
use rdmablk_common::tcp::{encode, fes, Digests, Header, Transfer};
use rdmablk_tests::check::{
    assert_same, assert_status, assert_zero, open, sct_sc, settled_fd_count, OrPanic,
};
use rdmablk_tests::client::{Completion, Controller, Opts, Queue};
use rdmablk_tests::names::{DEFAULT_NQN, HOST_A, HOST_B, OPEN_NQN, PRIVATE_NQN};
use rdmablk_tests::open_subsystem_config;
use rdmablk_tests::two_subsystems_config;
use rdmablk_tests::{fd_count, Rng, Target, TempDir};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::time::{Duration, Instant};

mod buffers;
mod controller;
mod data;
mod hostile;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const NSID: u32 = 1;
/// What the target promises (MAXH2CDATA, and the largest C2HData it sends).
const MAX_DATA_PDU: u32 = 128 << 10;
const BOTH_DIGESTS: Digests = Digests {
    header: true,
    data: true,
};

fn identify_ns(c: &mut Controller, nsid: u32) -> NamespaceId {
    NamespaceId::parse(
        &c.admin()
            .identify(cns::NAMESPACE, nsid)
            .or_panic("Identify Namespace"),
    )
}

/// Runs `n` commands through `q` keeping `qd` in flight: `make(i)` builds
/// command `i` (SQE, data out, data in length), `check(i, completion)` judges it.
fn rolling(
    q: &mut Queue,
    qd: usize,
    n: usize,
    mut make: impl FnMut(usize) -> (Sqe, Option<Vec<u8>>, u32),
    mut check: impl FnMut(usize, Completion),
) {
    let mut inflight: HashMap<u16, usize> = HashMap::new();
    let mut next = 0;
    let mut max_seen = 0;
    while next < n || !inflight.is_empty() {
        while next < n && inflight.len() < qd {
            let (sqe, out, in_len) = make(next);
            let cid = q
                .submit(sqe, out.as_deref(), in_len)
                .or_panic(format_args!("submit #{next}"));
            inflight.insert(cid, next);
            next += 1;
        }
        max_seen = max_seen.max(inflight.len());
        let c = q.wait_any().or_panic(format_args!(
            "waiting with {} commands in flight",
            inflight.len()
        ));
        let i = inflight
            .remove(&c.cid)
            .expect("completion for a command we sent");
        check(i, c);
    }
    assert_eq!(
        max_seen,
        qd.min(n),
        "the queue depth the test meant to reach"
    );
}

/// `count` distinct 4 KiB-aligned byte offsets below `limit`.
fn distinct_slots(rng: &mut Rng, count: usize, limit: u64) -> Vec<u64> {
    let slots = limit / 4096;
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    while out.len() < count {
        let s = rng.below(slots);
        if seen.insert(s) {
            out.push(s * 4096);
        }
    }
    out
}

/// Pipelined random 4 KiB writes and verified reads at QD 32.
fn pipelined_random(q: &mut Queue, bs: u32, ns_bytes: u64, rng: &mut Rng, n: usize) {
    let offsets = distinct_slots(rng, n, ns_bytes);
    let data: Vec<Vec<u8>> = (0..n).map(|_| rng.bytes(4096)).collect();
    let nlb = 4096 / bs;
    let lba = |off: u64| off / bs as u64;
    rolling(
        q,
        32,
        n,
        |i| {
            let sqe = Queue::rw_sqe(nvm::WRITE, NSID, lba(offsets[i]), nlb);
            (sqe, Some(data[i].clone()), 0)
        },
        |i, c| {
            assert_status(
                &c,
                Status::SUCCESS,
                &format!("pipelined write #{i} at byte {}", offsets[i]),
            )
        },
    );
    rolling(
        q,
        32,
        n,
        |i| {
            (
                Queue::rw_sqe(nvm::READ, NSID, lba(offsets[i]), nlb),
                None,
                4096,
            )
        },
        |i, c| {
            let what = format!("pipelined read #{i} at byte {}", offsets[i]);
            assert_status(&c, Status::SUCCESS, &what);
            assert_same(&c.data, &data[i], &what);
        },
    );
}

/// Writes `data` at byte `off` and reads it back, checking which transport
/// path each took.
fn write_read_checked(q: &mut Queue, bs: u32, off: u64, data: &[u8]) {
    let slba = off / bs as u64;
    let nlb = (data.len() / bs as usize) as u32;
    let what = format!("{} KiB at byte {off}", data.len() / KIB);
    let before = q.stats;
    q.write(NSID, slba, data, bs, false)
        .or_panic(format_args!("write {what}"));
    let after = q.stats;
    if data.len() <= 8 * KIB {
        assert_eq!(
            after.r2ts, before.r2ts,
            "write {what} should go in-capsule, without R2T"
        );
        assert_eq!(after.in_capsule_writes, before.in_capsule_writes + 1);
    } else {
        assert!(after.r2ts > before.r2ts, "write {what}: no R2T seen");
        let min_pdus = data.len().div_ceil(q.maxh2cdata() as usize) as u64;
        assert!(
            after.h2c_pdus - before.h2c_pdus >= min_pdus,
            "write {what}: {} H2CData PDUs, expected at least {min_pdus}",
            after.h2c_pdus - before.h2c_pdus
        );
    }
    let got = q
        .read(NSID, slba, nlb, bs)
        .or_panic(format_args!("read {what}"));
    assert_same(&got, data, &format!("read back {what}"));
    assert!(
        q.stats.c2h_max_len <= MAX_DATA_PDU,
        "C2HData of {} bytes; the target promises at most {MAX_DATA_PDU}",
        q.stats.c2h_max_len
    );
}

/// The I/O exercise every backend gets.
fn exercise_namespace(t: &Target, nqn: &str, bs: u32, ns_bytes: u64, seed: u64) {
    let mut c = open(t, nqn, HOST_A, &Opts::default());
    let ns = identify_ns(&mut c, NSID);
    assert_eq!(ns.block_size(), bs, "namespace LBA size");
    assert_eq!(ns.nsze, ns_bytes / bs as u64, "namespace size in blocks");
    let q = &mut c.io[0];
    let mut rng = Rng::new(seed);
    let lba = |off: u64| off / bs as u64;

    // In-capsule 4 KiB, then R2T-driven 64 KiB and 1 MiB.
    write_read_checked(q, bs, 8 * 4096, &rng.bytes(4 * KIB));
    write_read_checked(q, bs, MIB as u64, &rng.bytes(64 * KIB));
    write_read_checked(q, bs, 4 * MIB as u64, &rng.bytes(MIB));

    // FUA, and the very last blocks of the namespace.
    let tail = rng.bytes(8 * KIB);
    let tail_off = ns_bytes - tail.len() as u64;
    q.write(NSID, lba(tail_off), &tail, bs, true)
        .or_panic("FUA write of the last 8 KiB");
    let got = q
        .read(NSID, lba(tail_off), (tail.len() as u32) / bs, bs)
        .or_panic("read of the last 8 KiB");
    assert_same(&got, &tail, "last 8 KiB");

    pipelined_random(q, bs, ns_bytes, &mut rng, 256);

    // Write Zeroes (plain and with Deallocate) and DSM deallocate: the
    // middle of a written range reads as zeroes, its neighbours keep their
    // data (catches 0's-based / 1-based NLB mix-ups).
    let zero_cases: [(&str, u64); 3] = [
        ("Write Zeroes", 8 * MIB as u64),
        ("Write Zeroes DEAC", 9 * MIB as u64),
        ("DSM deallocate", 10 * MIB as u64),
    ];
    for (name, off) in zero_cases {
        let nlb = (32 * KIB as u32) / bs;
        let data = rng.bytes(((nlb + 2) * bs) as usize);
        q.write(NSID, lba(off), &data, bs, false)
            .or_panic(format_args!("{name}: writing the range"));
        let (slba, n) = (lba(off) + 1, nlb);
        match name {
            "Write Zeroes" => q.write_zeroes(NSID, slba, n, false),
            "Write Zeroes DEAC" => q.write_zeroes(NSID, slba, n, true),
            _ => q.deallocate(NSID, &[(slba, n)]),
        }
        .or_panic(name);
        let got = q
            .read(NSID, lba(off), nlb + 2, bs)
            .or_panic(format_args!("{name}: read back"));
        let b = bs as usize;
        assert_same(
            &got[..b],
            &data[..b],
            &format!("{name}: block before the range"),
        );
        assert_zero(
            &got[b..got.len() - b],
            &format!("{name} (DLFEAT {:#x})", ns.dlfeat),
        );
        assert_same(
            &got[got.len() - b..],
            &data[data.len() - b..],
            &format!("{name}: block after the range"),
        );
    }
    // DSM with several ranges in one command.
    let ranges: Vec<(u64, u32)> = (0..4)
        .map(|i| {
            (
                lba(12 * MIB as u64 + i * 64 * KIB as u64),
                8 * KIB as u32 / bs,
            )
        })
        .collect();
    for &(slba, _) in &ranges {
        q.write(NSID, slba, &rng.bytes(8 * KIB), bs, false)
            .or_panic("DSM multi-range: write");
    }
    q.deallocate(NSID, &ranges).or_panic("DSM with 4 ranges");
    for &(slba, nlb) in &ranges {
        let got = q
            .read(NSID, slba, nlb, bs)
            .or_panic("DSM multi-range: read");
        assert_zero(&got, &format!("DSM multi-range at LBA {slba}"));
    }

    q.flush(NSID).or_panic("Flush");
    c.shutdown().or_panic("controller shutdown");
}

fn file_of(dir: &TempDir, bytes: u64) -> String {
    let path = dir.sparse_file("ns.img", bytes);
    path.to_str().expect("UTF-8 temp path").to_string()
}

/// Waits for a C2HTermReq, then for the target to close. Returns (FES, FEI).
fn expect_term_req(q: &mut Queue, case: &str) -> (u16, u32) {
    q.set_timeout(Duration::from_secs(5))
        .or_panic("set_timeout");
    match q.recv_pdu() {
        Ok((
            Header::TermReq {
                from_host: false,
                fes,
                fei,
            },
            _,
        )) => {
            assert!(
                q.is_closed_by_peer(Duration::from_secs(5)),
                "{case}: C2HTermReq (FES {fes}, FEI {fei}) but the connection stays open"
            );
            (fes, fei)
        }
        Ok((h, _)) => panic!("{case}: expected a C2HTermReq, got {h:?}"),
        Err(e) => panic!("{case}: expected a C2HTermReq: {e}"),
    }
}

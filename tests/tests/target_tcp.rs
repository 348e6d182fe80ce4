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
    let path = dir.join("ns.img");
    let f = std::fs::File::create(&path).expect("creating the backing file");
    f.set_len(bytes).expect("sizing the backing file");
    path.to_str().expect("UTF-8 temp path").to_string()
}

#[test]
fn identify_and_properties() {
    let t = Target::start(&["--memory", "64MiB"]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
    let id = c.id.clone();

    assert_eq!(
        id.cntlid, c.cntlid,
        "Identify CNTLID vs the cntlid in the Connect CQE"
    );
    assert_eq!(id.mdts, 8, "MDTS (1 MiB)");
    assert!(
        id.ioccsz * 16 >= 64 + 8192,
        "IOCCSZ {} (x16 bytes) leaves no room for 8 KiB in-capsule data",
        id.ioccsz
    );
    assert!(
        id.iorcsz >= 1,
        "IORCSZ {} (the Linux host rejects < 1)",
        id.iorcsz
    );
    assert_eq!(id.icdoff, 0, "ICDOFF (the Linux host supports only 0)");
    assert_eq!(
        id.cntrltype,
        cntrltype::IO,
        "CNTRLTYPE of an I/O controller"
    );
    assert_ne!(id.kas, 0, "KAS: keep-alive must be supported");
    assert!(
        id.maxcmd >= 128,
        "MAXCMD {} below the 128-entry queue we connected",
        id.maxcmd
    );
    assert_ne!(
        id.sgls & sgls::SUPPORTED,
        0,
        "SGLS bit 0 (SGLs supported): {:#x}",
        id.sgls
    );
    assert!(id.nn >= 1, "NN {}", id.nn);
    assert_eq!(id.subnqn, DEFAULT_NQN, "SUBNQN");
    assert_eq!(c.admin().maxh2cdata(), MAX_DATA_PDU, "MAXH2CDATA in ICResp");
    assert_eq!(
        c.io[0].maxh2cdata(),
        MAX_DATA_PDU,
        "MAXH2CDATA on the I/O queue"
    );

    let mqes = c.cap & 0xffff;
    assert!(mqes > 0, "CAP.MQES is 0 (CAP {:#x})", c.cap);
    let vs = c
        .admin()
        .prop_get(property::VS, false)
        .or_panic("Property Get VS") as u32;
    assert!(vs >= 0x0001_0300, "VS {vs:#x} below 1.3");
    assert_eq!(id.ver, vs, "Identify VER vs the VS property");
    let csts = c
        .admin()
        .prop_get(property::CSTS, false)
        .or_panic("Property Get CSTS") as u32;
    assert_eq!(
        csts & (property::CSTS_RDY | property::CSTS_CFS),
        property::CSTS_RDY,
        "CSTS {csts:#x}"
    );

    let ns = identify_ns(&mut c, NSID);
    assert_eq!(ns.block_size(), 512);
    assert_eq!(
        ns.nsze,
        (64 * MIB / 512) as u64,
        "NSZE of a 64 MiB namespace"
    );
    assert!(
        ns.ncap <= ns.nsze && ns.ncap > 0,
        "NCAP {} vs NSZE {}",
        ns.ncap,
        ns.nsze
    );

    let list = parse_ns_list(
        &c.admin()
            .identify(cns::ACTIVE_NS_LIST, 0)
            .or_panic("Identify CNS 2"),
    );
    assert_eq!(list, vec![1], "active namespace list");

    let desc = c
        .admin()
        .identify(cns::NS_DESCRIPTORS, NSID)
        .or_panic("Identify CNS 3");
    assert!(
        desc[0] != 0 && desc[1] != 0,
        "no namespace identification descriptor (NIDT {}, NIDL {})",
        desc[0],
        desc[1]
    );

    let bad = c
        .admin()
        .exec(Queue::identify_sqe(0x1f, 0), None, 4096)
        .or_panic("Identify CNS 0x1f");
    assert_status(
        &bad,
        Status::INVALID_FIELD,
        "Identify with an unsupported CNS",
    );

    let smart = c
        .admin()
        .get_log(lid::SMART, 512, 0)
        .or_panic("Get Log Page SMART");
    assert_eq!(smart.len(), 512);
    let errors = c
        .admin()
        .get_log(lid::ERROR, 64, 0)
        .or_panic("Get Log Page Error Information");
    assert_eq!(errors.len(), 64);

    // The I/O queue works.
    let data = Rng::new(1).bytes(4096);
    c.io[0]
        .write(NSID, 0, &data, 512, false)
        .or_panic("write on the I/O queue");
    let got = c.io[0]
        .read(NSID, 0, 8, 512)
        .or_panic("read on the I/O queue");
    assert_same(&got, &data, "I/O queue round trip");
    c.admin().keep_alive().or_panic("Keep Alive");

    // Commands without data as the Linux host sends them: a transport SGL of
    // length 0 rather than a null data block.
    let linux_null = Sgl::Transport { len: 0 };
    c.admin().set_no_data_sgl(linux_null);
    c.io[0].set_no_data_sgl(linux_null);
    c.admin()
        .keep_alive()
        .or_panic("Keep Alive with a zero-length transport SGL");
    let vs2 = c
        .admin()
        .prop_get(property::VS, false)
        .or_panic("Property Get with a zero-length transport SGL");
    assert_eq!(vs2 as u32, vs);
    c.io[0]
        .flush(NSID)
        .or_panic("Flush with a zero-length transport SGL");
    c.shutdown().or_panic("controller shutdown");
}

#[test]
fn write_read_patterns_memory() {
    let t = Target::start(&["--memory", "64MiB"]);
    exercise_namespace(&t, DEFAULT_NQN, 512, 64 * MIB as u64, 2);
}

#[test]
fn write_read_patterns_file() {
    let dir = TempDir::new("file-ns");
    let path = file_of(&dir, 64 * MIB as u64);
    let t = Target::start(&["--file", &path]);
    exercise_namespace(&t, DEFAULT_NQN, 512, 64 * MIB as u64, 3);
}

/// A loop device attached for the life of a test.
struct LoopDevice(String);

impl LoopDevice {
    fn attach(file: &str) -> LoopDevice {
        let out = std::process::Command::new("losetup")
            .args(["-f", "--show", file])
            .output()
            .unwrap_or_else(|e| {
                panic!("losetup (util-linux) is needed for the block-device test: {e}")
            });
        assert!(
            out.status.success(),
            "losetup -f --show {file} failed (no free loop device, or not root?): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        LoopDevice(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

#[test]
fn write_read_patterns_block_device() {
    let dir = TempDir::new("blockdev-ns");
    let path = file_of(&dir, 64 * MIB as u64);
    let dev = LoopDevice::attach(&path);
    let t = Target::start(&["--file", &dev.0]);
    assert!(
        t.log().contains("block device"),
        "the daemon does not report a block device\n{}",
        t.log_tail()
    );
    exercise_namespace(&t, DEFAULT_NQN, 512, 64 * MIB as u64, 31);
}

#[test]
fn write_read_patterns_file_4k_config() {
    let dir = TempDir::new("file-ns-4k");
    let path = file_of(&dir, 64 * MIB as u64);
    let t = Target::start_config(&open_subsystem_config(
        "",
        OPEN_NQN,
        &format!("backend = \"file\"\npath = \"{path}\"\nblock_size = 4096"),
    ));
    exercise_namespace(&t, OPEN_NQN, 4096, 64 * MIB as u64, 4);
}

/// Busy-polling pollers (`pollers.busy_poll`) serve the same I/O as
/// sleeping ones.
#[test]
fn busy_poll_pollers_serve_io() {
    let t = Target::start_config(&open_subsystem_config(
        "[pollers]\ncount = 1\nbusy_poll = true",
        OPEN_NQN,
        "backend = \"memory\"\nsize = \"64MiB\"",
    ));
    exercise_namespace(&t, OPEN_NQN, 512, 64 * MIB as u64, 5);
}

/// 8 MiB in 1 MiB commands, one at a time and then 8 in flight.
fn multi_megabyte(q: &mut Queue, rng: &mut Rng) {
    let data = rng.bytes(8 * MIB);
    let lbas_per_mib = (MIB / 512) as u32;
    for (i, chunk) in data.chunks(MIB).enumerate() {
        let before = q.stats;
        q.write(NSID, i as u64 * lbas_per_mib as u64, chunk, 512, false)
            .or_panic(format_args!("1 MiB write #{i}"));
        assert!(q.stats.r2ts > before.r2ts, "1 MiB write #{i}: no R2T");
        let h2c = q.stats.h2c_pdus - before.h2c_pdus;
        assert!(
            h2c > 1,
            "1 MiB write #{i}: {h2c} H2CData PDU(s) with MAXH2CDATA {}",
            q.maxh2cdata()
        );
    }
    for (i, chunk) in data.chunks(MIB).enumerate() {
        let before = q.stats;
        let got = q
            .read(NSID, i as u64 * lbas_per_mib as u64, lbas_per_mib, 512)
            .or_panic(format_args!("1 MiB read #{i}"));
        let c2h = q.stats.c2h_pdus - before.c2h_pdus;
        assert!(c2h > 1, "1 MiB read #{i} came in {c2h} C2HData PDU(s)");
        assert_same(&got, chunk, &format!("1 MiB read #{i}"));
    }
    assert!(
        q.stats.c2h_max_len <= MAX_DATA_PDU,
        "C2HData of {} bytes",
        q.stats.c2h_max_len
    );

    // Again with all eight in flight at once, writes with fresh data.
    let data = rng.bytes(8 * MIB);
    let slba = |i: usize| (8 + i as u64) * lbas_per_mib as u64;
    rolling(
        q,
        8,
        8,
        |i| {
            let sqe = Queue::rw_sqe(nvm::WRITE, NSID, slba(i), lbas_per_mib);
            (sqe, Some(data[i * MIB..(i + 1) * MIB].to_vec()), 0)
        },
        |i, c| assert_status(&c, Status::SUCCESS, &format!("pipelined 1 MiB write #{i}")),
    );
    rolling(
        q,
        8,
        8,
        |i| {
            (
                Queue::rw_sqe(nvm::READ, NSID, slba(i), lbas_per_mib),
                None,
                MIB as u32,
            )
        },
        |i, c| {
            assert_status(&c, Status::SUCCESS, &format!("pipelined 1 MiB read #{i}"));
            assert_same(
                &c.data,
                &data[i * MIB..(i + 1) * MIB],
                &format!("pipelined 1 MiB read #{i}"),
            );
        },
    );
}

#[test]
fn multi_megabyte_transfer() {
    let t = Target::start(&["--memory", "64MiB"]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
    multi_megabyte(&mut c.io[0], &mut Rng::new(5));
}

#[test]
fn digests_on() {
    let t = Target::start(&["--memory", "64MiB"]);
    let opts = Opts {
        digests: BOTH_DIGESTS,
        ..Opts::default()
    };
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &opts);
    assert_eq!(
        c.admin().digests(),
        BOTH_DIGESTS,
        "digests on the admin queue"
    );
    assert_eq!(c.io[0].digests(), BOTH_DIGESTS, "digests on the I/O queue");
    let q = &mut c.io[0];
    let mut rng = Rng::new(6);
    write_read_checked(q, 512, 0, &rng.bytes(4 * KIB));
    write_read_checked(q, 512, MIB as u64, &rng.bytes(64 * KIB));
    multi_megabyte(q, &mut rng);
    pipelined_random(q, 512, 64 * MIB as u64, &mut rng, 128);

    // A command whose header digest is wrong: C2HTermReq (Header Digest
    // Error), then the connection closes.
    let mut bad = Queue::connect(t.addr(), BOTH_DIGESTS).or_panic("second connection with digests");
    let cqe = bad
        .fabrics_connect(0, 31, 5000, DEFAULT_NQN, HOST_B, [7; 16], 0xffff)
        .or_panic("admin Connect with digests");
    assert!(cqe.status().is_success(), "admin Connect: {}", cqe.status());
    let sqe = rdmablk_common::fabrics::PropertyCmd {
        wide: true,
        offset: property::CAP,
        value: 0,
    }
    .to_sqe(1, false);
    let mut pdu = encode(&Header::CapsuleCmd(sqe), 0, &[], BOTH_DIGESTS, 1);
    pdu[72] ^= 0xff; // first byte of HDGST after the 72-byte header
    bad.send_raw(&pdu).or_panic("sending the corrupted capsule");
    let (fes, _) = expect_term_req(&mut bad, "corrupted header digest");
    assert_eq!(
        fes,
        fes::HEADER_DIGEST_ERROR,
        "FES for a header digest error"
    );

    // H2CData whose data digest is wrong, small (through the receive
    // buffer) and large (placed straight in the arena): the write completes
    // with Transient Transport Error and the queue goes on.
    for (len, cid) in [(8 * KIB, 0x7101u16), (128 * KIB, 0x7102)] {
        let q = &mut c.io[0];
        let mut sqe = Queue::rw_sqe(nvm::WRITE, NSID, 4096, (len / 512) as u32);
        sqe.set_cid(cid);
        sqe.set_sgl(&Sgl::Transport { len: len as u32 });
        q.send_raw(&encode(&Header::CapsuleCmd(sqe), 0, &[], BOTH_DIGESTS, 1))
            .or_panic("sending a write");
        let r2t = match q.recv_pdu().or_panic("R2T") {
            (Header::R2T(t), _) => t,
            (h, _) => panic!("expected an R2T, got {h:?}"),
        };
        let data = rng.bytes(r2t.len as usize);
        let h2c = Transfer {
            len: r2t.len,
            ..r2t
        };
        let mut pdu = encode(&Header::H2CData(h2c), 0x04, &data, BOTH_DIGESTS, 1);
        let n = pdu.len();
        pdu[n - 1] ^= 0xff; // last byte of DDGST
        q.send_raw(&pdu).or_panic("sending H2CData");
        match q.recv_pdu().or_panic("response to the corrupted write") {
            (Header::CapsuleResp(cqe), _) => {
                assert_eq!(cqe.cid, cid);
                assert_eq!(
                    sct_sc(cqe.status()),
                    sct_sc(Status::TRANSIENT_TRANSPORT_ERROR),
                    "{len}-byte H2CData with a bad data digest: {}",
                    cqe.status()
                );
            }
            (h, _) => panic!("expected a CapsuleResp, got {h:?}"),
        }
    }

    // The first association is unharmed.
    write_read_checked(&mut c.io[0], 512, 2 * MIB as u64, &rng.bytes(4 * KIB));
}

#[test]
fn persistence_across_restart() {
    let dir = TempDir::new("persist");
    let path = file_of(&dir, 64 * MIB as u64);
    let mut rng = Rng::new(7);
    let writes: Vec<(u64, Vec<u8>, bool)> = vec![
        (0, rng.bytes(4 * KIB), false),
        (9 * 512, rng.bytes(512), true),
        (MIB as u64 + 512, rng.bytes(64 * KIB), false),
        (5 * MIB as u64, rng.bytes(MIB), true),
        (64 * MIB as u64 - 4096, rng.bytes(4 * KIB), false),
    ];

    let mut t = Target::start(&["--file", &path]);
    {
        let mut c = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
        pipelined_random(&mut c.io[0], 512, 64 * MIB as u64, &mut rng, 64);
        for (off, data, fua) in &writes {
            c.io[0]
                .write(NSID, off / 512, data, 512, *fua)
                .or_panic(format_args!("write at byte {off}"));
        }
    }
    let status = t.stop();
    assert!(status.success(), "exit status after SIGTERM: {status}");
    drop(t);

    // On disk, where the namespace says.
    let file = std::fs::read(&path).expect("reading the backing file");
    for (off, data, _) in &writes {
        let at = *off as usize;
        assert_same(
            &file[at..at + data.len()],
            data,
            &format!("backing file at byte {off}"),
        );
    }

    let t = Target::start(&["--file", &path]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
    for (off, data, _) in &writes {
        let got = c.io[0]
            .read(NSID, off / 512, (data.len() / 512) as u32, 512)
            .or_panic(format_args!("read after restart at byte {off}"));
        assert_same(&got, data, &format!("after restart, byte {off}"));
    }
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

/// For input so broken that a TermReq is optional: a C2HTermReq followed
/// by a close, or just a close, within 5 s; never silence.
fn expect_term_req_or_close(q: &mut Queue, case: &str) {
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
        )) => assert!(
            q.is_closed_by_peer(Duration::from_secs(5)),
            "{case}: C2HTermReq (FES {fes}, FEI {fei}) but the connection stays open"
        ),
        Ok((h, _)) => panic!("{case}: expected a C2HTermReq or a close, got {h:?}"),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
            ) => {}
        Err(e) => panic!("{case}: expected a C2HTermReq or a close: {e}"),
    }
}

/// A controller doing verified I/O between the bad-input cases.
struct Healthy {
    c: Controller,
    rng: Rng,
    written: BTreeMap<u64, Vec<u8>>,
}

impl Healthy {
    fn check(&mut self, after: &str) {
        let what = |step: &str| format!("healthy controller after {after}: {step}");
        self.c.admin().keep_alive().or_panic(what("Keep Alive"));
        let q = &mut self.c.io[0];
        let slba = (self.written.len() as u64) * 8;
        let data = self.rng.bytes(4096);
        q.write(NSID, slba, &data, 512, false)
            .or_panic(what("write"));
        self.written.insert(slba, data);
        for (slba, data) in &self.written {
            let got = q.read(NSID, *slba, 8, 512).or_panic(what("read"));
            assert_same(&got, data, &what(&format!("data at LBA {slba}")));
        }
    }
}

/// A valid capsule (Property Get CAP) without digests.
fn plain_capsule() -> Vec<u8> {
    let sqe = rdmablk_common::fabrics::PropertyCmd {
        wide: true,
        offset: property::CAP,
        value: 0,
    }
    .to_sqe(1, false);
    encode(&Header::CapsuleCmd(sqe), 0, &[], Digests::default(), 1)
}

#[test]
fn bad_input_keeps_others_working() {
    let mut t = Target::start_config(&two_subsystems_config());
    let addr = t.addr();
    let mut healthy = Healthy {
        c: open(&t, OPEN_NQN, HOST_A, &Opts::default()),
        rng: Rng::new(8),
        written: BTreeMap::new(),
    };
    healthy.check("setup");
    let fresh = || Queue::connect(addr, Digests::default()).or_panic("fresh connection with ICReq");
    let fresh_raw = || Queue::connect_raw(addr).or_panic("fresh TCP connection");

    // Garbage instead of an ICReq.
    let mut q = fresh_raw();
    q.send_raw(&Rng::new(9).bytes(256))
        .or_panic("sending garbage");
    expect_term_req_or_close(&mut q, "garbage bytes");
    healthy.check("garbage bytes");

    // Half a capsule, then EOF: the target must notice and close its side.
    let mut q = fresh();
    q.send_raw(&plain_capsule()[..40])
        .or_panic("sending half a capsule");
    q.shutdown_write().or_panic("shutdown(WR)");
    assert!(
        q.is_closed_by_peer(Duration::from_secs(5)),
        "truncated PDU then EOF: the target did not close"
    );
    healthy.check("a truncated PDU");

    // PLEN far beyond anything acceptable.
    let mut q = fresh();
    let mut pdu = plain_capsule();
    pdu[4..8].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
    q.send_raw(&pdu).or_panic("sending a huge-PLEN capsule");
    let (f, i) = expect_term_req(&mut q, "huge PLEN");
    assert_eq!(
        (f, i),
        (fes::INVALID_HEADER_FIELD, 4),
        "(FES, FEI) for a huge PLEN"
    );
    healthy.check("a huge PLEN");

    // Unknown PDU type.
    let mut q = fresh();
    let mut pdu = plain_capsule();
    pdu[0] = 0x42;
    q.send_raw(&pdu).or_panic("sending PDU type 0x42");
    let (f, i) = expect_term_req(&mut q, "PDU type 0x42");
    assert_eq!(
        (f, i),
        (fes::INVALID_HEADER_FIELD, 0),
        "(FES, FEI) for PDU type 0x42"
    );
    healthy.check("PDU type 0x42");

    // A controller-to-host PDU sent by the host.
    let mut q = fresh();
    let c2h = Transfer {
        cccid: 0,
        ttag: 0,
        offset: 0,
        len: 4,
    };
    q.send_raw(&encode(
        &Header::C2HData(c2h),
        0,
        &[1, 2, 3, 4],
        Digests::default(),
        1,
    ))
    .or_panic("sending C2HData to the target");
    expect_term_req(&mut q, "C2HData from the host");
    healthy.check("C2HData from the host");

    // A capsule before the ICReq.
    let mut q = fresh_raw();
    q.send_raw(&plain_capsule())
        .or_panic("sending a capsule before ICReq");
    expect_term_req_or_close(&mut q, "capsule before ICReq");
    healthy.check("a capsule before ICReq");

    // Command errors on a second controller: statuses, and its queue lives on.
    let mut probe = open(&t, OPEN_NQN, HOST_B, &Opts::default());
    let nsze = identify_ns(&mut probe, NSID).nsze;
    let q = &mut probe.io[0];
    let mut expect = |what: &str, sqe: Sqe, out: Option<&[u8]>, in_len: u32, want: Status| {
        let c = q.exec(sqe, out, in_len).or_panic(what);
        assert_status(&c, want, what);
    };
    let read = |nsid: u32, slba: u64, nlb: u32| Queue::rw_sqe(nvm::READ, nsid, slba, nlb);
    let write = |nsid: u32, slba: u64, nlb: u32| Queue::rw_sqe(nvm::WRITE, nsid, slba, nlb);
    let block = [0x5au8; 512];
    let two_blocks = [0x5au8; 1024];
    expect(
        "read of nsid 99",
        read(99, 0, 8),
        None,
        4096,
        Status::INVALID_NAMESPACE,
    );
    expect(
        "write to nsid 99",
        write(99, 0, 1),
        Some(&block),
        0,
        Status::INVALID_NAMESPACE,
    );
    expect(
        "read across the end",
        read(NSID, nsze - 1, 2),
        None,
        1024,
        Status::LBA_OUT_OF_RANGE,
    );
    expect(
        "read past the end",
        read(NSID, nsze, 1),
        None,
        512,
        Status::LBA_OUT_OF_RANGE,
    );
    expect(
        "read at SLBA 2^64-1",
        read(NSID, u64::MAX, 1),
        None,
        512,
        Status::LBA_OUT_OF_RANGE,
    );
    expect(
        "write across the end",
        write(NSID, nsze - 1, 2),
        Some(&two_blocks),
        0,
        Status::LBA_OUT_OF_RANGE,
    );
    expect(
        "2 MiB read (over MDTS)",
        read(NSID, 0, 4096),
        None,
        2 * MIB as u32,
        Status::INVALID_FIELD,
    );
    let big = vec![0u8; 2 * MIB];
    expect(
        "2 MiB write (over MDTS)",
        write(NSID, 0, 4096),
        Some(&big),
        0,
        Status::INVALID_FIELD,
    );
    // SGL shorter than NLB says: must fail, and must not overrun our 512 bytes.
    let c = q
        .exec(read(NSID, 0, 8), None, 512)
        .or_panic("read with a short SGL");
    assert!(
        !c.status().is_success(),
        "read of 4 KiB into a 512-byte SGL succeeded"
    );
    let got = q
        .read(NSID, 0, 1, 512)
        .or_panic("probe controller after its errors");
    assert_eq!(got.len(), 512);
    drop(probe);
    healthy.check("command errors");

    // Connect to a subsystem that does not exist.
    let mut q = fresh();
    let cqe = q
        .fabrics_connect(
            0,
            31,
            5000,
            "nqn.2026-11.io.rdmablk:nope",
            HOST_A,
            [1; 16],
            0xffff,
        )
        .or_panic("Connect to an unknown NQN");
    assert_eq!(
        sct_sc(cqe.status()),
        sct_sc(Status::CONNECT_INVALID_PARAMETERS),
        "unknown NQN: {}",
        cqe.status()
    );
    healthy.check("Connect to an unknown NQN");

    // A host not on the allow-list, and (control) one that is.
    let mut q = fresh();
    let cqe = q
        .fabrics_connect(0, 31, 5000, PRIVATE_NQN, HOST_B, [2; 16], 0xffff)
        .or_panic("Connect as a host not allowed");
    assert_eq!(
        sct_sc(cqe.status()),
        sct_sc(Status::CONNECT_INVALID_HOST),
        "host not allowed: {}",
        cqe.status()
    );
    let mut allowed = open(&t, PRIVATE_NQN, HOST_A, &Opts::default());
    allowed.io[0]
        .read(NSID, 0, 1, 512)
        .or_panic("read as an allowed host");
    drop(allowed);
    healthy.check("Connect as a host not allowed");

    // An I/O queue for a controller that does not exist.
    let mut q = fresh();
    let bogus = if healthy.c.cntlid == 0xbeef {
        0xbeee
    } else {
        0xbeef
    };
    let cqe = q
        .fabrics_connect(1, 127, 0, OPEN_NQN, HOST_A, [3; 16], bogus)
        .or_panic("I/O queue Connect with a bogus cntlid");
    assert_eq!(
        sct_sc(cqe.status()),
        sct_sc(Status::CONNECT_INVALID_PARAMETERS),
        "bogus cntlid: {}",
        cqe.status()
    );
    healthy.check("an I/O queue Connect with a bogus cntlid");

    assert!(t.is_running(), "the daemon died");
}

#[test]
fn keep_alive_timeout_disconnects() {
    let t = Target::start(&["--memory", "64MiB"]);
    // Warm up (so lazily created resources are not counted as a leak), then
    // measure.
    let mut warm = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
    warm.shutdown().or_panic("warm-up shutdown");
    drop(warm);
    let baseline = settled_fd_count(t.pid());

    // Admin Connect with KATO 1 s, then silence.
    let start = Instant::now();
    let mut idle = Queue::connect(t.addr(), Digests::default()).or_panic("connect");
    let cqe = idle
        .fabrics_connect(0, 31, 1000, DEFAULT_NQN, HOST_A, [4; 16], 0xffff)
        .or_panic("admin Connect with KATO 1000");
    assert!(cqe.status().is_success(), "admin Connect: {}", cqe.status());
    // And a whole controller with an I/O queue, just as silent.
    let opts = Opts {
        kato_ms: 1000,
        auto_keep_alive: false,
        ..Opts::default()
    };
    let mut idle_ctrl = open(&t, DEFAULT_NQN, HOST_A, &opts);

    assert!(
        idle.is_closed_by_peer(Duration::from_secs(4)),
        "admin queue with KATO 1 s still open after {:?} of silence",
        start.elapsed()
    );
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(900),
        "closed after {elapsed:?}, before KATO (1 s) ran out"
    );
    let left = Duration::from_secs(5).saturating_sub(start.elapsed());
    assert!(
        idle_ctrl.admin().is_closed_by_peer(left),
        "idle controller's admin queue still open"
    );
    let left = Duration::from_secs(5).saturating_sub(start.elapsed());
    assert!(
        idle_ctrl.io[0].is_closed_by_peer(left),
        "idle controller's I/O queue still open after KATO expiry"
    );
    drop((idle, idle_ctrl));

    let deadline = Instant::now() + Duration::from_secs(3);
    let mut fds = fd_count(t.pid());
    while fds > baseline && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        fds = fd_count(t.pid());
    }
    assert!(
        fds <= baseline,
        "daemon holds {fds} fds, {baseline} before the timed-out connections"
    );

    // A host that sends Keep Alive every 300 ms stays connected.
    let mut live = open(&t, DEFAULT_NQN, HOST_A, &opts);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(300));
        live.admin().keep_alive().or_panic(format_args!(
            "Keep Alive {:?} into a KATO 1 s association",
            start.elapsed()
        ));
    }
    live.io[0]
        .read(NSID, 0, 8, 512)
        .or_panic("I/O after 3 s of keep-alives");
}

/// The log also lists the discovery subsystem itself on each listener
/// (SUBTYPE 3h, NVMe over Fabrics 1.1a Figure 38 and TP 8013) with
/// DUPRETINFO, which tells hosts (nvme connect-all) not to connect to it
/// again, and EPCSD.
#[test]
fn discovery_log_lists_allowed_subsystems() {
    let t = Target::start_config(&two_subsystems_config());
    let port = t.port().to_string();
    let subsystems = |host: &str| {
        let entries =
            Controller::discover(t.addr(), host).or_panic(format_args!("discovery as {host}"));
        let current: Vec<_> = entries
            .iter()
            .filter(|e| e.subnqn == DISCOVERY_NQN)
            .collect();
        assert_eq!(current.len(), 1, "one current discovery entry per listener");
        let c = current[0];
        assert_eq!(
            (c.subtype, c.eflags, c.traddr.as_str(), c.trsvcid.as_str()),
            (
                subtype::CURRENT_DISCOVERY,
                eflags::DUPRETINFO | eflags::EPCSD,
                "127.0.0.1",
                port.as_str()
            ),
            "current discovery entry"
        );
        let mut nqns = Vec::new();
        for e in entries.iter().filter(|e| e.subnqn != DISCOVERY_NQN) {
            let what = format!("entry for {} as seen by {host}", e.subnqn);
            assert_eq!(e.trtype, trtype::TCP, "{what}: TRTYPE");
            assert_eq!(e.adrfam, adrfam::IPV4, "{what}: ADRFAM");
            assert_eq!(e.subtype, subtype::NVME, "{what}: SUBTYPE");
            assert_eq!(e.trsvcid, port, "{what}: TRSVCID");
            assert_eq!(e.traddr, "127.0.0.1", "{what}: TRADDR");
            nqns.push(e.subnqn.clone());
        }
        nqns.sort();
        nqns
    };
    assert_eq!(
        subsystems(HOST_A),
        vec![OPEN_NQN.to_string(), PRIVATE_NQN.to_string()],
        "as the allowed host"
    );
    assert_eq!(
        subsystems(HOST_B),
        vec![OPEN_NQN.to_string()],
        "as a host only the open subsystem admits"
    );
}

#[test]
fn graceful_shutdown_drains() {
    let dir = TempDir::new("drain");
    let path = file_of(&dir, 64 * MIB as u64);
    let mut t = Target::start(&["--file", &path]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
    let q = &mut c.io[0];
    let mut rng = Rng::new(10);
    let len = 128 * KIB;
    let data: Vec<Vec<u8>> = (0..32).map(|_| rng.bytes(len)).collect();
    let slba = |i: usize| (i * 2 * len / 512) as u64;

    // 32 writes that need R2T: none can finish before we answer, and we
    // answer only after SIGTERM.
    let mut cids = HashMap::new();
    for (i, d) in data.iter().enumerate() {
        let sqe = Queue::rw_sqe(nvm::WRITE, NSID, slba(i), (len / 512) as u32);
        let cid = q
            .submit(sqe, Some(d), 0)
            .or_panic(format_args!("submit write #{i}"));
        cids.insert(cid, i);
    }
    assert!(
        t.wait_notify("READY=1", Duration::ZERO),
        "no READY=1 on $NOTIFY_SOCKET although the daemon listens"
    );
    t.terminate();
    // Answer the R2Ts only once the daemon is stopping, so the writes are
    // really in flight while it drains.
    assert!(
        t.wait_notify("STOPPING=1", Duration::from_secs(5)),
        "no STOPPING=1 on $NOTIFY_SOCKET within 5 s of SIGTERM"
    );
    let mut done = 0;
    while done < data.len() {
        let c = q.wait_any().unwrap_or_else(|e| {
            panic!(
                "after SIGTERM, {done} of 32 in-flight writes completed, then: {e} \
                 (the host had received {} R2Ts and sent {} H2CData PDUs)",
                q.stats.r2ts, q.stats.h2c_pdus
            )
        });
        let i = cids[&c.cid];
        assert_status(
            &c,
            Status::SUCCESS,
            &format!("write #{i} in flight at SIGTERM"),
        );
        done += 1;
    }
    let status = t.wait(Duration::from_secs(10));
    assert!(status.success(), "exit status after draining: {status}");

    let file = std::fs::read(&path).expect("reading the backing file");
    for (i, d) in data.iter().enumerate() {
        let at = slba(i) as usize * 512;
        assert_same(
            &file[at..at + len],
            d,
            &format!("write #{i} on disk after the drain"),
        );
    }
}

/// Sends `sqe` with `data` in the capsule under an in-capsule SGL of the
/// data's length, and reads the status of its CapsuleResp (the connection
/// must have nothing else in flight).
fn raw_capsule_status(q: &mut Queue, mut sqe: Sqe, data: &[u8], what: &str) -> Status {
    let cid = sqe.cid();
    sqe.set_sgl(&Sgl::InCapsule {
        offset: 0,
        len: data.len() as u32,
    });
    q.send_raw(&encode(
        &Header::CapsuleCmd(sqe),
        0,
        data,
        Digests::default(),
        1,
    ))
    .or_panic(format_args!("{what}: sending"));
    match q.recv_pdu().or_panic(format_args!("{what}: response")) {
        (Header::CapsuleResp(cqe), _) if cqe.cid == cid => cqe.status(),
        (h, _) => panic!("{what}: expected the CapsuleResp of cid {cid}, got {h:?}"),
    }
}

/// Capsules whose in-capsule data does not match the command, and a Get Log
/// Page asking for 16 GiB, get statuses; the daemon and another controller
/// carry on.
#[test]
fn mismatched_capsule_data_and_huge_log_requests() {
    let t = Target::start(&["--memory", "64MiB"]);
    let mut healthy = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
    let mut c = open(&t, DEFAULT_NQN, HOST_B, &Opts::default());

    // Keep Alive (no data) with an in-capsule descriptor of length 0.
    let what = "Keep Alive with an empty in-capsule SGL";
    let st = raw_capsule_status(&mut c.admin(), Sqe::new(0x18, 0x7001), &[], what);
    assert!(st.is_success(), "{what}: {st}");

    // Flush (no data) with 512 bytes in the capsule: NVMe Base 2.1, 4.3.2,
    // an SGL longer than the command's transfer is Data SGL Length Invalid.
    let mut flush = Sqe::new(nvm::FLUSH, 0x7002);
    flush.set_nsid(NSID);
    let what = "Flush carrying 512 bytes";
    let st = raw_capsule_status(&mut c.io[0], flush, &[0u8; 512], what);
    assert_eq!(
        sct_sc(st),
        sct_sc(Status::SGL_DATA_LENGTH_INVALID),
        "{what}: {st}"
    );
    // DSM of one range (16 bytes) with 8 KiB in the capsule: the one rule
    // of every transport and SGL type is that the data covers the ranges
    // (as nvmet_check_data_len_lte); the rest is ignored.
    let mut dsm = Sqe::new(nvm::DSM, 0x7003);
    dsm.set_nsid(NSID);
    dsm.set_cdw(11, 1 << 2);
    let what = "DSM of one range carrying 8 KiB";
    let st = raw_capsule_status(&mut c.io[0], dsm, &[0u8; 8192], what);
    assert!(st.is_success(), "{what}: {st}");

    // Get Log Page (SMART) with NUMD = 2^32 - 1 dwords and a 4 KiB transfer:
    // the SGL is shorter than the transfer the command asks for (NVMe Base
    // 2.1, 4.3.2: Data SGL Length Invalid), and nothing is allocated for it.
    let mut glp = Sqe::new(0x02, 0);
    glp.set_cdw(10, lid::SMART as u32 | 0xffff << 16);
    glp.set_cdw(11, 0xffff);
    let got = c
        .admin()
        .exec(glp, None, 4096)
        .or_panic("Get Log Page of 16 GiB");
    assert_status(
        &got,
        Status::SGL_DATA_LENGTH_INVALID,
        "Get Log Page with the largest NUMD and a 4 KiB SGL",
    );

    c.io[0]
        .write(NSID, 8, &[0x5au8; 4096], 512, false)
        .or_panic("I/O on the same queue afterwards");
    healthy.io[0]
        .write(NSID, 0, &[0xa5u8; 4096], 512, false)
        .or_panic("the other controller afterwards");
    let back = healthy.io[0].read(NSID, 0, 8, 512).or_panic("read back");
    assert_same(&back, &[0xa5u8; 4096], "the other controller's data");
}

/// More large writes in flight than the arena holds: commands wait for
/// buffers while the byte stream keeps flowing, every write completes, and
/// each R2T asks for at most MAXH2CDATA (hosts older than Linux 5.18 send an
/// R2T's data in one PDU).
#[test]
fn writes_larger_than_the_arena_complete() {
    let t = Target::start_config(&open_subsystem_config(
        "[pollers]\ncount = 1\narena = \"4MiB\"",
        DEFAULT_NQN,
        "backend = \"memory\"\nsize = \"64MiB\"",
    ));
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
    let q = &mut c.io[0];
    let mut rng = Rng::new(77);
    let data: Vec<Vec<u8>> = (0..32).map(|_| rng.bytes(MIB)).collect();
    let lbas = (MIB / 512) as u32;
    let before = q.stats;
    let mut cids = HashMap::new();
    for (i, d) in data.iter().enumerate() {
        let sqe = Queue::rw_sqe(nvm::WRITE, NSID, (i as u32 * lbas) as u64, lbas);
        cids.insert(
            q.submit(sqe, Some(d), 0)
                .or_panic(format_args!("submit write #{i}")),
            i,
        );
    }
    for _ in 0..data.len() {
        let c = q
            .wait_any()
            .or_panic("32 writes of 1 MiB through a 4 MiB arena");
        assert_status(&c, Status::SUCCESS, &format!("write #{}", cids[&c.cid]));
    }
    let r2ts = q.stats.r2ts - before.r2ts;
    assert_eq!(
        r2ts,
        32 * (MIB as u64 / MAX_DATA_PDU as u64),
        "R2Ts for 32 MiB in 128 KiB pieces"
    );
    for (i, d) in data.iter().enumerate() {
        let got = q
            .read(NSID, (i as u32 * lbas) as u64, lbas, 512)
            .or_panic(format_args!("read #{i}"));
        assert_same(&got, d, &format!("1 MiB #{i}"));
    }
}

/// In-capsule writes that arrive while their queue's budget is held by
/// large writes waiting for their data are staged (within the poller's
/// bound) without stopping the byte stream that carries that data: every
/// write completes and reads back.
#[test]
fn in_capsule_writes_wait_behind_a_full_budget() {
    let t = Target::start(&["--memory", "64MiB"]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
    let q = &mut c.io[0];
    let mut rng = Rng::new(78);
    let lbas = (MIB / 512) as u32;
    // Four writes of 1 MiB take the whole queue budget (limits.queue_buffer,
    // 4 MiB); their R2Ts are answered only once we wait.
    let big: Vec<Vec<u8>> = (0..4).map(|_| rng.bytes(MIB)).collect();
    let small: Vec<Vec<u8>> = (0..32).map(|_| rng.bytes(4096)).collect();
    let mut cids = Vec::new();
    for (i, d) in big.iter().enumerate() {
        let sqe = Queue::rw_sqe(nvm::WRITE, NSID, i as u64 * lbas as u64, lbas);
        cids.push(q.submit(sqe, Some(d), 0).or_panic("submit a 1 MiB write"));
    }
    let before = q.stats;
    let small_at = 4 * lbas as u64;
    for (i, d) in small.iter().enumerate() {
        let sqe = Queue::rw_sqe(nvm::WRITE, NSID, small_at + 8 * i as u64, 8);
        cids.push(q.submit(sqe, Some(d), 0).or_panic("submit a 4 KiB write"));
    }
    assert_eq!(
        q.stats.in_capsule_writes - before.in_capsule_writes,
        32,
        "the 4 KiB writes travel in their capsules"
    );
    for cid in cids {
        assert_status(&q.wait(cid).or_panic("write"), Status::SUCCESS, "write");
    }
    for (i, d) in big.iter().enumerate() {
        let got = q
            .read(NSID, i as u64 * lbas as u64, lbas, 512)
            .or_panic("read back 1 MiB");
        assert_same(&got, d, &format!("1 MiB write #{i}"));
    }
    for (i, d) in small.iter().enumerate() {
        let got = q
            .read(NSID, small_at + 8 * i as u64, 8, 512)
            .or_panic("read back 4 KiB");
        assert_same(&got, d, &format!("4 KiB write #{i}"));
    }
}

/// A large H2CData whose header carries padding (PDO past the header) and
/// arrives in pieces, the first ending inside the padding: the target waits
/// for the rest and places the data (it used to slice past what it had).
#[test]
fn padded_h2cdata_header_in_pieces() {
    let t = Target::start(&["--memory", "64MiB"]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
    let q = &mut c.io[0];
    let data = Rng::new(79).bytes(64 * 1024);
    let cid = q
        .submit(Queue::rw_sqe(nvm::WRITE, NSID, 0, 128), Some(&data), 0)
        .or_panic("submit a 64 KiB Write");
    let (r2t, _) = q.recv_pdu().or_panic("R2T");
    let Header::R2T(t2) = r2t else {
        panic!("expected an R2T, got {r2t:?}")
    };
    assert_eq!(t2.cccid, cid);
    let h2c = Header::H2CData(Transfer {
        cccid: cid,
        ttag: t2.ttag,
        offset: t2.offset,
        len: t2.len,
    });
    let n = t2.len as usize;
    // Data aligned to 200 bytes: PDO 200, 176 bytes of padding.
    let pdu = encode(
        &h2c,
        rdmablk_common::tcp::flags::LAST_PDU,
        &data[t2.offset as usize..t2.offset as usize + n],
        q.digests(),
        200,
    );
    assert_eq!(pdu[3], 200, "PDO");
    q.send_raw(&pdu[..100])
        .or_panic("header and part of the padding");
    std::thread::sleep(Duration::from_millis(300));
    q.send_raw(&pdu[100..]).or_panic("the rest");
    let got = q.wait(cid).or_panic("the Write");
    assert_status(&got, Status::SUCCESS, "Write with a padded H2CData");
    let back = q.read(NSID, 0, 128, 512).or_panic("read back");
    assert_same(&back, &data, "64 KiB written through a padded H2CData");
}

/// Reads the daemon's stats file: (connections, controllers, arena buffers
/// in use summed over pollers), once it exists.
fn read_stats(path: &std::path::Path) -> Option<(u64, u64, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let field = |name: &str| -> Option<&str> {
        let at = text.find(&format!("\"{name}\":"))? + name.len() + 3;
        Some(&text[at..])
    };
    let num = |name: &str| -> Option<u64> {
        let rest = field(name)?;
        rest[..rest.find(|c: char| !c.is_ascii_digit())?]
            .parse()
            .ok()
    };
    let buffers = field("arena_buffers_in_use")?;
    let list = &buffers[1..buffers.find(']')?];
    let sum = list
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u64>().ok())
        .sum::<Option<u64>>()?;
    Some((num("connections")?, num("controllers")?, sum))
}

/// Polls the stats file until `want` holds (≤ 5 s); returns the last reading.
fn stats_until(
    path: &std::path::Path,
    what: &str,
    want: impl Fn((u64, u64, u64)) -> bool,
) -> (u64, u64, u64) {
    let start = Instant::now();
    loop {
        let got = read_stats(path);
        if let Some(s) = got.filter(|s| want(*s)) {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{what}: stats file says {got:?} (connections, controllers, arena buffers in use)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `--stats FILE`: the counters follow connections, controllers and arena
/// buffers, and the buffers come back to zero once the I/O is done.
#[test]
fn stats_file_tracks_connections_and_buffers() {
    let dir = TempDir::new("stats");
    let path = dir.join("stats.json");
    let t = Target::start(&[
        "--memory",
        "64MiB",
        "--stats",
        path.to_str().expect("utf-8 path"),
    ]);
    stats_until(&path, "idle daemon", |s| s == (0, 0, 0));
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
    stats_until(&path, "one controller, admin and I/O queue", |s| {
        s == (2, 1, 0)
    });
    // Eight 1 MiB writes whose data we hold back: as many as the queue's
    // budget (limits.queue_buffer, 4 MiB by default) hold an arena buffer,
    // the others wait for one.
    let q = &mut c.io[0];
    let data = Rng::new(5).bytes(MIB);
    let lbas = (MIB / 512) as u32;
    let cids: Vec<u16> = (0..8)
        .map(|i| {
            q.submit(
                Queue::rw_sqe(nvm::WRITE, NSID, i * lbas as u64, lbas),
                Some(&data),
                0,
            )
            .or_panic("submit")
        })
        .collect();
    stats_until(&path, "eight writes waiting for their data", |s| s.2 == 4);
    for cid in cids {
        assert_status(&q.wait(cid).or_panic("write"), Status::SUCCESS, "write");
    }
    stats_until(&path, "after the writes", |s| s == (2, 1, 0));
    // The eight writes are the I/O commands answered, and the daemon's CPU
    // time per I/O follows from its counters.
    let start = Instant::now();
    let (ios, cpu_us, per_io) = loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let got = (
            v["io_commands"].as_u64(),
            v["cpu_us"].as_u64(),
            v["cpu_us_per_io"].as_f64(),
        );
        if let (Some(8), Some(c), Some(p)) = got {
            break (8, c, p);
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "stats file after eight writes: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(cpu_us > 0, "the daemon reports no CPU time");
    let want = cpu_us as f64 / ios as f64;
    assert!(
        (per_io - want).abs() <= 0.006,
        "cpu_us_per_io {per_io} is not cpu_us / io_commands ({want})"
    );
    drop(c);
    stats_until(&path, "after the host left", |s| s == (0, 0, 0));
}

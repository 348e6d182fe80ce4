//! `rdmablk-target` against the letter of the NVMe specifications, over
//! NVMe/TCP on loopback with the test host in `rdmablk_tests::client`.
//! Each test names the section it checks (NVMe Base 2.1 unless stated);
//! each runs its own daemon, and a failing test prints the daemon's log tail.

use rdmablk_common::bytes::get_u16;
use rdmablk_common::fabrics::{cattr, fctype, PropertyCmd, DISCOVERY_NQN};
use rdmablk_common::nvme::identify::{cns, NamespaceId};
use rdmablk_common::nvme::log::lid;
use rdmablk_common::nvme::{
    admin, crd_of, dnr_of, feature, nvm, property, Cqe, Sgl, Sqe, Status, FABRICS_OPCODE,
};
use rdmablk_common::tcp::{encode, flags, Digests, Header, Transfer};
use rdmablk_tests::check::{
    assert_cqe_status, assert_same, assert_status, assert_zero, open, sct_sc, OrPanic,
};
use rdmablk_tests::client::{Completion, Controller, Opts, Queue};
use rdmablk_tests::names::{DEFAULT_NQN, HOST_A, HOST_B, OPEN_NQN, PRIVATE_NQN};
use rdmablk_tests::open_subsystem_config;
use rdmablk_tests::{two_subsystems_config, Rng, Target};
use std::io;
use std::time::{Duration, Instant};

const NSID: u32 = 1;
const KIB: usize = 1 << 10;
const BOTH_DIGESTS: Digests = Digests {
    header: true,
    data: true,
};
/// CC with EN and the I/O queue entry sizes (64-byte SQEs, 16-byte CQEs).
const CC_ENABLE: u32 = property::CC_EN | 6 << 16 | 4 << 20;
const SHST_MASK: u32 = 3 << property::CSTS_SHST_SHIFT;
/// Connect CATTR bit 2: disable SQ flow control.
/// Host Behavior Support data length.
const HBS_LEN: usize = 512;

/// Options for a host that sends no Keep Alive but has a KATO long enough
/// for any test (the keep-alive thread would stop at the first failing
/// Keep Alive, e.g. while the controller is disabled).
fn quiet_opts() -> Opts {
    Opts {
        kato_ms: 60_000,
        auto_keep_alive: false,
        ..Opts::default()
    }
}

/// [`quiet_opts`] with header and data digests on every queue.
fn digest_opts() -> Opts {
    Opts {
        digests: BOTH_DIGESTS,
        ..quiet_opts()
    }
}

/// Options for a discovery host: no I/O queue, KATO 0, no Keep Alive.
fn discovery_opts() -> Opts {
    Opts {
        io_queues: 0,
        kato_ms: 0,
        auto_keep_alive: false,
        ..Opts::default()
    }
}

/// A Fabrics Disconnect command (FCTYPE 08h).
fn disconnect_sqe() -> Sqe {
    let mut s = Sqe::new(FABRICS_OPCODE, 0);
    s.0[4] = fctype::DISCONNECT;
    s
}

fn property_get_sqe(offset: u32, wide: bool) -> Sqe {
    PropertyCmd {
        wide,
        offset,
        value: 0,
    }
    .to_sqe(0, false)
}

fn property_set_sqe(offset: u32, value: u32) -> Sqe {
    PropertyCmd {
        wide: false,
        offset,
        value: value as u64,
    }
    .to_sqe(0, true)
}

/// Polls CSTS until `done(csts)` (≤ 5 s); returns the last value read.
fn poll_csts(admin: &mut Queue, what: &str, done: impl Fn(u32) -> bool) -> u32 {
    let start = Instant::now();
    loop {
        let csts = admin
            .prop_get(property::CSTS, false)
            .or_panic(format_args!("Property Get CSTS ({what})")) as u32;
        if done(csts) || start.elapsed() > Duration::from_secs(5) {
            return csts;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether an error from the host means the target closed the connection.
fn is_closed_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// A fresh TCP connection that connects I/O queue `qid` of controller
/// `cntlid` (the caller checks the completion).
fn connect_io_queue(
    t: &Target,
    qid: u16,
    host: &str,
    opts: &Opts,
    cntlid: u16,
) -> (Queue, Completion) {
    let mut q = Queue::connect(t.addr(), opts.digests).or_panic("new I/O queue connection");
    let c = q
        .fabrics_connect_full(
            qid,
            opts.sqsize,
            0,
            opts.cattr,
            DEFAULT_NQN,
            host,
            opts.hostid,
            cntlid,
        )
        .or_panic(format_args!("I/O queue {qid} Connect"));
    q.set_in_capsule_limit(8192);
    (q, c)
}

// ---- 1: controller reset and shutdown --------------------------------------

/// NVMe Base 2.1, 3.7.2 (Controller Level Reset): CC.EN 1 → 0 deletes the
/// I/O queues. A Write sent on the old I/O queue afterwards does not execute
/// (Command Aborted due to SQ Deletion, or the connection is gone) and its
/// data never reaches the namespace; the target closes the old queue's
/// connection within about a second; CSTS.RDY reads 0; CC.EN = 1 makes RDY
/// 1 again and the same queue id connects again on a new connection and
/// does I/O.
#[test]
fn cc_en_reset_deletes_io_queues() {
    let t = Target::start(&["--memory", "64MiB"]);
    let opts = quiet_opts();
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &opts);
    let before = Rng::new(11).bytes(4096);
    c.io[0]
        .write(NSID, 0, &before, 512, false)
        .or_panic("write before the reset");

    let cc = c.admin().prop_get(property::CC, false).or_panic("Get CC") as u32;
    assert_ne!(cc & property::CC_EN, 0, "CC.EN before the reset: {cc:#x}");
    c.admin()
        .prop_set(property::CC, cc & !property::CC_EN)
        .or_panic("Property Set CC.EN = 0");
    let reset_at = Instant::now();
    let csts = c
        .admin()
        .prop_get(property::CSTS, false)
        .or_panic("CSTS after the reset") as u32;
    assert_eq!(
        csts & property::CSTS_RDY,
        0,
        "CSTS.RDY after CC.EN 1 -> 0 (CSTS {csts:#x})"
    );

    // A write on the deleted queue: aborted, or the connection is closed.
    let after = Rng::new(12).bytes(4096);
    let sqe = Queue::rw_sqe(nvm::WRITE, NSID, 0, 8);
    match c.io[0].exec(sqe, Some(&after), 0) {
        Ok(done) => assert_status(
            &done,
            Status::ABORTED_SQ_DELETION,
            "Write on an I/O queue deleted by a controller reset",
        ),
        Err(e) if is_closed_error(&e) => {}
        Err(e) => panic!("Write on an I/O queue deleted by a controller reset: {e}"),
    }
    let left = Duration::from_millis(1500).saturating_sub(reset_at.elapsed());
    assert!(
        c.io[0].is_closed_by_peer(left),
        "the deleted I/O queue's connection is still open {:?} after the reset",
        reset_at.elapsed()
    );
    let csts = c
        .admin()
        .prop_get(property::CSTS, false)
        .or_panic("CSTS while disabled") as u32;
    assert_eq!(csts & property::CSTS_RDY, 0, "CSTS.RDY while disabled");

    // Enable again: RDY = 1, the same qid connects on a new connection.
    c.admin()
        .prop_set(property::CC, CC_ENABLE)
        .or_panic("Property Set CC.EN = 1");
    let csts = poll_csts(&mut c.admin(), "after re-enable", |v| {
        v & property::CSTS_RDY != 0
    });
    assert_eq!(
        csts & (property::CSTS_RDY | property::CSTS_CFS),
        property::CSTS_RDY,
        "CSTS after CC.EN 0 -> 1 (CSTS {csts:#x})"
    );
    let (mut q, done) = connect_io_queue(&t, 1, HOST_A, &opts, c.cntlid);
    assert_status(
        &done,
        Status::SUCCESS,
        "Connect of I/O queue 1 again after the reset",
    );
    let got = q
        .read(NSID, 0, 8, 512)
        .or_panic("read on the new I/O queue");
    assert_same(
        &got,
        &before,
        "LBA 0 after a write on the deleted queue (read on the new queue)",
    );
    let more = Rng::new(13).bytes(4096);
    q.write(NSID, 8, &more, 512, false)
        .or_panic("write on the new I/O queue");
    let got = q
        .read(NSID, 8, 8, 512)
        .or_panic("read back on the new queue");
    assert_same(&got, &more, "I/O on the new queue");

    // And from a new association.
    let mut other = open(&t, DEFAULT_NQN, HOST_B, &Opts::default());
    let got = other.io[0]
        .read(NSID, 0, 8, 512)
        .or_panic("read from a new association");
    assert_same(
        &got,
        &before,
        "LBA 0 seen by a new association after a write on the deleted queue",
    );
}

/// NVMe Base 2.1, 3.6 (shutdown): CC.SHN = 01b (normal shutdown) ends with
/// CSTS.SHST = 10b (shutdown processing complete) and CSTS.RDY = 0.
#[test]
fn cc_shn_normal_shutdown_completes() {
    let t = Target::start(&["--memory", "64MiB"]);
    let c = open(&t, DEFAULT_NQN, HOST_A, &quiet_opts());
    let mut admin = c.admin();
    let cc = admin.prop_get(property::CC, false).or_panic("Get CC") as u32;
    let cc = (cc & !property::CC_SHN_MASK) | 1 << property::CC_SHN_SHIFT;
    admin
        .prop_set(property::CC, cc)
        .or_panic("Set CC.SHN = 01b");
    let csts = poll_csts(&mut admin, "after CC.SHN = 01b", |v| {
        v & SHST_MASK != 1 << property::CSTS_SHST_SHIFT
    });
    assert_eq!(
        csts & SHST_MASK,
        property::CSTS_SHST_COMPLETE,
        "CSTS.SHST after CC.SHN = 01b (CSTS {csts:#x})"
    );
    assert_eq!(
        csts & property::CSTS_RDY,
        0,
        "CSTS.RDY after the shutdown (CSTS {csts:#x})"
    );
}

// ---- 2: Disconnect ---------------------------------------------------------

/// NVMe Base 2.1, 6.4: a Disconnect that arrives while an earlier Write on
/// the queue still waits for its data (R2T sent, H2CData not yet): that
/// Write does not execute once its data comes (Command Aborted due to SQ
/// Deletion), nothing reaches the namespace, and the daemon keeps serving.
#[test]
fn disconnect_with_a_write_waiting_for_its_data() {
    let t = Target::start(&["--memory", "64MiB"]);
    let opts = quiet_opts();
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &opts);
    let zero = vec![0u8; 64 * KIB];
    let data = Rng::new(24).bytes(64 * KIB);
    let q = &mut c.io[0];
    // 64 KiB goes by R2T; its data is sent only when the client reads the
    // R2T, after the Disconnect capsule is already on the wire.
    let write = q
        .submit(Queue::rw_sqe(nvm::WRITE, NSID, 0, 128), Some(&data), 0)
        .or_panic("submit a 64 KiB Write");
    let dis = q
        .submit(disconnect_sqe(), None, 0)
        .or_panic("submit the Disconnect");
    let got = q.wait(dis).or_panic("Disconnect");
    assert_status(&got, Status::SUCCESS, "Disconnect");
    let got = q.wait(write).or_panic("the Write that waited for its data");
    assert_status(
        &got,
        Status::ABORTED_SQ_DELETION,
        "a Write whose data came after the Disconnect",
    );
    let mut other = open(&t, DEFAULT_NQN, HOST_B, &opts);
    let back = other.io[0]
        .read(NSID, 0, 128, 512)
        .or_panic("read back from another controller");
    assert_same(&back, &zero, "the namespace after the aborted Write");
}

/// NVMe Base 2.1, 6.4 (Disconnect, FCTYPE 08h): on an I/O queue it succeeds
/// and deletes the queue: a Write sent afterwards gets Command Sequence
/// Error and changes nothing; the same qid connects again on a new
/// connection while the old one stays open. On the admin queue it fails
/// with Invalid Queue Type (SCT 1, SC 85h; Figure 105). Property Get on an
/// I/O queue is an Invalid Field (Figure 541 note 3).
#[test]
fn disconnect_deletes_io_queue_not_admin() {
    let t = Target::start(&["--memory", "64MiB"]);
    let opts = quiet_opts();
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &opts);

    let got = c.io[0]
        .exec(property_get_sqe(property::CAP, true), None, 0)
        .or_panic("Property Get on an I/O queue");
    assert_status(&got, Status::INVALID_FIELD, "Property Get on an I/O queue");

    let got = c
        .admin()
        .exec(disconnect_sqe(), None, 0)
        .or_panic("Disconnect on the admin queue");
    assert_status(
        &got,
        Status::INVALID_QUEUE_TYPE,
        "Disconnect on the admin queue",
    );
    assert_eq!(
        sct_sc(got.status()),
        (1, 0x85),
        "Invalid Queue Type is SCT 1, SC 0x85"
    );
    c.admin()
        .keep_alive()
        .or_panic("admin queue after its refused Disconnect");

    let before = Rng::new(21).bytes(4096);
    c.io[0]
        .write(NSID, 0, &before, 512, false)
        .or_panic("write before the Disconnect");
    let got = c.io[0]
        .exec(disconnect_sqe(), None, 0)
        .or_panic("Disconnect on I/O queue 1");
    assert_status(&got, Status::SUCCESS, "Disconnect on I/O queue 1");

    // Nothing executes on the old queue any more: in-capsule and R2T writes.
    let small = Rng::new(22).bytes(4096);
    let got = c.io[0]
        .exec(Queue::rw_sqe(nvm::WRITE, NSID, 0, 8), Some(&small), 0)
        .or_panic("in-capsule Write after the Disconnect");
    assert_status(
        &got,
        Status::COMMAND_SEQUENCE_ERROR,
        "in-capsule Write after the Disconnect",
    );
    let big = Rng::new(23).bytes(64 * KIB);
    let got = c.io[0]
        .exec(Queue::rw_sqe(nvm::WRITE, NSID, 0, 128), Some(&big), 0)
        .or_panic("64 KiB Write after the Disconnect");
    assert_status(
        &got,
        Status::COMMAND_SEQUENCE_ERROR,
        "64 KiB Write (R2T) after the Disconnect",
    );

    // The same qid, on a new connection.
    let (mut q, done) = connect_io_queue(&t, 1, HOST_A, &opts, c.cntlid);
    assert_status(
        &done,
        Status::SUCCESS,
        "Connect of I/O queue 1 again after its Disconnect",
    );
    let got = q.read(NSID, 0, 8, 512).or_panic("read on the new queue");
    assert_same(
        &got,
        &before,
        "LBA 0 after writes sent after the Disconnect",
    );
    let got = q.read(NSID, 8, 120, 512).or_panic("read of LBAs 8..128");
    assert_zero(&got, "LBAs 8..128 after the refused 64 KiB write");

    // The old connection stays open, still without a queue.
    assert!(
        !c.io[0].is_closed_by_peer(Duration::from_millis(500)),
        "the target closed the connection after Disconnect (NVMe Base 2.1, 6.4: it stays)"
    );
    let got = c.io[0]
        .exec(Queue::rw_sqe(nvm::WRITE, NSID, 0, 8), Some(&small), 0)
        .or_panic("Write on the old connection after the reconnect");
    assert_status(
        &got,
        Status::COMMAND_SEQUENCE_ERROR,
        "Write on the old connection after the qid was connected again",
    );
    let got = q.read(NSID, 0, 8, 512).or_panic("read on the new queue");
    assert_same(&got, &before, "LBA 0 at the end");
}

// ---- 3: DNR, CRDT, Host Behavior Support -----------------------------------

/// A 4 KiB Write at `slba` whose in-capsule data digest is wrong; returns
/// the CQE (the queue must have nothing else outstanding).
fn corrupt_in_capsule_write(q: &mut Queue, slba: u64, cid: u16) -> Cqe {
    let mut sqe = Queue::rw_sqe(nvm::WRITE, NSID, slba, 8);
    sqe.set_cid(cid);
    sqe.set_sgl(&Sgl::InCapsule {
        offset: 0,
        len: 4096,
    });
    let data = Rng::new(cid as u64).bytes(4096);
    let mut pdu = encode(&Header::CapsuleCmd(sqe), 0, &data, q.digests(), 1);
    let n = pdu.len();
    pdu[n - 1] ^= 0xff; // last byte of DDGST
    q.send_raw(&pdu).or_panic("sending a corrupted capsule");
    match q.recv_pdu().or_panic("response to the corrupted capsule") {
        (Header::CapsuleResp(cqe), _) if cqe.cid == cid => cqe,
        (h, _) => panic!("expected the CapsuleResp of cid {cid}, got {h:?}"),
    }
}

/// A 64 KiB Write at `slba` through R2T whose H2CData data digest is wrong;
/// returns the CQE.
fn corrupt_h2c_write(q: &mut Queue, slba: u64, cid: u16) -> Cqe {
    let len = 64 * KIB as u32;
    let mut sqe = Queue::rw_sqe(nvm::WRITE, NSID, slba, len / 512);
    sqe.set_cid(cid);
    sqe.set_sgl(&Sgl::Transport { len });
    q.send_raw(&encode(&Header::CapsuleCmd(sqe), 0, &[], q.digests(), 1))
        .or_panic("sending a write");
    let r2t = match q.recv_pdu().or_panic("R2T") {
        (Header::R2T(t), _) => t,
        (h, _) => panic!("expected an R2T, got {h:?}"),
    };
    let data = Rng::new(cid as u64).bytes(r2t.len as usize);
    let h2c = Transfer {
        len: r2t.len,
        ..r2t
    };
    let mut pdu = encode(
        &Header::H2CData(h2c),
        flags::LAST_PDU,
        &data,
        q.digests(),
        1,
    );
    let n = pdu.len();
    pdu[n - 1] ^= 0xff;
    q.send_raw(&pdu).or_panic("sending corrupted H2CData");
    match q.recv_pdu().or_panic("response to the corrupted write") {
        (Header::CapsuleResp(cqe), _) if cqe.cid == cid => cqe,
        (h, _) => panic!("expected the CapsuleResp of cid {cid}, got {h:?}"),
    }
}

/// NVMe Base 2.1, 4.2.3 (Figure 100, DNR): a Transient Transport Error
/// (data digest error on in-capsule data or H2CData) leaves DNR clear; an
/// LBA Out of Range sets it. Neither write reaches the namespace.
#[test]
fn dnr_clear_on_transient_transport_error_set_on_lba_out_of_range() {
    let t = Target::start(&["--memory", "64MiB"]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &digest_opts());
    assert_eq!(c.io[0].digests(), BOTH_DIGESTS, "digests on the I/O queue");
    let nsze = NamespaceId::parse(
        &c.admin()
            .identify(cns::NAMESPACE, NSID)
            .or_panic("Identify Namespace"),
    )
    .nsze;
    let q = &mut c.io[0];

    for (path, cqe) in [
        ("in-capsule", corrupt_in_capsule_write(q, 64, 0x7101)),
        ("H2CData", corrupt_h2c_write(q, 256, 0x7102)),
    ] {
        let what = format!("Write with a bad {path} data digest");
        assert_cqe_status(&cqe, Status::TRANSIENT_TRANSPORT_ERROR, &what);
        assert!(
            !dnr_of(cqe.status),
            "{what}: DNR set (status field {:#06x}); a transient error may be retried",
            cqe.status
        );
        assert_eq!(
            crd_of(cqe.status),
            0,
            "{what}: CRD without Host Behavior Support ACRE"
        );
    }
    let got = q.read(NSID, 64, 8, 512).or_panic("read LBA 64");
    assert_zero(&got, "LBAs of the in-capsule write with a bad digest");
    let got = q.read(NSID, 256, 128, 512).or_panic("read LBA 256");
    assert_zero(&got, "LBAs of the H2CData write with a bad digest");

    let got = q
        .exec(Queue::rw_sqe(nvm::READ, NSID, nsze, 1), None, 512)
        .or_panic("read past the end");
    assert_status(&got, Status::LBA_OUT_OF_RANGE, "read past the end");
    assert!(
        dnr_of(got.cqe.status),
        "LBA Out of Range without DNR (status field {:#06x})",
        got.cqe.status
    );
    let got = q
        .exec(
            Queue::rw_sqe(nvm::WRITE, NSID, nsze - 1, 2),
            Some(&[7u8; 1024]),
            0,
        )
        .or_panic("write across the end");
    assert_status(&got, Status::LBA_OUT_OF_RANGE, "write across the end");
    assert!(
        dnr_of(got.cqe.status),
        "LBA Out of Range (write) without DNR (status field {:#06x})",
        got.cqe.status
    );
}

/// NVMe Base 2.1, 4.2.3 (Command Retry Delay): Identify Controller bytes
/// 128..133 hold CRDT1 to CRDT3 in 100 ms units: an I/O controller reports
/// 1, 10 and 100; a discovery controller reports zero (reserved there).
#[test]
fn identify_controller_reports_crdt() {
    let t = Target::start(&["--memory", "64MiB"]);
    let c = open(&t, DEFAULT_NQN, HOST_A, &quiet_opts());
    let id = c
        .admin()
        .identify(cns::CONTROLLER, 0)
        .or_panic("Identify Controller");
    let crdt = [get_u16(&id, 128), get_u16(&id, 130), get_u16(&id, 132)];
    assert_eq!(crdt, [1, 10, 100], "CRDT1..3 of the I/O controller");

    let d = open(&t, DISCOVERY_NQN, HOST_A, &discovery_opts());
    let id = d
        .admin()
        .identify(cns::CONTROLLER, 0)
        .or_panic("Identify Controller (discovery)");
    assert_zero(&id[128..134], "CRDT1..3 of the discovery controller");
}

/// NVMe Base 2.1, 4.2.3 and the Host Behavior Support feature (FID 16h,
/// 512 bytes, ACRE in byte 0): before the host sets ACRE a Transient
/// Transport Error has CRD 00b; after Set Features with ACRE = 1 it has
/// CRD 01b (status field bits 13:12), and Get Features returns ACRE = 1.
#[test]
fn host_behavior_acre_enables_command_retry_delay() {
    let t = Target::start(&["--memory", "64MiB"]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &digest_opts());
    let get_hbs = |c: &mut Controller| -> Vec<u8> {
        let mut sqe = Sqe::new(admin::GET_FEATURES, 0);
        sqe.set_cdw(10, feature::HOST_BEHAVIOR as u32);
        let got = c
            .admin()
            .exec(sqe, None, HBS_LEN as u32)
            .or_panic("Get Features Host Behavior Support");
        assert_status(&got, Status::SUCCESS, "Get Features Host Behavior Support");
        got.data
    };

    let cqe = corrupt_in_capsule_write(&mut c.io[0], 64, 0x7201);
    assert_cqe_status(
        &cqe,
        Status::TRANSIENT_TRANSPORT_ERROR,
        "bad digest before ACRE",
    );
    assert_eq!(
        crd_of(cqe.status),
        0,
        "CRD before ACRE (status field {:#06x})",
        cqe.status
    );
    assert_eq!(get_hbs(&mut c)[0], 0, "ACRE before Set Features");

    let mut hbs = vec![0u8; HBS_LEN];
    hbs[0] = 1;
    let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
    sqe.set_cdw(10, feature::HOST_BEHAVIOR as u32);
    let got = c
        .admin()
        .exec(sqe, Some(&hbs), 0)
        .or_panic("Set Features Host Behavior Support");
    assert_status(
        &got,
        Status::SUCCESS,
        "Set Features Host Behavior Support (ACRE = 1)",
    );
    let data = get_hbs(&mut c);
    assert_eq!(data.len(), HBS_LEN);
    assert_eq!(data[0], 1, "ACRE read back by Get Features");

    let cqe = corrupt_in_capsule_write(&mut c.io[0], 64, 0x7202);
    assert_cqe_status(
        &cqe,
        Status::TRANSIENT_TRANSPORT_ERROR,
        "bad digest after ACRE",
    );
    assert_eq!(
        crd_of(cqe.status),
        1,
        "CRD after ACRE = 1 (status field {:#06x})",
        cqe.status
    );
    assert!(!dnr_of(cqe.status), "DNR after ACRE = 1");
    let cqe = corrupt_h2c_write(&mut c.io[0], 256, 0x7203);
    assert_cqe_status(
        &cqe,
        Status::TRANSIENT_TRANSPORT_ERROR,
        "bad H2CData digest after ACRE",
    );
    assert_eq!(
        crd_of(cqe.status),
        1,
        "CRD of an H2CData digest error after ACRE = 1 (status field {:#06x})",
        cqe.status
    );
    // Non-retryable statuses never carry a CRD.
    let got = c.io[0]
        .exec(Queue::rw_sqe(nvm::READ, 99, 0, 1), None, 512)
        .or_panic("read of nsid 99");
    assert_status(&got, Status::INVALID_NAMESPACE, "read of nsid 99");
    assert!(dnr_of(got.cqe.status), "Invalid Namespace without DNR");
    assert_eq!(crd_of(got.cqe.status), 0, "CRD of Invalid Namespace");
}

// ---- 4: PSDT and FUSE ------------------------------------------------------

/// NVMe Base 2.1, Figure 91 (CDW0) and nvmet_req_init: PSDT other than 01b
/// (SGLs, CDW0 bits 15:14) and FUSE other than 00b (CDW0 bits 9:8) are
/// Invalid Field, on the admin and I/O queues; the queues carry on.
#[test]
fn psdt_and_fuse_are_checked() {
    let t = Target::start(&["--memory", "64MiB"]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &quiet_opts());
    // (byte 1 value, what)
    let bad_flags: [(u8, &str); 5] = [
        (0x00, "PSDT 00b (PRPs)"),
        (0x80, "PSDT 10b"),
        (0xc0, "PSDT 11b"),
        (0x41, "FUSE 01b (first fused)"),
        (0x42, "FUSE 10b (second fused)"),
    ];
    for (byte1, what) in bad_flags {
        // Keep Alive on the admin queue.
        let mut sqe = Sqe::new(admin::KEEP_ALIVE, 0);
        sqe.set_sgl(&Sgl::Null);
        sqe.set_flags(byte1);
        let got = c
            .admin()
            .exec_as_is(sqe, &[], 0)
            .or_panic(format_args!("Keep Alive with {what}"));
        assert_status(
            &got,
            Status::INVALID_FIELD,
            &format!("Keep Alive with {what}"),
        );

        // Read on the I/O queue.
        let mut sqe = Queue::rw_sqe(nvm::READ, NSID, 0, 8);
        sqe.set_sgl(&Sgl::Transport { len: 4096 });
        sqe.set_flags(byte1);
        let got = c.io[0]
            .exec_as_is(sqe, &[], 4096)
            .or_panic(format_args!("Read with {what}"));
        assert_status(&got, Status::INVALID_FIELD, &format!("Read with {what}"));

        // Write with in-capsule data on the I/O queue: must not be written.
        let mut sqe = Queue::rw_sqe(nvm::WRITE, NSID, 16, 8);
        sqe.set_sgl(&Sgl::InCapsule {
            offset: 0,
            len: 4096,
        });
        sqe.set_flags(byte1);
        let got = c.io[0]
            .exec_as_is(sqe, &[0x5a; 4096], 0)
            .or_panic(format_args!("Write with {what}"));
        assert_status(&got, Status::INVALID_FIELD, &format!("Write with {what}"));
    }
    // Control: the same commands as sent normally succeed.
    let mut sqe = Sqe::new(admin::KEEP_ALIVE, 0);
    sqe.set_sgl(&Sgl::Null);
    let got = c
        .admin()
        .exec_as_is(sqe, &[], 0)
        .or_panic("Keep Alive with PSDT 01b");
    assert_status(&got, Status::SUCCESS, "Keep Alive with PSDT 01b, FUSE 00b");
    let got = c.io[0].read(NSID, 16, 8, 512).or_panic("read after");
    assert_zero(&got, "LBAs of the writes with bad PSDT/FUSE");
}

// ---- 5: Number of Queues ----------------------------------------------------

/// NVMe 1.4, 5.21.1.7 (Number of Queues; Base 2.x, the Number of Queues
/// feature): Set Features Number of Queues once an I/O queue exists is a
/// Command Sequence Error.
#[test]
fn set_number_of_queues_after_io_queue_is_sequence_error() {
    let t = Target::start(&["--memory", "64MiB"]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &quiet_opts());
    for n in [0u32, 3] {
        let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
        sqe.set_cdw(10, feature::NUM_QUEUES as u32);
        sqe.set_cdw(11, n | n << 16);
        let got = c
            .admin()
            .exec(sqe, None, 0)
            .or_panic("Set Features Number of Queues");
        assert_status(
            &got,
            Status::COMMAND_SEQUENCE_ERROR,
            &format!(
                "Set Features Number of Queues ({} queues) with I/O queue 1 connected",
                n + 1
            ),
        );
    }
    c.io[0]
        .read(NSID, 0, 1, 512)
        .or_panic("I/O queue afterwards");
}

// ---- 6: Keep Alive on an I/O queue -------------------------------------------

/// NVMe Base 2.1, Figure 102 (01h, Invalid Command Opcode): Keep Alive
/// (opcode 18h) is an admin command; sent on an I/O queue it is an Invalid
/// Command Opcode, whatever its NSID.
#[test]
fn keep_alive_on_io_queue_is_invalid_opcode() {
    let t = Target::start(&["--memory", "64MiB"]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &quiet_opts());
    for nsid in [0, NSID, 2, 99, 0xffff_ffff] {
        let mut sqe = Sqe::new(admin::KEEP_ALIVE, 0);
        sqe.set_nsid(nsid);
        let got = c.io[0]
            .exec(sqe, None, 0)
            .or_panic(format_args!("Keep Alive on the I/O queue, nsid {nsid:#x}"));
        assert_status(
            &got,
            Status::INVALID_OPCODE,
            &format!("Keep Alive on the I/O queue, nsid {nsid:#x}"),
        );
    }
    c.io[0]
        .read(NSID, 0, 1, 512)
        .or_panic("I/O queue afterwards");
}

// ---- 7: Get Log Page offsets ---------------------------------------------------

/// NVMe Base 2.1, 5.1.12 (Get Log Page, Figure 199): a Log Page Offset past
/// the end of the log, or not dword aligned, is an Invalid Field; a length
/// running past the end succeeds and reads zeroes there; an offset equal to
/// the log's size succeeds with zeroes.
#[test]
fn get_log_page_offset_and_length() {
    let t = Target::start(&["--memory", "64MiB"]);
    let c = open(&t, DEFAULT_NQN, HOST_A, &quiet_opts());
    let mut admin = c.admin();
    let smart = admin.get_log(lid::SMART, 512, 0).or_panic("SMART log");
    assert_eq!(smart.len(), 512);

    let mut expect = |len: u32, offset: u64, want: Status| -> Completion {
        let what = format!("Get Log Page SMART, {len} bytes at offset {offset}");
        let got = admin
            .exec(Queue::get_log_sqe(lid::SMART, len, offset), None, len)
            .or_panic(&what);
        assert_status(&got, want, &what);
        got
    };
    expect(512, 516, Status::INVALID_FIELD);
    expect(4, 1024, Status::INVALID_FIELD);
    expect(512, 2, Status::INVALID_FIELD);
    expect(4, 510, Status::INVALID_FIELD);

    let got = expect(8192, 0, Status::SUCCESS);
    assert_same(&got.data[..512], &smart, "SMART log read with 8 KiB");
    assert_zero(
        &got.data[512..],
        "8 KiB of the 512-byte SMART log, past its end",
    );

    let got = expect(512, 512, Status::SUCCESS);
    assert_zero(&got.data, "SMART log at offset 512 (its size)");

    let got = expect(512, 256, Status::SUCCESS);
    assert_same(&got.data[..256], &smart[256..], "SMART log from offset 256");
    assert_zero(&got.data[256..], "SMART log from offset 256, past its end");
}

// ---- 8: SGL data length ------------------------------------------------------

/// NVMe Base 2.1, 4.3.2 and Figure 102 (0Fh, Data SGL Length Invalid): an
/// Identify whose SGL describes 2048 or 8192 bytes instead of 4096, and a
/// Keep Alive (no data) with a 4096-byte transport SGL.
#[test]
fn sgl_length_must_match_the_transfer() {
    let t = Target::start(&["--memory", "64MiB"]);
    let c = open(&t, DEFAULT_NQN, HOST_A, &quiet_opts());
    let mut admin = c.admin();
    for len in [2048u32, 8192] {
        let what = format!("Identify Controller with a {len}-byte SGL");
        let got = admin
            .exec(Queue::identify_sqe(cns::CONTROLLER, 0), None, len)
            .or_panic(&what);
        assert_status(&got, Status::SGL_DATA_LENGTH_INVALID, &what);
    }
    let what = "Keep Alive with a 4096-byte transport SGL";
    let got = admin
        .exec(Sqe::new(admin::KEEP_ALIVE, 0), None, 4096)
        .or_panic(what);
    assert_status(&got, Status::SGL_DATA_LENGTH_INVALID, what);
    // Control: the right lengths work.
    admin
        .identify(cns::CONTROLLER, 0)
        .or_panic("Identify with a 4096-byte SGL");
    admin.keep_alive().or_panic("Keep Alive without data");
}

// ---- 9: NQN comparison --------------------------------------------------------

/// NVMe Qualified Names are compared as exact bytes up to the NUL: a host
/// NQN that is an allowed one plus a trailing space (or a leading one, or
/// in upper case) is refused with Connect Invalid Host (NVMe Base 2.1, 6.3
/// Connect response: SCT 1, SC 84h) on a subsystem with an allow-list.
#[test]
fn host_nqn_compared_exactly() {
    let t = Target::start_config(&two_subsystems_config());
    let hostid = [9u8; 16];
    for host in [
        format!("{HOST_A} "),
        format!(" {HOST_A}"),
        HOST_A.to_uppercase(),
    ] {
        let mut q = Queue::connect(t.addr(), Digests::default()).or_panic("connect");
        let cqe = q
            .fabrics_connect(0, 31, 5000, PRIVATE_NQN, &host, hostid, 0xffff)
            .or_panic(format_args!("admin Connect as {host:?}"));
        assert_cqe_status(
            &cqe,
            Status::CONNECT_INVALID_HOST,
            &format!("admin Connect to the allow-listed subsystem as {host:?}"),
        );
    }
    // Control: the exact NQN is admitted; an I/O queue Connect naming it
    // with a trailing space is not.
    let c = open(&t, PRIVATE_NQN, HOST_A, &quiet_opts());
    let mut q = Queue::connect(t.addr(), Digests::default()).or_panic("connect");
    let cqe = q
        .fabrics_connect(
            2,
            127,
            0,
            PRIVATE_NQN,
            &format!("{HOST_A} "),
            quiet_opts().hostid,
            c.cntlid,
        )
        .or_panic("I/O Connect with a trailing space");
    assert!(
        !cqe.status().is_success(),
        "I/O queue Connect with the host NQN plus a space succeeded"
    );
}

// ---- 10: SQ flow control disable -----------------------------------------------

/// Runs `sqe` on `q`, fails unless it succeeds, returns the completion.
fn exec_ok(q: &mut Queue, sqe: Sqe, out: Option<&[u8]>, in_len: u32, what: &str) -> Completion {
    let got = q.exec(sqe, out, in_len).or_panic(what);
    assert_status(&got, Status::SUCCESS, what);
    got
}

/// Sends a Read of `nlb` blocks at LBA 0 with CID `cid` raw and collects
/// its C2HData (the flags of each PDU, the data); then sends a Flush with
/// CID `cid + 1` and collects every CapsuleResp up to the Flush's. The
/// queue must have nothing else outstanding.
fn raw_read_then_flush(q: &mut Queue, nlb: u32, cid: u16) -> (Vec<u8>, Vec<u8>, Vec<Cqe>) {
    let mut sqe = Queue::rw_sqe(nvm::READ, NSID, 0, nlb);
    sqe.set_cid(cid);
    sqe.set_sgl(&Sgl::Transport { len: nlb * 512 });
    q.send_raw(&encode(&Header::CapsuleCmd(sqe), 0, &[], q.digests(), 1))
        .or_panic("sending a raw Read");
    let mut fl = Vec::new();
    let mut data = Vec::new();
    loop {
        match q.recv_pdu_flags().or_panic("C2HData of the raw Read") {
            (Header::C2HData(t), f, d) => {
                assert_eq!(t.cccid, cid, "C2HData CCCID");
                assert_eq!(t.offset as usize, data.len(), "C2HData offset");
                data.extend_from_slice(&d);
                fl.push(f);
                if f & flags::LAST_PDU != 0 {
                    break;
                }
            }
            (h, _, _) => panic!("expected C2HData of cid {cid}, got {h:?}"),
        }
    }
    let mut flush = Sqe::new(nvm::FLUSH, cid + 1);
    flush.set_nsid(NSID);
    flush.set_sgl(&Sgl::Null);
    q.send_raw(&encode(&Header::CapsuleCmd(flush), 0, &[], q.digests(), 1))
        .or_panic("sending a raw Flush");
    let mut resps = Vec::new();
    loop {
        match q
            .recv_pdu_flags()
            .or_panic("responses after the read's last C2HData")
        {
            (Header::CapsuleResp(cqe), _, _) => {
                resps.push(cqe);
                if cqe.cid == cid + 1 || resps.len() > 2 {
                    break;
                }
            }
            (h, _, _) => panic!("expected CapsuleResps after the read's C2HData, got {h:?}"),
        }
    }
    (fl, data, resps)
}

/// NVMe Base 2.1, 6.3 (Connect, Figure 546: CATTR bit 2) and NVMe/TCP 1.0,
/// 3.3.2.1 and 3.6.2.9: a queue connected with SQ flow control disabled
/// answers with SQHD FFFFh, in the Connect response and every later one; a
/// successful read ends with a C2HData flagged LAST_PDU and SUCCESS and no
/// CapsuleResp follows; a write still gets a CapsuleResp with SQHD FFFFh.
#[test]
fn sq_flow_control_disabled_by_connect() {
    let t = Target::start(&["--memory", "64MiB"]);
    let hostid = [5u8; 16];

    // The admin queue, by hand, to see every response.
    let mut admin = Queue::connect(t.addr(), Digests::default()).or_panic("admin connection");
    let got = admin
        .fabrics_connect_full(
            0,
            31,
            60_000,
            cattr::DISABLE_SQ_FLOW,
            DEFAULT_NQN,
            HOST_A,
            hostid,
            0xffff,
        )
        .or_panic("admin Connect with CATTR bit 2");
    assert_status(&got, Status::SUCCESS, "admin Connect with CATTR bit 2");
    assert_eq!(got.cqe.sqhd, 0xffff, "SQHD of the admin Connect response");
    let cntlid = got.cqe.dw0 as u16;
    let mut sqhds = Vec::new();
    let c = exec_ok(
        &mut admin,
        property_set_sqe(property::CC, CC_ENABLE),
        None,
        0,
        "Property Set CC.EN",
    );
    sqhds.push(("Property Set", c.cqe.sqhd));
    let csts = poll_csts(&mut admin, "enable", |v| v & property::CSTS_RDY != 0);
    assert_ne!(csts & property::CSTS_RDY, 0, "CSTS.RDY");
    let c = exec_ok(
        &mut admin,
        property_get_sqe(property::CSTS, false),
        None,
        0,
        "Property Get CSTS",
    );
    sqhds.push(("Property Get", c.cqe.sqhd));
    // Identify returns data: it may complete by C2HData SUCCESS (then it
    // has no CQE to look at).
    let c = exec_ok(
        &mut admin,
        Queue::identify_sqe(cns::CONTROLLER, 0),
        None,
        4096,
        "Identify",
    );
    if !c.success_in_data {
        sqhds.push(("Identify", c.cqe.sqhd));
    }
    let mut nq = Sqe::new(admin::SET_FEATURES, 0);
    nq.set_cdw(10, feature::NUM_QUEUES as u32);
    let c = exec_ok(&mut admin, nq, None, 0, "Set Features Number of Queues");
    sqhds.push(("Set Features", c.cqe.sqhd));
    let c = exec_ok(
        &mut admin,
        Sqe::new(admin::KEEP_ALIVE, 0),
        None,
        0,
        "Keep Alive",
    );
    sqhds.push(("Keep Alive", c.cqe.sqhd));
    for (what, sqhd) in &sqhds {
        assert_eq!(*sqhd, 0xffff, "SQHD of {what} on the admin queue");
    }

    // The I/O queue.
    let opts = Opts {
        hostid,
        cattr: cattr::DISABLE_SQ_FLOW,
        ..Opts::default()
    };
    let (mut q, got) = connect_io_queue(&t, 1, HOST_A, &opts, cntlid);
    assert_status(&got, Status::SUCCESS, "I/O Connect with CATTR bit 2");
    assert_eq!(got.cqe.sqhd, 0xffff, "SQHD of the I/O Connect response");

    let mut rng = Rng::new(31);
    let small = rng.bytes(4096);
    let big = rng.bytes(256 * KIB);
    for (slba, data, what) in [
        (0u64, &small, "4 KiB in-capsule write"),
        (64, &big, "256 KiB R2T write"),
    ] {
        let nlb = (data.len() / 512) as u32;
        let c = exec_ok(
            &mut q,
            Queue::rw_sqe(nvm::WRITE, NSID, slba, nlb),
            Some(data),
            0,
            what,
        );
        assert!(
            !c.success_in_data,
            "{what}: completed without a CapsuleResp"
        );
        assert_eq!(c.cqe.sqhd, 0xffff, "SQHD of the {what}'s response");
    }
    for (slba, data, what) in [(0u64, &small, "4 KiB read"), (64, &big, "256 KiB read")] {
        let nlb = (data.len() / 512) as u32;
        let before = q.stats.c2h_pdus;
        let c = exec_ok(
            &mut q,
            Queue::rw_sqe(nvm::READ, NSID, slba, nlb),
            None,
            nlb * 512,
            what,
        );
        assert!(
            c.success_in_data,
            "{what} on a queue without SQ flow control ended with a CapsuleResp \
             (SQHD {:#x}), not a C2HData with SUCCESS",
            c.cqe.sqhd
        );
        assert_same(&c.data, data, what);
        assert!(q.stats.c2h_pdus > before, "{what}: no C2HData");
    }
    // The next command's response is its own (a stray CapsuleResp for a
    // read would make the host fail here).
    let mut flush = Sqe::new(nvm::FLUSH, 0);
    flush.set_nsid(NSID);
    let c = exec_ok(&mut q, flush, None, 0, "Flush after the reads");
    assert_eq!(c.cqe.sqhd, 0xffff, "SQHD of the Flush's response");
    let c = q
        .exec(Queue::rw_sqe(nvm::READ, NSID, u64::MAX - 1, 1), None, 512)
        .or_panic("failing read");
    assert_status(&c, Status::LBA_OUT_OF_RANGE, "read at SLBA 2^64-2");
    assert!(!c.success_in_data, "a failed read completed by SUCCESS");
    assert_eq!(c.cqe.sqhd, 0xffff, "SQHD of a failed read's response");

    // On the wire: 4 KiB (one PDU) and 256 KiB (two at 128 KiB).
    for (nlb, cid) in [(8u32, 0x7300u16), (512, 0x7310)] {
        let (fl, data, resps) = raw_read_then_flush(&mut q, nlb, cid);
        // LBAs 0..8 hold `small`, the 256 KiB from LBA 0 start with it.
        assert_eq!(data.len(), nlb as usize * 512, "raw read length");
        assert_same(&data[..4096], &small, "raw read data");
        let last = *fl.last().expect("at least one C2HData");
        assert_eq!(
            last & (flags::LAST_PDU | flags::SUCCESS),
            flags::LAST_PDU | flags::SUCCESS,
            "flags of the last C2HData of a {nlb}-block read: {last:#04x}"
        );
        for f in &fl[..fl.len() - 1] {
            assert_eq!(
                f & flags::SUCCESS,
                0,
                "SUCCESS on a C2HData that is not the last ({} PDUs)",
                fl.len()
            );
        }
        let cids: Vec<u16> = resps.iter().map(|c| c.cid).collect();
        assert_eq!(
            cids,
            vec![cid + 1],
            "after a read ({cid:#x}) completed by C2HData SUCCESS, the next PDU must be \
             the Flush's CapsuleResp ({:#x}); CapsuleResps seen: {cids:#x?}",
            cid + 1
        );
        assert_cqe_status(&resps[0], Status::SUCCESS, "raw Flush");
        assert_eq!(resps[0].sqhd, 0xffff, "SQHD of the raw Flush's response");
    }
}

/// Without CATTR bit 2 (NVMe/TCP 1.0, 3.6.2.9): reads end with a
/// CapsuleResp and no C2HData carries SUCCESS, and SQHD advances with each
/// command.
#[test]
fn sq_flow_control_enabled_by_default() {
    let t = Target::start(&["--memory", "64MiB"]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &quiet_opts());
    let q = &mut c.io[0];
    let depth = quiet_opts().sqsize as u32 + 1;
    let data = Rng::new(41).bytes(256 * KIB);
    exec_ok(
        q,
        Queue::rw_sqe(nvm::WRITE, NSID, 0, 512),
        Some(&data),
        0,
        "256 KiB write",
    );
    let mut sqhds = Vec::new();
    for i in 0..5 {
        let c = exec_ok(
            q,
            Queue::rw_sqe(nvm::READ, NSID, 0, 8),
            None,
            4096,
            &format!("read #{i}"),
        );
        assert!(!c.success_in_data, "read #{i} completed by C2HData SUCCESS");
        assert_ne!(c.cqe.sqhd, 0xffff, "SQHD FFFFh with SQ flow control on");
        sqhds.push(c.cqe.sqhd as u32);
    }
    for w in sqhds.windows(2) {
        assert_eq!(
            w[1],
            (w[0] + 1) % depth,
            "SQHD does not advance by one per command: {sqhds:?}"
        );
    }
    for (nlb, cid) in [(8u32, 0x7400u16), (512, 0x7410)] {
        let (fl, got, resps) = raw_read_then_flush(q, nlb, cid);
        assert_same(&got, &data[..nlb as usize * 512], "raw read");
        assert_eq!(
            fl.last().map(|f| f & flags::LAST_PDU),
            Some(flags::LAST_PDU),
            "last C2HData flags {fl:#04x?}"
        );
        for f in &fl {
            assert_eq!(
                f & flags::SUCCESS,
                0,
                "C2HData flags {f:#04x} with SQ flow control on"
            );
        }
        let cids: Vec<u16> = resps.iter().map(|c| c.cid).collect();
        assert_eq!(
            cids,
            vec![cid, cid + 1],
            "CapsuleResps after a read's C2HData: the read's, then the Flush's"
        );
        assert_cqe_status(&resps[0], Status::SUCCESS, "the read's CapsuleResp");
        assert_ne!(resps[0].sqhd, 0xffff, "SQHD of the read's CapsuleResp");
    }
}

/// NVMe Base 2.1, Discovery Log Page Entry TREQ (byte 3), with NVMe/TCP
/// 1.0, 3.3.2.1: every entry says SQ flow control may be disabled (TREQ =
/// 04h, secure channel not specified).
#[test]
fn discovery_log_entries_allow_disabling_sq_flow_control() {
    let t = Target::start_config(&two_subsystems_config());
    let entries = Controller::discover(t.addr(), HOST_A).or_panic("discovery");
    assert!(!entries.is_empty(), "no discovery log entries");
    for e in &entries {
        assert_eq!(e.treq, 0x04, "TREQ of the entry for {}", e.subnqn);
    }
    let nqns: Vec<_> = entries.iter().map(|e| e.subnqn.as_str()).collect();
    assert!(nqns.contains(&OPEN_NQN), "entries {nqns:?}");
}

// ---- 11: discovery keep-alive -------------------------------------------------

/// Keep Alive of a discovery controller (NVMe Base 2.1 Keep Alive; nvmet
/// gives discovery controllers a default KATO too): one connected with
/// KATO 0 is not kept forever. With `limits.discovery_keep_alive = "2s"`
/// an idle association is closed by the target within about 3 s (not
/// before 2 s), and one that sends Keep Alive stays.
#[test]
fn discovery_kato_zero_is_bounded() {
    let t = Target::start_config(&open_subsystem_config(
        "[limits]\ndiscovery_keep_alive = \"2s\"",
        OPEN_NQN,
        "backend = \"memory\"\nsize = \"16MiB\"",
    ));
    let start = Instant::now();
    let opts = discovery_opts();
    let d = open(&t, DISCOVERY_NQN, HOST_A, &opts);
    d.admin()
        .get_log(lid::DISCOVERY, 1024, 0)
        .or_panic("discovery log header");
    let closed = d.admin().is_closed_by_peer(Duration::from_secs(5));
    let elapsed = start.elapsed();
    assert!(
        closed,
        "idle discovery association with KATO 0 still open after {elapsed:?} \
         (limits.discovery_keep_alive = 2s)"
    );
    assert!(
        elapsed <= Duration::from_millis(3500),
        "closed only after {elapsed:?}, want about 2 s"
    );
    assert!(
        elapsed >= Duration::from_millis(1800),
        "closed after {elapsed:?}, before the 2 s discovery keep-alive ran out"
    );

    // A host that keeps talking keeps it.
    let d = open(&t, DISCOVERY_NQN, HOST_A, &opts);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(500));
        d.admin().keep_alive().or_panic(format_args!(
            "Keep Alive {:?} into the association",
            start.elapsed()
        ));
    }
}

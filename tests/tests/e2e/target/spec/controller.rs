//! Controller reset and shutdown (CC.EN, CC.SHN), and Disconnect.

use super::*;
use rdmablk_tests::events::submit_aer;

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
    let _machine = crate::shared();
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

/// Sets CC.SHN = 01b (normal shutdown) and polls CSTS until shutdown
/// processing is no longer occurring; returns that CSTS.
fn normal_shutdown(admin: &mut Queue) -> u32 {
    let cc = admin.prop_get(property::CC, false).or_panic("Get CC") as u32;
    let cc = (cc & !property::CC_SHN_MASK) | 1 << property::CC_SHN_SHIFT;
    admin
        .prop_set(property::CC, cc)
        .or_panic("Set CC.SHN = 01b");
    poll_csts(admin, "after CC.SHN = 01b", |v| {
        v & SHST_MASK != 1 << property::CSTS_SHST_SHIFT
    })
}

/// NVMe Base 2.1, 3.6 (shutdown): CC.SHN = 01b (normal shutdown) ends with
/// CSTS.SHST = 10b (shutdown processing complete) and CSTS.RDY = 0.
#[test]
fn cc_shn_normal_shutdown_completes() {
    let _machine = crate::shared();
    let t = Target::start(&["--memory", "64MiB"]);
    let c = open(&t, DEFAULT_NQN, HOST_A, &quiet_opts());
    let mut admin = c.admin();
    let csts = normal_shutdown(&mut admin);
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

/// NVMe Base 2.1, 5.2: an AER outstanding when the controller is reset is
/// aborted with no completion queue entry; at a shutdown it stays
/// unanswered too, as nvmet leaves it. This is how SPDK's initiator ends:
/// it cancels its AER on its own side, sets CC.SHN = 01b and polls CSTS
/// until SHST says complete; a completion for the AER it cancelled fails
/// its controller ("no tcp_req is found with cid", then "Failed to read the
/// CSTS register"). The Linux host shuts down the same way before it
/// deletes its queues.
#[test]
fn an_aer_outstanding_at_a_shutdown_gets_no_completion() {
    let _machine = crate::shared();
    let t = Target::start(&["--memory", "64MiB"]);
    let c = open(&t, DEFAULT_NQN, HOST_A, &quiet_opts());
    let aer = submit_aer(&c);
    let mut admin = c.admin();
    let csts = normal_shutdown(&mut admin);
    assert_eq!(csts & SHST_MASK, property::CSTS_SHST_COMPLETE);
    // More round trips: a completion sent for the AER would come first.
    for _ in 0..3 {
        admin
            .prop_get(property::CSTS, false)
            .or_panic("CSTS after the shutdown");
    }
    assert!(
        !admin.has_completed(aer),
        "the AER outstanding at the shutdown was completed"
    );
    drop(admin);
    drop(c);
    let mut other = open(&t, DEFAULT_NQN, HOST_B, &quiet_opts());
    other.io[0]
        .read(NSID, 0, 8, 512)
        .or_panic("the target serves on after the shutdown");
}

// ---- 2: Disconnect ---------------------------------------------------------

/// NVMe Base 2.1, 6.4: a Disconnect that arrives while an earlier Write on
/// the queue still waits for its data (R2T sent, H2CData not yet): that
/// Write does not execute once its data comes (Command Aborted due to SQ
/// Deletion), nothing reaches the namespace, and the daemon keeps serving.
#[test]
fn disconnect_with_a_write_waiting_for_its_data() {
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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

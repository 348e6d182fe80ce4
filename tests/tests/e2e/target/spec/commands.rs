//! Rules of single commands: PSDT and FUSE, Number of Queues, Keep Alive
//! on I/O and discovery queues, Get Log Page offsets, SGL data length, NQN
//! comparison.

use super::*;

// ---- 4: PSDT and FUSE ------------------------------------------------------

/// NVMe Base 2.1, Figure 91 (CDW0) and nvmet_req_init: PSDT other than 01b
/// (SGLs, CDW0 bits 15:14) is Invalid Field on the admin and I/O queues,
/// FUSE other than 00b (CDW0 bits 9:8) on the admin queue; the queues carry
/// on. (Fused commands on I/O queues: `compare_write`.)
#[test]
fn psdt_and_fuse_are_checked() {
    let _machine = crate::shared();
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
        if byte1 & 3 != 0 {
            continue;
        }

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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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

// ---- 11: discovery keep-alive -------------------------------------------------

/// Keep Alive of a discovery controller (NVMe Base 2.1 Keep Alive; nvmet
/// gives discovery controllers a default KATO too): one connected with
/// KATO 0 is not kept forever. With `limits.discovery_keep_alive = "2s"`
/// an idle association is closed by the target within about 3 s (not
/// before 2 s), and one that sends Keep Alive stays.
#[test]
fn discovery_kato_zero_is_bounded() {
    let _machine = crate::shared();
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

//! SQ flow control: disabled by Connect, enabled by default, and offered
//! by discovery log entries.

use super::*;

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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
    let t = Target::start_config(&two_subsystems_config());
    let entries = Controller::discover(t.addr(), HOST_A).or_panic("discovery");
    assert!(!entries.is_empty(), "no discovery log entries");
    for e in &entries {
        assert_eq!(e.treq, 0x04, "TREQ of the entry for {}", e.subnqn);
    }
    let nqns: Vec<_> = entries.iter().map(|e| e.subnqn.as_str()).collect();
    assert!(nqns.contains(&OPEN_NQN), "entries {nqns:?}");
}

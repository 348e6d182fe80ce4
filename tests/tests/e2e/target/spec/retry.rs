//! DNR, CRDT and Host Behavior Support: what a host may retry, and when.

use super::*;

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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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

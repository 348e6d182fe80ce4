//! Bad input: malformed PDUs and capsules keep other hosts working, an
//! expired keep-alive disconnects.

use super::*;

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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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

//! Identify and properties, the discovery log, and a graceful shutdown
//! that drains I/O.

use super::*;

#[test]
fn identify_and_properties() {
    let _machine = crate::shared();
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

/// The log also lists the discovery subsystem itself on each listener
/// (SUBTYPE 3h, NVMe over Fabrics 1.1a Figure 38 and TP 8013) with
/// DUPRETINFO, which tells hosts (nvme connect-all) not to connect to it
/// again, and EPCSD.
#[test]
fn discovery_log_lists_allowed_subsystems() {
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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

/// Storage that never answers does not hold a stopping daemon past
/// systemd's stop timeout (30 s in the unit): its pollers give up on the
/// queues whose operations never ended 15 s after SIGTERM, and the daemon
/// exits with an error saying so, leaving those operations in flight.
#[test]
fn shutdown_gives_up_on_storage_that_never_answers() {
    let _machine = crate::shared();
    let dir = TempDir::new("hung-storage");
    let path = file_of(&dir, 16 * MIB as u64);
    let stallable = rdmablk_tests::stall::StallablePath::new(std::path::Path::new(&path));
    let (file, stats) = (
        stallable.file().display().to_string(),
        dir.join("stats.json"),
    );
    let mut t = Target::start(&["--file", &file, "--stats", &stats.display().to_string()]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
    let q = &mut c.io[0];
    stallable.stall();
    for slba in [0, 64] {
        let sqe = Queue::rw_sqe(nvm::READ, NSID, slba, 8);
        q.submit(sqe, None, 4096).or_panic("submitting a read");
    }
    // Both wait in the storage, each holding its arena buffer.
    let buffers = || -> Option<u64> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).ok()?).ok()?;
        v["arena_buffers_in_use"]
            .as_array()?
            .iter()
            .map(|b| b.as_u64())
            .sum()
    };
    rdmablk_tests::check::wait_until(
        Duration::from_secs(10),
        "two reads holding their buffers in the stalled storage",
        || buffers().is_some_and(|b| b >= 2),
    );
    let stopped = Instant::now();
    t.terminate();
    let status = t.wait(Duration::from_secs(25));
    let took = stopped.elapsed();
    assert!(
        took >= Duration::from_secs(14),
        "exited {took:?} after SIGTERM, before giving the storage 15 s\n{}",
        t.log_tail()
    );
    assert_eq!(status.code(), Some(1), "exit status\n{}", t.log_tail());
    t.wait_log("storage operations never ended");
    stallable.resume();
}

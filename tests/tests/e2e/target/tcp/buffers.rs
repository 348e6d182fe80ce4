//! The buffer arena: writes larger than it, in-capsule writes behind a full
//! budget, H2CData headers in pieces, and the stats file.

use super::*;

/// More large writes in flight than the arena holds: commands wait for
/// buffers while the byte stream keeps flowing, every write completes, and
/// each R2T asks for at most MAXH2CDATA (hosts older than Linux 5.18 send an
/// R2T's data in one PDU).
#[test]
fn writes_larger_than_the_arena_complete() {
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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

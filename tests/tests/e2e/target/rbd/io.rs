//! I/O on an image: bench, fio through the NBD export, bytes in the
//! cluster, two gateways on one image.

use super::*;

/// `rdmablk bench --verify` at 4 KiB and 1 MiB on an image.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn bench_verifies_at_4k_and_1m() {
    let _machine = crate::alone();
    let img = Image::create("bench", IMAGE_BYTES);
    let t = target(&img.name, "", "20s");
    wait_active(&t);
    // librados' and librbd's threads wait for a poller to yield
    // (SCHED_BATCH); the pollers and the daemon's own threads do not.
    let threads = policies(t.pid());
    let of = |name: &str| -> Vec<u32> {
        let named = threads.iter().filter(|(n, _)| n.starts_with(name));
        named.map(|&(_, p)| p).collect()
    };
    for name in ["msgr-worker", "io_context_pool", "tp_librbd"] {
        assert!(!of(name).is_empty(), "no {name} thread among {threads:?}");
        assert!(
            of(name).iter().all(|&p| p == SCHED_BATCH),
            "{name} not under SCHED_BATCH: {threads:?}"
        );
    }
    for name in ["poller-", "rbd-life"] {
        assert!(
            of(name).iter().all(|&p| p == SCHED_OTHER),
            "{name} not under SCHED_OTHER: {threads:?}"
        );
    }
    for (bs, qd, bytes) in [("4k", "32", 4096.0), ("1m", "4", MIB as f64)] {
        let r = bench(
            t.port(),
            NQN,
            &[
                "--rw",
                "randrw",
                "--bs",
                bs,
                "--qd",
                qd,
                "--runtime",
                "3",
                "--verify",
                "--json",
            ],
        );
        check_bench(&r, bytes, &["read", "write"], &format!("bench {bs} on RBD"));
    }
    stop(t);
}

/// sched(7)'s policy numbers, as /proc/PID/task/TID/stat's 41st field.
const SCHED_OTHER: u32 = 0;
const SCHED_BATCH: u32 = 3;

/// Each thread of process `pid`: its name and scheduling policy.
fn policies(pid: u32) -> Vec<(String, u32)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the target's threads");
    let mut out = Vec::new();
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // it ended
        };
        // "TID (COMM) STATE ...": fields after the name, which may hold spaces.
        let (head, rest) = stat.rsplit_once(") ").expect("a stat line");
        let name = head.split_once(" (").expect("a stat line").1.to_string();
        let policy = rest.split(' ').nth(38).expect("a policy field");
        out.push((name, policy.parse().expect("a number")));
    }
    out
}

/// fio's nbd engine through our NBD export of an RBD namespace, verified.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn fio_through_the_nbd_export_verifies() {
    let _machine = crate::alone();
    let img = Image::create("fio", IMAGE_BYTES);
    let t = target(&img.name, "", "20s");
    wait_active(&t);
    let e = NbdExport::start(t.port(), NQN, &[]);
    let size = 32 * MIB;
    fio_ok(
        e.uri(),
        &[
            "--name=rbd-randwrite",
            "--rw=randwrite",
            "--bs=64k",
            "--iodepth=16",
            &format!("--size={size}"),
            "--verify=crc32c",
            "--do_verify=1",
        ],
        size,
        "fio through the NBD export of an RBD namespace",
    );
    drop(e);
    stop(t);
}

/// Bytes written over NVMe/TCP (plain, FUA, and zeroed) are in the
/// cluster: `rbd export` reads them back.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn written_over_tcp_lands_in_ceph() {
    let _machine = crate::alone();
    let img = Image::create("land", 64 * MIB);
    let t = target(&img.name, "", "20s");
    wait_active(&t);
    let mut c = controller(&t, HOST_A);
    let mut rng = Rng::new(7);
    let writes: Vec<(u64, Vec<u8>, bool)> = (0..8)
        .map(|i| {
            let slba = rng.below(64 * MIB / 512 - 2048);
            (slba, rng.bytes(256 << 10), i % 2 == 1)
        })
        .collect();
    for (slba, data, fua) in &writes {
        io(&mut c)
            .write(1, *slba, data, 512, *fua)
            .or_panic("write");
    }
    // A zeroed range inside the first write and a deallocated one inside
    // the second: both must read back as zeroes from the cluster.
    let (z0, d0) = (writes[0].0 + 8, writes[1].0 + 16);
    io(&mut c)
        .write_zeroes(1, z0, 16, false)
        .or_panic("Write Zeroes");
    io(&mut c).deallocate(1, &[(d0, 32)]).or_panic("Deallocate");
    io(&mut c).flush(1).or_panic("Flush");

    let dir = TempDir::new("rbd-export");
    let out = dir.join("image");
    rbd(&["export", &img.spec(), out.to_str().expect("path")]).assert_success("rbd export");
    let exported = std::fs::read(&out).or_panic("reading the export");
    assert_eq!(exported.len() as u64, 64 * MIB, "exported image size");
    let mut expect = vec![None::<u8>; exported.len()];
    for (slba, data, _) in &writes {
        let at = (*slba * 512) as usize;
        for (k, b) in data.iter().enumerate() {
            expect[at + k] = Some(*b);
        }
    }
    for (slba, blocks) in [(z0, 16usize), (d0, 32)] {
        let at = (slba * 512) as usize;
        expect[at..at + blocks * 512].fill(Some(0));
    }
    for (slba, data, _) in &writes {
        let at = (*slba * 512) as usize;
        let want: Vec<u8> = expect[at..at + data.len()]
            .iter()
            .map(|b| b.expect("written"))
            .collect();
        assert_same(&exported[at..at + data.len()], &want, "rbd export");
        let back = io(&mut c)
            .read(1, *slba, data.len() as u32 / 512, 512)
            .or_panic("read");
        assert_same(&back, &want, "read over NVMe/TCP");
    }
    drop(c);
    stop(t);
}

/// Two targets export one image under one NQN and NSID, with disjoint
/// controller id ranges (cntlid_min/max, as the Linux host refuses a
/// controller id seen twice in a subsystem): what one writes the other
/// reads, both ways, and both report the same namespace identifiers.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn two_gateways_on_one_image_agree() {
    let _machine = crate::alone();
    let img = Image::create("pair", 64 * MIB);
    let a = target(&img.name, "cntlid_min = 1\ncntlid_max = 99", "20s");
    let b = target(&img.name, "cntlid_min = 100\ncntlid_max = 199", "20s");
    wait_active(&a);
    wait_active(&b);
    let mut ca = controller(&a, HOST_A);
    let mut cb = controller(&b, HOST_B);
    assert!(
        (1..=99).contains(&ca.cntlid),
        "gateway A cntlid {}",
        ca.cntlid
    );
    assert!(
        (100..=199).contains(&cb.cntlid),
        "gateway B cntlid {}",
        cb.cntlid
    );
    assert_eq!(
        ca.id.serial, cb.id.serial,
        "one subsystem, one serial number"
    );
    let (na, nb) = (identify_ns(&ca), identify_ns(&cb));
    assert_eq!(na.nguid, nb.nguid, "NGUID of the image on both gateways");
    assert_ne!(na.nguid, [0; 16], "an NGUID is reported");
    assert_eq!(na.nmic & 1, 1, "NMIC: may be shared");
    assert_eq!(ca.id.cmic & 2, 2, "CMIC: more than one controller");

    let mut rng = Rng::new(11);
    for round in 0..4 {
        let (w, r) = if round % 2 == 0 {
            (&mut ca, &mut cb)
        } else {
            (&mut cb, &mut ca)
        };
        let slba = rng.below(64 * MIB / 512 - 256);
        let data = rng.bytes(128 << 10);
        io(w).write(1, slba, &data, 512, false).or_panic("write");
        let back = io(r)
            .read(1, slba, 256, 512)
            .or_panic("read on the other gateway");
        assert_same(
            &back,
            &data,
            &format!("round {round}: the other gateway's read"),
        );
    }
    drop((ca, cb));
    stop(a);
    stop(b);
}

//! Data: write/read patterns on memory, file and block device namespaces,
//! busy-poll pollers, multi-megabyte transfers, digests, persistence.

use super::*;

#[test]
fn write_read_patterns_memory() {
    let _machine = crate::shared();
    let t = Target::start(&["--memory", "64MiB"]);
    exercise_namespace(&t, DEFAULT_NQN, 512, 64 * MIB as u64, 2);
}

#[test]
fn write_read_patterns_file() {
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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
    let _machine = crate::shared();
    let t = Target::start(&["--memory", "64MiB"]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
    multi_megabyte(&mut c.io[0], &mut Rng::new(5));
}

#[test]
fn digests_on() {
    let _machine = crate::shared();
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
    let _machine = crate::shared();
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

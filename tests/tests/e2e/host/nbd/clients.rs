//! Clients we did not write on the export: nbdinfo, qemu-io, nbdcopy,
//! fio's nbd engine, and nbdfuse + losetup + mkfs.ext4 + mount.

use super::*;

// ---------------------------------------------------------------- nbdinfo

fn nbdinfo_json(args: &[&str]) -> Value {
    let r = run("nbdinfo", &mut cmd("nbdinfo", args), TOOL_TIMEOUT);
    r.assert_success("nbdinfo");
    serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("nbdinfo printed no JSON ({e})\n{}", r.report()))
}

/// The only export `nbdinfo --json` describes.
fn only_export(v: &Value, what: &str) -> Value {
    let exports = v["exports"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no `exports` array in {v:#}"));
    assert_eq!(exports.len(), 1, "{what}: exports in {v:#}");
    exports[0].clone()
}

/// What the contract says an export of `size` bytes on a namespace of
/// `lba`-byte blocks looks like to a client.
fn check_export(e: &Value, size: u64, lba: u64, what: &str) {
    let num = |k: &str| {
        e[k].as_u64()
            .unwrap_or_else(|| panic!("{what}: `{k}` missing or not a number in {e:#}"))
    };
    let flag = |k: &str| {
        e[k].as_bool()
            .unwrap_or_else(|| panic!("{what}: `{k}` missing or not a boolean in {e:#}"))
    };
    assert_eq!(num("export-size"), size, "{what}: export-size");
    assert_eq!(num("block_size_minimum"), 512, "{what}: block_size_minimum");
    assert_eq!(
        num("block_size_preferred"),
        lba,
        "{what}: block_size_preferred (the namespace's LBA size)"
    );
    assert_eq!(
        num("block_size_maximum"),
        MAX_BLOCK,
        "{what}: block_size_maximum"
    );
    for f in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
    ] {
        assert!(flag(f), "{what}: {f} is false in {e:#}");
    }
    assert!(!flag("is_read_only"), "{what}: is_read_only in {e:#}");
}

#[test]
fn nbdinfo_sees_export() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &[]);
    let sock = e.socket().display().to_string();
    assert_eq!(
        e.uri(),
        format!("nbd+unix:///?socket={sock}"),
        "the ready: line's URI"
    );
    let meta = fs::metadata(e.socket()).unwrap_or_else(|e| panic!("the socket after ready: {e}"));
    assert!(meta.file_type().is_socket(), "{sock} is not a socket");

    let size = 64 * MIB as u64;
    let v = nbdinfo_json(&["--json", e.uri()]);
    check_export(&only_export(&v, "export \"\""), size, 512, "export \"\"");

    // The NQN as the export name: percent-encoded, and as written in the
    // contract (a raw colon in the path).
    for uri in [
        e.uri_for_export(DEFAULT_NQN),
        format!("nbd+unix:///{DEFAULT_NQN}?socket={sock}"),
    ] {
        let ex = only_export(&nbdinfo_json(&["--json", &uri]), &uri);
        check_export(&ex, size, 512, &uri);
        assert_eq!(ex["export-name"], DEFAULT_NQN, "{uri}: export-name");
    }

    // The listing names the NQN.
    let listed = nbdinfo_json(&["--json", "--list", e.uri()]);
    let names: Vec<&str> = listed["exports"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["export-name"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        names.contains(&DEFAULT_NQN),
        "nbdinfo --list: exports {names:?} do not include {DEFAULT_NQN}\n{listed:#}"
    );

    // Any other name is refused.
    let bogus = e.uri_for_export("no-such-export");
    let r = run("nbdinfo", &mut cmd("nbdinfo", &[&bogus]), TOOL_TIMEOUT);
    assert!(
        !r.status.success(),
        "the export answered to the name \"no-such-export\"\n{}",
        r.report()
    );

    // A 4096-byte-LBA namespace, exported on TCP this time.
    let t4 = Target::start(&["--memory", "32MiB", "--block-size", "4096"]);
    let port = free_port();
    let listen = format!("tcp:127.0.0.1:{port}");
    let e4 = NbdExport::try_start(t4.port(), DEFAULT_NQN, Some(&listen), &[])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        e4.uri(),
        format!("nbd://127.0.0.1:{port}/"),
        "the ready: line's URI for --nbd {listen}"
    );
    let v4 = nbdinfo_json(&["--json", e4.uri()]);
    check_export(
        &only_export(&v4, "4096-byte LBAs"),
        32 * MIB as u64,
        4096,
        "4096-byte LBAs over tcp",
    );
}

// ---------------------------------------------------------------- qemu-io

/// The checks of [`qemu_io_ok`] catch a mismatch: a read expecting the
/// wrong pattern must fail.
fn qemu_io_detects_mismatch(uri: &str, wrong_read: &str) {
    let r = qemu_io(uri, &[wrong_read]);
    assert!(
        r.stdout.contains("Pattern verification failed") && !r.status.success(),
        "`{wrong_read}` should have failed pattern verification\n{}",
        r.report()
    );
}

#[test]
fn qemu_io_odd_offsets() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &[]);
    // 64 MiB = 67108864: the last 7 bytes start at 67108857.
    let cmds = [
        "write -P 0xab 1000 5000",
        "read -P 0xab 1000 5000",
        "read -P 0 0 1000",
        "read -P 0 6000 2192",
        "write -P 0x11 0 3",
        "read -P 0x11 0 3",
        "read -P 0 3 997",
        "read -P 0xab 1000 5000",
        // Across the 4 KiB boundary.
        "write -P 0x22 4095 2",
        "read -P 0x22 4095 2",
        "read -P 0xab 1000 3095",
        "read -P 0xab 4097 1903",
        // FUA.
        "write -f -P 0x33 9000 700",
        "read -P 0x33 9000 700",
        "read -P 0 8192 808",
        "read -P 0 9700 540",
        // The last bytes of the export.
        "write -P 0x44 67108857 7",
        "read -P 0x44 67108857 7",
        "read -P 0 67108352 505",
        // Larger than the 2 MiB maximum block size: the client splits it.
        "write -P 0x55 1048576 3145728",
        "read -P 0x55 1048576 3145728",
        // Zeroes and discards over written data.
        "write -z 1500 3000",
        "read -P 0 1500 3000",
        "read -P 0xab 1000 500",
        "read -P 0xab 4500 1500",
        "write -P 0x66 131072 262144",
        "discard 131072 262144",
        "read -P 0 131072 262144",
        "flush",
        "read -P 0x55 1048576 3145728",
    ];
    qemu_io_ok(e.uri(), &cmds, "512-byte LBAs");
    // A second session sees the same data (nothing lived only in a cache).
    qemu_io_ok(
        e.uri(),
        &[
            "read -P 0x11 0 3",
            "read -P 0xab 1000 500",
            "read -P 0x33 9000 700",
            "read -P 0x44 67108857 7",
        ],
        "512-byte LBAs, second session",
    );
    qemu_io_detects_mismatch(e.uri(), "read -P 0xff 1000 500");
}

#[test]
fn qemu_io_odd_offsets_4k_lba() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB", "--block-size", "4096"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &[]);
    // Every write below is not aligned to the 4096-byte LBAs, so the export
    // serves it by read-modify-write; the reads around it check the
    // neighbouring bytes of the same blocks survived.
    let cmds = [
        "write -P 0xcd 0 65536",
        // Across a 4 KiB boundary: two partial blocks.
        "write -P 0x11 4090 12",
        "read -P 0x11 4090 12",
        "read -P 0xcd 0 4090",
        "read -P 0xcd 4102 12282",
        // A partial head block, a whole block, a partial tail block.
        "write -P 0xab 1000 5000",
        "read -P 0xab 1000 5000",
        "read -P 0xcd 0 1000",
        "read -P 0xcd 6000 2192",
        // 512 bytes inside one block (the advertised minimum block size).
        "write -P 0x22 12800 512",
        "read -P 0x22 12800 512",
        "read -P 0xcd 12288 512",
        "read -P 0xcd 13312 3072",
        // FUA, inside one block.
        "write -f -P 0x33 20000 100",
        "read -P 0x33 20000 100",
        "read -P 0xcd 16384 3616",
        "read -P 0xcd 20100 4476",
        // The last bytes of the export.
        "write -P 0x44 67108857 7",
        "read -P 0x44 67108857 7",
        "read -P 0 67104768 4089",
        // Discard whole blocks.
        "discard 32768 16384",
        "read -P 0 32768 16384",
        "read -P 0xcd 24576 8192",
        // Zeroes that are not block-aligned.
        "write -z 50000 5000",
        "read -P 0 50000 5000",
        "read -P 0xcd 49152 848",
        "read -P 0xcd 55000 536",
        "write -z 57344 512",
        "read -P 0 57344 512",
        "read -P 0xcd 57856 3584",
        "flush",
    ];
    qemu_io_ok(e.uri(), &cmds, "4096-byte LBAs");
    qemu_io_detects_mismatch(e.uri(), "read -P 0xcd 4090 12");
}

// ---------------------------------------------------------------- nbdcopy

#[test]
fn nbdcopy_round_trip() {
    let _machine = crate::alone();
    let dir = TempDir::new("nbdcopy");
    let size = 64 * MIB;
    let img = dir.sparse_file("ns.img", size as u64);
    let mut t = Target::start(&["--file", path_str(&img)]);
    let mut e = NbdExport::start(t.port(), DEFAULT_NQN, &["-i", "2"]);
    let uri = e.uri().to_string();
    let mut rng = Rng::new(0x6e62_6463);

    // Random data in and out.
    let first = rng.bytes(size);
    let a = dir.join("a.bin");
    write_file(&a, &first);
    nbdcopy(&[path_str(&a), &uri], "copying 64 MiB in");
    let out = dir.join("out.bin");
    nbdcopy(&[&uri, path_str(&out)], "copying 64 MiB out");
    assert_same(&read_file(&out), &first, "64 MiB copied in and out");

    // Over it, data with zero runs: nbdcopy sends those as zero requests,
    // which must really zero what was there.
    let mut second = rng.bytes(size);
    second[8 * MIB..12 * MIB].fill(0);
    second[40 * MIB + 4096..40 * MIB + 4096 + 65536].fill(0);
    second[size - MIB..].fill(0);
    let b = dir.join("b.bin");
    write_file(&b, &second);
    nbdcopy(
        &["--flush", path_str(&b), &uri],
        "copying data with zero runs in",
    );
    nbdcopy(&[&uri, path_str(&out)], "copying it out");
    assert_same(
        &read_file(&out),
        &second,
        "data with zero runs, copied in and out",
    );

    // Many connections at once (the export advertises CAN_MULTI_CONN):
    // -C 8 and -C 16 connections, each with as many requests in flight,
    // spread over the export's two engines, round trip byte for byte.
    for (conns, data) in [("8", &first), ("16", &second)] {
        let what = format!("{conns} connections");
        let src = dir.join("many.bin");
        write_file(&src, data);
        let opts = ["-C", conns, "-T", conns, "--request-size=262144"];
        let copy_in: Vec<&str> = opts.iter().copied().chain([path_str(&src), &uri]).collect();
        nbdcopy(&copy_in, &format!("{what}: copying in"));
        let copy_out: Vec<&str> = opts.iter().copied().chain([&uri, path_str(&out)]).collect();
        nbdcopy(&copy_out, &format!("{what}: copying out"));
        assert_same(&read_file(&out), data, &what);
    }

    // And it reached the backing file.
    e.proc().signal(libc::SIGTERM);
    let status = e.proc().wait(EXIT_WITHIN);
    assert!(status.success(), "rdmablk connect after SIGTERM: {status}");
    let status = t.stop();
    assert!(status.success(), "rdmablk-target after SIGTERM: {status}");
    assert_same(&read_file(&img), &second, "the backing file");
}

// ---------------------------------------------------------------- fio

#[test]
fn fio_nbd_verify() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &[]);
    let size = 32 * MIB as u64;
    fio_ok(
        e.uri(),
        &[
            "--name=randwrite-4k",
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--size=32M",
            "--verify=crc32c",
            "--do_verify=1",
        ],
        size,
        "random 4 KiB writes at QD 16, verified",
    );
    // Eight jobs, each its own connection and its own 4 MiB region.
    fio_ok(
        e.uri(),
        &[
            "--name=eight-connections",
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=8",
            "--numjobs=8",
            "--size=4M",
            "--offset_increment=4M",
            "--group_reporting",
            "--verify=crc32c",
            "--do_verify=1",
        ],
        size,
        "8 jobs on 8 connections, random 4 KiB writes at QD 8, verified",
    );
    fio_ok(
        e.uri(),
        &[
            "--name=seqwrite-mixed",
            "--rw=write",
            "--bsrange=4k-256k",
            "--iodepth=16",
            "--size=32M",
            "--verify=crc32c",
            "--do_verify=1",
        ],
        size,
        "sequential 4-256 KiB writes at QD 16, verified",
    );
}

/// 512-byte writes on a 4096-byte-LBA namespace: each is a read-modify-write
/// of a block its neighbours share. One at a time, then 16 in flight, as any
/// NBD client may send them (the export advertises a 512-byte minimum). Each
/// job writes blocks nothing wrote before, so a lost write cannot hide behind
/// an identical older one.
#[test]
fn fio_nbd_verify_sub_block_writes_4k_lba() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB", "--block-size", "4096"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &[]);
    let job = |depth: &str, offset: &str| -> Vec<String> {
        vec![
            format!("--name=seqwrite-512-qd{depth}"),
            "--rw=write".into(),
            "--bs=512".into(),
            format!("--iodepth={depth}"),
            format!("--offset={offset}"),
            "--size=4M".into(),
            "--verify=crc32c".into(),
            "--do_verify=1".into(),
        ]
    };
    let run_job = |args: Vec<String>, what: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fio_ok(e.uri(), &args, 4 * MIB as u64, what);
    };
    run_job(
        job("1", "0"),
        "sequential 512-byte writes at QD 1 on 4096-byte LBAs",
    );
    run_job(
        job("16", "16M"),
        "sequential 512-byte writes at QD 16 on 4096-byte LBAs (writes in flight \
         together share blocks)",
    );
}

// ---------------------------------------------------------------- nbdfuse + ext4

/// Whether `path` is a mount point (per /proc/self/mountinfo).
fn is_mountpoint(path: &Path) -> bool {
    let Ok(canon) = fs::canonicalize(path) else {
        return false;
    };
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = canon.to_string_lossy().replace(' ', "\\040");
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// Undoes what the nbdfuse test set up, newest first, even when it fails
/// half-way: the ext4 mount, the loop device, the FUSE mount.
#[derive(Default)]
struct Mounts {
    ext4: Option<PathBuf>,
    loop_dev: Option<String>,
    fuse: Option<PathBuf>,
}

fn unmount(path: &Path) {
    if !is_mountpoint(path) {
        return;
    }
    let p = path_str(path);
    let r = run("umount", &mut cmd("umount", &[p]), TOOL_TIMEOUT);
    if !r.status.success() {
        eprintln!("cleanup: {}\nfalling back to a lazy unmount", r.report());
        let _ = run("umount", &mut cmd("umount", &["-l", p]), TOOL_TIMEOUT);
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        if let Some(m) = self.ext4.take() {
            unmount(&m);
        }
        if let Some(dev) = self.loop_dev.take() {
            let r = run("losetup", &mut cmd("losetup", &["-d", &dev]), TOOL_TIMEOUT);
            if !r.status.success() {
                eprintln!("cleanup: {}", r.report());
            }
        }
        if let Some(m) = self.fuse.take() {
            unmount(&m);
        }
    }
}

/// FUSE and loop devices are needed: without them the test fails (it does
/// not skip) and says what is missing.
fn require_fuse_and_loop() {
    if let Err(e) = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        panic!(
            "/dev/fuse cannot be opened ({e}): this test needs FUSE (modprobe fuse) \
             and root"
        );
    }
    let r = run("losetup", &mut cmd("losetup", &["-f"]), TOOL_TIMEOUT);
    assert!(
        r.status.success() && r.stdout.trim().starts_with("/dev/loop"),
        "no free loop device: this test needs loop devices (modprobe loop) and root\n{}",
        r.report()
    );
}

#[test]
fn nbdfuse_ext4() {
    let _machine = crate::alone();
    require_fuse_and_loop();
    let dir = TempDir::new("ext4");
    let size = 128 * MIB as u64;
    let t = Target::start(&["--memory", "128MiB"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &[]);
    let fuse_dir = dir.join("fuse");
    let mnt = dir.join("mnt");
    fs::create_dir_all(&fuse_dir).expect("creating the FUSE mount point");
    fs::create_dir_all(&mnt).expect("creating the ext4 mount point");

    let mut nbdfuse = Proc::spawn(
        "nbdfuse",
        &mut cmd("nbdfuse", &[path_str(&fuse_dir), e.uri()]),
    );
    // Dropped before `nbdfuse` (declared after it): unmounts everything first.
    let mut mounts = Mounts::default();
    mounts.fuse = Some(fuse_dir.clone());
    let disk = fuse_dir.join("nbd");
    let appeared = poll_until(START_TIMEOUT, || {
        fs::metadata(&disk).is_ok_and(|m| m.len() == size) || !nbdfuse.is_running()
    });
    assert!(
        appeared && nbdfuse.is_running(),
        "{} did not appear with {size} bytes within {START_TIMEOUT:?}\n{}",
        disk.display(),
        nbdfuse.report()
    );

    let r = run(
        "losetup",
        &mut cmd("losetup", &["-f", "--show", path_str(&disk)]),
        TOOL_TIMEOUT,
    );
    r.assert_success("attaching a loop device to the FUSE file");
    let dev = r.stdout.trim().to_string();
    assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
    mounts.loop_dev = Some(dev.clone());

    run(
        "mkfs.ext4",
        &mut cmd("mkfs.ext4", &["-q", &dev]),
        TOOL_TIMEOUT,
    )
    .assert_success("mkfs.ext4 on the loop device");
    let mount = |what: &str| {
        run(
            "mount",
            &mut cmd("mount", &[&dev, path_str(&mnt)]),
            TOOL_TIMEOUT,
        )
        .assert_success(what);
    };
    mount("mounting the new file system");
    mounts.ext4 = Some(mnt.clone());

    let mut rng = Rng::new(0x6578_7434);
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("a.bin", rng.bytes(5 * MIB + 123)),
        ("dir/b.bin", rng.bytes(3 * MIB)),
        ("dir/sub/c.bin", rng.bytes(777)),
        ("d.bin", rng.bytes(2 * MIB + 4095)),
    ];
    fs::create_dir_all(mnt.join("dir/sub")).expect("creating directories on ext4");
    for (name, data) in &files {
        let mut f = fs::File::create(mnt.join(name))
            .unwrap_or_else(|e| panic!("creating {name} on ext4: {e}"));
        f.write_all(data)
            .unwrap_or_else(|e| panic!("writing {name} on ext4: {e}"));
        f.sync_all()
            .unwrap_or_else(|e| panic!("fsync of {name} on ext4: {e}"));
    }
    run("sync", &mut cmd("sync", &[]), TOOL_TIMEOUT).assert_success("sync");
    let umount = |what: &str| {
        run(
            "umount",
            &mut cmd("umount", &[path_str(&mnt)]),
            TOOL_TIMEOUT,
        )
        .assert_success(what);
    };
    umount("unmounting the file system");

    mount("mounting the file system again");
    for (name, data) in &files {
        assert_same(
            &read_file(&mnt.join(name)),
            data,
            &format!("{name} after a remount"),
        );
    }
    umount("unmounting it again");
    mounts.ext4 = None;

    run(
        "e2fsck",
        &mut cmd("e2fsck", &["-f", "-n", &dev]),
        TOOL_TIMEOUT,
    )
    .assert_success("e2fsck -f -n on the loop device");
    run("losetup", &mut cmd("losetup", &["-d", &dev]), TOOL_TIMEOUT)
        .assert_success("detaching the loop device");
    mounts.loop_dev = None;
    umount_fuse(&fuse_dir, &mut nbdfuse);
    mounts.fuse = None;

    // Past every cache of this machine: the image as the target has it.
    let img = dir.join("image.ext4");
    nbdcopy(&[e.uri(), path_str(&img)], "copying the disk image out");
    run(
        "e2fsck",
        &mut cmd("e2fsck", &["-f", "-n", path_str(&img)]),
        TOOL_TIMEOUT,
    )
    .assert_success("e2fsck -f -n on the image copied out of the export");
    for (name, data) in &files {
        let out = dir.join("dumped");
        let _ = fs::remove_file(&out);
        let request = format!("dump /{name} {}", out.display());
        let r = run(
            "debugfs",
            &mut cmd("debugfs", &["-R", &request, path_str(&img)]),
            TOOL_TIMEOUT,
        );
        let got = fs::read(&out)
            .unwrap_or_else(|err| panic!("debugfs did not dump /{name} ({err})\n{}", r.report()));
        assert_same(&got, data, &format!("{name} in the image copied out"));
    }
}

fn umount_fuse(fuse_dir: &Path, nbdfuse: &mut Proc) {
    run(
        "umount",
        &mut cmd("umount", &[path_str(fuse_dir)]),
        TOOL_TIMEOUT,
    )
    .assert_success("unmounting nbdfuse");
    let status = nbdfuse.wait(Duration::from_secs(10));
    assert!(
        status.success(),
        "nbdfuse after its unmount: {status}\n{}",
        nbdfuse.report()
    );
}

//! The host side — `rdmablk connect --nbd`, `rdmablk discover`, `rdmablk
//! bench` — against a real `rdmablk-target` on loopback, driven by clients we
//! did not write: nbdinfo, qemu-io, nbdcopy, fio's nbd engine, and nbdfuse +
//! losetup + mkfs.ext4 + mount.
//!
//! Each test starts its own daemon on a free port. The tests take one lock
//! so that benchmarks and copies do not compete for the machine's cores with
//! the tests that time an exit. A failing test prints the daemon's log tail
//! and the output of every process it still holds.

use rdmablk_tests::names::{DEFAULT_NQN, HOST_A, HOST_B, OPEN_NQN, PRIVATE_NQN};
use rdmablk_tests::tools::{bench, check_bench, fio_ok, TOOL_TIMEOUT};
use rdmablk_tests::two_subsystems_config;
use rdmablk_tests::{
    fd_count, free_port, run, NbdExport, Proc, Ran, Rng, Target, TempDir, START_TIMEOUT,
};
use serde_json::Value;
use std::fs;
use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
/// The export's advertised maximum block size.
const MAX_BLOCK: u64 = 2 << 20;
/// What the contract allows `connect` to give up, or to exit after a signal.
const EXIT_WITHIN: Duration = Duration::from_secs(5);

/// One test at a time (see the module comment); a panicked holder does not
/// block the others.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn cmd(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

/// Compares without dumping megabytes: names the first differing byte.
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {i} (MiB {}): got {:#04x}, want {:#04x}",
            i / MIB,
            got[i],
            want[i]
        );
    }
    assert_eq!(got.len(), want.len(), "{what}: length");
}

fn read_file(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn write_file(path: &Path, data: &[u8]) {
    fs::write(path, data).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// A sparse file of `bytes` for a file namespace.
fn backing_file(dir: &TempDir, bytes: u64) -> PathBuf {
    let path = dir.join("ns.img");
    let f = fs::File::create(&path).expect("creating the backing file");
    f.set_len(bytes).expect("sizing the backing file");
    path
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temp path")
}

/// Polls `cond` every 10 ms until it holds; false if `timeout` passes first.
fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

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
    let _s = serial();
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

fn qemu_io(uri: &str, cmds: &[&str]) -> Ran {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for x in cmds {
        c.args(["-c", x]);
    }
    c.arg(uri);
    run("qemu-io", &mut c, TOOL_TIMEOUT)
}

/// The line qemu-io prints when a data command completes in full, e.g.
/// `read 5000/5000 bytes at offset 1000` (offsets and lengths in decimal).
fn qemu_io_summary(command: &str) -> Option<String> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let verb = match words.first() {
        Some(&"read") => "read",
        Some(&"write") => "wrote",
        Some(&"discard") => "discard",
        _ => return None,
    };
    let (off, len) = (words[words.len() - 2], words[words.len() - 1]);
    Some(format!("{verb} {len}/{len} bytes at offset {off}"))
}

/// Runs `cmds` in one qemu-io session; fails on a non-zero exit, on any
/// "failed" line (e.g. "Pattern verification failed at offset ..."), and
/// when a data command did not report completing in full.
fn qemu_io_ok(uri: &str, cmds: &[&str], what: &str) {
    let r = qemu_io(uri, cmds);
    let out = format!("{}\n{}", r.stdout, r.stderr);
    let failed: Vec<&str> = out.lines().filter(|l| l.contains("failed")).collect();
    assert!(
        failed.is_empty() && r.status.success(),
        "{what}: qemu-io reported {} failure(s):\n  {}\n{}",
        failed.len(),
        failed.join("\n  "),
        r.report()
    );
    for c in cmds {
        if let Some(line) = qemu_io_summary(c) {
            assert!(
                out.contains(&line),
                "{what}: qemu-io did not print `{line}` for `{c}`\n{}",
                r.report()
            );
        }
    }
}

/// The checker above catches a mismatch: a read expecting the wrong pattern
/// must fail.
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
    let _s = serial();
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
    let _s = serial();
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

fn nbdcopy(args: &[&str], what: &str) {
    run("nbdcopy", &mut cmd("nbdcopy", args), TOOL_TIMEOUT).assert_success(what);
}

#[test]
fn nbdcopy_round_trip() {
    let _s = serial();
    let dir = TempDir::new("nbdcopy");
    let size = 64 * MIB;
    let img = backing_file(&dir, size as u64);
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
    let _s = serial();
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
    let _s = serial();
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
    let _s = serial();
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

// ---------------------------------------------------------------- bench

#[test]
fn bench_verify_memory_and_file() {
    let _s = serial();
    let verify = ["--verify", "--rw", "randrw", "--qd", "32", "--json"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        verify.iter().chain(extra).copied().collect()
    };
    let mem = Target::start(&["--memory", "256MiB"]);
    let r = bench(
        mem.port(),
        DEFAULT_NQN,
        &with(&["--bs", "4k", "--runtime", "2s"]),
    );
    check_bench(&r, 4096.0, &["read", "write"], "memory, 4 KiB");
    // Above the target's 1 MiB MDTS: each I/O is split.
    let r = bench(
        mem.port(),
        DEFAULT_NQN,
        &with(&["--bs", "2m", "--runtime", "2s"]),
    );
    check_bench(&r, 2.0 * MIB as f64, &["read", "write"], "memory, 2 MiB");
    // Spinning on the ring instead of sleeping in it.
    let r = bench(
        mem.port(),
        DEFAULT_NQN,
        &with(&["--bs", "4k", "--runtime", "1s", "--busy-poll"]),
    );
    check_bench(&r, 4096.0, &["read", "write"], "memory, 4 KiB, --busy-poll");
    // Header and data digests, with reads large enough to be received in
    // place and small ones through the receive buffer.
    for bs in ["4k", "256k"] {
        let r = bench(
            mem.port(),
            DEFAULT_NQN,
            &with(&["-g", "-G", "--bs", bs, "--runtime", "1s"]),
        );
        let bytes = rdmablk_common::units::parse_size(bs).expect("size") as f64;
        check_bench(
            &r,
            bytes,
            &["read", "write"],
            &format!("memory, {bs}, digests"),
        );
    }
    let second_queues = || mem.log().matches("qid=2 ").count();
    let before = second_queues();
    let r = bench(
        mem.port(),
        DEFAULT_NQN,
        &with(&["--bs", "4k", "--runtime", "2s", "--queues", "2"]),
    );
    check_bench(&r, 4096.0, &["read", "write"], "memory, 4 KiB, 2 queues");
    assert_eq!(
        second_queues(),
        before + 1,
        "the daemon log should show the bench connect I/O queue 2\n{}",
        mem.log_tail()
    );

    let dir = TempDir::new("bench");
    let img = backing_file(&dir, 256 * MIB as u64);
    let file = Target::start(&["--file", path_str(&img)]);
    let r = bench(
        file.port(),
        DEFAULT_NQN,
        &with(&["--bs", "4k", "--runtime", "2s"]),
    );
    check_bench(&r, 4096.0, &["read", "write"], "file, 4 KiB");
}

/// `--verify` fails when someone else overwrites what the run wrote: a
/// second bench (its own run id) writes the same small namespace meanwhile.
#[test]
fn bench_verify_detects_foreign_writes() {
    let _s = serial();
    let t = Target::start(&["--memory", "16MiB"]);
    let port = t.port().to_string();
    let bin = rdmablk_tests::bin_path("rdmablk");
    let args = |rw: &str| -> Vec<String> {
        [
            "bench",
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
            "-n",
            DEFAULT_NQN,
            "--verify",
            "--rw",
            rw,
            "--bs",
            "4k",
            "--qd",
            "32",
            "--runtime",
            "2s",
            "--json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let mut checker = Proc::spawn(
        "rdmablk bench (verifying)",
        Command::new(&bin).args(args("randrw")),
    );
    let mut writer = Proc::spawn(
        "rdmablk bench (foreign writer)",
        Command::new(&bin).args(args("randwrite")),
    );
    let checker_status = checker.wait(TOOL_TIMEOUT);
    let writer_status = writer.wait(TOOL_TIMEOUT);
    assert!(
        writer_status.success(),
        "the writer only writes, so it has nothing to verify: {writer_status}\n{}",
        writer.report()
    );
    assert!(
        !checker_status.success(),
        "bench --verify passed although another run overwrote its blocks\n{}\n{}",
        checker.report(),
        writer.report()
    );
    let v: Value = serde_json::from_str(checker.stdout().trim()).unwrap_or_else(|e| {
        panic!(
            "no JSON result from the failed run ({e})\n{}",
            checker.report()
        )
    });
    assert!(
        v["verify_errors"].as_u64().is_some_and(|n| n > 0),
        "verify_errors in {v}\n{}",
        checker.report()
    );
    assert!(
        checker.stderr().contains("verify: LBA"),
        "the failed run should name a mismatching LBA\n{}",
        checker.report()
    );
}

// ---------------------------------------------------------------- discover

/// The NVM subsystem entries of `rdmablk discover`'s output, as key/value
/// maps; the record count must match all entries printed, and the current
/// discovery subsystem's entry (always listed) is checked and left out.
fn discover(
    port: u16,
    host: &str,
    extra: &[&str],
) -> Vec<std::collections::BTreeMap<String, String>> {
    let port = port.to_string();
    let mut args = vec![
        "discover",
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &port,
        "-q",
        host,
    ];
    args.extend_from_slice(extra);
    let r = run(
        "rdmablk discover",
        &mut cmd(path_str(&rdmablk_tests::bin_path("rdmablk")), &args),
        TOOL_TIMEOUT,
    );
    r.assert_success(&format!("discovery as {host}"));
    let records: usize = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Discovery Log Number of Records "))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `Discovery Log Number of Records N`\n{}", r.report()));
    let entries: Vec<_> = r
        .stdout
        .split("=====Discovery Log Entry")
        .skip(1)
        .map(|block| {
            block
                .lines()
                .skip(1)
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .collect()
        })
        .collect();
    assert_eq!(
        entries.len(),
        records,
        "entries vs the record count\n{}",
        r.report()
    );
    let (current, subsystems): (Vec<_>, Vec<_>) =
        entries
            .into_iter()
            .partition(|e: &std::collections::BTreeMap<String, String>| {
                e.get("subtype").map(String::as_str) == Some("current discovery subsystem")
            });
    assert_eq!(
        current.len(),
        1,
        "one listener, one current discovery entry\n{}",
        r.report()
    );
    assert_eq!(
        current[0].get("eflags").map(String::as_str),
        Some("explicit discovery connections, duplicate discovery information"),
        "{}",
        r.report()
    );
    subsystems
}

#[test]
fn discover_lists_subsystems() {
    let _s = serial();
    let t = Target::start_config(&two_subsystems_config());
    let port = t.port().to_string();
    let nqns = |host: &str| {
        let mut nqns: Vec<String> = discover(t.port(), host, &[])
            .into_iter()
            .map(|e| {
                let what = format!("entry {e:?} as seen by {host}");
                assert_eq!(e.get("trtype").map(String::as_str), Some("tcp"), "{what}");
                assert_eq!(e.get("adrfam").map(String::as_str), Some("ipv4"), "{what}");
                assert_eq!(
                    e.get("subtype").map(String::as_str),
                    Some("nvme subsystem"),
                    "{what}"
                );
                assert_eq!(e.get("trsvcid"), Some(&port), "{what}");
                assert_eq!(
                    e.get("traddr").map(String::as_str),
                    Some("127.0.0.1"),
                    "{what}"
                );
                e.get("subnqn").cloned().unwrap_or_default()
            })
            .collect();
        nqns.sort();
        nqns
    };
    assert_eq!(
        nqns(HOST_A),
        vec![OPEN_NQN.to_string(), PRIVATE_NQN.to_string()],
        "subsystems listed for the allowed host"
    );
    assert_eq!(
        nqns(HOST_B),
        vec![OPEN_NQN.to_string()],
        "subsystems listed for a host only the open subsystem admits"
    );
}

/// `--disable-sqflow`: the host asks every queue to run without SQ flow
/// control (NVMe over Fabrics 1.1, Figure 20), and rdmablk-target then ends
/// reads and Identify with a C2HData PDU flagged SUCCESS and no response
/// capsule (NVMe/TCP 1.0, 3.6.2.9), as SPDK does unasked. Discovery, the
/// admin bring-up and bench --verify take those completions, with and
/// without digests. The listener is a wildcard: the discovery entry names
/// the address this host reached (as nvmet's disc_traddr).
#[test]
fn host_takes_completions_in_data_pdus() {
    let _s = serial();
    let port = rdmablk_tests::free_port();
    let listen = format!("tcp://0.0.0.0:{port}");
    let t = Target::start(&["--listen", &listen, "--memory", "64MiB"]);
    let entries = discover(t.port(), HOST_A, &["--disable-sqflow"]);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(
        entries[0].get("subnqn").map(String::as_str),
        Some(DEFAULT_NQN)
    );
    assert_eq!(
        entries[0].get("traddr").map(String::as_str),
        Some("127.0.0.1"),
        "a wildcard listener is reported at the address reached"
    );
    verify_small_and_large(t.port(), &["--disable-sqflow"]);
}

/// Without `-n`, the host reads the discovery log and uses the one NVMe
/// subsystem it lists for this host, at the address its entry names, and
/// disables SQ flow control because the entry allows it (TREQ bit 2, NVMe
/// over Fabrics 1.1 Figure 40; the Connect responses' SQHD FFFFh confirm
/// it). Where the log lists two subsystems, the host names both and asks
/// for `-n` instead of guessing.
#[test]
fn host_uses_the_subsystem_the_discovery_log_lists() {
    let _s = serial();
    let t = Target::start_config(&two_subsystems_config());
    let port = t.port().to_string();
    let bench_without_nqn = |extra: &[&str]| {
        let mut c = Command::new(rdmablk_tests::bin_path("rdmablk"));
        c.args(["bench", "-t", "tcp", "-a", "127.0.0.1", "-s", &port])
            .args(["--verify", "--rw", "randrw", "--bs", "4k", "--qd", "16"])
            .args(["--runtime", "1s", "--json"])
            .args(extra)
            .env("RUST_LOG", "rdmablk=debug");
        run("rdmablk bench without -n", &mut c, TOOL_TIMEOUT)
    };
    // This host may use only the open subsystem: that one is connected.
    let r = bench_without_nqn(&[]);
    check_bench(&r, 4096.0, &["read", "write"], "bench without -n");
    assert!(
        r.stderr.contains(&format!("subnqn={OPEN_NQN}")),
        "the discovered subsystem is not named in the log\n{}",
        r.report()
    );
    let disabled = r.stderr.matches("sq_flow_control=false").count();
    assert!(
        disabled >= 2,
        "SQ flow control not disabled on the admin and I/O queues ({disabled} queues)\n{}",
        r.report()
    );
    // HOST_A may use both: the host asks which.
    let r = bench_without_nqn(&["-q", HOST_A]);
    assert!(!r.status.success(), "{}", r.report());
    for want in ["choose one with -n", OPEN_NQN, PRIVATE_NQN] {
        assert!(r.stderr.contains(want), "no {want:?}\n{}", r.report());
    }
}

/// bench --verify with 4 KiB I/Os, then 256 KiB ones with digests, each
/// with `extra` options.
fn verify_small_and_large(port: u16, extra: &[&str]) {
    for (bs, bytes, digests) in [("4k", 4096.0, false), ("256k", 262144.0, true)] {
        let mut args = vec![
            "--verify",
            "--rw",
            "randrw",
            "--qd",
            "16",
            "--bs",
            bs,
            "--runtime",
            "1s",
            "--json",
        ];
        args.extend_from_slice(extra);
        if digests {
            args.extend(["-g", "-G"]);
        }
        let r = bench(port, DEFAULT_NQN, &args);
        let what = format!("{bs}, digests {digests}");
        check_bench(&r, bytes, &["read", "write"], &what);
    }
}

/// Against a target that answers as SPDK's nvmf_tgt does with its default
/// options: a read or an Identify that completes with nothing to say ends
/// with its last C2HData PDU flagged SUCCESS and no response capsule,
/// although the host never asked to disable SQ flow control (NVMe/TCP 1.0,
/// 3.6.2.9; SPDK lib/nvmf/tcp.c). Discovery, connect with an NBD export
/// (qemu-io through it) and bench --verify, with and without digests.
#[test]
fn works_with_spdk_style_completions() {
    let _s = serial();
    let t = Target::start(&["--memory", "64MiB"]);
    let proxy = rdmablk_tests::proxy::Proxy::spdk_style(t.port());
    let entries = discover(proxy.port(), HOST_A, &[]);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(
        entries[0].get("subnqn").map(String::as_str),
        Some(DEFAULT_NQN)
    );
    let folded = proxy.changed();
    assert!(
        folded > 0,
        "the discovery's Identify and log pages came without capsules"
    );
    verify_small_and_large(proxy.port(), &[]);
    assert!(
        proxy.changed() > folded + 100,
        "reads completed in their data"
    );
    let e = NbdExport::start(proxy.port(), DEFAULT_NQN, &[]);
    qemu_io_ok(
        e.uri(),
        &[
            "write -P 0x5a 1048576 3145728",
            "read -P 0x5a 1048576 3145728",
            "write -z 0 1048576",
            "read -P 0 0 1048576",
        ],
        "an NBD export over an SPDK-style target",
    );
}

/// A target that answers some I/O with Command Interrupted, DNR clear and
/// CRD 1 (NVMe Base 2.1, 4.2.3.1 and Figure 101: a status the host retries
/// after CRDT1, which the host enabled with ACRE): bench --verify completes
/// without an error, every such command retried after the delay.
#[test]
fn retryable_statuses_are_retried() {
    let _s = serial();
    let t = Target::start(&["--memory", "64MiB"]);
    let proxy = rdmablk_tests::proxy::Proxy::interrupting(t.port(), 50);
    let args = [
        "--verify",
        "--rw",
        "randrw",
        "--qd",
        "8",
        "--bs",
        "4k",
        "--runtime",
        "2s",
        "--json",
    ];
    let r = bench(proxy.port(), DEFAULT_NQN, &args);
    check_bench(
        &r,
        4096.0,
        &["read", "write"],
        "every 50th response interrupted",
    );
    assert!(proxy.changed() > 0, "the proxy interrupted responses");
}

// ---------------------------------------------------------------- refused connects

/// `rdmablk connect` to something that refuses: exits non-zero within
/// seconds, says `cause` on stderr, never prints `ready:` nor creates the socket.
fn assert_refused(port: u16, nqn: &str, extra: &[&str], cause: &str, what: &str) {
    let dir = TempDir::new("refused");
    let sock = dir.join("nbd.sock");
    let listen = format!("unix:{}", sock.display());
    let mut c = rdmablk_tests::rdmablk_command("connect", port, nqn);
    c.args(["--nbd", &listen]).args(extra);
    let started = Instant::now();
    let mut p = Proc::spawn("rdmablk connect", &mut c);
    let status = p.wait_timeout(EXIT_WITHIN).unwrap_or_else(|| {
        p.kill();
        panic!(
            "{what}: rdmablk connect still running after {EXIT_WITHIN:?}\n{}",
            p.report()
        )
    });
    let took = started.elapsed();
    assert!(
        !status.success(),
        "{what}: exit status {status}\n{}",
        p.report()
    );
    assert!(
        p.stderr().contains(cause),
        "{what}: stderr does not say {cause:?}\n{}",
        p.report()
    );
    assert!(
        !p.stdout().contains("ready:"),
        "{what}: printed ready:\n{}",
        p.report()
    );
    assert!(
        !sock.exists(),
        "{what}: {} was created although no association was made",
        sock.display()
    );
    eprintln!("{what}: refused in {took:.2?}");
}

#[test]
fn refused_connects_exit_nonzero() {
    let _s = serial();
    assert_refused(
        free_port(),
        DEFAULT_NQN,
        &[],
        "no NVMe-oF target listens",
        "nothing listening",
    );

    let t = Target::start(&["--memory", "16MiB"]);
    let unknown = "nqn.2026-11.io.rdmablk:no-such-subsystem";
    assert_refused(t.port(), unknown, &[], "has no subsystem", "unknown NQN");

    let c = Target::start_config(&two_subsystems_config());
    assert_refused(
        c.port(),
        PRIVATE_NQN,
        &["-q", HOST_B],
        "not allowed",
        "host not on the allow-list",
    );
    // The same subsystem admits the listed host: the refusal was about the host.
    let mut e = NbdExport::start(c.port(), PRIVATE_NQN, &["-q", HOST_A]);
    assert!(e.socket().exists(), "socket of the admitted host's export");
    e.proc().signal(libc::SIGTERM);
    let status = e.proc().wait(EXIT_WITHIN);
    assert!(
        status.success(),
        "the admitted host's export after SIGTERM: {status}"
    );
}

// ---------------------------------------------------------------- clients fed through a pipe

/// A thread that streams random bytes into a client's stdin (`nbdcopy -- -
/// URI` copies them to the export as they come). It writes while fewer than
/// `budget` bytes went in, then holds the pipe open, so the client waits for
/// more instead of finishing; once `kill_at` bytes went in it SIGKILLs the
/// victim, if it has one, right in the stream.
struct Feeder {
    written: Arc<AtomicU64>,
    budget: Arc<AtomicU64>,
    kill_at: Arc<AtomicU64>,
    killed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Feeder {
    /// `victim` must be a child not yet reaped (the caller does not reap it
    /// while `kill_at` can be reached).
    fn start(mut sink: std::process::ChildStdin, budget: u64, victim: Option<u32>) -> Feeder {
        let written = Arc::new(AtomicU64::new(0));
        let budget = Arc::new(AtomicU64::new(budget));
        let kill_at = Arc::new(AtomicU64::new(u64::MAX));
        let killed = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (w, b, k, kd, s) = (
            written.clone(),
            budget.clone(),
            kill_at.clone(),
            killed.clone(),
            stop.clone(),
        );
        let handle = std::thread::spawn(move || {
            let mut rng = Rng::new(0x6665_6564);
            let mut chunk = vec![0u8; 256 << 10];
            while !s.load(Ordering::Relaxed) {
                let done = w.load(Ordering::Relaxed);
                if done >= k.load(Ordering::Relaxed) {
                    if let Some(pid) = victim {
                        rdmablk_tests::send_signal(pid, libc::SIGKILL);
                        kd.store(true, Ordering::Relaxed);
                    }
                    return;
                }
                if done >= b.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                rng.fill(&mut chunk);
                if sink.write_all(&chunk).is_err() {
                    return; // the client is gone
                }
                w.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
        });
        Feeder {
            written,
            budget,
            kill_at,
            killed,
            stop,
            handle: Some(handle),
        }
    }

    fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Waits until `bytes` went in; panics (with the client's output) if the
    /// client exits or stalls first.
    fn wait_written(&self, bytes: u64, client: &mut Proc) {
        let ok = poll_until(Duration::from_secs(20), || {
            self.written() >= bytes || !client.is_running()
        });
        let running = client.is_running();
        assert!(
            ok && running,
            "{} took {} of {bytes} bytes and is {}\n{}",
            client.name(),
            self.written(),
            if running { "stalled" } else { "gone" },
            client.report()
        );
    }

    /// Waits for the thread to end (it ends once `kill_at` is reached, the
    /// client is gone, or `stop`); true if it did within `timeout`.
    fn join(&mut self, timeout: Duration) -> bool {
        let Some(h) = self.handle.take() else {
            return true;
        };
        if !poll_until(timeout, || h.is_finished()) {
            self.handle = Some(h);
            return false;
        }
        h.join().expect("the feeder thread panicked");
        true
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // A feeder blocked on a full pipe ends when its client dies, which
        // the caller's Proc ensures when it drops; do not wait here.
    }
}

fn settled_fd_count(pid: u32, want: usize, timeout: Duration) -> Result<(), usize> {
    let mut last = 0;
    if poll_until(timeout, || {
        last = fd_count(pid);
        last == want
    }) {
        Ok(())
    } else {
        Err(last)
    }
}

// ---------------------------------------------------------------- a killed client

#[test]
fn killed_client_leaves_others_serving() {
    use std::os::unix::process::ExitStatusExt;
    let _s = serial();
    let t = Target::start(&["--memory", "256MiB"]);
    let mut e = NbdExport::start(t.port(), DEFAULT_NQN, &["-i", "2"]);
    let uri = e.uri().to_string();
    let baseline_fds = fd_count(e.pid());

    // The last 64 MiB hold a pattern that a second client reads while the
    // copy streams into the first 128 MiB.
    qemu_io_ok(
        &uri,
        &["write -P 0x5a 201326592 67108864"],
        "writing the reader's region",
    );
    let (mut copier, stdin) = Proc::spawn_with_stdin(
        "nbdcopy (to be killed)",
        &mut cmd("nbdcopy", &["--", "-", &uri]),
    );
    let mut feed = Feeder::start(stdin, 96 << 20, Some(copier.pid()));
    feed.wait_written(8 << 20, &mut copier);
    qemu_io_ok(
        &uri,
        &[
            "read -P 0x5a 201326592 67108864",
            "read -P 0x5a 201326592 67108864",
        ],
        "reading while nbdcopy writes",
    );
    assert!(
        copier.is_running(),
        "nbdcopy ended before it was killed\n{}",
        copier.report()
    );
    // Let it stream again and kill it 8 MiB further on, mid-stream.
    let kill_at = feed.written() + (8 << 20);
    feed.kill_at.store(kill_at, Ordering::Relaxed);
    feed.budget.store(128 << 20, Ordering::Relaxed);
    if !feed.join(Duration::from_secs(20)) {
        copier.kill();
        panic!(
            "nbdcopy did not take 8 MiB more within 20 s ({} of {kill_at} bytes)\n{}\n{}",
            feed.written(),
            copier.report(),
            e.report()
        );
    }
    assert!(
        feed.killed.load(Ordering::Relaxed),
        "nbdcopy went away before it was killed ({} bytes in)\n{}",
        feed.written(),
        copier.report()
    );
    let status = copier.wait(EXIT_WITHIN);
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "nbdcopy's end: {status}"
    );

    assert!(
        e.is_running(),
        "rdmablk connect died with its client\n{}",
        e.report()
    );
    qemu_io_ok(
        &uri,
        &[
            "write -P 0x77 1048576 4194304",
            "read -P 0x77 1048576 4194304",
            "write -P 0x78 3001 70000",
            "read -P 0x78 3001 70000",
            "read -P 0x5a 201326592 67108864",
            "flush",
        ],
        "a fresh client after the kill",
    );
    let dir = TempDir::new("killed");
    let data = Rng::new(0x6b69_6c6c).bytes(16 * MIB);
    let src = dir.join("src.bin");
    write_file(&src, &data);
    nbdcopy(&[path_str(&src), &uri], "a fresh nbdcopy in after the kill");
    let out = dir.join("out.bin");
    nbdcopy(&[&uri, path_str(&out)], "nbdcopy out after the kill");
    let got = read_file(&out);
    assert_same(&got[..16 * MIB], &data, "the fresh nbdcopy's data");
    if let Some(i) = got[192 * MIB..].iter().position(|&b| b != 0x5a) {
        panic!("the reader's region changed at byte {}", 192 * MIB + i);
    }

    // Every client is gone: the export holds no more descriptors than
    // before the first one came.
    if let Err(n) = settled_fd_count(e.pid(), baseline_fds, Duration::from_secs(5)) {
        panic!(
            "rdmablk connect holds {n} file descriptors after all clients left, \
             {baseline_fds} before any came\n{}",
            e.report()
        );
    }
    assert!(e.is_running(), "rdmablk connect exited\n{}", e.report());
    let r = bench(
        t.port(),
        DEFAULT_NQN,
        &[
            "--verify",
            "--rw",
            "randrw",
            "--bs",
            "4k",
            "--qd",
            "32",
            "--runtime",
            "1s",
            "--json",
        ],
    );
    check_bench(
        &r,
        4096.0,
        &["read", "write"],
        "bench on the daemon after the kill",
    );

    e.proc().signal(libc::SIGTERM);
    let status = e.proc().wait(EXIT_WITHIN);
    assert!(
        status.success(),
        "rdmablk connect after SIGTERM: {status}\n{}",
        e.report()
    );
}

// ---------------------------------------------------------------- SIGTERM / SIGINT

/// Sends `sig` to the export and checks the contract: exit 0 within 5 s,
/// socket removed, one `ready:` line in all, and the daemon saw `host` shut
/// its controller down.
fn assert_clean_exit(t: &Target, e: &mut NbdExport, sig: i32, host: &str, what: &str) {
    let started = Instant::now();
    e.proc().signal(sig);
    let status = e.proc().wait_timeout(EXIT_WITHIN).unwrap_or_else(|| {
        e.proc().kill();
        panic!(
            "{what}: rdmablk connect still running {EXIT_WITHIN:?} after the signal; \
             killed it\n{}",
            e.report()
        )
    });
    let took = started.elapsed();
    assert!(
        status.success(),
        "{what}: exit status {status}\n{}",
        e.report()
    );
    assert!(
        !e.socket().exists(),
        "{what}: {} still exists after the exit",
        e.socket().display()
    );
    let out = e.proc().stdout();
    assert_eq!(
        out,
        format!("ready: {}\n", e.uri()),
        "{what}: stdout should be exactly one ready: line"
    );
    let seen = poll_until(Duration::from_secs(2), || {
        t.log()
            .lines()
            .any(|l| l.contains("host shut the controller down") && l.contains(host))
    });
    assert!(
        seen,
        "{what}: the daemon log shows no `host shut the controller down` for {host}\n{}\n{}",
        t.log_tail(),
        e.report()
    );
    eprintln!("{what}: exited in {took:.2?}");
}

#[test]
fn connect_sigterm_exits_cleanly() {
    let _s = serial();
    let t = Target::start(&["--memory", "64MiB"]);

    // SIGTERM with an idle client attached: an interactive qemu-io that has
    // done one read and waits for its next command.
    let mut e = NbdExport::start(t.port(), DEFAULT_NQN, &["-q", HOST_A]);
    let (mut client, mut stdin) = Proc::spawn_with_stdin(
        "qemu-io (interactive)",
        &mut cmd("qemu-io", &["-f", "raw", e.uri()]),
    );
    stdin
        .write_all(b"read -P 0 0 4096\n")
        .expect("writing to qemu-io");
    let answered = poll_until(Duration::from_secs(10), || {
        client.stdout().contains("read 4096/4096 bytes at offset 0") || !client.is_running()
    });
    assert!(
        answered && client.is_running(),
        "qemu-io did not answer its first command\n{}",
        client.report()
    );
    assert_clean_exit(
        &t,
        &mut e,
        libc::SIGTERM,
        HOST_A,
        "SIGTERM with an idle client",
    );
    drop(stdin);
    client.kill();

    // SIGINT, no client.
    let mut e = NbdExport::start(t.port(), DEFAULT_NQN, &["-q", HOST_B]);
    assert_clean_exit(&t, &mut e, libc::SIGINT, HOST_B, "SIGINT");
}

/// Opens an NBD connection by hand (fixed newstyle, `NBD_OPT_EXPORT_NAME`
/// ""), sends a 64 KiB `NBD_CMD_WRITE` with only the first 4 KiB of its
/// payload, and leaves it there: a client stalled in mid-request, which no
/// stock client produces on purpose.
fn stall_mid_write(socket: &Path) -> std::os::unix::net::UnixStream {
    use std::io::Read;
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", socket.display()));
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).expect("reading the NBD greeting");
    assert_eq!(&hello[..16], b"NBDMAGICIHAVEOPT", "NBD greeting");
    let no_zeroes = u16::from_be_bytes([hello[16], hello[17]]) & 2 != 0;
    let client_flags: u32 = 1 | if no_zeroes { 2 } else { 0 };
    let mut out = client_flags.to_be_bytes().to_vec();
    out.extend_from_slice(b"IHAVEOPT");
    out.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
    out.extend_from_slice(&0u32.to_be_bytes()); // the empty name
    s.write_all(&out).expect("sending NBD_OPT_EXPORT_NAME");
    let mut info = vec![0u8; 10 + if no_zeroes { 0 } else { 124 }];
    s.read_exact(&mut info)
        .expect("reading the export's size and flags");
    let mut req = 0x2560_9513u32.to_be_bytes().to_vec(); // request magic
    req.extend_from_slice(&0u16.to_be_bytes()); // flags
    req.extend_from_slice(&1u16.to_be_bytes()); // NBD_CMD_WRITE
    req.extend_from_slice(&7u64.to_be_bytes()); // cookie
    req.extend_from_slice(&0u64.to_be_bytes()); // offset
    req.extend_from_slice(&(64u32 << 10).to_be_bytes()); // length
    req.extend_from_slice(&[0xee; 4096]);
    s.write_all(&req).expect("sending part of a write");
    s
}

/// SIGTERM while clients are in the middle of writes: the export must
/// still end within 5 s. First a client stalled mid-payload (deterministic),
/// then rounds of `nbdcopy` streaming from a pipe that keeps coming.
#[test]
fn connect_sigterm_while_client_writes() {
    let _s = serial();
    let t = Target::start(&["--memory", "256MiB"]);

    let mut e = NbdExport::start(t.port(), DEFAULT_NQN, &["-q", HOST_A]);
    let stalled = stall_mid_write(e.socket());
    // A full round trip of another client on the same (single) engine after
    // the partial write went out: the engine has taken the stalled request.
    qemu_io_ok(
        e.uri(),
        &["read -P 0 1048576 4096"],
        "a read beside the stalled write",
    );
    assert_clean_exit(
        &t,
        &mut e,
        libc::SIGTERM,
        HOST_A,
        "SIGTERM with a client stalled in the middle of a write's payload",
    );
    drop(stalled);

    for round in 1..=3 {
        let mut e = NbdExport::start(t.port(), DEFAULT_NQN, &["-q", HOST_B]);
        let (mut client, stdin) = Proc::spawn_with_stdin(
            "nbdcopy (streaming)",
            &mut cmd("nbdcopy", &["--", "-", e.uri()]),
        );
        let feed = Feeder::start(stdin, 192 << 20, None);
        feed.wait_written(16 << 20, &mut client);
        assert_clean_exit(
            &t,
            &mut e,
            libc::SIGTERM,
            HOST_B,
            &format!("SIGTERM while nbdcopy writes (round {round} of 3)"),
        );
        drop(feed);
        client.kill();
    }
}

/// The target dies (SIGKILL) under an attached export: a write issued
/// during the outage waits, completes once a new daemon serves the same file
/// on the same port, and everything written before and during the outage
/// reads back. The export process never restarts.
#[test]
fn reconnects_after_target_restart() {
    let _s = serial();
    let dir = TempDir::new("reconnect");
    let file = backing_file(&dir, 64 * MIB as u64);
    let port = free_port();
    let mut t = Target::start_on(port, &["--file", path_str(&file)]);
    let mut e = NbdExport::start(port, DEFAULT_NQN, &["-l", "60", "-k", "2"]);
    qemu_io_ok(e.uri(), &["write -P 0x5a 0 1048576"], "before the outage");

    t.kill();
    let uri = e.uri().to_string();
    let (mut writer, mut stdin) = Proc::spawn_with_stdin(
        "qemu-io (during the outage)",
        &mut cmd("qemu-io", &["-f", "raw", &uri]),
    );
    stdin
        .write_all(b"write -P 0x6b 1048576 1048576\n")
        .expect("writing to qemu-io");
    // The write must wait, not fail, while nothing listens.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !writer.stdout().contains("wrote") && !writer.stdout().contains("failed"),
        "the write finished while the target was down\n{}",
        writer.report()
    );
    let _t2 = Target::start_on(port, &["--file", path_str(&file)]);
    let done = poll_until(Duration::from_secs(30), || {
        writer
            .stdout()
            .contains("wrote 1048576/1048576 bytes at offset 1048576")
    });
    assert!(
        done,
        "the write issued during the outage did not complete after the target came back\n{}\n{}",
        writer.report(),
        e.proc().report()
    );
    drop(stdin);
    writer.kill();
    qemu_io_ok(
        e.uri(),
        &["read -P 0x5a 0 1048576", "read -P 0x6b 1048576 1048576"],
        "after the reconnect",
    );
    assert!(
        e.proc().is_running(),
        "rdmablk connect exited\n{}",
        e.proc().report()
    );
}

/// With the target gone for good, I/O fails once --ctrl-loss-tmo runs out
/// and `rdmablk connect` exits non-zero, removing its socket.
#[test]
fn gives_up_after_ctrl_loss_tmo() {
    let _s = serial();
    let mut t = Target::start(&["--memory", "64MiB"]);
    let mut e = NbdExport::start(t.port(), DEFAULT_NQN, &["-l", "2", "-k", "2"]);
    qemu_io_ok(e.uri(), &["write -P 0x11 0 4096"], "before the outage");
    t.kill();
    let started = Instant::now();
    let r = qemu_io(e.uri(), &["write -P 0x22 4096 4096"]);
    let out = format!("{}{}", r.stdout, r.stderr);
    assert!(
        out.contains("Input/output error") || !r.status.success(),
        "a write after the association was lost for good did not fail\n{}",
        r.report()
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the write took {:?} to fail with ctrl-loss-tmo 2 s",
        started.elapsed()
    );
    let status = e.proc().wait(Duration::from_secs(15));
    assert!(
        !status.success(),
        "rdmablk connect exited 0 after giving up\n{}",
        e.proc().report()
    );
    assert!(
        e.proc().stderr().contains("ctrl-loss-tmo"),
        "the exit message does not name ctrl-loss-tmo\n{}",
        e.proc().report()
    );
    assert!(!e.socket().exists(), "the NBD socket was left behind");
}

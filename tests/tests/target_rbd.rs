//! Namespaces backed by Ceph RBD images, against a real one-node cluster
//! (`scripts/ceph-dev.sh up`; the test command starts it and passes its
//! ceph.conf in `RDMABLK_CEPH_CONF`). The tests are `#[ignore]`d without
//! one: `scripts/test.sh` runs them with `--ignored`.
//!
//! What they show: `rdmablk bench --verify` and fio (through our NBD export)
//! on an image; bytes written over NVMe/TCP are what `rbd export` reads
//! from the cluster; two targets exporting one image agree, each with its
//! own controller ids and the same namespace identifiers; a namespace is
//! inactive until its image opens and is announced (and resized) with
//! Namespace Attribute Changed; an OSD that stops answering turns I/O into
//! a retryable Command Interrupted within the configured timeout, and I/O
//! works again once the OSD continues; a blocklisted client reconnects; a
//! cluster that does not answer holds up no other.

use rdmablk_common::nvme::identify::{cns, parse_ns_list, NamespaceId};
use rdmablk_common::nvme::{admin, crd_of, dnr_of, feature, nvm, Sqe, Status};
use rdmablk_tests::check::{assert_same, assert_status, open, OrPanic};
use rdmablk_tests::client::{Controller, Opts, Queue};
use rdmablk_tests::names::{HOST_A, HOST_B};
use rdmablk_tests::tools::{bench, check_bench, fio_ok, TOOL_TIMEOUT};
use rdmablk_tests::{run, send_signal, NbdExport, Ran, Rng, Target, TempDir};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.io.example:rbd";
const MIB: u64 = 1 << 20;
const IMAGE_BYTES: u64 = 128 * MIB;
/// How long an image may take to open once it exists (the target retries
/// every 5 s).
const OPEN_WITHIN: Duration = Duration::from_secs(30);
/// The Namespace Attribute Changed notice's completion dword 0 (NVMe Base
/// 2.1, Figure 150: Notice, information 00h, log page 04h).
const NS_ATTR_CHANGED: u32 = 0x0004_0002;

/// One test at a time: they share the cluster's single OSD, which one of
/// them stops.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The test cluster's ceph.conf.
fn ceph_conf() -> PathBuf {
    let conf = std::env::var_os("RDMABLK_CEPH_CONF").unwrap_or_else(|| {
        panic!("RDMABLK_CEPH_CONF is not set: run `scripts/ceph-dev.sh up` and set it to the path it prints")
    });
    PathBuf::from(conf)
}

/// `rbd -c CONF ARGS...` as client.admin.
fn rbd(args: &[&str]) -> Ran {
    let mut c = Command::new("rbd");
    c.arg("-c").arg(ceph_conf()).args(args);
    run("rbd", &mut c, TOOL_TIMEOUT)
}

/// An image made for one test (layering only: without exclusive-lock, two
/// gateways write it without passing a lock back and forth), removed after.
struct Image {
    name: String,
}

impl Image {
    fn create(label: &str, bytes: u64) -> Image {
        let name = format!("{label}-{}", std::process::id());
        let size = format!("{}M", bytes / MIB);
        let _ = rbd(&["rm", &format!("rbd/{name}")]);
        rbd(&[
            "create",
            &format!("rbd/{name}"),
            "--size",
            &size,
            "--image-feature",
            "layering",
        ])
        .assert_success("rbd create");
        Image { name }
    }

    fn spec(&self) -> String {
        format!("rbd/{}", self.name)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = rbd(&["rm", &self.spec()]);
    }
}

/// A target exporting `image` as namespace 1 of [`NQN`], as the test
/// cluster's client.rdmablk, with `subsystem_extra` keys and `timeout`.
fn target(image: &str, subsystem_extra: &str, timeout: &str) -> Target {
    target_as(image, subsystem_extra, timeout, "client_id = \"rdmablk\"")
}

/// [`target`] with other namespace keys than client.rdmablk's.
fn target_as(image: &str, subsystem_extra: &str, timeout: &str, ns_extra: &str) -> Target {
    Target::start_config(&format!(
        r#"
[[listener]]
transport = "tcp"
address = "127.0.0.1:{{port}}"

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true
{subsystem_extra}

  [[subsystem.namespace]]
  nsid = 1
  backend = "rbd"
  pool = "rbd"
  image = "{image}"
  ceph_conf = "{conf}"
  timeout = "{timeout}"
  {ns_extra}
"#,
        conf = ceph_conf().display()
    ))
}

/// Waits until the target's log says `what`.
fn wait_log(t: &Target, what: &str) {
    let start = Instant::now();
    while !t.log().contains(what) {
        assert!(
            start.elapsed() < OPEN_WITHIN,
            "the target did not log {what:?}\n{}",
            t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the target logs that its image is open.
fn wait_active(t: &Target) {
    wait_log(t, "namespace active");
}

/// Stops a target with SIGTERM: it exits 0, having closed its image (so
/// that the image can be removed at once, its watch gone).
fn stop(mut t: Target) {
    let status = t.stop();
    assert!(status.success(), "exit status {status}\n{}", t.log_tail());
}

/// A controller of [`NQN`] with one I/O queue.
fn controller(t: &Target, host: &str) -> Controller {
    open(t, NQN, host, &Opts::default())
}

fn io(c: &mut Controller) -> &mut Queue {
    &mut c.io[0]
}

/// The active namespace list of a controller.
fn active(c: &Controller) -> Vec<u32> {
    let list = c
        .admin()
        .identify(cns::ACTIVE_NS_LIST, 0)
        .or_panic("Identify active namespace list");
    parse_ns_list(&list)
}

fn identify_ns(c: &Controller) -> NamespaceId {
    NamespaceId::parse(
        &c.admin()
            .identify(cns::NAMESPACE, 1)
            .or_panic("Identify Namespace"),
    )
}

/// `rdmablk bench --verify` at 4 KiB and 1 MiB on an image.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn bench_verifies_at_4k_and_1m() {
    let _s = serial();
    let img = Image::create("bench", IMAGE_BYTES);
    let t = target(&img.name, "", "20s");
    wait_active(&t);
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

/// fio's nbd engine through our NBD export of an RBD namespace, verified.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn fio_through_the_nbd_export_verifies() {
    let _s = serial();
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
    let _s = serial();
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
    let _s = serial();
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

/// A namespace whose image does not exist yet is inactive (absent from the
/// active list, I/O refused as Invalid Namespace); once the image is
/// created it opens and the host hears Namespace Attribute Changed; a
/// resize is announced the same way, with the new size in Identify.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn the_namespace_appears_when_its_image_opens_and_follows_resizes() {
    let _s = serial();
    let name = format!("late-{}", std::process::id());
    let spec = format!("rbd/{name}");
    let _ = rbd(&["rm", &spec]);
    // Removes the image after the target is gone (declared first).
    let img = Image { name: name.clone() };
    let t = target(&name, "", "20s");
    // A KATO longer than the waits for an event, which hold the admin queue.
    let opts = Opts {
        kato_ms: 120_000,
        ..Opts::default()
    };
    let mut c = open(&t, NQN, HOST_A, &opts);
    assert_eq!(active(&c), Vec::<u32>::new(), "no active namespace yet");
    let refused = io(&mut c)
        .exec(Queue::rw_sqe(nvm::READ, 1, 0, 1), None, 512)
        .or_panic("a read before the image exists");
    assert_status(
        &refused,
        Status::INVALID_NAMESPACE,
        "read of an inactive namespace",
    );
    // The target says why the namespace is inactive.
    wait_log(&t, "cannot open the RBD image");

    c.admin()
        .set_features(feature::ASYNC_EVENT, 1 << 8)
        .or_panic("enabling Namespace Attribute Changed");
    let wait_event = |c: &mut Controller, what: &str| {
        let aer = c
            .admin()
            .submit(Sqe::new(admin::ASYNC_EVENT, 0), None, 0)
            .or_panic("submitting an AER");
        c.admin().set_timeout(OPEN_WITHIN).or_panic("admin timeout");
        let done = c.admin().wait(aer).or_panic(what);
        assert_status(&done, Status::SUCCESS, what);
        assert_eq!(done.cqe.dw0, NS_ATTR_CHANGED, "{what}: the event");
        // Reading the Changed Namespace List (RAE clear) unmasks the event.
        let log = c
            .admin()
            .get_log(rdmablk_common::nvme::log::lid::CHANGED_NS, 4096, 0)
            .or_panic("Changed Namespace List");
        assert_eq!(
            &log[..8],
            &[1, 0, 0, 0, 0, 0, 0, 0],
            "{what}: nsid 1 changed"
        );
    };
    rbd(&[
        "create",
        &spec,
        "--size",
        "32M",
        "--image-feature",
        "layering",
    ])
    .assert_success("rbd create");
    wait_event(&mut c, "the event of the image opening");
    assert_eq!(
        t.log().matches("connected to the Ceph cluster").count(),
        1,
        "one connection while the image did not exist\n{}",
        t.log_tail()
    );
    assert_eq!(active(&c), vec![1], "active once open");
    assert_eq!(
        identify_ns(&c).nsze,
        32 * MIB / 512,
        "size of the open image"
    );
    let data = Rng::new(3).bytes(4096);
    io(&mut c).write(1, 8, &data, 512, false).or_panic("write");

    rbd(&["resize", &img.spec(), "--size", "48M"]).assert_success("rbd resize");
    wait_event(&mut c, "the event of the resize");
    assert_eq!(
        identify_ns(&c).nsze,
        48 * MIB / 512,
        "size after the resize"
    );
    let end = 48 * MIB / 512 - 8;
    io(&mut c)
        .write(1, end, &data, 512, false)
        .or_panic("write past the old end");
    let back = io(&mut c).read(1, 8, 8, 512).or_panic("read");
    assert_same(&back, &data, "data before the resize");
    drop(c);
    stop(t);
}

/// A read-only namespace opens its image for reading only, so a client
/// with read-only credentials (client.reader: `profile rbd-read-only`)
/// serves it: reads return what `rbd import` put there, writes are refused
/// with Namespace Is Write Protected, and Identify says so (NSATTR bit 0).
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn read_only_namespaces_serve_read_only_credentials() {
    let _s = serial();
    let img = Image {
        name: format!("golden-{}", std::process::id()),
    };
    let dir = TempDir::new("rbd-import");
    let file = dir.join("golden");
    let data = Rng::new(21).bytes(4 << 20);
    std::fs::write(&file, &data).or_panic("writing the image file");
    let _ = rbd(&["rm", &img.spec()]);
    rbd(&[
        "import",
        "--image-feature",
        "layering",
        file.to_str().expect("path"),
        &img.spec(),
    ])
    .assert_success("rbd import");
    let t = target_as(
        &img.name,
        "",
        "20s",
        "client_id = \"reader\"\n  read_only = true",
    );
    wait_active(&t);
    let mut c = controller(&t, HOST_A);
    assert_eq!(identify_ns(&c).nsattr & 1, 1, "NSATTR: write protected");
    // In 1 MiB reads (the target's MDTS).
    for (k, chunk) in data.chunks(MIB as usize).enumerate() {
        let slba = k as u64 * 2048;
        let back = io(&mut c).read(1, slba, 2048, 512).or_panic("read");
        assert_same(&back, chunk, &format!("the imported bytes at LBA {slba}"));
    }
    let refused = io(&mut c)
        .exec(Queue::rw_sqe(nvm::WRITE, 1, 0, 8), Some(&data[..4096]), 0)
        .or_panic("a write");
    assert_status(
        &refused,
        Status::NAMESPACE_WRITE_PROTECTED,
        "write to a read-only namespace",
    );
    drop(c);
    stop(t);
}

/// Sends SIGCONT to the OSD when dropped, so that a failing test does not
/// leave the cluster stopped.
struct StoppedOsd(u32);

impl StoppedOsd {
    fn stop() -> StoppedOsd {
        let pidfile = ceph_conf().with_file_name("osd.0.pid");
        let pid: u32 = std::fs::read_to_string(&pidfile)
            .or_panic("reading the OSD's pid file")
            .trim()
            .parse()
            .expect("a pid");
        send_signal(pid, libc::SIGSTOP);
        StoppedOsd(pid)
    }
}

impl Drop for StoppedOsd {
    fn drop(&mut self) {
        send_signal(self.0, libc::SIGCONT);
    }
}

/// With the OSD stopped, I/O completes within the namespace's timeout with a
/// status the host retries, DNR clear (NVMe Base 2.1, 4.2.3.1, Generic
/// Command Status Values): Namespace Not Ready (82h) before the host enabled
/// ACRE, Command Interrupted (21h, which the specification allows only
/// with ACRE) with a Command Retry Delay after; the target logs it. After
/// the OSD continues, I/O works again.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn a_stopped_osd_gives_a_retryable_error_within_the_timeout() {
    let _s = serial();
    let img = Image::create("stall", 64 * MIB);
    let timeout = Duration::from_secs(3);
    let t = target(&img.name, "", "3s");
    wait_active(&t);
    let mut c = controller(&t, HOST_A);
    let data = Rng::new(5).bytes(64 << 10);
    io(&mut c)
        .write(1, 0, &data, 512, false)
        .or_panic("write before");
    io(&mut c)
        .set_timeout(Duration::from_secs(30))
        .or_panic("queue timeout");

    let osd = StoppedOsd::stop();
    let answered = |c: &mut Controller, sqe: Sqe, out: Option<&[u8]>, what: &str| {
        let start = Instant::now();
        let done = io(c)
            .exec(sqe, out, if out.is_some() { 0 } else { 64 << 10 })
            .or_panic(what);
        let took = start.elapsed();
        // Ceph's timers run on a coarse clock: they may fire a few
        // milliseconds before the timeout by ours.
        let early = Duration::from_millis(100);
        assert!(
            took + early >= timeout && took < timeout + Duration::from_secs(5),
            "{what} answered after {took:?}, the timeout being {timeout:?}"
        );
        assert!(!dnr_of(done.cqe.status), "{what}: DNR clear (retryable)");
        done
    };
    let w = answered(
        &mut c,
        Queue::rw_sqe(nvm::WRITE, 1, 1024, 128),
        Some(&data),
        "a write to a stopped OSD",
    );
    assert_status(&w, Status::NAMESPACE_NOT_READY, "write without ACRE");
    assert_eq!(crd_of(w.cqe.status), 0, "no CRD without ACRE");

    // Advanced Command Retry (Host Behavior Support, FID 16h, ACRE in byte
    // 0), as the Linux host enables it.
    let mut hbs = vec![0u8; 512];
    hbs[0] = 1;
    let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
    sqe.set_cdw(10, feature::HOST_BEHAVIOR as u32);
    let set = c
        .admin()
        .exec(sqe, Some(&hbs), 0)
        .or_panic("Set Features ACRE");
    assert_status(&set, Status::SUCCESS, "Set Features Host Behavior Support");
    let r = answered(
        &mut c,
        Queue::rw_sqe(nvm::READ, 1, 0, 128),
        None,
        "a read from a stopped OSD",
    );
    assert_status(&r, Status::COMMAND_INTERRUPTED, "read with ACRE");
    assert_eq!(crd_of(r.cqe.status), 1, "CRD names CRDT1 once ACRE is on");
    assert!(
        t.log().contains("backend I/O timed out"),
        "the target logs the timeout\n{}",
        t.log_tail()
    );
    drop(osd);

    let start = Instant::now();
    loop {
        let done = io(&mut c)
            .exec(Queue::rw_sqe(nvm::READ, 1, 0, 128), None, 64 << 10)
            .or_panic("a read after the OSD continued");
        if done.status().is_success() {
            assert_same(&done.data, &data, "read after the OSD continued");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "I/O does not work again after the OSD continued: {}",
            done.status()
        );
    }
    io(&mut c)
        .write(1, 1024, &data, 512, true)
        .or_panic("write after");
    drop(c);
    stop(t);
}

/// `ceph -c CONF ARGS...` as client.admin.
fn ceph(args: &[&str]) -> Ran {
    let mut c = Command::new("ceph");
    c.arg("-c").arg(ceph_conf()).args(args);
    run("ceph", &mut c, TOOL_TIMEOUT)
}

/// The addresses of the clients watching an image (`rbd status`).
fn watchers(img: &Image) -> Vec<String> {
    let out = rbd(&["status", &img.spec(), "--format", "json"]);
    out.assert_success("rbd status");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("rbd status JSON");
    v["watchers"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(|x| x["address"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes a cephx client when dropped.
struct Client(String);

impl Drop for Client {
    fn drop(&mut self) {
        let _ = ceph(&["auth", "del", &format!("client.{}", self.0)]);
    }
}

/// Takes a client off the cluster's blocklist when dropped.
struct Blocklisted(String);

impl Drop for Blocklisted {
    fn drop(&mut self) {
        let _ = ceph(&["osd", "blocklist", "rm", &self.0]);
    }
}

/// Waits until the target has opened its image again `n` times in all,
/// then reads back `data` (at LBA 128) through `c`.
fn reconnected(t: &Target, n: usize, c: &mut Controller, data: &[u8], what: &str) {
    let start = Instant::now();
    while t.log().matches("open again on a new connection").count() < n {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no new connection {what}\n{}",
            t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let back = io(c).read(1, 128, 128, 512).or_panic(what);
    assert_same(&back, data, what);
}

/// A client the cluster blocklists (as another client breaking its lock
/// would, or an operator) has every operation refused for good: the target
/// opens the image again on a new connection. Meanwhile I/O is answered
/// with a status the host retries (DNR clear), if any meets the old
/// connection; then it works again, with
/// the data written before, and the image has a new watcher. A namespace
/// blocklisted while idle reconnects too (its image's watch notices).
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn a_blocklisted_client_reconnects() {
    let _s = serial();
    let img = Image::create("blocklist", 64 * MIB);
    // A client of its own, whose caps the test takes away for a while.
    let client = format!("blocklist-{}", std::process::id());
    let keyring = ceph_conf().with_file_name(format!("ceph.client.{client}.keyring"));
    ceph(&[
        "auth",
        "get-or-create",
        &format!("client.{client}"),
        "mon",
        "profile rbd",
        "osd",
        "profile rbd pool=rbd",
        "-o",
        keyring.to_str().expect("utf-8"),
    ])
    .assert_success("ceph auth get-or-create");
    let _client = Client(client.clone());
    let t = target_as(
        &img.name,
        "",
        "5s",
        &format!(
            "client_id = \"{client}\"\n  keyring = \"{}\"",
            keyring.display()
        ),
    );
    wait_active(&t);
    let mut c = controller(&t, HOST_A);
    let data = Rng::new(6).bytes(64 << 10);
    io(&mut c)
        .write(1, 0, &data, 512, false)
        .or_panic("write before");
    io(&mut c)
        .set_timeout(Duration::from_secs(30))
        .or_panic("queue timeout");
    let before = watchers(&img);
    assert_eq!(before.len(), 1, "one watcher, the target: {before:?}");
    ceph(&["osd", "blocklist", "add", &before[0]]).assert_success("ceph osd blocklist add");
    let _unlist = Blocklisted(before[0].clone());

    let start = Instant::now();
    let mut refused = Vec::new();
    loop {
        let done = io(&mut c)
            .exec(Queue::rw_sqe(nvm::READ, 1, 0, 128), None, 64 << 10)
            .or_panic("a read while the client is blocklisted");
        let st = done.status();
        if st.is_success() && t.log().contains("open again on a new connection") {
            assert_same(&done.data, &data, "read after reconnecting");
            break;
        }
        if !st.is_success() {
            assert!(
                !dnr_of(done.cqe.status)
                    && (st == Status::NAMESPACE_NOT_READY || st == Status::COMMAND_INTERRUPTED),
                "a read while reconnecting answered {st} (DNR {}): not a status the host retries",
                dnr_of(done.cqe.status)
            );
            refused.push(st);
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no new connection within 60 s ({} reads refused)\n{}",
            refused.len(),
            t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Whether a read met the blocklisted connection depends on which of
    // them and the image's watch saw the refusal first.
    assert!(
        t.log().contains("the cluster blocklisted this client"),
        "{}",
        t.log_tail()
    );
    let fresh = Rng::new(7).bytes(64 << 10);
    io(&mut c)
        .write(1, 128, &fresh, 512, true)
        .or_panic("write after reconnecting");
    assert_same(
        &io(&mut c).read(1, 128, 128, 512).or_panic("read back"),
        &fresh,
        "read back after reconnecting",
    );
    let after = watchers(&img);
    assert!(
        after.len() == 1 && after[0] != before[0],
        "the image is watched by a new client: before {before:?}, after {after:?}"
    );
    println!(
        "reconnected after {:?}; {} reads refused meanwhile ({:?})",
        start.elapsed(),
        refused.len(),
        refused.first()
    );

    // Blocklisted while it cannot connect again (its OSD caps revoked
    // first): I/O meets the old connection and is answered with a status
    // the host retries while the target retries; once the caps are back,
    // the namespace reconnects.
    let now = watchers(&img);
    let (name, caps) = (format!("client.{client}"), ["mon", "profile rbd"]);
    ceph(&["auth", "caps", &name, caps[0], caps[1]]).assert_success("ceph auth caps (revoke)");
    ceph(&["osd", "blocklist", "add", &now[0]]).assert_success("ceph osd blocklist add");
    let _unlist3 = Blocklisted(now[0].clone());
    let start = Instant::now();
    let mut refused = Vec::new();
    while refused.len() < 3 {
        let done = io(&mut c)
            .exec(Queue::rw_sqe(nvm::READ, 1, 0, 128), None, 64 << 10)
            .or_panic("a read while the target cannot reconnect");
        let st = done.status();
        if !st.is_success() {
            assert!(
                !dnr_of(done.cqe.status) && st == Status::NAMESPACE_NOT_READY,
                "a read on a blocklisted connection answered {st} (DNR {})",
                dnr_of(done.cqe.status)
            );
            refused.push(st);
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "reads were not refused\n{}",
            t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    ceph(&[
        "auth",
        "caps",
        &name,
        "mon",
        "profile rbd",
        "osd",
        "profile rbd pool=rbd",
    ])
    .assert_success("ceph auth caps (restore)");
    reconnected(&t, 2, &mut c, &fresh, "after the caps came back");

    // Blocklisted while idle: the image's watch notices, and the namespace
    // has a new connection before the next I/O.
    let idle = watchers(&img);
    ceph(&["osd", "blocklist", "add", &idle[0]]).assert_success("ceph osd blocklist add");
    let _unlist2 = Blocklisted(idle[0].clone());
    reconnected(&t, 3, &mut c, &fresh, "blocklisted while idle");
    drop(c);
    stop(t);
}

/// A namespace whose cluster does not answer (its monitor accepts
/// connections and stays silent) does not hold up another cluster's: a
/// namespace added by a reload while the first is connecting (for its 10 s
/// timeout) is active within seconds.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn a_dead_cluster_does_not_hold_up_another() {
    let _s = serial();
    let img = Image::create("alive", 32 * MIB);
    let dir = TempDir::new("rbd-dead");
    let dead_conf = dir.join("dead.conf");
    // A "monitor" that takes connections and never says a word: connecting
    // waits for the whole timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").or_panic("binding a silent port");
    let port = silent.local_addr().or_panic("its address").port();
    let conf = std::fs::read_to_string(ceph_conf()).or_panic("reading ceph.conf");
    let dead: String = conf
        .lines()
        .map(|l| {
            if l.starts_with("mon_host") {
                format!("mon_host = [v2:127.0.0.1:{port}]")
            } else {
                l.to_string()
            }
        })
        .map(|l| l + "\n")
        .collect();
    std::fs::write(&dead_conf, dead).or_panic("writing dead.conf");
    let namespace = |nsid: u32, image: &str, conf: &std::path::Path| {
        format!(
            "  [[subsystem.namespace]]\n  nsid = {nsid}\n  backend = \"rbd\"\n  pool = \"rbd\"\n  \
             image = \"{image}\"\n  ceph_conf = \"{}\"\n  client_id = \"rdmablk\"\n  timeout = \"10s\"\n",
            conf.display()
        )
    };
    let config = |namespaces: &str| {
        format!(
            "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{{port}}\"\n\n\
             [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n{namespaces}"
        )
    };
    let sock = dir.join("control.sock");
    let sock_arg = sock.to_str().expect("utf-8");
    let one = config(&namespace(1, "nowhere", &dead_conf));
    let t = Target::start_config_with(&one, &["--control", sock_arg], None);
    // The first namespace is connecting to the silent monitor now.
    std::thread::sleep(Duration::from_millis(500));
    let two = one + &namespace(2, &img.name, &ceph_conf());
    std::fs::write(
        t.dir().join("target.toml"),
        two.replace("{port}", &t.port().to_string()),
    )
    .or_panic("writing the config");
    let reloaded = Instant::now();
    let mut reload = Command::new(rdmablk_tests::bin_path("rdmablk-target"));
    reload.args(["reload", "--control", sock_arg]);
    run("rdmablk-target reload", &mut reload, TOOL_TIMEOUT).assert_success("reload");
    wait_active(&t);
    let took = reloaded.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the healthy namespace opened {took:?} after the reload, behind the silent cluster\n{}",
        t.log_tail()
    );
    let mut c = controller(&t, HOST_A);
    assert_eq!(active(&c), vec![2], "only the healthy namespace is active");
    let data = Rng::new(8).bytes(4096);
    c.io[0].write(2, 0, &data, 512, false).or_panic("write");
    assert_same(
        &c.io[0].read(2, 0, 8, 512).or_panic("read"),
        &data,
        "read back",
    );
    drop(c);
    drop(silent);
    stop(t);
}

/// An image whose own configuration turns librbd's cache on (`rbd config
/// image set ... rbd_cache true`, which overrides the target's client
/// options) is not served: the namespace would promise durable writes
/// without a volatile write cache. The target says why and how to fix it;
/// once the setting is removed, the namespace opens (the target retries
/// every 5 s).
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn an_image_configured_with_a_cache_is_not_served() {
    let _s = serial();
    let img = Image::create("cached", 32 * MIB);
    rbd(&["config", "image", "set", &img.spec(), "rbd_cache", "true"])
        .assert_success("rbd config image set");
    let t = target(&img.name, "", "20s");
    wait_log(&t, "sets rbd_cache = true");
    assert!(
        t.log().contains("rbd config image rm"),
        "the log says how to fix it\n{}",
        t.log_tail()
    );
    let c = controller(&t, HOST_A);
    assert_eq!(active(&c), Vec::<u32>::new(), "not served with a cache");
    rbd(&["config", "image", "rm", &img.spec(), "rbd_cache"]).assert_success("rbd config image rm");
    wait_active(&t);
    assert_eq!(active(&c), vec![1], "served once the cache is off");
    drop(c);
    stop(t);
}

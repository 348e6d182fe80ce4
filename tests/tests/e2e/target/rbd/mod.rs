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
//! cluster that does not answer holds up no other; a target stopped, or
//! failing to start, while its image opens exits with its own status, not
//! a signal.
//!
//! Each test runs alone (`crate::alone`): they share the cluster's single
//! OSD, which one of them stops.

use rdmablk_common::nvme::identify::{cns, parse_ns_list, NamespaceId};
use rdmablk_common::nvme::{admin, crd_of, dnr_of, feature, nvm, Sqe, Status};
use rdmablk_tests::check::{assert_same, assert_status, open, OrPanic};
use rdmablk_tests::client::{Controller, Opts, Queue};
use rdmablk_tests::events::NS_ATTR_CHANGED;
use rdmablk_tests::names::{HOST_A, HOST_B};
use rdmablk_tests::tools::{bench, check_bench, fio_ok, TOOL_TIMEOUT};
use rdmablk_tests::{run, send_signal, NbdExport, Ran, Rng, Target, TempDir};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod compare_write;
mod failures;
mod gateway;
mod gateway_fio;
mod gateway_group;
mod gateway_resv;
mod io;
mod namespace;
mod partitions;
mod scale;

const NQN: &str = "nqn.2026-11.io.example:rbd";
const MIB: u64 = 1 << 20;
const IMAGE_BYTES: u64 = 128 * MIB;
/// How long an image may take to open once it exists (the target retries
/// every 5 s).
const OPEN_WITHIN: Duration = Duration::from_secs(30);
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

/// `rados -c CONF -p rbd ARGS...` as client.admin.
fn rados(args: &[&str]) -> Ran {
    let mut c = Command::new("rados");
    c.arg("-c").arg(ceph_conf()).args(["-p", "rbd"]).args(args);
    run("rados", &mut c, TOOL_TIMEOUT)
}

/// Takes a client off the cluster's blocklist when dropped.
struct Blocklisted(String);

impl Drop for Blocklisted {
    fn drop(&mut self) {
        let _ = ceph(&["osd", "blocklist", "rm", &self.0]);
    }
}

/// An image made for one test (layering only: without exclusive-lock, two
/// gateways write it without passing a lock back and forth), removed after.
struct Image {
    name: String,
}

impl Image {
    fn create(label: &str, bytes: u64) -> Image {
        Image::create_with(label, bytes, "layering")
    }

    /// An image with the RBD `features` given (comma-separated).
    fn create_with(label: &str, bytes: u64, features: &str) -> Image {
        let name = format!("{label}-{}", std::process::id());
        let size = format!("{}M", bytes / MIB);
        let _ = rbd(&["rm", &format!("rbd/{name}")]);
        rbd(&[
            "create",
            &format!("rbd/{name}"),
            "--size",
            &size,
            "--image-feature",
            features,
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
    Target::start_config(&config(image, subsystem_extra, timeout, ns_extra))
}

/// The configuration [`target_as`] starts a target with; its listener's
/// port is `{port}`.
fn config(image: &str, subsystem_extra: &str, timeout: &str, ns_extra: &str) -> String {
    format!(
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
    )
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

//! rdmablk-target at scale, in the reduced form the suite can afford
//! (`bench/scale.sh` runs the full one and prints its numbers): thousands
//! of namespaces start, are listed, scraped and reloaded, and serve I/O;
//! hundreds of idle hosts keep their controllers while a busy one works,
//! each costing the daemon two descriptors.

use rdmablk_tests::bin_path;
use rdmablk_tests::check::{open, settled_fd_count, OrPanic};
use rdmablk_tests::client::{quiet, Controller};
use rdmablk_tests::control::ControlledTarget;
use rdmablk_tests::events::active_namespaces;
use rdmablk_tests::names::HOST_A;
use rdmablk_tests::tools::{bench, check_bench};
use rdmablk_tests::{fd_count, Target};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PER_SUBSYSTEM: u32 = 1000;

fn nqn(sub: u32) -> String {
    format!("nqn.2026-11.io.rdmablk:scale-{sub}")
}

/// A configuration of `n` memory namespaces of 1 MiB numbered from
/// `first`: namespace `i` is nsid `i % 1000 + 1` of subsystem `i / 1000`.
fn namespaces(first: u32, n: u32) -> String {
    let mut out = String::from(
        "[pollers]\ncount = 1\n\n[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{port}\"\n\n",
    );
    let mut sub = None;
    for i in first..first + n {
        if sub != Some(i / PER_SUBSYSTEM) {
            sub = Some(i / PER_SUBSYSTEM);
            out += &format!(
                "[[subsystem]]\nnqn = \"{}\"\nallow_any_host = true\n\n",
                nqn(i / PER_SUBSYSTEM)
            );
        }
        out += &format!(
            "  [[subsystem.namespace]]\n  nsid = {}\n  backend = \"memory\"\n  size = \"1MiB\"\n\n",
            i % PER_SUBSYSTEM + 1
        );
    }
    out
}

/// Verified I/O on namespace `nsid` of subsystem `sub`.
fn verify_io(t: &Target, sub: u32, nsid: u32) {
    let nsid = nsid.to_string();
    let args = [
        "--nsid",
        &nsid,
        "--rw",
        "randrw",
        "--bs",
        "4k",
        "--qd",
        "4",
        "--runtime",
        "500ms",
        "--verify",
        "--json",
    ];
    let r = bench(t.port(), &nqn(sub), &args);
    check_bench(
        &r,
        4096.0,
        &["read", "write"],
        &format!("I/O on {} nsid {nsid}", nqn(sub)),
    );
}

/// 3,000 namespaces in three subsystems: each subsystem's active
/// namespace list has its thousand, the discovery log its three, `status`
/// and the metrics every one; a reload that removes 300 and adds 300 (in
/// a fourth subsystem) applies, and both old and new namespaces serve
/// verified I/O.
#[test]
fn three_thousand_namespaces_start_list_reload_and_serve() {
    let _machine = crate::shared();
    let started = Instant::now();
    let d = ControlledTarget::start(&namespaces(0, 3 * PER_SUBSYSTEM));
    println!("3000 namespaces: serving after {:.1?}", started.elapsed());
    for sub in 0..3 {
        let c = open(&d.t, &nqn(sub), HOST_A, &quiet());
        let ids = active_namespaces(&c);
        assert_eq!(
            ids,
            (1..=PER_SUBSYSTEM).collect::<Vec<_>>(),
            "active namespace list of {}",
            nqn(sub)
        );
    }
    let entries = Controller::discover(d.t.addr(), HOST_A).or_panic("the discovery log");
    let ours = entries
        .iter()
        .filter(|e| e.subnqn.starts_with("nqn.2026-11.io.rdmablk:scale-"))
        .count();
    assert_eq!(ours, 3, "discovery log entries of the three subsystems");

    let (ok, status, err) = d.run(&["status"]);
    assert!(ok, "status: {err}");
    assert!(
        status.contains(&nqn(2)),
        "status names the last subsystem:\n{}",
        &status[..status.len().min(2000)]
    );

    let t0 = Instant::now();
    let report = d.reload(&namespaces(300, 3 * PER_SUBSYSTEM));
    println!(
        "reload removing 300 namespaces and adding 300: {:.1?}",
        t0.elapsed()
    );
    let removed = report.matches("removed").count();
    assert!(
        removed == 300 && report.contains(&format!("{}: subsystem added", nqn(3))),
        "the reload report says {removed} namespaces removed, and whether {} was added:\n{}",
        nqn(3),
        &report[..report.len().min(2000)]
    );
    let c = open(&d.t, &nqn(3), HOST_A, &quiet());
    assert_eq!(
        active_namespaces(&c),
        (1..=300).collect::<Vec<_>>(),
        "the subsystem the reload added"
    );
    let c = open(&d.t, &nqn(0), HOST_A, &quiet());
    assert_eq!(
        active_namespaces(&c),
        (301..=PER_SUBSYSTEM).collect::<Vec<_>>(),
        "the subsystem the reload took 300 from"
    );
    verify_io(&d.t, 3, 300);
    verify_io(&d.t, 0, 301);
    verify_io(&d.t, 2, PER_SUBSYSTEM);
}

/// `hold_queues`: `count` idle hosts, each an admin and one I/O queue,
/// keep-alives every second; returns once all hold.
fn idle_hosts(t: &Target, count: usize) -> Child {
    let mut child = Command::new(bin_path("hold_queues"))
        .arg(t.addr().to_string())
        .arg(nqn(0))
        .args(["--count", &count.to_string(), "--io-queues", "1"])
        .args([
            "--kato",
            "2s",
            "--hostnqn-prefix",
            "nqn.2026-11.io.rdmablk:idle",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .or_panic("starting hold_queues");
    let out = BufReader::new(child.stdout.take().expect("piped"));
    for line in out.lines() {
        let line = line.or_panic("hold_queues output");
        if line.starts_with("holding") {
            return child;
        }
    }
    let status = child.wait().or_panic("hold_queues");
    panic!("hold_queues ended before holding its {count} hosts: {status}");
}

/// 300 idle hosts on a one-poller daemon: their controllers take two
/// descriptors each; while a busy host does verified I/O, every idle one
/// keeps its association (their keep-alives are answered: `hold_queues`
/// exits on the first that is not), and after it too.
#[test]
fn idle_hosts_keep_their_controllers_while_a_busy_one_works() {
    const IDLE: usize = 300;
    let _machine = crate::alone();
    let t = Target::start_config(&namespaces(0, 1));
    let before = settled_fd_count(t.pid());
    let mut hold = idle_hosts(&t, IDLE);
    let held = fd_count(t.pid());
    assert_eq!(
        held - before,
        2 * IDLE,
        "descriptors of {IDLE} controllers (admin and I/O queue each)"
    );
    let r = bench(
        t.port(),
        &nqn(0),
        &[
            "--rw",
            "randrw",
            "--bs",
            "4k",
            "--qd",
            "16",
            "--runtime",
            "3s",
            "--verify",
            "--json",
        ],
    );
    check_bench(
        &r,
        4096.0,
        &["read", "write"],
        "the busy host among idle ones",
    );
    // Keep-alives go on past the busy host's run (KATO 2 s, sent every 1 s).
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        hold.try_wait().or_panic("hold_queues").is_none(),
        "an idle host lost its association (hold_queues ended)"
    );
    assert_eq!(
        fd_count(t.pid()) - before,
        2 * IDLE,
        "every idle controller is still there"
    );
    let _ = hold.kill();
    let _ = hold.wait();
}

//! On a machine without an RDMA device (this one, and CI's), NVMe/RDMA is
//! refused at once with a message that says what is missing and how to get
//! a software device; never a panic or a hang. The transport itself is
//! exercised over soft-RoCE in the VM suite (tests/vm/scenarios/5*-*.sh).

use rdmablk_common::rdma::device_names;
use rdmablk_tests::{bin_path, run};
use std::process::Command;
use std::time::Duration;

const HINT: &str = "rdma link add rxe0 type rxe netdev";

fn no_device_here() -> bool {
    let names = device_names();
    if !names.is_empty() {
        eprintln!("this machine has RDMA devices {names:?}: nothing to check here");
    }
    names.is_empty()
}

#[test]
fn target_refuses_an_rdma_listener_without_a_device() {
    let _machine = crate::shared();
    if !no_device_here() {
        return;
    }
    let mut c = Command::new(bin_path("rdmablk-target"));
    c.args(["--listen", "rdma://127.0.0.1:4420", "--memory", "64MiB"]);
    let r = run("rdmablk-target", &mut c, Duration::from_secs(20));
    assert_eq!(r.status.code(), Some(1), "{}", r.report());
    assert!(r.stderr.contains("no RDMA device found"), "{}", r.report());
    assert!(r.stderr.contains(HINT), "{}", r.report());
    assert!(!r.stderr.contains("panicked"), "{}", r.report());
}

#[test]
fn host_refuses_rdma_without_a_device() {
    let _machine = crate::shared();
    if !no_device_here() {
        return;
    }
    for sub in [
        vec!["discover"],
        vec!["bench", "-n", "nqn.2026-11.io.rdmablk:x", "--runtime", "1s"],
        vec![
            "connect",
            "-n",
            "nqn.2026-11.io.rdmablk:x",
            "--nbd",
            "unix:/tmp/never.sock",
        ],
    ] {
        let mut c = Command::new(bin_path("rdmablk"));
        c.args(&sub[..1])
            .args(["-t", "rdma", "-a", "127.0.0.1", "-s", "4420"])
            .args(&sub[1..]);
        let r = run("rdmablk", &mut c, Duration::from_secs(20));
        assert!(!r.status.success(), "{}", r.report());
        assert!(r.stderr.contains("no RDMA device found"), "{}", r.report());
        assert!(r.stderr.contains(HINT), "{}", r.report());
        assert!(
            r.elapsed < Duration::from_secs(5),
            "not at once: {}",
            r.report()
        );
    }
}

//! NVMe/RDMA and whether the machine has an RDMA device. Without one (this
//! machine, and CI's), `rdma://` listeners and `-t rdma` are refused at
//! once with a message that says what is missing and how to get a software
//! device; never a panic or a hang. With one, neither the daemon nor the
//! host says there is none: they get past the device check (and may then
//! fail on the loopback address, which no RDMA device serves). The
//! transport itself is exercised over soft-RoCE in the VM suite
//! (tests/vm/scenarios/5*-*.sh).

use rdmablk_common::rdma::device_names;
use rdmablk_tests::{bin_path, run, Proc};
use std::process::Command;
use std::time::Duration;

const HINT: &str = "rdma link add rxe0 type rxe netdev";
const NO_DEVICE: &str = "no RDMA device found";

/// The RDMA devices of this machine, said on stderr so that a run shows
/// which of the two behaviours its tests checked.
fn devices(test: &str) -> Vec<String> {
    let names = device_names();
    if names.is_empty() {
        eprintln!("{test}: no RDMA device here: checking the refusal");
    } else {
        eprintln!("{test}: RDMA devices {names:?}: checking that nothing claims there is none");
    }
    names
}

/// With an RDMA device present: runs `cmd` for up to 5 s (killing it if it
/// still runs, as a listening daemon or a host retrying would) and asserts
/// it did not say there is no device, nor panic.
fn gets_past_the_device_check(name: &str, cmd: &mut Command) {
    let mut p = Proc::spawn(name, cmd);
    if p.wait_timeout(Duration::from_secs(5)).is_none() {
        p.kill();
    }
    let stderr = p.stderr();
    assert!(!stderr.contains(NO_DEVICE), "{}", p.report());
    assert!(!stderr.contains("panicked"), "{}", p.report());
}

#[test]
fn target_refuses_an_rdma_listener_without_a_device() {
    let _machine = crate::shared();
    let mut c = Command::new(bin_path("rdmablk-target"));
    c.args(["--listen", "rdma://127.0.0.1:4420", "--memory", "64MiB"]);
    if devices("target_refuses_an_rdma_listener_without_a_device").is_empty() {
        let r = run("rdmablk-target", &mut c, Duration::from_secs(20));
        assert_eq!(r.status.code(), Some(1), "{}", r.report());
        assert!(r.stderr.contains(NO_DEVICE), "{}", r.report());
        assert!(r.stderr.contains(HINT), "{}", r.report());
        assert!(!r.stderr.contains("panicked"), "{}", r.report());
    } else {
        gets_past_the_device_check("rdmablk-target", &mut c);
    }
}

#[test]
fn host_refuses_rdma_without_a_device() {
    let _machine = crate::shared();
    let device_here = !devices("host_refuses_rdma_without_a_device").is_empty();
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
        if device_here {
            gets_past_the_device_check("rdmablk", &mut c);
        } else {
            let r = run("rdmablk", &mut c, Duration::from_secs(20));
            assert!(!r.status.success(), "{}", r.report());
            assert!(r.stderr.contains(NO_DEVICE), "{}", r.report());
            assert!(r.stderr.contains(HINT), "{}", r.report());
            assert!(
                r.elapsed < Duration::from_secs(5),
                "not at once: {}",
                r.report()
            );
        }
    }
}

//! `connect --ublk` and whether the kernel has ublk. Without it (this
//! machine's kernel, and CI's), it fails at once, before connecting, with a
//! message that names the module to load and the NBD alternative, and
//! nothing else on stderr. With it, the message is not given: the host gets
//! past the check (and fails to connect, as nothing listens). The
//! front-end itself runs in the VM suite (tests/vm/scenarios/8*-*.sh).

use rdmablk_tests::{bin_path, free_port, rdmablk_command, run, Proc};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const UBLK_CONTROL: &str = "/dev/ublk-control";

#[test]
fn ublk_without_the_driver_fails_at_once() {
    let _machine = crate::shared();
    // Nothing listens on the port: without ublk, the ublk check must come first.
    let mut c = rdmablk_command("connect", free_port(), "nqn.2026-11.io.rdmablk:x");
    c.args(["--ublk", "--ublk-id", "0"]);
    if Path::new(UBLK_CONTROL).exists() {
        eprintln!(
            "ublk_without_the_driver_fails_at_once: this kernel has ublk: \
             checking that connect --ublk gets past the check"
        );
        let mut p = Proc::spawn("rdmablk", &mut c);
        if p.wait_timeout(Duration::from_secs(10)).is_none() {
            p.kill();
        }
        let status = p.exit_status().expect("killed or exited");
        assert!(!status.success(), "nothing listens: {}", p.report());
        assert!(!p.stderr().contains("modprobe ublk_drv"), "{}", p.report());
        assert!(!p.stderr().contains("panicked"), "{}", p.report());
    } else {
        eprintln!("ublk_without_the_driver_fails_at_once: no {UBLK_CONTROL}: checking the refusal");
        let r = run("rdmablk", &mut c, Duration::from_secs(20));
        assert_eq!(r.status.code(), Some(1), "{}", r.report());
        assert!(r.stderr.contains("modprobe ublk_drv"), "{}", r.report());
        assert!(r.stderr.contains("--nbd"), "{}", r.report());
        assert!(!r.stderr.contains("connection refused"), "{}", r.report());
        assert_eq!(
            r.stderr.lines().count(),
            1,
            "one line, no library noise: {}",
            r.report()
        );
        assert!(
            r.elapsed < Duration::from_secs(2),
            "not at once: {}",
            r.report()
        );
    }
}

#[test]
fn ublk_and_nbd_exclude_each_other() {
    let _machine = crate::shared();
    let mut c = Command::new(bin_path("rdmablk"));
    c.args([
        "connect",
        "-a",
        "127.0.0.1",
        "-n",
        "nqn.2026-11.io.rdmablk:x",
    ])
    .args(["--ublk", "--nbd", "unix:/tmp/never.sock"]);
    let r = run("rdmablk", &mut c, Duration::from_secs(20));
    assert_eq!(r.status.code(), Some(2), "{}", r.report());
    assert!(r.stderr.contains("cannot be used with"), "{}", r.report());
    let mut c = Command::new(bin_path("rdmablk"));
    c.args([
        "connect",
        "-a",
        "127.0.0.1",
        "-n",
        "nqn.2026-11.io.rdmablk:x",
    ]);
    let r = run("rdmablk", &mut c, Duration::from_secs(20));
    assert_eq!(
        r.status.code(),
        Some(2),
        "neither front-end: {}",
        r.report()
    );
}

//! The host side — `rdmablk connect --nbd`, `rdmablk discover`, `rdmablk
//! bench` — against a real `rdmablk-target` on loopback, driven by clients we
//! did not write: nbdinfo, qemu-io, nbdcopy, fio's nbd engine, and nbdfuse +
//! losetup + mkfs.ext4 + mount.
//!
//! Each test starts its own daemon on a free port. Each runs alone
//! (`crate::alone`) so that benchmarks and copies do not compete for the
//! machine's cores with the tests that time an exit. A failing test prints the daemon's log tail
//! and the output of every process it still holds.

use rdmablk_tests::cmdline::{rdmablk_command, tcp_target_args};
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
use std::sync::Arc;
use std::time::{Duration, Instant};

mod bench;
mod clients;
mod discover;
mod lifecycle;

const MIB: usize = 1 << 20;
/// The export's advertised maximum block size.
const MAX_BLOCK: u64 = 2 << 20;
/// What the contract allows `connect` to give up, or to exit after a signal.
const EXIT_WITHIN: Duration = Duration::from_secs(5);

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

fn nbdcopy(args: &[&str], what: &str) {
    run("nbdcopy", &mut cmd("nbdcopy", args), TOOL_TIMEOUT).assert_success(what);
}

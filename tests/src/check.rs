//! Assertions and small steps the end-to-end tests of the target share:
//! unwrapping with the step's name, opening a controller, comparing
//! statuses on (SCT, SC), comparing data without dumping it, and the
//! daemon's descriptor count once it settles.

use crate::client::{Completion, Controller, Opts};
use crate::{fd_count, Target};
use rdmablk_common::nvme::{Cqe, Status};
use std::fmt::Display;
use std::io;
use std::time::{Duration, Instant};

/// Unwraps with a message naming the step; the daemon's log tail follows
/// when the `Target` drops during the panic.
pub trait OrPanic<T> {
    fn or_panic(self, what: impl Display) -> T;
}

impl<T> OrPanic<T> for io::Result<T> {
    fn or_panic(self, what: impl Display) -> T {
        self.unwrap_or_else(|e| panic!("{what}: {e}"))
    }
}

/// An enabled controller of `nqn` for `host`, with `opts`.
pub fn open(t: &Target, nqn: &str, host: &str, opts: &Opts) -> Controller {
    Controller::open(t.addr(), nqn, host, opts).or_panic(format_args!("opening {nqn} as {host}"))
}

/// Status code type and code (DNR and CRD are checked where they matter).
pub fn sct_sc(s: Status) -> (u8, u8) {
    (s.sct, s.sc)
}

/// Asserts a completion's status on (SCT, SC).
pub fn assert_status(c: &Completion, want: Status, what: &str) {
    assert_cqe_status(&c.cqe, want, what);
}

/// Asserts a CQE's status on (SCT, SC); the message shows the whole field.
pub fn assert_cqe_status(cqe: &Cqe, want: Status, what: &str) {
    assert_eq!(
        sct_sc(cqe.status()),
        sct_sc(want),
        "{what}: got {} (status field {:#06x}), want {want}",
        cqe.status(),
        cqe.status
    );
}

/// Compares without dumping megabytes: names the first differing byte.
pub fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {i} (512-byte sector {}): got {:#04x}, want {:#04x}",
            i / 512,
            got[i],
            want[i]
        );
    }
}

/// Asserts every byte is zero.
pub fn assert_zero(got: &[u8], what: &str) {
    if let Some(i) = got.iter().position(|&b| b != 0) {
        panic!("{what}: byte {i} is {:#04x}, want zero", got[i]);
    }
}

/// The daemon's descriptor count once it stops changing (up to 2 s).
pub fn settled_fd_count(pid: u32) -> usize {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut last = fd_count(pid);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = fd_count(pid);
        if now == last || Instant::now() >= deadline {
            return now;
        }
        last = now;
    }
}

/// Polls `cond` every 20 ms until it holds; panics naming `what` (waited
/// for) if `timeout` passes first.
#[track_caller]
pub fn wait_until(timeout: Duration, what: impl Display, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "gave up after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

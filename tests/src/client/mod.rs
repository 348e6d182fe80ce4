//! A small blocking NVMe/TCP host for tests, built only from `rdmablk_common`.
//!
//! It does what the Linux host does on the wire (ICReq, Connect, property
//! handshake, in-capsule or R2T-driven writes, C2HData reads) and is strict
//! about what it receives: anything a real host would choke on is an error
//! whose message says what was wrong. Errors are `io::Error`s; a TermReq from
//! the target is one too, and [`term_req_of`] recovers its FES and FEI.

mod commands;
mod controller;
mod queue;

pub use controller::{quiet, Controller, Opts};
pub use queue::Queue;

use rdmablk_common::nvme::{Cqe, Status};
use std::io;
use std::time::Duration;

/// How long a read may block before the test fails instead of hanging.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// In-capsule data limit used until the controller's IOCCSZ is known; the
/// Linux host's admin queue uses the same 8 KiB.
pub const DEFAULT_IN_CAPSULE: u32 = 8192;
/// A finished command.
#[derive(Clone, Debug)]
pub struct Completion {
    pub cid: u16,
    pub cqe: Cqe,
    /// Data the controller sent (C2HData), `data_in_len` bytes.
    pub data: Vec<u8>,
    /// The command completed with a C2HData PDU flagged SUCCESS (NVMe/TCP
    /// 1.0, 3.6.2.9) rather than a CapsuleResp; `cqe` is then synthesized
    /// (success, SQHD 0).
    pub success_in_data: bool,
}

impl Completion {
    pub fn status(&self) -> Status {
        self.cqe.status()
    }

    /// The completion, or an error naming `what` and the status if it failed.
    pub fn check(self, what: &str) -> io::Result<Completion> {
        if self.status().is_success() {
            Ok(self)
        } else {
            Err(other(format!("{what} failed: {}", self.status())))
        }
    }
}

/// Counters of what went over the wire, for tests that assert on the path taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Commands whose data went in the capsule.
    pub in_capsule_writes: u64,
    pub r2ts: u64,
    pub h2c_pdus: u64,
    pub c2h_pdus: u64,
    /// Largest DATAL of any C2HData seen.
    pub c2h_max_len: u32,
}

/// The FES and FEI of a TermReq the target sent, carried inside the `io::Error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TermReq {
    pub fes: u16,
    pub fei: u32,
}

impl std::fmt::Display for TermReq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.fes {
            1 => "Invalid PDU Header Field",
            2 => "PDU Sequence Error",
            3 => "Header Digest Error",
            4 => "Data Transfer Out of Range",
            5 => "R2T Limit Exceeded",
            6 => "Unsupported Parameter",
            _ => "unknown FES",
        };
        write!(
            f,
            "target sent C2HTermReq: FES {:#x} ({name}), FEI {}",
            self.fes, self.fei
        )
    }
}

impl std::error::Error for TermReq {}

/// The TermReq inside an error from [`Queue`], if that is what it was.
pub fn term_req_of(e: &io::Error) -> Option<TermReq> {
    e.get_ref()?.downcast_ref::<TermReq>().copied()
}

fn other(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

//! `rdmablk-target` against the letter of the NVMe specifications, over
//! NVMe/TCP on loopback with the test host in `rdmablk_tests::client`.
//! Each test names the section it checks (NVMe Base 2.1 unless stated);
//! each runs its own daemon, and a failing test prints the daemon's log tail.

use rdmablk_common::bytes::get_u16;
use rdmablk_common::fabrics::{cattr, fctype, PropertyCmd, DISCOVERY_NQN};
use rdmablk_common::nvme::identify::{cns, IndependentNamespaceId, NamespaceId, NvmControllerId};
use rdmablk_common::nvme::log::lid;
use rdmablk_common::nvme::{
    admin, crd_of, dnr_of, feature, nvm, property, Cqe, Sgl, Sqe, Status, FABRICS_OPCODE,
};
use rdmablk_common::tcp::{encode, flags, Digests, Header, Transfer};
use rdmablk_tests::check::{
    assert_cqe_status, assert_same, assert_status, assert_zero, open, sct_sc, OrPanic,
};
use rdmablk_tests::client::{quiet, Completion, Controller, Opts, Queue};
use rdmablk_tests::names::{DEFAULT_NQN, HOST_A, HOST_B, OPEN_NQN, PRIVATE_NQN};
use rdmablk_tests::open_subsystem_config;
use rdmablk_tests::{two_subsystems_config, Rng, Target};
use std::io;
use std::time::{Duration, Instant};

mod claims;
mod commands;
mod controller;
mod flow_control;
mod retry;

const NSID: u32 = 1;
const KIB: usize = 1 << 10;
const BOTH_DIGESTS: Digests = Digests {
    header: true,
    data: true,
};
/// CC with EN and the I/O queue entry sizes (64-byte SQEs, 16-byte CQEs).
const CC_ENABLE: u32 = property::CC_EN | 6 << 16 | 4 << 20;
const SHST_MASK: u32 = 3 << property::CSTS_SHST_SHIFT;
/// Connect CATTR bit 2: disable SQ flow control.
/// Host Behavior Support data length.
const HBS_LEN: usize = 512;

/// Options for a host that sends no Keep Alive but has a KATO long enough
/// for any test (the keep-alive thread would stop at the first failing
/// Keep Alive, e.g. while the controller is disabled).
fn quiet_opts() -> Opts {
    Opts {
        kato_ms: 60_000,
        auto_keep_alive: false,
        ..Opts::default()
    }
}

/// [`quiet_opts`] with header and data digests on every queue.
fn digest_opts() -> Opts {
    Opts {
        digests: BOTH_DIGESTS,
        ..quiet_opts()
    }
}

/// Options for a discovery host: no I/O queue, KATO 0, no Keep Alive.
fn discovery_opts() -> Opts {
    Opts {
        io_queues: 0,
        ..quiet()
    }
}

/// A Fabrics Disconnect command (FCTYPE 08h).
fn disconnect_sqe() -> Sqe {
    let mut s = Sqe::new(FABRICS_OPCODE, 0);
    s.0[4] = fctype::DISCONNECT;
    s
}

fn property_get_sqe(offset: u32, wide: bool) -> Sqe {
    PropertyCmd {
        wide,
        offset,
        value: 0,
    }
    .to_sqe(0, false)
}

fn property_set_sqe(offset: u32, value: u32) -> Sqe {
    PropertyCmd {
        wide: false,
        offset,
        value: value as u64,
    }
    .to_sqe(0, true)
}

/// Polls CSTS until `done(csts)` (≤ 5 s); returns the last value read.
fn poll_csts(admin: &mut Queue, what: &str, done: impl Fn(u32) -> bool) -> u32 {
    let start = Instant::now();
    loop {
        let csts = admin
            .prop_get(property::CSTS, false)
            .or_panic(format_args!("Property Get CSTS ({what})")) as u32;
        if done(csts) || start.elapsed() > Duration::from_secs(5) {
            return csts;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether an error from the host means the target closed the connection.
fn is_closed_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// A fresh TCP connection that connects I/O queue `qid` of controller
/// `cntlid` (the caller checks the completion).
fn connect_io_queue(
    t: &Target,
    qid: u16,
    host: &str,
    opts: &Opts,
    cntlid: u16,
) -> (Queue, Completion) {
    let mut q = Queue::connect(t.addr(), opts.digests).or_panic("new I/O queue connection");
    let c = q
        .fabrics_connect_full(
            qid,
            opts.sqsize,
            0,
            opts.cattr,
            DEFAULT_NQN,
            host,
            opts.hostid,
            cntlid,
        )
        .or_panic(format_args!("I/O queue {qid} Connect"));
    q.set_in_capsule_limit(8192);
    (q, c)
}

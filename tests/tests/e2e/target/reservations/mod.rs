//! Reservations (NVMe Base 2.1, 8.1.22, with the commands of 7.5 to 7.8:
//! Reservation Acquire, Register, Release and Report) against a running
//! daemon: what each reservation type lets the holder, the other registrants
//! and everyone else do (Figure "Command Behavior in the Presence of a
//! Reservation"), the key rules of Register, Acquire and Release, the
//! Reservation Status data structure, the Reservation Notification log page
//! (80h) and its asynchronous event, Preempt and Abort of a write whose data
//! has not arrived yet, and Persist Through Power Loss across a `kill -9`.
//!
//! The hosts are distinct: each its own host NQN and 128-bit host identifier
//! (what a registration belongs to: every controller of a host shares it).
//! The command fields and data structures are encoded and parsed here from
//! the specification, not with the target's code; every daemon keeps its
//! PTPL state files in a temporary directory.
//!
//! The protocol side (hosts, commands, data structures) is
//! `rdmablk_tests::reservation`; here are the daemons these tests start and
//! the steps they share.

use rdmablk_common::bytes::get_u16;
use rdmablk_common::nvme::identify::cns;
use rdmablk_common::nvme::{dnr_of, feature, nvm, Sqe, Status};
use rdmablk_tests::check::{assert_same, assert_status, OrPanic};
use rdmablk_tests::client::{Completion, Controller, Queue};
use rdmablk_tests::events::{flush_events, submit_aer};
use rdmablk_tests::names::{DEFAULT_NQN, OPEN_NQN};
use rdmablk_tests::reservation::*;
use rdmablk_tests::{Rng, Target, TempDir};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The block size of the namespaces these tests make.
const BS: u32 = 512;

mod access;
mod notices;
mod preempt_abort;
mod ptpl;
mod registration;

/// A controller of [`DEFAULT_NQN`] for `h` at `t`, one I/O queue, no Keep Alive.
fn open_as(t: &Target, h: &Host) -> Controller {
    open_nqn(t, DEFAULT_NQN, h)
}

/// Get Features `fid` of namespace [`NSID`] on `c` (`what`, for messages),
/// which must succeed: completion dword 0.
fn namespace_feature(c: &Controller, fid: u8, what: &str) -> u32 {
    let done = c.admin().get_features_ns(fid, NSID).or_panic(what);
    assert_status(&done, Status::SUCCESS, what);
    done.cqe.dw0
}

/// The controller's one I/O queue.
fn io(c: &mut Controller) -> &mut Queue {
    &mut c.io[0]
}

// ---- daemons -----------------------------------------------------------------

/// A configuration: PTPL state files in `state`, one subsystem
/// ([`DEFAULT_NQN`], any host) with `namespaces` (the keys of each).
fn config(state: &Path, namespaces: &[&str]) -> String {
    let mut s = format!(
        "[reservations]\nstate_directory = \"{}\"\n\n\
         [[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{{port}}\"\n\n\
         [[subsystem]]\nnqn = \"{DEFAULT_NQN}\"\nallow_any_host = true\n",
        state.display()
    );
    for ns in namespaces {
        let _ = write!(s, "\n  [[subsystem.namespace]]\n{ns}\n");
    }
    s
}

const MEMORY_NS: &str = "  backend = \"memory\"\n  size = \"16MiB\"";

/// A daemon with [`config`] and the directory of its PTPL state files
/// (kept until the daemon is gone).
struct PtplTarget {
    t: Target,
    _state: TempDir,
}

fn start(namespaces: &[&str]) -> PtplTarget {
    let state = TempDir::new("resv-state");
    let t = Target::start_config(&config(state.path(), namespaces));
    PtplTarget { t, _state: state }
}

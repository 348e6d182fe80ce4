//! End-to-end tests: real `rdmablk-target` and `rdmablk` processes (found by
//! `rdmablk_tests::bin_path`), driven over real sockets, one module per area:
//! [`target`] for the daemon, [`host`] for the host's front-ends, and
//! [`rdma_unavailable`] for both with and without an RDMA device.
//!
//! All of them run in this one process, in parallel threads. A test that
//! times the daemon or loads the machine (benchmarks, floods, a shared Ceph
//! OSD) takes [`alone`]; every other test takes [`shared`], so none runs
//! beside the first kind.

mod host;
mod rdma_unavailable;
mod target;

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Held shared by every test, and exclusively by those that run alone.
static MACHINE: RwLock<()> = RwLock::new(());

/// Waits until no other test runs, and keeps them out until dropped. A test
/// that panicked holding it does not block the others.
fn alone() -> RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(PoisonError::into_inner)
}

/// Waits while a test runs [`alone`], and keeps such tests out until
/// dropped; tests holding it run beside each other.
fn shared() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(PoisonError::into_inner)
}

//! The signals that stop rdmablk (SIGINT, SIGTERM), taken with a deadline.

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use std::os::fd::AsFd;
use std::time::Duration;

/// SIGINT and SIGTERM.
pub fn stop_set() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set
}

/// Takes SIGINT/SIGTERM, which the caller has blocked (see [`stop_set`]).
pub struct StopSignals(SignalFd);

impl StopSignals {
    /// A reader of the blocked stop signals.
    pub fn new() -> Result<Self, String> {
        let flags = SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC;
        SignalFd::with_flags(&stop_set(), flags)
            .map(Self)
            .map_err(|e| format!("signalfd: {e}"))
    }

    /// Waits up to `timeout` for a stop signal and takes it; its number, or
    /// `None` when none came.
    pub fn wait(&self, timeout: Duration) -> Option<u32> {
        let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, timeout).ok()? == 0 {
            return None;
        }
        self.0.read_signal().ok().flatten().map(|s| s.ssi_signo)
    }
}

//! Why the daemon could not start, or could not stop cleanly.

use std::io;

/// A failure of the daemon as a whole (a host's mistakes are NVMe statuses
/// and logged refusals, never these).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A namespace's backend could not be opened.
    #[error("{key} ({nqn}): {source}")]
    Namespace {
        key: String,
        nqn: String,
        source: io::Error,
    },
    /// A listener could not be set up.
    #[error("cannot listen on {url}: {source}{hint}")]
    Listen {
        url: String,
        source: io::Error,
        /// What to check, when there is something to say.
        hint: &'static str,
    },
    /// The RDMA device of a listener is iWARP.
    #[error("{url} is on iWARP device {device}: iWARP is not supported (use RoCE or InfiniBand, e.g. soft-RoCE rxe)")]
    Iwarp { url: String, device: String },
    /// A thread or resource of the daemon could not be started.
    #[error("starting {what}: {source}")]
    Start {
        what: &'static str,
        source: io::Error,
    },
    /// The open files limit is below what the configuration needs.
    #[error(
        "the configuration needs {needed} open files (limits.connections, twice \
         limits.pending_connections, the namespaces, the pollers): the limit cannot be raised \
         to that ({source}); raise the hard limit (LimitNOFILE= in the unit, ulimit -Hn) or \
         lower [limits]"
    )]
    OpenFiles { needed: u64, source: io::Error },
    /// Signal handling failed.
    #[error("{what}: {source}")]
    Signals {
        what: &'static str,
        source: nix::Error,
    },
    /// Storage did not answer operations in flight at shutdown.
    #[error(
        "stopped with {queues} queue(s) whose storage operations never ended (a hung disk or \
         cluster); they were left in flight, and no namespace was flushed or closed; a gateway \
         group's other gateways fence this one before they take its groups"
    )]
    Undrained { queues: usize },
    /// Namespaces were not flushed and closed in time at shutdown.
    #[error(
        "stopped with {namespaces} namespace(s) not flushed and closed within {within:?} (their \
         storage does not answer: a hung disk, a full or unreachable cluster); what RBD images \
         acknowledged was durable already, and {clients} cluster client(s) of this process were \
         blocklisted for a minute so that their watches end now"
    )]
    Unclosed {
        namespaces: usize,
        within: std::time::Duration,
        clients: usize,
    },
    /// A namespace could not be flushed at shutdown.
    #[error("flushing {nqn} namespace {nsid}: {source}")]
    Flush {
        nqn: String,
        nsid: u32,
        source: io::Error,
    },
}

/// `map_err` helper: the context of a failed start.
pub fn starting(what: &'static str) -> impl FnOnce(io::Error) -> DaemonError {
    move |source| DaemonError::Start { what, source }
}

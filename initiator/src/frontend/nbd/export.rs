//! Serving a namespace as an NBD export: the listening socket, handshakes,
//! the engine threads, and an orderly end on SIGINT/SIGTERM.

use super::driver::{ExportInfo, NbdDriver};
use super::greeter::{set_nonblocking, Accept, Greeter};
use super::handoff::NewClient;
use super::handshake::Export;
use super::proto::flags;
use crate::frontend::keeper::{EngineSpec, Engines, Keeper, Until};
use crate::host::engine::Waker;
use crate::host::Attachment;
use nix::sys::socket::{shutdown, Shutdown};
use rdmablk_common::nvme::identify::oncs;
use rdmablk_common::spin::PollMode;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

/// Largest NBD request served in one piece.
const MAX_BLOCK: u32 = 2 << 20;

/// Where the export listens.
#[derive(Clone, Debug)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Listen, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("unix: needs a socket path, e.g. unix:/run/rdmablk/disk0.sock".into());
            }
            Ok(Listen::Unix(PathBuf::from(p)))
        } else if let Some(a) = s.strip_prefix("tcp:") {
            use std::net::ToSocketAddrs;
            a.to_socket_addrs()
                .map_err(|e| format!("{a}: {e}"))?
                .next()
                .map(Listen::Tcp)
                .ok_or_else(|| format!("{a}: no address"))
        } else {
            Err(format!("{s:?}: use unix:PATH or tcp:HOST:PORT"))
        }
    }
}

impl Listen {
    /// The NBD URI clients use.
    pub fn uri(&self) -> String {
        match self {
            Listen::Unix(p) => format!("nbd+unix:///?socket={}", p.display()),
            Listen::Tcp(a) => format!("nbd://{a}/"),
        }
    }
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    fn bind(l: &Listen) -> Result<Listener, String> {
        match l {
            Listen::Unix(p) => {
                if p.exists() {
                    // A socket nobody answers on is a leftover of a crash.
                    if std::os::unix::net::UnixStream::connect(p).is_ok() {
                        return Err(format!("{} is in use by another NBD server", p.display()));
                    }
                    std::fs::remove_file(p)
                        .map_err(|e| format!("removing stale {}: {e}", p.display()))?;
                }
                if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| format!("creating {}: {e}", dir.display()))?;
                }
                UnixListener::bind(p)
                    .map(Listener::Unix)
                    .map_err(|e| format!("listening on {}: {e}", p.display()))
            }
            Listen::Tcp(a) => TcpListener::bind(a)
                .map(Listener::Tcp)
                .map_err(|e| format!("listening on {a}: {e}")),
        }
    }
}

impl Accept for Listener {
    fn listening(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Listener::Unix(l) => l.as_fd(),
            Listener::Tcp(l) => l.as_fd(),
        }
    }

    fn accept_one(&self) -> std::io::Result<Option<(OwnedFd, String, bool)>> {
        let r = match self {
            Listener::Unix(l) => l
                .accept()
                .map(|(s, _)| (OwnedFd::from(s), "unix".to_string(), false)),
            Listener::Tcp(l) => l
                .accept()
                .map(|(s, a)| (OwnedFd::from(s), a.to_string(), true)),
        };
        match r {
            Ok((fd, peer, tcp)) => {
                set_nonblocking(&fd, true)?;
                Ok(Some((fd, peer, tcp)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The transmission flags this export supports for a namespace whose
/// paths support the optional commands `oncs`.
fn export_flags(oncs: u16) -> u16 {
    let mut f = flags::SEND_FLUSH | flags::SEND_FUA | flags::CAN_MULTI_CONN;
    if oncs & oncs::DSM != 0 {
        f |= flags::SEND_TRIM;
    }
    if oncs & oncs::WRITE_ZEROES != 0 {
        f |= flags::SEND_WRITE_ZEROES;
    }
    f
}

/// Serves the namespace of `att` at `listen` until SIGINT/SIGTERM, over
/// all its paths. A lost association is re-established with backoff, I/O
/// going on through the other paths or waiting, until no path has been
/// usable for `ctrl_loss_tmo`; then waiting I/O fails and this returns an
/// error. Signals must be blocked in all threads (the caller blocks them
/// before connecting).
pub fn serve(
    att: Attachment,
    listen: &Listen,
    queues: u16,
    ctrl_loss_tmo: Duration,
    max_clients: usize,
    poll: PollMode,
) -> Result<(), String> {
    let ns = att.ns;
    let subnqn = att.subnqn().to_string();
    let export = Export {
        name: subnqn.clone(),
        description: format!("rdmablk: namespace {} of {subnqn}", ns.nsid),
        size: ns.size_bytes(),
        min_block: 512,
        preferred_block: ns.block_size.max(512),
        max_block: MAX_BLOCK,
        read_only: ns.read_only,
        flags: export_flags(att.oncs()),
    };
    let info = ExportInfo {
        ns,
        max_block: MAX_BLOCK,
        max_transfer: att.max_transfer(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let give_up = Arc::new(AtomicBool::new(false));
    let mut clients: Vec<(Sender<NewClient>, Waker)> = Vec::new();
    let n = att.io_queues().min(queues).max(1);
    let arena = (att.queue_size() as usize * (4 << 20)).clamp(16 << 20, 256 << 20);
    let mut keeper = Keeper::new(att, ctrl_loss_tmo);
    let spec = EngineSpec {
        queues: n,
        arena_bytes: arena,
        name: "nbd",
        poll,
    };
    let engines = Engines::spawn(&keeper, spec, |_, waker| {
        let (tx, rx) = mpsc::channel();
        clients.push((tx, waker));
        Ok(NbdDriver::new(info, rx, stop.clone(), give_up.clone()))
    })?;
    // Every client and handshake is a descriptor.
    if let Err(e) = rdmablk_common::usage::raise_open_files_limit() {
        tracing::warn!("cannot raise the open files limit: {e}");
    }
    let listener = Arc::new(Listener::bind(listen)?);
    set_nonblocking(&listener.listening(), true)
        .map_err(|e| format!("listening on {}: {e}", listen.uri()))?;
    println!("ready: {}", listen.uri());
    use std::io::Write;
    let _ = std::io::stdout().flush();
    tracing::info!(export = %listen.uri(), size = ns.size_bytes(), queues = n, max_clients, "NBD export ready");
    keeper.publish(&listen.uri());

    let acceptor = {
        let listener = listener.clone();
        let greeter = Greeter {
            export: Arc::new(export),
            engines: clients,
            max_clients,
            stop: stop.clone(),
        };
        std::thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || greeter.run(&*listener))
            .map_err(|e| e.to_string())?
    };

    let outcome = keeper.watch(&engines, Until::Signal("closing the NBD export"));
    if outcome.result.is_err() {
        give_up.store(true, Ordering::Release);
    }
    stop.store(true, Ordering::Release);
    engines.wake_all();
    // Shutting down our own listening socket wakes the greeter's poll.
    let _ = shutdown(listener.listening().as_raw_fd(), Shutdown::Both);
    let _ = acceptor.join();
    let failure = outcome.result.err().or(engines.join().0);
    if let Listen::Unix(p) = listen {
        let _ = std::fs::remove_file(p);
    }
    for s in outcome.sessions {
        if let Err(e) = s.shutdown() {
            tracing::warn!("controller shutdown: {e}");
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

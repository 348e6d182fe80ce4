//! Accepting NVMe/TCP connections and handing them to the pollers; on a
//! TLS listener, each connection's handshake first runs on a thread of its
//! own (off the pollers, as DH-HMAC-CHAP's DH does), within
//! `limits.handshake_timeout`, at most `limits.tls_handshakes` at once.

use crate::base::admission::{HangUp, Permit, Silent};
use crate::config::ListenerTls;
use crate::nvme::port::TlsPeer;
use crate::nvme::subsystem::Registry;
use crate::service::ana::AnaStates;
use crate::transport::Listen;
use nix::sys::socket::Shutdown;
use rdmablk_common::fabrics::DISCOVERY_NQN;
use rdmablk_common::tcp::stream::Records;
use rdmablk_common::tls::handshake::{self, HandshakeError};
use rdmablk_common::tls::key::{Identity, TlsPsk};
use rdmablk_common::tls::{ktls, Engine, Session};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A connection accepted, on its way to a poller.
pub(super) struct Accepted {
    /// Until it speaks (its ICReq, or a TLS handshake done: a flood cannot
    /// do one without a key), a newcomer may push it out. Before `sock`:
    /// dropped first, so that its hang-up never names a closed descriptor.
    pub(super) silent: Option<Silent>,
    pub(super) sock: TcpStream,
    pub(super) peer: SocketAddr,
    /// Its place among connections waiting for their Connect.
    pub(super) pending: Permit,
    /// The ANA states of the listener that accepted it.
    pub(super) ana: Arc<AnaStates>,
    /// Once its TLS handshake is done: its records when TLS stays in user
    /// space (none with kernel TLS), and who its identity names.
    pub(super) tls: Option<(Option<Box<Records>>, Arc<TlsPeer>)>,
}

/// Accepts connections on `listener` until `l.stop`, handing them to the
/// pollers round robin.
pub(super) fn accept_loop(listener: TcpListener, l: Listen) {
    let l = Arc::new(l);
    let next = Arc::new(AtomicUsize::new(0));
    loop {
        let accepted = listener.accept();
        if l.stop.load(Ordering::Acquire) {
            tracing::info!("stopped listening on tcp://{}", l.addr);
            return;
        }
        match accepted {
            Ok((sock, peer)) => {
                // The descriptor is open while the hang-up is armed: the
                // connection disarms it before closing it (`Silent`).
                let fd = sock.as_raw_fd();
                let hang_up: HangUp = Box::new(move || {
                    let _ = nix::sys::socket::shutdown(fd, Shutdown::Both);
                });
                // Past limits.pending_connections, it takes the place of one
                // that has been silent; with none, the socket is closed at once.
                let admission = &l.registry.admission;
                let Some((pending, silent)) = admission.new_connection(&peer, hang_up) else {
                    continue;
                };
                let conn = Accepted {
                    silent: Some(silent),
                    sock,
                    peer,
                    pending,
                    ana: l.ana.clone(),
                    tls: None,
                };
                match l.tls.get() {
                    ListenerTls::Off => hand(&l, &next, conn),
                    mode => start_handshake(&l, &next, conn, mode),
                }
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Hands a connection to the next poller.
fn hand(l: &Listen, next: &AtomicUsize, conn: Accepted) {
    let i = next.fetch_add(1, Ordering::Relaxed);
    l.pollers[i % l.pollers.len()].adopt(l.ep, Box::new(conn));
}

/// Runs a connection's TLS handshake on a thread of its own, then hands it
/// to a poller; a failure closes it, logged with the peer and the reason.
fn start_handshake(l: &Arc<Listen>, next: &Arc<AtomicUsize>, conn: Accepted, mode: ListenerTls) {
    let admission = &l.registry.admission;
    // Past limits.tls_handshakes the socket is closed at once.
    let Some(permit) = admission.tls_handshake(&conn.peer) else {
        return;
    };
    let deadline = Instant::now() + admission.limits.handshake_timeout;
    let (l, next) = (l.clone(), next.clone());
    let peer = conn.peer;
    let spawned = std::thread::Builder::new()
        .name("tls-handshake".into())
        .spawn(move || {
            let _permit = permit;
            match secure(conn, mode, &l.registry, deadline) {
                Ok(conn) => hand(&l, &next, conn),
                Err(Failure::Refused(why)) => {
                    // A flood of failing handshakes must not flood the log.
                    if let Some(more) = l.registry.admission.refusals.allow() {
                        tracing::warn!(%peer, suppressed = more, "connection closed: TLS handshake failed: {why}");
                    }
                }
                Err(Failure::Quiet) => {
                    tracing::debug!(%peer, "connection closed before its TLS handshake")
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(%peer, "connection closed: no thread for its TLS handshake: {e}");
    }
}

/// Why a connection did not get through its handshake.
enum Failure {
    /// Logged: the host's TLS is wrong, or the connection is not TLS.
    Refused(String),
    /// Not logged: the peer closed before sending a byte (a port probe).
    Quiet,
}

/// Brings a connection through its TLS handshake (on an `Optional`
/// listener, only one that opens with a ClientHello).
fn secure(
    mut conn: Accepted,
    mode: ListenerTls,
    registry: &Arc<Registry>,
    deadline: Instant,
) -> Result<Accepted, Failure> {
    let described = |e: HandshakeError| match e {
        HandshakeError::Plaintext => Failure::Refused(
            "the host sent a plaintext ICReq; this listener requires TLS (tls = \"required\")"
                .to_string(),
        ),
        HandshakeError::Abandoned => Failure::Quiet,
        e => Failure::Refused(e.to_string()),
    };
    if mode == ListenerTls::Optional {
        let first = handshake::first_byte(&conn.sock, deadline).map_err(described)?;
        if !handshake::starts_tls(first) {
            return Ok(conn);
        }
    }
    let keys = registry.clone();
    let mut engine = Engine::server(Box::new(move |raw| psk_of(&keys, raw)))
        .map_err(|e| Failure::Refused(e.to_string()))?;
    handshake::run(&conn.sock, &mut engine, deadline).map_err(described)?;
    let Some(Ok(shown)) = engine.psk_outcome().cloned() else {
        return Err(Failure::Refused("the handshake ended without a PSK".into()));
    };
    let id = Identity::parse(shown.as_bytes()).map_err(Failure::Refused)?;
    let cipher = engine.cipher();
    let session = Session::after_handshake(&engine).map_err(|e| Failure::Refused(e.to_string()))?;
    let records = match kernel_tls(&conn.sock, &session) {
        Ok(()) => None,
        Err(ktls::KtlsError::Keys(e)) => {
            return Err(Failure::Refused(format!(
                "kernel TLS refused the keys: {e}"
            )))
        }
        Err(why) => {
            tracing::debug!(peer = %conn.peer, "TLS in user space: {why}");
            Some(Box::new(Records::new(session)))
        }
    };
    let peer = TlsPeer {
        hostnqn: id.hostnqn,
        subnqn: id.subnqn,
        cipher,
        kernel: records.is_none(),
    };
    tracing::debug!(peer = %conn.peer, identity = %shown, cipher = peer.cipher, kernel = peer.kernel, "TLS handshake done");
    conn.tls = Some((records, Arc::new(peer)));
    conn.silent = None;
    Ok(conn)
}

/// Hands the connection's TLS to the kernel (see [`ktls::offload`]); the
/// first time the kernel cannot take it, says so once.
fn kernel_tls(sock: &TcpStream, session: &Session) -> Result<(), ktls::KtlsError> {
    static TOLD: std::sync::Once = std::sync::Once::new();
    let r = ktls::offload(sock, session);
    if let Err(ktls::KtlsError::Unavailable(e)) = &r {
        TOLD.call_once(|| {
            tracing::info!("TLS records are encrypted in user space: the kernel has no TLS ({e}; modprobe tls)")
        });
    }
    r
}

/// The TLS PSK of the identity a host offered: from the key configured for
/// its host NQN on the subsystem it names.
fn psk_of(registry: &Registry, raw: &[u8]) -> Result<TlsPsk, String> {
    let id = Identity::parse(raw).map_err(|e| {
        format!(
            "identity {:?}: {e}",
            String::from_utf8_lossy(&raw[..raw.len().min(64)])
        )
    })?;
    let key = registry.tls_key(&id.hostnqn, &id.subnqn).ok_or_else(|| {
        let on = if id.subnqn == DISCOVERY_NQN {
            "any subsystem".to_string()
        } else {
            id.subnqn.clone()
        };
        format!("no TLS key for host {} on {on} (identity {id})", id.hostnqn)
    })?;
    id.tls_psk(&key.key, key.labels)
        .map_err(|e| format!("identity {id}: {e}"))
}

//! systemd's readiness protocol (sd_notify): a datagram to $NOTIFY_SOCKET.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` (e.g. "READY=1") to systemd; does nothing when not run by
/// systemd with `Type=notify`.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        None => SocketAddr::from_pathname(&path),
    };
    let sent = addr
        .and_then(|a| UnixDatagram::unbound().and_then(|s| s.send_to_addr(state.as_bytes(), &a)));
    if let Err(e) = sent {
        tracing::warn!("cannot notify systemd ({path}) of {state:?}: {e}");
    }
}

//! Accepting NVMe/TCP connections and handing them to the pollers.

use crate::base::admission::Permit;
use crate::service::ana::AnaStates;
use crate::transport::Listen;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A connection accepted, on its way to a poller.
pub(super) struct Accepted {
    pub(super) sock: TcpStream,
    pub(super) peer: SocketAddr,
    /// Its place among connections waiting for their Connect.
    pub(super) pending: Permit,
    /// The ANA states of the listener that accepted it.
    pub(super) ana: Arc<AnaStates>,
}

/// Accepts connections on `listener` until `l.stop`, handing them to the
/// pollers round robin.
pub(super) fn accept_loop(listener: TcpListener, l: Listen) {
    let mut next = 0;
    loop {
        let accepted = listener.accept();
        if l.stop.load(Ordering::Acquire) {
            tracing::info!("stopped listening on tcp://{}", l.addr);
            return;
        }
        match accepted {
            Ok((sock, peer)) => {
                // Past limits.pending_connections the socket is closed at once.
                let Some(pending) = l.registry.admission.pending_connection(&peer) else {
                    continue;
                };
                let conn = Accepted {
                    sock,
                    peer,
                    pending,
                    ana: l.ana.clone(),
                };
                l.pollers[next % l.pollers.len()].adopt(l.ep, Box::new(conn));
                next += 1;
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

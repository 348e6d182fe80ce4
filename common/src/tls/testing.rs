//! Both ends of a TLS handshake over a real loopback connection, for the
//! tests of the TLS code and of the stream's records.

use super::handshake::{self, HandshakeError};
use super::key::{ConfiguredKey, Identity, Labels};
use super::Engine;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

pub(crate) const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:host-a";
const SUBSYS: &str = "nqn.2026-01.io.rdmablk:tls";

pub(crate) fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    (c, l.accept().unwrap().0)
}

pub(crate) fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// A server that knows `key` for HOST, deriving as a target does.
pub(crate) fn server(key: ConfiguredKey) -> Engine {
    Engine::server(Box::new(move |raw| {
        let id = Identity::parse(raw)?;
        if id.hostnqn != HOST {
            return Err(format!("no TLS key for host {}", id.hostnqn));
        }
        id.tls_psk(&key, Labels::Rfc8446)
    }))
    .unwrap()
}

pub(crate) fn client(key: &ConfiguredKey, version: u8, hostnqn: &str) -> Engine {
    let id = Identity::of(version, key, hostnqn, SUBSYS, Labels::Rfc8446);
    Engine::client(&id.to_string(), id.tls_psk(key, Labels::Rfc8446).unwrap()).unwrap()
}

/// One end after its handshake: the result, the socket and the engine.
pub(crate) type End = (Result<(), HandshakeError>, TcpStream, Engine);

/// Runs both handshakes; returns the server's end and the client's.
pub(crate) fn handshake_both(mut s: Engine, mut c: Engine) -> (End, End) {
    let (cs, ss) = pair();
    let t = std::thread::spawn(move || {
        let r = handshake::run(&ss, &mut s, deadline());
        (r, ss, s)
    });
    let rc = handshake::run(&cs, &mut c, deadline());
    if rc.is_err() {
        let _ = cs.shutdown(std::net::Shutdown::Both);
    }
    (t.join().unwrap(), (rc, cs, c))
}

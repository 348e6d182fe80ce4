//! Both ends of TLS over real loopback sockets: the handshake with the
//! right key, a wrong one and an unknown identity; data through blocking
//! sockets; and the record layer under a stream, through io_uring, with a
//! receive buffer far smaller than what arrives.

use super::handshake::{self, HandshakeError};
use super::key::{ConfiguredKey, Hash, Identity, Labels};
use super::{Engine, Records, TlsSocket};
use crate::nvme::{Cqe, Status};
use crate::tcp::stream::{Flow, Inbound, InboundLimits, Placed, Receiver, Role, Stream};
use crate::tcp::{self, Digests, Header, Pdu, Transfer};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:host-a";
const SUBSYS: &str = "nqn.2026-01.io.rdmablk:tls";

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    (c, l.accept().unwrap().0)
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// A server that knows `key` for HOST, deriving as a target does.
fn server(key: ConfiguredKey) -> Engine {
    Engine::server(Box::new(move |raw| {
        let id = Identity::parse(raw)?;
        if id.hostnqn != HOST {
            return Err(format!("no TLS key for host {}", id.hostnqn));
        }
        id.tls_psk(&key, Labels::Rfc8446)
    }))
    .unwrap()
}

fn client(key: &ConfiguredKey, version: u8, hostnqn: &str) -> Engine {
    let id = Identity::of(version, key, hostnqn, SUBSYS, Labels::Rfc8446);
    Engine::client(&id.to_string(), id.tls_psk(key, Labels::Rfc8446).unwrap()).unwrap()
}

/// One end after its handshake: the result, the socket and the engine.
type End = (Result<(), HandshakeError>, TcpStream, Engine);

/// Runs both handshakes; returns the server's end and the client's.
fn handshake_both(mut s: Engine, mut c: Engine) -> (End, End) {
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

#[test]
fn both_identity_versions_and_both_hashes_handshake_and_carry_data() {
    for (hash, version, suite) in [
        (Hash::Sha256, 0, "TLS_AES_128_GCM_SHA256"),
        (Hash::Sha256, 1, "TLS_AES_128_GCM_SHA256"),
        (Hash::Sha384, 0, "TLS_AES_256_GCM_SHA384"),
        (Hash::Sha384, 1, "TLS_AES_256_GCM_SHA384"),
    ] {
        let key = ConfiguredKey::generate(hash).unwrap();
        let ((rs, ss, s), (rc, cs, c)) =
            handshake_both(server(key.clone()), client(&key, version, HOST));
        rs.unwrap();
        rc.unwrap();
        assert_eq!(s.cipher(), suite);
        assert_eq!(c.cipher(), suite);
        let mut s = TlsSocket::new(ss, &s).unwrap();
        let mut c = TlsSocket::new(cs, &c).unwrap();
        let msg: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let m = msg.clone();
        let t = std::thread::spawn(move || c.write_all(&m).map(|_| c));
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got, msg);
        let mut c = t.join().unwrap().unwrap();
        s.write_all(b"back").unwrap();
        let mut back = [0u8; 4];
        c.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"back");
    }
}

#[test]
fn a_wrong_key_fails_both_ends() {
    let key = ConfiguredKey::generate(Hash::Sha256).unwrap();
    let wrong = ConfiguredKey::generate(Hash::Sha256).unwrap();
    let ((rs, ..), (rc, ..)) = handshake_both(server(key), client(&wrong, 0, HOST));
    let (rs, rc) = (rs.unwrap_err().to_string(), rc.unwrap_err().to_string());
    assert!(
        rs.contains("key is not the one configured for identity NVMe0R01"),
        "{rs}"
    );
    assert!(rc.contains("handshake"), "{rc}");
}

#[test]
fn an_unknown_identity_is_refused_with_the_servers_reason() {
    let key = ConfiguredKey::generate(Hash::Sha256).unwrap();
    let ((rs, ..), (rc, ..)) = handshake_both(
        server(key.clone()),
        client(&key, 0, "nqn.2026-01.io.rdmablk:stranger"),
    );
    let rs = rs.unwrap_err().to_string();
    assert!(
        rs.contains("no TLS key for host nqn.2026-01.io.rdmablk:stranger"),
        "{rs}"
    );
    assert!(rc.is_err());
}

#[test]
fn a_plaintext_icreq_and_a_silent_peer_end_the_handshake() {
    let key = ConfiguredKey::generate(Hash::Sha256).unwrap();
    let (mut c, s) = pair();
    let icreq = Header::IcReq {
        pfv: 0,
        hpda: 0,
        digests: Digests::default(),
        maxr2t: 0,
    };
    c.write_all(&tcp::encode(&icreq, 0, &[], Digests::default(), 1))
        .unwrap();
    let e = handshake::run(&s, &mut server(key.clone()), deadline()).unwrap_err();
    assert!(matches!(e, HandshakeError::Plaintext), "{e}");

    let (c, s) = pair();
    drop(c);
    let e = handshake::run(&s, &mut server(key.clone()), deadline()).unwrap_err();
    assert!(matches!(e, HandshakeError::Abandoned), "{e}");

    let (_c, s) = pair();
    let start = Instant::now();
    let soon = start + Duration::from_millis(300);
    let e = handshake::run(&s, &mut server(key.clone()), soon).unwrap_err();
    assert!(matches!(e, HandshakeError::Timeout), "{e}");
    assert!(start.elapsed() < Duration::from_secs(3));

    // A record header announcing more than TLS 1.3 allows.
    let (mut c, s) = pair();
    c.write_all(&[22, 3, 1, 0xff, 0xff]).unwrap();
    let e = handshake::run(&s, &mut server(key), deadline()).unwrap_err();
    assert!(matches!(e, HandshakeError::Oversized(0xffff)), "{e}");
}

/// Counts the CapsuleResp PDUs it receives.
#[derive(Default)]
struct Counter(Vec<u16>);

// SAFETY: never gives a place (no data PDU is expected).
unsafe impl Receiver for Counter {
    type Error = String;
    fn digests(&self) -> Digests {
        Digests::default()
    }
    fn receiving(&self) -> bool {
        true
    }
    fn place(&mut self, t: &Transfer, _: usize) -> Result<*mut u8, String> {
        Err(format!("unexpected data {t:?}"))
    }
    fn placed(&mut self, _: Placed) -> Result<(), String> {
        Err("unexpected".into())
    }
    fn pdu(&mut self, pdu: &Pdu<'_>) -> Result<Flow, String> {
        match pdu.header {
            Header::CapsuleResp(cqe) => self.0.push(cqe.cid),
            _ => return Err("unexpected PDU".into()),
        }
        Ok(Flow::Consumed)
    }
}

#[test]
fn the_stream_receives_and_sends_through_records_with_io_uring() {
    const PDUS: u16 = 20_000; // 480 KB of PDUs into an 8 KiB receive buffer
    let key = ConfiguredKey::generate(Hash::Sha256).unwrap();
    let ((rs, ss, s), (rc, cs, c)) = handshake_both(server(key.clone()), client(&key, 0, HOST));
    rs.unwrap();
    rc.unwrap();
    let limits = InboundLimits {
        buffer: 8 << 10,
        max_pdu: 64 << 10,
        max_other: 1 << 10,
        direct_min: 4 << 10,
    };
    let inbound = Inbound::new(Role::Host, limits).unwrap();
    let mut stream = Stream::with_tls(ss, inbound, Some(Box::new(Records::new(&s, &[]).unwrap())));
    assert_eq!(stream.tls_cipher(), Some("TLS_AES_128_GCM_SHA256"));
    let mut peer = TlsSocket::new(cs, &c).unwrap();
    let writer = std::thread::spawn(move || {
        let mut all = Vec::new();
        for cid in 0..PDUS {
            let h = Header::CapsuleResp(Cqe::new(cid, Status::SUCCESS));
            all.extend(tcp::encode(&h, 0, &[], Digests::default(), 1));
        }
        peer.write_all(&all).unwrap();
        // Then read back what the stream sends.
        let mut back = vec![0u8; PDUS as usize * tcp::SHORT_HLEN];
        peer.read_exact(&mut back).unwrap();
        back
    });
    let mut ring = io_uring::IoUring::new(8).unwrap();
    let mut counter = Counter::default();
    let mut inbound_done = false;
    while !inbound_done {
        let e = stream.recv_entry(1).expect("room after processing");
        // SAFETY: the stream and its buffers outlive the wait below.
        unsafe { ring.submission().push(&e).unwrap() };
        ring.submit_and_wait(1).unwrap();
        let res = ring.completion().next().unwrap().result();
        assert!(matches!(stream.received(res), tcp::stream::Received::Bytes));
        let mut inbound = std::mem::take(&mut stream.inbound);
        inbound.process(&mut counter).unwrap();
        stream.inbound = inbound;
        inbound_done = counter.0.len() == PDUS as usize;
    }
    assert!(counter.0.iter().copied().eq(0..PDUS));

    for cid in 0..PDUS {
        let h = Header::CapsuleResp(Cqe::new(cid, Status::SUCCESS));
        stream
            .outbound
            .push(&h, &[], Digests::default(), Some(cid as u64));
    }
    let mut done = Vec::new();
    while done.len() < PDUS as usize {
        let e = stream.send_entry(2).expect("queued PDUs to send");
        // SAFETY: as above.
        unsafe { ring.submission().push(&e).unwrap() };
        ring.submit_and_wait(1).unwrap();
        let res = ring.completion().next().unwrap().result();
        stream.sent(res, &mut done).unwrap();
    }
    assert!(!stream.busy() && stream.outbound.drained());
    let back = writer.join().unwrap();
    let mut cids = Vec::new();
    let mut at = 0;
    while at < back.len() {
        let (pdu, n) = tcp::decode(&back[at..], Digests::default(), 1 << 20)
            .unwrap()
            .unwrap();
        if let Header::CapsuleResp(cqe) = pdu.header {
            cids.push(cqe.cid);
        }
        at += n;
    }
    assert!(cids.into_iter().eq(0..PDUS));
}

#[test]
fn kernel_tls_carries_the_data_or_says_why_not() {
    let key = ConfiguredKey::generate(Hash::Sha384).unwrap();
    let ((rs, mut ss, s), (rc, cs, c)) = handshake_both(server(key.clone()), client(&key, 1, HOST));
    rs.unwrap();
    rc.unwrap();
    let (st, ct) = (s.traffic().unwrap(), c.traffic().unwrap());
    assert_eq!(*st.sent, *ct.received);
    assert_eq!(*st.received, *ct.sent);
    assert_eq!(st.sent.len(), 48);
    match super::ktls::offload(&ss, &s) {
        Ok(()) => {
            // The kernel encrypts: plaintext on the server's socket.
            let mut peer = TlsSocket::new(cs, &c).unwrap();
            ss.write_all(b"from the kernel").unwrap();
            let mut got = [0u8; 15];
            peer.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"from the kernel");
            peer.write_all(b"to the kernel").unwrap();
            let mut got = [0u8; 13];
            ss.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"to the kernel");
        }
        Err(super::ktls::KtlsError::Unavailable(e)) => {
            eprintln!("no kernel TLS here ({e}): user-space records carry TLS");
        }
        Err(e) => panic!("{e}"),
    }
}

/// What the stream makes of `bytes` arriving after the handshake.
fn stream_receives(bytes: &[u8]) -> tcp::stream::Received {
    let key = ConfiguredKey::generate(Hash::Sha256).unwrap();
    let ((rs, ss, s), (rc, mut cs, c)) = handshake_both(server(key.clone()), client(&key, 0, HOST));
    drop(c);
    rs.unwrap();
    rc.unwrap();
    let limits = InboundLimits {
        buffer: 8 << 10,
        max_pdu: 64 << 10,
        max_other: 1 << 10,
        direct_min: 4 << 10,
    };
    let inbound = Inbound::new(Role::Controller, limits).unwrap();
    let mut stream = Stream::with_tls(ss, inbound, Some(Box::new(Records::new(&s, &[]).unwrap())));
    cs.write_all(bytes).unwrap();
    cs.shutdown(std::net::Shutdown::Write).unwrap();
    let mut ring = io_uring::IoUring::new(4).unwrap();
    loop {
        let e = stream.recv_entry(1).unwrap();
        // SAFETY: the stream outlives the wait.
        unsafe { ring.submission().push(&e).unwrap() };
        ring.submit_and_wait(1).unwrap();
        let res = ring.completion().next().unwrap().result();
        match stream.received(res) {
            tcp::stream::Received::Bytes => continue,
            other => return other,
        }
    }
}

#[test]
fn oversized_and_forged_records_fail_the_receive() {
    // A record announcing more than TLS 1.3 allows (2^14 + 256).
    let mut big = vec![23, 3, 3, 0x48, 0x00];
    big.resize(5 + 0x4800, 0xab);
    let r = stream_receives(&big);
    assert!(
        matches!(&r, tcp::stream::Received::Failed(e) if e.to_string().contains("TLS")),
        "{r:?}"
    );
    // A record of the right size whose bytes are not the peer's.
    let mut forged = vec![23, 3, 3, 0x01, 0x00];
    forged.resize(5 + 0x100, 0x5a);
    let r = stream_receives(&forged);
    assert!(
        matches!(&r, tcp::stream::Received::Failed(e) if e.to_string().contains("TLS")),
        "{r:?}"
    );
    // A record cut short, then the connection closed.
    let r = stream_receives(&[23, 3, 3, 0x01, 0x00, 1, 2, 3]);
    assert!(matches!(r, tcp::stream::Received::Closed), "{r:?}");
}

//! The record layer under a stream, through io_uring, against a blocking
//! TLS socket: far more PDUs than the receive buffer holds, both ways; and
//! records that are too large, forged or cut short.

use crate::nvme::{Cqe, Status};
use crate::tcp::stream::{Flow, Inbound, InboundLimits, Placed, Receiver, Records, Role, Stream};
use crate::tcp::{self, Digests, Header, Pdu, Transfer};
use crate::tls::key::{ConfiguredKey, Hash};
use crate::tls::testing::{client, handshake_both, server, HOST};
use crate::tls::{Session, TlsSocket};
use std::io::{Read, Write};

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

/// After a handshake: the server's end as `role`'s stream with records
/// (an 8 KiB receive buffer), the client's as a blocking socket.
fn tls_stream(role: Role) -> (Stream, TlsSocket) {
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
    let inbound = Inbound::new(role, limits).unwrap();
    let records = Records::new(Session::after_handshake(&s).unwrap());
    let stream = Stream::with_tls(ss, inbound, Some(Box::new(records)));
    (stream, TlsSocket::new(cs, &c).unwrap())
}

#[test]
fn the_stream_receives_and_sends_through_records_with_io_uring() {
    const PDUS: u16 = 20_000; // 480 KB of PDUs into an 8 KiB receive buffer
    let (mut stream, mut peer) = tls_stream(Role::Host);
    assert_eq!(stream.tls_cipher(), Some("TLS_AES_128_GCM_SHA256"));
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

/// What the stream makes of `bytes` arriving after the handshake.
fn stream_receives(bytes: &[u8]) -> tcp::stream::Received {
    let (mut stream, peer) = tls_stream(Role::Controller);
    let (mut cs, _) = peer.into_parts();
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

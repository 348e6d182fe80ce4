//! Both ends of TLS over real loopback sockets: the handshake with the
//! right key, a wrong one and an unknown identity; data through blocking
//! sockets; and the record layer under a stream, through io_uring, with a
//! receive buffer far smaller than what arrives.

use super::handshake::{self, HandshakeError};
use super::key::{ConfiguredKey, Hash};
use super::testing::{client, deadline, handshake_both, pair, server, HOST};
use super::TlsSocket;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

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
    // An ICReq: type 0, HLEN and PLEN 128 (NVMe/TCP 1.0, 3.6.2.2).
    let mut icreq = vec![0u8, 0, 128, 0, 128, 0, 0, 0];
    icreq.resize(128, 0);
    c.write_all(&icreq).unwrap();
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
    match super::ktls::offload(&ss, &super::Session::after_handshake(&s).unwrap()) {
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

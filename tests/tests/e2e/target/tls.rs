//! NVMe/TCP over TLS 1.3 on rdmablk-target (NVMe/TCP 1.1, 3.6.1), with
//! GnuTLS's `gnutls-cli` (the library the kernel's tlshd handshakes with)
//! as the host's TLS end: identities of versions 0 and 1 and both hashes
//! reach an ICResp; a wrong key, an unknown host, a plaintext ICReq where
//! TLS is required, a ClientHello where it is not, a silent peer and a
//! flood of handshakes each end their connection with a log line naming the
//! peer and the reason, while a good host still gets through; the discovery
//! log says which ports require TLS.

use rdmablk_common::fabrics::discovery::treq;
use rdmablk_common::tcp::{self, Digests, Header};
use rdmablk_common::tls::key::Hash;
use rdmablk_tests::check::OrPanic;
use rdmablk_tests::client::{Controller, Queue};
use rdmablk_tests::names::HOST_A;
use rdmablk_tests::tls::{key, key_file, offer, target, SUBSYS};
use rdmablk_tests::{free_port, Proc, Target, TempDir};
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn icreq() -> Vec<u8> {
    let h = Header::IcReq {
        pfv: 0,
        hpda: 0,
        digests: Digests::default(),
        maxr2t: 0,
    };
    tcp::encode(&h, 0, &[], Digests::default(), 1)
}

/// gnutls-cli to `t` offering `identity` with the SHA-256 TLS PSK `psk`,
/// in TLS 1.3 with (EC)DHE as tlshd offers it, sending an ICReq; returns what it
/// received once an ICResp's worth is there or 10 s passed, and its stderr.
fn gnutls(t: &Target, identity: &str, psk: &[u8]) -> (Vec<u8>, String) {
    let priority =
        "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-128-GCM:+ECDHE-PSK:+DHE-PSK:%NO_TICKETS";
    let (mut p, mut stdin) = Proc::spawn_with_stdin(
        "gnutls-cli",
        Command::new("gnutls-cli").args([
            &format!("--priority={priority}"),
            &format!("--pskusername={identity}"),
            &format!("--pskkey={}", hex(psk)),
            &format!("--port={}", t.port()),
            "--logfile=/dev/null",
            "127.0.0.1",
        ]),
    );
    let _ = stdin.write_all(&icreq());
    let out = p.dir().join("stdout");
    let got = |p: &mut Proc| {
        std::fs::read(&out).unwrap_or_default().len() >= tcp::IC_LEN || !p.is_running()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !got(&mut p) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stdin);
    p.kill();
    (std::fs::read(&out).unwrap_or_default(), p.stderr())
}

fn assert_icresp(got: &[u8], what: &str) {
    assert!(
        got.len() >= tcp::IC_LEN && got[0] == tcp::pdu_type::ICRESP,
        "{what}: no ICResp through TLS, got {} bytes {:02x?}",
        got.len(),
        &got[..got.len().min(16)]
    );
}

#[test]
fn gnutls_reaches_an_icresp_with_both_identity_versions() {
    let k = key(Hash::Sha256, 3);
    let (d, _keys) = target(&k, "required", "", None);
    let t = &d.t;
    for v in [0, 1] {
        let (identity, psk) = offer(&k, v, HOST_A);
        let (got, err) = gnutls(t, &identity, &psk);
        assert_icresp(&got, &format!("version {v}: {err}"));
    }
}

#[test]
fn a_wrong_key_and_an_unknown_host_are_named_in_the_log() {
    let k = key(Hash::Sha256, 5);
    let (d, _keys) = target(&k, "required", "", None);
    let t = &d.t;
    let (identity, _) = offer(&k, 0, HOST_A);
    let (_, wrong) = offer(&key(Hash::Sha256, 6), 0, HOST_A);
    let (got, err) = gnutls(t, &identity, &wrong);
    assert!(got.is_empty(), "a wrong key got {} bytes", got.len());
    assert!(err.contains("alert"), "{err}");
    t.wait_log("key is not the one configured for identity NVMe0R01");

    std::thread::sleep(Duration::from_millis(1100)); // the log's refusal throttle
    let stranger = "nqn.2026-12.io.rdmablk:stranger";
    let (identity, psk) = offer(&k, 0, stranger);
    let (got, _) = gnutls(t, &identity, &psk);
    assert!(got.is_empty());
    t.wait_log(&format!("no TLS key for host {stranger} on {SUBSYS}"));

    // The right key still works.
    let (identity, psk) = offer(&k, 0, HOST_A);
    assert_icresp(&gnutls(t, &identity, &psk).0, "the right key");
}

#[test]
fn plaintext_where_tls_is_required_and_tls_where_it_is_not() {
    let k = key(Hash::Sha256, 7);
    let plain = free_port();
    let (d, _keys) = target(&k, "required", "", Some(plain));
    let t = &d.t;

    // A plaintext ICReq on the TLS listener: closed, named.
    let mut s = TcpStream::connect(t.addr()).or_panic("connect");
    s.write_all(&icreq()).or_panic("sending ICReq");
    t.wait_log("the host sent a plaintext ICReq; this listener requires TLS");

    // A ClientHello on the plaintext listener: closed, named.
    let (identity, psk) = offer(&k, 0, HOST_A);
    let mut c = Command::new("gnutls-cli");
    c.args([
        "--priority=NORMAL:-VERS-ALL:+VERS-TLS1.3:+ECDHE-PSK",
        &format!("--pskusername={identity}"),
        &format!("--pskkey={}", hex(&psk)),
        &format!("--port={plain}"),
        "--logfile=/dev/null",
        "127.0.0.1",
    ]);
    let r = rdmablk_tests::run("gnutls-cli", &mut c, Duration::from_secs(20));
    assert!(!r.status.success(), "{}", r.report());
    std::thread::sleep(Duration::from_millis(1100)); // the log's refusal throttle
    t.wait_log("the host opened TLS (a ClientHello) on a listener without it");

    // The discovery log (read over the plaintext listener) tells which
    // port requires TLS: TSAS SECTYPE TLS 1.3 and TREQ "required" (NVMe/TCP
    // 1.1, Figure 13; NVMe over Fabrics 1.1, Figure 40).
    let plain_addr: std::net::SocketAddr = ([127, 0, 0, 1], plain).into();
    let entries = Controller::discover(plain_addr, HOST_A).or_panic("discovery");
    let port_of = |p: u16| {
        entries
            .iter()
            .find(|e| e.subnqn == SUBSYS && e.trsvcid == p.to_string())
            .unwrap_or_else(|| panic!("no entry of {SUBSYS} on port {p}: {entries:?}"))
    };
    let secure = port_of(t.port());
    assert_eq!(secure.tsas[0], 2, "SECTYPE TLS 1.3");
    assert_eq!(secure.treq & 3, treq::SECURE_CHANNEL_REQUIRED);
    let open = port_of(plain);
    assert_eq!(open.tsas[0], 0);
    assert_eq!(open.treq & 3, treq::SECURE_CHANNEL_NOT_SPECIFIED);

    // HOST_A is allowed only by its key: its plaintext Connect is refused.
    let e = Controller::open(plain_addr, SUBSYS, HOST_A, &Default::default());
    assert!(e.is_err(), "a key-only host connected in plaintext");
    t.wait_log("is allowed on nqn.2026-12.io.rdmablk:tls only over TLS");
}

#[test]
fn an_optional_listener_takes_both() {
    let k = key(Hash::Sha256, 9);
    let (d, _keys) = target(&k, "optional", "", None);
    let t = &d.t;
    let (identity, psk) = offer(&k, 0, HOST_A);
    assert_icresp(&gnutls(t, &identity, &psk).0, "TLS");
    let q = Queue::connect(t.addr(), Digests::default());
    assert!(q.is_ok(), "plaintext ICReq on an optional listener");
    let entries = Controller::discover(t.addr(), HOST_A).or_panic("discovery");
    let e = entries
        .iter()
        .find(|e| e.subnqn == SUBSYS)
        .expect("an entry");
    assert_eq!(
        (e.tsas[0], e.treq & 3),
        (2, treq::SECURE_CHANNEL_NOT_REQUIRED)
    );
}

#[test]
fn silent_peers_and_a_flood_of_handshakes_are_bounded() {
    let k = key(Hash::Sha256, 11);
    let limits = "handshake_timeout = \"1s\"\ntls_handshakes = 2";
    let (d, _keys) = target(&k, "required", limits, None);
    let t = &d.t;
    // Two silent connections hold both handshakes; a third is refused at once.
    let silent: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(t.addr()).or_panic("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let third = TcpStream::connect(t.addr()).or_panic("connect");
    t.wait_log("too many TLS handshakes in progress (limits.tls_handshakes)");
    // The silent ones end at the deadline, then a good host gets through.
    t.wait_log("no TLS handshake within its deadline");
    std::thread::sleep(Duration::from_millis(300));
    let (identity, psk) = offer(&k, 0, HOST_A);
    assert_icresp(&gnutls(t, &identity, &psk).0, "after the flood");
    drop((silent, third));
}

/// A key file others may read is refused, naming the fix.
#[test]
fn a_key_file_others_may_read_is_refused() {
    let dir = TempDir::new("tls-perm");
    let k = key(Hash::Sha256, 13);
    let path: &Path = &key_file(&dir, "open.key", &k);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).or_panic("chmod");
    let text = format!(
        "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{}\"\ntls = \"required\"\n\
         [[subsystem]]\nnqn = \"{SUBSYS}\"\n\
         [[subsystem.host]]\nnqn = \"{HOST_A}\"\ntls_key_file = \"{}\"\n\
         [[subsystem.namespace]]\nbackend = \"memory\"\nsize = \"16MiB\"\n",
        free_port(),
        path.display()
    );
    let cfg = dir.join("target.toml");
    std::fs::write(&cfg, text).or_panic("writing the config");
    let r = rdmablk_tests::run(
        "rdmablk-target --check",
        Command::new(rdmablk_tests::bin_path("rdmablk-target")).args([
            "--check",
            "--config",
            cfg.to_str().expect("utf-8"),
        ]),
        Duration::from_secs(20),
    );
    assert!(!r.status.success(), "{}", r.report());
    assert!(
        r.stderr.contains("tls_key_file") && r.stderr.contains("chmod 600"),
        "{}",
        r.report()
    );
}

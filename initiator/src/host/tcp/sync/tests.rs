//! The blocking queue over TLS against a fake target in a thread: a TLS
//! server that derives keys as a target does, then answers ICReq and one
//! command through the encrypted connection.

use super::*;
use crate::host::{TlsParams, Transport};
use rdmablk_common::tls::handshake;
use rdmablk_common::tls::key::{ConfiguredKey, Hash, Identity, Labels};
use rdmablk_common::tls::Engine;
use std::net::TcpListener;
use std::thread::JoinHandle;
use std::time::Instant;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0f8c5a5e-7f0e-4c6b-9b8e-3c1d2e4f5a6b";
const SUBSYS: &str = "nqn.2024-01.io.example:disk0";

fn params(addr: SocketAddr, tls: Option<TlsParams>) -> Params {
    Params {
        transport: Transport::Tcp,
        addr,
        subnqn: SUBSYS.into(),
        hostnqn: HOST.into(),
        hostid: [0; 16],
        digests: Digests::default(),
        kato: Duration::ZERO,
        queue_size: 32,
        io_queues: 1,
        disable_sqflow: false,
        dhchap: None,
        tls,
    }
}

fn tls(key: &ConfiguredKey, identity: u8) -> TlsParams {
    TlsParams {
        key: key.clone(),
        identity,
        labels: Labels::Rfc8446,
    }
}

/// A target holding `key` for [`HOST`]: on one connection, the TLS
/// handshake and ICReq/ICResp, then `serve`. Returns its address and what
/// it saw: the identity offered, or why it stopped.
fn target(
    key: ConfiguredKey,
    serve: impl FnOnce(&mut TlsSocket) -> std::io::Result<()> + Send + 'static,
) -> (SocketAddr, JoinHandle<Result<String, String>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (sock, _) = l.accept().unwrap();
        let mut engine = Engine::server(Box::new(move |raw| {
            let id = Identity::parse(raw)?;
            if id.hostnqn != HOST {
                return Err(format!("no key for {}", id.hostnqn));
            }
            id.tls_psk(&key, Labels::Rfc8446)
        }))
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        handshake::run(&sock, &mut engine, deadline).map_err(|e| e.to_string())?;
        let offered = match engine.psk_outcome() {
            Some(Ok(id)) => id.clone(),
            other => return Err(format!("PSK outcome {other:?}")),
        };
        let mut s = TlsSocket::new(sock, &engine).map_err(|e| e.to_string())?;
        let mut icreq = [0u8; 128];
        s.read_exact(&mut icreq).map_err(|e| e.to_string())?;
        let icresp = Header::IcResp {
            pfv: 0,
            cpda: 0,
            digests: Digests::default(),
            maxh2cdata: 128 << 10,
        };
        s.write_all(&tcp::encode(&icresp, 0, &[], Digests::default(), 1))
            .map_err(|e| e.to_string())?;
        serve(&mut s).map_err(|e| e.to_string())?;
        Ok(offered)
    });
    (addr, t)
}

/// Reads a command capsule with `data` bytes in it: its SQE and data.
fn read_command(s: &mut TlsSocket, data: usize) -> std::io::Result<(Sqe, Vec<u8>)> {
    let mut cmd = vec![0u8; 72 + data];
    s.read_exact(&mut cmd)?;
    Ok((Sqe::from_bytes(&cmd[8..72]), cmd.split_off(72)))
}

fn respond(s: &mut TlsSocket, cid: u16) -> std::io::Result<()> {
    let resp = Header::CapsuleResp(Cqe::new(cid, Status::SUCCESS));
    s.write_all(&tcp::encode(&resp, 0, &[], Digests::default(), 1))
}

/// Answers one command without data.
fn answer_one(s: &mut TlsSocket) -> std::io::Result<()> {
    let (sqe, _) = read_command(s, 0)?;
    respond(s, sqe.cid())
}

#[test]
fn a_queue_over_tls_offers_its_identity_and_runs_commands() {
    for (hash, identity, suite) in [
        (Hash::Sha256, 0, "TLS_AES_128_GCM_SHA256"),
        (Hash::Sha384, 1, "TLS_AES_256_GCM_SHA384"),
    ] {
        let key = ConfiguredKey::generate(hash).unwrap();
        let (addr, t) = target(key.clone(), answer_one);
        let p = params(addr, Some(tls(&key, identity)));
        let mut q = TcpSync::open(&p, SUBSYS).unwrap();
        assert_eq!(q.tls_cipher(), Some(suite));
        let (cqe, _) = q.exec(Sqe::new(admin::KEEP_ALIVE, 0), &[], 0).unwrap();
        assert!(cqe.status().is_success());
        let want = tls(&key, identity).identity(HOST, SUBSYS).to_string();
        assert_eq!(t.join().unwrap(), Ok(want));
        let (_, records) = q.into_stream().unwrap();
        assert_eq!(records.map(|r| r.cipher().to_string()), Some(suite.into()));
    }
}

#[test]
fn another_key_fails_the_handshake_naming_the_identity() {
    let key = ConfiguredKey::generate(Hash::Sha256).unwrap();
    let (addr, t) = target(key, answer_one);
    let other = ConfiguredKey::generate(Hash::Sha256).unwrap();
    let Err(e) = TcpSync::open(&params(addr, Some(tls(&other, 0))), SUBSYS) else {
        panic!("a handshake with another key succeeded");
    };
    let e = e.to_string();
    assert!(
        e.starts_with(&format!("TLS handshake with {addr} failed: ")),
        "{e}"
    );
    assert!(
        e.contains(&format!("identity `NVMe0R01 {HOST} {SUBSYS}`")),
        "{e}"
    );
    assert!(t.join().unwrap().is_err());
}

#[test]
fn a_plaintext_host_at_a_tls_listener_is_told_to_add_tls() {
    let key = ConfiguredKey::generate(Hash::Sha256).unwrap();
    let (addr, t) = target(key, answer_one);
    let Err(e) = TcpSync::open(&params(addr, None), SUBSYS) else {
        panic!("a plaintext ICReq was answered");
    };
    assert!(matches!(e, HostError::TlsRequired(a) if a == addr), "{e}");
    assert!(e.to_string().contains("add --tls"), "{e}");
    assert!(t.join().unwrap().is_err());
}

#[test]
fn a_tls_host_at_a_plaintext_listener_is_told_so() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut sock, _) = l.accept().unwrap();
        // A target without TLS takes the ClientHello for a PDU and ends
        // the connection with a C2HTermReq.
        let mut hello = [0u8; 8];
        sock.read_exact(&mut hello).unwrap();
        let term = Header::TermReq {
            from_host: false,
            fes: 1,
            fei: 0,
        };
        let _ = sock.write_all(&tcp::encode(&term, 0, &[], Digests::default(), 1));
    });
    let key = ConfiguredKey::generate(Hash::Sha256).unwrap();
    let Err(e) = TcpSync::open(&params(addr, Some(tls(&key, 0))), SUBSYS) else {
        panic!("a handshake with a plaintext listener succeeded");
    };
    assert!(matches!(e, HostError::NotTls { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("is its listener configured with tls?"),
        "{e}"
    );
    t.join().unwrap();
}

/// The connection goes on encrypted on the io_uring data path: a read of
/// 64 KiB (C2HData decrypted into the command's buffer) and an 8 KiB write
/// in the capsule, with the target checking what it got.
#[test]
fn the_io_queue_takes_the_tls_connection_over() {
    use crate::host::QueueLimits;
    use rdmablk_common::nvme::nvm;
    use rdmablk_common::ring::{Op, Ring};
    const READ: usize = 64 << 10;
    const WRITE: usize = 8 << 10;
    let pattern = |n: usize, seed: u8| -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    };
    let key = ConfiguredKey::generate(Hash::Sha256).unwrap();
    let (addr, t) = target(key.clone(), move |s| {
        let (read, _) = read_command(s, 0)?;
        let data = pattern(READ, 7);
        for (at, chunk) in data.chunks(16 << 10).enumerate() {
            let h = Header::C2HData(Transfer {
                cccid: read.cid(),
                ttag: 0,
                offset: (at * (16 << 10)) as u32,
                len: chunk.len() as u32,
            });
            let last = if (at + 1) * (16 << 10) == READ {
                tcp::flags::LAST_PDU
            } else {
                0
            };
            s.write_all(&tcp::encode(&h, last, chunk, Digests::default(), 1))?;
        }
        respond(s, read.cid())?;
        let (write, got) = read_command(s, WRITE)?;
        if got != pattern(WRITE, 9) {
            return Err(std::io::Error::other("the write's data differs"));
        }
        respond(s, write.cid())
    });
    let q = TcpSync::open(&params(addr, Some(tls(&key, 0))), SUBSYS).unwrap();
    let limits = QueueLimits {
        digests: q.digests,
        max_h2c: q.max_h2c,
        in_capsule: WRITE,
        depth: 8,
        crdt: [0; 3],
    };
    let (sock, records) = q.into_stream().unwrap();
    let mut queue = crate::host::tcp::TcpQueue::new(sock, records, limits);
    let ops = [
        Op(io_uring::opcode::Recv::CODE, "RECV"),
        Op(io_uring::opcode::Send::CODE, "SEND"),
        Op(io_uring::opcode::Nop::CODE, "NOP"),
    ];
    let mut ring = Ring::new(16, 4 << 20, &ops).unwrap();
    let mut read_buf = vec![0u8; READ];
    let mut write_buf = pattern(WRITE, 9);
    let rw = |opcode: u8, len: usize| {
        let mut sqe = Sqe::new(opcode, 0);
        sqe.set_nsid(1);
        sqe.set_cdw(12, (len / 512 - 1) as u32);
        sqe
    };
    // SAFETY: both buffers outlive the queue's use of them: the loop below
    // runs until both commands completed.
    unsafe {
        queue.submit(rw(nvm::READ, READ), read_buf.as_mut_ptr(), READ, true, 1);
        queue.submit(
            rw(nvm::WRITE, WRITE),
            write_buf.as_mut_ptr(),
            WRITE,
            false,
            2,
        );
    }
    let mut reaped = Vec::new();
    // One turn: the queue's operations go out, their results come back.
    let mut turn = |queue: &mut crate::host::tcp::TcpQueue| {
        queue.pump(&mut ring.submissions(), 1, 2);
        // SAFETY: the queue and the buffers stay in place until every
        // operation completed: the test turns until none is in flight.
        unsafe { ring.submit_and_wait() }.unwrap();
        ring.reap(&mut reaped);
        for (ud, res) in reaped.drain(..) {
            match ud {
                1 => queue.on_recv(res),
                _ => queue.on_send(res),
            }
        }
    };
    let mut done = Vec::new();
    let start = Instant::now();
    while done.len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            queue.failed()
        );
        turn(&mut queue);
        queue.take_done(&mut done);
    }
    assert!(done.iter().all(|d| d.cqe.status().is_success()), "{done:?}");
    assert_eq!(read_buf, pattern(READ, 7));
    assert_eq!(t.join().unwrap().map(|_| ()), Ok(()));
    queue.fail("test over".into());
    while queue.ops_in_flight() {
        turn(&mut queue);
    }
}

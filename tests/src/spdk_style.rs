//! An NVMe/TCP proxy that makes rdmablk-target answer the way SPDK's
//! `nvmf_tgt` does with its default options: a command that returns data
//! and completes with success and completion dwords 0 and 1 zero ends with
//! its last C2HData PDU flagged SUCCESS and no response capsule, whatever
//! the host asked at Connect (SPDK `lib/nvmf/tcp.c`). Host-to-target bytes
//! pass through untouched; target-to-host PDUs are decoded, and a last
//! C2HData is held until the PDU after it shows whether it can carry the
//! completion.

use rdmablk_common::tcp::{self, flags, Digests, Header};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// The largest PDU the proxy decodes (the target's MAXH2CDATA and C2HData
/// are 128 KiB).
const MAX_PDU: usize = 1 << 20;

/// What the proxy learned from the handshake.
#[derive(Clone, Copy, Default)]
struct Negotiated {
    digests: Digests,
    /// Data alignment the host asked for (HPDA), in bytes.
    align: usize,
}

/// A running proxy; it stops with the test process.
pub struct SuccessProxy {
    port: u16,
    folded: Arc<AtomicU64>,
}

impl SuccessProxy {
    /// Listens on a free loopback port and forwards each connection to the
    /// target on `target_port`.
    pub fn start(target_port: u16) -> SuccessProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listener");
        let port = listener.local_addr().expect("proxy address").port();
        let target: SocketAddr = ([127, 0, 0, 1], target_port).into();
        let folded = Arc::new(AtomicU64::new(0));
        let count = folded.clone();
        thread::spawn(move || {
            for host in listener.incoming().flatten() {
                let Ok(tgt) = TcpStream::connect(target) else {
                    continue;
                };
                let _ = host.set_nodelay(true);
                let _ = tgt.set_nodelay(true);
                let seen = Arc::new(Mutex::new(None));
                let (h2, t2) = (
                    host.try_clone().expect("clone"),
                    tgt.try_clone().expect("clone"),
                );
                let seen2 = seen.clone();
                let count = count.clone();
                thread::spawn(move || to_target(h2, t2, seen2));
                thread::spawn(move || to_host(tgt, host, seen, &count));
            }
        });
        SuccessProxy { port, folded }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Completions moved into a C2HData PDU so far.
    pub fn folded(&self) -> u64 {
        self.folded.load(Ordering::Relaxed)
    }
}

/// Host to target: bytes as they come; the ICReq's digests and alignment
/// are noted for the other direction.
fn to_target(mut host: TcpStream, mut tgt: TcpStream, seen: Arc<Mutex<Option<Negotiated>>>) {
    let mut first = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match host.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if seen.lock().expect("lock").is_none() {
            first.extend_from_slice(&buf[..n]);
            if let Ok(Some((pdu, _))) = tcp::decode(&first, Digests::default(), MAX_PDU) {
                if let Header::IcReq { hpda, digests, .. } = pdu.header {
                    let align = (hpda as usize + 1) * 4;
                    *seen.lock().expect("lock") = Some(Negotiated { digests, align });
                }
            }
        }
        if tgt.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = tgt.shutdown(Shutdown::Both);
}

/// Target to host: PDUs re-framed where a completion moves into the data.
fn to_host(
    mut tgt: TcpStream,
    mut host: TcpStream,
    seen: Arc<Mutex<Option<Negotiated>>>,
    folded: &AtomicU64,
) {
    let mut rx = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    // The last C2HData of a command: its transfer, data and raw bytes.
    let mut held: Option<(tcp::Transfer, Vec<u8>, Vec<u8>)> = None;
    let mut handshake_done = false;
    loop {
        let n = match tgt.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        rx.extend_from_slice(&buf[..n]);
        loop {
            let neg = seen.lock().expect("lock").unwrap_or_default();
            let expect = if handshake_done {
                neg.digests
            } else {
                Digests::default()
            };
            let (header, fl, data, len) = match tcp::decode(&rx, expect, MAX_PDU) {
                Ok(Some((pdu, len))) => (pdu.header, pdu.flags, pdu.data.to_vec(), len),
                Ok(None) => break,
                Err(_) => return,
            };
            let raw: Vec<u8> = rx.drain(..len).collect();
            let mut out = Vec::new();
            match header {
                Header::IcResp { .. } => {
                    handshake_done = true;
                    out.extend_from_slice(&raw);
                }
                Header::C2HData(t) if fl & flags::LAST_PDU != 0 && fl & flags::SUCCESS == 0 => {
                    if let Some((_, _, r)) = held.take() {
                        out.extend_from_slice(&r);
                    }
                    held = Some((t, data, raw));
                }
                Header::CapsuleResp(cqe) => {
                    let folds = held.as_ref().is_some_and(|(t, _, _)| {
                        t.cccid == cqe.cid
                            && cqe.status().is_success()
                            && cqe.dw0 == 0
                            && cqe.dw1 == 0
                    });
                    match held.take() {
                        Some((t, d, _)) if folds => {
                            let fl = flags::LAST_PDU | flags::SUCCESS;
                            let pdu =
                                tcp::encode(&Header::C2HData(t), fl, &d, neg.digests, neg.align);
                            out.extend_from_slice(&pdu);
                            folded.fetch_add(1, Ordering::Relaxed);
                        }
                        Some((_, _, r)) => {
                            out.extend_from_slice(&r);
                            out.extend_from_slice(&raw);
                        }
                        None => out.extend_from_slice(&raw),
                    }
                }
                _ => {
                    if let Some((_, _, r)) = held.take() {
                        out.extend_from_slice(&r);
                    }
                    out.extend_from_slice(&raw);
                }
            }
            if host.write_all(&out).is_err() {
                return;
            }
        }
    }
    let _ = host.shutdown(Shutdown::Both);
}

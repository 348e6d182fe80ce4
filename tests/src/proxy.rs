//! An NVMe/TCP proxy that changes how rdmablk-target answers, to test the
//! host against behaviours of other targets:
//! - [`Proxy::spdk_style`]: as SPDK's `nvmf_tgt` with its default options, a
//!   command that returns data and completes with success and completion
//!   dwords 0 and 1 zero ends with its last C2HData PDU flagged SUCCESS and
//!   no response capsule, whatever the host asked at Connect (SPDK
//!   `lib/nvmf/tcp.c`);
//! - [`Proxy::interrupting`]: every Nth successful response on an I/O queue
//!   becomes Command Interrupted with DNR clear and CRD 1, a status a host
//!   retries after CRDT1 (the command did run: reads and writes are
//!   idempotent);
//! - [`Proxy::interrupting_then_closing`]: the same, and the connection is
//!   closed right after each such response, while the host waits to retry.
//!
//! Host-to-target bytes pass through untouched (the ICReq and Connect are
//! read on the way); target-to-host PDUs are decoded and re-framed.

use rdmablk_common::fabrics::ConnectCmd;
use rdmablk_common::nvme::Status;
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
    /// The queue id of the Connect, once seen.
    qid: Option<u16>,
}

/// What the proxy changes.
#[derive(Clone, Copy)]
enum Rewrite {
    FoldCompletions,
    /// Every `every`th successful I/O response interrupted, the connection
    /// closed after it when `close`.
    Interrupt {
        every: u64,
        close: bool,
    },
}

/// A running proxy; it stops with the test process.
pub struct Proxy {
    port: u16,
    changed: Arc<AtomicU64>,
}

impl Proxy {
    /// Completions folded into the last C2HData, as SPDK does.
    pub fn spdk_style(target_port: u16) -> Proxy {
        Proxy::start(target_port, Rewrite::FoldCompletions)
    }

    /// Every `every`th successful I/O response turned into Command
    /// Interrupted (DNR clear, CRD 1).
    pub fn interrupting(target_port: u16, every: u64) -> Proxy {
        Proxy::start(
            target_port,
            Rewrite::Interrupt {
                every,
                close: false,
            },
        )
    }

    /// As [`Proxy::interrupting`], each interrupted response followed by
    /// the end of its connection (as a target that stops would): with a
    /// host that reconnects at once, a path that keeps coming and going.
    pub fn interrupting_then_closing(target_port: u16, every: u64) -> Proxy {
        Proxy::start(target_port, Rewrite::Interrupt { every, close: true })
    }

    /// Listens on a free loopback port and forwards each connection to the
    /// target on `target_port`.
    fn start(target_port: u16, rewrite: Rewrite) -> Proxy {
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
                thread::spawn(move || to_host(tgt, host, seen, rewrite, &count));
            }
        });
        Proxy {
            port,
            changed: folded,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Responses changed so far (folded, or interrupted).
    pub fn changed(&self) -> u64 {
        self.changed.load(Ordering::Relaxed)
    }
}

/// Host to target: bytes as they come; the ICReq's digests and alignment
/// are noted for the other direction.
fn to_target(mut host: TcpStream, mut tgt: TcpStream, seen: Arc<Mutex<Option<Negotiated>>>) {
    let mut first = Vec::new();
    let mut learned = false;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match host.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !learned {
            first.extend_from_slice(&buf[..n]);
            learned = learn(&first, &seen);
        }
        if tgt.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = tgt.shutdown(Shutdown::Both);
}

/// Reads the ICReq and the Connect from the start of the host's bytes;
/// true once both were seen.
fn learn(bytes: &[u8], seen: &Mutex<Option<Negotiated>>) -> bool {
    let Ok(Some((pdu, n))) = tcp::decode(bytes, Digests::default(), MAX_PDU) else {
        return false;
    };
    let Header::IcReq { hpda, digests, .. } = pdu.header else {
        return true;
    };
    let mut neg = Negotiated {
        digests,
        align: (hpda as usize + 1) * 4,
        qid: None,
    };
    if let Ok(Some((pdu, _))) = tcp::decode(&bytes[n..], digests, MAX_PDU) {
        if let Header::CapsuleCmd(sqe) = pdu.header {
            neg.qid = Some(ConnectCmd::from_sqe(&sqe).qid);
        }
    }
    let done = neg.qid.is_some();
    *seen.lock().expect("lock") = Some(neg);
    done
}

/// Target to host: PDUs re-framed where a completion moves into the data.
fn to_host(
    mut tgt: TcpStream,
    mut host: TcpStream,
    seen: Arc<Mutex<Option<Negotiated>>>,
    rewrite: Rewrite,
    changed: &AtomicU64,
) {
    let mut responses = 0u64;
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
            let mut close = false;
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
                Header::CapsuleResp(mut cqe) => {
                    let folds = matches!(rewrite, Rewrite::FoldCompletions)
                        && held.as_ref().is_some_and(|(t, _, _)| {
                            t.cccid == cqe.cid
                                && cqe.status().is_success()
                                && cqe.dw0 == 0
                                && cqe.dw1 == 0
                        });
                    let io_queue = neg.qid.is_some_and(|q| q > 0);
                    let interrupt = match rewrite {
                        Rewrite::Interrupt { every, .. }
                            if io_queue && cqe.status().is_success() =>
                        {
                            responses += 1;
                            responses.is_multiple_of(every)
                        }
                        _ => false,
                    };
                    close = interrupt && matches!(rewrite, Rewrite::Interrupt { close: true, .. });
                    if let Some((t, d, r)) = held.take() {
                        if folds {
                            let fl = flags::LAST_PDU | flags::SUCCESS;
                            let pdu =
                                tcp::encode(&Header::C2HData(t), fl, &d, neg.digests, neg.align);
                            out.extend_from_slice(&pdu);
                            changed.fetch_add(1, Ordering::Relaxed);
                        } else {
                            out.extend_from_slice(&r);
                        }
                    }
                    if interrupt {
                        // CRD 1 (bits 12:11), DNR clear.
                        cqe.status = Status::COMMAND_INTERRUPTED.to_field(1);
                        let pdu = tcp::encode(&Header::CapsuleResp(cqe), 0, &[], neg.digests, 1);
                        out.extend_from_slice(&pdu);
                        changed.fetch_add(1, Ordering::Relaxed);
                    } else if !folds {
                        out.extend_from_slice(&raw);
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
            if close {
                let _ = tgt.shutdown(Shutdown::Both);
                let _ = host.shutdown(Shutdown::Both);
                return;
            }
        }
    }
    let _ = host.shutdown(Shutdown::Both);
}

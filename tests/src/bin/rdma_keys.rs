//! rdma_keys: shows over a real RDMA device (soft-RoCE in the VM suite) that
//! the host's NVMe/RDMA queue lets a target reach a command's buffer only
//! while that command is in flight, only inside it and only in the
//! direction its transfer needs.
//!
//! One process holds both ends: the host's own `RdmaQueue` (the initiator
//! library) and a scripted target on the same device that answers its
//! commands and then misuses their keys. Each case is a fresh connection
//! (a refused access breaks the queue pair, as it should):
//!
//! - `windows-remote-invalidate`: the target RDMA WRITEs a read's data and
//!   answers with SEND with Invalidate (the keyed SGL asked for it, subtype
//!   Fh); the data arrived; a WRITE with the same key afterwards is refused.
//! - `windows-local-invalidate`: the same, answered with a plain SEND: the
//!   host invalidates the window itself before completing the command.
//! - `registrations`: a registration per command (devices without
//!   windows): the key is gone once the command completes.
//! - `outside-the-buffer`: a WRITE just past the command's buffer is refused.
//! - `wrong-direction`: a write command's key (the target may READ the
//!   buffer) refuses an RDMA WRITE.
//! - `bogus-invalidate`: the target invalidates another command's key with
//!   its answer: the host fails the queue instead of completing.
//!
//! rdma_keys ADDR [--port 4600]
//!
//! Prints one `ok: CASE: ...` line per case; exits non-zero at the first
//! case that does not hold.

use rdmablk::host::rdma::{RdmaQueue, RemoteAccess};
use rdmablk_common::nvme::{nvm, Cqe, Sgl, Sqe, Status, SQE_LEN};
use rdmablk_common::rdma::private_data::{ConnectReply, ConnectRequest};
use rdmablk_common::rdma::{
    access, CmChannel, CmEventKind, CmId, CompChannel, Completion, ConnParam, Cq, Mr, Pd, QpConfig,
    SendOp, SendWr, Sge,
};
use rdmablk_tests::args::Flags;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(5);
const DEPTH: u16 = 8;
const LEN: usize = 4096;
/// Reads per case that completes them: each rebinds the same window.
const ROUNDS: usize = 3;
/// Capsule receive slots of the scripted target.
const SLOT: usize = 8192;

type Res<T> = Result<T, String>;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Case {
    WindowsRemoteInvalidate,
    WindowsLocalInvalidate,
    Registrations,
    OutsideTheBuffer,
    WrongDirection,
    BogusInvalidate,
}

const CASES: [(Case, &str); 6] = [
    (Case::WindowsRemoteInvalidate, "windows-remote-invalidate"),
    (Case::WindowsLocalInvalidate, "windows-local-invalidate"),
    (Case::Registrations, "registrations"),
    (Case::OutsideTheBuffer, "outside-the-buffer"),
    (Case::WrongDirection, "wrong-direction"),
    (Case::BogusInvalidate, "bogus-invalidate"),
];

fn main() {
    let flags = Flags::from_env();
    let Some(ip) = flags.positional(0).and_then(|a| a.parse::<IpAddr>().ok()) else {
        eprintln!("usage: rdma_keys ADDR [--port 4600]");
        std::process::exit(2);
    };
    let port: u16 = flags.number("--port", "4600").unwrap_or(4600);
    for (i, (case, name)) in CASES.iter().enumerate() {
        let addr = SocketAddr::new(ip, port + i as u16);
        match run_case(*case, addr) {
            Ok(what) => println!("ok: {name}: {what}"),
            Err(e) => {
                eprintln!("FAILED: {name}: {e}");
                std::process::exit(1);
            }
        }
    }
}

/// What the host asks for in a case, and what the target then tries.
struct Script {
    remote: RemoteAccess,
    /// A read (the target writes the host's buffer) or a write.
    to_host: bool,
    /// The target answers with SEND with Invalidate of the command's key.
    invalidate: bool,
}

fn script(case: Case) -> Script {
    let (remote, to_host, invalidate) = match case {
        Case::WindowsRemoteInvalidate | Case::OutsideTheBuffer => {
            (RemoteAccess::Windows, true, true)
        }
        Case::WindowsLocalInvalidate => (RemoteAccess::Windows, true, false),
        Case::Registrations => (RemoteAccess::Registrations, true, false),
        Case::WrongDirection | Case::BogusInvalidate => (RemoteAccess::Windows, false, true),
    };
    Script {
        remote,
        to_host,
        invalidate,
    }
}

fn run_case(case: Case, addr: SocketAddr) -> Res<String> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let target = std::thread::spawn(move || serve(case, addr, ready_tx, done_rx));
    ready_rx
        .recv_timeout(WAIT)
        .map_err(|_| "the scripted target did not start".to_string())??;
    let s = script(case);
    // Declared before the queue: dropped after it.
    let mut buf = vec![0x11u8; 2 * LEN];
    let mut q = RdmaQueue::connect(addr, 1, DEPTH, Some(s.remote)).map_err(|e| e.to_string())?;
    // SAFETY: `buf` is not reallocated and outlives `q`.
    unsafe { q.register(buf.as_mut_ptr(), buf.len()) }.map_err(|e| e.to_string())?;
    let opcode = if s.to_host { nvm::READ } else { nvm::WRITE };
    if case == Case::BogusInvalidate {
        // Two writes in flight; the answer to the first invalidates the
        // second's key.
        // SAFETY: `buf` is registered and untouched while the queue lives.
        unsafe { q.submit(Sqe::new(opcode, 0), buf.as_mut_ptr(), LEN, false, 1) }
            .ok_or("submitting the first write")?;
    }
    let at = if case == Case::BogusInvalidate {
        LEN
    } else {
        0
    };
    let rounds = match case {
        Case::BogusInvalidate | Case::WrongDirection => 1,
        _ => ROUNDS,
    };
    let mut outcome = Err(rdmablk::host::HostError::Protocol("no command".into()));
    for _ in 0..rounds {
        if s.to_host {
            // Each read's data must arrive anew.
            buf[..LEN].fill(0x11);
        }
        // SAFETY: `buf` is registered and untouched while the command runs.
        outcome = unsafe {
            q.exec_blocking(
                Sqe::new(opcode, 0),
                buf.as_mut_ptr().add(at),
                LEN,
                s.to_host,
                WAIT,
            )
        };
        match &outcome {
            Ok(cqe)
                if cqe.status().is_success()
                    && (!s.to_host || buf[..LEN].iter().all(|&b| b == 0xaa)) => {}
            _ => break,
        }
    }
    let host = match (case, outcome) {
        (Case::BogusInvalidate, Err(e)) if e.to_string().contains("invalidated key") => {
            format!("the host failed the queue: {e}")
        }
        // The target's misuse broke the queue pair while the command waited.
        (Case::WrongDirection, Err(e)) => format!("the host's queue failed: {e}"),
        (Case::BogusInvalidate | Case::WrongDirection, outcome) => {
            return Err(format!("the host's command ended with {outcome:?}"))
        }
        (_, Err(e)) => return Err(format!("the command failed: {e}")),
        (_, Ok(cqe)) if !cqe.status().is_success() => {
            return Err(format!("the command failed: {:?}", cqe.status()))
        }
        (_, Ok(_)) if s.to_host && buf[..LEN].iter().any(|&b| b != 0xaa) => {
            return Err("the read's data did not arrive".into())
        }
        (_, Ok(_)) => format!("{rounds} commands completed with their data"),
    };
    // The command is over (or the queue failed): the target misuses its key.
    let _ = done_tx.send(());
    let probe = target
        .join()
        .map_err(|_| "the scripted target panicked".to_string())??;
    let expected = if s.to_host { 0xaa } else { 0x11 };
    if buf[..LEN].iter().any(|&b| b != expected) || buf[LEN..].iter().any(|&b| b != 0x11) {
        return Err(format!("host memory changed: {probe}"));
    }
    Ok(format!("{host}; {probe}"))
}

/// The scripted target's end of one connection.
struct Conn {
    /// Declared first: the queue pair goes before the memory it uses.
    id: CmId,
    cq: Cq,
    /// Capsule slots, then a response, then data to write.
    mr: Mr,
    _mem: Vec<u8>,
    base: *mut u8,
    /// Completions polled and not yet waited for.
    wcs: Vec<Completion>,
}

const RESPONSE_AT: usize = DEPTH as usize * SLOT;
const DATA_AT: usize = RESPONSE_AT + 64;
const MEM_LEN: usize = DATA_AT + LEN;

impl Conn {
    fn sge(&self, at: usize, len: usize) -> Sge {
        Sge {
            // SAFETY: `at + len` lies inside the registered memory.
            addr: unsafe { self.base.add(at) },
            len: len as u32,
            lkey: self.mr.lkey(),
        }
    }

    /// Posts `wr` and waits for its completion (receives are reposted).
    fn post_wait(&mut self, op: SendOp, sge: Option<Sge>) -> Res<Completion> {
        let sges: Vec<Sge> = sge.into_iter().collect();
        let wr = SendWr {
            wr_id: 1 << 40,
            op,
            sges: &sges,
            signaled: true,
            inline: false,
        };
        // SAFETY: the QP is alive and `sges` lie in registered memory that
        // outlives the request (we wait for it below).
        unsafe { rdmablk_common::rdma::verbs::post_send(self.id.qp(), &[wr]) }
            .map_err(|e| e.to_string())?;
        self.wait(|wc| wc.wr_id == 1 << 40)
    }

    /// Waits for a completion that `want` picks.
    fn wait(&mut self, want: impl Fn(&Completion) -> bool) -> Res<Completion> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(i) = self.wcs.iter().position(&want) {
                return Ok(self.wcs.remove(i));
            }
            self.cq.poll(&mut self.wcs).map_err(|e| e.to_string())?;
            if let Some(i) = self.wcs.iter().position(&want) {
                return Ok(self.wcs.remove(i));
            }
            if Instant::now() > deadline {
                return Err("no completion within 5 s".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Takes the next command capsule.
    fn next_command(&mut self) -> Res<Sqe> {
        let wc = self.wait(|wc| wc.wr_id < DEPTH as u64)?;
        if !wc.ok() || (wc.byte_len as usize) < SQE_LEN {
            return Err(format!("capsule receive: {}", wc.status_str()));
        }
        let at = wc.wr_id as usize * SLOT;
        // SAFETY: the slot is registered memory the receive has completed into.
        let bytes = unsafe { std::slice::from_raw_parts(self.base.add(at), SQE_LEN) };
        Ok(Sqe::from_bytes(bytes))
    }

    fn respond(&mut self, cid: u16, invalidate: Option<u32>) -> Res<()> {
        let cqe = Cqe::new(cid, Status::SUCCESS).to_bytes();
        // SAFETY: the response area is ours; no request uses it now.
        unsafe { std::ptr::copy_nonoverlapping(cqe.as_ptr(), self.base.add(RESPONSE_AT), 16) };
        let wc = self.post_wait(SendOp::Send { invalidate }, Some(self.sge(RESPONSE_AT, 16)))?;
        wc.ok()
            .then_some(())
            .ok_or(format!("response SEND: {}", wc.status_str()))
    }

    /// An RDMA WRITE of our data to `addr` with `rkey`; its completion status.
    fn write(&mut self, addr: u64, rkey: u32, fill: u8) -> Res<Completion> {
        // SAFETY: the data area is ours.
        unsafe { std::ptr::write_bytes(self.base.add(DATA_AT), fill, LEN) };
        let sge = self.sge(DATA_AT, LEN);
        self.post_wait(
            SendOp::RdmaWrite {
                remote_addr: addr,
                rkey,
            },
            Some(sge),
        )
    }
}

fn keyed(sqe: &Sqe) -> Res<(u64, u32, u32, bool)> {
    match sqe.sgl() {
        Sgl::Keyed {
            addr,
            len,
            key,
            invalidate,
        } => Ok((addr, len, key, invalidate)),
        other => Err(format!("a command without a keyed SGL: {other:?}")),
    }
}

/// Runs the target's side of `case`; returns what the key misuse met.
fn serve(
    case: Case,
    addr: SocketAddr,
    ready: mpsc::Sender<Res<()>>,
    done: mpsc::Receiver<()>,
) -> Res<String> {
    let cm = CmChannel::new().map_err(|e| e.to_string())?;
    let mut listener = CmId::new(&cm).map_err(|e| e.to_string())?;
    if let Err(e) = listener.listen(addr, 4) {
        let _ = ready.send(Err(format!("listen on {addr}: {e}")));
        return Err(e.to_string());
    }
    let _ = ready.send(Ok(()));
    let ev = loop {
        let ev = cm.wait_event(WAIT).map_err(|e| e.to_string())?;
        match ev {
            Some(ev) if ev.kind == CmEventKind::ConnectRequest => break ev,
            Some(_) => continue,
            None => return Err("no connection".into()),
        }
    };
    ConnectRequest::decode(&ev.private_data).map_err(|e| e.describe().to_string())?;
    let new = ev.new_id.ok_or("a connect request without an id")?;
    let device = new.device();
    let mut id = CmId::adopt(new, &cm).map_err(|e| e.to_string())?;
    let pd = Pd::new(device).map_err(|e| e.to_string())?;
    let channel = CompChannel::new(device).map_err(|e| e.to_string())?;
    let cq = Cq::new(device, 64, &channel).map_err(|e| e.to_string())?;
    id.create_qp(&QpConfig {
        pd: &pd,
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        max_send_wr: 16,
        max_recv_wr: DEPTH as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    })
    .map_err(|e| e.to_string())?;
    let mut mem = vec![0u8; MEM_LEN];
    let base = mem.as_mut_ptr();
    // SAFETY: `mem` is not reallocated and outlives the registration
    // (dropped after `Conn::mr`).
    let mr = unsafe { Mr::register(&Arc::clone(&pd), base, MEM_LEN, access::LOCAL_WRITE) }
        .map_err(|e| e.to_string())?;
    let mut c = Conn {
        id,
        cq,
        mr,
        _mem: mem,
        base,
        wcs: Vec::new(),
    };
    for i in 0..DEPTH as usize {
        let sge = [c.sge(i * SLOT, SLOT)];
        // SAFETY: the slot is registered and left to the receive.
        unsafe { rdmablk_common::rdma::verbs::post_recv(c.id.qp(), i as u64, &sge) }
            .map_err(|e| e.to_string())?;
    }
    let reply = ConnectReply {
        recfmt: 0,
        crqsize: DEPTH,
    }
    .encode();
    let attrs = device.attrs().map_err(|e| e.to_string())?;
    c.id.accept(&ConnParam {
        private_data: &reply,
        responder_resources: attrs.max_qp_rd_atom,
        initiator_depth: attrs.max_qp_init_rd_atom,
        retry_count: 7,
        rnr_retry_count: 7,
    })
    .map_err(|e| e.to_string())?;

    let s = script(case);
    let first = c.next_command()?;
    let (addr1, len1, key1, asked) = keyed(&first)?;
    if len1 as usize != LEN {
        return Err(format!("a {len1}-byte keyed SGL for a {LEN}-byte command"));
    }
    if asked != (s.remote == RemoteAccess::Windows) {
        return Err(format!(
            "the keyed SGL's Invalidate Key subtype is {asked} with {:?}",
            s.remote
        ));
    }
    let probe = match case {
        Case::BogusInvalidate => {
            let second = c.next_command()?;
            let (_, _, key2, _) = keyed(&second)?;
            c.respond(first.cid(), Some(key2))?;
            let _ = done.recv_timeout(WAIT);
            return Ok(format!(
                "the target answered command {} invalidating key {key2:#x} of command {}",
                first.cid(),
                second.cid()
            ));
        }
        Case::WrongDirection => (key1, c.write(addr1, key1, 0x55)?),
        _ => {
            // The same command slot, and so the same window, each round.
            let (mut cmd, mut at, mut key) = (first, addr1, key1);
            let mut keys = Vec::new();
            for round in 0..ROUNDS {
                if round > 0 {
                    cmd = c.next_command()?;
                    (at, _, key, _) = keyed(&cmd)?;
                }
                keys.push(key);
                let wc = c.write(at, key, 0xaa)?;
                if !wc.ok() {
                    return Err(format!("the read's RDMA WRITE failed: {}", wc.status_str()));
                }
                c.respond(cmd.cid(), s.invalidate.then_some(key))?;
            }
            keys.sort_unstable();
            keys.dedup();
            if keys.len() != ROUNDS {
                return Err(format!("{ROUNDS} commands shared keys: {keys:x?}"));
            }
            done.recv_timeout(WAIT)
                .map_err(|_| "the host did not complete the commands")?;
            if case == Case::OutsideTheBuffer {
                at += LEN as u64;
            }
            (key, c.write(at, key, 0x55)?)
        }
    };
    let (key1, probe) = probe;
    if probe.ok() {
        return Err(format!(
            "an RDMA WRITE with key {key1:#x} was accepted by the host"
        ));
    }
    if case == Case::WrongDirection {
        let _ = done.recv_timeout(WAIT);
    }
    let when = match case {
        Case::WrongDirection => "for a write, an RDMA WRITE",
        Case::OutsideTheBuffer => "after the buffer's end",
        _ => "after the command",
    };
    Ok(format!(
        "key {key1:#x} refused {when}: {}",
        probe.status_str()
    ))
}

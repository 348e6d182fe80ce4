//! rdma_stall: an NVMe/RDMA host that stops taking responses, for the VM
//! suite's send_timeout scenario.
//!
//! It connects an admin queue (Connect data by keyed SGL: the target RDMA
//! READs it), enables the controller, connects one I/O queue (Connect data
//! in the capsule), posts reads with keyed SGLs into a registered buffer of
//! its own, and posts NO receive for their responses. Then it sleeps
//! without polling anything: the target's RDMA WRITEs land, but its
//! response SENDs get RNR NAKs for as long as the queue lives. Every
//! receive this host posts is one it needs for a response it waits for.
//!
//! rdma_stall ADDR:PORT SUBNQN [--reads 32] [--bs 128k] [--hold 30s] [--hostnqn NQN]
//!
//! Prints `stalled: ...` once the reads are posted, then `done` after
//! `--hold` (the queues go when the process exits).

use rdmablk_common::fabrics::{ConnectCmd, ConnectData, PropertyCmd, CONNECT_DATA_LEN};
use rdmablk_common::nvme::identify::{cns, ControllerId, NamespaceId, IDENTIFY_LEN};
use rdmablk_common::nvme::{admin, nvm, property, Cqe, Sgl, Sqe, CQE_LEN, SQE_LEN};
use rdmablk_common::rdma::private_data::{decode_reject, ConnectReply, ConnectRequest};
use rdmablk_common::rdma::{
    access, CmChannel, CmEventKind, CmId, CompChannel, Completion, ConnParam, Cq, Mr, Pd, QpConfig,
    SendOp, SendWr, Sge,
};
use rdmablk_common::units::{parse_duration, parse_size};
use rdmablk_tests::args::Flags;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Address and route resolution, connection establishment.
const CM_TIMEOUT: Duration = Duration::from_secs(5);
/// One admin command or Connect.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
const ADMIN_DEPTH: u16 = 32;
const HOSTID: [u8; 16] = *b"rdma_stall-hstid";
const DEFAULT_HOSTNQN: &str =
    "nqn.2014-08.org.nvmexpress:uuid:0e5a11ed-57a1-4000-8000-000000000001";
/// Send completions carry this bit in their wr_id; receives do not.
const SEND_BIT: u64 = 1 << 32;

fn main() {
    if let Err(e) = run() {
        eprintln!("rdma_stall: {e}");
        std::process::exit(1);
    }
}

type Res<T> = Result<T, String>;

fn run() -> Res<()> {
    let flags = Flags::from_env();
    let usage =
        "usage: rdma_stall ADDR:PORT SUBNQN [--reads 32] [--bs 128k] [--hold 30s] [--hostnqn NQN]";
    let (Some(addr), Some(subnqn)) = (flags.positional(0), flags.positional(1)) else {
        return Err(usage.into());
    };
    let addr: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let reads: u16 = flags.number("--reads", "32")?;
    let bs = parse_size(&flags.value("--bs", "128k")).map_err(|e| e.to_string())? as usize;
    let hold = parse_duration(&flags.value("--hold", "30s")).map_err(|e| e.to_string())?;
    let hostnqn = flags.value("--hostnqn", DEFAULT_HOSTNQN);
    if reads == 0 || reads > 1024 {
        return Err("--reads: 1 to 1024".into());
    }
    rdmablk_common::rdma::require_device().map_err(|e| e.to_string())?;

    // Admin queue: Connect (data by keyed SGL), CC.EN, wait for RDY,
    // Identify Controller and Namespace 1.
    let mut adm = RawQueue::connect(addr, 0, ADMIN_DEPTH, IDENTIFY_LEN)?;
    let data = ConnectData {
        hostid: HOSTID,
        cntlid: 0xffff,
        subnqn: subnqn.to_string(),
        hostnqn: hostnqn.clone(),
    }
    .encode();
    let cmd = ConnectCmd {
        recfmt: 0,
        qid: 0,
        sqsize: ADMIN_DEPTH - 1,
        cattr: 0,
        // No keep-alive: this host sends nothing once it stalls, and the
        // queue must end for send_timeout, not for KATO.
        kato: 0,
    };
    let cqe = adm.exec(cmd.to_sqe(0, &Sgl::Null), DataMode::KeyedOut(&data))?;
    check(&cqe, "admin Connect")?;
    let cntlid = cqe.dw0 as u16;
    let cc = 6 << 16 | 4 << 20 | property::CC_EN;
    let set = PropertyCmd {
        wide: false,
        offset: property::CC,
        value: cc as u64,
    };
    check(
        &adm.exec(set.to_sqe(0, true), DataMode::None)?,
        "Property Set CC.EN",
    )?;
    let start = Instant::now();
    loop {
        let get = PropertyCmd {
            wide: false,
            offset: property::CSTS,
            value: 0,
        };
        let cqe = adm.exec(get.to_sqe(0, false), DataMode::None)?;
        check(&cqe, "Property Get CSTS")?;
        if cqe.dw0 & property::CSTS_RDY != 0 {
            break;
        }
        if start.elapsed() > REPLY_TIMEOUT {
            return Err(format!(
                "CSTS.RDY not set after CC.EN (CSTS {:#x})",
                cqe.dw0
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut sqe = Sqe::new(admin::IDENTIFY, 0);
    sqe.set_cdw(10, cns::CONTROLLER as u32);
    check(
        &adm.exec(sqe, DataMode::KeyedIn(IDENTIFY_LEN))?,
        "Identify Controller",
    )?;
    let ctrl = ControllerId::parse(adm.data(IDENTIFY_LEN));
    let mut sqe = Sqe::new(admin::IDENTIFY, 0);
    sqe.set_nsid(1);
    sqe.set_cdw(10, cns::NAMESPACE as u32);
    check(
        &adm.exec(sqe, DataMode::KeyedIn(IDENTIFY_LEN))?,
        "Identify Namespace 1",
    )?;
    let ns = NamespaceId::parse(adm.data(IDENTIFY_LEN));
    let block = ns.block_size() as usize;
    let nlb = (bs / block).max(1);
    if (reads as u64) * (nlb as u64) > ns.nsze {
        return Err(format!(
            "namespace 1 has {} blocks: too small for {reads} reads of {bs}",
            ns.nsze
        ));
    }

    // I/O queue 1 of `reads` entries: Connect with its data in the capsule
    // when IOCCSZ allows (else keyed), then the reads, and no receives.
    let mut io = RawQueue::connect(addr, 1, reads.max(2), reads as usize * bs)?;
    let data = ConnectData {
        hostid: HOSTID,
        cntlid,
        subnqn: subnqn.to_string(),
        hostnqn,
    }
    .encode();
    let cmd = ConnectCmd {
        recfmt: 0,
        qid: 1,
        sqsize: reads.max(2) - 1,
        cattr: 0,
        kato: 0,
    };
    let in_capsule = (ctrl.ioccsz as usize * 16).saturating_sub(SQE_LEN) >= CONNECT_DATA_LEN;
    let mode = if in_capsule {
        DataMode::InCapsule(&data)
    } else {
        DataMode::KeyedOut(&data)
    };
    let cqe = io.exec(cmd.to_sqe(0, &Sgl::Null), mode)?;
    check(&cqe, "I/O queue Connect")?;
    io.data_mut(reads as usize * bs).fill(0);
    for i in 0..reads {
        let slba = i as u64 * nlb as u64;
        let mut sqe = Sqe::new(nvm::READ, i);
        sqe.set_nsid(1);
        sqe.set_cdw(10, slba as u32);
        sqe.set_cdw(11, (slba >> 32) as u32);
        sqe.set_cdw(12, nlb as u32 - 1);
        let off = i as usize * bs;
        let sgl = Sgl::Keyed {
            addr: io.data_addr(off) as u64,
            len: (nlb * block) as u32,
            key: io.mr.rkey(),
            invalidate: false,
        };
        sqe.set_sgl(&sgl);
        io.post_capsule(i as usize, &sqe, None)?;
    }
    println!(
        "stalled: cntlid {cntlid}, {reads} reads of {} bytes posted on I/O queue 1 \
         (Connect data {}), no receives posted; holding {hold:?} without polling",
        nlb * block,
        if in_capsule { "in capsule" } else { "keyed" }
    );
    let _ = std::io::stdout().flush();
    std::thread::sleep(hold);
    // The target's WRITEs may have landed; nothing else is looked at.
    println!("done");
    drop(io);
    drop(adm);
    Ok(())
}

fn check(cqe: &Cqe, what: &str) -> Res<()> {
    let st = cqe.status();
    if st.is_success() {
        Ok(())
    } else {
        Err(format!("{what} failed: {st} (dw0 {:#x})", cqe.dw0))
    }
}

/// How a command's data moves.
enum DataMode<'a> {
    None,
    /// Host to controller: the target RDMA READs it from our buffer.
    KeyedOut(&'a [u8]),
    /// Controller to host: the target RDMA WRITEs `n` bytes into our buffer.
    KeyedIn(usize),
    /// Host to controller, in the command capsule (a second SGE).
    InCapsule(&'a [u8]),
}

/// One NVMe/RDMA queue with all its memory in one registered region:
/// capsules, response slots, then data.
struct RawQueue {
    /// Declared first: the queue pair goes before the memory it may touch.
    id: CmId,
    cq: Cq,
    /// Before `mem`: deregistered before the memory is freed.
    mr: Mr,
    mem: Vec<u8>,
    depth: usize,
    addr: SocketAddr,
    wcs: Vec<Completion>,
}

impl RawQueue {
    fn capsule_off(&self, i: usize) -> usize {
        i * SQE_LEN
    }

    fn response_off(&self, i: usize) -> usize {
        self.depth * SQE_LEN + i * CQE_LEN
    }

    fn data_off(&self) -> usize {
        (self.depth * (SQE_LEN + CQE_LEN)).next_multiple_of(4096)
    }

    fn data(&self, len: usize) -> &[u8] {
        let o = self.data_off();
        &self.mem[o..o + len]
    }

    fn data_mut(&mut self, len: usize) -> &mut [u8] {
        let o = self.data_off();
        &mut self.mem[o..o + len]
    }

    fn data_addr(&self, off: usize) -> *const u8 {
        self.mem[self.data_off() + off..].as_ptr()
    }

    fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.mem[off..off + len].as_ptr(),
            len: len as u32,
            lkey: self.mr.lkey(),
        }
    }

    /// Resolves, creates the queue pair and registers `data_len` bytes of
    /// data space, then connects queue `qid` of `depth` entries.
    fn connect(addr: SocketAddr, qid: u16, depth: u16, data_len: usize) -> Res<RawQueue> {
        let err = |e: std::io::Error| format!("queue {qid} to {addr}: {e}");
        let cm = CmChannel::new().map_err(err)?;
        let mut id = CmId::new(&cm).map_err(err)?;
        id.resolve_addr(addr, CM_TIMEOUT).map_err(err)?;
        wait_cm(&cm, CmEventKind::AddrResolved, "address resolution")?;
        id.resolve_route(CM_TIMEOUT).map_err(err)?;
        wait_cm(&cm, CmEventKind::RouteResolved, "route resolution")?;
        let device = id.device().ok_or("no RDMA device for the address")?;
        let attrs = device.attrs().map_err(err)?;
        let pd: Arc<Pd> = Pd::new(device).map_err(err)?;
        let channel = CompChannel::new(device).map_err(err)?;
        let d = depth as u32;
        let cq = Cq::new(device, 2 * d + 8, &channel).map_err(err)?;
        id.create_qp(&QpConfig {
            pd: &pd,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            max_send_wr: d + 1,
            max_recv_wr: d + 1,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .map_err(err)?;
        let depth_n = depth as usize;
        let len = (depth_n * (SQE_LEN + CQE_LEN)).next_multiple_of(4096) + data_len.max(4096);
        let mut mem = vec![0u8; len];
        let rights = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
        // SAFETY: `mem` is never reallocated and outlives its registration
        // (field order of `RawQueue`: the region goes before the memory).
        let mr = unsafe { Mr::register(&pd, mem.as_mut_ptr(), len, rights) }.map_err(err)?;
        let req = ConnectRequest {
            recfmt: 0,
            qid,
            hrqsize: depth,
            hsqsize: depth - 1,
            cntlid: 0,
        }
        .encode();
        id.connect(&ConnParam {
            private_data: &req,
            responder_resources: attrs.max_qp_rd_atom,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
        })
        .map_err(err)?;
        let reply = wait_cm(&cm, CmEventKind::Established, "connect")?;
        if let Some(r) = ConnectReply::decode(&reply) {
            if r.crqsize < depth {
                return Err(format!(
                    "queue {qid}: the target takes {} commands at once, fewer than {depth}",
                    r.crqsize
                ));
            }
        }
        Ok(RawQueue {
            id,
            cq,
            mr,
            mem,
            depth: depth_n,
            addr,
            wcs: Vec::new(),
        })
    }

    /// Posts the SEND of command slot `i` (and its in-capsule data, which
    /// sits at the start of the data space).
    fn post_capsule(&mut self, i: usize, sqe: &Sqe, in_capsule: Option<usize>) -> Res<()> {
        let off = self.capsule_off(i);
        self.mem[off..off + SQE_LEN].copy_from_slice(&sqe.0);
        let mut sges = vec![self.sge(off, SQE_LEN)];
        if let Some(n) = in_capsule {
            sges.push(self.sge(self.data_off(), n));
        }
        let wr = SendWr {
            wr_id: SEND_BIT | i as u64,
            op: SendOp::Send { invalidate: None },
            sges: &sges,
            signaled: true,
            inline: false,
        };
        // SAFETY: the QP is alive; the capsule and data lie in the registered
        // region, which lives as long as the QP and is not written again
        // before this SEND completes (exec waits for it; the stalled reads'
        // capsules are never reused).
        unsafe { rdmablk_common::rdma::verbs::post_send(self.id.qp(), &[wr]) }
            .map_err(|e| format!("posting a command to {}: {e}", self.addr))
    }

    /// Runs one command (cid 0, slot 0): posts the one receive its response
    /// needs, sends it, and waits for both completions.
    fn exec(&mut self, mut sqe: Sqe, mode: DataMode) -> Res<Cqe> {
        sqe.set_cid(0);
        let rkey = self.mr.rkey();
        let base = self.data_addr(0) as u64;
        let mut in_capsule = None;
        match mode {
            DataMode::None => sqe.set_sgl(&Sgl::Keyed {
                addr: 0,
                len: 0,
                key: 0,
                invalidate: false,
            }),
            DataMode::KeyedOut(d) => {
                self.data_mut(d.len()).copy_from_slice(d);
                sqe.set_sgl(&Sgl::Keyed {
                    addr: base,
                    len: d.len() as u32,
                    key: rkey,
                    invalidate: false,
                });
            }
            DataMode::KeyedIn(n) => sqe.set_sgl(&Sgl::Keyed {
                addr: base,
                len: n as u32,
                key: rkey,
                invalidate: false,
            }),
            DataMode::InCapsule(d) => {
                self.data_mut(d.len()).copy_from_slice(d);
                sqe.set_sgl(&Sgl::InCapsule {
                    offset: 0,
                    len: d.len() as u32,
                });
                in_capsule = Some(d.len());
            }
        }
        let resp = self.sge(self.response_off(0), CQE_LEN);
        // SAFETY: the response slot is registered and left to the receive
        // until it completes (waited for below, or the QP is destroyed first).
        unsafe { rdmablk_common::rdma::verbs::post_recv(self.id.qp(), 0, &[resp]) }
            .map_err(|e| format!("posting a receive: {e}"))?;
        self.post_capsule(0, &sqe, in_capsule)?;
        let (mut sent, mut got) = (false, None);
        let deadline = Instant::now() + REPLY_TIMEOUT;
        while !(sent && got.is_some()) {
            if Instant::now() > deadline {
                return Err(format!(
                    "no answer from {} within {REPLY_TIMEOUT:?} (opcode {:#x})",
                    self.addr,
                    sqe.opcode()
                ));
            }
            let _ = self.cq.take_events();
            self.wcs.clear();
            self.cq
                .poll(&mut self.wcs)
                .map_err(|e| format!("polling the CQ: {e}"))?;
            if self.wcs.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
            }
            for wc in &self.wcs {
                let send = wc.wr_id & SEND_BIT != 0;
                if !wc.ok() {
                    let what = if send {
                        "command SEND"
                    } else {
                        "response receive"
                    };
                    return Err(format!("{what} failed: {}", wc.status_str()));
                }
                if send {
                    sent = true;
                } else {
                    if (wc.byte_len as usize) < CQE_LEN {
                        return Err(format!("a {}-byte response", wc.byte_len));
                    }
                    let o = self.response_off(0);
                    got = Some(Cqe::from_bytes(&self.mem[o..o + CQE_LEN]));
                }
            }
        }
        let cqe = got.expect("loop ends with a response");
        if cqe.cid != 0 {
            return Err(format!("a response for cid {}, expected 0", cqe.cid));
        }
        Ok(cqe)
    }
}

/// Waits for the CM event that ends a step; anything else is an error.
fn wait_cm(cm: &CmChannel, want: CmEventKind, what: &str) -> Res<Vec<u8>> {
    let deadline = Instant::now() + CM_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("{what} timed out after {CM_TIMEOUT:?}"));
        }
        let Some(ev) = cm.wait_event(left).map_err(|e| e.to_string())? else {
            continue;
        };
        if ev.kind == want {
            return Ok(ev.private_data);
        }
        return Err(match ev.kind {
            CmEventKind::Rejected => match decode_reject(&ev.private_data) {
                Ok(st) => format!("{what}: the target refused the queue: {}", st.describe()),
                Err(code) => format!("{what}: rejected (status {code:?})"),
            },
            _ => format!("{what} failed: {} (status {})", ev.name, ev.status),
        });
    }
}

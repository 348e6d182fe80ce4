//! The transport-independent life of one command: classify and validate it,
//! execute Fabrics and admin commands, and turn I/O commands into backend
//! operations whose completions are counted here. Transports move the data
//! and send the response.

use crate::backend::{Access, Backend, BackendOp, FixedBuf};
use crate::base::budget::{Ledger, PollerBudget};
use crate::nvme::controller::{
    self, admin_transfer_len, fabrics_transfer_len, Association, Reply, TransferLen, MAX_AERS,
};
use crate::nvme::fabric::TransportCaps;
use crate::nvme::io_cmd::{self, IoKind, IoRequest};
use crate::nvme::port::Arrival;
use crate::nvme::subsystem::Registry;
use rdmablk_common::fabrics::{fctype, CONNECT_ATR, CONNECT_DATA_LEN};
use rdmablk_common::mem::{Arena, ArenaBuf};
use rdmablk_common::nvme::{DataDirection, Sqe, Status, FABRICS_OPCODE, PSDT_SGL};
use std::sync::Arc;

/// Largest data of an admin or Fabrics command (Identify and log pages are
/// 4 KiB; the discovery log grows by 1 KiB per entry).
const MAX_ADMIN_DATA: usize = 256 << 10;
/// Largest Dataset Management data: 256 ranges of 16 bytes.
const MAX_DSM_DATA: usize = 256 * 16;

/// Where a command is in its life. A command starts `Received`; a free
/// slot holds none. Every transport moves its commands through these
/// states with `Queue::advance` (`engine::queue`), which traces each transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Planned from its capsule; nothing done yet.
    Received,
    /// Waiting for arena space for its data, in arrival order.
    AwaitingBuffer,
    /// Its data is coming from the host (R2T and H2CData, or RDMA READ).
    FetchingData,
    /// Backend operations are in flight.
    OnBackend,
    /// Its data and then its response are on their way to the host
    /// (C2HData, or RDMA WRITE and SEND); freed once sent.
    ReturningData,
    /// Its response is on its way; freed once sent.
    Responding,
}

/// What kind of work a command is.
pub enum Work {
    /// Fabrics Connect, before the queue has an association.
    Connect,
    /// Another Fabrics command (Property Get/Set, Disconnect).
    Fabrics,
    /// An admin command.
    Admin,
    /// An I/O command.
    Io(IoRequest),
}

/// A command between its capsule and its response.
pub struct Command {
    pub sqe: Sqe,
    /// Where it is in its life.
    pub state: State,
    pub work: Work,
    /// Data bytes the command moves (either way).
    pub len: usize,
    /// Direction of the data.
    pub to_host: bool,
    /// Arena buffer holding the data, when `len > 0`.
    pub buf: Option<ArenaBuf>,
    /// Host-to-controller bytes received so far.
    pub received: usize,
    /// Host-to-controller bytes asked for so far (R2T on NVMe/TCP).
    pub requested: usize,
    /// In-capsule data held until an arena buffer is free.
    pub staged: Option<Vec<u8>>,
    /// When the command last waited for the host (its data).
    pub since: std::time::Instant,
    /// When its capsule arrived (its latency in metrics runs from here).
    pub arrived: std::time::Instant,
    /// Final status, once known.
    pub status: Status,
    /// CQE dwords 0 and 1.
    pub dw0: u32,
    pub dw1: u32,
    /// Backend operations in flight.
    pub ops_in_flight: u32,
    /// For a single read/write: bytes the backend has finished.
    done_bytes: usize,
    /// Write Zeroes already retried the other way of zeroing.
    zeroing_fallback: bool,
    /// A FUA write's flush (backends that need one) was started.
    fua_flushed: bool,
}

/// Classifies a capsule. `sgl_len` is the length its data pointer describes;
/// `poller` is the poller's index (an I/O command counts in its metrics).
/// An `Err` is the status to complete the command with at once.
pub fn plan(
    assoc: Option<&Association>,
    sqe: &Sqe,
    sgl_len: u32,
    poller: usize,
) -> Result<Command, Status> {
    // As nvmet_req_init: no fused operations (Compare and Write is not
    // supported), and every Fabrics command uses SGLs (NVMe over Fabrics
    // 1.1, 2.1: PSDT 01b).
    if sqe.fuse() != 0 || sqe.psdt() != PSDT_SGL {
        return Err(Status::INVALID_FIELD);
    }
    let is_fabrics = sqe.opcode() == FABRICS_OPCODE;
    let work = match assoc {
        None if is_fabrics && sqe.fctype() == fctype::CONNECT => Work::Connect,
        None => return Err(Status::COMMAND_SEQUENCE_ERROR),
        Some(_) if is_fabrics => Work::Fabrics,
        // Until the queue has authenticated, only Fabrics commands run
        // (nvmet_check_auth_status): Authentication Required, DNR.
        Some(a) if a.auth_pending() => return Err(Status::AUTH_REQUIRED),
        Some(a) if a.qid == 0 => Work::Admin,
        Some(a) => Work::Io(io_cmd::decode(
            |nsid| a.namespace(nsid),
            a.ctrl.ana(),
            sqe,
            sgl_len,
            a.ctrl.caps().max_transfer(),
            poller,
        )?),
    };
    let dir = DataDirection::from_code(if is_fabrics {
        sqe.fctype()
    } else {
        sqe.opcode()
    });
    let len = match &work {
        // io_cmd::decode checked the SGL against the command.
        Work::Io(req) => req.data_to_controller().max(req.data_to_host()),
        _ => {
            let want = if is_fabrics {
                fabrics_transfer_len(sqe)
            } else {
                admin_transfer_len(sqe)
            }
            .ok_or(Status::INVALID_OPCODE)?;
            let sgl_len = sgl_len as usize;
            // NVMe Base 2.1, 4.3.2 and Figure 102: an SGL shorter than the
            // transfer, or longer where the command does not allow it (as
            // nvmet; oversized SGLs are not advertised), is a Data SGL
            // Length Invalid.
            let fits = match want {
                TransferLen::Exact(n) => sgl_len == n,
                TransferLen::AtLeast(n) => sgl_len >= n,
            };
            if sgl_len > MAX_ADMIN_DATA {
                return Err(Status::INVALID_FIELD);
            }
            if !fits {
                return Err(Status::SGL_DATA_LENGTH_INVALID);
            }
            sgl_len
        }
    };
    let max = assoc.map_or(MAX_ADMIN_DATA, |a| a.ctrl.caps().max_transfer());
    if len > max || dir == DataDirection::Bidirectional {
        return Err(Status::INVALID_FIELD);
    }
    let to_host = match &work {
        Work::Io(req) => req.data_to_host() > 0,
        _ => dir == DataDirection::ToHost,
    };
    let now = std::time::Instant::now();
    Ok(Command {
        sqe: *sqe,
        state: State::Received,
        work,
        len,
        to_host,
        buf: None,
        received: 0,
        requested: 0,
        staged: None,
        since: now,
        arrived: now,
        status: Status::SUCCESS,
        dw0: 0,
        dw1: 0,
        ops_in_flight: 0,
        done_bytes: 0,
        zeroing_fallback: false,
        fua_flushed: false,
    })
}

/// The backend operations of one command: one, except for Dataset
/// Management, so they live inline.
pub type Entries = smallvec::SmallVec<[BackendOp; 1]>;

/// What executing a command led to.
pub enum Progress {
    /// The response can be sent now.
    Complete,
    /// Backend operations were queued; their completions finish the command.
    Waiting(Entries),
    /// The command is an AER to hold.
    Held,
}

/// Result of executing a Connect.
pub enum Connected {
    Yes(Association),
    No,
}

impl Command {
    /// Copies the start of the command's data into `out`; returns what was
    /// copied (the data is never borrowed: the arena is device memory).
    pub fn copy_data<'a>(&self, arena: &Arena, out: &'a mut [u8]) -> &'a [u8] {
        let Some(b) = &self.buf else {
            return &[];
        };
        let n = self.len.min(out.len());
        arena.read(b, 0, &mut out[..n]);
        &out[..n]
    }

    fn fixed(&self, arena: &Arena, from: usize) -> FixedBuf {
        let buf = self
            .buf
            .as_ref()
            .expect("I/O command with data has a buffer");
        FixedBuf {
            ptr: arena.addr(buf, from),
            len: self.len - from,
            index: rdmablk_common::ring::ARENA_BUF_INDEX,
        }
    }

    /// Executes a Connect on a queue that has no association yet.
    pub fn connect(
        &mut self,
        registry: &Arc<Registry>,
        arena: &Arena,
        caps: TransportCaps,
        arrival: &Arrival,
        peer: &str,
    ) -> Connected {
        let mut data = [0u8; CONNECT_DATA_LEN];
        let data = self.copy_data(arena, &mut data);
        match controller::connect(registry, &self.sqe, data, caps, arrival) {
            Ok(a) => {
                self.dw0 = a.ctrl.cntlid as u32;
                if a.auth_required {
                    self.dw0 |= CONNECT_ATR;
                }
                tracing::debug!(
                    peer,
                    cntlid = a.ctrl.cntlid,
                    qid = a.qid,
                    depth = a.depth,
                    "queue connected"
                );
                Connected::Yes(a)
            }
            Err(r) if r.status == Status::CONTROLLER_BUSY => {
                // A limit: hosts retry, so say it at most once a second.
                if let Some(more) = registry.admission.refusals.allow() {
                    tracing::warn!(
                        peer,
                        suppressed = more,
                        "Connect refused with Controller Busy (the host may retry): {}",
                        r.reason
                    );
                }
                self.status = r.status;
                self.dw0 = r.dw0;
                Connected::No
            }
            Err(r) => {
                tracing::warn!(peer, status = %r.status, "Connect refused: {}", r.reason);
                self.status = r.status;
                self.dw0 = r.dw0;
                Connected::No
            }
        }
    }

    /// Executes the command on an associated queue. `held_aers` is how many
    /// AERs the queue already holds.
    pub fn execute(
        &mut self,
        assoc: &Association,
        arena: &mut Arena,
        held_aers: usize,
    ) -> Progress {
        let reply = match &self.work {
            Work::Connect => unreachable!("Connect runs through Command::connect"),
            Work::Fabrics if matches!(self.sqe.fctype(), fctype::AUTH_SEND | fctype::AUTH_RECV) => {
                let mut data = vec![0u8; if self.to_host { 0 } else { self.len }];
                let data = self.copy_data(arena, &mut data);
                assoc.authenticate(&self.sqe, data)
            }
            Work::Fabrics => assoc.ctrl.fabrics(&self.sqe, assoc.qid),
            Work::Admin => {
                // Admin data from the host is small and rare (Set Features):
                // a copy off the arena.
                let mut data = vec![0u8; if self.to_host { 0 } else { self.len }];
                let data = self.copy_data(arena, &mut data);
                assoc.ctrl.admin(&self.sqe, data)
            }
            Work::Io(_) => return self.start_io(arena),
        };
        match reply {
            Reply::Held if held_aers >= MAX_AERS => {
                self.status = Status::ASYNC_EVENT_LIMIT;
                Progress::Complete
            }
            Reply::Held => Progress::Held,
            Reply::After(job) => {
                self.ops_in_flight = 1;
                let mut entries = Entries::new();
                entries.push(BackendOp::Offload(job));
                Progress::Waiting(entries)
            }
            Reply::Done {
                status,
                dw0,
                dw1,
                data,
            } => {
                self.status = status;
                self.dw0 = dw0;
                self.dw1 = dw1;
                if self.to_host && status.is_success() {
                    if let Some(b) = &self.buf {
                        let n = data.len().min(self.len);
                        arena.write(b, 0, &data[..n]);
                        arena.fill(b, n, self.len - n, 0);
                    }
                }
                Progress::Complete
            }
        }
    }

    fn start_io(&mut self, arena: &mut Arena) -> Progress {
        let Work::Io(req) = &self.work else {
            unreachable!("start_io on a non-I/O command")
        };
        let (ns, offset, len) = (req.ns.clone(), req.offset, req.len);
        // One operation for everything but Dataset Management: no heap on
        // the I/O path.
        let mut entries = Entries::new();
        let mut take = |a: Access, status: &mut Status| match a {
            Access::Done(Ok(())) => {}
            Access::Done(Err(st)) => *status = st,
            Access::Submit(e) => entries.push(e),
        };
        match req.kind {
            IoKind::Read => take(
                ns.backend.read(offset, self.fixed(arena, 0)),
                &mut self.status,
            ),
            IoKind::Write { fua } => take(
                ns.backend.write(offset, self.fixed(arena, 0), fua),
                &mut self.status,
            ),
            IoKind::Flush => take(ns.backend.flush(), &mut self.status),
            IoKind::WriteZeroes { deallocate } => {
                take(ns.backend.zero(offset, len, deallocate), &mut self.status)
            }
            IoKind::Dsm { deallocate: false } => {}
            IoKind::Dsm { deallocate: true } => {
                match io_cmd::dsm_ranges(&ns, self.copy_data(arena, &mut [0u8; MAX_DSM_DATA])) {
                    Ok(ranges) => {
                        for (o, l) in ranges {
                            take(ns.backend.zero(o, l, true), &mut self.status);
                        }
                    }
                    Err(st) => self.status = st,
                }
            }
        }
        self.ops_in_flight = entries.len() as u32;
        if entries.is_empty() {
            Progress::Complete
        } else {
            Progress::Waiting(entries)
        }
    }

    /// Handles a backend completion (`res` as io_uring reports it). Returns
    /// a follow-up operation to submit, if any; the command is complete when
    /// `ops_in_flight` is back to zero. `acre` says whether the host enabled
    /// Advanced Command Retry.
    pub fn on_backend_done(
        &mut self,
        res: i32,
        arena: &Arena,
        acre: impl FnOnce() -> bool,
    ) -> Option<BackendOp> {
        let Work::Io(req) = &self.work else {
            unreachable!("backend completion for a non-I/O command")
        };
        let rw = matches!(req.kind, IoKind::Read | IoKind::Write { .. });
        if res < 0 {
            let errno = -res;
            if let (libc::EOPNOTSUPP, IoKind::WriteZeroes { deallocate }) = (errno, req.kind) {
                if !self.zeroing_fallback {
                    // The other way of zeroing: a hole where ZERO_RANGE is
                    // missing (some file systems), ZERO_RANGE where a hole
                    // cannot be punched (block devices without discard).
                    self.zeroing_fallback = true;
                    return Some(
                        req.ns
                            .backend
                            .zero(req.offset, req.len, !deallocate)
                            .into_op(),
                    );
                }
            }
            if errno == libc::EOPNOTSUPP && matches!(req.kind, IoKind::Dsm { .. }) {
                // Deallocation is advisory: the blocks simply stay allocated.
                tracing::debug!("deallocate not supported by the backend; ignored");
            } else if errno == libc::ETIMEDOUT
                || matches!(errno, libc::ESHUTDOWN | libc::ENOTCONN)
                    && matches!(req.ns.backend, Backend::Rbd(_))
            {
                // The backend (a cluster) did not answer in time, or (RBD)
                // refused a client it blocklisted, which the backend
                // replaces, saying so once: a status the host retries (NVMe
                // Base 2.1, 4.2.3.1, Generic Command Status Values). Command
                // Interrupted (21h) only once the host enabled ACRE, as the
                // specification allows it only then (with the controller's
                // retry delay); Namespace Not Ready (82h) before.
                self.status = if acre() {
                    Status::COMMAND_INTERRUPTED
                } else {
                    Status::NAMESPACE_NOT_READY
                };
                if errno == libc::ETIMEDOUT {
                    tracing::warn!(
                        opcode = self.sqe.opcode(),
                        offset = req.offset,
                        len = req.len,
                        backend = %req.ns.backend.describe(),
                        "backend I/O timed out; answered {} (the host may retry)",
                        self.status
                    );
                }
            } else {
                tracing::error!(
                    opcode = self.sqe.opcode(),
                    offset = req.offset,
                    len = req.len,
                    "backend I/O failed: {}",
                    std::io::Error::from_raw_os_error(errno)
                );
                self.status = Status::INTERNAL_ERROR;
            }
        } else if rw {
            self.done_bytes += res as usize;
            if self.done_bytes < self.len {
                if res == 0 {
                    tracing::error!(
                        offset = req.offset,
                        "backend returned end of file inside the namespace"
                    );
                    self.status = Status::INTERNAL_ERROR;
                } else {
                    // Short transfer: continue where it stopped.
                    let buf = self.fixed(arena, self.done_bytes);
                    let at = req.offset + self.done_bytes as u64;
                    let access = match req.kind {
                        IoKind::Read => req.ns.backend.read(at, buf),
                        IoKind::Write { fua } => req.ns.backend.write(at, buf, fua),
                        _ => unreachable!(),
                    };
                    return Some(access.into_op());
                }
            } else if let IoKind::Write { fua: true } = req.kind {
                if req.ns.backend.flush_after_fua() && !self.fua_flushed {
                    // Durable before completion: the flush that follows.
                    self.fua_flushed = true;
                    return Some(req.ns.backend.flush().into_op());
                }
            }
        }
        self.ops_in_flight -= 1;
        None
    }

    /// Gives the data buffer back to the arena, through the queue's ledger.
    pub fn release(&mut self, ledger: &mut Ledger, arena: &mut Arena, pool: &mut PollerBudget) {
        if let Some(b) = self.buf.take() {
            ledger.free(b, arena, pool);
        }
        if let Some(d) = self.staged.take() {
            ledger.unstage(d, pool);
        }
    }

    /// Whether this is a Fabrics Disconnect.
    pub fn is_disconnect(&self) -> bool {
        matches!(self.work, Work::Fabrics) && self.sqe.fctype() == fctype::DISCONNECT
    }
}

impl Access {
    /// The operation of a backend that always submits one (files, RBD).
    fn into_op(self) -> BackendOp {
        match self {
            Access::Submit(op) => op,
            Access::Done(_) => unreachable!("only file and RBD backends follow up operations"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limits;
    use crate::testing::*;
    use rdmablk_common::nvme::{admin, feature, nvm, Sgl};

    /// The status `plan` answers a command with at once, or its data length.
    fn planned(assoc: Option<&Association>, mut sqe: Sqe, sgl_len: u32) -> Result<usize, Status> {
        sqe.set_sgl(&Sgl::Transport { len: sgl_len });
        plan(assoc, &sqe, sgl_len, 0).map(|c| c.len)
    }

    /// NVMe Base 2.1, Figure 91 (CDW0) and nvmet_req_init: fabrics commands
    /// use SGLs (PSDT 01b) and nothing is fused.
    #[test]
    fn psdt_and_fuse_are_checked_first() {
        let reg = registry(Limits::default());
        let a = enabled(&reg, 1);
        let mut sqe = Sqe::new(admin::KEEP_ALIVE, 1);
        sqe.set_sgl(&Sgl::Transport { len: 0 });
        assert!(plan(Some(&a), &sqe, 0, 0).is_ok());
        for flags in [0x00, 0x80, 0xc0, 0x41, 0x42] {
            sqe.set_flags(flags);
            assert_eq!(
                plan(Some(&a), &sqe, 0, 0).err(),
                Some(Status::INVALID_FIELD),
                "flags {flags:#04x}"
            );
        }
    }

    /// NVMe Base 2.1, 4.3.2 and Figure 102 (0Fh): the SGL describes exactly
    /// what the command transfers; Set Features (like Dataset Management)
    /// may describe more, as nvmet allows. Unknown opcodes are Invalid
    /// Opcode before any length rule.
    #[test]
    fn admin_transfer_lengths() {
        let reg = registry(Limits::default());
        let a = enabled(&reg, 1);
        let mut identify = Sqe::new(admin::IDENTIFY, 2);
        identify.set_cdw(10, 1);
        assert_eq!(planned(Some(&a), identify, 4096), Ok(4096));
        for len in [0, 2048, 8192] {
            assert_eq!(
                planned(Some(&a), identify, len),
                Err(Status::SGL_DATA_LENGTH_INVALID),
                "Identify with {len} bytes"
            );
        }
        let mut set = Sqe::new(admin::SET_FEATURES, 3);
        set.set_cdw(10, feature::NUM_QUEUES as u32);
        assert_eq!(planned(Some(&a), set, 4096), Ok(4096), "longer SGL allowed");
        set.set_cdw(10, feature::HOST_BEHAVIOR as u32);
        assert_eq!(
            planned(Some(&a), set, 256),
            Err(Status::SGL_DATA_LENGTH_INVALID),
            "Host Behavior Support needs 512 bytes"
        );
        let mut get = Sqe::new(admin::GET_FEATURES, 4);
        get.set_cdw(10, feature::HOST_ID as u32);
        assert_eq!(planned(Some(&a), get, 16), Ok(16));
        get.set_cdw(10, feature::KEEP_ALIVE as u32);
        assert_eq!(
            planned(Some(&a), get, 16),
            Err(Status::SGL_DATA_LENGTH_INVALID)
        );
        assert_eq!(
            planned(Some(&a), Sqe::new(0x7e, 5), 4096),
            Err(Status::INVALID_OPCODE)
        );
        assert_eq!(
            planned(None, identify, 4096),
            Err(Status::COMMAND_SEQUENCE_ERROR),
            "before Connect"
        );
    }

    /// I/O command decoding: the opcode first (Keep Alive on an I/O queue is
    /// an Invalid Opcode whatever its NSID), then the namespace, the range
    /// and the SGL.
    #[test]
    fn io_command_rules() {
        let reg = registry(Limits::default());
        let a = enabled(&reg, 1);
        let q = io_connect(&reg, &a, 1).expect("I/O queue");
        let io = |opcode: u8, nsid: u32, slba: u64, nlb: u32| {
            let mut sqe = Sqe::new(opcode, 6);
            sqe.set_nsid(nsid);
            sqe.set_cdw(10, slba as u32);
            sqe.set_cdw(11, (slba >> 32) as u32);
            sqe.set_cdw(12, nlb - 1);
            sqe
        };
        let blocks = 16 << 20 >> 9;
        assert_eq!(planned(Some(&q), io(nvm::READ, 1, 0, 8), 4096), Ok(4096));
        assert_eq!(
            planned(Some(&q), io(nvm::READ, 1, 0, 8), 2048),
            Err(Status::SGL_DATA_LENGTH_INVALID)
        );
        assert_eq!(
            planned(Some(&q), io(nvm::WRITE, 1, blocks - 4, 8), 4096),
            Err(Status::LBA_OUT_OF_RANGE)
        );
        assert_eq!(
            planned(Some(&q), io(nvm::READ, 99, 0, 8), 4096),
            Err(Status::INVALID_NAMESPACE)
        );
        for nsid in [0, 1, 99] {
            assert_eq!(
                planned(Some(&q), io(admin::KEEP_ALIVE, nsid, 0, 1), 0),
                Err(Status::INVALID_OPCODE),
                "Keep Alive on an I/O queue, nsid {nsid}"
            );
        }
        assert_eq!(
            planned(Some(&q), io(nvm::FLUSH, 1, 0, 1), 512),
            Err(Status::SGL_DATA_LENGTH_INVALID),
            "Flush carries no data"
        );
        let mut dsm = io(nvm::DSM, 1, 0, 1);
        dsm.set_cdw(10, 0); // one range
        dsm.set_cdw(11, 1 << 2);
        assert_eq!(planned(Some(&q), dsm, 4096), Ok(16), "a page for one range");
    }
}

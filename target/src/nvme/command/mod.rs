//! The transport-independent life of one command: classify and validate it,
//! execute Fabrics and admin commands, and turn I/O commands into backend
//! operations whose completions are counted here. Transports move the data
//! and send the response.
//!
//! I/O commands have one room here: `decode` (decoding and validation
//! against the namespace), `io` (their execution) and `reservation` (the
//! reservation commands).

use crate::backend::{BackendOp, Later};
use crate::base::budget::{Ledger, PollerBudget};
use crate::nvme::controller::{
    self, admin_transfer_len, fabrics_transfer_len, Association, Reply, TransferLen, MAX_AERS,
};
use crate::nvme::fabric::TransportCaps;
use crate::nvme::port::Arrival;
use crate::nvme::subsystem::Registry;
use crate::service::reservation::ptpl::Saver;
use crate::service::write_gate::Pass;
use rdmablk_common::fabrics::{fctype, CONNECT_ATR, CONNECT_DATA_LEN};
use rdmablk_common::mem::{Arena, ArenaBuf};
use rdmablk_common::nvme::{DataDirection, Sqe, Status, FABRICS_OPCODE, PSDT_SGL};
use std::sync::Arc;

/// Largest data of an admin or Fabrics command (Identify and log pages are
/// 4 KiB; the discovery log grows by 1 KiB per entry).
const MAX_ADMIN_DATA: usize = 256 << 10;

mod decode;
mod io;
mod reservation;

use decode::IoRequest;

/// Where a command is in its life. A command starts `Received`; a free
/// slot holds none. Every transport moves its commands through these
/// states with `Queue::advance` (`engine::queue`), which traces each transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Planned from its capsule; nothing done yet.
    Received,
    /// Held back by its QoS limits until its time comes.
    Throttled,
    /// Waiting for arena space for its data, in arrival order.
    AwaitingBuffer,
    /// Its data is coming from the host (R2T and H2CData, or RDMA READ).
    FetchingData,
    /// A command of a fused operation, its data arrived, waits for the
    /// other (Compare and Write runs as one).
    AwaitingPartner,
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
    /// Where its backend work is (I/O commands).
    step: Step,
    /// Its pass through the namespace's write gate, while it writes.
    gate: Option<Pass>,
    /// The other command of its fused operation, by slot.
    pub partner: Option<u16>,
    /// The first command of a fused Compare and Write holds the data of
    /// its second (the Write) once both arrived.
    pub partner_buf: Option<ArenaBuf>,
    /// What became of that Write (the first command carries it out).
    pub fused_write_status: Status,
    /// That Write asked for Force Unit Access.
    pub fused_fua: bool,
}

/// Where an I/O command's backend work is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Its operations as planned.
    Run,
    /// Waiting for its write gate pass (this id).
    Gate(u64),
    /// A Compare reads what it compares with.
    CompareRead,
    /// A fused Compare and Write writes, the data having matched.
    FusedWrite,
    /// librbd compares and writes (one operation).
    RbdCompareAndWrite,
    /// A Preempt and Abort waits for the writes on the backend (exclusive
    /// pass `id`); the state file is written next if `persist`.
    Drain { id: u64, persist: bool },
    /// A reservation command waits for its state file to be written.
    Persist,
    /// A reservation command waits for the gateway group's record.
    Shared,
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
    let is_fabrics = sqe.opcode() == FABRICS_OPCODE;
    // Every Fabrics command uses SGLs (NVMe over Fabrics 1.1, 2.1: PSDT
    // 01b), and only I/O commands are fused (Compare and Write; which ones
    // `decode::decode` says).
    let io_queue = !is_fabrics && assoc.is_some_and(|a| a.qid != 0);
    if sqe.psdt() != PSDT_SGL || sqe.fuse() != 0 && !io_queue {
        return Err(Status::INVALID_FIELD);
    }
    let work = match assoc {
        None if is_fabrics && sqe.fctype() == fctype::CONNECT => Work::Connect,
        None => return Err(Status::COMMAND_SEQUENCE_ERROR),
        Some(_) if is_fabrics => Work::Fabrics,
        // Until the queue has authenticated, only Fabrics commands run
        // (nvmet_check_auth_status): Authentication Required, DNR.
        Some(a) if a.auth_pending() => return Err(Status::AUTH_REQUIRED),
        Some(a) if a.qid == 0 => Work::Admin,
        Some(a) => Work::Io(decode::decode(
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
        // decode::decode checked the SGL against the command.
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
        step: Step::Run,
        gate: None,
        partner: None,
        partner_buf: None,
        fused_write_status: Status::SUCCESS,
        fused_fua: false,
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
            Work::Io(_) => return self.start_io(arena, &assoc.ctrl),
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
            Reply::Persist(what) => {
                self.step = Step::Persist;
                self.ops_in_flight = 1;
                let mut entries = Entries::new();
                entries.push(BackendOp::Later(Later::new(move |token, completions| {
                    Saver::get().save(&what, token, completions)
                })));
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

    /// Whether the admin command was waiting for a state file (Set Features
    /// Reservation Persistence), now written (`res` 0) or not: it is then
    /// complete.
    pub fn persisted(&mut self, res: i32) -> bool {
        if self.step != Step::Persist {
            return false;
        }
        self.step = Step::Run;
        if res < 0 {
            tracing::error!(
                "cannot write the reservation state file: {}; Set Features fails",
                std::io::Error::from_raw_os_error(-res)
            );
            self.status = Status::INTERNAL_ERROR;
        }
        true
    }

    /// Arena bytes its data needs (a Compare holds what it reads too).
    pub fn buffer_len(&self) -> usize {
        match &self.work {
            Work::Io(req) => req.buffer_len(),
            _ => self.len,
        }
    }

    /// Gives the data buffers back to the arena, through the queue's
    /// ledger, and its write gate pass to its namespace.
    pub fn release(&mut self, ledger: &mut Ledger, arena: &mut Arena, pool: &mut PollerBudget) {
        self.leave_gate();
        for b in [self.buf.take(), self.partner_buf.take()]
            .into_iter()
            .flatten()
        {
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

#[cfg(test)]
mod tests;

//! NVM command set I/O commands: decoding and validation against the
//! namespace, before any data moves. Transport independent.

use crate::base::metrics::Op;
use crate::config::QosClass;
use crate::nvme::namespace::Namespace;
use crate::service::ana::AnaStates;
use crate::service::qos::Throttle;
use crate::service::reservation::AccessGroup;
use rdmablk_common::nvme::resv::{KEYS_LEN, KEY_LEN, STATUS_EXT_HEADER};
use rdmablk_common::nvme::{fuse, nvm, DsmCmd, DsmRange, ReadWriteCmd, Sqe, Status, DSM_RANGE_LEN};
use std::sync::Arc;
use std::time::Instant;

/// What an I/O command asks the backend to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    /// Read `len` bytes at `offset` and return them to the host.
    Read,
    /// Receive `len` bytes from the host and write them at `offset`.
    Write {
        fua: bool,
    },
    Flush,
    /// Zero `len` bytes at `offset`, deallocating if allowed.
    WriteZeroes {
        deallocate: bool,
    },
    /// Dataset Management: receive `len` bytes of ranges; deallocate them when
    /// `deallocate` is set (other attributes are hints and need no action).
    Dsm {
        deallocate: bool,
    },
    /// Receive `len` bytes from the host and compare them with those at
    /// `offset`; the first command of a fused Compare and Write also writes
    /// its partner's data when they match.
    Compare,
    /// A reservation command: Register, Acquire and Release receive `len`
    /// bytes of keys; Report returns `len` bytes.
    Reservation(u8),
}

impl IoKind {
    /// The command group the reservation access rules put it in; `None`
    /// for the reservation commands themselves (NVMe Base 2.1, 8.1.22).
    pub fn access_group(self) -> Option<AccessGroup> {
        match self {
            IoKind::Read | IoKind::Compare => Some(AccessGroup::Read),
            IoKind::Reservation(_) => None,
            _ => Some(AccessGroup::Write),
        }
    }

    /// What QoS limits count it as: a read (Read, Compare), a write (Write,
    /// Write Zeroes, Dataset Management), or neither (`None`: Flush,
    /// reservation commands).
    pub fn qos_class(self) -> Option<QosClass> {
        match self {
            IoKind::Read | IoKind::Compare => Some(QosClass::Read),
            IoKind::Write { .. } | IoKind::WriteZeroes { .. } | IoKind::Dsm { .. } => {
                Some(QosClass::Write)
            }
            IoKind::Flush | IoKind::Reservation(_) => None,
        }
    }
}

/// A validated I/O command.
pub struct IoRequest {
    pub kind: IoKind,
    pub ns: Arc<Namespace>,
    /// Byte offset in the namespace.
    pub offset: u64,
    /// Bytes of data the command moves (Read/Write/DSM), or zeroes (Write Zeroes).
    pub len: u64,
    /// The poller whose metrics slot of the namespace counts the command.
    pub poller: usize,
    /// The namespace's Preempt and Abort count when it arrived.
    pub aborts_seen: u64,
    /// The QoS limits it falls under, if any.
    pub throttle: Option<Throttle>,
    /// Since when and until when it waits for them.
    held: Option<(Instant, Instant)>,
}

impl Drop for IoRequest {
    fn drop(&mut self) {
        self.release();
        self.ns.metrics.of(self.poller).end();
    }
}

impl IoRequest {
    /// Takes the command's cost from its QoS limits at `now`: it waits
    /// until the instant returned, if any.
    pub fn hold(&mut self, now: Instant) -> Option<Instant> {
        let t = self.throttle.as_ref()?;
        let class = self.kind.qos_class()?;
        let bytes = self.data_to_host().max(self.data_to_controller()) as u64;
        let until = t.admit(class, bytes, now)?;
        self.held = Some((now, until));
        self.ns.metrics.of(self.poller).held();
        Some(until)
    }

    /// Whether a held command may go at `now` (its time came, or its
    /// limits were replaced).
    pub fn may_go(&self, now: Instant) -> bool {
        self.held.is_none_or(|(_, until)| until <= now)
            || self.throttle.as_ref().is_some_and(Throttle::retired)
    }

    /// When a held command may go.
    pub fn held_until(&self) -> Option<Instant> {
        self.held.map(|(_, until)| until)
    }

    /// Ends a hold (the command goes, or is dropped): its time counts.
    pub fn release(&mut self) {
        if let Some((since, _)) = self.held.take() {
            self.ns.metrics.of(self.poller).released(since.elapsed());
        }
    }

    /// The operation class metrics count the command under.
    pub fn op(&self) -> Op {
        match self.kind {
            IoKind::Read => Op::Read,
            IoKind::Write { .. } => Op::Write,
            _ => Op::Other,
        }
    }

    /// Bytes the host sends (Write, DSM ranges, Compare, reservation keys).
    pub fn data_to_controller(&self) -> usize {
        match self.kind {
            IoKind::Write { .. } | IoKind::Dsm { .. } | IoKind::Compare => self.len as usize,
            IoKind::Reservation(op) if op != nvm::RESV_REPORT => self.len as usize,
            _ => 0,
        }
    }

    /// Bytes returned to the host (Read, Reservation Report).
    pub fn data_to_host(&self) -> usize {
        match self.kind {
            IoKind::Read | IoKind::Reservation(nvm::RESV_REPORT) => self.len as usize,
            _ => 0,
        }
    }

    /// Arena bytes the command's data needs: a Compare also holds what it
    /// reads.
    pub fn buffer_len(&self) -> usize {
        match self.kind {
            IoKind::Compare => 2 * self.len as usize,
            _ => self.data_to_controller().max(self.data_to_host()),
        }
    }

    /// The bytes it writes, for the write gate (Dataset Management: the
    /// whole namespace, its ranges are not known yet).
    pub fn written(&self) -> std::ops::Range<u64> {
        match self.kind {
            IoKind::Dsm { .. } => 0..u64::MAX,
            _ => self.offset..self.offset + self.len,
        }
    }
}

/// Decodes an I/O command; `namespace` finds a namespace by id, `ana` are
/// the ANA states of the path the command came through, and `sgl_len` is
/// the length the data pointer describes. The namespace's metrics slot of
/// `poller` counts it: as started, or as refused when it names a namespace
/// but fails a check.
pub fn decode(
    namespace: impl FnOnce(u32) -> Option<(Arc<Namespace>, Option<Throttle>)>,
    ana: &AnaStates,
    sqe: &Sqe,
    sgl_len: u32,
    max_transfer: usize,
    poller: usize,
) -> Result<IoRequest, Status> {
    // The opcode first: an admin command on an I/O queue (Keep Alive) is an
    // Invalid Opcode, whatever its namespace field.
    let reservation = matches!(
        sqe.opcode(),
        nvm::RESV_REGISTER | nvm::RESV_REPORT | nvm::RESV_ACQUIRE | nvm::RESV_RELEASE
    );
    if !reservation
        && !matches!(
            sqe.opcode(),
            nvm::READ | nvm::WRITE | nvm::FLUSH | nvm::WRITE_ZEROES | nvm::DSM | nvm::COMPARE
        )
    {
        return Err(Status::INVALID_OPCODE);
    }
    // Only a Compare may start a fused operation, and only a Write end it
    // (NVM Command Set 2.1, 3.3.1).
    match (sqe.fuse(), sqe.opcode()) {
        (0, _) | (fuse::FIRST, nvm::COMPARE) | (fuse::SECOND, nvm::WRITE) => {}
        _ => return Err(Status::INVALID_FIELD),
    }
    let (ns, throttle) = namespace(sqe.nsid()).ok_or(Status::INVALID_NAMESPACE)?;
    if reservation && ns.reservations.is_none() {
        // Reservations turned off for this namespace: as a controller
        // without them.
        return Err(Status::INVALID_OPCODE);
    }
    let counters = ns.metrics.of(poller);
    // As nvmet, the path first: a group not usable here refuses every
    // command on its namespaces with a path status, DNR clear, so that the
    // host sends it down another path (NVMe Base 2.1, 8.1.3.3 to 8.1.3.5).
    let checked = match ana.io_status(ns.ana_group()) {
        Some(path) => Err(path),
        None => check(&ns, sqe, sgl_len, max_transfer),
    };
    match checked {
        Ok((kind, offset, len)) => {
            counters.start();
            let aborts_seen = ns.reservations.as_ref().map_or(0, |r| r.aborts());
            Ok(IoRequest {
                kind,
                ns,
                offset,
                len,
                poller,
                aborts_seen,
                throttle,
                held: None,
            })
        }
        Err(st) => {
            let op = match sqe.opcode() {
                nvm::READ => Op::Read,
                nvm::WRITE => Op::Write,
                _ => Op::Other,
            };
            counters.refused(op, st);
            Err(st)
        }
    }
}

/// Checks an I/O command against its namespace: what it does, at which
/// byte offset, over how many bytes.
fn check(
    ns: &Namespace,
    sqe: &Sqe,
    sgl_len: u32,
    max_transfer: usize,
) -> Result<(IoKind, u64, u64), Status> {
    let no_data = || {
        if sgl_len == 0 {
            Ok(())
        } else {
            Err(Status::SGL_DATA_LENGTH_INVALID)
        }
    };
    let bs = ns.block_size as u64;
    let rw_range = |ns: &Namespace, rw: &ReadWriteCmd| -> Result<(u64, u64), Status> {
        let nlb = rw.blocks();
        match rw.slba.checked_add(nlb) {
            Some(end) if end <= ns.blocks() => Ok((rw.slba * bs, nlb * bs)),
            _ => Err(Status::LBA_OUT_OF_RANGE),
        }
    };
    let writable = |ns: &Namespace| {
        if ns.read_only() {
            Err(Status::NAMESPACE_WRITE_PROTECTED)
        } else {
            Ok(())
        }
    };
    let (kind, offset, len) = match sqe.opcode() {
        nvm::READ | nvm::WRITE | nvm::COMPARE => {
            let rw = ReadWriteCmd::from_sqe(sqe);
            let (offset, len) = rw_range(ns, &rw)?;
            // A Compare holds what it reads too: half the largest transfer.
            let most = match sqe.opcode() {
                nvm::COMPARE => max_transfer / 2,
                _ => max_transfer,
            };
            if len > most as u64 {
                return Err(Status::INVALID_FIELD);
            }
            if sgl_len as u64 != len {
                return Err(Status::SGL_DATA_LENGTH_INVALID);
            }
            match sqe.opcode() {
                nvm::READ => (IoKind::Read, offset, len),
                nvm::COMPARE => (IoKind::Compare, offset, len),
                _ => {
                    writable(ns)?;
                    (IoKind::Write { fua: rw.fua }, offset, len)
                }
            }
        }
        op @ (nvm::RESV_REGISTER | nvm::RESV_ACQUIRE | nvm::RESV_RELEASE) => {
            // The keys: 16 bytes, 8 for Release (a longer SGL is allowed,
            // as nvme-cli and the Linux host send 8 or 16 for it).
            let len = if op == nvm::RESV_RELEASE {
                KEY_LEN
            } else {
                KEYS_LEN
            };
            if (sgl_len as usize) < len {
                return Err(Status::SGL_DATA_LENGTH_INVALID);
            }
            (IoKind::Reservation(op), 0, len as u64)
        }
        nvm::RESV_REPORT => {
            let len = (sqe.cdw(10) as u64 + 1) * 4;
            if len < STATUS_EXT_HEADER as u64 || len > max_transfer as u64 {
                return Err(Status::INVALID_FIELD);
            }
            if (sgl_len as u64) < len {
                return Err(Status::SGL_DATA_LENGTH_INVALID);
            }
            (IoKind::Reservation(nvm::RESV_REPORT), 0, len)
        }
        nvm::FLUSH => {
            no_data()?;
            (IoKind::Flush, 0, 0)
        }
        nvm::WRITE_ZEROES => {
            no_data()?;
            writable(ns)?;
            let rw = ReadWriteCmd::from_sqe(sqe);
            let (offset, len) = rw_range(ns, &rw)?;
            let deallocate = rw.deallocate;
            (IoKind::WriteZeroes { deallocate }, offset, len)
        }
        nvm::DSM => {
            let dsm = DsmCmd::from_sqe(sqe);
            let len = dsm.data_len() as u64;
            if (sgl_len as u64) < len {
                return Err(Status::SGL_DATA_LENGTH_INVALID);
            }
            let deallocate = dsm.deallocate;
            if deallocate {
                writable(ns)?;
            }
            (IoKind::Dsm { deallocate }, 0, len)
        }
        _ => return Err(Status::INVALID_OPCODE),
    };
    Ok((kind, offset, len))
}

/// Decodes DSM ranges into byte (offset, length) pairs, checking each.
pub fn dsm_ranges(ns: &Namespace, data: &[u8]) -> Result<Vec<(u64, u64)>, Status> {
    let bs = ns.block_size as u64;
    data.chunks_exact(DSM_RANGE_LEN)
        .map(|r| {
            let DsmRange { nlb, slba } = DsmRange::parse(r);
            let nlb = nlb as u64;
            match slba.checked_add(nlb) {
                Some(end) if end <= ns.blocks() => Ok((slba * bs, nlb * bs)),
                _ => Err(Status::LBA_OUT_OF_RANGE),
            }
        })
        .filter(|r| !matches!(r, Ok((_, 0))))
        .collect()
}

//! What a controller keeps of its namespaces' reservations: the
//! Reservation Notification log page (80h) and its asynchronous event, the
//! Reservation Notification Mask (feature 82h) and Reservation Persistence
//! (feature 83h), as NVMe Base 2.1 defines them with reservations (8.1.22).

use super::{aen, Controller, Reply};
use crate::nvme::namespace::Namespace;
use crate::service::reservation::ptpl::Persistent;
use rdmablk_common::nvme::resv::{notice, NoticeLog};
use rdmablk_common::nvme::{Sqe, Status};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Notices a controller keeps unread at most; older ones are dropped (the
/// gap in the log page count tells the host).
const NOTICES_KEPT: usize = 64;

/// The NSID that names every namespace.
const ALL_NAMESPACES: u32 = u32::MAX;

/// A controller's reservation notices and masks.
#[derive(Default)]
pub(super) struct Notices {
    unread: VecDeque<NoticeLog>,
    /// Log Page Count of the latest notice (never 0).
    count: u64,
    /// Reservation Notification Mask of each namespace that was given one.
    masks: HashMap<u32, u32>,
}

impl Controller {
    /// Namespace `nsid`'s reservations changed in a way this controller's
    /// host hears of (`notice` type): a log page entry and, unless masked,
    /// the event (I/O command set specific, Reservation Log Page Available).
    pub fn reservation_notice(&self, kind: u8, nsid: u32) {
        let mut st = self.state.lock().expect("controller state");
        let n = &mut st.notices;
        if n.masks.get(&nsid).copied().unwrap_or(0) & 1 << kind != 0 {
            return;
        }
        n.count = n.count.checked_add(1).unwrap_or(1);
        if n.unread.len() == NOTICES_KEPT {
            n.unread.pop_front();
        }
        let count = n.count;
        n.unread.push_back(NoticeLog {
            count,
            kind,
            available: 0,
            nsid,
        });
        // Not an Asynchronous Event Configuration bit: the mask above.
        self.raise_always(&mut st, aen::RESERVATION, aen::RESERVATION_DW0);
    }

    /// The Reservation Notification log page: the oldest unread notice (all
    /// zeroes when none), with how many more wait. Read with RAE clear, it
    /// lets the next notice raise an event.
    pub(super) fn reservation_log(&self, rae: bool) -> Vec<u8> {
        let mut st = self.state.lock().expect("controller state");
        let page = match st.notices.unread.pop_front() {
            Some(mut n) => {
                n.available = st.notices.unread.len().min(255) as u8;
                n.encode()
            }
            None => NoticeLog::default().encode(),
        };
        if !rae {
            st.events.masked &= !aen::RESERVATION;
        }
        page
    }

    /// The namespace (with reservations) a feature 82h or 83h command names.
    /// Whether a namespace of the subsystem takes reservations: ONCS bit
    /// 5, the reservation commands, log page 80h and features 82h and 83h
    /// are announced then.
    pub(super) fn takes_reservations(&self) -> bool {
        self.subsys
            .namespaces()
            .iter()
            .any(|n| n.reservations.is_some())
    }

    fn reservation_namespace(&self, nsid: u32) -> Result<Arc<Namespace>, Status> {
        let ns = self
            .subsys
            .visible_namespace(nsid, &self.hostnqn)
            .ok_or(Status::INVALID_NAMESPACE)?;
        if ns.reservations.is_none() {
            return Err(Status::INVALID_FIELD);
        }
        Ok(ns)
    }

    /// Set Features, Reservation Notification Mask: for one namespace, or
    /// every one with reservations (NSID FFFFFFFFh).
    pub(super) fn set_reservation_mask(&self, sqe: &Sqe) -> Reply {
        let mask = sqe.cdw(11);
        if mask & !notice::MASKABLE != 0 {
            return Reply::status(Status::INVALID_FIELD);
        }
        let nsids: Vec<u32> = match sqe.nsid() {
            ALL_NAMESPACES => self
                .subsys
                .visible_namespaces(&self.hostnqn)
                .iter()
                .filter(|n| n.reservations.is_some())
                .map(|n| n.nsid)
                .collect(),
            nsid => match self.reservation_namespace(nsid) {
                Ok(ns) => vec![ns.nsid],
                Err(st) => return Reply::status(st),
            },
        };
        let mut st = self.state.lock().expect("controller state");
        for nsid in nsids {
            st.notices.masks.insert(nsid, mask);
        }
        Reply::ok(0)
    }

    /// Get Features, Reservation Notification Mask of one namespace.
    pub(super) fn get_reservation_mask(&self, sqe: &Sqe) -> Reply {
        match self.reservation_namespace(sqe.nsid()) {
            Ok(ns) => {
                let st = self.state.lock().expect("controller state");
                Reply::ok(st.notices.masks.get(&ns.nsid).copied().unwrap_or(0))
            }
            Err(st) => Reply::status(st),
        }
    }

    /// Set Features, Reservation Persistence: PTPL of one namespace, written
    /// to its state file before the command completes.
    pub(super) fn set_reservation_persistence(&self, sqe: &Sqe) -> Reply {
        let ns = match self.reservation_namespace(sqe.nsid()) {
            Ok(ns) => ns,
            Err(st) => return Reply::status(st),
        };
        let ptpl = sqe.cdw(11) & 1 != 0;
        let r = ns.reservations.as_ref().expect("checked");
        if r.set_ptpl(ptpl) {
            let what: Arc<dyn Persistent> = ns;
            return Reply::Persist(what);
        }
        Reply::ok(0)
    }

    /// Get Features, Reservation Persistence.
    pub(super) fn get_reservation_persistence(&self, sqe: &Sqe) -> Reply {
        match self.reservation_namespace(sqe.nsid()) {
            Ok(ns) => Reply::ok(ns.reservations.as_ref().is_some_and(|r| r.snapshot().ptpl) as u32),
            Err(st) => Reply::status(st),
        }
    }
}

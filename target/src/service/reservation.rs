//! Reservations of one namespace (NVMe Base 2.1, 8.1.22): its registrants,
//! keyed by host identifier (every controller of a host shares its
//! registration), the reservation and its holder, the access rules every
//! I/O command meets, and what each Register, Acquire and Release changes
//! and whom it notifies. The rules follow Linux nvmet (pr.c).
//!
//! Commands take no lock while no reservation is held (one atomic load);
//! then a read lock.

use rdmablk_common::nvme::resv::{
    notice, racqa, rrega, rrela, Registrant, ResvCmd, ResvStatus, ResvType,
};
use rdmablk_common::nvme::Status;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

pub mod ptpl;
pub mod shared;

#[cfg(test)]
mod tests;

/// A host identifier (Connect's HOSTID).
pub type HostId = [u8; 16];

/// The command group a reservation's access rules put an I/O command in
/// (NVMe Base 2.1, 8.1.22): the read group (Read, Compare) or the write
/// group (Write, Write Zeroes, Dataset Management, Flush).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessGroup {
    Read,
    Write,
}

/// Preempt and abort events remembered, to tell the commands they abort.
const ABORTS_KEPT: usize = 64;

/// Registrants a namespace takes at most: registrations outlive
/// connections, so a host that comes back under ever new host identifiers
/// must not grow the table without end. Clusters have far fewer nodes.
pub const MAX_REGISTRANTS: usize = 256;

/// What a reservation command changed: the state to persist, and the
/// notices and aborts it calls for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Registrations or the reservation changed.
    pub changed: bool,
    /// (host, notice type) for each Reservation Notification to log.
    pub notices: Vec<(HostId, u8)>,
    /// Hosts whose commands on the namespace a Preempt and Abort aborts.
    pub aborted: Vec<HostId>,
}

/// The registrations and the reservation: what PTPL keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Generation (Reservation Report GEN).
    pub generation: u32,
    /// Persist Through Power Loss.
    pub ptpl: bool,
    /// Registrants and their keys, in the order they registered.
    pub registrants: Vec<(HostId, u64)>,
    /// The reservation held, and by whom (under the All Registrants types
    /// every registrant holds it; `host` is then one of them).
    pub holder: Option<(ResvType, HostId)>,
}

impl State {
    fn key_of(&self, host: &HostId) -> Option<u64> {
        self.registrants
            .iter()
            .find(|(h, _)| h == host)
            .map(|&(_, k)| k)
    }

    /// Whether `host` holds the reservation.
    fn holds(&self, host: &HostId) -> bool {
        match self.holder {
            Some((t, _)) if t.all_registrants() => self.key_of(host).is_some(),
            Some((_, h)) => h == *host,
            None => false,
        }
    }

    /// Whether a command of `host` in command group `access` may run: NVMe
    /// Base 2.1, 8.1.22, the table of Command Behavior in the Presence of a
    /// Reservation.
    pub fn admits(&self, host: &HostId, access: AccessGroup) -> bool {
        let Some((rtype, _)) = self.holder else {
            return true;
        };
        self.holds(host)
            || rtype.admits_registrants() && self.key_of(host).is_some()
            || access == AccessGroup::Read && !rtype.excludes_readers()
    }

    /// Removes `host`'s registration; the reservation goes with it when it
    /// held it alone, and the other registrants hear of it under the
    /// Registrants Only types (as nvmet).
    fn unregister(&mut self, host: &HostId, out: &mut Outcome) {
        self.registrants.retain(|(h, _)| h != host);
        match self.holder {
            Some((t, _)) if t.all_registrants() => match self.registrants.first() {
                Some(&(next, _)) => self.holder = Some((t, next)),
                None => self.holder = None,
            },
            Some((t, h)) if h == *host => {
                self.holder = None;
                if matches!(
                    t,
                    ResvType::WriteExclusiveRegistrantsOnly
                        | ResvType::ExclusiveAccessRegistrantsOnly
                ) {
                    self.notify_others(host, notice::RESERVATION_RELEASED, out);
                }
            }
            _ => {}
        }
    }

    fn notify_others(&self, host: &HostId, kind: u8, out: &mut Outcome) {
        for (h, _) in self.registrants.iter().filter(|(h, _)| h != host) {
            out.notices.push((*h, kind));
        }
    }

    /// Unregisters the hosts other than `except` (all when `None`) whose
    /// key is `key` (any key when `None`); each hears that its
    /// registration was preempted. Whether any was.
    fn preempt(
        &mut self,
        by: &HostId,
        key: Option<u64>,
        except: Option<&HostId>,
        out: &mut Outcome,
    ) -> bool {
        let gone: Vec<HostId> = self
            .registrants
            .iter()
            .filter(|(h, k)| key.is_none_or(|key| *k == key) && except != Some(h))
            .map(|&(h, _)| h)
            .collect();
        for h in &gone {
            self.unregister(h, out);
            out.aborted.push(*h);
            if h != by {
                out.notices.push((*h, notice::REGISTRATION_PREEMPTED));
            }
        }
        !gone.is_empty()
    }

    /// Reservation Register (NVMe Base 2.1).
    pub fn register(&mut self, host: &HostId, c: &ResvCmd) -> Result<Outcome, Status> {
        let ptpl = match c.cptpl {
            0 => None,
            2 => Some(false),
            3 => Some(true),
            _ => return Err(Status::INVALID_FIELD),
        };
        let mut out = Outcome::default();
        let current = self.key_of(host);
        let key_ok = c.iekey || current == Some(c.crkey);
        match (c.action, current) {
            (rrega::REGISTER, Some(k)) if k == c.key2 => {}
            (rrega::REGISTER, Some(_)) => return Err(Status::RESERVATION_CONFLICT),
            (rrega::REGISTER, None) if self.registrants.len() >= MAX_REGISTRANTS => {
                tracing::warn!(
                    "reservation registration refused: the namespace has {MAX_REGISTRANTS} registrants already"
                );
                return Err(Status::RESERVATION_CONFLICT);
            }
            (rrega::REGISTER, None) => self.registrants.push((*host, c.key2)),
            (rrega::UNREGISTER, Some(_)) if key_ok => self.unregister(host, &mut out),
            (rrega::REPLACE, Some(_)) if key_ok => {
                for r in self.registrants.iter_mut().filter(|(h, _)| h == host) {
                    r.1 = c.key2;
                }
            }
            (rrega::UNREGISTER | rrega::REPLACE, _) => return Err(Status::RESERVATION_CONFLICT),
            _ => return Err(Status::INVALID_FIELD),
        }
        if let Some(p) = ptpl {
            self.ptpl = p;
        }
        self.generation = self.generation.wrapping_add(1);
        out.changed = true;
        Ok(out)
    }

    /// Reservation Acquire (NVMe Base 2.1).
    pub fn acquire(&mut self, host: &HostId, c: &ResvCmd) -> Result<Outcome, Status> {
        let rtype = ResvType::from_u8(c.rtype).ok_or(Status::INVALID_FIELD)?;
        if c.iekey || c.action > racqa::PREEMPT_AND_ABORT {
            return Err(Status::INVALID_FIELD);
        }
        if self.key_of(host) != Some(c.crkey) {
            return Err(Status::RESERVATION_CONFLICT);
        }
        let mut out = Outcome::default();
        if c.action == racqa::ACQUIRE {
            return match self.holder {
                None => {
                    self.holder = Some((rtype, *host));
                    out.changed = true;
                    Ok(out)
                }
                Some((t, _)) if t == rtype && self.holds(host) => Ok(out),
                Some(_) => Err(Status::RESERVATION_CONFLICT),
            };
        }
        let prkey = c.key2;
        match self.holder {
            None => {
                if !self.preempt(host, Some(prkey), None, &mut out) {
                    return Err(Status::RESERVATION_CONFLICT);
                }
            }
            Some((t, _)) if t.all_registrants() => {
                if prkey == 0 {
                    // The preempting host holds it first, so that nobody
                    // else is let in meanwhile (as nvmet).
                    self.holder = Some((rtype, *host));
                    self.preempt(host, None, Some(host), &mut out);
                } else if !self.preempt(host, Some(prkey), None, &mut out) {
                    return Err(Status::RESERVATION_CONFLICT);
                }
            }
            Some((t, h)) if h == *host => {
                self.holder = Some((rtype, h));
                if t != rtype {
                    self.notify_others(host, notice::RESERVATION_RELEASED, &mut out);
                }
            }
            Some((t, h)) if self.key_of(&h) == Some(prkey) => {
                self.holder = Some((rtype, *host));
                self.preempt(host, Some(prkey), Some(host), &mut out);
                if t != rtype {
                    self.notify_others(host, notice::RESERVATION_RELEASED, &mut out);
                }
            }
            Some(_) if prkey != 0 => {
                if !self.preempt(host, Some(prkey), None, &mut out) {
                    return Err(Status::RESERVATION_CONFLICT);
                }
            }
            Some(_) => return Err(Status::INVALID_FIELD),
        }
        if c.action != racqa::PREEMPT_AND_ABORT {
            out.aborted.clear();
        }
        self.generation = self.generation.wrapping_add(1);
        out.changed = true;
        Ok(out)
    }

    /// Reservation Release (NVMe Base 2.1).
    pub fn release(&mut self, host: &HostId, c: &ResvCmd) -> Result<Outcome, Status> {
        if c.iekey || c.action > rrela::CLEAR {
            return Err(Status::INVALID_FIELD);
        }
        if self.key_of(host) != Some(c.crkey) {
            return Err(Status::RESERVATION_CONFLICT);
        }
        let mut out = Outcome::default();
        if c.action == rrela::CLEAR {
            self.holder = None;
            self.notify_others(host, notice::RESERVATION_PREEMPTED, &mut out);
            self.registrants.clear();
            self.generation = self.generation.wrapping_add(1);
            out.changed = true;
            return Ok(out);
        }
        match self.holder {
            Some((t, _)) if self.holds(host) => {
                if t as u8 != c.rtype {
                    return Err(Status::INVALID_FIELD);
                }
                self.holder = None;
                if t.admits_registrants() {
                    self.notify_others(host, notice::RESERVATION_RELEASED, &mut out);
                }
                out.changed = true;
                Ok(out)
            }
            // Nothing held by this host: nothing to do, successfully.
            _ => Ok(out),
        }
    }

    /// The Reservation Status (Reservation Report, NVMe Base 2.1) with host
    /// identifiers: a registrant is a host, not one of its controllers.
    pub fn report(&self) -> ResvStatus {
        ResvStatus {
            gen: self.generation,
            rtype: self.holder.map_or(0, |(t, _)| t as u8),
            ptpls: self.ptpl,
            registrants: self
                .registrants
                .iter()
                .map(|&(hostid, rkey)| Registrant {
                    cntlid: 0xffff,
                    holds: self.holds(&hostid),
                    hostid,
                    rkey,
                })
                .collect(),
        }
    }
}

/// A namespace's reservations, shared by every queue of every poller.
pub struct Reservations {
    state: RwLock<State>,
    /// Whether a reservation is held: commands meet the access rules only then.
    held: AtomicBool,
    /// Preempt and Abort events so far; a command remembers the count it
    /// was decoded under.
    aborts: AtomicU64,
    /// The latest of them: (event number, aborted host).
    aborted: Mutex<VecDeque<(u64, HostId)>>,
    /// The gateway group's record, where the state lives when shared.
    record: RwLock<Option<Arc<shared::Record>>>,
}

impl Reservations {
    /// Reservations starting from `state` (restored through PTPL, or empty).
    pub fn new(state: State) -> Reservations {
        Reservations {
            held: AtomicBool::new(state.holder.is_some()),
            state: RwLock::new(state),
            aborts: AtomicU64::new(0),
            aborted: Mutex::new(VecDeque::new()),
            record: RwLock::new(None),
        }
    }

    /// Whether a command of `host` in command group `access` may run.
    #[inline]
    pub fn admits(&self, host: &HostId, access: AccessGroup) -> bool {
        !self.held.load(Ordering::Acquire)
            || self
                .state
                .read()
                .expect("reservations lock")
                .admits(host, access)
    }

    /// The number of Preempt and Abort events so far.
    #[inline]
    pub fn aborts(&self) -> u64 {
        self.aborts.load(Ordering::Acquire)
    }

    /// Whether a Preempt and Abort after event `seen` aborted `host`'s
    /// commands.
    #[inline]
    pub fn aborted_since(&self, host: &HostId, seen: u64) -> bool {
        self.aborts() != seen
            && self
                .aborted
                .lock()
                .expect("aborts lock")
                .iter()
                .any(|(n, h)| *n > seen && h == host)
    }

    /// Runs a reservation command on the state: `f` changes it or refuses.
    /// A Preempt and Abort is recorded before the new state shows.
    pub fn apply(
        &self,
        f: impl FnOnce(&mut State) -> Result<Outcome, Status>,
    ) -> Result<Outcome, Status> {
        let mut st = self.state.write().expect("reservations lock");
        let out = f(&mut st)?;
        self.record_aborts(&out.aborted);
        self.held.store(st.holder.is_some(), Ordering::Release);
        Ok(out)
    }

    /// Remembers a Preempt and Abort of `hosts` (none: nothing to do);
    /// under the state's write lock, before the new state shows.
    fn record_aborts(&self, hosts: &[HostId]) {
        if hosts.is_empty() {
            return;
        }
        let n = self.aborts.load(Ordering::Acquire) + 1;
        let mut aborted = self.aborted.lock().expect("aborts lock");
        for h in hosts {
            if aborted.len() == ABORTS_KEPT {
                aborted.pop_front();
            }
            aborted.push_back((n, *h));
        }
        self.aborts.store(n, Ordering::Release);
    }

    /// Makes `st` the state (read from the gateway group's record), the
    /// commands of `aborted` hosts aborted by the change that made it.
    pub fn install(&self, st: State, aborted: &[HostId]) {
        let mut now = self.state.write().expect("reservations lock");
        self.record_aborts(aborted);
        self.held.store(st.holder.is_some(), Ordering::Release);
        *now = st;
    }

    /// The gateway group's record of the state, when it is shared.
    pub fn record(&self) -> Option<Arc<shared::Record>> {
        self.record.read().expect("record lock").clone()
    }

    /// Shares the state through `record` from now on (a new connection's
    /// record replaces the old one).
    pub fn set_record(&self, record: Arc<shared::Record>) {
        *self.record.write().expect("record lock") = Some(record);
    }

    /// The state now.
    pub fn snapshot(&self) -> State {
        self.state.read().expect("reservations lock").clone()
    }

    /// Sets Persist Through Power Loss (Set Features 83h).
    pub fn set_ptpl(&self, ptpl: bool) -> bool {
        let mut st = self.state.write().expect("reservations lock");
        let changed = st.ptpl != ptpl;
        st.ptpl = ptpl;
        changed
    }
}

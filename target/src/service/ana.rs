//! Asymmetric Namespace Access as the target reports it (NVMe Base 2.1,
//! 8.1.3): each listener reports a state for every ANA group
//! ([`AnaStates`]); a namespace belongs to one group. Controllers read the
//! states of the listener their admin queue came through: in Identify, in
//! the ANA log page and on every I/O command, which a group that is not
//! usable on that path refuses with a path status.

use crate::base::clock;
use crate::config::{AnaState, ListenerConfig, MAX_ANA_GROUP};
use rdmablk_common::nvme::ana::{anacap, AnaGroup, AnaLog};
use rdmablk_common::nvme::Status;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// ANA Transition Time: the longest a group stays in the change state
/// before the target moves it on by itself (Identify ANATT, seconds).
pub const ANATT_SECS: u8 = 10;
/// ANATT as a duration.
pub const ANATT: Duration = Duration::from_secs(ANATT_SECS as u64);
/// What the controllers report in ANACAP: every state, and a namespace's
/// group may change while it is attached (a reload moves it): bit 6 clear.
pub const ANACAP: u8 = anacap::OPTIMIZED
    | anacap::NON_OPTIMIZED
    | anacap::INACCESSIBLE
    | anacap::PERSISTENT_LOSS
    | anacap::CHANGE;

/// The ANA states one listener reports: a state and a change count per
/// group, and the count of all changes (the log page's CHGCNT). Read on
/// every I/O command without a lock; written by reloads and the control
/// socket, one at a time.
pub struct AnaStates {
    /// State codes, group 1 first.
    states: Box<[AtomicU8]>,
    /// Changes of each group's state.
    changes: Box<[AtomicU64]>,
    /// Until when each group is usable whatever its state (`base::clock`
    /// nanoseconds; 0: no limit): a gateway group's lease, so that a
    /// gateway frozen past it refuses I/O the moment it runs again.
    usable_until: Box<[AtomicU64]>,
    total: AtomicU64,
    /// The state of groups not otherwise set (optimized, or inaccessible
    /// in a gateway group): the reports leave those out.
    default: AtomicU8,
    writer: Mutex<()>,
}

impl AnaStates {
    /// The states listener `l` is configured with.
    pub fn new(l: &ListenerConfig) -> AnaStates {
        let groups = MAX_ANA_GROUP as usize;
        AnaStates {
            states: (1..=MAX_ANA_GROUP)
                .map(|g| AtomicU8::new(l.ana_state(g) as u8))
                .collect(),
            changes: (0..groups).map(|_| AtomicU64::new(0)).collect(),
            usable_until: (0..groups).map(|_| AtomicU64::new(0)).collect(),
            total: AtomicU64::new(0),
            default: AtomicU8::new(AnaState::Optimized as u8),
            writer: Mutex::new(()),
        }
    }

    /// Puts every group in `state`, as if configured so, before any host
    /// sees the listener (a gateway group: nothing is usable until owned).
    pub fn start_all(&self, state: AnaState) {
        let _w = self.writer.lock().expect("ANA writer");
        for s in self.states.iter() {
            s.store(state as u8, Ordering::Release);
        }
        self.default.store(state as u8, Ordering::Release);
    }

    fn index(group: u32) -> usize {
        debug_assert!((1..=MAX_ANA_GROUP).contains(&group));
        group as usize - 1
    }

    /// The state of group `group` (1 to [`MAX_ANA_GROUP`]).
    #[inline]
    pub fn state(&self, group: u32) -> AnaState {
        let code = self.states[Self::index(group)].load(Ordering::Acquire);
        AnaState::from_code(code).expect("only states are stored")
    }

    /// The path status an I/O command gets on a namespace of group `group`
    /// (NVMe Base 2.1, 8.1.3.3 to 8.1.3.5), or `None` when the group is
    /// usable through this listener.
    #[inline]
    pub fn io_status(&self, group: u32) -> Option<Status> {
        match self.state(group) {
            AnaState::Optimized | AnaState::NonOptimized => {
                let until = self.usable_until[Self::index(group)].load(Ordering::Acquire);
                (until != 0 && clock::now() > until).then_some(Status::ANA_INACCESSIBLE)
            }
            AnaState::Inaccessible => Some(Status::ANA_INACCESSIBLE),
            AnaState::PersistentLoss => Some(Status::ANA_PERSISTENT_LOSS),
            AnaState::Change => Some(Status::ANA_TRANSITION),
        }
    }

    /// Makes group `group` refuse I/O after `until` (`base::clock`
    /// nanoseconds) whatever its state, until set again.
    pub fn usable_until(&self, group: u32, until: u64) {
        self.usable_until[Self::index(group)].store(until, Ordering::Release);
    }

    /// Sets group `group` to `state`; whether that changed it.
    pub fn set(&self, group: u32, state: AnaState) -> bool {
        let _w = self.writer.lock().expect("ANA writer");
        self.set_locked(group, state)
    }

    fn set_locked(&self, group: u32, state: AnaState) -> bool {
        let i = Self::index(group);
        if self.states[i].swap(state as u8, Ordering::AcqRel) == state as u8 {
            return false;
        }
        self.changes[i].fetch_add(1, Ordering::AcqRel);
        self.total.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Sets every group to what listener `l` is configured with (a reload):
    /// the groups whose state changed.
    pub fn apply(&self, l: &ListenerConfig) -> Vec<u32> {
        let _w = self.writer.lock().expect("ANA writer");
        (1..=MAX_ANA_GROUP)
            .filter(|&g| self.set_locked(g, l.ana_state(g)))
            .collect()
    }

    /// The change count of group `group`.
    pub fn group_changes(&self, group: u32) -> u64 {
        self.changes[Self::index(group)].load(Ordering::Acquire)
    }

    /// Ends a change state that has lasted ANATT: when group `group` is
    /// still in the change state it entered at change count `entered`, it
    /// becomes inaccessible (the target must not leave it in change longer:
    /// the host resets the controller after twice ANATT). Whether it did.
    pub fn expire_change(&self, group: u32, entered: u64) -> bool {
        let _w = self.writer.lock().expect("ANA writer");
        if self.state(group) != AnaState::Change || self.group_changes(group) != entered {
            return false;
        }
        self.set_locked(group, AnaState::Inaccessible)
    }

    /// The ANA log page (NVMe Base 2.1, 5.1.12.1.13) for a controller whose
    /// subsystem has the active namespaces `groups` (by group, ascending):
    /// a descriptor for each group with namespaces, listing them unless
    /// Return Groups Only (`rgo`).
    pub fn log(&self, groups: &BTreeMap<u32, Vec<u32>>, rgo: bool) -> AnaLog {
        AnaLog {
            chgcnt: self.total.load(Ordering::Acquire),
            groups: groups
                .iter()
                .map(|(&grpid, nsids)| AnaGroup {
                    grpid,
                    chgcnt: self.group_changes(grpid),
                    state: self.state(grpid),
                    nsids: if rgo { Vec::new() } else { nsids.clone() },
                })
                .collect(),
        }
    }

    /// The states of groups `groups` and of every group not in the
    /// listener's default state, by group: what the reports show.
    pub fn shown(&self, groups: &BTreeSet<u32>) -> Vec<(u32, AnaState)> {
        let default = self.default.load(Ordering::Acquire);
        (1..=MAX_ANA_GROUP)
            .map(|g| (g, self.state(g)))
            .filter(|(g, s)| groups.contains(g) || *s as u8 != default)
            .collect()
    }
}

#[cfg(test)]
mod tests;

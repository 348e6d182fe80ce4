//! The asynchronous events a controller reports (NVMe Base 2.1, 5.2.2):
//! their Async Event Configuration bit (also their OAES bit, and their mask
//! bit here) and completion dword 0 (type Notice, information, log page);
//! those waiting for an Asynchronous Event Request, and the kinds reported
//! and not yet acknowledged by a read of their log page.

use super::{Controller, State};
use rdmablk_common::nvme::feature;
use std::collections::{BTreeSet, VecDeque};

/// Namespace Attribute Notices (NVMe Base 2.1, Figure 201, bit 8).
pub const NS_ATTR: u32 = 1 << 8;
/// Asymmetric Namespace Access Change Notices (bit 11).
pub const ANA_CHANGE: u32 = 1 << 11;
/// Discovery Log Page Change Notices (bit 31; discovery controllers).
pub const DISCOVERY: u32 = 1 << 31;
/// Reservation Log Page Available: not an Asynchronous Event Configuration
/// bit (feature 82h masks it); a bit of its own for `Events::masked`.
pub const RESERVATION: u32 = 1 << 30;
/// Asynchronous Event Type Notice (NVMe Base 2.1, Figure 150).
const NOTICE: u32 = 2;
/// Notice: Namespace Attribute Changed (information 00h), Changed
/// Namespace List (04h).
pub const NS_ATTR_DW0: u32 = NOTICE | 0x04 << 16;
/// Notice: Asymmetric Namespace Access Change (information 03h), ANA log
/// (0Ch).
pub const ANA_CHANGE_DW0: u32 = NOTICE | 0x03 << 8 | 0x0c << 16;
/// Notice: Discovery Log Page Change, Discovery log (70h).
pub const DISCOVERY_DW0: u32 = NOTICE | 0xf0 << 8 | 0x70 << 16;
/// I/O Command Set Specific Status (6h), Reservation Log Page Available
/// (00h), Reservation Notification log (80h).
pub const RESERVATION_DW0: u32 = 6 | 0x80 << 16;

/// Asynchronous events: those waiting for an Asynchronous Event Request,
/// the kinds reported and not yet acknowledged by a read of their log page
/// (masked until then), and the namespaces changed since the host last read
/// the Changed Namespace List.
#[derive(Default)]
pub(super) struct Events {
    /// Completion dword 0 of each event to report, oldest first.
    pending: VecDeque<u32>,
    /// Event kinds (the constants above) reported and not acknowledged.
    pub(super) masked: u32,
    pub(super) changed_ns: BTreeSet<u32>,
}

impl Controller {
    /// Reports an event of kind `kind` (a constant above) with completion
    /// dword 0 `dw0`, unless the host did not enable it (Asynchronous Event
    /// Configuration) or has not acknowledged the last one of its kind.
    fn raise(&self, st: &mut State, kind: u32, dw0: u32) {
        let enabled = st.features.get(&feature::ASYNC_EVENT).copied().unwrap_or(0);
        if enabled & kind != 0 {
            self.raise_always(st, kind, dw0);
        }
    }

    /// [`Controller::raise`] for an event no configuration bit turns off.
    pub(super) fn raise_always(&self, st: &mut State, kind: u32, dw0: u32) {
        if st.events.masked & kind == 0 {
            st.events.masked |= kind;
            st.events.pending.push_back(dw0);
        }
    }

    /// Namespaces `nsids` were added, removed or changed (a reload):
    /// Namespace Attribute Changed.
    pub fn namespaces_changed(&self, nsids: &[u32]) {
        let mut st = self.state.lock().expect("controller state");
        st.events.changed_ns.extend(nsids);
        self.raise(&mut st, NS_ATTR, NS_ATTR_DW0);
    }

    /// The ANA log page this controller reads changed (a group's state on
    /// its listener, or a namespace's group): Asymmetric Namespace Access
    /// Change.
    pub fn ana_changed(&self) {
        let mut st = self.state.lock().expect("controller state");
        self.raise(&mut st, ANA_CHANGE, ANA_CHANGE_DW0);
    }

    /// The discovery log changed (a reload): Discovery Log Page Change.
    pub fn discovery_changed(&self) {
        let mut st = self.state.lock().expect("controller state");
        self.raise(&mut st, DISCOVERY, DISCOVERY_DW0);
    }

    /// Completion dword 0 of the oldest event waiting for an AER.
    pub fn take_event(&self) -> Option<u32> {
        self.state
            .lock()
            .expect("controller state")
            .events
            .pending
            .pop_front()
    }

    /// The host read the log page of event kind `kind` with RAE clear: it
    /// may be reported again.
    pub(super) fn acknowledge(&self, kind: u32) {
        self.state.lock().expect("controller state").events.masked &= !kind;
    }
}

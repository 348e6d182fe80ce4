//! Asynchronous events as a host sees them: the Asynchronous Event
//! Configuration bits, the completions of Asynchronous Event Requests, and
//! the namespace lists a host reads after a Namespace Attribute Changed
//! event.

use crate::check::OrPanic;
use crate::client::Controller;
use rdmablk_common::nvme::identify::{cns, parse_ns_list};
use rdmablk_common::nvme::log::lid;
use rdmablk_common::nvme::{admin, Sqe};

/// Completion dword 0 of Namespace Attribute Changed (Notice, information
/// 00h, Changed Namespace List 04h): NVMe Base 2.1, Figure 150.
pub const NS_ATTR_CHANGED: u32 = 0x0004_0002;
/// Completion dword 0 of Discovery Log Page Change (Notice, F0h, log 70h):
/// NVMe Base 2.1, Figure 150.
pub const DISCOVERY_CHANGED: u32 = 0x0070_f002;
/// Async Event Configuration bit of Namespace Attribute Notices (NVMe Base
/// 2.1, Figure 201).
pub const AEC_NS_ATTR: u32 = 1 << 8;
/// Async Event Configuration bit of ANA Change Notices.
pub const AEC_ANA_CHANGE: u32 = 1 << 11;
/// Async Event Configuration bit of Discovery Log Page Change Notices.
pub const AEC_DISCOVERY: u32 = 1 << 31;

/// Submits an Asynchronous Event Request on `c`'s admin queue; its command id.
pub fn submit_aer(c: &Controller) -> u16 {
    c.admin()
        .submit(Sqe::new(admin::ASYNC_EVENT, 0), None, 0)
        .or_panic("submitting an AER")
}

/// Get Log Page Changed Namespace List with RAE clear: the namespaces
/// listed (NVMe Base 2.1, 5.16.1.5).
pub fn changed_namespaces(c: &Controller) -> Vec<u32> {
    parse_ns_list(
        &c.admin()
            .get_log(lid::CHANGED_NS, 4096, 0)
            .or_panic("changed ns log"),
    )
}

/// Identify Active Namespace ID list: the namespaces `c` sees.
pub fn active_namespaces(c: &Controller) -> Vec<u32> {
    parse_ns_list(
        &c.admin()
            .identify(cns::ACTIVE_NS_LIST, 0)
            .or_panic("active ns list"),
    )
}

/// Waits until `c` has received whatever the target had pending for it
/// when this was called. The target raises an event (a reservation notice,
/// a namespace change) before it completes the command or reload that
/// causes it, and every time its poller services a queue it first hands
/// pending events to the AERs held there, then reads the commands that
/// arrived. So once a Keep Alive sent after the cause has completed, the
/// AER's completion, if there was one, came before it on the same
/// connection; the second round trip covers a Keep Alive read in the same
/// pass as the event was raised. Each waits at most the client's timeout,
/// failing the test with a message.
pub fn flush_events(c: &Controller) {
    let mut admin = c.admin();
    for round in 1..=2 {
        admin
            .keep_alive()
            .or_panic(format_args!("Keep Alive {round} of 2 after the event"));
    }
}

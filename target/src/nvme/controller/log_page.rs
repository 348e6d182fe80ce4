//! Get Log Page: the discovery log (discovery controllers), and Supported
//! Log Pages, Error Information, SMART / Health Information, Firmware Slot
//! Information, Changed Namespace List, Commands Supported and Effects,
//! Asymmetric Namespace Access, Feature Identifiers Supported and Effects,
//! NVMe-MI Commands Supported and Effects and Reservation Notification (I/O
//! controllers).

use super::{aen, Controller, Reply};
use rdmablk_common::bytes::put_u32;
use rdmablk_common::nvme::ana;
use rdmablk_common::nvme::log::{entry, lid, LogRequest};
use rdmablk_common::nvme::{admin, feature, nvm, Sqe, Status, FABRICS_OPCODE};
use std::collections::BTreeMap;

/// Namespaces the Changed Namespace List holds; beyond, it says "more than
/// that" with FFFFFFFFh as its only entry (NVMe Base 2.1, 5.16.1.5).
const CHANGED_NS_MAX: usize = 1024;

impl Controller {
    /// Get Log Page: the window of the log that the command asks for.
    pub(super) fn get_log_page(&self, sqe: &Sqe) -> Reply {
        let req = LogRequest::from_sqe(sqe);
        if !req.offset.is_multiple_of(4) {
            return Reply::status(Status::INVALID_FIELD);
        }
        let page = match req.lid {
            lid::DISCOVERY if self.subsys.is_discovery() => {
                if !req.rae {
                    self.acknowledge(aen::DISCOVERY);
                }
                self.registry
                    .discovery_log(&self.hostnqn, self.arrival.local)
            }
            _ if self.subsys.is_discovery() => return Reply::status(Status::INVALID_LOG_PAGE),
            lid::SUPPORTED => supported_logs(self.takes_reservations()),
            lid::ERROR => vec![0; 64],
            // For the whole controller only (Identify LPA bit 0 clear):
            // NVMe Base 2.1, 5.1.12.1.3.
            lid::SMART if sqe.nsid() != 0 && sqe.nsid() != u32::MAX => {
                return Reply::status(Status::INVALID_FIELD)
            }
            lid::SMART => smart_log(),
            lid::FW_SLOT => {
                let mut b = vec![0u8; 512];
                b[0] = 1; // active slot 1
                rdmablk_common::bytes::put_str(&mut b, 8, 8, env!("CARGO_PKG_VERSION"), b' ');
                b
            }
            lid::CHANGED_NS => self.changed_ns_log(req.rae),
            lid::CMD_EFFECTS => effects_log(self.takes_reservations()),
            lid::ANA => self.ana_log(req.lsp & ana::LSP_RGO != 0, req.rae),
            lid::FEATURES => features_log(self.takes_reservations()),
            // No NVMe-MI command is supported: every entry is zero.
            lid::MI_EFFECTS => vec![0; 4096],
            lid::RESERVATION if self.takes_reservations() => self.reservation_log(req.rae),
            _ => return Reply::status(Status::INVALID_LOG_PAGE),
        };
        // NVMe Base 2.0, 5.16: an offset past the end of the log is an
        // Invalid Field; a length past it reads zeroes (transport padding).
        if req.offset > page.len() as u64 {
            return Reply::status(Status::INVALID_FIELD);
        }
        Reply::data(req.window(&page))
    }

    /// The Changed Namespace List (NVMe Base 2.1, 5.16.1.5): namespaces
    /// changed since the last read with RAE clear, which empties it and
    /// acknowledges Namespace Attribute Changed.
    fn changed_ns_log(&self, rae: bool) -> Vec<u8> {
        let mut st = self.state.lock().expect("controller state");
        let mut b = vec![0u8; 4096];
        let ev = &mut st.events;
        if ev.changed_ns.len() > CHANGED_NS_MAX {
            rdmablk_common::bytes::put_u32(&mut b, 0, u32::MAX);
        } else {
            for (i, nsid) in ev.changed_ns.iter().enumerate() {
                rdmablk_common::bytes::put_u32(&mut b, i * 4, *nsid);
            }
        }
        if !rae {
            ev.changed_ns.clear();
            ev.masked &= !aen::NS_ATTR;
        }
        b
    }
}

impl Controller {
    /// The ANA log page (NVMe Base 2.1, 5.1.12.1.13) as this controller's
    /// listener reports it: each group with active namespaces in the
    /// subsystem, their namespaces unless Return Groups Only. A read with
    /// RAE clear acknowledges Asymmetric Namespace Access Change.
    fn ana_log(&self, rgo: bool, rae: bool) -> Vec<u8> {
        let mut groups: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for ns in self.subsys.visible_namespaces(&self.hostnqn) {
            groups.entry(ns.ana_group()).or_default().push(ns.nsid);
        }
        // Ascending within a group: the Linux host walks them in step with
        // its own namespace list.
        for nsids in groups.values_mut() {
            nsids.sort_unstable();
        }
        let log = self.arrival.ana.log(&groups, rgo);
        if !rae {
            self.acknowledge(aen::ANA_CHANGE);
        }
        log.encode()
    }
}

/// SMART / Health Information: nothing to warn about.
fn smart_log() -> Vec<u8> {
    let mut b = vec![0u8; 512];
    rdmablk_common::bytes::put_u16(&mut b, 1, 300); // composite temperature, kelvin
    b[3] = 100; // available spare %
    b[4] = 10; // spare threshold %
    b
}

/// Supported Log Pages (NVMe Base 2.0, 5.16.1.1): every log page this
/// controller serves; no Index Offset, no log specific parameters claimed.
fn supported_logs(reservations: bool) -> Vec<u8> {
    let mut b = vec![0u8; 1024];
    let mut lids = vec![
        lid::SUPPORTED,
        lid::ERROR,
        lid::SMART,
        lid::FW_SLOT,
        lid::CHANGED_NS,
        lid::CMD_EFFECTS,
        lid::ANA,
        lid::FEATURES,
        lid::MI_EFFECTS,
    ];
    if reservations {
        lids.push(lid::RESERVATION);
    }
    for l in lids {
        put_u32(&mut b, l as usize * 4, entry::SUPPORTED);
    }
    b
}

/// Commands Supported and Effects (NVMe Base 2.0, 5.16.1.6): which
/// opcodes exist, which change data, and their scope (the controller for
/// admin commands, namespaces for I/O commands).
fn effects_log(reservations: bool) -> Vec<u8> {
    let admin_cmd = entry::SUPPORTED | entry::SCOPE_CONTROLLER;
    let reads = entry::SUPPORTED | entry::SCOPE_NAMESPACE;
    let writes = reads | entry::CHANGES_DATA;
    let mut io = vec![
        (nvm::FLUSH, reads),
        (nvm::READ, reads),
        (nvm::COMPARE, reads),
        (nvm::WRITE, writes),
        (nvm::WRITE_ZEROES, writes),
        (nvm::DSM, writes),
    ];
    if reservations {
        for opc in [
            nvm::RESV_REGISTER,
            nvm::RESV_REPORT,
            nvm::RESV_ACQUIRE,
            nvm::RESV_RELEASE,
        ] {
            io.push((opc, reads));
        }
    }
    let mut b = vec![0u8; 4096];
    for opc in [
        admin::GET_LOG_PAGE,
        admin::IDENTIFY,
        admin::ABORT,
        admin::SET_FEATURES,
        admin::GET_FEATURES,
        admin::ASYNC_EVENT,
        admin::KEEP_ALIVE,
        FABRICS_OPCODE,
    ] {
        put_u32(&mut b, opc as usize * 4, admin_cmd);
    }
    for (opc, effects) in io {
        put_u32(&mut b, 1024 + opc as usize * 4, effects);
    }
    b
}

/// Feature Identifiers Supported and Effects (NVMe Base 2.0, 5.16.1.18):
/// the features Get Features answers, and their scope.
fn features_log(reservations: bool) -> Vec<u8> {
    let controller = entry::SUPPORTED | entry::SCOPE_CONTROLLER;
    let namespace = entry::SUPPORTED | entry::SCOPE_NAMESPACE;
    let mut fids = vec![
        (feature::ARBITRATION, controller),
        (feature::POWER_MGMT, controller),
        (feature::TEMP_THRESHOLD, controller),
        (feature::ERROR_RECOVERY, controller),
        (feature::VOLATILE_WC, controller),
        (feature::NUM_QUEUES, controller),
        (feature::IRQ_COALESCE, controller),
        (feature::WRITE_ATOMIC, controller),
        (feature::ASYNC_EVENT, controller),
        (feature::KEEP_ALIVE, controller),
        (feature::HOST_BEHAVIOR, controller),
        (feature::HOST_ID, controller),
    ];
    if reservations {
        fids.push((feature::RESV_MASK, namespace));
        fids.push((feature::RESV_PERSIST, namespace));
    }
    let mut b = vec![0u8; 1024];
    for (fid, effects) in fids {
        put_u32(&mut b, fid as usize * 4, effects);
    }
    b
}

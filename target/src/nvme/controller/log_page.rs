//! Get Log Page: the discovery log (discovery controllers), and Error
//! Information, SMART / Health Information, Firmware Slot Information,
//! Changed Namespace List, Commands Supported and Effects and Asymmetric
//! Namespace Access (I/O controllers).

use super::{aen, Controller, Reply};
use rdmablk_common::nvme::ana;
use rdmablk_common::nvme::log::{lid, LogRequest};
use rdmablk_common::nvme::{admin, nvm, Sqe, Status, FABRICS_OPCODE};
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
            lid::CMD_EFFECTS => effects_log(),
            lid::ANA => self.ana_log(req.lsp & ana::LSP_RGO != 0, req.rae),
            lid::RESERVATION => self.reservation_log(req.rae),
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

/// Commands Supported and Effects: which opcodes exist and which change data.
fn effects_log() -> Vec<u8> {
    const CSUPP: u32 = 1;
    const LBCC: u32 = 1 << 1;
    let mut b = vec![0u8; 4096];
    let put = |b: &mut [u8], base: usize, opc: u8, v: u32| {
        rdmablk_common::bytes::put_u32(b, base + opc as usize * 4, v)
    };
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
        put(&mut b, 0, opc, CSUPP);
    }
    for opc in [
        nvm::FLUSH,
        nvm::READ,
        nvm::COMPARE,
        nvm::RESV_REGISTER,
        nvm::RESV_REPORT,
        nvm::RESV_ACQUIRE,
        nvm::RESV_RELEASE,
    ] {
        put(&mut b, 1024, opc, CSUPP);
    }
    for opc in [nvm::WRITE, nvm::WRITE_ZEROES, nvm::DSM] {
        put(&mut b, 1024, opc, CSUPP | LBCC);
    }
    b
}

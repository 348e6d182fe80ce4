//! Identify: the controller (as an I/O or a discovery controller), a
//! namespace, the active namespace list and a namespace's identifiers, and
//! the NVM command set's and the command set independent structures NVMe
//! 2.0 adds (CNS 05h to 08h).

use super::fabrics::KAS;
use super::{aen, Controller, Reply, CRDT, MAX_AERS, VERSION};
use crate::config::{MAX_ANA_GROUP, MAX_NSID};
use crate::nvme::fabric::ADMIN_QUEUE_SIZE;
use crate::nvme::namespace::Namespace;
use crate::service::ana::{ANACAP, ANATT_SECS};
use rdmablk_common::nvme::identify::{
    cns, cntrltype, csi_of, encode_ns_descriptors, encode_ns_list, fuses, oncs, ControllerId,
    IndependentNamespaceId, NamespaceId, NamespaceIdentifiers, NvmControllerId, CSI_NVM,
    IDENTIFY_LEN,
};
use rdmablk_common::nvme::resv::rescap;
use rdmablk_common::nvme::{Sqe, Status};

/// Namespace ids from here up (FFFFFFFEh, and FFFFFFFFh: all namespaces)
/// cannot start an Active Namespace ID list (NVMe Base 2.1, 5.1.13.2.2).
const NSID_RESERVED: u32 = 0xffff_fffe;

/// Write Zeroes Size Limit: 4 KiB << 13 = 32 MiB, the most a Write Zeroes
/// can name (65,536 blocks) on a 512-byte namespace. The Linux host sizes
/// its write-zeroes requests by it (MDTS otherwise).
const WZSL: u8 = 13;

impl Controller {
    /// Identify, by CNS; a discovery controller has only its own.
    pub(super) fn identify(&self, sqe: &Sqe) -> Reply {
        let cns = sqe.cdw(10) as u8;
        let nsid = sqe.nsid();
        if self.subsys.is_discovery() && cns != cns::CONTROLLER {
            return Reply::status(Status::INVALID_FIELD);
        }
        // The NVM command set is the only one (NVMe Base 2.0, 5.17.1: an
        // unsupported CSI is an Invalid Field).
        let nvm = csi_of(sqe.cdw(11)) == CSI_NVM;
        match cns {
            cns::CONTROLLER => Reply::data(self.identify_controller().encode()),
            cns::NAMESPACE => match self.subsys.visible_namespace(nsid, &self.hostnqn) {
                Some(ns) => {
                    let ids = ns.ids();
                    Reply::data(
                        NamespaceId {
                            nsze: ns.blocks(),
                            ncap: ns.blocks(),
                            nuse: ns.blocks(),
                            nsfeat: 0,
                            nmic: 1,
                            rescap: rescap_of(&ns),
                            dlfeat: 1 | 1 << 3,
                            anagrpid: ns.ana_group(),
                            nsattr: ns.read_only() as u8,
                            nguid: ids.nguid,
                            eui64: ids.eui64.unwrap_or([0; 8]),
                            lba_shift: ns.lba_shift() as u8,
                        }
                        .encode(),
                    )
                }
                None => self.inactive(nsid),
            },
            cns::ACTIVE_NS_LIST | cns::CS_ACTIVE_NS_LIST
                if nsid < NSID_RESERVED && (cns == cns::ACTIVE_NS_LIST || nvm) =>
            {
                Reply::data(encode_ns_list(
                    self.subsys
                        .visible_namespaces(&self.hostnqn)
                        .iter()
                        .map(|n| n.nsid),
                    nsid,
                ))
            }
            cns::NS_DESCRIPTORS => match self.subsys.visible_namespace(nsid, &self.hostnqn) {
                Some(ns) => {
                    let ids = ns.ids();
                    Reply::data(encode_ns_descriptors(&NamespaceIdentifiers {
                        eui64: ids.eui64,
                        nguid: Some(ids.nguid),
                        uuid: Some(ids.uuid),
                    }))
                }
                None => Reply::status(Status::INVALID_NAMESPACE),
            },
            // The NVM command set's namespace data: LBA storage tags and
            // protection information, which no namespace has (all zeroes,
            // as nvmet).
            cns::CS_NAMESPACE if nvm => match self.subsys.visible_namespace(nsid, &self.hostnqn) {
                Some(_) => Reply::data(vec![0; IDENTIFY_LEN]),
                None => self.inactive(nsid),
            },
            cns::CS_CONTROLLER if nvm => Reply::data(
                NvmControllerId {
                    wzsl: WZSL,
                    // Ranges and their sizes: no limit but the command's
                    // own (256 ranges of up to 2^32 - 1 blocks).
                    ..Default::default()
                }
                .encode(),
            ),
            cns::INDEPENDENT_NS => match self.subsys.visible_namespace(nsid, &self.hostnqn) {
                Some(ns) => Reply::data(independent(&ns).encode()),
                None => self.inactive(nsid),
            },
            _ => Reply::status(Status::INVALID_FIELD),
        }
    }

    /// The answer for a namespace this host does not see: zeroes for an
    /// inactive nsid, Invalid Namespace for one that cannot exist (NVMe
    /// Base 2.0, 5.17.2.1).
    fn inactive(&self, nsid: u32) -> Reply {
        if nsid != 0 && nsid <= MAX_NSID {
            Reply::data(vec![0; IDENTIFY_LEN])
        } else {
            Reply::status(Status::INVALID_NAMESPACE)
        }
    }

    fn identify_controller(&self) -> ControllerId {
        let disc = self.subsys.is_discovery();
        ControllerId {
            vid: 0,
            ssvid: 0,
            serial: self.subsys.serial.clone(),
            model: "rdmablk".into(),
            firmware: env!("CARGO_PKG_VERSION").into(),
            // Multiple controllers per subsystem (bit 1), ANA reporting
            // (bit 3).
            cmic: if disc { 0 } else { 1 << 1 | 1 << 3 },
            mdts: self.caps.mdts,
            cntlid: self.cntlid,
            ver: VERSION,
            // Exactly the notices implemented (NVMe Base 2.1, Figure 312).
            oaes: if disc {
                aen::DISCOVERY
            } else {
                aen::NS_ATTR | aen::ANA_CHANGE
            },
            // 128-bit host identifiers (Connect's, Reservation Report's).
            ctratt: 1,
            cntrltype: if disc {
                cntrltype::DISCOVERY
            } else {
                cntrltype::IO
            },
            // Reserved for discovery controllers (NVMe Base 2.1, Figure 312).
            crdt: if disc { [0; 3] } else { CRDT },
            acl: 3,
            aerl: (MAX_AERS - 1) as u8,
            // The Commands Supported and Effects log (bit 1), extended
            // data for Get Log Page (bit 2: 64-bit offsets), and for I/O
            // controllers the logs NVMe 2.0 makes mandatory (bit 5:
            // Supported Log Pages, Feature Identifiers Supported and
            // Effects, NVMe-MI Commands Supported and Effects, and the
            // scope of each command). Not bit 0: SMART / Health
            // Information is for the controller only.
            lpa: if disc {
                1 << 1 | 1 << 2
            } else {
                1 << 1 | 1 << 2 | 1 << 5
            },
            elpe: 0,
            kas: KAS,
            // ANA: reported by NVM subsystems only.
            anatt: if disc { 0 } else { ANATT_SECS },
            anacap: if disc { 0 } else { ANACAP },
            anagrpmax: if disc { 0 } else { MAX_ANA_GROUP },
            nanagrpid: if disc { 0 } else { MAX_ANA_GROUP },
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: if disc {
                ADMIN_QUEUE_SIZE
            } else {
                self.caps.max_queue_entries
            },
            // As nvmet: namespace ids up to 1024, each of which may be
            // attached. MNAN sizes the ANA log the host reads (header,
            // NANAGRPID descriptors, MNAN namespace ids: 8 KiB), and must be
            // at most NN or the Linux host turns ANA off.
            nn: if disc { 0 } else { MAX_NSID },
            oncs: if disc {
                0
            } else if self.takes_reservations() {
                oncs::COMPARE | oncs::DSM | oncs::WRITE_ZEROES | oncs::RESERVATIONS
            } else {
                oncs::COMPARE | oncs::DSM | oncs::WRITE_ZEROES
            },
            fuses: if disc { 0 } else { fuses::COMPARE_AND_WRITE },
            // One block: larger ones are not torn by other writes either
            // (`write_gate`), but a reader may see part of them.
            acwu: 0,
            vwc: self.subsys.volatile_cache() as u8,
            sgls: self.caps.sgls,
            mnan: if disc { 0 } else { MAX_NSID },
            subnqn: self.subsys.nqn.clone(),
            ioccsz: self.caps.ioccsz(),
            iorcsz: 1,
            icdoff: 0,
            fcatt: 0,
            msdbd: 1,
        }
    }
}

/// The command set independent Identify Namespace data of `ns` (NVMe Base
/// 2.0, 5.17.2.14): what Identify Namespace says of sharing, reservations,
/// its ANA group and write protection, and that it is ready (the Linux host
/// of an NVMe 2.0 controller reads it, and skips a namespace not ready).
fn independent(ns: &Namespace) -> IndependentNamespaceId {
    IndependentNamespaceId {
        nsfeat: 0,
        nmic: 1,
        rescap: rescap_of(ns),
        anagrpid: ns.ana_group(),
        nsattr: ns.read_only() as u8,
        nstat: IndependentNamespaceId::READY,
    }
}

/// The reservations `ns` takes (RESCAP).
fn rescap_of(ns: &Namespace) -> u8 {
    if ns.reservations.is_some() {
        rescap::PTPL | rescap::ALL_TYPES | rescap::IEKEY_1_3
    } else {
        0
    }
}

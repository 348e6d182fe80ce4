//! Identify data structures (CNS 00h namespace, 01h controller, 02h active
//! namespace list, 03h namespace identification descriptors, 06h the NVM
//! command set's controller data, 08h command set independent namespace
//! data).

use crate::bytes::{get_str, get_u16, get_u32, get_u64, put_str, put_u16, put_u32, put_u64};

/// Every Identify data structure is 4 KiB.
pub const IDENTIFY_LEN: usize = 4096;

/// Controller or Namespace Structure values (CDW10 bits 7:0).
pub mod cns {
    pub const NAMESPACE: u8 = 0x00;
    pub const CONTROLLER: u8 = 0x01;
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    pub const NS_DESCRIPTORS: u8 = 0x03;
    /// The I/O command set specific Identify Namespace data structure.
    pub const CS_NAMESPACE: u8 = 0x05;
    /// The I/O command set specific Identify Controller data structure.
    pub const CS_CONTROLLER: u8 = 0x06;
    /// The active namespace list of an I/O command set.
    pub const CS_ACTIVE_NS_LIST: u8 = 0x07;
    /// The I/O command set independent Identify Namespace data structure.
    pub const INDEPENDENT_NS: u8 = 0x08;
}

/// The NVM command set's Command Set Identifier.
pub const CSI_NVM: u8 = 0;

/// The Command Set Identifier an Identify command names (CDW11 bits 31:24).
pub fn csi_of(cdw11: u32) -> u8 {
    (cdw11 >> 24) as u8
}

/// Controller type (CNTRLTYPE).
pub mod cntrltype {
    pub const IO: u8 = 1;
    pub const DISCOVERY: u8 = 2;
}

/// Optional NVM command support bits (ONCS).
pub mod oncs {
    pub const COMPARE: u16 = 1 << 0;
    pub const DSM: u16 = 1 << 2;
    pub const WRITE_ZEROES: u16 = 1 << 3;
    pub const RESERVATIONS: u16 = 1 << 5;
}

/// Fused operation support bits (FUSES).
pub mod fuses {
    pub const COMPARE_AND_WRITE: u16 = 1 << 0;
}

/// SGL support bits (SGLS).
pub mod sgls {
    /// SGLs supported, no alignment requirement.
    pub const SUPPORTED: u32 = 1 << 0;
    /// Keyed SGL Data Block descriptors (RDMA).
    pub const KEYED: u32 = 1 << 2;
    /// Offset-addressed Data Block descriptors (in-capsule data).
    pub const OFFSET: u32 = 1 << 20;
    /// Transport SGL Data Block descriptors (NVMe/TCP).
    pub const TRANSPORT: u32 = 1 << 21;
}

/// The fields of the Identify Controller structure that NVMe over Fabrics uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControllerId {
    pub vid: u16,
    pub ssvid: u16,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// Controller multi-path I/O and namespace sharing capabilities.
    pub cmic: u8,
    /// Maximum data transfer size, a power of two in units of 4 KiB; 0 = no limit.
    pub mdts: u8,
    pub cntlid: u16,
    /// Version, as in the VS property.
    pub ver: u32,
    /// Optional asynchronous events supported.
    pub oaes: u32,
    /// Controller attributes (bit 0: 128-bit host identifiers).
    pub ctratt: u32,
    pub cntrltype: u8,
    /// Command Retry Delay Times 1 to 3, in 100 ms units: how long a host
    /// that enabled Advanced Command Retry waits for a status's CRD.
    pub crdt: [u16; 3],
    /// Abort command limit (0's based).
    pub acl: u8,
    /// Asynchronous event request limit (0's based).
    pub aerl: u8,
    /// Log page attributes.
    pub lpa: u8,
    /// Error log page entries (0's based).
    pub elpe: u8,
    /// Keep-alive support: granularity in 100 ms units; 0 = not supported.
    pub kas: u16,
    /// ANA Transition Time: seconds a group stays in the change state at most.
    pub anatt: u8,
    /// ANA capabilities (`ana::anacap`).
    pub anacap: u8,
    /// Highest ANA group id.
    pub anagrpmax: u32,
    /// Number of ANA group ids the controller supports.
    pub nanagrpid: u32,
    pub sqes: u8,
    pub cqes: u8,
    /// Maximum outstanding commands per queue.
    pub maxcmd: u16,
    /// Number of namespaces (highest valid nsid).
    pub nn: u32,
    pub oncs: u16,
    /// Fused operations supported (`fuses`).
    pub fuses: u16,
    /// Atomic Compare & Write Unit: logical blocks (0's based) a Compare and
    /// Write writes atomically.
    pub acwu: u16,
    /// Volatile write cache present (bit 0).
    pub vwc: u8,
    pub sgls: u32,
    pub mnan: u32,
    pub subnqn: String,
    /// I/O queue command capsule supported size, in 16-byte units.
    pub ioccsz: u32,
    /// I/O queue response capsule supported size, in 16-byte units.
    pub iorcsz: u32,
    /// In-capsule data offset, in 16-byte units.
    pub icdoff: u16,
    /// Fabrics controller attributes (bit 0: static controller model).
    pub fcatt: u8,
    /// Maximum SGL data block descriptors per command.
    pub msdbd: u8,
}

impl ControllerId {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        put_u16(&mut b, 0, self.vid);
        put_u16(&mut b, 2, self.ssvid);
        put_str(&mut b, 4, 20, &self.serial, b' ');
        put_str(&mut b, 24, 40, &self.model, b' ');
        put_str(&mut b, 64, 8, &self.firmware, b' ');
        b[72] = 6; // recommended arbitration burst
        b[76] = self.cmic;
        b[77] = self.mdts;
        put_u16(&mut b, 78, self.cntlid);
        put_u32(&mut b, 80, self.ver);
        put_u32(&mut b, 92, self.oaes);
        put_u32(&mut b, 96, self.ctratt);
        b[111] = self.cntrltype;
        for (i, t) in self.crdt.iter().enumerate() {
            put_u16(&mut b, 128 + 2 * i, *t);
        }
        b[258] = self.acl;
        b[259] = self.aerl;
        b[260] = 1 << 1 | 1; // firmware: slot 1 read-only, one slot
        b[261] = self.lpa;
        b[262] = self.elpe;
        put_u16(&mut b, 320, self.kas);
        b[342] = self.anatt;
        b[343] = self.anacap;
        put_u32(&mut b, 344, self.anagrpmax);
        put_u32(&mut b, 348, self.nanagrpid);
        b[512] = self.sqes;
        b[513] = self.cqes;
        put_u16(&mut b, 514, self.maxcmd);
        put_u32(&mut b, 516, self.nn);
        put_u16(&mut b, 520, self.oncs);
        put_u16(&mut b, 522, self.fuses);
        put_u16(&mut b, 534, self.acwu);
        b[525] = self.vwc;
        put_u32(&mut b, 536, self.sgls);
        put_u32(&mut b, 540, self.mnan);
        put_str(&mut b, 768, 256, &self.subnqn, 0);
        put_u32(&mut b, 1792, self.ioccsz);
        put_u32(&mut b, 1796, self.iorcsz);
        put_u16(&mut b, 1800, self.icdoff);
        b[1802] = self.fcatt;
        b[1803] = self.msdbd;
        b
    }

    /// Parses a 4 KiB Identify Controller structure. `b` must be 4096 bytes.
    pub fn parse(b: &[u8]) -> Self {
        ControllerId {
            vid: get_u16(b, 0),
            ssvid: get_u16(b, 2),
            serial: get_str(b, 4, 20),
            model: get_str(b, 24, 40),
            firmware: get_str(b, 64, 8),
            cmic: b[76],
            mdts: b[77],
            cntlid: get_u16(b, 78),
            ver: get_u32(b, 80),
            oaes: get_u32(b, 92),
            ctratt: get_u32(b, 96),
            cntrltype: b[111],
            crdt: [get_u16(b, 128), get_u16(b, 130), get_u16(b, 132)],
            acl: b[258],
            aerl: b[259],
            lpa: b[261],
            elpe: b[262],
            kas: get_u16(b, 320),
            anatt: b[342],
            anacap: b[343],
            anagrpmax: get_u32(b, 344),
            nanagrpid: get_u32(b, 348),
            sqes: b[512],
            cqes: b[513],
            maxcmd: get_u16(b, 514),
            nn: get_u32(b, 516),
            oncs: get_u16(b, 520),
            fuses: get_u16(b, 522),
            acwu: get_u16(b, 534),
            vwc: b[525],
            sgls: get_u32(b, 536),
            mnan: get_u32(b, 540),
            subnqn: get_str(b, 768, 256),
            ioccsz: get_u32(b, 1792),
            iorcsz: get_u32(b, 1796),
            icdoff: get_u16(b, 1800),
            fcatt: b[1802],
            msdbd: b[1803],
        }
    }

    /// The maximum transfer size in bytes, or `None` when unlimited.
    pub fn max_transfer(&self) -> Option<u32> {
        (self.mdts != 0).then(|| 4096u32 << self.mdts)
    }
}

/// The fields of the Identify Namespace structure (NVM command set) we use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceId {
    /// Namespace size in logical blocks.
    pub nsze: u64,
    pub ncap: u64,
    pub nuse: u64,
    /// Namespace features (bit 0: thin provisioning).
    pub nsfeat: u8,
    /// Namespace multi-path I/O and sharing (bit 0: may be shared).
    pub nmic: u8,
    /// Reservation capabilities (`resv::rescap`).
    pub rescap: u8,
    /// Deallocate logical block features: bits 2:0 say what deallocated
    /// blocks read as (1 = zeroes); bit 3: Write Zeroes may deallocate.
    pub dlfeat: u8,
    /// The namespace's ANA group (0: it reports none).
    pub anagrpid: u32,
    /// Namespace attributes (bit 0: write protected).
    pub nsattr: u8,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    /// log2 of the logical block size of the single LBA format.
    pub lba_shift: u8,
}

impl NamespaceId {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        put_u64(&mut b, 0, self.nsze);
        put_u64(&mut b, 8, self.ncap);
        put_u64(&mut b, 16, self.nuse);
        b[24] = self.nsfeat;
        b[25] = 0; // one LBA format (0's based)
        b[26] = 0; // format 0 in use
        b[30] = self.nmic;
        b[31] = self.rescap;
        b[33] = self.dlfeat;
        put_u32(&mut b, 92, self.anagrpid);
        b[99] = self.nsattr;
        b[104..120].copy_from_slice(&self.nguid);
        b[120..128].copy_from_slice(&self.eui64);
        b[130] = self.lba_shift; // LBAF0: MS = 0, LBADS, RP = 0 (best)
        b
    }

    pub fn parse(b: &[u8]) -> Self {
        let flbas = (b[26] & 0xf) as usize;
        let mut nguid = [0; 16];
        nguid.copy_from_slice(&b[104..120]);
        let mut eui64 = [0; 8];
        eui64.copy_from_slice(&b[120..128]);
        NamespaceId {
            nsze: get_u64(b, 0),
            ncap: get_u64(b, 8),
            nuse: get_u64(b, 16),
            nsfeat: b[24],
            nmic: b[30],
            rescap: b[31],
            dlfeat: b[33],
            anagrpid: get_u32(b, 92),
            nsattr: b[99],
            nguid,
            eui64,
            lba_shift: b[128 + flbas * 4 + 2],
        }
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        1 << self.lba_shift
    }
}

/// The NVM command set's Identify Controller data structure (CNS 06h,
/// NVM Command Set 1.0, 4.1.5.2): its per-command limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmControllerId {
    /// Verify Size Limit: 4 KiB << VSL bytes; 0 = no limit.
    pub vsl: u8,
    /// Write Zeroes Size Limit: 4 KiB << WZSL bytes; 0 = no limit.
    pub wzsl: u8,
    /// Write Uncorrectable Size Limit: 4 KiB << WUSL bytes; 0 = no limit.
    pub wusl: u8,
    /// Dataset Management Ranges Limit: ranges per command; 0 = no limit.
    pub dmrl: u8,
    /// Dataset Management Range Size Limit: blocks per range; 0 = no limit.
    pub dmrsl: u32,
    /// Dataset Management Size Limit: blocks per command; 0 = no limit.
    pub dmsl: u64,
}

impl NvmControllerId {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        b[0] = self.vsl;
        b[1] = self.wzsl;
        b[2] = self.wusl;
        b[3] = self.dmrl;
        put_u32(&mut b, 4, self.dmrsl);
        put_u64(&mut b, 8, self.dmsl);
        b
    }

    pub fn parse(b: &[u8]) -> Self {
        NvmControllerId {
            vsl: b[0],
            wzsl: b[1],
            wusl: b[2],
            dmrl: b[3],
            dmrsl: get_u32(b, 4),
            dmsl: get_u64(b, 8),
        }
    }
}

/// The I/O command set independent Identify Namespace data structure
/// (CNS 08h, NVMe Base 2.0, 5.17.2.14).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndependentNamespaceId {
    /// Namespace features (bit 4: rotational media).
    pub nsfeat: u8,
    /// Namespace multi-path I/O and sharing (bit 0: may be shared).
    pub nmic: u8,
    /// Reservation capabilities (`resv::rescap`).
    pub rescap: u8,
    /// The namespace's ANA group (0: it reports none).
    pub anagrpid: u32,
    /// Namespace attributes (bit 0: write protected).
    pub nsattr: u8,
    /// Namespace status (bit 0: ready for I/O).
    pub nstat: u8,
}

impl IndependentNamespaceId {
    /// NSTAT bit 0: the namespace is ready.
    pub const READY: u8 = 1;

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        b[0] = self.nsfeat;
        b[1] = self.nmic;
        b[2] = self.rescap;
        put_u32(&mut b, 4, self.anagrpid);
        b[8] = self.nsattr;
        b[14] = self.nstat;
        b
    }

    pub fn parse(b: &[u8]) -> Self {
        IndependentNamespaceId {
            nsfeat: b[0],
            nmic: b[1],
            rescap: b[2],
            anagrpid: get_u32(b, 4),
            nsattr: b[8],
            nstat: b[14],
        }
    }
}

/// Encodes an active namespace list: the nsids above `after`, ascending.
pub fn encode_ns_list(nsids: impl IntoIterator<Item = u32>, after: u32) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    let mut ids: Vec<u32> = nsids.into_iter().filter(|&n| n > after).collect();
    ids.sort_unstable();
    for (i, id) in ids.iter().take(IDENTIFY_LEN / 4).enumerate() {
        put_u32(&mut b, i * 4, *id);
    }
    b
}

/// Decodes an active namespace list.
pub fn parse_ns_list(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| get_u32(c, 0))
        .take_while(|&n| n != 0)
        .collect()
}

/// Namespace identification descriptor types (NIDT).
pub mod nidt {
    pub const EUI64: u8 = 1;
    pub const NGUID: u8 = 2;
    pub const UUID: u8 = 3;
    pub const CSI: u8 = 4;
}

/// Encodes a namespace identification descriptor list: the identifiers
/// `ids` has, then the command set (NVM).
pub fn encode_ns_descriptors(ids: &NamespaceIdentifiers) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    let mut at = 0;
    let csi = [CSI_NVM];
    for (kind, id) in [
        (nidt::EUI64, ids.eui64.as_ref().map(|i| &i[..])),
        (nidt::NGUID, ids.nguid.as_ref().map(|i| &i[..])),
        (nidt::UUID, ids.uuid.as_ref().map(|i| &i[..])),
        (nidt::CSI, Some(&csi[..])),
    ] {
        let Some(id) = id else { continue };
        b[at] = kind;
        b[at + 1] = id.len() as u8;
        b[at + 4..at + 4 + id.len()].copy_from_slice(id);
        at += 4 + id.len();
    }
    b
}

/// The identifiers a namespace identification descriptor list gives (and
/// the EUI-64 and NGUID fields of Identify Namespace, which carry the same).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamespaceIdentifiers {
    pub eui64: Option<[u8; 8]>,
    pub nguid: Option<[u8; 16]>,
    pub uuid: Option<[u8; 16]>,
}

impl NamespaceIdentifiers {
    /// Decodes a descriptor list (NVMe Base 2.1, 5.1.13.2.3), up to its
    /// first zero-length descriptor.
    pub fn parse(b: &[u8]) -> NamespaceIdentifiers {
        let mut ids = NamespaceIdentifiers::default();
        let mut at = 0;
        while at + 4 <= b.len() {
            let (kind, len) = (b[at], b[at + 1] as usize);
            let Some(id) = b.get(at + 4..at + 4 + len).filter(|_| len > 0) else {
                break;
            };
            match kind {
                nidt::EUI64 => ids.eui64 = id.try_into().ok(),
                nidt::NGUID => ids.nguid = id.try_into().ok(),
                nidt::UUID => ids.uuid = id.try_into().ok(),
                _ => {}
            }
            at += 4 + len;
        }
        ids
    }

    /// Takes Identify Namespace's NGUID and EUI-64 where the list gave none
    /// (all-zero fields say none).
    pub fn with(mut self, id: &NamespaceId) -> NamespaceIdentifiers {
        if self.nguid.is_none() && id.nguid != [0; 16] {
            self.nguid = Some(id.nguid);
        }
        if self.eui64.is_none() && id.eui64 != [0; 8] {
            self.eui64 = Some(id.eui64);
        }
        self
    }

    /// Whether it names the namespace at all.
    pub fn any(&self) -> bool {
        self.eui64.is_some() || self.nguid.is_some() || self.uuid.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_fields_at_spec_offsets() {
        let id = ControllerId {
            serial: "SN1".into(),
            mdts: 8,
            cntlid: 0x1234,
            kas: 100,
            maxcmd: 128,
            nn: 4,
            sgls: sgls::SUPPORTED | sgls::OFFSET,
            subnqn: "nqn.2026-11.io.rdmablk:x".into(),
            ioccsz: 516,
            iorcsz: 1,
            crdt: [1, 10, 100],
            anatt: 10,
            anacap: 0x1f,
            anagrpmax: 128,
            nanagrpid: 127,
            mnan: 1024,
            ..Default::default()
        };
        let b = id.encode();
        // NVMe Base 2.1, Figure 312: ANATT 342, ANACAP 343, ANAGRPMAX
        // 347:344, NANAGRPID 351:348, MNAN 543:540.
        assert_eq!((b[342], b[343]), (10, 0x1f));
        assert_eq!((get_u32(&b, 344), get_u32(&b, 348)), (128, 127));
        assert_eq!(get_u32(&b, 540), 1024);
        // NVMe Base 2.0, 5.17.2.1 Figure 275: CRDT1..3 at bytes 129:128, 131:130, 133:132.
        assert_eq!(get_u16(&b, 128), 1);
        assert_eq!(get_u16(&b, 132), 100);
        assert_eq!(&b[4..8], b"SN1 ");
        assert_eq!(b[77], 8);
        assert_eq!(get_u16(&b, 78), 0x1234);
        assert_eq!(get_u16(&b, 320), 100);
        assert_eq!(get_u16(&b, 514), 128);
        assert_eq!(get_u32(&b, 536), 0x0010_0001);
        assert_eq!(&b[768..792], b"nqn.2026-11.io.rdmablk:x");
        assert_eq!(get_u32(&b, 1792), 516);
        assert_eq!(ControllerId::parse(&b), id);
        assert_eq!(id.max_transfer(), Some(1 << 20));
    }

    #[test]
    fn descriptor_list_round_trip() {
        let given = NamespaceIdentifiers {
            eui64: None,
            nguid: Some([1; 16]),
            uuid: Some([2; 16]),
        };
        let b = encode_ns_descriptors(&given);
        let ids = NamespaceIdentifiers::parse(&b);
        assert_eq!(ids, given);
        // NVMe Base 2.0, Figure 281: NIDT, NIDL, two reserved bytes, NID;
        // the command set (NIDT 4h, one byte: 0h, NVM) last.
        assert_eq!((b[0], b[1]), (nidt::NGUID, 16));
        assert_eq!((b[40], b[41], b[44]), (nidt::CSI, 1, CSI_NVM));
        let all = NamespaceIdentifiers {
            eui64: Some([5; 8]),
            ..given
        };
        let b = encode_ns_descriptors(&all);
        assert_eq!((b[0], b[1], &b[4..12]), (nidt::EUI64, 8, &[5u8; 8][..]));
        assert_eq!(NamespaceIdentifiers::parse(&b), all);
        let id = NamespaceId {
            eui64: [3; 8],
            nguid: [9; 16],
            ..Default::default()
        };
        let both = ids.with(&id);
        assert_eq!((both.nguid, both.eui64), (Some([1; 16]), Some([3; 8])));
        assert!(!NamespaceIdentifiers::parse(&[0; 64]).any());
    }

    #[test]
    fn namespace_round_trip() {
        let ns = NamespaceId {
            nsze: 2048,
            ncap: 2048,
            nuse: 2048,
            nmic: 1,
            dlfeat: 9,
            lba_shift: 12,
            nguid: [7; 16],
            anagrpid: 3,
            ..Default::default()
        };
        let b = ns.encode();
        assert_eq!(b[130], 12);
        // NVM Command Set 1.1, Figure 114: ANAGRPID at 95:92.
        assert_eq!(get_u32(&b, 92), 3);
        assert_eq!(NamespaceId::parse(&b), ns);
        assert_eq!(ns.block_size(), 4096);
    }

    #[test]
    fn nvm_controller_and_independent_namespace_at_spec_offsets() {
        let nvm = NvmControllerId {
            wzsl: 13,
            dmrl: 255,
            dmrsl: 0x1234_5678,
            dmsl: 1 << 40,
            ..Default::default()
        };
        let b = nvm.encode();
        // NVM Command Set 1.0, Figure 97: WZSL byte 1, DMRL 3, DMRSL 7:4, DMSL 15:8.
        assert_eq!((b[1], b[3]), (13, 255));
        assert_eq!(get_u32(&b, 4), 0x1234_5678);
        assert_eq!(get_u64(&b, 8), 1 << 40);
        assert_eq!(NvmControllerId::parse(&b), nvm);

        let ns = IndependentNamespaceId {
            nmic: 1,
            rescap: 0xff,
            anagrpid: 7,
            nsattr: 1,
            nstat: IndependentNamespaceId::READY,
            ..Default::default()
        };
        let b = ns.encode();
        // NVMe Base 2.0, Figure 285: NMIC 1, RESCAP 2, ANAGRPID 7:4, NSATTR 8, NSTAT 14.
        assert_eq!((b[1], b[2], b[8], b[14]), (1, 0xff, 1, 1));
        assert_eq!(get_u32(&b, 4), 7);
        assert_eq!(IndependentNamespaceId::parse(&b), ns);
        assert_eq!(csi_of(0x0200_0000), 2);
    }

    #[test]
    fn ns_list_skips_at_or_below_start() {
        let b = encode_ns_list([3, 1, 2], 1);
        assert_eq!(parse_ns_list(&b), vec![2, 3]);
    }
}

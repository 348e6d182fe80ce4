//! The discovery log page (log identifier 70h).

use crate::bytes::{get_str, get_u16, get_u64, put_str, put_u16, put_u64};

/// Size of the discovery log page header.
pub const DISCOVERY_LOG_HEADER_LEN: usize = 1024;
/// Size of one discovery log entry.
pub const DISCOVERY_ENTRY_LEN: usize = 1024;

/// Transport types (TRTYPE).
pub mod trtype {
    pub const RDMA: u8 = 1;
    pub const TCP: u8 = 3;
}

/// Address families (ADRFAM).
pub mod adrfam {
    pub const IPV4: u8 = 1;
    pub const IPV6: u8 = 2;
}

/// Subsystem types (SUBTYPE).
pub mod subtype {
    pub const REFERRAL: u8 = 1;
    pub const NVME: u8 = 2;
    pub const CURRENT_DISCOVERY: u8 = 3;
}

/// Transport requirements (TREQ), NVMe over Fabrics 1.1 Figure 40.
pub mod treq {
    /// Secure channel (bits 1:0): not specified.
    pub const SECURE_CHANNEL_NOT_SPECIFIED: u8 = 0b00;
    /// Secure channel: required.
    pub const SECURE_CHANNEL_REQUIRED: u8 = 0b01;
    /// Secure channel: not required.
    pub const SECURE_CHANNEL_NOT_REQUIRED: u8 = 0b10;
    /// The controller supports hosts disabling SQ flow control (bit 2).
    pub const SQ_FLOW_CONTROL_DISABLE: u8 = 1 << 2;
}

/// Entry flags (EFLAGS, bytes 11:10), NVMe over Fabrics 1.1a Figure 38
/// (TP 8013).
pub mod eflags {
    /// Duplicate Returned Information: this discovery controller returns
    /// the same log as the one reading it (hosts need not connect to it).
    pub const DUPRETINFO: u16 = 1 << 0;
    /// Explicit Persistent Connection Support for Discovery: hosts may keep
    /// a connection to it and take Discovery Log Page Change events.
    pub const EPCSD: u16 = 1 << 1;
}

/// The RDMA transport specific address subtype (TSAS), NVMe over Fabrics
/// 1.1 Figure 41: queue pair type, provider type, connection management.
pub mod rdma_tsas {
    /// RDMA_QPTYPE: reliable connected.
    pub const QPTYPE_CONNECTED: u8 = 1;
    /// RDMA_PRTYPE: no particular provider.
    pub const PRTYPE_NOT_SPECIFIED: u8 = 1;
    /// RDMA_CMS: the RDMA connection manager.
    pub const CMS_RDMA_CM: u8 = 1;

    /// The TSAS of a reliable connected queue pair set up through RDMA CM.
    pub const RDMA_CM: [u8; 32] = {
        let mut tsas = [0u8; 32];
        tsas[0] = QPTYPE_CONNECTED;
        tsas[1] = PRTYPE_NOT_SPECIFIED;
        tsas[2] = CMS_RDMA_CM;
        tsas
    };
}

/// One entry of the discovery log: where and how to reach a subsystem.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiscoveryEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    /// Transport requirements (bits 1:0 secure channel; bit 2 SQ flow control disable).
    pub treq: u8,
    pub portid: u16,
    pub cntlid: u16,
    /// Admin max SQ size.
    pub asqsz: u16,
    /// Entry flags ([`eflags`]).
    pub eflags: u16,
    pub trsvcid: String,
    pub subnqn: String,
    pub traddr: String,
    /// Transport specific address subtype, raw.
    pub tsas: [u8; 32],
}

impl DiscoveryEntry {
    pub fn encode_into(&self, b: &mut [u8]) {
        b[0] = self.trtype;
        b[1] = self.adrfam;
        b[2] = self.subtype;
        b[3] = self.treq;
        put_u16(b, 4, self.portid);
        put_u16(b, 6, self.cntlid);
        put_u16(b, 8, self.asqsz);
        put_u16(b, 10, self.eflags);
        put_str(b, 32, 32, &self.trsvcid, b' ');
        put_str(b, 256, 256, &self.subnqn, 0);
        put_str(b, 512, 256, &self.traddr, b' ');
        b[768..800].copy_from_slice(&self.tsas);
    }

    pub fn parse(b: &[u8]) -> Self {
        let mut tsas = [0; 32];
        tsas.copy_from_slice(&b[768..800]);
        DiscoveryEntry {
            trtype: b[0],
            adrfam: b[1],
            subtype: b[2],
            treq: b[3],
            portid: get_u16(b, 4),
            cntlid: get_u16(b, 6),
            asqsz: get_u16(b, 8),
            eflags: get_u16(b, 10),
            trsvcid: get_str(b, 32, 32),
            subnqn: get_str(b, 256, 256),
            traddr: get_str(b, 512, 256),
            tsas,
        }
    }
}

/// Encodes a whole discovery log page.
pub fn encode_log(genctr: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut b = vec![0u8; DISCOVERY_LOG_HEADER_LEN + entries.len() * DISCOVERY_ENTRY_LEN];
    put_u64(&mut b, 0, genctr);
    put_u64(&mut b, 8, entries.len() as u64);
    put_u16(&mut b, 16, 0); // recfmt
    for (i, e) in entries.iter().enumerate() {
        let at = DISCOVERY_LOG_HEADER_LEN + i * DISCOVERY_ENTRY_LEN;
        e.encode_into(&mut b[at..at + DISCOVERY_ENTRY_LEN]);
    }
    b
}

/// Decodes the header: (generation counter, number of records).
pub fn parse_log_header(b: &[u8]) -> (u64, u64) {
    (get_u64(b, 0), get_u64(b, 8))
}

/// Decodes the entries that `b` holds completely.
pub fn parse_log_entries(b: &[u8]) -> Vec<DiscoveryEntry> {
    if b.len() < DISCOVERY_LOG_HEADER_LEN {
        // No entry, and perhaps not even NUMREC.
        return Vec::new();
    }
    let (_, numrec) = parse_log_header(b);
    b[DISCOVERY_LOG_HEADER_LEN..]
        .chunks_exact(DISCOVERY_ENTRY_LEN)
        .take(numrec as usize)
        .map(DiscoveryEntry::parse)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_round_trip() {
        let e = DiscoveryEntry {
            trtype: trtype::TCP,
            adrfam: adrfam::IPV4,
            subtype: subtype::NVME,
            treq: treq::SECURE_CHANNEL_NOT_REQUIRED,
            portid: 1,
            cntlid: 0xffff,
            asqsz: 32,
            eflags: eflags::EPCSD,
            trsvcid: "4420".into(),
            subnqn: "nqn.2026-11.io.rdmablk:a".into(),
            traddr: "127.0.0.1".into(),
            tsas: [0; 32],
        };
        let b = encode_log(5, &[e.clone(), e.clone()]);
        assert_eq!(b.len(), 3072);
        assert_eq!(parse_log_header(&b), (5, 2));
        assert_eq!(b[1024], 3);
        assert_eq!(&b[1024 + 32..1024 + 36], b"4420");
        assert_eq!(b[1024 + 10], 2, "EFLAGS at bytes 11:10");
        assert_eq!(parse_log_entries(&b), vec![e.clone(), e]);
    }
}

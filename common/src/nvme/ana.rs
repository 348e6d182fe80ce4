//! Asymmetric Namespace Access (NVMe Base 2.1, 8.1.3): the states an ANA
//! group can be in on a path, and the ANA log page (5.1.12.1.13) that
//! reports them.

use crate::bytes::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use std::fmt;

/// Log Specific Parameter of the ANA log, bit 0: Return Groups Only (the
/// descriptors carry no namespace lists).
pub const LSP_RGO: u8 = 1;
/// Bytes of the log page's header.
pub const HEADER_LEN: usize = 16;
/// Bytes of a group descriptor before its namespace list.
pub const DESCRIPTOR_LEN: usize = 32;

/// Identify Controller ANACAP bits (NVMe Base 2.1, Figure 312).
pub mod anacap {
    pub const OPTIMIZED: u8 = 1 << 0;
    pub const NON_OPTIMIZED: u8 = 1 << 1;
    pub const INACCESSIBLE: u8 = 1 << 2;
    pub const PERSISTENT_LOSS: u8 = 1 << 3;
    pub const CHANGE: u8 = 1 << 4;
    /// ANAGRPID does not change while the namespace is attached.
    pub const GRPID_FIXED: u8 = 1 << 6;
    /// Namespace Management takes a non-zero ANAGRPID.
    pub const GRPID_MGMT: u8 = 1 << 7;
}

/// The state of an ANA group on a path (the ANA log's ANA State field).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AnaState {
    Optimized = 0x01,
    NonOptimized = 0x02,
    Inaccessible = 0x03,
    PersistentLoss = 0x04,
    /// Transitional: the group is moving to another state.
    Change = 0x0f,
}

impl AnaState {
    /// Every state, in code order.
    pub const ALL: [AnaState; 5] = [
        AnaState::Optimized,
        AnaState::NonOptimized,
        AnaState::Inaccessible,
        AnaState::PersistentLoss,
        AnaState::Change,
    ];

    /// The state of code `code`, if it names one.
    pub fn from_code(code: u8) -> Option<AnaState> {
        AnaState::ALL.into_iter().find(|s| *s as u8 == code)
    }

    /// Its name as the Linux host's sysfs `ana_state` and nvme-cli print it.
    pub fn name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non-optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent-loss",
            AnaState::Change => "change",
        }
    }

    /// Whether I/O may be sent through a path in this state.
    pub fn is_usable(self) -> bool {
        matches!(self, AnaState::Optimized | AnaState::NonOptimized)
    }
}

impl fmt::Display for AnaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for AnaState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AnaState::ALL
            .into_iter()
            .find(|st| st.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!(
                    "{s:?} is not an ANA state; use optimized, non-optimized, inaccessible, \
                     persistent-loss or change"
                )
            })
    }
}

/// One ANA Group Descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnaGroup {
    /// ANA Group ID (1 to ANAGRPMAX).
    pub grpid: u32,
    /// The group's change count.
    pub chgcnt: u64,
    pub state: AnaState,
    /// Its namespaces, ascending (empty when Return Groups Only was asked).
    pub nsids: Vec<u32>,
}

/// The ANA log page: its change count and group descriptors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnaLog {
    pub chgcnt: u64,
    pub groups: Vec<AnaGroup>,
}

impl AnaLog {
    /// The page's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let len = HEADER_LEN
            + self
                .groups
                .iter()
                .map(|g| DESCRIPTOR_LEN + 4 * g.nsids.len())
                .sum::<usize>();
        let mut b = vec![0u8; len];
        put_u64(&mut b, 0, self.chgcnt);
        put_u16(&mut b, 8, self.groups.len() as u16);
        let mut at = HEADER_LEN;
        for g in &self.groups {
            put_u32(&mut b, at, g.grpid);
            put_u32(&mut b, at + 4, g.nsids.len() as u32);
            put_u64(&mut b, at + 8, g.chgcnt);
            b[at + 16] = g.state as u8;
            at += DESCRIPTOR_LEN;
            for nsid in &g.nsids {
                put_u32(&mut b, at, *nsid);
                at += 4;
            }
        }
        b
    }

    /// Parses a page; `None` when it is cut short or names an unknown state.
    pub fn parse(b: &[u8]) -> Option<AnaLog> {
        if b.len() < HEADER_LEN {
            return None;
        }
        let mut groups = Vec::new();
        let mut at = HEADER_LEN;
        for _ in 0..get_u16(b, 8) {
            let desc = b.get(at..at + DESCRIPTOR_LEN)?;
            let n = get_u32(desc, 4) as usize;
            let list = b.get(at + DESCRIPTOR_LEN..at + DESCRIPTOR_LEN + n.checked_mul(4)?)?;
            groups.push(AnaGroup {
                grpid: get_u32(desc, 0),
                chgcnt: get_u64(desc, 8),
                state: AnaState::from_code(desc[16])?,
                nsids: list.chunks_exact(4).map(|c| get_u32(c, 0)).collect(),
            });
            at += DESCRIPTOR_LEN + 4 * n;
        }
        Some(AnaLog {
            chgcnt: get_u64(b, 0),
            groups,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field offsets of NVMe Base 2.1, Figures 243 and 244.
    #[test]
    fn layout_and_round_trip() {
        let log = AnaLog {
            chgcnt: 7,
            groups: vec![
                AnaGroup {
                    grpid: 1,
                    chgcnt: 3,
                    state: AnaState::Optimized,
                    nsids: vec![1, 4],
                },
                AnaGroup {
                    grpid: 2,
                    chgcnt: 4,
                    state: AnaState::Change,
                    nsids: vec![],
                },
            ],
        };
        let b = log.encode();
        assert_eq!(b.len(), 16 + 32 + 8 + 32);
        assert_eq!(get_u64(&b, 0), 7);
        assert_eq!(get_u16(&b, 8), 2);
        assert_eq!((get_u32(&b, 16), get_u32(&b, 20)), (1, 2));
        assert_eq!(b[32], 0x01);
        assert_eq!((get_u32(&b, 48), get_u32(&b, 52)), (1, 4));
        assert_eq!((get_u32(&b, 56), b[72]), (2, 0x0f));
        assert_eq!(AnaLog::parse(&b), Some(log));
        assert_eq!(AnaLog::parse(&b[..60]), None, "cut inside a namespace list");
    }

    #[test]
    fn state_names() {
        for s in AnaState::ALL {
            assert_eq!(s.name().parse::<AnaState>(), Ok(s));
            assert_eq!(AnaState::from_code(s as u8), Some(s));
        }
        assert!("fast".parse::<AnaState>().is_err());
        assert_eq!(AnaState::from_code(0), None);
    }
}

//! Identifiers stable across restarts: a namespace's NGUID, UUID and
//! EUI-64 (given by the configuration, or derived from names), a
//! subsystem's serial number.

use crate::config::GivenIds;
use std::fmt::Write;

/// A namespace's globally unique identifiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceIds {
    pub nguid: [u8; 16],
    pub uuid: [u8; 16],
    /// Only when the configuration gives one: an EUI-64 needs an
    /// organization's identifier, which a derived one would not have.
    pub eui64: Option<[u8; 8]>,
}

impl NamespaceIds {
    /// The identifiers `given`, and for those it lacks, NGUID and UUID
    /// derived from `key`, a name stable across restarts.
    pub fn derive(key: &str, given: &GivenIds) -> NamespaceIds {
        let mut uuid = id128(key, 0x75);
        uuid[6] = (uuid[6] & 0x0f) | 0x80; // version 8: custom
        uuid[8] = (uuid[8] & 0x3f) | 0x80; // RFC 4122 variant
        NamespaceIds {
            nguid: given.nguid.unwrap_or_else(|| id128(key, 0x6e)),
            uuid: given.uuid.unwrap_or(uuid),
            eui64: given.eui64,
        }
    }
}

/// A UUID in its usual form: 8-4-4-4-12 lower-case hex digits.
pub fn uuid_text(uuid: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, b) in uuid.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// An NGUID or EUI-64 as nvme-cli shows it: hex digits, no separators.
pub fn hex_text(id: &[u8]) -> String {
    id.iter()
        .fold(String::with_capacity(id.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The serial number (SN) of the subsystem named `nqn`: 16 hex digits.
pub fn serial_number(nqn: &str) -> String {
    format!(
        "{:08x}{:08x}",
        crc32c::crc32c(nqn.as_bytes()),
        stable_hash(nqn, 1) as u32
    )
}

/// A stable 64-bit hash (not DefaultHasher, whose output may change between releases).
fn stable_hash(s: &str, seed: u8) -> u64 {
    let lo = crc32c::crc32c_append(seed as u32, s.as_bytes());
    let hi = crc32c::crc32c_append(lo ^ 0x5bd1_e995, s.as_bytes());
    (hi as u64) << 32 | lo as u64
}

/// A stable 128-bit identifier derived from `key`.
fn id128(key: &str, seed: u8) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&stable_hash(key, seed).to_be_bytes());
    out[8..].copy_from_slice(&stable_hash(key, seed.wrapping_add(1)).to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_identifiers_replace_derived_ones() {
        let derived = NamespaceIds::derive("nqn.x/1", &GivenIds::default());
        assert_eq!(derived.eui64, None);
        assert_eq!(derived.uuid[6] >> 4, 8, "version 8");
        let given = GivenIds {
            uuid: Some([0x11; 16]),
            eui64: Some([0x22; 8]),
            nguid: None,
        };
        let ids = NamespaceIds::derive("nqn.x/1", &given);
        assert_eq!(
            (ids.nguid, ids.uuid, ids.eui64),
            (derived.nguid, [0x11; 16], Some([0x22; 8]))
        );
    }

    #[test]
    fn identifiers_print_as_nvme_cli_shows_them() {
        let mut uuid = [0u8; 16];
        uuid[0] = 0x3a;
        uuid[15] = 0xab;
        assert_eq!(uuid_text(&uuid), "3a000000-0000-0000-0000-0000000000ab");
        assert_eq!(hex_text(&[0, 0x25, 0x38, 0xb5]), "002538b5");
    }
}

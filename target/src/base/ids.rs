//! Identifiers stable across restarts, derived from names: a namespace's
//! NGUID and UUID, a subsystem's serial number.

/// A namespace's globally unique identifiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceIds {
    pub nguid: [u8; 16],
    pub uuid: [u8; 16],
}

impl NamespaceIds {
    /// Identifiers derived from `key`, a name stable across restarts.
    pub fn derive(key: &str) -> NamespaceIds {
        let mut uuid = id128(key, 0x75);
        uuid[6] = (uuid[6] & 0x0f) | 0x80; // version 8: custom
        uuid[8] = (uuid[8] & 0x3f) | 0x80; // RFC 4122 variant
        NamespaceIds {
            nguid: id128(key, 0x6e),
            uuid,
        }
    }
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

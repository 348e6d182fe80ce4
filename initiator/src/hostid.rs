//! The host's identity: host NQN and host identifier, as nvme-cli finds them.

use std::path::Path;

/// Host NQN: /etc/nvme/hostnqn when present, else a stable uuid-based NQN
/// derived from /etc/machine-id.
pub fn default_hostnqn() -> String {
    read_trimmed("/etc/nvme/hostnqn").unwrap_or_else(|| {
        format!(
            "nqn.2014-08.org.nvmexpress:uuid:{}",
            format_uuid(&machine_uuid())
        )
    })
}

/// Host identifier: /etc/nvme/hostid when it holds a UUID, else the
/// machine-id derived UUID (the same one the default host NQN carries).
pub fn default_hostid() -> [u8; 16] {
    read_trimmed("/etc/nvme/hostid")
        .and_then(|s| parse_uuid(&s))
        .unwrap_or_else(machine_uuid)
}

fn read_trimmed(path: impl AsRef<Path>) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// A version-8 UUID derived from the machine id (or the host name when
/// there is none), stable across runs.
fn machine_uuid() -> [u8; 16] {
    let seed = read_trimmed("/etc/machine-id")
        .or_else(|| read_trimmed("/proc/sys/kernel/hostname"))
        .unwrap_or_else(|| "rdmablk".into());
    let a = crc32c::crc32c_append(0x7264_6d61, seed.as_bytes());
    let b = crc32c::crc32c_append(a, seed.as_bytes());
    let c = crc32c::crc32c_append(b, seed.as_bytes());
    let d = crc32c::crc32c_append(c, seed.as_bytes());
    let mut u = [0u8; 16];
    for (i, w) in [a, b, c, d].iter().enumerate() {
        u[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
    }
    u[6] = (u[6] & 0x0f) | 0x80;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// Formats 16 bytes as 8-4-4-4-12 hex.
pub fn format_uuid(u: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*u).hyphenated().to_string()
}

/// Parses a UUID (8-4-4-4-12 hex, as nvme-cli writes /etc/nvme/hostid);
/// `None` for anything else, whatever the bytes.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    uuid::Uuid::try_parse(s).ok().map(|u| *u.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_round_trip() {
        let u = machine_uuid();
        assert_eq!(parse_uuid(&format_uuid(&u)), Some(u));
        assert_eq!(machine_uuid(), u, "stable");
        assert!(parse_uuid("not-a-uuid").is_none());
        let u = parse_uuid("5f0c3a52-3f1e-4c2a-9a57-1b2d3c4e5f60").expect("a UUID");
        assert_eq!(format_uuid(&u), "5f0c3a52-3f1e-4c2a-9a57-1b2d3c4e5f60");
    }

    /// Multi-byte characters, wrong lengths and stray characters are
    /// refused, never a panic (the old parser sliced strings by byte).
    #[test]
    fn hostile_uuids_are_refused() {
        for s in [
            "",
            "é",
            "5f0c3a52-3f1e-4c2a-9a57-1b2d3c4e5fé",
            "5f0c3a52-3f1e-4c2a-9a57-1b2d3c4e5f6é",
            "ééééééééééééééééé-éééé-éééé-éééé",
            "5f0c3a52-3f1e-4c2a-9a57-1b2d3c4e5f6",
            "5f0c3a52-3f1e-4c2a-9a57-1b2d3c4e5f600",
            "zf0c3a52-3f1e-4c2a-9a57-1b2d3c4e5f60",
        ] {
            assert_eq!(parse_uuid(s), None, "{s:?}");
        }
    }
}

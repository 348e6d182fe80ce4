//! DH-HMAC-CHAP secrets as `nvme gen-dhchap-key` prints them:
//! `DHHC-1:XX:BASE64:`, where XX names the hash that transforms the key
//! when it is used (00: none, 01: SHA-256, 02: SHA-384, 03: SHA-512) and
//! BASE64 (RFC 4648, padded) holds the 32, 48 or 64 key bytes followed by
//! their CRC-32 (IEEE, little-endian), as the Linux kernel and libnvme
//! read and write them.

use super::Hash;
use crate::interchange::{self, InterchangeError};
use zeroize::Zeroizing;

/// A host or controller secret. Its bytes never appear in `Debug` output
/// and are zeroed when it is dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Zeroizing<Vec<u8>>,
    /// The hash that transforms the key before use; `None` for 00.
    transform: Option<Hash>,
}

/// Why a DHHC-1 string is not a usable secret (never quoting it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a DH-HMAC-CHAP secret starts with \"DHHC-1:\" (as nvme gen-dhchap-key prints it)")]
    Prefix,
    #[error("the hash field is {0:?}; use 00, 01 (SHA-256), 02 (SHA-384) or 03 (SHA-512)")]
    HashField(String),
    #[error("the key is not valid base64")]
    Base64,
    #[error("the key has {0} bytes; a DHHC-1 key has 32, 48 or 64 bytes and a CRC")]
    Length(usize),
    #[error("the key's CRC-32 does not match: the secret is mistyped or truncated")]
    Crc,
}

impl Secret {
    /// Parses `DHHC-1:XX:BASE64:` (the trailing colon may be missing).
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let (field, key) = interchange::parse(text, "DHHC-1", &[32, 48, 64], "32, 48 or 64")
            .map_err(|e| match e {
                InterchangeError::Prefix(_) => SecretError::Prefix,
                InterchangeError::HashField(f) => SecretError::HashField(f),
                InterchangeError::Base64 => SecretError::Base64,
                InterchangeError::Length(n, _) => SecretError::Length(n),
                InterchangeError::Crc => SecretError::Crc,
            })?;
        let transform = match field.as_str() {
            "00" => None,
            "01" | "02" | "03" => Hash::from_id(field.as_bytes()[1] - b'0'),
            other => return Err(SecretError::HashField(other.to_string())),
        };
        Ok(Secret { key, transform })
    }

    /// A secret of `key` (32, 48 or 64 bytes) transformed with `transform`.
    pub fn new(key: &[u8], transform: Option<Hash>) -> Secret {
        Secret {
            key: Zeroizing::new(key.to_vec()),
            transform,
        }
    }

    /// The DHHC-1 representation.
    pub fn to_dhhc1(&self) -> String {
        interchange::format("DHHC-1", self.transform.map_or(0, Hash::id), &self.key)
    }

    /// The key as it is used with `nqn` (the host NQN for a host secret,
    /// the subsystem NQN for a controller secret): HMAC with the transform
    /// hash of NQN || "NVMe-over-Fabrics", or the key itself for 00.
    pub fn transformed(&self, nqn: &str) -> Zeroizing<Vec<u8>> {
        match self.transform {
            None => Zeroizing::new(self.key.to_vec()),
            Some(h) => h.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Secret({} bytes, transform {:?})",
            self.key.len(),
            self.transform
        )
    }
}

//! The interchange format NVMe's configured secrets share:
//! `PREFIX:HH:BASE64:`, where HH is a two-digit field (the hash that
//! transforms the key) and BASE64 (RFC 4648, padded) holds the key bytes
//! followed by their CRC-32 (IEEE, little-endian). DH-HMAC-CHAP secrets
//! (`DHHC-1`, NVMe Base 2.1, 8.3.4.5.8) and TLS PSKs (`NVMeTLSkey-1`,
//! NVMe/TCP 1.1, 3.6.1.5) are written this way; libnvme and the Linux
//! kernel read and write both.

use base64::Engine;
use zeroize::{Zeroize, Zeroizing};

/// Why a string is not a key of the format (never quoting the key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterchangeError {
    #[error("it does not start with \"{0}:\"")]
    Prefix(&'static str),
    #[error("the hash field is {0:?}")]
    HashField(String),
    #[error("the key is not valid base64")]
    Base64,
    #[error("the key has {0} bytes; expected {1}")]
    Length(usize, &'static str),
    #[error("the key's CRC-32 does not match: the key is mistyped or truncated")]
    Crc,
}

/// Splits `PREFIX:HH:BASE64:` (surrounding whitespace and a missing
/// trailing colon allowed) into its hash field and key, checking the CRC
/// and that the key's length is one of `lengths` (`shown` names them).
pub fn parse(
    text: &str,
    prefix: &'static str,
    lengths: &[usize],
    shown: &'static str,
) -> Result<(String, Zeroizing<Vec<u8>>), InterchangeError> {
    let rest = text
        .trim()
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix(':'))
        .ok_or(InterchangeError::Prefix(prefix))?;
    let (field, b64) = rest
        .split_once(':')
        .ok_or(InterchangeError::Prefix(prefix))?;
    if field.len() != 2 || !field.bytes().all(|b| b.is_ascii_digit()) {
        return Err(InterchangeError::HashField(field.to_string()));
    }
    let b64 = b64.strip_suffix(':').unwrap_or(b64);
    let mut raw = Zeroizing::new(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| InterchangeError::Base64)?,
    );
    let key_len = raw.len().saturating_sub(4);
    if !lengths.contains(&key_len) || raw.len() != key_len + 4 {
        return Err(InterchangeError::Length(key_len, shown));
    }
    let crc = u32::from_le_bytes(raw[key_len..].try_into().expect("4 bytes"));
    if crc32fast::hash(&raw[..key_len]) != crc {
        return Err(InterchangeError::Crc);
    }
    raw.truncate(key_len);
    Ok((field.to_string(), raw))
}

/// `PREFIX:HH:BASE64:` of `key` with hash field `field`.
pub fn format(prefix: &str, field: u8, key: &[u8]) -> String {
    let mut raw = Zeroizing::new(key.to_vec());
    raw.extend_from_slice(&crc32fast::hash(key).to_le_bytes());
    let mut b64 = base64::engine::general_purpose::STANDARD.encode(&*raw);
    let out = format!("{prefix}:{field:02}:{b64}:");
    b64.zeroize();
    out
}

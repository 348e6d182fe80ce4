//! NVMe/TCP pre-shared keys (NVMe/TCP 1.1, 3.6.1.3 to 3.6.1.5): the
//! configured PSK in its interchange format (`NVMeTLSkey-1:HH:BASE64:`, as
//! `nvme gen-tls-key` prints it), the retained PSK derived from it and the
//! host NQN, the TLS PSK identity a host offers, and the TLS PSK the
//! handshake uses, derived from the retained PSK and the identity.

use crate::interchange;
use hkdf::Hkdf;
use sha2::{Sha256, Sha384};
use zeroize::Zeroizing;

/// The hash of a PSK: it picks the cipher suite (TLS_AES_128_GCM_SHA256 or
/// TLS_AES_256_GCM_SHA384) and is the `0x` of an identity `NVMe?R0x`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hash {
    Sha256,
    Sha384,
}

impl Hash {
    /// Its number in identities and in the interchange format (01, 02).
    pub fn id(self) -> u8 {
        match self {
            Hash::Sha256 => 1,
            Hash::Sha384 => 2,
        }
    }

    fn from_id(id: u8) -> Option<Hash> {
        match id {
            1 => Some(Hash::Sha256),
            2 => Some(Hash::Sha384),
            _ => None,
        }
    }

    /// Its output length: that of the keys it goes with.
    pub fn key_len(self) -> usize {
        match self {
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
        }
    }

    /// HKDF-Extract with no salt, then HKDF-Expand of `info` to `len` bytes
    /// (RFC 5869).
    fn hkdf(self, ikm: &[u8], info: &[u8], len: usize) -> Zeroizing<Vec<u8>> {
        let mut out = Zeroizing::new(vec![0u8; len]);
        let done = match self {
            Hash::Sha256 => Hkdf::<Sha256>::new(None, ikm).expand(info, &mut out),
            Hash::Sha384 => Hkdf::<Sha384>::new(None, ikm).expand(info, &mut out),
        };
        done.expect("a PSK's length is within HKDF's limit");
        out
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        use hmac::{Mac, SimpleHmac};
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
            let mut m = <M as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        match self {
            Hash::Sha256 => run::<SimpleHmac<Sha256>>(key, data),
            Hash::Sha384 => run::<SimpleHmac<Sha384>>(key, data),
        }
    }
}

/// How HKDF-Expand-Label's info is laid out. RFC 8446, 7.1 is what the
/// NVMe/TCP specification means and what libnvme and SPDK write now;
/// libnvme before 1.16 wrote the length little-endian and the label and
/// context without their length bytes, and keys it derived (and put in
/// the kernel's keyring) still exist (libnvme issues #735, #1040).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Labels {
    #[default]
    Rfc8446,
    /// libnvme's layout before 1.16.
    LegacyLibnvme,
}

impl Labels {
    /// The info of HKDF-Expand-Label(secret, `label`, `context`, `len`).
    fn info(self, len: usize, label: &str, context: &[u8]) -> Vec<u8> {
        let label = format!("tls13 {label}");
        let mut info = Vec::with_capacity(4 + label.len() + context.len());
        match self {
            Labels::Rfc8446 => {
                info.extend_from_slice(&(len as u16).to_be_bytes());
                info.push(label.len() as u8);
                info.extend_from_slice(label.as_bytes());
                info.push(context.len() as u8);
                info.extend_from_slice(context);
            }
            Labels::LegacyLibnvme => {
                info.extend_from_slice(&(len as u16).to_le_bytes());
                info.extend_from_slice(label.as_bytes());
                info.extend_from_slice(context);
            }
        }
        info
    }
}

/// A configured PSK. Its bytes never appear in `Debug` output and are
/// wiped when it is dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfiguredKey {
    key: Zeroizing<Vec<u8>>,
    /// The hash deriving the retained PSK; `None` (HH 00): the configured
    /// key is the retained PSK.
    transform: Option<Hash>,
}

/// A TLS PSK: what the handshake's binder and key schedule use.
#[derive(Clone)]
pub struct TlsPsk {
    pub hash: Hash,
    pub key: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for TlsPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsPsk({:?}, {} bytes)", self.hash, self.key.len())
    }
}

/// Why a string is not a configured PSK (never quoting it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}; a TLS PSK looks like NVMeTLSkey-1:01:<base64>: (as `rdmablk gen-tls-key` or `nvme gen-tls-key` prints it)")]
pub struct KeyError(String);

impl ConfiguredKey {
    /// Parses `NVMeTLSkey-1:HH:BASE64:`: HH 00 (a 32- or 48-byte key used
    /// as the retained PSK), 01 (32 bytes, SHA-256) or 02 (48 bytes,
    /// SHA-384).
    pub fn parse(text: &str) -> Result<ConfiguredKey, KeyError> {
        let (field, key) = interchange::parse(text, "NVMeTLSkey-1", &[32, 48], "32 or 48")
            .map_err(|e| KeyError(e.to_string()))?;
        let transform = match field.as_str() {
            "00" => None,
            "01" => Some(Hash::Sha256),
            "02" => Some(Hash::Sha384),
            f => {
                return Err(KeyError(format!(
                    "the hash field is {f:?}; use 00, 01 or 02"
                )))
            }
        };
        if transform.is_some_and(|h| h.key_len() != key.len()) {
            return Err(KeyError(format!(
                "hash field {field} takes a {}-byte key, this one has {}",
                transform.map_or(0, Hash::key_len),
                key.len()
            )));
        }
        Ok(ConfiguredKey { key, transform })
    }

    /// A new random key of `hash`'s length, transformed by it.
    pub fn generate(hash: Hash) -> std::io::Result<ConfiguredKey> {
        let mut key = Zeroizing::new(vec![0u8; hash.key_len()]);
        getrandom::fill(&mut key).map_err(std::io::Error::other)?;
        Ok(ConfiguredKey {
            key,
            transform: Some(hash),
        })
    }

    /// A key of these bytes (32 or 48), transformed by `transform`.
    pub fn from_bytes(key: &[u8], transform: Option<Hash>) -> ConfiguredKey {
        ConfiguredKey {
            key: Zeroizing::new(key.to_vec()),
            transform,
        }
    }

    /// The interchange format.
    pub fn to_interchange(&self) -> String {
        interchange::format(
            "NVMeTLSkey-1",
            self.transform.map_or(0, Hash::id),
            &self.key,
        )
    }

    /// The hash of the PSKs derived from this key: the transform's, or for
    /// an untransformed key the one its length fits.
    pub fn hash(&self) -> Hash {
        self.transform.unwrap_or(if self.key.len() == 48 {
            Hash::Sha384
        } else {
            Hash::Sha256
        })
    }

    /// The retained PSK of `hostnqn` (3.6.1.4): HKDF-Expand-Label(
    /// HKDF-Extract(0, key), "HostNQN", hostnqn, length), or the key itself
    /// for HH 00.
    pub fn retained(&self, hostnqn: &str, labels: Labels) -> Zeroizing<Vec<u8>> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => {
                let info = labels.info(self.key.len(), "HostNQN", hostnqn.as_bytes());
                h.hkdf(&self.key, &info, self.key.len())
            }
        }
    }
}

impl std::fmt::Debug for ConfiguredKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ConfiguredKey({} bytes, transform {:?})",
            self.key.len(),
            self.transform
        )
    }
}

/// A TLS PSK identity (3.6.1.3): `NVMe0R0x <hostnqn> <subnqn>` (version 0,
/// what SPDK and older Linux hosts offer) or `NVMe1R0x <hostnqn> <subnqn>
/// <digest>` (version 1, newer Linux hosts), `x` naming the hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub version: u8,
    pub hash: Hash,
    pub hostnqn: String,
    pub subnqn: String,
    /// Version 1's PSK digest (base64).
    pub digest: Option<String>,
}

impl Identity {
    /// Parses an identity a host offered.
    pub fn parse(bytes: &[u8]) -> Result<Identity, String> {
        let text =
            std::str::from_utf8(bytes).map_err(|_| "the identity is not UTF-8".to_string())?;
        let mut words = text.split(' ');
        let head = words.next().unwrap_or_default();
        let (version, hash) = match head.as_bytes() {
            [b'N', b'V', b'M', b'e', v @ (b'0' | b'1'), b'R', b'0', h] => {
                let hash = Hash::from_id(h.wrapping_sub(b'0'));
                (
                    v - b'0',
                    hash.ok_or_else(|| format!("unknown hash in {head:?}"))?,
                )
            }
            _ => return Err("not an NVMe TLS PSK identity (NVMe0R0x or NVMe1R0x)".into()),
        };
        let (Some(hostnqn), Some(subnqn)) = (words.next(), words.next()) else {
            return Err("the identity lacks its host or subsystem NQN".into());
        };
        let digest = words.next().map(str::to_string);
        if words.next().is_some() || (version == 1) != digest.is_some() {
            return Err(format!("malformed identity of version {version}"));
        }
        Ok(Identity {
            version,
            hash,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            digest,
        })
    }

    /// The identity `hostnqn` offers to `subnqn` with `key`: version 1
    /// carries the digest of the retained PSK.
    pub fn of(
        version: u8,
        key: &ConfiguredKey,
        hostnqn: &str,
        subnqn: &str,
        labels: Labels,
    ) -> Identity {
        let hash = key.hash();
        let digest = (version == 1)
            .then(|| psk_digest(hash, &key.retained(hostnqn, labels), hostnqn, subnqn));
        Identity {
            version,
            hash,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            digest,
        }
    }

    /// The TLS PSK of this identity, from `key` (3.6.1.5): HKDF-Expand-
    /// Label(HKDF-Extract(0, retained), "nvme-tls-psk", context, length);
    /// the context is the identity for version 0, "0x <digest>" for
    /// version 1. A version 1 identity whose digest is not the key's was
    /// made with another key: refused.
    pub fn tls_psk(&self, key: &ConfiguredKey, labels: Labels) -> Result<TlsPsk, String> {
        if key.hash() != self.hash {
            return Err(format!(
                "the identity names hash {:02}, the host's key is of hash {:02}",
                self.hash.id(),
                key.hash().id()
            ));
        }
        let retained = key.retained(&self.hostnqn, labels);
        let context = match &self.digest {
            None => self.to_string(),
            Some(d) => {
                let want = psk_digest(self.hash, &retained, &self.hostnqn, &self.subnqn);
                if !bool::from(subtle::ConstantTimeEq::ct_eq(want.as_bytes(), d.as_bytes())) {
                    return Err("the identity's PSK digest is not that of the host's key".into());
                }
                format!("{:02} {d}", self.hash.id())
            }
        };
        let info = labels.info(retained.len(), "nvme-tls-psk", context.as_bytes());
        Ok(TlsPsk {
            hash: self.hash,
            key: self.hash.hkdf(&retained, &info, retained.len()),
        })
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NVMe{}R{:02} {} {}",
            self.version,
            self.hash.id(),
            self.hostnqn,
            self.subnqn
        )?;
        if let Some(d) = &self.digest {
            write!(f, " {d}")?;
        }
        Ok(())
    }
}

/// The PSK digest of a version 1 identity: base64 of HMAC(retained,
/// "<hostnqn> <subnqn> NVMe-over-Fabrics").
fn psk_digest(hash: Hash, retained: &[u8], hostnqn: &str, subnqn: &str) -> String {
    use base64::Engine;
    let mac = hash.hmac(
        retained,
        format!("{hostnqn} {subnqn} NVMe-over-Fabrics").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(mac)
}

#[cfg(test)]
mod tests;

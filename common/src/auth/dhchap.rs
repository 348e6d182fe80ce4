//! The DH-HMAC-CHAP computations both ends make (NVMe Base 2.1, 8.3.4.5.4
//! and 8.3.4.5.5), in the byte order the Linux host and nvmet use:
//!
//! - R1 = HMAC(Kh', C1' || LE32(S1) || LE16(T_ID) || SC_C || "HostHost" ||
//!   NQNh || 00h || NQNc), checked by the controller;
//! - R2 = HMAC(Kc', C2' || LE32(S2) || LE16(T_ID) || 00h || "Controller" ||
//!   NQNc || 00h || NQNh), checked by the host;
//!
//! where Kh' and Kc' are the transformed host and controller keys
//! ([`super::Secret::transformed`]) and C' is the challenge, augmented
//! with the Diffie-Hellman shared secret Z when a DH group is used:
//! C' = HMAC(H(Z), C).

use hmac::{Mac, SimpleHmac};
use sha2::{Digest, Sha256, Sha384, Sha512};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

/// The hash functions of DH-HMAC-CHAP, by their identifiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hash {
    Sha256,
    Sha384,
    Sha512,
}

impl Hash {
    /// All, in identifier order.
    pub const ALL: [Hash; 3] = [Hash::Sha256, Hash::Sha384, Hash::Sha512];

    /// The hash of identifier `id` (01h, 02h, 03h).
    pub fn from_id(id: u8) -> Option<Hash> {
        Hash::ALL.into_iter().find(|h| h.id() == id)
    }

    /// The hash named `name` ("sha256", "hmac(sha256)", "sha384", ...).
    pub fn from_name(name: &str) -> Option<Hash> {
        let name = name.trim_start_matches("hmac(").trim_end_matches(')');
        Hash::ALL.into_iter().find(|h| h.name() == name)
    }

    pub fn id(self) -> u8 {
        match self {
            Hash::Sha256 => 1,
            Hash::Sha384 => 2,
            Hash::Sha512 => 3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Hash::Sha256 => "sha256",
            Hash::Sha384 => "sha384",
            Hash::Sha512 => "sha512",
        }
    }

    /// Digest length in bytes (the HL of the messages).
    pub fn digest_len(self) -> usize {
        match self {
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }

    /// HMAC of the concatenation of `parts` under `key`.
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            let mut m = <M as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
            for p in parts {
                m.update(p);
            }
            m.finalize().into_bytes().to_vec()
        }
        Zeroizing::new(match self {
            Hash::Sha256 => run::<SimpleHmac<Sha256>>(key, parts),
            Hash::Sha384 => run::<SimpleHmac<Sha384>>(key, parts),
            Hash::Sha512 => run::<SimpleHmac<Sha512>>(key, parts),
        })
    }

    /// The digest of `data`.
    pub fn digest(self, data: &[u8]) -> Zeroizing<Vec<u8>> {
        Zeroizing::new(match self {
            Hash::Sha256 => Sha256::digest(data).to_vec(),
            Hash::Sha384 => Sha384::digest(data).to_vec(),
            Hash::Sha512 => Sha512::digest(data).to_vec(),
        })
    }
}

/// The challenge as the response covers it: `challenge` itself without a
/// DH group, else HMAC(H(Z), challenge) with the shared secret `z`.
pub fn augmented_challenge(hash: Hash, challenge: &[u8], z: Option<&[u8]>) -> Zeroizing<Vec<u8>> {
    match z {
        None => Zeroizing::new(challenge.to_vec()),
        Some(z) => hash.hmac(&hash.digest(z), &[challenge]),
    }
}

/// What a response covers besides the keys.
#[derive(Clone, Copy, Debug)]
pub struct Transaction<'a> {
    pub hash: Hash,
    /// The (augmented) challenge.
    pub challenge: &'a [u8],
    pub seqnum: u32,
    pub tid: u16,
    pub host_nqn: &'a str,
    pub subsys_nqn: &'a str,
}

/// R1, the host's response, under the transformed host key; `sc_c` is the
/// Negotiate message's secure channel concatenation field.
pub fn host_response(key: &[u8], t: &Transaction, sc_c: u8) -> Zeroizing<Vec<u8>> {
    t.hash.hmac(
        key,
        &[
            t.challenge,
            &t.seqnum.to_le_bytes(),
            &t.tid.to_le_bytes(),
            &[sc_c],
            b"HostHost",
            t.host_nqn.as_bytes(),
            &[0],
            t.subsys_nqn.as_bytes(),
        ],
    )
}

/// R2, the controller's response, under the transformed controller key.
pub fn controller_response(key: &[u8], t: &Transaction) -> Zeroizing<Vec<u8>> {
    t.hash.hmac(
        key,
        &[
            t.challenge,
            &t.seqnum.to_le_bytes(),
            &t.tid.to_le_bytes(),
            &[0],
            b"Controller",
            t.subsys_nqn.as_bytes(),
            &[0],
            t.host_nqn.as_bytes(),
        ],
    )
}

/// Whether a received response equals the expected one, in constant time.
pub fn responses_match(expected: &[u8], received: &[u8]) -> bool {
    expected.len() == received.len() && bool::from(expected.ct_eq(received))
}

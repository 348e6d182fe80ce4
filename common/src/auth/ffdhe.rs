//! Finite-field Diffie-Hellman over the RFC 7919 groups (generator 2) for
//! the augmented challenge of DH-HMAC-CHAP. Exponentiation is crypto-bigint's
//! constant-time Montgomery ladder; public values and the shared secret are
//! big-endian and padded to the size of the prime, as the Linux host and
//! nvmet send and derive them (a shorter peer value is accepted, as the
//! kernel does).

use super::ffdhe_primes::*;
use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use zeroize::{Zeroize, Zeroizing};

/// The DH groups of DH-HMAC-CHAP, by their identifiers (null: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DhGroup {
    Null,
    Ffdhe2048,
    Ffdhe3072,
    Ffdhe4096,
    Ffdhe6144,
    Ffdhe8192,
}

/// Why a peer's public value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DhError {
    #[error("the DH value has {got} bytes; {group} values have at most {max}")]
    Length {
        group: &'static str,
        got: usize,
        max: usize,
    },
    #[error("the DH value is outside 2..p-2")]
    Range,
    #[error("the null DH group has no values")]
    Null,
}

impl DhGroup {
    /// All, in identifier order.
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    pub fn id(self) -> u8 {
        self as u8
    }

    pub fn from_id(id: u8) -> Option<DhGroup> {
        DhGroup::ALL.get(id as usize).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }

    pub fn from_name(name: &str) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| g.name() == name)
    }

    /// Bits of the prime (0 for null).
    pub fn bits(self) -> u32 {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 2048,
            DhGroup::Ffdhe3072 => 3072,
            DhGroup::Ffdhe4096 => 4096,
            DhGroup::Ffdhe6144 => 6144,
            DhGroup::Ffdhe8192 => 8192,
        }
    }

    /// Bytes of a public value or shared secret (DHVLEN).
    pub fn value_len(self) -> usize {
        self.bits() as usize / 8
    }

    /// Bits of the private exponents used: at least RFC 7919's 5.2
    /// recommendation (225 to 400 bits), rounded up.
    fn exponent_bits(self) -> u32 {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 256,
            DhGroup::Ffdhe3072 => 320,
            DhGroup::Ffdhe4096 => 384,
            DhGroup::Ffdhe6144 => 448,
            DhGroup::Ffdhe8192 => 512,
        }
    }

    fn prime(self) -> Option<BoxedUint> {
        let hex = match self {
            DhGroup::Null => return None,
            DhGroup::Ffdhe2048 => FFDHE2048_P,
            DhGroup::Ffdhe3072 => FFDHE3072_P,
            DhGroup::Ffdhe4096 => FFDHE4096_P,
            DhGroup::Ffdhe6144 => FFDHE6144_P,
            DhGroup::Ffdhe8192 => FFDHE8192_P,
        };
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("the primes are hex"))
            .collect();
        Some(BoxedUint::from_be_slice(&bytes, self.bits()).expect("the prime fits its size"))
    }

    fn params(self) -> Option<BoxedMontyParams> {
        let p = self.prime()?;
        Some(BoxedMontyParams::new(
            Odd::new(p).expect("the RFC 7919 primes are odd"),
        ))
    }
}

/// One side's key pair for one exchange.
pub struct KeyPair {
    group: DhGroup,
    private: BoxedUint,
    /// Bits of the private exponent as given (its length, not its value):
    /// the exponentiations take this many steps, not the prime's size.
    private_bits: u32,
    public: Vec<u8>,
}

impl Drop for KeyPair {
    fn drop(&mut self) {
        self.private.zeroize();
    }
}

impl KeyPair {
    /// A fresh key pair in `group` (not null), from the operating system's
    /// random source.
    pub fn generate(group: DhGroup) -> std::io::Result<KeyPair> {
        let mut x = super::random_bytes(group.exponent_bits() as usize / 8)?;
        // At least 2: the top bit set keeps the exponent at its full size.
        x[0] |= 0x80;
        Ok(KeyPair::from_private(group, &x))
    }

    /// The key pair of private exponent `x` (big-endian): for tests with
    /// known answers.
    pub fn from_private(group: DhGroup, x: &[u8]) -> KeyPair {
        let params = group.params().expect("a key pair needs a DH group");
        let bits = group.bits();
        let private = BoxedUint::from_be_slice(x, bits).expect("the exponent fits the group");
        // The exponent's length in bytes is public (fixed per group for
        // generated keys); its value is not, and the ladder's time does not
        // depend on it. A 512-bit exponent of ffdhe8192 takes 512 steps
        // instead of 8192: about 16 times faster.
        let private_bits = (x.len() as u32 * 8).min(bits);
        let two = BoxedMontyForm::new(BoxedUint::from_be_slice(&[2], bits).expect("2"), params);
        let public = two
            .pow_bounded_exp(&private, private_bits)
            .retrieve()
            .to_be_bytes()
            .to_vec();
        KeyPair {
            group,
            private,
            private_bits,
            public,
        }
    }

    /// g^x mod p, padded to the prime's size.
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// The shared secret with a peer's public value: peer^x mod p, padded
    /// to the prime's size. The value must lie in 2..p-2.
    pub fn shared_secret(&self, peer: &[u8]) -> Result<Zeroizing<Vec<u8>>, DhError> {
        let g = self.group;
        let len = g.value_len();
        if peer.len() > len {
            return Err(DhError::Length {
                group: g.name(),
                got: peer.len(),
                max: len,
            });
        }
        let mut padded = vec![0u8; len];
        padded[len - peer.len()..].copy_from_slice(peer);
        let p = g.prime().ok_or(DhError::Null)?.to_be_bytes();
        let mut p_minus_1 = p.to_vec();
        *p_minus_1.last_mut().expect("non-empty") -= 1; // p is odd
        let mut one = vec![0u8; len];
        one[len - 1] = 1;
        // Public values: comparing them in variable time reveals nothing.
        if padded <= one || padded >= p_minus_1 {
            return Err(DhError::Range);
        }
        let params = g.params().ok_or(DhError::Null)?;
        let y = BoxedUint::from_be_slice(&padded, g.bits()).expect("padded to the group");
        let z = BoxedMontyForm::new(y, params)
            .pow_bounded_exp(&self.private, self.private_bits)
            .retrieve();
        Ok(Zeroizing::new(z.to_be_bytes().to_vec()))
    }
}

//! NVMe in-band authentication, DH-HMAC-CHAP (NVMe Base 2.1, 8.3.4.5;
//! TP 8006): secrets in their DHHC-1 representation, the key
//! transformation, the responses both sides compute, the finite-field
//! Diffie-Hellman groups that augment the challenge, and the messages
//! AUTH_Send and AUTH_Receive carry. The hashes, the HMAC and the
//! constant-time modular arithmetic come from RustCrypto crates; secrets
//! are zeroized when dropped and compared in constant time.

pub mod dhchap;
pub mod ffdhe;
mod ffdhe_primes;
pub mod host;
pub mod message;
pub mod secret;

pub use dhchap::Hash;
pub use ffdhe::DhGroup;
pub use secret::Secret;

/// `n` bytes from the operating system's random source (challenges,
/// private exponents).
pub fn random_bytes(n: usize) -> std::io::Result<zeroize::Zeroizing<Vec<u8>>> {
    let mut b = zeroize::Zeroizing::new(vec![0u8; n]);
    getrandom::fill(&mut b).map_err(std::io::Error::other)?;
    Ok(b)
}

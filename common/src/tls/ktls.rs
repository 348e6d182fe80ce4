//! Kernel TLS: once a handshake is done, its application traffic keys go to
//! the kernel (`TCP_ULP` "tls", then `TLS_TX` and `TLS_RX`), which encrypts
//! what is sent on the socket and decrypts what is received, so that the
//! stream's io_uring sends and receives plaintext as without TLS.
//!
//! The keys come from the session's traffic secrets (the handshake's, or
//! those a KeyUpdate made) through RFC 8446, 7.3: key =
//! HKDF-Expand-Label(secret, "key", "", key length), iv =
//! HKDF-Expand-Label(secret, "iv", "", 12), with the sequence numbers of
//! the next records: a target hands over right after the handshake, a host
//! after the records its blocking queue exchanged. [`offload`] refuses a
//! session holding received bytes not yet read, as it does where the kernel
//! has no `tls` module; the caller then keeps TLS in user space.
//!
//! What the kernel cannot do, the connection cannot either: a record other
//! than application data (an alert, a KeyUpdate) fails the receive, which
//! closes the connection.

use super::key::Hash;
use super::protect::expand_label;
use super::Session;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use zeroize::{Zeroize, Zeroizing};

const SOL_TCP: libc::c_int = 6;
const TCP_ULP: libc::c_int = 31;
const SOL_TLS: libc::c_int = 282;
const TLS_TX: libc::c_int = 1;
const TLS_RX: libc::c_int = 2;
const TLS_1_3_VERSION: u16 = 0x0304;
const TLS_CIPHER_AES_GCM_128: u16 = 51;
const TLS_CIPHER_AES_GCM_256: u16 = 52;

/// `struct tls12_crypto_info_aes_gcm_128` / `_256` (linux/tls.h): the
/// record IV's last 8 bytes, the key, the IV's first 4 bytes (salt) and the
/// record sequence number; `K` is the key length.
#[repr(C)]
struct CryptoInfo<const K: usize> {
    version: u16,
    cipher_type: u16,
    iv: [u8; 8],
    key: [u8; K],
    salt: [u8; 4],
    rec_seq: [u8; 8],
}

impl<const K: usize> Drop for CryptoInfo<K> {
    fn drop(&mut self) {
        self.key.zeroize();
        self.iv.zeroize();
        self.salt.zeroize();
    }
}

/// Why the kernel did not take the connection's TLS.
#[derive(Debug, thiserror::Error)]
pub enum KtlsError {
    #[error("the kernel has no TLS (the tls module): {0}")]
    Unavailable(std::io::Error),
    #[error("bytes received wait to be read in user space")]
    Buffered,
    #[error("kernel TLS is turned off (RDMABLK_KTLS=0)")]
    NotWanted,
    #[error("setting the kernel's TLS keys: {0}")]
    Keys(std::io::Error),
}

/// The crypto info of one direction's traffic `secret`.
fn crypto_info<const K: usize>(hash: Hash, cipher: u16, secret: &[u8], seq: u64) -> CryptoInfo<K> {
    let mut key = Zeroizing::new([0u8; K]);
    let mut iv = Zeroizing::new([0u8; 12]);
    expand_label(hash, secret, "key", &mut key[..]);
    expand_label(hash, secret, "iv", &mut iv[..]);
    let mut info = CryptoInfo {
        version: TLS_1_3_VERSION,
        cipher_type: cipher,
        iv: [0; 8],
        key: *key,
        salt: [0; 4],
        rec_seq: seq.to_be_bytes(),
    };
    info.salt.copy_from_slice(&iv[..4]);
    info.iv.copy_from_slice(&iv[4..]);
    info
}

fn set<T>(
    sock: &TcpStream,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
    len: usize,
) -> std::io::Result<()> {
    // SAFETY: `value` points at `len` readable bytes for the call.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            len as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn set_keys<const K: usize>(
    sock: &TcpStream,
    session: &Session,
    cipher: u16,
) -> Result<(), KtlsError> {
    let (hash, [sent, received]) = session.prot.kernel_state();
    for (dir, (secret, seq)) in [(TLS_TX, sent), (TLS_RX, received)] {
        let info = crypto_info::<K>(hash, cipher, secret, seq);
        set(
            sock,
            SOL_TLS,
            dir,
            &info,
            std::mem::size_of::<CryptoInfo<K>>(),
        )
        .map_err(KtlsError::Keys)?;
    }
    Ok(())
}

/// Hands the TLS `session` of `sock` to the kernel, unless `RDMABLK_KTLS=0`.
/// On an error before the keys are set the socket is as it was (and the
/// session goes on in user space); after (`Keys`), it is unusable.
pub fn offload(sock: &TcpStream, session: &Session) -> Result<(), KtlsError> {
    if !wanted() {
        return Err(KtlsError::NotWanted);
    }
    if !session.plain.is_empty() || !session.unopened.is_empty() {
        return Err(KtlsError::Buffered);
    }
    set(sock, SOL_TCP, TCP_ULP, b"tls", 3).map_err(KtlsError::Unavailable)?;
    match session.prot.kernel_state().0 {
        Hash::Sha256 => set_keys::<16>(sock, session, TLS_CIPHER_AES_GCM_128),
        Hash::Sha384 => set_keys::<32>(sock, session, TLS_CIPHER_AES_GCM_256),
    }
}

/// Whether kernel TLS is wanted: on unless `RDMABLK_KTLS=0` (to compare it
/// with TLS in user space, or to rule it out).
fn wanted() -> bool {
    std::env::var_os("RDMABLK_KTLS").is_none_or(|v| v != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8448, 3 (a simple 1-RTT handshake): the server's application
    /// traffic secret and the write key and IV derived from it.
    #[test]
    fn rfc8448_application_keys() {
        let hex = |s: &str| -> Vec<u8> {
            let s: String = s.split_whitespace().collect();
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect()
        };
        let secret = hex("a1 1a f9 f0 55 31 f8 56 ad 47 11 6b 45 a9 50 32 82 04 b4 f4 4b fb 6b 3a 4b 4f 1f 3f cb 63 16 43");
        let info = crypto_info::<16>(Hash::Sha256, TLS_CIPHER_AES_GCM_128, &secret, 0);
        assert_eq!(
            info.key.to_vec(),
            hex("9f 02 28 3b 6c 9c 07 ef c2 6b b9 f2 ac 92 e3 56")
        );
        let iv = [info.salt.to_vec(), info.iv.to_vec()].concat();
        assert_eq!(iv, hex("cf 78 2b 88 dd 83 54 9a ad f1 e9 84"));
        assert_eq!(info.rec_seq, [0; 8]);
    }
}

//! TLS 1.3 record protection after the handshake (RFC 8446, 5.2 to 5.4
//! and 4.6.3), in user space: OpenSSL does the handshake, these keys then
//! seal and open every record. AES-GCM is AWS-LC's (aws-lc-rs: VAES with
//! AVX-512 where the CPU has it, about 14 GB/s on 16 KiB records here,
//! against ring's 9 and Debian 12's OpenSSL 3.0's 3.8), which is most of what
//! TLS costs per I/O. AWS-LC clears a key's memory when it frees it.
//!
//! Records after the handshake carry application data, alerts and two
//! handshake messages: NewSessionTicket (ignored: there is no resumption)
//! and KeyUpdate (the keys of that direction move on; one that asks for an
//! update is answered, the only KeyUpdate ever sent).

use super::engine::Traffic;
use super::key::Hash;
use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::hkdf;
use zeroize::Zeroizing;

/// A record's header: type, legacy version, length.
pub const HEADER: usize = 5;
/// Most plaintext one record carries (RFC 8446, 5.1).
pub const MAX_PLAIN: usize = 16 << 10;
/// The largest record a peer may send (2^14 + 256 of ciphertext).
pub const MAX_RECORD: usize = HEADER + (16 << 10) + 256;
/// A record's AEAD tag.
const TAG: usize = 16;
/// What a record adds to its plaintext: header, content type, tag.
pub const OVERHEAD: usize = HEADER + 1 + TAG;

/// Record content types (RFC 8446, 5.1).
pub const CHANGE_CIPHER_SPEC: u8 = 20;
pub const ALERT: u8 = 21;
pub const HANDSHAKE: u8 = 22;
pub const APPLICATION_DATA: u8 = 23;
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;

/// Why a record cannot be accepted (the connection ends).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("a record of {0} bytes is larger than TLS 1.3 allows")]
    Oversized(usize),
    #[error("a record of type {0} where only application data may come")]
    OuterType(u8),
    #[error("a record does not decrypt (bad record MAC): not the peer's, or altered")]
    BadMac,
    #[error("the peer sent alert {0}")]
    Alert(u8),
    #[error("a handshake message of type {0} after the handshake")]
    Handshake(u8),
    #[error("a malformed record: {0}")]
    Malformed(&'static str),
}

/// What an opened record holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// Application data: `len` bytes at the start of the record's buffer.
    Data(usize),
    /// Nothing for the stream (a ticket, a KeyUpdate taken in).
    Nothing,
    /// close_notify.
    Closed,
}

/// One direction's keys: AEAD key, IV, sequence number, and the traffic
/// secret the next KeyUpdate derives from.
struct Direction {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
    secret: Zeroizing<Vec<u8>>,
}

impl Direction {
    fn new(hash: Hash, secret: Zeroizing<Vec<u8>>) -> Direction {
        let (alg, len) = match hash {
            Hash::Sha256 => (&aead::AES_128_GCM, 16),
            Hash::Sha384 => (&aead::AES_256_GCM, 32),
        };
        let mut key = Zeroizing::new(vec![0u8; len]);
        let mut iv = [0u8; 12];
        expand_label(hash, &secret, "key", &mut key);
        expand_label(hash, &secret, "iv", &mut iv);
        Direction {
            key: LessSafeKey::new(UnboundKey::new(alg, &key).expect("key of the suite's length")),
            iv,
            seq: 0,
            secret,
        }
    }

    /// The nonce of the next record, which it uses up (RFC 8446, 5.3).
    fn nonce(&mut self) -> Nonce {
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        self.seq += 1;
        Nonce::assume_unique_for_key(n)
    }

    /// The keys after a KeyUpdate (RFC 8446, 7.2).
    fn updated(&self, hash: Hash) -> Direction {
        let mut next = Zeroizing::new(vec![0u8; self.secret.len()]);
        expand_label(hash, &self.secret, "traffic upd", &mut next);
        Direction::new(hash, next)
    }
}

/// One direction's traffic secret and the sequence number of its next record.
pub(crate) type DirectionState<'a> = (&'a [u8], u64);

/// HKDF-Expand-Label(secret, label, "", out.len()) (RFC 8446, 7.1).
pub fn expand_label(hash: Hash, secret: &[u8], label: &str, out: &mut [u8]) {
    struct Len(usize);
    impl hkdf::KeyType for Len {
        fn len(&self) -> usize {
            self.0
        }
    }
    let alg = match hash {
        Hash::Sha256 => hkdf::HKDF_SHA256,
        Hash::Sha384 => hkdf::HKDF_SHA384,
    };
    let label = format!("tls13 {label}");
    let info = [
        &(out.len() as u16).to_be_bytes()[..],
        &[label.len() as u8],
        label.as_bytes(),
        &[0],
    ];
    hkdf::Prk::new_less_safe(alg, secret)
        .expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .expect("key and IV lengths are within HKDF's limit");
}

/// The record keys of a connection, from its side.
pub struct Protection {
    hash: Hash,
    seal: Direction,
    open: Direction,
    /// A KeyUpdate answering the peer's request waits to be sent.
    answer_update: bool,
}

impl Protection {
    /// The keys of a connection whose handshake gave `traffic`; no record
    /// has been sent or received with them yet.
    pub fn new(traffic: Traffic) -> Protection {
        Protection {
            hash: traffic.hash,
            seal: Direction::new(traffic.hash, traffic.sent),
            open: Direction::new(traffic.hash, traffic.received),
            answer_update: false,
        }
    }

    /// Appends to `out` one record of application data: header, the `len`
    /// bytes `fill` appends, content type, tag. At most [`MAX_PLAIN`] bytes.
    pub fn seal(&mut self, out: &mut Vec<u8>, len: usize, fill: impl FnOnce(&mut Vec<u8>)) {
        self.seal_typed(out, APPLICATION_DATA, len, fill);
    }

    /// [`Protection::seal`] of a record of content type `kind`: `fill`
    /// appends the `len` bytes of its content to `out` (appending, rather
    /// than writing over zeros, spares a pass over the bytes).
    fn seal_typed(
        &mut self,
        out: &mut Vec<u8>,
        kind: u8,
        len: usize,
        fill: impl FnOnce(&mut Vec<u8>),
    ) {
        debug_assert!(len <= MAX_PLAIN);
        let at = out.len();
        let body = len + 1 + TAG;
        out.reserve(HEADER + body);
        out.extend_from_slice(&[APPLICATION_DATA, 3, 3]);
        out.extend_from_slice(&(body as u16).to_be_bytes());
        fill(out);
        assert_eq!(
            out.len(),
            at + HEADER + len,
            "a record's content is as long as it says"
        );
        out.push(kind);
        let (head, rest) = out[at..].split_at_mut(HEADER);
        let aad: [u8; HEADER] = head.try_into().expect("a header");
        let nonce = self.seal.nonce();
        let tag = self
            .seal
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(aad), rest)
            .expect("a record is within AES-GCM's limits");
        out.extend_from_slice(tag.as_ref());
    }

    /// What kernel TLS needs to take over: the hash, then for what this
    /// side sends and what it receives, the traffic secret and the sequence
    /// number of the next record.
    pub(crate) fn kernel_state(&self) -> (Hash, [DirectionState<'_>; 2]) {
        (
            self.hash,
            [
                (self.seal.secret.as_slice(), self.seal.seq),
                (self.open.secret.as_slice(), self.open.seq),
            ],
        )
    }

    /// Appends the records that must go out before more data: the answer
    /// to a KeyUpdate that asked for one (after which this side's keys move
    /// on too).
    pub fn pending_output(&mut self, out: &mut Vec<u8>) {
        if std::mem::take(&mut self.answer_update) {
            // KeyUpdate, update_not_requested (RFC 8446, 4.6.3).
            self.seal_typed(out, HANDSHAKE, 5, |b| {
                b.extend_from_slice(&[KEY_UPDATE, 0, 0, 1, 0])
            });
            self.seal = self.seal.updated(self.hash);
        }
    }

    /// The length of the whole record at the start of `buf`, once its
    /// header is there.
    pub fn record_len(buf: &[u8]) -> Result<Option<usize>, RecordError> {
        if buf.len() < HEADER {
            return Ok(None);
        }
        if buf[0] != APPLICATION_DATA {
            return Err(RecordError::OuterType(buf[0]));
        }
        let len = HEADER + u16::from_be_bytes([buf[3], buf[4]]) as usize;
        if len > MAX_RECORD {
            return Err(RecordError::Oversized(len - HEADER));
        }
        if len < HEADER + 1 + TAG {
            return Err(RecordError::Malformed("shorter than its tag"));
        }
        Ok(Some(len))
    }

    /// Opens the whole record `rec` in place: application data ends up at
    /// `rec[HEADER..HEADER + n]` for `Opened::Data(n)`.
    pub fn open(&mut self, rec: &mut [u8]) -> Result<Opened, RecordError> {
        let (head, body) = rec.split_at_mut(HEADER);
        let aad: [u8; HEADER] = (&*head).try_into().expect("a header");
        let nonce = self.open.nonce();
        let plain = self
            .open
            .key
            .open_in_place(nonce, Aad::from(aad), body)
            .map_err(|_| RecordError::BadMac)?;
        // The content type is the last non-zero byte (padding is zeros).
        let Some(end) = plain.iter().rposition(|b| *b != 0) else {
            return Err(RecordError::Malformed("no content type"));
        };
        let (kind, len) = (plain[end], end);
        match kind {
            APPLICATION_DATA => Ok(Opened::Data(len)),
            ALERT => match plain[..len] {
                [_, 0] => Ok(Opened::Closed),
                [_, what] => Err(RecordError::Alert(what)),
                _ => Err(RecordError::Malformed("an alert of other than 2 bytes")),
            },
            HANDSHAKE => self.handshake(&plain[..len]),
            other => Err(RecordError::OuterType(other)),
        }
    }

    /// Handshake messages after the handshake (several may share a record;
    /// none spans records here: both are a few bytes).
    fn handshake(&mut self, mut msgs: &[u8]) -> Result<Opened, RecordError> {
        while !msgs.is_empty() {
            if msgs.len() < 4 {
                return Err(RecordError::Malformed("a cut handshake message"));
            }
            let len = u32::from_be_bytes([0, msgs[1], msgs[2], msgs[3]]) as usize;
            let Some(body) = msgs.get(4..4 + len) else {
                return Err(RecordError::Malformed(
                    "a handshake message spanning records",
                ));
            };
            match msgs[0] {
                NEW_SESSION_TICKET => {}
                KEY_UPDATE => {
                    let requested = match body {
                        [0] => false,
                        [1] => true,
                        _ => {
                            return Err(RecordError::Malformed("a KeyUpdate of other than 1 byte"))
                        }
                    };
                    self.open = self.open.updated(self.hash);
                    self.answer_update |= requested;
                }
                other => return Err(RecordError::Handshake(other)),
            }
            msgs = &msgs[4 + len..];
        }
        Ok(Opened::Nothing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ends whose keys mirror each other.
    fn pair(hash: Hash) -> (Protection, Protection) {
        let n = match hash {
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
        };
        let (a, b) = (Zeroizing::new(vec![1u8; n]), Zeroizing::new(vec![2u8; n]));
        let end = |sent: &Zeroizing<Vec<u8>>, received: &Zeroizing<Vec<u8>>| {
            Protection::new(Traffic {
                hash,
                sent: sent.clone(),
                received: received.clone(),
            })
        };
        (end(&a, &b), end(&b, &a))
    }

    fn data(from: &mut Protection, to: &mut Protection, bytes: &[u8]) -> Opened {
        let mut rec = Vec::new();
        from.seal(&mut rec, bytes.len(), |d| d.extend_from_slice(bytes));
        assert_eq!(Protection::record_len(&rec).unwrap(), Some(rec.len()));
        let opened = to.open(&mut rec).unwrap();
        if let Opened::Data(n) = opened {
            assert_eq!(&rec[HEADER..HEADER + n], bytes);
        }
        opened
    }

    #[test]
    fn records_carry_data_with_both_suites() {
        for hash in [Hash::Sha256, Hash::Sha384] {
            let (mut a, mut b) = pair(hash);
            for i in 0..3u8 {
                assert_eq!(data(&mut a, &mut b, &[i; 100]), Opened::Data(100));
                assert_eq!(
                    data(&mut b, &mut a, &[i; MAX_PLAIN]),
                    Opened::Data(MAX_PLAIN)
                );
            }
        }
    }

    /// RFC 8446, 4.6.3: a KeyUpdate that asks for one is answered once, and
    /// both directions go on with their new keys; a ticket is ignored.
    #[test]
    fn a_key_update_is_taken_and_answered_and_tickets_ignored() {
        let (mut a, mut b) = pair(Hash::Sha256);
        let mut rec = Vec::new();
        a.seal_typed(&mut rec, HANDSHAKE, 5, |d| {
            d.extend_from_slice(&[KEY_UPDATE, 0, 0, 1, 1])
        });
        a.seal = a.seal.updated(a.hash);
        assert_eq!(b.open(&mut rec).unwrap(), Opened::Nothing);
        let mut answer = Vec::new();
        b.pending_output(&mut answer);
        assert!(!answer.is_empty(), "no answer to update_requested");
        assert_eq!(a.open(&mut answer).unwrap(), Opened::Nothing);
        let mut again = Vec::new();
        b.pending_output(&mut again);
        assert!(again.is_empty(), "answered twice");
        assert!(
            !a.answer_update,
            "the answer (update_not_requested) asked for another"
        );
        assert_eq!(data(&mut a, &mut b, b"after"), Opened::Data(5));
        assert_eq!(data(&mut b, &mut a, b"both ways"), Opened::Data(9));

        let mut ticket = Vec::new();
        a.seal_typed(&mut ticket, HANDSHAKE, 8, |d| {
            d.extend_from_slice(&[NEW_SESSION_TICKET, 0, 0, 4, 0, 0, 0, 0])
        });
        assert_eq!(b.open(&mut ticket).unwrap(), Opened::Nothing);
    }

    #[test]
    fn alerts_and_forgeries() {
        let (mut a, mut b) = pair(Hash::Sha256);
        let mut rec = Vec::new();
        a.seal_typed(&mut rec, ALERT, 2, |d| d.extend_from_slice(&[1, 0]));
        assert_eq!(b.open(&mut rec).unwrap(), Opened::Closed);
        let mut rec = Vec::new();
        a.seal_typed(&mut rec, ALERT, 2, |d| d.extend_from_slice(&[2, 20]));
        assert!(matches!(b.open(&mut rec), Err(RecordError::Alert(20))));
        let mut rec = Vec::new();
        a.seal(&mut rec, 10, |d| d.extend_from_slice(&[7; 10]));
        rec[7] ^= 1;
        assert!(matches!(b.open(&mut rec), Err(RecordError::BadMac)));
        assert!(matches!(
            Protection::record_len(&[22, 3, 3, 0, 10]),
            Err(RecordError::OuterType(22))
        ));
        assert!(matches!(
            Protection::record_len(&[23, 3, 3, 0x41, 1]),
            Err(RecordError::Oversized(_))
        ));
    }
}

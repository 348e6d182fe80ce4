//! The messages AUTH_Send and AUTH_Receive carry (NVMe Base 2.1, 8.3.4.5;
//! layouts as `include/linux/nvme.h`), all little-endian: a common header
//! (type, identifier, transaction id), then per message:
//!
//! | message | type / id | body |
//! |---|---|---|
//! | AUTH_Negotiate | 0 / 00h | SC_C, NAPD, one 64-byte descriptor: auth id 1, HALEN, DHLEN, hash ids at 4.., DH group ids at 34.. |
//! | Challenge | 1 / 01h | HL, hash id, DH group, DHVLEN, sequence number, challenge, DH value |
//! | Reply | 1 / 02h | HL, CVALID, DHVLEN, sequence number, response, challenge (HL bytes, zero unless CVALID), DH value |
//! | Success1 | 1 / 03h | HL, RVALID, response |
//! | Success2 | 1 / 04h | nothing |
//! | AUTH_Failure2 / Failure1 | 0 / F0h, F1h | reason code, explanation |

use crate::bytes::{get_u16, get_u32};

/// SECP of AUTH_Send / AUTH_Receive for DH-HMAC-CHAP, and SPSP0, SPSP1.
pub const SECP: u8 = 0xe9;
pub const SPSP: u8 = 0x01;

/// An AUTH_Send (`send`) or AUTH_Receive of `len` bytes (TL or AL) for
/// DH-HMAC-CHAP (NVMe Base 2.1, 6.2 and 6.3).
pub fn command(send: bool, len: usize) -> crate::nvme::Sqe {
    let mut sqe = crate::nvme::Sqe::new(crate::nvme::FABRICS_OPCODE, 0);
    let fc = if send {
        crate::fabrics::fctype::AUTH_SEND
    } else {
        crate::fabrics::fctype::AUTH_RECV
    };
    sqe.set_cdw(1, fc as u32);
    sqe.set_cdw(
        10,
        (SECP as u32) << 24 | (SPSP as u32) << 16 | (SPSP as u32) << 8,
    );
    sqe.set_cdw(11, len as u32);
    sqe
}

/// Bytes an AUTH_Receive asks for: room for any message (as the Linux host).
pub const RECEIVE_LEN: usize = 4096;

/// The protocol identifier in a Negotiate descriptor.
const DHCHAP_AUTH_ID: u8 = 0x01;
/// Hash and DH group identifiers a descriptor holds at most, each.
const MAX_IDS: usize = 30;
const HEADER: usize = 6;
const NEGOTIATE_LEN: usize = 8 + 64;

/// Explanations of an authentication failure (reason code 01h).
pub mod explanation {
    pub const FAILED: u8 = 0x01;
    pub const NOT_USABLE: u8 = 0x02;
    pub const CONCAT_MISMATCH: u8 = 0x03;
    pub const HASH_UNUSABLE: u8 = 0x04;
    pub const DHGROUP_UNUSABLE: u8 = 0x05;
    pub const INCORRECT_PAYLOAD: u8 = 0x06;
    pub const INCORRECT_MESSAGE: u8 = 0x07;

    /// What an explanation says, for logs.
    pub fn describe(e: u8) -> &'static str {
        match e {
            FAILED => "authentication failed",
            NOT_USABLE => "authentication protocol not usable",
            CONCAT_MISMATCH => "secure channel concatenation mismatch",
            HASH_UNUSABLE => "hash function not usable",
            DHGROUP_UNUSABLE => "DH group not usable",
            INCORRECT_PAYLOAD => "incorrect payload",
            INCORRECT_MESSAGE => "incorrect protocol message",
            _ => "unknown reason",
        }
    }
}

/// The reason code of every failure message (authentication failure).
pub const REASON_FAILED: u8 = 0x01;

/// One authentication message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Negotiate {
        tid: u16,
        sc_c: u8,
        hashes: Vec<u8>,
        dh_groups: Vec<u8>,
    },
    Challenge {
        tid: u16,
        hash: u8,
        dh_group: u8,
        seqnum: u32,
        challenge: Vec<u8>,
        dh_value: Vec<u8>,
    },
    Reply {
        tid: u16,
        response: Vec<u8>,
        /// The host's challenge to the controller (bidirectional).
        ctrl_challenge: Option<Vec<u8>>,
        seqnum: u32,
        dh_value: Vec<u8>,
    },
    Success1 {
        tid: u16,
        /// Digest length (HL), also when no response follows.
        hl: u8,
        response: Option<Vec<u8>>,
    },
    Success2 {
        tid: u16,
    },
    /// From the controller (F1h).
    Failure1 {
        tid: u16,
        explanation: u8,
    },
    /// From the host (F0h).
    Failure2 {
        tid: u16,
        explanation: u8,
    },
}

/// Why a message cannot be read; the explanation a failure message gives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {why}", explanation::describe(*.explanation))]
pub struct MessageError {
    pub explanation: u8,
    pub why: String,
}

fn payload(why: impl Into<String>) -> MessageError {
    MessageError {
        explanation: explanation::INCORRECT_PAYLOAD,
        why: why.into(),
    }
}

impl Message {
    /// The transaction id.
    pub fn tid(&self) -> u16 {
        match self {
            Message::Negotiate { tid, .. }
            | Message::Challenge { tid, .. }
            | Message::Reply { tid, .. }
            | Message::Success1 { tid, .. }
            | Message::Success2 { tid }
            | Message::Failure1 { tid, .. }
            | Message::Failure2 { tid, .. } => *tid,
        }
    }

    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let header = |b: &mut Vec<u8>, ty: u8, id: u8, tid: u16| {
            b.extend_from_slice(&[ty, id, 0, 0]);
            b.extend_from_slice(&tid.to_le_bytes());
        };
        let mut b = Vec::new();
        match self {
            Message::Negotiate {
                tid,
                sc_c,
                hashes,
                dh_groups,
            } => {
                header(&mut b, 0, 0x00, *tid);
                b.extend_from_slice(&[*sc_c, 1]);
                let mut d = [0u8; 64];
                d[0] = DHCHAP_AUTH_ID;
                d[2] = hashes.len().min(MAX_IDS) as u8;
                d[3] = dh_groups.len().min(MAX_IDS) as u8;
                for (i, h) in hashes.iter().take(MAX_IDS).enumerate() {
                    d[4 + i] = *h;
                }
                for (i, g) in dh_groups.iter().take(MAX_IDS).enumerate() {
                    d[4 + MAX_IDS + i] = *g;
                }
                b.extend_from_slice(&d);
            }
            Message::Challenge {
                tid,
                hash,
                dh_group,
                seqnum,
                challenge,
                dh_value,
            } => {
                header(&mut b, 1, 0x01, *tid);
                b.extend_from_slice(&[challenge.len() as u8, 0, *hash, *dh_group]);
                b.extend_from_slice(&(dh_value.len() as u16).to_le_bytes());
                b.extend_from_slice(&seqnum.to_le_bytes());
                b.extend_from_slice(challenge);
                b.extend_from_slice(dh_value);
            }
            Message::Reply {
                tid,
                response,
                ctrl_challenge,
                seqnum,
                dh_value,
            } => {
                header(&mut b, 1, 0x02, *tid);
                let hl = response.len();
                b.extend_from_slice(&[hl as u8, 0, ctrl_challenge.is_some() as u8, 0]);
                b.extend_from_slice(&(dh_value.len() as u16).to_le_bytes());
                b.extend_from_slice(&seqnum.to_le_bytes());
                b.extend_from_slice(response);
                match ctrl_challenge {
                    Some(c) => b.extend_from_slice(c),
                    None => b.resize(b.len() + hl, 0),
                }
                b.extend_from_slice(dh_value);
            }
            Message::Success1 { tid, hl, response } => {
                header(&mut b, 1, 0x03, *tid);
                b.extend_from_slice(&[*hl, 0, response.is_some() as u8]);
                b.resize(16, 0);
                if let Some(r) = response {
                    b.extend_from_slice(r);
                }
            }
            Message::Success2 { tid } => {
                header(&mut b, 1, 0x04, *tid);
                b.resize(16, 0);
            }
            Message::Failure1 { tid, explanation } | Message::Failure2 { tid, explanation } => {
                let id = if matches!(self, Message::Failure1 { .. }) {
                    0xf1
                } else {
                    0xf0
                };
                header(&mut b, 0, id, *tid);
                b.extend_from_slice(&[REASON_FAILED, *explanation]);
            }
        }
        b
    }

    /// Reads a message; trailing bytes (a receive's padding) are ignored.
    pub fn decode(b: &[u8]) -> Result<Message, MessageError> {
        if b.len() < HEADER + 2 {
            return Err(payload(format!(
                "{} bytes is shorter than any message",
                b.len()
            )));
        }
        let tid = get_u16(b, 4);
        let need = |n: usize| {
            if b.len() < n {
                Err(payload(format!(
                    "{} bytes where the message needs {n}",
                    b.len()
                )))
            } else {
                Ok(())
            }
        };
        Ok(match (b[0], b[1]) {
            (0, 0x00) => {
                need(NEGOTIATE_LEN)?;
                if b[7] != 1 {
                    return Err(MessageError {
                        explanation: explanation::HASH_UNUSABLE,
                        why: format!("{} protocol descriptors (one is supported)", b[7]),
                    });
                }
                let d = &b[8..NEGOTIATE_LEN];
                let (halen, dhlen) = (d[2] as usize, d[3] as usize);
                if d[0] != DHCHAP_AUTH_ID || halen > MAX_IDS || dhlen > MAX_IDS {
                    return Err(payload("not a DH-HMAC-CHAP descriptor"));
                }
                Message::Negotiate {
                    tid,
                    sc_c: b[6],
                    hashes: d[4..4 + halen].to_vec(),
                    dh_groups: d[4 + MAX_IDS..4 + MAX_IDS + dhlen].to_vec(),
                }
            }
            (1, 0x01) => {
                need(16)?;
                let (hl, dhvlen) = (b[6] as usize, get_u16(b, 10) as usize);
                need(16 + hl + dhvlen)?;
                Message::Challenge {
                    tid,
                    hash: b[8],
                    dh_group: b[9],
                    seqnum: get_u32(b, 12),
                    challenge: b[16..16 + hl].to_vec(),
                    dh_value: b[16 + hl..16 + hl + dhvlen].to_vec(),
                }
            }
            (1, 0x02) => {
                need(16)?;
                let (hl, dhvlen) = (b[6] as usize, get_u16(b, 10) as usize);
                need(16 + 2 * hl + dhvlen)?;
                Message::Reply {
                    tid,
                    response: b[16..16 + hl].to_vec(),
                    ctrl_challenge: (b[8] & 1 != 0).then(|| b[16 + hl..16 + 2 * hl].to_vec()),
                    seqnum: get_u32(b, 12),
                    dh_value: b[16 + 2 * hl..16 + 2 * hl + dhvlen].to_vec(),
                }
            }
            (1, 0x03) => {
                need(16)?;
                let hl = b[6];
                let response = if b[8] & 1 != 0 {
                    need(16 + hl as usize)?;
                    Some(b[16..16 + hl as usize].to_vec())
                } else {
                    None
                };
                Message::Success1 { tid, hl, response }
            }
            (1, 0x04) => Message::Success2 { tid },
            (0, 0xf1) => Message::Failure1 {
                tid,
                explanation: b[7],
            },
            (0, 0xf0) => Message::Failure2 {
                tid,
                explanation: b[7],
            },
            (ty, id) => {
                return Err(MessageError {
                    explanation: explanation::INCORRECT_MESSAGE,
                    why: format!("message type {ty:#x} identifier {id:#x}"),
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Negotiate the Linux host sends: 72 bytes, hashes 1..3 at byte
    /// 12, DH groups 0..5 at byte 42 (nvme_auth_set_dhchap_negotiate_data).
    #[test]
    fn negotiate_layout_is_the_kernels() {
        let m = Message::Negotiate {
            tid: 0x0102,
            sc_c: 0,
            hashes: vec![1, 2, 3],
            dh_groups: vec![0, 1, 2, 3, 4, 5],
        };
        let b = m.encode();
        assert_eq!(b.len(), 72);
        assert_eq!(&b[..8], &[0, 0, 0, 0, 0x02, 0x01, 0, 1]);
        assert_eq!(&b[8..12], &[1, 0, 3, 6]);
        assert_eq!(&b[12..15], &[1, 2, 3]);
        assert_eq!(&b[42..48], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(Message::decode(&b), Ok(m));
    }

    #[test]
    fn every_message_round_trips_with_padding() {
        let msgs = [
            Message::Challenge {
                tid: 3,
                hash: 1,
                dh_group: 1,
                seqnum: 0xdead_beef,
                challenge: vec![7; 32],
                dh_value: vec![9; 256],
            },
            Message::Reply {
                tid: 3,
                response: vec![1; 48],
                ctrl_challenge: Some(vec![2; 48]),
                seqnum: 5,
                dh_value: vec![],
            },
            Message::Reply {
                tid: 3,
                response: vec![1; 32],
                ctrl_challenge: None,
                seqnum: 0,
                dh_value: vec![4; 384],
            },
            Message::Success1 {
                tid: 3,
                hl: 64,
                response: Some(vec![5; 64]),
            },
            Message::Success1 {
                tid: 3,
                hl: 32,
                response: None,
            },
            Message::Success2 { tid: 3 },
            Message::Failure1 {
                tid: 3,
                explanation: explanation::FAILED,
            },
            Message::Failure2 {
                tid: 3,
                explanation: explanation::DHGROUP_UNUSABLE,
            },
        ];
        for m in msgs {
            let mut b = m.encode();
            b.resize(4096, 0);
            assert_eq!(Message::decode(&b), Ok(m));
        }
    }

    #[test]
    fn truncated_and_unknown_messages_are_refused() {
        let c = Message::Challenge {
            tid: 1,
            hash: 1,
            dh_group: 0,
            seqnum: 1,
            challenge: vec![1; 32],
            dh_value: vec![],
        }
        .encode();
        let e = Message::decode(&c[..40]).expect_err("truncated");
        assert_eq!(e.explanation, explanation::INCORRECT_PAYLOAD);
        let e = Message::decode(&[1, 9, 0, 0, 0, 0, 0, 0]).expect_err("unknown");
        assert_eq!(e.explanation, explanation::INCORRECT_MESSAGE);
    }
}

//! The test host's side of DH-HMAC-CHAP (NVMe Base 2.1, 8.3.4.5), as the
//! Linux host runs it on every queue whose Connect response asks for it:
//! Negotiate (every hash and DH group), Challenge, Reply (with a challenge
//! of its own when it has a controller secret), Success1, Success2.

use crate::client::Queue;
use rdmablk_common::auth::dhchap::{
    augmented_challenge, controller_response, host_response, responses_match, Transaction,
};
use rdmablk_common::auth::ffdhe::KeyPair;
use rdmablk_common::auth::message::{explanation, Message, SECP, SPSP};
use rdmablk_common::auth::{random_bytes, DhGroup, Hash, Secret};
use rdmablk_common::fabrics::fctype;
use rdmablk_common::nvme::{Status, FABRICS_OPCODE};
use std::io;

/// What the host authenticates with.
#[derive(Clone, Debug)]
pub struct Secrets {
    pub host: Secret,
    /// The controller's secret: the host checks the controller too.
    pub ctrl: Option<Secret>,
    /// Offered hashes and DH groups (identifiers); all by default.
    pub hashes: Vec<u8>,
    pub dh_groups: Vec<u8>,
}

impl Secrets {
    pub fn new(host: &str, ctrl: Option<&str>) -> Secrets {
        Secrets {
            host: Secret::parse(host).expect("a DHHC-1 host secret"),
            ctrl: ctrl.map(|c| Secret::parse(c).expect("a DHHC-1 controller secret")),
            hashes: Hash::ALL.iter().map(|h| h.id()).collect(),
            dh_groups: DhGroup::ALL.iter().map(|g| g.id()).collect(),
        }
    }
}

/// Why authentication did not succeed.
#[derive(Debug)]
pub enum AuthError {
    /// The controller sent AUTH_Failure1 with this explanation.
    Refused(u8),
    /// The controller's response did not match its secret.
    ControllerFailed,
    Io(io::Error),
}

impl From<io::Error> for AuthError {
    fn from(e: io::Error) -> Self {
        AuthError::Io(e)
    }
}

fn auth_sqe(fc: u8, len: usize) -> rdmablk_common::nvme::Sqe {
    let mut sqe = rdmablk_common::nvme::Sqe::new(FABRICS_OPCODE, 0);
    sqe.set_cdw(1, fc as u32);
    sqe.set_cdw(
        10,
        (SECP as u32) << 24 | (SPSP as u32) << 16 | (SPSP as u32) << 8,
    );
    sqe.set_cdw(11, len as u32);
    sqe
}

fn send(q: &mut Queue, m: &Message) -> io::Result<Status> {
    let data = m.encode();
    Ok(
        q.exec(auth_sqe(fctype::AUTH_SEND, data.len()), Some(&data), 0)?
            .status(),
    )
}

fn receive(q: &mut Queue) -> Result<Message, AuthError> {
    let c = q.exec(auth_sqe(fctype::AUTH_RECV, 4096), None, 4096)?;
    if !c.status().is_success() {
        return Err(AuthError::Io(io::Error::other(format!(
            "AUTH_Receive: {}",
            c.status()
        ))));
    }
    Message::decode(&c.data).map_err(|e| AuthError::Io(io::Error::other(e.to_string())))
}

/// Authenticates queue `q` of `host_nqn` with subsystem `subsys_nqn`.
pub fn authenticate(
    q: &mut Queue,
    tid: u16,
    s: &Secrets,
    host_nqn: &str,
    subsys_nqn: &str,
) -> Result<(), AuthError> {
    send(
        q,
        &Message::Negotiate {
            tid,
            sc_c: 0,
            hashes: s.hashes.clone(),
            dh_groups: s.dh_groups.clone(),
        },
    )?;
    let (hash, dh_group, seqnum, challenge, dh_value) = match receive(q)? {
        Message::Challenge {
            hash,
            dh_group,
            seqnum,
            challenge,
            dh_value,
            ..
        } => (hash, dh_group, seqnum, challenge, dh_value),
        Message::Failure1 { explanation, .. } => return Err(AuthError::Refused(explanation)),
        m => {
            return Err(AuthError::Io(io::Error::other(format!(
                "expected a Challenge, got {m:?}"
            ))))
        }
    };
    let hash = Hash::from_id(hash).ok_or(AuthError::Refused(explanation::HASH_UNUSABLE))?;
    let group =
        DhGroup::from_id(dh_group).ok_or(AuthError::Refused(explanation::DHGROUP_UNUSABLE))?;
    let (z, our_value) = match group {
        DhGroup::Null => (None, Vec::new()),
        g => {
            let pair = KeyPair::generate(g)?;
            let z = pair
                .shared_secret(&dh_value)
                .map_err(|_| AuthError::Refused(explanation::DHGROUP_UNUSABLE))?;
            (Some(z), pair.public().to_vec())
        }
    };
    let z = z.as_deref().map(|z| &z[..]);
    let c1 = augmented_challenge(hash, &challenge, z);
    let t = Transaction {
        hash,
        challenge: &c1,
        seqnum,
        tid,
        host_nqn,
        subsys_nqn,
    };
    let response = host_response(&s.host.transformed(host_nqn), &t, 0).to_vec();
    let c2 = match &s.ctrl {
        Some(_) => Some(random_bytes(hash.digest_len())?.to_vec()),
        None => None,
    };
    let s2 = 0x5eed_0001;
    send(
        q,
        &Message::Reply {
            tid,
            response,
            ctrl_challenge: c2.clone(),
            seqnum: s2,
            dh_value: our_value,
        },
    )?;
    match receive(q)? {
        Message::Success1 { response, .. } => {
            if let (Some(cs), Some(c2)) = (&s.ctrl, c2) {
                let c2 = augmented_challenge(hash, &c2, z);
                let want = controller_response(
                    &cs.transformed(subsys_nqn),
                    &Transaction {
                        challenge: &c2,
                        seqnum: s2,
                        ..t
                    },
                );
                let got = response.unwrap_or_default();
                if !responses_match(&want, &got) {
                    let _ = send(
                        q,
                        &Message::Failure2 {
                            tid,
                            explanation: explanation::FAILED,
                        },
                    );
                    return Err(AuthError::ControllerFailed);
                }
                send(q, &Message::Success2 { tid })?;
            }
            Ok(())
        }
        Message::Failure1 { explanation, .. } => Err(AuthError::Refused(explanation)),
        m => Err(AuthError::Io(io::Error::other(format!(
            "expected Success1, got {m:?}"
        )))),
    }
}

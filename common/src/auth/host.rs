//! The host's side of one DH-HMAC-CHAP transaction, as the Linux host runs
//! it on each queue whose Connect response sets ATR: Negotiate (every hash
//! and DH group), the Challenge answered with a Reply (with a challenge of
//! its own when it holds the controller's secret), Success1 checked, then
//! Success2. The caller moves the messages (AUTH_Send, AUTH_Receive).

use super::dhchap::{
    augmented_challenge, controller_response, host_response, responses_match, Transaction,
};
use super::ffdhe::KeyPair;
use super::message::{explanation, Message};
use super::{random_bytes, DhGroup, Hash, Secret};
use zeroize::Zeroizing;

/// What a host authenticates with.
#[derive(Clone, Debug)]
pub struct HostSecrets {
    pub host: Secret,
    /// The controller's secret: the host authenticates the controller too.
    pub ctrl: Option<Secret>,
    /// Hash and DH group identifiers offered; all by default.
    pub hashes: Vec<u8>,
    pub dh_groups: Vec<u8>,
}

impl HostSecrets {
    pub fn new(host: Secret, ctrl: Option<Secret>) -> HostSecrets {
        HostSecrets {
            host,
            ctrl,
            hashes: Hash::ALL.iter().map(|h| h.id()).collect(),
            dh_groups: DhGroup::ALL.iter().map(|g| g.id()).collect(),
        }
    }
}

/// Why a transaction did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("the controller refused authentication: {}", explanation::describe(*.0))]
    Refused(u8),
    #[error("the controller failed to prove its identity (its response does not match the controller secret)")]
    ControllerFailed,
    #[error("authentication protocol error: {0}")]
    Protocol(String),
}

/// One transaction on one queue.
pub struct HostTransaction<'a> {
    secrets: &'a HostSecrets,
    tid: u16,
    host_nqn: &'a str,
    subsys_nqn: &'a str,
    /// After the Reply: what Success1 must carry.
    expect: Option<Zeroizing<Vec<u8>>>,
}

impl<'a> HostTransaction<'a> {
    pub fn new(secrets: &'a HostSecrets, tid: u16, host_nqn: &'a str, subsys_nqn: &'a str) -> Self {
        HostTransaction {
            secrets,
            tid,
            host_nqn,
            subsys_nqn,
            expect: None,
        }
    }

    /// The AUTH_Negotiate to send first.
    pub fn negotiate(&self) -> Message {
        Message::Negotiate {
            tid: self.tid,
            sc_c: 0,
            hashes: self.secrets.hashes.clone(),
            dh_groups: self.secrets.dh_groups.clone(),
        }
    }

    /// The controller's answer to the Negotiate: the Reply to send.
    pub fn on_challenge(&mut self, m: Message) -> Result<Message, AuthError> {
        let (hash, dh_group, seqnum, challenge, dh_value) = match m {
            Message::Challenge {
                tid,
                hash,
                dh_group,
                seqnum,
                challenge,
                dh_value,
            } if tid == self.tid => (hash, dh_group, seqnum, challenge, dh_value),
            Message::Failure1 { explanation, .. } => return Err(AuthError::Refused(explanation)),
            m => {
                return Err(AuthError::Protocol(format!(
                    "expected a Challenge, got {m:?}"
                )))
            }
        };
        let hash = Hash::from_id(hash)
            .filter(|h| h.digest_len() == challenge.len())
            .ok_or_else(|| {
                AuthError::Protocol(format!(
                    "hash {hash} with a {}-byte challenge",
                    challenge.len()
                ))
            })?;
        let group = DhGroup::from_id(dh_group)
            .ok_or_else(|| AuthError::Protocol(format!("unknown DH group {dh_group}")))?;
        let (z, value) = match group {
            DhGroup::Null if dh_value.is_empty() => (None, Vec::new()),
            DhGroup::Null => {
                return Err(AuthError::Protocol("a DH value with the null group".into()))
            }
            g => {
                let pair = KeyPair::generate(g).map_err(|e| AuthError::Protocol(e.to_string()))?;
                let z = pair
                    .shared_secret(&dh_value)
                    .map_err(|e| AuthError::Protocol(e.to_string()))?;
                (Some(z), pair.public().to_vec())
            }
        };
        let z = z.as_deref().map(|z| &z[..]);
        let c1 = augmented_challenge(hash, &challenge, z);
        let t = Transaction {
            hash,
            challenge: &c1,
            seqnum,
            tid: self.tid,
            host_nqn: self.host_nqn,
            subsys_nqn: self.subsys_nqn,
        };
        let response = host_response(&self.secrets.host.transformed(self.host_nqn), &t, 0);
        let (ctrl_challenge, seqnum2) = match &self.secrets.ctrl {
            None => (None, 0),
            Some(cs) => {
                let c2 = random_bytes(hash.digest_len())
                    .map_err(|e| AuthError::Protocol(e.to_string()))?;
                let s2 = u32::from_le_bytes(
                    random_bytes(4).map_err(|e| AuthError::Protocol(e.to_string()))?[..4]
                        .try_into()
                        .expect("4 bytes"),
                ) | 1;
                let a2 = augmented_challenge(hash, &c2, z);
                self.expect = Some(controller_response(
                    &cs.transformed(self.subsys_nqn),
                    &Transaction {
                        challenge: &a2,
                        seqnum: s2,
                        ..t
                    },
                ));
                (Some(c2.to_vec()), s2)
            }
        };
        Ok(Message::Reply {
            tid: self.tid,
            response: response.to_vec(),
            ctrl_challenge,
            seqnum: seqnum2,
            dh_value: value,
        })
    }

    /// The controller's Success1: the Success2 to send when the host
    /// authenticated the controller, or the Failure2 to send and the error.
    pub fn on_success1(
        &mut self,
        m: Message,
    ) -> Result<Option<Message>, (Option<Message>, AuthError)> {
        match m {
            Message::Success1 { tid, response, .. } if tid == self.tid => match &self.expect {
                None => Ok(None),
                Some(want) if responses_match(want, response.as_deref().unwrap_or_default()) => {
                    Ok(Some(Message::Success2 { tid }))
                }
                Some(_) => Err((
                    Some(Message::Failure2 {
                        tid,
                        explanation: explanation::FAILED,
                    }),
                    AuthError::ControllerFailed,
                )),
            },
            Message::Failure1 { explanation, .. } => Err((None, AuthError::Refused(explanation))),
            m => Err((
                None,
                AuthError::Protocol(format!("expected Success1, got {m:?}")),
            )),
        }
    }
}

//! DH-HMAC-CHAP on one queue, the controller's side (NVMe Base 2.1,
//! 8.3.4.5): AUTH_Send brings Negotiate, Reply and Success2; AUTH_Receive
//! takes Challenge, Success1 or Failure1. A protocol error does not fail
//! the command: the next AUTH_Receive returns AUTH_Failure1 and the
//! controller ends, as nvmet does. Every queue of a host with a secret
//! authenticates; until it has, only Fabrics commands run on it.
//! Diffie-Hellman (key generation for the Challenge, the shared secret of a
//! Reply) runs off the poller: the command executes again once it is done.

use crate::base::offload::{Job, Task};
use crate::config::HostAuth;
use rdmablk_common::auth::dhchap::{
    augmented_challenge, controller_response, host_response, responses_match, Transaction,
};
use rdmablk_common::auth::ffdhe::{DhError, KeyPair};
use rdmablk_common::auth::message::{explanation, Message};
use rdmablk_common::auth::{random_bytes, DhGroup, Hash};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// Where a queue's authentication is.
enum Step {
    /// Waiting for AUTH_Negotiate.
    Idle,
    /// Negotiated: the next AUTH_Receive gets the Challenge.
    Negotiated {
        tid: u16,
        sc_c: u8,
        hash: Hash,
        group: DhGroup,
    },
    /// Challenged: waiting for the Reply.
    Challenged {
        tid: u16,
        sc_c: u8,
        hash: Hash,
        seqnum: u32,
        challenge: Zeroizing<Vec<u8>>,
        pair: Option<Arc<KeyPair>>,
    },
    /// The host's response was right: the next AUTH_Receive gets Success1
    /// (with the controller's response when the host asked for one).
    Replied {
        tid: u16,
        hash: Hash,
        response: Option<Zeroizing<Vec<u8>>>,
    },
    /// Bidirectional: waiting for Success2.
    AwaitingSuccess2 { tid: u16 },
    /// The next AUTH_Receive gets AUTH_Failure1.
    Failed { tid: u16, explanation: u8 },
}

/// What a message did to the queue.
#[derive(Debug)]
pub enum Outcome {
    Continue,
    /// The queue is authenticated.
    Authenticated,
    /// The controller must end (the reason, for the log).
    Fatal(String),
    /// The message needs this Diffie-Hellman work first: the command
    /// executes again once the job has run.
    After(Job),
}

/// Diffie-Hellman work of the transaction, off the poller, for the
/// command `cid`: one at a time per queue.
struct DhWork {
    cid: u16,
    task: DhTask,
}

impl DhWork {
    fn new(cid: u16, task: DhTask) -> DhWork {
        DhWork { cid, task }
    }
}

enum DhTask {
    /// The controller's key pair for the Challenge.
    KeyPair(Task<std::io::Result<KeyPair>>),
    /// The shared secret with the value of the host's Reply.
    Secret(Task<Result<Zeroizing<Vec<u8>>, DhError>>),
}

/// The queue's side of the association.
pub struct QueueAuth {
    authenticated: bool,
    step: Step,
    /// When the transaction in progress started.
    since: Option<Instant>,
    /// Diffie-Hellman work started for the command being handled.
    dh: Option<DhWork>,
}

/// The host and subsystem a transaction is between.
pub struct Peers<'a> {
    pub host_nqn: &'a str,
    pub subsys_nqn: &'a str,
    /// The host's secrets now (a reload may have changed them); `None`
    /// when the host no longer has a secret.
    pub host: Option<&'a HostAuth>,
}

/// Why a transaction fails when the offload thread has too much waiting.
const BUSY: &str = "too many authentications in progress (the host may retry)";

/// Sequence numbers of challenges: never 0, never repeated soon.
static SEQNUM: AtomicU32 = AtomicU32::new(0);

fn next_seqnum() -> u32 {
    if SEQNUM.load(Ordering::Relaxed) == 0 {
        let start = random_bytes(4).map_or(1, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let _ = SEQNUM.compare_exchange(0, start | 1, Ordering::AcqRel, Ordering::Relaxed);
    }
    loop {
        let s = SEQNUM.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        if s != 0 {
            return s;
        }
    }
}

/// The first of `ours` (in our order of preference) the host offers.
fn first_offered<T: Copy>(ours: &[T], offered: &[u8], id: impl Fn(T) -> u8) -> Option<T> {
    ours.iter().copied().find(|x| offered.contains(&id(*x)))
}

impl Default for QueueAuth {
    fn default() -> Self {
        QueueAuth {
            authenticated: false,
            step: Step::Idle,
            since: None,
            dh: None,
        }
    }
}

impl QueueAuth {
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// Whether a transaction has been in progress longer than `limit`.
    pub fn overdue(&self, limit: Duration) -> bool {
        self.since.is_some_and(|t| t.elapsed() > limit)
    }

    fn fail(&mut self, tid: u16, explanation: u8) -> Outcome {
        self.step = Step::Failed { tid, explanation };
        Outcome::Continue
    }

    /// The offload thread had too many jobs waiting to take this one.
    fn offload_refused(&mut self, tid: u16, peers: &Peers) -> Outcome {
        tracing::warn!(host = peers.host_nqn, "authentication failed: {BUSY}");
        self.fail(tid, explanation::FAILED)
    }

    /// The Diffie-Hellman work command `cid` started, if it is the one
    /// that waits; an error when another command waits for its own (a
    /// host sends one authentication command at a time).
    fn dh_of(&mut self, cid: u16) -> Result<Option<DhTask>, String> {
        match self.dh.take() {
            Some(w) if w.cid == cid => Ok(Some(w.task)),
            Some(w) => {
                self.dh = Some(w);
                Err(
                    "an authentication command arrived while another waits for its \
                     Diffie-Hellman work"
                        .into(),
                )
            }
            None => Ok(None),
        }
    }

    /// An AUTH_Send (command `cid`) brought `data`.
    pub fn on_send(&mut self, cid: u16, data: &[u8], peers: &Peers) -> Outcome {
        let dh = match self.dh_of(cid) {
            Ok(dh) => dh,
            Err(why) => return Outcome::Fatal(why),
        };
        let msg = match Message::decode(data) {
            Ok(m) => m,
            Err(e) => {
                let tid = if data.len() >= 6 {
                    u16::from_le_bytes([data[4], data[5]])
                } else {
                    0
                };
                tracing::warn!(host = peers.host_nqn, "authentication: {e}");
                return self.fail(tid, e.explanation);
            }
        };
        let Some(host) = peers.host else {
            tracing::warn!(
                host = peers.host_nqn,
                "authentication: the host has no secret here"
            );
            return self.fail(msg.tid(), explanation::FAILED);
        };
        match (std::mem::replace(&mut self.step, Step::Idle), msg) {
            // A Negotiate starts (or restarts) a transaction in any step.
            (
                _,
                Message::Negotiate {
                    tid,
                    sc_c,
                    hashes,
                    dh_groups,
                },
            ) => {
                // From the first Negotiate: starting over does not move the
                // transaction's deadline.
                self.since.get_or_insert_with(Instant::now);
                if sc_c != 0 {
                    return self.fail(tid, explanation::CONCAT_MISMATCH);
                }
                let hash = first_offered(&host.hashes, &hashes, |h| h.id());
                let group = first_offered(&host.dh_groups, &dh_groups, |g| g.id());
                let (Some(hash), Some(group)) = (hash, group) else {
                    let e = if hash.is_none() {
                        explanation::HASH_UNUSABLE
                    } else {
                        explanation::DHGROUP_UNUSABLE
                    };
                    tracing::warn!(
                        host = peers.host_nqn,
                        ?hashes,
                        ?dh_groups,
                        "authentication: {}",
                        explanation::describe(e)
                    );
                    return self.fail(tid, e);
                };
                self.step = Step::Negotiated {
                    tid,
                    sc_c,
                    hash,
                    group,
                };
                Outcome::Continue
            }
            (
                Step::Challenged {
                    tid,
                    sc_c,
                    hash,
                    seqnum,
                    challenge,
                    pair,
                },
                Message::Reply {
                    tid: rtid,
                    response,
                    ctrl_challenge,
                    seqnum: s2,
                    dh_value,
                },
            ) => {
                if rtid != tid || response.len() != hash.digest_len() {
                    return self.fail(tid, explanation::INCORRECT_PAYLOAD);
                }
                let z = match &pair {
                    None if dh_value.is_empty() => None,
                    Some(p) => match dh {
                        Some(DhTask::Secret(task)) => match task.take() {
                            Some(Ok(z)) => Some(z),
                            Some(Err(e)) => {
                                tracing::warn!(host = peers.host_nqn, "authentication: {e}");
                                return self.fail(tid, explanation::DHGROUP_UNUSABLE);
                            }
                            None => return self.offload_refused(tid, peers),
                        },
                        _ => {
                            let p = p.clone();
                            let (task, job) =
                                Task::new(peers.host_nqn, move || p.shared_secret(&dh_value));
                            self.dh = Some(DhWork::new(cid, DhTask::Secret(task)));
                            self.step = Step::Challenged {
                                tid,
                                sc_c,
                                hash,
                                seqnum,
                                challenge,
                                pair,
                            };
                            return Outcome::After(job);
                        }
                    },
                    None => return self.fail(tid, explanation::INCORRECT_PAYLOAD),
                };
                let c1 = augmented_challenge(hash, &challenge, z.as_deref().map(|z| &z[..]));
                let kh = host.secret.transformed(peers.host_nqn);
                let t = Transaction {
                    hash,
                    challenge: &c1,
                    seqnum,
                    tid,
                    host_nqn: peers.host_nqn,
                    subsys_nqn: peers.subsys_nqn,
                };
                if !responses_match(&host_response(&kh, &t, sc_c), &response) {
                    tracing::warn!(
                        host = peers.host_nqn,
                        "authentication failed: the host's response does not match its secret"
                    );
                    return self.fail(tid, explanation::FAILED);
                }
                let response = match ctrl_challenge {
                    None => None,
                    Some(c2) => {
                        let Some(cs) = &host.ctrl_secret else {
                            tracing::warn!(host = peers.host_nqn, "authentication: the host asks the controller to authenticate, and it has no controller secret for it");
                            return self.fail(tid, explanation::FAILED);
                        };
                        let c2 = augmented_challenge(hash, &c2, z.as_deref().map(|z| &z[..]));
                        let kc = cs.transformed(peers.subsys_nqn);
                        let t = Transaction {
                            challenge: &c2,
                            seqnum: s2,
                            ..t
                        };
                        Some(controller_response(&kc, &t))
                    }
                };
                let bidirectional = response.is_some();
                self.step = Step::Replied {
                    tid,
                    hash,
                    response,
                };
                if bidirectional {
                    Outcome::Continue
                } else {
                    self.done(peers)
                }
            }
            (Step::AwaitingSuccess2 { tid }, Message::Success2 { tid: t2 }) if t2 == tid => {
                self.done(peers)
            }
            (_, Message::Failure2 { explanation: e, .. }) => Outcome::Fatal(format!(
                "the host ended authentication: {}",
                explanation::describe(e)
            )),
            (_, m) => self.fail(m.tid(), explanation::INCORRECT_MESSAGE),
        }
    }

    fn done(&mut self, peers: &Peers) -> Outcome {
        if self.authenticated {
            tracing::info!(host = peers.host_nqn, "queue re-authenticated");
        } else {
            tracing::debug!(host = peers.host_nqn, "queue authenticated");
        }
        self.authenticated = true;
        self.since = None;
        Outcome::Authenticated
    }

    /// An AUTH_Receive (command `cid`): the message to return.
    pub fn on_receive(&mut self, cid: u16, peers: &Peers) -> (Vec<u8>, Outcome) {
        let dh = match self.dh_of(cid) {
            Ok(dh) => dh,
            Err(why) => return (Vec::new(), Outcome::Fatal(why)),
        };
        match std::mem::replace(&mut self.step, Step::Idle) {
            Step::Negotiated {
                tid,
                sc_c,
                hash,
                group,
            } => {
                let pair = match (group, dh) {
                    (DhGroup::Null, _) => None,
                    (_, Some(DhTask::KeyPair(task))) => match task.take() {
                        Some(Ok(p)) => Some(Arc::new(p)),
                        Some(Err(e)) => {
                            return self.refuse_now(tid, peers, format!("no DH key: {e}"))
                        }
                        None => return self.refuse_now(tid, peers, BUSY.into()),
                    },
                    (g, _) => {
                        let (task, job) = Task::new(peers.host_nqn, move || KeyPair::generate(g));
                        self.dh = Some(DhWork::new(cid, DhTask::KeyPair(task)));
                        self.step = Step::Negotiated {
                            tid,
                            sc_c,
                            hash,
                            group,
                        };
                        return (Vec::new(), Outcome::After(job));
                    }
                };
                let challenge = match random_bytes(hash.digest_len()) {
                    Ok(c) => c,
                    Err(e) => return self.refuse_now(tid, peers, format!("no random bytes: {e}")),
                };
                let seqnum = next_seqnum();
                let msg = Message::Challenge {
                    tid,
                    hash: hash.id(),
                    dh_group: group.id(),
                    seqnum,
                    challenge: challenge.to_vec(),
                    dh_value: pair.as_ref().map_or(Vec::new(), |p| p.public().to_vec()),
                };
                self.step = Step::Challenged {
                    tid,
                    sc_c,
                    hash,
                    seqnum,
                    challenge,
                    pair,
                };
                (msg.encode(), Outcome::Continue)
            }
            Step::Replied {
                tid,
                hash,
                response,
            } => {
                let bidirectional = response.is_some();
                let msg = Message::Success1 {
                    tid,
                    hl: hash.digest_len() as u8,
                    response: response.map(|r| r.to_vec()),
                };
                if bidirectional {
                    self.step = Step::AwaitingSuccess2 { tid };
                }
                (msg.encode(), Outcome::Continue)
            }
            Step::Failed {
                tid,
                explanation: e,
            } => {
                let why = format!("authentication failed: {}", explanation::describe(e));
                tracing::warn!(host = peers.host_nqn, "{why}");
                (
                    Message::Failure1 {
                        tid,
                        explanation: e,
                    }
                    .encode(),
                    Outcome::Fatal(why),
                )
            }
            other => {
                // Nothing to say in this step: an incorrect message.
                self.step = other;
                let tid = 0xffff;
                (
                    Message::Failure1 {
                        tid,
                        explanation: explanation::INCORRECT_MESSAGE,
                    }
                    .encode(),
                    Outcome::Fatal("AUTH_Receive with no message to send".into()),
                )
            }
        }
    }

    fn refuse_now(&mut self, tid: u16, peers: &Peers, why: String) -> (Vec<u8>, Outcome) {
        tracing::error!(host = peers.host_nqn, "authentication: {why}");
        (
            Message::Failure1 {
                tid,
                explanation: explanation::FAILED,
            }
            .encode(),
            Outcome::Fatal(why),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmablk_common::auth::Secret;

    fn host() -> HostAuth {
        HostAuth {
            nqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001".into(),
            secret: Secret::new(&[7u8; 32], None),
            ctrl_secret: None,
            hashes: vec![Hash::Sha256],
            dh_groups: vec![DhGroup::Ffdhe2048],
        }
    }

    fn peers(h: &HostAuth) -> Peers<'_> {
        Peers {
            host_nqn: &h.nqn,
            subsys_nqn: "nqn.2026-11.io.example:s",
            host: Some(h),
        }
    }

    fn negotiate() -> Vec<u8> {
        Message::Negotiate {
            tid: 1,
            sc_c: 0,
            hashes: vec![Hash::Sha256.id()],
            dh_groups: vec![DhGroup::Ffdhe2048.id()],
        }
        .encode()
    }

    #[test]
    fn the_challenge_waits_for_its_key_pair_and_nothing_else_runs_meanwhile() {
        let h = host();
        let peers = peers(&h);
        let mut a = QueueAuth::default();
        assert!(matches!(
            a.on_send(1, &negotiate(), &peers),
            Outcome::Continue
        ));
        let (msg, outcome) = a.on_receive(2, &peers);
        assert!(msg.is_empty(), "no Challenge before the key pair");
        let Outcome::After(job) = outcome else {
            panic!("the key pair is made off the poller");
        };
        // Another authentication command while command 2 waits ends the
        // controller (a host sends one at a time).
        let (_, other) = a.on_receive(3, &peers);
        assert!(
            matches!(&other, Outcome::Fatal(why) if why.contains("another waits")),
            "{other:?}"
        );
        // Command 2 executes again once its work ran: the Challenge, with
        // the controller's DH value.
        job.run_here();
        let (msg, outcome) = a.on_receive(2, &peers);
        assert!(matches!(outcome, Outcome::Continue), "{outcome:?}");
        let Ok(Message::Challenge { dh_value, .. }) = Message::decode(&msg) else {
            panic!("a Challenge");
        };
        assert_eq!(dh_value.len(), DhGroup::Ffdhe2048.value_len());
    }

    #[test]
    fn work_dropped_by_a_full_offload_queue_fails_the_transaction() {
        let h = host();
        let peers = peers(&h);
        let mut a = QueueAuth::default();
        a.on_send(1, &negotiate(), &peers);
        let (_, outcome) = a.on_receive(2, &peers);
        // The job never runs (the queue was full): executed again, the
        // command gets AUTH_Failure1 and the controller ends.
        drop(outcome);
        let (msg, outcome) = a.on_receive(2, &peers);
        assert!(matches!(outcome, Outcome::Fatal(_)), "{outcome:?}");
        assert!(matches!(
            Message::decode(&msg),
            Ok(Message::Failure1 { .. })
        ));
    }
}

//! Reservations a gateway group shares (`[gateway_group]`): a namespace's
//! registrations, reservation and PTPL live in one attribute of a RADOS
//! object in the group's pool, in the state file's format (PTPL said), and
//! every gateway of the group watches that object.
//!
//! - A Register, Acquire or Release runs on the record's lane (of
//!   [`RECORD_WORKERS`], a few threads every record shares), on the
//!   state read from the cluster just then; the result replaces the
//!   attribute only if it still holds what was read (compare-and-set in one
//!   OSD operation: the version guard). When another gateway changed it
//!   meanwhile, the command runs again on the new state. Then the other
//!   gateways are notified (the new state, the notices, the hosts a Preempt
//!   and Abort aborts) and the command completes once they acknowledged, or
//!   after [`NOTIFY_TIMEOUT`]: from then on every live gateway enforces it.
//! - A gateway notified makes the new state its namespace's and raises the
//!   Reservation Notifications on its own controllers of the hosts
//!   concerned.
//! - A gateway that takes an ANA group reads the records of its namespaces
//!   first ([`Record::refresh`]).

use super::ptpl::{decode, encode, hex, unhex, Identity};
use super::{HostId, Outcome, State};
use crate::backend::rbd::{Pool, Watch};
use crate::backend::Waker;
use crate::base::lanes::{Lane, Workers};
use rdmablk_common::nvme::Status;
use std::sync::Arc;
use std::time::Duration;

/// Threads that run the changes of every shared record (each a few RADOS
/// operations and a notify, bounded by the client's timeouts).
pub static RECORD_WORKERS: Workers = Workers::new("resv-shared", 4);

/// The attribute holding the state.
const ATTR: &str = "rdmablk.reservations";
/// The attribute that makes the object exist (compare-and-set needs it).
const CREATED_ATTR: &str = "rdmablk.created";
/// How long a change waits for the other gateways' acknowledgements.
pub const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the cluster may go without hearing the watch before it drops it.
const WATCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts of a change that other gateways keep changing first.
const ATTEMPTS: usize = 16;

/// The `res` a waiting command gets: 0 done; 1 to [`STATUS`] - 1 done,
/// and a Preempt and Abort aborted that many hosts (the command waits for
/// their writes); `STATUS | (sct << 8) | sc` refused with that status;
/// -errno when the cluster failed.
pub const STATUS: i32 = 0x1_0000;

/// A reservation command's change of the state.
pub type Change = Box<dyn FnMut(&mut State) -> Result<Outcome, Status> + Send>;

/// What a record does with a state it installs: the namespace's
/// reservations take it (with the hosts whose commands it aborts), and the
/// notices go to this gateway's controllers. Holds its namespace weakly:
/// the namespace holds the record.
pub trait Holder: Send + Sync {
    fn install(&self, st: State, aborted: &[HostId]);
    fn notices(&self, notices: &[(HostId, u8)]);
}

/// One namespace's shared record.
pub struct Record {
    pool: Arc<Pool>,
    oid: String,
    identity: Identity,
    /// This gateway process: notifies it sent itself are ignored.
    me: String,
    holder: Arc<dyn Holder>,
    /// Where its changes run, one at a time.
    lane: Lane,
    _watch: Option<Watch>,
}

impl Record {
    /// Opens (making it if missing) the record `oid` in `pool` of namespace
    /// `identity`, installs its state in `holder`, watches it, and starts
    /// its lane. `reset`: a record without PTPL starts empty (the whole
    /// group restarted: its power loss).
    pub fn open(
        pool: &Arc<Pool>,
        oid: String,
        identity: Identity,
        me: String,
        holder: Arc<dyn Holder>,
        reset: bool,
    ) -> std::io::Result<Arc<Record>> {
        pool.set_attr(&oid, CREATED_ATTR, b"1")?;
        let heard = {
            let (holder, identity, me) = (holder.clone(), identity.clone(), me.clone());
            move |payload: &[u8]| heard(payload, &identity, &me, &holder)
        };
        let lost = {
            let oid = oid.clone();
            move |err: i32| {
                tracing::warn!(
                    "shared reservations {oid}: the cluster dropped the watch ({}); changes by other gateways are read before each command only",
                    std::io::Error::from_raw_os_error(-err)
                )
            }
        };
        let watch = pool.watch(&oid, WATCH_TIMEOUT, heard, lost)?;
        let record = Arc::new(Record {
            pool: pool.clone(),
            oid,
            identity,
            me,
            holder,
            lane: Lane::new(&RECORD_WORKERS),
            _watch: Some(watch),
        });
        let st = record.refresh()?;
        if reset && !st.ptpl && st != State::default() {
            tracing::info!(oid = %record.oid, "shared reservations without PTPL: the group restarted, they start empty");
            record.change(&mut |st: &mut State| {
                *st = State::default();
                Ok(Outcome {
                    changed: true,
                    ..Outcome::default()
                })
            });
        }
        Ok(record)
    }

    /// Whether the record is on connection `pool`.
    pub fn on(&self, pool: &Arc<Pool>) -> bool {
        Arc::ptr_eq(&self.pool, pool)
    }

    /// Runs `change` on the record's lane; its end (see [`STATUS`]) goes
    /// to `waker`.
    pub fn submit(self: &Arc<Self>, mut change: Change, waker: Waker) {
        let record = Arc::downgrade(self);
        self.lane.submit(Box::new(move || {
            let (completions, token) = waker;
            let res = match record.upgrade() {
                Some(r) => r.change(&mut change),
                None => -libc::ENODEV,
            };
            completions.push(token, res);
        }));
    }

    /// Reads the record and installs its state; returns it.
    pub fn refresh(&self) -> std::io::Result<State> {
        let (_, st) = self.read()?;
        self.holder.install(st.clone(), &[]);
        Ok(st)
    }

    /// The attribute's bytes and the state they hold (none: empty).
    fn read(&self) -> std::io::Result<(Vec<u8>, State)> {
        let bytes = self.pool.get_attr(&self.oid, ATTR)?.unwrap_or_default();
        if bytes.is_empty() {
            return Ok((bytes, State::default()));
        }
        let st = decode(&self.identity, &String::from_utf8_lossy(&bytes))
            .map_err(|why| std::io::Error::other(format!("record {}: {why}", self.oid)))?;
        Ok((bytes, st))
    }

    /// Applies `change` to the record (see the module's description);
    /// the `res` of [`STATUS`].
    pub fn change(&self, change: &mut dyn FnMut(&mut State) -> Result<Outcome, Status>) -> i32 {
        for _ in 0..ATTEMPTS {
            let (old, mut st) = match self.read() {
                Ok(r) => r,
                Err(e) => return self.failed("reading", &e),
            };
            let out = match change(&mut st) {
                Ok(out) => out,
                Err(s) => return STATUS | (s.sct as i32) << 8 | s.sc as i32,
            };
            if !out.changed {
                return 0;
            }
            let new = encode(&self.identity, &st, true);
            match self
                .pool
                .compare_and_set_attr(&self.oid, ATTR, &old, new.as_bytes())
            {
                Ok(true) => {}
                Ok(false) => continue, // another gateway was first
                Err(e) => return self.failed("writing", &e),
            }
            self.holder.install(st, &out.aborted);
            self.holder.notices(&out.notices);
            let payload = Changed {
                from: self.me.clone(),
                notices: out.notices.clone(),
                aborted: out.aborted.clone(),
                state: new,
            }
            .encode();
            if let Err(e) = self.pool.notify(&self.oid, &payload, NOTIFY_TIMEOUT) {
                tracing::warn!(oid = %self.oid, "shared reservations: not every gateway acknowledged the change: {e}");
            }
            // (At most the registrants of a namespace: far below STATUS.)
            return out.aborted.len().min(STATUS as usize - 1) as i32;
        }
        tracing::error!(oid = %self.oid, "shared reservations: other gateways changed the record first {ATTEMPTS} times in a row");
        -libc::EAGAIN
    }

    fn failed(&self, what: &str, e: &std::io::Error) -> i32 {
        tracing::error!(oid = %self.oid, "shared reservations: {what} the record: {e}");
        -e.raw_os_error().unwrap_or(libc::EIO)
    }
}

/// What a notify carries: who changed the record, the notices and aborts
/// the change calls for, and the new state.
#[derive(Debug, PartialEq)]
struct Changed {
    from: String,
    notices: Vec<(HostId, u8)>,
    aborted: Vec<HostId>,
    state: String,
}

impl Changed {
    /// Lines: `from NAME`, `notice HOST KIND`..., `aborted HOST`..., an
    /// empty line, then the state.
    fn encode(&self) -> Vec<u8> {
        let mut text = format!("from {}\n", self.from);
        for (h, kind) in &self.notices {
            text += &format!("notice {} {kind}\n", hex(h));
        }
        for h in &self.aborted {
            text += &format!("aborted {}\n", hex(h));
        }
        text += "\n";
        text += &self.state;
        text.into_bytes()
    }

    fn decode(payload: &[u8]) -> Option<Changed> {
        let text = std::str::from_utf8(payload).ok()?;
        let (head, state) = text.split_once("\n\n")?;
        let mut c = Changed {
            from: String::new(),
            notices: Vec::new(),
            aborted: Vec::new(),
            state: state.to_string(),
        };
        for line in head.lines() {
            let w: Vec<&str> = line.split(' ').collect();
            match w[..] {
                ["from", name] => c.from = name.to_string(),
                ["notice", h, kind] => c.notices.push((unhex(h).ok()?, kind.parse().ok()?)),
                ["aborted", h] => c.aborted.push(unhex(h).ok()?),
                _ => return None,
            }
        }
        Some(c)
    }
}

/// A notify from another gateway: its state installed, its notices raised.
fn heard(payload: &[u8], identity: &Identity, me: &str, holder: &Arc<dyn Holder>) {
    let Some(c) = Changed::decode(payload) else {
        tracing::warn!(
            "shared reservations: a notify that is not a change ({} bytes)",
            payload.len()
        );
        return;
    };
    if c.from == me {
        return;
    }
    let st = match decode(identity, &c.state) {
        Ok(st) => st,
        Err(why) => {
            tracing::error!(
                "shared reservations: {} sent a state this gateway cannot use: {why}",
                c.from
            );
            return;
        }
    };
    tracing::debug!(from = %c.from, nsid = identity.nsid, "shared reservations changed by another gateway");
    holder.install(st, &c.aborted);
    holder.notices(&c.notices);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_comes_back_from_its_payload() {
        let c = Changed {
            from: "gw-a/1234".into(),
            notices: vec![([1; 16], 2), ([0xab; 16], 3)],
            aborted: vec![([7; 16])],
            state: "format = 1\n\nnsid = 1\n".into(),
        };
        assert_eq!(Changed::decode(&c.encode()), Some(c));
        assert_eq!(Changed::decode(b"from x\nnotice zz 1\n\n"), None);
    }
}

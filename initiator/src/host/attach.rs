//! A namespace reached over one or more paths: an association (a
//! [`Session`]) with a controller of the subsystem per path, each checked
//! to serve the same namespace, and what the front-ends may rely on across
//! all of them.

use super::{HostError, NamespaceInfo, Params, Session};
use rdmablk_common::nvme::identify::NamespaceIdentifiers;

/// A namespace and its paths.
pub struct Attachment {
    /// One association per path, in the order given.
    pub sessions: Vec<Session>,
    pub ns: NamespaceInfo,
    /// What every path reports the namespace as.
    pub ids: NamespaceIdentifiers,
}

impl Attachment {
    /// Connects every path of `paths` (all to the same subsystem) and
    /// checks that namespace `nsid` (by default the first active one of the
    /// first path) is the same on each: the same identifiers (NGUID,
    /// EUI-64, UUID), size and block size. A path that differs, or that
    /// cannot be reached, is refused with the reason.
    pub fn open(paths: &[Params], nsid: Option<u32>) -> Result<Attachment, HostError> {
        let first = Session::connect(&paths[0])?;
        let nsid = match nsid {
            Some(n) => n,
            None => *first.namespaces()?.first().ok_or_else(|| {
                HostError::Protocol(format!("subsystem {} has no namespaces", paths[0].subnqn))
            })?,
        };
        let ns = first.namespace(nsid)?;
        let ids = first.namespace_ids(nsid)?;
        let mut sessions = vec![first];
        for p in &paths[1..] {
            let path = |e: HostError| HostError::Protocol(format!("path {}: {e}", p.addr));
            let s = Session::connect(p).map_err(path)?;
            let other = s.namespace(nsid).map_err(path)?;
            let other_ids = s.namespace_ids(nsid).map_err(path)?;
            if let Some(why) = difference(&ns, &ids, &other, &other_ids) {
                return Err(HostError::Protocol(format!(
                    "path {} does not serve the namespace of {}: {why}",
                    p.addr, paths[0].addr
                )));
            }
            sessions.push(s);
        }
        if sessions.len() > 1 && !ids.any() {
            return Err(HostError::Protocol(format!(
                "namespace {nsid} reports no NGUID, EUI-64 or UUID: its paths cannot be \
                 told to lead to the same namespace"
            )));
        }
        Ok(Attachment { sessions, ns, ids })
    }

    /// The subsystem's NQN.
    pub fn subnqn(&self) -> &str {
        &self.sessions[0].params().subnqn
    }

    /// I/O queues every path granted.
    pub fn io_queues(&self) -> u16 {
        self.sessions.iter().map(|s| s.io_queues).min().unwrap_or(1)
    }

    /// I/O queue entries every path allows.
    pub fn queue_size(&self) -> u16 {
        self.sessions
            .iter()
            .map(|s| s.queue_size)
            .min()
            .unwrap_or(2)
    }

    /// The largest transfer every path takes in one command.
    pub fn max_transfer(&self) -> usize {
        self.sessions
            .iter()
            .map(Session::max_transfer)
            .min()
            .unwrap_or(4096)
    }

    /// The optional NVM commands every path supports (ONCS).
    pub fn oncs(&self) -> u16 {
        self.sessions.iter().fold(u16::MAX, |a, s| a & s.ctrl.oncs)
    }
}

/// How namespace `b` (`b_ids`) differs from `a` (`a_ids`), if it does.
pub fn difference(
    a: &NamespaceInfo,
    a_ids: &NamespaceIdentifiers,
    b: &NamespaceInfo,
    b_ids: &NamespaceIdentifiers,
) -> Option<String> {
    if a_ids != b_ids {
        return Some(format!("its identifiers are {b_ids:?}, not {a_ids:?}"));
    }
    if (a.blocks, a.block_size) != (b.blocks, b.block_size) {
        return Some(format!(
            "it has {} blocks of {} bytes, not {} of {}",
            b.blocks, b.block_size, a.blocks, a.block_size
        ));
    }
    None
}

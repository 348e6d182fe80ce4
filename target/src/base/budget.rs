//! Budgets of arena space. Every data buffer a queue takes from its
//! poller's arena goes through the queue's [`Ledger`], which keeps it within
//! three budgets: the queue's own (`limits.queue_buffer`), its
//! association's across all pollers (`limits.association_buffer`), and, for
//! discovery queues, what the discovery queues of the poller hold together
//! (`limits.discovery_buffer`). A command over budget waits for the queue's
//! own buffers to come back; other queues keep theirs. In-capsule data that
//! arrives while its queue has no buffer is staged off the arena, within a
//! poller-wide bound ([`STAGED_LIMIT`]).

use crate::base::admission::Gauge;
use rdmablk_common::mem::{capacity_for, Arena, ArenaBuf};
use std::sync::Arc;

/// In-capsule data (at most 8 KiB a command) all queues of a poller may
/// hold staged while waiting for arena buffers; past it a queue stops
/// reading its socket until buffers come back, unless data it waits for
/// may be behind (see [`Ledger::stage`]).
pub const STAGED_LIMIT: usize = 8 << 20;
/// Staged data a poller holds at most, even for queues that must not stop
/// reading: past it their in-capsule commands are refused with a status
/// the host retries.
pub const STAGED_HARD_LIMIT: usize = 4 * STAGED_LIMIT;

/// What became of in-capsule data that has no buffer yet.
#[derive(Debug)]
pub enum Staged {
    /// A copy, held until the command gets its buffer.
    Copy(Vec<u8>),
    /// No room: leave the capsule in the socket for now.
    Stall,
    /// No room, and the stream must go on: refuse the command.
    Refuse,
}

/// What the queues of one poller hold together.
#[derive(Debug, Default)]
pub struct PollerBudget {
    /// Arena bytes of discovery queues, and their limit.
    held: usize,
    limit: usize,
    /// Bytes of in-capsule data staged off the arena.
    staged: usize,
}

impl PollerBudget {
    /// A poller whose discovery queues may hold `discovery_limit` bytes.
    pub fn new(discovery_limit: usize) -> PollerBudget {
        PollerBudget {
            held: 0,
            limit: discovery_limit,
            staged: 0,
        }
    }
}

/// The arena space one queue holds, and its budgets.
#[derive(Debug)]
pub struct Ledger {
    held: usize,
    limit: usize,
    association: Option<(Arc<Gauge>, usize)>,
    discovery: bool,
}

impl Ledger {
    /// A queue that may hold `limit` bytes.
    pub fn new(limit: usize) -> Ledger {
        Ledger {
            held: 0,
            limit,
            association: None,
            discovery: false,
        }
    }

    /// Bytes held now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held
    }

    /// Joins an association (whose `gauge` may reach `limit` bytes), of the
    /// discovery subsystem or not; what the queue holds already counts there.
    pub fn associate(
        &mut self,
        gauge: Arc<Gauge>,
        queue_limit: usize,
        limit: usize,
        discovery: bool,
        pool: &mut PollerBudget,
    ) {
        self.dissociate(pool);
        gauge.add(self.held);
        self.association = Some((gauge, limit));
        self.limit = queue_limit;
        self.discovery = discovery;
        if discovery {
            pool.held += self.held;
        }
    }

    /// Leaves the association (a Disconnect): what the queue still holds
    /// no longer counts there.
    pub fn dissociate(&mut self, pool: &mut PollerBudget) {
        if let Some((g, _)) = self.association.take() {
            g.sub(self.held);
        }
        if std::mem::take(&mut self.discovery) {
            pool.held -= self.held;
        }
    }

    /// A buffer of `len` bytes if every budget has room and the arena has
    /// the space; `None` means wait for buffers to come back.
    pub fn alloc(
        &mut self,
        len: usize,
        arena: &mut Arena,
        pool: &mut PollerBudget,
    ) -> Option<ArenaBuf> {
        let cap = capacity_for(len);
        if self.held + cap > self.limit {
            return None;
        }
        if self.discovery && pool.held + cap > pool.limit {
            return None;
        }
        if let Some((g, limit)) = &self.association {
            if !g.try_add(cap, *limit) {
                return None;
            }
        }
        let Some(buf) = arena.alloc(len) else {
            if let Some((g, _)) = &self.association {
                g.sub(cap);
            }
            return None;
        };
        self.charge(cap, pool);
        Some(buf)
    }

    /// Takes over a buffer allocated elsewhere (an RDMA receive's in-capsule
    /// data), charged whatever the budgets say: its data has arrived.
    pub fn adopt(&mut self, buf: &ArenaBuf, pool: &mut PollerBudget) {
        if let Some((g, _)) = &self.association {
            g.add(buf.capacity());
        }
        self.charge(buf.capacity(), pool);
    }

    /// A copy of in-capsule data for a command that has no buffer yet, if
    /// the poller's [`STAGED_LIMIT`] allows. `must` says the queue has
    /// commands holding buffers whose data may follow in the stream:
    /// stopping would keep it from them, so such data is staged up to
    /// [`STAGED_HARD_LIMIT`] and refused beyond.
    pub fn stage(&mut self, data: &[u8], must: bool, pool: &mut PollerBudget) -> Staged {
        let limit = if must {
            STAGED_HARD_LIMIT
        } else {
            STAGED_LIMIT
        };
        if pool.staged + data.len() > limit {
            return if must { Staged::Refuse } else { Staged::Stall };
        }
        pool.staged += data.len();
        Staged::Copy(data.to_vec())
    }

    /// Gives back staged data (copied into its buffer, or dropped).
    pub fn unstage(&mut self, staged: Vec<u8>, pool: &mut PollerBudget) {
        pool.staged -= staged.len();
    }

    fn charge(&mut self, cap: usize, pool: &mut PollerBudget) {
        self.held += cap;
        if self.discovery {
            pool.held += cap;
        }
    }

    /// Gives a buffer back to the arena.
    pub fn free(&mut self, buf: ArenaBuf, arena: &mut Arena, pool: &mut PollerBudget) {
        let cap = buf.capacity();
        self.held -= cap;
        if let Some((g, _)) = &self.association {
            g.sub(cap);
        }
        if self.discovery {
            pool.held -= cap;
        }
        arena.free(buf);
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        debug_assert_eq!(self.held, 0, "a queue went with arena buffers charged");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_stays_within_its_budget_and_others_keep_theirs() {
        let mut arena = Arena::new(16 << 20, false).unwrap();
        let mut pool = PollerBudget::new(1 << 20);
        let mut greedy = Ledger::new(2 << 20);
        let mut other = Ledger::new(2 << 20);
        let a = greedy.alloc(1 << 20, &mut arena, &mut pool).unwrap();
        let b = greedy.alloc(1 << 20, &mut arena, &mut pool).unwrap();
        assert!(greedy.alloc(4096, &mut arena, &mut pool).is_none());
        let c = other.alloc(1 << 20, &mut arena, &mut pool).unwrap();
        for buf in [a, b] {
            greedy.free(buf, &mut arena, &mut pool);
        }
        other.free(c, &mut arena, &mut pool);
        assert_eq!(arena.buffers_in_use(), 0);
        assert_eq!(greedy.held(), 0);
    }

    #[test]
    fn association_and_discovery_budgets_are_shared() {
        let mut arena = Arena::new(16 << 20, false).unwrap();
        let mut pool = PollerBudget::new(512 << 10);
        let assoc = Arc::new(Gauge::default());
        let mut q1 = Ledger::new(4 << 20);
        let mut q2 = Ledger::new(4 << 20);
        // Held before the association (the Connect data) moves in with it.
        let connect = q1.alloc(1024, &mut arena, &mut pool).unwrap();
        q1.associate(assoc.clone(), 4 << 20, 1 << 20, true, &mut pool);
        q2.associate(assoc.clone(), 4 << 20, 1 << 20, true, &mut pool);
        assert_eq!(assoc.get(), 4096);
        let big = q2.alloc(256 << 10, &mut arena, &mut pool).unwrap();
        // The discovery pool (512 KiB) has 252 KiB left: no room for 256 KiB.
        assert!(q1.alloc(256 << 10, &mut arena, &mut pool).is_none());
        assert_eq!(
            assoc.get(),
            4096 + (256 << 10),
            "a refused alloc takes nothing"
        );
        q2.free(big, &mut arena, &mut pool);
        // A Disconnect with the Connect's buffer still held: it leaves the
        // association's count, which a new association does not double.
        q1.dissociate(&mut pool);
        assert_eq!((assoc.get(), pool.held), (0, 0));
        q1.associate(assoc.clone(), 4 << 20, 1 << 20, false, &mut pool);
        assert_eq!(assoc.get(), 4096);
        q1.free(connect, &mut arena, &mut pool);
        assert_eq!(assoc.get(), 0);
        assert_eq!(pool.held, 0);
    }

    #[test]
    fn staged_data_is_bounded_per_poller() {
        let mut pool = PollerBudget::new(1 << 20);
        let mut q = Ledger::new(4 << 20);
        let chunk = vec![7u8; 8192];
        let copy = |s| match s {
            Staged::Copy(d) => Some(d),
            _ => None,
        };
        let staged: Vec<_> =
            std::iter::from_fn(|| copy(q.stage(&chunk, false, &mut pool))).collect();
        assert_eq!(staged.len(), STAGED_LIMIT / 8192);
        assert!(matches!(q.stage(&chunk, false, &mut pool), Staged::Stall));
        let forced: Vec<_> =
            std::iter::from_fn(|| copy(q.stage(&chunk, true, &mut pool))).collect();
        assert_eq!(forced.len(), (STAGED_HARD_LIMIT - STAGED_LIMIT) / 8192);
        assert!(matches!(q.stage(&chunk, true, &mut pool), Staged::Refuse));
        for s in staged.into_iter().chain(forced) {
            q.unstage(s, &mut pool);
        }
        assert_eq!(pool.staged, 0);
    }
}

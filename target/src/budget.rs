//! Budgets of arena space. Every data buffer a queue takes from its
//! poller's arena goes through the queue's [`Ledger`], which keeps it within
//! three budgets: the queue's own (`limits.queue_buffer`), its
//! association's across all pollers (`limits.association_buffer`), and, for
//! discovery queues, what the discovery queues of the poller hold together
//! (`limits.discovery_buffer`). A command over budget waits for the queue's
//! own buffers to come back; other queues keep theirs.

use crate::admission::Gauge;
use rdmablk_common::mem::{capacity_for, Arena, ArenaBuf};
use std::sync::Arc;

/// What the discovery queues of one poller hold.
#[derive(Debug, Default)]
pub struct DiscoveryPool {
    held: usize,
    limit: usize,
}

impl DiscoveryPool {
    pub fn new(limit: usize) -> DiscoveryPool {
        DiscoveryPool { held: 0, limit }
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
        limit: usize,
        discovery: bool,
        pool: &mut DiscoveryPool,
    ) {
        gauge.add(self.held);
        self.association = Some((gauge, limit));
        self.discovery = discovery;
        if discovery {
            pool.held += self.held;
        }
    }

    /// A buffer of `len` bytes if every budget has room and the arena has
    /// the space; `None` means wait for buffers to come back.
    pub fn alloc(
        &mut self,
        len: usize,
        arena: &mut Arena,
        pool: &mut DiscoveryPool,
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
    pub fn adopt(&mut self, buf: &ArenaBuf, pool: &mut DiscoveryPool) {
        if let Some((g, _)) = &self.association {
            g.add(buf.capacity());
        }
        self.charge(buf.capacity(), pool);
    }

    fn charge(&mut self, cap: usize, pool: &mut DiscoveryPool) {
        self.held += cap;
        if self.discovery {
            pool.held += cap;
        }
    }

    /// Gives a buffer back to the arena.
    pub fn free(&mut self, buf: ArenaBuf, arena: &mut Arena, pool: &mut DiscoveryPool) {
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
        let mut pool = DiscoveryPool::new(1 << 20);
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
        let mut pool = DiscoveryPool::new(512 << 10);
        let assoc = Arc::new(Gauge::default());
        let mut q1 = Ledger::new(4 << 20);
        let mut q2 = Ledger::new(4 << 20);
        // Held before the association (the Connect data) moves in with it.
        let connect = q1.alloc(1024, &mut arena, &mut pool).unwrap();
        q1.associate(assoc.clone(), 1 << 20, true, &mut pool);
        q2.associate(assoc.clone(), 1 << 20, true, &mut pool);
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
        q1.free(connect, &mut arena, &mut pool);
        assert_eq!(assoc.get(), 0);
        assert_eq!(pool.held, 0);
    }
}

//! The per-poller engine: poller threads, each with its io_uring and arena
//! (`poller`); the queue state machine every transport drives through its
//! `Wire` (`queue`); a queue's binding to its association and budgets
//! (`binding`); which queues a poller pumps in a round (`ready`). It names
//! no transport: the application hands each poller its transports'
//! endpoints.

pub mod binding;
pub mod poller;
pub mod queue;
pub mod ready;

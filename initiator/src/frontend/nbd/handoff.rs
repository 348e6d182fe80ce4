//! What the greeter hands to the engines: a client that finished its
//! handshake, with its place among the export's clients.

use super::handshake::Negotiated;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A place among the export's clients, given back when dropped.
pub struct Seat(Arc<AtomicUsize>);

impl Seat {
    /// Takes a place among `clients`; returns it and how many places are
    /// taken now, this one included.
    pub fn claim(clients: &Arc<AtomicUsize>) -> (Seat, usize) {
        let seated = clients.fetch_add(1, Ordering::AcqRel) + 1;
        (Seat(clients.clone()), seated)
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A new client that finished its handshake.
pub struct NewClient {
    /// Its socket, blocking.
    pub fd: OwnedFd,
    /// What its handshake settled.
    pub negotiated: Negotiated,
    /// Its address, for the log.
    pub peer: String,
    /// Its place among the export's clients, held until it is freed.
    pub seat: Seat,
}

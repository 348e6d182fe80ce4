//! One NVMe/TCP byte stream, for both ends of a connection: the socket, the
//! PDUs received (framing, digests, and data PDUs placed straight into their
//! command's memory: C2HData into the host's buffers, H2CData into the
//! target's arena) and the PDUs queued for sending (data sent from where it
//! lies). The caller's io_uring does the I/O: the stream builds each receive
//! and send and takes its result.
//!
//! The record layer's seam: bytes cross between the socket and the PDUs only
//! in [`Stream::recv_entry`] / [`Stream::received`] and
//! [`Stream::send_entry`] / [`Stream::sent`]. A record layer (TLS) sits
//! there, under the PDUs, without either side's PDU handling knowing.

mod buffers;
mod inbound;
mod outbound;

pub use buffers::{RxBuf, TxQueue};
pub use inbound::{Flow, Inbound, InboundLimits, Placed, Receiver, Role, Stop};
pub use outbound::Outbound;

use io_uring::{opcode, squeue, types};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;

/// The socket of a connection with what it receives and what it sends.
pub struct Stream {
    sock: TcpStream,
    /// PDUs arriving; taken out (`std::mem::take`) while they are handled,
    /// so that handling may queue PDUs on [`Stream::outbound`].
    pub inbound: Inbound,
    pub outbound: Outbound,
}

/// What one receive brought.
#[derive(Debug)]
pub enum Received {
    /// Bytes arrived (into the receive buffer or a data PDU's place).
    Bytes,
    /// The peer closed the connection.
    Closed,
    /// The receive failed.
    Failed(std::io::Error),
}

impl Stream {
    /// The stream of `sock`, receiving as `inbound` says.
    pub fn new(sock: TcpStream, inbound: Inbound) -> Stream {
        Stream {
            sock,
            inbound,
            outbound: Outbound::default(),
        }
    }

    /// The socket (for its addresses and options).
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Shuts the socket down both ways, so that its operations in flight end.
    pub fn shutdown(&self) {
        let _ = self.sock.shutdown(Shutdown::Both);
    }

    /// The receive to post next, with `user_data`: into the data PDU being
    /// placed, else into the receive buffer's free room. `None` while one is
    /// in flight, or when the buffer is full of a PDU that waits for room
    /// elsewhere (the caller posts again once it is handled).
    ///
    /// Pushing the entry is the caller's: it keeps the stream where it is
    /// until the receive completes and hands its result to
    /// [`Stream::received`]; the place of a data PDU stays valid as
    /// [`Receiver::place`] promised.
    pub fn recv_entry(&mut self, user_data: u64) -> Option<squeue::Entry> {
        let (ptr, len) = self.inbound.next_recv()?;
        Some(
            opcode::Recv::new(types::Fd(self.sock.as_raw_fd()), ptr, len as u32)
                .build()
                .user_data(user_data),
        )
    }

    /// Takes the result of the receive [`Stream::recv_entry`] built.
    pub fn received(&mut self, res: i32) -> Received {
        self.inbound.received(res)
    }

    /// The send to post next, with `user_data`: one `sendmsg` over the queued
    /// PDUs. `None` while one is in flight or when nothing is queued.
    ///
    /// Pushing the entry is the caller's: it keeps the stream where it is
    /// and the queued payloads unchanged until the send completes and its
    /// result goes to [`Stream::sent`] (see [`Outbound::push_with_body`]).
    pub fn send_entry(&mut self, user_data: u64) -> Option<squeue::Entry> {
        let msg = self.outbound.next_send()?;
        Some(
            opcode::SendMsg::new(types::Fd(self.sock.as_raw_fd()), msg)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build()
                .user_data(user_data),
        )
    }

    /// Takes the result of the send [`Stream::send_entry`] built: the tokens
    /// of the PDUs now wholly sent are appended to `done`.
    pub fn sent(&mut self, res: i32, done: &mut Vec<u64>) -> std::io::Result<usize> {
        self.outbound.sent(res, done)
    }

    /// Whether a receive or a send is in flight.
    pub fn busy(&self) -> bool {
        self.inbound.busy() || self.outbound.busy()
    }
}

#[cfg(test)]
mod tests;

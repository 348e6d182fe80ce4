//! One NVMe/TCP byte stream, for both ends of a connection: the socket, the
//! PDUs received (framing, digests, and data PDUs placed straight into their
//! command's memory: C2HData into the host's buffers, H2CData into the
//! target's arena) and the PDUs queued for sending (data sent from where it
//! lies). The caller's io_uring does the I/O: the stream builds each receive
//! and send and takes its result.
//!
//! The record layer's seam: bytes cross between the socket and the PDUs only
//! in [`Stream::recv_entry`] / [`Stream::received`] and
//! [`Stream::send_entry`] / [`Stream::sent`]. TLS in user space
//! ([`Records`]) sits there, under the PDUs, without either
//! side's PDU handling knowing; with kernel TLS the socket itself carries
//! plaintext and the stream is as without TLS.

mod buffers;
mod inbound;
mod outbound;
mod records;

pub use buffers::{RxBuf, TxQueue};
pub use inbound::{Flow, Inbound, InboundLimits, Placed, Receiver, Role, Stop};
pub use outbound::Outbound;
pub use records::{Records, RecvKind};

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
    /// The TLS record layer, when the connection encrypts in user space.
    tls: Option<Box<Records>>,
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
            tls: None,
        }
    }

    /// The stream of `sock`, whose TLS records `tls` encrypts and decrypts.
    pub fn with_tls(sock: TcpStream, inbound: Inbound, tls: Option<Box<Records>>) -> Stream {
        Stream {
            tls,
            ..Stream::new(sock, inbound)
        }
    }

    /// The TLS cipher suite, when the stream encrypts in user space.
    pub fn tls_cipher(&self) -> Option<&str> {
        self.tls.as_deref().map(Records::cipher)
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
        if let Some(tls) = &mut self.tls {
            let entry = match tls.next_recv(&mut self.inbound)? {
                (RecvKind::Socket, ptr, len) => {
                    opcode::Recv::new(types::Fd(self.sock.as_raw_fd()), ptr, len as u32).build()
                }
                (RecvKind::Buffered, ..) => opcode::Nop::new().build(),
            };
            return Some(entry.user_data(user_data));
        }
        let (ptr, len) = self.inbound.next_recv()?;
        Some(
            opcode::Recv::new(types::Fd(self.sock.as_raw_fd()), ptr, len as u32)
                .build()
                .user_data(user_data),
        )
    }

    /// Takes the result of the receive [`Stream::recv_entry`] built.
    pub fn received(&mut self, res: i32) -> Received {
        match &mut self.tls {
            Some(tls) => tls.received(res, &mut self.inbound),
            None => self.inbound.received(res),
        }
    }

    /// The send to post next, with `user_data`: one `sendmsg` over the queued
    /// PDUs. `None` while one is in flight or when nothing is queued.
    ///
    /// Pushing the entry is the caller's: it keeps the stream where it is
    /// and the queued payloads unchanged until the send completes and its
    /// result goes to [`Stream::sent`] (see [`Outbound::push_with_body`]).
    pub fn send_entry(&mut self, user_data: u64) -> Option<squeue::Entry> {
        if let Some(tls) = &mut self.tls {
            let (ptr, len) = tls.next_send(&mut self.outbound)?;
            return Some(
                opcode::Send::new(types::Fd(self.sock.as_raw_fd()), ptr, len as u32)
                    .flags(libc::MSG_NOSIGNAL)
                    .build()
                    .user_data(user_data),
            );
        }
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
        match &mut self.tls {
            Some(tls) => tls.sent(res, &mut self.outbound, done),
            None => self.outbound.sent(res, done),
        }
    }

    /// Whether a receive is in flight.
    pub fn receiving(&self) -> bool {
        self.inbound.busy() || self.tls.as_ref().is_some_and(|t| t.busy().0)
    }

    /// Whether a send is in flight.
    pub fn sending(&self) -> bool {
        self.outbound.busy() || self.tls.as_ref().is_some_and(|t| t.busy().1)
    }

    /// Whether a receive in flight writes into a data PDU's place (with
    /// TLS, receives write into the stream's own buffer).
    pub fn receiving_in_place(&self) -> bool {
        self.inbound.busy_in_place()
    }

    /// Whether the stream waits only for its peer: a receive in flight,
    /// nothing received left to handle, nothing queued that no send in
    /// flight carries.
    pub fn quiet(&self) -> bool {
        self.receiving()
            && self.inbound.pending().is_empty()
            && (self.sending() || self.outbound.is_empty())
    }

    /// Whether a receive or a send is in flight.
    pub fn busy(&self) -> bool {
        self.receiving() || self.sending()
    }
}

#[cfg(test)]
mod tests;

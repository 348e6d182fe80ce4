//! The sending half of a stream: PDUs queued in order, data PDUs sent from
//! the memory their command owns, one `sendmsg` in flight at a time.

use super::buffers::TxQueue;
use crate::tcp::{self, Digests, Header, Transfer};

/// PDUs queued for sending, and whether a send is in flight.
#[derive(Default)]
pub struct Outbound {
    tx: TxQueue,
    busy: bool,
}

impl Outbound {
    /// Queues a PDU with its data (none, or a TermReq's copy of a header)
    /// encoded into it; `token` comes back from [`super::Stream::sent`] once
    /// it is on the wire.
    pub fn push(&mut self, h: &Header, data: &[u8], digests: Digests, token: Option<u64>) {
        let mut head = self.tx.buf();
        tcp::encode_into(&mut head, h, 0, data, digests, 1);
        self.tx.push(head, token);
    }

    /// Queues a PDU whose `len` bytes of data are sent from `body`, where
    /// they lie; `digest` computes their data digest when the connection
    /// has one. `align` is the data alignment the peer asked for, in bytes.
    ///
    /// The caller keeps the bytes at `body` alive and unchanged until
    /// `token`, or that of a later PDU, comes back from
    /// [`super::Stream::sent`]: the send it posts reads them.
    #[allow(clippy::too_many_arguments)]
    pub fn push_with_body(
        &mut self,
        h: &Header,
        flags: u8,
        body: *const u8,
        len: usize,
        digests: Digests,
        align: usize,
        digest: impl FnOnce() -> u32,
        token: Option<u64>,
    ) {
        let mut head = self.tx.buf();
        tcp::encode_header(&mut head, h, flags, len, digests, align);
        let digest = digests.data.then(|| digest().to_le_bytes());
        self.tx.push_with_body(head, body, len, digest, token);
    }

    /// Queues the data of a transfer as data PDUs (`data`: H2CData or
    /// C2HData) of at most `max` bytes each, sent from `body` (the
    /// transfer's first byte). `digest_of(at, n)` computes the data digest
    /// of `n` bytes at offset `at`; `last_flags` (SUCCESS) go on the last
    /// PDU, and so does `token`. Returns the number of PDUs queued.
    ///
    /// The caller keeps the transfer's bytes as [`Outbound::push_with_body`]
    /// says, until `token` comes back.
    #[allow(clippy::too_many_arguments)]
    pub fn push_transfer(
        &mut self,
        data: fn(Transfer) -> Header,
        all: Transfer,
        max: usize,
        body: *const u8,
        digests: Digests,
        align: usize,
        mut digest_of: impl FnMut(usize, usize) -> u32,
        last_flags: u8,
        token: Option<u64>,
    ) -> usize {
        let mut pdus = 0;
        for (t, fl) in tcp::split_transfer(all, max) {
            let (at, n) = ((t.offset - all.offset) as usize, t.len as usize);
            let last = fl & tcp::flags::LAST_PDU != 0;
            let fl = if last { fl | last_flags } else { fl };
            self.push_with_body(
                &data(t),
                fl,
                body.wrapping_add(at),
                n,
                digests,
                align,
                || digest_of(at, n),
                token.filter(|_| last),
            );
            pdus += 1;
        }
        pdus
    }

    /// Whether no PDU waits to be sent (one may still be in flight).
    pub fn is_empty(&self) -> bool {
        self.tx.is_empty()
    }

    /// Whether a send is in flight.
    pub fn busy(&self) -> bool {
        self.busy
    }

    /// No PDU left to send and no send in flight.
    pub fn drained(&self) -> bool {
        self.tx.is_empty() && !self.busy
    }

    /// The message of the next send, marking it in flight.
    pub(crate) fn next_send(&mut self) -> Option<*const libc::msghdr> {
        if self.busy || self.tx.is_empty() {
            return None;
        }
        self.busy = true;
        Some(self.tx.message())
    }

    /// A send ended with `res`: the tokens of the PDUs now wholly sent go
    /// to `done`. Returns the bytes sent.
    pub(crate) fn sent(&mut self, res: i32, done: &mut Vec<u64>) -> std::io::Result<usize> {
        self.busy = false;
        if res < 0 {
            return Err(std::io::Error::from_raw_os_error(-res));
        }
        self.tx.advance(res as usize, done);
        Ok(res as usize)
    }
}

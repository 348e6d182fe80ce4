//! The PDUs a connection receives, as its stream hands them over: the
//! handshake, command capsules, H2CData (the stream places the data where
//! `TcpWire::check_h2c` says, in the command's arena buffer), and protocol
//! errors, which end the connection with a C2HTermReq.

use super::connection::TcpQueue;
use super::wire::{fatal, Fatal, TcpWire};
use super::{Phase, MAX_H2C_DATA};
use crate::engine::poller::Io;
use crate::engine::queue::{InCapsule, Intake};
use rdmablk_common::nvme::Sqe;
use rdmablk_common::tcp::stream::{Flow, Placed, Receiver, Stop};
use rdmablk_common::tcp::{self, fes, Digests, Header, Transfer};
use rdmablk_common::tls::handshake;
use std::time::Instant;

/// A connection handling the PDUs its stream received.
struct Receiving<'a, 'io> {
    c: &'a mut TcpQueue,
    io: &'a mut Io<'io>,
}

// SAFETY: `place` gives the part of a command's arena buffer that an R2T
// asked the host for (`TcpWire::check_h2c`), which nothing else touches
// until that data arrives: the command cannot complete, and so keep or free
// its buffer, before `placed` records it, and a closed connection is torn
// down only once no receive of its stream is in flight.
unsafe impl Receiver for Receiving<'_, '_> {
    type Error = Fatal;

    fn digests(&self) -> Digests {
        match self.c.w.phase {
            Phase::Handshake => Digests::default(),
            _ => self.c.w.digests,
        }
    }

    fn receiving(&self) -> bool {
        matches!(self.c.w.phase, Phase::Handshake | Phase::Live)
    }

    fn place(&mut self, t: &Transfer, len: usize) -> Result<*mut u8, Fatal> {
        if self.c.w.phase != Phase::Live {
            return Err(fatal(fes::INVALID_HEADER_FIELD, 0, "expected ICReq first"));
        }
        TcpWire::check_h2c(&self.c.q, *t, len, self.io)
    }

    fn placed(&mut self, p: Placed) -> Result<(), Fatal> {
        let t = p.transfer;
        let end = t.offset as usize + t.len as usize;
        self.c
            .q
            .data_arrived(t.ttag, end, p.digest_ok, self.io, &mut self.c.w);
        Ok(())
    }

    fn pdu(&mut self, pdu: &tcp::Pdu<'_>) -> Result<Flow, Fatal> {
        self.c.handle_pdu(pdu, self.io)
    }
}

impl TcpQueue {
    /// Handles the PDUs the stream received, as far as they can go now.
    pub(super) fn process_rx(&mut self, io: &mut Io) {
        // Take the PDUs out so that they can be handled while `self` changes.
        let mut inbound = std::mem::take(&mut self.w.stream.inbound);
        if let Err(stop) = inbound.process(&mut Receiving { c: self, io }) {
            let first = inbound.pending().first().copied();
            if self.w.phase == Phase::Handshake && first.is_some_and(handshake::starts_tls) {
                // A TermReq would mean nothing to a TLS client.
                let why = "the host opened TLS (a ClientHello) on a listener without it; \
                           set tls = \"required\" or \"optional\" on the listener, or connect without TLS";
                if let Some(more) = io.registry.admission.refusals.allow() {
                    tracing::warn!(peer = %self.q.peer, suppressed = more, "connection closed: {why}");
                }
                self.close(why);
                self.w.stream.inbound = inbound;
                return;
            }
            let f = match stop {
                Stop::Malformed(e) => Fatal::from(e),
                Stop::Refused(f) => f,
            };
            let pending = inbound.pending();
            self.terminate(f, &pending[..pending.len().min(tcp::TERM_REQ_MAX_DATA)]);
        }
        self.w.stream.inbound = inbound;
    }

    /// Sends a C2HTermReq carrying the offending header and ends the connection.
    fn terminate(&mut self, f: Fatal, bad_header: &[u8]) {
        tracing::warn!(peer = %self.q.peer, fes = f.fes, fei = f.fei, "protocol error: {}; sending C2HTermReq", f.why);
        let h = Header::TermReq {
            from_host: false,
            fes: f.fes,
            fei: f.fei,
        };
        self.w
            .stream
            .outbound
            .push(&h, bad_header, self.w.digests, None);
        self.w.phase = Phase::Terminating;
        self.w.since = Instant::now();
    }

    fn handle_pdu(&mut self, pdu: &tcp::Pdu<'_>, io: &mut Io) -> Result<Flow, Fatal> {
        match (self.w.phase, pdu.header) {
            (
                Phase::Handshake,
                Header::IcReq {
                    pfv, hpda, digests, ..
                },
            ) => {
                if pfv != 0 {
                    return Err(fatal(
                        fes::UNSUPPORTED_PARAMETER,
                        8,
                        format!("PDU format version {pfv}"),
                    ));
                }
                if hpda > 31 {
                    return Err(fatal(
                        fes::INVALID_HEADER_FIELD,
                        10,
                        format!("HPDA {hpda} is above 31"),
                    ));
                }
                self.w.digests = digests;
                self.w.c2h_align = (hpda as usize + 1) * 4;
                let resp = Header::IcResp {
                    pfv: 0,
                    cpda: 0,
                    digests,
                    maxh2cdata: MAX_H2C_DATA as u32,
                };
                self.w.push_pdu(&resp, None);
                self.w.phase = Phase::Live;
                self.silent = None; // it spoke: a newcomer cannot push it out

                tracing::debug!(peer = %self.q.peer, ?digests, hpda, "NVMe/TCP connection initialized");
                Ok(Flow::Consumed)
            }
            (Phase::Handshake, _) => {
                Err(fatal(fes::INVALID_HEADER_FIELD, 0, "expected ICReq first"))
            }
            // While the daemon drains, capsules that still arrive are served
            // too: the connection closes at its first idle moment.
            (Phase::Live, Header::CapsuleCmd(sqe)) => {
                Ok(self.handle_capsule(&sqe, pdu.data, pdu.data_digest_ok, io))
            }
            (_, Header::TermReq { fes, fei, .. }) => {
                tracing::warn!(peer = %self.q.peer, fes, fei, "host terminated the connection (H2CTermReq)");
                self.close("host sent H2CTermReq");
                Ok(Flow::Consumed)
            }
            (_, h) => Err(fatal(
                fes::INVALID_HEADER_FIELD,
                0,
                format!(
                    "PDU type {:#04x} is not one a host sends here",
                    h.pdu_type()
                ),
            )),
        }
    }

    fn handle_capsule(&mut self, sqe: &Sqe, data: &[u8], digest_ok: bool, io: &mut Io) -> Flow {
        let data = InCapsule::Bytes { data, digest_ok };
        match self.q.receive(sqe, data, io, &mut self.w) {
            Intake::Taken => Flow::Consumed,
            // Left in the socket until buffers or responses go.
            Intake::Stall => Flow::Stall,
            Intake::Overrun => {
                self.close("the host sent more commands than its queue holds");
                Flow::Consumed
            }
        }
    }
}

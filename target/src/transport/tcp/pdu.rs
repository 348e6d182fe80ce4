//! The PDUs a connection receives: the handshake, command capsules, H2CData
//! (large payloads straight into their command's buffer), and protocol
//! errors, which end the connection with a C2HTermReq.

use super::connection::TcpQueue;
use super::wire::{fatal, Direct, Fatal, TcpWire};
use super::{Phase, IN_CAPSULE_DATA, MAX_H2C_DATA};
use crate::engine::poller::Io;
use crate::engine::queue::{InCapsule, Intake};
use rdmablk_common::nvme::Sqe;
use rdmablk_common::tcp::stream::RxBuf;
use rdmablk_common::tcp::{self, fes, Digests, Header};
use std::time::Instant;

/// Largest PDU accepted: an H2CData PDU with digests and the most padding
/// (whose data goes straight to its command's buffer, see `DIRECT_MIN`).
const MAX_PDU: usize = MAX_H2C_DATA + 256;
/// Largest PDU other than H2CData: a command capsule with the most
/// in-capsule data, digests and padding.
const MAX_CAPSULE_PDU: usize = 72 + IN_CAPSULE_DATA + 256;
/// H2CData at least this large is received straight into the command's
/// arena buffer rather than through the receive buffer.
const DIRECT_MIN: usize = 16 << 10;

/// What became of one received PDU.
enum Flow {
    Consumed,
    /// Leave it in the buffer and retry later (no room to hold it yet).
    Stall,
}

impl TcpQueue {
    /// Handles the PDUs the receive buffer holds, as far as they can go now.
    pub(super) fn process_rx(&mut self, io: &mut Io) {
        // Take the buffer out so that PDUs can borrow it while `self` changes.
        let mut rx = std::mem::replace(&mut self.w.rx, RxBuf::empty());
        while matches!(self.w.phase, Phase::Handshake | Phase::Live) {
            if self.w.direct.is_some() {
                if self.drain_direct(&mut rx, io) {
                    continue;
                }
                break;
            }
            let avail = rx.pending();
            let expect = if self.w.phase == Phase::Handshake {
                Digests::default()
            } else {
                self.w.digests
            };
            let res = tcp::decode(avail, expect, MAX_PDU)
                .map_err(Fatal::from)
                .and_then(|d| match d {
                    None => Ok(None),
                    Some((pdu, n)) => self.handle_pdu(&pdu, io).map(|f| Some((f, n))),
                });
            match res {
                Ok(None) => {
                    if let Err(f) = self.start_direct(&mut rx, io) {
                        let avail = rx.pending();
                        let hdr = &avail[..avail.len().min(tcp::TERM_REQ_MAX_DATA)];
                        self.terminate(f, hdr);
                    }
                    break;
                }
                Ok(Some((Flow::Consumed, n))) => rx.consume(n),
                Ok(Some((Flow::Stall, _))) => break,
                Err(f) => {
                    let hdr = &avail[..avail.len().min(tcp::TERM_REQ_MAX_DATA)];
                    self.terminate(f, hdr);
                }
            }
        }
        self.w.rx = rx;
    }

    /// Sends a C2HTermReq carrying the offending header and ends the connection.
    fn terminate(&mut self, f: Fatal, bad_header: &[u8]) {
        tracing::warn!(peer = %self.q.peer, fes = f.fes, fei = f.fei, "protocol error: {}; sending C2HTermReq", f.why);
        let h = Header::TermReq {
            from_host: false,
            fes: f.fes,
            fei: f.fei,
        };
        let mut pdu = self.w.tx.buf();
        tcp::encode_into(&mut pdu, &h, 0, bad_header, self.w.digests, 1);
        self.w.tx.push(pdu, None);
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
            (Phase::Live, Header::H2CData(t)) => {
                let dst = TcpWire::check_h2c(&self.q, t, pdu.data.len(), io)?;
                // SAFETY: check_h2c found `pdu.data.len()` bytes of the
                // command's arena buffer at `dst` (within what was requested
                // of the host); the receive buffer is not arena memory.
                unsafe { std::ptr::copy_nonoverlapping(pdu.data.as_ptr(), dst, pdu.data.len()) };
                let end = t.offset as usize + pdu.data.len();
                self.q
                    .data_arrived(t.ttag, end, pdu.data_digest_ok, io, &mut self.w);
                Ok(Flow::Consumed)
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

    /// Starts placing a large H2CData payload whose header has arrived
    /// straight into its command's arena buffer.
    fn start_direct(&mut self, rx: &mut RxBuf, io: &Io) -> Result<(), Fatal> {
        if self.w.phase != Phase::Live {
            return Ok(());
        }
        let pending = rx.pending();
        let Some(f) = tcp::decode_framing(pending, self.w.digests, MAX_PDU)? else {
            return Ok(());
        };
        let Header::H2CData(t) = f.header else {
            if f.plen > MAX_CAPSULE_PDU {
                // It could never be received whole: refuse it now.
                return Err(fatal(
                    fes::INVALID_HEADER_FIELD,
                    4,
                    format!(
                        "PLEN {} is larger than any capsule this target accepts",
                        f.plen
                    ),
                ));
            }
            return Ok(());
        };
        if f.data_len < DIRECT_MIN || pending.len() >= f.plen {
            return Ok(());
        }
        if pending.len() < f.data_at {
            return Ok(()); // the header's padding is still to come
        }
        let dst = TcpWire::check_h2c(&self.q, t, f.data_len, io)?;
        let have = (pending.len() - f.data_at).min(f.data_len);
        // SAFETY: check_h2c found `f.data_len` bytes of the command's buffer
        // at `dst`; the receive buffer is not arena memory.
        unsafe { std::ptr::copy_nonoverlapping(pending[f.data_at..].as_ptr(), dst, have) };
        rx.consume(f.data_at + have);
        self.w.direct = Some(Direct {
            slot: t.ttag,
            dst: dst.wrapping_add(have),
            left: f.data_len - have,
            at: t.offset as usize,
            len: f.data_len,
            digest: f.data_digest,
        });
        Ok(())
    }

    /// Moves received bytes of a direct payload into place and, once all is
    /// there (with its digest), hands it to the command. Returns true then.
    fn drain_direct(&mut self, rx: &mut RxBuf, io: &mut Io) -> bool {
        let d = self
            .w
            .direct
            .as_mut()
            .expect("direct placement in progress");
        if d.left > 0 {
            let pending = rx.pending();
            let n = pending.len().min(d.left);
            // SAFETY: `d.dst` has `d.left` writable bytes of the command's
            // buffer; the receive buffer is not arena memory.
            unsafe { std::ptr::copy_nonoverlapping(pending.as_ptr(), d.dst, n) };
            d.left -= n;
            d.dst = d.dst.wrapping_add(n);
            rx.consume(n);
            if d.left > 0 {
                return false;
            }
        }
        let mut digest_ok = true;
        if d.digest {
            let pending = rx.pending();
            if pending.len() < tcp::DIGEST_LEN {
                return false;
            }
            let want = u32::from_le_bytes(pending[..4].try_into().expect("4 bytes"));
            let buf = self.q.command(d.slot).and_then(|c| c.buf.as_ref());
            digest_ok = buf.is_some_and(|b| io.arena.crc32c(b, d.at, d.len) == want);
            rx.consume(tcp::DIGEST_LEN);
        }
        let d = self.w.direct.take().expect("checked above");
        self.q
            .data_arrived(d.slot, d.at + d.len, digest_ok, io, &mut self.w);
        true
    }
}

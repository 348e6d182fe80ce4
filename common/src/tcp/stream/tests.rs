//! The receiving half against a receiver of its own: data PDUs placed in
//! the buffer and past it, digests, stalls and refusals.

use super::inbound::{Flow, Inbound, InboundLimits, Placed, Receiver, Role, Stop};
use crate::nvme::Cqe;
use crate::tcp::{self, flags, Digests, Header, Pdu, Transfer};

const LIMITS: InboundLimits = InboundLimits {
    buffer: 8 << 10,
    max_pdu: 256 << 10,
    max_other: 1 << 10,
    direct_min: 4 << 10,
};

/// A host with one command reading into `buf`.
struct Host {
    buf: Vec<u8>,
    digests: Digests,
    placed: Vec<Placed>,
    other: Vec<Header>,
    stall: bool,
}

impl Host {
    fn new(len: usize, digests: Digests) -> Host {
        Host {
            buf: vec![0; len],
            digests,
            placed: Vec::new(),
            other: Vec::new(),
            stall: false,
        }
    }
}

// SAFETY: `place` returns a range of the test's own vector, checked
// against its length, which lives as long as the test.
unsafe impl Receiver for Host {
    type Error = String;
    fn digests(&self) -> Digests {
        self.digests
    }
    fn receiving(&self) -> bool {
        true
    }
    fn place(&mut self, t: &Transfer, len: usize) -> Result<*mut u8, String> {
        let at = t.offset as usize;
        if t.cccid != 7 || at + len > self.buf.len() {
            return Err(format!("no place for {t:?}"));
        }
        Ok(self.buf[at..].as_mut_ptr())
    }
    fn placed(&mut self, p: Placed) -> Result<(), String> {
        self.placed.push(p);
        Ok(())
    }
    fn pdu(&mut self, pdu: &Pdu<'_>) -> Result<Flow, String> {
        if self.stall {
            return Ok(Flow::Stall);
        }
        self.other.push(pdu.header);
        Ok(Flow::Consumed)
    }
}

fn c2h(offset: usize, data: &[u8], fl: u8, digests: Digests) -> Vec<u8> {
    let t = Transfer {
        cccid: 7,
        ttag: 0,
        offset: offset as u32,
        len: data.len() as u32,
    };
    let mut pdu = Vec::new();
    tcp::encode_into(&mut pdu, &Header::C2HData(t), fl, data, digests, 1);
    pdu
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// Delivers `wire` in receives of at most `chunk` bytes, handling PDUs
/// between them as a queue does; returns how many receives wrote past the
/// receive buffer, into a command's place.
fn deliver(inb: &mut Inbound, r: &mut Host, wire: &[u8], chunk: usize) -> Result<usize, String> {
    let mut at = 0;
    let mut in_place = 0;
    while at < wire.len() {
        inb.process(r).map_err(|e| format!("{e:?}"))?;
        let (ptr, len) = inb.next_recv().ok_or("no receive to post")?;
        let n = len.min(chunk).min(wire.len() - at);
        let base = r.buf.as_ptr() as usize;
        if (base..base + r.buf.len()).contains(&(ptr as usize)) {
            in_place += 1;
        }
        // SAFETY: `next_recv` gave `len` writable bytes at `ptr`.
        unsafe { std::ptr::copy_nonoverlapping(wire[at..].as_ptr(), ptr, n) };
        assert!(matches!(inb.received(n as i32), super::Received::Bytes));
        at += n;
    }
    inb.process(r).map_err(|e| format!("{e:?}"))?;
    Ok(in_place)
}

#[test]
fn small_data_is_copied_from_the_buffer_and_large_data_lands_in_place() {
    for digests in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        let mut inb = Inbound::new(Role::Host, LIMITS).unwrap();
        let mut host = Host::new(64 << 10, digests);
        let small = pattern(1000);
        let large = pattern(40 << 10);
        let mut wire = c2h(0, &small, 0, digests);
        wire.extend(c2h(1000, &large, flags::LAST_PDU | flags::SUCCESS, digests));
        let in_place = deliver(&mut inb, &mut host, &wire, 3000).unwrap();
        assert!(in_place > 0, "the large payload went through the buffer");
        assert_eq!(&host.buf[..1000], &small[..]);
        assert_eq!(&host.buf[1000..1000 + large.len()], &large[..]);
        assert_eq!(host.placed.len(), 2);
        assert!(host.placed.iter().all(|p| p.digest_ok));
        assert_eq!(host.placed[1].transfer.offset, 1000);
        assert_eq!(host.placed[1].transfer.len as usize, large.len());
        assert_ne!(host.placed[1].flags & flags::SUCCESS, 0);
        assert!(inb.pending().is_empty());
    }
}

#[test]
fn a_bad_data_digest_is_reported_in_the_buffer_and_in_place() {
    let digests = Digests {
        header: false,
        data: true,
    };
    for len in [100, 20 << 10] {
        let mut inb = Inbound::new(Role::Host, LIMITS).unwrap();
        let mut host = Host::new(32 << 10, digests);
        let mut wire = c2h(0, &pattern(len), 0, digests);
        let last = wire.len() - 1;
        wire[last] ^= 1;
        deliver(&mut inb, &mut host, &wire, 1500).unwrap();
        assert_eq!(host.placed.len(), 1, "{len} bytes");
        assert!(!host.placed[0].digest_ok, "{len} bytes");
    }
}

#[test]
fn other_pdus_go_to_the_receiver_and_may_wait() {
    let mut inb = Inbound::new(Role::Host, LIMITS).unwrap();
    let mut host = Host::new(16, Digests::default());
    host.stall = true;
    let resp = tcp::encode(
        &Header::CapsuleResp(Cqe::default()),
        0,
        &[],
        Digests::default(),
        1,
    );
    deliver(&mut inb, &mut host, &resp, 4096).unwrap();
    assert!(host.other.is_empty());
    assert_eq!(inb.pending(), &resp[..], "a stalled PDU stays at the head");
    host.stall = false;
    inb.process(&mut host).unwrap();
    assert_eq!(host.other, vec![Header::CapsuleResp(Cqe::default())]);
    assert!(inb.pending().is_empty());
}

#[test]
fn a_pdu_larger_than_its_type_allows_is_refused_from_its_header() {
    let mut inb = Inbound::new(Role::Host, LIMITS).unwrap();
    let mut host = Host::new(16, Digests::default());
    // A capsule of 2 KiB: refused once its header is in, before its data.
    let cmd = Header::CapsuleCmd(crate::nvme::Sqe::default());
    let pdu = tcp::encode(&cmd, 0, &[0; 2000], Digests::default(), 1);
    let err = deliver(&mut inb, &mut host, &pdu[..72], 72).unwrap_err();
    assert!(err.contains("offset: 4"), "{err}");
}

#[test]
fn data_for_no_place_is_refused_and_the_pdu_stays_for_the_term_req() {
    let mut inb = Inbound::new(Role::Host, LIMITS).unwrap();
    let mut host = Host::new(16, Digests::default());
    let wire = c2h(0, &pattern(100), 0, Digests::default());
    let err = deliver(&mut inb, &mut host, &wire, 4096).unwrap_err();
    assert!(err.contains("no place"), "{err}");
    assert_eq!(inb.pending(), &wire[..]);
    // A controller takes H2CData, not C2HData: that one is "other".
    let mut inb = Inbound::new(Role::Controller, LIMITS).unwrap();
    let mut host = Host::new(4096, Digests::default());
    deliver(&mut inb, &mut host, &wire, 4096).unwrap();
    assert!(host.placed.is_empty());
    assert_eq!(host.other.len(), 1);
}

#[test]
fn a_stop_is_a_malformed_pdu_or_a_refusal() {
    let mut inb = Inbound::new(Role::Host, LIMITS).unwrap();
    let mut host = Host::new(16, Digests::default());
    let (ptr, _) = inb.next_recv().unwrap();
    // SAFETY: the receive buffer has room for 8 bytes.
    unsafe { std::ptr::copy_nonoverlapping([0xffu8; 8].as_ptr(), ptr, 8) };
    inb.received(8);
    assert!(matches!(inb.process(&mut host), Err(Stop::Malformed(_))));
}

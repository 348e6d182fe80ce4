//! Every NVMe/TCP PDU of a real capture (Linux 6.12 host talking to Linux
//! nvmet-tcp) must decode, and re-encode to the very same bytes.

use rdmablk_common::tcp::{self, flags, Digests, Header};
use std::collections::BTreeMap;

const PCAP: &[u8] = include_bytes!("fixtures/nvme-tcp-kernel-host-vs-nvmet.pcap");
const NVME_PORT: u16 = 4420;

/// One direction of one TCP connection, reassembled by sequence number.
#[derive(Default)]
struct Stream {
    isn: Option<u32>,
    bytes: Vec<u8>,
    first_seen: usize,
}

/// Reads a classic pcap file with Ethernet, Linux cooked (v1, v2) or raw IP
/// framing and returns the TCP payload streams keyed by (src port, dst port).
fn tcp_streams(pcap: &[u8]) -> BTreeMap<(u16, u16), Stream> {
    let magic = u32::from_le_bytes(pcap[..4].try_into().unwrap());
    let le = match magic {
        0xa1b2_c3d4 | 0xa1b2_3c4d => true,
        0xd4c3_b2a1 | 0x4d3c_b2a1 => false,
        _ => panic!("not a classic pcap file"),
    };
    let rd32 = |b: &[u8]| {
        let a: [u8; 4] = b[..4].try_into().unwrap();
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let linktype = rd32(&pcap[20..]);
    let be16 = |b: &[u8], o: usize| u16::from_be_bytes([b[o], b[o + 1]]);
    let be32 = |b: &[u8], o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
    let mut streams: BTreeMap<(u16, u16), Stream> = BTreeMap::new();
    let mut at = 24;
    let mut index = 0;
    while at + 16 <= pcap.len() {
        let incl = rd32(&pcap[at + 8..]) as usize;
        let frame = &pcap[at + 16..at + 16 + incl];
        at += 16 + incl;
        index += 1;
        let (ethertype, ip) = match linktype {
            1 => (be16(frame, 12), &frame[14..]),
            113 => (be16(frame, 14), &frame[16..]),
            276 => (be16(frame, 0), &frame[20..]),
            101 => (if frame[0] >> 4 == 6 { 0x86dd } else { 0x0800 }, frame),
            other => panic!("unsupported link type {other}"),
        };
        let (proto, l4) = match ethertype {
            0x0800 => {
                let ihl = (ip[0] & 0xf) as usize * 4;
                let total = be16(ip, 2) as usize;
                (ip[9], &ip[ihl..total])
            }
            0x86dd => (ip[6], &ip[40..40 + be16(ip, 4) as usize]),
            _ => continue,
        };
        if proto != 6 {
            continue;
        }
        let (sport, dport) = (be16(l4, 0), be16(l4, 2));
        if sport != NVME_PORT && dport != NVME_PORT {
            continue;
        }
        let seq = be32(l4, 4);
        let tcp_flags = l4[13];
        let payload = &l4[((l4[12] >> 4) as usize * 4)..];
        let s = streams.entry((sport, dport)).or_default();
        if s.isn.is_none() {
            s.first_seen = index;
            // SYN consumes one sequence number.
            s.isn = Some(if tcp_flags & 0x02 != 0 {
                seq.wrapping_add(1)
            } else {
                seq
            });
        }
        if payload.is_empty() {
            continue;
        }
        let off = seq.wrapping_sub(s.isn.unwrap()) as usize;
        if off + payload.len() > s.bytes.len() {
            s.bytes.resize(off + payload.len(), 0);
        }
        s.bytes[off..off + payload.len()].copy_from_slice(payload);
    }
    streams
}

#[test]
fn every_captured_pdu_round_trips() {
    let streams = tcp_streams(PCAP);
    assert!(
        streams.len() >= 6,
        "expected 3 connections, found {} streams",
        streams.len()
    );
    let mut counts: BTreeMap<u8, usize> = BTreeMap::new();
    let mut digest_pdus = 0;
    for ((sport, dport), s) in &streams {
        // The ICResp of a connection tells which digests it uses; find it in
        // the target-to-host direction.
        let c2h_key = if *dport == NVME_PORT {
            (*dport, *sport)
        } else {
            (*sport, *dport)
        };
        let ic = &streams[&c2h_key].bytes;
        let (icresp, _) = tcp::decode(ic, Digests::default(), 1 << 24)
            .unwrap()
            .unwrap();
        let Header::IcResp { digests, .. } = icresp.header else {
            panic!("stream {c2h_key:?} does not start with ICResp");
        };
        let mut at = 0;
        let mut first = true;
        while at < s.bytes.len() {
            let expect = if first { Digests::default() } else { digests };
            let (pdu, n) = tcp::decode(&s.bytes[at..], expect, 1 << 24)
                .unwrap_or_else(|e| panic!("stream {sport}->{dport} at byte {at}: {e}"))
                .unwrap_or_else(|| panic!("stream {sport}->{dport}: truncated PDU at byte {at}"));
            assert!(pdu.data_digest_ok, "data digest mismatch at byte {at}");
            let raw = &s.bytes[at..at + n];
            let extra = pdu.flags & (flags::LAST_PDU | flags::SUCCESS);
            let re = tcp::encode(&pdu.header, extra, pdu.data, expect, 1);
            assert_eq!(
                re, raw,
                "re-encoding differs: stream {sport}->{dport} at byte {at}: {:?}",
                pdu.header
            );
            *counts.entry(pdu.header.pdu_type()).or_default() += 1;
            if pdu.flags & flags::HDGST != 0 {
                digest_pdus += 1;
            }
            at += n;
            first = false;
        }
    }
    // The capture holds every PDU type the host and target exchange.
    for ty in [0u8, 1, 4, 5, 6, 7, 9] {
        assert!(
            counts.get(&ty).copied().unwrap_or(0) > 0,
            "no PDU of type {ty:#x} in capture: {counts:?}"
        );
    }
    assert!(digest_pdus > 0, "the digest connection was not seen");
    eprintln!("PDUs by type: {counts:?}, with header digest: {digest_pdus}");
}

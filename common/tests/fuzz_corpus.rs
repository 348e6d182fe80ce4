//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the
//! checks the fuzz targets run (`rdmablk_common::fuzzing`), on stable, as
//! ordinary tests. libFuzzer itself runs only from `scripts/fuzz.sh`.
//!
//! `seed_corpus_from_capture` (ignored) wrote the seed files: real PDUs,
//! Connect and Property capsules and SGL descriptors of the NVMe/TCP capture
//! in `fixtures/`, and a few built ones where the capture has none (NVMe/RDMA
//! private data, keyed SGLs, discovery log pages). Run it again with
//! `cargo test -p rdmablk-common --test fuzz_corpus -- --ignored` after the
//! capture changes.

use rdmablk_common::fuzzing::{MAX_CORPUS_FILE, TARGETS};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
}

fn replay(target: &str) {
    rdmablk_common::fuzzing::replay(TARGETS, target, &corpus_dir());
}

#[test]
fn tcp_pdu() {
    replay("tcp_pdu");
}

#[test]
fn fabrics_connect() {
    replay("fabrics_connect");
}

#[test]
fn sgl() {
    replay("sgl");
}

#[test]
fn rdma_private_data() {
    replay("rdma_private_data");
}

#[test]
fn discovery_log() {
    replay("discovery_log");
}

/// A target added to `fuzzing::TARGETS` needs a test above (and a corpus).
#[test]
fn every_target_is_replayed() {
    let tested = [
        "tcp_pdu",
        "fabrics_connect",
        "sgl",
        "rdma_private_data",
        "discovery_log",
    ];
    for (name, _) in TARGETS {
        assert!(
            tested.contains(name),
            "no replay test for fuzz target {name}"
        );
    }
}

// ---- seeding the corpus from the capture ----

use rdmablk_common::fabrics::discovery::{
    adrfam, encode_log, subtype, treq, trtype, DiscoveryEntry,
};
use rdmablk_common::fabrics::fctype;
use rdmablk_common::nvme::{admin, Sgl, FABRICS_OPCODE};
use rdmablk_common::rdma::private_data::{
    encode_reject, ConnectReply, ConnectRequest, RejectStatus,
};
use rdmablk_common::tcp::{self, Digests, Header};

const PCAP: &[u8] = include_bytes!("fixtures/nvme-tcp-kernel-host-vs-nvmet.pcap");
const NVME_PORT: u16 = 4420;

/// The TCP payload of each direction of each connection to port 4420 of an
/// Ethernet pcap, reassembled by sequence number, keyed by (src, dst) port.
fn tcp_streams(pcap: &[u8]) -> BTreeMap<(u16, u16), Vec<u8>> {
    let le32 = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let be16 = |b: &[u8], o: usize| u16::from_be_bytes([b[o], b[o + 1]]);
    let be32 = |b: &[u8], o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
    assert_eq!(le32(pcap, 0), 0xa1b2_c3d4, "a little-endian classic pcap");
    assert_eq!(le32(pcap, 20), 1, "Ethernet link type");
    let mut isn: BTreeMap<(u16, u16), u32> = BTreeMap::new();
    let mut streams: BTreeMap<(u16, u16), Vec<u8>> = BTreeMap::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let incl = le32(pcap, at + 8) as usize;
        let frame = &pcap[at + 16..at + 16 + incl];
        at += 16 + incl;
        let ip = &frame[14..];
        let (proto, l4) = match be16(frame, 12) {
            0x0800 => (ip[9], &ip[(ip[0] & 0xf) as usize * 4..be16(ip, 2) as usize]),
            0x86dd => (ip[6], &ip[40..40 + be16(ip, 4) as usize]),
            _ => continue,
        };
        let ports = (be16(l4, 0), be16(l4, 2));
        if proto != 6 || (ports.0 != NVME_PORT && ports.1 != NVME_PORT) {
            continue;
        }
        let seq = be32(l4, 4);
        let syn = l4[13] & 0x02 != 0;
        let base = *isn
            .entry(ports)
            .or_insert(if syn { seq.wrapping_add(1) } else { seq });
        let payload = &l4[(l4[12] >> 4) as usize * 4..];
        if payload.is_empty() {
            continue;
        }
        let off = seq.wrapping_sub(base) as usize;
        let s = streams.entry(ports).or_default();
        if off + payload.len() > s.len() {
            s.resize(off + payload.len(), 0);
        }
        s[off..off + payload.len()].copy_from_slice(payload);
    }
    streams
}

/// One decoded PDU of the capture.
struct Captured {
    raw: Vec<u8>,
    header: Header,
    data: Vec<u8>,
    digests: Digests,
}

/// The PDUs of one direction of a connection, in order.
fn pdus(streams: &BTreeMap<(u16, u16), Vec<u8>>, key: (u16, u16)) -> Vec<Captured> {
    let c2h = if key.0 == NVME_PORT {
        key
    } else {
        (key.1, key.0)
    };
    let (icresp, _) = tcp::decode(&streams[&c2h], Digests::default(), 1 << 24)
        .unwrap()
        .unwrap();
    let Header::IcResp { digests, .. } = icresp.header else {
        panic!("{c2h:?} does not start with ICResp");
    };
    let bytes = &streams[&key];
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let expect = if at == 0 { Digests::default() } else { digests };
        let (pdu, n) = tcp::decode(&bytes[at..], expect, 1 << 24).unwrap().unwrap();
        out.push(Captured {
            raw: bytes[at..at + n].to_vec(),
            header: pdu.header,
            data: pdu.data.to_vec(),
            digests,
        });
        at += n;
    }
    out
}

/// Writes seed files, replacing the ones of the same name.
struct Seeds {
    target: &'static str,
    written: usize,
}

impl Seeds {
    fn new(target: &'static str) -> Self {
        std::fs::create_dir_all(corpus_dir().join(target)).unwrap();
        Seeds { target, written: 0 }
    }

    fn put(&mut self, name: &str, data: &[u8]) {
        assert!(
            data.len() <= MAX_CORPUS_FILE,
            "{name}: {} bytes",
            data.len()
        );
        std::fs::write(corpus_dir().join(self.target).join(name), data).unwrap();
        self.written += 1;
    }
}

impl Drop for Seeds {
    fn drop(&mut self) {
        eprintln!("{}: {} seed files", self.target, self.written);
    }
}

fn pdu_name(h: &Header) -> &'static str {
    match h {
        Header::IcReq { .. } => "icreq",
        Header::IcResp { .. } => "icresp",
        Header::TermReq { .. } => "termreq",
        Header::CapsuleCmd(_) => "capsule-cmd",
        Header::CapsuleResp(_) => "capsule-resp",
        Header::H2CData(_) => "h2c-data",
        Header::C2HData(_) => "c2h-data",
        Header::R2T(_) => "r2t",
    }
}

#[test]
#[ignore = "writes fuzz/corpus seed files; run by hand after the capture changes"]
fn seed_corpus_from_capture() {
    let streams = tcp_streams(PCAP);
    let mut tcp_seeds = Seeds::new("tcp_pdu");
    let mut connect_seeds = Seeds::new("fabrics_connect");
    let mut sgl_seeds = Seeds::new("sgl");
    let mut kinds = BTreeSet::new();
    let mut capsules = BTreeSet::new();
    let mut sgls = BTreeSet::new();
    let mut log_reads = Vec::new();
    let mut cut = BTreeSet::new();
    for &key in streams.keys() {
        let all = pdus(&streams, key);

        // The start of the stream: several PDUs back to back.
        let mut start = Vec::new();
        for p in all.iter().take_while(|p| p.raw.len() <= MAX_CORPUS_FILE) {
            if start.len() + p.raw.len() > MAX_CORPUS_FILE {
                break;
            }
            start.extend_from_slice(&p.raw);
        }
        tcp_seeds.put(&format!("capture-stream-{}-{}", key.0, key.1), &start);

        for p in &all {
            // One PDU of each kind: type, flags, digests, data or not, and
            // for commands the opcode, for responses success or not.
            let detail = match p.header {
                Header::CapsuleCmd(sqe) => u16::from_be_bytes([sqe.opcode(), sqe.fctype()]),
                Header::CapsuleResp(cqe) => u16::from(cqe.status >> 1 != 0),
                _ => 0,
            };
            let kind = (
                p.header.pdu_type(),
                p.raw[1],
                p.digests.header,
                p.digests.data,
                p.data.is_empty(),
                detail,
            );
            if p.raw.len() <= MAX_CORPUS_FILE && kinds.insert(kind) {
                let name = format!("capture-{}-{:03}", pdu_name(&p.header), kinds.len());
                tcp_seeds.put(&name, &p.raw);
            }
            // Data PDUs of the capture carry 4 KiB or more: keep their first
            // 512 bytes of data, re-encoded with the connection's digests.
            if let Header::H2CData(t) | Header::C2HData(t) = p.header {
                if p.data.len() > 512 && cut.insert((p.header.pdu_type(), p.digests.header)) {
                    let t = tcp::Transfer { len: 512, ..t };
                    let h = match p.header {
                        Header::H2CData(_) => Header::H2CData(t),
                        _ => Header::C2HData(t),
                    };
                    let raw = tcp::encode(&h, p.raw[1] & 0x0c, &p.data[..512], p.digests, 1);
                    let name = format!("cut-{}-{}", pdu_name(&h), cut.len());
                    tcp_seeds.put(&name, &raw);
                }
            }

            let Header::CapsuleCmd(sqe) = p.header else {
                continue;
            };
            let sgl = &sqe.0[24..40];
            if sgls.insert((sgl[15], sgl[8..12].to_vec())) {
                sgl_seeds.put(&format!("capture-{:03}", sgls.len()), sgl);
            }
            if sqe.opcode() == FABRICS_OPCODE {
                let what = match sqe.fctype() {
                    fctype::CONNECT => "connect",
                    fctype::PROPERTY_GET => "property-get",
                    fctype::PROPERTY_SET => "property-set",
                    _ => "fabrics",
                };
                // The CID varies between otherwise equal commands.
                let mut plain = sqe;
                plain.set_cid(0);
                if capsules.insert((plain.0.to_vec(), p.data.clone())) {
                    let mut seed = sqe.0.to_vec();
                    seed.extend_from_slice(&p.data);
                    connect_seeds.put(&format!("capture-{what}-{:03}", capsules.len()), &seed);
                }
            }
            if sqe.opcode() == admin::GET_LOG_PAGE && sqe.cdw(10) & 0xff == 0x70 {
                // NUMDL: dwords, 0's based.
                let len = ((sqe.cdw(10) >> 16) as usize + 1) * 4;
                log_reads.push(((key.1, key.0), sqe.cid(), len));
            }
        }
    }

    // Discovery log pages: the C2HData answering the host's Get Log Page.
    let mut disc = Seeds::new("discovery_log");
    for (c2h, cid, len) in log_reads {
        let mut page = vec![0u8; len];
        let mut got = 0;
        for p in pdus(&streams, c2h) {
            if let Header::C2HData(t) = p.header {
                if t.cccid == cid && t.offset as usize + p.data.len() <= len {
                    page[t.offset as usize..][..p.data.len()].copy_from_slice(&p.data);
                    got += p.data.len();
                }
            }
        }
        assert_eq!(
            got, len,
            "the log page of command {cid} is not all in the capture"
        );
        disc.put(&format!("capture-{}-{len}", c2h.1), &page);
    }

    // The capture has no TermReq: one each way, carrying a bad header.
    let bad = tcp::encode(
        &Header::CapsuleResp(Default::default()),
        0,
        &[],
        Digests::default(),
        1,
    );
    for (from_host, fes, fei) in [(true, 1, 2), (false, 3, 0)] {
        let h = Header::TermReq {
            from_host,
            fes,
            fei,
        };
        let raw = tcp::encode(&h, 0, &bad, Digests::default(), 1);
        let dir = if from_host { "h2c" } else { "c2h" };
        tcp_seeds.put(&format!("built-{}-{dir}", pdu_name(&h)), &raw);
    }
    drop(tcp_seeds);

    // Keyed SGLs are NVMe/RDMA's: as the kernel's RDMA host builds them.
    for (i, invalidate) in [false, true].into_iter().enumerate() {
        let keyed = Sgl::Keyed {
            addr: 0xffff_8881_2345_6000,
            len: 4096,
            key: 0x0012_3401,
            invalidate,
        };
        sgl_seeds.put(&format!("built-keyed-{i}"), &keyed.to_bytes());
    }

    // NVMe/RDMA private data as the kernel host and target exchange it.
    let mut rdma = Seeds::new("rdma_private_data");
    let admin_q = ConnectRequest {
        recfmt: 0,
        qid: 0,
        hrqsize: 32,
        hsqsize: 31,
        cntlid: 0xffff,
    };
    let io_q = ConnectRequest {
        qid: 1,
        hrqsize: 128,
        hsqsize: 127,
        cntlid: 1,
        ..admin_q
    };
    rdma.put("built-request-admin", &admin_q.encode());
    rdma.put("built-request-io", &io_q.encode());
    let reply = ConnectReply {
        recfmt: 0,
        crqsize: 128,
    };
    rdma.put("built-reply", &reply.encode());
    rdma.put(
        "built-reject-hsqsize",
        &encode_reject(RejectStatus::InvalidHsqsize),
    );
    rdma.put(
        "built-reject-no-resources",
        &encode_reject(RejectStatus::NoResources),
    );

    // Discovery log pages with other transports and address families.
    let tcp4 = DiscoveryEntry {
        trtype: trtype::TCP,
        adrfam: adrfam::IPV4,
        subtype: subtype::NVME,
        treq: treq::SECURE_CHANNEL_NOT_REQUIRED,
        portid: 1,
        cntlid: 0xffff,
        asqsz: 32,
        eflags: 0,
        trsvcid: "4420".into(),
        subnqn: "nqn.2026-11.io.rdmablk:vol0".into(),
        traddr: "192.0.2.10".into(),
        tsas: [0; 32],
    };
    let rdma6 = DiscoveryEntry {
        trtype: trtype::RDMA,
        adrfam: adrfam::IPV6,
        subtype: subtype::CURRENT_DISCOVERY,
        eflags: 3,
        portid: 2,
        traddr: "2001:db8::10".into(),
        subnqn: "nqn.2014-08.org.nvmexpress.discovery".into(),
        ..tcp4.clone()
    };
    disc.put("built-empty", &encode_log(1, &[]));
    disc.put("built-one", &encode_log(2, std::slice::from_ref(&tcp4)));
    disc.put("built-two", &encode_log(7, &[tcp4, rdma6]));
}

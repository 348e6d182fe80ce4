use super::*;
use crate::nvme::Status;
use proptest::prelude::*;

const BOTH: Digests = Digests {
    header: true,
    data: true,
};

#[test]
fn icreq_layout() {
    let h = Header::IcReq {
        pfv: 0,
        hpda: 0,
        digests: BOTH,
        maxr2t: 0,
    };
    let b = encode(&h, 0, &[], BOTH, 1);
    assert_eq!(b.len(), 128);
    assert_eq!(&b[..8], &[0, 0, 128, 0, 128, 0, 0, 0]);
    assert_eq!(b[11], 3);
    let (p, n) = decode(&b, Digests::default(), 4096).unwrap().unwrap();
    assert_eq!((p.header, n), (h, 128));
}

#[test]
fn capsule_with_in_capsule_data_and_digests() {
    let mut sqe = Sqe::new(0x01, 7);
    sqe.set_nsid(1);
    let data = [0xabu8; 512];
    let b = encode(&Header::CapsuleCmd(sqe), 0, &data, BOTH, 1);
    // CH + SQE + HDGST, data at PDO 76, DDGST last.
    assert_eq!(b[1], flags::HDGST | flags::DDGST);
    assert_eq!(b[3], 76);
    assert_eq!(get_u32(&b, 4) as usize, 76 + 512 + 4);
    assert_eq!(get_u32(&b, 72), crc32c::crc32c(&b[..72]));
    let (p, _) = decode(&b, BOTH, 1 << 20).unwrap().unwrap();
    assert_eq!(p.header, Header::CapsuleCmd(sqe));
    assert_eq!(p.data, &data[..]);
    assert!(p.data_digest_ok);
}

#[test]
fn encode_into_appends_a_whole_pdu() {
    let sqe = Sqe::new(0x02, 9);
    let data = [0x11u8; 100];
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(b"prev");
    let ptr = out.as_ptr();
    encode_into(&mut out, &Header::CapsuleCmd(sqe), 0, &data, BOTH, 1);
    assert_eq!(out.as_ptr(), ptr, "fits: no reallocation");
    assert_eq!(&out[..4], b"prev");
    let pdu = &out[4..];
    assert_eq!(
        pdu,
        &encode(&Header::CapsuleCmd(sqe), 0, &data, BOTH, 1)[..]
    );
    assert_eq!(pdu.len(), 76 + 100 + 4);
    assert_eq!(&pdu[76 + 100..], &data_digest(&data));
    // A second PDU after the first; a TermReq never gets a data digest.
    let term = Header::TermReq {
        from_host: true,
        fes: fes::PDU_SEQUENCE_ERROR,
        fei: 0,
    };
    let before = out.len();
    encode_into(&mut out, &term, 0, &[1, 2, 3], BOTH, 1);
    assert_eq!(&out[before..], &encode(&term, 0, &[1, 2, 3], BOTH, 1)[..]);
    assert_eq!(out.len() - before, SHORT_HLEN + 3);
}

#[test]
fn c2h_data_honours_host_alignment() {
    let t = Transfer {
        cccid: 3,
        ttag: 0,
        offset: 0,
        len: 8,
    };
    let b = encode(
        &Header::C2HData(t),
        flags::LAST_PDU,
        &[1; 8],
        Digests::default(),
        32,
    );
    assert_eq!(b[3], 32);
    assert_eq!(b.len(), 40);
    let (p, _) = decode(&b, Digests::default(), 4096).unwrap().unwrap();
    assert_eq!(p.flags, flags::LAST_PDU);
    assert_eq!(p.data, &[1; 8]);
}

#[test]
fn errors_name_the_bad_field() {
    let resp = encode(
        &Header::CapsuleResp(Cqe::new(1, Status::SUCCESS)),
        0,
        &[],
        Digests::default(),
        1,
    );
    let mut bad = resp.clone();
    bad[0] = 0x42;
    assert_eq!(decode(&bad, Digests::default(), 4096).unwrap_err().fei(), 0);
    let mut bad = resp.clone();
    bad[2] = 72;
    assert_eq!(decode(&bad, Digests::default(), 4096).unwrap_err().fei(), 2);
    let mut bad = resp.clone();
    put_u32(&mut bad, 4, 1 << 30);
    assert_eq!(peek_len(&bad, 4096).unwrap_err().fei(), 4);
    // Header digest expected but absent.
    assert_eq!(decode(&resp, BOTH, 4096).unwrap_err().fei(), 1);
    // Corrupt digest.
    let mut hd = encode(
        &Header::CapsuleResp(Cqe::new(1, Status::SUCCESS)),
        0,
        &[],
        BOTH,
        1,
    );
    hd[24] ^= 1;
    assert_eq!(decode(&hd, BOTH, 4096).unwrap_err(), PduError::HeaderDigest);
    // Truncated: not an error, just not complete yet.
    assert_eq!(decode(&resp[..20], Digests::default(), 4096).unwrap(), None);
}

#[test]
fn data_digest_mismatch_is_reported_not_fatal() {
    let t = Transfer {
        cccid: 1,
        ttag: 2,
        offset: 0,
        len: 4,
    };
    let mut b = encode(&Header::H2CData(t), flags::LAST_PDU, &[9; 4], BOTH, 1);
    let n = b.len();
    b[n - 1] ^= 0xff;
    let (p, _) = decode(&b, BOTH, 4096).unwrap().unwrap();
    assert!(!p.data_digest_ok);
}

#[test]
fn term_req_carries_the_bad_header() {
    let h = Header::TermReq {
        from_host: false,
        fes: fes::INVALID_HEADER_FIELD,
        fei: 4,
    };
    let b = encode(&h, 0, &[7; 24], BOTH, 1);
    assert_eq!(b.len(), 48);
    assert_eq!(b[0], pdu_type::C2H_TERM_REQ);
    let (p, _) = decode(&b, BOTH, 4096).unwrap().unwrap();
    assert_eq!(p.header, h);
    assert_eq!(p.data, &[7; 24]);
}

fn any_digests() -> impl Strategy<Value = Digests> {
    (any::<bool>(), any::<bool>()).prop_map(|(header, data)| Digests { header, data })
}

fn any_header() -> impl Strategy<Value = Header> {
    let transfer =
        (any::<u16>(), any::<u16>(), any::<u32>()).prop_map(|(cccid, ttag, offset)| Transfer {
            cccid,
            ttag,
            offset,
            len: 0,
        });
    prop_oneof![
        prop::array::uniform32(any::<u8>()).prop_map(|a| {
            let mut s = [0u8; 64];
            s[..32].copy_from_slice(&a);
            s[32..].copy_from_slice(&a);
            Header::CapsuleCmd(Sqe(s))
        }),
        (any::<u32>(), any::<u16>(), any::<u16>()).prop_map(|(dw0, cid, st)| Header::CapsuleResp(
            Cqe {
                dw0,
                cid,
                status: st,
                ..Default::default()
            }
        )),
        transfer.clone().prop_map(Header::H2CData),
        transfer.clone().prop_map(Header::C2HData),
        transfer.prop_map(|mut t| {
            t.len = 4096;
            Header::R2T(t)
        }),
    ]
}

proptest! {
    #[test]
    fn encode_decode_round_trip(
        header in any_header(),
        digests in any_digests(),
        data in prop::collection::vec(any::<u8>(), 0..300),
        align in prop::sample::select(vec![1usize, 4, 32, 128]),
    ) {
        let carries = matches!(header, Header::CapsuleCmd(_) | Header::H2CData(_) | Header::C2HData(_));
        let data = if carries { data } else { Vec::new() };
        let header = match header {
            Header::H2CData(mut t) => { t.len = data.len() as u32; Header::H2CData(t) }
            Header::C2HData(mut t) => { t.len = data.len() as u32; Header::C2HData(t) }
            h => h,
        };
        let b = encode(&header, 0, &data, digests, align);
        // Appending to a used vector writes the same bytes after what is there.
        let mut appended = vec![0x5a; 3];
        encode_into(&mut appended, &header, 0, &data, digests, align);
        prop_assert_eq!(&appended[..3], &[0x5a; 3]);
        prop_assert_eq!(&appended[3..], &b[..]);
        let (p, n) = decode(&b, digests, 1 << 20).unwrap().unwrap();
        prop_assert_eq!(n, b.len());
        prop_assert_eq!(p.header, header);
        prop_assert_eq!(p.data, &data[..]);
        prop_assert!(p.data_digest_ok);
        // Any prefix is incomplete, never an error.
        for cut in [0, 7, b.len() / 2, b.len() - 1] {
            prop_assert_eq!(decode(&b[..cut], digests, 1 << 20).unwrap(), None);
        }
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512), digests in any_digests()) {
        let _ = decode(&bytes, digests, 4096);
    }
}

#[test]
fn split_transfer_pieces() {
    let t = Transfer {
        cccid: 3,
        ttag: 9,
        offset: 4096,
        len: 300_000,
    };
    let pieces: Vec<_> = split_transfer(t, 131072).collect();
    assert_eq!(pieces.len(), 3);
    assert_eq!(
        (pieces[0].0.offset, pieces[0].0.len, pieces[0].1),
        (4096, 131072, 0)
    );
    assert_eq!(
        (pieces[2].0.offset, pieces[2].0.len, pieces[2].1),
        (4096 + 262144, 300_000 - 262144, flags::LAST_PDU)
    );
    assert!(pieces.iter().all(|(p, _)| p.cccid == 3 && p.ttag == 9));
    assert_eq!(split_transfer(Transfer { len: 0, ..t }, 4096).count(), 0);
}

//! DH-HMAC-CHAP against known answers computed independently (Python's
//! hmac/hashlib/zlib/base64 and integers, `data/dhchap_vectors.py`), the
//! ffdhe2048 case being the Linux crypto test manager's: secrets in DHHC-1
//! form, key transformation, augmented challenges, both responses, and
//! Diffie-Hellman in every RFC 7919 group.

use rdmablk_common::auth::dhchap::{
    augmented_challenge, controller_response, host_response, responses_match, Transaction,
};
use rdmablk_common::auth::ffdhe::{DhError, KeyPair};
use rdmablk_common::auth::{DhGroup, Hash, Secret};
use std::collections::HashMap;

fn vectors() -> HashMap<String, String> {
    include_str!("data/dhchap_vectors.txt")
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn hex(v: &HashMap<String, String>, key: &str) -> Vec<u8> {
    let s = v.get(key).unwrap_or_else(|| panic!("no vector {key}"));
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn diffie_hellman_in_every_group() {
    let v = vectors();
    for g in DhGroup::ALL.into_iter().skip(1) {
        let b = g.bits();
        let pair = KeyPair::from_private(g, &hex(&v, &format!("dh.{b}.private")));
        assert!(
            pair.public() == hex(&v, &format!("dh.{b}.public")),
            "{g:?} public value"
        );
        let z = pair
            .shared_secret(&hex(&v, &format!("dh.{b}.peer")))
            .expect("a valid peer value");
        assert!(
            *z == hex(&v, &format!("dh.{b}.shared")),
            "{g:?} shared secret"
        );
        assert_eq!(pair.public().len(), g.value_len());
    }
}

#[test]
fn peer_values_outside_the_group_are_refused() {
    let pair = KeyPair::generate(DhGroup::Ffdhe2048).expect("random key");
    let len = DhGroup::Ffdhe2048.value_len();
    assert_eq!(pair.shared_secret(&[1]).err(), Some(DhError::Range));
    assert_eq!(
        pair.shared_secret(&vec![0; len]).err(),
        Some(DhError::Range)
    );
    assert_eq!(
        pair.shared_secret(&vec![0xff; len]).err(),
        Some(DhError::Range)
    );
    assert!(matches!(
        pair.shared_secret(&vec![1; len + 1]),
        Err(DhError::Length { .. })
    ));
    // Two fresh pairs agree; a short (unpadded) value is read as padded.
    let other = KeyPair::generate(DhGroup::Ffdhe2048).expect("random key");
    let z1 = pair.shared_secret(other.public()).expect("valid");
    let z2 = other.shared_secret(pair.public()).expect("valid");
    assert!(z1 == z2, "both ends derive the same secret");
    let trimmed: Vec<u8> = pair
        .public()
        .iter()
        .copied()
        .skip_while(|&b| b == 0)
        .collect();
    assert!(*other.shared_secret(&trimmed).expect("unpadded") == *z2);
}

#[test]
fn secrets_transforms_and_responses() {
    let v = vectors();
    let host = &v["nqn.host_text"];
    let subsys = &v["nqn.subsys_text"];
    for h in Hash::ALL {
        for t in [0, h.id()] {
            let pre = format!("chap.{}.t{t}", h.name());
            let hs = Secret::parse(&v[&format!("{pre}.host_secret_text")]).expect("host secret");
            let cs = Secret::parse(&v[&format!("{pre}.ctrl_secret_text")]).expect("ctrl secret");
            assert_eq!(
                hs.to_dhhc1(),
                v[&format!("{pre}.host_secret_text")],
                "round trip"
            );
            let kh = hs.transformed(host);
            let kc = cs.transformed(subsys);
            assert!(*kh == hex(&v, &format!("{pre}.kh")), "{pre}: Kh'");
            assert!(*kc == hex(&v, &format!("{pre}.kc")), "{pre}: Kc'");
            let hl = h.digest_len();
            let c1: Vec<u8> = (0..hl).map(|i| 0xa0 + i as u8).collect();
            let c2: Vec<u8> = (0..hl).map(|i| (0x10 + i) as u8).collect();
            let z = hex(&v, "dh.2048.shared");
            for (dh, z) in [("null", None), ("ffdhe2048", Some(&z[..]))] {
                let a1 = augmented_challenge(h, &c1, z);
                let a2 = augmented_challenge(h, &c2, z);
                assert!(
                    *a1 == hex(&v, &format!("{pre}.{dh}.c1_aug")),
                    "{pre} {dh}: C1'"
                );
                let mut tr = Transaction {
                    hash: h,
                    challenge: &a1,
                    seqnum: 0x1234_5678,
                    tid: 7,
                    host_nqn: host,
                    subsys_nqn: subsys,
                };
                let r1 = host_response(&kh, &tr, 0);
                assert!(
                    responses_match(&hex(&v, &format!("{pre}.{dh}.r1")), &r1),
                    "{pre} {dh}: R1"
                );
                tr.challenge = &a2;
                tr.seqnum = 0x9abc_def0;
                let r2 = controller_response(&kc, &tr);
                assert!(
                    responses_match(&hex(&v, &format!("{pre}.{dh}.r2")), &r2),
                    "{pre} {dh}: R2"
                );
                assert!(!responses_match(&r1, &r2), "R1 and R2 differ");
            }
        }
    }
}

#[test]
fn malformed_secrets_say_why() {
    use rdmablk_common::auth::secret::SecretError;
    let good = Secret::new(&[7; 32], Some(Hash::Sha256)).to_dhhc1();
    assert!(Secret::parse(&good).is_ok());
    assert_eq!(Secret::parse("DHHC-2:01:abc:"), Err(SecretError::Prefix));
    assert!(matches!(
        Secret::parse(&good.replace(":01:", ":04:")),
        Err(SecretError::HashField(_))
    ));
    assert_eq!(Secret::parse("DHHC-1:01:!!!!:"), Err(SecretError::Base64));
    let short = Secret::new(&[7; 16], None).to_dhhc1();
    assert_eq!(Secret::parse(&short), Err(SecretError::Length(16)));
    // One character changed: the CRC catches it.
    let mut typo = good.clone().into_bytes();
    typo[12] = if typo[12] == b'A' { b'B' } else { b'A' };
    assert_eq!(
        Secret::parse(std::str::from_utf8(&typo).expect("ascii")),
        Err(SecretError::Crc)
    );
    assert!(!format!("{:?}", Secret::parse(&good).expect("good")).contains("7"));
}

//! The derivations against the peers' published vectors: libnvme's
//! `test/psk.c` (interchange strings and version 1 identities, in both
//! HKDF-Expand-Label layouts) and the Linux kernel's nvme-auth KUnit test
//! (the PSK digest and the TLS PSK of a version 1 identity). The version 0
//! TLS PSKs have no published vector; theirs were computed independently
//! from the specification's formulas (NVMe/TCP 1.1, 3.6.1.4 and 3.6.1.5)
//! and pin the result.

use super::*;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn k32() -> Vec<u8> {
    hex("5512dbb6737d0106f65975b773dfb011ffc344bcf442e2dd6d8bc4870b5d5b03")
}

fn k48() -> Vec<u8> {
    let mut k = k32();
    k.extend(hex("ffc344bcf442e2dd6d8bc4870b5d5b03"));
    k
}

const HOST: &str = "nqn.psk-test-host";
const SUBSYS: &str = "nqn.psk-test-subsys";

#[test]
fn interchange_strings_are_libnvmes() {
    let cases = [
        (k32(), None, "NVMeTLSkey-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"),
        (k32(), Some(Hash::Sha256), "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"),
        (k48(), Some(Hash::Sha384), "NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ==:"),
    ];
    for (key, transform, text) in cases {
        let k = ConfiguredKey::from_bytes(&key, transform);
        assert_eq!(k.to_interchange(), text);
        assert_eq!(ConfiguredKey::parse(text).unwrap(), k);
    }
}

#[test]
fn bad_interchange_strings_are_refused_without_quoting_the_key() {
    let good = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
    let cases = [
        (
            "DHHC-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
            "NVMeTLSkey-1",
        ),
        (
            "NVMeTLSkey-1:03:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
            "hash field",
        ),
        (
            "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrY:",
            "CRC",
        ),
        (
            "NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
            "48-byte",
        ),
        ("NVMeTLSkey-1:01:not*base64:", "base64"),
    ];
    for (text, why) in cases {
        let e = ConfiguredKey::parse(text).unwrap_err().to_string();
        assert!(e.contains(why), "{text}: {e}");
        assert!(!e.contains("VRLbtn"), "{e}");
    }
    assert!(ConfiguredKey::parse(&format!("  {good}\n")).is_ok());
}

#[test]
fn version_1_identities_are_libnvmes_in_both_label_layouts() {
    let cases = [
        (k32(), Hash::Sha256, Labels::Rfc8446, "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys iSbjiStwJ/1TrTvDlt2fjFmzvsytOJelidNnA+X5lEU="),
        (k48(), Hash::Sha384, Labels::Rfc8446, "NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys QhW2+Rp6RzHlNtCslyRxMnwJ11tKKhz8JCAQpQ+XUD8f9td1VeH5h53yz2wKJG1a"),
        (k32(), Hash::Sha256, Labels::LegacyLibnvme, "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys 66GuqV08TsAGII39teWUfwQwizjv06Jy8jOcX3NAAzM="),
        (k48(), Hash::Sha384, Labels::LegacyLibnvme, "NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys RsKmYJ3nAn1ApjjMloJFbAkLPivONDAX/xW327YBUsn2eGShXSjCZvBaOxscLqmz"),
    ];
    for (key, hash, labels, want) in cases {
        let key = ConfiguredKey::from_bytes(&key, Some(hash));
        let id = Identity::of(1, &key, HOST, SUBSYS, labels);
        assert_eq!(id.to_string(), want);
        assert_eq!(Identity::parse(want.as_bytes()).unwrap(), id);
    }
}

#[test]
fn the_kernels_digest_and_tls_psk_vectors() {
    // nvme_auth_generate_digest / nvme_auth_derive_tls_psk of the KUnit
    // test: the PSK there is the retained one (a 00 key here).
    let cases = [
        ("1733c59fa7f48fcf37f5f26fc4ff0268ad4f78e030f4f3b0bfd1d47e7bb1447a",
         "OldoKuTfKddMuyCznAZojkWD7P4D9/AtzDzLimtOxqI=",
         "3c17da628474a04d2247c4cab47968c915388193f7c071bd9489cc3666cd7cc8"),
        ("f14b2dd3234c459694d3bc63f8968bd6b37c2c6de849e22e118749001ce4bbe8640b9e3a748cb11ce4b1d71d359cce39",
         "cffMWk8TSS7HOQebjgYEIkrPrjWPV4JE5cdPB8WhEvY4JBW5YynKyv66XscN4A9n",
         "2774753233537b3fa50eb7d16a8e43457d85f4906c005b2236616c5d80939d0898fff15bb8b77119d2be0aac423e7590"),
    ];
    for (psk, digest, tls) in cases {
        let key = ConfiguredKey::from_bytes(&hex(psk), None);
        let id = Identity::of(1, &key, "hostnqn", "subsysnqn", Labels::Rfc8446);
        assert_eq!(id.digest.as_deref(), Some(digest));
        let got = id.tls_psk(&key, Labels::Rfc8446).unwrap();
        assert_eq!(*got.key, hex(tls));
    }
}

#[test]
fn version_0_tls_psks() {
    let cases = [
        (k32(), Hash::Sha256, Labels::Rfc8446, "073311dec37e219ff3acd43f130130c5bdd443c066e1cc3424e49030234ff7d5", "05c6503551ad136e6ee32e6eeb3f6d500b69701d84ec71e328f65c7f51566f68"),
        (k48(), Hash::Sha384, Labels::Rfc8446, "73973a1b51a9acdde29a0610ac6a3ef852cf45936cca6830a661d18f68502f1a4c7a8ecb37524e0b1f7087cb4d680ad9", "f42ba63824cdfe421914c582921f85b5b5b7e2d4df084caeedc9be20b212e8bb0fe8a23e9d59a1c8fc6449da4970a78d"),
        (k32(), Hash::Sha256, Labels::LegacyLibnvme, "ad4cdadfcbaf4e353fcbd09aac891c4d75c5300fe5ee7bb04ae87726a312eddc", "09fb1983ac6d6d0353e7cae4f23daddd651c367fa347c59d9cf6936f5a83eafb"),
    ];
    for (key, hash, labels, retained, tls) in cases {
        let key = ConfiguredKey::from_bytes(&key, Some(hash));
        assert_eq!(*key.retained(HOST, labels), hex(retained));
        let id = Identity::of(0, &key, HOST, SUBSYS, labels);
        assert_eq!(
            id.to_string(),
            format!("NVMe0R0{} {HOST} {SUBSYS}", hash.id())
        );
        assert_eq!(*id.tls_psk(&key, labels).unwrap().key, hex(tls));
    }
}

#[test]
fn a_version_1_identity_made_with_another_key_is_refused() {
    let key = ConfiguredKey::from_bytes(&k32(), Some(Hash::Sha256));
    let other = ConfiguredKey::generate(Hash::Sha256).unwrap();
    let id = Identity::of(1, &other, HOST, SUBSYS, Labels::Rfc8446);
    let e = id.tls_psk(&key, Labels::Rfc8446).unwrap_err();
    assert!(e.contains("digest"), "{e}");
    let e = Identity::of(0, &key, HOST, SUBSYS, Labels::Rfc8446)
        .tls_psk(
            &ConfiguredKey::from_bytes(&k48(), Some(Hash::Sha384)),
            Labels::Rfc8446,
        )
        .unwrap_err();
    assert!(e.contains("hash"), "{e}");
}

#[test]
fn malformed_identities_are_refused() {
    for bad in [
        &b"NVMe0R03 h s"[..],
        b"NVMe2R01 h s",
        b"NVMe0R01 h",
        b"NVMe0R01 h s extra",
        b"NVMe1R01 h s",
        b"\xff\xfe",
        b"Client_identity",
    ] {
        assert!(Identity::parse(bad).is_err(), "{bad:?}");
    }
}

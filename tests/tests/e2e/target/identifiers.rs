//! Namespace identifiers from the configuration (`nguid`, `uuid`, `eui64`):
//! a namespace moved here from another target keeps the identifiers its
//! hosts know it by. Identify Namespace (NGUID, EUI64: NVMe Base 2.0,
//! Figure 114 of the NVM Command Set 1.0) and the Namespace Identification
//! Descriptor list (NVMe Base 2.0, 5.17.2.3) carry exactly those given,
//! derived ones stand in for those not given, `status` shows them, and a
//! reload may not change them under a served namespace.

use rdmablk_common::nvme::identify::{cns, NamespaceId, NamespaceIdentifiers};
use rdmablk_tests::check::OrPanic;
use rdmablk_tests::client::{quiet, Controller};
use rdmablk_tests::control::ControlledTarget;
use rdmablk_tests::names::{DEFAULT_NQN, HOST_A};

const UUID: &str = "3a9f0c4e-1b2d-4c5e-8f70-0123456789ab";
const NGUID: &str = "0123456789abcdef0011223344556677";
const EUI64: &str = "002538b571b12345";

fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'-').collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).expect("ascii"), 16).expect("hex"))
        .collect()
}

/// Namespace 1 with all three given, namespace 2 with only a UUID.
fn config(ns1_uuid: &str) -> String {
    format!(
        "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{{port}}\"\n\n\
         [[subsystem]]\nnqn = \"{DEFAULT_NQN}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = \"memory\"\nsize = \"16MiB\"\n\
         uuid = \"{ns1_uuid}\"\nnguid = \"{NGUID}\"\neui64 = \"{EUI64}\"\n\
         [[subsystem.namespace]]\nnsid = 2\nbackend = \"memory\"\nsize = \"16MiB\"\n\
         uuid = \"{}\"\n",
        UUID.replace("ab", "ac")
    )
}

/// What a host reads of namespace `nsid`'s identifiers: the descriptor
/// list, and Identify Namespace's NGUID and EUI64 fields.
fn read_ids(c: &Controller, nsid: u32) -> (NamespaceIdentifiers, NamespaceId) {
    let mut a = c.admin();
    let list = a
        .identify(cns::NS_DESCRIPTORS, nsid)
        .or_panic("Namespace Identification Descriptor list");
    let id = a
        .identify(cns::NAMESPACE, nsid)
        .or_panic("Identify Namespace");
    (NamespaceIdentifiers::parse(&list), NamespaceId::parse(&id))
}

#[test]
fn given_identifiers_are_what_hosts_read_and_a_reload_keeps_them() {
    let _machine = crate::shared();
    let d = ControlledTarget::start(&config(UUID));
    let c = Controller::open(d.t.addr(), DEFAULT_NQN, HOST_A, &quiet()).or_panic("connect");

    let (list, id) = read_ids(&c, 1);
    assert_eq!(
        list.uuid.map(|u| u.to_vec()),
        Some(hex(UUID)),
        "uuid descriptor"
    );
    assert_eq!(
        list.nguid.map(|u| u.to_vec()),
        Some(hex(NGUID)),
        "nguid descriptor"
    );
    assert_eq!(
        list.eui64.map(|u| u.to_vec()),
        Some(hex(EUI64)),
        "eui64 descriptor"
    );
    assert_eq!(id.nguid.to_vec(), hex(NGUID), "Identify Namespace NGUID");
    assert_eq!(id.eui64.to_vec(), hex(EUI64), "Identify Namespace EUI64");

    // Only a UUID given: an NGUID derived (neither zero nor namespace 1's),
    // no EUI-64 at all.
    let (list2, id2) = read_ids(&c, 2);
    assert_eq!(
        list2.uuid.map(|u| u.to_vec()),
        Some(hex(&UUID.replace("ab", "ac")))
    );
    let nguid2 = list2.nguid.expect("a derived NGUID");
    assert!(
        nguid2 != [0; 16] && nguid2.to_vec() != hex(NGUID),
        "{nguid2:02x?}"
    );
    assert_eq!(id2.nguid, nguid2, "the same NGUID in both structures");
    assert_eq!(
        (list2.eui64, id2.eui64),
        (None, [0; 8]),
        "no EUI-64 derived"
    );

    let (ok, status, err) = d.run(&["status"]);
    assert!(ok, "status: {err}");
    for want in [
        format!("nguid {NGUID} (given), uuid {UUID} (given), eui64 {EUI64} (given)"),
        format!("uuid {} (given)", UUID.replace("ab", "ac")),
    ] {
        assert!(status.contains(&want), "status lacks {want:?}:\n{status}");
    }

    // Changing a served namespace's identifiers is refused, naming them;
    // the namespace keeps its own.
    d.write(&config(&UUID.replace("ab", "ad")));
    let (ok, out, err) = d.run(&["reload"]);
    assert!(!ok, "reload took new identifiers: {out}");
    assert!(
        err.contains("subsystem[0].namespace[0].nguid/uuid/eui64"),
        "the refusal names the keys: {err}"
    );
    let (after, _) = read_ids(&c, 1);
    assert_eq!(after, list, "identifiers after the refused reload");
}

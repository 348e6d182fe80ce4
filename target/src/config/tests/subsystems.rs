//! `[[subsystem]]` tables: NQNs, hosts and their DH-HMAC-CHAP settings.

use super::{assert_invalid, minimal, HOST};
use crate::config::nqn::DISCOVERY_NQN;
use crate::config::parse;
use rdmablk_common::auth::{DhGroup, Hash, Secret};

/// Hashes and DH groups are checked by name, each error at its index.
#[test]
fn dhchap_names_are_checked() {
    let key = Secret::new(&[1; 32], None).to_dhhc1();
    let table = |extra: &str| {
        minimal(
            "",
            &format!("[[subsystem.host]]\nnqn = \"{HOST}\"\ndhchap_secret = \"{key}\"\n{extra}"),
        )
    };
    let ok = parse(&table(
        "dhchap_hash = [\"sha512\"]\ndhchap_dhgroup = [\"null\"]",
    ))
    .expect("valid");
    assert_eq!(ok.subsystems[0].auth[0].hashes, vec![Hash::Sha512]);
    assert_eq!(ok.subsystems[0].auth[0].dh_groups, vec![DhGroup::Null]);
    assert_invalid(
        &table("dhchap_hash = [\"sha256\", \"md5\"]"),
        "subsystem[0].host[0].dhchap_hash[1]",
        "\"md5\": use \"sha256\"",
    );
    assert_invalid(
        &table("dhchap_dhgroup = [\"ffdhe1024\"]"),
        "subsystem[0].host[0].dhchap_dhgroup[0]",
        "use \"null\" or \"ffdhe2048\"",
    );
}

#[test]
fn subsystem_rules() {
    let listener_only = "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:4420\"\n";
    assert_invalid(listener_only, "subsystem", "no subsystem");

    let second = |body: &str| {
        minimal(
            "",
            &format!(
                "[[subsystem]]\n{body}\n[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\""
            ),
        )
    };
    assert_invalid(
        &second("nqn = \"nqn.2026-11.io.example:a\"\nallow_any_host = true"),
        "subsystem[1].nqn",
        "already used by subsystem[0]",
    );
    assert_invalid(
        &second(&format!("nqn = \"{DISCOVERY_NQN}\"\nallow_any_host = true")),
        "subsystem[1].nqn",
        "discovery",
    );
    assert_invalid(
        &second("nqn = \"iqn.2026-11.io.example:a\"\nallow_any_host = true"),
        "subsystem[1].nqn",
        "not a valid NQN",
    );
    assert_invalid(
        &second("allow_any_host = true"),
        "subsystem[1].nqn",
        "missing",
    );
    assert_invalid(
        &second("nqn = \"nqn.2026-11.io.example:b\""),
        "subsystem[1].hosts",
        "no host could ever connect: list host NQNs in hosts = [...] or set allow_any_host = true",
    );
    assert_invalid(
        &second(&format!(
            "nqn = \"nqn.2026-11.io.example:b\"\nhosts = [\"{HOST}\", \"host1\"]"
        )),
        "subsystem[1].hosts[1]",
        "not a valid host NQN",
    );
    assert!(parse(&second(&format!(
        "nqn = \"nqn.2026-11.io.example:b\"\nhosts = [\"{HOST}\"]"
    )))
    .is_ok());

    let no_namespace = minimal(
        "",
        "[[subsystem]]\nnqn = \"nqn.2026-11.io.example:b\"\nallow_any_host = true",
    );
    assert_invalid(&no_namespace, "subsystem[1].namespace", "no namespace");
}

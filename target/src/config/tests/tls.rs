//! TLS settings: a listener's `tls`, hosts' `tls_key` in `[[subsystem.host]]`.

use super::{assert_invalid, minimal, HOST};
use crate::config::holds_inline_secrets;
use crate::config::{parse, ListenerTls};
use rdmablk_common::tls::key::{ConfiguredKey, Hash, Labels};

fn with_listener(line: &str, transport: &str) -> String {
    minimal("", "").replacen(
        "transport = \"tcp\"\naddress = \"127.0.0.1:4420\"\n",
        &format!("transport = \"{transport}\"\naddress = \"127.0.0.1:4420\"\n{line}\n"),
        1,
    )
}

#[test]
fn listener_tls_modes() {
    let mode = |line: &str| parse(&with_listener(line, "tcp")).expect("valid").listeners[0].tls;
    assert_eq!(mode(""), ListenerTls::Off);
    assert_eq!(mode("tls = \"required\""), ListenerTls::Required);
    assert_eq!(mode("tls = \"optional\""), ListenerTls::Optional);
    assert_invalid(
        &with_listener("tls = \"yes\"", "tcp"),
        "listener[0].tls",
        "use \"required\" (TLS only) or \"optional\"",
    );
    assert_invalid(
        &with_listener("tls = \"required\"", "rdma"),
        "listener[0].tls",
        "an RDMA listener takes none",
    );
}

#[test]
fn a_host_table_gives_a_tls_key_a_dhchap_secret_or_both() {
    let key = ConfiguredKey::from_bytes(&[3; 32], Some(Hash::Sha256)).to_interchange();
    let host = |extra: &str| {
        minimal(
            &format!("[[subsystem.host]]\nnqn = \"{HOST}\"\n{extra}"),
            "",
        )
    };
    let c = parse(&host(&format!("tls_key = \"{key}\""))).expect("valid");
    let t = &c.subsystems[0].tls_keys[0];
    assert_eq!((t.nqn.as_str(), t.labels), (HOST, Labels::Rfc8446));
    assert_eq!(t.key, ConfiguredKey::parse(&key).unwrap());
    assert!(c.subsystems[0].auth.is_empty());
    let legacy = parse(&host(&format!(
        "tls_key = \"{key}\"\ntls_key_legacy = true"
    )))
    .expect("valid");
    assert_eq!(
        legacy.subsystems[0].tls_keys[0].labels,
        Labels::LegacyLibnvme
    );
    assert_invalid(
        &host(""),
        "subsystem[0].host[0].dhchap_secret",
        "or its TLS key (tls_key, tls_key_file)",
    );
    assert_invalid(
        &host("tls_key = \"NVMeTLSkey-1:01:bm90IGEga2V5:\""),
        "subsystem[0].host[0].tls_key",
        "NVMeTLSkey-1:01:<base64>:",
    );
    assert_invalid(
        &host(&format!("tls_key = \"{key}\"\ntls_key_file = \"/etc/k\"")),
        "subsystem[0].host[0].tls_key",
        "keep one",
    );
    assert_invalid(
        &host(&format!("tls_key = \"{key}\"\ndhchap_hash = [\"sha256\"]")),
        "subsystem[0].host[0].dhchap_secret",
        "while other dhchap_ keys are given",
    );
    assert!(holds_inline_secrets(&host(&format!("tls_key = \"{key}\""))));
    assert!(!holds_inline_secrets(&host("tls_key_file = \"/etc/k\"")));
}

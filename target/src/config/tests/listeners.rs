//! `[[listener]]` and `[metrics]` addresses.

use super::{assert_invalid, minimal};
use crate::config::{parse, ConfigError, Transport};

/// `[metrics] listen`: an address with a port, not an NVMe/TCP
/// listener's; without it (or the table), no endpoint.
#[test]
fn metrics_rules() {
    assert_eq!(parse(&minimal("", "")).expect("valid").metrics, None);
    assert_eq!(
        parse(&minimal("", "[metrics]")).expect("valid").metrics,
        None
    );
    let on = parse(&minimal("", "[metrics]\nlisten = \"[::1]:9469\""))
        .expect("valid")
        .metrics;
    assert_eq!(on, Some("[::1]:9469".parse().unwrap()));
    for bad in ["localhost:9469", "127.0.0.1", "127.0.0.1:0", ""] {
        let text = minimal("", &format!("[metrics]\nlisten = {bad:?}"));
        assert_invalid(&text, "metrics.listen", "not an IP address with a port");
    }
    let clash = minimal("", "[metrics]\nlisten = \"0.0.0.0:4420\"");
    assert_invalid(
        &clash,
        "metrics.listen",
        "overlaps the NVMe/TCP listener on 127.0.0.1:4420",
    );
    let typo = minimal("", "[metrics]\naddress = \"127.0.0.1:9469\"");
    assert!(matches!(parse(&typo), Err(ConfigError::Syntax(_))));
}

#[test]
fn transport_display() {
    assert_eq!(Transport::Tcp.to_string(), "tcp");
    assert_eq!(Transport::Rdma.to_string(), "rdma");
}

#[test]
fn listener_rules() {
    let subsystem = "[[subsystem]]\nnqn = \"nqn.2026-11.io.example:a\"\nallow_any_host = true\n\
                     [[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\"\n";
    assert_invalid(subsystem, "listener", "no listener");

    let dup = minimal(
        "",
        "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:4420\"",
    );
    assert_invalid(&dup, "listener[1]", "duplicates listener[0]");
    let same_addr_other_transport = minimal(
        "",
        "[[listener]]\ntransport = \"rdma\"\naddress = \"127.0.0.1:4420\"",
    );
    assert!(parse(&same_addr_other_transport).is_ok());

    for (listener, key, part) in [
        (
            "transport = \"udp\"\naddress = \"1.2.3.4:4420\"",
            "listener[1].transport",
            "\"tcp\" or \"rdma\"",
        ),
        (
            "address = \"1.2.3.4:4420\"",
            "listener[1].transport",
            "missing",
        ),
        ("transport = \"tcp\"", "listener[1].address", "missing"),
        (
            "transport = \"tcp\"\naddress = \"localhost:4420\"",
            "listener[1].address",
            "host names",
        ),
        (
            "transport = \"tcp\"\naddress = \"10.0.0.1\"",
            "listener[1].address",
            "\"10.0.0.1:4420\"",
        ),
        (
            "transport = \"tcp\"\naddress = \"::1\"",
            "listener[1].address",
            "\"[::1]:4420\"",
        ),
        (
            "transport = \"tcp\"\naddress = \"::1:4420\"",
            "listener[1].address",
            "no port",
        ),
        (
            "transport = \"tcp\"\naddress = \"1.2.3.4:0\"",
            "listener[1].address",
            "port 0",
        ),
    ] {
        assert_invalid(
            &minimal("", &format!("[[listener]]\n{listener}")),
            key,
            part,
        );
    }
}

//! `[[listener]]` and `[metrics]` addresses.

use super::{assert_invalid, minimal};
use crate::config::{parse, AnaState, ConfigError, Transport};
use std::collections::BTreeMap;

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

/// `ana_groups` on a listener: group id to state; groups not named are
/// optimized.
#[test]
fn ana_groups_rules() {
    let listener = |groups: &str| {
        minimal(
            "",
            &format!(
                "[[listener]]\ntransport = \"tcp\"\naddress = \"10.0.0.1:4420\"\n\
                 ana_groups = {{ {groups} }}"
            ),
        )
    };
    let config = parse(&listener(
        "1 = \"optimized\", 2 = \"non-optimized\", 3 = \"inaccessible\", \
         128 = \"persistent-loss\"",
    ))
    .expect("valid");
    let l = &config.listeners[1];
    assert_eq!(
        l.ana_groups,
        BTreeMap::from([
            (1, AnaState::Optimized),
            (2, AnaState::NonOptimized),
            (3, AnaState::Inaccessible),
            (128, AnaState::PersistentLoss),
        ])
    );
    assert_eq!(l.ana_state(2), AnaState::NonOptimized);
    assert_eq!(l.ana_state(4), AnaState::Optimized, "unnamed: optimized");
    let plain = &config.listeners[0];
    assert!(plain.ana_groups.is_empty());
    assert_eq!(plain.ana_state(1), AnaState::Optimized);
    assert_eq!(plain.ana_state(2), AnaState::Optimized);

    for (groups, key, part) in [
        (
            "1 = \"standby\"",
            "ana_groups.1",
            "\"standby\" is not an ANA state",
        ),
        ("0 = \"optimized\"", "ana_groups.0", "use 1 to 128"),
        ("129 = \"optimized\"", "ana_groups.129", "use 1 to 128"),
        ("-1 = \"optimized\"", "ana_groups.-1", "use 1 to 128"),
        (
            "primary = \"optimized\"",
            "ana_groups.primary",
            "use 1 to 128",
        ),
        ("2 = \"change\"", "ana_groups.2", "transitional"),
        ("2 = \"change\"", "ana_groups.2", "ana set GROUP change"),
    ] {
        assert_invalid(&listener(groups), &format!("listener[1].{key}"), part);
    }
    // A state is a name, not a number.
    assert!(matches!(
        parse(&listener("1 = 1")),
        Err(ConfigError::Syntax(_))
    ));
}

/// A listener is its transport and address: other ANA states do not make
/// it another one.
#[test]
fn ana_groups_do_not_tell_listeners_apart() {
    let text = minimal(
        "",
        "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:4420\"\n\
         ana_groups = { 1 = \"non-optimized\", 2 = \"inaccessible\" }",
    );
    assert_invalid(&text, "listener[1]", "duplicates listener[0]");
}

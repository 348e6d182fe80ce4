//! NQN syntax, and the exact texts of the typed NQN and address reasons.

use super::HOST;
use crate::config::listener::{parse_socket_addr, AddressError};
use crate::config::nqn::{validate_nqn, NqnError, DISCOVERY_NQN, NQN_UUID_PREFIX};
use crate::config::DEFAULT_NQN;
use std::net::SocketAddr;

#[test]
fn nqn_syntax() {
    for good in [
        "nqn.2026-11.io.rdmablk:disk0",
        "nqn.2014-08.com.example:nvme:nvm-subsystem-sn-d78432",
        "nqn.1999-01.io:x",
        "nqn.2026-11.a-b.c0:name with spaces and ünïcode",
        HOST,
        "nqn.2014-08.org.nvmexpress:uuid:3F2A9C1E-5B7D-4E08-9A61-0C4D2B8E7F15",
        DEFAULT_NQN,
    ] {
        assert_eq!(validate_nqn(good), Ok(()), "{good}");
    }
    let exactly_max = format!("nqn.2026-11.io.example:{}", "x".repeat(223 - 23));
    assert_eq!(exactly_max.len(), 223);
    assert_eq!(validate_nqn(&exactly_max), Ok(()));

    for (bad, reason_part) in [
        (format!("{exactly_max}x"), "at most 223 bytes"),
        ("".to_owned(), "\"nqn.\""),
        ("iqn.2026-11.io.example:a".to_owned(), "\"nqn.\""),
        ("nqn.2026-13.io.example:a".to_owned(), "YYYY-MM"),
        ("nqn.2026-00.io.example:a".to_owned(), "YYYY-MM"),
        ("nqn.26-11.io.example:a".to_owned(), "YYYY-MM"),
        ("nqn.2026-1.io.example:a".to_owned(), "YYYY-MM"),
        ("nqn.2026-11:a".to_owned(), "reverse domain"),
        ("nqn.2026".to_owned(), "YYYY-MM"),
        ("nqn.2026-11.io.example".to_owned(), "no ':'"),
        (DISCOVERY_NQN.to_owned(), "no ':'"),
        ("nqn.2026-11.:a".to_owned(), "domain"),
        ("nqn.2026-11.io..example:a".to_owned(), "domain"),
        ("nqn.2026-11.IO.Example:a".to_owned(), "lowercase"),
        ("nqn.2026-11.io_example:a".to_owned(), "domain"),
        ("nqn.2026-11.io.example:".to_owned(), "empty"),
        ("nqn.2026-11.io.example:a\0b".to_owned(), "control"),
        (format!("{NQN_UUID_PREFIX}3f2a9c1e-5b7d-4e08-9a61"), "UUID"),
        (
            format!("{NQN_UUID_PREFIX}3f2a9c1e5b7d4e089a610c4d2b8e7f15"),
            "UUID",
        ),
        (
            format!("{NQN_UUID_PREFIX}3f2a9c1e-5b7d-4e08-9a61-0c4d2b8e7f1g"),
            "UUID",
        ),
        (
            format!("{NQN_UUID_PREFIX}3f2a9c1e-5b7d-4e08-9a61-0c4d2b8e7f15-"),
            "UUID",
        ),
        (NQN_UUID_PREFIX.to_owned(), "UUID"),
    ] {
        let reason = validate_nqn(&bad).expect_err(&bad).to_string();
        assert!(reason.contains(reason_part), "{bad:?}: {reason:?}");
    }
}

/// The typed reasons and their exact texts: daemon error messages and
/// operators' scripts depend on these words.
#[test]
fn nqn_and_address_reason_texts() {
    const FORMS: &str = "expected nqn.YYYY-MM.reverse.domain:name \
                         (e.g. nqn.2026-11.io.example:disk0) \
                         or nqn.2014-08.org.nvmexpress:uuid:<8-4-4-4-12 hex UUID>";
    let too_long = format!("nqn.2026-11.io.example:{}", "x".repeat(201));
    for (nqn, error, reason) in [
        (
            too_long.as_str(),
            NqnError::TooLong { len: 224 },
            "it is 224 bytes long; an NQN may be at most 223 bytes".to_owned(),
        ),
        (
            "nqn.2026-11.io.example:a\0b",
            NqnError::ControlCharacter,
            "it contains a control character".to_owned(),
        ),
        (
            "nqn.2014-08.org.nvmexpress:uuid:xyz",
            NqnError::BadUuid { uuid: "xyz".into() },
            "\"xyz\" after \"uuid:\" is not a UUID in 8-4-4-4-12 hex form \
             (e.g. 3f2a9c1e-5b7d-4e08-9a61-0c4d2b8e7f15)"
                .to_owned(),
        ),
        (
            "iqn.2026-11.io.example:a",
            NqnError::MissingPrefix,
            format!("it does not start with \"nqn.\"; {FORMS}"),
        ),
        (
            "nqn.2026-13.io.example:a",
            NqnError::BadDate {
                date: "2026-13".into(),
            },
            format!("\"2026-13\" after \"nqn.\" is not a year-month date YYYY-MM; {FORMS}"),
        ),
        (
            "nqn.2026-11:a",
            NqnError::MissingDomain,
            format!("the date must be followed by \".\" and a reverse domain name; {FORMS}"),
        ),
        (
            "nqn.2026-11.io.example",
            NqnError::MissingName,
            format!("there is no ':' followed by a name after the domain; {FORMS}"),
        ),
        (
            "nqn.2026-11.IO.Example:a",
            NqnError::BadDomain {
                domain: "IO.Example".into(),
            },
            format!(
                "domain \"IO.Example\" is not a reverse domain name: it needs one or more \
                 labels of lowercase letters, digits and '-' separated by single dots; \
                 {FORMS}"
            ),
        ),
        (
            "nqn.2026-11.io.example:",
            NqnError::EmptyName,
            format!("the name after ':' is empty; {FORMS}"),
        ),
    ] {
        let got = validate_nqn(nqn).expect_err(nqn);
        assert_eq!(got, error, "{nqn:?}");
        assert_eq!(got.to_string(), reason, "{nqn:?}");
    }

    let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
    for (address, error, problem) in [
        (
            "127.0.0.1:0",
            AddressError::PortZero {
                suggestion: addr("127.0.0.1:4420"),
            },
            "port 0 is not allowed; give a fixed port, usually 4420 (e.g. \"127.0.0.1:4420\")",
        ),
        (
            "[::1]:0",
            AddressError::PortZero {
                suggestion: addr("[::1]:4420"),
            },
            "port 0 is not allowed; give a fixed port, usually 4420 (e.g. \"[::1]:4420\")",
        ),
        (
            "10.0.0.1",
            AddressError::NoPort {
                input: "10.0.0.1".into(),
                suggestion: addr("10.0.0.1:4420"),
            },
            "\"10.0.0.1\" has no port; add one, e.g. \"10.0.0.1:4420\"",
        ),
        (
            "[fe80::1]",
            AddressError::NoPort {
                input: "[fe80::1]".into(),
                suggestion: addr("[fe80::1]:4420"),
            },
            "\"[fe80::1]\" has no port; add one, e.g. \"[fe80::1]:4420\"",
        ),
        (
            "::1:4420",
            AddressError::NoPort {
                input: "::1:4420".into(),
                suggestion: addr("[::1:4420]:4420"),
            },
            "\"::1:4420\" has no port; add one, e.g. \"[::1:4420]:4420\"",
        ),
        (
            "localhost:4420",
            AddressError::NotAnAddress {
                input: "localhost:4420".into(),
            },
            "\"localhost:4420\" is not an IP address and port; use e.g. \
             \"0.0.0.0:4420\", or \"[::1]:4420\" for IPv6 (host names are not resolved)",
        ),
    ] {
        let got = parse_socket_addr(address).expect_err(address);
        assert_eq!(got, error, "{address:?}");
        assert_eq!(got.to_string(), problem, "{address:?}");
    }
    assert_eq!(parse_socket_addr("[::]:4420"), Ok(addr("[::]:4420")));
}

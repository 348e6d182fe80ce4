//! `[gateway_group]`.

use super::{assert_invalid, minimal};
use crate::config::parse;
use std::time::Duration;

#[test]
fn gateway_group_rules() {
    let group = |body: &str| format!("[gateway_group]\n{body}\n{}", minimal("", ""));
    let cfg = parse(&group(
        "name = \"rack-1\"\ngateway = \"gw-a\"\npreferred = { 1 = \"gw-a\", 2 = \"gw-b\" }",
    ))
    .expect("valid");
    let g = cfg.gateway_group.expect("a group");
    assert_eq!(
        (g.name.as_str(), g.gateway.as_str(), g.pool.as_str()),
        ("rack-1", "gw-a", "rbd")
    );
    assert_eq!(
        (g.lease, g.failback_delay),
        (Duration::from_secs(3), Duration::from_secs(10))
    );
    assert_eq!(g.preferred.get(&2).map(String::as_str), Some("gw-b"));
    assert_eq!(g.ceph_conf.to_str(), Some("/etc/ceph/ceph.conf"));
    assert!(parse(&minimal("", ""))
        .expect("valid")
        .gateway_group
        .is_none());

    for (body, key, part) in [
        ("gateway = \"gw-a\"", "gateway_group.name", "missing"),
        ("name = \"g\"", "gateway_group.gateway", "missing"),
        (
            "name = \"a b\"\ngateway = \"gw-a\"",
            "gateway_group.name",
            "letters, digits",
        ),
        (
            "name = \"g\"\ngateway = \"\"",
            "gateway_group.gateway",
            "1 to 64",
        ),
        (
            "name = \"g\"\ngateway = \"gw-a\"\nlease = \"500ms\"",
            "gateway_group.lease",
            "shortest",
        ),
        (
            "name = \"g\"\ngateway = \"gw-a\"\npreferred = { 0 = \"gw-a\" }",
            "gateway_group.preferred.0",
            "out of range",
        ),
        (
            "name = \"g\"\ngateway = \"gw-a\"\npreferred = { 1 = \"gw a\" }",
            "gateway_group.preferred.1",
            "letters",
        ),
    ] {
        assert_invalid(&group(body), key, part);
    }
    // The leases decide every ANA state: a listener's own are refused.
    let text = group("name = \"g\"\ngateway = \"gw-a\"").replace(
        "address = \"127.0.0.1:4420\"",
        "address = \"127.0.0.1:4420\"\nana_groups = { 1 = \"optimized\" }",
    );
    assert_invalid(&text, "listener[0].ana_groups", "remove ana_groups");
}

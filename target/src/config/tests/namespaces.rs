//! `[[subsystem.namespace]]` tables.

use super::{assert_invalid, minimal};
use crate::config::{parse, ConfigError, DEFAULT_NQN};

#[test]
fn namespace_rules() {
    let ns = "subsystem[0].namespace[0]";
    for (extra, key, part) in [
        ("nsid = 0", "nsid", "1 to 1024"),
        ("nsid = 1025", "nsid", "1 to 1024"),
        ("nsid = -1", "nsid", "1 to 1024"),
        ("block_size = 1000", "block_size", "use 512 or 4096"),
        ("block_size = -512", "block_size", "use 512 or 4096"),
        ("block_size = 8192", "block_size", "use 512 or 4096"),
    ] {
        assert_invalid(&minimal(extra, ""), &format!("{ns}.{key}"), part);
    }

    let namespace = |body: &str| {
        let text = "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:4420\"\n\
                    [[subsystem]]\nnqn = \"nqn.2026-11.io.example:a\"\nallow_any_host = true\n\
                    [[subsystem.namespace]]\n";
        format!("{text}{body}")
    };
    for (body, key, part) in [
        ("size = \"1GiB\"", "backend", "missing"),
        ("backend = \"disk\"\nsize = \"1GiB\"", "backend", "\"file\""),
        ("backend = \"file\"", "path", "missing"),
        ("backend = \"file\"\npath = \"\"", "path", "empty"),
        (
            "backend = \"file\"\npath = \"/x\"\nsize = 1000",
            "size",
            "multiple of block_size 512",
        ),
        (
            "backend = \"file\"\npath = \"/x\"\nsize = 0",
            "size",
            "greater than 0",
        ),
        ("backend = \"memory\"", "size", "missing"),
        ("backend = \"null\"", "size", "missing"),
        (
            "backend = \"memory\"\nsize = \"1GiB\"\npath = \"/x\"",
            "path",
            "only backend = \"file\"",
        ),
        ("backend = \"null\"\nsize = \"0\"", "size", "greater than 0"),
        (
            "backend = \"null\"\nsize = \"1GiB\"\nblock_size = 4096",
            "",
            "",
        ),
        (
            "backend = \"memory\"\nsize = \"6k\"\nblock_size = 4096",
            "size",
            "\"4KiB\"",
        ),
        ("backend = \"memory\"\nsize = 513", "size", "not a multiple"),
        ("backend = \"memory\"\nsize = -4096", "size", "negative"),
        (
            "backend = \"memory\"\nsize = \"1.5GiB\"",
            "size",
            "whole number",
        ),
        (
            "backend = \"memory\"\nsize = \"1GB\"",
            "size",
            "unknown unit",
        ),
    ] {
        let text = namespace(body);
        if key.is_empty() {
            assert!(parse(&text).is_ok(), "{body}");
        } else {
            assert_invalid(&text, &format!("{ns}.{key}"), part);
        }
    }
}

#[test]
fn duplicate_nsids_are_rejected() {
    let explicit = minimal(
        "nsid = 3",
        "[[subsystem.namespace]]\nnsid = 3\nbackend = \"null\"\nsize = \"1GiB\"",
    );
    assert_invalid(
        &explicit,
        "subsystem[0].namespace[1].nsid",
        "nsid 3 is already used by subsystem[0].namespace[0]",
    );
    // An explicit nsid colliding with a later namespace's positional default.
    let positional = minimal(
        "nsid = 2",
        "[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\"",
    );
    assert_invalid(
        &positional,
        "subsystem[0].namespace[1].nsid",
        "already used",
    );
}

/// `ana_group`: 1 unless given, 1 to 128.
#[test]
fn ana_group_rules() {
    let config = parse(&minimal(
        "",
        "[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\"\nana_group = 2\n\
         [[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\"\nana_group = 128",
    ))
    .expect("valid");
    let groups: Vec<u32> = config.subsystems[0]
        .namespaces
        .iter()
        .map(|ns| ns.ana_group)
        .collect();
    assert_eq!(groups, [1, 2, 128]);

    for group in ["0", "129", "-1"] {
        assert_invalid(
            &minimal(&format!("ana_group = {group}"), ""),
            "subsystem[0].namespace[0].ana_group",
            &format!("ANA group {group} is out of range; use 1 to 128"),
        );
    }
    assert!(matches!(
        parse(&minimal("ana_group = \"2\"", "")),
        Err(ConfigError::Syntax(_))
    ));
}

/// `hosts`, `qos` and `host_qos`: read as written; refused with the key
/// named when malformed, or naming a host that could never use them.
#[test]
fn tenancy_rules() {
    let a = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a";
    let b = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b";
    let limits = format!(
        "hosts = [\"{a}\", \"{b}\"]\nqos = {{ read_iops = 2000, write_bandwidth = \"50MiB\" }}\n\
         [[subsystem.namespace.host_qos]]\nnqn = \"{a}\"\niops = 100\nbandwidth = 8192\n"
    );
    let cfg = parse(&minimal(&limits, "")).expect("valid");
    let ns = &cfg.subsystems[0].namespaces[0];
    assert_eq!(
        ns.hosts.as_deref(),
        Some(&[a.to_string(), b.to_string()][..])
    );
    assert_eq!(
        ns.qos.to_string(),
        "read_iops 2000, write_bandwidth 50MiB/s"
    );
    assert_eq!(ns.host_qos[0].nqn, a);
    assert_eq!(
        ns.host_qos[0].limits.to_string(),
        "iops 100, bandwidth 8KiB/s"
    );
    assert!(ns.visible_to(a) && !ns.visible_to(DEFAULT_NQN));
    // 8 KiB/s would hold a 1 MiB command for two minutes: valid, but said.
    let w = cfg.warnings();
    assert!(
        w.iter()
            .any(|w| w.starts_with("subsystem[0].namespace[0]: a bandwidth limit below 1MiB/s")),
        "{w:?}"
    );

    let key = "subsystem[0].namespace[0]";
    for (extra, at, part) in [
        ("qos = { iops = 0 }", "qos.iops", "not a positive number"),
        (
            "qos = { read_iops = -5 }",
            "qos.read_iops",
            "not a positive number",
        ),
        (
            "qos = { bandwidth = \"1KiB\" }",
            "qos.bandwidth",
            "below the smallest",
        ),
        (
            "qos = { write_bandwidth = \"5MB\" }",
            "qos.write_bandwidth",
            "unknown unit",
        ),
        (
            &format!("qos = {{ nqn = \"{a}\", iops = 5 }}"),
            "qos.nqn",
            "host_qos",
        ),
        (
            "hosts = [\"not-an-nqn\"]",
            "hosts[0]",
            "not a valid host NQN",
        ),
        (
            &format!("hosts = [\"{a}\", \"{a}\"]"),
            "hosts[1]",
            "listed twice",
        ),
        (
            &format!("[[subsystem.namespace.host_qos]]\nnqn = \"{a}\""),
            "host_qos[0]",
            "no limit given",
        ),
        (
            "[[subsystem.namespace.host_qos]]\niops = 5",
            "host_qos[0].nqn",
            "missing",
        ),
        (
            &format!(
                "hosts = [\"{b}\"]\n[[subsystem.namespace.host_qos]]\nnqn = \"{a}\"\niops = 5"
            ),
            "host_qos[0].nqn",
            "does not see this namespace",
        ),
    ] {
        assert_invalid(&minimal(extra, ""), &format!("{key}.{at}"), part);
    }
    assert!(matches!(
        parse(&minimal("qos = { iops = 5, burst = 3 }", "")),
        Err(ConfigError::Syntax(_))
    ));
    // A host the subsystem does not admit.
    let closed = minimal(&format!("hosts = [\"{b}\"]"), "")
        .replace("allow_any_host = true", &format!("hosts = [\"{a}\"]"));
    assert_invalid(
        &closed,
        &format!("{key}.hosts[0]"),
        "may not connect to the subsystem",
    );
}

/// `nguid`, `uuid` and `eui64`: read as nvme-cli and nvmet write them,
/// refused with the key named when malformed, all zeroes or used twice in
/// a subsystem.
#[test]
fn identifier_rules() {
    let config = parse(&minimal(
        "uuid = \"3A9F0C4E-1B2D-4C5E-8F70-0123456789AB\"\n\
         nguid = \"3a9f0c4e-1b2d-4c5e-8f70-0123456789ac\"\neui64 = \"00:25:38:b5:71:b1:23:45\"",
        "[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\"\n\
         nguid = \"3a9f0c4e1b2d4c5e8f700123456789ad\"",
    ))
    .expect("valid");
    let ns = &config.subsystems[0].namespaces;
    let uuid = ns[0].ids.uuid.expect("uuid");
    assert_eq!((uuid[0], uuid[15]), (0x3a, 0xab));
    assert_eq!(ns[0].ids.nguid.expect("nguid")[15], 0xac);
    assert_eq!(
        ns[0].ids.eui64,
        Some([0x00, 0x25, 0x38, 0xb5, 0x71, 0xb1, 0x23, 0x45])
    );
    assert_eq!((ns[1].ids.uuid, ns[1].ids.eui64), (None, None));

    let key = "subsystem[0].namespace[0]";
    for (extra, name, part) in [
        (
            "uuid = \"3a9f0c4e-1b2d-4c5e-8f70\"",
            "uuid",
            "32 hex digits, not 20",
        ),
        (
            "nguid = \"3a9f0c4e1b2d4c5e8f700123456789zz\"",
            "nguid",
            "'z' is not a hex digit",
        ),
        ("eui64 = \"0000000000000000\"", "eui64", "all zeroes"),
        (
            "eui64 = \"002538b5 71b1234\"",
            "eui64",
            "' ' is not a hex digit",
        ),
        (
            "eui64 = \"002538b571b1234567\"",
            "eui64",
            "e.g. eui64 = \"002538b571b12345\"",
        ),
    ] {
        assert_invalid(&minimal(extra, ""), &format!("{key}.{name}"), part);
    }
    assert!(matches!(
        parse(&minimal("eui64 = 42", "")),
        Err(ConfigError::Syntax(_))
    ));
    for name in ["uuid", "nguid", "eui64"] {
        let id = if name == "eui64" {
            "002538b571b12345"
        } else {
            "3a9f0c4e1b2d4c5e8f700123456789ab"
        };
        assert_invalid(
            &minimal(
                &format!("{name} = \"{id}\""),
                &format!("[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\"\n{name} = \"{id}\""),
            ),
            &format!("subsystem[0].namespace[1].{name}"),
            &format!("the same {name} as subsystem[0].namespace[0]"),
        );
    }
}

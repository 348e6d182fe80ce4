//! The whole file: the shipped example, defaults, TOML-level errors and
//! [`load`](crate::config::load).

use super::{assert_syntax, minimal, EXAMPLE, HOST};
use crate::config::listener::default_listener;
use crate::config::model::MAX_POLLERS;
use crate::config::nqn::validate_nqn;
use crate::config::{
    embedded_default, holds_inline_secrets, load, parse, AnaState, BackendConfig, ConfigError,
    GivenIds, Limits, ListenerConfig, NamespaceConfig, Pollers, QosLimits, Transport, DEFAULT_NQN,
    MAX_CNTLID,
};
use rdmablk_common::auth::Secret;
use rdmablk_common::spin::SpinBounds;
use std::path::PathBuf;
use std::time::Duration;

#[test]
fn example_parses() {
    let config = parse(EXAMPLE).expect("shipped example must be valid");
    assert_eq!(
        config.listeners,
        vec![ListenerConfig::new(
            Transport::Tcp,
            "0.0.0.0:4420".parse().unwrap()
        )]
    );
    assert_eq!(config.pollers.arena_bytes, 64 << 20);
    assert!(!config.pollers.busy_poll);
    assert_eq!(config.metrics, Some("127.0.0.1:9469".parse().unwrap()));
    assert_eq!(
        config.limits,
        Limits::default(),
        "the example shows the defaults"
    );
    assert_eq!(config.subsystems.len(), 2);

    let disk = &config.subsystems[0];
    assert!(!disk.allow_any_host);
    assert!(!disk.hosts.is_empty());
    assert_eq!(disk.namespaces.len(), 1);
    assert_eq!(disk.namespaces[0].nsid, 1);
    assert_eq!(
        disk.namespaces[0].backend,
        BackendConfig::File {
            path: PathBuf::from("/var/lib/rdmablk/disk0.img"),
            create_size: Some(10 << 30),
        }
    );

    let ramdisk = &config.subsystems[1];
    assert!(matches!(
        ramdisk.namespaces[0].backend,
        BackendConfig::Memory { .. }
    ));
}

/// Only a secret given inline in a `[[subsystem.host]]` table makes the
/// file itself secret: comments and `*_file` keys do not.
#[test]
fn inline_secrets_are_found_in_host_tables_only() {
    assert!(
        !holds_inline_secrets(EXAMPLE),
        "the example's secrets are comments"
    );
    let key = Secret::new(&[1; 32], None).to_dhhc1();
    let table = |k: &str| {
        minimal(
            "",
            &format!("[[subsystem.host]]\nnqn = \"{HOST}\"\n{k} = \"{key}\""),
        )
    };
    assert!(holds_inline_secrets(&table("dhchap_secret")));
    assert!(holds_inline_secrets(&table("dhchap_ctrl_secret")));
    assert!(!holds_inline_secrets(&table("dhchap_secret_file")));
}

#[test]
fn example_mentions_rdma_listener() {
    assert!(EXAMPLE.contains("transport = \"rdma\""));
}

/// The packaged /etc/rdmablk/target.toml serves what the daemon serves
/// with no arguments: a memory namespace on loopback to any host.
#[test]
fn the_packaged_default_is_the_embedded_default() {
    let packaged = parse(include_str!("../../../../config/default.toml")).expect("default.toml");
    let embedded = embedded_default();
    assert_eq!(packaged.listeners, embedded.listeners);
    assert_eq!(packaged.subsystems.len(), 1);
    let (p, e) = (&packaged.subsystems[0], &embedded.subsystems[0]);
    assert_eq!((&p.nqn, p.allow_any_host), (&e.nqn, e.allow_any_host));
    assert_eq!(p.namespaces, e.namespaces);
}

#[test]
fn embedded_default_is_valid() {
    let config = embedded_default();
    config.validate().unwrap();
    assert_eq!(config.listeners, vec![default_listener()]);
    assert_eq!(config.listeners[0].address.to_string(), "127.0.0.1:4420");
    let subsystem = &config.subsystems[0];
    assert_eq!(subsystem.nqn, DEFAULT_NQN);
    assert!(subsystem.allow_any_host);
    assert_eq!(
        subsystem.namespaces,
        vec![NamespaceConfig {
            nsid: 1,
            backend: BackendConfig::Memory { size: 1 << 30 },
            block_size: 512,
            read_only: false,
            ana_group: 1,
            reservations: true,
            hosts: None,
            qos: QosLimits::default(),
            host_qos: Vec::new(),
            ids: GivenIds::default(),
        }]
    );
    assert_eq!(config.pollers, Pollers::default());
    assert!(validate_nqn(DEFAULT_NQN).is_ok());
}

#[test]
fn defaults_are_applied() {
    let config = parse(&minimal("", "")).unwrap();
    assert_eq!(config.pollers, Pollers::default());
    assert!((1..=MAX_POLLERS).contains(&config.pollers.count));
    let ns = &config.subsystems[0].namespaces[0];
    assert_eq!(ns.nsid, 1);
    assert_eq!(ns.block_size, 512);
    assert!(!ns.read_only);
    assert!(config.subsystems[0].hosts.is_empty());
}

#[test]
fn positional_nsids_and_explicit_values() {
    let text = minimal(
        "block_size = 4096\nread_only = true",
        "[[subsystem.namespace]]\nbackend = \"null\"\nsize = 1048576\n\
         [[subsystem.namespace]]\nnsid = 7\nbackend = \"file\"\npath = \"/dev/null\"\n\
         [pollers]\ncount = 3\narena = 8388608\nbusy_poll = true\nspin_max = \"40us\"\n\
         [[listener]]\ntransport = \"RDMA\"\naddress = \"[::1]:4420\"",
    );
    let config = parse(&text).unwrap();
    assert_eq!(
        config.pollers,
        Pollers {
            count: 3,
            arena_bytes: 8 << 20,
            busy_poll: true,
            spin: SpinBounds::new(SpinBounds::DEFAULT.min, Duration::from_micros(40)).unwrap(),
        }
    );
    assert_eq!(config.listeners[1].transport, Transport::Rdma);
    assert_eq!(config.listeners[1].address.to_string(), "[::1]:4420");
    let ns = &config.subsystems[0].namespaces;
    assert_eq!(
        (ns[0].nsid, ns[0].block_size, ns[0].read_only),
        (1, 4096, true)
    );
    assert_eq!(ns[1].nsid, 2);
    assert_eq!(ns[1].backend, BackendConfig::Null { size: 1 << 20 });
    assert_eq!(ns[2].nsid, 7);
    assert_eq!(
        ns[2].backend,
        BackendConfig::File {
            path: PathBuf::from("/dev/null"),
            create_size: None,
        }
    );
}

#[test]
fn error_display_reads_key_colon_problem() {
    let text = minimal(
        "",
        "[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\"\nblock_size = 1000",
    );
    assert_eq!(
        parse(&text).unwrap_err().to_string(),
        "subsystem[0].namespace[1].block_size: 1000 is not a supported LBA size; use 512 or 4096"
    );
}

#[test]
fn unknown_keys_are_rejected_by_name() {
    assert_syntax(&format!("colour = \"blue\"\n{}", minimal("", "")), "colour");
    assert_syntax(&minimal("", "colour = \"blue\""), "colour");
    assert_syntax(
        &minimal("", "[[listeners]]\ntransport = \"tcp\""),
        "listeners",
    );
    assert_syntax(&minimal("", "[pollers]\nthreads = 4"), "threads");
    assert_syntax(
        &minimal(
            "",
            "[[listener]]\ntransport = \"tcp\"\naddress = \"1.2.3.4:1\"\nport = 1",
        ),
        "port",
    );
    assert_syntax(
        &minimal(
            "",
            "[[subsystem]]\nnqn = \"nqn.2026-11.io.example:b\"\nallow_any_hosts = true",
        ),
        "allow_any_hosts",
    );
    assert_syntax(&minimal("blocksize = 4096", ""), "blocksize");
}

#[test]
fn toml_errors_keep_line_and_column() {
    let text = minimal("size = ", "");
    match parse(&text) {
        Err(ConfigError::Syntax(msg)) => {
            assert!(msg.contains("line 10"), "{msg}");
            assert!(msg.contains("column"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    assert_syntax(&minimal("read_only = \"yes\"", ""), "read_only");
    assert_syntax(
        &minimal(
            "",
            "[[subsystem.namespace]]\nbackend = \"null\"\nsize = 1.5",
        ),
        "integer number of bytes",
    );
    assert_syntax("[[listener]\n", "line");
}

#[test]
fn load_reads_the_file_and_names_it_on_error() {
    let dir = std::env::temp_dir();
    let path = dir.join(format!("rdmablk-config-test-{}.toml", std::process::id()));
    std::fs::write(&path, EXAMPLE).unwrap();
    let loaded = load(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded.unwrap(), parse(EXAMPLE).unwrap());

    let missing = dir.join("rdmablk-config-test-does-not-exist.toml");
    let err = load(&missing).unwrap_err();
    assert!(matches!(err, ConfigError::Io { .. }));
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
}

/// The two gateway examples export one subsystem: the same NQN, hosts and
/// namespaces (nsid, storage, ANA group), disjoint controller ids, and each
/// the optimized path for the group the other reports non-optimized.
#[test]
fn gateway_examples_pair_up() {
    let a = parse(include_str!("../../../../config/gateway-a.toml")).expect("gateway-a.toml");
    let b = parse(include_str!("../../../../config/gateway-b.toml")).expect("gateway-b.toml");
    let (sa, sb) = (&a.subsystems[..], &b.subsystems[..]);
    assert_eq!((sa.len(), sb.len()), (1, 1));
    let (sa, sb) = (&sa[0], &sb[0]);
    assert_eq!(sa.nqn, sb.nqn);
    assert!(!sa.allow_any_host && !sb.allow_any_host);
    assert!(!sa.hosts.is_empty());
    assert_eq!(sa.hosts, sb.hosts);
    assert_eq!(
        sa.namespaces, sb.namespaces,
        "nsid, storage, ana_group alike"
    );
    let groups: Vec<(u32, u32)> = sa
        .namespaces
        .iter()
        .map(|n| (n.nsid, n.ana_group))
        .collect();
    assert_eq!(groups, [(1, 1), (2, 2)]);
    for ns in &sa.namespaces {
        assert!(
            matches!(
                ns.backend,
                BackendConfig::File {
                    create_size: None,
                    ..
                }
            ),
            "shared storage is never created: {:?}",
            ns.backend
        );
    }
    assert!(
        sa.cntlids.end() < sb.cntlids.start(),
        "disjoint controller ids: {:?} and {:?}",
        sa.cntlids,
        sb.cntlids
    );
    assert_eq!(*sb.cntlids.end(), MAX_CNTLID);

    assert_eq!((a.listeners.len(), b.listeners.len()), (1, 1));
    let (la, lb) = (&a.listeners[0], &b.listeners[0]);
    assert_ne!(la.address, lb.address);
    use AnaState::{NonOptimized, Optimized};
    assert_eq!(
        (la.ana_state(1), la.ana_state(2)),
        (Optimized, NonOptimized)
    );
    assert_eq!(
        (lb.ana_state(1), lb.ana_state(2)),
        (NonOptimized, Optimized)
    );
    assert_eq!(la.ana_groups.len(), 2);
    assert_eq!(lb.ana_groups.len(), 2);
}

/// The fields the parser accepts in a table, read off its refusal of an
/// unknown one ("unknown field `zz`, expected one of `a`, `b`").
fn accepted_fields(probe: &str) -> Vec<String> {
    let msg = match parse(probe) {
        Err(ConfigError::Syntax(msg)) => msg,
        other => panic!("{probe}: expected an unknown field, got {other:?}"),
    };
    let expected = msg
        .split_once("expected")
        .unwrap_or_else(|| panic!("{msg}"))
        .1;
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The configuration reference (config/target.toml, rendered as the man
/// page rdmablk-target.toml(5)) names every key the parser accepts, in
/// every table: a key added to the parser without its documentation fails
/// here.
#[test]
fn every_key_the_parser_accepts_is_in_the_reference() {
    use crate::config::manual::{key_of, REFERENCE};
    let documented: std::collections::BTreeSet<&str> = REFERENCE
        .lines()
        .map(|l| l.trim().trim_start_matches('#').trim())
        .filter_map(key_of)
        .collect();
    let tables: Vec<&str> = REFERENCE
        .lines()
        .map(|l| l.trim().trim_start_matches('#').trim())
        .filter(|l| l.starts_with('['))
        .collect();
    let sub = "[[subsystem]]\nnqn = \"nqn.2026-11.io.example:a\"\n";
    let ns = format!("{sub}[[subsystem.namespace]]\n");
    let probes = [
        ("the file", "zz = 1\n".to_string()),
        ("[pollers]", "[pollers]\nzz = 1\n".into()),
        ("[limits]", "[limits]\nzz = 1\n".into()),
        ("[metrics]", "[metrics]\nzz = 1\n".into()),
        ("[reservations]", "[reservations]\nzz = 1\n".into()),
        ("[gateway_group]", "[gateway_group]\nzz = 1\n".into()),
        ("[[listener]]", "[[listener]]\nzz = 1\n".into()),
        ("[[subsystem]]", format!("{sub}zz = 1\n")),
        (
            "[[subsystem.host]]",
            format!("{sub}[[subsystem.host]]\nzz = 1\n"),
        ),
        ("[[subsystem.namespace]]", format!("{ns}zz = 1\n")),
        ("qos", format!("{ns}qos = {{ zz = 1 }}\n")),
        (
            "[[subsystem.namespace.host_qos]]",
            format!("{ns}[[subsystem.namespace.host_qos]]\nzz = 1\n"),
        ),
    ];
    let mut missing = Vec::new();
    for (table, probe) in &probes {
        let fields = accepted_fields(probe);
        assert!(!fields.is_empty(), "{table}: {fields:?}");
        for f in fields {
            // A key, or a table of its own ([[subsystem.host]] for host).
            let found = documented.contains(f.as_str())
                || tables.iter().any(|t| {
                    let name = t.trim_matches(|c| c == '[' || c == ']');
                    name.rsplit('.').next() == Some(f.as_str())
                });
            if !found {
                missing.push(format!("{table} {f}"));
            }
        }
    }
    assert!(missing.is_empty(), "not in config/target.toml: {missing:?}");
}

//! The command-line quick form and `--listen` URLs.

use crate::config::nqn::DISCOVERY_NQN;
use crate::config::quick::parse_listen_url;
use crate::config::{
    embedded_default, from_quick_args, BackendConfig, Config, ConfigError, GivenIds,
    ListenerConfig, NamespaceConfig, QosLimits, QuickArgs, Transport,
};
use std::path::PathBuf;

fn quick(f: impl FnOnce(&mut QuickArgs)) -> Result<Config, ConfigError> {
    let mut q = QuickArgs::default();
    f(&mut q);
    from_quick_args(&q)
}

#[track_caller]
fn assert_quick_invalid(f: impl FnOnce(&mut QuickArgs), key: &str, part: &str) {
    match quick(f) {
        Err(ConfigError::Invalid { key: k, problem }) => {
            assert_eq!(k, key, "{problem}");
            assert!(problem.contains(part), "{problem:?} lacks {part:?}");
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn quick_memory_defaults() {
    let config = quick(|q| q.memory = Some("1GiB".into())).unwrap();
    assert_eq!(config, embedded_default());
}

#[test]
fn quick_file_over_rdma_with_nqn() {
    let config = quick(|q| {
        q.listen = vec!["rdma://10.0.0.1:4420".into(), "tcp://[::1]:4421".into()];
        q.file = Some(PathBuf::from("/dev/nvme0n1"));
        q.nqn = Some("nqn.2026-11.io.example:fast".into());
        q.block_size = Some(4096);
    })
    .unwrap();
    assert_eq!(
        config.listeners,
        vec![
            ListenerConfig::new(Transport::Rdma, "10.0.0.1:4420".parse().unwrap()),
            ListenerConfig::new(Transport::Tcp, "[::1]:4421".parse().unwrap()),
        ]
    );
    let subsystem = &config.subsystems[0];
    assert_eq!(subsystem.nqn, "nqn.2026-11.io.example:fast");
    assert!(subsystem.allow_any_host);
    assert_eq!(
        subsystem.namespaces,
        vec![NamespaceConfig {
            nsid: 1,
            backend: BackendConfig::File {
                path: PathBuf::from("/dev/nvme0n1"),
                create_size: None,
            },
            block_size: 4096,
            read_only: false,
            ana_group: 1,
            reservations: true,
            hosts: None,
            qos: QosLimits::default(),
            host_qos: Vec::new(),
            ids: GivenIds::default(),
        }]
    );
}

#[test]
fn quick_null() {
    let config = quick(|q| q.null = Some("2g".into())).unwrap();
    assert_eq!(
        config.subsystems[0].namespaces[0].backend,
        BackendConfig::Null { size: 2 << 30 }
    );
}

#[test]
fn quick_errors() {
    assert_quick_invalid(|_| {}, "--memory/--file/--null/--rbd", "exactly one");
    assert_quick_invalid(
        |q| {
            q.memory = Some("1GiB".into());
            q.null = Some("1GiB".into());
        },
        "--memory/--file/--null/--rbd",
        "--memory and --null were given together",
    );
    assert_quick_invalid(
        |q| {
            q.memory = Some("1GiB".into());
            q.file = Some("/x".into());
            q.null = Some("1GiB".into());
        },
        "--memory/--file/--null/--rbd",
        "--memory and --file and --null",
    );
    assert_quick_invalid(
        |q| q.memory = Some("1 gigabyte".into()),
        "--memory",
        "unknown unit",
    );
    assert_quick_invalid(|q| q.null = Some("0".into()), "--null", "greater than 0");
    assert_quick_invalid(
        |q| {
            q.memory = Some("6k".into());
            q.block_size = Some(4096);
        },
        "--memory",
        "multiple of block_size 4096",
    );
    assert_quick_invalid(|q| q.file = Some(PathBuf::new()), "--file", "empty path");
    assert_quick_invalid(
        |q| {
            q.memory = Some("1GiB".into());
            q.block_size = Some(1024);
        },
        "--block-size",
        "512 or 4096",
    );
    assert_quick_invalid(
        |q| {
            q.memory = Some("1GiB".into());
            q.nqn = Some("disk0".into());
        },
        "--nqn",
        "not a valid NQN",
    );
    assert_quick_invalid(
        |q| {
            q.memory = Some("1GiB".into());
            q.nqn = Some(DISCOVERY_NQN.into());
        },
        "--nqn",
        "discovery",
    );
    assert_quick_invalid(
        |q| {
            q.memory = Some("1GiB".into());
            q.listen = vec!["tcp://127.0.0.1:4420".into(), "tcp://127.0.0.1:4420".into()];
        },
        "--listen",
        "given twice",
    );
}

#[test]
fn listen_urls() {
    let l = parse_listen_url("tcp://127.0.0.1:4420").unwrap();
    assert_eq!(
        (l.transport, l.address.to_string().as_str()),
        (Transport::Tcp, "127.0.0.1:4420")
    );
    let l = parse_listen_url("rdma://[fe80::1]:4420").unwrap();
    assert_eq!((l.transport, l.address.port()), (Transport::Rdma, 4420));

    for (url, part) in [
        ("127.0.0.1:4420", "not a listen URL"),
        ("udp://127.0.0.1:4420", "unknown transport \"udp\""),
        ("tcp://127.0.0.1", "no port"),
        ("tcp://localhost:4420", "host names"),
        ("tcp://127.0.0.1:4420/", "not an IP address and port"),
        ("tcp://127.0.0.1:0", "port 0"),
        ("", "not a listen URL"),
    ] {
        match parse_listen_url(url) {
            Err(ConfigError::Invalid { key, problem }) => {
                assert_eq!(key, "--listen");
                assert!(problem.contains(part), "{url}: {problem:?}");
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}

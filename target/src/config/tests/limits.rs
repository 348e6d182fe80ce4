//! `[pollers]` and `[limits]`, and the warning they may give.

use super::{assert_invalid, assert_syntax, minimal};
use crate::config::{parse, Limits};
use rdmablk_common::spin::{PollMode, SpinBounds};
use std::time::Duration;

#[test]
fn poller_rules() {
    for (pollers, part) in [
        ("count = 0", "1 to 256"),
        ("count = 257", "1 to 256"),
        ("count = -3", "1 to 256"),
        ("arena = \"2MiB\"", "minimum of 4MiB"),
        ("arena = 4194303", "minimum"),
        ("arena = \"4098k\"", "multiple of 4KiB"),
        ("arena = \"64 furlongs\"", "unknown unit"),
        ("arena = -1", "negative"),
    ] {
        let key = if pollers.starts_with("count") {
            "pollers.count"
        } else {
            "pollers.arena"
        };
        assert_invalid(&minimal("", &format!("[pollers]\n{pollers}")), key, part);
    }
    let ok = parse(&minimal("", "[pollers]\ncount = 256\narena = \"4MiB\"")).unwrap();
    assert_eq!((ok.pollers.count, ok.pollers.arena_bytes), (256, 4 << 20));
}

#[test]
fn spin_window_rules() {
    for (pollers, key, part) in [
        ("spin_min = \"0us\"", "pollers.spin_min", "above zero"),
        (
            "spin_min = \"200us\"",
            "pollers.spin_min",
            "above its maximum",
        ),
        ("spin_max = \"2s\"", "pollers.spin_max", "busy polling"),
        (
            "spin_max = \"5 parsecs\"",
            "pollers.spin_max",
            "unknown unit",
        ),
        ("spin_min = -5", "pollers.spin_min", "negative"),
    ] {
        assert_invalid(&minimal("", &format!("[pollers]\n{pollers}")), key, part);
    }
    let p = parse(&minimal("", "")).unwrap().pollers;
    assert_eq!(p.mode(), PollMode::Adaptive(SpinBounds::DEFAULT));
    let p = parse(&minimal(
        "",
        "[pollers]\nspin_min = \"2us\"\nspin_max = \"1ms\"",
    ))
    .unwrap();
    let want = SpinBounds::new(Duration::from_micros(2), Duration::from_millis(1)).unwrap();
    assert_eq!(p.pollers.mode(), PollMode::Adaptive(want));
    // A maximum of zero: sleep as soon as idle, whatever the minimum.
    let p = parse(&minimal("", "[pollers]\nspin_max = \"0us\"")).unwrap();
    assert_eq!(p.pollers.mode(), PollMode::Adaptive(SpinBounds::SLEEP));
    let p = parse(&minimal("", "[pollers]\nbusy_poll = true")).unwrap();
    assert_eq!(p.pollers.mode(), PollMode::Busy);
}

#[test]
fn one_host_holding_every_arena_is_a_warning() {
    let mut cfg = parse(&minimal("", "[pollers]\ncount = 2\narena = \"64MiB\"")).unwrap();
    assert!(cfg.warnings().is_empty(), "defaults: 16 x 8MiB = 2 x 64MiB");
    assert_eq!(cfg.limits.association_buffer(cfg.pollers.arenas()), 8 << 20);
    // One poller (the quick form's --pollers 1): the default is sized from
    // its arena, and nothing warns.
    cfg.pollers.count = 1;
    assert!(cfg.warnings().is_empty(), "{:?}", cfg.warnings());
    assert_eq!(cfg.limits.association_buffer(cfg.pollers.arenas()), 4 << 20);
    // Given in the file, it over-commits: a warning.
    let cfg = parse(&minimal(
        "",
        "[pollers]\ncount = 1\narena = \"64MiB\"\n[limits]\nassociation_buffer = \"8MiB\"",
    ))
    .unwrap();
    let w = cfg.warnings();
    assert_eq!(w.len(), 1);
    assert!(w[0].contains("limits.associations_per_host 16"), "{}", w[0]);
    // Never below a queue's own buffer.
    let cfg = parse(&minimal(
        "",
        "[pollers]\ncount = 1\narena = \"16MiB\"\n[limits]\nqueue_buffer = \"2MiB\"",
    ))
    .unwrap();
    assert_eq!(cfg.limits.association_buffer(cfg.pollers.arenas()), 2 << 20);
}

#[test]
fn limit_rules() {
    for (limits, key, part) in [
        ("connections = 0", "limits.connections", "at least 1"),
        (
            "queue_buffer = \"512KiB\"",
            "limits.queue_buffer",
            "largest transfer",
        ),
        (
            "queue_buffer = \"128MiB\"",
            "limits.queue_buffer",
            "pollers.arena",
        ),
        (
            "discovery_buffer = \"4KiB\"",
            "limits.discovery_buffer",
            "256KiB",
        ),
        (
            "queue_buffer = \"8MiB\"\nassociation_buffer = \"4MiB\"",
            "limits.association_buffer",
            "queue_buffer",
        ),
        ("send_timeout = \"10ms\"", "limits.send_timeout", "100ms"),
        ("data_timeout = -1", "limits.data_timeout", "negative"),
        (
            "enable_timeout = \"3 fortnights\"",
            "limits.enable_timeout",
            "unit",
        ),
    ] {
        assert_invalid(&minimal("", &format!("[limits]\n{limits}")), key, part);
    }
    let ok = parse(&minimal(
        "",
        "[limits]\nsend_timeout = \"1500ms\"\ndata_timeout = 7\nconnections = 3",
    ))
    .unwrap();
    assert_eq!(ok.limits.send_timeout, Duration::from_millis(1500));
    assert_eq!(ok.limits.data_timeout, Duration::from_secs(7));
    assert_eq!(ok.limits.connections, 3);
    assert_eq!(ok.limits.queue_buffer, Limits::default().queue_buffer);
    assert_syntax(&minimal("", "[limits]\nconections = 3"), "conections");
}

//! The Prometheus text exposition (format 0.0.4) a scrape of the metrics
//! endpoint gets, rendered from the counters.

use crate::app::gateway::status::GroupStatus;
use crate::base::metrics::{NsMetrics, PollerCounters, BUCKETS, LATENCY_BOUNDS_US, OPS};
use crate::engine::poller::Shared;
use crate::nvme::namespace::Namespace;
use rdmablk_common::nvme::Status;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Escapes a label value (backslash, double quote, newline).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes a family's HELP and TYPE lines.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The whole exposition (`group`: this gateway's group, when in one).
pub fn render(shared: &Shared, started: Instant, group: Option<&GroupStatus>) -> String {
    let mut out = String::with_capacity(16 << 10);
    let r = &shared.registry;
    family(
        &mut out,
        "rdmablk_build_info",
        "gauge",
        "The running rdmablk-target's version.",
    );
    let _ = writeln!(
        out,
        "rdmablk_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    family(
        &mut out,
        "rdmablk_uptime_seconds",
        "gauge",
        "Seconds since the daemon started.",
    );
    let _ = writeln!(
        out,
        "rdmablk_uptime_seconds {:.3}",
        started.elapsed().as_secs_f64()
    );
    family(
        &mut out,
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU time of the daemon.",
    );
    let cpu = rdmablk_common::usage::process_cpu().as_secs_f64();
    let _ = writeln!(out, "process_cpu_seconds_total {cpu:.6}");
    family(
        &mut out,
        "rdmablk_connections",
        "gauge",
        "Connections (queues) open, connected or not.",
    );
    let _ = writeln!(
        out,
        "rdmablk_connections {}",
        shared.connections.load(Ordering::Acquire)
    );

    let subsystems = r.subsystems();
    let namespaces: Vec<(&str, Arc<Namespace>)> = subsystems
        .iter()
        .flat_map(|s| {
            s.namespaces()
                .iter()
                .map(|n| (s.nqn.as_str(), n.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    family(
        &mut out,
        "rdmablk_ana_state",
        "gauge",
        "1 for the ANA state each listener reports for an ANA group (groups with namespaces, and groups not optimized).",
    );
    let groups: BTreeSet<u32> = namespaces.iter().map(|(_, n)| n.ana_group()).collect();
    for p in r.ports() {
        let url = label(&format!("{}://{}", p.profile.kind, p.addr));
        for (g, s) in p.ana.shown(&groups) {
            let _ = writeln!(
                out,
                "rdmablk_ana_state{{listener=\"{url}\",group=\"{g}\",state=\"{s}\"}} 1"
            );
        }
    }
    let ns_labels =
        |nqn: &str, n: &Namespace| format!("subsystem=\"{}\",nsid=\"{}\"", label(nqn), n.nsid);
    family(
        &mut out,
        "rdmablk_namespace_size_bytes",
        "gauge",
        "Size of the namespace.",
    );
    for (nqn, n) in &namespaces {
        let _ = writeln!(
            out,
            "rdmablk_namespace_size_bytes{{{}}} {}",
            ns_labels(nqn, n),
            n.blocks() * n.block_size as u64
        );
    }
    family(
        &mut out,
        "rdmablk_namespace_commands_total",
        "counter",
        "I/O commands answered, by operation (other: flush, write zeroes, dataset management).",
    );
    for (nqn, n) in &namespaces {
        for (op, name) in OPS {
            let v = n.metrics.commands(op);
            let _ = writeln!(
                out,
                "rdmablk_namespace_commands_total{{{},op=\"{name}\"}} {v}",
                ns_labels(nqn, n)
            );
        }
    }
    family(
        &mut out,
        "rdmablk_namespace_bytes_total",
        "counter",
        "Bytes read and written by successful commands.",
    );
    for (nqn, n) in &namespaces {
        for (op, name) in &OPS[..2] {
            let v = n.metrics.bytes(*op);
            let _ = writeln!(
                out,
                "rdmablk_namespace_bytes_total{{{},op=\"{name}\"}} {v}",
                ns_labels(nqn, n)
            );
        }
    }
    family(
        &mut out,
        "rdmablk_namespace_errors_total",
        "counter",
        "I/O commands answered with an error, by NVMe status.",
    );
    for (nqn, n) in &namespaces {
        for (key, v) in n.metrics.errors() {
            let (name, sct, sc) = match key {
                Some(k) => {
                    let st = Status {
                        sct: (k >> 8) as u8,
                        sc: k as u8,
                    };
                    (
                        st.name().to_string(),
                        st.sct.to_string(),
                        format!("{:#04x}", st.sc),
                    )
                }
                None => ("other".to_string(), String::new(), String::new()),
            };
            let _ = writeln!(
                out,
                "rdmablk_namespace_errors_total{{{},status=\"{}\",sct=\"{sct}\",sc=\"{sc}\"}} {v}",
                ns_labels(nqn, n),
                label(&name)
            );
        }
    }
    family(
        &mut out,
        "rdmablk_namespace_commands_in_flight",
        "gauge",
        "I/O commands received and not yet answered.",
    );
    for (nqn, n) in &namespaces {
        let _ = writeln!(
            out,
            "rdmablk_namespace_commands_in_flight{{{}}} {}",
            ns_labels(nqn, n),
            n.metrics.in_flight()
        );
    }
    for (name, kind, help, pick) in [
        (
            "rdmablk_namespace_throttled_commands_total",
            "counter",
            "I/O commands held back by QoS limits.",
            (|m: &NsMetrics| m.throttled() as f64) as fn(&NsMetrics) -> f64,
        ),
        (
            "rdmablk_namespace_throttled_seconds_total",
            "counter",
            "Time I/O commands spent held back by QoS limits, summed over commands.",
            |m: &NsMetrics| m.throttled_ns() as f64 / 1e9,
        ),
        (
            "rdmablk_namespace_commands_queued",
            "gauge",
            "I/O commands held back by QoS limits now.",
            |m: &NsMetrics| m.queued() as f64,
        ),
    ] {
        family(&mut out, name, kind, help);
        for (nqn, n) in &namespaces {
            let _ = writeln!(out, "{name}{{{}}} {}", ns_labels(nqn, n), pick(&n.metrics));
        }
    }
    family(
        &mut out,
        "rdmablk_namespace_qos_limit",
        "gauge",
        "QoS limits per second (commands, or bytes for the bandwidths), for all hosts (host=\"\") or one host.",
    );
    for (nqn, n) in &namespaces {
        let (shared, hosts) = n.tenancy.limits();
        for (host, limits) in std::iter::once((String::new(), shared)).chain(hosts) {
            for (k, v) in limits.iter() {
                let _ = writeln!(
                    out,
                    "rdmablk_namespace_qos_limit{{{},host=\"{}\",limit=\"{}\"}} {v}",
                    ns_labels(nqn, n),
                    label(&host),
                    k.name()
                );
            }
        }
    }
    // Latency: a time counter per namespace (its mean is the rate of this
    // over the rate of its commands), the distribution per subsystem: a
    // histogram per namespace would be some fifty series each, too many
    // for a gateway with thousands.
    family(
        &mut out,
        "rdmablk_namespace_command_seconds_total",
        "counter",
        "Time from commands' arrival to their response, summed, by operation.",
    );
    for (nqn, n) in &namespaces {
        let l = ns_labels(nqn, n);
        for (op, name) in OPS {
            let sum = n.metrics.latency_ns(op) as f64 / 1e9;
            let _ = writeln!(
                out,
                "rdmablk_namespace_command_seconds_total{{{l},op=\"{name}\"}} {sum:.9}"
            );
        }
    }
    family(
        &mut out,
        "rdmablk_subsystem_command_duration_seconds",
        "histogram",
        "Time from a command's arrival to its response, by operation, over the subsystem's namespaces.",
    );
    for s in subsystems.iter() {
        let l = format!("subsystem=\"{}\"", label(&s.nqn));
        let members = s.namespaces();
        for (op, name) in OPS {
            let mut buckets = [0u64; BUCKETS];
            let mut sum_ns = 0u64;
            for n in members.iter() {
                for (b, v) in n.metrics.latency_buckets(op).iter().enumerate() {
                    buckets[b] += v;
                }
                sum_ns += n.metrics.latency_ns(op);
            }
            let mut cumulative = 0u64;
            for (b, bound) in LATENCY_BOUNDS_US.iter().enumerate() {
                cumulative += buckets[b];
                let _ = writeln!(
                    out,
                    "rdmablk_subsystem_command_duration_seconds_bucket{{{l},op=\"{name}\",le=\"{}\"}} {cumulative}",
                    *bound as f64 / 1e6
                );
            }
            cumulative += buckets[BUCKETS - 1];
            let _ = writeln!(
                out,
                "rdmablk_subsystem_command_duration_seconds_bucket{{{l},op=\"{name}\",le=\"+Inf\"}} {cumulative}"
            );
            let sum = sum_ns as f64 / 1e9;
            let _ = writeln!(
                out,
                "rdmablk_subsystem_command_duration_seconds_sum{{{l},op=\"{name}\"}} {sum:.9}\nrdmablk_subsystem_command_duration_seconds_count{{{l},op=\"{name}\"}} {cumulative}"
            );
        }
    }

    // Hosts: live controllers and their queues, by host NQN, transport and
    // whether they are encrypted.
    let mut hosts: BTreeMap<(String, &'static str, bool), (u64, u64)> = BTreeMap::new();
    for s in subsystems.iter().chain([&r.discovery]) {
        for c in s.live_controllers() {
            let e = hosts
                .entry((c.hostnqn.clone(), c.caps().transport, c.tls().is_some()))
                .or_default();
            e.0 += 1;
            e.1 += c.queues_connected() as u64;
        }
    }
    for (name, help, pick) in [
        (
            "rdmablk_host_controllers",
            "Live controllers (associations), by host NQN, transport and TLS.",
            (|v: &(u64, u64)| v.0) as fn(&(u64, u64)) -> u64,
        ),
        (
            "rdmablk_host_queues",
            "Connected queues (admin and I/O), by host NQN, transport and TLS.",
            |v: &(u64, u64)| v.1,
        ),
    ] {
        family(&mut out, name, "gauge", help);
        for ((host, transport, tls), v) in &hosts {
            let _ = writeln!(
                out,
                "{name}{{host=\"{}\",transport=\"{transport}\",tls=\"{tls}\"}} {}",
                label(host),
                pick(v)
            );
        }
    }
    family(
        &mut out,
        "rdmablk_poller_arena_bytes_in_use",
        "gauge",
        "Arena bytes the poller holds: commands' data and RDMA receive buffers.",
    );
    for (i, p) in shared.pollers.iter().enumerate() {
        let _ = writeln!(
            out,
            "rdmablk_poller_arena_bytes_in_use{{poller=\"{i}\"}} {}",
            p.arena_bytes.get()
        );
    }
    family(
        &mut out,
        "rdmablk_poller_busy_seconds_total",
        "counter",
        "CPU time of the poller thread (all of its time with busy_poll).",
    );
    for (i, p) in shared.pollers.iter().enumerate() {
        let _ = writeln!(
            out,
            "rdmablk_poller_busy_seconds_total{{poller=\"{i}\"}} {:.6}",
            p.busy_ns.get() as f64 / 1e9
        );
    }
    /// A family with one value per poller: name, type, help, the value.
    type PerPoller = (
        &'static str,
        &'static str,
        &'static str,
        fn(&PollerCounters) -> f64,
    );
    let per_poller: [PerPoller; 3] = [
        (
            "rdmablk_poller_sleeps_total",
            "counter",
            "Times the poller slept in its ring when its spin window passed with nothing to do (each ended by a wake-up).",
            |p| p.sleeps.get() as f64,
        ),
        (
            "rdmablk_poller_sends_total",
            "counter",
            "Socket sends (NVMe/TCP), each carrying every PDU its queue had ready.",
            |p| p.sends.get() as f64,
        ),
        (
            "rdmablk_poller_spin_window_seconds",
            "gauge",
            "How long the poller keeps polling after its last work before it sleeps (adaptive polling).",
            |p| p.spin_window_ns.get() as f64 / 1e9,
        ),
    ];
    for (name, kind, help, value) in per_poller {
        family(&mut out, name, kind, help);
        for (i, p) in shared.pollers.iter().enumerate() {
            let _ = writeln!(out, "{name}{{poller=\"{i}\"}} {}", value(p));
        }
    }
    if let Some(g) = group {
        gateway_group(&mut out, g);
    }
    out
}

/// The gateway group's families.
fn gateway_group(out: &mut String, g: &GroupStatus) {
    let group = format!("group=\"{}\"", label(&g.name));
    family(
        out,
        "rdmablk_gateway_up",
        "gauge",
        "The gateways of the group this one knows of: 1 while its heartbeat moved within the last lease (this gateway: always 1).",
    );
    let _ = writeln!(
        out,
        "rdmablk_gateway_up{{{group},gateway=\"{}\",self=\"true\"}} 1",
        label(&g.gateway)
    );
    for (p, alive) in &g.peers {
        let _ = writeln!(
            out,
            "rdmablk_gateway_up{{{group},gateway=\"{}\",self=\"false\"}} {}",
            label(p),
            u8::from(*alive)
        );
    }
    family(
        out,
        "rdmablk_gateway_ana_group_owner",
        "gauge",
        "1 for each ANA group's owner, as this gateway last read its lease object.",
    );
    for (ana, owner, _) in &g.ana_groups {
        let _ = writeln!(
            out,
            "rdmablk_gateway_ana_group_owner{{{group},ana_group=\"{ana}\",owner=\"{}\"}} 1",
            label(owner)
        );
    }
    family(
        out,
        "rdmablk_gateway_lease_age_seconds",
        "gauge",
        "Seconds since this gateway last renewed the lease of an ANA group it owns.",
    );
    for (ana, _, renewed) in &g.ana_groups {
        if let Some(t) = renewed {
            let _ = writeln!(
                out,
                "rdmablk_gateway_lease_age_seconds{{{group},ana_group=\"{ana}\"}} {:.3}",
                t.as_secs_f64()
            );
        }
    }
    for (name, help, v) in [
        (
            "rdmablk_gateway_failovers_total",
            "ANA groups this gateway took from a gateway that did not hand them over.",
            g.failovers,
        ),
        (
            "rdmablk_gateway_fenced_clients_total",
            "Cluster clients of other gateways (or of an earlier process of this one) this gateway blocklisted.",
            g.fenced,
        ),
    ] {
        family(out, name, "counter", help);
        let _ = writeln!(out, "{name}{{{group}}} {v}");
    }
}

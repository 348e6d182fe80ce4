//! `rdmablk-target status`: what the running daemon serves and to whom, with
//! each namespace's current IOPS and bandwidth (over a short sample).

use crate::base::ids::{hex_text, uuid_text};
use crate::engine::poller::Shared;
use crate::nvme::namespace::Namespace;
use rdmablk_common::spin::PollMode;
use rdmablk_common::units::format_size;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the rates are sampled over.
const SAMPLE: Duration = Duration::from_millis(500);

/// The summary, one line per listener, subsystem, namespace and host.
pub fn render(shared: &Shared, started: Instant) -> String {
    let r = &shared.registry;
    let subsystems = r.subsystems();
    let namespaces: Vec<Vec<Arc<Namespace>>> =
        subsystems.iter().map(|s| s.namespaces().to_vec()).collect();
    let totals = |ns: &Namespace| ns.metrics.totals();
    let before: Vec<Vec<(u64, u64)>> = namespaces
        .iter()
        .map(|v| v.iter().map(|n| totals(n)).collect())
        .collect();
    let pollers_before = poller_samples(shared);
    let t0 = Instant::now();
    std::thread::sleep(SAMPLE);
    let secs = t0.elapsed().as_secs_f64();

    let mut out = String::new();
    let up = started.elapsed().as_secs();
    let _ = writeln!(
        out,
        "rdmablk-target {}, up {}h{:02}m{:02}s, {} poller(s), {} connection(s)",
        env!("CARGO_PKG_VERSION"),
        up / 3600,
        up / 60 % 60,
        up % 60,
        r.pollers,
        shared.connections.load(Ordering::Acquire)
    );
    let listening: Vec<String> = r
        .ports()
        .iter()
        .map(|p| format!("{}://{}", p.profile.kind, p.addr))
        .collect();
    pollers(&mut out, shared, &pollers_before, secs);
    let _ = writeln!(out, "listening: {}", listening.join(", "));
    let groups: BTreeSet<u32> = namespaces.iter().flatten().map(|n| n.ana_group()).collect();
    for (p, url) in r.ports().iter().zip(&listening) {
        let states: Vec<String> = p
            .ana
            .shown(&groups)
            .iter()
            .map(|(g, s)| format!("{g} {s}"))
            .collect();
        let _ = writeln!(out, "  ANA groups on {url}: {}", states.join(", "));
    }
    for (s, (nss, before)) in subsystems.iter().zip(namespaces.iter().zip(&before)) {
        let access = s.access();
        let who = if access.allow_any_host {
            "any host".to_string()
        } else {
            format!("{} allowed host(s)", access.hosts.len())
        };
        let _ = writeln!(out, "subsystem {} ({who})", s.nqn);
        for (n, (c0, b0)) in nss.iter().zip(before) {
            let (c1, b1) = totals(n);
            let iops = (c1 - c0) as f64 / secs;
            let bw = (b1 - b0) as f64 / secs;
            let _ = writeln!(
                out,
                "  namespace {}: {} on {}, {}, ANA group {}: {iops:.0} IOPS, {}/s, {} in flight",
                n.nsid,
                format_size(n.blocks() * n.block_size as u64),
                n.backend.describe(),
                match (n.is_active(), n.read_only()) {
                    (false, _) => "inactive (not open yet)",
                    (true, true) => "read-only",
                    (true, false) => "read-write",
                },
                n.ana_group(),
                format_size(bw as u64),
                n.metrics.in_flight()
            );
            identifiers(&mut out, n);
            tenancy(&mut out, n);
            if let Some(r) = &n.reservations {
                let st = r.snapshot();
                let _ = writeln!(
                    out,
                    "    reservations: {} registrant(s), {}, generation {}{}",
                    st.registrants.len(),
                    match st.holder {
                        Some((t, _)) => format!("{t:?} held"),
                        None => "none held".into(),
                    },
                    st.generation,
                    if st.ptpl {
                        ", persist through power loss"
                    } else {
                        ""
                    }
                );
            }
        }
        let mut hosts: BTreeMap<(String, &str, String), (usize, usize)> = BTreeMap::new();
        for c in s.live_controllers() {
            let over = match c.tls() {
                Some(t) if t.kernel => format!(" with TLS ({}, kernel)", t.cipher),
                Some(t) => format!(" with TLS ({})", t.cipher),
                None => String::new(),
            };
            let e = hosts
                .entry((c.hostnqn.clone(), c.caps().transport, over))
                .or_default();
            e.0 += 1;
            e.1 += c.queues_connected();
        }
        for ((host, transport, over), (ctrls, queues)) in hosts {
            let _ = writeln!(
                out,
                "  host {host}: {ctrls} controller(s) over {transport}{over}, {queues} queue(s)"
            );
        }
    }
    let discovery = r.discovery.live_controllers().len();
    let _ = writeln!(out, "discovery controllers: {discovery}");
    out
}

/// What a poller had done at one time: I/O commands answered, sleeps,
/// socket sends.
fn poller_samples(shared: &Shared) -> Vec<[u64; 3]> {
    shared
        .pollers
        .iter()
        .zip(&shared.io_commands)
        .map(|(p, io)| [io.load(Ordering::Relaxed), p.sleeps.get(), p.sends.get()])
        .collect()
}

/// How the pollers wait, and per poller what it answered over the sample
/// and how many commands each wake-up and each socket send served.
fn pollers(out: &mut String, shared: &Shared, before: &[[u64; 3]], secs: f64) {
    let mode = match shared.poll_mode {
        PollMode::Busy => "busy polling (never sleep)".to_string(),
        PollMode::Adaptive(b) if b.max.is_zero() => "sleep when idle (no spinning)".to_string(),
        PollMode::Adaptive(b) => format!(
            "adaptive polling: spin {}us to {}us after the last work, then sleep",
            b.min.as_micros(),
            b.max.as_micros()
        ),
    };
    let _ = writeln!(out, "pollers: {mode}");
    for (i, (b, a)) in before.iter().zip(poller_samples(shared)).enumerate() {
        let [io, sleeps, sends] = [0, 1, 2].map(|k| a[k] - b[k]);
        let window = match shared.poll_mode {
            PollMode::Adaptive(b) if !b.max.is_zero() => format!(
                ", spin window {}us",
                shared.pollers[i].spin_window_ns.get() / 1000
            ),
            _ => String::new(),
        };
        if io == 0 {
            let _ = writeln!(out, "  poller {i}: idle{window}");
            continue;
        }
        let per = |n: u64, what: &str| {
            if n == 0 {
                format!("no {what}")
            } else {
                format!("{:.1} per {what}", io as f64 / n as f64)
            }
        };
        let _ = writeln!(
            out,
            "  poller {i}: {:.0} I/O/s, {}, {}{window}",
            io as f64 / secs,
            per(sleeps, "wake-up"),
            per(sends, "socket send"),
        );
    }
}

/// The identifiers of namespace `n` hosts see, each marked "given" when
/// the configuration gives it (once it is active: an RBD namespace's
/// derive from its image).
fn identifiers(out: &mut String, n: &Namespace) {
    if !n.is_active() {
        return;
    }
    let (ids, given) = (n.ids(), n.given_ids());
    let mark = |g: bool| if g { " (given)" } else { "" };
    let _ = write!(
        out,
        "    nguid {}{}, uuid {}{}",
        hex_text(&ids.nguid),
        mark(given.nguid.is_some()),
        uuid_text(&ids.uuid),
        mark(given.uuid.is_some()),
    );
    if let Some(eui64) = ids.eui64 {
        let _ = write!(out, ", eui64 {} (given)", hex_text(&eui64));
    }
    out.push('\n');
}

/// Who sees namespace `n` (when not every host), its QoS limits and what
/// they hold back.
fn tenancy(out: &mut String, n: &Namespace) {
    if let Some(hosts) = n.tenancy.hosts() {
        let who = if hosts.is_empty() {
            "no host".to_string()
        } else {
            hosts.join(", ")
        };
        let _ = writeln!(out, "    visible to: {who}");
    }
    let (shared, hosts) = n.tenancy.limits();
    if shared.is_empty() && hosts.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "    qos for all hosts: {shared}; {} command(s) waiting, {} held back so far for {:.3}s in all",
        n.metrics.queued(),
        n.metrics.throttled(),
        n.metrics.throttled_ns() as f64 / 1e9
    );
    for (host, limits) in hosts {
        let _ = writeln!(out, "    qos for {host}: {limits}");
    }
}

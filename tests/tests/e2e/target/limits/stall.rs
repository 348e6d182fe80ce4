//! Hosts that hold the target's resources by not reading, not answering
//! an R2T, or idling on discovery associations.

use super::*;

// ---- tests ----------------------------------------------------------------------

/// A host that submits reads of 1 MiB and never reads its socket holds, at
/// most, its queues' buffer budget; once its sends make no progress for
/// `limits.send_timeout` its queues are reset and the buffers come back.
/// The victim, sharing the pollers, does not notice.
#[test]
fn host_that_stops_reading_is_torn_down() {
    let setup = Setup::new();
    let mut attack = Stall {
        what: "host that stops reading",
        opcode: nvm::READ,
        limit: "send_timeout",
        timeout: Duration::from_secs(4),
        commands: "its reads",
        stalled: "it stopped reading",
        ended: "reset",
    }
    .prepare(&setup);
    stats_until(
        &attack.stats,
        Instant::now() + 5 * STATS_PERIOD,
        "victim (2 queues) and attacker (3) connected",
        |s| s.queues_connected == 5 && s.controllers == 2,
    );
    attack.run();
    attack
        .attacker
        .ctrl
        .admin()
        .keep_alive()
        .or_panic("the attacker's admin queue after its I/O queues were torn down");
}

/// A host that submits writes of 1 MiB and never sends the data the R2Ts
/// ask for holds its queues' buffer budget for `limits.data_timeout`, then
/// its queues are closed and the buffers come back.
#[test]
fn unanswered_r2t_is_torn_down() {
    let setup = Setup::new();
    Stall {
        what: "unanswered R2T",
        opcode: nvm::WRITE,
        limit: "data_timeout",
        timeout: Duration::from_secs(3),
        commands: "its writes",
        stalled: "writes whose data it never sent",
        ended: "closed",
    }
    .prepare(&setup)
    .run();
}

/// Discovery associations whose hosts asked for no keep-alive (KATO 0)
/// still expire after `limits.discovery_keep_alive`; an association whose
/// host never enables the controller ends after `limits.enable_timeout`.
#[test]
fn idle_discovery_associations_expire() {
    const IDLE: usize = 1000;
    let setup = Setup::new();
    let what = "idle discovery associations";
    let keep_alive = Duration::from_secs(6);
    let enable_timeout = Duration::from_secs(2);
    let dir = TempDir::new("limits-discovery");
    let stats = dir.join("stats.json");
    let t = setup.target(
        &config(2, "discovery_keep_alive = \"6s\"\nenable_timeout = \"2s\""),
        &stats,
    );
    let mut victim = Victim::open(&t);
    let solo = victim.solo(what);

    // Admin Connects whose hosts never set CC.EN, to an NVM subsystem (KATO
    // 0: no keep-alive deadline) and to the discovery subsystem.
    let start = Instant::now();
    let mut never_enabled: Vec<(&str, Queue)> = [(SUBNQN, "nvm"), (DISCOVERY_NQN, "discovery")]
        .into_iter()
        .map(|(nqn, kind)| {
            let host = format!("nqn.2026-11.io.rdmablk:never-enabled-{kind}");
            let mut q = Queue::connect(t.addr(), Digests::default())
                .or_panic(format_args!("{kind}: ICReq"));
            let cqe = q
                .fabrics_connect(0, 31, 0, nqn, &host, HOSTID, 0xffff)
                .or_panic(format_args!("{kind}: admin Connect"));
            assert!(
                cqe.status().is_success(),
                "{kind}: admin Connect: {}",
                cqe.status()
            );
            (kind, q)
        })
        .collect();
    for (kind, q) in &mut never_enabled {
        let left = (start + enable_timeout + SLACK).saturating_duration_since(Instant::now());
        assert!(
            q.is_closed_by_peer(left),
            "{kind} association never enabled still open {:?} after its Connect (enable_timeout {enable_timeout:?})",
            start.elapsed()
        );
        let elapsed = start.elapsed();
        assert!(
            elapsed >= enable_timeout,
            "{kind} association never enabled closed {elapsed:?} after its Connect, before enable_timeout ({enable_timeout:?})"
        );
        println!("{what}: {kind} association never enabled closed after {elapsed:.1?}");
    }
    drop(never_enabled);

    let (attacked, peak, (idle, created, gone)) = under_attack(&mut victim, what, &stats, || {
        let opts = Opts {
            io_queues: 0,
            ..quiet()
        };
        let begin = Instant::now();
        let idle: Vec<Controller> = (0..IDLE)
            .map(|i| {
                let host = format!("nqn.2026-11.io.rdmablk:idle-{i}");
                Controller::open(t.addr(), DISCOVERY_NQN, &host, &opts)
                    .or_panic(format_args!("discovery association #{i} as {host}"))
            })
            .collect();
        let created = Instant::now();
        println!(
            "{what}: {IDLE} discovery associations enabled in {:.1?}",
            created - begin
        );
        // Each expires discovery_keep_alive after it was enabled; the stats
        // file may lag a period.
        stats_until(
            &stats,
            created + keep_alive + SLACK + STATS_PERIOD,
            "idle discovery associations past discovery_keep_alive",
            |s| s.controllers == 1 && s.connections == 2 && s.queues_connected == 2,
        );
        let gone = created.elapsed();
        (idle, created, gone)
    });
    println!(
        "{what}: at most {} controllers and {} connections seen; all idle ones gone {gone:.1?} after the last was enabled (discovery_keep_alive {keep_alive:?})",
        peak.controllers, peak.connections
    );
    // The target closed every one of them.
    let mut still_open = 0;
    for c in &idle {
        if !c.admin().is_closed_by_peer(Duration::from_millis(200)) {
            still_open += 1;
        }
    }
    assert_eq!(
        still_open,
        0,
        "{what}: discovery admin queues still open {:?} after the last was enabled",
        created.elapsed()
    );
    judge_victim(what, solo, attacked, keep_alive / 2);
    stats_until(
        &stats,
        Instant::now() + 3 * STATS_PERIOD,
        "after the idle associations",
        |s| s.buffers == 0 && s.controllers == 1 && s.connections == 2,
    );
}

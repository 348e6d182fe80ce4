//! The partition tests' nemesis: schedules of faults drawn from a seed (so
//! a failing one can be replayed), and their execution against a
//! [`Cluster`] of gateways, bounded in time.
//!
//! A schedule is a few steps, each a fault on one gateway (or on the Ceph
//! OSD) held for a while, the next one starting a random time after the
//! previous one: often while the previous fault, or the failover or
//! failback it caused, is still under way. At any moment at least one
//! gateway has no fault, so a host always has a live path.

use crate::Rng;
use std::fmt;
use std::time::{Duration, Instant};

/// A fault, on one gateway unless said otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL; started again when the hold ends.
    Kill,
    /// SIGSTOP; SIGCONT when the hold ends.
    Freeze,
    /// SIGTERM (a clean stop: it hands its groups over), started again
    /// when the hold ends.
    Restart,
    /// Cut from the Ceph cluster, not from its hosts.
    CutCeph,
    /// Cut from every host (on the gateway's side), not from the cluster.
    CutHosts,
    /// The host's path to this gateway cut (on the host's side).
    CutPath,
    /// The gateway's link to its hosts cut and healed again and again.
    Flap,
    /// The Ceph OSD paused (SIGSTOP; SIGCONT when the hold ends), for
    /// every gateway.
    PauseOsd,
    /// The gateway's path to its storage stalls: what it sent down the
    /// path waits, and lands when the hold ends.
    StallStorage,
}

impl Fault {
    /// The faults of gateways on Ceph (a gateway group).
    pub const CEPH: [Fault; 8] = [
        Fault::Kill,
        Fault::Freeze,
        Fault::Restart,
        Fault::CutCeph,
        Fault::CutHosts,
        Fault::CutPath,
        Fault::Flap,
        Fault::PauseOsd,
    ];

    /// The faults of gateways sharing a file, the first through a path
    /// that can stall.
    pub const SHARED_FILE: [Fault; 7] = [
        Fault::Kill,
        Fault::Freeze,
        Fault::Restart,
        Fault::CutHosts,
        Fault::CutPath,
        Fault::Flap,
        Fault::StallStorage,
    ];

    /// Its name in schedules and reports.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Freeze => "freeze",
            Fault::Restart => "restart",
            Fault::CutCeph => "cut-ceph",
            Fault::CutHosts => "cut-hosts",
            Fault::CutPath => "cut-path",
            Fault::Flap => "flap",
            Fault::PauseOsd => "pause-osd",
            Fault::StallStorage => "stall-storage",
        }
    }

    /// How long it is held, at most: the OSD only briefly (every gateway's
    /// I/O waits for it); a cut between hosts and a gateway past the time
    /// the group takes to follow the hosts (keep-alive, then a lease).
    fn longest_hold(self) -> Duration {
        match self {
            Fault::PauseOsd => Duration::from_secs(3),
            Fault::CutHosts | Fault::CutPath => Duration::from_secs(16),
            _ => Duration::from_secs(8),
        }
    }
}

/// One fault of a schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// When it starts, from the schedule's start.
    pub at: Duration,
    pub fault: Fault,
    /// The gateway it hits (meaningless for [`Fault::PauseOsd`]).
    pub gateway: usize,
    /// How long it is held before it is healed.
    pub hold: Duration,
}

/// The faults a seed decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub steps: Vec<Step>,
}

impl Schedule {
    /// Two or three steps of `kinds` over `gateways` gateways: each starts
    /// 0 to 6 s after the previous one, is held 1 s to its longest hold,
    /// and hits a gateway without a fault then, never the last one.
    pub fn generate(seed: u64, gateways: usize, kinds: &[Fault]) -> Schedule {
        assert!(gateways >= 2 && !kinds.is_empty());
        let mut rng = Rng::new(seed);
        let ms = |rng: &mut Rng, lo: u64, hi: u64| Duration::from_millis(lo + rng.below(hi - lo));
        let mut steps: Vec<Step> = Vec::new();
        let mut at = Duration::ZERO;
        for i in 0..2 + rng.below(2) {
            if i > 0 {
                at += ms(&mut rng, 0, 6000);
            }
            let fault = kinds[rng.below(kinds.len() as u64) as usize];
            let hold = ms(&mut rng, 1000, fault.longest_hold().as_millis() as u64);
            // Faults held at `at`, and until when.
            let held = |steps: &[Step], at: Duration| -> Vec<Step> {
                steps
                    .iter()
                    .filter(|s| s.at <= at && at < s.at + s.hold)
                    .cloned()
                    .collect()
            };
            // Wait for faults to end until a gateway besides the one to
            // hit is free of them.
            loop {
                let now = held(&steps, at);
                let busy: Vec<usize> = now
                    .iter()
                    .filter(|s| s.fault != Fault::PauseOsd)
                    .map(|s| s.gateway)
                    .collect();
                let osd_paused = now.iter().any(|s| s.fault == Fault::PauseOsd);
                let free = (0..gateways).filter(|g| !busy.contains(g)).count();
                if free >= 2 && !(osd_paused && fault == Fault::PauseOsd) {
                    break;
                }
                at = now
                    .iter()
                    .map(|s| s.at + s.hold)
                    .min()
                    .expect("some fault holds");
            }
            let busy: Vec<usize> = held(&steps, at)
                .iter()
                .filter(|s| s.fault != Fault::PauseOsd)
                .map(|s| s.gateway)
                .collect();
            let free: Vec<usize> = (0..gateways).filter(|g| !busy.contains(g)).collect();
            let gateway = free[rng.below(free.len() as u64) as usize];
            steps.push(Step {
                at,
                fault,
                gateway,
                hold,
            });
        }
        Schedule { seed, steps }
    }

    /// When its last fault is healed, from its start.
    pub fn length(&self) -> Duration {
        self.steps
            .iter()
            .map(|s| s.at + s.hold)
            .max()
            .unwrap_or_default()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {}:", self.seed)?;
        for s in &self.steps {
            let on = match s.fault {
                Fault::PauseOsd => "osd".to_string(),
                _ => format!("gw{}", s.gateway),
            };
            write!(
                f,
                " [at {:.1}s {} {on} for {:.1}s]",
                s.at.as_secs_f64(),
                s.fault.name(),
                s.hold.as_secs_f64()
            )?;
        }
        Ok(())
    }
}

/// What the nemesis acts on.
pub trait Cluster {
    /// Starts `fault` on gateway `gateway`.
    fn inject(&mut self, fault: Fault, gateway: usize);
    /// Ends it.
    fn heal(&mut self, fault: Fault, gateway: usize);
    /// [`Fault::Flap`]'s toggles: cuts (true) or heals the gateway's link
    /// to its hosts.
    fn flap(&mut self, gateway: usize, cut: bool);
}

/// A fault as it happened, on the clock of `clock` given to [`run`].
#[derive(Clone, Debug)]
pub struct Window {
    pub fault: Fault,
    pub gateway: usize,
    pub injected: Duration,
    pub healed: Duration,
}

/// Runs `schedule` against `cluster`, each fault injected and healed on
/// time (as closely as the cluster's actions allow); returns when each
/// happened, on the clock `now` (the history's).
pub fn run(
    schedule: &Schedule,
    cluster: &mut dyn Cluster,
    now: &dyn Fn() -> Duration,
) -> Vec<Window> {
    let start = Instant::now();
    // (time, step, inject?) in time order; heals before injections at the
    // same instant.
    let mut events: Vec<(Duration, usize, bool)> = Vec::new();
    for (i, s) in schedule.steps.iter().enumerate() {
        events.push((s.at, i, true));
        events.push((s.at + s.hold, i, false));
    }
    events.sort_by_key(|&(t, i, inject)| (t, inject, i));
    let mut windows: Vec<Option<Window>> = vec![None; schedule.steps.len()];
    let mut flapping: Vec<(usize, bool)> = Vec::new();
    let mut rng = Rng::new(schedule.seed ^ 0xf1a9);
    let mut next_flap = Duration::ZERO;
    for (t, i, inject) in events {
        // Wait for the event, toggling flapping links meanwhile.
        loop {
            let elapsed = start.elapsed();
            if elapsed >= t {
                break;
            }
            if !flapping.is_empty() && elapsed >= next_flap {
                for (g, cut) in &mut flapping {
                    *cut = !*cut;
                    cluster.flap(*g, *cut);
                }
                next_flap = elapsed + Duration::from_millis(300 + rng.below(1200));
            }
            let until = if flapping.is_empty() {
                t
            } else {
                t.min(next_flap)
            };
            std::thread::sleep(
                until
                    .saturating_sub(start.elapsed())
                    .min(Duration::from_millis(50)),
            );
        }
        let s = &schedule.steps[i];
        if inject {
            // The fault starts as its injection does (a restart's stop,
            // an nftables rewrite take a while): an operation started
            // meanwhile counts as started under it.
            let injected = now();
            cluster.inject(s.fault, s.gateway);
            if s.fault == Fault::Flap {
                flapping.push((s.gateway, true));
            }
            windows[i] = Some(Window {
                fault: s.fault,
                gateway: s.gateway,
                injected,
                healed: Duration::ZERO,
            });
        } else {
            flapping.retain(|&(g, _)| !(s.fault == Fault::Flap && g == s.gateway));
            cluster.heal(s.fault, s.gateway);
            windows[i].as_mut().expect("injected before healed").healed = now();
        }
    }
    windows
        .into_iter()
        .map(|w| w.expect("every step ran"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_decides_the_schedule_and_one_gateway_stays_free() {
        for seed in 0..500 {
            let s = Schedule::generate(seed, 3, &Fault::CEPH);
            assert_eq!(s, Schedule::generate(seed, 3, &Fault::CEPH), "replayable");
            assert!((2..=3).contains(&s.steps.len()));
            for t in (0..s.length().as_millis() as u64).step_by(50) {
                let t = Duration::from_millis(t);
                let held: Vec<&Step> = s
                    .steps
                    .iter()
                    .filter(|x| x.at <= t && t < x.at + x.hold)
                    .collect();
                let mut hit: Vec<usize> = held
                    .iter()
                    .filter(|x| x.fault != Fault::PauseOsd)
                    .map(|x| x.gateway)
                    .collect();
                hit.sort();
                hit.dedup();
                assert!(hit.len() < 3, "{s}: every gateway faulted at {t:?}");
                assert_eq!(
                    hit.len(),
                    held.iter().filter(|x| x.fault != Fault::PauseOsd).count(),
                    "{s}: two faults on one gateway at {t:?}"
                );
            }
        }
    }
}

//! The gateway group the gateway tests share: each gateway's
//! configuration (three gateways, two images, each in an ANA group of its
//! own with a preferred owner) and which gateway owns a group.

use super::*;
use rdmablk_common::nvme::ana::{AnaLog, AnaState};
use rdmablk_common::nvme::log::lid;
use rdmablk_tests::client::quiet;

/// The lease of a gateway's ownership of its groups, in seconds.
pub(super) const LEASE_SECS: u64 = 3;

/// A gateway's configuration with a failback delay of `failback`
/// seconds and the top-level tables `extra` (as `[metrics]`); the listener
/// on `{port}`.
pub(super) fn config(
    group: &str,
    gw: char,
    (one, two): (&Image, &Image),
    failback: u64,
    extra: &str,
) -> String {
    let first = 1 + 100 * (gw as u16 - 'a' as u16);
    let conf = ceph_conf().display().to_string();
    let ns = |nsid: u32, image: &Image| {
        format!(
            "  [[subsystem.namespace]]\n  nsid = {nsid}\n  backend = \"rbd\"\n  pool = \"rbd\"\n  \
             image = \"{}\"\n  ceph_conf = \"{conf}\"\n  ana_group = {nsid}\n",
            image.name
        )
    };
    format!(
        "{extra}\n[gateway_group]\nname = \"{group}\"\ngateway = \"gw-{gw}\"\npool = \"rbd\"\n\
         ceph_conf = \"{conf}\"\nlease = \"{LEASE_SECS}s\"\nfailback_delay = \"{failback}s\"\n\
         preferred = {{ 1 = \"gw-a\", 2 = \"gw-b\" }}\n\n\
         [[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{{port}}\"\n\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\ncntlid_min = {first}\ncntlid_max = {}\n{}{}",
        first + 99,
        ns(1, one),
        ns(2, two)
    )
}

/// Options of a tool that reads logs: an admin queue alone.
pub(super) fn admin_only() -> Opts {
    Opts {
        io_queues: 0,
        ..quiet()
    }
}

/// The state ANA group `g` has on gateway `t`, as a tool reads it.
pub(super) fn ana_state(t: &Target, g: u32) -> Option<AnaState> {
    let c = Controller::open(t.addr(), NQN, HOST_A, &admin_only()).ok()?;
    let page = c.admin().get_log(lid::ANA, 4096, 0).ok()?;
    let log = AnaLog::parse(&page)?;
    log.groups.iter().find(|x| x.grpid == g).map(|x| x.state)
}

/// Waits (at most `within`) until ANA group `g` is optimized on exactly the
/// gateway `owner` of `all` (any one, `None`); returns how long it took.
pub(super) fn wait_owner(
    all: &[&Target],
    owner: Option<usize>,
    g: u32,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        let states: Vec<Option<AnaState>> = all.iter().map(|t| ana_state(t, g)).collect();
        let optimized: Vec<usize> = (0..all.len())
            .filter(|&i| states[i] == Some(AnaState::Optimized))
            .collect();
        if optimized.len() == 1 && owner.is_none_or(|o| optimized == [o]) {
            return start.elapsed();
        }
        assert!(
            optimized.len() <= 1,
            "ANA group {g} optimized on two gateways: {states:?}"
        );
        assert!(
            start.elapsed() < within,
            "ANA group {g} not owned by gateway {owner:?} within {within:?}: {states:?}\n{}",
            all.iter()
                .map(|t| t.log_tail())
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

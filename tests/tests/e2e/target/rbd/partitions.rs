//! The partition suite on a gateway group: three gateways, each in a
//! network namespace of its own, serve three RBD namespaces (ANA groups 1,
//! 2 and 3, preferred by gw-a, gw-b and gw-c) to a host namespace, where
//! `rdmablk connect --nbd` exports each namespace over a path to every
//! gateway. The host holds a Write Exclusive reservation on each. Clients
//! write unique values to a few blocks of each namespace and read them
//! back while the nemesis runs schedules drawn from seeds: gateways
//! killed, frozen, restarted, cut from the cluster, from the host or the
//! host from them, their links flapping, the OSD paused, several at once.
//! After each schedule every group is back with its preferred gateway
//! (never optimized on two at once); at the end every block is read once
//! more and the whole history is checked: each block a linearizable
//! register, no operation past the deadline. The reservations survived.
//!
//! `RDMABLK_PARTITION_SEED` (the first seed, default 1) and
//! `RDMABLK_PARTITION_SCHEDULES` (how many, default 3) choose the
//! schedules; `bench/partitions.sh` runs many.

use super::gateway_group::{wait_owner, LEASE_SECS};
use super::*;
use rdmablk_common::nvme::nvm;
use rdmablk_tests::nemesis::Fault;
use rdmablk_tests::partition::{self, Cluster, METRICS_PORT, PORT};
use rdmablk_tests::reservation::{self, open_nqn, report_ns, rt, ACQUIRE, REGISTER};
use rdmablk_tests::testnet::BRIDGE_ADDR;
use rdmablk_tests::workload::{Export, Options};

const FAILBACK_SECS: u64 = 3;
/// How long an operation may take while a gateway is alive and in reach:
/// the host leaves a silent gateway after its keep-alive (5 s), a group
/// moves within a lease (3 s) of its owner's end, or within a lease of
/// the owner losing the host's keep-alive; the rest is slack for a loaded
/// machine. Longer is an anomaly (hung).
const HOST_DEADLINE: Duration = Duration::from_secs(20);
const GROUPS: u32 = 3;
/// The host's reservation key.
const KEY: u64 = 0x9a57;
/// Write Exclusive.
const WRITE_EXCLUSIVE: u8 = 1;

fn gateway_config(group: &str, gw: &str, addr: std::net::Ipv4Addr, images: &[Image]) -> String {
    let conf = ceph_conf().display().to_string();
    let first = 1 + 100 * (gw.as_bytes()[3] - b'a') as u16;
    let mut s = format!(
        "[metrics]\nlisten = \"{addr}:{METRICS_PORT}\"\n\n\
         [gateway_group]\nname = \"{group}\"\ngateway = \"{gw}\"\npool = \"rbd\"\n\
         ceph_conf = \"{conf}\"\nlease = \"{LEASE_SECS}s\"\nfailback_delay = \"{FAILBACK_SECS}s\"\n\
         preferred = {{ 1 = \"gw-a\", 2 = \"gw-b\", 3 = \"gw-c\" }}\n\n\
         [[listener]]\ntransport = \"tcp\"\naddress = \"{addr}:{PORT}\"\n\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\ncntlid_min = {first}\ncntlid_max = {}\n",
        first + 99
    );
    for (i, image) in images.iter().enumerate() {
        let nsid = i + 1;
        s.push_str(&format!(
            "  [[subsystem.namespace]]\n  nsid = {nsid}\n  backend = \"rbd\"\n  pool = \"rbd\"\n  \
             image = \"{}\"\n  ceph_conf = \"{conf}\"\n  ana_group = {nsid}\n",
            image.name
        ));
    }
    s
}

/// Waits until each group is optimized on one gateway (never on two),
/// every gateway running: a failback may still be under way when the next
/// schedule starts.
fn settle(cluster: &mut Cluster) {
    let targets: Vec<&Target> = cluster.gateways.iter().map(|g| g.t()).collect();
    let within = Duration::from_secs(FAILBACK_SECS + 8 * LEASE_SECS);
    for g in 1..=GROUPS {
        wait_owner(&targets, None, g, within);
    }
}

/// Waits until each group is optimized on its preferred gateway alone.
fn settle_home(cluster: &mut Cluster) {
    let targets: Vec<&Target> = cluster.gateways.iter().map(|g| g.t()).collect();
    let within = Duration::from_secs(FAILBACK_SECS + 8 * LEASE_SECS);
    for g in 1..=GROUPS {
        wait_owner(&targets, Some(g as usize - 1), g, within);
    }
}

/// The host's reservation on namespace `nsid`, through its owner: a
/// Write Exclusive held by the host with [`KEY`].
fn reserve(owner: &Target, nsid: u32) {
    let mut c = open_nqn(owner, NQN, &reservation::A);
    let q = &mut c.io[0];
    let ok = |c: rdmablk_tests::client::Completion, what: &str| reservation::ok(c, what);
    ok(
        reservation::resv(q, nvm::RESV_REGISTER, nsid, REGISTER, &[0, KEY]),
        "register",
    );
    ok(
        reservation::resv(
            q,
            nvm::RESV_ACQUIRE,
            nsid,
            ACQUIRE | rt(WRITE_EXCLUSIVE),
            &[KEY, 0],
        ),
        "acquire",
    );
}

fn hostid_text(id: &[u8; 16]) -> String {
    let h: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[test]
#[ignore = "needs a Ceph cluster on 198.18.0.1: scripts/testnet.sh up, CEPH_DEV_ADDR=198.18.0.1 scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn every_acknowledged_write_survives_partitions_kills_and_freezes() {
    let _machine = crate::alone();
    let conf_text = std::fs::read_to_string(ceph_conf()).or_panic("reading ceph.conf");
    assert!(
        conf_text.contains(&format!("v2:{BRIDGE_ADDR}:")),
        "the partition suite needs the Ceph cluster on the test network's bridge: \
         scripts/testnet.sh up, then CEPH_DEV_ADDR={BRIDGE_ADDR} scripts/ceph-dev.sh up"
    );
    let osd_pid = std::fs::read_to_string(ceph_conf().with_file_name("osd.0.pid"))
        .or_panic("reading osd.0.pid");
    let osd: u32 = osd_pid
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("osd.0.pid {osd_pid:?}: {e}"));
    let images: Vec<Image> = (1..=GROUPS)
        .map(|i| Image::create_with(&format!("part{i}"), 16 * MIB, "layering,exclusive-lock"))
        .collect();
    let group = format!("part-{}", std::process::id());
    let mut cluster = Cluster::start(
        &["gw-a", "gw-b", "gw-c"],
        &|gw, addr| gateway_config(&group, gw, addr, &images),
        Some(osd),
    );
    settle_home(&mut cluster);
    for nsid in 1..=GROUPS {
        reserve(cluster.gateways[nsid as usize - 1].t(), nsid);
    }

    let hostid = hostid_text(&reservation::A.id);
    // The host's default ctrl-loss-tmo (600 s): it keeps reconnecting to
    // a gateway the nemesis kept away for a minute, as a host would.
    let host_args = ["-q", reservation::A.nqn, "-I", &hostid];
    let nbd: Vec<NbdExport> = (1..=GROUPS)
        .map(|nsid| cluster.export(NQN, nsid, &host_args))
        .collect();
    let exports: Vec<Export> = nbd
        .iter()
        .zip(1..)
        .map(|(e, namespace)| Export {
            namespace,
            socket: e.socket().to_path_buf(),
        })
        .collect();
    let schedules = partition::schedules_from_env(cluster.gateways.len(), &Fault::CEPH);
    let opts = Options {
        blocks: 8,
        clients: 2,
        deadline: HOST_DEADLINE,
        seed: schedules[0].seed,
    };
    let verdict = partition::run_schedules(&mut cluster, &exports, &opts, &schedules, &mut settle);
    eprintln!("partition suite (gateway group):\n{}", verdict.summary());
    let found = verdict.anomalies();
    for a in &found {
        eprintln!("{a}");
    }
    assert!(
        verdict.incidents.is_empty(),
        "faults that went wrong:\n{}",
        verdict.incidents.join("\n")
    );
    assert!(
        found.is_empty(),
        "{} anomalies (above; replay one schedule with RDMABLK_PARTITION_SEED=<its seed> RDMABLK_PARTITION_SCHEDULES=1)",
        found.len()
    );
    assert!(
        verdict.report.ok_writes > 0 && verdict.report.ok_reads > 0,
        "the clients did work: {}",
        verdict.report.summary()
    );
    // The reservations are the group's: still there after every failover.
    settle_home(&mut cluster);
    for nsid in 1..=GROUPS {
        let owner = cluster.gateways[nsid as usize - 1].t();
        let mut c = open_nqn(owner, NQN, &reservation::A);
        let r = report_ns(&mut c.io[0], nsid);
        assert_eq!(r.rtype, WRITE_EXCLUSIVE, "namespace {nsid}: {r:?}");
        assert!(
            r.registrants
                .iter()
                .any(|x| x.hostid == reservation::A.id && x.rkey == KEY && x.holds),
            "namespace {nsid}: the host no longer holds its reservation: {r:?}"
        );
    }
    drop(nbd);
    cluster.stop();
}

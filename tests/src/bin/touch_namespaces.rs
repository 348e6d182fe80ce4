//! touch_namespaces: writes a block to every active namespace of some
//! subsystems of an NVMe/TCP target and reads it back, for the scale bench
//! (bench/scale.sh rbd).
//!
//! touch_namespaces ADDR:PORT SUBNQN... [--hostnqn nqn.2026-11.io.rdmablk:toucher]
//!     [--ana-group G]
//!
//! For each subsystem: one controller with one I/O queue; for each active
//! namespace (in ANA group G only, with --ana-group), 4 KiB of data of its
//! own at a block of its own, written, read back and compared. Prints one
//! line per subsystem and a total; exits 1 at the first failure or
//! difference.

use rdmablk_common::nvme::identify::{cns, parse_ns_list, NamespaceId};
use rdmablk_tests::args::Flags;
use rdmablk_tests::client::{Controller, Opts};
use rdmablk_tests::Rng;
use std::net::SocketAddr;
use std::time::Instant;

fn main() {
    if let Err(e) = run() {
        eprintln!("touch_namespaces: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let flags = Flags::from_env();
    let usage = "usage: touch_namespaces ADDR:PORT SUBNQN... [--hostnqn NQN]";
    let addr: SocketAddr = flags
        .positional(0)
        .ok_or(usage)?
        .parse()
        .map_err(|e| format!("address: {e}"))?;
    let host = flags.value("--hostnqn", "nqn.2026-11.io.rdmablk:toucher");
    let group: u32 = flags.number("--ana-group", "0")?;
    let mut rng = Rng::new(0x70c4);
    let (start, mut total) = (Instant::now(), 0usize);
    for i in 1.. {
        let Some(subnqn) = flags.positional(i).filter(|a| !a.starts_with("--")) else {
            break;
        };
        let began = Instant::now();
        let mut c = Controller::open(addr, subnqn, &host, &Opts::default())
            .map_err(|e| format!("{subnqn}: controller: {e}"))?;
        let ids = c
            .admin()
            .identify(cns::ACTIVE_NS_LIST, 0)
            .map_err(|e| format!("{subnqn}: active namespace list: {e}"))?;
        let mut touched = 0;
        for nsid in parse_ns_list(&ids) {
            let id = c
                .admin()
                .identify(cns::NAMESPACE, nsid)
                .map_err(|e| format!("{subnqn} nsid {nsid}: Identify Namespace: {e}"))?;
            let id = NamespaceId::parse(&id);
            if group != 0 && id.anagrpid != group {
                continue;
            }
            let bs = id.block_size();
            let data = rng.bytes(4096);
            let (lba, nlb) = (nsid as u64 * 4096 / bs as u64, 4096 / bs);
            let q = &mut c.io[0];
            q.write(nsid, lba, &data, bs, false)
                .map_err(|e| format!("{subnqn} nsid {nsid}: write: {e}"))?;
            let back = q
                .read(nsid, lba, nlb, bs)
                .map_err(|e| format!("{subnqn} nsid {nsid}: read: {e}"))?;
            if back != data {
                return Err(format!("{subnqn} nsid {nsid}: read back other data"));
            }
            touched += 1;
        }
        total += touched;
        println!(
            "{subnqn}: {touched} namespaces written and read back in {:.1?}",
            began.elapsed()
        );
    }
    println!("touched {total} namespaces in {:.1?}", start.elapsed());
    Ok(())
}

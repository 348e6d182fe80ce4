//! A test network on this machine, for the partition tests: each [`Node`]
//! (a gateway, a host) is a network namespace of its own, joined by a veth
//! pair to `scripts/testnet.sh`'s bridge, where this namespace (the test,
//! and the Ceph cluster bound to [`BRIDGE_ADDR`]) also sits. A node's links
//! are cut and healed by an nftables table in its namespace, so a gateway
//! can lose the cluster but keep its hosts, or lose one host, while the
//! test still reaches it.

use crate::process::run;
use crate::workspace_root;
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::Duration;

/// This namespace's address on the bridge: the test's, and the Ceph
/// cluster's when `scripts/ceph-dev.sh` ran with `CEPH_DEV_ADDR` set to it.
pub const BRIDGE_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The Ceph cluster's ports: the mon's (msgr2, msgr1) and the OSDs' range.
pub const CEPH_PORTS: &str = "3300, 6789, 6800-7300";
/// The nftables table in a node's namespace that holds its cuts.
const TABLE: &str = "inet nemesis";
/// How long `ip` and `nft` may take.
const TOOL_DEADLINE: Duration = Duration::from_secs(10);

/// What a cut blocks, both ways, on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Link {
    /// All traffic with this address.
    Peer(Ipv4Addr),
    /// The Ceph cluster's ports on [`BRIDGE_ADDR`].
    Ceph,
}

/// Makes the bridge if it is missing (`scripts/testnet.sh up`).
pub fn bridge_up() {
    let script = workspace_root().join("scripts/testnet.sh");
    run(
        "testnet.sh",
        Command::new("bash").arg(script).arg("up"),
        TOOL_DEADLINE,
    )
    .assert_success("making the test network's bridge (scripts/testnet.sh up)");
}

/// A network namespace `rbk-NAME` on the bridge, with address
/// 198.18.0.`host`/24 on its `eth0`; removed on drop.
pub struct Node {
    netns: String,
    addr: Ipv4Addr,
}

fn ip(args: &[&str]) {
    run("ip", Command::new("ip").args(args), TOOL_DEADLINE)
        .assert_success(&format!("ip {}", args.join(" ")));
}

impl Node {
    /// Makes the namespace (replacing one a crashed run left), its veth
    /// pair (`rbk-NAME` on the bridge, `eth0` inside) and its address.
    pub fn new(name: &str, host: u8) -> Node {
        assert!(
            host > 1 && host < 255 && name.len() <= 11,
            "node {name} 198.18.0.{host}: a host number of 2..=254 and a name of at most 11 bytes (interface names have 15)"
        );
        bridge_up();
        let netns = format!("rbk-{name}");
        // What a crashed run left: the namespace, and its veth while a
        // dying process still held the namespace.
        let _ = Command::new("ip")
            .args(["netns", "delete", &netns])
            .stderr(std::process::Stdio::null())
            .status();
        let deadline = std::time::Instant::now() + TOOL_DEADLINE;
        while Command::new("ip")
            .args(["link", "delete", &netns])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        ip(&["netns", "add", &netns]);
        let node = Node {
            netns,
            addr: Ipv4Addr::new(198, 18, 0, host),
        };
        let n = node.netns.as_str();
        ip(&[
            "link", "add", n, "type", "veth", "peer", "name", "eth0", "netns", n,
        ]);
        ip(&["link", "set", n, "master", "rbktest0", "up"]);
        ip(&[
            "-n",
            n,
            "addr",
            "add",
            &format!("{}/24", node.addr),
            "dev",
            "eth0",
        ]);
        ip(&["-n", n, "link", "set", "eth0", "up"]);
        ip(&["-n", n, "link", "set", "lo", "up"]);
        node
    }

    /// Its address on the bridge.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// `ip netns exec rbk-NAME`: a launcher that runs a command line in
    /// this namespace (and execs it: the pid is the command's).
    pub fn launcher(&self) -> [&str; 4] {
        ["ip", "netns", "exec", &self.netns]
    }

    /// `program` run in this namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let [ip, netns, exec, name] = self.launcher();
        let mut c = Command::new(ip);
        c.args([netns, exec, name]).arg(program);
        c
    }

    /// Cuts exactly `links` (both ways) and heals every other: the node's
    /// table is replaced in one nftables transaction.
    pub fn cut(&self, links: &[Link]) {
        let (mut out, mut inp) = (String::new(), String::new());
        for l in links {
            match l {
                Link::Peer(a) => {
                    out.push_str(&format!("    ip daddr {a} drop\n"));
                    inp.push_str(&format!("    ip saddr {a} drop\n"));
                }
                Link::Ceph => {
                    out.push_str(&format!(
                        "    ip daddr {BRIDGE_ADDR} tcp dport {{ {CEPH_PORTS} }} drop\n"
                    ));
                    inp.push_str(&format!(
                        "    ip saddr {BRIDGE_ADDR} tcp sport {{ {CEPH_PORTS} }} drop\n"
                    ));
                }
            }
        }
        let script = format!(
            "table {TABLE}\ndelete table {TABLE}\ntable {TABLE} {{\n  \
             chain output {{\n    type filter hook output priority 0;\n{out}  }}\n  \
             chain input {{\n    type filter hook input priority 0;\n{inp}  }}\n}}\n"
        );
        let path = std::env::temp_dir().join(format!("{}.nft", self.netns));
        std::fs::write(&path, script).expect("writing an nftables script");
        let mut nft = self.command("nft");
        nft.arg("-f").arg(&path);
        run("nft", &mut nft, TOOL_DEADLINE)
            .assert_success(&format!("cutting {links:?} on {}", self.netns));
        let _ = std::fs::remove_file(path);
    }

    /// Heals every cut.
    pub fn heal(&self) {
        self.cut(&[]);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Its processes are gone first (they are killed on drop before
        // it); deleting the namespace removes the veth pair.
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.netns])
            .status();
    }
}

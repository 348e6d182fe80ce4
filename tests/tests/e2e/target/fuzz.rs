//! Randomized hostile hosts against a live `rdmablk-target`: valid PDU
//! sequences with random fields and random byte flips, on fresh connections
//! and on associated admin and I/O queues. The daemon (which ends on any
//! panic) must stay up, and a healthy controller must keep its data.

use rdmablk_common::fabrics::{ConnectCmd, ConnectData};
use rdmablk_common::nvme::{Sgl, Sqe};
use rdmablk_common::tcp::{encode, Digests, Header, Transfer};
use rdmablk_tests::client::{Controller, Opts, Queue};
use rdmablk_tests::names::{HOST_A, HOST_B, OPEN_NQN, PRIVATE_NQN};
use rdmablk_tests::{two_subsystems_config, Rng, Target};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

const ROUNDS: u64 = 400;

/// A random SGL: every kind the target knows, and junk.
fn random_sgl(rng: &mut Rng) -> Sgl {
    let len = match rng.below(4) {
        0 => 0,
        1 => rng.below(9000) as u32,
        2 => (rng.below(2048) as u32) * 512,
        _ => rng.next_u64() as u32,
    };
    match rng.below(5) {
        0 => Sgl::InCapsule {
            offset: rng.below(3) * 512,
            len,
        },
        1 => Sgl::Transport { len },
        2 => Sgl::Keyed {
            addr: rng.next_u64(),
            len: len & 0xff_ffff,
            key: rng.next_u64() as u32,
            invalidate: false,
        },
        3 => Sgl::Null,
        _ => Sgl::Unsupported(rng.next_u64() as u8),
    }
}

/// A random command: opcodes the target implements (admin, I/O, Fabrics)
/// with random dwords, or any opcode.
fn random_sqe(rng: &mut Rng) -> Sqe {
    const OPCODES: [u8; 14] = [
        0x00, 0x01, 0x02, 0x08, 0x09, 0x06, 0x0a, 0x0c, 0x18, 0x7f, 0x05, 0x04, 0x10, 0xff,
    ];
    let opc = if rng.below(5) == 0 {
        rng.next_u64() as u8
    } else {
        OPCODES[rng.below(OPCODES.len() as u64) as usize]
    };
    let mut sqe = Sqe::new(opc, rng.next_u64() as u16);
    sqe.0[4] = [0x00, 0x01, 0x04, 0x08, rng.next_u64() as u8][rng.below(5) as usize];
    sqe.set_nsid([0, 1, 2, 0xffff_ffff, rng.next_u64() as u32][rng.below(5) as usize]);
    for dw in 10..16 {
        let v = match rng.below(4) {
            0 => 0,
            1 => rng.below(64) as u32,
            _ => rng.next_u64() as u32,
        };
        sqe.set_cdw(dw, v);
    }
    sqe.set_sgl(&random_sgl(rng));
    sqe
}

/// A random PDU a host might send, well framed or not.
fn random_pdu(rng: &mut Rng, digests: Digests) -> Vec<u8> {
    let data_len = match rng.below(4) {
        0 => 0,
        1 => rng.below(64) as usize,
        2 => rng.below(9000) as usize,
        _ => rng.below(200_000) as usize,
    };
    let data = rng.bytes(data_len);
    let transfer = Transfer {
        cccid: rng.below(8) as u16,
        ttag: rng.below(40) as u16,
        offset: [0, 512, rng.next_u64() as u32][rng.below(3) as usize],
        len: data_len as u32,
    };
    let mut pdu = match rng.below(6) {
        0..=2 => encode(&Header::CapsuleCmd(random_sqe(rng)), 0, &data, digests, 1),
        3 => encode(
            &Header::H2CData(transfer),
            (rng.below(2) as u8) << 2,
            &data,
            digests,
            1,
        ),
        4 => encode(
            &Header::R2T(Transfer {
                len: 4096,
                ..transfer
            }),
            0,
            &[],
            digests,
            1,
        ),
        _ => encode(
            &Header::TermReq {
                from_host: true,
                fes: 1,
                fei: 0,
            },
            0,
            &data[..data.len().min(128)],
            digests,
            1,
        ),
    };
    // Sometimes flip a few bytes anywhere (header fields included).
    if rng.below(3) == 0 {
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(pdu.len().min(96) as u64) as usize;
            pdu[at] ^= 1 << rng.below(8);
        }
    }
    pdu
}

/// Sends bytes and reads whatever comes back for a moment, ignoring errors:
/// the target may close the connection at any point.
fn throw(sock: &mut TcpStream, bytes: &[u8]) {
    let _ = sock.write_all(bytes);
    let mut sink = [0u8; 65536];
    let _ = sock.set_read_timeout(Some(Duration::from_millis(5)));
    while let Ok(n) = sock.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
}

fn icreq(digests: Digests) -> Vec<u8> {
    encode(
        &Header::IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        },
        0,
        &[],
        Digests::default(),
        1,
    )
}

fn admin_connect(host: &str) -> Vec<u8> {
    let cmd = ConnectCmd {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 5000,
    };
    let data = ConnectData {
        hostid: [3; 16],
        cntlid: 0xffff,
        subnqn: OPEN_NQN.into(),
        hostnqn: host.into(),
    }
    .encode();
    let sqe = cmd.to_sqe(
        1,
        &Sgl::InCapsule {
            offset: 0,
            len: 1024,
        },
    );
    encode(&Header::CapsuleCmd(sqe), 0, &data, Digests::default(), 1)
}

#[test]
fn random_hostile_hosts_never_bring_the_daemon_down() {
    let _machine = crate::shared();
    // Hostile hosts get the open subsystem; the healthy one has its own,
    // which only it may use.
    let mut t = Target::start_config(&two_subsystems_config());
    let mut healthy = Controller::open(t.addr(), PRIVATE_NQN, HOST_A, &Opts::default())
        .unwrap_or_else(|e| panic!("healthy controller: {e}"));
    let mut rng = Rng::new(0xf022);
    let pattern = rng.bytes(4096);
    healthy.io[0]
        .write(1, 0, &pattern, 512, false)
        .expect("healthy write");

    for round in 0..ROUNDS {
        let digests = Digests {
            header: rng.below(4) == 0,
            data: rng.below(4) == 0,
        };
        let mut sock = TcpStream::connect(t.addr()).expect("connect");
        let _ = sock.set_nodelay(true);
        let mut bytes = Vec::new();
        match round % 3 {
            // Garbage or a mutated ICReq first.
            0 => {
                bytes = icreq(digests);
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] ^= 1 << rng.below(8);
            }
            // An initialized connection sending random PDUs before Connect.
            1 => bytes.extend(icreq(digests)),
            // An admin queue, then random PDUs (commands on a live controller).
            _ => {
                throw(&mut sock, &icreq(Digests::default()));
                bytes.extend(admin_connect(HOST_B));
                for _ in 0..3 {
                    bytes.extend(random_pdu(&mut rng, Digests::default()));
                }
            }
        }
        for _ in 0..4 {
            bytes.extend(random_pdu(&mut rng, digests));
        }
        throw(&mut sock, &bytes);
        assert!(
            t.is_running(),
            "the daemon died in round {round}\n{}",
            t.log_tail()
        );
    }

    // Random commands on a real I/O queue of a live controller.
    let mut c =
        Controller::open(t.addr(), OPEN_NQN, HOST_B, &Opts::default()).expect("second controller");
    let q: &mut Queue = &mut c.io[0];
    for _ in 0..ROUNDS {
        let sqe = random_sqe(&mut rng);
        let pdu = encode(&Header::CapsuleCmd(sqe), 0, &[], Digests::default(), 1);
        if q.send_raw(&pdu).is_err() {
            break; // the target ended the queue: fine
        }
    }
    assert!(
        t.is_running(),
        "the daemon died on random I/O commands\n{}",
        t.log_tail()
    );
    let back = healthy.io[0]
        .read(1, 0, 8, 512)
        .expect("healthy read after the storm");
    assert!(back == pattern, "the healthy controller's data changed");
}

/// Opens an NBD session by hand (fixed newstyle, NBD_OPT_EXPORT_NAME "")
/// and returns the socket in the transmission phase.
fn nbd_session(socket: &std::path::Path) -> std::os::unix::net::UnixStream {
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("NBD connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).expect("NBD greeting");
    s.write_all(&3u32.to_be_bytes()).expect("client flags"); // FIXED_NEWSTYLE | NO_ZEROES
    let mut opt = Vec::new();
    opt.extend_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes()); // IHAVEOPT
    opt.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
    opt.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&opt).expect("export name");
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).expect("export size and flags");
    s
}

/// Random NBD requests (any command, flags, offsets and lengths, with and
/// without payloads, sometimes a bad magic or a half-sent payload) never
/// bring `rdmablk connect` down, and the export keeps serving.
#[test]
fn random_nbd_clients_never_bring_the_export_down() {
    let _machine = crate::shared();
    use rdmablk::frontend::nbd::proto::{Command as Nbd, Request};
    let t = Target::start(&["--memory", "16MiB", "--block-size", "4096"]);
    let mut e = rdmablk_tests::NbdExport::start(t.port(), rdmablk_tests::names::DEFAULT_NQN, &[]);
    let mut rng = Rng::new(0x4e42);
    let size = 16u64 << 20;
    for _ in 0..ROUNDS / 4 {
        let mut s = nbd_session(e.socket());
        let _ = s.set_read_timeout(Some(Duration::from_millis(5)));
        for _ in 0..8 {
            let command = Nbd::from(rng.below(12) as u16);
            let offset = match rng.below(3) {
                0 => rng.below(size),
                1 => rng.below(size / 512) * 512,
                _ => rng.next_u64(),
            };
            let length = match rng.below(4) {
                0 => rng.below(8192) as u32,
                1 => (rng.below(64) as u32) * 4096,
                2 => rng.below(4 << 20) as u32,
                _ => rng.next_u64() as u32,
            };
            let req = Request {
                flags: rng.next_u64() as u16 & [0, 0x1, 0x3, 0xffff][rng.below(4) as usize],
                command,
                cookie: rng.next_u64(),
                offset,
                length,
            };
            let mut bytes = req.encode().to_vec();
            if rng.below(20) == 0 {
                bytes[0] ^= 0x80; // bad magic
            }
            if command == Nbd::Write {
                // The whole payload, or only part of it.
                let n = (length as usize).min(1 << 20);
                let n = if rng.below(4) == 0 { n / 2 } else { n };
                bytes.extend(rng.bytes(n));
            }
            if s.write_all(&bytes).is_err() {
                break;
            }
            let mut sink = [0u8; 65536];
            while let Ok(n) = s.read(&mut sink) {
                if n == 0 {
                    break;
                }
            }
        }
        assert!(
            e.proc().is_running(),
            "rdmablk connect died\n{}",
            e.proc().report()
        );
    }
    let r = rdmablk_tests::run(
        "qemu-io",
        Command::new("qemu-io").args([
            "-f",
            "raw",
            "-c",
            "write -P 0x3c 4096 8192",
            "-c",
            "read -P 0x3c 4096 8192",
            e.uri(),
        ]),
        Duration::from_secs(30),
    );
    let out = format!("{}{}", r.stdout, r.stderr);
    assert!(
        r.status.success() && !out.contains("fail"),
        "the export after the storm\n{}",
        r.report()
    );
}

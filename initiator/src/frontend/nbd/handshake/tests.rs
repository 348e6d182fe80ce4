//! The handshake against scripted clients, and against libnbd's nbdinfo
//! and nbdcopy.

use super::super::proto::{
    self, flags::*, structured_done, structured_error, structured_offset_data_header, Command,
    Request, REQUEST_LEN,
};
use super::*;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Command as Process, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(5);
const NQN: &str = "nqn.2026-11.io.rdmablk:test";
const SERVED: u16 = SEND_FLUSH | SEND_FUA | SEND_TRIM | SEND_WRITE_ZEROES | CAN_MULTI_CONN;

fn export() -> Export {
    Export {
        name: NQN.to_string(),
        description: "rdmablk test namespace".to_string(),
        size: 64 << 20,
        min_block: 512,
        preferred_block: 4096,
        max_block: 32 << 20,
        read_only: false,
        flags: SERVED,
    }
}

// ---- scripted client over a socket pair ----

/// Runs the handshake against `client`; returns the server's result.
fn run(export: Export, client: impl FnOnce(&mut UnixStream)) -> Result<Outcome, HandshakeError> {
    let (mut c, mut s) = UnixStream::pair().unwrap();
    for sock in [&c, &s] {
        sock.set_read_timeout(Some(TIMEOUT)).unwrap();
        sock.set_write_timeout(Some(TIMEOUT)).unwrap();
    }
    let server = thread::spawn(move || serve_handshake(&mut s, &export));
    client(&mut c);
    server.join().unwrap()
}

/// Reads the greeting and answers with `client_flags`.
fn greet(c: &mut UnixStream, client_flags: u32) {
    let mut g = [0u8; 18];
    c.read_exact(&mut g).unwrap();
    assert_eq!(&g[0..8], b"NBDMAGIC");
    assert_eq!(&g[8..16], b"IHAVEOPT");
    assert_eq!(&g[16..18], &[0, 3]); // FIXED_NEWSTYLE | NO_ZEROES
    c.write_all(&client_flags.to_be_bytes()).unwrap();
}

fn send_opt(c: &mut UnixStream, opt: u32, data: &[u8]) {
    let mut m = Vec::new();
    m.extend_from_slice(b"IHAVEOPT");
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    c.write_all(&m).unwrap();
}

/// Reads one option reply for `opt`; returns (reply type, data).
fn reply(c: &mut UnixStream, opt: u32) -> (u32, Vec<u8>) {
    let mut h = [0u8; 20];
    c.read_exact(&mut h).unwrap();
    assert_eq!(&h[0..8], &[0, 3, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9]);
    assert_eq!(u32::from_be_bytes(h[8..12].try_into().unwrap()), opt);
    let rep = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    let mut data = vec![0u8; len as usize];
    c.read_exact(&mut data).unwrap();
    (rep, data)
}

fn info_data(name: &str, requests: &[u16]) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(requests.len() as u16).to_be_bytes());
    for r in requests {
        d.extend_from_slice(&r.to_be_bytes());
    }
    d
}

fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

fn assert_closed(c: &mut UnixStream) {
    let mut b = [0u8; 1];
    assert_eq!(c.read(&mut b).unwrap(), 0, "server should have closed");
}

#[test]
fn options_then_go_with_block_size() {
    let out = run(export(), |c| {
        greet(c, C_FIXED_NEWSTYLE | C_NO_ZEROES);

        // Unknown option: UNSUP, and the stream stays in sync.
        send_opt(c, 42, b"xyz");
        let (rep, msg) = reply(c, 42);
        assert_eq!(rep, REP_ERR_UNSUP);
        assert_eq!(msg, b"option 42 is not supported");

        send_opt(c, OPT_LIST, &[]);
        let (rep, data) = reply(c, OPT_LIST);
        assert_eq!(rep, REP_SERVER);
        assert_eq!(&data[0..4], &(NQN.len() as u32).to_be_bytes());
        assert_eq!(&data[4..4 + NQN.len()], NQN.as_bytes());
        assert_eq!(&data[4 + NQN.len()..], b"rdmablk test namespace");
        assert_eq!(reply(c, OPT_LIST), (REP_ACK, vec![]));
        send_opt(c, OPT_LIST, b"x");
        assert_eq!(reply(c, OPT_LIST).0, REP_ERR_INVALID);

        send_opt(c, OPT_STARTTLS, &[]);
        assert_eq!(reply(c, OPT_STARTTLS).0, REP_ERR_POLICY);

        // Metadata contexts need structured replies first.
        send_opt(
            c,
            OPT_SET_META_CONTEXT,
            &meta_data("", &["base:allocation"]),
        );
        assert_eq!(reply(c, OPT_SET_META_CONTEXT).0, REP_ERR_INVALID);
        send_opt(c, OPT_STRUCTURED_REPLY, b"junk");
        assert_eq!(reply(c, OPT_STRUCTURED_REPLY).0, REP_ERR_INVALID);
        send_opt(c, OPT_STRUCTURED_REPLY, &[]);
        assert_eq!(reply(c, OPT_STRUCTURED_REPLY), (REP_ACK, vec![]));
        for opt in [OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT] {
            send_opt(c, opt, &meta_data(NQN, &["base:allocation", "qemu:"]));
            assert_eq!(reply(c, opt), (REP_ACK, vec![]), "no contexts offered");
            send_opt(c, opt, &meta_data("", &[]));
            assert_eq!(reply(c, opt), (REP_ACK, vec![]));
            let mut bad = meta_data("", &["base:allocation"]);
            bad.pop();
            send_opt(c, opt, &bad);
            assert_eq!(reply(c, opt).0, REP_ERR_INVALID);
        }

        // Bad names and malformed requests leave negotiation open.
        send_opt(c, OPT_INFO, &info_data("nqn.other", &[]));
        let (rep, msg) = reply(c, OPT_INFO);
        assert_eq!(rep, REP_ERR_UNKNOWN);
        assert!(String::from_utf8(msg).unwrap().contains("nqn.other"));
        let mut bad = info_data("", &[INFO_BLOCK_SIZE]);
        bad.push(0);
        send_opt(c, OPT_GO, &bad);
        assert_eq!(reply(c, OPT_GO).0, REP_ERR_INVALID);
        send_opt(c, OPT_GO, &[0, 0, 0, 9, b'x']);
        assert_eq!(reply(c, OPT_GO).0, REP_ERR_INVALID);

        // Oversized option: discarded, TOO_BIG, still in sync.
        send_opt(c, 77, &vec![0xaa; 100_000]);
        assert_eq!(reply(c, 77).0, REP_ERR_TOO_BIG);

        // INFO on the default export: no name/description unless asked.
        send_opt(c, OPT_INFO, &info_data("", &[]));
        let (rep, d) = reply(c, OPT_INFO);
        assert_eq!(rep, REP_INFO);
        assert_eq!(&d[0..2], &INFO_EXPORT.to_be_bytes());
        assert_eq!(reply(c, OPT_INFO).1[0..2], INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(reply(c, OPT_INFO), (REP_ACK, vec![]));

        // GO by name, with block size, name, description and an unknown request.
        send_opt(
            c,
            OPT_GO,
            &info_data(NQN, &[INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION, 999]),
        );
        let mut expect_export = INFO_EXPORT.to_be_bytes().to_vec();
        expect_export.extend_from_slice(&(64u64 << 20).to_be_bytes());
        expect_export.extend_from_slice(&(HAS_FLAGS | SERVED).to_be_bytes());
        assert_eq!(reply(c, OPT_GO), (REP_INFO, expect_export));
        let mut expect_bs = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for v in [512u32, 4096, 32 << 20] {
            expect_bs.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(reply(c, OPT_GO), (REP_INFO, expect_bs));
        let mut expect_name = INFO_NAME.to_be_bytes().to_vec();
        expect_name.extend_from_slice(NQN.as_bytes());
        assert_eq!(reply(c, OPT_GO), (REP_INFO, expect_name));
        let mut expect_desc = INFO_DESCRIPTION.to_be_bytes().to_vec();
        expect_desc.extend_from_slice(b"rdmablk test namespace");
        assert_eq!(reply(c, OPT_GO), (REP_INFO, expect_desc));
        assert_eq!(reply(c, OPT_GO), (REP_ACK, vec![]));
    });
    assert_eq!(
        out.unwrap(),
        Outcome::Serve(Negotiated {
            structured_replies: true,
            transmission_flags: HAS_FLAGS | SERVED,
        })
    );
}

#[test]
fn abort_closes() {
    let out = run(export(), |c| {
        greet(c, C_FIXED_NEWSTYLE);
        send_opt(c, OPT_ABORT, b"ignored");
        assert_eq!(reply(c, OPT_ABORT), (REP_ACK, vec![]));
        assert_closed(c);
    });
    assert_eq!(out.unwrap(), Outcome::Closed);
    // A client that sends ABORT and leaves at once is no error either.
    let out = run(export(), |c| {
        greet(c, C_FIXED_NEWSTYLE);
        send_opt(c, OPT_ABORT, &[]);
        c.shutdown(std::net::Shutdown::Both).unwrap();
    });
    assert_eq!(out.unwrap(), Outcome::Closed);
}

#[test]
fn leaving_between_options_closes() {
    let out = run(export(), |c| {
        greet(c, C_FIXED_NEWSTYLE);
        send_opt(c, OPT_LIST, &[]);
        reply(c, OPT_LIST);
        reply(c, OPT_LIST);
        c.shutdown(std::net::Shutdown::Write).unwrap();
    });
    assert_eq!(out.unwrap(), Outcome::Closed);
    // Leaving in the middle of an option is an I/O error.
    let out = run(export(), |c| {
        greet(c, C_FIXED_NEWSTYLE);
        c.write_all(b"IHAVEOPT\0\0").unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
    });
    assert!(matches!(out, Err(HandshakeError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof));
}

#[test]
fn export_name_with_and_without_zeroes() {
    for (client_flags, padding) in [(C_FIXED_NEWSTYLE, 124), (C_FIXED_NEWSTYLE | C_NO_ZEROES, 0)] {
        let mut e = export();
        e.read_only = true;
        e.flags |= SEND_DF; // dropped: no structured replies
        let out = run(e, |c| {
            greet(c, client_flags);
            send_opt(c, OPT_EXPORT_NAME, NQN.as_bytes());
            let mut r = vec![0u8; 10 + padding];
            c.read_exact(&mut r).unwrap();
            assert_eq!(&r[0..8], &(64u64 << 20).to_be_bytes());
            assert_eq!(&r[8..10], &(HAS_FLAGS | READ_ONLY | SERVED).to_be_bytes());
            assert!(r[10..].iter().all(|&b| b == 0));
            assert_closed(c);
        });
        assert_eq!(
            out.unwrap(),
            Outcome::Serve(Negotiated {
                structured_replies: false,
                transmission_flags: HAS_FLAGS | READ_ONLY | SERVED,
            })
        );
    }
}

#[test]
fn structured_replies_allow_send_df() {
    let mut e = export();
    e.flags |= SEND_DF;
    let out = run(e, |c| {
        greet(c, C_FIXED_NEWSTYLE | C_NO_ZEROES);
        send_opt(c, OPT_STRUCTURED_REPLY, &[]);
        reply(c, OPT_STRUCTURED_REPLY);
        send_opt(c, OPT_EXPORT_NAME, &[]);
        let mut r = [0u8; 10];
        c.read_exact(&mut r).unwrap();
        assert_eq!(&r[8..10], &(HAS_FLAGS | SERVED | SEND_DF).to_be_bytes());
    });
    assert!(matches!(
        out.unwrap(),
        Outcome::Serve(Negotiated {
            structured_replies: true,
            ..
        })
    ));
}

/// Runs `client`; the server must fail with a protocol error mentioning
/// `needle` and close the connection.
fn expect_violation(needle: &str, client: impl FnOnce(&mut UnixStream)) {
    let out = run(export(), |c| {
        client(c);
        assert_closed(c);
    });
    match out {
        Err(HandshakeError::Protocol(msg)) => assert!(msg.contains(needle), "{msg}"),
        other => panic!("{needle}: {other:?}"),
    }
}

#[test]
fn protocol_violations_close() {
    expect_violation("unknown export", |c| {
        greet(c, C_FIXED_NEWSTYLE);
        send_opt(c, OPT_EXPORT_NAME, b"nqn.other");
    });
    expect_violation("did not advertise", |c| greet(c, C_FIXED_NEWSTYLE | 4));
    expect_violation("FIXED_NEWSTYLE", |c| greet(c, 0));
    expect_violation("not IHAVEOPT", |c| {
        greet(c, C_FIXED_NEWSTYLE);
        c.write_all(&[0u8; 16]).unwrap();
    });
    expect_violation("far beyond", |c| {
        greet(c, C_FIXED_NEWSTYLE);
        let mut h = b"IHAVEOPT".to_vec();
        h.extend_from_slice(&OPT_INFO.to_be_bytes());
        h.extend_from_slice(&u32::MAX.to_be_bytes());
        c.write_all(&h).unwrap();
    });
    expect_violation("without choosing", |c| {
        greet(c, C_FIXED_NEWSTYLE);
        for _ in 0..MAX_OPTIONS {
            send_opt(c, OPT_LIST, &[]);
            reply(c, OPT_LIST);
            reply(c, OPT_LIST);
        }
    });
}

#[test]
fn info_request_parsing_is_bounded() {
    assert_eq!(
        parse_info_request(&info_data("ab", &[3, 1])),
        Some((&b"ab"[..], vec![3, 1]))
    );
    assert_eq!(parse_info_request(&[]), None);
    assert_eq!(parse_info_request(&[0xff, 0xff, 0xff, 0xff, 0, 0]), None);
    assert_eq!(parse_info_request(&[0, 0, 0, 0, 0xff, 0xff]), None);
    assert_eq!(
        parse_meta_context(&meta_data("x", &["a:", "b:c"])),
        Some(())
    );
    assert_eq!(
        parse_meta_context(&[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]),
        None
    );
    assert_eq!(
        parse_meta_context(&[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 5]),
        None
    );
}

// ---- interoperability with libnbd's tools ----

/// A temporary directory holding the server's socket, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("nbd-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Test-only transmission loop over an in-memory disk. Returns the
/// number of requests served.
fn transmit(s: &mut UnixStream, neg: Negotiated, e: &Export, disk: &Mutex<Vec<u8>>) -> usize {
    let mut served = 0;
    loop {
        let mut h = [0u8; REQUEST_LEN];
        if !read_or_eof(s, &mut h).unwrap() {
            return served;
        }
        let req = Request::parse(&h).unwrap();
        let mut payload = vec![0u8; req.payload_len() as usize];
        s.read_exact(&mut payload).unwrap();
        if req.command == Command::Disc {
            return served;
        }
        served += 1;
        // Only used once validate() has bounded the range by the disk size.
        let range = req.offset as usize..req.offset.saturating_add(u64::from(req.length)) as usize;
        let mut out = Vec::new();
        match proto::validate(&req, e.size, neg.transmission_flags, e.max_block) {
            Err(err) if neg.structured_replies => {
                out.extend(structured_error(req.cookie, err, "rejected"));
            }
            Err(err) => out.extend(proto::simple_reply(err, req.cookie)),
            Ok(()) if req.command == Command::Read => {
                let disk = disk.lock().unwrap();
                if !neg.structured_replies {
                    out.extend(proto::simple_reply(0, req.cookie));
                } else if req.length > 0 {
                    out.extend(structured_offset_data_header(
                        req.cookie, req.offset, req.length, true,
                    ));
                } else {
                    out.extend(structured_done(req.cookie));
                }
                out.extend_from_slice(&disk[range]);
            }
            Ok(()) => {
                let mut disk = disk.lock().unwrap();
                match req.command {
                    Command::Write => disk[range].copy_from_slice(&payload),
                    Command::WriteZeroes | Command::Trim => disk[range].fill(0),
                    _ => {}
                }
                out.extend(proto::simple_reply(0, req.cookie));
            }
        }
        s.write_all(&out).unwrap();
    }
}

/// Serves `e` over `disk` on a fresh socket while `tool` runs with the
/// arguments `args(uri)`; returns its stdout, the number of transmission
/// requests served and the final disk.
fn with_tool(
    e: Export,
    disk: Vec<u8>,
    tool: &str,
    name: &str,
    args: impl Fn(&str) -> Vec<String>,
) -> (String, usize, Vec<u8>) {
    let dir = TempDir::new();
    let sock = dir.0.join("nbd.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();

    let uri = format!("nbd+unix:///{name}?socket={}", sock.display());
    let mut child = match Process::new(tool)
        .args(args(&uri))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(err) => panic!("cannot run {tool} ({err}): apt-get install libnbd-bin"),
    };

    let done = Arc::new(AtomicBool::new(false));
    let disk = Arc::new(Mutex::new(disk));
    let server = {
        let (done, disk) = (done.clone(), disk.clone());
        thread::spawn(move || {
            let mut conns = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let mut s = match listener.accept() {
                    Ok((s, _)) => s,
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    Err(err) => panic!("accept: {err}"),
                };
                let (e, disk) = (e.clone(), disk.clone());
                conns.push(thread::spawn(move || {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(TIMEOUT)).unwrap();
                    s.set_write_timeout(Some(TIMEOUT)).unwrap();
                    match serve_handshake(&mut s, &e).unwrap() {
                        Outcome::Serve(neg) => transmit(&mut s, neg, &e, &disk),
                        Outcome::Closed => 0,
                    }
                }));
            }
            conns.into_iter().map(|c| c.join().unwrap()).sum::<usize>()
        })
    };

    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            done.store(true, Ordering::Relaxed);
            panic!("{tool} did not finish within {TIMEOUT:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    done.store(true, Ordering::Relaxed);
    let served = server.join().unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        status.success(),
        "{tool} failed: {status}\n{stdout}\n{stderr}"
    );
    let disk = std::mem::take(&mut *disk.lock().unwrap());
    (stdout, served, disk)
}

/// The raw value of `"key": value` in nbdinfo's JSON (one field per line).
fn field<'a>(json: &'a str, key: &str) -> &'a str {
    let pat = format!("\"{key}\": ");
    let at = json
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {json}"));
    let rest = &json[at + pat.len()..];
    rest[..rest.find([',', '\n']).unwrap_or(rest.len())].trim()
}

/// Runs `nbdinfo ARGS URI` against `e`; returns its JSON and the number of
/// transmission requests it made.
fn nbdinfo(e: Export, args: &[&str], name: &str) -> (String, usize) {
    let disk = vec![0u8; e.size as usize];
    let (json, served, _) = with_tool(e, disk, "nbdinfo", name, |uri| {
        args.iter()
            .map(|a| a.to_string())
            .chain([uri.to_string()])
            .collect()
    });
    (json, served)
}

#[test]
fn nbdinfo_default_export() {
    let (json, served) = nbdinfo(export(), &["--json"], "");
    assert_eq!(field(&json, "protocol"), "\"newstyle-fixed\"");
    assert_eq!(field(&json, "structured"), "true");
    // NBD_INFO_NAME reports the canonical name of the default export.
    assert_eq!(field(&json, "export-name"), format!("\"{NQN}\""));
    assert_eq!(field(&json, "export-size"), (64u64 << 20).to_string());
    assert_eq!(field(&json, "block_size_minimum"), "512");
    assert_eq!(field(&json, "block_size_preferred"), "4096");
    assert_eq!(
        field(&json, "block_size_maximum"),
        (32u32 << 20).to_string()
    );
    for (key, value) in [
        ("is_read_only", "false"),
        ("is_rotational", "false"),
        ("can_flush", "true"),
        ("can_fua", "true"),
        ("can_trim", "true"),
        ("can_zero", "true"),
        ("can_multi_conn", "true"),
        ("can_fast_zero", "false"),
        ("can_df", "false"),
        ("can_cache", "false"),
    ] {
        assert_eq!(field(&json, key), value, "{key} in {json}");
    }
    assert!(served > 0, "nbdinfo reads the content: {json}");
}

#[test]
fn nbdinfo_named_read_only_export() {
    let mut e = export();
    e.read_only = true;
    e.preferred_block = 512;
    let (json, _) = nbdinfo(e, &["--json"], NQN);
    assert_eq!(field(&json, "export-name"), format!("\"{NQN}\""));
    assert_eq!(field(&json, "is_read_only"), "true");
    assert_eq!(field(&json, "block_size_preferred"), "512");
    assert_eq!(field(&json, "description"), "\"rdmablk test namespace\"");
}

#[test]
fn nbdinfo_list() {
    let (json, _) = nbdinfo(export(), &["--list", "--json"], "");
    assert_eq!(field(&json, "export-name"), format!("\"{NQN}\""));
    assert_eq!(field(&json, "description"), "\"rdmablk test namespace\"");
    assert_eq!(field(&json, "export-size"), (64u64 << 20).to_string());
    assert_eq!(field(&json, "can_multi_conn"), "true");
}

#[test]
fn nbdcopy_round_trip() {
    let dir = TempDir::new();
    let mut e = export();
    e.size = 4 << 20;
    // A zero run lets nbdcopy use write-zeroes or trim.
    let mut image: Vec<u8> = (0..e.size as usize).map(|i| (i * 7 % 251) as u8).collect();
    image[1 << 20..2 << 20].fill(0);
    let src = dir.0.join("src.img");
    let dst = dir.0.join("dst.img");
    std::fs::write(&src, &image).unwrap();

    let stale = vec![0xee; e.size as usize];
    let (_, writes, disk) = with_tool(e.clone(), stale, "nbdcopy", "", |uri| {
        vec!["--flush".into(), src.display().to_string(), uri.to_string()]
    });
    assert!(writes > 0);
    assert!(disk == image, "the export holds what nbdcopy wrote");

    let (_, reads, _) = with_tool(e, disk, "nbdcopy", NQN, |uri| {
        vec![uri.to_string(), dst.display().to_string()]
    });
    assert!(reads > 0);
    assert!(
        std::fs::read(&dst).unwrap() == image,
        "nbdcopy read back the image"
    );
}

//! Replays the committed NBD fuzz corpus (`fuzz/corpus/nbd_*/`) through the
//! checks the fuzz targets run (`rdmablk::fuzzing`), on stable, as ordinary
//! tests. libFuzzer itself runs only from `scripts/fuzz.sh`.
//!
//! `seed_corpus` (ignored) wrote the seed files: client sessions and request
//! headers built as the NBD protocol document lays them out, the way
//! nbd-client, libnbd's tools and qemu's client use the protocol. Run it again
//! with `cargo test -p rdmablk --test fuzz_corpus -- --ignored`.

use rdmablk::fuzzing::TARGETS;
use rdmablk_common::fuzzing::MAX_CORPUS_FILE;
use std::path::{Path, PathBuf};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
}

fn replay(target: &str) {
    rdmablk_common::fuzzing::replay(TARGETS, target, &corpus_dir());
}

#[test]
fn nbd_handshake() {
    replay("nbd_handshake");
}

#[test]
fn nbd_request() {
    replay("nbd_request");
}

/// A target added to `fuzzing::TARGETS` needs a test above (and a corpus).
#[test]
fn every_target_is_replayed() {
    for (name, _) in TARGETS {
        assert!(
            ["nbd_handshake", "nbd_request"].contains(name),
            "no replay test for fuzz target {name}"
        );
    }
}

// ---- seeding the corpus ----

use rdmablk::frontend::nbd::handshake::{serve_handshake, Export, Outcome};
use rdmablk::frontend::nbd::proto::{flags, Command, Request};

const NAME: &str = "nqn.2026-11.io.rdmablk:fuzz";

// Handshake values (NBD protocol document), as the export uses them.
use rdmablk::frontend::nbd::handshake::{
    C_FIXED_NEWSTYLE, C_NO_ZEROES, INFO_BLOCK_SIZE, INFO_DESCRIPTION, INFO_NAME, OPT_ABORT,
    OPT_EXPORT_NAME, OPT_GO, OPT_INFO, OPT_LIST, OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT,
    OPT_STARTTLS, OPT_STRUCTURED_REPLY,
};

/// A client's side of a session, built message by message.
struct Session(Vec<u8>);

impl Session {
    fn new(client_flags: u32) -> Self {
        Session(client_flags.to_be_bytes().to_vec())
    }

    fn opt(mut self, opt: u32, data: &[u8]) -> Self {
        self.0.extend_from_slice(b"IHAVEOPT");
        self.0.extend_from_slice(&opt.to_be_bytes());
        self.0.extend_from_slice(&(data.len() as u32).to_be_bytes());
        self.0.extend_from_slice(data);
        self
    }

    /// `NBD_OPT_INFO` / `NBD_OPT_GO` data.
    fn info(self, opt: u32, name: &str, requests: &[u16]) -> Self {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for r in requests {
            d.extend_from_slice(&r.to_be_bytes());
        }
        self.opt(opt, &d)
    }

    /// `NBD_OPT_{LIST,SET}_META_CONTEXT` data.
    fn meta(self, opt: u32, name: &str, queries: &[&str]) -> Self {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        self.opt(opt, &d)
    }

    fn req(mut self, command: Command, flags: u16, offset: u64, length: u32) -> Self {
        let r = Request {
            flags,
            command,
            cookie: self.0.len() as u64,
            offset,
            length,
        };
        self.0.extend_from_slice(&r.encode());
        if command == Command::Write {
            self.0.extend(std::iter::repeat_n(0xa5, length as usize));
        }
        self
    }
}

/// A client connection that sends `.0` and drops what the server writes.
struct Conn<'a>(std::io::Cursor<&'a [u8]>);

impl std::io::Read for Conn<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl std::io::Write for Conn<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The export the fuzz target serves, as far as the handshake cares.
fn fuzz_export() -> Export {
    Export {
        name: NAME.to_string(),
        description: String::new(),
        size: 64 << 20,
        min_block: 512,
        preferred_block: 4096,
        max_block: 2 << 20,
        read_only: false,
        flags: 0,
    }
}

fn put(target: &str, name: &str, data: &[u8]) {
    assert!(
        data.len() <= MAX_CORPUS_FILE,
        "{name}: {} bytes",
        data.len()
    );
    let dir = corpus_dir().join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), data).unwrap();
}

#[test]
#[ignore = "writes fuzz/corpus seed files; run by hand"]
fn seed_corpus() {
    let both = C_FIXED_NEWSTYLE | C_NO_ZEROES;
    let sessions = [
        // nbd-client: straight to GO on the default export, then I/O.
        (
            "built-go-default",
            Session::new(both)
                .info(OPT_GO, "", &[INFO_BLOCK_SIZE])
                .req(Command::Read, 0, 0, 4096)
                .req(Command::Write, flags::FUA, 4096, 512)
                .req(Command::Flush, 0, 0, 0)
                .req(Command::Trim, 0, 1 << 20, 1 << 20)
                .req(Command::WriteZeroes, flags::NO_HOLE, 8192, 1000)
                .req(Command::Disc, 0, 0, 0),
        ),
        // libnbd (nbdinfo, nbdcopy): structured replies, metadata context,
        // INFO then GO by name.
        (
            "built-libnbd",
            Session::new(both)
                .opt(OPT_STRUCTURED_REPLY, &[])
                .meta(OPT_SET_META_CONTEXT, NAME, &["base:allocation"])
                .info(
                    OPT_INFO,
                    NAME,
                    &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE],
                )
                .info(OPT_GO, NAME, &[INFO_BLOCK_SIZE])
                .req(Command::Read, flags::DF, 0, 65536)
                .req(Command::BlockStatus, 0, 0, 4096)
                .req(Command::Cache, 0, 0, 4096)
                .req(Command::Disc, 0, 0, 0),
        ),
        // nbdinfo --list: list, describe, leave.
        (
            "built-list",
            Session::new(both)
                .opt(OPT_LIST, &[])
                .info(OPT_INFO, NAME, &[INFO_DESCRIPTION])
                .opt(OPT_ABORT, &[]),
        ),
        // qemu's old path: NBD_OPT_EXPORT_NAME, padded answer.
        (
            "built-export-name",
            Session::new(C_FIXED_NEWSTYLE)
                .opt(OPT_EXPORT_NAME, NAME.as_bytes())
                .req(Command::Write, 0, 0, 1024)
                .req(Command::Read, 0, 512, 512)
                .req(Command::Disc, 0, 0, 0),
        ),
        // Options the server refuses before a client settles.
        (
            "built-refusals",
            Session::new(both)
                .meta(OPT_LIST_META_CONTEXT, "", &["base:"])
                .opt(OPT_STARTTLS, &[])
                .opt(42, b"unknown")
                .opt(OPT_LIST, b"data")
                .info(OPT_GO, "nqn.2026-11.io.rdmablk:other", &[])
                .opt(OPT_INFO, &[0, 0, 0, 9, 0])
                .info(OPT_GO, "", &[])
                .req(Command::Unknown(42), 0, 0, 0)
                .req(Command::Read, flags::REQ_ONE, u64::MAX - 10, 100),
        ),
        // The client leaves between options.
        ("built-leave", Session::new(both).opt(OPT_LIST, &[])),
    ];
    for (name, s) in sessions {
        // Each session gets as far as it was built to.
        let served = !matches!(name, "built-list" | "built-leave");
        let mut conn = Conn(std::io::Cursor::new(&s.0[..]));
        let outcome = serve_handshake(&mut conn, &fuzz_export()).unwrap();
        assert_eq!(
            matches!(outcome, Outcome::Serve(_)),
            served,
            "{name}: {outcome:?}"
        );
        put("nbd_handshake", name, &s.0);
    }

    // Request headers, each checked against a writable export like the one
    // served and a read-only one advertising everything.
    let mut exports = Vec::new();
    for (size, tflags, max_block) in [
        (
            64u64 << 20,
            flags::HAS_FLAGS
                | flags::SEND_FLUSH
                | flags::SEND_FUA
                | flags::SEND_TRIM
                | flags::SEND_WRITE_ZEROES
                | flags::CAN_MULTI_CONN,
            2u32 << 20,
        ),
        (1 << 30, 0x0fff, 32 << 20),
    ] {
        exports.extend_from_slice(&size.to_be_bytes());
        exports.extend_from_slice(&u16::to_be_bytes(tflags));
        exports.extend_from_slice(&max_block.to_be_bytes());
    }
    let requests = [
        ("read", Command::Read, 0, 0, 4096),
        ("read-df", Command::Read, flags::DF, 1 << 20, 65536),
        ("read-past-end", Command::Read, 0, (64 << 20) - 512, 4096),
        ("write-fua", Command::Write, flags::FUA, 4096, 512),
        ("write-overflow", Command::Write, 0, u64::MAX - 100, 4096),
        ("flush", Command::Flush, 0, 0, 0),
        ("trim", Command::Trim, 0, 0, 8 << 20),
        (
            "write-zeroes",
            Command::WriteZeroes,
            flags::NO_HOLE,
            100,
            5000,
        ),
        ("fast-zero", Command::WriteZeroes, flags::FAST_ZERO, 0, 4096),
        ("cache", Command::Cache, 0, 0, 4096),
        (
            "block-status",
            Command::BlockStatus,
            flags::REQ_ONE,
            0,
            4096,
        ),
        ("disc", Command::Disc, 0, 0, 0),
        ("unknown", Command::Unknown(0x1234), 0, 0, 0),
    ];
    for (name, command, fl, offset, length) in requests {
        let r = Request {
            flags: fl,
            command,
            cookie: 0x0102_0304_0506_0708,
            offset,
            length,
        };
        let mut seed = r.encode().to_vec();
        seed.extend_from_slice(&exports);
        put("nbd_request", &format!("built-{name}"), &seed);
    }
    let mut bad = Request {
        flags: 0,
        command: Command::Read,
        cookie: 1,
        offset: 0,
        length: 512,
    }
    .encode();
    bad[0] ^= 0xff;
    put("nbd_request", "built-bad-magic", &bad);
}

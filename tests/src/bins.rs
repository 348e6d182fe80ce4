//! Where the binaries under test are, and a check that they were built from
//! the sources as they are now.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// A built binary: `$RDMABLK_BIN_DIR/name`, else `build/release/name`, else
/// `build/debug/name` in the workspace. A binary from `build/` must be newer
/// than every `.rs` file under `src/` of its crate and of `common`, so that
/// a test never runs one that predates the change it tests; binaries from
/// `RDMABLK_BIN_DIR` are taken as they are.
pub fn bin_path(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("RDMABLK_BIN_DIR") {
        let p = Path::new(&dir).join(name);
        assert!(
            p.is_file(),
            "{} does not exist (RDMABLK_BIN_DIR is set)",
            p.display()
        );
        return p;
    }
    let build = workspace_root().join("build");
    let candidates = [
        build.join("release").join(name),
        build.join("debug").join(name),
    ];
    let p = candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "{name} not found in {} or {}: run `cargo build --release` first \
             (or point RDMABLK_BIN_DIR at the binaries)",
                candidates[0].display(),
                candidates[1].display()
            )
        });
    let built = modified(&p);
    if let Some((source, changed)) = newest_source(name) {
        assert!(
            changed <= built,
            "{} is older than {}, changed since it was built: run `cargo build --release` \
             (or point RDMABLK_BIN_DIR at binaries to test them as they are)",
            p.display(),
            source.display()
        );
    }
    p
}

/// The source directories of the crates that build binary `name`: its own
/// crate's and `common`'s. Only `src/`: a change to a crate's integration
/// tests, or a manifest edit that changes nothing, does not rebuild the
/// binary, so comparing with those would fail after a fresh build.
fn sources_of(name: &str) -> [&'static str; 2] {
    match name {
        "rdmablk-target" => ["target/src", "common/src"],
        "rdmablk" => ["initiator/src", "common/src"],
        // The test tools (tests/src/bin).
        "hold_queues" | "blkload" | "rdma_stall" | "rdma_keys" | "touch_namespaces" => {
            ["tests/src", "common/src"]
        }
        _ => panic!("bin_path: no known sources for {name}"),
    }
}

/// The most recently modified `.rs` file in the sources of `name`, and when.
fn newest_source(name: &str) -> Option<(PathBuf, SystemTime)> {
    let root = workspace_root();
    let mut newest = None;
    for dir in sources_of(name) {
        newest_rs(&root.join(dir), &mut newest);
    }
    newest
}

/// Whether a source file or directory holds unit tests only (`tests.rs`,
/// `tests/`): a change there rebuilds no binary.
fn tests_only(path: &Path) -> bool {
    path.file_stem().is_some_and(|s| s == "tests")
}

/// Updates `newest` with the `.rs` files under `dir`, recursively, unit
/// tests aside.
fn newest_rs(dir: &Path, newest: &mut Option<(PathBuf, SystemTime)>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .path();
        if tests_only(&path) {
            continue;
        }
        if path.is_dir() {
            newest_rs(&path, newest);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let t = modified(&path);
            if newest.as_ref().is_none_or(|(_, n)| t > *n) {
                *newest = Some((path, t));
            }
        }
    }
}

fn modified(path: &Path) -> SystemTime {
    fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

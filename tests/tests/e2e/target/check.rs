//! `rdmablk-target --check --config FILE`: the configuration is checked
//! against this machine (files that must exist, memory that must fit) and
//! the exit status and message say what is wrong, naming the key.

use rdmablk_tests::names::OPEN_NQN;
use rdmablk_tests::{bin_path, open_subsystem_config, run, Ran, TempDir};
use std::process::Command;
use std::time::Duration;

/// Writes `namespace` (the body of a `[[subsystem.namespace]]`) into a
/// one-subsystem configuration and runs `--check` on it.
fn check(dir: &TempDir, name: &str, namespace: &str) -> Ran {
    let path = dir.join(name);
    // --check binds nothing: any port will do.
    let text = open_subsystem_config("", OPEN_NQN, namespace).replace("{port}", "4420");
    std::fs::write(&path, text).expect("writing the config");
    let mut cmd = Command::new(bin_path("rdmablk-target"));
    cmd.arg("--check")
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info");
    run("rdmablk-target --check", &mut cmd, Duration::from_secs(30))
}

/// Fails unless `--check` exited non-zero with `key` in its output.
fn assert_refused(r: &Ran, key: &str, what: &str) {
    assert!(
        !r.status.success(),
        "{what}: --check accepted it\n{}",
        r.report()
    );
    let out = format!("{}{}", r.stdout, r.stderr);
    assert!(
        out.contains(key),
        "{what}: the message does not name {key}\n{}",
        r.report()
    );
}

#[test]
fn check_refuses_a_missing_file_without_size() {
    let _machine = crate::shared();
    let dir = TempDir::new("check-missing");
    let missing = dir.join("no-such-dir").join("ns.img");
    let r = check(
        &dir,
        "missing.toml",
        &format!(
            "  backend = \"file\"\n  path = \"{}\"\n",
            missing.to_str().expect("UTF-8 temp path")
        ),
    );
    assert_refused(
        &r,
        "subsystem[0].namespace[0].path",
        "a file namespace whose file does not exist and has no size",
    );
    assert!(!missing.exists(), "--check created {}", missing.display());
}

#[test]
fn check_refuses_memory_beyond_the_machine() {
    let _machine = crate::shared();
    let dir = TempDir::new("check-memory");
    let r = check(
        &dir,
        "huge.toml",
        "  backend = \"memory\"\n  size = \"64TiB\"\n",
    );
    assert_refused(
        &r,
        "subsystem[0].namespace[0].size",
        "a 64 TiB memory namespace",
    );
}

#[test]
fn check_accepts_a_valid_config() {
    let _machine = crate::shared();
    let dir = TempDir::new("check-valid");
    let existing = dir.sparse_file("ns.img", 16 << 20);
    let to_be_created = dir.join("created.img");
    let cases = [
        (
            "memory.toml",
            "  backend = \"memory\"\n  size = \"16MiB\"\n".to_string(),
        ),
        (
            "file.toml",
            format!(
                "  backend = \"file\"\n  path = \"{}\"\n",
                existing.to_str().expect("UTF-8 temp path")
            ),
        ),
        (
            "file-created.toml",
            format!(
                "  backend = \"file\"\n  path = \"{}\"\n  size = \"16MiB\"\n",
                to_be_created.to_str().expect("UTF-8 temp path")
            ),
        ),
    ];
    for (name, ns) in cases {
        let r = check(&dir, name, &ns);
        assert!(
            r.status.success(),
            "--check refused a valid config ({name})\n{}",
            r.report()
        );
    }
}

/// Malformed and repeated namespace identifiers are refused, naming the key.
#[test]
fn check_refuses_malformed_and_repeated_identifiers() {
    let _machine = crate::shared();
    let dir = TempDir::new("check-ids");
    let memory = "  backend = \"memory\"\n  size = \"16MiB\"\n";
    for (name, body, key) in [
        (
            "short-uuid.toml",
            format!("{memory}  uuid = \"3a9f0c4e-1b2d-4c5e-8f70\"\n"),
            "subsystem[0].namespace[0].uuid",
        ),
        (
            "zero-eui64.toml",
            format!("{memory}  eui64 = \"0000000000000000\"\n"),
            "subsystem[0].namespace[0].eui64",
        ),
        (
            "twice.toml",
            format!(
                "{memory}  nguid = \"0123456789abcdef0011223344556677\"\n\
                 [[subsystem.namespace]]\n{memory}  nguid = \"0123456789abcdef0011223344556677\"\n"
            ),
            "subsystem[0].namespace[1].nguid",
        ),
    ] {
        let r = check(&dir, name, &body);
        assert_refused(&r, key, name);
    }
}

//! Sets RDMABLK_COMMIT, the commit `--version` names: from the environment
//! when it is set (a build from a source tarball), else from Git; "unknown"
//! when neither knows. Runs again when the checked-out commit changes.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=RDMABLK_COMMIT");
    if let Ok(commit) = std::env::var("RDMABLK_COMMIT") {
        println!("cargo:rustc-env=RDMABLK_COMMIT={commit}");
        return;
    }
    let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let commit = git(&here, &["rev-parse", "--short=12", "HEAD"]);
    if let Some(gitdir) = git(&here, &["rev-parse", "--absolute-git-dir"]) {
        let gitdir = PathBuf::from(gitdir);
        println!("cargo:rerun-if-changed={}", gitdir.join("HEAD").display());
        if let Some(head) = git(&here, &["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={}", gitdir.join(head).display());
        }
        println!(
            "cargo:rerun-if-changed={}",
            gitdir.join("packed-refs").display()
        );
    }
    let commit = commit.unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=RDMABLK_COMMIT={commit}");
}

//! The target's layers point one way: a module uses its own layer and the
//! layers below it, never one above (docs/architecture.md draws them). This
//! test reads every source file under `src/` (unit tests excluded) and fails
//! on each `crate::` or `super::` path that reaches a higher layer, and on a
//! top-level module that no layer lists.

use std::path::{Path, PathBuf};

/// The layers, lowest first, each with its top-level modules.
const LAYERS: &[(&str, &[&str])] = &[
    ("configuration", &["config"]),
    ("base services", &["base"]),
    ("backends", &["backend"]),
    ("services", &["service"]),
    ("NVMe controller protocol", &["nvme"]),
    ("per-poller engine", &["engine"]),
    ("transports", &["transport"]),
    ("application", &["app"]),
];

/// Top-level modules outside the layers: test helpers (compiled for unit
/// tests only).
const OUTSIDE: &[&str] = &["testing"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, mods)| mods.contains(&module))
}

/// The source files under `dir`, unit-test files excluded.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// The module path of a file: `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

/// The code of a file without comments and without its unit tests (all
/// that follows the first `#[cfg(test)]` module).
fn code(text: &str) -> String {
    let mut text = text.to_string();
    if let Some(at) = find_test_module(&text) {
        text.truncate(at);
    }
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn find_test_module(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find("#[cfg(test)]") {
        let at = from + i;
        let rest = text[at + "#[cfg(test)]".len()..].trim_start();
        let rest = rest.strip_prefix("pub ").unwrap_or(rest);
        if rest.starts_with("mod ") {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// The first module each `crate::`/`super::` path of `code` names, as an
/// absolute top-level module name (`crate::{a, b}` names both).
fn reached(code: &str, me: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for (i, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
    {
        let inside_a_path = code[..i].ends_with("::");
        if inside_a_path || i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')
        {
            continue;
        }
        let mut base: Vec<String> = Vec::new();
        let mut rest = &code[i..];
        if let Some(r) = rest.strip_prefix("crate::") {
            rest = r;
        } else {
            base = me.to_vec();
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r.trim_start();
            }
        }
        if let Some(group) = rest.strip_prefix('{') {
            if base.is_empty() {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        out.push(name);
                    }
                }
            } else {
                out.push(base[0].clone());
            }
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        match base.first() {
            Some(top) => out.push(top.clone()),
            None if !name.is_empty() => out.push(name),
            None => {}
        }
    }
    out
}

/// The top-level modules of layers above its own that the source `text` of
/// module `me` reaches (none when `me` is in no layer).
fn upward(text: &str, me: &[String]) -> Vec<String> {
    let Some(mine) = me.first().and_then(|top| layer_of(top)) else {
        return Vec::new();
    };
    reached(&code(text), me)
        .into_iter()
        .filter(|other| layer_of(other).is_some_and(|l| l > mine))
        .collect()
}

#[test]
fn no_module_imports_from_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    for file in &files {
        let me = module_path(&src, file);
        let Some(top) = me.first() else {
            continue; // lib.rs and main.rs only declare and run the layers
        };
        if OUTSIDE.contains(&top.as_str()) {
            continue;
        }
        let rel = file.strip_prefix(&src).unwrap().display().to_string();
        let Some(mine) = layer_of(top) else {
            problems.push(format!(
                "src/{rel}: top-level module `{top}` is in no layer (add it to LAYERS)"
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read source");
        for other in upward(&text, &me) {
            let theirs = layer_of(&other).expect("upward names layers");
            problems.push(format!(
                "src/{rel} ({}) uses crate::{other} ({}), a layer above it",
                LAYERS[mine].0, LAYERS[theirs].0
            ));
        }
    }
    problems.dedup();
    assert!(
        problems.is_empty(),
        "layers must point one way (docs/architecture.md):\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_scan_sees_paths_in_every_form() {
    let me: Vec<String> = vec!["nvme".into(), "controller".into(), "connect".into()];
    let source = "use crate::{base::admission, engine::poller::Io};\n\
                use super::super::fabric::Caps;\n\
                let x = crate::app::serve();\n\
                use rdmablk_common::crate_like::x;";
    assert_eq!(reached(source, &me), ["base", "engine", "app", "nvme"]);
    let tests = "use crate::base;\n#[cfg(test)]\nmod tests {\n use crate::app;\n}";
    assert_eq!(reached(&code(tests), &me), ["base"]);
}

/// A service that imports the controller's protocol is reported, however
/// the path is written; the protocol importing a service is not.
#[test]
fn a_service_importing_nvme_is_reported() {
    let shared: Vec<String> = vec!["service".into(), "reservation".into(), "shared".into()];
    for line in [
        "use crate::nvme::namespace::Namespace;",
        "use crate::{backend::Waker, nvme::port::Arrival};",
        "use super::super::super::nvme::controller::Controller;",
        "let ns: &crate::nvme::namespace::Namespace = todo!();",
    ] {
        assert_eq!(upward(line, &shared), ["nvme"], "{line}");
    }
    let below = "use crate::backend::rbd::Pool;\n\
                 use crate::base::completions::Completions;\n\
                 use super::ptpl::Identity;\n\
                 use super::super::qos::Throttle;";
    assert!(upward(below, &shared).is_empty());
    let subsystem: Vec<String> = vec!["nvme".into(), "subsystem".into()];
    assert!(upward("use crate::service::qos::Throttle;", &subsystem).is_empty());
}

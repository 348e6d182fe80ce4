//! Unit tests of the configuration, by concern; the helpers here build
//! small configurations and check the errors they give.

use super::{parse, ConfigError};

mod file;
mod gateway;
mod limits;
mod listeners;
mod namespaces;
mod nqn;
mod quick;
mod subsystems;
mod tls;

const EXAMPLE: &str = include_str!("../../../../config/target.toml");

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:3f2a9c1e-5b7d-4e08-9a61-0c4d2b8e7f15";

/// A minimal valid config; `extra` is appended to the namespace table,
/// `tail` after everything.
fn minimal(extra: &str, tail: &str) -> String {
    format!(
        "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:4420\"\n\
         [[subsystem]]\nnqn = \"nqn.2026-11.io.example:a\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nbackend = \"memory\"\nsize = \"1GiB\"\n{extra}\n{tail}"
    )
}

fn invalid_of(text: &str) -> (String, String) {
    match parse(text) {
        Err(ConfigError::Invalid { key, problem }) => (key, problem),
        other => panic!("expected Invalid, got {other:?}\n--- config ---\n{text}"),
    }
}

#[track_caller]
pub(super) fn assert_invalid(text: &str, key: &str, problem_part: &str) {
    let (k, p) = invalid_of(text);
    assert_eq!(k, key, "problem was: {p}");
    assert!(
        p.contains(problem_part),
        "{k}: {p:?} lacks {problem_part:?}"
    );
}

#[track_caller]
fn assert_syntax(text: &str, part: &str) {
    match parse(text) {
        Err(ConfigError::Syntax(msg)) => {
            assert!(msg.contains(part), "{msg:?} lacks {part:?}");
            assert!(msg.contains("line"), "keeps the location: {msg}");
        }
        other => panic!("expected Syntax, got {other:?}"),
    }
}

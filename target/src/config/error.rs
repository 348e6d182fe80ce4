//! Why a configuration was rejected: [`ConfigError`], and [`invalid`] to
//! name a key and its problem.

use std::path::PathBuf;

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Io {
        /// The file that was read.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Not valid TOML, or a key that is unknown or has the wrong type;
    /// toml's message, with line and column.
    #[error("{0}")]
    Syntax(String),
    /// A value breaks a rule: `key: problem`.
    #[error("{key}: {problem}")]
    Invalid {
        /// Key path such as `subsystem[0].namespace[1].block_size`, or a
        /// command-line flag such as `--listen`.
        key: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
}

/// A [`ConfigError::Invalid`] at `key`.
pub(super) fn invalid(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        problem: problem.into(),
    }
}

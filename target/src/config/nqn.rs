//! NVMe Qualified Names: the syntax rules ([`validate_nqn`]), the reserved
//! discovery NQN and the default subsystem's NQN.

use super::error::{invalid, ConfigError};

/// NQN of the subsystem created by [`embedded_default`](super::embedded_default)
/// and the quick form when no NQN is given.
pub const DEFAULT_NQN: &str = "nqn.2026-11.io.rdmablk:default";

/// Well-known NQN of the discovery subsystem; reserved, so no configured
/// subsystem may use it.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Longest NQN in bytes (NVMe base specification, "NVMe Qualified Names").
const MAX_NQN_BYTES: usize = 223;
/// Prefix of NQNs built from a UUID rather than a domain name.
pub(super) const NQN_UUID_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";
/// The NQN that error messages give as an example.
pub(super) const EXAMPLE_NQN: &str = "nqn.2026-11.io.example:disk0";

/// The accepted NQN forms, appended to most [`NqnError`] messages.
const NQN_FORMS: &str = "expected nqn.YYYY-MM.reverse.domain:name \
                         (e.g. nqn.2026-11.io.example:disk0) \
                         or nqn.2014-08.org.nvmexpress:uuid:<8-4-4-4-12 hex UUID>";

/// Why [`validate_nqn`] rejected an NQN. The message completes a sentence
/// such as `"…" is not a valid NQN: {reason}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NqnError {
    /// Longer than the 223 bytes the specification allows.
    #[error(
        "it is {len} bytes long; an NQN may be at most {} bytes",
        MAX_NQN_BYTES
    )]
    TooLong {
        /// Length of the rejected NQN in bytes.
        len: usize,
    },
    /// Contains a control character.
    #[error("it contains a control character")]
    ControlCharacter,
    /// The part after `nqn.2014-08.org.nvmexpress:uuid:` is not a UUID.
    #[error(
        "{uuid:?} after \"uuid:\" is not a UUID in 8-4-4-4-12 hex form \
         (e.g. 3f2a9c1e-5b7d-4e08-9a61-0c4d2b8e7f15)"
    )]
    BadUuid {
        /// The text after `uuid:`.
        uuid: String,
    },
    /// Does not start with `nqn.`.
    #[error("it does not start with \"nqn.\"; {}", NQN_FORMS)]
    MissingPrefix,
    /// No valid `YYYY-MM` date after `nqn.`.
    #[error(
        "{date:?} after \"nqn.\" is not a year-month date YYYY-MM; {}",
        NQN_FORMS
    )]
    BadDate {
        /// The text after `nqn.` up to the first `.` or `:`.
        date: String,
    },
    /// The date is not followed by `.`.
    #[error(
        "the date must be followed by \".\" and a reverse domain name; {}",
        NQN_FORMS
    )]
    MissingDomain,
    /// No `:` after the domain.
    #[error("there is no ':' followed by a name after the domain; {}", NQN_FORMS)]
    MissingName,
    /// The domain is not dot-separated labels of `a-z`, `0-9` and `-`.
    #[error(
        "domain {domain:?} is not a reverse domain name: it needs one or more labels \
         of lowercase letters, digits and '-' separated by single dots; {}",
        NQN_FORMS
    )]
    BadDomain {
        /// The text between the date and the first `:`.
        domain: String,
    },
    /// Nothing after the `:`.
    #[error("the name after ':' is empty; {}", NQN_FORMS)]
    EmptyName,
}

/// Checks NQN syntax (NVMe base specification, "NVMe Qualified Names").
///
/// Accepts at most 223 bytes in one of two forms:
/// `nqn.YYYY-MM.reverse.domain:name` (a real year-month, domain labels of
/// `a-z`, `0-9` and `-` separated by dots, a non-empty name after the first
/// `:`), or `nqn.2014-08.org.nvmexpress:uuid:` followed by a UUID in
/// 8-4-4-4-12 hex form. Control characters are rejected. The discovery NQN
/// [`DISCOVERY_NQN`] has no `:` part and does not pass. On error, returns
/// the reason as an [`NqnError`].
pub fn validate_nqn(nqn: &str) -> Result<(), NqnError> {
    if nqn.len() > MAX_NQN_BYTES {
        return Err(NqnError::TooLong { len: nqn.len() });
    }
    if nqn.chars().any(char::is_control) {
        return Err(NqnError::ControlCharacter);
    }
    if let Some(uuid) = nqn.strip_prefix(NQN_UUID_PREFIX) {
        return if is_uuid(uuid) {
            Ok(())
        } else {
            Err(NqnError::BadUuid { uuid: uuid.into() })
        };
    }
    let Some(rest) = nqn.strip_prefix("nqn.") else {
        return Err(NqnError::MissingPrefix);
    };
    let date = rest.get(..7).unwrap_or(rest);
    if !is_year_month(date) {
        return Err(NqnError::BadDate {
            date: rest.split(['.', ':']).next().unwrap_or(rest).into(),
        });
    }
    if rest.as_bytes().get(7) != Some(&b'.') {
        return Err(NqnError::MissingDomain);
    }
    let Some((domain, name)) = rest[8..].split_once(':') else {
        return Err(NqnError::MissingName);
    };
    let labels_ok = domain.split('.').all(|label| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    });
    if !labels_ok {
        return Err(NqnError::BadDomain {
            domain: domain.into(),
        });
    }
    if name.is_empty() {
        return Err(NqnError::EmptyName);
    }
    Ok(())
}

/// Checks a subsystem NQN at `key`: valid, and not the discovery NQN.
pub(super) fn check_subsystem_nqn(key: &str, nqn: &str) -> Result<(), ConfigError> {
    if nqn == DISCOVERY_NQN {
        return Err(invalid(
            key,
            format!(
                "{nqn:?} is the well-known discovery NQN, reserved for the discovery \
                 service; choose another NQN, e.g. \"{EXAMPLE_NQN}\""
            ),
        ));
    }
    validate_nqn(nqn)
        .map_err(|reason| invalid(key, format!("{nqn:?} is not a valid NQN: {reason}")))
}

/// Whether `s` is a year-month date `YYYY-MM` (month 01 to 12).
fn is_year_month(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 7
        || b[4] != b'-'
        || !b
            .iter()
            .enumerate()
            .all(|(i, c)| i == 4 || c.is_ascii_digit())
    {
        return false;
    }
    let month = (b[5] - b'0') * 10 + (b[6] - b'0');
    (1..=12).contains(&month)
}

/// Whether `s` is a UUID in 8-4-4-4-12 hex form.
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

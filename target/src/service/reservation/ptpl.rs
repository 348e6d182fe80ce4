//! Persist Through Power Loss: a namespace's registrations and reservation
//! in a state file of its own, written atomically and durably (a new file,
//! fsync, rename, fsync of the directory) before the command that changed
//! them completes, read back when the namespace opens. A file that does not
//! describe this very namespace (another subsystem, namespace id, backend,
//! block size or size) or cannot be read is set aside as `NAME.refused`,
//! with a log line saying why, and the namespace starts without
//! registrations. Without PTPL the file is removed: the state is gone at
//! the next start, as the specification says.
//!
//! Writes run on one thread of their own ([`Saver`]): a poller never waits
//! for a disk. Waiting commands are told through their poller's
//! `Completions`, like a backend operation's end.

use super::{HostId, State};
use crate::base::completions::Completions;
use rdmablk_common::nvme::resv::ResvType;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};

/// The state file format this build writes and reads.
const FORMAT: u32 = 1;

/// Which namespace a state file is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub subsystem: String,
    pub nsid: u32,
    /// The backend: `file:PATH`, `rbd:POOL/IMAGE`, `memory`, `null`.
    pub backend: String,
    pub block_size: u32,
    /// Bytes; `None` where the backend's size is not known when it opens
    /// (an RBD image, resized by Ceph).
    pub size: Option<u64>,
}

/// The file's contents.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Contents {
    format: u32,
    #[serde(flatten)]
    identity: Identity,
    generation: u32,
    /// Persist Through Power Loss: a state file exists only with it (this
    /// is left out); a gateway group's record says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ptpl: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reservation: Option<Holder>,
    #[serde(default, rename = "registrant")]
    registrants: Vec<Registrant>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Holder {
    #[serde(rename = "type")]
    rtype: u8,
    host: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Registrant {
    host: String,
    /// Hexadecimal: TOML integers stop at 2^63.
    key: String,
}

/// A host identifier in hexadecimal.
pub(super) fn hex(h: &HostId) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// A host identifier from hexadecimal.
pub(super) fn unhex(s: &str) -> Result<HostId, String> {
    let bad = || format!("{s:?} is not a 128-bit host identifier in hexadecimal");
    if s.len() != 32 {
        return Err(bad());
    }
    let mut h = [0u8; 16];
    for (i, b) in h.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(h)
}

/// A namespace's state file.
pub struct StateFile {
    path: PathBuf,
    /// The namespace it is for (its size as given to `load` and `save`).
    identity: Identity,
}

impl StateFile {
    /// The state file of the namespace `identity` in directory `dir`: its
    /// subsystem NQN (a `/` in it written `%2F`, a `%` `%25`) and nsid.
    pub fn new(dir: &Path, identity: Identity) -> StateFile {
        let nqn = identity.subsystem.replace('%', "%25").replace('/', "%2F");
        let name = format!("{nqn}.ns{}.ptpl", identity.nsid);
        StateFile {
            path: dir.join(name),
            identity,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace it is for.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The state the file holds for this namespace: none when there is no
    /// file; a file that cannot be used is renamed `.refused` and logged.
    pub fn load(&self, size: Option<u64>) -> State {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return State::default(),
            Err(e) => return self.refuse(&format!("cannot read it: {e}")),
        };
        match self.parse(&text, size) {
            Ok(st) => {
                tracing::info!(
                    file = %self.path.display(),
                    registrants = st.registrants.len(),
                    reservation = ?st.holder.map(|(t, _)| t),
                    "reservations restored (persist through power loss)"
                );
                st
            }
            Err(why) => self.refuse(&why),
        }
    }

    fn parse(&self, text: &str, size: Option<u64>) -> Result<State, String> {
        let identity = Identity {
            size,
            ..self.identity.clone()
        };
        decode(&identity, text)
    }

    fn refuse(&self, why: &str) -> State {
        let mut aside = self.path.clone().into_os_string();
        aside.push(".refused");
        let moved = std::fs::rename(&self.path, &aside);
        tracing::error!(
            file = %self.path.display(),
            "reservation state file refused, the namespace starts without registrations: {why}{}",
            match moved {
                Ok(()) => format!("; kept as {}", Path::new(&aside).display()),
                Err(e) => format!("; could not move it aside: {e}"),
            }
        );
        State::default()
    }

    /// Makes `st` what the file says, durably: written and fsynced under a
    /// temporary name, renamed over the file, the directory fsynced. A state
    /// without PTPL removes the file.
    pub fn save(&self, st: &State, size: Option<u64>) -> std::io::Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        if !st.ptpl {
            match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                r => r?,
            }
            return std::fs::File::open(dir)?.sync_all();
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let identity = Identity {
            size,
            ..self.identity.clone()
        };
        let text = format!(
            "# rdmablk-target: reservations of one namespace, kept through power loss.\n\
             # Written by the daemon; a file that does not match its namespace is refused.\n{}",
            encode(&identity, st, false)
        );
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".new");
        // Host identifiers and keys: for the daemon only.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        std::fs::File::open(dir)?.sync_all()
    }
}

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};

/// `st` as a state file (`with_ptpl` false: PTPL goes without saying) or
/// a gateway group's record holds it, for namespace `identity`.
pub fn encode(identity: &Identity, st: &State, with_ptpl: bool) -> String {
    let contents = Contents {
        format: FORMAT,
        identity: identity.clone(),
        generation: st.generation,
        ptpl: with_ptpl.then_some(st.ptpl),
        reservation: st.holder.map(|(t, h)| Holder {
            rtype: t as u8,
            host: hex(&h),
        }),
        registrants: st
            .registrants
            .iter()
            .map(|(h, k)| Registrant {
                host: hex(h),
                key: format!("{k:#x}"),
            })
            .collect(),
    };
    toml::to_string(&contents).expect("plain strings and numbers serialize")
}

/// The state `text` (a state file or record) holds for namespace
/// `identity`; why it cannot be used otherwise.
pub fn decode(identity: &Identity, text: &str) -> Result<State, String> {
    let c: Contents = toml::from_str(text).map_err(|e| format!("not a state file: {e}"))?;
    if c.format != FORMAT {
        return Err(format!("format {} (this build reads {FORMAT})", c.format));
    }
    if c.identity != *identity {
        return Err(format!(
            "it is for another namespace: {:?}, this one is {identity:?}",
            c.identity
        ));
    }
    let mut registrants = Vec::new();
    for r in &c.registrants {
        let key = u64::from_str_radix(r.key.trim_start_matches("0x"), 16)
            .map_err(|_| format!("key {:?} is not a 64-bit hexadecimal number", r.key))?;
        registrants.push((unhex(&r.host)?, key));
    }
    let holder = match &c.reservation {
        None => None,
        Some(h) => {
            let t = ResvType::from_u8(h.rtype)
                .ok_or_else(|| format!("reservation type {} does not exist", h.rtype))?;
            let host = unhex(&h.host)?;
            if !registrants.iter().any(|(r, _)| *r == host) {
                return Err("the reservation's holder is not a registrant".into());
            }
            Some((t, host))
        }
    };
    Ok(State {
        generation: c.generation,
        ptpl: c.ptpl.unwrap_or(true),
        registrants,
        holder,
    })
}

/// What the saver is asked: a namespace's state to write, and whom to tell.
pub trait Persistent: Send + Sync {
    /// Writes the state as it is now.
    fn persist(&self) -> std::io::Result<()>;
}

/// Commands waiting for one namespace's state to be written.
struct Dirty {
    what: Weak<dyn Persistent>,
    waiting: Vec<(Arc<Completions>, u64)>,
}

/// The thread that writes state files, in turn; each write takes the state
/// as it is when it starts, so one write serves every change before it.
pub struct Saver {
    dirty: Mutex<HashMap<usize, Dirty>>,
    ready: Condvar,
}

impl Saver {
    /// The daemon's saver (its thread starts with the first request).
    pub fn get() -> &'static Saver {
        static SAVER: OnceLock<&'static Saver> = OnceLock::new();
        SAVER.get_or_init(|| {
            let saver: &'static Saver = Box::leak(Box::new(Saver {
                dirty: Mutex::new(HashMap::new()),
                ready: Condvar::new(),
            }));
            if let Err(e) = std::thread::Builder::new()
                .name("ptpl".into())
                .spawn(move || saver.run())
            {
                tracing::error!("cannot start the reservation state writer: {e}");
            }
            saver
        })
    }

    /// Writes `what`'s state, then records the end (0 or -errno) with
    /// `token` in `completions`.
    pub fn save(&self, what: &Arc<dyn Persistent>, token: u64, completions: &Arc<Completions>) {
        let key = Arc::as_ptr(what) as *const () as usize;
        let mut d = self.dirty.lock().expect("saver lock");
        d.entry(key)
            .or_insert_with(|| Dirty {
                what: Arc::downgrade(what),
                waiting: Vec::new(),
            })
            .waiting
            .push((completions.clone(), token));
        self.ready.notify_one();
    }

    fn run(&self) {
        loop {
            let batch: Vec<Dirty> = {
                let mut d = self.dirty.lock().expect("saver lock");
                while d.is_empty() {
                    d = self.ready.wait(d).expect("saver lock");
                }
                d.drain().map(|(_, v)| v).collect()
            };
            for Dirty { what, waiting } in batch {
                let res = match what.upgrade() {
                    Some(w) => match w.persist() {
                        Ok(()) => 0,
                        Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
                    },
                    None => -libc::ENODEV,
                };
                for (c, token) in waiting {
                    c.push(token, res);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, backend: &str) -> StateFile {
        StateFile::new(
            dir,
            Identity {
                subsystem: "nqn.2026-12.io.rdmablk:t".into(),
                nsid: 1,
                backend: backend.into(),
                block_size: 512,
                size: None,
            },
        )
    }

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "rdmablk-ptpl-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn state() -> State {
        State {
            generation: 9,
            ptpl: true,
            registrants: vec![([1; 16], u64::MAX), ([2; 16], 7)],
            holder: Some((ResvType::ExclusiveAccessRegistrantsOnly, [2; 16])),
        }
    }

    #[test]
    fn a_slash_in_the_nqn_stays_in_the_directory() {
        let mut id = file(Path::new("/d"), "null").identity;
        id.subsystem = "nqn.2026-12.io.rdmablk:a/b%c".into();
        let f = StateFile::new(Path::new("/d"), id);
        assert_eq!(
            f.path(),
            Path::new("/d/nqn.2026-12.io.rdmablk:a%2Fb%25c.ns1.ptpl")
        );
    }

    #[test]
    fn saved_state_comes_back() {
        let d = dir();
        let f = file(&d, "file:/srv/a.img");
        f.save(&state(), Some(1 << 20)).expect("save");
        assert_eq!(f.load(Some(1 << 20)), state());
        // Without PTPL the file goes: nothing comes back.
        f.save(&State::default(), Some(1 << 20)).expect("save");
        assert!(!f.path().exists());
        assert_eq!(f.load(Some(1 << 20)), State::default());
        std::fs::remove_dir_all(&d).expect("clean up");
    }

    /// Another namespace's file, a resized namespace, or garbage: refused,
    /// set aside, nothing applied.
    #[test]
    fn foreign_files_are_refused() {
        let d = dir();
        let f = file(&d, "file:/srv/a.img");
        let aside = |f: &StateFile| {
            let mut p = f.path().as_os_str().to_owned();
            p.push(".refused");
            PathBuf::from(p)
        };
        f.save(&state(), Some(1 << 20)).expect("save");
        assert_eq!(f.load(Some(2 << 20)), State::default(), "resized");
        assert!(aside(&f).exists() && !f.path().exists());
        file(&d, "file:/srv/b.img")
            .save(&state(), Some(1 << 20))
            .expect("save");
        assert_eq!(f.load(Some(1 << 20)), State::default(), "another file");
        std::fs::write(f.path(), "reservation = [").expect("write");
        assert_eq!(f.load(Some(1 << 20)), State::default(), "garbage");
        std::fs::remove_dir_all(&d).expect("clean up");
    }
}

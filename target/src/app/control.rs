//! The control socket: `rdmablk-target reload`, `status`, `ana set` and
//! `qos set` talk
//! to the running daemon over a Unix socket that only its owner (root under
//! systemd) may open. One request per connection, one line; the answer's
//! last line is `ok` or `error: ...`. One thread answers one request at a
//! time.

use crate::app::reload::{self, Running};
use crate::app::report::status;
use crate::app::{ana, qos};
use crate::config::AnaState;
use crate::engine::poller::Shared;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where the systemd unit puts the socket, and where the subcommands look.
pub const DEFAULT_PATH: &str = "/run/rdmablk/control.sock";
/// Time a client has to send its request.
const READ_DEADLINE: Duration = Duration::from_secs(2);
/// Bytes of request read at most (`qos set` names two NQNs of up to 223).
const MAX_REQUEST: u64 = 1024;
/// How long the subcommands wait for an answer (a reload drains removed
/// namespaces for up to 30 s).
const ANSWER_DEADLINE: Duration = Duration::from_secs(60);

/// Binds the socket at `path` (owner-only), replacing a stale one; refuses
/// when another daemon answers there.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another daemon answers on {}", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Answers requests until the process ends.
pub fn serve(
    listener: UnixListener,
    running: Arc<Mutex<Running>>,
    shared: Arc<Shared>,
    started: Instant,
) {
    for conn in listener.incoming() {
        let Ok(s) = conn else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        if let Err(e) = answer(s, &running, &shared, started) {
            tracing::debug!("control request: {e}");
        }
    }
}

fn answer(
    mut s: UnixStream,
    running: &Mutex<Running>,
    shared: &Shared,
    started: Instant,
) -> io::Result<()> {
    s.set_read_timeout(Some(READ_DEADLINE))?;
    s.set_write_timeout(Some(READ_DEADLINE))?;
    let mut line = String::new();
    BufReader::new((&s).take(MAX_REQUEST)).read_line(&mut line)?;
    let reply = match line.trim() {
        "reload" => {
            let mut r = running.lock().expect("running configuration");
            match reload::reload(&mut r) {
                Ok(changes) if changes.is_empty() => "no change\nok\n".to_string(),
                Ok(changes) => changes.join("\n") + "\nok\n",
                Err(e) => {
                    tracing::warn!("reload refused: {e}");
                    format!("error: {e}\n")
                }
            }
        }
        "status" => {
            let group = running
                .lock()
                .expect("running configuration")
                .gateway
                .clone();
            let mut text = status::render(shared, started);
            for line in group.iter().flat_map(|g| g.status().lines()) {
                text += &line;
                text.push('\n');
            }
            text + "ok\n"
        }
        other => {
            let r = running.lock().expect("running configuration");
            if let Some(args) = other.strip_prefix("ana set ") {
                ana_set(args, &r)
            } else if let Some(args) = other.strip_prefix("qos set ") {
                answer_lines(qos::set(&r, args))
            } else {
                format!(
                    "error: unknown request {other:?}; send reload, status, ana set or qos set\n"
                )
            }
        }
    };
    s.write_all(reply.as_bytes())
}

/// `ana set GROUP STATE [LISTENER]`: the answer to send.
fn ana_set(args: &str, running: &Running) -> String {
    let words: Vec<&str> = args.split_whitespace().collect();
    let parsed = match words[..] {
        [group, state] | [group, state, _] => group
            .parse::<u32>()
            .map_err(|_| format!("{group:?} is not an ANA group id"))
            .and_then(|g| state.parse::<AnaState>().map(|s| (g, s))),
        _ => Err("usage: ana set GROUP STATE [LISTENER]".to_string()),
    };
    answer_lines(parsed.and_then(|(g, s)| ana::set(running, g, s, words.get(2).copied())))
}

/// The answer to a request that changed something (its lines) or not.
fn answer_lines(r: Result<Vec<String>, String>) -> String {
    match r {
        Ok(lines) => lines.join("\n") + "\nok\n",
        Err(e) => format!("error: {e}\n"),
    }
}

/// Sends `request` to the daemon at `path` and prints its answer; Ok(true)
/// when the answer ends in `ok`.
pub fn request(path: &Path, request: &str) -> Result<bool, String> {
    let mut s = UnixStream::connect(path).map_err(|e| {
        format!(
            "cannot reach the daemon at {}: {e} (is rdmablk-target running with --control {}?)",
            path.display(),
            path.display()
        )
    })?;
    s.set_read_timeout(Some(ANSWER_DEADLINE))
        .map_err(|e| e.to_string())?;
    s.write_all(format!("{request}\n").as_bytes())
        .map_err(|e| format!("sending {request}: {e}"))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .map_err(|e| format!("reading the answer to {request}: {e}"))?;
    let mut ok = false;
    for l in answer.lines() {
        if l == "ok" {
            ok = true;
        } else if let Some(e) = l.strip_prefix("error: ") {
            eprintln!("rdmablk-target {request}: {e}");
        } else {
            println!("{l}");
        }
    }
    Ok(ok)
}

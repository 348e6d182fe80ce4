//! The test host's DH-HMAC-CHAP: `common::auth::host`'s transaction, its
//! messages carried by AUTH_Send and AUTH_Receive on a test queue.

use crate::client::Queue;
use rdmablk_common::auth::host::{AuthError, HostSecrets, HostTransaction};
use rdmablk_common::auth::message::{self, Message};
use rdmablk_common::auth::Secret;
use std::io;

pub use rdmablk_common::auth::host::HostSecrets as Secrets;

/// Secrets from DHHC-1 strings.
pub fn secrets(host: &str, ctrl: Option<&str>) -> HostSecrets {
    HostSecrets::new(
        Secret::parse(host).expect("a DHHC-1 host secret"),
        ctrl.map(|c| Secret::parse(c).expect("a DHHC-1 controller secret")),
    )
}

fn send(q: &mut Queue, m: &Message) -> io::Result<()> {
    let data = m.encode();
    q.exec(message::command(true, data.len()), Some(&data), 0)?
        .check("AUTH_Send")
        .map(|_| ())
}

fn receive(q: &mut Queue) -> io::Result<Message> {
    let len = message::RECEIVE_LEN;
    let c = q
        .exec(message::command(false, len), None, len as u32)?
        .check("AUTH_Receive")?;
    Message::decode(&c.data).map_err(|e| io::Error::other(e.to_string()))
}

/// Authenticates queue `q`; `Ok(Err(..))` when the protocol refused.
pub fn authenticate(
    q: &mut Queue,
    tid: u16,
    s: &HostSecrets,
    host_nqn: &str,
    subsys_nqn: &str,
) -> io::Result<Result<(), AuthError>> {
    let mut t = HostTransaction::new(s, tid, host_nqn, subsys_nqn);
    send(q, &t.negotiate())?;
    let reply = match t.on_challenge(receive(q)?) {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    send(q, &reply)?;
    match t.on_success1(receive(q)?) {
        Ok(Some(success2)) => send(q, &success2).map(Ok),
        Ok(None) => Ok(Ok(())),
        Err((failure2, e)) => {
            if let Some(f) = failure2 {
                send(q, &f)?;
            }
            Ok(Err(e))
        }
    }
}

//! DH-HMAC-CHAP on a queue being set up: `common::auth::host`'s
//! transaction, its messages carried by AUTH_Send and AUTH_Receive on the
//! queue's synchronous path, right after a Connect that set ATR.

use super::sync_queue::SyncQueue;
use super::{HostError, Params};
use rdmablk_common::auth::host::HostTransaction;
use rdmablk_common::auth::message::{self, Message};

fn send(q: &mut SyncQueue, m: &Message) -> Result<(), HostError> {
    let data = m.encode();
    q.exec_ok("AUTH_Send", message::command(true, data.len()), &data, 0)?;
    Ok(())
}

fn receive(q: &mut SyncQueue) -> Result<Message, HostError> {
    let len = message::RECEIVE_LEN;
    let (_, data) = q
        .exec_ok("AUTH_Receive", message::command(false, len), &[], len)
        .map_err(|e| match e {
            // nvmet ends the controller as it refuses, and its AUTH_Failure1
            // may not reach us before the connection closes.
            HostError::Protocol(why) => HostError::Protocol(format!(
                "authentication did not complete: {why} (a target that refuses \
                 the secrets may close at once)"
            )),
            e => e,
        })?;
    Message::decode(&data).map_err(|e| HostError::Protocol(format!("authentication: {e}")))
}

/// Authenticates queue `qid` (its transaction id) with subsystem `subnqn`.
pub fn authenticate(
    q: &mut SyncQueue,
    qid: u16,
    p: &Params,
    subnqn: &str,
) -> Result<(), HostError> {
    let Some(secrets) = &p.dhchap else {
        return Err(HostError::AuthRequired { nqn: subnqn.into() });
    };
    let failed = |source| HostError::Auth {
        qid,
        nqn: subnqn.into(),
        source,
    };
    let mut t = HostTransaction::new(secrets, qid, &p.hostnqn, subnqn);
    send(q, &t.negotiate())?;
    let reply = t.on_challenge(receive(q)?).map_err(failed)?;
    send(q, &reply)?;
    match t.on_success1(receive(q)?) {
        Ok(Some(success2)) => send(q, &success2)?,
        Ok(None) => {}
        Err((failure2, e)) => {
            if let Some(f) = failure2 {
                // The verdict is ours whatever becomes of the message:
                // nvmet ends the controller on AUTH_Failure2 and may close
                // the connection before it completes the AUTH_Send.
                if let Err(sent) = send(q, &f) {
                    tracing::debug!(qid, "AUTH_Failure2 not acknowledged: {sent}");
                }
            }
            return Err(failed(e));
        }
    }
    tracing::debug!(qid, "queue authenticated");
    Ok(())
}

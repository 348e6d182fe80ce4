//! `rdmablk-target ana set`: an operator (or a cluster manager) sets the
//! state of an ANA group on one listener or all, without rewriting the
//! configuration file; it holds until the next reload or restart, which
//! apply the file. The transitional `change` state is bounded: a group left
//! in it for ANATT becomes inaccessible by itself.

use crate::app::reload::{Listening, Running};
use crate::config::{AnaState, MAX_ANA_GROUP};
use crate::nvme::subsystem::Registry;
use crate::service::ana::{AnaStates, ANATT};
use std::sync::Arc;

/// Sets ANA group `group` to `state` on the listener `listener` names
/// (`ADDR:PORT` or `TRANSPORT://ADDR:PORT`), or on every listener. Returns
/// one line per listener, or why nothing changed.
pub fn set(
    running: &Running,
    group: u32,
    state: AnaState,
    listener: Option<&str>,
) -> Result<Vec<String>, String> {
    if let Some(g) = &running.cfg.gateway_group {
        return Err(format!(
            "the gateway group {:?} sets every ANA group's state from its leases; \
             stop the owning gateway to move a group",
            g.name
        ));
    }
    if !(1..=MAX_ANA_GROUP).contains(&group) {
        return Err(format!(
            "ANA group {group} is out of range; use 1 to {MAX_ANA_GROUP}"
        ));
    }
    let chosen: Vec<&Listening> = running
        .listeners
        .iter()
        .filter(|l| listener.is_none_or(|want| names(l, want)))
        .collect();
    if chosen.is_empty() {
        let all: Vec<String> = running.listeners.iter().map(Listening::url).collect();
        return Err(format!(
            "no listener {:?}; the listeners are {}",
            listener.unwrap_or_default(),
            all.join(", ")
        ));
    }
    let mut lines = Vec::new();
    for l in chosen {
        let ana = &l.port.ana;
        if !ana.set(group, state) {
            lines.push(format!("ANA group {group} on {}: already {state}", l.url()));
            continue;
        }
        tracing::info!(listener = %l.url(), "ANA group {group} set {state} by command");
        running.registry.ana_changed(ana, &[group]);
        if state == AnaState::Change {
            end_change_after_anatt(&running.registry, ana, group, l.url());
        }
        lines.push(format!("ANA group {group} on {}: {state}", l.url()));
    }
    Ok(lines)
}

/// Whether `want` (`ADDR:PORT` or `TRANSPORT://ADDR:PORT`) names listener `l`.
fn names(l: &Listening, want: &str) -> bool {
    match want.split_once("://") {
        Some(_) => want.eq_ignore_ascii_case(&l.url()),
        None => want.parse() == Ok(l.cfg.address),
    }
}

/// Moves group `group` of `ana` from change to inaccessible once ANATT has
/// passed, unless it moved on by then (one short-lived thread per command).
fn end_change_after_anatt(registry: &Arc<Registry>, ana: &Arc<AnaStates>, group: u32, url: String) {
    let entered = ana.group_changes(group);
    let (registry, states) = (Arc::downgrade(registry), ana.clone());
    let spawned = std::thread::Builder::new()
        .name("ana-change".into())
        .spawn(move || {
            std::thread::sleep(ANATT);
            let Some(registry) = registry.upgrade() else {
                return;
            };
            if states.expire_change(group, entered) {
                tracing::warn!(
                    listener = %url,
                    "ANA group {group} was left in change for ANATT ({} s): now inaccessible",
                    ANATT.as_secs()
                );
                registry.ana_changed(&states, &[group]);
            }
        });
    if let Err(e) = spawned {
        // Without the thread the group must not stay in change unbounded.
        tracing::error!("cannot start the ANATT timer ({e}): ANA group {group} made inaccessible");
        let _ = ana.set(group, AnaState::Inaccessible);
    }
}

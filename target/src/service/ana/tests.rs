//! ANA states: their counts, path statuses, change timing and the ANA
//! log they make.

use super::*;

fn listener(groups: &[(u32, AnaState)]) -> ListenerConfig {
    let mut l = ListenerConfig::new(
        crate::config::Transport::Tcp,
        "127.0.0.1:4420".parse().unwrap(),
    );
    l.ana_groups = groups.iter().copied().collect();
    l
}

#[test]
fn states_counts_and_path_statuses() {
    let a = AnaStates::new(&listener(&[(2, AnaState::NonOptimized)]));
    assert_eq!(
        a.state(1),
        AnaState::Optimized,
        "unnamed groups are optimized"
    );
    assert_eq!(a.state(2), AnaState::NonOptimized);
    assert_eq!((a.io_status(1), a.io_status(2)), (None, None));
    assert!(!a.set(1, AnaState::Optimized), "no change, no count");
    assert!(a.set(1, AnaState::Inaccessible));
    // NVMe Base 2.1, Figure 105: SCT 3h, SC 01h to 03h.
    assert_eq!(a.io_status(1), Some(Status::ANA_INACCESSIBLE));
    a.set(1, AnaState::PersistentLoss);
    assert_eq!(a.io_status(1), Some(Status::ANA_PERSISTENT_LOSS));
    a.set(1, AnaState::Change);
    assert_eq!(a.io_status(1), Some(Status::ANA_TRANSITION));
    assert_eq!(a.group_changes(1), 3);
    assert_eq!(a.group_changes(2), 0);
    // A reload to the configured states: group 1 back to optimized, 2 moved.
    let changed = a.apply(&listener(&[(2, AnaState::Inaccessible)]));
    assert_eq!(changed, vec![1, 2]);
    assert_eq!(a.log(&BTreeMap::new(), false).chgcnt, 5);
}

#[test]
fn a_change_state_ends_after_anatt_unless_it_moved() {
    let a = AnaStates::new(&listener(&[]));
    a.set(3, AnaState::Change);
    let entered = a.group_changes(3);
    a.set(3, AnaState::Optimized);
    assert!(!a.expire_change(3, entered), "moved on in time");
    a.set(3, AnaState::Change);
    let entered = a.group_changes(3);
    assert!(a.expire_change(3, entered));
    assert_eq!(a.state(3), AnaState::Inaccessible);
    assert!(!a.expire_change(3, entered), "once");
}

#[test]
fn log_lists_groups_with_namespaces_and_rgo_drops_the_lists() {
    let a = AnaStates::new(&listener(&[(2, AnaState::NonOptimized)]));
    let groups = BTreeMap::from([(1, vec![1, 3]), (2, vec![2])]);
    let log = a.log(&groups, false);
    assert_eq!(log.groups.len(), 2);
    assert_eq!(log.groups[0].nsids, vec![1, 3]);
    assert_eq!(log.groups[1].state, AnaState::NonOptimized);
    let rgo = a.log(&groups, true);
    assert!(rgo.groups.iter().all(|g| g.nsids.is_empty()));
    assert_eq!(rgo.groups[1].grpid, 2);
}

//! Tests of `wire/src/session`.

use super::*;
use crate::model::{CiliumNetworkPolicy, ResourceKey, ResourceType};

fn policy(id: &str, version: Pk) -> Resource {
    Resource::CiliumNetworkPolicy(CiliumNetworkPolicy {
        id: id.into(),
        workspace_id: "ws".into(),
        environment_id: "env".into(),
        region: "us-east".into(),
        k8s_name: id.into(),
        k8s_namespace: "ns".into(),
        policy_json: "{}".into(),
        version,
        created_at_ms: 0,
        updated_at_ms: 0,
    })
}

fn delete(id: &str) -> ResourceChange {
    ResourceChange::Delete(ResourceKey {
        resource_type: ResourceType::CiliumNetworkPolicy,
        resource_id: id.into(),
        region: "us-east".into(),
    })
}

#[test]
fn plan_follows_the_cursor_rules() {
    assert_eq!(plan_watch(0, 1, 1, 10, 20), WatchStart::FullSync);
    // Another epoch: the cursor means nothing, behind or ahead.
    for cursor in [5, 15, 25] {
        assert_eq!(
            plan_watch(cursor, 1, 2, 10, 20),
            WatchStart::EpochChanged { epoch: 2 }
        );
    }
    // A cursor 0 needs no epoch; an unknown epoch trusts the cursor.
    assert_eq!(plan_watch(0, 0, 2, 10, 20), WatchStart::FullSync);
    assert_eq!(
        plan_watch(15, 0, 2, 10, 20),
        WatchStart::Incremental { after: 15 }
    );
    // A node with no epoch yet is another epoch than a known one.
    assert_eq!(
        plan_watch(15, 2, 0, 10, 20),
        WatchStart::EpochChanged { epoch: 0 }
    );
    assert_eq!(
        plan_watch(5, 1, 1, 10, 20),
        WatchStart::ResyncRequired { floor: 10 }
    );
    assert_eq!(
        plan_watch(10, 1, 1, 10, 20),
        WatchStart::Incremental { after: 10 }
    );
    assert_eq!(
        plan_watch(20, 1, 1, 10, 20),
        WatchStart::Incremental { after: 20 }
    );
    assert_eq!(
        plan_watch(21, 1, 1, 10, 20),
        WatchStart::WaitForCatchUp { cursor: 21 }
    );
}

/// A cursor of another epoch: the server says so as its only event,
/// the client resets its cursor; a full sync then carries the epoch.
#[test]
fn an_epoch_change_resets_the_cursor() {
    let mut server = WatchServer::new();
    let mut client = WatchClient::new(40);
    let event = server.epoch_changed(9).unwrap();
    assert!(server.sync_start(3, 9).is_err());
    assert_eq!(
        client.on_event(event).unwrap(),
        ClientAction::EpochChanged { epoch: 9 }
    );
    assert_eq!(client.cursor(), 0);
    // Not allowed on a full-sync request, nor after the first event.
    let mut fresh = WatchClient::new(0);
    assert!(
        fresh
            .on_event(WatchEvent::EpochChanged { epoch: 9 })
            .is_err()
    );

    let mut server = WatchServer::new();
    let mut client = WatchClient::new(0);
    assert_eq!(
        client.on_event(server.sync_start(3, 9).unwrap()).unwrap(),
        ClientAction::BeginFullSync {
            cursor: 3,
            epoch: 9
        }
    );
}

/// A server and a client wired together in memory: full sync, then
/// changes and bookmarks; the cursor only moves on confirmed applies.
#[test]
fn full_sync_then_changes_in_memory() {
    let mut server = WatchServer::new();
    let mut client = WatchClient::new(0);
    let mut events = vec![
        server.sync_start(7, 1).unwrap(),
        server.sync_item(policy("a", 3)).unwrap(),
        server.sync_item(policy("b", 7)).unwrap(),
        server.sync_end().unwrap(),
        server
            .change(9, ResourceChange::Apply(policy("a", 9)))
            .unwrap(),
    ];
    events.extend(server.progress(12));
    events.push(server.change(13, delete("b")).unwrap());
    assert!(server.progress(13).is_none());

    let mut applied = Vec::new();
    for event in events {
        match client.on_event(event).unwrap() {
            ClientAction::FinishFullSync { cursor } => {
                assert_eq!(client.cursor(), 0, "cursor moves only after the GC");
                client.applied(cursor).unwrap();
            }
            ClientAction::Apply { version, change } => {
                applied.push((version, change.key().resource_id));
                client.applied(version).unwrap();
            }
            _ => {}
        }
    }
    assert_eq!(client.cursor(), 13);
    assert_eq!(applied, [(9, "a".to_string()), (13, "b".to_string())]);
}

#[test]
fn server_refuses_out_of_order_events() {
    let mut server = WatchServer::new();
    assert!(server.change(1, delete("a")).is_err(), "not live yet");
    server.resume(5).unwrap();
    assert!(server.change(5, delete("a")).is_err());
    assert!(server.change(6, delete("a")).is_ok());
    assert!(server.sync_start(1, 1).is_err());
    let mut syncing = WatchServer::new();
    syncing.sync_start(4, 1).unwrap();
    assert!(syncing.sync_item(policy("a", 5)).is_err());
}

#[test]
fn client_refuses_what_the_rules_forbid() {
    // A full sync answering an incremental request.
    assert!(
        WatchClient::new(5)
            .on_event(WatchEvent::SyncStart {
                cursor: 9,
                epoch: 1
            })
            .is_err()
    );
    // A duplicate or older change.
    let mut client = WatchClient::new(5);
    assert!(
        client
            .on_event(WatchEvent::Change {
                version: 5,
                change: delete("a")
            })
            .is_err()
    );
    // An event before the previous one was applied.
    let mut client = WatchClient::new(5);
    client
        .on_event(WatchEvent::Change {
            version: 6,
            change: delete("a"),
        })
        .unwrap();
    assert!(client.on_event(WatchEvent::Progress { cursor: 7 }).is_err());
    // Mismatched sync cursors.
    let mut client = WatchClient::new(0);
    client
        .on_event(WatchEvent::SyncStart {
            cursor: 3,
            epoch: 1,
        })
        .unwrap();
    assert!(client.on_event(WatchEvent::SyncEnd { cursor: 4 }).is_err());
    // Sync items outside a sync.
    let mut client = WatchClient::new(2);
    assert!(
        client
            .on_event(WatchEvent::SyncItem(policy("a", 1)))
            .is_err()
    );
}

#[test]
fn a_failed_apply_leaves_the_cursor_behind() {
    let mut client = WatchClient::new(5);
    client
        .on_event(WatchEvent::Change {
            version: 6,
            change: delete("a"),
        })
        .unwrap();
    // The agent failed to apply 6: it does not call applied(6) and
    // reconnects with the cursor it has.
    assert_eq!(client.cursor(), 5);
}

#[test]
fn resync_resets_the_cursor() {
    let mut client = WatchClient::new(5);
    assert_eq!(
        client
            .on_event(WatchEvent::ResyncRequired { floor: 9 })
            .unwrap(),
        ClientAction::Resync { floor: 9 }
    );
    assert_eq!(client.cursor(), 0);
    assert!(
        client
            .on_event(WatchEvent::Progress { cursor: 10 })
            .is_err()
    );
}

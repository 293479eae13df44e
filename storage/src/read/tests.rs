//! Tests of the read view: lookups and lists, full-sync paging, the
//! change log's edges, the consistent cut, and the state hash.
use wire::model::{Deployment, Resource, ResourceType, Sentinel};

use super::*;
use crate::Mutation;
use crate::test_support::*;

#[test]
fn an_environments_sentinel_is_found_by_its_likely_id_or_by_a_scan() {
    let store = store();
    let other_env = |id: &str, region: &str| Sentinel {
        environment_id: "other".into(),
        ..sentinel(id, region)
    };
    apply_one(
        &store,
        1,
        mutations![
            Mutation::UpsertSentinel(other_env("s0", "eu")),
            Mutation::UpsertSentinel(sentinel("s1", "eu")),
            Mutation::UpsertSentinel(other_env("s2", "eu")),
            Mutation::UpsertSentinel(other_env("s3", "us")),
        ],
    );
    let view = store.read().unwrap();
    let found = |env: &str, region: &str, likely: &str| {
        view.environment_sentinel(env, region, likely)
            .unwrap()
            .map(|s| s.id)
    };
    // At its likely id, or elsewhere in its region.
    assert_eq!(found("env", "eu", "s1"), Some("s1".into()));
    assert_eq!(found("env", "eu", "nope"), Some("s1".into()));
    // A likely id holding another environment's sentinel is passed by.
    assert_eq!(found("env", "eu", "s2"), Some("s1".into()));
    assert_eq!(found("other", "eu", "s2"), Some("s2".into()));
    // Never another region's.
    assert_eq!(found("env", "us", "s1"), None);
    assert_eq!(found("other", "us", "s0"), Some("s3".into()));
    assert_eq!(found("env", "ap", "s1"), None);
}

#[test]
fn full_sync_pages_by_type_then_id_within_one_region() {
    let store = store();
    apply_one(
        &store,
        1,
        mutations![
            Mutation::UpsertCiliumNetworkPolicy(policy("p2", "eu")),
            Mutation::UpsertCiliumNetworkPolicy(policy("p1", "eu")),
            Mutation::UpsertSentinel(sentinel("s1", "eu")),
            create("d2", &["eu", "eu-west"], 1),
            create("d1", &["eu"], 1),
            // Neighbouring regions must not leak into "eu".
            Mutation::UpsertCiliumNetworkPolicy(policy("p0", "eu-west")),
            Mutation::UpsertSentinel(sentinel("s0", "e")),
        ],
    );
    let view = store.read().unwrap();
    let all: Vec<(ResourceType, String)> = view
        .region_resources("eu", None, usize::MAX)
        .unwrap()
        .iter()
        .map(|r| (r.key().resource_type, r.key().resource_id))
        .collect();
    let expected = [
        (ResourceType::DeploymentTopology, "d1"),
        (ResourceType::DeploymentTopology, "d2"),
        (ResourceType::Sentinel, "s1"),
        (ResourceType::CiliumNetworkPolicy, "p1"),
        (ResourceType::CiliumNetworkPolicy, "p2"),
    ];
    assert_eq!(
        all,
        expected.map(|(t, id)| (t, id.to_string())).to_vec(),
        "{all:?}"
    );
    for page_size in 1..=6 {
        let mut paged = Vec::new();
        let mut after = None;
        loop {
            let page = view
                .region_resources("eu", after.as_ref(), page_size)
                .unwrap();
            assert!(page.len() <= page_size);
            after = page.last().map(Resource::key);
            let done = page.len() < page_size;
            paged.extend(page);
            if done {
                break;
            }
        }
        assert_eq!(paged, view.region_resources("eu", None, 100).unwrap());
    }
    assert!(view.region_resources("eu", None, 0).unwrap().is_empty());
    assert!(
        view.region_resources("nowhere", None, 9)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn changes_after_edges() {
    let store = store();
    apply_one(&store, 1, create("d1", &["eu", "eu-west", "e"], 1));
    let view = store.read().unwrap();
    assert_eq!(view.changes_after("eu", 0, 10).unwrap().len(), 1);
    assert_eq!(view.changes_after("eu", 0, 0).unwrap(), vec![]);
    assert_eq!(view.changes_after("eu", Pk::MAX, 10).unwrap(), vec![]);
    assert_eq!(view.changes_after("eu-west", 1, 10).unwrap()[0].0, 2);
    assert_eq!(view.changes_after("eu-west", 2, 10).unwrap(), vec![]);
}

#[test]
fn lists_and_lookups() {
    let store = store();
    apply_one(
        &store,
        1,
        mutations![
            create("d1", &["eu"], 1),
            create("d10", &["eu"], 1),
            create("d2", &["eu"], 1),
            Mutation::ReportInstances(crate::mutations::ReportInstances {
                deployment_id: "d1".into(),
                region: "eu".into(),
                instances: running("d1", "eu", 2),
            }),
            Mutation::ReportInstances(crate::mutations::ReportInstances {
                deployment_id: "d10".into(),
                region: "eu".into(),
                instances: running("d10", "eu", 3),
            }),
        ],
    );
    let view = store.read().unwrap();
    let ids = |list: Vec<Deployment>| list.into_iter().map(|d| d.id).collect::<Vec<_>>();
    assert_eq!(
        ids(view.list_deployments(None, 10).unwrap()),
        ["d1", "d10", "d2"]
    );
    assert_eq!(ids(view.list_deployments(None, 2).unwrap()), ["d1", "d10"]);
    assert_eq!(ids(view.list_deployments(Some("d10"), 2).unwrap()), ["d2"]);
    assert_eq!(view.instances("d1").unwrap().len(), 2);
    assert_eq!(view.instances("d10").unwrap().len(), 3);
    assert!(view.instances("d").unwrap().is_empty());
    assert!(view.deployment("d3").unwrap().is_none());
    assert!(view.topology("d1", "us").unwrap().is_none());
    assert!(view.sentinel("s", "eu").unwrap().is_none());
    assert!(view.policy("p", "eu").unwrap().is_none());
}

#[test]
fn the_view_is_a_consistent_cut() {
    let store = store();
    apply_one(&store, 1, create("d1", &["eu"], 1));
    let view = store.read().unwrap();
    let hash = view.state_hash().unwrap();
    apply_one(&store, 2, create("d2", &["eu"], 1));
    assert_eq!(view.last_pk(), 1);
    assert_eq!(view.changes_after("eu", 0, 10).unwrap().len(), 1);
    assert!(view.deployment("d2").unwrap().is_none());
    assert_eq!(view.state_hash().unwrap(), hash);
    assert_ne!(store.read().unwrap().state_hash().unwrap(), hash);
}

#[test]
fn fnv1a_matches_the_reference_vectors() {
    let hash = |s: &[u8]| {
        let mut h = Fnv1a::new();
        h.write(s);
        h.finish()
    };
    assert_eq!(hash(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(hash(b"foobar"), 0x8594_4171_f739_67e8);
}

//! Tests of the dispatcher: batches, rejected mutations among accepted
//! ones, entries without a command, and random mutation sequences against a
//! model of the change log.
use wire::ErrorCode;
use wire::model::{DesiredState, Pk, Resource, ResourceKey, ResourceType};

use crate::command::{ApplyEntry, COMPACT_ROWS_MAX, Command, Mutation, MutationResult};
use crate::test_support::*;

fn code(result: &MutationResult) -> Option<ErrorCode> {
    result.as_ref().err().map(|e| e.code)
}

#[test]
fn a_rejected_mutation_leaves_nothing_and_the_others_land() {
    let store = store();
    let out = apply_one(
        &store,
        10,
        mutations![
            create("d1", &["eu", "us"], 1),
            set_state("nope", DesiredState::Stopped),
            create("d1", &["ap"], 1),
            create("d2", &["eu", "eu"], 1),
            Mutation::ReportInstances(crate::mutations::ReportInstances {
                deployment_id: "d1".into(),
                region: "eu".into(),
                instances: vec![instance("d1", "us", "p", true)],
            }),
            Mutation::ReportInstances(crate::mutations::ReportInstances {
                deployment_id: "d1".into(),
                region: "ap".into(),
                instances: vec![],
            }),
            Mutation::DeleteCiliumNetworkPolicy(crate::mutations::DeleteCiliumNetworkPolicy {
                id: "p".into(),
                region: "eu".into(),
            }),
            Mutation::ReportSentinelStatus(sentinel_status("s", "eu")),
            Mutation::Compact(crate::mutations::Compact {
                created_before_ms: 0,
                rows_max: COMPACT_ROWS_MAX + 1,
                requests_created_before_ms: 0,
                keep_rows_min: 0,
            }),
            Mutation::UpsertCiliumNetworkPolicy(policy("p", "eu")),
        ],
    );
    let codes: Vec<_> = out.iter().map(code).collect();
    assert_eq!(
        codes,
        vec![
            None,
            None,
            Some(ErrorCode::NotFound),
            Some(ErrorCode::BadRequest),
            // The start of a deployment that was not created: its guard
            // fails, a success that writes nothing.
            None,
            Some(ErrorCode::BadRequest),
            None,
            Some(ErrorCode::BadRequest),
            Some(ErrorCode::NotFound),
            Some(ErrorCode::NotFound),
            Some(ErrorCode::NotFound),
            Some(ErrorCode::BadRequest),
            None,
        ]
    );
    // Exactly the rows of the two accepted mutations, gap-free.
    assert_eq!(
        all_changes(&store),
        vec![(1, "eu".into()), (2, "us".into()), (3, "eu".into())]
    );
    let view = store.read().unwrap();
    assert!(view.deployment("d2").unwrap().is_none());
    assert!(view.topology("d1", "ap").unwrap().is_none());
    assert!(view.instances("d1").unwrap().is_empty());
    assert!(view.sentinel_status("s", "eu").unwrap().is_none());
    assert_eq!(view.policy("p", "eu").unwrap().unwrap().version, 3);

    // The same state as a store that only saw the accepted mutations.
    let clean = crate::test_support::store();
    apply_one(
        &clean,
        10,
        mutations![
            create("d1", &["eu", "us"], 1),
            Mutation::UpsertCiliumNetworkPolicy(policy("p", "eu")),
        ],
    );
    assert_eq!(
        view.state_hash().unwrap(),
        clean.read().unwrap().state_hash().unwrap()
    );
}

#[test]
fn entries_without_a_command_advance_the_raft_meta() {
    let store = store();
    let command = Command {
        now_ms: 1,
        mutations: create("d1", &["eu"], 1),
    };
    let result = store
        .apply(&[None, Some(&command), None], &raft_meta(3), false)
        .unwrap();
    assert_eq!(result.outcomes.len(), 3);
    assert!(result.outcomes[0].is_empty() && result.outcomes[2].is_empty());
    assert_eq!(result.last_pk, 1);
    // A non-durable commit is visible to readers at once.
    let view = store.read().unwrap();
    assert_eq!(view.raft_meta(), Some(raft_meta(3)));
    assert_eq!(view.last_pk(), 1);

    let empty = store.apply(&[], &raft_meta(4), true).unwrap();
    assert_eq!((empty.outcomes.len(), empty.last_pk), (0, 1));
    assert_eq!(store.read().unwrap().raft_meta(), Some(raft_meta(4)));
}

mod model {
    //! Random mutation sequences against a simple model of the change
    //! log and of which mutations succeed.

    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;

    const REGIONS: [&str; 4] = ["ap", "eu", "us", "zz"];

    #[derive(Debug, Clone)]
    enum Op {
        Create { dep: u8, regions: u8, replicas: u32 },
        SetState { dep: u8, running: bool },
        Report { dep: u8, region: u8, running: u8 },
        Deleted { dep: u8, region: u8 },
        UpsertPolicy { id: u8, region: u8 },
        DeletePolicy { id: u8, region: u8 },
        UpsertSentinel { id: u8, region: u8 },
        Compact { age_ms: u64, rows_max: u32 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..4u8, 0..8u8, 0..3u32).prop_map(|(dep, regions, replicas)| Op::Create {
                dep,
                regions,
                replicas
            }),
            (0..4u8, any::<bool>()).prop_map(|(dep, running)| Op::SetState { dep, running }),
            (0..4u8, 0..4u8, 0..3u8).prop_map(|(dep, region, running)| Op::Report {
                dep,
                region,
                running
            }),
            (0..4u8, 0..4u8).prop_map(|(dep, region)| Op::Deleted { dep, region }),
            (0..3u8, 0..4u8).prop_map(|(id, region)| Op::UpsertPolicy { id, region }),
            (0..3u8, 0..4u8).prop_map(|(id, region)| Op::DeletePolicy { id, region }),
            (0..2u8, 0..4u8).prop_map(|(id, region)| Op::UpsertSentinel { id, region }),
            (0..60u64, 0..6u32).prop_map(|(age_ms, rows_max)| Op::Compact { age_ms, rows_max }),
        ]
    }

    /// Regions of a deployment: a bit mask over the first three regions
    /// ("zz" never belongs to a deployment).
    fn regions(mask: u8) -> Vec<&'static str> {
        (0..3)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| REGIONS[i])
            .collect()
    }

    fn mutation(op: &Op) -> Vec<Mutation> {
        let dep = |d: &u8| format!("d{d}");
        vec![match op {
            Op::Create {
                dep: d,
                regions: mask,
                replicas,
            } => return create(&dep(d), &regions(*mask), *replicas),
            Op::SetState { dep: d, running } => set_state(
                &dep(d),
                if *running {
                    DesiredState::Running
                } else {
                    DesiredState::Stopped
                },
            ),
            Op::Report {
                dep: d,
                region,
                running: n,
            } => Mutation::ReportInstances(crate::mutations::ReportInstances {
                deployment_id: dep(d),
                region: REGIONS[*region as usize].into(),
                instances: running(&dep(d), REGIONS[*region as usize], *n as usize),
            }),
            Op::Deleted { dep: d, region } => {
                Mutation::ReportDeploymentDeleted(crate::mutations::ReportDeploymentDeleted {
                    deployment_id: dep(d),
                    region: REGIONS[*region as usize].into(),
                })
            }
            Op::UpsertPolicy { id, region } => Mutation::UpsertCiliumNetworkPolicy(policy(
                &format!("p{id}"),
                REGIONS[*region as usize],
            )),
            Op::DeletePolicy { id, region } => {
                Mutation::DeleteCiliumNetworkPolicy(crate::mutations::DeleteCiliumNetworkPolicy {
                    id: format!("p{id}"),
                    region: REGIONS[*region as usize].into(),
                })
            }
            Op::UpsertSentinel { id, region } => {
                Mutation::UpsertSentinel(sentinel(&format!("s{id}"), REGIONS[*region as usize]))
            }
            // Resolved against `now_ms` by the caller.
            Op::Compact { .. } => unreachable!(),
        }]
    }

    #[derive(Default)]
    struct Model {
        /// id → (regions, whether its topologies run)
        deployments: BTreeMap<String, (Vec<&'static str>, bool)>,
        policies: BTreeSet<(String, String)>,
        /// (pk, region, key, created_at) of every live change row.
        log: Vec<(Pk, String, ResourceKey, u64)>,
        /// Live resource → the pk that last changed it.
        versions: BTreeMap<ResourceKey, Pk>,
        last_pk: Pk,
        floor_pk: Pk,
    }

    impl Model {
        fn change(&mut self, resource_type: ResourceType, id: &str, region: &str, now: u64) {
            self.last_pk += 1;
            let key = ResourceKey {
                resource_type,
                resource_id: id.to_string(),
                region: region.to_string(),
            };
            self.log
                .push((self.last_pk, region.to_string(), key.clone(), now));
            self.versions.insert(key, self.last_pk);
        }

        /// Whether the mutation succeeds.
        fn apply(&mut self, op: &Op, now: u64) -> bool {
            let dep = |d: &u8| format!("d{d}");
            match op {
                Op::Create {
                    dep: d,
                    regions: mask,
                    ..
                } => {
                    let rs = regions(*mask);
                    if rs.is_empty() || self.deployments.contains_key(&dep(d)) {
                        return false;
                    }
                    for r in &rs {
                        self.change(ResourceType::DeploymentTopology, &dep(d), r, now);
                    }
                    self.deployments.insert(dep(d), (rs, true));
                    true
                }
                Op::SetState { dep: d, running } => {
                    let Some((rs, state)) = self.deployments.get(&dep(d)).cloned() else {
                        return false;
                    };
                    // Stopping stops the running topologies; running again
                    // only makes the deployment pending (the workflow's
                    // start, not modelled here, writes the topologies).
                    if state && !*running {
                        for r in &rs {
                            self.change(ResourceType::DeploymentTopology, &dep(d), r, now);
                        }
                        self.deployments.insert(dep(d), (rs, false));
                    }
                    true
                }
                Op::Report { dep: d, region, .. } | Op::Deleted { dep: d, region } => self
                    .deployments
                    .get(&dep(d))
                    .is_some_and(|(rs, _)| rs.contains(&REGIONS[*region as usize])),
                Op::UpsertPolicy { id, region } => {
                    let (id, region) = (format!("p{id}"), REGIONS[*region as usize]);
                    self.change(ResourceType::CiliumNetworkPolicy, &id, region, now);
                    self.policies.insert((region.to_string(), id));
                    true
                }
                Op::DeletePolicy { id, region } => {
                    let (id, region) = (format!("p{id}"), REGIONS[*region as usize]);
                    if !self.policies.remove(&(region.to_string(), id.clone())) {
                        return false;
                    }
                    self.change(ResourceType::CiliumNetworkPolicy, &id, region, now);
                    self.versions.remove(&ResourceKey {
                        resource_type: ResourceType::CiliumNetworkPolicy,
                        resource_id: id,
                        region: region.to_string(),
                    });
                    true
                }
                Op::UpsertSentinel { id, region } => {
                    self.change(
                        ResourceType::Sentinel,
                        &format!("s{id}"),
                        REGIONS[*region as usize],
                        now,
                    );
                    true
                }
                Op::Compact { age_ms, rows_max } => {
                    let cutoff = now.saturating_sub(*age_ms);
                    let n = self
                        .log
                        .iter()
                        .take(*rows_max as usize)
                        .take_while(|row| row.3 < cutoff)
                        .count();
                    if let Some(row) = self.log.drain(..n).next_back() {
                        self.floor_pk = row.0;
                    }
                    true
                }
            }
        }
    }

    /// Batches of Raft entries; an entry is a command (a list of ops)
    /// or `None`.
    fn batches() -> impl Strategy<Value = Vec<Vec<Option<Vec<Op>>>>> {
        let entry = prop::option::weighted(0.9, prop::collection::vec(op(), 1..5));
        prop::collection::vec(prop::collection::vec(entry, 1..4), 1..12)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn apply_matches_the_model(batches in batches(), limit in 1..5usize) {
            let store = store();
            // Counted now (nothing), then kept in step by every batch.
            prop_assert_eq!(store.counts().unwrap(), crate::Counts::default());
            let mut model = Model::default();
            let mut now: u64 = 0;
            let mut previous_last_pk = 0;
            for (b, batch) in batches.iter().enumerate() {
                let mut commands = Vec::new();
                let mut expected = Vec::new();
                for entry in batch {
                    let Some(ops) = entry else {
                        commands.push(None);
                        expected.push(Vec::new());
                        continue;
                    };
                    now += 10;
                    let mut mutations = Vec::new();
                    let mut oks = Vec::new();
                    for op in ops {
                        mutations.extend(match op {
                            Op::Compact { age_ms, rows_max } => vec![Mutation::Compact(crate::mutations::Compact {
                                created_before_ms: now.saturating_sub(*age_ms),
                                rows_max: *rows_max,
                                requests_created_before_ms: 0,
                                keep_rows_min: 0,
                            })],
                            other => mutation(other),
                        });
                        oks.push(model.apply(op, now));
                        if matches!(op, Op::Create { .. }) {
                            // The workflow's start: a guarded transition,
                            // a success even when its guard fails.
                            oks.push(true);
                        }
                    }
                    commands.push(Some(Command { now_ms: now, mutations }));
                    expected.push(oks);
                }
                let entries: Vec<ApplyEntry<'_>> = commands.iter().map(Option::as_ref).collect();
                let result = store.apply(&entries, &raft_meta(b as u64), b % 2 == 0).unwrap();
                let oks: Vec<Vec<bool>> = result
                    .outcomes
                    .iter()
                    .map(|entry| entry.iter().map(Result::is_ok).collect())
                    .collect();
                prop_assert_eq!(oks, expected);
                prop_assert_eq!(result.last_pk, model.last_pk);
                prop_assert!(result.last_pk >= previous_last_pk);
                let kept = store.counts().unwrap();
                let mut counted = store.recount().unwrap();
                // A status counted down to zero stays as a key.
                for (kept, counted) in [
                    (&kept.deployments, &mut counted.deployments),
                    (&kept.instances, &mut counted.instances),
                    (&kept.topologies, &mut counted.topologies),
                ] {
                    for (status, count) in kept {
                        if *count == 0 {
                            counted.entry(status).or_insert(0);
                        }
                    }
                }
                prop_assert_eq!(kept, counted);
                previous_last_pk = result.last_pk;
            }

            let view = store.read().unwrap();
            prop_assert_eq!(view.last_pk(), model.last_pk);
            prop_assert_eq!(view.floor_pk(), model.floor_pk);

            // Gap-free: the live log is exactly floor+1 ..= last.
            let pks: Vec<Pk> = all_changes(&store).into_iter().map(|(pk, _)| pk).collect();
            let expected: Vec<Pk> = (model.floor_pk + 1..=model.last_pk).collect();
            prop_assert_eq!(pks, expected);

            // changes_after: exactly the region's rows after N, in order.
            for region in REGIONS {
                for after in 0..=model.last_pk + 1 {
                    let want: Vec<(Pk, ResourceKey, u64)> = model
                        .log
                        .iter()
                        .filter(|row| row.1 == region && row.0 > after)
                        .map(|row| (row.0, row.2.clone(), row.3))
                        .collect();
                    let got: Vec<(Pk, ResourceKey, u64)> = view
                        .changes_after(region, after, usize::MAX)
                        .unwrap()
                        .into_iter()
                        .map(|(pk, row)| (pk, row.key(), row.created_at_ms))
                        .collect();
                    prop_assert_eq!(&got, &want);
                    let page = view.changes_after(region, after, limit).unwrap();
                    prop_assert_eq!(page.len(), want.len().min(limit));
                }
                // The full sync lists exactly the live resources, with
                // the version of their last change.
                let mut synced = BTreeMap::new();
                let mut after = None;
                loop {
                    let page = view.region_resources(region, after.as_ref(), limit).unwrap();
                    for r in &page {
                        prop_assert!(synced.insert(r.key(), r.version()).is_none());
                    }
                    if page.len() < limit {
                        break;
                    }
                    after = page.last().map(Resource::key);
                }
                let want: BTreeMap<ResourceKey, Pk> = model
                    .versions
                    .iter()
                    .filter(|(k, _)| k.region == region)
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                prop_assert_eq!(synced, want);
            }
        }
    }
}

/// Every write a workflow decision reads names its record in the touched
/// log, and only those: a heartbeat or a region touches nothing.
#[test]
fn apply_names_the_records_it_wrote_in_the_touched_log() {
    use crate::command::Touched;
    let store = store();
    let deployment = |id: &str| Touched::Deployment(id.to_string());
    let sentinel = |id: &str| Touched::Sentinel {
        region: "eu".into(),
        id: id.to_string(),
    };
    let environment = Touched::Environment("env".into());
    // A new store says "everything" first.
    assert!(store.take_touched().everything);

    apply_one(&store, 5, vec![submit("d1", &["eu"], 1)]);
    let taken = store.take_touched();
    assert!(!taken.everything);
    assert!(taken.keys.contains(&deployment("d1")), "{taken:?}");

    apply_one(&store, 6, vec![start("d1")]);
    assert!(store.take_touched().keys.contains(&deployment("d1")));

    apply_one(
        &store,
        7,
        vec![Mutation::ReportInstances(
            crate::mutations::ReportInstances {
                deployment_id: "d1".into(),
                region: "eu".into(),
                instances: running("d1", "eu", 1),
            },
        )],
    );
    assert_eq!(store.take_touched().keys, [deployment("d1")].into());

    apply_one(
        &store,
        8,
        vec![Mutation::UpsertSentinel(sentinel_row("s1"))],
    );
    apply_one(
        &store,
        9,
        vec![Mutation::ReportSentinelStatus(sentinel_status("s1", "eu"))],
    );
    assert_eq!(store.take_touched().keys, [sentinel("s1")].into());

    apply_one(
        &store,
        10,
        vec![Mutation::UpsertCiliumNetworkPolicy(policy("p1", "eu"))],
    );
    assert_eq!(store.take_touched().keys, [environment].into());

    apply_one(&store, 11, vec![add_region("ap-south")]);
    assert_eq!(store.take_touched(), crate::TouchedSet::default());

    // A snapshot import may change anything.
    let (snapshot, _) = store.export_snapshot().unwrap();
    store.import_snapshot(&snapshot).unwrap();
    assert!(store.take_touched().everything);
}

fn sentinel_row(id: &str) -> wire::model::Sentinel {
    sentinel(id, "eu")
}

//! Golden bytes of everything the state machine writes, under
//! [`SCHEMA_VERSION`]: the value of every state table, the keys (redb's
//! encoding decides the order of rows, which full sync and the change log
//! rely on), the table names and metadata as a file holds them, the
//! replicated command and its outcomes (the payload of every Raft log
//! entry), a whole snapshot and the state hash. A snapshot and a hash are
//! also what apply makes of fixed commands: a change there is one replicas
//! of two builds would disagree on, so it, too, needs a version bump.
//!
//! A failure names the type and says what to do; `GOLDEN_UPDATE=1` records
//! new goldens but never rewrites the bytes of a golden of the current
//! version (see `wire::golden`).

use redb::{ReadableDatabase, ReadableTable, Value};
use std::collections::BTreeMap;
use storage::mutations;
use storage::tables::{self, DueKey, InstanceKey, RegionChangeKey, RegionKey, RequestAgeKey, name};

use storage::command::{
    DeliveryAction, DeliveryTransition, DeployAction, DeployTransition, RolloutStep,
    RolloutTransition, SentinelAction, SentinelTransition,
};
use storage::{
    ChangeRow, ClusterIdentity, Command, Fingerprint, Guard, Mutation, MutationResult, Outcome,
    RaftMeta, RequestRecord, SCHEMA_VERSION, Store,
};
use wire::golden::Goldens;
use wire::golden::fixtures::{self, NOW_MS};
use wire::model::{Deployment, DeploymentStatus, DesiredState, ResourceType, SentinelDeployStatus};
use wire::operator::RolloutCommand;
use wire::rollout::RolloutState;

fn goldens() -> Goldens {
    Goldens::new(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden"),
        "SCHEMA_VERSION",
        SCHEMA_VERSION,
    )
}

fn change_row() -> ChangeRow {
    ChangeRow {
        resource_type: ResourceType::CiliumNetworkPolicy,
        resource_id: "cnp_01hx".into(),
        region: "eu-west".into(),
        created_at_ms: NOW_MS,
    }
}

/// The fixture deployment as it is created: pending.
fn pending_deployment() -> Deployment {
    let mut deployment = fixtures::deployment();
    deployment.status = DeploymentStatus::Pending;
    deployment
}

/// The workflow's start of the fixture deployment, decided at `revision`.
fn start(revision: u64) -> Mutation {
    Mutation::Deploy(DeployTransition {
        deployment_id: "dep_01hx3k9".into(),
        expected: Guard {
            step: "pending".into(),
            revision,
        },
        action: DeployAction::Start {
            k8s_namespace: "shop".into(),
            sentinels: vec![fixtures::sentinel()],
            policies: vec![fixtures::policy()],
        },
    })
}

/// Every variant of [`DeployAction`], each in a transition.
fn deploy_transitions() -> Vec<Mutation> {
    let transition = |action| {
        Mutation::Deploy(DeployTransition {
            deployment_id: "dep_01hx3k9".into(),
            expected: guard(),
            action,
        })
    };
    vec![
        start(7),
        transition(DeployAction::Observe {
            observed_running: 5,
            deadline_at_ms: NOW_MS + 900_000,
            failing_since_ms: BTreeMap::from([("us-east".to_string(), NOW_MS + 15)]),
        }),
        transition(DeployAction::Advance {
            to: DeploymentStatus::Network,
            reason: "every region runs its replicas".into(),
        }),
        transition(DeployAction::Finalize {
            standby_replaced_at_ms: NOW_MS + 600_000,
        }),
        transition(DeployAction::Fail {
            reason: "progress deadline passed; eu-west: 0/3 running".into(),
        }),
        transition(DeployAction::Supersede {
            by: "dep_01hx3kb".into(),
        }),
        transition(DeployAction::ApplySchedule),
        transition(DeployAction::MarkStopped),
    ]
}

fn mutations() -> Vec<Mutation> {
    let mut all = vec![
        Mutation::CreateDeployment(mutations::CreateDeployment {
            deployment: pending_deployment(),
        }),
        Mutation::SetDesiredState(mutations::SetDesiredState {
            deployment_id: "dep_01hx3k9".into(),
            desired_state: DesiredState::Standby,
            at_ms: Some(NOW_MS + 1_800_000),
            force: true,
        }),
        Mutation::ReportInstances(mutations::ReportInstances {
            deployment_id: "dep_01hx3k9".into(),
            region: "eu-west".into(),
            instances: vec![fixtures::instance()],
        }),
        Mutation::ReportDeploymentDeleted(mutations::ReportDeploymentDeleted {
            deployment_id: "dep_01hx3k9".into(),
            region: "us-east".into(),
        }),
        Mutation::UpsertSentinel(fixtures::sentinel()),
        Mutation::ReportSentinelStatus(fixtures::sentinel_status()),
        Mutation::UpsertCiliumNetworkPolicy(fixtures::policy()),
        Mutation::DeleteCiliumNetworkPolicy(mutations::DeleteCiliumNetworkPolicy {
            id: "cnp_01hx".into(),
            region: "eu-west".into(),
        }),
        Mutation::ReportApply(fixtures::apply_report()),
        Mutation::Compact(mutations::Compact {
            created_before_ms: NOW_MS,
            rows_max: 10_000,
            requests_created_before_ms: NOW_MS - 86_400_000,
            keep_rows_min: 10_000,
        }),
        Mutation::AddRegion(mutations::AddRegion {
            name: "eu-west".into(),
        }),
        Mutation::SetRegionSchedulable(mutations::SetRegionSchedulable {
            name: "us-east".into(),
            schedulable: false,
        }),
        Mutation::RecordHeartbeat(mutations::RecordHeartbeat {
            region: "eu-west".into(),
            heartbeat: fixtures::heartbeat(),
        }),
        request(),
    ];
    all.extend(deploy_transitions());
    all.extend([
        Mutation::CancelDeployment(mutations::CancelDeployment {
            deployment_id: "dep_01hx3kb".into(),
        }),
        Mutation::Rollback(mutations::Rollback {
            environment_id: "env_prod".into(),
            to: Some("dep_01hx3k8".into()),
        }),
        Mutation::AddNotifyEndpoint(fixtures::notify_endpoint()),
        Mutation::RemoveNotifyEndpoint(mutations::RemoveNotifyEndpoint {
            name: "ops-alerts".into(),
        }),
        Mutation::DeploySentinel(mutations::DeploySentinel {
            sentinel: fixtures::sentinel(),
            deadline_ms: 600_000,
        }),
        Mutation::Sentinel(SentinelTransition {
            sentinel_id: "snt_01hx".into(),
            region: "eu-west".into(),
            expected: guard(),
            action: SentinelAction::Ready,
        }),
        Mutation::Sentinel(SentinelTransition {
            sentinel_id: "snt_01hx".into(),
            region: "eu-west".into(),
            expected: guard(),
            action: SentinelAction::Fail {
                reason: "not converged within 10m".into(),
            },
        }),
        Mutation::StartRollout(fixtures::rollout_options()),
        Mutation::ControlRollout(RolloutCommand::Resume),
        Mutation::ControlRollout(RolloutCommand::Cancel),
        Mutation::ControlRollout(RolloutCommand::RollbackAll),
        Mutation::Rollout(RolloutTransition {
            seq: 7,
            expected: guard(),
            steps: rollout_steps(),
        }),
        Mutation::UpdateDeployment(mutations::UpdateDeployment {
            deployment_id: "dep_01hx3k9".into(),
            update: fixtures::deployment_update(),
        }),
    ]);
    all.extend(delivery_transitions());
    all.push(Mutation::ReplayDelivery(mutations::ReplayDelivery {
        delivery_id: 70_001,
    }));
    all.push(Mutation::SetClusterIdentity(identity()));
    all
}

/// A fixture cluster identity.
fn identity() -> ClusterIdentity {
    ClusterIdentity {
        cluster_id: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        epoch: 0x5eed_0000_0000_0001,
    }
}

/// Every variant of [`DeliveryAction`], each in a transition.
fn delivery_transitions() -> Vec<Mutation> {
    let transition = |action| {
        Mutation::Deliver(DeliveryTransition {
            delivery_id: 70_000,
            expected: Guard {
                step: "pending".into(),
                revision: 4,
            },
            action,
        })
    };
    vec![
        transition(DeliveryAction::Delivered),
        transition(DeliveryAction::Failed {
            error: "HTTP 502 Bad Gateway".into(),
            next_attempt_at_ms: NOW_MS + 8_000,
        }),
        transition(DeliveryAction::GaveUp {
            error: "connection refused".into(),
        }),
    ]
}

/// A second deployment of the fixture's environment, created, started
/// and failed: its failure creates a notification.
fn failed_deployment() -> Vec<Mutation> {
    let mut deployment = pending_deployment();
    deployment.id = "dep_01hx3kc".into();
    let revision = deployment.workflow.revision;
    vec![
        Mutation::CreateDeployment(mutations::CreateDeployment { deployment }),
        Mutation::Deploy(DeployTransition {
            deployment_id: "dep_01hx3kc".into(),
            expected: Guard {
                step: "pending".into(),
                revision,
            },
            action: DeployAction::Start {
                k8s_namespace: "shop".into(),
                sentinels: vec![fixtures::sentinel()],
                policies: Vec::new(),
            },
        }),
        Mutation::Deploy(DeployTransition {
            deployment_id: "dep_01hx3kc".into(),
            expected: Guard {
                step: "deploying".into(),
                revision: revision + 1,
            },
            action: DeployAction::Fail {
                reason: "progress deadline passed".into(),
            },
        }),
    ]
}

/// Every variant of [`RolloutStep`].
fn rollout_steps() -> Vec<RolloutStep> {
    vec![
        RolloutStep::Settle {
            member: 3,
            failed: Some("fell out of convergence during the bake".into()),
        },
        RolloutStep::StartWave,
        RolloutStep::Deploy {
            members: vec![4, 5],
        },
        RolloutStep::Bake {
            until_ms: NOW_MS + 300_000,
        },
        RolloutStep::CompleteWave,
        RolloutStep::Pause {
            reason: "wave 2: 1 failed, at most 0 allowed".into(),
        },
        RolloutStep::Complete,
        RolloutStep::Revert {
            members: vec![2, 1],
        },
        RolloutStep::NextRollbackWave { wave: 1 },
        RolloutStep::FinishRollback,
    ]
}

fn fingerprint() -> Fingerprint {
    std::array::from_fn(|i| u8::try_from(i * 7 + 1).expect("below 256"))
}

/// An operator request with an id, wrapping a stop.
fn request() -> Mutation {
    Mutation::Request(mutations::Request {
        request_id: fixtures::request_id().as_str().to_string(),
        fingerprint: fingerprint(),
        actor: "operator".into(),
        mutation: Box::new(Mutation::SetDesiredState(mutations::SetDesiredState {
            deployment_id: "dep_01hx3k9".into(),
            desired_state: DesiredState::Standby,
            at_ms: Some(NOW_MS + 1_800_000),
            force: true,
        })),
    })
}

fn request_record() -> RequestRecord {
    RequestRecord {
        fingerprint: fingerprint(),
        result: Ok(Outcome::DeploymentCreated {
            deployment_id: "dep_01hx3k9".into(),
        }),
        created_at_ms: NOW_MS,
        actor: "operator".into(),
    }
}

fn guard() -> Guard {
    Guard {
        step: "deploying".into(),
        revision: 300,
    }
}

fn outcomes() -> Vec<Outcome> {
    vec![
        Outcome::DeploymentCreated {
            deployment_id: "dep_01hx3k9".into(),
        },
        Outcome::Deployment(fixtures::deployment()),
        Outcome::Recorded,
        Outcome::Compacted {
            rows_deleted: 10_000,
            floor_pk: 70_000,
            requests_deleted: 300,
        },
        Outcome::GuardFailed {
            expected: guard(),
            found: Some(Guard {
                step: "ready".into(),
                revision: 301,
            }),
        },
        Outcome::Region(fixtures::region()),
        Outcome::EndpointRemoved {
            deliveries_dead: 17,
        },
        Outcome::SentinelDeployed {
            sentinel_id: "snt_01hx".into(),
            version: 310,
            status: SentinelDeployStatus::Ready,
        },
        Outcome::Rollout {
            seq: 7,
            state: RolloutState::RollingBack,
        },
        Outcome::Revoked(fixtures::revocation()),
    ]
}

fn raft_meta(index: u8) -> RaftMeta {
    RaftMeta {
        last_applied: vec![index, 0xaa],
        membership: vec![0xbb, index],
    }
}

/// A store with a row in every table but the revocations (pinned by
/// value above; the migration tests compare snapshots of older schemas,
/// which have none, with this one's) and a raised compaction floor, made
/// by fixed commands.
fn populated(store: &Store) {
    let commands = [
        vec![
            Mutation::AddRegion(mutations::AddRegion {
                name: "us-east".into(),
            }),
            Mutation::RecordHeartbeat(mutations::RecordHeartbeat {
                region: "eu-west".into(),
                heartbeat: fixtures::heartbeat(),
            }),
            Mutation::CreateDeployment(mutations::CreateDeployment {
                deployment: pending_deployment(),
            }),
            start(fixtures::deploy_workflow().revision),
            Mutation::ReportSentinelStatus(fixtures::sentinel_status()),
            Mutation::AddNotifyEndpoint(fixtures::notify_endpoint()),
            Mutation::SetClusterIdentity(identity()),
        ],
        failed_deployment(),
        vec![
            Mutation::ReportInstances(mutations::ReportInstances {
                deployment_id: "dep_01hx3k9".into(),
                region: "eu-west".into(),
                instances: vec![fixtures::instance()],
            }),
            Mutation::UpsertCiliumNetworkPolicy(fixtures::policy()),
            Mutation::ReportApply(wire::model::ApplyReport {
                version: 1,
                ..fixtures::apply_report()
            }),
            // To every endpoint: the populated store has none named in the fixture.
            Mutation::StartRollout(wire::rollout::RolloutOptions {
                notify: None,
                ..fixtures::rollout_options()
            }),
        ],
        vec![
            request(),
            Mutation::Compact(mutations::Compact {
                created_before_ms: NOW_MS + 1,
                rows_max: 2,
                requests_created_before_ms: 0,
                keep_rows_min: 0,
            }),
        ],
    ];
    for (i, mutations) in commands.into_iter().enumerate() {
        let command = Command {
            now_ms: NOW_MS + i as u64,
            mutations,
        };
        let result = store
            .apply(
                &[Some(&command)],
                &raft_meta(u8::try_from(i + 1).expect("few commands")),
                true,
            )
            .expect("apply");
        let accepted: Vec<&MutationResult> = result.outcomes[0].iter().collect();
        assert!(accepted.iter().all(|r| r.is_ok()), "{accepted:?}");
    }
    let view = store.read().expect("read");
    assert_eq!((view.floor_pk(), view.last_pk()), (2, 9));
    assert_eq!(view.request_count().expect("count"), 1);
    let deliveries = view.pending_deliveries(10).expect("deliveries");
    assert_eq!(
        deliveries.len(),
        2,
        "the notifications of the failure and of the rollout start"
    );
}

fn key<K: Value>(label: &str, value: &K::SelfType<'_>) -> (String, Vec<u8>) {
    (label.to_string(), K::as_bytes(value).as_ref().to_vec())
}

#[test]
fn state_formats_match_their_goldens() {
    let mut g = goldens();

    // The values of the state tables.
    g.check("tables.deployments", &[fixtures::deployment()]);
    g.check("tables.deployment_topology", &[fixtures::topology()]);
    g.check("tables.sentinels", &[fixtures::sentinel()]);
    g.check("tables.sentinel_status", &[fixtures::sentinel_status()]);
    g.check("tables.cilium_network_policies", &[fixtures::policy()]);
    g.check("tables.instances", &[fixtures::instance()]);
    g.check("tables.changes", &[change_row()]);
    g.check("tables.environments", &[fixtures::environment()]);
    g.check("tables.journal", &[fixtures::journal_entry()]);
    g.check("tables.regions", &[fixtures::region()]);
    g.check("tables.requests", &[request_record()]);
    g.check(
        "tables.policy_applied",
        &[fixtures::apply_report(), fixtures::apply_rejected()],
    );
    g.check("tables.notify_endpoints", &[fixtures::notify_endpoint()]);
    g.check("tables.deliveries", &[fixtures::delivery()]);
    g.check("tables.rollouts", &[fixtures::rollout()]);
    g.check("tables.routes", &[fixtures::route()]);
    g.check("tables.revocations", &[fixtures::revocation()]);

    // Their keys, as redb encodes them.
    g.check_bytes(
        "tables.keys",
        "the keys of the state tables (redb's encoding)",
        vec![
            key::<&str>("deployment_id", &"dep_01hx3k9"),
            key::<RegionKey>("region_key", &("eu-west", "snt_01hx")),
            key::<InstanceKey>("instance_key", &("dep_01hx3k9", "eu-west", "dep-01hx3k9-0")),
            key::<u64>("change_pk", &70_000),
            key::<RegionChangeKey>("region_change_key", &("eu-west", 70_000)),
            key::<&str>("environment_id", &"env_prod"),
            key::<u64>("journal_seq", &4_000),
            key::<&str>("request_id", &fixtures::request_id().as_str()),
            key::<RequestAgeKey>(
                "request_age_key",
                &(NOW_MS, fixtures::request_id().as_str()),
            ),
            key::<&str>("endpoint_name", &"chat"),
            key::<u64>("delivery_id", &70_000),
            key::<DueKey>("due_key", &(NOW_MS + 8_000, 70_000)),
            key::<&str>("revocation_key", &"operator:alice"),
        ],
    );
    g.check_bytes(
        "tables.names",
        "the names of the state tables",
        [
            name::DEPLOYMENTS,
            name::DEPLOYMENT_TOPOLOGY,
            name::SENTINELS,
            name::SENTINEL_STATUS,
            name::CILIUM_NETWORK_POLICIES,
            name::INSTANCES,
            name::CHANGES,
            name::REGION_CHANGES,
            name::METADATA,
            name::ENVIRONMENTS,
            name::JOURNAL,
            name::OPEN_DEPLOYMENTS,
            name::REGIONS,
            name::REQUESTS,
            name::REQUESTS_BY_AGE,
            name::POLICY_APPLIED,
            name::NOTIFY_ENDPOINTS,
            name::DELIVERIES,
            name::PENDING_DELIVERIES,
            name::ROLLOUTS,
            name::ROUTES,
            name::ENVIRONMENT_SENTINELS,
            name::OPEN_DEPLOYMENTS_BY_ENVIRONMENT,
            name::POLICIES_BY_NAME,
            name::REVOCATIONS,
        ]
        .iter()
        .map(|n| (n.to_string(), n.as_bytes().to_vec()))
        .collect(),
    );

    // The replicated command: what every Raft log entry carries.
    g.check(
        "command.Command",
        &[Command {
            now_ms: NOW_MS,
            mutations: mutations(),
        }],
    );
    // Cases added under the current version go after the command's own.
    let mut every = mutations();
    every.push(Mutation::ReportApply(fixtures::apply_rejected()));
    every.push(Mutation::PatchSentinel(mutations::PatchSentinel {
        patch: wire::rules::sentinel::SentinelPatch {
            workspace_id: "ws_acme".into(),
            project_id: "proj_shop".into(),
            app_id: "app_web".into(),
            environment_id: "env_prod".into(),
            region: "eu-west".into(),
            image: Some("registry.local/sentinel:3".into()),
            replicas: Some(3),
            cpu_millicores: Some(250),
            memory_mib: Some(128),
        },
        deadline_ms: 600_000,
    }));
    every.push(Mutation::Revoke(mutations::Revoke {
        target: wire::revocation::RevokedTarget::Serial("4f1c2a9e07b3".into()),
        reason: "laptop lost".into(),
    }));
    g.check("command.Mutation", &every);
    g.check("command.Outcome", &outcomes());
    g.check("command.Guard", &[guard()]);
    g.check("command.RolloutStep", &rollout_steps());
    g.check(
        "command.MutationResult",
        &[Ok(Outcome::Recorded), Err(fixtures::wire_error())],
    );
    g.check("command.RaftMeta", &[raft_meta(7)]);
    g.check("command.ClusterIdentity", &[identity()]);

    // A file as apply leaves it: every metadata row.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.redb");
    populated(&Store::open(&path).expect("open"));
    let db = redb::Database::open(&path).expect("reopen with redb");
    let txn = db.begin_read().expect("read");
    let metadata = txn.open_table(tables::METADATA).expect("metadata");
    let rows = metadata
        .iter()
        .expect("iterate")
        .map(|row| {
            let (k, v) = row.expect("row");
            (k.value().to_string(), v.value().to_vec())
        })
        .collect();
    g.check_bytes(
        "tables.metadata",
        "the metadata table of a state file",
        rows,
    );

    // A snapshot of the same state, and its state hash.
    let store = Store::in_memory().expect("store");
    populated(&store);
    let (snapshot, _) = store.export_snapshot().expect("export");
    let hash = store.read().expect("read").state_hash().expect("hash");
    g.check_bytes(
        "snapshot",
        "a snapshot (Store::export_snapshot) of a populated store",
        vec![("snapshot".into(), snapshot.clone())],
    );
    g.check_bytes(
        "read.state_hash",
        "the state hash (ReadView::state_hash) of a populated store",
        vec![("state_hash".into(), hash.to_le_bytes().to_vec())],
    );
    // The snapshot reads back into the same state.
    let copy = Store::in_memory().expect("store");
    copy.import_snapshot(&snapshot).expect("import");
    assert_eq!(copy.export_snapshot().expect("export").0, snapshot);

    g.assert_all();
}

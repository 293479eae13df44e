//! Fixture values for the golden tests: one value of each `wire` type with
//! every field set, and for each enum a case of every variant. The goldens
//! of `wire`, `storage` and node's Raft log are built from these, so a
//! fixture is part of the golden bytes: change one only together with a
//! version bump, and add new cases rather than altering old ones.
//!
//! Values are chosen so that every varint width shows up somewhere (small
//! and large integers, multi-byte characters) and no two fields of a value
//! are equal, so a swap of two fields changes the bytes.

use std::collections::BTreeMap;

use crate::agent::{
    AgentRequest, AgentResponse, DeploymentReport, HeartbeatReport, ResourceChange, WatchEvent,
    WatchRequest,
};
use crate::error::{ErrorCode, WireError};
use crate::hello::{Hello, LegacyHello, Protocol, VersionRange};
use crate::model::{
    Actor, ApplyOutcome, ApplyReport, CiliumNetworkPolicy, DeployWorkflow, Deployment,
    DeploymentStatus, DeploymentTopology, DesiredState, Environment, FailedApply, Health,
    Heartbeat, Instance, InstanceStatus, JournalEntry, Region, RegionSource, Resource, ResourceKey,
    ResourceType, Route, RouteWeight, ScheduledChange, Sentinel, SentinelDeploy,
    SentinelDeployStatus, SentinelStatus, StepRecord,
};
use crate::notify::{
    AddEndpoint, Delivery, DeliveryState, EndpointView, NotifyEndpoint, NotifyEvent,
};
use crate::operator::{
    ApplyPolicy, ApplySentinel, BackupChunk, CreateDeployment, DeliveryPage, DeploymentUpdate,
    DeploymentView, LogStatus, Membership, NodeDiagnostics, NodeStatus, OperatorCall,
    OperatorRequest, OperatorResponse, PolicyView, RegionList, RegionView, RequestId,
    RolloutCommand, RolloutPlan, SentinelView, StartRollout, StateHash,
};
use crate::rollout::{
    MemberState, Rollout, RolloutEvent, RolloutEventKind, RolloutMember, RolloutOptions,
    RolloutState, RolloutSummary, WaveCounts,
};
use crate::workload::{HealthCheck, Probe, SealedSecret, SecretValue, WorkloadSpec};

/// A leader timestamp (2024-05-01, milliseconds): a 6-byte varint.
pub const NOW_MS: u64 = 1_714_521_600_000;

fn env_vars() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("LOG_LEVEL".to_string(), "debug".to_string()),
        ("GREETING".to_string(), "grüße".to_string()),
    ])
}

/// Every variant of [`ResourceType`], each with every field set.
pub fn resource_types() -> Vec<ResourceType> {
    ResourceType::ALL.to_vec()
}

/// A fixture [`ResourceKey`], every field set.
pub fn resource_key() -> ResourceKey {
    ResourceKey {
        resource_type: ResourceType::Sentinel,
        resource_id: "snt_01hx".into(),
        region: "eu-west".into(),
    }
}

/// Every variant of [`DesiredState`], each with every field set.
pub fn desired_states() -> Vec<DesiredState> {
    vec![
        DesiredState::Running,
        DesiredState::Stopped,
        DesiredState::Standby,
        DesiredState::Archived,
    ]
}

/// Every variant of [`DeploymentStatus`], each with every field set.
pub fn deployment_statuses() -> Vec<DeploymentStatus> {
    DeploymentStatus::ALL.to_vec()
}

/// A fixture [`StepRecord`], every field set.
pub fn step_record() -> StepRecord {
    StepRecord {
        step: DeploymentStatus::Network,
        started_at_ms: NOW_MS + 10,
        ended_at_ms: Some(NOW_MS + 20),
        error: Some("sentinel unhealthy in eu-west".into()),
    }
}

/// A fixture [`ScheduledChange`], every field set.
pub fn scheduled_change() -> ScheduledChange {
    ScheduledChange {
        desired_state: DesiredState::Standby,
        at_ms: NOW_MS + 600_000,
    }
}

/// A fixture [`DeployWorkflow`], every field set.
pub fn deploy_workflow() -> DeployWorkflow {
    DeployWorkflow {
        revision: 7,
        steps: vec![
            StepRecord {
                step: DeploymentStatus::Pending,
                started_at_ms: NOW_MS,
                ended_at_ms: Some(NOW_MS + 10),
                error: Some("region us-east is cordoned".into()),
            },
            step_record(),
        ],
        progress_deadline_ms: 900_000,
        deadline_at_ms: NOW_MS + 900_010,
        fail_fast_ms: 60_000,
        min_ready_regions: 2,
        observed_running: 5,
        failing_since_ms: BTreeMap::from([("us-east".to_string(), NOW_MS + 15)]),
        make_live: true,
        reason: Some("progress deadline passed".into()),
        scheduled: Some(scheduled_change()),
    }
}

/// A fixture [`Environment`], every field set.
pub fn environment() -> Environment {
    Environment {
        id: "env_prod".into(),
        workspace_id: "ws_acme".into(),
        project_id: "proj_shop".into(),
        live_deployment_id: Some("dep_01hx3k9".into()),
        formerly_live: vec!["dep_01hx3k7".into(), "dep_01hx3k8".into()],
        latest_attempt: Some("dep_01hx3kb".into()),
        created_at_ms: NOW_MS,
        updated_at_ms: NOW_MS + 3,
    }
}

/// Every variant of [`Actor`], each with every field set.
pub fn actors() -> Vec<Actor> {
    vec![Actor::Workflow, Actor::Operator("operator:alice".into())]
}

/// A fixture [`JournalEntry`], every field set.
pub fn journal_entry() -> JournalEntry {
    JournalEntry {
        seq: 4_000,
        at_ms: NOW_MS + 30,
        deployment_id: "dep_01hx3k9".into(),
        environment_id: "env_prod".into(),
        from: Some(DeploymentStatus::Network),
        to: DeploymentStatus::Failed,
        reason: "progress deadline passed; eu-west: 0/3 running".into(),
        request_id: Some("req_7f3a".into()),
        actor: Actor::Operator("operator:alice".into()),
    }
}

/// Every variant of [`Health`], each with every field set.
pub fn healths() -> Vec<Health> {
    vec![
        Health::Unknown,
        Health::Healthy,
        Health::Unhealthy,
        Health::Paused,
    ]
}

/// Every variant of [`InstanceStatus`], each with every field set.
pub fn instance_statuses() -> Vec<InstanceStatus> {
    vec![
        InstanceStatus::Pending,
        InstanceStatus::Running,
        InstanceStatus::Failed,
    ]
}

/// A fixture [`Deployment`], every field set.
pub fn deployment() -> Deployment {
    Deployment {
        id: "dep_01hx3k9".into(),
        workspace_id: "ws_acme".into(),
        project_id: "proj_shop".into(),
        environment_id: "env_prod".into(),
        image: "registry.local/shop:1.4.2".into(),
        cpu_millicores: 1_500,
        memory_mib: 70_000,
        replicas: 3,
        regions: vec!["eu-west".into(), "us-east".into()],
        env_vars: env_vars(),
        desired_state: DesiredState::Running,
        status: DeploymentStatus::Deploying,
        created_at_ms: NOW_MS,
        updated_at_ms: NOW_MS + 1,
        workflow: deploy_workflow(),
        spec: Box::new(workload_spec()),
    }
}

/// A fixture [`SealedSecret`], every field set.
pub fn sealed_secret() -> SealedSecret {
    SealedSecret {
        key_id: "k-2024-05".into(),
        nonce: (1..=12).collect(),
        ciphertext: vec![0xde, 0xad, 0xbe, 0xef, 0x00, 0x7f, 0x80, 0xff],
    }
}

/// Every variant of [`SecretValue`], each with every field set.
pub fn secret_values() -> Vec<SecretValue> {
    vec![
        SecretValue::Plain("s3cr3t-grüße".into()),
        SecretValue::Sealed(sealed_secret()),
    ]
}

/// Every variant of [`Probe`], each with every field set.
pub fn probes() -> Vec<Probe> {
    vec![
        Probe::Http {
            path: "/healthz".into(),
            port: Some(9_090),
        },
        Probe::Exec {
            command: vec!["pg_isready".into(), "-h".into(), "localhost".into()],
        },
    ]
}

/// A fixture [`HealthCheck`], every field set.
pub fn health_check() -> HealthCheck {
    HealthCheck {
        probe: probes().remove(0),
        period_s: 15,
        timeout_s: 3,
        failure_threshold: 200,
    }
}

/// A fixture [`WorkloadSpec`] as stored, every field set (its secret
/// sealed).
pub fn workload_spec() -> WorkloadSpec {
    WorkloadSpec {
        port: Some(8_080),
        command: vec!["/app/server".into()],
        args: vec!["--listen".into(), ":8080".into()],
        health: Some(health_check()),
        shutdown_signal: Some("SIGQUIT".into()),
        termination_grace_s: Some(45),
        pod_labels: BTreeMap::from([("team".to_string(), "payments".to_string())]),
        pod_annotations: BTreeMap::from([("prometheus.io/scrape".to_string(), "true".to_string())]),
        secret_env: BTreeMap::from([(
            "DATABASE_URL".to_string(),
            SecretValue::Sealed(sealed_secret()),
        )]),
    }
}

/// [`workload_spec`] as an operator sends it: its secret in the clear.
pub fn workload_spec_plain() -> WorkloadSpec {
    let mut spec = workload_spec();
    spec.secret_env.insert(
        "DATABASE_URL".to_string(),
        SecretValue::Plain("postgres://shop@db/shop".into()),
    );
    spec
}

/// A fixture [`DeploymentTopology`], every field set.
pub fn topology() -> DeploymentTopology {
    DeploymentTopology {
        deployment_id: "dep_01hx3k9".into(),
        workspace_id: "ws_acme".into(),
        project_id: "proj_shop".into(),
        environment_id: "env_prod".into(),
        region: "eu-west".into(),
        k8s_name: "dep-01hx3k9".into(),
        k8s_namespace: "shop".into(),
        image: "registry.local/shop:1.4.2".into(),
        cpu_millicores: 1_500,
        memory_mib: 70_000,
        replicas: 3,
        env_vars: env_vars(),
        desired_state: DesiredState::Stopped,
        version: 300,
        created_at_ms: NOW_MS,
        updated_at_ms: NOW_MS + 2,
        spec: Box::new(workload_spec()),
    }
}

/// A fixture [`Sentinel`], every field set.
pub fn sentinel() -> Sentinel {
    Sentinel {
        id: "snt_01hx".into(),
        workspace_id: "ws_acme".into(),
        project_id: "proj_shop".into(),
        app_id: "app_web".into(),
        environment_id: "env_prod".into(),
        region: "eu-west".into(),
        k8s_name: "snt-01hx".into(),
        k8s_namespace: "sentinel".into(),
        image: "registry.local/sentinel:2".into(),
        cpu_millicores: 250,
        memory_mib: 128,
        replicas: 2,
        desired_state: DesiredState::Running,
        version: 301,
        created_at_ms: NOW_MS,
        updated_at_ms: NOW_MS + 3,
        deploy: sentinel_deploy(),
    }
}

/// A fixture [`SentinelDeploy`], every field set.
pub fn sentinel_deploy() -> SentinelDeploy {
    SentinelDeploy {
        status: SentinelDeployStatus::Failed,
        started_at_ms: NOW_MS + 3,
        deadline_at_ms: NOW_MS + 600_000,
        ended_at_ms: Some(NOW_MS + 600_001),
        reason: Some("not converged within 10m".into()),
    }
}

/// Every variant of [`SentinelDeployStatus`].
pub fn sentinel_deploy_statuses() -> Vec<SentinelDeployStatus> {
    vec![
        SentinelDeployStatus::Idle,
        SentinelDeployStatus::Progressing,
        SentinelDeployStatus::Ready,
        SentinelDeployStatus::Failed,
    ]
}

/// A fixture [`CiliumNetworkPolicy`], every field set.
pub fn policy() -> CiliumNetworkPolicy {
    CiliumNetworkPolicy {
        id: "cnp_01hx".into(),
        workspace_id: "ws_acme".into(),
        environment_id: "env_prod".into(),
        region: "eu-west".into(),
        k8s_name: "allow-env-prod".into(),
        k8s_namespace: "shop".into(),
        policy_json: r#"{"endpointSelector":{}}"#.into(),
        version: 302,
        created_at_ms: NOW_MS,
        updated_at_ms: NOW_MS + 4,
    }
}

/// Every variant of [`Resource`], each with every field set.
pub fn resources() -> Vec<Resource> {
    vec![
        Resource::DeploymentTopology(topology()),
        Resource::Sentinel(sentinel()),
        Resource::CiliumNetworkPolicy(policy()),
        Resource::Route(route()),
    ]
}

/// A fixture [`Route`], every field set.
pub fn route() -> Route {
    Route {
        id: "snt_01hx".into(),
        workspace_id: "ws_acme".into(),
        project_id: "proj_shop".into(),
        environment_id: "env_prod".into(),
        region: "eu-west".into(),
        sentinel_k8s_name: "snt-01hx".into(),
        k8s_name: "snt-01hx-routes".into(),
        k8s_namespace: "sentinel".into(),
        backends: vec![RouteWeight {
            deployment_id: "dep_01hx3k9".into(),
            weight: 100,
            port: 8080,
        }],
        pending_deployment_id: Some("dep_01hx3kb".into()),
        version: 302,
        created_at_ms: NOW_MS,
        updated_at_ms: NOW_MS + 4,
    }
}

/// A fixture [`Instance`], every field set.
pub fn instance() -> Instance {
    Instance {
        deployment_id: "dep_01hx3k9".into(),
        region: "eu-west".into(),
        pod_name: "dep-01hx3k9-0".into(),
        address: "10.1.2.3".into(),
        cpu_millicores: 1_500,
        memory_mib: 70_000,
        status: InstanceStatus::Failed,
        reason: Some("ImagePullBackOff".into()),
        updated_at_ms: NOW_MS + 5,
        updated: true,
    }
}

/// A fixture [`SentinelStatus`], every field set.
pub fn sentinel_status() -> SentinelStatus {
    SentinelStatus {
        sentinel_id: "snt_01hx".into(),
        region: "eu-west".into(),
        available_replicas: 1,
        updated_replicas: 2,
        ready_replicas: 3,
        observed_generation: -4,
        running_image: "registry.local/sentinel:2".into(),
        health: Health::Unhealthy,
        updated_at_ms: NOW_MS + 6,
        applied_version: 300,
    }
}

/// A fixture [`ApplyReport`], every field set.
pub fn apply_report() -> ApplyReport {
    ApplyReport {
        key: ResourceKey {
            resource_type: ResourceType::CiliumNetworkPolicy,
            resource_id: "cnp_01hx".into(),
            region: "eu-west".into(),
        },
        version: 42,
        outcome: ApplyOutcome::Applied,
        at_ms: NOW_MS + 7,
    }
}

/// A fixture [`ApplyReport`] of a rejected version, every field set.
pub fn apply_rejected() -> ApplyReport {
    ApplyReport {
        key: ResourceKey {
            resource_type: ResourceType::DeploymentTopology,
            resource_id: "dep_01hx3k9".into(),
            region: "eu-west".into(),
        },
        version: 43,
        outcome: apply_outcomes().remove(1),
        at_ms: NOW_MS + 8,
    }
}

/// Every variant of [`ApplyOutcome`], each with every field set.
pub fn apply_outcomes() -> Vec<ApplyOutcome> {
    vec![
        ApplyOutcome::Applied,
        ApplyOutcome::Rejected {
            reason: "StatefulSet.apps \"web\" is invalid: spec.template.spec.containers[0].env[0].name: Invalid value: \"1X\"".into(),
            code: 422,
            field: Some("spec.template.spec.containers[0].env[0].name".into()),
        },
    ]
}

/// Every variant of [`RegionSource`], each with every field set.
pub fn region_sources() -> Vec<RegionSource> {
    vec![RegionSource::Operator, RegionSource::Heartbeat]
}

/// A fixture [`FailedApply`], every field set.
pub fn failed_apply() -> FailedApply {
    FailedApply {
        key: ResourceKey {
            resource_type: ResourceType::DeploymentTopology,
            resource_id: "dep_01hx3k9".into(),
            region: "eu-west".into(),
        },
        error: "admission webhook denied: größe".into(),
    }
}

/// A fixture [`Heartbeat`], every field set.
pub fn heartbeat() -> Heartbeat {
    Heartbeat {
        agent_version: "0.1.0".into(),
        cursor: 70_000,
        interval_ms: 30_000,
        applied_resources: 300,
        failed_applies: vec![failed_apply()],
        at_ms: NOW_MS + 7,
    }
}

/// A fixture [`Region`], every field set.
pub fn region() -> Region {
    Region {
        name: "eu-west".into(),
        schedulable: true,
        registered_by: RegionSource::Heartbeat,
        created_at_ms: NOW_MS + 8,
        last_heartbeat: Some(heartbeat()),
    }
}

/// A fixture [`HeartbeatReport`], every field set.
pub fn heartbeat_report() -> HeartbeatReport {
    HeartbeatReport {
        region: "eu-west".into(),
        agent_version: "0.1.0".into(),
        cursor: 70_000,
        interval_ms: 30_000,
        applied_resources: 300,
        failed_applies: vec![failed_apply()],
    }
}

/// A fixture [`RegionView`], every field set.
pub fn region_view() -> RegionView {
    RegionView {
        region: region(),
        heartbeat_age_ms: Some(1_500),
        lag: Some(3),
        stale: true,
    }
}

/// A fixture [`RegionList`], every field set.
pub fn region_list() -> RegionList {
    RegionList {
        regions: vec![region_view()],
        last_pk: 70_003,
        as_of_ms: NOW_MS + 9,
    }
}

/// Every variant of [`ErrorCode`], each with every field set.
pub fn error_codes() -> Vec<ErrorCode> {
    vec![
        ErrorCode::BadRequest,
        ErrorCode::NotFound,
        ErrorCode::PermissionDenied,
        ErrorCode::NotLeader,
        ErrorCode::Unavailable,
        ErrorCode::VersionMismatch,
        ErrorCode::BadFrame,
        ErrorCode::ProtocolViolation,
        ErrorCode::Internal,
        ErrorCode::Conflict,
        ErrorCode::FailedPrecondition,
    ]
}

/// A fixture [`WireError`], every field set.
pub fn wire_error() -> WireError {
    WireError::new(ErrorCode::NotLeader, "not the leader; try node 2")
}

/// Every variant of [`Protocol`], each with every field set.
pub fn protocols() -> Vec<Protocol> {
    vec![Protocol::Agent, Protocol::Operator, Protocol::Raft]
}

/// A fixture [`VersionRange`] (fixed values, not this build's range, so
/// that the golden pins the layout alone).
pub fn version_range() -> VersionRange {
    VersionRange { min: 4, max: 5 }
}

/// A fixture [`Hello`], every field set.
pub fn hello() -> Hello {
    Hello::offering(Protocol::Operator, version_range())
}

/// A fixture [`NodeVersion`], every field set.
pub fn node_version() -> crate::operator::NodeVersion {
    crate::operator::NodeVersion {
        node_id: 2,
        software: "0.5.0".into(),
        protocols: version_range(),
    }
}

/// A fixture [`LegacyHello`]: protocol 4's hello of an operator stream, as
/// that release sent it.
pub fn legacy_hello() -> LegacyHello {
    LegacyHello::new(Protocol::Operator, 4)
}

/// A fixture [`WatchRequest`], every field set.
pub fn watch_request() -> WatchRequest {
    WatchRequest {
        region: "eu-west".into(),
        cursor: 70_000,
        epoch: 0x5eed_0000_0000_0001,
    }
}

fn instances_report() -> DeploymentReport {
    DeploymentReport::Instances {
        deployment_id: "dep_01hx3k9".into(),
        region: "eu-west".into(),
        instances: vec![instance()],
    }
}

/// Every variant of [`DeploymentReport`], each with every field set.
pub fn deployment_reports() -> Vec<DeploymentReport> {
    vec![
        instances_report(),
        DeploymentReport::Deleted {
            deployment_id: "dep_01hx3k9".into(),
            region: "us-east".into(),
        },
    ]
}

/// Every variant of [`AgentRequest`], each with every field set.
pub fn agent_requests() -> Vec<AgentRequest> {
    vec![
        AgentRequest::Watch(watch_request()),
        AgentRequest::ReportDeploymentStatus(instances_report()),
        AgentRequest::ReportSentinelStatus(sentinel_status()),
        AgentRequest::GetDesiredDeployment {
            deployment_id: "dep_01hx3k9".into(),
            region: "eu-west".into(),
        },
        AgentRequest::GetDesiredSentinel {
            sentinel_id: "snt_01hx".into(),
            region: "eu-west".into(),
        },
        AgentRequest::GetDesiredPolicy {
            policy_id: "cnp_01hx".into(),
            region: "eu-west".into(),
        },
        AgentRequest::Heartbeat(heartbeat_report()),
        AgentRequest::ReportApply(apply_report()),
    ]
}

/// Every variant of [`AgentResponse`], each with every field set.
pub fn agent_responses() -> Vec<AgentResponse> {
    vec![
        AgentResponse::Ack,
        AgentResponse::DesiredDeployment(Some(topology())),
        AgentResponse::DesiredSentinel(Some(sentinel())),
        AgentResponse::DesiredPolicy(Some(policy())),
        AgentResponse::Error(wire_error()),
    ]
}

/// Every variant of [`ResourceChange`], each with every field set.
pub fn resource_changes() -> Vec<ResourceChange> {
    vec![
        ResourceChange::Apply(Resource::Sentinel(sentinel())),
        ResourceChange::Delete(resource_key()),
    ]
}

/// Every variant of [`WatchEvent`], each with every field set.
pub fn watch_events() -> Vec<WatchEvent> {
    vec![
        WatchEvent::SyncStart {
            cursor: 0,
            epoch: 0x5eed_0000_0000_0001,
        },
        WatchEvent::SyncItem(Resource::DeploymentTopology(topology())),
        WatchEvent::SyncEnd { cursor: 302 },
        WatchEvent::Change {
            version: 303,
            change: ResourceChange::Delete(resource_key()),
        },
        WatchEvent::Progress { cursor: 1 << 40 },
        WatchEvent::ResyncRequired { floor: 200 },
        WatchEvent::Error(WireError::new(
            ErrorCode::PermissionDenied,
            "an agent of region us-east may not watch eu-west",
        )),
        WatchEvent::EpochChanged {
            epoch: 0x5eed_0000_0000_0002,
        },
    ]
}

/// A fixture [`CreateDeployment`], every field set.
pub fn create_deployment() -> CreateDeployment {
    CreateDeployment {
        workspace_id: "ws_acme".into(),
        project_id: "proj_shop".into(),
        environment_id: "env_prod".into(),
        image: "registry.local/shop:1.4.2".into(),
        cpu_millicores: 1_500,
        memory_mib: 70_000,
        replicas: 3,
        regions: vec!["eu-west".into(), "us-east".into()],
        env_vars: env_vars(),
        progress_deadline_ms: Some(900_000),
        min_ready_regions: Some(1),
        spec: Box::new(workload_spec_plain()),
    }
}

/// A fixture [`ApplySentinel`], every field set.
pub fn apply_sentinel() -> ApplySentinel {
    ApplySentinel {
        workspace_id: "ws_acme".into(),
        project_id: "proj_shop".into(),
        app_id: "app_web".into(),
        environment_id: "env_prod".into(),
        region: "eu-west".into(),
        image: Some("registry.local/sentinel:2".into()),
        replicas: Some(2),
        cpu_millicores: Some(250),
        memory_mib: Some(128),
        deadline_ms: Some(600_000),
    }
}

/// A fixture [`ApplyPolicy`], every field set.
pub fn apply_policy() -> ApplyPolicy {
    ApplyPolicy {
        workspace_id: "ws_acme".into(),
        environment_id: "env_prod".into(),
        region: "eu-west".into(),
        name: "allow-env-prod".into(),
        namespace: "shop".into(),
        policy_json: r#"{"endpointSelector":{}}"#.into(),
    }
}

/// A fixture [`Membership`], every field set.
pub fn membership() -> Membership {
    Membership {
        voters: vec![1, 2],
        learners: vec![3],
        nodes: vec![
            (1, "10.0.0.1:7400".into()),
            (2, "10.0.0.2:7400".into()),
            (3, "10.0.0.3:7400".into()),
        ],
    }
}

/// A fixture [`LogStatus`], every field set.
pub fn log_status() -> LogStatus {
    LogStatus {
        last_log_index: Some(9_000),
        snapshot_index: Some(8_192),
        purged_index: Some(4_096),
    }
}

/// A fixture [`StateHash`], every field set.
pub fn state_hash() -> StateHash {
    StateHash {
        node_id: 2,
        applied_index: 9_000,
        last_change_pk: 303,
        hash: 0xcbf2_9ce4_8422_2325,
    }
}

/// A fixture [`NodeDiagnostics`], every field set.
pub fn node_diagnostics() -> NodeDiagnostics {
    NodeDiagnostics {
        node_id: 2,
        config_toml: "node_id = 2\nlisten_addr = \"10.0.0.2:7400\"\n".into(),
        metrics: "ctrl_raft_term 7\n# EOF\n".into(),
    }
}

/// A fixture [`NodeStatus`], every field set.
pub fn node_status() -> NodeStatus {
    NodeStatus {
        node_id: 1,
        addr: "10.0.0.1:7400".into(),
        role: "leader".into(),
        term: 7,
        leader_id: Some(1),
        last_log_index: Some(9_001),
        applied_index: Some(9_000),
        last_change_pk: 303,
        members: vec![(1, "10.0.0.1:7400".into()), (2, "10.0.0.2:7400".into())],
    }
}

/// A fixture [`SentinelView`], every field set.
pub fn sentinel_view() -> SentinelView {
    SentinelView {
        sentinel: sentinel(),
        status: Some(sentinel_status()),
        rejected: Some(apply_rejected()),
    }
}

/// A fixture [`DeploymentView`], every field set.
pub fn deployment_view() -> DeploymentView {
    DeploymentView {
        deployment: deployment(),
        instances: vec![instance()],
        rejected: vec![apply_rejected()],
    }
}

/// Every variant of [`OperatorRequest`], each with every field set.
pub fn operator_requests() -> Vec<OperatorRequest> {
    vec![
        OperatorRequest::CreateDeployment(create_deployment()),
        OperatorRequest::GetDeployment(crate::operator::request::GetDeployment {
            id: "dep_01hx3k9".into(),
        }),
        OperatorRequest::ListDeployments(crate::operator::request::ListDeployments {
            after: Some("dep_01hx3k8".into()),
            limit: 500,
        }),
        OperatorRequest::SetDesiredState(crate::operator::request::SetDesiredState {
            id: "dep_01hx3k9".into(),
            desired_state: DesiredState::Standby,
            after_ms: Some(1_800_000),
            force: true,
        }),
        OperatorRequest::InitCluster(crate::operator::request::InitCluster),
        OperatorRequest::NodeStatus(crate::operator::request::NodeStatus),
        OperatorRequest::AddNode(crate::operator::request::AddNode {
            node_id: 3,
            addr: "10.0.0.3:7400".into(),
            wait_ms: 30_000,
        }),
        OperatorRequest::RemoveNode(crate::operator::request::RemoveNode {
            node_id: 2,
            wait_ms: 20_000,
        }),
        OperatorRequest::LogStatus(crate::operator::request::LogStatus),
        OperatorRequest::StateHash(crate::operator::request::StateHash {
            min_applied_index: 9_000,
            wait_ms: 5_000,
        }),
        OperatorRequest::ApplySentinel(apply_sentinel()),
        OperatorRequest::StopSentinel(crate::operator::request::StopSentinel {
            id: "snt_01hx".into(),
        }),
        OperatorRequest::GetSentinel(crate::operator::request::GetSentinel {
            id: "snt_01hx".into(),
        }),
        OperatorRequest::ApplyPolicy(apply_policy()),
        OperatorRequest::DeletePolicy(crate::operator::request::DeletePolicy {
            id: "cnp_01hx".into(),
        }),
        OperatorRequest::WaitDeployment(crate::operator::request::WaitDeployment {
            id: "dep_01hx3k9".into(),
            seen: 0x8422_2325_cbf2_9ce4,
            wait_ms: 60_000,
        }),
        OperatorRequest::AddRegion(crate::operator::request::AddRegion {
            name: "eu-west".into(),
        }),
        OperatorRequest::SetRegionSchedulable(crate::operator::request::SetRegionSchedulable {
            name: "us-east".into(),
            schedulable: false,
        }),
        OperatorRequest::ListRegions(crate::operator::request::ListRegions),
        OperatorRequest::CancelDeployment(crate::operator::request::CancelDeployment {
            id: "dep_01hx3kb".into(),
        }),
        OperatorRequest::Rollback(crate::operator::request::Rollback {
            environment_id: "env_prod".into(),
            to: Some("dep_01hx3k8".into()),
        }),
        OperatorRequest::GetEnvironment(crate::operator::request::GetEnvironment {
            id: "env_prod".into(),
        }),
        OperatorRequest::History(crate::operator::request::History {
            environment_id: Some("env_prod".into()),
            deployment_id: Some("dep_01hx3k9".into()),
            after: 3_999,
            limit: 200,
        }),
        OperatorRequest::NodeDiagnostics(crate::operator::request::NodeDiagnostics),
        OperatorRequest::ListPolicies(crate::operator::request::ListPolicies {
            after: Some(("eu-west".into(), "cnp_01hx".into())),
            limit: 500,
        }),
        OperatorRequest::AddNotifyEndpoint(add_endpoint()),
        OperatorRequest::RemoveNotifyEndpoint(crate::operator::request::RemoveNotifyEndpoint {
            name: "chat".into(),
        }),
        OperatorRequest::ListNotifyEndpoints(crate::operator::request::ListNotifyEndpoints),
        OperatorRequest::ListDeliveries(crate::operator::request::ListDeliveries {
            after: 4_096,
            limit: 300,
        }),
        OperatorRequest::ReplayDelivery(crate::operator::request::ReplayDelivery { id: 70_000 }),
        OperatorRequest::ListSentinels(crate::operator::request::ListSentinels {
            after: Some(("eu-west".into(), "snt_01hw".into())),
            limit: 300,
        }),
        OperatorRequest::PlanRollout(crate::operator::request::PlanRollout {
            image: "registry.local/sentinel:3".into(),
            wave_percents: vec![1, 5, 25, 50, 100],
        }),
        OperatorRequest::StartRollout(StartRollout {
            options: rollout_options(),
        }),
        OperatorRequest::RolloutStatus(crate::operator::request::RolloutStatus),
        OperatorRequest::ControlRollout(crate::operator::request::ControlRollout {
            command: RolloutCommand::Resume,
        }),
        OperatorRequest::ControlRollout(crate::operator::request::ControlRollout {
            command: RolloutCommand::Cancel,
        }),
        OperatorRequest::ControlRollout(crate::operator::request::ControlRollout {
            command: RolloutCommand::RollbackAll,
        }),
        OperatorRequest::RolloutHistory(crate::operator::request::RolloutHistory { limit: 20 }),
        OperatorRequest::UpdateDeployment(crate::operator::request::UpdateDeployment {
            id: "dep_01hx3k9".into(),
            update: deployment_update(),
        }),
        OperatorRequest::Backup(crate::operator::request::Backup),
        OperatorRequest::NodeVersion(crate::operator::request::NodeVersion),
        OperatorRequest::DescribeEnvironment(crate::operator::request::DescribeEnvironment {
            id: "env_prod".into(),
        }),
        OperatorRequest::ListEnvironments(crate::operator::request::ListEnvironments {
            after: Some("env_dev".into()),
            limit: 100,
        }),
        OperatorRequest::WaitSentinel(crate::operator::request::WaitSentinel {
            id: "snt_01hx".into(),
            region: "eu-west".into(),
            seen: 0x1234_5678_9abc_def0,
            wait_ms: 30_000,
        }),
        OperatorRequest::WaitRollout(crate::operator::request::WaitRollout {
            seen: 0x0fed_cba9_8765_4321,
            wait_ms: 30_000,
        }),
        OperatorRequest::RevokeCertificate(crate::operator::request::RevokeCertificate {
            target: crate::revocation::RevokedTarget::Operator("alice".into()),
            reason: "laptop lost".into(),
        }),
        OperatorRequest::ListRevocations(crate::operator::request::ListRevocations),
    ]
}

/// Every [`crate::revocation::RevokedTarget`] variant.
pub fn revoked_targets() -> Vec<crate::revocation::RevokedTarget> {
    use crate::revocation::RevokedTarget;
    vec![
        RevokedTarget::Serial("4f1c2a9e07b3".into()),
        RevokedTarget::Operator("alice".into()),
        RevokedTarget::Agent("eu-west".into()),
    ]
}

/// A fixture [`crate::revocation::Revocation`], every field set.
pub fn revocation() -> crate::revocation::Revocation {
    crate::revocation::Revocation {
        target: crate::revocation::RevokedTarget::Operator("alice".into()),
        reason: "laptop lost".into(),
        revoked_at_ms: NOW_MS,
        revoked_by: "ctrl://operator/root/admin".into(),
    }
}

/// A fixture [`BackupChunk`], every field set.
pub fn backup_chunk() -> BackupChunk {
    BackupChunk {
        offset: 262_144,
        total_bytes: 600_000,
        bytes: b"ctrlbkup".to_vec(),
    }
}

/// A fixture [`PolicyView`], every field set.
pub fn policy_view() -> PolicyView {
    PolicyView {
        policy: policy(),
        applied_version: Some(41),
        rejected: Some(apply_rejected()),
    }
}

/// A fixture [`RolloutOptions`], every field set.
pub fn rollout_options() -> RolloutOptions {
    RolloutOptions {
        image: "registry.local/sentinel:3".into(),
        wave_percents: vec![10, 100],
        bake_ms: 300_000,
        max_failures: 2,
        concurrency: 50,
        deadline_ms: 600_000,
        notify: Some("ops-alerts".into()),
    }
}

/// Every variant of [`RolloutState`].
pub fn rollout_states() -> Vec<RolloutState> {
    vec![
        RolloutState::Idle,
        RolloutState::InProgress,
        RolloutState::Paused,
        RolloutState::RollingBack,
        RolloutState::Cancelled,
        RolloutState::Completed,
    ]
}

/// Every variant of [`MemberState`].
pub fn member_states() -> Vec<MemberState> {
    vec![
        MemberState::Pending,
        MemberState::Deploying,
        MemberState::Succeeded,
        MemberState::Failed,
        MemberState::Skipped,
        MemberState::Reverting,
        MemberState::Reverted,
        MemberState::RevertFailed,
    ]
}

/// Every variant of [`RolloutEventKind`].
pub fn rollout_event_kinds() -> Vec<RolloutEventKind> {
    vec![
        RolloutEventKind::Started,
        RolloutEventKind::WaveStarted,
        RolloutEventKind::WaveCompleted,
        RolloutEventKind::Paused,
        RolloutEventKind::Resumed,
        RolloutEventKind::Completed,
        RolloutEventKind::Cancelled,
        RolloutEventKind::RollbackStarted,
        RolloutEventKind::RollbackCompleted,
    ]
}

/// A fixture [`RolloutMember`], every field set.
pub fn rollout_member() -> RolloutMember {
    RolloutMember {
        sentinel_id: "snt_01hx".into(),
        region: "eu-west".into(),
        wave: 1,
        previous_image: "registry.local/sentinel:2".into(),
        state: MemberState::Failed,
        version: 310,
        writes: 1,
        reason: Some("not converged within 10m".into()),
    }
}

/// A fixture [`RolloutEvent`], every field set.
pub fn rollout_event() -> RolloutEvent {
    RolloutEvent {
        at_ms: NOW_MS + 20,
        kind: RolloutEventKind::Paused,
        wave: 1,
        message: "wave 2: 1 failed, at most 0 allowed".into(),
    }
}

/// A fixture [`Rollout`], every field set.
pub fn rollout() -> Rollout {
    Rollout {
        seq: 7,
        options: rollout_options(),
        state: RolloutState::Paused,
        waves: vec![1],
        members: vec![rollout_member()],
        current_wave: 1,
        wave_started_at_ms: Some(NOW_MS + 10),
        bake_until_ms: Some(NOW_MS + 300_010),
        revision: 12,
        started_at_ms: NOW_MS + 9,
        ended_at_ms: Some(NOW_MS + 400_000),
        reverted: 3,
        reason: Some("wave 2: 1 failed, at most 0 allowed".into()),
        events: vec![rollout_event()],
    }
}

/// A fixture [`WaveCounts`], every field set.
pub fn wave_counts() -> WaveCounts {
    WaveCounts {
        done: 40,
        failed: 2,
        pending: 300,
        skipped: 1,
    }
}

/// A fixture [`RolloutSummary`], every field set.
pub fn rollout_summary() -> RolloutSummary {
    RolloutSummary {
        seq: 7,
        image: "registry.local/sentinel:3".into(),
        state: RolloutState::Completed,
        started_at_ms: NOW_MS + 9,
        ended_at_ms: Some(NOW_MS + 400_000),
        sentinels: 1_000,
        waves: vec![wave_counts()],
        reverted: 0,
        reason: Some("wave 2: 1 failed, at most 0 allowed".into()),
    }
}

/// A fixture [`RolloutPlan`], every field set.
pub fn rollout_plan() -> RolloutPlan {
    RolloutPlan {
        image: "registry.local/sentinel:3".into(),
        already_on_image: 4,
        waves: vec![vec![("eu-west".into(), "snt_01hx".into())]],
    }
}

/// A fixture [`DeploymentUpdate`], every field set.
pub fn deployment_update() -> DeploymentUpdate {
    DeploymentUpdate {
        replicas: Some(700),
        cpu_millicores: Some(2_500),
        memory_mib: Some(90_000),
        health: Some(Some(HealthCheck {
            probe: probes().remove(1),
            period_s: 20,
            timeout_s: 4,
            failure_threshold: 5,
        })),
    }
}

/// Every variant of [`OperatorResponse`], each with every field set.
pub fn operator_responses() -> Vec<OperatorResponse> {
    vec![
        OperatorResponse::Created {
            deployment_id: "dep_01hx3k9".into(),
        },
        OperatorResponse::Deployment(deployment_view()),
        OperatorResponse::Deployments {
            items: vec![deployment()],
            next_after: Some("dep_01hx3k9".into()),
        },
        OperatorResponse::Updated(deployment()),
        OperatorResponse::Initialized {
            members: vec![(1, "10.0.0.1:7400".into())],
        },
        OperatorResponse::NodeStatus(node_status()),
        OperatorResponse::MembershipChanged(membership()),
        OperatorResponse::StateHash(state_hash()),
        OperatorResponse::LogStatus(log_status()),
        OperatorResponse::SentinelApplied {
            sentinel_id: "snt_01hx".into(),
        },
        OperatorResponse::SentinelStopped {
            sentinel_id: "snt_01hx".into(),
        },
        OperatorResponse::Sentinel(sentinel_view()),
        OperatorResponse::PolicyApplied {
            policy_id: "cnp_01hx".into(),
        },
        OperatorResponse::PolicyDeleted {
            policy_id: "cnp_01hx".into(),
        },
        OperatorResponse::Error(wire_error()),
        OperatorResponse::Region(region()),
        OperatorResponse::Regions(region_list()),
        OperatorResponse::Environment(environment()),
        OperatorResponse::History {
            entries: vec![journal_entry()],
            next_after: Some(4_000),
        },
        OperatorResponse::NodeDiagnostics(node_diagnostics()),
        OperatorResponse::Policies(vec![policy_view()]),
        OperatorResponse::NotifyEndpoint(endpoint_view()),
        OperatorResponse::NotifyEndpointRemoved {
            name: "chat".into(),
            deliveries_dead: 3,
        },
        OperatorResponse::NotifyEndpoints(vec![endpoint_view()]),
        OperatorResponse::Deliveries(delivery_page()),
        OperatorResponse::DeliveryReplayed(delivery()),
        OperatorResponse::SentinelDeployed {
            sentinel_id: "snt_01hx".into(),
            version: 310,
            status: SentinelDeployStatus::Progressing,
        },
        OperatorResponse::Sentinels {
            items: vec![sentinel_view()],
            next_after: Some(("eu-west".into(), "snt_01hx".into())),
        },
        OperatorResponse::RolloutPlan(rollout_plan()),
        OperatorResponse::Rollout(Some(rollout())),
        OperatorResponse::Rollouts(vec![rollout_summary()]),
        OperatorResponse::BackupChunk(backup_chunk()),
        OperatorResponse::NodeVersion(node_version()),
        OperatorResponse::EnvironmentView(environment_view()),
        OperatorResponse::Environments {
            items: vec![environment_view()],
            next_after: Some("env_prod".into()),
        },
        OperatorResponse::Revoked(revocation()),
        OperatorResponse::Revocations(vec![revocation()]),
    ]
}

/// A fixture [`crate::operator::EnvironmentView`], every field set.
pub fn environment_view() -> crate::operator::EnvironmentView {
    crate::operator::EnvironmentView {
        environment: environment(),
        routes: vec![crate::operator::RouteView {
            route: route(),
            address: "snt-01hx.sentinel.svc:8040".into(),
            report: Some(apply_rejected()),
        }],
    }
}

/// A fixture [`NotifyEndpoint`], every field set.
pub fn notify_endpoint() -> NotifyEndpoint {
    NotifyEndpoint {
        name: "chat".into(),
        url: "https://chat.example/hooks/ctrl".into(),
        secret: Some("s3crét".into()),
        created_at_ms: NOW_MS - 86_400_000,
    }
}

/// A fixture [`EndpointView`], every field set.
pub fn endpoint_view() -> EndpointView {
    notify_endpoint().view()
}

/// A fixture [`AddEndpoint`], every field set.
pub fn add_endpoint() -> AddEndpoint {
    AddEndpoint {
        name: "ops-alerts".into(),
        url: "http://10.0.0.9:9093/hook".into(),
        secret: Some("k3y".into()),
    }
}

/// Every variant of [`NotifyEvent`], each with every field set.
pub fn notify_events() -> Vec<NotifyEvent> {
    let rollout_id = || "ro_01hx".to_string();
    let image = || "ghcr.io/acme/sentinel:2.1".to_string();
    vec![
        NotifyEvent::DeploymentReady {
            deployment_id: "dep_01hx3k9".into(),
            environment_id: "env_prod".into(),
            project_id: "proj_api".into(),
            image: "ghcr.io/acme/api:1.4".into(),
            live: true,
        },
        NotifyEvent::DeploymentFailed {
            deployment_id: "dep_01hx3ka".into(),
            environment_id: "env_stage".into(),
            project_id: "proj_web".into(),
            image: "ghcr.io/acme/web:0.9".into(),
            reason: "eu-west: 3 pods CrashLoopBackOff — grüße".into(),
        },
        NotifyEvent::RolloutStarted {
            rollout_id: rollout_id(),
            image: image(),
            waves: 5,
            sentinels: 1_000,
        },
        NotifyEvent::RolloutWaveStarted {
            rollout_id: rollout_id(),
            image: image(),
            wave: 2,
            waves: 5,
            sentinels: 40,
        },
        NotifyEvent::RolloutWaveCompleted {
            rollout_id: rollout_id(),
            image: image(),
            wave: 3,
            waves: 5,
            succeeded: 199,
            failed: 1,
        },
        NotifyEvent::RolloutPaused {
            rollout_id: rollout_id(),
            image: image(),
            wave: 4,
            failed: 2,
            reason: "snt_a, snt_b did not converge".into(),
        },
        NotifyEvent::RolloutResumed {
            rollout_id: rollout_id(),
            image: image(),
            wave: 5,
        },
        NotifyEvent::RolloutCompleted {
            rollout_id: rollout_id(),
            image: image(),
            succeeded: 997,
            failed: 3,
        },
        NotifyEvent::RolloutRollbackStarted {
            rollout_id: rollout_id(),
            image: image(),
            sentinels: 250,
        },
        NotifyEvent::RolloutRollbackCompleted {
            rollout_id: rollout_id(),
            image: image(),
            reverted: 248,
            failed: 2,
        },
    ]
}

/// Every variant of [`DeliveryState`].
pub fn delivery_states() -> Vec<DeliveryState> {
    vec![
        DeliveryState::Pending,
        DeliveryState::Delivered,
        DeliveryState::Dead,
    ]
}

/// A fixture [`Delivery`], every field set.
pub fn delivery() -> Delivery {
    Delivery {
        id: 70_000,
        event_id: 35_000,
        endpoint: "chat".into(),
        event: notify_events().remove(1),
        created_at_ms: NOW_MS - 60_000,
        state: DeliveryState::Dead,
        revision: 11,
        attempts: 10,
        next_attempt_at_ms: NOW_MS - 1_000,
        last_attempt_at_ms: Some(NOW_MS - 2_000),
        last_error: Some("HTTP 503 Service Unavailable".into()),
        delivered_at_ms: Some(NOW_MS - 500),
    }
}

/// A fixture [`DeliveryPage`], every field set.
pub fn delivery_page() -> DeliveryPage {
    DeliveryPage {
        items: vec![delivery()],
        next_after: Some(70_000),
        dropped: 12,
    }
}

/// A fixture [`RequestId`], every field set.
pub fn request_id() -> RequestId {
    // A fixture, valid by construction.
    RequestId::parse("cli-5f1c9a0e7d3b2468").expect("a valid request id")
}

/// A fixture [`OperatorCall`], every field set.
pub fn operator_call() -> OperatorCall {
    OperatorCall {
        request_id: Some(request_id()),
        request: OperatorRequest::CreateDeployment(create_deployment()),
    }
}

//! Proptest strategies for every message of the `wire` crate, shared by the
//! integration tests. Strings, maps and lists are kept short so a case is
//! cheap; integers range over their whole domain so every varint width is
//! exercised.

// Each test binary uses a different subset of these strategies.
#![allow(dead_code)]

use std::collections::BTreeMap;

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;

use wire::agent::{
    AgentRequest, AgentResponse, DeploymentReport, HeartbeatReport, ResourceChange, WatchEvent,
    WatchRequest,
};
use wire::hello::{self, Hello, LegacyHello, Protocol, VersionRange};
use wire::model::{
    ApplyOutcome, ApplyReport, CiliumNetworkPolicy, Deployment, DeploymentStatus,
    DeploymentTopology, DesiredState, FailedApply, Health, Heartbeat, Instance, InstanceStatus,
    Region, RegionSource, Resource, ResourceKey, ResourceType, Sentinel, SentinelDeploy,
    SentinelDeployStatus, SentinelStatus,
};
use wire::operator::{
    ApplyPolicy, ApplySentinel, CreateDeployment, DeploymentView, NodeStatus, OperatorCall,
    OperatorRequest, OperatorResponse, PolicyView, RegionList, RegionView, RequestId, SentinelView,
};
use wire::workload::{HealthCheck, Probe, SealedSecret, SecretValue, WorkloadSpec};
use wire::{ErrorCode, WireError};

/// A short string of arbitrary (non-newline) Unicode scalar values,
/// including the empty string and multi-byte characters.
pub(crate) fn short_string() -> impl Strategy<Value = String> {
    ".{0,6}"
}

pub(crate) fn env_vars() -> impl Strategy<Value = BTreeMap<String, String>> {
    btree_map(short_string(), short_string(), 0..3)
}

prop_compose! {
    pub fn workload_spec()(
        port in option::of(any::<u16>()),
        command in vec(short_string(), 0..2),
        args in vec(short_string(), 0..2),
        health in option::of((
            prop_oneof![
                (short_string(), option::of(any::<u16>()))
                    .prop_map(|(path, port)| Probe::Http { path, port }),
                vec(short_string(), 0..2).prop_map(|command| Probe::Exec { command }),
            ],
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
        )),
        shutdown_signal in option::of(short_string()),
        termination_grace_s in option::of(any::<u32>()),
        pod_labels in env_vars(),
        pod_annotations in env_vars(),
        secret_env in btree_map(
            short_string(),
            prop_oneof![
                short_string().prop_map(SecretValue::Plain),
                (short_string(), vec(any::<u8>(), 0..13), vec(any::<u8>(), 0..20)).prop_map(
                    |(key_id, nonce, ciphertext)| SecretValue::Sealed(SealedSecret {
                        key_id,
                        nonce,
                        ciphertext,
                    })
                ),
            ],
            0..2,
        ),
    ) -> WorkloadSpec {
        WorkloadSpec {
            port,
            command,
            args,
            health: health.map(|(probe, period_s, timeout_s, failure_threshold)| HealthCheck {
                probe,
                period_s,
                timeout_s,
                failure_threshold,
            }),
            shutdown_signal,
            termination_grace_s,
            pod_labels,
            pod_annotations,
            secret_env,
        }
    }
}

pub(crate) fn regions() -> impl Strategy<Value = Vec<String>> {
    vec(short_string(), 0..3)
}

// ---------------------------------------------------------------- enums

pub(crate) fn resource_type() -> impl Strategy<Value = ResourceType> {
    prop_oneof![
        Just(ResourceType::DeploymentTopology),
        Just(ResourceType::Sentinel),
        Just(ResourceType::CiliumNetworkPolicy),
    ]
}

pub(crate) fn desired_state() -> impl Strategy<Value = DesiredState> {
    prop_oneof![Just(DesiredState::Running), Just(DesiredState::Stopped)]
}

pub(crate) fn deployment_status() -> impl Strategy<Value = DeploymentStatus> {
    prop_oneof![
        Just(DeploymentStatus::Deploying),
        Just(DeploymentStatus::Ready),
        Just(DeploymentStatus::Failed),
        Just(DeploymentStatus::Stopped),
    ]
}

pub(crate) fn health() -> impl Strategy<Value = Health> {
    prop_oneof![
        Just(Health::Unknown),
        Just(Health::Healthy),
        Just(Health::Unhealthy),
        Just(Health::Paused),
    ]
}

pub(crate) fn instance_status() -> impl Strategy<Value = InstanceStatus> {
    prop_oneof![
        Just(InstanceStatus::Pending),
        Just(InstanceStatus::Running),
        Just(InstanceStatus::Failed),
    ]
}

pub(crate) fn error_code() -> impl Strategy<Value = ErrorCode> {
    prop_oneof![
        Just(ErrorCode::BadRequest),
        Just(ErrorCode::NotFound),
        Just(ErrorCode::PermissionDenied),
        Just(ErrorCode::NotLeader),
        Just(ErrorCode::Unavailable),
        Just(ErrorCode::VersionMismatch),
        Just(ErrorCode::BadFrame),
        Just(ErrorCode::ProtocolViolation),
        Just(ErrorCode::Internal),
        Just(ErrorCode::Conflict),
    ]
}

pub(crate) fn protocol() -> impl Strategy<Value = Protocol> {
    prop_oneof![
        Just(Protocol::Agent),
        Just(Protocol::Operator),
        Just(Protocol::Raft),
    ]
}

prop_compose! {
    pub fn wire_error()(code in error_code(), message in short_string()) -> WireError {
        WireError { code, message }
    }
}

// ---------------------------------------------------------------- model

prop_compose! {
    pub fn resource_key()(
        resource_type in resource_type(),
        resource_id in short_string(),
        region in short_string(),
    ) -> ResourceKey {
        ResourceKey { resource_type, resource_id, region }
    }
}

prop_compose! {
    pub fn deployment()(
        id in short_string(),
        workspace_id in short_string(),
        project_id in short_string(),
        environment_id in short_string(),
        image in short_string(),
        cpu_millicores in any::<u32>(),
        memory_mib in any::<u32>(),
        replicas in any::<u32>(),
        regions in regions(),
        env_vars in env_vars(),
        desired_state in desired_state(),
        status in deployment_status(),
        created_at_ms in any::<u64>(),
        updated_at_ms in any::<u64>(),
        (revision, deadline_at_ms, make_live, reason) in
            (any::<u64>(), any::<u64>(), any::<bool>(), proptest::option::of(short_string())),
        spec in workload_spec(),
    ) -> Deployment {
        Deployment {
            id,
            workspace_id,
            project_id,
            environment_id,
            image,
            cpu_millicores,
            memory_mib,
            replicas,
            regions,
            env_vars,
            desired_state,
            status,
            created_at_ms,
            updated_at_ms,
            workflow: wire::model::DeployWorkflow {
                revision,
                steps: vec![wire::model::StepRecord {
                    step: status,
                    started_at_ms: created_at_ms,
                    ended_at_ms: Some(updated_at_ms),
                    error: reason.clone(),
                }],
                deadline_at_ms,
                make_live,
                reason,
                ..wire::model::DeployWorkflow::default()
            },
            spec: Box::new(spec),
        }
    }
}

prop_compose! {
    pub fn deployment_topology()(
        deployment_id in short_string(),
        workspace_id in short_string(),
        project_id in short_string(),
        environment_id in short_string(),
        region in short_string(),
        k8s_name in short_string(),
        k8s_namespace in short_string(),
        image in short_string(),
        cpu_millicores in any::<u32>(),
        memory_mib in any::<u32>(),
        replicas in any::<u32>(),
        env_vars in env_vars(),
        desired_state in desired_state(),
        version in any::<u64>(),
        created_at_ms in any::<u64>(),
        updated_at_ms in any::<u64>(),
        spec in workload_spec(),
    ) -> DeploymentTopology {
        DeploymentTopology {
            deployment_id,
            workspace_id,
            project_id,
            environment_id,
            region,
            k8s_name,
            k8s_namespace,
            image,
            cpu_millicores,
            memory_mib,
            replicas,
            env_vars,
            desired_state,
            version,
            created_at_ms,
            updated_at_ms,
            spec: Box::new(spec),
        }
    }
}

prop_compose! {
    pub fn sentinel()(
        id in short_string(),
        workspace_id in short_string(),
        project_id in short_string(),
        app_id in short_string(),
        environment_id in short_string(),
        region in short_string(),
        k8s_name in short_string(),
        k8s_namespace in short_string(),
        image in short_string(),
        cpu_millicores in any::<u32>(),
        memory_mib in any::<u32>(),
        replicas in any::<u32>(),
        desired_state in desired_state(),
        version in any::<u64>(),
        created_at_ms in any::<u64>(),
        updated_at_ms in any::<u64>(),
        deploy in sentinel_deploy(),
    ) -> Sentinel {
        Sentinel {
            id,
            workspace_id,
            project_id,
            app_id,
            environment_id,
            region,
            k8s_name,
            k8s_namespace,
            image,
            cpu_millicores,
            memory_mib,
            replicas,
            desired_state,
            version,
            created_at_ms,
            updated_at_ms,
            deploy,
        }
    }
}

prop_compose! {
    pub fn sentinel_deploy()(
        status in prop_oneof![
            Just(SentinelDeployStatus::Idle),
            Just(SentinelDeployStatus::Progressing),
            Just(SentinelDeployStatus::Ready),
            Just(SentinelDeployStatus::Failed),
        ],
        started_at_ms in any::<u64>(),
        deadline_at_ms in any::<u64>(),
        ended_at_ms in option::of(any::<u64>()),
        reason in option::of(short_string()),
    ) -> SentinelDeploy {
        SentinelDeploy { status, started_at_ms, deadline_at_ms, ended_at_ms, reason }
    }
}

prop_compose! {
    pub fn cilium_network_policy()(
        id in short_string(),
        workspace_id in short_string(),
        environment_id in short_string(),
        region in short_string(),
        k8s_name in short_string(),
        k8s_namespace in short_string(),
        policy_json in ".{0,24}",
        version in any::<u64>(),
        created_at_ms in any::<u64>(),
        updated_at_ms in any::<u64>(),
    ) -> CiliumNetworkPolicy {
        CiliumNetworkPolicy {
            id,
            workspace_id,
            environment_id,
            region,
            k8s_name,
            k8s_namespace,
            policy_json,
            version,
            created_at_ms,
            updated_at_ms,
        }
    }
}

pub(crate) fn resource() -> impl Strategy<Value = Resource> {
    prop_oneof![
        deployment_topology().prop_map(Resource::DeploymentTopology),
        sentinel().prop_map(Resource::Sentinel),
        cilium_network_policy().prop_map(Resource::CiliumNetworkPolicy),
    ]
}

prop_compose! {
    pub fn instance()(
        deployment_id in short_string(),
        region in short_string(),
        pod_name in short_string(),
        address in short_string(),
        cpu_millicores in any::<u32>(),
        memory_mib in any::<u32>(),
        status in instance_status(),
        reason in option::of(short_string()),
        updated_at_ms in any::<u64>(),
        updated in any::<bool>(),
    ) -> Instance {
        Instance {
            deployment_id,
            region,
            pod_name,
            address,
            cpu_millicores,
            memory_mib,
            status,
            reason,
            updated_at_ms,
            updated,
        }
    }
}

prop_compose! {
    pub fn sentinel_status()(
        sentinel_id in short_string(),
        region in short_string(),
        available_replicas in any::<u32>(),
        updated_replicas in any::<u32>(),
        ready_replicas in any::<u32>(),
        observed_generation in any::<i64>(),
        running_image in short_string(),
        health in health(),
        updated_at_ms in any::<u64>(),
        applied_version in any::<u64>(),
    ) -> SentinelStatus {
        SentinelStatus {
            sentinel_id,
            region,
            available_replicas,
            updated_replicas,
            ready_replicas,
            observed_generation,
            running_image,
            health,
            updated_at_ms,
            applied_version,
        }
    }
}

// ---------------------------------------------------------------- agent

prop_compose! {
    pub fn watch_request()(region in short_string(), cursor in any::<u64>()) -> WatchRequest {
        WatchRequest {
            region,
            cursor,
            epoch: cursor.rotate_left(7),
        }
    }
}

pub(crate) fn deployment_report() -> impl Strategy<Value = DeploymentReport> {
    prop_oneof![
        (short_string(), short_string(), vec(instance(), 0..3)).prop_map(
            |(deployment_id, region, instances)| DeploymentReport::Instances {
                deployment_id,
                region,
                instances,
            }
        ),
        (short_string(), short_string()).prop_map(|(deployment_id, region)| {
            DeploymentReport::Deleted {
                deployment_id,
                region,
            }
        }),
    ]
}

prop_compose! {
    pub fn failed_apply()(key in resource_key(), error in short_string()) -> FailedApply {
        FailedApply { key, error }
    }
}

/// Either outcome of an apply.
pub(crate) fn apply_outcome() -> impl Strategy<Value = ApplyOutcome> {
    prop_oneof![
        Just(ApplyOutcome::Applied),
        (short_string(), any::<u16>(), option::of(short_string())).prop_map(
            |(reason, code, field)| ApplyOutcome::Rejected {
                reason,
                code,
                field
            }
        ),
    ]
}

prop_compose! {
    pub fn apply_report()(
        key in resource_key(),
        version in any::<u64>(),
        outcome in apply_outcome(),
        at_ms in any::<u64>(),
    ) -> ApplyReport {
        ApplyReport { key, version, outcome, at_ms }
    }
}

prop_compose! {
    pub fn heartbeat_report()(
        region in short_string(),
        agent_version in short_string(),
        cursor in any::<u64>(),
        interval_ms in any::<u64>(),
        applied_resources in any::<u32>(),
        failed_applies in vec(failed_apply(), 0..3),
    ) -> HeartbeatReport {
        HeartbeatReport {
            region, agent_version, cursor, interval_ms, applied_resources, failed_applies,
        }
    }
}

prop_compose! {
    pub fn heartbeat()(
        report in heartbeat_report(),
        at_ms in any::<u64>(),
    ) -> Heartbeat {
        report.into_heartbeat(at_ms).1
    }
}

prop_compose! {
    pub fn region()(
        name in short_string(),
        schedulable in any::<bool>(),
        by_operator in any::<bool>(),
        created_at_ms in any::<u64>(),
        last_heartbeat in option::of(heartbeat()),
    ) -> Region {
        let registered_by = if by_operator { RegionSource::Operator } else { RegionSource::Heartbeat };
        Region { name, schedulable, registered_by, created_at_ms, last_heartbeat }
    }
}

prop_compose! {
    pub fn region_list()(
        regions in vec(
            (region(), option::of(any::<u64>()), option::of(any::<u64>()), any::<bool>()),
            0..3,
        ),
        last_pk in any::<u64>(),
        as_of_ms in any::<u64>(),
    ) -> RegionList {
        let regions = regions
            .into_iter()
            .map(|(region, heartbeat_age_ms, lag, stale)| RegionView {
                region, heartbeat_age_ms, lag, stale,
            })
            .collect();
        RegionList { regions, last_pk, as_of_ms }
    }
}

/// Boxed: the union of every variant is too large for a test thread's
/// stack when built in place.
pub(crate) fn agent_request() -> BoxedStrategy<AgentRequest> {
    prop_oneof![
        watch_request().prop_map(AgentRequest::Watch),
        deployment_report().prop_map(AgentRequest::ReportDeploymentStatus),
        sentinel_status().prop_map(AgentRequest::ReportSentinelStatus),
        (short_string(), short_string()).prop_map(|(deployment_id, region)| {
            AgentRequest::GetDesiredDeployment {
                deployment_id,
                region,
            }
        }),
        (short_string(), short_string()).prop_map(|(sentinel_id, region)| {
            AgentRequest::GetDesiredSentinel {
                sentinel_id,
                region,
            }
        }),
        (short_string(), short_string())
            .prop_map(|(policy_id, region)| AgentRequest::GetDesiredPolicy { policy_id, region }),
        heartbeat_report().prop_map(AgentRequest::Heartbeat),
        apply_report().prop_map(AgentRequest::ReportApply),
    ]
    .boxed()
}

/// Boxed: the union of every variant is too large for a test thread's
/// stack when built in place.
pub(crate) fn agent_response() -> BoxedStrategy<AgentResponse> {
    prop_oneof![
        Just(AgentResponse::Ack),
        option::of(deployment_topology()).prop_map(AgentResponse::DesiredDeployment),
        option::of(sentinel()).prop_map(AgentResponse::DesiredSentinel),
        option::of(cilium_network_policy()).prop_map(AgentResponse::DesiredPolicy),
        wire_error().prop_map(AgentResponse::Error),
    ]
    .boxed()
}

pub(crate) fn resource_change() -> impl Strategy<Value = ResourceChange> {
    prop_oneof![
        resource().prop_map(ResourceChange::Apply),
        resource_key().prop_map(ResourceChange::Delete),
    ]
}

/// Boxed: the union of every variant is too large for a test thread's
/// stack when built in place.
pub(crate) fn watch_event() -> BoxedStrategy<WatchEvent> {
    prop_oneof![
        (any::<u64>(), any::<u64>())
            .prop_map(|(cursor, epoch)| WatchEvent::SyncStart { cursor, epoch }),
        resource().prop_map(WatchEvent::SyncItem),
        any::<u64>().prop_map(|cursor| WatchEvent::SyncEnd { cursor }),
        (any::<u64>(), resource_change())
            .prop_map(|(version, change)| WatchEvent::Change { version, change }),
        any::<u64>().prop_map(|cursor| WatchEvent::Progress { cursor }),
        any::<u64>().prop_map(|floor| WatchEvent::ResyncRequired { floor }),
        any::<u64>().prop_map(|epoch| WatchEvent::EpochChanged { epoch }),
        wire_error().prop_map(WatchEvent::Error),
    ]
    .boxed()
}

// ---------------------------------------------------------------- operator

prop_compose! {
    pub fn create_deployment()(
        workspace_id in short_string(),
        project_id in short_string(),
        environment_id in short_string(),
        image in short_string(),
        cpu_millicores in any::<u32>(),
        memory_mib in any::<u32>(),
        replicas in any::<u32>(),
        regions in regions(),
        env_vars in env_vars(),
        spec in workload_spec(),
    ) -> CreateDeployment {
        CreateDeployment {
            workspace_id,
            project_id,
            environment_id,
            image,
            cpu_millicores,
            memory_mib,
            replicas,
            regions,
            env_vars,
            progress_deadline_ms: None,
            min_ready_regions: None,
            spec: Box::new(spec),
        }
    }
}

prop_compose! {
    pub fn apply_sentinel()(
        ids in (short_string(), short_string(), short_string(), short_string()),
        region in short_string(),
        image in option::of(short_string()),
        replicas in option::of(any::<u32>()),
        cpu_millicores in option::of(any::<u32>()),
        memory_mib in option::of(any::<u32>()),
        deadline_ms in option::of(any::<u64>()),
    ) -> ApplySentinel {
        let (workspace_id, project_id, app_id, environment_id) = ids;
        ApplySentinel {
            workspace_id, project_id, app_id, environment_id, region, image,
            replicas, cpu_millicores, memory_mib, deadline_ms,
        }
    }
}

prop_compose! {
    pub fn apply_policy()(
        workspace_id in short_string(),
        environment_id in short_string(),
        region in short_string(),
        name in short_string(),
        namespace in short_string(),
        policy_json in short_string(),
    ) -> ApplyPolicy {
        ApplyPolicy { workspace_id, environment_id, region, name, namespace, policy_json }
    }
}

prop_compose! {
    pub fn sentinel_view()(
        sentinel in sentinel(),
        status in option::of(sentinel_status()),
        rejected in option::of(apply_report()),
    ) -> SentinelView {
        SentinelView { sentinel, status, rejected }
    }
}

/// Boxed: the union of every variant is too large for a test thread's
/// stack when built in place.
pub(crate) fn operator_request() -> BoxedStrategy<OperatorRequest> {
    prop_oneof![
        create_deployment().prop_map(OperatorRequest::CreateDeployment),
        short_string().prop_map(|id| OperatorRequest::GetDeployment(
            wire::operator::request::GetDeployment { id }
        )),
        (option::of(short_string()), any::<u32>()).prop_map(|(after, limit)| {
            OperatorRequest::ListDeployments(wire::operator::request::ListDeployments {
                after,
                limit,
            })
        }),
        (short_string(), desired_state()).prop_map(|(id, desired_state)| {
            OperatorRequest::SetDesiredState(wire::operator::request::SetDesiredState {
                id,
                desired_state,
                after_ms: None,
                force: false,
            })
        }),
        Just(OperatorRequest::InitCluster(
            wire::operator::request::InitCluster
        )),
        Just(OperatorRequest::NodeStatus(
            wire::operator::request::NodeStatus
        )),
        apply_sentinel().prop_map(OperatorRequest::ApplySentinel),
        short_string().prop_map(|id| OperatorRequest::StopSentinel(
            wire::operator::request::StopSentinel { id }
        )),
        short_string().prop_map(|id| OperatorRequest::GetSentinel(
            wire::operator::request::GetSentinel { id }
        )),
        apply_policy().prop_map(OperatorRequest::ApplyPolicy),
        short_string().prop_map(|id| OperatorRequest::DeletePolicy(
            wire::operator::request::DeletePolicy { id }
        )),
        short_string().prop_map(|name| OperatorRequest::AddRegion(
            wire::operator::request::AddRegion { name }
        )),
        (short_string(), any::<bool>()).prop_map(|(name, schedulable)| {
            OperatorRequest::SetRegionSchedulable(wire::operator::request::SetRegionSchedulable {
                name,
                schedulable,
            })
        }),
        Just(OperatorRequest::ListRegions(
            wire::operator::request::ListRegions
        )),
        (option::of((short_string(), short_string())), any::<u32>()).prop_map(|(after, limit)| {
            OperatorRequest::ListPolicies(wire::operator::request::ListPolicies { after, limit })
        }),
        (
            short_string(),
            option::of(any::<u32>()),
            option::of(any::<u32>()),
            option::of(any::<u32>()),
            option::of(option::of(
                workload_spec().prop_filter_map("a health check", |s| s.health)
            )),
        )
            .prop_map(|(id, replicas, cpu_millicores, memory_mib, health)| {
                OperatorRequest::UpdateDeployment(wire::operator::request::UpdateDeployment {
                    id,
                    update: wire::operator::DeploymentUpdate {
                        replicas,
                        cpu_millicores,
                        memory_mib,
                        health,
                    },
                })
            }),
        Just(OperatorRequest::Backup(wire::operator::request::Backup)),
        Just(OperatorRequest::NodeVersion(
            wire::operator::request::NodeVersion
        )),
        (revoked_target(), short_string()).prop_map(|(target, reason)| {
            OperatorRequest::RevokeCertificate(wire::operator::request::RevokeCertificate {
                target,
                reason,
            })
        }),
        Just(OperatorRequest::ListRevocations(
            wire::operator::request::ListRevocations
        )),
    ]
    .boxed()
}

pub(crate) fn revoked_target() -> impl Strategy<Value = wire::revocation::RevokedTarget> {
    use wire::revocation::RevokedTarget;
    prop_oneof![
        short_string().prop_map(RevokedTarget::Serial),
        short_string().prop_map(RevokedTarget::Operator),
        short_string().prop_map(RevokedTarget::Agent),
    ]
}

pub(crate) fn operator_call() -> impl Strategy<Value = OperatorCall> {
    (option::of("[!-~]{1,16}"), operator_request()).prop_map(|(id, request)| OperatorCall {
        request_id: id.map(|id| RequestId::parse(&id).expect("printable ASCII")),
        request,
    })
}

fn members() -> impl Strategy<Value = Vec<(u64, String)>> {
    vec((any::<u64>(), short_string()), 0..3)
}

prop_compose! {
    pub fn node_status()(
        node_id in any::<u64>(),
        addr in short_string(),
        role in short_string(),
        term in any::<u64>(),
        leader_id in option::of(any::<u64>()),
        last_log_index in option::of(any::<u64>()),
        applied_index in option::of(any::<u64>()),
        last_change_pk in any::<u64>(),
        members in members(),
    ) -> NodeStatus {
        NodeStatus {
            node_id, addr, role, term, leader_id, last_log_index, applied_index,
            last_change_pk, members,
        }
    }
}

prop_compose! {
    pub fn deployment_view()(
        deployment in deployment(),
        instances in vec(instance(), 0..3),
        rejected in vec(apply_report(), 0..2),
    ) -> DeploymentView {
        DeploymentView { deployment, instances, rejected }
    }
}

/// Boxed: the union of every variant is too large for a test thread's
/// stack when built in place.
pub(crate) fn operator_response() -> BoxedStrategy<OperatorResponse> {
    prop_oneof![
        short_string().prop_map(|deployment_id| OperatorResponse::Created { deployment_id }),
        deployment_view().prop_map(OperatorResponse::Deployment),
        (vec(deployment(), 0..3), option::of(short_string()))
            .prop_map(|(items, next_after)| OperatorResponse::Deployments { items, next_after }),
        deployment().prop_map(OperatorResponse::Updated),
        members().prop_map(|members| OperatorResponse::Initialized { members }),
        node_status().prop_map(OperatorResponse::NodeStatus),
        short_string().prop_map(|sentinel_id| OperatorResponse::SentinelApplied { sentinel_id }),
        short_string().prop_map(|sentinel_id| OperatorResponse::SentinelStopped { sentinel_id }),
        sentinel_view().prop_map(OperatorResponse::Sentinel),
        short_string().prop_map(|policy_id| OperatorResponse::PolicyApplied { policy_id }),
        short_string().prop_map(|policy_id| OperatorResponse::PolicyDeleted { policy_id }),
        wire_error().prop_map(OperatorResponse::Error),
        region().prop_map(OperatorResponse::Region),
        region_list().prop_map(OperatorResponse::Regions),
        vec(
            (
                cilium_network_policy(),
                option::of(any::<u64>()),
                option::of(apply_report())
            )
                .prop_map(|(policy, applied_version, rejected)| PolicyView {
                    policy,
                    applied_version,
                    rejected,
                }),
            0..3
        )
        .prop_map(OperatorResponse::Policies),
        (any::<u64>(), any::<u64>(), vec(any::<u8>(), 0..64)).prop_map(
            |(offset, total_bytes, bytes)| {
                OperatorResponse::BackupChunk(wire::operator::BackupChunk {
                    offset,
                    total_bytes,
                    bytes,
                })
            }
        ),
        (any::<u64>(), "[0-9.]{1,12}", version_range()).prop_map(
            |(node_id, software, protocols)| {
                OperatorResponse::NodeVersion(wire::operator::NodeVersion {
                    node_id,
                    software,
                    protocols,
                })
            }
        ),
    ]
    .boxed()
}

// ---------------------------------------------------------------- hello

pub(crate) fn version_range() -> impl Strategy<Value = VersionRange> {
    prop_oneof![
        Just(hello::PROTOCOL_VERSIONS),
        (0u32..8, 0u32..8).prop_map(|(min, max)| VersionRange { min, max }),
        (any::<u32>(), any::<u32>()).prop_map(|(min, max)| VersionRange { min, max }),
    ]
}

pub(crate) fn hello() -> impl Strategy<Value = Hello> {
    prop_oneof![
        protocol().prop_map(Hello::new),
        (any::<[u8; 4]>(), version_range(), protocol()).prop_map(|(magic, versions, protocol)| {
            Hello {
                magic,
                versions,
                protocol,
            }
        }),
        (version_range(), protocol())
            .prop_map(|(versions, protocol)| Hello::offering(protocol, versions)),
    ]
}

pub(crate) fn legacy_hello() -> impl Strategy<Value = LegacyHello> {
    prop_oneof![
        (0u32..8, protocol()).prop_map(|(version, protocol)| LegacyHello::new(protocol, version)),
        (any::<[u8; 4]>(), any::<u32>(), protocol()).prop_map(|(magic, version, protocol)| {
            LegacyHello {
                magic,
                version,
                protocol,
            }
        }),
    ]
}

// ---------------------------------------------------------------- chunking

/// Sizes in which to split a byte stream: mostly tiny (so prefixes and
/// payloads are split everywhere), sometimes everything at once.
pub(crate) fn chunk_sizes() -> impl Strategy<Value = Vec<usize>> {
    vec(
        prop_oneof![4 => 1usize..8, 2 => 1usize..64, 1 => Just(usize::MAX)],
        1..8,
    )
}

/// Splits `bytes` into consecutive chunks of the given sizes, cycling
/// through them; every chunk is non-empty and the chunks cover `bytes`.
pub(crate) fn split<'a>(bytes: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    assert!(!sizes.is_empty() && sizes.iter().all(|&s| s > 0));
    let mut out = Vec::new();
    let mut rest = bytes;
    for &size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (chunk, tail) = rest.split_at(size.min(rest.len()));
        out.push(chunk);
        rest = tail;
    }
    out
}

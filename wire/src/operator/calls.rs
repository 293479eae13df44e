//! Each operator request's [`Call`]: its answer type, and how the request
//! and the answer convert to and from [`OperatorRequest`] and
//! [`OperatorResponse`]. An error answer ([`OperatorResponse::Error`]) is
//! no call's answer: callers turn it into their error first.

use super::request::*;
use super::{
    BackupChunk, DeliveryPage, DeploymentView, EndpointRemoved, EnvironmentView,
    LogStatus as LogStatusAnswer, Membership, NodeDiagnostics as NodeDiagnosticsAnswer,
    NodeStatus as NodeStatusAnswer, NodeVersion as NodeVersionAnswer, OperatorRequest,
    OperatorResponse, Page, PolicyView, RegionList, RolloutPlan, SentinelDeployed, SentinelView,
    StateHash as StateHashAnswer,
};
use crate::call::Call;
use crate::model::{Deployment, Environment, JournalEntry, Region};
use crate::notify::{AddEndpoint, Delivery, EndpointView};
use crate::revocation::Revocation;
use crate::rollout::{Rollout, RolloutSummary};

/// A [`Call`] of the operator protocol: what a client of ctrl can send.
pub trait Operation: Call<Request = OperatorRequest, Response = OperatorResponse> {}

impl<C: Call<Request = OperatorRequest, Response = OperatorResponse>> Operation for C {}

crate::calls! {
    OperatorRequest, OperatorResponse;
    CreateDeployment(CreateDeployment) -> String {
        OperatorResponse::Created { deployment_id } => deployment_id,
        |deployment_id| OperatorResponse::Created { deployment_id }
    };
    GetDeployment(GetDeployment) => Deployment(DeploymentView);
    ListDeployments(ListDeployments) -> Page<Deployment, String> {
        OperatorResponse::Deployments { items, next_after } => Page { items, next_after },
        |page| OperatorResponse::Deployments { items: page.items, next_after: page.next_after }
    };
    SetDesiredState(SetDesiredState) => Updated(Deployment);
    InitCluster(InitCluster) -> Vec<(u64, String)> {
        OperatorResponse::Initialized { members } => members,
        |members| OperatorResponse::Initialized { members }
    };
    NodeStatus(NodeStatus) => NodeStatus(NodeStatusAnswer);
    AddNode(AddNode) => MembershipChanged(Membership);
    RemoveNode(RemoveNode) => MembershipChanged(Membership);
    LogStatus(LogStatus) => LogStatus(LogStatusAnswer);
    StateHash(StateHash) => StateHash(StateHashAnswer);
    ApplySentinel(ApplySentinel) -> SentinelDeployed {
        OperatorResponse::SentinelDeployed { sentinel_id, version, status } =>
            SentinelDeployed { sentinel_id, version, status },
        |d| OperatorResponse::SentinelDeployed {
            sentinel_id: d.sentinel_id,
            version: d.version,
            status: d.status,
        }
    };
    StopSentinel(StopSentinel) -> String {
        OperatorResponse::SentinelStopped { sentinel_id } => sentinel_id,
        |sentinel_id| OperatorResponse::SentinelStopped { sentinel_id }
    };
    GetSentinel(GetSentinel) => Sentinel(SentinelView);
    ApplyPolicy(ApplyPolicy) -> String {
        OperatorResponse::PolicyApplied { policy_id } => policy_id,
        |policy_id| OperatorResponse::PolicyApplied { policy_id }
    };
    DeletePolicy(DeletePolicy) -> String {
        OperatorResponse::PolicyDeleted { policy_id } => policy_id,
        |policy_id| OperatorResponse::PolicyDeleted { policy_id }
    };
    WaitDeployment(WaitDeployment) => Deployment(DeploymentView);
    AddRegion(AddRegion) => Region(Region);
    SetRegionSchedulable(SetRegionSchedulable) => Region(Region);
    ListRegions(ListRegions) => Regions(RegionList);
    CancelDeployment(CancelDeployment) => Updated(Deployment);
    Rollback(Rollback) => Updated(Deployment);
    GetEnvironment(GetEnvironment) => Environment(Environment);
    History(History) -> Page<JournalEntry, u64> {
        OperatorResponse::History { entries, next_after } => Page { items: entries, next_after },
        |page| OperatorResponse::History { entries: page.items, next_after: page.next_after }
    };
    NodeDiagnostics(NodeDiagnostics) => NodeDiagnostics(NodeDiagnosticsAnswer);
    ListPolicies(ListPolicies) => Policies(Vec<PolicyView>);
    AddNotifyEndpoint(AddEndpoint) => NotifyEndpoint(EndpointView);
    RemoveNotifyEndpoint(RemoveNotifyEndpoint) -> EndpointRemoved {
        OperatorResponse::NotifyEndpointRemoved { name, deliveries_dead } =>
            EndpointRemoved { name, deliveries_dead },
        |r| OperatorResponse::NotifyEndpointRemoved { name: r.name, deliveries_dead: r.deliveries_dead }
    };
    ListNotifyEndpoints(ListNotifyEndpoints) => NotifyEndpoints(Vec<EndpointView>);
    ListDeliveries(ListDeliveries) => Deliveries(DeliveryPage);
    ReplayDelivery(ReplayDelivery) => DeliveryReplayed(Delivery);
    ListSentinels(ListSentinels) -> Page<SentinelView, (String, String)> {
        OperatorResponse::Sentinels { items, next_after } => Page { items, next_after },
        |page| OperatorResponse::Sentinels { items: page.items, next_after: page.next_after }
    };
    PlanRollout(PlanRollout) => RolloutPlan(RolloutPlan);
    StartRollout(StartRollout) -> Rollout {
        OperatorResponse::Rollout(Some(rollout)) => rollout,
        |rollout| OperatorResponse::Rollout(Some(rollout))
    };
    RolloutStatus(RolloutStatus) => Rollout(Option<Rollout>);
    ControlRollout(ControlRollout) -> Rollout {
        OperatorResponse::Rollout(Some(rollout)) => rollout,
        |rollout| OperatorResponse::Rollout(Some(rollout))
    };
    RolloutHistory(RolloutHistory) => Rollouts(Vec<RolloutSummary>);
    UpdateDeployment(UpdateDeployment) => Updated(Deployment);
    Backup(Backup) => BackupChunk(BackupChunk);
    NodeVersion(NodeVersion) => NodeVersion(NodeVersionAnswer);
    DescribeEnvironment(DescribeEnvironment) => EnvironmentView(EnvironmentView);
    ListEnvironments(ListEnvironments) -> Page<EnvironmentView, String> {
        OperatorResponse::Environments { items, next_after } => Page { items, next_after },
        |page| OperatorResponse::Environments { items: page.items, next_after: page.next_after }
    };
    WaitSentinel(WaitSentinel) => Sentinel(SentinelView);
    WaitRollout(WaitRollout) => Rollout(Option<Rollout>);
    RevokeCertificate(RevokeCertificate) => Revoked(Revocation);
    ListRevocations(ListRevocations) => Revocations(Vec<Revocation>);
}

//! Golden bytes of every `wire` type, under [`PROTOCOL_VERSION`]: the
//! requests, responses and events of the agent and operator protocols, the
//! hello, the errors, the resources, and a frame. A failure names the type
//! and says what to do; `GOLDEN_UPDATE=1` records new goldens but never
//! rewrites the bytes of a golden of the current version (see
//! `wire::golden`).

use wire::frame::{self, FRAME_BYTES_MAX};
use wire::golden::Goldens;
use wire::golden::fixtures::*;
use wire::hello::PROTOCOL_VERSION;

#[test]
fn wire_formats_match_their_goldens() {
    let mut g = Goldens::new(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden"),
        "PROTOCOL_VERSION",
        PROTOCOL_VERSION,
    );

    // model
    g.check("model.ResourceType", &resource_types());
    g.check("model.ResourceKey", &[resource_key()]);
    g.check("model.DesiredState", &desired_states());
    g.check("model.DeploymentStatus", &deployment_statuses());
    g.check("model.Deployment", &[deployment()]);
    g.check("model.DeploymentTopology", &[topology()]);
    g.check("model.Health", &healths());
    g.check("model.Sentinel", &[sentinel()]);
    g.check("model.CiliumNetworkPolicy", &[policy()]);
    g.check("model.Resource", &resources());
    g.check("model.InstanceStatus", &instance_statuses());
    g.check("model.Instance", &[instance()]);
    g.check("model.SentinelStatus", &[sentinel_status()]);
    g.check("model.ApplyOutcome", &apply_outcomes());
    g.check("model.ApplyReport", &[apply_report(), apply_rejected()]);
    g.check("model.RegionSource", &region_sources());
    g.check("model.FailedApply", &[failed_apply()]);
    g.check("model.Heartbeat", &[heartbeat()]);
    g.check("model.Region", &[region()]);
    g.check("model.StepRecord", &[step_record()]);
    g.check("model.ScheduledChange", &[scheduled_change()]);
    g.check("model.DeployWorkflow", &[deploy_workflow()]);
    g.check("model.Environment", &[environment()]);
    g.check("model.Actor", &actors());
    g.check("model.JournalEntry", &[journal_entry()]);
    g.check("model.SentinelDeployStatus", &sentinel_deploy_statuses());
    g.check("model.SentinelDeploy", &[sentinel_deploy()]);
    g.check("model.Route", &[route()]);
    g.check("model.RouteWeight", &route().backends);

    // rollouts
    g.check("rollout.RolloutState", &rollout_states());
    g.check("rollout.MemberState", &member_states());
    g.check("rollout.RolloutEventKind", &rollout_event_kinds());
    g.check("rollout.RolloutOptions", &[rollout_options()]);
    g.check("rollout.RolloutMember", &[rollout_member()]);
    g.check("rollout.RolloutEvent", &[rollout_event()]);
    g.check("rollout.Rollout", &[rollout()]);
    g.check("rollout.WaveCounts", &[wave_counts()]);
    g.check("rollout.RolloutSummary", &[rollout_summary()]);

    // workload settings
    g.check(
        "workload.WorkloadSpec",
        &[workload_spec(), workload_spec_plain()],
    );
    g.check("workload.HealthCheck", &[health_check()]);
    g.check("workload.Probe", &probes());
    g.check("workload.SecretValue", &secret_values());
    g.check("workload.SealedSecret", &[sealed_secret()]);

    // errors and the handshake
    g.check("error.ErrorCode", &error_codes());
    g.check("error.WireError", &[wire_error()]);
    g.check("hello.Protocol", &protocols());
    g.check("hello.Hello", &[hello()]);
    g.check("hello.VersionRange", &[version_range()]);
    g.check("hello.LegacyHello", &[legacy_hello()]);

    // the agent protocol
    g.check("agent.AgentRequest", &agent_requests());
    g.check("agent.WatchRequest", &[watch_request()]);
    g.check("agent.HeartbeatReport", &[heartbeat_report()]);
    g.check("agent.DeploymentReport", &deployment_reports());
    g.check("agent.AgentResponse", &agent_responses());
    g.check("agent.ResourceChange", &resource_changes());
    g.check("agent.WatchEvent", &watch_events());

    // the operator protocol
    g.check("operator.OperatorRequest", &operator_requests());
    g.check("operator.RequestId", &[request_id()]);
    g.check("operator.OperatorCall", &[operator_call()]);
    g.check("operator.Membership", &[membership()]);
    g.check("operator.LogStatus", &[log_status()]);
    g.check("operator.StateHash", &[state_hash()]);
    g.check("operator.NodeStatus", &[node_status()]);
    g.check("operator.NodeVersion", &[node_version()]);
    g.check("operator.EnvironmentView", &[environment_view()]);
    g.check("operator.RouteView", &environment_view().routes);
    g.check("operator.NodeDiagnostics", &[node_diagnostics()]);
    g.check("operator.CreateDeployment", &[create_deployment()]);
    g.check("operator.DeploymentUpdate", &[deployment_update()]);
    g.check("operator.ApplySentinel", &[apply_sentinel()]);
    g.check("operator.ApplyPolicy", &[apply_policy()]);
    g.check("operator.SentinelView", &[sentinel_view()]);
    g.check("operator.PolicyView", &[policy_view()]);
    g.check("operator.DeploymentView", &[deployment_view()]);
    g.check("operator.RegionView", &[region_view()]);
    g.check("operator.RegionList", &[region_list()]);
    g.check("operator.RolloutPlan", &[rollout_plan()]);
    g.check("operator.OperatorResponse", &operator_responses());
    g.check("operator.DeliveryPage", &[delivery_page()]);
    g.check("operator.BackupChunk", &[backup_chunk()]);

    // notifications
    g.check("notify.NotifyEndpoint", &[notify_endpoint()]);
    g.check("notify.EndpointView", &[endpoint_view()]);
    g.check("notify.AddEndpoint", &[add_endpoint()]);
    g.check("notify.NotifyEvent", &notify_events());
    g.check("notify.DeliveryState", &delivery_states());
    g.check("notify.Delivery", &[delivery()]);

    // revocations
    g.check("revocation.RevokedTarget", &revoked_targets());
    g.check("revocation.Revocation", &[revocation()]);

    // The framing: a length prefix, then the payload.
    let framed = frame::encode(&hello(), FRAME_BYTES_MAX).expect("a hello fits a frame");
    g.check_bytes(
        "frame.Hello",
        "a framed wire::hello::Hello",
        vec![("frame".into(), framed)],
    );

    g.assert_all();
}

#[test]
fn every_operator_request_has_a_name_of_its_own() {
    let mut by_variant = std::collections::BTreeMap::new();
    for request in operator_requests() {
        let variant = format!("{:?}", std::mem::discriminant(&request));
        by_variant.insert(variant, request.name());
    }
    let names: std::collections::BTreeSet<&str> = by_variant.values().copied().collect();
    assert_eq!(names.len(), by_variant.len(), "{by_variant:?}");
    for name in names {
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{name:?}"
        );
    }
}

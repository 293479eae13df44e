//! The agent protocol's unary calls: desired-state lookups (read from this
//! node's applied state), status reports and heartbeats (checked, then
//! proposed).
//! Whether the agent may act for the request's region is decided before,
//! by the server; watches are served by `server::watch`.

use storage::Mutation;
use storage::mutations;
use wire::agent::{
    AgentRequest, AgentResponse, DeploymentReport, HeartbeatReport, REPORT_INSTANCES_MAX,
};
use wire::model::FAILED_APPLY_ERROR_BYTES_MAX;
use wire::{ErrorCode, WireError};

use super::{Propose, ReadState, internal, propose_one};

/// Answers one unary agent call.
pub async fn answer<S: Propose + ReadState>(
    state: &S,
    request: AgentRequest,
) -> Result<AgentResponse, WireError> {
    let mutation = match request {
        AgentRequest::Watch(_) => {
            return Err(WireError::new(
                ErrorCode::Internal,
                "a watch reached the unary handler",
            ));
        }
        AgentRequest::GetDesiredDeployment {
            deployment_id,
            region,
        } => {
            let view = state.read().map_err(internal)?;
            let mut topology = view.topology(&deployment_id, &region).map_err(internal)?;
            if let Some(topology) = &mut topology {
                super::secrets::open_topology(state.keyring(), topology)?;
            }
            return Ok(AgentResponse::DesiredDeployment(topology));
        }
        AgentRequest::GetDesiredSentinel {
            sentinel_id,
            region,
        } => {
            let view = state.read().map_err(internal)?;
            let sentinel = view.sentinel(&sentinel_id, &region).map_err(internal)?;
            return Ok(AgentResponse::DesiredSentinel(sentinel));
        }
        AgentRequest::GetDesiredPolicy { policy_id, region } => {
            let view = state.read().map_err(internal)?;
            let policy = view.policy(&policy_id, &region).map_err(internal)?;
            return Ok(AgentResponse::DesiredPolicy(policy));
        }
        AgentRequest::ReportDeploymentStatus(report) => report_mutation(report)?,
        AgentRequest::ReportSentinelStatus(status) => Mutation::ReportSentinelStatus(status),
        AgentRequest::Heartbeat(report) => heartbeat_mutation(report)?,
        AgentRequest::ReportApply(report) => apply_mutation(report)?,
    };
    propose_one(state, mutation).await?;
    Ok(AgentResponse::Ack)
}

/// The mutation an apply report asks for; a rejection's texts are
/// bounded by [`FAILED_APPLY_ERROR_BYTES_MAX`].
fn apply_mutation(report: wire::model::ApplyReport) -> Result<Mutation, WireError> {
    if let wire::model::ApplyOutcome::Rejected { reason, field, .. } = &report.outcome
        && (reason.len() > FAILED_APPLY_ERROR_BYTES_MAX
            || field
                .as_ref()
                .is_some_and(|f| f.len() > FAILED_APPLY_ERROR_BYTES_MAX))
    {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!(
                "a rejection's reason and field are at most {FAILED_APPLY_ERROR_BYTES_MAX} bytes"
            ),
        ));
    }
    Ok(Mutation::ReportApply(report))
}

/// The mutation a heartbeat asks for, checked against its bounds before
/// proposing. Its time is apply's (the command's `now_ms`).
fn heartbeat_mutation(report: HeartbeatReport) -> Result<Mutation, WireError> {
    let (region, heartbeat) = report.into_heartbeat(0);
    heartbeat.validate()?;
    Ok(Mutation::RecordHeartbeat(mutations::RecordHeartbeat {
        region,
        heartbeat,
    }))
}

/// The mutation a deployment report asks for; a report of more than
/// [`REPORT_INSTANCES_MAX`] instances, or of an instance of another
/// deployment or region, is refused.
fn report_mutation(report: DeploymentReport) -> Result<Mutation, WireError> {
    match report {
        DeploymentReport::Instances {
            deployment_id,
            region,
            instances,
        } => {
            if instances.len() > REPORT_INSTANCES_MAX {
                return Err(WireError::new(
                    ErrorCode::BadRequest,
                    format!("a report may carry at most {REPORT_INSTANCES_MAX} instances"),
                ));
            }
            if let Some(stray) = instances
                .iter()
                .find(|i| i.deployment_id != deployment_id || i.region != region)
            {
                return Err(WireError::new(
                    ErrorCode::BadRequest,
                    format!(
                        "instance {} belongs to {}/{}, not to the reported {deployment_id}/{region}",
                        stray.pod_name, stray.deployment_id, stray.region
                    ),
                ));
            }
            Ok(Mutation::ReportInstances(mutations::ReportInstances {
                deployment_id,
                region,
                instances,
            }))
        }
        DeploymentReport::Deleted {
            deployment_id,
            region,
        } => Ok(Mutation::ReportDeploymentDeleted(
            mutations::ReportDeploymentDeleted {
                deployment_id,
                region,
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use wire::model::{Instance, InstanceStatus};

    use super::*;
    use crate::app::testing::MemoryNode;

    fn instance(deployment_id: &str, region: &str, pod: &str) -> Instance {
        Instance {
            deployment_id: deployment_id.into(),
            region: region.into(),
            pod_name: pod.into(),
            address: "10.0.0.1".into(),
            cpu_millicores: 100,
            memory_mib: 128,
            status: InstanceStatus::Running,
            reason: None,
            updated_at_ms: 3,
            updated: true,
        }
    }

    fn report(id: &str, region: &str, instances: Vec<Instance>) -> AgentRequest {
        AgentRequest::ReportDeploymentStatus(DeploymentReport::Instances {
            deployment_id: id.into(),
            region: region.into(),
            instances,
        })
    }

    #[tokio::test]
    async fn a_report_is_recorded_and_a_lookup_reads_the_desired_state() {
        let node = MemoryNode::new();
        let id = crate::app::deployments::testing::deployed(&node, &["us-east"]).await;
        let ack = answer(
            &node,
            report(&id, "us-east", vec![instance(&id, "us-east", "web-0")]),
        )
        .await
        .unwrap();
        assert_eq!(ack, AgentResponse::Ack);
        assert_eq!(node.read().unwrap().instances(&id).unwrap().len(), 1);
        let lookup = AgentRequest::GetDesiredDeployment {
            deployment_id: id.clone(),
            region: "us-east".into(),
        };
        match answer(&node, lookup).await.unwrap() {
            AgentResponse::DesiredDeployment(Some(t)) => assert_eq!(t.deployment_id, id),
            other => panic!("not the topology: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_report_with_a_stray_or_too_many_instances_is_refused_unproposed() {
        let node = MemoryNode::new();
        let stray = report(
            "dep_a",
            "us-east",
            vec![instance("dep_a", "eu-west", "web-0")],
        );
        let e = answer(&node, stray).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
        assert!(
            e.message.contains("belongs to dep_a/eu-west"),
            "{}",
            e.message
        );
        let many = (0..=REPORT_INSTANCES_MAX)
            .map(|i| instance("dep_a", "us-east", &format!("web-{i}")))
            .collect();
        let e = answer(&node, report("dep_a", "us-east", many))
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
        assert_eq!(node.proposals(), 0);
    }

    fn heartbeat(region: &str, cursor: u64) -> AgentRequest {
        AgentRequest::Heartbeat(HeartbeatReport {
            region: region.into(),
            agent_version: "0.1.0".into(),
            cursor,
            interval_ms: 30_000,
            applied_resources: 4,
            failed_applies: Vec::new(),
        })
    }

    #[tokio::test]
    async fn a_heartbeat_is_acknowledged_and_registers_its_region() {
        let node = MemoryNode::with_regions(&[]);
        assert_eq!(
            answer(&node, heartbeat("ap-south", 9)).await.unwrap(),
            AgentResponse::Ack
        );
        let region = node.read().unwrap().region("ap-south").unwrap().unwrap();
        let last = region.last_heartbeat.expect("recorded");
        assert_eq!((last.cursor, last.applied_resources), (9, 4));
        assert_eq!(last.at_ms, node.now_ms(), "stamped with the node's time");
    }

    #[tokio::test]
    async fn a_heartbeat_out_of_bounds_is_refused_unproposed() {
        let node = MemoryNode::new();
        let AgentRequest::Heartbeat(mut report) = heartbeat("us-east", 1) else {
            unreachable!()
        };
        report.interval_ms = 0;
        let e = answer(&node, AgentRequest::Heartbeat(report))
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
        assert_eq!(node.proposals(), 0);
    }

    #[tokio::test]
    async fn a_rejected_report_is_the_callers_error() {
        let node = MemoryNode::new();
        let unknown = report(
            "dep_x",
            "us-east",
            vec![instance("dep_x", "us-east", "web-0")],
        );
        let e = answer(&node, unknown).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
    }
}

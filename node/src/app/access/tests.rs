//! Every operator request kind under every role and scope, against one
//! table written here: a request kind the table does not name fails the
//! test, so a new kind cannot land without someone saying who may call
//! it.

use std::collections::BTreeMap;

use storage::Mutation;
use storage::mutations::CreateDeployment;
use wire::ErrorCode;
use wire::access::{Access, Grant, Role};
use wire::golden::fixtures;

use super::check;
use crate::app::testing::MemoryNode;
use crate::app::{Propose, ReadState};

/// Who may call a request kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    /// Every operator.
    Anyone,
    /// A deployer whose scope holds the environment, or an admin.
    DeployerInScope,
    /// An admin only.
    AdminOnly,
}

/// The table: every request kind by its name.
fn table() -> BTreeMap<&'static str, Who> {
    use Who::*;
    BTreeMap::from([
        ("create_deployment", DeployerInScope),
        ("get_deployment", Anyone),
        ("list_deployments", Anyone),
        ("set_desired_state", DeployerInScope),
        ("init_cluster", AdminOnly),
        ("node_status", Anyone),
        ("add_node", AdminOnly),
        ("remove_node", AdminOnly),
        ("log_status", Anyone),
        ("state_hash", Anyone),
        ("apply_sentinel", AdminOnly),
        ("stop_sentinel", AdminOnly),
        ("get_sentinel", Anyone),
        ("apply_policy", AdminOnly),
        ("delete_policy", AdminOnly),
        ("wait_deployment", Anyone),
        ("add_region", AdminOnly),
        ("set_region_schedulable", AdminOnly),
        ("list_regions", Anyone),
        ("cancel_deployment", DeployerInScope),
        ("rollback", DeployerInScope),
        ("get_environment", Anyone),
        ("history", Anyone),
        ("node_diagnostics", Anyone),
        ("list_policies", Anyone),
        ("add_notify_endpoint", AdminOnly),
        ("remove_notify_endpoint", AdminOnly),
        ("list_notify_endpoints", Anyone),
        ("list_deliveries", Anyone),
        ("replay_delivery", AdminOnly),
        ("list_sentinels", Anyone),
        ("plan_rollout", Anyone),
        ("start_rollout", AdminOnly),
        ("rollout_status", Anyone),
        ("control_rollout", AdminOnly),
        ("rollout_history", Anyone),
        ("update_deployment", DeployerInScope),
        ("backup", AdminOnly),
        ("node_version", Anyone),
        ("describe_environment", Anyone),
        ("list_environments", Anyone),
        ("wait_sentinel", Anyone),
        ("wait_rollout", Anyone),
        ("revoke_certificate", AdminOnly),
        ("list_revocations", Anyone),
    ])
}

/// The environment every deployment named by id lives in.
const ENVIRONMENT: &str = "prod-eu";

fn grant(name: &str, role: Role, environments: &[&str]) -> Grant {
    Grant {
        name: name.into(),
        role,
        environments: environments.iter().map(|e| e.to_string()).collect(),
    }
}

#[tokio::test]
async fn every_request_kind_under_every_role_and_scope_is_as_the_table_says() {
    let node = MemoryNode::with_regions(&["us-east"]);
    let requests = fixtures::operator_requests();
    // The deployments the requests name by id, in ENVIRONMENT.
    let mut create = crate::app::testing::create_request(&["us-east"]);
    create.environment_id = ENVIRONMENT.into();
    let settings = config::DeploySettings::default();
    let made = crate::app::deployments::create(&node, node.clock(), &settings, create)
        .await
        .expect("create");
    let made = node
        .read()
        .unwrap()
        .deployment(&made)
        .unwrap()
        .expect("created");
    for request in &requests {
        if let Access::Deployment(id) = request.access() {
            let deployment = wire::model::Deployment {
                id: id.to_string(),
                ..made.clone()
            };
            node.propose(vec![Mutation::CreateDeployment(CreateDeployment {
                deployment,
            })])
            .await
            .expect("create");
        }
    }
    let table = table();
    let mut seen = Vec::new();
    for request in &requests {
        let name = request.name();
        seen.push(name);
        let Some(&who) = table.get(name) else {
            panic!("request kind {name} is not in the table: say who may call it");
        };
        // The environment the request acts in, for the scopes.
        let environment = match request.access() {
            Access::Environment(e) => e.to_string(),
            _ => ENVIRONMENT.to_string(),
        };
        let prefix = format!("{}*", &environment[..2]);
        let cases = [
            (grant("vera", Role::Viewer, &[]), who == Who::Anyone),
            (grant("dora", Role::Deployer, &[]), who != Who::AdminOnly),
            (
                grant("dana", Role::Deployer, &["elsewhere", &prefix]),
                who != Who::AdminOnly,
            ),
            (
                grant("otto", Role::Deployer, &["elsewhere"]),
                who == Who::Anyone,
            ),
            (grant("ada", Role::Admin, &["elsewhere"]), true),
            (Grant::unnamed(), true),
        ];
        for (grant, allowed) in cases {
            let result = check(&node, &grant, request);
            match (allowed, result) {
                (true, Ok(())) => {}
                (false, Err(e)) => {
                    assert_eq!(e.code, ErrorCode::PermissionDenied, "{name}: {e}");
                    assert!(
                        e.message.contains(&grant.name)
                            && e.message.contains(grant.role.as_str())
                            && e.message.contains(name),
                        "{name}: the refusal names the operator, role and request: {e}"
                    );
                    if who == Who::DeployerInScope {
                        assert!(e.message.contains(&environment), "{name}: {e}");
                    }
                }
                (allowed, result) => panic!(
                    "{name} for {} ({}) {:?}: expected {}, got {result:?}",
                    grant.name,
                    grant.role.as_str(),
                    grant.environments,
                    if allowed { "allowed" } else { "refused" }
                ),
            }
        }
    }
    seen.sort_unstable();
    seen.dedup();
    let named: Vec<&str> = table.keys().copied().collect();
    assert_eq!(
        seen, named,
        "the table names exactly the request kinds there are"
    );
}

#[tokio::test]
async fn a_scoped_deployer_naming_an_unknown_deployment_is_told_it_is_not_found() {
    let node = MemoryNode::with_regions(&["us-east"]);
    let request = wire::operator::request::CancelDeployment {
        id: "dep_nowhere".into(),
    }
    .into();
    let scoped = grant("dana", Role::Deployer, &["prod-*"]);
    let e = check(&node, &scoped, &request).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    // Unscoped, it goes on to the handler's own NotFound.
    assert!(check(&node, &grant("dora", Role::Deployer, &[]), &request).is_ok());
}

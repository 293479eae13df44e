//! Region authorization by certificate: an agent watches and reports for
//! its own region only; an operator certificate cannot act as an agent;
//! an agent certificate cannot call operator commands. A refusal is a
//! permission error and carries no data. Named operators act within their
//! role and environment scope, and the journal names them.

use std::time::Duration;

use agent::ctrl::{CtrlClient, CtrlError};
use config::{AgentConfig, TlsFiles};
use integration::cluster::{TestNode, as_agent};
use integration::kit::wait::bounded;
use node::client::{Client, ClientError};
use wire::agent::{AgentRequest, AgentResponse, DeploymentReport, WatchEvent};
use wire::operator::CreateDeployment;
use wire::{ErrorCode, WireError};

const TEST_TIMEOUT: Duration = Duration::from_secs(30);

fn create(region: &str) -> CreateDeployment {
    integration::requests::deployment([region]).build()
}

/// Opens a watch of `region` with `client` and expects a permission error
/// as the only event.
async fn assert_watch_refused(client: &Client, region: &str) {
    let mut watch = client.watch(region, 0).await.expect("stream opened");
    match watch.next().await {
        Ok(Some(WatchEvent::Error(e))) => {
            assert_eq!(e.code, ErrorCode::PermissionDenied, "{e}");
        }
        other => panic!("expected a permission error and no data, got {other:?}"),
    }
    match watch.next().await {
        Ok(None) | Err(_) => {}
        Ok(Some(event)) => panic!("data after the refusal: {event:?}"),
    }
}

/// Expects `result` to be a permission error, and nothing else.
fn assert_refused(result: Result<AgentResponse, CtrlError>) -> WireError {
    match result {
        Err(CtrlError::Refused(e)) => {
            assert_eq!(e.code, ErrorCode::PermissionDenied, "{e}");
            e
        }
        other => panic!("expected a permission error and no data, got {other:?}"),
    }
}

/// A krane-side client of `node` for `region`, presenting the certificate
/// `cert` (`agent-REGION`, `operator`) of the node's certificate directory.
fn ctrl_client(node: &TestNode, region: &str, cert: &str) -> CtrlClient {
    let certs = node.dir.path().join("certs");
    let config = AgentConfig::new(
        region,
        vec![node.node.local_addr.into()],
        TlsFiles::in_dir(&certs, cert),
    );
    CtrlClient::new(&config).expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_and_lookups_are_refused_outside_the_agents_region() {
    bounded(TEST_TIMEOUT, async {
        let node = TestNode::start().await.unwrap();
        let operator = node.operator().unwrap();
        // One environment each, so that neither supersedes the other; the
        // workflow has started both (and then waits) before the checks.
        let deployment = |region: &str| {
            integration::requests::deployment([region])
                .environment(format!("env-{region}"))
                .build()
        };
        let (west, _) = operator.deploy(deployment("eu-west")).await.unwrap();
        let (east, _) = operator.deploy(deployment("us-east")).await.unwrap();
        let deleted = |id: &str, region: &str| {
            AgentRequest::ReportDeploymentStatus(DeploymentReport::Deleted {
                deployment_id: id.into(),
                region: region.into(),
            })
        };
        let lookup = |id: &str, region: &str| AgentRequest::GetDesiredDeployment {
            deployment_id: id.into(),
            region: region.into(),
        };

        let applied = || node.node.state.raft.metrics().borrow().last_applied;
        // The answer to a create can arrive before Raft's metrics count
        // its apply: wait until they show every entry applied.
        node.node
            .state
            .raft
            .wait(Some(Duration::from_secs(5)))
            .metrics(
                |m| m.last_applied.map(|id| id.index) == m.last_log_index,
                "every entry applied",
            )
            .await
            .unwrap();
        let applied_before = applied();

        // The us-east agent, speaking for eu-west: refused, no data.
        let east_agent = ctrl_client(&node, "us-east", "agent-us-east");
        let e = assert_refused(east_agent.call(&deleted(&west, "eu-west")).await);
        assert!(e.message.contains("eu-west"), "{e}");
        assert_refused(east_agent.call(&lookup(&west, "eu-west")).await);
        // The operator certificate on the agent protocol: refused too.
        let as_operator = ctrl_client(&node, "us-east", "operator");
        assert_refused(as_operator.call(&deleted(&east, "us-east")).await);
        assert_refused(as_operator.call(&lookup(&east, "us-east")).await);

        // No refused report was proposed: nothing was applied since.
        assert_eq!(applied(), applied_before, "a refused report was written");
        // The us-east agent's own lookup works.
        match east_agent.call(&lookup(&east, "us-east")).await {
            Ok(AgentResponse::DesiredDeployment(Some(t))) => assert_eq!(t.deployment_id, east),
            other => panic!("own region's lookup failed: {other:?}"),
        }
        node.node.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_act_only_within_their_role_and_region() {
    bounded(TEST_TIMEOUT, scenario()).await;
}

async fn scenario() {
    let node = TestNode::start().await.unwrap();
    let operator = node.client().unwrap();
    operator.call(create("us-east")).await.unwrap();

    // An operator certificate cannot watch as an agent.
    assert_watch_refused(&operator, "us-east").await;

    // An agent watches its own region, and no other.
    let east = Client::new(&as_agent(&node.operator, "us-east")).unwrap();
    let mut own = east.watch("us-east", 0).await.unwrap();
    assert!(matches!(
        own.next().await.unwrap(),
        Some(WatchEvent::SyncStart { .. })
    ));
    assert_watch_refused(&east, "eu-west").await;

    // An agent certificate cannot call operator commands.
    match east.call(create("us-east")).await {
        Err(ClientError::Server(e)) => assert_eq!(e.code, ErrorCode::PermissionDenied, "{e}"),
        other => panic!("expected a permission error, got {other:?}"),
    }
    node.node.shutdown().await;
}

/// An operator client of `node` presenting the named operator
/// certificate issued for `grant` from the node's CA.
fn named(node: &TestNode, grant: &wire::access::Grant) -> Client {
    let certs = node.dir.path().join("certs");
    transport::certs::issue_named_operator(&certs, grant).expect("issued");
    let config = config::OperatorConfig {
        tls: TlsFiles::in_dir(&certs, &format!("operator-{}", grant.name)),
        ..node.operator.clone()
    };
    Client::new(&config).expect("client")
}

/// The permission error of `result`, and nothing else.
fn denied<T: std::fmt::Debug>(result: Result<T, ClientError>) -> WireError {
    match result {
        Err(ClientError::Server(e)) if e.code == ErrorCode::PermissionDenied => e,
        other => panic!("expected a permission error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_operators_act_within_their_role_and_scope_and_are_journaled_by_name() {
    use wire::access::{Grant, Role};
    use wire::operator::request::{AddRegion, CancelDeployment, History, ListDeployments};
    bounded(TEST_TIMEOUT, async {
        let node = TestNode::start().await.unwrap();
        let alice = named(
            &node,
            &Grant {
                name: "alice".into(),
                role: Role::Deployer,
                environments: vec!["staging-*".into()],
            },
        );
        let vera = named(
            &node,
            &Grant {
                name: "vera".into(),
                role: Role::Viewer,
                environments: Vec::new(),
            },
        );
        let in_scope = integration::requests::deployment(["us-east"])
            .owner("ws", "proj", "staging-eu")
            .build();
        let made = alice.call(in_scope).await.expect("a deploy in scope");
        let out_of_scope = integration::requests::deployment(["us-east"])
            .owner("ws", "proj", "prod")
            .build();
        let e = denied(alice.call(out_of_scope).await);
        assert_eq!(
            e.message,
            "operator alice (deployer) may not create_deployment in environment prod: outside its scope staging-*"
        );
        let e = denied(
            alice
                .call(AddRegion {
                    name: "ap-south".into(),
                })
                .await,
        );
        assert!(e.message.contains("needs the admin role"), "{e}");
        // A viewer reads everything and changes nothing.
        let page = vera
            .call(ListDeployments {
                after: None,
                limit: 10,
            })
            .await
            .expect("a viewer lists");
        assert_eq!(page.items.len(), 1, "nothing was written by the refusals");
        let e = denied(
            vera.call(CancelDeployment {
                id: made.clone(),
            })
            .await,
        );
        assert_eq!(
            e.message,
            "operator vera (viewer) may not cancel_deployment in environment staging-eu: a viewer only reads"
        );
        // A viewer's debug bundle carries no node configuration.
        let diagnostics = vera
            .call(wire::operator::request::NodeDiagnostics)
            .await
            .expect("a viewer reads diagnostics");
        assert_eq!(
            diagnostics.config_toml,
            node::server::operator::CONFIG_WITHHELD
        );
        assert!(!diagnostics.metrics.is_empty());
        // The journal names who created it.
        let history = vera
            .call(History {
                environment_id: None,
                deployment_id: Some(made.clone()),
                after: 0,
                limit: 10,
            })
            .await
            .unwrap();
        let created = history.items.first().expect("a creation entry");
        assert_eq!(
            created.actor,
            wire::model::Actor::Operator("ctrl://operator/alice/deployer".into())
        );
        // The unnamed certificate is an admin.
        node.client()
            .unwrap()
            .call(AddRegion {
                name: "ap-south".into(),
            })
            .await
            .expect("the unnamed operator is an admin");
        node.node.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_naming_an_unknown_role_or_a_bad_scope_is_refused_naming_the_field() {
    bounded(TEST_TIMEOUT, async {
        let node = TestNode::start().await.unwrap();
        let certs = node.dir.path().join("certs");
        for (stem, uri, field) in [
            ("operator-eve", "ctrl://operator/eve/superuser", "superuser"),
            ("operator-mal", "ctrl://operator/mal/deployer/PROD", "PROD"),
        ] {
            transport::certs::issue_unchecked_uri(
                &certs,
                &transport::certs::CertBundle::in_dir(&certs, stem),
                uri,
            )
            .expect("issued");
            let config = config::OperatorConfig {
                tls: TlsFiles::in_dir(&certs, stem),
                ..node.operator.clone()
            };
            let client = Client::new(&config).expect("client");
            let error = client
                .call(wire::operator::request::ListRegions)
                .await
                .expect_err("refused")
                .to_string();
            assert!(
                error.contains("this certificate is refused") && error.contains(field),
                "{uri}: {error}"
            );
        }
        node.node.shutdown().await;
    })
    .await;
}

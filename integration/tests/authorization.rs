//! Region authorization by certificate: an agent watches and reports for
//! its own region only; an operator certificate cannot act as an agent;
//! an agent certificate cannot call operator commands. A refusal is a
//! permission error and carries no data.

use std::collections::BTreeMap;
use std::time::Duration;

use integration::cluster::{TestNode, as_agent};
use node::client::{Client, ClientError};
use wire::ErrorCode;
use wire::agent::WatchEvent;
use wire::operator::{CreateDeployment, OperatorRequest, OperatorResponse};

const TEST_TIMEOUT: Duration = Duration::from_secs(30);

fn create(region: &str) -> OperatorRequest {
    OperatorRequest::CreateDeployment(CreateDeployment {
        workspace_id: "ws".into(),
        project_id: "proj".into(),
        environment_id: "env".into(),
        image: "nginx:1.27".into(),
        cpu_millicores: 100,
        memory_mib: 128,
        replicas: 1,
        regions: vec![region.into()],
        env_vars: BTreeMap::new(),
    })
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_act_only_within_their_role_and_region() {
    tokio::time::timeout(TEST_TIMEOUT, scenario())
        .await
        .expect("test timed out");
}

async fn scenario() {
    let node = TestNode::start().await.unwrap();
    let operator = node.client().unwrap();
    assert!(matches!(
        operator.call(&create("us-east")).await.unwrap(),
        OperatorResponse::Created { .. }
    ));

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
    match east.call(&create("us-east")).await {
        Err(ClientError::Server(e)) => assert_eq!(e.code, ErrorCode::PermissionDenied, "{e}"),
        other => panic!("expected a permission error, got {other:?}"),
    }
    node.node.shutdown().await;
}

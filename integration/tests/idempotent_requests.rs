//! Idempotent operator requests with real nodes: a create whose answer is
//! lost (the node's replies to the client are dropped by its relay after
//! it served the request) is sent again by the client, with the same
//! request id, to another node, which answers with the first deployment —
//! exactly one exists. Without an id the client does not resend (the
//! create was applied all the same, which is why it must not). And the
//! `ctrl` CLI run twice with the same `--request-id` prints the same
//! deployment id, with one deployment.

use std::collections::BTreeSet;
use std::time::Duration;

use config::ConfigFile;
use integration::cluster::{TestCluster, TestNode};
use integration::kit::ctrl;
use integration::kit::wait::{bounded, wait_until, within};
use node::client::{Client, ClientError};
use wire::operator::CreateDeployment;
use wire::operator::request::{ListDeployments, NodeStatus};

/// Bound on each test.
const TEST_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on one call, a lost answer and its retry included (a lost answer
/// is noticed by the QUIC idle timeout, 0.8 s, within the 5 s per try).
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

fn create() -> CreateDeployment {
    integration::requests::deployment(["us-east"]).build()
}

async fn deployment_ids(client: &Client) -> BTreeSet<String> {
    let list = ListDeployments {
        after: None,
        limit: 100,
    };
    let page = client.call(list).await.expect("list");
    page.items.into_iter().map(|d| d.id).collect()
}

/// A client that reaches node 1 through its relay first (so its replies
/// can be dropped), then the others directly; connected to node 1.
async fn client_through_relay(cluster: &TestCluster, others: bool) -> Client {
    let mut operator = cluster.operator.clone();
    operator.endpoints[0] = cluster.relays[0].addr;
    if !others {
        operator.endpoints.truncate(1);
    }
    let client = Client::new(&operator).expect("client");
    let status = client.call(NodeStatus).await.expect("status");
    assert_eq!(status.node_id, 1);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_is_lost_is_retried_and_applied_once() {
    bounded(TEST_TIMEOUT, async {
        let cluster = TestCluster::start_with_relays(3, |_| {}).await.unwrap();
        let observer = cluster.client().unwrap();

        // With a request id (`call` makes one): node 1 serves the create,
        // its answer is dropped, the client sends it again to node 2.
        let client = client_through_relay(&cluster, true).await;
        cluster.faults.drop_client_replies(1, 0);
        let deployment_id = within(
            CALL_TIMEOUT,
            "the create and its retry",
            client.call(create()),
        )
        .await
        .expect("answered after the retry");
        assert_eq!(
            deployment_ids(&observer).await,
            BTreeSet::from([deployment_id.clone()]),
            "exactly the one deployment"
        );

        // Without an id: the answer is lost and the client must not send
        // the create again, because it was applied.
        cluster.faults.heal();
        let client = client_through_relay(&cluster, false).await;
        cluster.faults.drop_client_replies(1, 0);
        let lost = within(
            CALL_TIMEOUT,
            "the create without an id",
            client.call_with_id(create(), None),
        )
        .await;
        assert!(matches!(lost, Err(ClientError::AnswerLost(_))), "{lost:?}");
        let ids = wait_until(
            tokio::time::Instant::now() + CALL_TIMEOUT,
            "the second create applied",
            async || {
                let ids = deployment_ids(&observer).await;
                if ids.len() == 2 { Ok(ids) } else { Err(ids) }
            },
        )
        .await
        .expect("applied though its answer was lost");
        assert!(ids.contains(&deployment_id), "{ids:?}");
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_with_the_same_request_id_twice_creates_one_deployment() {
    bounded(TEST_TIMEOUT, async {
        let node = TestNode::start().await.unwrap();
        let path = node.dir.path().join("operator.toml");
        std::fs::write(&path, node.operator.to_toml_string()).unwrap();
        let ctrl = ctrl::with_config(&path).await.unwrap();
        let deploy = |request_id: &'static str| {
            let ctrl = ctrl.clone();
            async move {
                ctrl.ok(&[
                    "deploy",
                    "--image",
                    "nginx:1.27",
                    "--regions",
                    "us-east",
                    "--request-id",
                    request_id,
                ])
                .await
                .expect("ctrl deploy")
                .trim()
                .to_string()
            }
        };
        let first = deploy("cli-retry-1").await;
        assert!(first.starts_with("dep_"), "{first}");
        assert_eq!(deploy("cli-retry-1").await, first, "the first answer");
        let client = node.client().unwrap();
        assert_eq!(
            deployment_ids(&client).await,
            BTreeSet::from([first.clone()])
        );

        // The same id for another request is refused, naming the conflict.
        let other = ctrl
            .run(&[
                "deploy",
                "--image",
                "nginx:1.28",
                "--regions",
                "us-east",
                "--request-id",
                "cli-retry-1",
            ])
            .await
            .unwrap();
        assert!(!other.status.success());
        let stderr = String::from_utf8_lossy(&other.stderr);
        assert!(stderr.contains("conflict"), "{stderr}");
        // An invalid id is refused before anything is sent.
        let bad = ctrl
            .run(&["stop", &first, "--request-id", "has space"])
            .await
            .unwrap();
        assert!(!bad.status.success());
        assert!(
            String::from_utf8_lossy(&bad.stderr).contains("printable"),
            "{}",
            String::from_utf8_lossy(&bad.stderr)
        );
        // Another id, another deployment.
        assert_ne!(deploy("cli-retry-2").await, first);
        assert_eq!(deployment_ids(&client).await.len(), 2);
    })
    .await;
}

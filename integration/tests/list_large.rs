//! Replies bounded by bytes: with 10,000 deployments, `ctrl list
//! deployments` (the real binary) reads every one, page by page, each page
//! cut to fit one frame.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use integration::cluster::TestNode;
use integration::kit::wait::bounded;
use wire::operator::OperatorRequest;

const TEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Deployments created.
const DEPLOYMENTS: usize = 10_000;
/// Creates in flight at once (group commit shares Raft entries).
const CREATES_IN_FLIGHT: usize = 256;
/// Bytes of an environment value each deployment carries: the CLI's page
/// of 500 deployments is then over 1 MiB, more than one frame, so only
/// pages cut by bytes can answer it.
const PAYLOAD_BYTES: usize = 2_500;
/// How long the listing may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_deployments_are_listed_by_the_cli() {
    bounded(TEST_TIMEOUT, async {
        let node = TestNode::start().await.unwrap();
        let state = node.node.state.clone();
        let settings = state.deploy.clone();
        // Straight into the node's application layer: no stream per create.
        let results: Vec<_> = futures::stream::iter(0..DEPLOYMENTS)
            .map(|_| {
                let state = state.clone();
                let settings = settings.clone();
                async move {
                    let create = integration::requests::deployment(["us-east"])
                        .own_environment()
                        .env_var("PAYLOAD", "x".repeat(PAYLOAD_BYTES))
                        .build();
                    node::app::requests::apply(
                        state.as_ref(),
                        state.clock.as_ref(),
                        &settings,
                        OperatorRequest::CreateDeployment(create),
                    )
                    .await
                }
            })
            .buffer_unordered(CREATES_IN_FLIGHT)
            .collect()
            .await;
        let failed: Vec<_> = results.iter().filter(|r| r.is_err()).collect();
        assert!(
            failed.is_empty(),
            "{} creates failed: {:?}",
            failed.len(),
            failed.first()
        );

        let operator_path = node.dir.path().join("operator.toml");
        std::fs::write(
            &operator_path,
            config::ConfigFile::to_toml_string(&node.operator),
        )
        .unwrap();
        let ctrl = integration::kit::ctrl::with_config(&operator_path)
            .await
            .unwrap()
            .timeout(LIST_TIMEOUT);
        let out = ctrl
            .ok(&["list", "deployments", "-o", "json"])
            .await
            .unwrap();
        let listed: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
        let ids: BTreeSet<&str> = listed
            .iter()
            .map(|d| d["id"].as_str().expect("an id"))
            .collect();
        assert_eq!(listed.len(), DEPLOYMENTS);
        assert_eq!(ids.len(), DEPLOYMENTS, "every deployment once");
        // The text table too.
        let table = ctrl.ok(&["list", "deployments"]).await.unwrap();
        assert_eq!(
            table.lines().count(),
            DEPLOYMENTS + 1,
            "a header and a line each"
        );
    })
    .await;
}

//! `WaitDeployment`, the long poll behind `ctrl deploy --wait`: the node
//! answers at once when the caller's view is out of date, when an agent's
//! report changes the deployment during the wait, or with the unchanged
//! view once the wait is over; bad waits and unknown ids are refused.

use std::time::{Duration, Instant};

use agent::ctrl::CtrlClient;
use config::{AgentConfig, TlsFiles};
use integration::cluster::TestNode;
use integration::kit::wait::bounded;
use node::client::ClientError;
use node::wait::{WaitError, changed};
use wire::ErrorCode;
use wire::agent::{AgentRequest, DeploymentReport};
use wire::model::{Instance, InstanceStatus};
use wire::operator::DEPLOYMENT_WAIT_MS_MAX;

const TEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A wait the test expects a change to cut short: an answer that took
/// this long means the node did not notice the change. Below the client's
/// call timeout (5 s by default).
const LONG_WAIT_MS: u64 = 4_000;
/// A wait the test lets run out.
const SHORT_WAIT_MS: u64 = 200;

fn running(id: &str, pod: &str) -> Instance {
    Instance {
        deployment_id: id.to_string(),
        region: "us-east".to_string(),
        pod_name: pod.to_string(),
        address: "10.0.0.7".to_string(),
        cpu_millicores: 100,
        memory_mib: 128,
        status: InstanceStatus::Running,
        reason: None,
        updated_at_ms: 1,
        updated: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_ends_with_a_change_or_with_its_time() {
    bounded(TEST_TIMEOUT, async {
        let node = TestNode::start().await.unwrap();
        let kit = node.operator().unwrap();
        let operator = kit.client();
        // Started by the workflow, which then waits for instances: the
        // deployment changes only when the test changes it.
        let (id, _) = kit
            .deploy(integration::requests::deployment(["us-east"]).build())
            .await
            .unwrap();
        let view = kit.deployment(&id).await.unwrap();

        // An out-of-date view is answered at once.
        let started = Instant::now();
        let fresh = changed(operator, &id, view.digest() ^ 1, LONG_WAIT_MS)
            .await
            .unwrap();
        assert_eq!(fresh, view);
        assert!(
            started.elapsed() < Duration::from_millis(LONG_WAIT_MS),
            "waited although the view was out of date"
        );

        // Nothing changes: the view comes back as it was, after the wait.
        let started = Instant::now();
        let same = changed(operator, &id, view.digest(), SHORT_WAIT_MS)
            .await
            .unwrap();
        assert_eq!(same, view);
        assert!(
            started.elapsed() >= Duration::from_millis(SHORT_WAIT_MS),
            "answered before the wait was over with nothing changed"
        );

        // The agent reports a running pod during a long wait: the wait
        // ends with the report in the view.
        let certs = node.dir.path().join("certs");
        let agent = CtrlClient::new(&AgentConfig::new(
            "us-east",
            vec![node.node.local_addr.into()],
            TlsFiles::in_dir(&certs, "agent-us-east"),
        ))
        .unwrap();
        let started = Instant::now();
        let waiting = {
            let (operator, id, seen) = (node.client().unwrap(), id.clone(), view.digest());
            tokio::spawn(async move { changed(&operator, &id, seen, LONG_WAIT_MS).await })
        };
        let report = AgentRequest::ReportDeploymentStatus(DeploymentReport::Instances {
            deployment_id: id.clone(),
            region: "us-east".to_string(),
            instances: vec![running(&id, "web-0")],
        });
        agent.call(&report).await.unwrap();
        let after_report = waiting.await.unwrap().unwrap();
        assert_eq!(after_report.instances, vec![running(&id, "web-0")]);
        assert_ne!(after_report.digest(), view.digest());
        assert!(
            started.elapsed() < Duration::from_millis(LONG_WAIT_MS),
            "the report did not end the wait"
        );

        // Waits out of bounds and unknown deployments are refused.
        for wait_ms in [0, DEPLOYMENT_WAIT_MS_MAX + 1] {
            match changed(operator, &id, 0, wait_ms).await {
                Err(WaitError::Client(ClientError::Server(e))) => {
                    assert_eq!(e.code, ErrorCode::BadRequest, "{e}")
                }
                other => panic!("wait_ms {wait_ms} accepted: {other:?}"),
            }
        }
        match changed(operator, "dep_unknown", 0, SHORT_WAIT_MS).await {
            Err(WaitError::Client(ClientError::Server(e))) => {
                assert_eq!(e.code, ErrorCode::NotFound, "{e}")
            }
            other => panic!("an unknown deployment answered: {other:?}"),
        }
        node.node.shutdown().await;
    })
    .await;
}

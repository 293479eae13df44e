//! Regions end to end, over real sockets: a ctrl node, a Kubernetes API
//! simulator and its krane (started by [`integration::fleet`], the region
//! not registered by the operator).
//!
//! - krane's first heartbeat registers its region; `list regions` shows
//!   its version and, once it has applied a deployment, its cursor at the
//!   cluster's last pk (lag 0), fresh.
//! - A cordoned region refuses a deploy naming it (naming the region,
//!   writing nothing); uncordoned, the same deploy goes through.
//! - `ctrl list regions -o json` prints the answer's serde form.

use std::time::Duration;

use integration::fleet::{Fleet, FleetConfig};
use integration::kit::operator::Operator;
use integration::kit::wait::{bounded, wait_until};
use node::client::ClientError;
use tokio::time::Instant;
use wire::ErrorCode;
use wire::model::RegionSource;
use wire::operator::request::ListDeployments;
use wire::operator::{RegionList, RegionView};

/// Bound on the whole test.
const TEST_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on one wait for a heartbeat to show.
const WAIT: Duration = Duration::from_secs(20);
/// Bound on `Operator::ready`, in seconds.
const READY_TIMEOUT_S: u64 = 30;
/// krane's heartbeat interval here: short, so the waits are short.
const HEARTBEAT_INTERVAL_MS: u64 = 200;
const REGION: &str = "us-east";

/// The region's row once `check` holds of it (bounded), read again after
/// each miss: heartbeats are writes with no call to wait on.
async fn region_when(
    operator: &Operator,
    what: &str,
    check: impl Fn(&RegionView, &RegionList) -> bool,
) -> RegionView {
    wait_until(Instant::now() + WAIT, what, async || {
        let list = operator.regions().await.map_err(|e| e.to_string())?;
        match list.regions.iter().find(|r| r.region.name == REGION) {
            Some(view) if check(view, &list) => Ok(view.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_register_the_region_and_cordon_refuses_deploys() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = FleetConfig::new(dir.path(), vec![REGION.to_string()]);
        config.register_regions = false;
        config.heartbeat_interval_ms = HEARTBEAT_INTERVAL_MS;
        let fleet = Fleet::start(config).await.expect("fleet starts");
        let operator = fleet.operator().expect("operator");

        // The first heartbeat registers the region.
        let registered = region_when(&operator, "krane's first heartbeat", |view, _| {
            view.region.last_heartbeat.is_some()
        })
        .await;
        assert_eq!(registered.region.registered_by, RegionSource::Heartbeat);
        assert!(registered.region.schedulable);
        let heartbeat = registered.region.last_heartbeat.as_ref().unwrap();
        assert_eq!(heartbeat.agent_version, env!("CARGO_PKG_VERSION"));
        assert_eq!(heartbeat.interval_ms, HEARTBEAT_INTERVAL_MS);
        assert!(heartbeat.failed_applies.is_empty());

        // A deployment applied: the cursor reaches the cluster's last pk.
        let create = || integration::requests::deployment([REGION]).build();
        let id = operator.create(create()).await.expect("create");
        operator
            .ready(&id, READY_TIMEOUT_S)
            .await
            .unwrap_or_else(|e| panic!("{id} not ready: {e}"));
        let caught_up = region_when(&operator, "the cursor at the last pk", |view, list| {
            view.lag == Some(0)
                && view.region.last_heartbeat.as_ref().unwrap().cursor == list.last_pk
        })
        .await;
        let heartbeat = caught_up.region.last_heartbeat.as_ref().unwrap();
        assert!(heartbeat.cursor > 0);
        assert_eq!(
            heartbeat.applied_resources, 4,
            "the topology, the environment's sentinel, the deployment's two policies"
        );
        assert!(!caught_up.stale, "{caught_up:?}");
        assert!(caught_up.heartbeat_age_ms.is_some());

        // Cordoned: a deploy naming the region is refused and writes nothing.
        let cordoned = operator
            .set_region_schedulable(REGION, false)
            .await
            .expect("cordon");
        assert!(!cordoned.schedulable);
        let deployments_before = operator
            .call(ListDeployments {
                after: None,
                limit: 100,
            })
            .await
            .expect("list");
        let answer = operator
            .call(integration::requests::deployment([REGION]).build())
            .await;
        match answer {
            Err(ClientError::Server(e)) => {
                assert_eq!(e.code, ErrorCode::BadRequest, "{e}");
                assert!(
                    e.message.contains(&format!("{REGION:?} is cordoned")),
                    "{e}"
                );
            }
            other => panic!("a deploy to a cordoned region: {other:?}"),
        }
        let deployments_after = operator
            .call(ListDeployments {
                after: None,
                limit: 100,
            })
            .await
            .expect("list");
        assert_eq!(deployments_after, deployments_before, "nothing written");

        // Uncordoned: the same deploy goes through.
        operator
            .set_region_schedulable(REGION, true)
            .await
            .expect("uncordon");
        let second = operator.create(create()).await.expect("uncordoned");
        assert_ne!(second, id);

        // The CLI prints the answer's serde form.
        let ctrl = integration::kit::ctrl::with_config(&fleet.operator_path)
            .await
            .expect("ctrl");
        let json = ctrl
            .ok(&["list", "regions", "-o", "json"])
            .await
            .expect("ctrl list regions");
        let list: RegionList = serde_json::from_str(&json).expect("the answer's JSON");
        assert_eq!(list.regions.len(), 1, "{list:?}");
        assert_eq!(list.regions[0].region.name, REGION);
        let table = ctrl.ok(&["list", "regions"]).await.expect("table");
        assert!(table.starts_with("REGION"), "{table}");
        assert!(table.contains(env!("CARGO_PKG_VERSION")), "{table}");
    })
    .await;
}

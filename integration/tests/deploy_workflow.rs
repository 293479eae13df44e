//! The deploy workflow on a site (ctrl, two simulated clusters, a krane
//! each — what the sandbox runs), through the operator's own tools:
//!
//! - an image the clusters cannot start: `ctrl deploy --wait` exits 1
//!   within the fail-fast time with the reason, the deployment is
//!   `failed`, its objects are gone from both clusters, the environment's
//!   live deployment is unchanged, and `ctrl status` lists the failure;
//! - rollback: v1 live, v2 live (v1 still running in its grace period),
//!   rollback → v1 live again at once (it runs: no new rollout) with its
//!   objects running; rollback to a failed deployment, or to the live one,
//!   refused;
//! - two first deploys of a new environment at once: one sentinel per
//!   region;
//! - an object krane does not manage holding the name of a deploy's
//!   object (the environment's sentinel Service): the deploy fails at once
//!   naming it, the object is left alone, and the region is not held (the
//!   next deploy elsewhere runs);
//! - every hopeless pod state (unschedulable, a container that cannot be
//!   configured, named, pulled or run, a crash loop of OOM kills) fails
//!   its deploy within the fail-fast time, with Kubernetes' reason in the
//!   deploy's error.

use std::time::Duration;

use config::NodeConfig;
use integration::fleet::{Fleet, FleetConfig, Region};
use integration::kit::operator::Operator;
use integration::kit::wait::bounded;
use k8s_sim::controller::PodFault;
use k8s_sim::resources::{CILIUM_NETWORK_POLICIES, SERVICES, STATEFUL_SETS};
use k8s_sim::{View, pod_ready};
use node::client::ClientError;
use tokio::time::Instant;
use wire::ErrorCode;
use wire::model::{DeploymentStatus, Resource};
use wire::operator::request::ListPolicies;
use wire::operator::{CreateDeployment, DeploymentView};

const TEST_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on one wait for a condition.
const WAIT: Duration = Duration::from_secs(30);
const READY_TIMEOUT_S: u64 = 30;
const REGIONS: [&str; 2] = ["us-east", "eu-west"];
const NAMESPACE: &str = "krane";
/// An image the simulated clusters never start (`ImagePullBackOff`).
const BROKEN_IMAGE: &str = "registry.invalid/broken:1";
/// The fail-fast time of these sites: short, so the test is quick.
const FAIL_FAST_MS: u64 = 1_500;
/// Slack on top of the fail-fast time for `ctrl deploy --wait` to exit:
/// pods failing, the reports, the decision, the answer.
const FAIL_FAST_SLACK: Duration = Duration::from_secs(10);
/// The CLI's exit code for a failed, cancelled or superseded deploy.
const EXIT_FAILED: i32 = 1;

fn configure(config: &mut NodeConfig) {
    config.deploy.fail_fast_ms = FAIL_FAST_MS;
    // The node has just become leader: deadlines may fire soon after.
    config.deploy.leader_grace_ms = 100;
}

async fn site(dir: &tempfile::TempDir) -> Fleet {
    let mut config = FleetConfig::new(dir.path(), REGIONS.map(String::from).to_vec()).fast();
    config.failing_images = vec![BROKEN_IMAGE.into()];
    config.configure_node = configure;
    Fleet::start(config).await.expect("the site starts")
}

/// A deployment of `image` to both regions in `environment`, as
/// `ctrl deploy` makes it by default (workspace and project).
fn deployment(environment: &str, image: &str) -> CreateDeployment {
    integration::requests::deployment(REGIONS)
        .owner("ws_default", "proj_default", environment)
        .image(image)
        .replicas(2)
        .build()
}

async fn ready(operator: &Operator, id: &str) -> DeploymentView {
    operator
        .ready(id, READY_TIMEOUT_S)
        .await
        .unwrap_or_else(|e| panic!("{id} not ready: {e}"))
}

async fn live(operator: &Operator, environment: &str) -> Option<String> {
    operator
        .environment(environment)
        .await
        .expect("read the environment")
        .live_deployment_id
}

fn k8s_name(id: &str) -> String {
    id.replacen("dep_", "dep-", 1)
}

fn selector(id: &str) -> String {
    format!("unkey.com/deployment.id={id}")
}

fn running(view: &View<'_>, id: &str) -> bool {
    let name = k8s_name(id);
    view.get(&SERVICES, NAMESPACE, &name).is_some()
        && view.get(&STATEFUL_SETS, NAMESPACE, &name).is_some()
        && view
            .pods(NAMESPACE, &selector(id))
            .iter()
            .filter(|p| pod_ready(p))
            .count()
            == 2
}

fn gone(view: &View<'_>, id: &str) -> bool {
    let name = k8s_name(id);
    view.get(&SERVICES, NAMESPACE, &name).is_none()
        && view.get(&STATEFUL_SETS, NAMESPACE, &name).is_none()
        && view.pods(NAMESPACE, &selector(id)).is_empty()
}

async fn wait_objects(region: &Region, what: &str, check: impl Fn(&View<'_>) -> bool) {
    region
        .sim
        .wait_until(WAIT, check)
        .await
        .unwrap_or_else(|e| panic!("{}: {what}: {e:?}", region.name));
}

/// The code of the node's refusal in `error`.
fn refusal(error: &anyhow::Error) -> Option<ErrorCode> {
    match error.downcast_ref::<ClientError>() {
        Some(ClientError::Server(e)) => Some(e.code),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_object_in_the_way_fails_the_deploy_at_once_naming_it() {
    use k8s_openapi::api::core::v1::{Namespace, Service};
    use kube::api::{Api, ObjectMeta, PostParams};
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = site(&dir).await;
        let operator = fleet.operator().unwrap();
        let env = "env-collides";
        // Someone's own Service holds the name of the environment's
        // sentinel in the first region.
        let region = &fleet.regions[0];
        let sentinel_name =
            wire::k8s_name::sentinel(&wire::rules::deploy::sentinel_id(env, &region.name));
        let client = agent::k8s::client(Some(&region.kubeconfig)).await.unwrap();
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(wire::k8s_name::SENTINEL_NAMESPACE.into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let _ = Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await;
        let theirs = Service {
            metadata: ObjectMeta {
                name: Some(sentinel_name.clone()),
                labels: Some([("team".to_string(), "theirs".to_string())].into()),
                ..ObjectMeta::default()
            },
            ..Service::default()
        };
        let services: Api<Service> =
            Api::namespaced(client.clone(), wire::k8s_name::SENTINEL_NAMESPACE);
        services
            .create(&PostParams::default(), &theirs)
            .await
            .unwrap();

        let started = Instant::now();
        let (id, _) = operator
            .deploy(deployment(env, "nginx:1.27"))
            .await
            .unwrap();
        let view = operator
            .wait_deployment(&id, started + WAIT, "the deploy to end", |v| {
                !v.deployment.status.in_flight()
            })
            .await
            .unwrap();
        let reason = view.deployment.workflow.reason.clone().unwrap_or_default();
        println!(
            "a deploy blocked by a foreign Service ended {} after {:?}: {reason}",
            view.deployment.status.as_str(),
            started.elapsed()
        );
        assert_eq!(view.deployment.status, DeploymentStatus::Failed);
        assert!(
            reason.contains(&format!("Service sentinel/{sentinel_name}"))
                && reason.contains("krane does not manage it"),
            "the reason names the object in the way: {reason}"
        );
        // Theirs is untouched.
        let after = services.get(&sentinel_name).await.unwrap();
        assert_eq!(after.metadata.labels, theirs.metadata.labels);
        // The region is not held: a deploy of another environment runs.
        let (other, _) = operator
            .deploy(deployment("env-free", "nginx:1.27"))
            .await
            .unwrap();
        ready(&operator, &other).await;
        fleet.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hopeless_pod_state_fails_fast_with_its_reason() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = site(&dir).await;
        let operator = fleet.operator().unwrap();
        let faults = [
            (
                "app:unschedulable",
                PodFault::Unschedulable,
                "Insufficient cpu",
            ),
            (
                "app:config",
                PodFault::Waiting("CreateContainerConfigError".into()),
                "CreateContainerConfigError",
            ),
            (
                "app:name",
                PodFault::Waiting("InvalidImageName".into()),
                "InvalidImageName",
            ),
            (
                "app:never-pull",
                PodFault::Waiting("ErrImageNeverPull".into()),
                "ErrImageNeverPull",
            ),
            (
                "app:run",
                PodFault::Waiting("RunContainerError".into()),
                "RunContainerError",
            ),
            ("app:oom", PodFault::OomKilled, "OOMKilled"),
        ];
        for region in &fleet.regions {
            for (image, fault, _) in &faults {
                region.sim.set_image_fault(image, Some(fault.clone()));
            }
        }
        let started = Instant::now();
        let mut ids = Vec::new();
        for (n, (image, _, _)) in faults.iter().enumerate() {
            let (id, _) = operator
                .deploy(deployment(&format!("env-hopeless-{n}"), image))
                .await
                .unwrap();
            ids.push(id);
        }
        let deadline = started + Duration::from_millis(FAIL_FAST_MS) + FAIL_FAST_SLACK;
        for (id, (image, _, expected)) in ids.iter().zip(&faults) {
            let view = operator
                .wait_deployment(id, deadline, "the deploy to fail", |v| {
                    !v.deployment.status.in_flight()
                })
                .await
                .unwrap();
            assert_eq!(view.deployment.status, DeploymentStatus::Failed, "{image}");
            let reason = view.deployment.workflow.reason.clone().unwrap_or_default();
            assert!(
                reason.contains("failed for") && reason.contains(expected),
                "{image}: the reason names Kubernetes' ({expected}): {reason}"
            );
        }
        println!("six hopeless deploys failed within {:?}", started.elapsed());
        fleet.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_image_fails_fast_cleans_up_and_keeps_the_live_deployment() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = site(&dir).await;
        let operator = fleet.operator().unwrap();
        let env = "env-fail-fast";
        let (v1, _) = operator
            .deploy(deployment(env, "nginx:1.27"))
            .await
            .unwrap();
        ready(&operator, &v1).await;
        assert_eq!(live(&operator, env).await.as_deref(), Some(v1.as_str()));

        // The operator's own command, as the README runs it.
        let ctrl = integration::kit::ctrl::with_config(&fleet.operator_path)
            .await
            .unwrap();
        let started = Instant::now();
        let out = ctrl
            .run(&[
                "deploy",
                "--image",
                BROKEN_IMAGE,
                "--regions",
                &REGIONS.join(","),
                "--replicas",
                "2",
                "--environment",
                env,
                "--wait",
                "--timeout-s",
                "60",
            ])
            .await
            .unwrap();
        let took = started.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!(
            "deploy --wait of a failing image exited {:?} after {took:?}:\n{stdout}\n{stderr}",
            out.status
        );
        assert_eq!(out.status.code(), Some(EXIT_FAILED), "{stdout}\n{stderr}");
        assert!(
            took < Duration::from_millis(FAIL_FAST_MS) + FAIL_FAST_SLACK,
            "exited after {took:?}"
        );
        assert!(stderr.contains("failed"), "{stderr}");
        assert!(
            stderr.contains("ImagePullBackOff"),
            "the pods' state: {stderr}"
        );
        let broken = stdout
            .lines()
            .next()
            .expect("the id first")
            .trim()
            .to_string();

        let view = operator.deployment(&broken).await.unwrap();
        assert_eq!(view.deployment.status, DeploymentStatus::Failed);
        let reason = view.deployment.workflow.reason.clone().unwrap_or_default();
        assert!(
            REGIONS.iter().any(|r| reason.contains(r)),
            "the reason names a failing region: {reason}"
        );
        // The step that failed records when and why.
        let failed_step = view.deployment.workflow.steps.last().expect("steps");
        assert_eq!(failed_step.step, DeploymentStatus::Deploying);
        assert!(failed_step.ended_at_ms.is_some());
        assert_eq!(failed_step.error.as_deref(), Some(reason.as_str()));
        for region in &fleet.regions {
            wait_objects(region, "the failed deployment's objects removed", |v| {
                gone(v, &broken)
            })
            .await;
            // The live deployment runs on.
            wait_objects(region, "v1 running", |v| running(v, &v1)).await;
        }
        assert_eq!(live(&operator, env).await.as_deref(), Some(v1.as_str()));

        // `ctrl status` shows it among the recent failures, with its reason.
        let status: serde_json::Value =
            serde_json::from_str(&ctrl.ok(&["status", "-o", "json"]).await.unwrap()).unwrap();
        assert_eq!(status["leader_id"], 1, "{status:#}");
        assert_eq!(status["nodes"][0]["reachable"], true, "{status:#}");
        let regions: Vec<&str> = status["regions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["region"]["name"].as_str())
            .collect();
        assert!(REGIONS.iter().all(|r| regions.contains(r)), "{status:#}");
        assert_eq!(status["in_progress"], serde_json::json!([]), "{status:#}");
        let failed = status["failed_recently"].as_array().unwrap();
        assert_eq!(failed.len(), 1, "{status:#}");
        assert_eq!(failed[0]["id"], broken.as_str());
        assert_eq!(failed[0]["reason"], reason.as_str());
        let text = ctrl.ok(&["status"]).await.unwrap();
        assert!(text.contains("FAILED IN THE LAST HOUR (1)"), "{text}");
        assert!(text.contains(&broken), "{text}");
        fleet.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_makes_the_previous_deployment_live_again() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = site(&dir).await;
        let operator = fleet.operator().unwrap();
        let env = "env-rollback";
        let (v1, _) = operator
            .deploy(deployment(env, "nginx:1.27"))
            .await
            .unwrap();
        ready(&operator, &v1).await;
        // Ready only once krane applied both policies everywhere: ingress
        // in the deployments' namespace, egress in the sentinels'.
        let policies = operator
            .call(ListPolicies {
                after: None,
                limit: 100,
            })
            .await
            .unwrap();
        let ingress = wire::k8s_name::deployment_policy(&v1);
        let egress = wire::k8s_name::deployment_egress_policy(&v1);
        for region in REGIONS {
            for (id, namespace) in [(&ingress, NAMESPACE), (&egress, "sentinel")] {
                let view = policies
                    .iter()
                    .find(|p| &p.policy.id == id && p.policy.region == region)
                    .unwrap_or_else(|| panic!("no {id} in {region}: {policies:#?}"));
                assert_eq!(view.policy.k8s_namespace, namespace);
                assert_eq!(view.applied_version, Some(view.policy.version), "{view:#?}");
            }
        }
        for region in &fleet.regions {
            region.sim.inspect(|v| {
                assert!(
                    v.get(&CILIUM_NETWORK_POLICIES, NAMESPACE, &ingress)
                        .is_some()
                );
                assert!(
                    v.get(&CILIUM_NETWORK_POLICIES, "sentinel", &egress)
                        .is_some()
                );
            });
        }
        let (v2, _) = operator
            .deploy(deployment(env, "nginx:1.28"))
            .await
            .unwrap();
        ready(&operator, &v2).await;
        assert_eq!(live(&operator, env).await.as_deref(), Some(v2.as_str()));
        // v1 keeps running through its grace period: a rollback is instant.
        for region in &fleet.regions {
            wait_objects(region, "v1 and v2 running", |v| {
                running(v, &v1) && running(v, &v2)
            })
            .await;
        }

        // Still running, v1 goes straight to finalizing: the workflow's
        // next round makes it live.
        let back = operator.rollback(env, None).await.unwrap();
        assert_eq!(back.id, v1);
        assert_eq!(back.status, DeploymentStatus::Finalizing);
        operator
            .wait_deployment(&v1, Instant::now() + WAIT, "ready again", |view| {
                view.deployment.status == DeploymentStatus::Ready
            })
            .await
            .unwrap();
        assert_eq!(live(&operator, env).await.as_deref(), Some(v1.as_str()));
        for region in &fleet.regions {
            wait_objects(region, "v1 running after the rollback", |v| running(v, &v1)).await;
        }

        // Refused: the live deployment itself, and a failed one.
        let e = operator.rollback(env, Some(&v1)).await.unwrap_err();
        assert_eq!(refusal(&e), Some(ErrorCode::FailedPrecondition), "{e:#}");
        let (broken, _) = operator
            .deploy(deployment(env, BROKEN_IMAGE))
            .await
            .unwrap();
        operator
            .wait_deployment(&broken, Instant::now() + WAIT, "failure", |view| {
                view.deployment.status == DeploymentStatus::Failed
            })
            .await
            .unwrap();
        let e = operator.rollback(env, Some(&broken)).await.unwrap_err();
        assert_eq!(refusal(&e), Some(ErrorCode::FailedPrecondition), "{e:#}");
        assert!(format!("{e:#}").contains(&broken), "names it: {e:#}");
        assert_eq!(live(&operator, env).await.as_deref(), Some(v1.as_str()));
        fleet.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_first_deploys_at_once_make_one_sentinel_per_region() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = site(&dir).await;
        let operator = fleet.operator().unwrap();
        let env = "env-new";
        let (a, b) = tokio::join!(
            operator.create(deployment(env, "nginx:1.27")),
            operator.create(deployment(env, "nginx:1.28")),
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        operator.started(&a).await.unwrap();
        operator.started(&b).await.unwrap();
        let view = fleet.node().state.store.read().unwrap();
        for region in REGIONS {
            let sentinels: Vec<String> = view
                .region_resources(region, None, 1_000)
                .unwrap()
                .into_iter()
                .filter_map(|r| match r {
                    Resource::Sentinel(s) if s.environment_id == env => Some(s.id),
                    _ => None,
                })
                .collect();
            assert_eq!(sentinels.len(), 1, "{region}: {sentinels:?}");
        }
        drop(view);
        fleet.shutdown().await.unwrap();
    })
    .await;
}

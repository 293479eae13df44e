//! Model check of the sync contract (../shared/DESIGN.md): for random
//! sequences of creates, updates and stops of deployments, sentinels and
//! cilium policies across two or three regions, interleaved with
//! compactions, agent disconnects and restarts, failed applies and server
//! restarts, once
//! the writes stop every agent's applied set equals the desired state of
//! its region, and no agent ever applied an older version of a resource
//! after a newer one.
//!
//! Each case runs one in-process ctrl node and, per region, the real
//! krane watch loop (`agent::watch::WatchLoop` with its local redb state)
//! whose [`Reconciler`] is an in-memory cluster recording every apply.
//! The desired state is read from the node's store and checked against
//! the keys the test's own operations created and deleted.
//!
//! Bounds: `MODEL_CHECK_CASES` cases (default [`CASES_DEFAULT`]), each
//! at most [`OPS_MAX`] operations and [`CASE_TIMEOUT`] (about 2 s each
//! in a debug build); shrinking a failure stops after [`SHRINK_ITERS_MAX`]
//! runs or [`SHRINK_TIME_MAX_MS`].
//!
//! Replaying a failure: the test prints its seed first
//! (`model check seed: N`); run it again with that seed to generate the
//! same cases —
//! `PROPTEST_RNG_SEED=N cargo test -p integration --test model_check` —
//! (timing inside a case is not deterministic, so a race may need a few
//! runs). proptest also prints the shrunk operations and stores the
//! failing case in `model_check.proptest-regressions` beside this file,
//! which later runs try first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent::backoff::Backoff;
use agent::controller::Reconciler;
use agent::controller::gc::Owner;
use agent::ctrl::CtrlClient;
use agent::k8s::K8sError;
use agent::locks::KeyLocks;
use agent::state::LocalState;
use agent::watch::{WatchLoop, WatchStatus};
use config::{AgentConfig, CompactionSettings, NodeConfig, TlsFiles};
use integration::cluster::TestNode;
use integration::requests;
use node::boot::RunningNode;
use node::client::{Client, ClientError};
use proptest::prelude::*;
use proptest::test_runner::{
    Config as ProptestConfig, FileFailurePersistence, RngSeed, TestCaseError, TestRunner,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use wire::Pk;
use wire::model::{DesiredState, Resource, ResourceKey, ResourceType};
use wire::operator::request::{DeletePolicy, SetDesiredState, StopSentinel};
use wire::operator::{ApplyPolicy, Operation};

/// Cases per run unless `MODEL_CHECK_CASES` says otherwise.
const CASES_DEFAULT: u32 = 12;
/// Operations per case.
const OPS_MAX: usize = 40;
/// Bound on one case, start to shutdown.
const CASE_TIMEOUT: Duration = Duration::from_secs(45);
/// Bound on the agents converging after the last write.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(20);
/// Runs, and milliseconds, spent shrinking a failure at most.
const SHRINK_ITERS_MAX: u32 = 24;
const SHRINK_TIME_MAX_MS: u32 = 90_000;
/// The regions a case may use (the first two have agent certificates from
/// [`TestNode`]; the third is issued here).
const REGIONS: [&str; 3] = ["us-east", "eu-west", "ap-south"];
/// Environments, so that sentinels and policies are sometimes updated and
/// sometimes created.
const ENVS: u8 = 3;
/// The environments of deployments: one per deployment, `deploy-N`.
const DEPLOY_ENV_PREFIX: &str = "deploy-";
/// Policy names per environment.
const POLICY_NAMES: u8 = 2;
/// A node's progress bookmark interval: agents of quiet regions see the
/// last pk soon after the writes stop.
const PROGRESS_INTERVAL_MS: u64 = 50;
/// A small full-sync page, so that syncs take several pages.
const SYNC_PAGE_RESOURCES: usize = 3;
/// Most resources of one region a case reads back (far more than
/// [`OPS_MAX`] operations create).
const REGION_RESOURCES_MAX: usize = 10_000;
/// krane's reconnect backoff in the test.
const BACKOFF_MIN_MS: u64 = 5;
const BACKOFF_MAX_MS: u64 = 50;

/// One step of a case. Indexes (`pick`) choose among what exists by
/// modulo, so every sequence is valid and shrinks well.
#[derive(Debug, Clone)]
enum Op {
    CreateDeployment {
        regions: u8,
    },
    SetDeploymentState {
        pick: usize,
        running: bool,
    },
    ApplySentinel {
        env: u8,
        region: usize,
        replicas: u32,
    },
    StopSentinel {
        pick: usize,
    },
    ApplyPolicy {
        env: u8,
        region: usize,
        name: u8,
        doc: u8,
    },
    DeletePolicy {
        pick: usize,
    },
    /// Compacts change rows up to now, at most `rows_max` of them.
    Compact {
        rows_max: u32,
    },
    /// The agent's stream is dropped mid-flight; its loop starts again on
    /// the same local state (a reconnect).
    DisconnectAgent {
        region: usize,
    },
    /// The agent stops (in the middle of whatever it does) and starts
    /// again, reopening its local state.
    RestartAgent {
        region: usize,
    },
    /// The node shuts down and starts again on its data.
    RestartServer,
    /// The agent's next `count` applies or deletes fail for good (an
    /// invalid object): the stream ends and resumes from the stored
    /// cursor.
    FailApplies {
        region: usize,
        count: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u8..8).prop_map(|regions| Op::CreateDeployment { regions }),
        3 => (any::<usize>(), any::<bool>())
            .prop_map(|(pick, running)| Op::SetDeploymentState { pick, running }),
        3 => (0..ENVS, 0..REGIONS.len(), 1u32..4)
            .prop_map(|(env, region, replicas)| Op::ApplySentinel { env, region, replicas }),
        1 => any::<usize>().prop_map(|pick| Op::StopSentinel { pick }),
        3 => (0..ENVS, 0..REGIONS.len(), 0..POLICY_NAMES, any::<u8>())
            .prop_map(|(env, region, name, doc)| Op::ApplyPolicy { env, region, name, doc }),
        1 => any::<usize>().prop_map(|pick| Op::DeletePolicy { pick }),
        2 => (1u32..20).prop_map(|rows_max| Op::Compact { rows_max }),
        2 => (0..REGIONS.len()).prop_map(|region| Op::DisconnectAgent { region }),
        2 => (0..REGIONS.len()).prop_map(|region| Op::RestartAgent { region }),
        1 => Just(Op::RestartServer),
        1 => (0..REGIONS.len(), 1u32..4).prop_map(|(region, count)| Op::FailApplies { region, count }),
    ]
}

/// A case: how many regions have agents, how many applies an agent runs
/// at once, and the operations.
#[derive(Debug, Clone)]
struct Case {
    regions: usize,
    max_concurrent_applies: usize,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        2..=REGIONS.len(),
        1usize..=4,
        proptest::collection::vec(op(), 1..=OPS_MAX),
    )
        .prop_map(|(regions, max_concurrent_applies, ops)| Case {
            regions,
            max_concurrent_applies,
            ops,
        })
}

#[test]
fn agents_converge_on_their_regions_desired_state() {
    let cases = std::env::var("MODEL_CHECK_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES_DEFAULT);
    let mut config = ProptestConfig {
        cases,
        max_shrink_iters: SHRINK_ITERS_MAX,
        max_shrink_time: SHRINK_TIME_MAX_MS,
        // Failing cases are stored next to this file.
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    };
    // `PROPTEST_RNG_SEED` (read by the default config) replays a run.
    let seed = match config.rng_seed {
        RngSeed::Fixed(seed) => seed,
        RngSeed::Random => rand::random(),
    };
    config.rng_seed = RngSeed::Fixed(seed);
    println!(
        "model check seed: {seed} (replay: PROPTEST_RNG_SEED={seed} \
         cargo test -p integration --test model_check)"
    );
    let mut runner = TestRunner::new(config);
    let result = runner.run(&case(), |case| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| TestCaseError::fail(format!("runtime: {e}")))?;
        runtime.block_on(async {
            match tokio::time::timeout(CASE_TIMEOUT, run_case(&case)).await {
                Ok(result) => result.map_err(TestCaseError::fail),
                Err(_) => Err(TestCaseError::fail(format!(
                    "the case did not finish within {CASE_TIMEOUT:?}"
                ))),
            }
        })
    });
    if let Err(e) = result {
        panic!("model check failed (seed {seed}): {e}");
    }
}

// --- the recording cluster -------------------------------------------------

/// What krane put in one region's cluster, and every violation seen.
#[derive(Debug, Default)]
struct Recorded {
    /// Resources whose objects exist, as last applied.
    objects: BTreeMap<ResourceKey, Resource>,
    /// The highest version ever applied, per resource.
    highest: BTreeMap<ResourceKey, Pk>,
    violations: Vec<String>,
    /// Applies and deletes still to fail.
    failures_left: u32,
}

/// An in-memory Kubernetes cluster: a [`Reconciler`] that records. It
/// outlives agent restarts, as a real cluster would.
#[derive(Debug, Default)]
struct Cluster {
    recorded: Mutex<Recorded>,
}

impl Cluster {
    fn with<T>(&self, f: impl FnOnce(&mut Recorded) -> T) -> T {
        // A panic while holding the lock fails the case anyway.
        f(&mut self.recorded.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// An injected failure, if one is due.
    fn injected_failure(r: &mut Recorded) -> Result<(), K8sError> {
        if r.failures_left == 0 {
            return Ok(());
        }
        r.failures_left -= 1;
        // A transient failure (retried; a permanent refusal would be
        // reported and passed instead).
        Err(K8sError::LocalState(Box::new(
            agent::state::StateError::Missing {
                path: "injected failure".into(),
            },
        )))
    }
}

impl Reconciler for Cluster {
    async fn apply(&self, resource: &Resource) -> Result<(), K8sError> {
        let key = resource.key();
        let version = resource.version();
        self.with(|r| {
            Self::injected_failure(r)?;
            let highest = r.highest.entry(key.clone()).or_default();
            if *highest > version {
                r.violations.push(format!(
                    "{key:?}: version {version} applied after version {highest}"
                ));
            }
            *highest = (*highest).max(version);
            r.objects.insert(key, resource.clone());
            Ok(())
        })
    }

    async fn rejected(
        &self,
        key: &ResourceKey,
        version: wire::Pk,
        _rejection: &agent::k8s::Rejection,
    ) -> Result<(), K8sError> {
        self.with(|r| {
            r.violations.push(format!(
                "{key:?}: version {version} rejected; the model's cluster rejects nothing"
            ));
            Ok(())
        })
    }

    async fn delete(&self, key: &ResourceKey, _last: Option<&Resource>) -> Result<(), K8sError> {
        self.with(|r| {
            Self::injected_failure(r)?;
            r.objects.remove(key);
            Ok(())
        })
    }

    async fn collect(&self, desired: &BTreeSet<Owner>) -> Result<usize, K8sError> {
        Ok(self.with(|r| {
            let before = r.objects.len();
            r.objects
                .retain(|key, _| desired.contains(&(key.resource_type, key.resource_id.clone())));
            before - r.objects.len()
        }))
    }
}

// --- agents ----------------------------------------------------------------

/// One region's krane: its watch loop task over a local state that
/// persists in `data_dir`, applying to `cluster`.
struct Agent {
    config: AgentConfig,
    max_concurrent_applies: usize,
    cluster: Arc<Cluster>,
    status: watch::Sender<WatchStatus>,
    state: Option<Arc<LocalState>>,
    task: Option<JoinHandle<()>>,
    /// Seeds the backoff jitter of each start.
    starts: u64,
}

impl Agent {
    fn start(&mut self) -> Result<(), String> {
        let state = match &self.state {
            Some(state) => state.clone(),
            None => {
                let state = Arc::new(
                    LocalState::open_in(&self.config.data_dir)
                        .map_err(|e| format!("open krane state: {e}"))?,
                );
                self.state = Some(state.clone());
                state
            }
        };
        let ctrl = Arc::new(CtrlClient::new(&self.config).map_err(|e| format!("ctrl: {e}"))?);
        self.starts += 1;
        let watch = WatchLoop::new(
            ctrl,
            state,
            self.cluster.clone(),
            Arc::new(KeyLocks::default()),
            self.max_concurrent_applies,
            Backoff::new(BACKOFF_MIN_MS, BACKOFF_MAX_MS),
            StdRng::seed_from_u64(self.starts),
            Duration::from_millis(self.config.full_resync_interval_ms),
            self.status.clone(),
        );
        self.task = Some(tokio::spawn(watch.run()));
        Ok(())
    }

    /// Ends the watch loop wherever it is (mid-apply included).
    async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    async fn disconnect(&mut self) -> Result<(), String> {
        self.stop().await;
        self.start()
    }

    async fn restart(&mut self) -> Result<(), String> {
        self.stop().await;
        // Every holder of the state is gone with the task: the file closes.
        self.state = None;
        self.start()
    }
}

// --- the node ----------------------------------------------------------------

struct Server {
    config: NodeConfig,
    node: Option<RunningNode>,
}

impl Server {
    fn running(&self) -> Result<&RunningNode, String> {
        self.node
            .as_ref()
            .ok_or_else(|| "the node is down".to_string())
    }

    async fn restart(&mut self) -> Result<(), String> {
        if let Some(node) = self.node.take() {
            node.shutdown().await;
        }
        // `RunningNode::shutdown` returns once the node's files and socket
        // are closed: it starts again at once.
        let node = node::boot::start(&self.config)
            .await
            .map_err(|e| format!("restart the node: {e:#}"))?;
        self.node = Some(node);
        Ok(())
    }
}

// --- a case ------------------------------------------------------------------

/// The keys the operations made live, per region (the test's own model).
#[derive(Debug, Default)]
struct Model {
    deployments: Vec<String>,
    sentinels: Vec<String>,
    policies: Vec<String>,
    live: BTreeSet<ResourceKey>,
}

fn key(resource_type: ResourceType, id: &str, region: &str) -> ResourceKey {
    ResourceKey {
        resource_type,
        resource_id: id.to_string(),
        region: region.to_string(),
    }
}

async fn run_case(case: &Case) -> Result<(), String> {
    let regions = &REGIONS[..case.regions];
    let mut captured = None;
    let TestNode {
        dir,
        node,
        operator,
    } = TestNode::start_with(|config| {
        config.watch.progress_interval_ms = PROGRESS_INTERVAL_MS;
        config.watch.sync_page_resources = SYNC_PAGE_RESOURCES;
        captured = Some(config.clone());
    })
    .await
    .map_err(|e| format!("start the node: {e:#}"))?;
    let mut config = captured.ok_or("no node config")?;
    // A restart listens where clients already point.
    config.listen_addr = node.local_addr;
    let mut server = Server {
        config,
        node: Some(node),
    };
    let certs = dir.path().join("certs");
    let mut agents = Vec::new();
    for region in regions {
        agents.push(start_agent(
            &server,
            &certs,
            dir.path().join(region),
            region,
            case,
        )?);
    }
    let client = Client::new(&operator).map_err(|e| format!("client: {e}"))?;
    let mut model = Model::default();
    let mut outcome = Ok(());
    for op in &case.ops {
        outcome = step(op, regions, &client, &mut server, &mut agents, &mut model).await;
        if outcome.is_err() {
            break;
        }
    }
    if outcome.is_ok() {
        outcome = check(&server, &agents, regions, &model).await;
    }
    let (full_syncs, streams) = agents.iter().fold((0, 0), |(f, s), agent| {
        let status = *agent.status.borrow();
        (f + status.full_syncs, s + status.streams)
    });
    println!(
        "case: {} ops, {} regions, {} live resources, {full_syncs} full syncs, {streams} streams: {}",
        case.ops.len(),
        regions.len(),
        model.live.len(),
        if outcome.is_ok() { "ok" } else { "FAILED" },
    );
    for agent in &mut agents {
        agent.stop().await;
    }
    if let Some(node) = server.node.take() {
        node.shutdown().await;
    }
    drop(dir);
    outcome
}

fn start_agent(
    server: &Server,
    certs: &std::path::Path,
    data_dir: PathBuf,
    region: &str,
    case: &Case,
) -> Result<Agent, String> {
    let bundle = transport::certs::agent_bundle(certs, region);
    if !bundle.cert.exists() {
        transport::certs::issue_agent(certs, region).map_err(|e| format!("agent cert: {e}"))?;
    }
    let mut config = AgentConfig::new(
        region,
        vec![server.running()?.local_addr.into()],
        TlsFiles::in_dir(certs, &format!("agent-{region}")),
    );
    config.data_dir = data_dir;
    config.reconnect_backoff_min_ms = BACKOFF_MIN_MS;
    config.reconnect_backoff_max_ms = BACKOFF_MAX_MS;
    let mut agent = Agent {
        config,
        max_concurrent_applies: case.max_concurrent_applies,
        cluster: Arc::default(),
        status: watch::Sender::new(WatchStatus::default()),
        state: None,
        task: None,
        starts: 0,
    };
    agent.start()?;
    Ok(agent)
}

/// Makes one operator call; a refusal (a stopped deployment's restart,
/// say) is an answer too (`None`), and leaves the model as it was.
async fn call<C: Operation + Clone + std::fmt::Debug>(
    client: &Client,
    call: C,
) -> Result<Option<C::Answer>, String> {
    match client.call(call.clone()).await {
        Ok(answer) => Ok(Some(answer)),
        Err(ClientError::Server(_)) => Ok(None),
        Err(e) => Err(format!("{call:?}: {e}")),
    }
}

async fn step(
    op: &Op,
    regions: &[&str],
    client: &Client,
    server: &mut Server,
    agents: &mut [Agent],
    model: &mut Model,
) -> Result<(), String> {
    let region = |i: usize| regions[i % regions.len()];
    match op {
        Op::CreateDeployment { regions: mask } => {
            let chosen: Vec<String> = regions
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, r)| r.to_string())
                .collect();
            let chosen = if chosen.is_empty() {
                vec![regions[0].to_string()]
            } else {
                chosen
            };
            // An environment of its own: a deploy supersedes an older one
            // of its environment still in flight, and the model keeps
            // every deployment it made running.
            let request = integration::requests::deployment(chosen.clone())
                .environment(format!("{DEPLOY_ENV_PREFIX}{}", model.deployments.len()))
                .build();
            if let Some(deployment_id) = call(client, request).await? {
                // The workflow writes its topologies when it starts it.
                integration::kit::operator::started(client, &deployment_id)
                    .await
                    .map_err(|e| format!("{e:#}"))?;
                for r in &chosen {
                    model
                        .live
                        .insert(key(ResourceType::DeploymentTopology, &deployment_id, r));
                }
                model.deployments.push(deployment_id);
            }
        }
        Op::SetDeploymentState { pick, running } => {
            if !model.deployments.is_empty() {
                let id = model.deployments[pick % model.deployments.len()].clone();
                let desired_state = if *running {
                    DesiredState::Running
                } else {
                    DesiredState::Standby
                };
                // Forced: each deployment is its environment's live one.
                let request = SetDesiredState {
                    id,
                    desired_state,
                    after_ms: None,
                    force: true,
                };
                call(client, request).await?;
            }
        }
        Op::ApplySentinel {
            env,
            region: r,
            replicas,
        } => {
            let request = requests::sentinel(format!("env-{env}"), region(*r))
                .image(format!("sentinel:1.{replicas}"))
                .replicas(*replicas)
                .build();
            if let Some(deployed) = call(client, request).await? {
                let sentinel_id = deployed.sentinel_id;
                model
                    .live
                    .insert(key(ResourceType::Sentinel, &sentinel_id, region(*r)));
                if !model.sentinels.contains(&sentinel_id) {
                    model.sentinels.push(sentinel_id);
                }
            }
        }
        Op::StopSentinel { pick } => {
            if !model.sentinels.is_empty() {
                let id = model.sentinels[pick % model.sentinels.len()].clone();
                call(client, StopSentinel { id }).await?;
            }
        }
        Op::ApplyPolicy {
            env,
            region: r,
            name,
            doc,
        } => {
            let request = ApplyPolicy {
                workspace_id: "ws".into(),
                environment_id: format!("env-{env}"),
                region: region(*r).into(),
                name: format!("allow-{name}"),
                namespace: "krane".into(),
                policy_json: format!(r#"{{"endpointSelector":{{"matchLabels":{{"v":"{doc}"}}}}}}"#),
            };
            if let Some(policy_id) = call(client, request).await? {
                model.live.insert(key(
                    ResourceType::CiliumNetworkPolicy,
                    &policy_id,
                    region(*r),
                ));
                if !model.policies.contains(&policy_id) {
                    model.policies.push(policy_id);
                }
            }
        }
        Op::DeletePolicy { pick } => {
            if !model.policies.is_empty() {
                let id = model.policies.remove(pick % model.policies.len());
                if let Some(policy_id) = call(client, DeletePolicy { id }).await? {
                    model.live.retain(|k| {
                        k.resource_type != ResourceType::CiliumNetworkPolicy
                            || k.resource_id != policy_id
                    });
                }
            }
        }
        Op::Compact { rows_max } => {
            let state = &server.running()?.state;
            let settings = CompactionSettings {
                retention_ms: 0,
                batch_rows_max: *rows_max as usize,
                keep_rows_min: 0,
                ..CompactionSettings::default()
            };
            // Everything written before now (the next millisecond).
            let now_ms = state.clock.now_ms() + 1;
            let cutoffs = node::jobs::compaction::Cutoffs {
                changes_ms: now_ms,
                requests_ms: now_ms,
            };
            let mutation = node::jobs::compaction::step(&settings, cutoffs);
            node::replica::write::propose(state, vec![mutation])
                .await
                .map_err(|e| format!("compact: {e}"))?;
        }
        Op::DisconnectAgent { region } => {
            agents[region % agents.len()].disconnect().await?;
        }
        Op::RestartAgent { region } => {
            agents[region % agents.len()].restart().await?;
        }
        Op::RestartServer => server.restart().await?,
        Op::FailApplies { region, count } => {
            agents[region % agents.len()]
                .cluster
                .with(|r| r.failures_left += count);
        }
    }
    Ok(())
}

/// After the last write: every agent reaches the node's last pk, then its
/// cluster holds exactly its region's desired state, and no apply went
/// back in version.
/// Most times `check` waits for the agents because rows were written
/// while it waited.
const QUIESCENCE_ROUNDS_MAX: u32 = 20;

async fn check(
    server: &Server,
    agents: &[Agent],
    regions: &[&str],
    model: &Model,
) -> Result<(), String> {
    let node = server.running()?;
    // The deploy workflow writes after the operations (a start's rows come
    // in the leader's next round): wait until the agents reached the last
    // pk and no row was written meanwhile, a bounded number of times.
    let mut rounds = 0;
    let (view, last) = loop {
        let last = node
            .state
            .store
            .read()
            .map_err(|e| format!("read: {e}"))?
            .last_pk();
        for (agent, region) in agents.iter().zip(regions) {
            let mut status = agent.status.subscribe();
            let reached =
                tokio::time::timeout(CONVERGE_TIMEOUT, status.wait_for(|s| s.cursor >= last)).await;
            if !matches!(reached, Ok(Ok(_))) {
                let status = *agent.status.borrow();
                return Err(format!(
                    "{region}: the agent did not reach pk {last} within {CONVERGE_TIMEOUT:?}: {status:?}"
                ));
            }
        }
        let view = node.state.store.read().map_err(|e| format!("read: {e}"))?;
        rounds += 1;
        let now_last = view.last_pk();
        if now_last == last || rounds >= QUIESCENCE_ROUNDS_MAX {
            break (view, now_last);
        }
    };
    for (agent, region) in agents.iter().zip(regions) {
        let desired: BTreeMap<ResourceKey, Resource> = view
            .region_resources(region, None, REGION_RESOURCES_MAX)
            .map_err(|e| format!("read {region}: {e}"))?
            .into_iter()
            .map(|r| (r.key(), r))
            .collect();
        let expected_keys: BTreeSet<&ResourceKey> =
            model.live.iter().filter(|k| k.region == *region).collect();
        // Besides what the operations wrote, the deploy workflow made the
        // sentinels of the deployments' environments and their policies.
        let by_workflow = |r: &Resource| match r {
            Resource::Sentinel(s) => s.environment_id.starts_with(DEPLOY_ENV_PREFIX),
            Resource::CiliumNetworkPolicy(p) => p.environment_id.starts_with(DEPLOY_ENV_PREFIX),
            _ => false,
        };
        let desired_keys: BTreeSet<&ResourceKey> = desired
            .iter()
            .filter(|(_, r)| !by_workflow(r))
            .map(|(k, _)| k)
            .collect();
        if desired_keys != expected_keys {
            return Err(format!(
                "{region}: the node's desired keys {desired_keys:?} are not the ones written {expected_keys:?}"
            ));
        }
        let (objects, violations) = agent
            .cluster
            .with(|r| (r.objects.clone(), r.violations.clone()));
        if !violations.is_empty() {
            return Err(format!("{region}: older after newer: {violations:?}"));
        }
        if objects != desired {
            let missing: Vec<_> = desired
                .iter()
                .filter(|(k, r)| objects.get(*k) != Some(*r))
                .map(|(k, r)| (k, r.version(), objects.get(k).map(Resource::version)))
                .collect();
            let extra: Vec<_> = objects
                .keys()
                .filter(|k| !desired.contains_key(*k))
                .collect();
            return Err(format!(
                "{region}: applied set differs from the desired state at pk {last}: \
                 missing or stale (key, desired version, applied version) {missing:?}; \
                 not desired {extra:?}"
            ));
        }
    }
    Ok(())
}

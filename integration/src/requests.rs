//! Operator requests the benchmarks and tests send, built in one place:
//! [`deployment`] starts a `CreateDeployment` and [`sentinel()`] an
//! `ApplySentinel`, each with small defaults that a test changes only
//! where it matters to it; [`add_region`] registers a region
//! ([`TEST_REGIONS`] are registered by every harness).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use wire::operator::request::{AddRegion, ApplySentinel};
use wire::operator::{CreateDeployment, OperatorRequest};

/// The regions the test harnesses (fleet, test and process clusters)
/// register when they start, as an operator does before deploying: every
/// region the tests and benchmarks deploy to.
pub const TEST_REGIONS: [&str; 3] = ["us-east", "eu-west", "ap-south"];

/// Change rows a started deploy writes in each of its regions when its
/// environment is new there: its topology, the environment's sentinel, its
/// ingress and its egress policy.
pub const ROWS_PER_STARTED_REGION: u64 = 4;

/// The request registering region `name` (idempotent).
pub fn add_region(name: &str) -> AddRegion {
    AddRegion { name: name.into() }
}

/// The image of [`deployment`] unless changed.
pub const IMAGE: &str = "nginx:1.27";

/// A deployment of one small replica (`nginx:1.27`, 100 millicores,
/// 128 MiB) in each of `regions`, in workspace `ws`, project `proj`,
/// environment `env`, without environment variables; change what a test
/// needs with the builder's methods.
pub fn deployment<R: Into<String>>(regions: impl IntoIterator<Item = R>) -> DeploymentBuilder {
    DeploymentBuilder(CreateDeployment {
        workspace_id: "ws".into(),
        project_id: "proj".into(),
        environment_id: "env".into(),
        image: IMAGE.into(),
        cpu_millicores: 100,
        memory_mib: 128,
        replicas: 1,
        regions: regions.into_iter().map(Into::into).collect(),
        env_vars: BTreeMap::new(),
        progress_deadline_ms: None,
        min_ready_regions: None,
        spec: Default::default(),
    })
}

/// A `CreateDeployment` under construction (see [`deployment`]).
#[derive(Debug, Clone)]
#[must_use]
pub struct DeploymentBuilder(CreateDeployment);

impl DeploymentBuilder {
    /// The image to run.
    pub fn image(mut self, image: &str) -> Self {
        self.0.image = image.into();
        self
    }

    /// Replicas per region.
    pub fn replicas(mut self, replicas: u32) -> Self {
        self.0.replicas = replicas;
        self
    }

    /// Each replica's CPU and memory.
    pub fn size(mut self, cpu_millicores: u32, memory_mib: u32) -> Self {
        self.0.cpu_millicores = cpu_millicores;
        self.0.memory_mib = memory_mib;
        self
    }

    /// The workspace, project and environment the deployment belongs to.
    pub fn owner(mut self, workspace_id: &str, project_id: &str, environment_id: &str) -> Self {
        self.0.workspace_id = workspace_id.into();
        self.0.project_id = project_id.into();
        self.0.environment_id = environment_id.into();
        self
    }

    /// The environment the deployment belongs to.
    pub fn environment(mut self, environment_id: impl Into<String>) -> Self {
        self.0.environment_id = environment_id.into();
        self
    }

    /// An environment of its own (`env-own-N`, unique in this process):
    /// the deployment neither supersedes another nor is superseded, as a
    /// deploy does to an older one of its environment still in flight.
    pub fn own_environment(self) -> Self {
        static ENVIRONMENTS: AtomicU64 = AtomicU64::new(0);
        let n = ENVIRONMENTS.fetch_add(1, Ordering::Relaxed);
        self.environment(format!("env-own-{n}"))
    }

    /// Adds the environment variable `name=value`.
    pub fn env_var(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.0.env_vars.insert(name.into(), value.into());
        self
    }

    /// Sets the workload spec (port, command, health, secrets, …).
    pub fn spec(mut self, spec: wire::workload::WorkloadSpec) -> Self {
        *self.0.spec = spec;
        self
    }

    /// Sets the progress deadline, in milliseconds.
    pub fn progress_deadline_ms(mut self, ms: u64) -> Self {
        self.0.progress_deadline_ms = Some(ms);
        self
    }

    /// The request.
    pub fn build(self) -> CreateDeployment {
        self.0
    }

    /// The request as the operator protocol's enum, for callers that
    /// send requests untyped (replays, generated mixes); a typed call
    /// takes [`DeploymentBuilder::build`].
    pub fn request(self) -> OperatorRequest {
        self.0.into()
    }
}

/// [`deployment`] with its defaults, built.
pub fn create_deployment<R: Into<String>>(
    regions: impl IntoIterator<Item = R>,
) -> CreateDeployment {
    deployment(regions).build()
}

/// [`create_deployment`] with `replicas` replicas per region.
pub fn create_deployment_with_replicas<R: Into<String>>(
    regions: impl IntoIterator<Item = R>,
    replicas: u32,
) -> CreateDeployment {
    deployment(regions).replicas(replicas).build()
}

/// An `ApplySentinel` of environment `environment_id` in `region`, owned
/// by workspace `ws`, project `proj`, app `app`; no image, replicas, size
/// or deadline (a new sentinel needs an image: [`SentinelBuilder::image`]).
pub fn sentinel(environment_id: impl Into<String>, region: impl Into<String>) -> SentinelBuilder {
    SentinelBuilder(ApplySentinel {
        workspace_id: "ws".into(),
        project_id: "proj".into(),
        app_id: "app".into(),
        environment_id: environment_id.into(),
        region: region.into(),
        image: None,
        replicas: None,
        cpu_millicores: None,
        memory_mib: None,
        deadline_ms: None,
    })
}

/// An `ApplySentinel` under construction (see [`sentinel()`]).
#[derive(Debug, Clone)]
#[must_use]
pub struct SentinelBuilder(ApplySentinel);

impl SentinelBuilder {
    /// The proxy image to run.
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.0.image = Some(image.into());
        self
    }

    /// Replicas (`None`: keep the current number, a default when new).
    pub fn replicas(mut self, replicas: impl Into<Option<u32>>) -> Self {
        self.0.replicas = replicas.into();
        self
    }

    /// Each replica's CPU and memory.
    pub fn size(mut self, cpu_millicores: u32, memory_mib: u32) -> Self {
        self.0.cpu_millicores = Some(cpu_millicores);
        self.0.memory_mib = Some(memory_mib);
        self
    }

    /// The workspace, project and app the sentinel belongs to.
    pub fn owner(mut self, workspace_id: &str, project_id: &str, app_id: &str) -> Self {
        self.0.workspace_id = workspace_id.into();
        self.0.project_id = project_id.into();
        self.0.app_id = app_id.into();
        self
    }

    /// How long the change may take to converge, in milliseconds.
    pub fn deadline_ms(mut self, ms: u64) -> Self {
        self.0.deadline_ms = Some(ms);
        self
    }

    /// The request.
    pub fn build(self) -> ApplySentinel {
        self.0
    }
}

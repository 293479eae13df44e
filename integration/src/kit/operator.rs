//! An operator as the tests play one: [`Operator`] wraps a node client
//! (and dereferences to it for any other call) with the calls tests make
//! again and again — create and stop deployments, apply and stop
//! sentinels, apply and delete policies, add and cordon regions — answering with ids and views
//! rather than raw responses, and waits for a deployment's state through
//! the node's long-poll `WaitDeployment` call (`node::wait`): each call
//! returns as soon as the deployment changes, so nothing polls.
//! Sentinels have no such call; [`Operator::wait_sentinel`] reads again.

use std::fmt::Debug;

use anyhow::{Context, Result, bail, ensure};
use config::OperatorConfig;
use node::client::Client;
use node::wait::WaitError;
use tokio::time::Instant;
use wire::model::{Deployment, DeploymentStatus, DesiredState, Environment, Region};
use wire::operator::request::{
    AddRegion, ControlRollout, DeletePolicy, GetDeployment, GetEnvironment, GetSentinel,
    ListRegions, Rollback, RolloutStatus, SetDesiredState, SetRegionSchedulable, StopSentinel,
};
use wire::operator::{
    ApplyPolicy, ApplySentinel, CreateDeployment, DeploymentView, Operation, RegionList,
    RolloutCommand, SentinelView, StartRollout,
};
use wire::rollout::{Rollout, RolloutOptions};

use super::wait::wait_until;

/// Bound on the deploy workflow starting a deployment just created.
pub const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits (at most [`START_TIMEOUT`], each read a long poll) until the
/// deploy workflow has started deployment `id` (it left `pending`).
pub async fn started(client: &Client, id: &str) -> Result<DeploymentView> {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut seen = 0;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            bail!("{id} was not started within {START_TIMEOUT:?}");
        }
        let wait_ms = node::wait::long_poll_ms(remaining, client.request_timeout_ms());
        let view = node::wait::changed(client, id, seen, wait_ms)
            .await
            .with_context(|| format!("waiting for the start of {id}"))?;
        if view.deployment.status != DeploymentStatus::Pending {
            return Ok(view);
        }
        seen = view.digest();
    }
}

/// An operator client with the calls tests make.
pub struct Operator {
    client: Client,
}

impl std::ops::Deref for Operator {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl From<Client> for Operator {
    fn from(client: Client) -> Operator {
        Operator { client }
    }
}

impl Operator {
    /// A client of the nodes `config` names.
    pub fn new(config: &OperatorConfig) -> Result<Operator> {
        Ok(Client::new(config)?.into())
    }

    /// The operator client, for calls the kit does not wrap.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Creates a deployment (see `crate::requests::deployment`); its id.
    pub async fn create(&self, deployment: CreateDeployment) -> Result<String> {
        self.call_named("create", deployment).await
    }

    /// Creates a deployment and waits (at most [`START_TIMEOUT`]) until the
    /// deploy workflow has started it: its topologies, the environment's
    /// sentinels and the deployment's policies are written. Its id and
    /// the deployment as it then is.
    pub async fn deploy(&self, deployment: CreateDeployment) -> Result<(String, Deployment)> {
        let id = self.create(deployment).await?;
        let view = self.started(&id).await?;
        Ok((id, view.deployment))
    }

    /// Waits (at most [`START_TIMEOUT`]) until the deploy workflow has
    /// started deployment `id` (it left `pending`).
    pub async fn started(&self, id: &str) -> Result<DeploymentView> {
        started(&self.client, id).await
    }

    /// Puts deployment `id` in standby now, live or not (with force).
    pub async fn stop(&self, id: &str) -> Result<Deployment> {
        self.set_desired_state(id, DesiredState::Standby).await
    }

    /// Sets the desired state of deployment `id` now (with force: the live
    /// deployment too) and returns it as it now is.
    pub async fn set_desired_state(
        &self,
        id: &str,
        desired_state: DesiredState,
    ) -> Result<Deployment> {
        let request = SetDesiredState {
            id: id.into(),
            desired_state,
            after_ms: None,
            force: true,
        };
        self.call_named("set the desired state", request).await
    }

    /// Environment `id`: its live deployment and history of live ones.
    pub async fn environment(&self, id: &str) -> Result<Environment> {
        self.call_named("read the environment", GetEnvironment { id: id.into() })
            .await
    }

    /// Environment `id` with its route and address per region
    /// (`ctrl get environment`).
    pub async fn describe_environment(&self, id: &str) -> Result<wire::operator::EnvironmentView> {
        self.call_named(
            "describe the environment",
            wire::operator::request::DescribeEnvironment { id: id.into() },
        )
        .await
    }

    /// Waits (at most `timeout`) until environment `id`'s sentinel in
    /// `region` reports serving its route's current generation; that
    /// generation and since when.
    pub async fn until_served(
        &self,
        id: &str,
        region: &str,
        timeout: std::time::Duration,
    ) -> Result<(u64, u64)> {
        let what = format!("environment {id}'s sentinel in {region} to serve its route");
        wait_until(Instant::now() + timeout, &what, async || {
            let view = self
                .describe_environment(id)
                .await
                .map_err(|e| e.to_string())?;
            let route = view
                .routes
                .iter()
                .find(|r| r.route.region == region)
                .ok_or_else(|| format!("no route in {region}: {view:?}"))?;
            match route.serving() {
                Some((generation, since_ms)) if generation == route.route.version => {
                    Ok((generation, since_ms))
                }
                _ => Err(format!("{route:?}")),
            }
        })
        .await
    }

    /// Rolls environment `environment_id` back to `to` (default: its
    /// previous live deployment); the deployment rolled back to.
    pub async fn rollback(&self, environment_id: &str, to: Option<&str>) -> Result<Deployment> {
        let request = Rollback {
            environment_id: environment_id.into(),
            to: to.map(str::to_string),
        };
        self.call_named("roll back", request).await
    }

    /// Deployment `id` with its reported instances.
    pub async fn deployment(&self, id: &str) -> Result<DeploymentView> {
        self.call_named("read the deployment", GetDeployment { id: id.into() })
            .await
    }

    /// Waits until deployment `id` satisfies `check`, each read a
    /// `WaitDeployment` long poll that ends when the deployment changes;
    /// fails at `deadline`, naming `what` and the last view.
    pub async fn wait_deployment(
        &self,
        id: &str,
        deadline: Instant,
        what: &str,
        check: impl Fn(&DeploymentView) -> bool,
    ) -> Result<DeploymentView> {
        let started = Instant::now();
        let mut view = self.deployment(id).await?;
        loop {
            if check(&view) {
                return Ok(view);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                bail!(
                    "waited {:?} for {what} of {id}; last seen {view:#?}",
                    started.elapsed()
                );
            }
            let wait_ms = node::wait::long_poll_ms(remaining, self.client.request_timeout_ms());
            view = node::wait::changed(&self.client, id, view.digest(), wait_ms)
                .await
                .with_context(|| format!("waiting for {what} of {id}"))?;
        }
    }

    /// Waits (as `ctrl deploy --wait` does, through the long poll) until
    /// deployment `id` is ready; an error if it fails, is stopped, or is
    /// not ready within `timeout_s` seconds, naming the regions short of
    /// replicas and their pods' state.
    pub async fn ready(&self, id: &str, timeout_s: u64) -> Result<DeploymentView, WaitError> {
        node::wait::until_ready(&self.client, id, timeout_s, |_| {}).await
    }

    /// Creates or updates a sentinel; its id.
    pub async fn apply_sentinel(&self, sentinel: ApplySentinel) -> Result<String> {
        let deployed = self.call_named("apply the sentinel", sentinel).await?;
        Ok(deployed.sentinel_id)
    }

    /// Sets sentinel `id` to stopped.
    pub async fn stop_sentinel(&self, id: &str) -> Result<()> {
        let stopped = self
            .call_named("stop the sentinel", StopSentinel { id: id.into() })
            .await?;
        ensure!(
            stopped == id,
            "sentinel {id} not stopped: the answer named {stopped}"
        );
        Ok(())
    }

    /// Sentinel `id` with its reported status.
    pub async fn sentinel(&self, id: &str) -> Result<SentinelView> {
        self.call_named("read the sentinel", GetSentinel { id: id.into() })
            .await
    }

    /// Reads sentinel `id` again until it satisfies `check` (ctrl has no
    /// call that waits for a sentinel's status); fails at `deadline`.
    pub async fn wait_sentinel(
        &self,
        id: &str,
        deadline: Instant,
        what: &str,
        check: impl Fn(&SentinelView) -> bool,
    ) -> Result<SentinelView> {
        // A failed read ends the wait (`Ok(Err(_))`); a view that does
        // not satisfy `check` yet is what was seen (`Err(view)`).
        wait_until(deadline, &format!("{what} of {id}"), async || {
            match self.sentinel(id).await {
                Ok(view) if check(&view) => Ok(Ok(view)),
                Ok(view) => Err(view),
                Err(e) => Ok(Err(e)),
            }
        })
        .await?
    }

    /// Starts a fleet rollout; the rollout as it started.
    pub async fn start_rollout(&self, options: RolloutOptions) -> Result<Rollout> {
        self.call_named("start the rollout", StartRollout { options })
            .await
    }

    /// Resumes, cancels or rolls back the latest rollout; the rollout after.
    pub async fn control_rollout(&self, command: RolloutCommand) -> Result<Rollout> {
        self.call_named(command.as_str(), ControlRollout { command })
            .await
    }

    /// The latest rollout.
    pub async fn rollout(&self) -> Result<Rollout> {
        self.call_named("read the rollout", RolloutStatus)
            .await?
            .context("no rollout")
    }

    /// Reads the latest rollout again until it satisfies `check`; fails at
    /// `deadline` naming what it last was.
    pub async fn wait_rollout(
        &self,
        deadline: Instant,
        what: &str,
        check: impl Fn(&Rollout) -> bool,
    ) -> Result<Rollout> {
        wait_until(deadline, what, async || match self.rollout().await {
            Ok(r) if check(&r) => Ok(Ok(r)),
            Ok(r) => Err(format!(
                "{} wave {} {:?}",
                r.state.as_str(),
                r.current_wave,
                r.wave_counts()
            )),
            Err(e) => Ok(Err(e)),
        })
        .await?
    }

    /// Creates or replaces a cilium policy; its id.
    pub async fn apply_policy(&self, policy: ApplyPolicy) -> Result<String> {
        self.call_named("apply the policy", policy).await
    }

    /// Deletes policy `id`.
    pub async fn delete_policy(&self, id: &str) -> Result<()> {
        let deleted = self
            .call_named("delete the policy", DeletePolicy { id: id.into() })
            .await?;
        ensure!(
            deleted == id,
            "policy {id} not deleted: the answer named {deleted}"
        );
        Ok(())
    }

    /// Registers region `name` (idempotent); the region as it now is.
    pub async fn add_region(&self, name: &str) -> Result<Region> {
        self.call_named("add the region", AddRegion { name: name.into() })
            .await
    }

    /// Registers every one of `names`, as an operator does before
    /// deploying to them (so a deploy does not race an agent's first
    /// heartbeat).
    pub async fn add_regions<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Result<()> {
        for name in names {
            self.add_region(name).await?;
        }
        Ok(())
    }

    /// Cordons (`schedulable = false`) or uncordons region `name`.
    pub async fn set_region_schedulable(&self, name: &str, schedulable: bool) -> Result<Region> {
        let request = SetRegionSchedulable {
            name: name.into(),
            schedulable,
        };
        self.call_named("cordon or uncordon", request).await
    }

    /// Every region with its agent's health, as `ctrl list regions` shows it.
    pub async fn regions(&self) -> Result<RegionList> {
        self.call_named("list the regions", ListRegions).await
    }

    /// Makes `call` and returns its answer; an error names `what` and
    /// the request.
    async fn call_named<C: Operation + Clone + Debug>(
        &self,
        what: &str,
        call: C,
    ) -> Result<C::Answer> {
        self.client
            .call(call.clone())
            .await
            .with_context(|| format!("{what}: {call:?}"))
    }
}

//! A ctrl cluster of separate processes on loopback, as it runs in
//! production (and as etcd's members run in the peer benchmark): each node
//! has its own scheduler threads, Raft thread and log writer, and competes
//! with the others only for the machine.
//!
//! The nodes are children of the calling binary, started with the
//! arguments it names plus `--config FILE` through the shared process
//! harness ([`testkit::process`]: output captured to `node-ID.log`, killed
//! on drop, tied to the parent); the child side is
//! [`serve_until_stdin_closes`]. A child stops when its stdin closes, so
//! nodes never outlive the benchmark that started them, even if it dies.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use config::{ConfigFile, NodeConfig, OperatorConfig};
use node::client::{Client, ClientError};
use testkit::process::{Process, Start, log_tail, tied_to_parent};
use wire::operator::request::{InitCluster, NodeStatus};

use crate::kit::wait::wait_until;

/// Bound on every node serving and agreeing on a leader.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on a child exiting once its stdin is closed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Running node processes; killed if dropped without [`ProcessCluster::shutdown`].
pub struct ProcessCluster {
    /// Data, configs and certificates of every node; removed on drop.
    pub dir: tempfile::TempDir,
    /// Node `i + 1`'s config at index `i`.
    pub configs: Vec<NodeConfig>,
    /// Names every node.
    pub operator: OperatorConfig,
    /// Node `i + 1`'s process at index `i`; `None` once killed.
    children: Vec<Option<Process>>,
    /// How a node is started: the program and its leading arguments.
    exe: std::path::PathBuf,
    args: Vec<String>,
}

impl ProcessCluster {
    /// Starts `count` nodes as `exe args… --config FILE`, initialises them
    /// as one cluster and waits until all of them know the same leader.
    pub async fn start(count: u64, exe: &Path, args: &[&str]) -> Result<ProcessCluster> {
        ProcessCluster::start_with(count, exe, args, |_| {}).await
    }

    /// [`ProcessCluster::start`] with each node's config adjusted by
    /// `configure` first.
    pub async fn start_with(
        count: u64,
        exe: &Path,
        args: &[&str],
        configure: impl Fn(&mut NodeConfig),
    ) -> Result<ProcessCluster> {
        let dir = tempfile::tempdir()?;
        let (configs, operator) = crate::plan::plan(dir.path(), count, configure)?;
        let mut cluster = ProcessCluster {
            dir,
            configs,
            operator,
            children: Vec::new(),
            exe: exe.to_path_buf(),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        for config in &cluster.configs {
            let path = cluster
                .dir
                .path()
                .join(format!("node-{}.toml", config.node_id));
            std::fs::write(&path, config.to_toml_string())
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        for id in 1..=count {
            let child = cluster.spawn(id)?;
            cluster.children.push(Some(child));
        }
        let started = match tokio::time::timeout(START_TIMEOUT, cluster.initialise()).await {
            Ok(started) => started,
            Err(_) => Err(anyhow::anyhow!(
                "the cluster did not start within {START_TIMEOUT:?}"
            )),
        };
        // The directory goes with the cluster: the logs' ends go with the error.
        started.with_context(|| cluster.log_tails())?;
        Ok(cluster)
    }

    /// The last lines of every node's log, for an error.
    fn log_tails(&self) -> String {
        const LINES: usize = 20;
        let tails: Vec<String> = self
            .configs
            .iter()
            .map(|c| log_tail(&self.log_path(c.node_id), LINES))
            .collect();
        format!("node logs:\n{}", tails.join("\n"))
    }

    fn log_path(&self, id: u64) -> std::path::PathBuf {
        self.dir.path().join(format!("node-{id}.log"))
    }

    /// Starts node `id`'s process (its config already written), its
    /// output appended to `node-ID.log`.
    fn spawn(&self, id: u64) -> Result<Process> {
        let path = self.dir.path().join(format!("node-{id}.toml"));
        let mut command = tied_to_parent(&self.exe);
        command.args(&self.args).arg("--config").arg(&path);
        Start::new(command, &self.log_path(id))
            .piped_stdin()
            .spawn()
    }

    fn index(id: u64) -> Result<usize> {
        usize::try_from(id.checked_sub(1).context("node ids start at 1")?)
            .context("a node id out of range")
    }

    /// SIGKILLs node `id` and reaps it.
    pub async fn kill(&mut self, id: u64) -> Result<()> {
        let slot = self
            .children
            .get_mut(Self::index(id)?)
            .context("no such node")?;
        if let Some(child) = slot.take() {
            child.kill();
        }
        Ok(())
    }

    /// Starts node `id` again, over its data directory.
    pub async fn restart(&mut self, id: u64) -> Result<()> {
        let index = Self::index(id)?;
        let child = self.spawn(id)?;
        *self.children.get_mut(index).context("no such node")? = Some(child);
        Ok(())
    }

    /// The process ids of the running nodes, node 1 first.
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.children
            .iter()
            .map(|c| c.as_ref().map(Process::pid))
            .collect()
    }

    /// An operator config for node `id` alone.
    pub fn operator_of(&self, id: u64) -> OperatorConfig {
        let addr =
            self.configs[usize::try_from(id.saturating_sub(1)).unwrap_or(usize::MAX)].listen_addr;
        OperatorConfig {
            endpoints: vec![addr],
            ..self.operator.clone()
        }
    }

    /// The leader every node agrees on, asking each node alone.
    pub async fn leader(&self) -> Result<Option<u64>> {
        let mut leaders = Vec::new();
        for config in &self.configs {
            let client = Client::new(&self.operator_of(config.node_id))?;
            leaders.push(client.call(NodeStatus).await?.leader_id);
        }
        Ok(match leaders.first() {
            Some(Some(first)) if leaders.iter().all(|l| *l == Some(*first)) => Some(*first),
            _ => None,
        })
    }

    /// Initialises the cluster through node 1 and waits until every node
    /// names the same leader, both bounded by [`START_TIMEOUT`] (the nodes
    /// offer no status stream to wait on, so both are asked again).
    async fn initialise(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        let first = Client::new(&self.operator_of(1))?;
        // The first call also waits for node 1 to serve: a failed call is
        // asked again, an unexpected answer ends the wait.
        let initialised =
            wait_until(
                deadline,
                "node 1 to initialise the cluster",
                async || match first.call(InitCluster).await {
                    Ok(_members) => Ok(Ok(())),
                    Err(e @ ClientError::UnexpectedAnswer { .. }) => Ok(Err(e)),
                    Err(e) => Err(e.to_string()),
                },
            )
            .await?;
        initialised?;
        wait_until(
            deadline,
            "every node to name one leader",
            async || match self.leader().await {
                Ok(Some(leader)) => Ok(leader),
                other => Err(format!("{other:?}")),
            },
        )
        .await?;
        crate::kit::operator::Operator::from(first)
            .add_regions(crate::requests::TEST_REGIONS)
            .await?;
        Ok(())
    }

    /// Closes every node's stdin and waits (bounded) for them to exit; a
    /// node still running then is killed.
    pub async fn shutdown(mut self) {
        let mut children: Vec<Process> = self.children.drain(..).flatten().collect();
        for child in &mut children {
            child.close_stdin();
        }
        // The exits are awaited on a thread: each wait blocks.
        let _ = tokio::task::spawn_blocking(move || {
            for mut child in children {
                if child.wait_exit(STOP_TIMEOUT).is_err() {
                    child.kill();
                }
            }
        })
        .await;
    }
}

/// The child side: serves the node configured in `config_path` until
/// stdin reaches its end (the parent closed it or died).
pub async fn serve_until_stdin_closes(config_path: &Path) -> Result<()> {
    let config = NodeConfig::load(config_path)?;
    let node = node::boot::start(&config).await?;
    let _ = tokio::task::spawn_blocking(|| {
        let mut buf = [0_u8; 64];
        while std::io::stdin().read(&mut buf).unwrap_or(0) > 0 {}
    })
    .await;
    node.shutdown().await;
    Ok(())
}

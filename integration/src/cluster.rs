//! An in-process ctrl node on loopback with fresh certificates, and an
//! operator client for it.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Result;
use config::{NodeConfig, OperatorConfig, TlsFiles};
use node::client::Client;
use node::node::RunningNode;

/// A single node serving from a temporary directory.
pub struct TestNode {
    pub dir: tempfile::TempDir,
    pub node: RunningNode,
    pub operator: OperatorConfig,
}

impl TestNode {
    /// Starts node 1 on an ephemeral loopback port.
    pub async fn start() -> Result<TestNode> {
        TestNode::start_with(|_| {}).await
    }

    /// Starts node 1 with its config changed by `configure` first.
    pub async fn start_with(configure: impl FnOnce(&mut NodeConfig)) -> Result<TestNode> {
        let dir = tempfile::tempdir()?;
        let certs = dir.path().join("certs");
        transport::certs::init_dir(
            &certs,
            &[1],
            &["us-east".to_string(), "eu-west".to_string()],
            &["ctrl.local".to_string(), "localhost".to_string()],
        )?;
        let mut config = NodeConfig::single_node_default(&dir.path().join("data"));
        config.listen_addr = "127.0.0.1:0".parse()?;
        config.tls = TlsFiles::in_dir(&certs, "node-1");
        configure(&mut config);
        let node = node::node::start(&config).await?;
        let operator = operator_config(&certs, node.local_addr);
        Ok(TestNode {
            dir,
            node,
            operator,
        })
    }

    pub fn client(&self) -> Result<Client> {
        Ok(Client::new(&self.operator)?)
    }
}

fn operator_config(certs: &Path, addr: SocketAddr) -> OperatorConfig {
    OperatorConfig {
        endpoints: vec![addr],
        tls: TlsFiles::in_dir(certs, "operator"),
        ..OperatorConfig::default()
    }
}

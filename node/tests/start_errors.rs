//! A node that cannot start says why, naming the file, address or setting
//! at fault (`node::boot::StartError`).

use std::net::UdpSocket;
use std::time::Duration;

use config::NodeConfig;
use node::boot::{self, StartError};

/// Bound on one start attempt.
const START_TIMEOUT: Duration = Duration::from_secs(20);

async fn start_error(config: &NodeConfig) -> StartError {
    match tokio::time::timeout(START_TIMEOUT, boot::start(config))
        .await
        .expect("start answers in time")
    {
        Ok(_) => panic!("the node started"),
        Err(e) => e,
    }
}

/// Certificates for node 1 under `dir/certs`, and a config of node 1 on an
/// ephemeral loopback port with data under `dir/data`.
fn config_with_certs(dir: &std::path::Path) -> NodeConfig {
    let certs = dir.join("certs");
    transport::certs::init_dir(
        &certs,
        &[1],
        &["us-east".to_string()],
        &["localhost".to_string()],
    )
    .unwrap();
    let mut config = NodeConfig::single_node_default(&dir.join("data"));
    config.listen_addr = "127.0.0.1:0".parse().unwrap();
    config.tls = config::TlsFiles::in_dir(&certs, "node-1");
    config.secrets_key = Some(certs.join(config::node::SECRETS_KEY_FILE));
    config
}

#[tokio::test]
async fn a_data_directory_that_is_a_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data");
    std::fs::write(&file, "not a directory").unwrap();
    let e = start_error(&NodeConfig::single_node_default(&file)).await;
    assert!(matches!(e, StartError::DataDir { .. }), "{e:?}");
    let message = e.to_string();
    assert!(message.contains(&file.display().to_string()), "{message}");
    assert!(message.contains("data_dir"), "{message}");
}

#[tokio::test]
async fn missing_tls_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = NodeConfig::single_node_default(dir.path());
    let e = start_error(&config).await;
    assert!(matches!(e, StartError::Tls { .. }), "{e:?}");
    let message = e.to_string();
    assert!(message.contains("tls.cert"), "{message}");
    assert!(
        message.contains(&config.tls.cert.display().to_string()),
        "{message}"
    );
}

#[tokio::test]
async fn an_address_in_use_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut config = config_with_certs(dir.path());
    config.listen_addr = taken.local_addr().unwrap();
    let e = start_error(&config).await;
    assert!(matches!(e, StartError::Listen { .. }), "{e:?}");
    let message = e.to_string();
    assert!(
        message.contains(&config.listen_addr.to_string()),
        "{message}"
    );
    assert!(message.contains("listen_addr"), "{message}");
}

#[tokio::test]
async fn a_state_file_of_another_kind_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_certs(dir.path());
    std::fs::create_dir_all(&config.data_dir).unwrap();
    let state = config.data_dir.join(boot::STATE_FILE);
    std::fs::write(&state, "not a redb file").unwrap();
    let e = start_error(&config).await;
    assert!(matches!(e, StartError::StateFile { .. }), "{e:?}");
    let message = e.to_string();
    assert!(message.contains(&state.display().to_string()), "{message}");
}

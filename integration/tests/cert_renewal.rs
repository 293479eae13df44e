//! Certificates renewed under a running cluster with krane watching
//! (issue 17's must-show): three `ctrl serve` processes and a `krane run`
//! process; `ctrl certs renew` replaces every leaf while they run. Every
//! node and krane reload their files; krane's watch stream is never reset
//! (no new watch attempt in its log, and a deployment made after the
//! renewal reaches the cluster over it); a new connection to each node is
//! served with the node's new certificate; a certificate whose not-after
//! is past is refused with an error saying so.

use std::path::Path;
use std::time::Duration;

use integration::kit::ctrl;
use integration::kit::operator::Operator;
use integration::kit::process::log_count;
use integration::kit::site::ProcessSite;
use integration::kit::wait::{bounded, wait_until};
use integration::requests;
use node::client::Client;
use tokio::time::Instant;
use transport::Identity;
use transport::certs::{self, CertBundle};
use wire::operator::request::NodeStatus;

const TEST_TIMEOUT: Duration = Duration::from_secs(240);
const WAIT: Duration = Duration::from_secs(60);
const READY_TIMEOUT_S: u64 = 60;
const NODES: u64 = 3;
const REGION: &str = "us-east";
/// How often the nodes read their TLS files again.
const RELOAD_INTERVAL_MS: u64 = 200;
/// What a node or krane logs when it loaded new TLS files.
const RELOADED: &str = "TLS certificate, key and CA bundle reloaded";
const SECS_PER_DAY: u64 = 86_400;

/// Watch attempts krane logged (each opens a new stream).
fn watch_attempts(log: &Path) -> usize {
    log_count(log, "full sync: watching from cursor") + log_count(log, "resumed at cursor")
}

/// Watch streams krane logged as ended.
fn watch_ends(log: &Path) -> usize {
    log_count(log, "watch failed") + log_count(log, "reconnecting")
}

/// The leaf certificate node `addr` presents to a new connection of
/// `operator`'s certificate.
async fn presented(operator: &config::OperatorConfig, addr: std::net::SocketAddr) -> Vec<u8> {
    let paths = transport::tls::TlsPaths {
        ca_cert: operator.tls.ca_cert.clone(),
        cert: operator.tls.cert.clone(),
        key: operator.tls.key.clone(),
    };
    let config =
        transport::tls::client_config(&paths, wire::operator::ALPN).expect("a client config");
    let endpoint =
        transport::endpoint::client_endpoint(transport::endpoint::client_bind_addr(addr))
            .expect("an endpoint");
    let (connection, _) =
        transport::endpoint::connect_any(&endpoint, &config, &[addr], "ctrl.local", 5_000)
            .await
            .expect("a new connection");
    let leaf = transport::identity::peer_leaf_der(&connection).expect("the node's certificate");
    connection.close(0u32.into(), b"done");
    leaf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_renewed_under_a_running_cluster() {
    bounded(TEST_TIMEOUT, async {
        let site = ProcessSite::start(NODES, &[REGION], |config| {
            config.tls.reload_interval_ms = RELOAD_INTERVAL_MS;
        })
        .await;
        let dir = site.dir.path();
        let certs_dir = site
            .operator
            .tls
            .ca_cert
            .parent()
            .expect("the certificate directory")
            .to_path_buf();
        let krane_log = dir.join(format!("krane-{REGION}.log"));
        let operator = Operator::new(&site.operator).expect("operator");

        // A deployment reaches krane over its watch stream.
        let (first, _) = operator
            .deploy(requests::deployment([REGION]).build())
            .await
            .expect("deploy");
        operator
            .ready(&first, READY_TIMEOUT_S)
            .await
            .expect("the first deployment is ready");
        let attempts = watch_attempts(&krane_log);
        assert!(attempts >= 1, "krane never watched");
        let ends = watch_ends(&krane_log);
        let node_cert = |id: u64| certs::node_bundle(&certs_dir, id).cert;
        let old: Vec<Vec<u8>> = (1..=NODES)
            .map(|id| certs::leaf_der(&node_cert(id)).expect("a node certificate"))
            .collect();

        // Every leaf renewed while everything runs.
        let printed = ctrl::cli()
            .await
            .expect("the ctrl binary")
            .ok(&[
                "certs",
                "renew",
                "--dir",
                certs_dir.to_str().expect("a UTF-8 path"),
                "--days",
                "90",
            ])
            .await
            .expect("ctrl certs renew");
        for file in [
            "node-1.pem",
            "node-3.pem",
            "operator.pem",
            "agent-us-east.pem",
        ] {
            assert!(printed.contains(file), "{file} not renewed: {printed}");
        }

        let logs: Vec<_> = (1..=NODES)
            .map(|id| dir.join(format!("node-{id}.log")))
            .chain([krane_log.clone()])
            .collect();
        wait_until(
            Instant::now() + WAIT,
            "every node and krane to reload their TLS files",
            async || {
                let counts: Vec<usize> = logs.iter().map(|l| log_count(l, RELOADED)).collect();
                if counts.iter().all(|&c| c == 1) {
                    Ok(())
                } else {
                    Err(format!("reloads logged (nodes 1-3, krane): {counts:?}"))
                }
            },
        )
        .await
        .expect("reloads");

        // New connections are served with the new certificates.
        for id in 1..=NODES {
            let index = usize::try_from(id - 1).expect("an index");
            let addr = site.configs[index].listen_addr;
            let seen = presented(&site.operator, addr).await;
            let new = certs::leaf_der(&node_cert(id)).expect("the renewed certificate");
            assert_ne!(new, old[index], "node {id}'s certificate was not renewed");
            assert_eq!(seen, new, "node {id} presents its old certificate");
        }

        // The watch stream was never reset: a deployment made now reaches
        // the cluster over it, and krane opened no other stream.
        let (second, _) = operator
            .deploy(
                requests::deployment([REGION])
                    .environment("env-after-renewal")
                    .build(),
            )
            .await
            .expect("deploy after the renewal");
        operator
            .ready(&second, READY_TIMEOUT_S)
            .await
            .expect("the second deployment is ready");
        assert_eq!(
            watch_attempts(&krane_log),
            attempts,
            "krane opened a new watch stream"
        );
        assert_eq!(watch_ends(&krane_log), ends, "krane's watch stream ended");

        // A certificate past its not-after is refused, saying so.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("a clock after 1970")
            .as_secs();
        let expired = CertBundle::in_dir(&certs_dir, "operator-expired");
        certs::issue_with_validity(
            &certs_dir,
            &expired,
            &Identity::unnamed_operator(),
            now - 10 * SECS_PER_DAY,
            now - SECS_PER_DAY,
        )
        .expect("an expired certificate");
        let mut config = site.operator.clone();
        config.tls.cert = expired.cert;
        config.tls.key = expired.key;
        let client = Client::new(&config).expect("a client");
        let error = client
            .call(NodeStatus)
            .await
            .expect_err("a call with an expired certificate");
        assert!(error.to_string().contains("expired"), "{error}");
    })
    .await
}

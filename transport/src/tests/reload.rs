//! Certificates renewed, reloaded and rotated under a live endpoint: new
//! handshakes present and check the new material, open connections keep
//! going, a reload that fails keeps the old material, an expired
//! certificate is refused, a CA bundle trusts both CAs of a rotation.

use std::path::Path;

use rustls::pki_types::CertificateDer;

use super::*;
use crate::reload::{ReloadOutcome, ReloadingTls, TlsReporter};
use crate::renew::{self, RenewSelection};

const ALPNS: [&[u8]; 2] = [wire::agent::ALPN, wire::operator::ALPN];

/// The leaf certificate a connection's peer presented.
fn peer_leaf(connection: &quinn::Connection) -> CertificateDer<'static> {
    connection
        .peer_identity()
        .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
        .expect("a peer certificate chain")[0]
        .clone()
}

/// The first certificate of a PEM file.
fn leaf_in(path: &Path) -> CertificateDer<'static> {
    tls::parse_certs(path, &tls::read_text(path).unwrap()).unwrap()[0].clone()
}

async fn connect(paths: &TlsPaths, server: SocketAddr) -> quinn::Connection {
    let (endpoint, config) = client(paths, wire::agent::ALPN, server);
    connect_any(
        &endpoint,
        &config,
        &[server],
        SERVER_NAME,
        CONNECT_TIMEOUT_MS,
    )
    .await
    .unwrap()
    .0
}

async fn call(connection: &quinn::Connection, msg: &str) -> Result<Answer, TransportError> {
    let mut stream = open_call(connection, Protocol::Agent, CLIENT_FRAME_BYTES_MAX).await?;
    stream.send(&msg.to_string()).await?;
    stream.finish().await?;
    Ok(stream.recv::<Answer>().await?.expect("an answer"))
}

#[tokio::test]
async fn a_renewed_certificate_is_used_by_new_connections_and_open_ones_keep_going() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let node = certs.tls_paths(certs.node(1).unwrap());
        let tls = ReloadingTls::load(&node, "node").unwrap();
        let (addr, mut events) = spawn_echo_server_with(tls.server_config(&ALPNS).unwrap());
        let agent = certs.tls_paths(certs.agent("us-east").unwrap());
        let old_leaf = leaf_in(&node.cert);
        let open = connect(&agent, addr).await;
        assert_eq!(peer_leaf(&open), old_leaf);
        assert_eq!(call(&open, "before").await.unwrap(), Ok("before".into()));
        assert!(matches!(events.recv().await, Some(Event::Call { .. })));

        assert!(matches!(tls.check().await, ReloadOutcome::Unchanged));
        let renewed = renew::renew(dir.path(), &RenewSelection::default(), 30).unwrap();
        assert_eq!(renewed.len(), 4, "{renewed:?}");
        assert!(matches!(tls.check().await, ReloadOutcome::Reloaded));
        let new_leaf = leaf_in(&node.cert);
        assert_ne!(new_leaf, old_leaf);
        assert_eq!(tls.leaf_der(), new_leaf);
        assert_eq!(tls.report().reloads, 1);

        // A new connection (with the renewed agent certificate) sees the
        // new node certificate; the open one keeps going.
        let fresh = connect(&agent, addr).await;
        assert_eq!(peer_leaf(&fresh), new_leaf);
        assert_eq!(call(&fresh, "after").await.unwrap(), Ok("after".into()));
        assert_eq!(call(&open, "still").await.unwrap(), Ok("still".into()));
        assert_eq!(open.close_reason(), None);
    })
    .await
}

#[tokio::test]
async fn a_reloading_client_presents_its_renewed_certificate() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let (addr, mut events) = spawn_echo_server(&certs.tls_paths(certs.node(1).unwrap()));
        let agent = certs.tls_paths(certs.agent("us-east").unwrap());
        let tls = ReloadingTls::load(&agent, "agent").unwrap();
        let config = tls.client_config(wire::agent::ALPN).unwrap();
        let endpoint = client_endpoint(client_bind_addr(addr)).unwrap();
        let selection = RenewSelection {
            agents: vec!["us-east".into()],
            ..RenewSelection::default()
        };
        renew::renew(dir.path(), &selection, 10).unwrap();
        assert!(matches!(tls.check().await, ReloadOutcome::Reloaded));
        // The same quinn config, built before the renewal.
        let (connection, _) = connect_any(&endpoint, &config, &[addr], SERVER_NAME, 5_000)
            .await
            .unwrap();
        assert_eq!(call(&connection, "x").await.unwrap(), Ok("x".into()));
        assert!(matches!(events.recv().await, Some(Event::Call { .. })));
        let report = tls.report();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let (name, not_after) = report.expiries[0];
        assert_eq!(name, "agent");
        assert!(not_after <= now + 10 * 86_400 && not_after > now + 9 * 86_400);
    })
    .await
}

#[tokio::test]
async fn a_reload_that_fails_keeps_the_old_material_and_names_the_file() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let node = certs.tls_paths(certs.node(1).unwrap());
        let tls = ReloadingTls::load(&node, "node").unwrap();
        let (addr, _events) = spawn_echo_server_with(tls.server_config(&ALPNS).unwrap());
        let agent = certs.tls_paths(certs.agent("us-east").unwrap());
        let old_leaf = leaf_in(&node.cert);
        let good_cert = std::fs::read(&node.cert).unwrap();

        std::fs::write(&node.cert, "-----BEGIN CERTIFICATE-----\nnope\n").unwrap();
        let ReloadOutcome::Failed(error) = tls.check().await else {
            panic!("a bad PEM was loaded");
        };
        assert!(error.to_string().contains("node-1.pem"), "{error}");
        // Reported once: the same content is not tried again.
        assert!(matches!(tls.check().await, ReloadOutcome::Unchanged));
        assert_eq!(tls.report().reload_failures, 1);
        assert_eq!(peer_leaf(&connect(&agent, addr).await), old_leaf);

        // A key that is not the certificate's.
        std::fs::write(&node.cert, &good_cert).unwrap();
        std::fs::copy(&certs.operator.key, &node.key).unwrap();
        let ReloadOutcome::Failed(error) = tls.check().await else {
            panic!("a key of another certificate was loaded");
        };
        assert!(
            error.to_string().contains("node-1.pem") && error.to_string().contains("node-1.key"),
            "{error}"
        );
        assert_eq!(tls.report().reload_failures, 2);
        assert_eq!(peer_leaf(&connect(&agent, addr).await), old_leaf);

        // A good pair again loads.
        renew::renew(
            dir.path(),
            &RenewSelection {
                nodes: vec![1],
                ..RenewSelection::default()
            },
            30,
        )
        .unwrap();
        assert!(matches!(tls.check().await, ReloadOutcome::Reloaded));
        assert_eq!(peer_leaf(&connect(&agent, addr).await), leaf_in(&node.cert));
    })
    .await
}

#[tokio::test]
async fn an_expired_client_certificate_is_refused() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let node = certs.tls_paths(certs.node(1).unwrap());
        let tls = ReloadingTls::load(&node, "node").unwrap();
        let (addr, mut events) = spawn_echo_server_with(tls.server_config(&ALPNS).unwrap());
        let expired = certs::CertBundle::in_dir(dir.path(), "agent-expired");
        let now = certs::now_unix_secs().unwrap();
        certs::issue_with_validity(
            dir.path(),
            &expired,
            &Identity::Agent {
                region: "us-east".into(),
            },
            now - 10 * 86_400,
            now - 86_400,
        )
        .unwrap();
        let config =
            tls::client_config(&expired.tls_paths(&certs.ca.cert), wire::agent::ALPN).unwrap();
        let reason = assert_client_refused(config, addr, &mut events).await;
        assert!(reason.contains("certificate expired"), "{reason}");
    })
    .await
}

#[tokio::test]
async fn a_ca_bundle_trusts_both_cas_until_the_old_one_is_dropped() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let certs = generate(dir.path());
        let node = certs.tls_paths(certs.node(1).unwrap());
        let tls = ReloadingTls::load(&node, "node").unwrap();
        let (addr, mut events) = spawn_echo_server_with(tls.server_config(&ALPNS).unwrap());
        let east = certs.tls_paths(certs.agent("us-east").unwrap());
        let west = certs.tls_paths(certs.agent("eu-west").unwrap());

        let rotated = renew::rotate_ca(dir.path()).unwrap();
        assert!(rotated.old_key.exists());
        assert_eq!(
            tls::parse_certs(&certs.ca.cert, &tls::read_text(&certs.ca.cert).unwrap())
                .unwrap()
                .len(),
            2
        );
        // The node and us-east move to the new CA; eu-west stays on the old.
        let selection = RenewSelection {
            nodes: vec![1],
            agents: vec!["us-east".into()],
            ..RenewSelection::default()
        };
        renew::renew(dir.path(), &selection, 30).unwrap();
        assert!(matches!(tls.check().await, ReloadOutcome::Reloaded));
        for paths in [&east, &west] {
            let connection = connect(paths, addr).await;
            assert_eq!(call(&connection, "hi").await.unwrap(), Ok("hi".into()));
            assert!(matches!(events.recv().await, Some(Event::Call { .. })));
        }

        assert_eq!(renew::drop_old_cas(dir.path()).unwrap(), 1);
        assert!(matches!(tls.check().await, ReloadOutcome::Reloaded));
        let connection = connect(&east, addr).await;
        assert_eq!(call(&connection, "hi").await.unwrap(), Ok("hi".into()));
        assert!(matches!(events.recv().await, Some(Event::Call { .. })));
        let config = tls::client_config(&west, wire::agent::ALPN).unwrap();
        let reason = assert_client_refused(config, addr, &mut events).await;
        assert!(
            reason.contains("UnknownIssuer") || reason.contains("BadSignature"),
            "{reason}"
        );
    })
    .await
}

#[test]
fn renew_keeps_identities_and_names_and_checks_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs::init_dir(dir.path(), &[1, 2], &[], &["ctrl.example.org".into()]).unwrap();
    let node2 = certs.node(2).unwrap();
    let before = std::fs::read(&node2.cert).unwrap();
    let inspect = |path: &Path| {
        crate::expiry::inspect_pem(path, &tls::read_text(path).unwrap()).unwrap()[0].clone()
    };
    let old = inspect(&node2.cert);

    // A missing certificate among those named: nothing is written.
    let selection = RenewSelection {
        nodes: vec![2, 3],
        ..RenewSelection::default()
    };
    let error = renew::renew(dir.path(), &selection, 30).unwrap_err();
    assert!(error.to_string().contains("node-3.pem"), "{error}");
    assert_eq!(std::fs::read(&node2.cert).unwrap(), before);
    for days in [0, renew::RENEW_DAYS_MAX + 1] {
        let error = renew::renew(dir.path(), &RenewSelection::default(), days).unwrap_err();
        assert!(matches!(error, CertError::InvalidInput(_)), "{error}");
    }

    let selection = RenewSelection {
        nodes: vec![2],
        ..RenewSelection::default()
    };
    let renewed = renew::renew(dir.path(), &selection, 30).unwrap();
    assert_eq!(renewed.len(), 1);
    assert_eq!(renewed[0].identity, Identity::Node { node_id: 2 });
    let new = inspect(&node2.cert);
    assert_eq!(new.identity, old.identity);
    assert_ne!(new.serial, old.serial);
    assert!(new.not_after_secs < old.not_after_secs);
    // The server names are kept: the renewed node still serves.
    let der = leaf_in(&node2.cert);
    let (_, x509) = x509_parser::parse_x509_certificate(&der).unwrap();
    let names = format!("{:?}", x509.subject_alternative_name().unwrap().unwrap());
    assert!(names.contains("ctrl.example.org"), "{names}");
    assert!(names.contains("127"), "{names}");
    // No temporary file is left behind.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn named_operators_are_renewed_by_name_and_by_default_keeping_their_grant() {
    let dir = tempfile::tempdir().unwrap();
    certs::init_dir(dir.path(), &[1], &[], &[]).unwrap();
    let grant = wire::access::Grant {
        name: "alice".into(),
        role: wire::access::Role::Deployer,
        environments: vec!["staging-*".into()],
    };
    certs::issue_named_operator(dir.path(), &grant).unwrap();
    let alice = certs::named_operator_bundle(dir.path(), "alice");
    let serial = |path: &Path| {
        crate::expiry::inspect_pem(path, &tls::read_text(path).unwrap()).unwrap()[0]
            .serial
            .clone()
    };
    let first = serial(&alice.cert);
    let by_name = RenewSelection {
        operators: vec!["alice".into()],
        ..RenewSelection::default()
    };
    let renewed = renew::renew(dir.path(), &by_name, 30).unwrap();
    assert_eq!(renewed.len(), 1);
    assert_eq!(renewed[0].identity, Identity::Operator(grant.clone()));
    let second = serial(&alice.cert);
    assert_ne!(second, first);
    // No selection renews every leaf, alice's among them.
    let all = renew::renew(dir.path(), &RenewSelection::default(), 30).unwrap();
    assert!(
        all.iter()
            .any(|r| r.identity == Identity::Operator(grant.clone()))
    );
    assert_ne!(serial(&alice.cert), second);
    // A name twice, or a malformed one, is refused before anything is written.
    for operators in [vec!["alice".into(), "alice".into()], vec!["Alice".into()]] {
        let selection = RenewSelection {
            operators,
            ..RenewSelection::default()
        };
        let error = renew::renew(dir.path(), &selection, 30).unwrap_err();
        assert!(matches!(error, CertError::InvalidInput(_)), "{error}");
    }
}

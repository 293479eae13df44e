//! The sentinel in-process on loopback, in front of small upstream
//! servers: balancing, route swaps, ejection and restore, 503s that say
//! why, h2c, upgrades, timeouts, the drain, the state directory, and
//! refused documents. Every test is bounded in time.

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::StatusCode;
use sentinel::routes::{OfferError, Offered};
use sentinel::source::ReloadError;
use sentinel::{RoutesSource, start};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wire::routes::RoutesError;

/// Names that answered `n` GETs of `/`.
async fn names(addr: SocketAddr, n: usize) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for _ in 0..n {
        let (status, body) = get(addr, "/").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        seen.insert(body);
    }
    seen
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[tokio::test]
async fn requests_reach_every_instance_and_a_new_generation_takes_over() {
    bounded(async {
        let a = Upstream::start("a").await;
        let b = Upstream::start("b").await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("routes.json");
        write_routes(&file, &document(1, &[("d1", 1, &[a.addr, b.addr])]));
        let sentinel = start(config(RoutesSource::File(file.clone())))
            .await
            .unwrap();
        assert_eq!(names(sentinel.addr(), 10).await, set(&["a", "b"]));

        // The headers the upstream saw: the client's Host, the forwarded
        // pair.
        let (status, headers, _) = get_with(&http1(), sentinel.addr(), "/").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            headers["x-seen-host"].to_str().unwrap(),
            sentinel.addr().to_string()
        );
        assert_eq!(headers["x-seen-forwarded-for"], "127.0.0.1");
        assert_eq!(headers["x-seen-forwarded-proto"], "http");

        let c = Upstream::start("c").await;
        write_routes(&file, &document(2, &[("d2", 1, &[c.addr])]));
        let offered = sentinel.reload().await.unwrap();
        assert!(matches!(offered, Offered::Applied(_)), "{offered:?}");
        assert_eq!(names(sentinel.addr(), 10).await, set(&["c"]));

        // An older generation is ignored.
        write_routes(&file, &document(1, &[("d1", 1, &[a.addr])]));
        let refused = sentinel.reload().await.unwrap_err();
        assert!(
            matches!(&refused, ReloadError::Refused(e) if e.reason() == "older_generation"),
            "{refused}"
        );
        assert_eq!(names(sentinel.addr(), 5).await, set(&["c"]));
        drop(b);
    })
    .await;
}

#[tokio::test]
async fn weights_split_the_traffic() {
    bounded(async {
        let a = Upstream::start("a").await;
        let b = Upstream::start("b").await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("routes.json");
        write_routes(
            &file,
            &document(1, &[("d1", 3, &[a.addr]), ("d2", 1, &[b.addr])]),
        );
        let sentinel = start(config(RoutesSource::File(file))).await.unwrap();
        let mut a_count = 0;
        for _ in 0..40 {
            let (_, body) = get(sentinel.addr(), "/").await;
            if body == "a" {
                a_count += 1;
            }
        }
        assert_eq!(a_count, 30);
    })
    .await;
}

#[tokio::test]
async fn a_dead_instance_is_retried_around_ejected_and_restored() {
    bounded(async {
        let a = Upstream::start("a").await;
        let b = Upstream::start("b").await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("routes.json");
        write_routes(&file, &document(1, &[("d1", 1, &[a.addr, b.addr])]));
        let sentinel = start(config(RoutesSource::File(file))).await.unwrap();
        assert_eq!(names(sentinel.addr(), 4).await, set(&["a", "b"]));

        let b_addr = b.kill().await;
        // Every request succeeds: the one that meets b is retried on a.
        assert_eq!(names(sentinel.addr(), 10).await, set(&["a"]));
        assert_eq!(sentinel.routes().ejected(), vec![b_addr]);
        let (_, metrics) = get(sentinel.admin_addr(), "/metrics").await;
        assert!(
            metrics.contains(r#"sentinel_upstream_errors_total{deployment="d1",kind="connect"} 1"#),
            "{metrics}"
        );
        assert!(
            metrics.contains("sentinel_instances_ejected 1"),
            "{metrics}"
        );

        // Listening again, b is probed back into rotation.
        let _b = Upstream::start_on("b", b_addr).await;
        sentinel
            .routes()
            .wait_until(|routes| routes.ejected().is_empty())
            .await;
        assert_eq!(names(sentinel.addr(), 4).await, set(&["a", "b"]));
    })
    .await;
}

#[tokio::test]
async fn no_routes_answers_503_naming_the_environment_and_why() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("routes.json");
        let sentinel = start(config(RoutesSource::File(file.clone())))
            .await
            .unwrap();
        let (status, body) = get(sentinel.addr(), "/").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("environment prod"), "{body}");
        assert!(body.contains("region eu"), "{body}");
        assert!(body.contains("no routes received yet"), "{body}");
        let (status, body) = get(sentinel.admin_addr(), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("no routes received yet"), "{body}");
        assert_eq!(get(sentinel.admin_addr(), "/livez").await.0, StatusCode::OK);
        assert_eq!(
            get(sentinel.addr(), sentinel::proxy::HEALTH_PATH).await,
            (StatusCode::OK, "ok\n".to_string())
        );

        // A route without a live deployment.
        write_routes(&file, &document(1, &[]));
        sentinel.reload().await.unwrap();
        let (status, body) = get(sentinel.addr(), "/").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.contains("environment prod has no live deployment in region eu"),
            "{body}"
        );

        // Every instance down: the one request meets a closed port, is
        // ejected, and nothing is left.
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        write_routes(&file, &document(2, &[("d1", 1, &[closed])]));
        sentinel.reload().await.unwrap();
        assert_eq!(
            get(sentinel.admin_addr(), "/readyz").await.0,
            StatusCode::OK
        );
        let (status, body) = get(sentinel.addr(), "/").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.contains("every instance of deployment d1 is down"),
            "{body}"
        );
        let (status, body) = get(sentinel.admin_addr(), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("deployment d1"), "{body}");
    })
    .await;
}

#[tokio::test]
async fn an_h2c_request_is_proxied() {
    bounded(async {
        let a = Upstream::start("a").await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("routes.json");
        write_routes(&file, &document(1, &[("d1", 1, &[a.addr])]));
        let sentinel = start(config(RoutesSource::File(file))).await.unwrap();
        let client = h2c();
        for _ in 0..3 {
            let (status, headers, body) = get_with(&client, sentinel.addr(), "/").await;
            assert_eq!((status, body.as_str()), (StatusCode::OK, "a"));
            // The HTTP/2 authority became the upstream's Host.
            assert_eq!(
                headers["x-seen-host"].to_str().unwrap(),
                sentinel.addr().to_string()
            );
        }
    })
    .await;
}

#[tokio::test]
async fn an_upgrade_passes_through_both_ways() {
    bounded(async {
        let a = Upstream::start("a").await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("routes.json");
        write_routes(&file, &document(1, &[("d1", 1, &[a.addr])]));
        let sentinel = start(config(RoutesSource::File(file))).await.unwrap();
        let mut stream = TcpStream::connect(sentinel.addr()).await.unwrap();
        stream
            .write_all(
                b"GET /ws HTTP/1.1\r\nHost: app\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            )
            .await
            .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "closed early");
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).unwrap();
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        assert!(head.to_ascii_lowercase().contains("upgrade: websocket"), "{head}");
        for message in [&b"ping"[..], b"second message"] {
            stream.write_all(message).await.unwrap();
            let mut echoed = vec![0u8; message.len()];
            stream.read_exact(&mut echoed).await.unwrap();
            assert_eq!(echoed, message);
        }
    })
    .await;
}

#[tokio::test]
async fn a_response_late_past_the_request_timeout_is_a_504() {
    bounded(async {
        let a = Upstream::start("a").await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("routes.json");
        write_routes(&file, &document(1, &[("d1", 1, &[a.addr])]));
        let mut config = config(RoutesSource::File(file));
        config.request_timeout = Duration::from_millis(200);
        let sentinel = start(config).await.unwrap();
        let (status, body) = get(sentinel.addr(), "/slow").await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
        assert!(body.contains("deployment d1"), "{body}");
        // Not a connect failure: nothing ejected.
        assert!(sentinel.routes().ejected().is_empty());
    })
    .await;
}

#[tokio::test]
async fn draining_finishes_in_flight_requests_and_refuses_new_connections() {
    bounded(async {
        let mut a = Upstream::start("a").await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("routes.json");
        write_routes(&file, &document(1, &[("d1", 1, &[a.addr])]));
        let sentinel = start(config(RoutesSource::File(file))).await.unwrap();
        let addr = sentinel.addr();
        let admin = sentinel.admin_addr();
        assert_eq!(get(admin, "/readyz").await.0, StatusCode::OK);

        let slow = tokio::spawn(async move { get(addr, "/slow").await });
        a.arrived.recv().await.expect("the slow request arrives");

        sentinel.begin_drain();
        let (status, body) = get(admin, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("draining"), "{body}");
        sentinel.listener_closed().await;
        let refused = TcpStream::connect(addr).await;
        assert!(refused.is_err(), "a connection while draining: {refused:?}");

        let stopped = tokio::spawn(sentinel.shutdown());
        a.release_one();
        assert_eq!(slow.await.unwrap(), (StatusCode::OK, "a slow".to_string()));
        stopped.await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_request_past_the_drain_grace_is_cut() {
    bounded(async {
        let mut a = Upstream::start("a").await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("routes.json");
        write_routes(&file, &document(1, &[("d1", 1, &[a.addr])]));
        let mut config = config(RoutesSource::File(file));
        config.drain_grace = Duration::from_millis(100);
        let sentinel = start(config).await.unwrap();
        let addr = sentinel.addr();
        let slow = tokio::spawn(async move {
            let request = hyper::Request::get(format!("http://{addr}/slow"))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            http1().request(request).await
        });
        a.arrived.recv().await.expect("the slow request arrives");
        sentinel.shutdown().await;
        assert!(slow.await.unwrap().is_err(), "the request was cut");
    })
    .await;
}

#[tokio::test]
async fn a_restart_with_an_unreadable_source_serves_the_stored_routes() {
    bounded(async {
        let a = Upstream::start("a").await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("routes.json");
        let state = dir.path().join("state");
        write_routes(&file, &document(3, &[("d1", 1, &[a.addr])]));
        let mut first = config(RoutesSource::File(file.clone()));
        first.state_dir = Some(state.clone());
        let sentinel = start(first.clone()).await.unwrap();
        assert_eq!(names(sentinel.addr(), 2).await, set(&["a"]));
        sentinel.shutdown().await;

        std::fs::remove_file(&file).unwrap();
        let restarted = start(first).await.unwrap();
        assert_eq!(restarted.routes().generation(), Some(3));
        assert_eq!(names(restarted.addr(), 2).await, set(&["a"]));
        assert_eq!(
            get(restarted.admin_addr(), "/readyz").await.0,
            StatusCode::OK
        );
        let (_, metrics) = get(restarted.admin_addr(), "/metrics").await;
        assert!(metrics.contains("sentinel_route_generation 3"), "{metrics}");
        assert!(
            metrics.contains("sentinel_source_errors_total 1"),
            "{metrics}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_newer_format_is_refused_and_the_last_table_keeps_serving() {
    bounded(async {
        let a = Upstream::start("a").await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("routes.json");
        write_routes(&file, &document(1, &[("d1", 1, &[a.addr])]));
        let sentinel = start(config(RoutesSource::File(file.clone())))
            .await
            .unwrap();
        std::fs::write(&file, r#"{"format":2,"tables":[]}"#).unwrap();
        let refused = sentinel.reload().await.unwrap_err();
        assert!(
            matches!(
                refused,
                ReloadError::Refused(OfferError::Parse(RoutesError::NewerFormat { found: 2 }))
            ),
            "{refused}"
        );
        assert_eq!(names(sentinel.addr(), 3).await, set(&["a"]));
        let (_, metrics) = get(sentinel.admin_addr(), "/metrics").await;
        assert!(
            metrics.contains(r#"sentinel_routes_refused_total{reason="newer_format"} 1"#),
            "{metrics}"
        );
        // A document for another environment is refused too.
        let mut other = document(5, &[("d9", 1, &[a.addr])]);
        other.environment_id = "staging".into();
        write_routes(&file, &other);
        let refused = sentinel.reload().await.unwrap_err();
        assert!(
            refused.to_string().contains("environment staging"),
            "{refused}"
        );
        assert_eq!(sentinel.routes().generation(), Some(1));
    })
    .await;
}

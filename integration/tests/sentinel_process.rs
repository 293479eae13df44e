//! The sentinel binary as a process against a site whose krane and ctrl
//! are gone: it keeps serving, and a sentinel SIGKILLed and started again
//! while the Kubernetes API is unreachable serves the routes it stored; a
//! SIGTERM lets a slow request started before it finish, then exits 0.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use integration::fleet::{Fleet, FleetConfig};
use integration::kit::operator::Operator;
use integration::kit::wait::bounded;
use integration::requests;
use k8s_sim::resources::DEPLOYMENTS;
use testkit::process::{Process, Start};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wire::workload::WorkloadSpec;

const TEST_TIMEOUT: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(30);
const REGION: &str = "us-east";
const ENV: &str = "prod";
const READY_LINE: &str = "sentinel listening on";

/// `GET path` through `addr`: the status and the body.
async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: prod\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("send: {e}"))?;
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(String::from_utf8_lossy(&answer).into_owned())
    };
    let text = tokio::time::timeout(WAIT, exchange)
        .await
        .map_err(|_| "no answer in time".to_string())??;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not HTTP: {text:?}"))?;
    Ok((
        status,
        text.split("\r\n\r\n").nth(1).unwrap_or("").to_string(),
    ))
}

/// Starts the sentinel binary reading `configmap` through `kubeconfig`.
async fn sentinel(
    dir: &Path,
    kubeconfig: &Path,
    configmap: &str,
    [listen, admin]: [SocketAddr; 2],
    state: &Path,
) -> Process {
    let bin = testkit::binaries::sentinel()
        .await
        .expect("sentinel binary");
    let command = testkit::process::tied_to_parent(bin);
    Start::new(command, &dir.join("sentinel.log"))
        .args(["--environment", ENV, "--region", REGION])
        .args(["--routes-configmap", configmap])
        .args([std::ffi::OsStr::new("--kubeconfig"), kubeconfig.as_os_str()])
        .args([std::ffi::OsStr::new("--state-dir"), state.as_os_str()])
        .args(["--listen", &listen.to_string()])
        .args(["--admin-addr", &admin.to_string()])
        .args(["--drain-grace-ms", "10000"])
        .ready_on(READY_LINE, WAIT)
        .spawn()
        .expect("sentinel starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_serves_its_last_routes_with_everything_else_down_and_drains() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut config = FleetConfig::new(dir.path(), vec![REGION.to_string()]).fast();
        config.traffic = true;
        let mut fleet = Fleet::start(config).await.expect("fleet");
        let operator = Operator::new(&fleet.operator).unwrap();
        let create = requests::deployment([REGION])
            .image("app:1")
            .environment(ENV)
            .spec(WorkloadSpec {
                port: Some(8080),
                ..WorkloadSpec::default()
            })
            .build();
        let id = operator.create(create).await.unwrap();
        operator.ready(&id, WAIT.as_secs()).await.expect("ready");
        let region = &fleet.regions[0];
        region
            .sentinels
            .as_ref()
            .unwrap()
            .wait_addr(ENV, WAIT)
            .await
            .unwrap();
        let sentinels = region.sim.list(&DEPLOYMENTS, Some("sentinel"), "");
        let env = &sentinels[0]["spec"]["template"]["spec"]["containers"][0]["env"];
        let configmap = env
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "SENTINEL_ROUTES_CONFIGMAP")
            .and_then(|e| e["value"].as_str())
            .expect("the routes ConfigMap")
            .to_string();

        // A sentinel process reading the routes krane wrote.
        let listen = testkit::ports::free_tcp_addr().unwrap();
        let state = dir.path().join("sentinel-state");
        let kubeconfig = region.kubeconfig.clone();
        let admin = testkit::ports::free_tcp_addr().unwrap();
        let addrs = [listen, admin];
        let mut first = sentinel(dir.path(), &kubeconfig, &configmap, addrs, &state).await;
        let mut answer = get(listen, "/").await;
        let started = std::time::Instant::now();
        while !matches!(&answer, Ok((200, body)) if body.contains("app:1"))
            && started.elapsed() < WAIT
        {
            answer = get(listen, "/").await;
        }
        assert!(
            matches!(&answer, Ok((200, b)) if b.contains("app:1")),
            "{answer:?}"
        );

        // krane and ctrl go; the sentinel is killed and comes back with
        // no API to read from (a kubeconfig naming a closed port).
        fleet.region_mut(REGION).stop_krane().await.unwrap();
        fleet.stop_ctrl().await;
        first.signal("KILL").unwrap();
        first.wait_exit(WAIT).unwrap();
        let dead = testkit::ports::free_tcp_addr().unwrap();
        let text = std::fs::read_to_string(&kubeconfig).unwrap();
        let server = fleet.regions[0].sim.url();
        let unreachable = dir.path().join("unreachable.kubeconfig");
        std::fs::write(
            &unreachable,
            text.replace(server.trim_end_matches('/'), &format!("http://{dead}")),
        )
        .unwrap();
        let mut second = sentinel(dir.path(), &unreachable, &configmap, addrs, &state).await;
        for _ in 0..5 {
            let answer = get(listen, "/").await;
            assert!(
                matches!(&answer, Ok((200, b)) if b.contains("app:1")),
                "{answer:?}"
            );
        }

        // SIGTERM while a slow request is in flight: it completes.
        let slow = tokio::spawn(async move { get(listen, "/_sim/sleep?ms=1500").await });
        // In flight once the sentinel counts it (the upstream holds it
        // for 1.5 s).
        let started = std::time::Instant::now();
        loop {
            let metrics = get(admin, "/metrics").await.unwrap_or_default().1;
            if metrics.contains("sentinel_requests_in_flight 1") {
                break;
            }
            assert!(
                started.elapsed() < WAIT,
                "the slow request never reached the sentinel"
            );
        }
        second.signal("TERM").unwrap();
        let answer = slow.await.unwrap();
        assert!(
            matches!(&answer, Ok((200, b)) if b.contains("app:1")),
            "{answer:?}"
        );
        let status = second.wait_exit(WAIT).unwrap();
        assert!(
            status.success(),
            "the sentinel exits 0 after its drain: {status:?}"
        );
        fleet.shutdown().await.unwrap();
    })
    .await;
}

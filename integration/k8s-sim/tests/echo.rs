//! Pods on the loopback network: each Running pod has its own `127.x.y.z`
//! address and an HTTP echo on each declared TCP port, closed when the pod
//! goes (deleted, scaled away, or the simulator shut down).

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use k8s_sim::{PodNetwork, SimConfig, Simulator, View, pod_ready};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const TEST_TIMEOUT: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(10);
const PORT: u16 = 8080;

async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("the test finishes in time")
}

async fn loopback_sim() -> Simulator {
    Simulator::start(SimConfig {
        pod_network: PodNetwork::Loopback,
        ..SimConfig::default()
    })
    .await
    .expect("simulator starts")
}

const JSON: &str = "Content-Type: application/json\r\n";

/// One HTTP/1.1 request on a fresh connection (closed after it), with
/// `headers` (each ending in CRLF); the status code and the body.
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("request sent");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response read");
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end: {response:?}"));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status: {head:?}"));
    (code, body.to_string())
}

async fn get_json(addr: SocketAddr, path: &str) -> Value {
    let (code, body) = http(addr, "GET", path, "", "").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

async fn create(sim: &Simulator, path: &str, object: Value) {
    let (code, body) = http(sim.addr(), "POST", path, JSON, &object.to_string()).await;
    assert_eq!(code, 201, "{body}");
}

fn deployment(name: &str, replicas: u32, ports: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": name},
           "spec": {"replicas": replicas,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name, "tier": "front"}},
                                 "spec": {"containers": [
                                     {"name": "app", "image": format!("{name}:1"), "ports": ports},
                                     {"name": "side", "image": "sidecar:1"}]}}}})
}

async fn create_deployment(sim: &Simulator, name: &str, replicas: u32, ports: Value) {
    let path = "/apis/apps/v1/namespaces/default/deployments";
    create(sim, path, deployment(name, replicas, ports)).await;
}

/// Waits for `count` ready pods labelled `app=NAME`; their names and IPs.
async fn ready_pods(sim: &Simulator, app: &str, count: usize) -> Vec<(String, Ipv4Addr)> {
    let selector = format!("app={app}");
    let ready = |v: &View<'_>| {
        let pods = v.pods("default", &selector);
        pods.len() == count && pods.iter().all(|p| pod_ready(p))
    };
    sim.wait_until(WAIT, ready)
        .await
        .unwrap_or_else(|e| panic!("{count} ready pods of {app}: {e}"));
    sim.pods("default", &selector)
        .iter()
        .map(|p| {
            let ip = p["status"]["podIP"].as_str().expect("a pod IP");
            assert_eq!(p["status"]["podIPs"], json!([{"ip": ip}]));
            (
                p["metadata"]["name"].as_str().unwrap().to_string(),
                ip.parse().expect("an IPv4 address"),
            )
        })
        .collect()
}

fn assert_refused(result: std::io::Result<TcpStream>, addr: SocketAddr) {
    match result {
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{addr}: {e}"),
        Ok(_) => panic!("{addr} still accepts connections"),
    }
}

#[tokio::test]
async fn a_pod_with_a_declared_port_answers_on_its_loopback_address() {
    bounded(async {
        let sim = loopback_sim().await;
        create_deployment(&sim, "web", 2, json!([{"containerPort": PORT}])).await;
        let pods = ready_pods(&sim, "web", 2).await;
        assert_ne!(pods[0].1, pods[1].1, "each pod its own address");
        for (name, ip) in &pods {
            assert!(ip.is_loopback() && *ip != Ipv4Addr::LOCALHOST, "{ip}");
            // Bound before the pod read as Running: no wait for the echo.
            let addr = SocketAddr::from((*ip, PORT));
            let echo = get_json(addr, "/hello?x=1").await;
            assert_eq!(echo["pod"], json!(name));
            assert_eq!(echo["namespace"], "default");
            assert_eq!(echo["image"], "web:1");
            assert_eq!(echo["labels"]["app"], "web");
            assert_eq!(echo["labels"]["tier"], "front");
            assert!(echo["labels"]["pod-template-hash"].is_string(), "{echo}");
            assert_eq!(
                (&echo["method"], &echo["path"], &echo["query"]),
                (&json!("GET"), &json!("/hello"), &json!("x=1"))
            );
            let (code, body) = http(addr, "POST", "/a/b", JSON, "{}").await;
            assert_eq!(code, 200);
            let posted: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(
                (&posted["method"], &posted["path"]),
                (&json!("POST"), &json!("/a/b"))
            );
            let upgrade = "Upgrade: websocket\r\n";
            assert_eq!(http(addr, "GET", "/ws", upgrade, "").await.0, 501);
        }
        let listening: Vec<SocketAddr> = pods.iter().map(|(_, ip)| (*ip, PORT).into()).collect();
        assert_eq!(sim.echo_addrs(), listening.into_iter().collect());
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn deleting_a_pod_or_scaling_to_zero_closes_its_listener() {
    bounded(async {
        let sim = loopback_sim().await;
        create_deployment(
            &sim,
            "api",
            1,
            json!([{"containerPort": PORT, "protocol": "TCP"}]),
        )
        .await;
        let (name, ip) = ready_pods(&sim, "api", 1).await.remove(0);
        let first = SocketAddr::from((ip, PORT));
        get_json(first, "/").await;

        let path = format!("/api/v1/namespaces/default/pods/{name}");
        assert_eq!(http(sim.addr(), "DELETE", &path, "", "").await.0, 200);
        sim.wait_echo(WAIT, |addrs| !addrs.contains(&first))
            .await
            .expect("the deleted pod's echo closes");
        assert_refused(TcpStream::connect(first).await, first);

        // The Deployment's new pod: a new address, served.
        let wait_new = |v: &View<'_>| {
            v.pods("default", "app=api")
                .iter()
                .any(|p| pod_ready(p) && p["metadata"]["name"] != json!(name))
        };
        sim.wait_until(WAIT, wait_new)
            .await
            .expect("a replacement pod");
        let (second_name, second_ip) = ready_pods(&sim, "api", 1).await.remove(0);
        assert_ne!(second_ip, ip, "an address is never reused");
        let second = SocketAddr::from((second_ip, PORT));
        assert_eq!(get_json(second, "/").await["pod"], json!(second_name));

        let deploy = "/apis/apps/v1/namespaces/default/deployments/api";
        let merge = "Content-Type: application/merge-patch+json\r\n";
        let zero = r#"{"spec": {"replicas": 0}}"#;
        let (code, body) = http(sim.addr(), "PATCH", deploy, merge, zero).await;
        assert_eq!(code, 200, "{body}");
        sim.wait_echo(WAIT, |addrs| addrs.is_empty())
            .await
            .expect("scaled to zero: no echo left");
        assert_refused(TcpStream::connect(second).await, second);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_refusing_image_closes_the_echo_and_it_comes_back_at_the_same_address() {
    bounded(async {
        let sim = loopback_sim().await;
        create_deployment(&sim, "web", 1, json!([{"containerPort": PORT}])).await;
        let (name, ip) = ready_pods(&sim, "web", 1).await.remove(0);
        let addr = SocketAddr::from((ip, PORT));
        get_json(addr, "/").await;

        sim.set_refusing_image("web:1", true);
        sim.wait_echo(WAIT, |addrs| !addrs.contains(&addr))
            .await
            .expect("the echo closes");
        assert_refused(TcpStream::connect(addr).await, addr);
        // The pod itself is untouched: the same one, Running and Ready.
        assert_eq!(ready_pods(&sim, "web", 1).await, [(name.clone(), ip)]);

        sim.set_refusing_image("web:1", false);
        sim.wait_echo(WAIT, |addrs| addrs.contains(&addr))
            .await
            .expect("the echo is back");
        assert_eq!(get_json(addr, "/").await["pod"], json!(name));
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn sleep_answers_after_the_asked_delay() {
    bounded(async {
        let sim = loopback_sim().await;
        create_deployment(&sim, "slow", 1, json!([{"containerPort": PORT}])).await;
        let (name, ip) = ready_pods(&sim, "slow", 1).await.remove(0);
        let addr = SocketAddr::from((ip, PORT));
        let started = Instant::now();
        let echo = get_json(addr, "/_sim/sleep?ms=200").await;
        assert!(
            started.elapsed() >= Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            (&echo["pod"], &echo["path"]),
            (&json!(name), &json!("/_sim/sleep"))
        );
        let too_long = format!("/_sim/sleep?ms={}", k8s_sim::echo::SLEEP_MS_MAX + 1);
        assert_eq!(http(addr, "GET", &too_long, "", "").await.0, 400);
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn pods_without_a_declared_port_get_an_address_but_no_listener() {
    bounded(async {
        let sim = loopback_sim().await;
        create_deployment(&sim, "quiet", 1, json!([])).await;
        create_deployment(
            &sim,
            "udp",
            1,
            json!([{"containerPort": PORT, "protocol": "UDP"}]),
        )
        .await;
        create_deployment(&sim, "loud", 1, json!([{"containerPort": PORT}])).await;
        let (_, quiet) = ready_pods(&sim, "quiet", 1).await.remove(0);
        let (_, udp) = ready_pods(&sim, "udp", 1).await.remove(0);
        let (_, loud) = ready_pods(&sim, "loud", 1).await.remove(0);
        let ips = [quiet, udp, loud];
        assert!(
            ips.iter()
                .all(|ip| ip.is_loopback() && *ip != Ipv4Addr::LOCALHOST)
        );
        assert!(
            ips[0] != ips[1] && ips[1] != ips[2] && ips[0] != ips[2],
            "{ips:?}"
        );
        let loud = SocketAddr::from((loud, PORT));
        assert_eq!(sim.echo_addrs().into_iter().collect::<Vec<_>>(), [loud]);
        for ip in [quiet, udp] {
            let addr = SocketAddr::from((ip, PORT));
            assert_refused(TcpStream::connect(addr).await, addr);
        }
        sim.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn shutting_down_closes_every_echo() {
    bounded(async {
        let sim = loopback_sim().await;
        create_deployment(
            &sim,
            "web",
            1,
            json!([{"containerPort": PORT}, {"containerPort": 9090}]),
        )
        .await;
        let (_, ip) = ready_pods(&sim, "web", 1).await.remove(0);
        let addrs: Vec<SocketAddr> = [PORT, 9090].map(|p| SocketAddr::from((ip, p))).into();
        for &addr in &addrs {
            get_json(addr, "/").await;
        }
        sim.shutdown().await;
        for addr in addrs {
            assert_refused(TcpStream::connect(addr).await, addr);
        }
    })
    .await;
}

#[tokio::test]
async fn the_cluster_network_keeps_ten_addresses_and_serves_nothing() {
    bounded(async {
        let sim = Simulator::start(SimConfig::default()).await.unwrap();
        create_deployment(&sim, "web", 1, json!([{"containerPort": PORT}])).await;
        let (_, ip) = ready_pods(&sim, "web", 1).await.remove(0);
        assert_eq!(IpAddr::from(ip).to_string().split('.').next(), Some("10"));
        assert!(sim.echo_addrs().is_empty());
        sim.shutdown().await;
    })
    .await;
}

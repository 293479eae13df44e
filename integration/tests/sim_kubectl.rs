//! The Kubernetes API simulator against the real `kubectl` (at
//! /usr/bin/kubectl, or `$KUBECTL`) and a raw HTTP client: server-side
//! apply, get/list with selectors, scale, delete with cascade, failing
//! images, watch resume and 410 Expired.
//!
//! Every test is bounded by [`TEST_TIMEOUT`]; waits are on the simulator's
//! change notifications (`Simulator::wait_until`), never sleeps.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use integration::kit::kubectl::kubectl;
use integration::kit::process::Cli;
use integration::kit::wait::bounded;
use k8s_sim::resources::{PODS, STATEFUL_SETS};
use k8s_sim::{SimConfig, Simulator, View, pod_ready};
use serde_json::{Value, json};
use tempfile::TempDir;

/// Bound on each test.
const TEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one wait for a condition of the simulator's state.
const WAIT: Duration = Duration::from_secs(20);

/// A simulator plus a kubeconfig and kubectl for it.
struct Fixture {
    sim: Simulator,
    dir: TempDir,
    kubectl: Cli,
}

impl Fixture {
    async fn start(config: SimConfig) -> Fixture {
        let sim = Simulator::start(config).await.expect("simulator starts");
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig)
            .expect("kubeconfig written");
        let kubectl = kubectl(&kubeconfig);
        Fixture { sim, dir, kubectl }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs kubectl; returns stdout, or panics with stderr.
    async fn kubectl(&self, args: &[&str]) -> String {
        self.kubectl
            .ok(args)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    async fn kubectl_json(&self, args: &[&str]) -> Value {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-o", "json"]);
        let out = self.kubectl(&all).await;
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}: {out}"))
    }

    async fn wait(&self, what: &str, predicate: impl FnMut(&View<'_>) -> bool) {
        self.sim
            .wait_until(WAIT, predicate)
            .await
            .unwrap_or_else(|e| panic!("waiting for {what}: {e}"));
    }
}

fn statefulset_yaml(name: &str, replicas: u32, image: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {name}
  labels:
    app.kubernetes.io/managed-by: krane
spec:
  replicas: {replicas}
  serviceName: {name}
  selector:
    matchLabels:
      app: {name}
  template:
    metadata:
      labels:
        app: {name}
    spec:
      containers:
      - name: app
        image: {image}
        resources:
          requests: {{cpu: 100m, memory: 64Mi}}
          limits: {{cpu: 100m, memory: 64Mi}}
"
    )
}

/// One HTTP/1.1 request; returns the status and the response (unread).
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> hyper::Response<Incoming> {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, addr.to_string())
        .header(CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    sender.send_request(req).await.expect("response")
}

/// One HTTP request with a JSON answer.
async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, Value) {
    let resp = send(addr, method, path, content_type, body).await;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}: {}", String::from_utf8_lossy(&bytes)));
    (status, value)
}

/// Server-side apply of a YAML body, as kube-rs does (with JSON) and
/// `kubectl apply --server-side` does.
async fn apply(
    addr: SocketAddr,
    path: &str,
    manager: &str,
    force: bool,
    yaml: &str,
) -> (u16, Value) {
    let query = format!("?fieldManager={manager}&force={force}");
    call(
        addr,
        "PATCH",
        &format!("{path}{query}"),
        "application/apply-patch+yaml",
        yaml,
    )
    .await
}

/// Reads watch events (one JSON object per line) until `count` arrived or
/// the stream ended.
async fn watch_events(resp: hyper::Response<Incoming>, count: usize) -> Vec<Value> {
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let mut events = Vec::new();
    while events.len() < count {
        let Some(frame) = body.frame().await else {
            break;
        };
        if let Ok(data) = frame.expect("frame").into_data() {
            buf.extend_from_slice(&data);
        }
        while let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            events.push(serde_json::from_slice(&line).expect("event is JSON"));
        }
    }
    events
}

fn names(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap_or("").to_string())
        .collect();
    names.sort();
    names
}

fn ready_pods(v: &View<'_>, selector: &str) -> usize {
    v.pods("default", selector)
        .into_iter()
        .filter(|p| pod_ready(p))
        .count()
}

#[tokio::test]
async fn kubectl_sees_applied_statefulset_scale_and_delete() {
    bounded(TEST_TIMEOUT, async {
        let f = Fixture::start(SimConfig {
            pod_ready_delay_ms: 20,
            ..SimConfig::default()
        })
        .await;
        let addr = f.sim.addr();
        let path = "/apis/apps/v1/namespaces/default/statefulsets/web";

        // Server-side apply over HTTP with a YAML body creates it (201).
        let (code, created) = apply(
            addr,
            path,
            "krane",
            true,
            &statefulset_yaml("web", 2, "nginx:1.27"),
        )
        .await;
        assert_eq!(code, 201, "{created}");
        assert_eq!(created["metadata"]["generation"], 1);
        assert_eq!(created["metadata"]["managedFields"][0]["manager"], "krane");

        let list = f.kubectl_json(&["get", "statefulsets"]).await;
        assert_eq!(names(&list), ["web"]);
        let sts = &list["items"][0];
        assert_eq!(sts["spec"]["replicas"], 2);
        assert_eq!(
            sts["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "krane"
        );
        assert!(
            sts["metadata"]["resourceVersion"]
                .as_str()
                .is_some_and(|rv| rv.parse::<u64>().is_ok())
        );

        f.wait("2 ready pods", |v| ready_pods(v, "app=web") == 2)
            .await;
        let pods = f.kubectl_json(&["get", "pods", "-l", "app=web"]).await;
        assert_eq!(names(&pods), ["web-0", "web-1"]);
        let mut ips = Vec::new();
        for pod in pods["items"].as_array().unwrap() {
            assert_eq!(pod["status"]["phase"], "Running");
            assert_eq!(pod["spec"]["containers"][0]["image"], "nginx:1.27");
            assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "StatefulSet");
            let ip = pod["status"]["podIP"].as_str().unwrap().to_string();
            assert!(ip.starts_with("10."), "{ip}");
            ips.push(ip);
            for kind in ["Ready", "ContainersReady"] {
                let c = pod["status"]["conditions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["type"] == kind)
                    .unwrap_or_else(|| panic!("condition {kind}"));
                assert_eq!(c["status"], "True");
            }
        }
        ips.sort();
        ips.dedup();
        assert_eq!(ips.len(), 2, "pod IPs are unique");
        let none = f.kubectl_json(&["get", "pods", "-l", "app!=web"]).await;
        assert!(names(&none).is_empty());

        // kubectl scale goes through the scale subresource.
        let out = f
            .kubectl(&["scale", "statefulset", "web", "--replicas=3"])
            .await;
        assert!(out.contains("scaled"), "{out}");
        f.wait("3 ready pods and status", |v| {
            let ready = v
                .get(&STATEFUL_SETS, "default", "web")
                .and_then(|s| s.pointer("/status/readyReplicas"))
                .and_then(Value::as_i64);
            ready_pods(v, "app=web") == 3 && ready == Some(3)
        })
        .await;
        let pods = f.kubectl_json(&["get", "pods", "-l", "app=web"]).await;
        assert_eq!(names(&pods), ["web-0", "web-1", "web-2"]);
        let sts = f.kubectl_json(&["get", "statefulset", "web"]).await;
        assert_eq!(sts["spec"]["replicas"], 3);
        assert_eq!(sts["metadata"]["generation"], 2);
        assert_eq!(sts["status"]["observedGeneration"], 2);
        assert_eq!(sts["status"]["updatedReplicas"], 3);
        let out = f
            .kubectl(&["rollout", "status", "statefulset", "web", "--timeout=20s"])
            .await;
        assert!(out.contains("roll out complete"), "{out}");

        // Re-applying krane's configuration conflicts with kubectl's scale
        // unless forced.
        let yaml = statefulset_yaml("web", 2, "nginx:1.27");
        let (code, status) = apply(addr, path, "krane", false, &yaml).await;
        assert_eq!(code, 409, "{status}");
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "Conflict");
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .contains(".spec.replicas"),
            "{status}"
        );
        let (code, _) = apply(addr, path, "krane", true, &yaml).await;
        assert_eq!(code, 200);
        f.wait("scale down to 2", |v| {
            v.pods("default", "app=web").len() == 2
        })
        .await;

        // Human-readable output uses the server's Table.
        let table = f.kubectl(&["get", "pods"]).await;
        assert!(table.starts_with("NAME"), "{table}");
        assert!(table.contains("Running"), "{table}");

        let out = f.kubectl(&["delete", "statefulset", "web"]).await;
        assert!(out.contains("deleted"), "{out}");
        f.wait("pods gone", |v| v.pods("default", "").is_empty())
            .await;
        assert!(names(&f.kubectl_json(&["get", "statefulsets"]).await).is_empty());
        assert!(names(&f.kubectl_json(&["get", "pods", "-l", "app=web"]).await).is_empty());
        f.sim.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn kubectl_apply_server_side_and_failing_images() {
    bounded(TEST_TIMEOUT, async {
        let f = Fixture::start(SimConfig {
            failing_images: vec!["registry.local/broken:1".into()],
            ..SimConfig::default()
        })
        .await;
        let manifest = f.path("bad.yaml");
        std::fs::write(
            &manifest,
            statefulset_yaml("bad", 1, "registry.local/broken:1"),
        )
        .unwrap();
        let out = f
            .kubectl(&["apply", "--server-side", "-f", manifest.to_str().unwrap()])
            .await;
        assert!(out.contains("serverside-applied"), "{out}");
        let waiting_reason = |p: &Value| {
            p.pointer("/status/containerStatuses/0/state/waiting/reason")
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        f.wait("ImagePullBackOff", |v| {
            v.pods("default", "app=bad")
                .first()
                .is_some_and(|p| waiting_reason(p).as_deref() == Some("ImagePullBackOff"))
        })
        .await;
        let pods = f.kubectl_json(&["get", "pods", "-l", "app=bad"]).await;
        let pod = &pods["items"][0];
        assert_eq!(pod["status"]["phase"], "Pending");
        assert_eq!(waiting_reason(pod).as_deref(), Some("ImagePullBackOff"));
        let message = pod
            .pointer("/status/containerStatuses/0/state/waiting/message")
            .and_then(Value::as_str)
            .unwrap_or("");
        assert!(message.contains("registry.local/broken:1"), "{message}");
        let table = f.kubectl(&["get", "pods"]).await;
        assert!(table.contains("ImagePullBackOff"), "{table}");
        let sts = f.kubectl_json(&["get", "statefulset", "bad"]).await;
        assert_eq!(sts["status"]["readyReplicas"], 0);

        // Fixing the image at run time lets the pod start.
        f.sim.remove_failing_image("registry.local/broken:1");
        f.wait("pod running", |v| ready_pods(v, "app=bad") == 1)
            .await;
        let pods = f.kubectl_json(&["get", "pods", "-l", "app=bad"]).await;
        assert_eq!(pods["items"][0]["status"]["phase"], "Running");
        f.sim.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn http_errors_are_status_objects() {
    bounded(TEST_TIMEOUT, async {
        let f = Fixture::start(SimConfig::default()).await;
        let addr = f.sim.addr();
        let pods = "/api/v1/namespaces/default/pods";
        let (code, s) = call(addr, "POST", pods, "application/json", "{not json").await;
        assert_eq!(
            (code, s["kind"].as_str(), s["reason"].as_str()),
            (400, Some("Status"), Some("BadRequest"))
        );
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                         "spec": {"containers": [{"name": "c", "image": "i"}]}})
        .to_string();
        let (code, _) = call(addr, "POST", pods, "application/json", &pod).await;
        assert_eq!(code, 201);
        let (code, s) = call(addr, "POST", pods, "application/json", &pod).await;
        assert_eq!((code, s["reason"].as_str()), (409, Some("AlreadyExists")));
        let (code, s) = call(addr, "GET", &format!("{pods}/nope"), "application/json", "").await;
        assert_eq!(
            (code, s["reason"].as_str(), s["details"]["name"].as_str()),
            (404, Some("NotFound"), Some("nope"))
        );
        let (code, s) = call(
            addr,
            "PATCH",
            &format!("{pods}/p"),
            "application/apply-patch+yaml",
            &pod,
        )
        .await;
        assert_eq!((code, s["reason"].as_str()), (422, Some("Invalid")));
        let (code, s) = call(
            addr,
            "GET",
            &format!("{pods}?labelSelector=a%20in%20(b"),
            "",
            "",
        )
        .await;
        assert_eq!((code, s["reason"].as_str()), (400, Some("BadRequest")));
        // A standalone pod starts too.
        f.wait("pod p running", |v| {
            v.get(&PODS, "default", "p").is_some_and(pod_ready)
        })
        .await;
        f.sim.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn watch_resumes_from_a_version_and_expires_old_ones() {
    bounded(TEST_TIMEOUT, async {
        let f = Fixture::start(SimConfig {
            event_history_len: 16,
            ..SimConfig::default()
        })
        .await;
        let addr = f.sim.addr();
        let cms = "/api/v1/namespaces/default/configmaps";
        let create = |name: &str| {
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"set": "a"}}})
                .to_string()
        };
        let (_, first) = call(addr, "POST", cms, "application/json", &create("c0")).await;
        let rv0 = first["metadata"]["resourceVersion"].as_str().unwrap().to_string();
        for name in ["c1", "c2"] {
            call(addr, "POST", cms, "application/json", &create(name)).await;
        }

        // Resuming after c0 replays c1 and c2, then follows live changes.
        let resp = send(addr, "GET", &format!("{cms}?watch=1&resourceVersion={rv0}&labelSelector=set%3Da"), "", "").await;
        assert_eq!(resp.status().as_u16(), 200);
        let watcher = tokio::spawn(watch_events(resp, 3));
        call(addr, "DELETE", &format!("{cms}/c1"), "application/json", "").await;
        let events = watcher.await.unwrap();
        let seen: Vec<(String, String)> = events
            .iter()
            .map(|e| (e["type"].as_str().unwrap().into(), e["object"]["metadata"]["name"].as_str().unwrap().into()))
            .collect();
        let want = [("ADDED", "c1"), ("ADDED", "c2"), ("DELETED", "c1")];
        assert_eq!(seen, want.map(|(t, n)| (t.to_string(), n.to_string())));

        // A list's resourceVersion is a valid resume point.
        let (_, list) = call(addr, "GET", cms, "", "").await;
        assert_eq!(list["kind"], "ConfigMapList");
        let list_rv = list["metadata"]["resourceVersion"].as_str().unwrap().to_string();
        assert_eq!(list_rv, f.sim.resource_version().to_string());

        // Push the first events out of the 16-event history: 410 Expired.
        for i in 0..20 {
            call(addr, "POST", cms, "application/json", &create(&format!("x{i}"))).await;
        }
        let resp = send(addr, "GET", &format!("{cms}?watch=true&resourceVersion={rv0}"), "", "").await;
        let events = watch_events(resp, 2).await;
        assert_eq!(events.len(), 1, "the stream ends after the error: {events:?}");
        assert_eq!(events[0]["type"], "ERROR");
        assert_eq!(events[0]["object"]["kind"], "Status");
        assert_eq!(events[0]["object"]["code"], 410);
        assert_eq!(events[0]["object"]["reason"], "Expired");

        // timeoutSeconds ends a quiet watch.
        let now = f.sim.resource_version();
        let resp = send(addr, "GET", &format!("{cms}?watch=1&resourceVersion={now}&timeoutSeconds=1"), "", "").await;
        let events = watch_events(resp, usize::MAX).await;
        assert!(events.is_empty(), "{events:?}");
        f.sim.shutdown().await;
    })
    .await
}

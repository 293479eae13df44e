//! Webhook notifications are delivered at least once, with real
//! processes: three `ctrl serve` nodes and two webhook receivers on
//! loopback (small hyper servers in this test), added with the `ctrl
//! notify` commands — `chat` with a secret, `void` without.
//!
//! Deploys to a region without an agent fail at their progress deadline;
//! each failure is an event, one delivery per endpoint.
//!
//! - The first failure happens while neither receiver listens; its
//!   delivery to `chat` has been attempted (and failed) when the leader
//!   is SIGKILLed. The second failure happens on the new leader, still
//!   with nothing listening.
//! - Then `chat`'s receiver starts, answering 500 to its first two
//!   requests: it gets both events, each answered 2xx at least once,
//!   every request with the event id header equal to the body's, the
//!   same id on every retry, and a signature that verifies (checked here
//!   with ring's HMAC, not the node's code).
//! - `void` never answers: both its deliveries end `dead` after the
//!   node's `notify.max_attempts`. Then its receiver starts, `ctrl notify
//!   replay` makes them pending again, and they are delivered.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use config::{ConfigFile, NodeConfig, OperatorConfig};
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use integration::kit::binaries;
use integration::kit::ctrl;
use integration::kit::process::{Cli, Process};
use integration::kit::wait::{bounded, wait_until, within};
use integration::plan::plan;
use node::client::Client;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use wire::notify::{Delivery, DeliveryState, EVENT_ID_HEADER, SIGNATURE_HEADER};
use wire::operator::request::{InitCluster, ListDeliveries, NodeStatus};

/// Bound on the whole scenario (building the binaries comes before it).
const TEST_TIMEOUT: Duration = Duration::from_secs(180);
/// Bound on one wait.
const WAIT: Duration = Duration::from_secs(40);
const NODES: u64 = 3;
const REGION: &str = "us-east";
/// Attempts per delivery: `void`'s deliveries die after these.
const MAX_ATTEMPTS: u32 = 10;
/// Backoff between attempts: 200 ms doubling to 1.5 s, so a delivery
/// lives about ten seconds — longer than `chat`'s receiver is down.
const BACKOFF_INITIAL_MS: u64 = 200;
const BACKOFF_MAX_MS: u64 = 1_500;
/// Requests `chat`'s receiver answers with 500 before answering 200.
const FAIL_FIRST: u32 = 2;
const SECRET: &str = "webhook-s3cret";

fn configure(config: &mut NodeConfig) {
    config.deploy.leader_grace_ms = 500;
    config.notify.max_attempts = MAX_ATTEMPTS;
    config.notify.backoff_initial_ms = BACKOFF_INITIAL_MS;
    config.notify.backoff_max_ms = BACKOFF_MAX_MS;
    config.notify.request_timeout_ms = 2_000;
}

/// One request a receiver got.
#[derive(Debug, Clone)]
struct Received {
    event_id_header: Option<String>,
    signature: Option<String>,
    body: Vec<u8>,
    answered: StatusCode,
}

impl Received {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    fn event_id(&self) -> String {
        self.json()["event_id"]
            .as_str()
            .expect("an event id")
            .to_string()
    }
}

/// A webhook receiver on `addr`: answers 500 to its first `fail_first`
/// requests, then 200; every request is published on the watch channel.
async fn receiver(addr: SocketAddr, fail_first: u32) -> watch::Receiver<Vec<Received>> {
    let listener = TcpListener::bind(addr).await.expect("bind the receiver");
    let (seen, received) = watch::channel(Vec::new());
    let seen = Arc::new(seen);
    let failures_left = Arc::new(AtomicU32::new(fail_first));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (seen, failures_left) = (seen.clone(), failures_left.clone());
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let (seen, failures_left) = (seen.clone(), failures_left.clone());
                    async move {
                        let header = |name: &str| {
                            request
                                .headers()
                                .get(name)
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_string)
                        };
                        let (event_id_header, signature) =
                            (header(EVENT_ID_HEADER), header(SIGNATURE_HEADER));
                        let body = request
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes().to_vec())
                            .unwrap_or_default();
                        let fail = failures_left
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok();
                        let answered = if fail {
                            StatusCode::INTERNAL_SERVER_ERROR
                        } else {
                            StatusCode::OK
                        };
                        seen.send_modify(|all| {
                            all.push(Received {
                                event_id_header,
                                signature,
                                body,
                                answered,
                            })
                        });
                        let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
                        *response.status_mut() = answered;
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    received
}

/// A loopback address nothing listens on (yet).
fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("an address")
}

/// Three `ctrl serve` processes (any may be down) and the operator's
/// config file.
struct Site {
    dir: tempfile::TempDir,
    ctrl: PathBuf,
    configs: Vec<NodeConfig>,
    operator: OperatorConfig,
    operator_file: PathBuf,
    nodes: BTreeMap<u64, Process>,
}

impl Site {
    async fn start() -> Site {
        let ctrl = binaries::ctrl()
            .await
            .expect("the ctrl binary")
            .to_path_buf();
        let dir = tempfile::tempdir().expect("tempdir");
        let (configs, operator) = plan(dir.path(), NODES, configure).expect("plan the cluster");
        for config in &configs {
            std::fs::write(
                dir.path().join(format!("node-{}.toml", config.node_id)),
                config.to_toml_string(),
            )
            .expect("write a node config");
        }
        let operator_file = dir.path().join("operator.toml");
        std::fs::write(&operator_file, operator.to_toml_string()).expect("write operator.toml");
        let mut site = Site {
            dir,
            ctrl,
            configs,
            operator,
            operator_file,
            nodes: BTreeMap::new(),
        };
        for id in 1..=NODES {
            site.start_node(id);
        }
        let first = Client::new(&site.operator_of(1)).expect("client");
        wait_until(
            Instant::now() + WAIT,
            "node 1 to initialise the cluster",
            async || match first.call(InitCluster).await {
                Ok(_members) => Ok(()),
                Err(e) => Err(format!("{e:?}")),
            },
        )
        .await
        .expect("cluster init");
        site.agreed_leader(&[1, 2, 3]).await;
        site
    }

    fn start_node(&mut self, id: u64) {
        let mut command = std::process::Command::new(&self.ctrl);
        command
            .args(["serve", "--config"])
            .arg(self.dir.path().join(format!("node-{id}.toml")))
            .env("CTRL_LOG", "info,node::jobs::notify=debug")
            .env("NO_COLOR", "1");
        let log = self.dir.path().join(format!("node-{id}.log"));
        let process = Process::start(command, &log).expect("ctrl serve starts");
        self.nodes.insert(id, process);
    }

    fn kill(&mut self, id: u64) {
        self.nodes.remove(&id).expect("the node runs").kill();
    }

    fn operator_of(&self, id: u64) -> OperatorConfig {
        let index = usize::try_from(id - 1).expect("a node id");
        OperatorConfig {
            endpoints: vec![self.configs[index].listen_addr],
            ..self.operator.clone()
        }
    }

    async fn cli(&self) -> Cli {
        ctrl::with_config(&self.operator_file).await.expect("ctrl")
    }

    /// The leader nodes `ids` (each asked alone) all name.
    async fn agreed_leader(&self, ids: &[u64]) -> u64 {
        wait_until(
            Instant::now() + WAIT,
            "the nodes to name one leader",
            async || {
                let mut leaders = Vec::new();
                for id in ids {
                    let client = Client::new(&self.operator_of(*id)).map_err(|e| e.to_string())?;
                    match client.call(NodeStatus).await {
                        Ok(status) => leaders.push(status.leader_id),
                        Err(e) => return Err(format!("node {id}: {e:?}")),
                    }
                }
                match leaders.first() {
                    Some(Some(first))
                        if leaders.iter().all(|l| *l == Some(*first)) && ids.contains(first) =>
                    {
                        Ok(*first)
                    }
                    _ => Err(format!("leaders named: {leaders:?}")),
                }
            },
        )
        .await
        .expect("one leader")
    }
}

/// Every delivery, as the node answers `ListDeliveries`.
async fn deliveries(client: &Client) -> Result<Vec<Delivery>, String> {
    let request = ListDeliveries {
        after: 0,
        limit: 1_000,
    };
    match client.call(request).await {
        Ok(page) => Ok(page.items),
        Err(e) => Err(format!("{e:?}")),
    }
}

/// Creates a deploy to the agentless region that fails at its deadline;
/// waits until its event's deliveries exist; the event id.
async fn failed_deploy(client: &Client, env: &str) -> u64 {
    let mut request = integration::requests::deployment([REGION])
        .owner("ws_notify", "proj_notify", env)
        .build();
    request.progress_deadline_ms = Some(wire::operator::PROGRESS_DEADLINE_MS_MIN);
    let id = client.call(request).await.expect("create");
    wait_until(
        Instant::now() + WAIT,
        "the failure's deliveries",
        async || {
            let all = deliveries(client).await?;
            let mine: Vec<&Delivery> = all
                .iter()
                .filter(|d| {
                    matches!(&d.event, wire::notify::NotifyEvent::DeploymentFailed {
                        deployment_id, ..
                    } if *deployment_id == id)
                })
                .collect();
            match mine.as_slice() {
                [a, b] if a.event_id == b.event_id => Ok(a.event_id),
                _ => Err(format!("{all:?}")),
            }
        },
    )
    .await
    .expect("deliveries of the failure")
}

fn verify(secret: &str, body: &[u8], signature: &str) -> bool {
    let Some(hex) = signature.strip_prefix("sha256=") else {
        return false;
    };
    let Ok(tag) = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<Vec<u8>, _>>()
    else {
        return false;
    };
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    ring::hmac::verify(&key, body, &tag).is_ok()
}

fn of(all: &[Delivery], endpoint: &str) -> Vec<Delivery> {
    all.iter()
        .filter(|d| d.endpoint == endpoint)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_get_every_notification_across_outages_and_a_leader_kill() {
    let mut site = Site::start().await;
    bounded(TEST_TIMEOUT, async {
        let cli = site.cli().await;
        let client = Client::new(&site.operator).expect("client");
        cli.ok(&["region", "add", REGION])
            .await
            .expect("region add");
        let (chat_addr, void_addr) = (free_addr(), free_addr());
        let secret_file = site.dir.path().join("chat.secret");
        std::fs::write(&secret_file, format!("{SECRET}\n")).expect("write the secret");
        let chat_url = format!("http://{chat_addr}/hooks/chat");
        let secret_arg = secret_file.to_str().expect("a UTF-8 path");
        cli.ok(&[
            "notify",
            "add",
            "chat",
            "--url",
            &chat_url,
            "--secret-file",
            secret_arg,
        ])
        .await
        .expect("notify add chat");
        let void_url = format!("http://{void_addr}/void");
        cli.ok(&["notify", "add", "void", "--url", &void_url])
            .await
            .expect("notify add void");
        let listed = cli
            .ok(&["notify", "list", "-o", "json"])
            .await
            .expect("list");
        assert!(
            !listed.contains(SECRET),
            "the secret is never shown: {listed}"
        );
        let listed: serde_json::Value = serde_json::from_str(&listed).expect("JSON");
        assert_eq!(listed[0]["name"], "chat");
        assert_eq!(listed[0]["secret"], "set");
        assert_eq!(listed[1]["secret"], "none");

        // The first failure: nothing listens; an attempt fails, then the
        // leader dies.
        let first = failed_deploy(&client, "env_one").await;
        wait_until(
            Instant::now() + WAIT,
            "a failed attempt to chat",
            async || {
                let all = deliveries(&client).await?;
                match of(&all, "chat").first() {
                    Some(d) if d.attempts >= 1 && d.state == DeliveryState::Pending => Ok(()),
                    _ => Err(format!("{all:?}")),
                }
            },
        )
        .await
        .expect("an attempt recorded");
        let leader = site.agreed_leader(&[1, 2, 3]).await;
        site.kill(leader);
        let others: Vec<u64> = (1..=NODES).filter(|id| *id != leader).collect();
        let new_leader = site.agreed_leader(&others).await;
        assert_ne!(new_leader, leader);

        // The second failure, on the new leader, still unheard.
        let second = failed_deploy(&client, "env_two").await;
        assert_ne!(first, second);

        // chat comes up, failing its first requests.
        let mut chat = receiver(chat_addr, FAIL_FIRST).await;
        let wanted = [first.to_string(), second.to_string()];
        let got = within(WAIT, "chat's receiver to get both events", async {
            chat.wait_for(|all| {
                wanted.iter().all(|id| {
                    all.iter()
                        .any(|r| r.answered == StatusCode::OK && r.event_id() == *id)
                })
            })
            .await
            .expect("the receiver runs")
            .clone()
        })
        .await;
        assert!(
            got.len() > wanted.len(),
            "the 500s were retried: {} requests",
            got.len()
        );
        let mut retried = false;
        for request in &got {
            let id = request.event_id();
            assert!(wanted.contains(&id), "an event of this test: {id}");
            assert_eq!(request.event_id_header.as_deref(), Some(id.as_str()));
            let signature = request.signature.as_deref().expect("a signature");
            assert!(
                verify(SECRET, &request.body, signature),
                "the signature verifies"
            );
            let json = request.json();
            assert_eq!(json["kind"], "deployment.failed");
            assert!(json["text"].as_str().expect("text").contains("failed"));
            let same: Vec<&Received> = got.iter().filter(|r| r.event_id() == id).collect();
            assert!(
                same.iter().all(|r| r.body == request.body),
                "the same body on retries"
            );
            retried |= same.len() > 1;
        }
        assert!(retried, "an event was sent again with the same id");
        wait_until(
            Instant::now() + WAIT,
            "chat's deliveries recorded",
            async || {
                let all = deliveries(&client).await?;
                let chat = of(&all, "chat");
                if chat.len() == 2 && chat.iter().all(|d| d.state == DeliveryState::Delivered) {
                    Ok(())
                } else {
                    Err(format!("{chat:?}"))
                }
            },
        )
        .await
        .expect("delivered");

        // void never answered: dead after the most attempts.
        let dead = wait_until(
            Instant::now() + WAIT,
            "void's deliveries dead",
            async || {
                let all = deliveries(&client).await?;
                let void = of(&all, "void");
                if void.len() == 2 && void.iter().all(|d| d.state == DeliveryState::Dead) {
                    Ok(void)
                } else {
                    Err(format!("{void:?}"))
                }
            },
        )
        .await
        .expect("dead");
        for d in &dead {
            assert_eq!(d.attempts, MAX_ATTEMPTS, "{d:?}");
            assert!(d.last_error.is_some(), "{d:?}");
        }
        let shown = cli
            .ok(&["notify", "deliveries", "-o", "json"])
            .await
            .expect("deliveries");
        let shown: serde_json::Value = serde_json::from_str(&shown).expect("JSON");
        assert_eq!(shown["deliveries"].as_array().expect("a list").len(), 4);
        assert_eq!(shown["dropped"], 0);

        // void comes up; a replay delivers each again, same event ids.
        let mut void = receiver(void_addr, 0).await;
        for d in &dead {
            cli.ok(&["notify", "replay", &d.id.to_string()])
                .await
                .expect("replay");
        }
        let got = within(WAIT, "void's receiver to get both events", async {
            void.wait_for(|all| {
                wanted
                    .iter()
                    .all(|id| all.iter().any(|r| r.event_id() == *id))
            })
            .await
            .expect("the receiver runs")
            .clone()
        })
        .await;
        assert!(
            got.iter().all(|r| r.signature.is_none()),
            "void has no secret"
        );
        wait_until(
            Instant::now() + WAIT,
            "void's deliveries recorded",
            async || {
                let all = deliveries(&client).await?;
                let void = of(&all, "void");
                if void
                    .iter()
                    .all(|d| d.state == DeliveryState::Delivered && d.attempts == 1)
                {
                    Ok(())
                } else {
                    Err(format!("{void:?}"))
                }
            },
        )
        .await
        .expect("delivered after the replay");
    })
    .await;
    drop(site);
}

//! `live-switch`: how fast a rollback moves an environment's traffic.
//!
//! A fleet with traffic ([`integration::fleet`], one ctrl node, one region:
//! the simulator's pods answer HTTP on loopback with a JSON echo naming
//! their image, and the environment's real sentinel runs in process).
//! v1 (`app:1`, port 8080) then v2 (`app:2`) are deployed to environment
//! `prod` and each is seen answering through the sentinel. A client then
//! polls the sentinel's address as fast as it can (one request at a time
//! on a keep-alive connection, each bounded), and `--flips` times the
//! environment is rolled back to the other deployment (`Rollback { to }`,
//! alternating). Before each flip, outside the measured time, the target
//! is ready and the last answer came from the live one.
//!
//! Figures (JSON lines, then a table on stderr):
//!
//! - `ack_to_first_answer`: from the rollback call's acknowledgement to
//!   the first answer from the target deployment through the sentinel —
//!   the workflow making it live, krane writing the routes ConfigMap, the
//!   sentinel's watch swapping its table; p50/p99/max (µs, and ms).
//!   `answers_before_ack` counts flips seen before the acknowledgement
//!   (counted as 0).
//! - `request_to_first_answer`: the same from the rollback's request.
//! - `rollback_call`: the call itself, request to acknowledgement.
//! - `poll`: the client's requests and how many failed (not a 200 echo,
//!   or no answer): a flip should fail none.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use integration::fleet::{Fleet, FleetConfig};
use integration::kit::operator::Operator;
use integration::stats::Summary;
use tokio::sync::watch;
use wire::model::DeploymentStatus;
use wire::workload::WorkloadSpec;

use crate::common::print_value;
use crate::print_summary;

const SCENARIO: &str = "live-switch";
const REGION: &str = "us-east";
const ENVIRONMENT: &str = "prod";
const PORT: u16 = 8080;
/// v1's and v2's images.
const IMAGES: [&str; 2] = ["app:1", "app:2"];
/// Bound on a deployment becoming ready, in seconds.
const READY_TIMEOUT_S: u64 = 60;
/// Bound on the environment's sentinel running, on the first answer from
/// a deployment just deployed, and on each flip's preconditions.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on one flip: acknowledgement to the target's first answer.
const FLIP_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on one request of the polling client (then it reconnects).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed connection attempt of the polling client.
const RECONNECT_PAUSE: Duration = Duration::from_millis(1);
/// Most flips accepted for `--flips`.
pub(crate) const FLIPS_MAX: usize = 10_000;

pub(crate) async fn live_switch(flips: usize) -> Result<()> {
    ensure!(
        (1..=FLIPS_MAX).contains(&flips),
        "--flips must be in 1..={FLIPS_MAX}"
    );
    let dir = tempfile::Builder::new()
        .prefix("bench-live-switch-")
        .tempdir()?;
    let mut config = FleetConfig::new(dir.path(), vec![REGION.to_string()]).fast();
    config.traffic = true;
    config.nodes = 1;
    let fleet = Fleet::start(config).await?;
    let measured = measure(&fleet, flips).await;
    let stopped = fleet.shutdown().await;
    measured?;
    stopped
}

async fn measure(fleet: &Fleet, flips: usize) -> Result<()> {
    let operator = fleet.operator()?;
    let sentinels = fleet.regions[0]
        .sentinels
        .as_ref()
        .context("a fleet with traffic runs sentinels")?;

    let v1 = deploy(&operator, IMAGES[0]).await?;
    let addr = sentinels.wait_addr(ENVIRONMENT, SETTLE_TIMEOUT).await?;
    let poller = Poller::start(addr);
    let mut answers = poller.answers.clone();
    wait_answer(&mut answers, IMAGES[0], SETTLE_TIMEOUT).await?;
    let v2 = deploy(&operator, IMAGES[1]).await?;
    wait_answer(&mut answers, IMAGES[1], SETTLE_TIMEOUT).await?;
    let ids = [v1, v2];
    let failed_before = poller.failed.load(Ordering::Relaxed);
    let sent_before = poller.sent.load(Ordering::Relaxed);

    let mut live = 1;
    let mut from_ack = Vec::with_capacity(flips);
    let mut from_request = Vec::with_capacity(flips);
    let mut calls = Vec::with_capacity(flips);
    let mut before_ack = 0_usize;
    let flips_started = Instant::now();
    for flip in 0..flips {
        let target = 1 - live;
        let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
        operator
            .wait_deployment(&ids[target], deadline, "ready", |v| {
                v.deployment.status == DeploymentStatus::Ready
            })
            .await?;
        wait_answer(&mut answers, IMAGES[live], SETTLE_TIMEOUT).await?;

        let sent = Instant::now();
        let rolled = operator
            .rollback(ENVIRONMENT, Some(&ids[target]))
            .await
            .with_context(|| format!("flip {flip}"))?;
        let ack = Instant::now();
        ensure!(
            rolled.id == ids[target],
            "flip {flip}: rolled back to {}, not {}",
            rolled.id,
            ids[target]
        );
        let answered = wait_answer(&mut answers, IMAGES[target], FLIP_TIMEOUT)
            .await
            .with_context(|| format!("flip {flip} to {}", IMAGES[target]))?;
        if answered < ack {
            before_ack += 1;
        }
        from_ack.push(answered.saturating_duration_since(ack));
        from_request.push(answered.saturating_duration_since(sent));
        calls.push(ack.duration_since(sent));
        live = target;
    }
    let flips_elapsed = flips_started.elapsed();
    let failed = poller.failed.load(Ordering::Relaxed) - failed_before;
    let polled = poller.sent.load(Ordering::Relaxed) - sent_before;
    let last_error = poller.last_error();
    poller.stop();

    let extra = serde_json::json!({
        "flips": flips,
        "environment": ENVIRONMENT,
        "answers_before_ack": before_ack,
    });
    let mut table = Vec::new();
    for (figure, samples) in [
        ("ack_to_first_answer", &mut from_ack),
        ("request_to_first_answer", &mut from_request),
        ("rollback_call", &mut calls),
    ] {
        let s = Summary::of(samples).context("no flips")?;
        let mut extra = extra.clone();
        if let Some(extra) = extra.as_object_mut() {
            extra.insert("p50_ms".into(), ms(s.p50_us).into());
            extra.insert("p99_ms".into(), ms(s.p99_us).into());
            extra.insert("max_ms".into(), ms(s.max_us).into());
        }
        print_summary(SCENARIO, figure, &s, extra);
        table.push((figure, s));
    }
    print_value(
        SCENARIO,
        "poll",
        serde_json::json!(polled),
        serde_json::json!({
            "unit": "requests during the flips",
            "failed": failed,
            "requests_per_s": (polled as f64 / flips_elapsed.as_secs_f64().max(1e-9)).round(),
            "last_error": last_error,
        }),
    );
    eprintln!("\nlive-switch: {flips} rollbacks in {ENVIRONMENT}, alternating; times in ms");
    eprintln!("{:>24} {:>8} {:>8} {:>8}", "", "p50", "p99", "max");
    for (figure, s) in &table {
        eprintln!(
            "{figure:>24} {:>8.2} {:>8.2} {:>8.2}",
            ms(s.p50_us),
            ms(s.p99_us),
            ms(s.max_us)
        );
    }
    eprintln!(
        "poll: {polled} requests through the sentinel during the flips, {failed} failed; {before_ack} flip(s) seen before the acknowledgement"
    );
    ensure!(
        failed == 0,
        "{failed} polled request(s) failed during the flips (last: {last_error:?})"
    );
    Ok(())
}

/// Microseconds as milliseconds, to the hundredth.
fn ms(us: u64) -> f64 {
    (us as f64 / 10.0).round() / 100.0
}

/// Deploys `image` (port [`PORT`], one replica) to the environment and
/// waits until it is ready, and so live; its id.
async fn deploy(operator: &Operator, image: &str) -> Result<String> {
    let request = integration::requests::deployment([REGION])
        .image(image)
        .environment(ENVIRONMENT)
        .spec(WorkloadSpec {
            port: Some(PORT),
            ..WorkloadSpec::default()
        })
        .build();
    let id = operator.create(request).await?;
    operator
        .ready(&id, READY_TIMEOUT_S)
        .await
        .with_context(|| format!("{image} ({id}) ready"))?;
    Ok(id)
}

/// One 200 answer of the polling client: the image that answered and when
/// the answer was read.
#[derive(Debug, Clone)]
struct Answer {
    image: String,
    at: Instant,
}

/// Waits (at most `timeout`) for the latest answer to be from `image`;
/// when it was read (possibly before this call: the latest answer counts).
async fn wait_answer(
    answers: &mut watch::Receiver<Option<Answer>>,
    image: &str,
    timeout: Duration,
) -> Result<Instant> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(answer) = answers.borrow_and_update().as_ref()
            && answer.image == image
        {
            return Ok(answer.at);
        }
        match tokio::time::timeout_at(deadline, answers.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => bail!("the polling client stopped"),
            Err(_) => {
                let last = answers.borrow().as_ref().map(|a| a.image.clone());
                bail!("no answer from {image} within {timeout:?}; last answer from {last:?}");
            }
        }
    }
}

/// A client sending `GET /` to the sentinel one request after another on
/// a keep-alive connection (a new one after a failure), publishing each
/// 200 echo's image.
struct Poller {
    answers: watch::Receiver<Option<Answer>>,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    last_error: Arc<std::sync::Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Poller {
    fn start(addr: SocketAddr) -> Poller {
        let (tx, answers) = watch::channel(None);
        let sent = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let last_error = Arc::new(std::sync::Mutex::new(None));
        let task = tokio::spawn(poll(
            addr,
            tx,
            sent.clone(),
            failed.clone(),
            last_error.clone(),
        ));
        Poller {
            answers,
            sent,
            failed,
            last_error,
            task,
        }
    }

    fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn stop(self) {
        self.task.abort();
    }
}

async fn poll(
    addr: SocketAddr,
    answers: watch::Sender<Option<Answer>>,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    last_error: Arc<std::sync::Mutex<Option<String>>>,
) {
    let fail = |error: String| {
        failed.fetch_add(1, Ordering::Relaxed);
        *last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
    };
    loop {
        let connected = tokio::time::timeout(REQUEST_TIMEOUT, connect(addr)).await;
        let mut sender = match connected {
            Ok(Ok(sender)) => sender,
            Ok(Err(e)) => {
                fail(format!("connect: {e:#}"));
                tokio::time::sleep(RECONNECT_PAUSE).await;
                continue;
            }
            Err(_) => {
                fail("connect: timed out".into());
                continue;
            }
        };
        loop {
            sent.fetch_add(1, Ordering::Relaxed);
            match tokio::time::timeout(REQUEST_TIMEOUT, get_image(&mut sender)).await {
                Ok(Ok(Ok(image))) => {
                    answers.send_replace(Some(Answer {
                        image,
                        at: Instant::now(),
                    }));
                }
                // An answer, but not a 200 echo: the connection still serves.
                Ok(Ok(Err(answer))) => fail(answer),
                Ok(Err(e)) => {
                    fail(format!("request: {e:#}"));
                    break;
                }
                Err(_) => {
                    fail("request: timed out".into());
                    break;
                }
            }
        }
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(addr: SocketAddr) -> Result<Sender> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// One `GET /`: the echo's image for a 200 echo, else what came instead.
async fn get_image(sender: &mut Sender) -> Result<Result<String, String>> {
    sender.ready().await?;
    let request = Request::get("/")
        .header(hyper::header::HOST, ENVIRONMENT)
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    let image = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["image"].as_str().map(str::to_string));
    Ok(match image {
        Some(image) if status.is_success() => Ok(image),
        _ => Err(format!(
            "{status}: {}",
            String::from_utf8_lossy(&body)
                .chars()
                .take(200)
                .collect::<String>()
        )),
    })
}

//! `proxy`: what the sentinel costs as a reverse proxy, measured side by
//! side with nginx on the same machine in the same run.
//!
//! Three processes besides the bench, each started here and killed when
//! the bench ends (SIGKILLed on drop, and under `setpriv --pdeathsig KILL`
//! so that they die with the bench even if it is killed):
//!
//! - the upstream: nginx answering every request itself with a fixed
//!   200 body (`return 200`), one process. It does the least work per
//!   request of the three (no upstream side), in C, in a process of its
//!   own whose CPU is measured apart; the `direct` figures show how far
//!   above the proxied ones its ceiling is (an upstream in the bench's
//!   own tokio runtime would do as well, but would share the bench's
//!   threads and its CPU could not be told apart).
//! - the peer: nginx as a reverse proxy to the upstream, one process,
//!   `proxy_http_version 1.1`, a keepalive pool of 64 upstream
//!   connections, `access_log off`, `X-Forwarded-For`/`-Proto` set as the
//!   sentinel sets them.
//! - the sentinel: the release `sentinel` binary (`--sentinel-bin`),
//!   serving a routes file whose one backend is the upstream, one tokio
//!   worker thread (`TOKIO_WORKER_THREADS=1`), logs at `warn`.
//!
//! nginx runs with `master_process off`: the one process serves with the
//! same event loop a lone worker runs (`worker_processes 1`), and it dies
//! with the bench (a SIGKILLed master would leave its worker running).
//!
//! **Fairness: both proxies pinned.** With two or more CPUs allowed, the
//! proxy under test (nginx or the sentinel) runs alone on the second CPU
//! (`taskset`), and the load side — `wrk` and the upstream — on the
//! first: each proxy gets exactly one core and one thread of work, and
//! never competes with the load generator. With one CPU nothing is
//! pinned (and the sentinel keeps its default threads).
//!
//! For each concurrency (1, 16, 64 connections; `wrk` threads =
//! min(connections, 2)) each target — the upstream `direct`, `nginx`,
//! `sentinel` — gets one `wrk --latency` run of `--seconds`, in an order
//! that alternates per round (direct, nginx, sentinel; then reversed),
//! for `--rounds` rounds, after an unmeasured 1 s warm-up of each.
//!
//! Figures (JSON lines, then a table on stderr):
//!
//! - `run`, one per wrk run: requests/s, latency p50/p99 (wrk's
//!   histogram, from a request's send to its response), errors (socket
//!   errors and non-2xx answers), the proxy's and the upstream's CPU
//!   (utilisation of one core, and the proxy's CPU µs per request), and
//!   how busy the two CPUs were (the machine is shared: a busy load CPU
//!   says the load side, not the proxy, may have been the limit).
//! - `summary`, one per concurrency: the mean over rounds of each
//!   target's requests/s, p50/p99 and (proxies) CPU µs per request; the
//!   added latency of each proxy (its p50/p99 minus the direct ones: what
//!   the extra hop costs); and the sentinel/nginx ratios (requests/s
//!   above 1, latencies and CPU per request below 1 favour the sentinel).
//!   CPU per request is the figure least moved by other load on a shared
//!   machine; requests/s is the proxy's ceiling only while its CPU is
//!   busy and the load CPU is not.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use testkit::cli::Cli;
use testkit::process::{Process, SETPRIV, Start};
use wire::routes::{RouteBackend, RoutesDocument};

use crate::common::{cpu_seconds, print_value};

const SCENARIO: &str = "proxy";
/// Client connections of the series, one wrk run each per target.
const CONCURRENCIES: [usize; 3] = [1, 16, 64];
/// Most wrk threads (the load side has one CPU).
const WRK_THREADS_MAX: usize = 2;
/// Bound on a wrk run past its `-d` seconds.
const WRK_GRACE: Duration = Duration::from_secs(30);
/// Seconds of the unmeasured warm-up run of each target.
const WARMUP_S: u64 = 1;
/// Connections of the warm-up run (fills both proxies' upstream pools).
const WARMUP_CONNECTIONS: usize = 64;
/// Bound on a started server accepting connections and answering.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two connection attempts while a server starts.
const READY_POLL: Duration = Duration::from_millis(20);
/// Most seconds per run and most rounds accepted.
pub(crate) const SECONDS_MAX: u64 = 600;
/// Most rounds accepted.
pub(crate) const ROUNDS_MAX: usize = 20;
/// Idle upstream connections nginx keeps (the sentinel keeps 64 per
/// instance: `POOL_IDLE_PER_INSTANCE_MAX`).
const NGINX_UPSTREAM_KEEPALIVE: usize = 64;
/// Requests per connection nginx allows before closing it (hyper sets no
/// such limit; nginx's default of 1,000 would make wrk reconnect).
const NGINX_KEEPALIVE_REQUESTS: u64 = 100_000_000;
/// The upstream's answer: about the size of the simulator's echo.
const BODY: &str = "{\"pod\":\"bench-0\",\"namespace\":\"bench\",\"image\":\"app:1\",\"method\":\"GET\",\"path\":\"/\",\"query\":\"\"}";
/// What to run when a program is missing.
const INSTALL_HINT: &str = "install them with: apt-get install -y wrk nginx-light";
/// The sentinel's ready line.
const SENTINEL_READY: &str = "sentinel listening on";

/// Where a run's requests go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Direct,
    Nginx,
    Sentinel,
}

impl Target {
    const ALL: [Target; 3] = [Target::Direct, Target::Nginx, Target::Sentinel];

    fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Nginx => "nginx",
            Target::Sentinel => "sentinel",
        }
    }
}

/// Which CPU the load side (wrk, the upstream) and the proxies run on.
#[derive(Debug, Clone, Copy)]
struct Pinning {
    load: usize,
    proxy: usize,
}

/// A server this bench started: its process and where it listens.
struct Server {
    process: Process,
    addr: SocketAddr,
}

/// What one wrk run measured.
#[derive(Debug, Clone, Copy)]
struct WrkRun {
    requests: u64,
    requests_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    errors: u64,
}

/// One measured run with the CPU it cost.
#[derive(Debug, Clone, Copy)]
struct Run {
    target: Target,
    connections: usize,
    wrk: WrkRun,
    /// The proxy's CPU time per request, in µs (none for `direct`).
    proxy_cpu_us_per_request: Option<f64>,
}

pub(crate) async fn proxy(
    seconds: u64,
    rounds: usize,
    sentinel_bin: Option<PathBuf>,
) -> Result<()> {
    ensure!(
        (1..=SECONDS_MAX).contains(&seconds),
        "--seconds must be in 1..={SECONDS_MAX}"
    );
    ensure!(
        (1..=ROUNDS_MAX).contains(&rounds),
        "--rounds must be in 1..={ROUNDS_MAX}"
    );
    let wrk = program("wrk").with_context(|| format!("no wrk in PATH; {INSTALL_HINT}"))?;
    let nginx = program("nginx").with_context(|| format!("no nginx in PATH; {INSTALL_HINT}"))?;
    let sentinel_bin = match sentinel_bin {
        Some(path) => path,
        None => std::env::current_exe()
            .context("cannot find the bench binary")?
            .with_file_name("sentinel"),
    };
    ensure!(
        sentinel_bin.is_file(),
        "no sentinel binary at {}: build it (cargo build --release -p sentinel --bin sentinel) or pass --sentinel-bin",
        sentinel_bin.display()
    );
    let pinning = pinning()?;
    let dir = tempfile::Builder::new().prefix("bench-proxy-").tempdir()?;

    let upstream_addr = testkit::ports::free_tcp_addr()?;
    let upstream = start_nginx(
        &nginx,
        dir.path(),
        "upstream",
        &upstream_conf(dir.path(), upstream_addr),
        upstream_addr,
        pinning.map(|p| p.load),
    )
    .await?;
    let nginx_addr = testkit::ports::free_tcp_addr()?;
    let peer = start_nginx(
        &nginx,
        dir.path(),
        "nginx",
        &proxy_conf(dir.path(), nginx_addr, upstream_addr),
        nginx_addr,
        pinning.map(|p| p.proxy),
    )
    .await?;
    let sentinel = start_sentinel(&sentinel_bin, dir.path(), upstream_addr, pinning).await?;
    for (target, addr) in [
        (Target::Direct, upstream.addr),
        (Target::Nginx, peer.addr),
        (Target::Sentinel, sentinel.addr),
    ] {
        check_answer(target, addr).await?;
    }
    let server_of = |target: Target| match target {
        Target::Direct => &upstream,
        Target::Nginx => &peer,
        Target::Sentinel => &sentinel,
    };
    let load_cpu = pinning.map(|p| p.load);

    for target in Target::ALL {
        let server = server_of(target);
        wrk_run(&wrk, load_cpu, server.addr, WARMUP_CONNECTIONS, WARMUP_S)
            .await
            .with_context(|| format!("warm-up of {}", target.name()))?;
    }

    let mut runs: Vec<Run> = Vec::new();
    for round in 0..rounds {
        let mut order = Target::ALL;
        if round % 2 == 1 {
            order.reverse();
        }
        for &connections in &CONCURRENCIES {
            for &target in &order {
                let server = server_of(target);
                let proxy_pid = (target != Target::Direct).then(|| server.process.pid());
                let cpu_before = Cpu::sample(proxy_pid, upstream.process.pid(), pinning)?;
                let wrk_result = wrk_run(&wrk, load_cpu, server.addr, connections, seconds)
                    .await
                    .with_context(|| format!("{} at {connections} connections", target.name()))?;
                let cpu =
                    Cpu::sample(proxy_pid, upstream.process.pid(), pinning)?.since(&cpu_before);
                let run = Run {
                    target,
                    connections,
                    wrk: wrk_result,
                    proxy_cpu_us_per_request: cpu
                        .proxy_s
                        .filter(|_| wrk_result.requests > 0)
                        .map(|s| s * 1e6 / wrk_result.requests as f64),
                };
                print_run(round, &run, &cpu, pinning);
                runs.push(run);
            }
        }
    }

    let mut table = Vec::new();
    for &connections in &CONCURRENCIES {
        let mean = |target: Target| Mean::of(&runs, target, connections);
        let (direct, nginx_mean, sentinel_mean) = (
            mean(Target::Direct),
            mean(Target::Nginx),
            mean(Target::Sentinel),
        );
        let added = |m: &Mean| (m.p50_us - direct.p50_us, m.p99_us - direct.p99_us);
        let (nginx_added, sentinel_added) = (added(&nginx_mean), added(&sentinel_mean));
        let ratio = |a: f64, b: f64| if b > 0.0 { round3(a / b) } else { f64::NAN };
        print_value(
            SCENARIO,
            "summary",
            serde_json::json!(connections),
            serde_json::json!({
                "connections": connections,
                "threads": threads(connections),
                "rounds": rounds,
                "seconds": seconds,
                "direct": direct.json(),
                "nginx": nginx_mean.json(),
                "sentinel": sentinel_mean.json(),
                "nginx_added_p50_us": round1(nginx_added.0),
                "nginx_added_p99_us": round1(nginx_added.1),
                "sentinel_added_p50_us": round1(sentinel_added.0),
                "sentinel_added_p99_us": round1(sentinel_added.1),
                "sentinel_over_nginx_requests_per_s":
                    ratio(sentinel_mean.requests_per_s, nginx_mean.requests_per_s),
                "sentinel_over_nginx_p50": ratio(sentinel_mean.p50_us, nginx_mean.p50_us),
                "sentinel_over_nginx_p99": ratio(sentinel_mean.p99_us, nginx_mean.p99_us),
                "sentinel_over_nginx_added_p50": ratio(sentinel_added.0, nginx_added.0),
                "sentinel_over_nginx_added_p99": ratio(sentinel_added.1, nginx_added.1),
                "sentinel_over_nginx_cpu_per_request": sentinel_mean
                    .proxy_cpu_us_per_request
                    .zip(nginx_mean.proxy_cpu_us_per_request)
                    .map(|(s, n)| ratio(s, n)),
            }),
        );
        table.push((connections, direct, nginx_mean, sentinel_mean));
    }
    print_table(&table, rounds, seconds, pinning);
    drop((sentinel, peer, upstream));
    Ok(())
}

/// `name` in `PATH` (or `/usr/sbin`, where nginx goes).
fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The CPUs to pin to: the first two this process may run on, when it may
/// run on two and `taskset` exists.
fn pinning() -> Result<Option<Pinning>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .context("no Cpus_allowed_list in /proc/self/status")?;
    let cpus = parse_cpu_list(list.trim())?;
    if cpus.len() < 2 || program("taskset").is_none() {
        return Ok(None);
    }
    Ok(Some(Pinning {
        load: cpus[0],
        proxy: cpus[1],
    }))
}

/// The first two CPUs (or fewer) of a list such as `0-3,6`.
fn parse_cpu_list(list: &str) -> Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>()?, b.parse::<usize>()?),
            None => {
                let cpu = part.parse::<usize>()?;
                (cpu, cpu)
            }
        };
        for cpu in first..=last {
            if cpus.len() == 2 {
                return Ok(cpus);
            }
            cpus.push(cpu);
        }
    }
    Ok(cpus)
}

/// The command line running `program` on `cpu` (if any), tied to this
/// process (`setpriv --pdeathsig KILL`, when there is setpriv).
fn command_line(program: &Path, cpu: Option<usize>) -> Vec<OsString> {
    let mut line: Vec<OsString> = Vec::new();
    if Path::new(SETPRIV).exists() {
        line.extend([SETPRIV, "--pdeathsig", "KILL", "--"].map(OsString::from));
    }
    if let Some(cpu) = cpu {
        line.extend(["taskset", "-c"].map(OsString::from));
        line.push(cpu.to_string().into());
    }
    line.push(program.as_os_str().to_os_string());
    line
}

fn std_command(line: &[OsString]) -> std::process::Command {
    let mut command = std::process::Command::new(&line[0]);
    command.args(&line[1..]);
    command
}

/// The settings both nginx configurations share: one process, no access
/// log, temporary files under `dir`, long keep-alive client connections.
fn nginx_common(dir: &Path, name: &str) -> String {
    let temp = dir.join(format!("{name}-temp"));
    let temp = temp.display();
    format!(
        "daemon off;
# One process serving with the event loop of a lone worker; it dies with
# the bench (a SIGKILLed master would leave its worker behind).
master_process off;
worker_processes 1;
pid {dir}/{name}.pid;
error_log stderr warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    keepalive_requests {NGINX_KEEPALIVE_REQUESTS};
    keepalive_timeout 300s;
",
        dir = dir.display(),
    )
}

/// The upstream: a fixed 200 answer.
fn upstream_conf(dir: &Path, listen: SocketAddr) -> String {
    format!(
        "{common}    server {{
        listen {listen} backlog=4096;
        location / {{
            default_type application/json;
            return 200 '{BODY}';
        }}
    }}
}}
",
        common = nginx_common(dir, "upstream"),
    )
}

/// The peer: a reverse proxy to `upstream` with a keep-alive pool.
fn proxy_conf(dir: &Path, listen: SocketAddr, upstream: SocketAddr) -> String {
    format!(
        "{common}    upstream app {{
        server {upstream};
        keepalive {NGINX_UPSTREAM_KEEPALIVE};
        keepalive_requests {NGINX_KEEPALIVE_REQUESTS};
        keepalive_timeout 300s;
    }}
    server {{
        listen {listen} backlog=4096;
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
        }}
    }}
}}
",
        common = nginx_common(dir, "nginx"),
    )
}

/// Starts nginx with `conf`, and waits until it answers on `addr`.
async fn start_nginx(
    nginx: &Path,
    dir: &Path,
    name: &str,
    conf: &str,
    addr: SocketAddr,
    cpu: Option<usize>,
) -> Result<Server> {
    let conf_path = dir.join(format!("{name}.conf"));
    std::fs::write(&conf_path, conf)
        .with_context(|| format!("cannot write {}", conf_path.display()))?;
    std::fs::create_dir_all(dir.join(format!("{name}-temp")))?;
    let mut command = std_command(&command_line(nginx, cpu));
    command
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&conf_path)
        .args(["-e", "stderr"]);
    let process = Start::new(command, &dir.join(format!("{name}.log"))).spawn()?;
    let mut server = Server { process, addr };
    wait_listening(&mut server, name).await?;
    Ok(server)
}

/// Starts the sentinel on a routes file whose one backend is `upstream`.
async fn start_sentinel(
    sentinel: &Path,
    dir: &Path,
    upstream: SocketAddr,
    pinning: Option<Pinning>,
) -> Result<Server> {
    let mut routes = RoutesDocument::empty("bench", "local", 1, 0);
    routes.backends.push(RouteBackend {
        deployment_id: "upstream".into(),
        weight: 100,
        instances: vec![upstream.to_string()],
    });
    let routes_path = dir.join("routes.json");
    std::fs::write(&routes_path, routes.to_json())
        .with_context(|| format!("cannot write {}", routes_path.display()))?;
    let addr = testkit::ports::free_tcp_addr()?;
    let mut command = std_command(&command_line(sentinel, pinning.map(|p| p.proxy)));
    command
        .arg("--routes-file")
        .arg(&routes_path)
        .args(["--environment", "bench", "--region", "local"])
        .args(["--listen", &addr.to_string(), "--admin-addr", "127.0.0.1:0"]);
    let mut start = Start::new(command, &dir.join("sentinel.log"))
        .ready_on(SENTINEL_READY, READY_TIMEOUT)
        .env("SENTINEL_LOG", "warn")
        .env("NO_COLOR", "1");
    if pinning.is_some() {
        // One core: one worker thread, as nginx has one process.
        start = start.env("TOKIO_WORKER_THREADS", "1");
    }
    let mut server = Server {
        process: start.spawn()?,
        addr,
    };
    wait_listening(&mut server, "sentinel").await?;
    Ok(server)
}

/// Waits (at most [`READY_TIMEOUT`]) until `server` accepts a connection.
async fn wait_listening(server: &mut Server, name: &str) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if tokio::net::TcpStream::connect(server.addr).await.is_ok() {
            return Ok(());
        }
        if let Ok(status) = server.process.wait_exit(Duration::ZERO) {
            bail!(
                "{name} exited ({status}); {}",
                server.process.log_tail(testkit::process::LOG_TAIL_LINES)
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "{name} not listening on {} within {READY_TIMEOUT:?}; {}",
                server.addr,
                server.process.log_tail(testkit::process::LOG_TAIL_LINES)
            );
        }
        tokio::time::sleep(READY_POLL).await;
    }
}

/// One request through `target`: a 200 with the upstream's body.
async fn check_answer(target: Target, addr: SocketAddr) -> Result<()> {
    let body = tokio::time::timeout(READY_TIMEOUT, integration::scrape::get(addr, "/"))
        .await
        .with_context(|| format!("{} did not answer within {READY_TIMEOUT:?}", target.name()))?
        .with_context(|| format!("GET / through {}", target.name()))?;
    ensure!(
        body == BODY,
        "{} answered {body:?}, not the upstream's body",
        target.name()
    );
    Ok(())
}

fn threads(connections: usize) -> usize {
    connections.clamp(1, WRK_THREADS_MAX)
}

/// One `wrk --latency` run of `seconds` with `connections` connections,
/// bounded by `seconds` + [`WRK_GRACE`].
async fn wrk_run(
    wrk: &Path,
    cpu: Option<usize>,
    addr: SocketAddr,
    connections: usize,
    seconds: u64,
) -> Result<WrkRun> {
    let line = command_line(wrk, cpu);
    let cli = Cli::new(&line[0])
        .leading_args(line[1..].iter().cloned())
        .timeout(Duration::from_secs(seconds) + WRK_GRACE)
        .missing_hint(INSTALL_HINT);
    let url = format!("http://{addr}/");
    let (threads, connections, duration) = (
        threads(connections).to_string(),
        connections.to_string(),
        format!("{seconds}s"),
    );
    let output = cli
        .ok(&[
            "--latency",
            "-t",
            &threads,
            "-c",
            &connections,
            "-d",
            &duration,
            &url,
        ])
        .await?;
    parse_wrk(&output).with_context(|| format!("reading wrk's output:\n{output}"))
}

/// Reads requests/s, the p50 and p99 latencies, the request count and the
/// errors from wrk's report.
fn parse_wrk(text: &str) -> Result<WrkRun> {
    let mut requests_per_s = None;
    let mut requests = None;
    let mut p50_us = None;
    let mut p99_us = None;
    let mut errors = 0_u64;
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("Requests/sec:") {
            requests_per_s = Some(rest.trim().parse::<f64>()?);
        } else if let Some(rest) = line.strip_prefix("50%") {
            p50_us = Some(wrk_duration_us(rest.trim())?);
        } else if let Some(rest) = line.strip_prefix("99%") {
            p99_us = Some(wrk_duration_us(rest.trim())?);
        } else if let Some((count, _)) = line.split_once(" requests in ") {
            requests = Some(count.trim().parse::<u64>()?);
        } else if let Some(rest) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            for part in rest.split(',') {
                if let Some(n) = part.split_whitespace().nth(1) {
                    errors += n.parse::<u64>()?;
                }
            }
        } else if let Some(rest) = line.strip_prefix("Non-2xx or 3xx responses:") {
            errors += rest.trim().parse::<u64>()?;
        }
    }
    Ok(WrkRun {
        requests: requests.context("no request count")?,
        requests_per_s: requests_per_s.context("no Requests/sec")?,
        p50_us: p50_us.context("no 50% latency (--latency)")?,
        p99_us: p99_us.context("no 99% latency (--latency)")?,
        errors,
    })
}

/// A wrk duration (`152.00us`, `1.20ms`, `2.00s`, `1.00m`) in µs.
fn wrk_duration_us(text: &str) -> Result<f64> {
    for (unit, scale) in [
        ("us", 1.0),
        ("ms", 1e3),
        ("s", 1e6),
        ("m", 60e6),
        ("h", 3_600e6),
    ] {
        if let Some(number) = text.strip_suffix(unit) {
            return Ok(number.parse::<f64>()? * scale);
        }
    }
    bail!("not a wrk duration: {text:?}")
}

/// CPU counters at one instant: the proxy's and the upstream's CPU
/// seconds, and the pinned CPUs' busy and total ticks.
struct Cpu {
    at: Instant,
    proxy_s: Option<f64>,
    upstream_s: f64,
    /// (busy, total) ticks of the load CPU and the proxy CPU.
    cores: Option<[(u64, u64); 2]>,
}

/// What a run cost.
struct CpuUsed {
    /// The proxy's CPU time over the run's wall time (1.0: one core).
    proxy_util: Option<f64>,
    proxy_s: Option<f64>,
    upstream_util: f64,
    /// Busy share of the load CPU and the proxy CPU (every process).
    cores_busy: Option<[f64; 2]>,
}

impl Cpu {
    fn sample(proxy: Option<u32>, upstream: u32, pinning: Option<Pinning>) -> Result<Cpu> {
        let cores = match pinning {
            Some(p) => Some([core_ticks(p.load)?, core_ticks(p.proxy)?]),
            None => None,
        };
        Ok(Cpu {
            at: Instant::now(),
            proxy_s: proxy.map(|pid| cpu_seconds(Some(pid))).transpose()?,
            upstream_s: cpu_seconds(Some(upstream))?,
            cores,
        })
    }

    fn since(&self, before: &Cpu) -> CpuUsed {
        let wall = self.at.duration_since(before.at).as_secs_f64().max(1e-9);
        let proxy_s = self
            .proxy_s
            .zip(before.proxy_s)
            .map(|(after, before)| after - before);
        let cores_busy = self.cores.zip(before.cores).map(|(after, before)| {
            [0, 1].map(|i| {
                let busy = after[i].0.saturating_sub(before[i].0) as f64;
                let total = after[i].1.saturating_sub(before[i].1) as f64;
                if total > 0.0 { busy / total } else { 0.0 }
            })
        });
        CpuUsed {
            proxy_util: proxy_s.map(|s| s / wall),
            proxy_s,
            upstream_util: (self.upstream_s - before.upstream_s) / wall,
            cores_busy,
        }
    }
}

/// (busy, total) ticks of CPU `cpu` since boot, from /proc/stat.
fn core_ticks(cpu: usize) -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let name = format!("cpu{cpu}");
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))
        .with_context(|| format!("no {name} in /proc/stat"))?;
    // user nice system idle iowait irq softirq steal (guest time is
    // already counted in user).
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{name} of /proc/stat is not numbers"))?;
    ensure!(ticks.len() == 8, "{name} of /proc/stat has too few fields");
    let total: u64 = ticks.iter().sum();
    let idle = ticks[3] + ticks[4];
    Ok((total - idle, total))
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn print_run(round: usize, run: &Run, cpu: &CpuUsed, pinning: Option<Pinning>) {
    print_value(
        SCENARIO,
        "run",
        serde_json::json!(round1(run.wrk.requests_per_s)),
        serde_json::json!({
            "unit": "requests/s",
            "round": round,
            "target": run.target.name(),
            "connections": run.connections,
            "threads": threads(run.connections),
            "requests": run.wrk.requests,
            "p50_us": round1(run.wrk.p50_us),
            "p99_us": round1(run.wrk.p99_us),
            "errors": run.wrk.errors,
            "proxy_cpu_util": cpu.proxy_util.map(round3),
            "proxy_cpu_us_per_request": run.proxy_cpu_us_per_request.map(round1),
            "upstream_cpu_util": round3(cpu.upstream_util),
            "load_cpu_busy": cpu.cores_busy.map(|b| round3(b[0])),
            "proxy_cpu_busy": cpu.cores_busy.map(|b| round3(b[1])),
            "pinned": pinning.map(|p| serde_json::json!({"load": p.load, "proxy": p.proxy})),
        }),
    );
}

/// The mean over rounds of one target's runs at one concurrency.
#[derive(Debug, Clone, Copy)]
struct Mean {
    requests_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    /// The lowest and highest requests/s of the rounds.
    requests_per_s_range: (f64, f64),
    errors: u64,
    /// The proxy's CPU µs per request (none for `direct`).
    proxy_cpu_us_per_request: Option<f64>,
}

impl Mean {
    fn of(runs: &[Run], target: Target, connections: usize) -> Mean {
        let runs: Vec<&Run> = runs
            .iter()
            .filter(|r| r.target == target && r.connections == connections)
            .collect();
        let cpu: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.proxy_cpu_us_per_request)
            .collect();
        let mine: Vec<&WrkRun> = runs.iter().map(|r| &r.wrk).collect();
        let n = mine.len().max(1) as f64;
        let mean = |f: fn(&WrkRun) -> f64| mine.iter().map(|r| f(r)).sum::<f64>() / n;
        let rates = mine.iter().map(|r| r.requests_per_s);
        Mean {
            requests_per_s: mean(|r| r.requests_per_s),
            p50_us: mean(|r| r.p50_us),
            p99_us: mean(|r| r.p99_us),
            requests_per_s_range: (
                rates.clone().fold(f64::INFINITY, f64::min),
                rates.fold(0.0, f64::max),
            ),
            errors: mine.iter().map(|r| r.errors).sum(),
            proxy_cpu_us_per_request: (!cpu.is_empty())
                .then(|| cpu.iter().sum::<f64>() / cpu.len() as f64),
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "requests_per_s": round1(self.requests_per_s),
            "requests_per_s_min": round1(self.requests_per_s_range.0),
            "requests_per_s_max": round1(self.requests_per_s_range.1),
            "p50_us": round1(self.p50_us),
            "p99_us": round1(self.p99_us),
            "errors": self.errors,
            "proxy_cpu_us_per_request": self.proxy_cpu_us_per_request.map(round1),
        })
    }
}

/// The summary as a table on stderr (stdout keeps the JSON lines).
fn print_table(
    rows: &[(usize, Mean, Mean, Mean)],
    rounds: usize,
    seconds: u64,
    pinning: Option<Pinning>,
) {
    let pinned = match pinning {
        Some(p) => format!(
            "wrk + upstream on CPU {}, each proxy alone on CPU {}",
            p.load, p.proxy
        ),
        None => "nothing pinned (one CPU)".to_string(),
    };
    eprintln!(
        "\nproxy: mean of {rounds} round(s) of {seconds} s per target; {pinned}; latencies in ms"
    );
    eprintln!(
        "{:>5} {:>9} {:>10} {:>8} {:>8} {:>9} {:>9} {:>11} {:>6}",
        "conns", "target", "req/s", "p50", "p99", "+p50", "+p99", "CPU us/req", "errors"
    );
    let ms = |us: f64| us / 1e3;
    for (connections, direct, nginx, sentinel) in rows {
        for (name, m) in [("direct", direct), ("nginx", nginx), ("sentinel", sentinel)] {
            let (added50, added99) = if name == "direct" {
                ("".to_string(), "".to_string())
            } else {
                (
                    format!("{:+.3}", ms(m.p50_us - direct.p50_us)),
                    format!("{:+.3}", ms(m.p99_us - direct.p99_us)),
                )
            };
            let cpu = m
                .proxy_cpu_us_per_request
                .map_or(String::new(), |us| format!("{us:.1}"));
            eprintln!(
                "{connections:>5} {name:>9} {:>10.0} {:>8.3} {:>8.3} {added50:>9} {added99:>9} {cpu:>11} {:>6}",
                m.requests_per_s,
                ms(m.p50_us),
                ms(m.p99_us),
                m.errors
            );
        }
        let cpu_ratio = sentinel
            .proxy_cpu_us_per_request
            .zip(nginx.proxy_cpu_us_per_request)
            .map_or(String::new(), |(s, n)| format!("{:.2}", s / n));
        eprintln!(
            "{:>5} {:>9} {:>10.2} {:>8.2} {:>8.2} {:>9} {:>9} {cpu_ratio:>11}   (sentinel / nginx)",
            "",
            "ratio",
            sentinel.requests_per_s / nginx.requests_per_s,
            sentinel.p50_us / nginx.p50_us,
            sentinel.p99_us / nginx.p99_us,
            "",
            "",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "Running 5s test @ http://127.0.0.1:8080/
  2 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   155.21us   50.00us   2.00ms   90.00%
    Req/Sec    50.00k     2.00k   55.00k    70.00%
  Latency Distribution
     50%  150.00us
     75%  170.00us
     90%  200.00us
     99%    1.50ms
  500000 requests in 5.00s, 60.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec: 100000.50
Transfer/sec:     12.00MB
";

    #[test]
    fn a_wrk_report_is_read() {
        let run = parse_wrk(REPORT).unwrap();
        assert_eq!(run.requests, 500_000);
        assert_eq!(run.requests_per_s, 100_000.5);
        assert_eq!(run.p50_us, 150.0);
        assert_eq!(run.p99_us, 1_500.0);
        assert_eq!(run.errors, 7);
        assert_eq!(wrk_duration_us("2.00s").unwrap(), 2e6);
        assert!(parse_wrk("nothing").is_err());
    }

    #[test]
    fn cpu_lists_give_the_first_two() {
        assert_eq!(parse_cpu_list("0-1").unwrap(), [0, 1]);
        assert_eq!(parse_cpu_list("2,5-7").unwrap(), [2, 5]);
        assert_eq!(parse_cpu_list("3").unwrap(), [3]);
    }
}

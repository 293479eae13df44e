//! README.md's "Running it for real", followed as written, on loopback:
//! the commands and files are read from the README's marked blocks
//! (`<!-- readme-test: NAME -->` before a fenced block), and only the
//! site's addresses and directories are replaced by loopback ports and a
//! temporary directory. Certificates carry a non-default server name;
//! three `ctrl serve` processes; `ctrl cluster init`; one `krane run`
//! against the Kubernetes simulator; `ctrl deploy --wait`. A change to the
//! README that breaks the path breaks this test.
//!
//! A second test checks the failure the README promises: `cluster init`
//! with a majority of the members down fails, names them, and changes
//! nothing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use integration::kit::process::{Cli, Process};
use integration::kit::wait::{bounded, wait_until};
use integration::kit::{binaries, ctrl};
use k8s_sim::resources::STATEFUL_SETS;
use k8s_sim::{SimConfig, Simulator, pod_ready};
use tokio::time::Instant;

/// Bound on the whole scenario.
const TEST_TIMEOUT: Duration = Duration::from_secs(180);
/// Bound on one CLI invocation (`deploy --wait` included).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// The site's node addresses in the README, in node order.
const README_NODE_ADDRS: [&str; 3] = ["10.0.0.11:7400", "10.0.0.12:7400", "10.0.0.13:7400"];
const REGION: &str = "us-east";

/// The fenced block after `<!-- readme-test: NAME -->` in README.md.
fn readme_block(name: &str) -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("read README.md");
    let marker = format!("<!-- readme-test: {name} -->");
    let after = readme
        .split_once(&marker)
        .unwrap_or_else(|| panic!("README.md has no {marker}"))
        .1;
    let fence_start = after.find("```").expect("a fenced block after the marker");
    let body = &after[fence_start..];
    let body = &body[body.find('\n').expect("fence line") + 1..];
    let end = body.find("```").expect("the block's closing fence");
    // Blocks sit in a numbered list: drop the list's indentation.
    body[..end]
        .lines()
        .map(|line| line.strip_prefix("   ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The commands of a shell block: one per line, `\` continues a line.
fn commands(block: &str) -> Vec<Vec<String>> {
    block
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| line.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// A binary of the workspace, built for this test if needed.
async fn binary(name: &str) -> PathBuf {
    let built = match name {
        "ctrl" => binaries::ctrl().await,
        "krane" => binaries::krane().await,
        other => panic!("the README names an unknown program {other:?}"),
    };
    built.expect("build the binary").to_path_buf()
}

/// The site's paths and addresses in a README text, made local.
struct Site {
    root: PathBuf,
    addrs: Vec<SocketAddr>,
}

impl Site {
    fn new(root: &Path) -> Site {
        let addrs = (0..3).map(|_| free_udp_addr()).collect();
        Site {
            root: root.to_path_buf(),
            addrs,
        }
    }

    /// `text` with the README's node addresses replaced by this site's and
    /// `/etc/X` and `/var/lib/X` moved under `host`'s directory.
    fn localise(&self, text: &str, host: &str) -> String {
        let mut text = text.to_string();
        for (readme, local) in README_NODE_ADDRS.iter().zip(&self.addrs) {
            text = text.replace(readme, &local.to_string());
        }
        let host_dir = self.root.join(host);
        text.replace("\"/etc/", &format!("\"{}/etc/", host_dir.display()))
            .replace("\"/var/lib/", &format!("\"{}/var/lib/", host_dir.display()))
    }

    fn host_path(&self, host: &str, path: &str) -> PathBuf {
        self.root.join(host).join(path.trim_start_matches('/'))
    }
}

fn free_udp_addr() -> SocketAddr {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    socket.local_addr().expect("addr")
}

fn copy(from: &Path, to_dir: &Path, files: &[&str]) {
    std::fs::create_dir_all(to_dir).expect("mkdir");
    for file in files {
        std::fs::copy(from.join(file), to_dir.join(file))
            .unwrap_or_else(|e| panic!("copy {file}: {e}"));
    }
}

/// Starts `program args… config`, its output in `log`; killed on drop.
fn start(program: &Path, args: &[&str], config: &Path, log: &Path) -> Process {
    let mut command = std::process::Command::new(program);
    command.args(args).arg(config);
    Process::start(command, log).unwrap_or_else(|e| panic!("start {}: {e:#}", program.display()))
}

/// Runs one README command (`ctrl …` or `krane …`) with `CTRL_CONFIG`,
/// bounded by [`COMMAND_TIMEOUT`]; returns its output.
async fn run(command: &[String], cwd: &Path, operator: Option<&Path>) -> std::process::Output {
    let (program, args) = command.split_first().expect("a command");
    let cli = match (program.as_str(), operator) {
        ("ctrl", Some(operator)) => ctrl::with_config(operator).await.expect("ctrl"),
        ("ctrl", None) => ctrl::cli().await.expect("ctrl"),
        (other, _) => Cli::new(binary(other).await),
    };
    let cli = cli.current_dir(cwd).timeout(COMMAND_TIMEOUT);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cli.run(&args).await.unwrap_or_else(|e| panic!("{e:#}"))
}

fn assert_success(command: &[String], output: &std::process::Output) {
    assert!(
        output.status.success(),
        "`{}` failed ({}):\n{}\n{}",
        command.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Steps 1–3: certificates, the nodes' configs and the operator's config,
/// as the README writes them; returns the operator config's path.
async fn prepare(site: &Site) -> PathBuf {
    for command in commands(&readme_block("certs")) {
        let output = run(&command, &site.root, None).await;
        assert_success(&command, &output);
    }
    let certs = site.root.join("certs");

    // Step 2: node 1's file as written; nodes 2 and 3 "the same, with
    // their own node_id, listen_addr and certificate files, and the other
    // two nodes as [[peers]]".
    let node1: toml::Table = toml::from_str(&readme_block("node-config")).expect("node TOML");
    for id in 1..=3u64 {
        let host = format!("node-{id}");
        let mut config = node1.clone();
        config.insert("node_id".into(), (id as i64).into());
        config.insert(
            "listen_addr".into(),
            README_NODE_ADDRS[usize::try_from(id - 1).expect("node id")].into(),
        );
        let tls = config["tls"].as_table().expect("[tls]").clone();
        let mut tls = tls;
        for field in ["cert", "key"] {
            let path = tls[field]
                .as_str()
                .expect("a path")
                .replace("node-1", &host);
            tls.insert(field.into(), path.into());
        }
        config.insert("tls".into(), tls.into());
        let peers: Vec<toml::Value> = (1..=3u64)
            .filter(|peer| *peer != id)
            .map(|peer| {
                toml::Value::Table(toml::Table::from_iter([
                    ("node_id".to_string(), (peer as i64).into()),
                    (
                        "addr".to_string(),
                        README_NODE_ADDRS[usize::try_from(peer - 1).expect("node id")].into(),
                    ),
                ]))
            })
            .collect();
        config.insert("peers".into(), peers.into());
        let text = site.localise(&toml::to_string(&config).expect("TOML"), &host);
        let etc = site.host_path(&host, "/etc/ctrl");
        copy(
            &certs,
            &etc,
            &[
                "ca.pem",
                &format!("{host}.pem"),
                &format!("{host}.key"),
                "secrets.key",
            ],
        );
        std::fs::write(etc.join("node.toml"), text).expect("write node.toml");
    }

    // Step 3: the operator's files next to its config.
    let operator_dir = site.root.join("operator");
    copy(
        &certs,
        &operator_dir,
        &["ca.pem", "operator.pem", "operator.key"],
    );
    let operator = operator_dir.join("operator.toml");
    let text = site.localise(&readme_block("operator-config"), "operator");
    std::fs::write(&operator, text).expect("write operator.toml");
    operator
}

async fn start_node(site: &Site, id: u64) -> Process {
    let host = format!("node-{id}");
    start(
        &binary("ctrl").await,
        &["serve", "--config"],
        &site.host_path(&host, "/etc/ctrl/node.toml"),
        &site.root.join(format!("{host}.log")),
    )
}

/// Runs `cluster init` until it succeeds (bounded by [`COMMAND_TIMEOUT`]):
/// while nodes are still starting, a refusal names the members that did
/// not answer yet; any other failure fails the test. Returns its stdout.
async fn init_when_the_members_answer(init: &[String], site: &Site, operator: &Path) -> String {
    wait_until(
        Instant::now() + COMMAND_TIMEOUT,
        "`cluster init` to succeed",
        async || {
            let output = run(init, &site.root, Some(operator)).await;
            if output.status.success() {
                return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
            }
            let err = String::from_utf8_lossy(&output.stderr).into_owned();
            assert!(err.contains("members answered"), "init failed: {err}");
            Err(err)
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_production_path_works_as_written() {
    bounded(TEST_TIMEOUT, async {
        let root = tempfile::tempdir().expect("tempdir");
        let site = Site::new(root.path());
        let operator = prepare(&site).await;
        let mut _nodes = Vec::new();
        for id in 1..=3 {
            _nodes.push(start_node(&site, id).await);
        }

        // Step 4: init (retried while the nodes are still starting: a
        // refusal names the members that did not answer yet).
        let init = commands(&readme_block("init"));
        let out = init_when_the_members_answer(&init[0], &site, &operator).await;
        for id in 1..=3 {
            assert!(out.contains(&format!("member {id}")), "{out}");
        }
        for command in &init[1..] {
            let output = run(command, &site.root, Some(&operator)).await;
            assert_success(command, &output);
        }

        // Step 5: krane with the README's config, its kubeconfig pointing
        // at the simulated cluster.
        let simulator = Simulator::start(SimConfig::default())
            .await
            .expect("simulator");
        let kubeconfig = site.host_path("krane", "/etc/krane/kubeconfig");
        let etc = site.host_path("krane", "/etc/krane");
        copy(
            &site.root.join("certs"),
            &etc,
            &[
                "ca.pem",
                &format!("agent-{REGION}.pem"),
                &format!("agent-{REGION}.key"),
            ],
        );
        simulator
            .write_kubeconfig(&kubeconfig)
            .expect("write kubeconfig");
        let krane_config = readme_block("krane-config").replace(
            "# kubeconfig = \"/etc/krane/kubeconfig\"",
            "kubeconfig = \"/etc/krane/kubeconfig\"",
        );
        let krane_toml = etc.join("agent.toml");
        std::fs::write(&krane_toml, site.localise(&krane_config, "krane")).expect("agent.toml");
        let _krane = start(
            &binary("krane").await,
            &["run", "--config"],
            &krane_toml,
            &site.root.join("krane.log"),
        );

        // Step 6: deploy --wait ends when every pod runs.
        let deploy = commands(&readme_block("deploy"));
        let output = run(&deploy[0], &site.root, Some(&operator)).await;
        assert_success(&deploy[0], &output);
        let listed = run(&deploy[1], &site.root, Some(&operator)).await;
        assert_success(&deploy[1], &listed);
        assert!(
            String::from_utf8_lossy(&listed.stdout).contains("nginx:1.27"),
            "{}",
            String::from_utf8_lossy(&listed.stdout)
        );
        let regions = run(&deploy[2], &site.root, Some(&operator)).await;
        assert_success(&deploy[2], &regions);
        let regions = String::from_utf8_lossy(&regions.stdout);
        assert!(
            regions.contains(REGION) && regions.contains(env!("CARGO_PKG_VERSION")),
            "the region and its agent's version: {regions}"
        );
        let stateful_sets = simulator.list(&STATEFUL_SETS, Some("krane"), "");
        assert_eq!(stateful_sets.len(), 1, "{stateful_sets:?}");
        let ready = simulator
            .pods("krane", "")
            .iter()
            .filter(|pod| pod_ready(pod))
            .count();
        assert_eq!(ready, 2, "the deployment's two pods run");
        simulator.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_without_a_majority_fails_and_names_the_silent_members() {
    bounded(TEST_TIMEOUT, async {
        let root = tempfile::tempdir().expect("tempdir");
        let site = Site::new(root.path());
        let operator = prepare(&site).await;
        let _node1 = start_node(&site, 1).await;
        let init = &commands(&readme_block("init"))[0];
        let output = run(init, &site.root, Some(&operator)).await;
        assert!(
            !output.status.success(),
            "init without a majority succeeded"
        );
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(err.contains("1 of 3 members answered"), "{err}");
        for id in [2usize, 3] {
            let named = format!("node {id} at {}", site.addrs[id - 1]);
            assert!(err.contains(&named), "{err}");
        }
        // Nothing changed: node 2 and 3 started now make the init work.
        let mut _others = BTreeMap::new();
        for id in 2..=3 {
            _others.insert(id, start_node(&site, id).await);
        }
        init_when_the_members_answer(init, &site, &operator).await;
    })
    .await;
}

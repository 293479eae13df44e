//! `ctrl debug bundle`: one gzipped tar archive with the site's status,
//! the deployments, the journal and every node's config and metrics — and
//! no private key material (the test looks for every key file's contents
//! in every file of the archive).

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use integration::fleet::{Fleet, FleetConfig};
use integration::kit::wait::bounded;

const TEST_TIMEOUT: Duration = Duration::from_secs(60);
const READY_TIMEOUT_S: u64 = 30;

/// The archive's files by path.
fn unpack(path: &std::path::Path) -> BTreeMap<String, String> {
    let file = std::fs::File::open(path).expect("the archive");
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let mut files = BTreeMap::new();
    for entry in archive.entries().expect("entries") {
        let mut entry = entry.expect("an entry");
        let path = entry.path().expect("a path").display().to_string();
        let mut contents = String::new();
        entry.read_to_string(&mut contents).expect("text");
        files.insert(path, contents);
    }
    files
}

/// The base64 lines of every private key under `dir`.
fn key_lines(dir: &std::path::Path) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the certificate directory") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "key") {
            let pem = std::fs::read_to_string(&path).expect("a key file");
            lines.extend(
                pem.lines()
                    .filter(|l| !l.starts_with("-----") && l.len() >= 16)
                    .map(str::to_string),
            );
        }
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_holds_status_journal_configs_and_metrics_and_no_key() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = Fleet::start(FleetConfig::new(dir.path(), vec!["us-east".into()]))
            .await
            .unwrap();
        let operator = fleet.operator().unwrap();
        let (id, _) = operator
            .deploy(integration::requests::deployment(["us-east"]).build())
            .await
            .unwrap();
        operator.ready(&id, READY_TIMEOUT_S).await.unwrap();

        let out = dir.path().join("bundle.tar.gz");
        let ctrl = integration::kit::ctrl::with_config(&fleet.operator_path)
            .await
            .unwrap();
        ctrl.ok(&["debug", "bundle", "--out", &out.display().to_string()])
            .await
            .unwrap();
        let files = unpack(&out);
        let names: Vec<&String> = files.keys().collect();
        let node_dir = format!("ctrl-bundle/nodes/{}", fleet.node().local_addr);
        for name in [
            "ctrl-bundle/status.json".to_string(),
            "ctrl-bundle/deployments.json".to_string(),
            "ctrl-bundle/journal.json".to_string(),
            "ctrl-bundle/cluster_check.json".to_string(),
            format!("{node_dir}/config.toml"),
            format!("{node_dir}/metrics.txt"),
        ] {
            assert!(files.contains_key(&name), "{name} in {names:?}");
        }
        assert!(files["ctrl-bundle/deployments.json"].contains(&id));
        assert!(files["ctrl-bundle/journal.json"].contains(&id));
        let check: serde_json::Value =
            serde_json::from_str(&files["ctrl-bundle/cluster_check.json"]).unwrap();
        assert_eq!(check["ok"], true, "{check:#}");
        assert!(files[&format!("{node_dir}/config.toml")].contains("node_id = 1"));
        assert!(files[&format!("{node_dir}/metrics.txt")].contains("ctrl_raft_term"));

        let secrets = key_lines(&fleet.dir.join("certs"));
        assert!(!secrets.is_empty(), "the site has keys");
        for (name, contents) in &files {
            for line in &secrets {
                assert!(
                    !contents.contains(line.as_str()),
                    "{name} holds private key material"
                );
            }
        }
        fleet.shutdown().await.unwrap();
    })
    .await;
}

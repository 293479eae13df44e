//! Rules of the tree that a review would otherwise have to remember:
//! which crate may depend on which (ARCHITECTURE.md's "Architecture
//! invariant" lines), and a `//!` doc at the top of every Rust file.
//! Dependencies are read from each member's Cargo.toml, every section
//! (normal, dev, build), so a test-only edge counts too.
//!
//! Within a crate: no cycle among sibling modules, node's modules only
//! using their own layer or lower ones ([`NODE_LAYERS`]), and no crate
//! but storage naming `storage::apply`. These read the sources as text
//! (see the section "Modules" below); `self_tests` feeds that reading
//! synthetic crates to show each check bites.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's own crates, by folder.
const MEMBERS: [&str; 10] = [
    "wire",
    "storage",
    "config",
    "transport",
    "node",
    "agent",
    "sentinel",
    "integration",
    "integration/k8s-sim",
    "integration/testkit",
];

/// Dependency sections of a Cargo.toml.
const SECTIONS: [&str; 3] = ["dependencies", "dev-dependencies", "build-dependencies"];

/// For each crate, the workspace crates it may depend on (any section).
/// Everything else of the workspace is forbidden.
fn allowed() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    BTreeMap::from([
        // The leaves: messages and framing, config files.
        ("wire", BTreeSet::new()),
        ("config", BTreeSet::new()),
        ("storage", BTreeSet::from(["wire"])),
        ("transport", BTreeSet::from(["wire"])),
        // The simulator knows nothing of the product.
        ("k8s-sim", BTreeSet::new()),
        // The process harness runs the product's binaries and links none
        // of its crates, so node's own tests can use it.
        ("testkit", BTreeSet::new()),
        // ctrl and krane never depend on each other, nor on the harness
        // (node's process tests use the process harness only); krane does
        // not link ctrl's storage.
        (
            "node",
            BTreeSet::from(["wire", "storage", "config", "transport", "testkit"]),
        ),
        // Its drift-repair tests run the simulator.
        (
            "agent",
            BTreeSet::from(["wire", "config", "transport", "k8s-sim"]),
        ),
        // The sentinel reads the routes document and nothing else of the
        // product; its ConfigMap test runs the simulator.
        ("sentinel", BTreeSet::from(["wire", "k8s-sim"])),
        (
            "integration",
            BTreeSet::from([
                "wire",
                "storage",
                "config",
                "transport",
                "node",
                "agent",
                "sentinel",
                "k8s-sim",
                "testkit",
            ]),
        ),
    ])
}

/// External crates a crate must not depend on in any section.
fn forbidden_external() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    BTreeMap::from([
        // wire is sans-I/O: the async frame helpers live in transport.
        ("wire", BTreeSet::from(["tokio", "quinn"])),
        ("storage", BTreeSet::from(["tokio", "quinn", "openraft"])),
        ("config", BTreeSet::from(["tokio", "quinn"])),
    ])
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// A member's package name and every dependency it names.
fn manifest(member: &str) -> Option<(String, BTreeSet<String>)> {
    let path = root().join(member).join("Cargo.toml");
    let text = std::fs::read_to_string(&path).ok()?;
    let manifest: toml::Table =
        toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let name = manifest["package"]["name"]
        .as_str()
        .expect("package.name")
        .to_string();
    let mut deps = BTreeSet::new();
    for section in SECTIONS {
        if let Some(table) = manifest.get(section).and_then(|v| v.as_table()) {
            deps.extend(table.keys().cloned());
        }
    }
    Some((name, deps))
}

#[test]
fn crates_depend_only_along_the_allowed_edges() {
    let allowed = allowed();
    let forbidden = forbidden_external();
    let workspace: BTreeSet<&str> = allowed.keys().copied().collect();
    let mut violations = Vec::new();
    let mut seen = 0;
    for member in MEMBERS {
        let Some((name, deps)) = manifest(member) else {
            continue;
        };
        seen += 1;
        let Some(may) = allowed.get(name.as_str()) else {
            violations.push(format!(
                "{name}: a crate this test does not know; add its rule"
            ));
            continue;
        };
        for dep in &deps {
            // A crate may dev-depend on itself to turn on a test feature
            // (wire's `golden`).
            if *dep == name {
                continue;
            }
            if workspace.contains(dep.as_str()) && !may.contains(dep.as_str()) {
                violations.push(format!("{name} depends on {dep}"));
            }
            if forbidden
                .get(name.as_str())
                .is_some_and(|f| f.contains(dep.as_str()))
            {
                violations.push(format!("{name} depends on {dep} (forbidden external)"));
            }
        }
    }
    assert!(seen >= 7, "found only {seen} member manifests");
    assert!(
        violations.is_empty(),
        "edges ARCHITECTURE.md forbids:\n{}",
        violations.join("\n")
    );
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_rust_file_opens_with_its_module_doc() {
    let mut files = Vec::new();
    for member in MEMBERS {
        for dir in ["src", "tests", "benches"] {
            rust_files(&root().join(member).join(dir), &mut files);
        }
    }
    assert!(files.len() > 100, "found only {} Rust files", files.len());
    let undocumented: Vec<String> = files
        .iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            !text.trim_start().starts_with("//!")
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(
        undocumented.is_empty(),
        "files without a `//!` module doc:\n{}",
        undocumented.join("\n")
    );
}

// ---------------------------------------------------------------------
// Modules: no cycles between the modules of a crate, node's layers, and
// storage's `apply` kept to storage. A text scan, not a parser: comments
// and literals are blanked, then `crate::`, `super::` and `self::` paths
// (grouped imports expanded) are read off the tokens. The functions below
// work on sources in memory, so the self-tests at the end feed them
// synthetic crates.

/// node's layers, top first. This mirrors the list in node/src/lib.rs's
/// `//!` doc; keep the two in step. A top-level module may use modules of
/// its own layer or of a lower one, never of a higher one (a cycle within
/// a layer is the cycle check's). Every top-level module of node must be
/// here, so a new module forces a decision. Modules lib.rs places beside
/// the layers sit where their uses put them, as commented.
const NODE_LAYERS: &[&[&str]] = &[
    // For the CLI: the ctrl binary's commands (main.rs, which reaches the
    // library as `node::`), the operator client, `deploy --wait`.
    &["cli", "client", "wait"],
    &["boot"],
    &["server", "jobs"],
    &["replica"],
    // workflow drives over app's seams; app never uses workflow.
    &["workflow"],
    // metrics: read by boot and server, and replica counts into it;
    // backup: used by server, jobs and the client.
    &["app", "notify", "metrics", "backup"],
    // wake: fed by raft's state machine, read by replica and app.
    &["raft", "runtime", "clock", "wake"],
];

#[path = "tidy/scan.rs"]
mod scan;

use scan::*;

/// The `.rs` files under `dir`, by path relative to it.
fn sources_under(dir: &Path) -> BTreeMap<String, String> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    files
        .into_iter()
        .map(|path| {
            let rel = path
                .strip_prefix(dir)
                .expect("under dir")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (rel, text)
        })
        .collect()
}

#[test]
fn the_modules_of_each_crate_form_no_cycle() {
    let mut report = Vec::new();
    for member in MEMBERS {
        let sources = sources_under(&root().join(member).join("src"));
        assert!(!sources.is_empty(), "{member}/src has no Rust file");
        report.extend(cycle_report(
            &format!("{member}/src/"),
            &scan_crate(&sources),
        ));
    }
    assert!(
        report.is_empty(),
        "cycles among sibling modules (each edge with one reference, file:line → path):\n{}",
        report.join("\n")
    );
}

#[test]
fn node_modules_use_only_their_own_or_lower_layers() {
    let targets = scan_crate(&sources_under(&root().join("node/src")));
    let report = layer_report("node/src/", &targets[""], NODE_LAYERS);
    assert!(
        report.is_empty(),
        "node's layers (NODE_LAYERS, as in node/src/lib.rs):\n{}",
        report.join("\n")
    );
}

#[test]
fn nothing_outside_storage_names_storage_apply() {
    let mut files = BTreeMap::new();
    for member in MEMBERS.iter().filter(|m| **m != "storage") {
        for (rel, text) in sources_under(&root().join(member)) {
            files.insert(format!("{member}/{rel}"), text);
        }
    }
    assert!(files.len() > 100, "found only {} Rust files", files.len());
    let report = storage_apply_report(&files);
    assert!(
        report.is_empty(),
        "`storage::apply` is storage's own; use what storage's root exports:\n{}",
        report.join("\n")
    );
}

#[cfg(test)]
#[path = "tidy/self_tests.rs"]
mod self_tests;

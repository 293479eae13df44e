//! The real `krane`, `ctrl` and `sentinel` binaries, for the tests that
//! run them as child processes.
//!
//! Cargo hands a test the path of a binary of its own package only
//! (`CARGO_BIN_EXE_<name>`), and krane, ctrl and sentinel belong to
//! `agent`, `node` and `sentinel`. So the first of [`krane`], [`ctrl`] and
//! [`sentinel`] a test process calls builds all three, once, in one `cargo
//! build -p agent -p node -p sentinel --bin krane --bin ctrl --bin
//! sentinel` (a no-op when they are up to date), into the target directory
//! and profile the calling test was built in (read from the test
//! executable's path, `<target>/<profile>/deps/<test>`), and takes their
//! paths from cargo's JSON messages. One build of the three, not one per
//! package: cargo resolves the features of the dependencies per build, so
//! each package built alone compiles much of the dependency graph again
//! with its own set (on a fresh checkout that is most of the time a
//! process test takes); the three together have one set, the one `cargo
//! build -p node -p agent -p sentinel` builds. A build is bounded by
//! [`BUILD_TIMEOUT`]: a test calls these before its own bound starts,
//! which a build on a fresh checkout would use up. `KRANE_BIN`,
//! `CTRL_BIN` and `SENTINEL_BIN` name prebuilt binaries instead (for a
//! cross-compiled layout, or to test a release build). A binary that is
//! not a test (`chaos`, `bench`), which cargo puts beside `ctrl` and
//! `krane` in `<target>/<profile>/`, uses the ones beside it (build them
//! first: `cargo build -p node --bin ctrl -p agent --bin krane`); it never
//! builds into another target directory.
//! Node's own tests have `CARGO_BIN_EXE_ctrl` and need none of this.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::sync::OnceCell;

/// Longest wait for the build of krane, ctrl and sentinel.
pub const BUILD_TIMEOUT: Duration = Duration::from_secs(600);
/// Names a prebuilt krane binary to use instead of building one.
pub const KRANE_BIN_ENV: &str = "KRANE_BIN";

/// Names a prebuilt ctrl binary to use instead of building one.
pub const CTRL_BIN_ENV: &str = "CTRL_BIN";

/// Names a prebuilt sentinel binary to use instead of building one.
pub const SENTINEL_BIN_ENV: &str = "SENTINEL_BIN";

/// The binaries built together, as `(package, binary)`.
const BUILT_TOGETHER: [(&str, &str); 3] = [
    ("agent", "krane"),
    ("node", "ctrl"),
    ("sentinel", "sentinel"),
];

static KRANE: OnceCell<PathBuf> = OnceCell::const_new();
static CTRL: OnceCell<PathBuf> = OnceCell::const_new();
static SENTINEL: OnceCell<PathBuf> = OnceCell::const_new();
/// The paths of [`BUILT_TOGETHER`]'s binaries, in its order, once built.
static BUILT: OnceCell<Vec<PathBuf>> = OnceCell::const_new();

/// The krane binary: `$KRANE_BIN`, or built by cargo (once per process).
pub async fn krane() -> Result<&'static Path> {
    built(&KRANE, KRANE_BIN_ENV, "krane").await
}

/// The ctrl binary: `$CTRL_BIN`, or built by cargo (once per process).
pub async fn ctrl() -> Result<&'static Path> {
    built(&CTRL, CTRL_BIN_ENV, "ctrl").await
}

/// The sentinel binary: `$SENTINEL_BIN`, or built by cargo (once per
/// process).
pub async fn sentinel() -> Result<&'static Path> {
    built(&SENTINEL, SENTINEL_BIN_ENV, "sentinel").await
}

async fn built(cell: &'static OnceCell<PathBuf>, env: &str, bin: &str) -> Result<&'static Path> {
    let path = cell.get_or_try_init(|| locate(env, bin)).await?;
    Ok(path.as_path())
}

/// `bin`: named by `env`, beside this binary, or built with the others.
async fn locate(env: &str, bin: &str) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Ok(PathBuf::from(path));
    }
    if let Some(path) = beside_this_binary(bin)? {
        return Ok(path);
    }
    let built = BUILT.get_or_try_init(build).await?;
    let index = BUILT_TOGETHER
        .iter()
        .position(|(_, b)| *b == bin)
        .with_context(|| format!("{bin} is not among the binaries built together"))?;
    Ok(built[index].clone())
}

/// For a binary of this package (not a test, whose executable is in
/// `deps/`): `bin` in the same directory, which must exist.
fn beside_this_binary(bin: &str) -> Result<Option<PathBuf>> {
    let exe = std::env::current_exe().context("this executable's path")?;
    if build_layout(&exe).is_some() {
        return Ok(None);
    }
    let dir = exe.parent().context("this executable's directory")?;
    let path = dir.join(bin);
    if !path.exists() {
        bail!(
            "no {bin} beside {} (build it, or name one in ${})",
            exe.display(),
            match bin {
                "krane" => KRANE_BIN_ENV,
                "sentinel" => SENTINEL_BIN_ENV,
                _ => CTRL_BIN_ENV,
            }
        );
    }
    Ok(Some(path))
}

/// Where and how the calling test was built: `(target dir, profile)`,
/// from `<target>/<profile dir>/deps/<test executable>`.
fn build_layout(test_exe: &Path) -> Option<(PathBuf, String)> {
    let deps = test_exe.parent()?;
    if deps.file_name()? != "deps" {
        return None;
    }
    let profile_dir = deps.parent()?;
    let target = profile_dir.parent()?;
    let profile = match profile_dir.file_name()?.to_str()? {
        "debug" => "dev".to_string(),
        other => other.to_string(),
    };
    Some((target.to_path_buf(), profile))
}

/// The executable of the `bin` artifact among cargo's JSON messages.
fn executable(messages: &str, bin: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == bin)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}

/// Builds [`BUILT_TOGETHER`] in one cargo run; their paths, in its order.
async fn build() -> Result<Vec<PathBuf>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let mut command = tokio::process::Command::new(cargo);
    command.arg("build");
    for (package, _) in BUILT_TOGETHER {
        command.args(["-p", package]);
    }
    for (_, bin) in BUILT_TOGETHER {
        command.args(["--bin", bin]);
    }
    // What cargo set for this test process is about the test's package, not
    // the build's; ring's build script asks to rerun when CARGO_MANIFEST_DIR
    // or CARGO_PKG_NAME change, so inherited they would rebuild ring and all
    // above it, here and again in the next build without them.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_for_the_test) {
            command.env_remove(name);
        }
    }
    command
        .arg("--message-format=json-render-diagnostics")
        .arg("--manifest-path")
        .arg(&manifest)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let test_exe = std::env::current_exe().context("the test executable's path")?;
    if let Some((target, profile)) = build_layout(&test_exe) {
        command
            .arg("--target-dir")
            .arg(target)
            .args(["--profile", &profile]);
    }
    let what = format!(
        "cargo build {}",
        BUILT_TOGETHER
            .iter()
            .map(|(package, bin)| format!("-p {package} --bin {bin}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let child = command
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let output = tokio::time::timeout(BUILD_TIMEOUT, child.wait_with_output())
        .await
        .with_context(|| format!("{what} did not finish within {BUILD_TIMEOUT:?}"))?
        .with_context(|| format!("running {what}"))?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    BUILT_TOGETHER
        .iter()
        .map(|(_, bin)| {
            executable(&stdout, bin).with_context(|| format!("{what} built no {bin} executable"))
        })
        .collect()
}

/// Whether cargo sets the environment variable `name` for a test it runs
/// (the package's manifest, name and version, its binaries, its `OUT_DIR`).
fn set_for_the_test(name: &str) -> bool {
    matches!(
        name,
        "CARGO_MANIFEST_DIR"
            | "CARGO_MANIFEST_PATH"
            | "CARGO_CRATE_NAME"
            | "CARGO_PRIMARY_PACKAGE"
            | "CARGO_TARGET_TMPDIR"
            | "OUT_DIR"
    ) || name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_read_from_the_test_executable() {
        assert_eq!(
            build_layout(Path::new("/w/target/debug/deps/krane_crash-0a1b")),
            Some((PathBuf::from("/w/target"), "dev".to_string()))
        );
        assert_eq!(
            build_layout(Path::new("/w/target/release/deps/krane_crash-0a1b")),
            Some((PathBuf::from("/w/target"), "release".to_string()))
        );
        assert_eq!(build_layout(Path::new("/usr/bin/test")), None);
    }

    #[test]
    fn what_cargo_set_for_the_test_is_not_passed_to_the_build() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_BIN_EXE_chaos",
            "OUT_DIR",
        ] {
            assert!(set_for_the_test(name), "{name}");
        }
        for name in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "PATH",
            "RUSTFLAGS",
        ] {
            assert!(!set_for_the_test(name), "{name}");
        }
    }

    #[test]
    fn the_executable_comes_from_the_krane_artifact() {
        let messages = [
            r#"{"reason":"compiler-artifact","target":{"name":"agent"},"executable":null}"#,
            "not json",
            r#"{"reason":"compiler-artifact","target":{"name":"krane"},"executable":"/t/debug/krane"}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        assert_eq!(
            executable(&messages, "krane"),
            Some(PathBuf::from("/t/debug/krane"))
        );
        assert_eq!(executable(r#"{"reason":"build-finished"}"#, "krane"), None);
        // A library and a binary of one name (sentinel's): the binary.
        let messages = [
            r#"{"reason":"compiler-artifact","target":{"name":"sentinel"},"executable":null}"#,
            r#"{"reason":"compiler-artifact","target":{"name":"sentinel"},"executable":"/t/debug/sentinel"}"#,
        ]
        .join("\n");
        assert_eq!(
            executable(&messages, "sentinel"),
            Some(PathBuf::from("/t/debug/sentinel"))
        );
    }
}

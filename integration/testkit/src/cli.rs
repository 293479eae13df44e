//! Commands run to their end (`ctrl deploy`, `kubectl apply`, `bash -n`),
//! every run bounded by a timeout: a command still running then is killed
//! (SIGKILL) and the run fails, naming it. `Command::output()` alone would
//! wait forever on a command that hangs.
//!
//! [`Cli`] is a program with the arguments, environment and directory its
//! runs share, for async tests; [`output`] runs one `std` command from a
//! plain test (on a thread of its own, so also from inside a runtime).
//! Both go through the same bounded run.

use std::ffi::OsString;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::AsyncWriteExt;

/// Bound on one command run, unless the caller says otherwise.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(30);

/// A command-line program to run, with the arguments, environment and
/// directory every run shares.
#[derive(Debug, Clone)]
pub struct Cli {
    program: PathBuf,
    /// Arguments before each run's own (`--kubeconfig FILE`, say).
    leading: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    dir: Option<PathBuf>,
    timeout: Duration,
    /// Added to the error when the program cannot be started.
    missing_hint: Option<String>,
}

impl Cli {
    /// A run of `program` with the default timeout, no arguments yet.
    pub fn new(program: impl Into<PathBuf>) -> Cli {
        Cli {
            program: program.into(),
            leading: Vec::new(),
            env: Vec::new(),
            dir: None,
            timeout: CLI_TIMEOUT,
            missing_hint: None,
        }
    }

    /// Arguments put before every run's own.
    pub fn leading_args<S: Into<OsString>>(mut self, args: impl IntoIterator<Item = S>) -> Cli {
        self.leading.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable of the run.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Cli {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Runs the program in `dir`.
    pub fn current_dir(mut self, dir: &Path) -> Cli {
        self.dir = Some(dir.to_path_buf());
        self
    }

    /// Bound on each run (default [`CLI_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Cli {
        self.timeout = timeout;
        self
    }

    /// What to tell the reader when the program cannot be started.
    pub fn missing_hint(mut self, hint: &str) -> Cli {
        self.missing_hint = Some(hint.to_string());
        self
    }

    /// Runs the program with `args` and returns its output whatever its
    /// exit status; fails if it cannot start or runs past its timeout (it
    /// is killed then).
    pub async fn run(&self, args: &[&str]) -> Result<Output> {
        self.run_with_stdin(args, None).await
    }

    /// Runs the program with `args`; returns its stdout, or fails with its
    /// stderr if it exits unsuccessfully.
    pub async fn ok(&self, args: &[&str]) -> Result<String> {
        success(&self.describe(args), self.run(args).await?)
    }

    /// [`Cli::ok`] with `stdin` written to the program's standard input.
    pub async fn ok_with_stdin(&self, args: &[&str], stdin: &str) -> Result<String> {
        success(
            &self.describe(args),
            self.run_with_stdin(args, Some(stdin)).await?,
        )
    }

    async fn run_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> Result<Output> {
        let what = self.describe(args);
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(&self.leading)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(dir) = &self.dir {
            command.current_dir(dir);
        }
        let hint = self.missing_hint.as_deref();
        bounded_run(command, stdin, self.timeout, &what, hint).await
    }

    fn describe(&self, args: &[&str]) -> String {
        let mut words = vec![self.program.display().to_string()];
        words.extend(
            self.leading
                .iter()
                .map(|a| a.to_string_lossy().into_owned()),
        );
        words.extend(args.iter().map(|a| a.to_string()));
        words.join(" ")
    }
}

/// Runs `command` to its end (stdin closed, stdout and stderr captured)
/// and returns its output whatever its exit status; fails if it cannot
/// start or runs past `timeout` (it is killed first).
pub fn output(command: &mut std::process::Command, timeout: Duration) -> Result<Output> {
    let what = format!("{command:?}");
    // A std `Command` keeps its settings: moved into a tokio one, it is
    // spawned with them.
    let mut moved = std::process::Command::new(command.get_program());
    std::mem::swap(command, &mut moved);
    let command = tokio::process::Command::from(moved);
    block_on(bounded_run(command, None, timeout, &what, None))
}

/// Runs `future` to its end on a runtime of its own, on a thread of its
/// own: the caller may be inside a runtime already.
pub fn block_on<T: Send>(future: impl Future<Output = Result<T>> + Send) -> Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("a runtime for one command")?
                    .block_on(future)
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The one bounded run behind [`Cli`] and [`output`].
async fn bounded_run(
    mut command: tokio::process::Command,
    stdin: Option<&str>,
    timeout: Duration,
    what: &str,
    missing_hint: Option<&str>,
) -> Result<Output> {
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Dropped on a timeout: the program is killed.
        .kill_on_drop(true);
    let mut child = command.spawn().with_context(|| match missing_hint {
        Some(hint) => format!("cannot start `{what}` ({hint})"),
        None => format!("cannot start `{what}`"),
    })?;
    let run = async {
        if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
            input
                .write_all(text.as_bytes())
                .await
                .with_context(|| format!("writing the input of `{what}`"))?;
        }
        child
            .wait_with_output()
            .await
            .with_context(|| format!("running `{what}`"))
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(output) => output,
        Err(_) => bail!("`{what}` ran past {timeout:?} and was killed"),
    }
}

/// The stdout of a successful run, or an error with its status and both
/// outputs.
fn success(what: &str, output: Output) -> Result<String> {
    if !output.status.success() {
        bail!(
            "`{what}` failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[tokio::test]
    async fn a_run_past_its_timeout_is_killed_and_fails() {
        let sleep = Cli::new("sleep").timeout(Duration::from_millis(100));
        let started = std::time::Instant::now();
        let error = sleep.run(&["30"]).await.unwrap_err().to_string();
        assert!(error.contains("ran past"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn output_status_and_stdin_are_reported() {
        let sh = Cli::new("sh").leading_args(["-c"]);
        assert_eq!(sh.ok(&["echo out"]).await.unwrap(), "out\n");
        assert_eq!(sh.ok_with_stdin(&["cat"], "in").await.unwrap(), "in");
        let error = sh.ok(&["echo why >&2; exit 3"]).await.unwrap_err();
        assert!(error.to_string().contains("why"), "{error}");
        let output = sh.run(&["echo why >&2; exit 3"]).await.unwrap();
        assert_eq!(output.status.code(), Some(3));
        assert_eq!(output.stderr, b"why\n");
        let missing = Cli::new("/nonexistent/kubectl").missing_hint("set KUBECTL");
        let error = missing.run(&[]).await.unwrap_err().to_string();
        assert!(error.contains("set KUBECTL"), "{error}");
    }

    #[test]
    fn a_plain_command_past_its_timeout_is_killed_and_fails() {
        let started = std::time::Instant::now();
        let error = output(Command::new("sleep").arg("30"), Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        assert!(error.contains("ran past"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let out = output(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            CLI_TIMEOUT,
        )
        .unwrap();
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(out.status.code(), Some(3));
    }
}

//! Child processes of a test: [`Cli`] runs one command to its end, every
//! run bounded by a timeout and killed when it expires; [`Process`] is a
//! long-running program (`ctrl serve`, `krane run`) whose output goes to a
//! log file, killed (SIGKILL, a crash) when dropped, and signalled
//! (`STOP`, `CONT`) on demand; [`tied_to_parent`] makes such a child die
//! with its parent; [`log_count`] counts a line in such a log.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::AsyncWriteExt;

/// Bound on one command run, unless [`Cli::timeout`] says otherwise.
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
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Dropped on a timeout: the program is killed.
            .kill_on_drop(true);
        if let Some(dir) = &self.dir {
            command.current_dir(dir);
        }
        let mut child = command.spawn().with_context(|| match &self.missing_hint {
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
        match tokio::time::timeout(self.timeout, run).await {
            Ok(output) => output,
            Err(_) => bail!("`{what}` ran past {:?} and was killed", self.timeout),
        }
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

/// Bound on `kill -s SIGNAL PID` ([`Process::signal`]).
pub const SIGNAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two checks of a `kill` run's exit.
const SIGNAL_POLL: Duration = Duration::from_millis(2);
/// `setpriv`, which [`tied_to_parent`] runs children under.
pub const SETPRIV: &str = "/usr/bin/setpriv";

/// A command running `program` that is SIGKILLed when the process that
/// starts it dies, even by SIGKILL: under `setpriv --pdeathsig KILL` (it
/// sets the signal, then execs `program`, keeping its pid), when
/// [`SETPRIV`] exists; otherwise `program` itself, which only [`Process`]'s
/// drop kills. The kernel sends the signal when the *thread* that started
/// the child ends, so start children from threads that live as long as the
/// caller (a tokio worker or the main thread, never `spawn_blocking`).
pub fn tied_to_parent(program: &Path) -> std::process::Command {
    if Path::new(SETPRIV).exists() {
        let mut command = std::process::Command::new(SETPRIV);
        command.args(["--pdeathsig", "KILL", "--"]).arg(program);
        command
    } else {
        std::process::Command::new(program)
    }
}

/// A long-running child process, its stdout and stderr appended to a log
/// file; killed with SIGKILL (a crash) and reaped when dropped.
#[derive(Debug)]
pub struct Process {
    child: std::process::Child,
}

impl Process {
    /// Starts `command` (its stdin closed), its output appended to `log`.
    pub fn start(mut command: std::process::Command, log: &Path) -> Result<Process> {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let program = command.get_program().to_string_lossy().into_owned();
        let child = command
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().context("sharing the log file")?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        Ok(Process { child })
    }

    /// SIGKILL: a crash, with no chance to flush or close anything.
    pub fn kill(mut self) {
        self.stop();
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (a name `kill -s` knows: `STOP`, `CONT`, …) to the
    /// child, with `/bin/kill` (the crate uses no `unsafe`, so no
    /// `libc::kill`); bounded by [`SIGNAL_TIMEOUT`].
    pub fn signal(&self, signal: &str) -> Result<()> {
        let mut kill = std::process::Command::new("kill")
            .args(["-s", signal, &self.pid().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting kill")?;
        let deadline = std::time::Instant::now() + SIGNAL_TIMEOUT;
        loop {
            if let Some(status) = kill.try_wait().context("waiting for kill")? {
                if !status.success() {
                    bail!("kill -s {signal} {} failed ({status})", self.pid());
                }
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                let _ = kill.kill();
                let _ = kill.wait();
                bail!("kill -s {signal} ran past {SIGNAL_TIMEOUT:?}");
            }
            std::thread::sleep(SIGNAL_POLL);
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        // Reaping a killed child returns at once.
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How often `needle` occurs in the log file at `path` (0 if there is no
/// file yet).
pub fn log_count(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .matches(needle)
        .count()
}

#[cfg(test)]
mod tests {
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
}

//! Long-running children of a test (`ctrl serve`, `krane run`, `ctrl
//! watch`, a benchmark's node processes).
//!
//! [`Start`] says how to start one: its command (made by
//! [`tied_to_parent`], so the child dies with the process that started
//! it, even by SIGKILL), the log file its stdout and stderr are captured
//! to, the line of output that says it is ready, and which output a test
//! reads line by line. [`Process`] is the running child: SIGKILLed (a
//! crash) and reaped when dropped; signalled (`STOP`, `CONT`, `TERM`) on
//! demand; its exit awaited as the event it is (its output closing), and
//! the tail of its log put into every failure message (and printed when a
//! test panics while it runs). [`ctrl_serve`] and [`krane_run`] are the
//! two programs most tests start; [`log_count`] counts a line in a log.

use std::convert::Infallible;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// Bound on a child printing its ready line, unless [`Start::ready_on`]
/// says otherwise.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on `kill -s SIGNAL PID` ([`Process::signal`]).
pub const SIGNAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on a SIGKILLed child's output closing (the last lines reaching
/// its log) before [`Process::kill`] returns.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Lines of a child's log that a failure message quotes.
pub const LOG_TAIL_LINES: usize = 40;
/// Pause between two checks of a `kill` run's exit.
const SIGNAL_POLL: Duration = Duration::from_millis(2);
/// `setpriv`, which [`tied_to_parent`] runs children under.
pub const SETPRIV: &str = "/usr/bin/setpriv";
/// What `ctrl serve` prints on stdout once it serves.
pub const CTRL_READY: &str = "serving on";

/// A command running `program` that is SIGKILLed when the process that
/// starts it dies, even by SIGKILL: under `setpriv --pdeathsig KILL` (it
/// sets the signal, then execs `program`, keeping its pid), when
/// [`SETPRIV`] exists; otherwise `program` itself, which only [`Process`]'s
/// drop kills. The kernel sends the signal when the *thread* that started
/// the child ends, so start children from threads that live as long as the
/// caller (a test's own thread, a tokio worker or the main thread, never
/// `spawn_blocking`).
pub fn tied_to_parent(program: &Path) -> Command {
    if Path::new(SETPRIV).exists() {
        let mut command = Command::new(SETPRIV);
        command.args(["--pdeathsig", "KILL", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// `ctrl serve --config CONFIG` ([`tied_to_parent`]), its output captured
/// to `log`, ready once it prints [`CTRL_READY`].
pub fn ctrl_serve(ctrl: &Path, config: &Path, log: &Path) -> Start {
    let mut command = tied_to_parent(ctrl);
    command.args(["serve", "--config"]).arg(config);
    Start::new(command, log).ready_on(CTRL_READY, READY_TIMEOUT)
}

/// `krane run --config CONFIG` ([`tied_to_parent`]) logging at `info`
/// without colours, its output captured to `log`. Krane has no ready line:
/// a test waits for what it does (a full sync, a pod).
pub fn krane_run(krane: &Path, config: &Path, log: &Path) -> Start {
    let mut command = tied_to_parent(krane);
    command.args(["run", "--config"]).arg(config);
    Start::new(command, log)
        .env("KRANE_LOG", "info")
        .env("NO_COLOR", "1")
}

/// One of a child's two outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error (the programs' logs).
    Stderr,
}

/// How to start a [`Process`].
#[derive(Debug)]
pub struct Start {
    command: Command,
    log: PathBuf,
    ready: Option<(String, Duration)>,
    lines: Option<Stream>,
    stdin: bool,
}

impl Start {
    /// `command` (its stdin closed), both outputs appended to `log`.
    pub fn new(command: Command, log: &Path) -> Start {
        Start {
            command,
            log: log.to_path_buf(),
            ready: None,
            lines: None,
            stdin: false,
        }
    }

    /// [`Start::spawn`] returns once a line of output contains `needle`,
    /// and fails (the child killed, its log quoted) if none does within
    /// `timeout` or the child exits first.
    pub fn ready_on(mut self, needle: &str, timeout: Duration) -> Start {
        self.ready = Some((needle.to_string(), timeout));
        self
    }

    /// Returns from [`Start::spawn`] at once, without waiting for the
    /// ready line: for a restart whose readiness the caller judges itself
    /// (a node restarted under load is serving long before it caught up).
    pub fn without_ready(mut self) -> Start {
        self.ready = None;
        self
    }

    /// Keeps the lines of `stream` for [`Process::take_lines`], from the
    /// first one on.
    pub fn lines_of(mut self, stream: Stream) -> Start {
        self.lines = Some(stream);
        self
    }

    /// Gives the child a stdin pipe, which [`Process::close_stdin`] closes
    /// (a child that stops at the end of its input).
    pub fn piped_stdin(mut self) -> Start {
        self.stdin = true;
        self
    }

    /// Adds arguments.
    pub fn args<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Start {
        self.command.args(args);
        self
    }

    /// Sets an environment variable of the child.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Start {
        self.command.env(key, value);
        self
    }

    /// Starts the child; with [`Start::ready_on`], waits until it is
    /// ready.
    pub fn spawn(mut self) -> Result<Process> {
        let program = format!("{:?}", self.command);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let mut child = self
            .command
            .stdin(if self.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        let file = Arc::new(Mutex::new(file));
        // Disconnected once both readers ended: the child closed its
        // output, which it does by exiting.
        let (closed_tx, closed) = mpsc::channel::<Infallible>();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let (lines_tx, lines) = mpsc::channel();
        let streams: [(Stream, Box<dyn Read + Send>); 2] = [
            (
                Stream::Stdout,
                Box::new(child.stdout.take().context("stdout is piped")?),
            ),
            (
                Stream::Stderr,
                Box::new(child.stderr.take().context("stderr is piped")?),
            ),
        ];
        for (stream, output) in streams {
            let reader = Reader {
                file: file.clone(),
                ready: self
                    .ready
                    .as_ref()
                    .map(|(needle, _)| (needle.clone(), ready_tx.clone())),
                lines: (self.lines == Some(stream)).then(|| lines_tx.clone()),
                _closed: closed_tx.clone(),
            };
            std::thread::spawn(move || reader.run(output));
        }
        drop((closed_tx, ready_tx, lines_tx));
        let mut process = Process {
            child,
            program,
            log: self.log,
            lines: self.lines.map(|_| lines),
            closed,
        };
        if let Some((needle, timeout)) = self.ready {
            match ready_rx.recv_timeout(timeout) {
                Ok(()) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    let status = process.wait_exit(DRAIN_TIMEOUT);
                    bail!(
                        "{} exited ({status:?}) before printing {needle:?}; {}",
                        process.program,
                        process.log_tail(LOG_TAIL_LINES)
                    );
                }
                Err(RecvTimeoutError::Timeout) => {
                    process.stop();
                    bail!(
                        "{} did not print {needle:?} within {timeout:?}; {}",
                        process.program,
                        process.log_tail(LOG_TAIL_LINES)
                    );
                }
            }
        }
        Ok(process)
    }
}

/// Copies one output of a child to its log, line by line.
struct Reader {
    file: Arc<Mutex<File>>,
    /// The ready line to look for, and where to say it came.
    ready: Option<(String, SyncSender<()>)>,
    /// Where the lines go, if a test reads them.
    lines: Option<Sender<String>>,
    /// Dropped when the output ends.
    _closed: Sender<Infallible>,
}

impl Reader {
    fn run(mut self, output: impl Read) {
        let mut output = BufReader::new(output);
        let mut bytes = Vec::new();
        loop {
            bytes.clear();
            match output.read_until(b'\n', &mut bytes) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&bytes);
            let line = line.trim_end_matches(['\n', '\r']);
            if let Ok(mut file) = self.file.lock() {
                // A log that cannot be written loses lines, not the run.
                let _ = writeln!(file, "{line}");
            }
            if let Some((needle, ready)) = &self.ready
                && line.contains(needle.as_str())
            {
                let _ = ready.try_send(());
                self.ready = None;
            }
            if let Some(lines) = &self.lines
                && lines.send(line.to_string()).is_err()
            {
                self.lines = None;
            }
        }
    }
}

/// A running child, its output captured to a log file; SIGKILLed (a
/// crash) and reaped when dropped.
#[derive(Debug)]
pub struct Process {
    child: Child,
    /// The command, for messages.
    program: String,
    log: PathBuf,
    lines: Option<Receiver<String>>,
    /// Disconnected once the child closed both outputs.
    closed: Receiver<Infallible>,
}

impl Process {
    /// [`Start::new`]`(command, log).spawn()`: no ready line, no lines
    /// kept.
    pub fn start(command: Command, log: &Path) -> Result<Process> {
        Start::new(command, log).spawn()
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log file its output goes to.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of its log, headed by the file's name.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// The lines of the stream named by [`Start::lines_of`] (every one
    /// since the start), on a channel that ends when the child closes its
    /// output, that is when it exits; `None` if not asked for or already
    /// taken.
    pub fn take_lines(&mut self) -> Option<Receiver<String>> {
        self.lines.take()
    }

    /// Sends `signal` (a name `kill -s` knows: `STOP`, `CONT`, `TERM`, …)
    /// to the child, with `/bin/kill` (no `unsafe`, so no `libc::kill`);
    /// bounded by [`SIGNAL_TIMEOUT`].
    pub fn signal(&self, signal: &str) -> Result<()> {
        let mut kill = Command::new("kill")
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

    /// Closes the child's stdin (see [`Start::piped_stdin`]).
    pub fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Waits at most `timeout` for the child to exit (its output closing
    /// is the event), and returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        match self.closed.recv_timeout(timeout) {
            Err(RecvTimeoutError::Disconnected) => {}
            Err(RecvTimeoutError::Timeout) => bail!(
                "{} still runs after {timeout:?}; {}",
                self.program,
                self.log_tail(LOG_TAIL_LINES)
            ),
        }
        self.child
            .wait()
            .with_context(|| format!("reaping {}", self.program))
    }

    /// SIGTERM, as an operator stops a program, and waits at most
    /// `timeout` for its exit; returns its status.
    pub fn terminate(mut self, timeout: Duration) -> Result<ExitStatus> {
        self.signal("TERM")?;
        self.wait_exit(timeout)
    }

    /// SIGKILL: a crash, with no chance to flush or close anything. Returns
    /// once the child is reaped and its last output is in its log (bounded
    /// by [`DRAIN_TIMEOUT`]).
    pub fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        // Reaping a killed child returns at once.
        let _ = self.child.wait();
        let _ = self.closed.recv_timeout(DRAIN_TIMEOUT);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("{}: {}", self.program, self.log_tail(LOG_TAIL_LINES));
        }
    }
}

/// The last `lines` lines of the log at `path`, headed by its name.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("({e})"));
    let all: Vec<&str> = text.lines().collect();
    format!(
        "the last lines of {}:\n{}",
        path.display(),
        all[all.len().saturating_sub(lines)..].join("\n")
    )
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

    fn sh(script: &str) -> Command {
        let mut command = tied_to_parent(Path::new("/bin/sh"));
        command.args(["-c", script]);
        command
    }

    #[test]
    fn readiness_is_read_from_the_output_and_the_log_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("child.log");
        let mut child = Start::new(sh("echo early >&2; echo ready now; exec sleep 30"), &log)
            .ready_on("ready", Duration::from_secs(10))
            .lines_of(Stream::Stderr)
            .spawn()
            .unwrap();
        let lines = child.take_lines().unwrap();
        assert_eq!(
            lines.recv_timeout(Duration::from_secs(10)).unwrap(),
            "early"
        );
        child.kill();
        assert_eq!(log_count(&log, "ready now"), 1);
        assert_eq!(log_count(&log, "early"), 1);
    }

    #[test]
    fn a_child_that_exits_unready_fails_quoting_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("child.log");
        let error = Start::new(sh("echo why >&2; exit 3"), &log)
            .ready_on("ready", Duration::from_secs(10))
            .spawn()
            .unwrap_err()
            .to_string();
        assert!(error.contains("before printing"), "{error}");
        assert!(error.contains("why"), "{error}");
    }

    #[test]
    fn a_child_never_ready_is_killed_at_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let started = std::time::Instant::now();
        let error = Start::new(sh("exec sleep 30"), &dir.path().join("child.log"))
            .ready_on("ready", Duration::from_millis(200))
            .spawn()
            .unwrap_err()
            .to_string();
        assert!(error.contains("within"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn an_exit_is_awaited_and_its_status_returned() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Start::new(sh("read line; exit 4"), &dir.path().join("child.log"))
            .piped_stdin()
            .spawn()
            .unwrap();
        assert!(child.wait_exit(Duration::from_millis(100)).is_err());
        child.close_stdin();
        let status = child.wait_exit(Duration::from_secs(10)).unwrap();
        assert_eq!(status.code(), Some(4));
        let sleeper = Process::start(sh("exec sleep 30"), &dir.path().join("s.log")).unwrap();
        let status = sleeper.terminate(Duration::from_secs(10)).unwrap();
        assert!(!status.success());
    }
}

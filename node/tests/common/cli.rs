//! Every command the process tests run to its end (`ctrl …`, `bash -n`)
//! goes through [`output`]: the run is bounded by [`CLI_TIMEOUT`], and a
//! command still running then is killed (SIGKILL) and fails the test,
//! naming it. `Command::output()` alone would wait forever on a command
//! that hangs.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Bound on one command run (`ctrl deploy --wait` included).
pub(crate) const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `command` to its end (stdin closed, stdout and stderr captured),
/// bounded by [`CLI_TIMEOUT`].
///
/// # Panics
/// When the command cannot start, or runs past the timeout (it is killed
/// first).
pub(crate) fn output(command: &mut Command) -> Output {
    output_within(command, CLI_TIMEOUT)
}

/// [`output`], bounded by `timeout`.
pub(crate) fn output_within(command: &mut Command, timeout: Duration) -> Output {
    let what = format!("{command:?}");
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A std `Command` keeps its settings: moved into a tokio one, it is
    // spawned with them (and killed if dropped before it ends).
    let mut moved = Command::new(command.get_program());
    std::mem::swap(command, &mut moved);
    // On a thread of its own: the caller may be inside a runtime already.
    std::thread::scope(|scope| {
        scope
            .spawn(|| run(moved, timeout, &what))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn run(command: Command, timeout: Duration, what: &str) -> Output {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for one command");
    runtime.block_on(async {
        let mut command = tokio::process::Command::from(command);
        command.kill_on_drop(true);
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let finished = async {
            let (stdout, stderr, status) =
                tokio::join!(read_all(stdout), read_all(stderr), child.wait());
            Output {
                status: status.unwrap_or_else(|e| panic!("waiting for {what}: {e}")),
                stdout,
                stderr,
            }
        };
        match tokio::time::timeout(timeout, finished).await {
            Ok(output) => output,
            Err(_) => {
                let _ = child.kill().await;
                panic!("{what} ran past {timeout:?} and was killed");
            }
        }
    })
}

async fn read_all(mut pipe: impl tokio::io::AsyncRead + Unpin) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut bytes = Vec::new();
    // A read error ends the output where it is; the exit status tells.
    let _ = pipe.read_to_end(&mut bytes).await;
    bytes
}

#[test]
fn a_command_past_its_timeout_is_killed_and_fails_the_test() {
    let started = std::time::Instant::now();
    let panicked = std::panic::catch_unwind(|| {
        output_within(Command::new("sleep").arg("30"), Duration::from_millis(200))
    });
    let message = panicked
        .expect_err("a run past its timeout fails")
        .downcast::<String>()
        .map(|m| *m)
        .unwrap_or_default();
    assert!(message.contains("ran past"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let out = output(Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]));
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.status.code(), Some(3));
}

//! Every command the process tests run to its end (`ctrl …`, `bash -n`)
//! goes through [`output`]: the run is bounded by [`CLI_TIMEOUT`], and a
//! command still running then is killed (SIGKILL) and fails the test,
//! naming it (the shared bounded run, [`testkit::cli::output`], with a
//! longer bound: `ctrl deploy --wait` runs here too).

use std::process::{Command, Output};
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
    testkit::cli::output(command, timeout).unwrap_or_else(|e| panic!("{e:#}"))
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

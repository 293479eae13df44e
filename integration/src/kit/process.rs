//! Child processes of a test, from the shared harness ([`testkit`]):
//! [`Cli`] runs one command to its end, bounded by a timeout and killed
//! when it expires; [`Process`] is a long-running program (`ctrl serve`,
//! `krane run`) whose output goes to a log file, killed (SIGKILL, a crash)
//! when dropped, and signalled (`STOP`, `CONT`) on demand;
//! [`tied_to_parent`] makes such a child die with its parent;
//! [`log_count`] counts a line in such a log.

pub use testkit::cli::{CLI_TIMEOUT, Cli};
pub use testkit::process::{
    Process, SETPRIV, SIGNAL_TIMEOUT, Start, Stream, ctrl_serve, krane_run, log_count, log_tail,
    tied_to_parent,
};

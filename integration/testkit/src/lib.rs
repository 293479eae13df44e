//! The process harness the workspace's tests share: node's own process
//! tests, the end-to-end tests and the chaos checker (`integration::kit`),
//! and the benchmarks' process clusters (`integration::processes`) all
//! start `ctrl` and `krane` through it.
//!
//! - [`binaries`]: the `ctrl` and `krane` executables (`CTRL_BIN`,
//!   `KRANE_BIN`, or built by cargo);
//! - [`ports`]: free loopback ports for configs written before a start;
//! - [`certs`] and [`configs`]: certificates through `ctrl certs init`,
//!   and the node and operator config files of a loopback cluster;
//! - [`cli`]: a command run to its end, bounded by a timeout and killed
//!   when it expires ([`cli::Cli`] in async code, [`cli::output`] in
//!   plain tests);
//! - [`process`]: a long-running child (`ctrl serve`, `krane run`, `ctrl
//!   watch`) whose output is captured to a log file (its tail goes into
//!   every failure message), whose readiness is read from that output,
//!   killed on drop and tied to its parent;
//! - [`wait`]: bounded waits for a whole test, a step, or a condition no
//!   event announces.
//!
//! It links no crate of the product (not node, agent or storage), so the
//! product's own tests can depend on it.

pub mod binaries;
pub mod certs;
pub mod cli;
pub mod configs;
pub mod ports;
pub mod process;
pub mod wait;

//! The test kit: what the end-to-end tests share instead of each building
//! its own.
//!
//! - [`wait`]: `bounded` for a whole test, `within` for one step, and
//!   `wait_until` for the few conditions no event announces;
//! - [`operator`]: an operator client that creates, stops and reads
//!   deployments, sentinels and policies, and waits for a deployment
//!   through the node's long-poll call;
//! - [`process`]: command runs bounded by a timeout and killed when it
//!   expires (`Cli`), long-running children killed on drop (`Process`);
//! - [`ctrl`] and [`kubectl`]: the two command lines tests run, as `Cli`s;
//! - [`binaries`] builds the real `ctrl` and `krane`, and [`krane`] runs
//!   krane as a child process;
//!
//! [`wait`], [`binaries`] and [`process`] are the shared process harness,
//! [`testkit`] (which node's own process tests use too), re-exported;
//! - [`site`]: three `ctrl serve` processes with a simulator and a krane
//!   process per region, for the leader-kill tests.
//!
//! The sites themselves are [`crate::fleet`] (nodes, simulators and
//! kranes), [`crate::cluster`] (nodes only) and [`crate::processes`];
//! operator requests are built by [`crate::requests`].

pub mod ctrl;
pub mod krane;
pub mod kubectl;
pub mod operator;
pub mod process;
pub mod site;

pub use testkit::{binaries, wait};

//! Multi-node tests, tests of ctrl and krane together, and benchmarks.
//!
//! [`cluster`] starts ctrl nodes in-process on loopback with fresh
//! certificates, for benchmarks and tests that need more than one process's
//! worth of control. The Kubernetes API simulator krane and kubectl are
//! pointed at is the `k8s-sim` crate (`integration/k8s-sim`). [`fleet`] is
//! a whole site: one or three ctrl nodes plus, per region, a simulator and
//! an in-process krane. [`kit`] is what the tests share: bounded waits, an
//! operator helper that waits through the node's long poll, bounded runs
//! of `ctrl` and `kubectl`, and the real `krane` and `ctrl` binaries as
//! child processes. [`plan`] makes the certificates and configs of a set
//! of nodes, which those sites start. [`relay`] puts UDP relays between
//! nodes to cut them apart. [`processes`] runs a cluster as separate node processes, for
//! benchmarks compared with peers whose members are processes. [`requests`]
//! builds the operator requests benchmarks and tests send. [`scrape`]
//! reads the `/metrics` of nodes and agents. [`sentinels`] runs the real
//! sentinel in process for each sentinel Deployment of a simulated
//! cluster (a fleet with `traffic`). The `chaos` binary
//! (`src/bin/chaos/`) runs a random mix of operations and faults against
//! a whole site of processes and checks the result.

#![forbid(unsafe_code)]

pub mod cluster;
pub mod fleet;
pub mod kit;
pub mod plan;
pub mod processes;
pub mod relay;
pub mod requests;
pub mod scrape;
pub mod sentinels;
pub mod stats;

//! Multi-node tests, the Kubernetes simulator and benchmarks.
//!
//! [`cluster`] starts ctrl nodes in-process on loopback with fresh
//! certificates, for benchmarks and tests that need more than one process's
//! worth of control. [`sim`] is the Kubernetes API simulator krane and
//! kubectl are pointed at in tests and the demo. [`fleet`] is a whole
//! site: one or three ctrl nodes plus, per region, a simulator and an
//! in-process krane. [`relay`] puts UDP relays between nodes to cut them
//! apart. [`processes`] runs a cluster as separate node processes, for
//! benchmarks compared with peers whose members are processes. [`requests`]
//! builds the operator requests benchmarks and tests send.

pub mod cluster;
pub mod fleet;
pub mod processes;
pub mod relay;
pub mod requests;
pub mod sim;
pub mod stats;

//! Multi-node tests, the Kubernetes simulator (to come) and benchmarks.
//!
//! [`cluster`] starts ctrl nodes in-process on loopback with fresh
//! certificates, for benchmarks and tests that need more than one process's
//! worth of control.

pub mod cluster;
pub mod stats;

//! ctrl: the control-plane node. It keeps the desired state in a
//! Raft-replicated redb state machine and serves agents and operators over
//! QUIC with mutual TLS.
//!
//! - [`raft`]: type configuration, log store, state machine, network.
//! - [`server`]: the QUIC endpoint and the per-protocol handlers.
//! - [`node`]: opening the stores and starting Raft and the server.
//! - [`client`]: the operator client the CLI uses.
//! - [`compaction`]: the leader's change-log compaction schedule.
//! - [`wait`]: waiting for a deployment to become ready (`deploy --wait`).
//! - [`clock`]: time and ids, passed in.

pub mod app;
pub mod client;
pub mod clock;
pub mod jobs;
pub mod node;
pub mod raft;
pub mod replica;
pub mod runtime;
pub mod server;
pub mod wait;

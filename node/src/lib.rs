//! ctrl: the control-plane node. It keeps the desired state in a
//! Raft-replicated redb state machine and serves agents and operators over
//! QUIC with mutual TLS.
//!
//! The layers, each using only those below it:
//!
//! - [`boot`]: the composition root — opens the stores, starts Raft, the
//!   server and the leader jobs, and returns a [`boot::RunningNode`].
//!   Nothing in the crate imports it.
//! - [`server`]: the QUIC endpoint, the stream prelude and the thin
//!   per-protocol handlers; [`jobs`]: leader-only background jobs
//!   (compaction, workflows, notify, identity, backup) under one
//!   supervisor.
//! - [`replica`]: this node as a Raft replica: `NodeState`, writes
//!   (batched, forwarded to the leader), membership, cluster status.
//! - [`workflow`]: durable workflows — the pure `decide(record, view,
//!   now)` shape and the leader's driver — over the application layer's
//!   seams; the rules they share with storage's apply (guards, record
//!   constructors, a rollout's steps, the sentinel id) are
//!   [`wire::rules`].
//! - [`app`]: the operator's and agents' rules as plain functions over two
//!   seams, `Propose` and `ReadState`, tested without sockets or Raft. It
//!   never uses `workflow`, in its tests neither: a test that needs a
//!   started deployment proposes the start itself
//!   (`app::deployments::testing`).
//! - [`notify`]: webhook deliveries — the pure decisions (body, signature,
//!   backoff) and the HTTP client the leader's delivery job uses.
//! - [`raft`]: type configuration, log store, state machine, network;
//!   [`runtime`]: the thread openraft runs on; [`clock`]: time and ids,
//!   passed in; [`wake`]: the long polls' wake-ups by record, which the
//!   state machine feeds.
//!
//! [`metrics`]: the gauges, counters and readiness served on
//! `metrics_addr` (beside `server`, read by `boot`).
//!
//! Beside them, for the CLI: [`client`], the operator client, and
//! [`wait`], waiting for a deployment to become ready (`deploy --wait`).

#![forbid(unsafe_code)]

pub mod app;
pub mod backup;
pub mod boot;
pub mod client;
pub mod clock;
pub mod jobs;
pub mod metrics;
pub mod notify;
pub mod raft;
pub mod replica;
pub mod runtime;
pub mod server;
pub mod wait;
pub mod wake;
pub mod workflow;

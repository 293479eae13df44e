//! Every message exchanged between ctrl nodes, krane agents and operators,
//! and the framing that carries them.
//!
//! - [`model`]: the resources of the desired state (deployments, topologies,
//!   sentinels, cilium network policies, instances).
//! - [`access`]: who may call what — operator roles, environment scopes,
//!   the access each operator request needs, the one check.
//! - [`agent`] and [`operator`]: the two client protocols, one enum of
//!   requests and one of responses each; [`call`]: the typed layer over
//!   such enums (each request type names its answer type).
//! - [`frame`]: length-prefixed postcard frames with a hard size limit, a
//!   sans-I/O decoder, and thin async helpers.
//! - [`rollout`]: fleet rollouts of a sentinel image (the record, its
//!   members and events) and the wave plan.
//! - [`routes`]: the routes document a sentinel serves (JSON, written by
//!   krane into the sentinel's routes ConfigMap).
//! - [`hello`]: the version handshake that opens every stream.
//! - [`k8s_name`]: Kubernetes naming shared by ctrl and krane (derived
//!   object names, the sentinel namespace, name checks).
//! - [`digest`]: FNV-1a, the stable 64-bit hash of state checks and
//!   snapshots.
//! - [`notify`]: webhook endpoints, the events workflow transitions
//!   announce, and their per-endpoint delivery records.
//! - [`validate`]: what Kubernetes or Cilium would refuse, refused where
//!   the user is (env var names, image references, quantities, a cilium
//!   policy's shape), each error naming the field.
//! - [`clock`]: wall-clock time, passed in (the one `Clock` of ctrl and
//!   krane, a system and a manual clock).
//! - [`session`]: the watch protocol rules (what may be sent when, cursor
//!   rules), free of I/O so both sides are tested without sockets.
//! - [`rules`]: the rules of the durable workflows (guards, record
//!   constructors, the rollout's plan and steps, the sentinel id), one
//!   module per workflow, shared by the state machine's apply and the
//!   leader's deciders.
//! - `golden` (feature `golden`, for tests): golden-byte checks that pin
//!   every serialized format to its version.
//! - `fuzz` (feature `fuzz`, for tests): the mutation engine of the
//!   time-boxed fuzzers.
//!
//! # Serialized formats
//!
//! Every message is a postcard encoding, which carries no field names: a
//! new field changes the bytes of every message holding it. So enum
//! variants are append-only, and any other change of a message's encoding
//! (a new field above all) comes with a bump of
//! [`hello::PROTOCOL_VERSION`]. `tests/golden.rs` pins the bytes of every
//! type under the current version and fails on a change made without one.

#![forbid(unsafe_code)]

pub mod access;
pub mod agent;
pub mod call;
pub mod clock;
pub mod digest;
pub mod error;
pub mod frame;
#[cfg(feature = "fuzz")]
pub mod fuzz;
#[cfg(feature = "golden")]
pub mod golden;
pub mod hello;
pub mod k8s_name;
pub mod model;
pub mod notify;
pub mod operator;
pub mod operator_name;
pub mod revocation;
pub mod rollout;
pub mod routes;
pub mod rules;
pub mod session;
pub mod validate;
pub mod workload;

pub use error::{ErrorCode, WireError};
pub use model::Pk;

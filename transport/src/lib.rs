//! QUIC and mutual TLS shared by ctrl nodes and krane agents (which never
//! depend on each other).
//!
//! - [`identity`]: who a peer is, read from the `ctrl://…` SAN URI of its
//!   certificate.
//! - [`certs`]: a cluster CA and node, operator and agent certificates,
//!   generated with rcgen for sites without an ACME service.
//! - [`tls`]: rustls configs (ring provider, TLS 1.3 only, client
//!   certificates required) wrapped as quinn configs with bounded transport
//!   limits.
//! - [`expiry`]: how close a certificate is to its expiry (the rule of
//!   `ctrl certs check`, the warnings and the metrics), and reading a
//!   certificate directory.
//! - [`renew`]: fresh leaves from the CA of a directory, and CA rotation
//!   (a bundle of old and new CA), every file replaced atomically.
//! - [`reload`]: a node's or krane's certificate, key and CA bundle
//!   reloaded when the files change; new handshakes use the new material,
//!   open connections keep going.
//! - [`verify`]: clients accept a server holding a node certificate of
//!   the cluster CA, whatever address or name they dialled.
//! - [`endpoint`]: server and client endpoints, and connecting to the first
//!   of several addresses that answers.
//! - [`closing`]: a signal for when a resource (a socket, a database) is
//!   released.
//! - [`frame`]: the async driver of `wire`'s sans-I/O frame decoder
//!   (reading frames from a stream without reading past them, writing
//!   them).
//! - [`http`]: the HTTP listener of `/metrics`, `/livez` and `/readyz`
//!   (what they answer comes from the binary's [`http::Probe`]).
//! - [`sealing`]: secret values at rest (AES-256-GCM under the nodes'
//!   key file, written by `ctrl certs init`, rotated by adding keys).
//! - [`stream`]: one call per bidirectional stream, as length-prefixed
//!   postcard frames opened by a [`wire::hello::Hello`].
//!
//! Errors are [`TransportError`] (anything on the network path) and
//! [`CertError`] (generating, loading or reading certificates).

#![forbid(unsafe_code)]

pub mod certs;
pub mod closing;
pub mod endpoint;
pub mod error;
pub mod expiry;
pub mod frame;
pub mod http;
pub mod identity;
pub mod reload;
pub mod renew;
pub mod sealing;
pub mod stream;
pub mod tls;
pub mod verify;

pub use error::{CertError, ConnectFailure, TransportError};
pub use identity::Identity;

#[cfg(test)]
mod tests;

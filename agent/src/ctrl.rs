//! The way to ctrl: one kept QUIC connection (mutual TLS, ALPN
//! `ctrl-agent/1`), failover across the configured endpoints, the watch
//! call, and unary calls retried on another node when one cannot serve.
//!
//! Endpoints are resolved again at every new connection, so a node that
//! moves (a Kubernetes Service, DNS) is found again.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use config::AgentConfig;
use tracing::{debug, info};
use transport::TransportError;
use transport::reload::ReloadingTls;
use transport::stream::{FramedStream, open_call};
use transport::tls::TlsPaths;
use wire::agent::{AgentRequest, AgentResponse, WatchRequest};
use wire::hello::Protocol;
use wire::{ErrorCode, Pk, WireError};

/// How long one connection handshake may take.
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// How long a unary call may take, from opening its stream to the answer.
pub const CALL_TIMEOUT_MS: u64 = 10_000;
/// Most attempts of one unary call (each after a failover).
pub const CALL_ATTEMPTS_MAX: usize = 3;

/// Talking to ctrl failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CtrlError {
    /// No configured endpoint resolved; the endpoints tried.
    #[error("no ctrl endpoint resolves to an address ({0})")]
    Resolve(String),
    /// Connecting, TLS or framing failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// ctrl answered with an error.
    #[error("ctrl answered: {0}")]
    Refused(WireError),
    /// ctrl did not answer within [`CALL_TIMEOUT_MS`].
    #[error("no answer within {CALL_TIMEOUT_MS} ms")]
    Timeout,
    /// ctrl closed the stream without an answer.
    #[error("ctrl ended the call without an answer")]
    NoAnswer,
}

impl CtrlError {
    /// Whether another node (or a later attempt) may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            CtrlError::Refused(e) => retryable_code(e.code),
            _ => true,
        }
    }
}

fn retryable_code(code: ErrorCode) -> bool {
    matches!(code, ErrorCode::Unavailable | ErrorCode::NotLeader)
}

#[derive(Debug, Default)]
struct Kept {
    connection: Option<(quinn::Connection, SocketAddr)>,
    /// Where the next connection attempt starts in the address list.
    next: usize,
}

/// A client of one ctrl cluster, shared by the watch loop and the status
/// reporter.
#[derive(Debug)]
pub struct CtrlClient {
    endpoint: quinn::Endpoint,
    client_config: quinn::ClientConfig,
    endpoints: Vec<config::Endpoint>,
    server_name: String,
    region: String,
    kept: Mutex<Kept>,
}

impl CtrlClient {
    /// Loads the TLS files once and binds a client endpoint. Needs a
    /// tokio runtime.
    pub fn new(config: &AgentConfig) -> Result<CtrlClient, CtrlError> {
        let tls = TlsPaths {
            ca_cert: config.tls.ca_cert.clone(),
            cert: config.tls.cert.clone(),
            key: config.tls.key.clone(),
        };
        let client_config = transport::tls::client_config(&tls, wire::agent::ALPN)?;
        CtrlClient::with_client_config(config, client_config)
    }

    /// A client whose every new connection presents the certificate `tls`
    /// holds then and trusts its CA bundle then (krane reloads them when
    /// the files change); the kept connection is not replaced by a reload.
    /// Needs a tokio runtime.
    pub fn with_tls(
        config: &AgentConfig,
        tls: &Arc<ReloadingTls>,
    ) -> Result<CtrlClient, CtrlError> {
        let client_config = tls.client_config(wire::agent::ALPN)?;
        CtrlClient::with_client_config(config, client_config)
    }

    fn with_client_config(
        config: &AgentConfig,
        client_config: quinn::ClientConfig,
    ) -> Result<CtrlClient, CtrlError> {
        let bind = config
            .endpoints
            .iter()
            .find_map(|e| e.resolve().ok()?.into_iter().next())
            .map_or((Ipv4Addr::UNSPECIFIED, 0).into(), |addr| {
                transport::endpoint::client_bind_addr(addr)
            });
        let endpoint = transport::endpoint::client_endpoint(bind)?;
        Ok(CtrlClient {
            endpoint,
            client_config,
            endpoints: config.endpoints.clone(),
            server_name: config.server_name.clone(),
            region: config.region.clone(),
            kept: Mutex::new(Kept::default()),
        })
    }

    fn kept(&self) -> MutexGuard<'_, Kept> {
        // Every update of `Kept` is a single assignment.
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The kept connection if it is still open, else a new one to the
    /// first endpoint that answers, starting after the last one given up.
    pub async fn connect(&self) -> Result<(quinn::Connection, SocketAddr), CtrlError> {
        let next = {
            let mut kept = self.kept();
            match &kept.connection {
                Some((connection, addr)) if connection.close_reason().is_none() => {
                    return Ok((connection.clone(), *addr));
                }
                // The node closed it (it stopped, or went away): start with
                // the following endpoint rather than wait on this one.
                Some(_) => {
                    kept.connection = None;
                    kept.next += 1;
                }
                None => {}
            }
            kept.next
        };
        let mut addrs = Vec::new();
        let mut problems = Vec::new();
        for endpoint in &self.endpoints {
            match endpoint.resolve() {
                Ok(resolved) => addrs.extend(resolved),
                Err(e) => problems.push(format!("{endpoint}: {e}")),
            }
        }
        if addrs.is_empty() {
            return Err(CtrlError::Resolve(problems.join("; ")));
        }
        addrs.truncate(transport::endpoint::CONNECT_ADDRS_MAX);
        let start = next % addrs.len();
        addrs.rotate_left(start);
        let (connection, addr) = transport::endpoint::connect_any(
            &self.endpoint,
            &self.client_config,
            &addrs,
            &self.server_name,
            CONNECT_TIMEOUT_MS,
        )
        .await?;
        info!(%addr, "connected to ctrl");
        let mut kept = self.kept();
        let index = addrs.iter().position(|a| *a == addr).unwrap_or(0);
        kept.next = start + index;
        kept.connection = Some((connection.clone(), addr));
        Ok((connection, addr))
    }

    /// Gives up `connection` (if it is the kept one): the next
    /// [`CtrlClient::connect`] starts at the following endpoint. Streams
    /// still open on it go on until they fail by themselves.
    pub fn fail_over(&self, connection: &quinn::Connection) {
        let mut kept = self.kept();
        if kept
            .connection
            .as_ref()
            .is_some_and(|(c, _)| c.stable_id() == connection.stable_id())
        {
            kept.connection = None;
            kept.next += 1;
        }
    }

    /// Opens a watch of this agent's region after `cursor`, taken in
    /// cluster epoch `epoch`.
    pub async fn watch(
        &self,
        cursor: Pk,
        epoch: u64,
    ) -> Result<(FramedStream, quinn::Connection, SocketAddr), CtrlError> {
        let (connection, addr) = self.connect().await?;
        let opened = async {
            let mut stream =
                open_call(&connection, Protocol::Agent, wire::frame::FRAME_BYTES_MAX).await?;
            stream
                .send(&AgentRequest::Watch(WatchRequest {
                    region: self.region.clone(),
                    cursor,
                    epoch,
                }))
                .await?;
            Ok::<_, TransportError>(stream)
        }
        .await;
        match opened {
            Ok(stream) => Ok((stream, connection, addr)),
            Err(e) => {
                self.fail_over(&connection);
                Err(e.into())
            }
        }
    }

    /// One unary call, retried on the next node when a node cannot serve
    /// (connection lost, timeout, `Unavailable`, `NotLeader`); any other
    /// error answer is returned as [`CtrlError::Refused`].
    pub async fn call(&self, request: &AgentRequest) -> Result<AgentResponse, CtrlError> {
        let mut last = CtrlError::NoAnswer;
        for attempt in 0..CALL_ATTEMPTS_MAX {
            let (connection, addr) = self.connect().await?;
            let answer = tokio::time::timeout(
                Duration::from_millis(CALL_TIMEOUT_MS),
                call_on(&connection, request),
            )
            .await
            .unwrap_or(Err(CtrlError::Timeout));
            let error = match answer {
                Ok(AgentResponse::Error(e)) => CtrlError::Refused(e),
                Ok(response) => return Ok(response),
                Err(e) => e,
            };
            if !error.is_retryable() {
                return Err(error);
            }
            debug!(%addr, attempt, %error, "call failed; failing over");
            self.fail_over(&connection);
            last = error;
        }
        Err(last)
    }
}

async fn call_on(
    connection: &quinn::Connection,
    request: &AgentRequest,
) -> Result<AgentResponse, CtrlError> {
    let mut stream = open_call(connection, Protocol::Agent, wire::frame::FRAME_BYTES_MAX).await?;
    stream.send(request).await?;
    stream.finish().await?;
    stream
        .recv::<AgentResponse>()
        .await?
        .ok_or(CtrlError::NoAnswer)
}

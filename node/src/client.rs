//! The operator client: one QUIC connection, shared by every call (each
//! call a stream of its own), made to the first configured node that
//! answers. Used by the `ctrl` CLI and by tests.
//!
//! A call that changes state carries a request id ([`new_request_id`],
//! or the caller's), the same on every try, so the node applies it once:
//! when its answer is lost (the connection dropped, no answer, a timeout)
//! it is safely sent again to another node, which answers with the first
//! answer. A state-changing call without an id is tried elsewhere only when
//! it was certainly not sent, or refused by a node that could not serve it.

use std::net::SocketAddr;

use config::OperatorConfig;
use transport::TransportError;
use transport::stream::FramedStream;
use wire::agent::{AgentRequest, WatchEvent, WatchRequest};
use wire::frame::FRAME_BYTES_MAX;
use wire::hello::Protocol;
use wire::operator::{Operation, OperatorCall, OperatorRequest, OperatorResponse, Page, RequestId};
use wire::{ErrorCode, Pk, WireError};

/// Why an operator call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Connecting, TLS or framing failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The node answered with an error.
    #[error("{0}")]
    Server(WireError),
    /// The node closed the stream without answering.
    #[error("the node closed the stream without an answer")]
    NoAnswer,
    /// Every configured node failed; each one's failure, joined.
    #[error("no node answered: {0}")]
    AllFailed(String),
    /// No answer within the call's timeout.
    #[error("no answer within {timeout_ms} ms")]
    Timeout {
        /// The timeout of the call.
        timeout_ms: u64,
    },
    /// The node sent nothing, not even the acknowledgement of a
    /// keep-alive, for `silent_ms` while the call waited: it is gone or
    /// stopped.
    #[error("the node went silent for {silent_ms} ms")]
    Silent {
        /// How long nothing came.
        silent_ms: u64,
    },
    /// A state-changing request without a request id was sent but its
    /// answer was lost: it may or may not have been applied, so it was not
    /// sent again.
    #[error(
        "the answer was lost and the request, which has no request id, may have been applied: {0}"
    )]
    AnswerLost(String),
    /// The node answered a request with an answer of another request: a
    /// peer that does not keep the protocol.
    #[error("the node answered {request} with {answer}")]
    UnexpectedAnswer {
        /// The request's name ([`OperatorRequest::name`]).
        request: &'static str,
        /// The answer it got, as debug text.
        answer: String,
    },
}

/// A call that may be sent again (it has a request id, or changes
/// nothing) gives up on its node when the connection received nothing for
/// this long: a live node acknowledges the keep-alives the client sends
/// every [`transport::tls::KEEP_ALIVE_INTERVAL_MS`], so this is two missed
/// acknowledgements, well before the QUIC idle timeout
/// ([`transport::tls::IDLE_TIMEOUT_MS`]) closes the connection.
pub const SILENCE_MS: u64 = 2 * transport::tls::KEEP_ALIVE_INTERVAL_MS;
/// How often a waiting call looks at what its connection received.
pub const SILENCE_POLL_MS: u64 = 50;

/// How one try of a call failed.
enum Attempt {
    /// Before the request was sent: it did not reach the node.
    NotSent(ClientError),
    /// After it was (or may have been) sent: its answer is lost.
    Lost(ClientError),
}

/// A fresh random request id (`req-` and 32 hex digits): one per
/// invocation of a command, kept on every retry.
pub fn new_request_id() -> RequestId {
    let id = format!("req-{:032x}", rand::random::<u128>());
    // 36 bytes of printable ASCII: valid by construction.
    RequestId::parse(&id).unwrap_or_else(|_| unreachable!("a generated request id is valid"))
}

/// The answer of call `C` out of `response`, or the error naming what came
/// instead.
fn answer<C: Operation>(
    request: &OperatorRequest,
    response: OperatorResponse,
) -> Result<C::Answer, ClientError> {
    C::answer(response).map_err(|other| ClientError::UnexpectedAnswer {
        request: request.name(),
        answer: format!("{other:?}"),
    })
}

/// Talks to a ctrl cluster as an operator.
pub struct Client {
    endpoint: quinn::Endpoint,
    operator_tls: quinn::ClientConfig,
    agent_tls: quinn::ClientConfig,
    addrs: Vec<SocketAddr>,
    server_name: String,
    timeout_ms: u64,
    /// The connection calls share, with the node it goes to; made by the
    /// first call that finds none, dropped when it fails.
    cached: tokio::sync::Mutex<Option<(quinn::Connection, SocketAddr)>>,
}

impl Client {
    /// A client of the nodes in `config`, with its TLS identity loaded; connects lazily.
    pub fn new(config: &OperatorConfig) -> Result<Self, ClientError> {
        transport::tls::install_crypto_provider();
        let paths = transport::tls::TlsPaths {
            ca_cert: config.tls.ca_cert.clone(),
            cert: config.tls.cert.clone(),
            key: config.tls.key.clone(),
        };
        let bind = match config.endpoints.first() {
            Some(SocketAddr::V6(_)) => "[::]:0",
            _ => "0.0.0.0:0",
        };
        let bind: SocketAddr = bind.parse().map_err(|_| ClientError::NoAnswer)?;
        Ok(Client {
            endpoint: transport::endpoint::client_endpoint(bind)?,
            operator_tls: transport::tls::client_config(&paths, wire::operator::ALPN)?,
            agent_tls: transport::tls::client_config(&paths, wire::agent::ALPN)?,
            addrs: config.endpoints.clone(),
            server_name: config.server_name.clone(),
            timeout_ms: config.request_timeout_ms,
            cached: tokio::sync::Mutex::new(None),
        })
    }

    /// Makes one operator call and returns its answer: `client.call(
    /// GetDeployment { id })` is a [`wire::operator::DeploymentView`] or an
    /// error. Fails over between nodes when a node is unreachable or
    /// cannot serve. A request that changes state gets a fresh request id
    /// ([`new_request_id`]), so it is tried again elsewhere when its
    /// answer is lost. Calls may run concurrently: they share one
    /// connection, each on a stream of its own.
    pub async fn call<C: Operation>(&self, call: C) -> Result<C::Answer, ClientError> {
        let request = call.into_request();
        let request_id = request.is_mutating().then(new_request_id);
        answer::<C>(&request, self.send_with_id(&request, request_id).await?)
    }

    /// Every item of a paged list call, oldest page first: `request(after)`
    /// makes the call for the page after `after` (`None`: the first).
    pub async fn all_pages<C, T, A>(
        &self,
        mut request: impl FnMut(Option<A>) -> C,
    ) -> Result<Vec<T>, ClientError>
    where
        C: Operation<Answer = Page<T, A>>,
    {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let page = self.call(request(after.take())).await?;
            all.extend(page.items);
            match page.next_after {
                Some(next) => after = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// [`Client::call`] with the caller's request id (`None`: none, so a
    /// state-changing request whose answer is lost is not tried again).
    pub async fn call_with_id<C: Operation>(
        &self,
        call: C,
        request_id: Option<RequestId>,
    ) -> Result<C::Answer, ClientError> {
        let request = call.into_request();
        answer::<C>(&request, self.send_with_id(&request, request_id).await?)
    }

    /// Sends a request as the protocol's enum and returns the response as
    /// it came (never `Error`: that is [`ClientError::Server`]), for
    /// callers that send requests they did not type (generated ones,
    /// replays). Otherwise as [`Client::call`].
    pub async fn send(&self, request: &OperatorRequest) -> Result<OperatorResponse, ClientError> {
        let request_id = request.is_mutating().then(new_request_id);
        self.send_with_id(request, request_id).await
    }

    /// [`Client::send`] with the caller's request id. Each try is bounded
    /// by `request_timeout_ms`, and there is one try per configured node
    /// and one more (the connection in use may be stale).
    pub async fn send_with_id(
        &self,
        request: &OperatorRequest,
        request_id: Option<RequestId>,
    ) -> Result<OperatorResponse, ClientError> {
        // Sent again after a lost answer only if that cannot apply it twice.
        let repeatable = request_id.is_some() || !request.is_mutating();
        let call = OperatorCall {
            request_id,
            request: request.clone(),
        };
        let mut failures = Vec::new();
        // The node to try first when a new connection is needed: after
        // the one that could not serve (staggered attempts: a node that is
        // down costs a stagger, not a timeout).
        let mut start = 0;
        // The connection in use (which may be stale: the node restarted,
        // idle timeout), then one to each node in turn.
        for _ in 0..=self.addrs.len() {
            let (connection, addr) = match self.connection(start).await {
                Ok(connected) => connected,
                Err(e) => {
                    failures.push(e.to_string());
                    break;
                }
            };
            start = self
                .addrs
                .iter()
                .position(|a| *a == addr)
                .map_or(0, |i| i + 1);
            match self
                .call_within(&connection, &call, self.timeout_ms, repeatable)
                .await
            {
                Ok(OperatorResponse::Error(e)) if retry_elsewhere(&e) => {
                    failures.push(format!("{addr}: {e}"));
                    self.forget(&connection).await;
                }
                Ok(OperatorResponse::Error(e)) => return Err(ClientError::Server(e)),
                Ok(response) => return Ok(response),
                Err(Attempt::Lost(e)) if !repeatable => {
                    self.forget(&connection).await;
                    return Err(ClientError::AnswerLost(format!("{addr}: {e}")));
                }
                Err(Attempt::NotSent(e) | Attempt::Lost(e)) => {
                    failures.push(format!("{addr}: {e}"));
                    self.forget(&connection).await;
                }
            }
        }
        Err(ClientError::AllFailed(failures.join("; ")))
    }

    /// The connection calls share, made (to the first node that answers,
    /// starting with `addrs[start]`) if there is none: concurrent callers
    /// wait for the one being made rather than each making its own.
    async fn connection(
        &self,
        start: usize,
    ) -> Result<(quinn::Connection, SocketAddr), ClientError> {
        let mut cached = self.cached.lock().await;
        if let Some((connection, addr)) = cached.as_ref()
            && connection.close_reason().is_none()
        {
            return Ok((connection.clone(), *addr));
        }
        let addrs = rotate(&self.addrs, start % self.addrs.len().max(1));
        let connected = transport::endpoint::connect_any(
            &self.endpoint,
            &self.operator_tls,
            &addrs,
            &self.server_name,
            self.timeout_ms,
        )
        .await?;
        *cached = Some(connected.clone());
        Ok(connected)
    }

    /// How long one call may take before it fails (`request_timeout_ms`).
    pub fn request_timeout_ms(&self) -> u64 {
        self.timeout_ms
    }

    /// QUIC connections this client holds open (its calls share one).
    pub fn open_connections(&self) -> usize {
        self.endpoint.open_connections()
    }

    /// Drops the cached connection if it is still `connection` (a
    /// concurrent call may already have replaced it).
    async fn forget(&self, connection: &quinn::Connection) {
        let mut cached = self.cached.lock().await;
        if cached
            .as_ref()
            .is_some_and(|(c, _)| c.stable_id() == connection.stable_id())
        {
            *cached = None;
        }
    }

    /// Sends one request that may take up to `timeout_ms` to the first
    /// node that accepts a connection, and returns its answer as it is: a
    /// node's error is not retried elsewhere (the node already hands
    /// cluster-wide calls to the leader). For calls that wait, like adding
    /// a node.
    pub async fn call_once<C: Operation>(
        &self,
        call: C,
        timeout_ms: u64,
    ) -> Result<C::Answer, ClientError> {
        let request = call.into_request();
        answer::<C>(&request, self.send_once(&request, timeout_ms).await?)
    }

    /// [`Client::call_once`] of a request as the protocol's enum.
    pub async fn send_once(
        &self,
        request: &OperatorRequest,
        timeout_ms: u64,
    ) -> Result<OperatorResponse, ClientError> {
        let (connection, _) = transport::endpoint::connect_any(
            &self.endpoint,
            &self.operator_tls,
            &self.addrs,
            &self.server_name,
            self.timeout_ms,
        )
        .await?;
        let call = OperatorCall::new(request.clone());
        match self
            .call_within(&connection, &call, timeout_ms, false)
            .await
        {
            Ok(OperatorResponse::Error(e)) => Err(ClientError::Server(e)),
            Ok(response) => Ok(response),
            Err(Attempt::NotSent(e) | Attempt::Lost(e)) => Err(e),
        }
    }

    /// One try of `call` on `connection`, within `timeout_ms`; with
    /// `give_up_on_silence`, the try also ends once the node has been
    /// silent for [`SILENCE_MS`].
    async fn call_within(
        &self,
        connection: &quinn::Connection,
        call: &OperatorCall,
        timeout_ms: u64,
        give_up_on_silence: bool,
    ) -> Result<OperatorResponse, Attempt> {
        let timeout = std::time::Duration::from_millis(timeout_ms);
        let deadline = tokio::time::Instant::now() + timeout;
        let timed_out = || ClientError::Timeout { timeout_ms };
        let opened = tokio::time::timeout_at(
            deadline,
            transport::stream::open_call(connection, Protocol::Operator, FRAME_BYTES_MAX),
        )
        .await;
        let mut stream = match opened {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(Attempt::NotSent(e.into())),
            Err(_) => return Err(Attempt::NotSent(timed_out())),
        };
        // From here on the request may have reached the node.
        let exchange = async {
            stream.send(call).await?;
            stream.finish().await?;
            stream.recv::<OperatorResponse>().await
        };
        let answered = async {
            match tokio::time::timeout_at(deadline, exchange).await {
                Ok(Ok(Some(response))) => Ok(response),
                Ok(Ok(None)) => Err(Attempt::Lost(ClientError::NoAnswer)),
                Ok(Err(e)) => Err(Attempt::Lost(e.into())),
                Err(_) => Err(Attempt::Lost(timed_out())),
            }
        };
        if !give_up_on_silence {
            return answered.await;
        }
        tokio::select! {
            result = answered => result,
            () = silent(connection, SILENCE_MS) => Err(Attempt::Lost(ClientError::Silent {
                silent_ms: SILENCE_MS,
            })),
        }
    }

    /// Takes a backup on the first node that accepts a connection: the
    /// file's bytes as the node streams them, within `timeout_ms` in all
    /// and at most [`crate::backup::BACKUP_BYTES_MAX`].
    pub async fn backup(&self, timeout_ms: u64) -> Result<Vec<u8>, ClientError> {
        let (connection, _) = transport::endpoint::connect_any(
            &self.endpoint,
            &self.operator_tls,
            &self.addrs,
            &self.server_name,
            self.timeout_ms,
        )
        .await?;
        let call = OperatorCall::new(OperatorRequest::Backup(wire::operator::request::Backup));
        let receive = async {
            let mut stream =
                transport::stream::open_call(&connection, Protocol::Operator, FRAME_BYTES_MAX)
                    .await?;
            stream.send(&call).await?;
            stream.finish().await?;
            let mut bytes = Vec::new();
            loop {
                match stream.recv::<OperatorResponse>().await? {
                    Some(OperatorResponse::BackupChunk(chunk)) => {
                        let at = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
                        if chunk.offset != at || chunk.total_bytes > crate::backup::BACKUP_BYTES_MAX
                        {
                            return Err(ClientError::Server(WireError::new(
                                ErrorCode::ProtocolViolation,
                                format!(
                                    "backup chunk at offset {} of {} bytes, expected offset {at}",
                                    chunk.offset, chunk.total_bytes
                                ),
                            )));
                        }
                        bytes.extend_from_slice(&chunk.bytes);
                        if u64::try_from(bytes.len()).unwrap_or(u64::MAX) >= chunk.total_bytes {
                            return Ok(bytes);
                        }
                    }
                    Some(OperatorResponse::Error(e)) => return Err(ClientError::Server(e)),
                    Some(other) => {
                        return Err(ClientError::Server(WireError::new(
                            ErrorCode::ProtocolViolation,
                            format!("unexpected answer to a backup: {other:?}"),
                        )));
                    }
                    None => return Err(ClientError::NoAnswer),
                }
            }
        };
        match tokio::time::timeout(std::time::Duration::from_millis(timeout_ms), receive).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::Timeout { timeout_ms }),
        }
    }

    /// Opens a watch of `region` from `cursor`, in no particular cluster
    /// epoch (the node trusts the cursor), on the first node that accepts
    /// a connection.
    pub async fn watch(&self, region: &str, cursor: Pk) -> Result<WatchStream, ClientError> {
        self.watch_in_epoch(region, cursor, 0).await
    }

    /// Opens a watch of `region` from `cursor`, taken in cluster epoch
    /// `epoch` (0: unknown), on the first node that accepts a connection.
    pub async fn watch_in_epoch(
        &self,
        region: &str,
        cursor: Pk,
        epoch: u64,
    ) -> Result<WatchStream, ClientError> {
        let (connection, _) = transport::endpoint::connect_any(
            &self.endpoint,
            &self.agent_tls,
            &self.addrs,
            &self.server_name,
            self.timeout_ms,
        )
        .await?;
        let mut stream =
            transport::stream::open_call(&connection, Protocol::Agent, FRAME_BYTES_MAX).await?;
        stream
            .send(&AgentRequest::Watch(WatchRequest {
                region: region.to_string(),
                cursor,
                epoch,
            }))
            .await?;
        Ok(WatchStream {
            _connection: connection,
            stream,
        })
    }
}

/// Returns once `connection` has received no datagram for `silence_ms`
/// (looked at every [`SILENCE_POLL_MS`]).
async fn silent(connection: &quinn::Connection, silence_ms: u64) {
    let silence = std::time::Duration::from_millis(silence_ms);
    let poll = std::time::Duration::from_millis(SILENCE_POLL_MS);
    let mut received = connection.stats().udp_rx.datagrams;
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(poll).await;
        let now = connection.stats().udp_rx.datagrams;
        if now != received {
            received = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= silence {
            return;
        }
    }
}

/// Errors another node may not have.
fn retry_elsewhere(error: &WireError) -> bool {
    matches!(error.code, ErrorCode::NotLeader | ErrorCode::Unavailable)
}

fn rotate(addrs: &[SocketAddr], start: usize) -> Vec<SocketAddr> {
    addrs[start..]
        .iter()
        .chain(&addrs[..start])
        .copied()
        .collect()
}

/// An open watch: events as the node sends them.
pub struct WatchStream {
    _connection: quinn::Connection,
    stream: FramedStream,
}

impl WatchStream {
    /// The next event; `None` when the node ended the stream.
    pub async fn next(&mut self) -> Result<Option<WatchEvent>, ClientError> {
        Ok(self.stream.recv::<WatchEvent>().await?)
    }
}

//! The stream prelude, written once for the agent, operator and Raft
//! protocols: accept a stream and check its hello, read a request,
//! authorize it for the peer's certificate, and answer; any refusal (a bad
//! hello, a request that cannot be read, a request the peer may not make)
//! is answered with the protocol's own error message and ends the stream.
//! A protocol says what it needs through [`Protocol`]; its handler gets
//! only authorized requests.

use std::marker::PhantomData;

use quinn::{RecvStream, SendStream};
use serde::Serialize;
use serde::de::DeserializeOwned;
use transport::identity::Identity;
use transport::stream::FramedStream;
use wire::WireError;

use super::ServeError;

/// What the prelude needs of a protocol.
pub(crate) trait Protocol {
    /// The protocol a stream's hello must name.
    const HELLO: wire::hello::Protocol;
    type Request: DeserializeOwned;
    /// What a refusal is sent as.
    type Refusal: Serialize;
    /// Whether `identity` may make `request`.
    fn authorize(identity: &Identity, request: &Self::Request) -> Result<(), WireError>;
    /// The refusal of `request` (`None`: no request was read) for `error`.
    fn refusal(request: Option<&Self::Request>, error: WireError) -> Self::Refusal;
}

/// A stream past its hello, serving requests of protocol `P` for one peer.
pub(crate) struct Call<'a, P> {
    stream: FramedStream,
    identity: &'a Identity,
    protocol: PhantomData<P>,
}

/// Accepts a stream of protocol `P`: reads and checks its hello. A refused
/// hello is answered (with `P`'s refusal) and the stream ended: `None`.
pub(crate) async fn accept<'a, P: Protocol>(
    send: SendStream,
    recv: RecvStream,
    identity: &'a Identity,
    frame_bytes_max: usize,
) -> Result<Option<Call<'a, P>>, ServeError> {
    match transport::stream::accept_call(send, recv, P::HELLO, frame_bytes_max).await {
        Ok(stream) => Ok(Some(Call {
            stream,
            identity,
            protocol: PhantomData,
        })),
        Err(transport::stream::AcceptError { mut stream, error }) => {
            stream.send(&P::refusal(None, error)).await?;
            finish(&mut stream).await;
            Ok(None)
        }
    }
}

impl<P: Protocol> Call<'_, P> {
    /// The next request, read and authorized. `None` ends the call: the
    /// peer finished its side, or the request could not be read or was
    /// refused — answered with the refusal. The stream is finished either
    /// way.
    pub(crate) async fn request(&mut self) -> Result<Option<P::Request>, ServeError> {
        let request = match self.stream.recv::<P::Request>().await {
            Ok(Some(request)) => request,
            Ok(None) => {
                finish(&mut self.stream).await;
                return Ok(None);
            }
            Err(e) => {
                self.refuse(None, e.to_wire()).await?;
                return Ok(None);
            }
        };
        match P::authorize(self.identity, &request) {
            Ok(()) => Ok(Some(request)),
            Err(e) => {
                self.refuse(Some(&request), e).await?;
                Ok(None)
            }
        }
    }

    /// Sends one answer.
    pub(crate) async fn answer<T: Serialize>(&mut self, response: &T) -> Result<(), ServeError> {
        self.stream.send(response).await?;
        Ok(())
    }

    /// Ends this side of the call after its last answer.
    pub(crate) async fn finish(mut self) {
        finish(&mut self.stream).await;
    }

    /// The stream, for a handler that streams its answer (a watch).
    pub(crate) fn into_stream(self) -> FramedStream {
        self.stream
    }

    async fn refuse(
        &mut self,
        request: Option<&P::Request>,
        error: WireError,
    ) -> Result<(), ServeError> {
        self.stream.send(&P::refusal(request, error)).await?;
        finish(&mut self.stream).await;
        Ok(())
    }
}

/// Closes a call's send side after its last frame.
pub(crate) async fn finish(stream: &mut FramedStream) {
    let _ = stream.finish().await;
}

//! One table from request type to handler: `Dispatch::new(state,
//! request).on(handler).on(handler)…finish()`, as rust-analyzer's request
//! dispatcher does. Each handler takes its request type and returns that
//! request's answer type ([`wire::call::Call`]), so no handler builds a
//! response enum and none can answer with another request's answer. The
//! first handler registered for the request's type serves it.

use std::future::Future;

use futures::future::BoxFuture;
use wire::operator::{Operation, OperatorRequest, OperatorResponse};
use wire::{ErrorCode, WireError};

/// A request on its way to its handler, over the state `S` handlers use.
pub struct Dispatch<'a, S> {
    state: &'a S,
    /// The request, until a handler takes it.
    request: Option<OperatorRequest>,
    /// The taking handler's answer, as a response.
    answer: Option<BoxFuture<'a, Result<OperatorResponse, WireError>>>,
    /// The request's name, for the error when no handler takes it.
    name: &'static str,
}

impl<'a, S: Sync> Dispatch<'a, S> {
    /// `request`, to be served over `state`.
    pub fn new(state: &'a S, request: OperatorRequest) -> Self {
        Dispatch {
            state,
            name: request.name(),
            request: Some(request),
            answer: None,
        }
    }

    /// Serves requests of type `C` with `handler`.
    pub fn on<C, F, Fut>(mut self, handler: F) -> Self
    where
        C: Operation + Send + 'a,
        C::Answer: Send,
        F: FnOnce(&'a S, C) -> Fut,
        Fut: Future<Output = Result<C::Answer, WireError>> + Send + 'a,
    {
        if let Some(request) = self.request.take() {
            match C::from_request(request) {
                Ok(call) => {
                    let answered = handler(self.state, call);
                    self.answer = Some(Box::pin(async move { answered.await.map(C::respond) }));
                }
                Err(request) => self.request = Some(request),
            }
        }
        self
    }

    /// Serves requests of type `C` with `handler`, which answers at once.
    pub fn on_sync<C, F>(mut self, handler: F) -> Self
    where
        C: Operation + Send + 'a,
        C::Answer: Send + 'a,
        F: FnOnce(&'a S, C) -> Result<C::Answer, WireError>,
    {
        if let Some(request) = self.request.take() {
            match C::from_request(request) {
                Ok(call) => {
                    let answered = handler(self.state, call).map(C::respond);
                    self.answer = Some(Box::pin(std::future::ready(answered)));
                }
                Err(request) => self.request = Some(request),
            }
        }
        self
    }

    /// The request, if no handler registered so far took it: for a table
    /// that hands the rest to another.
    pub fn unserved(&self) -> Option<&OperatorRequest> {
        self.request.as_ref()
    }

    /// The answer of the handler that took the request; `Internal` when
    /// none did (a request this table does not serve).
    pub async fn finish(self) -> Result<OperatorResponse, WireError> {
        match self.answer {
            Some(answer) => answer.await,
            None => Err(WireError::new(
                ErrorCode::Internal,
                format!("no handler serves {} here", self.name),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use wire::operator::request::{GetDeployment, NodeVersion};

    use super::*;

    #[tokio::test]
    async fn the_handler_of_the_request_type_answers() {
        let state = ();
        let request = OperatorRequest::from(NodeVersion);
        let response = Dispatch::new(&state, request)
            .on_sync(|_, GetDeployment { id }| Err(WireError::new(ErrorCode::NotFound, id)))
            .on_sync(|_, NodeVersion| {
                Ok(wire::operator::NodeVersion {
                    node_id: 7,
                    software: "x".into(),
                    protocols: wire::hello::PROTOCOL_VERSIONS,
                })
            })
            .finish()
            .await
            .unwrap();
        assert!(matches!(response, OperatorResponse::NodeVersion(v) if v.node_id == 7));
    }

    #[tokio::test]
    async fn a_request_no_handler_takes_is_an_internal_error_naming_it() {
        let state = ();
        let request = OperatorRequest::from(GetDeployment { id: "d".into() });
        let error = Dispatch::new(&state, request)
            .on(|_, NodeVersion| async { Err(WireError::new(ErrorCode::Internal, "not me")) })
            .finish()
            .await
            .unwrap_err();
        assert_eq!(error.code, ErrorCode::Internal);
        assert!(error.message.contains("get_deployment"), "{error}");
    }
}

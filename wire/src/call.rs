//! Typed calls: each request type names its answer type, so a caller gets
//! the answer it asked for or an error, never "some other answer" to
//! handle by hand (as rust-analyzer's request dispatcher and kube's
//! `Api<K>` do).
//!
//! A protocol keeps one request enum and one response enum on the wire
//! (append-only, pinned by golden bytes); [`Call`] is the typed layer over
//! them. The client side converts a request in with [`Call::into_request`]
//! and the response out with [`Call::answer`]; the serving side takes its
//! request out with [`Call::from_request`] and wraps its handler's answer
//! with [`Call::respond`]. The operator protocol's calls are in
//! [`crate::operator`]; ctrl's replicated mutations use the same trait.

/// One request type of a protocol and the answer it gets.
pub trait Call: Sized {
    /// The protocol's request enum.
    type Request;
    /// The protocol's response enum.
    type Response;
    /// What a successful call answers.
    type Answer;

    /// The request as the protocol's enum carries it.
    fn into_request(self) -> Self::Request;

    /// This request type out of the enum; the enum back if it holds
    /// another request.
    fn from_request(request: Self::Request) -> Result<Self, Self::Request>;

    /// The answer out of a response; the response back if it is not this
    /// call's answer (an error, or a peer that answered something else).
    fn answer(response: Self::Response) -> Result<Self::Answer, Self::Response>;

    /// The response that carries `answer`.
    fn respond(answer: Self::Answer) -> Self::Response;
}

/// Defines [`Call`] for request types of one protocol, whose request and
/// response enums are in scope by name. Two forms, one per line:
///
/// - `Variant(Type) => Response(Answer);` where the response variant
///   holds the answer as it is;
/// - `Variant(Type) -> Answer { pattern => answer, |a| response };`
///   where the answer is taken from (and put back into) the fields of a
///   response variant.
#[macro_export]
#[doc(hidden)]
macro_rules! calls {
    ($request_enum:ident, $response_enum:ident;) => {};
    (
        $request_enum:ident, $response_enum:ident;
        $variant:ident($request:ty) => $answer_variant:ident($answer:ty);
        $($rest:tt)*
    ) => {
        $crate::calls!(
            $request_enum, $response_enum;
            $variant($request) -> $answer {
                $response_enum::$answer_variant(answer) => answer,
                |answer| $response_enum::$answer_variant(answer)
            };
            $($rest)*
        );
    };
    (
        $request_enum:ident, $response_enum:ident;
        $variant:ident($request:ty) -> $answer:ty {
            $pattern:pat => $from:expr, |$a:ident| $to:expr
        };
        $($rest:tt)*
    ) => {
        impl From<$request> for $request_enum {
            fn from(request: $request) -> $request_enum {
                $request_enum::$variant(request)
            }
        }

        impl $crate::call::Call for $request {
            type Request = $request_enum;
            type Response = $response_enum;
            type Answer = $answer;

            fn into_request(self) -> $request_enum {
                $request_enum::$variant(self)
            }

            fn from_request(request: $request_enum) -> Result<Self, $request_enum> {
                match request {
                    $request_enum::$variant(call) => Ok(call),
                    other => Err(other),
                }
            }

            fn answer(response: $response_enum) -> Result<$answer, $response_enum> {
                match response {
                    $pattern => Ok($from),
                    other => Err(other),
                }
            }

            fn respond($a: $answer) -> $response_enum {
                $to
            }
        }

        $crate::calls!($request_enum, $response_enum; $($rest)*);
    };
}

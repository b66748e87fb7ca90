//! Errors as HTTP responses, in OpenAI's shape:
//! `{"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": "..."}}`
//! with the status that says who is at fault (4xx the request, 5xx the server); 429 carries
//! `Retry-After`. A prompt over the context adds llama.cpp's `n_prompt_tokens` and `n_ctx`.
//!
//! `type` is llama.cpp's error type for the status ([`ApiError::kind`]), which OpenAI's
//! clients ignore and llama.cpp's rely on: `invalid_request_error` (400 and the other 4xx),
//! `authentication_error` (401), `permission_error` (403), `not_found_error` (404),
//! `exceed_context_size_error` (400 for a prompt over the context), `not_supported_error` (501),
//! `unavailable_error` (503), `server_error` (the other 5xx). `code` stays our own string.

use super::metrics::Outcome;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A request refused or failed, with the reason a client can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<&'static str>,
    /// A machine-readable code (`context_length_exceeded`, `queue_full`, ...).
    pub code: &'static str,
    /// For a prompt over the context: its tokens and the context (llama.cpp's `n_prompt_tokens`
    /// and `n_ctx`, added to the error object).
    pub context: Option<(usize, usize)>,
}

impl ApiError {
    /// 400: the request is malformed or asks for something impossible.
    pub fn invalid(param: Option<&'static str>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param,
            code: "invalid_request",
            context: None,
        }
    }

    /// 400 naming a token limit (prompt too long, `max_tokens` too large).
    pub fn limit(param: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param),
            code,
            context: None,
        }
    }

    /// 429: the queue is full; try again after a second.
    pub fn queue_full(max_queue: usize) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!("the server's queue is full ({max_queue} requests waiting: --max-queue); retry later"),
            param: None,
            code: "queue_full",
            context: None,
        }
    }

    /// 503: the model is still loading, or the server is shutting down.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            param: None,
            code: "unavailable",
            context: None,
        }
    }

    /// 504: the request's deadline passed before it finished.
    pub fn timeout(seconds: f64) -> Self {
        ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            message: format!(
                "the request did not finish within its deadline of {seconds} s (--timeout)"
            ),
            param: None,
            code: "timeout",
            context: None,
        }
    }

    /// 500: the engine stopped answering.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            param: None,
            code: "internal_error",
            context: None,
        }
    }

    /// 404: no such route or model kind.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            param: None,
            code: "not_found",
            context: None,
        }
    }

    /// Any status, with its code, the field at fault and the message.
    pub fn new(
        status: StatusCode,
        code: &'static str,
        param: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            param,
            code,
            context: None,
        }
    }

    /// 401: the API key is missing or wrong (`--api-key`).
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            None,
            "a valid API key is required: send it as `Authorization: Bearer KEY` (--api-key)",
        )
    }

    /// 404: the request names a model this server does not serve (`served`: the names it
    /// answers to).
    pub fn model_not_found(asked: &str, served: &[String]) -> Self {
        let names: Vec<String> = served.iter().map(|n| format!("`{n}`")).collect();
        Self::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            Some("model"),
            format!("the model `{asked}` does not exist: this server serves {} (GET /v1/models; --served-model-name)", names.join(", ")),
        )
    }

    /// 413: the body is over the size limit.
    pub fn too_large(limit_bytes: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            None,
            format!("the request body is over the limit of {limit_bytes} bytes (--max-body-mib)"),
        )
    }

    /// 400 for a prompt over the context, with llama.cpp's `n_prompt_tokens` and `n_ctx`.
    pub fn with_context(mut self, prompt_tokens: usize, n_ctx: usize) -> Self {
        self.context = Some((prompt_tokens, n_ctx));
        self
    }

    /// How this ends the request in `/metrics`.
    pub fn outcome(&self) -> Outcome {
        match self.status {
            StatusCode::TOO_MANY_REQUESTS => Outcome::Rejected,
            StatusCode::GATEWAY_TIMEOUT => Outcome::Timeout,
            s if s.is_client_error() => Outcome::Invalid,
            _ => Outcome::Error,
        }
    }

    /// llama.cpp's error type of this error (see the module docs).
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::NOT_IMPLEMENTED => "not_supported_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            StatusCode::BAD_REQUEST if self.context.is_some() => "exceed_context_size_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        let kind = self.kind();
        let mut body = json!({"error": {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.code,
        }});
        if let Some((prompt_tokens, n_ctx)) = self.context {
            body["error"]["n_prompt_tokens"] = prompt_tokens.into();
            body["error"]["n_ctx"] = n_ctx.into();
        }
        body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

//! The gate every request passes before its route: who may ask, from where, in what format.
//!
//! In order:
//! 1. **Host** (DNS rebinding): the `Host` header must name this server: `localhost` (or a
//!    `*.localhost` name), an IP address (a rebinding attack needs a domain name; a client on
//!    the network uses the address), or a name given to `--allowed-host` (`*`: any). Else 403.
//! 2. **CORS**: with `--cors-origin`, a preflight (`OPTIONS` with `Origin` and
//!    `Access-Control-Request-Method`) is answered 200 with an empty body (as llama-server;
//!    the allowed methods and headers only for an allowed origin), and every answer to an
//!    allowed origin carries `Access-Control-Allow-Origin`. An origin is allowed when it is
//!    listed, when `*` is, or, for llama-server's pattern `localhost`, when its host is
//!    `localhost`, `127.0.0.1` or `::1` (any scheme and port; reflected). With
//!    `--cors-credentials` the answer names the origin itself, never `*`, and a preflight
//!    says `Access-Control-Allow-Credentials: true` (llama-server's default; ours is off).
//! 3. **API key**: with `--api-key` (or `TRANSFORMER_API_KEY`), every route but `/`, `/health`,
//!    `/v1/health` and `/languages` needs `Authorization: Bearer KEY` (or `X-Api-Key: KEY`),
//!    compared in constant time ([`same_secret`]); else 401 in OpenAI's shape. The
//!    LibreTranslate routes (`/translate`, `/detect`) also take the key as the body's
//!    `api_key` field: the gate lets them through marked [`KeyFromBody`], and they check it.
//! 4. **Content type**: a `POST` must say `Content-Type: application/json` (a cross-origin
//!    `fetch` in `no-cors` mode can only send `text/plain`, form or multipart bodies, so it
//!    cannot reach a generation); the LibreTranslate routes also take
//!    `application/x-www-form-urlencoded`. Else 415 naming the types accepted.
//!
//! Afterwards the answer's plain-text refusals from the framework (413 over the body limit,
//! 405 wrong method) are rewritten in the JSON error shape. Refusals on the LibreTranslate
//! routes use LibreTranslate's shape `{"error": "..."}`.

use super::api_error::ApiError;
use super::App;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::sync::Arc;

/// Routes open without the API key.
const OPEN_ROUTES: [&str; 4] = ["/", "/health", "/v1/health", "/languages"];

/// The LibreTranslate routes: form bodies, the key in the body, LibreTranslate's error shape.
pub const LIBRE_ROUTES: [&str; 3] = ["/translate", "/detect", "/languages"];

/// Marks a LibreTranslate request that brought no valid key in its headers: its handler
/// checks the body's `api_key` ([`App::check_body_key`]).
#[derive(Clone, Copy, Debug)]
pub struct KeyFromBody;

/// Whether `given` equals `secret`, in time that depends on their lengths only.
pub fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    let n = given.len().max(secret.len());
    let mut diff = given.len() ^ secret.len();
    for i in 0..n {
        let a = given.get(i).copied().unwrap_or(0);
        let b = secret.get(i).copied().unwrap_or(0);
        diff |= usize::from(a ^ b);
    }
    std::hint::black_box(diff) == 0
}

/// The host name of a `Host` header value (port and IPv6 brackets removed), lowercased.
fn host_name(value: &str) -> String {
    let value = value.trim();
    let name = if let Some(rest) = value.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else {
        match value.rsplit_once(':') {
            Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
            _ => value,
        }
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether the `Host` header value names this server (see the module docs).
pub fn host_allowed(value: &str, allowed: &[String]) -> bool {
    let name = host_name(value);
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<std::net::IpAddr>().is_ok()
        || allowed
            .iter()
            .any(|a| a == "*" || a.eq_ignore_ascii_case(&name))
}

/// The key of an `Authorization: Bearer KEY` or `X-Api-Key: KEY` header.
fn header_key(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        let v = v.as_bytes();
        let scheme = b"bearer ";
        if v.len() > scheme.len() && v[..scheme.len()].eq_ignore_ascii_case(scheme) {
            return Some(v[scheme.len()..].trim_ascii());
        }
    }
    headers.get("x-api-key").map(|v| v.as_bytes().trim_ascii())
}

/// The media type of the `Content-Type` header (parameters removed), lowercased.
fn media_type(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(v.split(';').next()?.trim().to_ascii_lowercase())
}

/// Whether a media type is JSON (`application/json` or a `+json` type).
fn is_json(media: &str) -> bool {
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

/// Whether an `Origin` names this machine: its host is `localhost`, `127.0.0.1` or `::1`
/// (llama-server's `--cors-origins localhost`).
pub fn origin_is_localhost(origin: &str) -> bool {
    let rest = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    matches!(host_name(authority).as_str(), "localhost" | "127.0.0.1" | "::1")
}

/// The allowed origin matching `origin`, as `Access-Control-Allow-Origin` should say it
/// (see the module docs).
fn allowed_origin(origins: &[String], credentials: bool, origin: &HeaderValue) -> Option<HeaderValue> {
    if origins.iter().any(|o| o == "*") {
        return Some(match credentials {
            true => origin.clone(),
            false => HeaderValue::from_static("*"),
        });
    }
    let o = origin.to_str().ok()?;
    origins
        .iter()
        .any(|a| {
            a.trim_end_matches('/').eq_ignore_ascii_case(o)
                || (a == "localhost" && origin_is_localhost(o))
        })
        .then(|| origin.clone())
}

/// A refusal in the shape of the route: LibreTranslate's or OpenAI's.
fn refuse(libre: bool, e: ApiError) -> Response {
    if libre {
        (e.status, Json(json!({"error": e.message}))).into_response()
    } else {
        e.into_response()
    }
}

/// The gate (see the module docs), as an axum middleware.
pub async fn gate(State(app): State<Arc<App>>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let libre = LIBRE_ROUTES.contains(&path.as_str());
    let headers = request.headers();
    if let Some(host) = headers.get(header::HOST) {
        let text = String::from_utf8_lossy(host.as_bytes());
        if !host_allowed(&text, &app.config.allowed_hosts) {
            let e = ApiError::new(
                StatusCode::FORBIDDEN,
                "host_not_allowed",
                None,
                format!("the Host header {text:?} does not name this server (a DNS rebinding guard): use localhost or an IP address, or start the server with --allowed-host {}", host_name(&text)),
            );
            return refuse(libre, e);
        }
    }
    let cors = headers
        .get(header::ORIGIN)
        .and_then(|o| allowed_origin(&app.config.cors_origins, app.config.cors_credentials, o));
    if request.method() == Method::OPTIONS
        && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        && !app.config.cors_origins.is_empty()
    {
        let mut response = StatusCode::OK.into_response();
        if let Some(origin) = cors {
            let h = response.headers_mut();
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            if app.config.cors_credentials {
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                    HeaderValue::from_static("true"),
                );
            }
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, OPTIONS"),
            );
            let asked = headers
                .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
                .cloned()
                .unwrap_or(HeaderValue::from_static("authorization, content-type"));
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
            h.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            );
            h.insert(header::VARY, HeaderValue::from_static("Origin"));
        }
        return response;
    }
    if let Some(secret) = &app.config.api_key {
        let open = OPEN_ROUTES.contains(&path.as_str());
        let keyed = header_key(headers).is_some_and(|k| same_secret(k, secret.as_bytes()));
        if !open && !keyed {
            if libre {
                request.extensions_mut().insert(KeyFromBody);
            } else {
                return refuse(libre, ApiError::unauthorized());
            }
        }
    }
    let headers = request.headers();
    if request.method() == Method::POST {
        let media = media_type(headers);
        let form = media.as_deref() == Some("application/x-www-form-urlencoded");
        let ok = media.as_deref().is_some_and(is_json) || (libre && form);
        if !ok {
            let want = if libre {
                "application/json or application/x-www-form-urlencoded"
            } else {
                "application/json"
            };
            let e = ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                None,
                format!(
                    "POST {path} needs a Content-Type of {want}, not {}",
                    media.as_deref().unwrap_or("none")
                ),
            );
            return refuse(libre, e);
        }
    }
    let method = request.method().clone();
    let mut response = next.run(request).await;
    let plain = !response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if plain {
        let rewritten = match response.status() {
            StatusCode::PAYLOAD_TOO_LARGE => Some(ApiError::too_large(app.config.max_body_bytes)),
            StatusCode::METHOD_NOT_ALLOWED => Some(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                None,
                format!("{method} is not allowed on {path}"),
            )),
            _ => None,
        };
        if let Some(e) = rewritten {
            let allow = response.headers().get(header::ALLOW).cloned();
            response = refuse(libre, e);
            if let Some(allow) = allow {
                response.headers_mut().insert(header::ALLOW, allow);
            }
        }
    }
    if let Some(origin) = cors {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cre", b"s3cret"));
        assert!(!same_secret(b"s3crett", b"s3cret"));
        assert!(!same_secret(b"s3creT", b"s3cret"));
        assert!(!same_secret(b"", b"s3cret"));
        assert!(same_secret(b"", b""));
    }

    #[test]
    fn origins_follow_the_list_the_localhost_pattern_and_credentials() {
        let origin = |o: &str| HeaderValue::from_str(o).unwrap();
        let localhost = vec!["localhost".to_string()];
        for ok in [
            "http://localhost",
            "http://localhost:8080",
            "https://127.0.0.1:3000",
            "http://[::1]",
            "http://[::1]:3000",
            "localhost",
        ] {
            assert_eq!(
                allowed_origin(&localhost, false, &origin(ok)),
                Some(origin(ok)),
                "{ok}"
            );
        }
        for bad in [
            "http://web.mydomain.fr",
            "http://evil.com",
            "http://notlocalhost",
            "http://localhost.evil.com",
            "http://127.0.0.2",
        ] {
            assert_eq!(allowed_origin(&localhost, false, &origin(bad)), None, "{bad}");
        }
        let any = vec!["*".to_string()];
        let o = origin("http://web.mydomain.fr");
        assert_eq!(allowed_origin(&any, false, &o), Some(origin("*")));
        assert_eq!(allowed_origin(&any, true, &o), Some(o.clone()));
        let listed = vec!["http://web.mydomain.fr/".to_string()];
        assert_eq!(allowed_origin(&listed, false, &o), Some(o));
        assert_eq!(allowed_origin(&listed, false, &origin("http://localhost")), None);
    }

    #[test]
    fn hosts_name_this_server() {
        let none: Vec<String> = Vec::new();
        for ok in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.:1",
            "app.localhost:3000",
            "127.0.0.1:8080",
            "10.1.2.3",
            "[::1]:8080",
            "[fe80::1]",
        ] {
            assert!(host_allowed(ok, &none), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "localhost.evil.com",
            "127.0.0.1.nip.io",
            "",
        ] {
            assert!(!host_allowed(bad, &none), "{bad}");
        }
        let allowed = vec!["my.box".to_string()];
        assert!(host_allowed("My.Box:8080", &allowed));
        assert!(!host_allowed("other.box", &allowed));
        assert!(host_allowed("other.box", &["*".to_string()]));
    }
}

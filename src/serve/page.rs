//! The web page at `GET /`: one static HTML file with its script, embedded in the binary
//! (`assets/serve/index.html`). It asks `/v1/models` and `/info` what is served; for a
//! language model it chats through `/v1/chat/completions` with `stream: true`, showing the
//! reply as its events arrive; for a translation model it translates through `/attention` and
//! draws one heat map per layer and head of the attention kind chosen (encoder, decoder,
//! cross), each a canvas in a `.map` element whose `data-label` names it ("cross layer 1
//! head 2"); for an encoder it embeds the sentences typed (one per line) through
//! `/v1/embeddings` and shows the cosine of every pair in a table.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The page, as built into the binary.
pub const INDEX_HTML: &str = include_str!("../../assets/serve/index.html");

/// `GET /`.
pub async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX_HTML,
    )
        .into_response()
}

//! The translation endpoints, LibreTranslate-compatible:
//! - `POST /translate` `{"q": "text" | ["a", "b"], "source": "en" | "auto", "target": "de",
//!   "alternatives": 2}` → `{"translatedText": "..." | [...], "alternatives": [...] | [[...]]}`
//!   (`alternatives` only when asked: the beam's next-best hypotheses; `detectedLanguage` when
//!   the source was `auto`). Errors are LibreTranslate's `{"error": "..."}` with a 4xx/5xx.
//!   Without `alternatives` (or with 0) each sentence gets its greedy translation, decoded by
//!   continuous batching ([`super::translate_engine`]: sentences join the running decode at
//!   the next step); with `alternatives: n` the n + 1 best of a beam search of width
//!   `max(4, n + 1)`, run between steps ([`super::jobs`]).
//! - `GET /languages` (or `POST`, as libretranslatepy asks) → `[{"code", "name", "targets"}]`:
//!   the one pair the model translates (`--source-lang`, `--target-lang`), or every pair of a
//!   multilingual model's codes (NLLB, M2M100, mBART-50; MADLAD-400's `<2xx>` targets, whose
//!   request's `target` chooses the piece written before each source).
//! - `POST /detect` `{"q": "text"}` → `[{"language", "confidence"}]`: the source language the
//!   model reads (`--source-lang`), at confidence 100 — the model knows no other, and there is
//!   no detector behind it.
//! - `POST /attention` `{"q": "sentence"}` → the greedy translation and every attention map
//!   (encoder, decoder, cross; per layer and head) for the page's heat maps, refused when the
//!   maps would hold more than [`super::jobs::MAX_ATTENTION_WEIGHTS`] weights.
//!
//! `/translate` and `/detect` take a JSON object or, as LibreTranslate does, a form
//! (`application/x-www-form-urlencoded`; a repeated `q` is a list), and the API key (`--api-key`)
//! as the field `api_key` when no header brings it. A model whose pair is unnamed (the defaults
//! `src` and `tgt`) accepts the codes a client sends.

use super::api_error::ApiError;
use super::gate::KeyFromBody;
use super::jobs::Job;
use super::metrics::Outcome;
use super::{App, OutcomeGuard};
use super::translate_routes::Routes;
use crate::pipeline::translate::{Languages, Translator};
use crate::text::detect::LanguageDetector;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// Sentences per request at most.
pub const MAX_SENTENCES: usize = 128;
/// Alternatives per sentence at most.
pub const MAX_ALTERNATIVES: usize = 8;

/// LibreTranslate's error shape.
fn libre_error(e: ApiError) -> Response {
    (e.status, Json(json!({"error": e.message}))).into_response()
}

/// A language's English name, for the few codes this project's data uses.
fn language_name(code: &str) -> String {
    match code {
        "en" => "English",
        "de" => "German",
        "es" => "Spanish",
        "fr" => "French",
        other => other,
    }
    .to_string()
}

/// A multilingual translation model's languages (M2M100, NLLB, mBART-50; MADLAD-400): each
/// code with its token, and the defaults (`--source-lang`, `--target-lang`, else the model's
/// `tokenizer_config.json`).
#[derive(Debug)]
pub struct LanguageTable {
    /// Code (as the model names it: `eng_Latn`, `en`) -> our id of its token.
    codes: Vec<(String, u32)>,
    /// Whether the target's token starts the source and nothing is forced (MADLAD-400's
    /// `<2xx>` pieces), rather than the source's token first and the target's forced.
    target_in_source: bool,
    /// The tokens of the languages a request that names none gets.
    default_source: Option<u32>,
    default_target: Option<u32>,
    /// Tells a text's language among the codes (`source: "auto"`, `/detect`).
    detector: LanguageDetector,
}

impl LanguageTable {
    /// The table of `translator` when it is multilingual, its defaults `source` and `target`
    /// unless they are the unnamed `src` / `tgt` (an unknown code is an error naming it).
    pub fn of(
        translator: &Translator,
        source: &str,
        target: &str,
    ) -> crate::error::Result<Option<LanguageTable>> {
        let named = |code: &str, unnamed: &str| (code != unnamed).then(|| code.to_string());
        let (source, target) = (named(source, "src"), named(target, "tgt"));
        let madlad = (translator.vocab.t5()).filter(|t| t.language_codes().next().is_some());
        let (codes, target_in_source, default_source, default_target) = match madlad {
            Some(t5) => {
                // The codes are checked as the library checks them.
                let defaults = translator.languages_of(source.as_deref(), target.as_deref())?;
                let codes: Vec<(String, u32)> = (t5.language_codes())
                    .map(|c| (c.to_string(), t5.language(c).expect("a listed code")))
                    .collect();
                let source = source.and_then(|c| t5.language(&c));
                (codes, true, source, defaults.source)
            }
            None => {
                let Some(tokenizer) = translator.vocab.fairseq() else {
                    return Ok(None);
                };
                let defaults = translator.languages_of(source.as_deref(), target.as_deref())?;
                let codes: Vec<(String, u32)> = (tokenizer.language_codes())
                    .map(|c| (c.to_string(), tokenizer.language(c).expect("a listed code")))
                    .collect();
                (codes, false, defaults.source, defaults.target)
            }
        };
        let detector = LanguageDetector::new(codes.iter().map(|(c, _)| c.as_str()));
        Ok(Some(LanguageTable {
            codes,
            target_in_source,
            default_source,
            default_target,
            detector,
        }))
    }

    /// What the model is asked for to translate the language of token `source` into that of
    /// `target`: the source's token first and the target's forced, or (MADLAD-400) the
    /// target's piece first.
    pub(super) fn languages(&self, source: u32, target: u32) -> Languages {
        match self.target_in_source {
            true => Languages {
                source: Some(target),
                target: None,
            },
            false => Languages {
                source: Some(source),
                target: Some(target),
            },
        }
    }

    /// Our id of the token of `code`, if the model knows it.
    pub(super) fn token(&self, code: &str) -> Option<u32> {
        self.codes.iter().find(|(c, _)| c == code).map(|&(_, t)| t)
    }

    /// The codes, in token order.
    pub(super) fn codes(&self) -> impl Iterator<Item = &str> {
        self.codes.iter().map(|(c, _)| c.as_str())
    }

    /// The code of our token id `token`.
    pub(super) fn code(&self, token: u32) -> Option<&str> {
        (self.codes.iter().find(|&&(_, t)| t == token)).map(|(c, _)| c.as_str())
    }

    /// The code of the language `text` is in and the confidence: the detector's when it is
    /// sure (see `text::detect`), else the default source, else its guess.
    fn detect(&self, text: &str) -> Option<(&str, f64)> {
        let detected = self.detector.detect(text);
        let default = (self.default_source).and_then(|t| self.code(t));
        match (detected, default) {
            (Some(d), _) if d.reliable => Some((d.code, d.confidence)),
            (_, Some(code)) => Some((code, 1.0)),
            (d, None) => d.map(|d| (d.code, d.confidence)),
        }
    }

    /// The languages of a request's `source` (`auto`: the language its `lines` are in, else
    /// the default source) and `target` (absent: the default target), and the source's code;
    /// or a 400 naming the field.
    fn request(
        &self,
        source: &str,
        target: Option<&str>,
        lines: &[String],
    ) -> Result<(Languages, String), ApiError> {
        let known = |field: &'static str, code: &str| {
            self.token(code).ok_or_else(|| {
                ApiError::invalid(
                    Some(field),
                    format!(
                        "{field} {code:?} is not one of the model's {} languages (GET /languages)",
                        self.codes.len()
                    ),
                )
            })
        };
        let source = match source {
            "auto" => {
                let detected = self.detect(&lines.join("\n"));
                detected.and_then(|(c, _)| self.token(c)).ok_or_else(|| {
                    ApiError::invalid(
                        Some("source"),
                        "source \"auto\": the text's language cannot be told among the \
                         model's; name the source language (GET /languages)",
                    )
                })?
            }
            code => known("source", code)?,
        };
        let target = match target {
            Some(code) => known("target", code)?,
            None => self.default_target.ok_or_else(|| {
                ApiError::invalid(Some("target"), "target (a language code) is missing")
            })?,
        };
        let code = self.code(source).unwrap_or_default().to_string();
        Ok((self.languages(source, target), code))
    }
}

/// The served translation model's language table, when it is multilingual.
fn language_table(app: &App) -> Option<Arc<LanguageTable>> {
    match app.served() {
        Ok(super::Served::Jobs { languages, .. }) => languages.clone(),
        _ => None,
    }
}

/// The routes of several served translation models.
fn routes(app: &App) -> Option<Arc<Routes>> {
    match app.served() {
        Ok(super::Served::Jobs { routes, .. }) => routes.clone(),
        _ => None,
    }
}

/// `GET /languages`.
pub async fn languages(State(app): State<Arc<App>>) -> Response {
    if let Some(routes) = routes(&app) {
        let list: Vec<Value> = (routes.pairs().into_iter())
            .map(|(code, targets)| {
                json!({"code": code, "name": language_name(&code), "targets": targets})
            })
            .collect();
        return Json(Value::Array(list)).into_response();
    }
    if let Some(table) = language_table(&app) {
        let all: Vec<&str> = table.codes.iter().map(|(c, _)| c.as_str()).collect();
        let list: Vec<Value> = (all.iter())
            .map(|&code| {
                let targets: Vec<&str> = all.iter().copied().filter(|&t| t != code).collect();
                json!({"code": code, "name": language_name(code), "targets": targets})
            })
            .collect();
        return Json(Value::Array(list)).into_response();
    }
    let (src, tgt) = (&app.config.source_lang, &app.config.target_lang);
    Json(json!([
        {"code": src, "name": language_name(src), "targets": [tgt]},
        {"code": tgt, "name": language_name(tgt), "targets": []},
    ]))
    .into_response()
}

/// The sentences of `q`, and whether it was a list.
fn sentences(body: &Value) -> Result<(Vec<String>, bool), ApiError> {
    match body.get("q") {
        Some(Value::String(s)) => Ok((vec![s.clone()], false)),
        Some(Value::Array(items)) => {
            let list = items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    ApiError::invalid(Some("q"), "q must be a string or a list of strings")
                })?;
            if list.len() > MAX_SENTENCES {
                return Err(ApiError::limit(
                    "q",
                    "too_many_sentences",
                    format!(
                        "q has {} sentences; at most {MAX_SENTENCES} per request",
                        list.len()
                    ),
                ));
            }
            Ok((list, true))
        }
        _ => Err(ApiError::invalid(
            Some("q"),
            "q (a string or a list of strings) is missing",
        )),
    }
}

/// A LibreTranslate request's fields: its JSON object, or its form's `key=value` pairs (values
/// as strings, `alternatives` as a number; a repeated key gathers a list).
fn libre_fields(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .starts_with("application/x-www-form-urlencoded")
        });
    if !form {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::invalid(None, format!("the body is not valid JSON: {e}")))?;
        if !value.is_object() {
            return Err(ApiError::invalid(None, "the body must be a JSON object"));
        }
        return Ok(value);
    }
    let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(body)
        .map_err(|e| ApiError::invalid(None, format!("the form body cannot be read: {e}")))?;
    let mut fields = serde_json::Map::new();
    for (key, text) in pairs {
        let value = match key.as_str() {
            "alternatives" => text.parse::<u64>().map_or(Value::String(text), Value::from),
            _ => Value::String(text),
        };
        match fields.get_mut(&key) {
            Some(Value::Array(list)) => list.push(value),
            Some(first) => *first = Value::Array(vec![first.take(), value]),
            None => {
                fields.insert(key, value);
            }
        }
    }
    Ok(Value::Object(fields))
}

/// The fields of a LibreTranslate request, its key checked when no header brought it.
fn checked_fields(
    app: &App,
    key_from_body: Option<Extension<KeyFromBody>>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Value, ApiError> {
    let fields = libre_fields(headers, body)?;
    if key_from_body.is_some() {
        app.check_body_key(&fields)?;
    }
    Ok(fields)
}

/// Whether the model's pair is unnamed (`src` → `tgt`, the defaults): then any codes go.
fn pair_unnamed(app: &App) -> bool {
    app.config.source_lang == "src" && app.config.target_lang == "tgt"
}

/// `POST /detect`.
pub async fn detect(
    State(app): State<Arc<App>>,
    key_from_body: Option<Extension<KeyFromBody>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = (|| {
        let fields = checked_fields(&app, key_from_body, &headers, &body)?;
        let text = sentences(&fields)?.0.join("\n");
        if let Some(routes) = routes(&app) {
            let (code, confidence) = routes.detect(&text).ok_or_else(|| {
                ApiError::invalid(
                    Some("q"),
                    "the text's language cannot be told among the served source languages",
                )
            })?;
            return Ok(json!([{"confidence": confidence_percent(confidence), "language": code}]));
        }
        match app.served()? {
            super::Served::Jobs {
                kind: "translation",
                ..
            } => match language_table(&app) {
                Some(table) => {
                    let (code, confidence) = table.detect(&text).ok_or_else(|| {
                        ApiError::invalid(
                            Some("q"),
                            "the text's language cannot be told among the model's (and it \
                             has no default source language)",
                        )
                    })?;
                    Ok(json!([{"confidence": confidence_percent(confidence), "language": code}]))
                }
                None => Ok(json!([{"confidence": 100.0, "language": app.config.source_lang}])),
            },
            other => Err(ApiError::not_found(format!(
                "this server serves a {} model, not a translation model",
                other.kind()
            ))),
        }
    })();
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => libre_error(e),
    }
}

/// A detector's confidence (0 to 1) as LibreTranslate reports it (0 to 100, one decimal).
fn confidence_percent(confidence: f64) -> f64 {
    (confidence * 1000.0).round() / 10.0
}

/// `POST /translate`.
pub async fn translate(
    State(app): State<Arc<App>>,
    key_from_body: Option<Extension<KeyFromBody>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut guard = OutcomeGuard::new(app.metrics.clone());
    let fields = checked_fields(&app, key_from_body, &headers, &body);
    let result = match fields {
        Ok(fields) => translate_inner(&app, fields).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(v) => {
            guard.set(Outcome::Ok);
            Json(v).into_response()
        }
        Err(e) => {
            guard.set(e.outcome());
            libre_error(e)
        }
    }
}

async fn translate_inner(app: &App, body: Value) -> Result<Value, ApiError> {
    let (lines, listed) = sentences(&body)?;
    let alternatives = alternatives(&body)?;
    if let Some(routes) = routes(app) {
        return translate_routed(app, &routes, &body, lines, listed, alternatives).await;
    }
    let (src, tgt) = (&app.config.source_lang, &app.config.target_lang);
    let source = body.get("source").and_then(Value::as_str).unwrap_or("auto");
    let table = language_table(app);
    let (languages, detected) = match &table {
        Some(table) => {
            let target = body.get("target").and_then(Value::as_str);
            table.request(source, target, &lines)?
        }
        None => (Languages::default(), src.clone()),
    };
    let target = body.get("target").and_then(Value::as_str).unwrap_or(tgt);
    if table.is_none()
        && !pair_unnamed(app)
        && ((source != "auto" && source != src) || target != tgt)
    {
        return Err(ApiError::invalid(
            Some("source"),
            format!(
                "this server translates {src} to {tgt}, not {source} to {target} (GET /languages)"
            ),
        ));
    }
    let n = lines.len();
    let arrived = Instant::now();
    let deadline = arrived + std::time::Duration::from_secs_f64(app.config.timeout_s);
    let lists = app
        .job(|reply| Job::Translate {
            lines,
            languages,
            nbest: alternatives + 1,
            arrived,
            deadline,
            reply,
        })
        .await?;
    debug_assert_eq!(lists.len(), n);
    let detected = (source == "auto").then_some((detected, 1.0));
    Ok(libre_answer(&lists, listed, alternatives, detected))
}

/// A request's `alternatives` (0 when absent), or a 400 past [`MAX_ALTERNATIVES`].
fn alternatives(body: &Value) -> Result<usize, ApiError> {
    Ok(match body.get("alternatives") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .filter(|&n| n as usize <= MAX_ALTERNATIVES)
            .ok_or_else(|| {
                ApiError::limit(
                    "alternatives",
                    "too_many_alternatives",
                    format!("alternatives must be a whole number from 0 to {MAX_ALTERNATIVES}"),
                )
            })? as usize,
    })
}

/// `/translate` with several models: the route of the request's pair (`source: "auto"`: the
/// language the text is in), one model or two through English, each taking the previous
/// one's best translations; the alternatives are the last model's.
async fn translate_routed(
    app: &App,
    routes: &Routes,
    body: &Value,
    lines: Vec<String>,
    listed: bool,
    alternatives: usize,
) -> Result<Value, ApiError> {
    let source = body.get("source").and_then(Value::as_str).unwrap_or("auto");
    let target = (body.get("target").and_then(Value::as_str))
        .ok_or_else(|| ApiError::invalid(Some("target"), "target (a language code) is missing"))?;
    let detected = match source {
        "auto" => Some(routes.detect(&lines.join("\n")).ok_or_else(|| {
            ApiError::invalid(
                Some("source"),
                "source \"auto\": the text's language cannot be told among the served source \
                 languages; name it (GET /languages)",
            )
        })?),
        _ => None,
    };
    let steps = routes.route(detected.map_or(source, |d| d.0), target)?;
    let arrived = Instant::now();
    let deadline = arrived + std::time::Duration::from_secs_f64(app.config.timeout_s);
    let mut texts = lines;
    let mut lists = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let nbest = if i + 1 == steps.len() { alternatives + 1 } else { 1 };
        lists = app
            .job_on(&step.model.jobs, |reply| Job::Translate {
                lines: std::mem::take(&mut texts),
                languages: step.languages,
                nbest,
                arrived,
                deadline,
                reply,
            })
            .await
            .map_err(|e| ApiError {
                message: format!("{}: {}", step.model.name, e.message),
                ..e
            })?;
        texts = lists.iter().map(|l| l.first().map(|h| h.1.clone()).unwrap_or_default()).collect();
    }
    let detected = detected.map(|(code, confidence)| (code.to_string(), confidence));
    Ok(libre_answer(&lists, listed, alternatives, detected))
}

/// LibreTranslate's answer: `translatedText` (and `alternatives`) of each sentence's n-best
/// list, a string or a list as `q` was, and `detectedLanguage` when the source was detected.
fn libre_answer(
    lists: &[Vec<(f64, String)>],
    listed: bool,
    alternatives: usize,
    detected: Option<(String, f64)>,
) -> Value {
    let n = lists.len();
    let best = |l: &Vec<(f64, String)>| l.first().map(|h| h.1.clone()).unwrap_or_default();
    let alts =
        |l: &Vec<(f64, String)>| -> Vec<String> { l.iter().skip(1).map(|h| h.1.clone()).collect() };
    let mut out = if listed {
        json!({"translatedText": lists.iter().map(best).collect::<Vec<_>>()})
    } else {
        json!({"translatedText": lists.first().map(best).unwrap_or_default()})
    };
    if alternatives > 0 {
        out["alternatives"] = if listed {
            json!(lists.iter().map(alts).collect::<Vec<_>>())
        } else {
            json!(lists.first().map(alts).unwrap_or_default())
        };
    }
    if let Some((language, confidence)) = detected {
        let detected = json!({"confidence": confidence_percent(confidence), "language": language});
        out["detectedLanguage"] = if listed {
            json!(vec![detected; n])
        } else {
            detected
        };
    }
    out
}

/// `POST /attention`.
pub async fn attention(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let mut guard = OutcomeGuard::new(app.metrics.clone());
    let result = async {
        let body: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid(None, format!("the body is not valid JSON: {e}")))?;
        let source = body
            .get("q")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(Some("q"), "q (one sentence) is missing"))?
            .to_string();
        let (maps, translation) = app
            .job(|reply| Job::Attention { source, arrived: Instant::now(), reply })
            .await?;
        let panels = |ps: &[crate::viz::AttentionPanel]| -> Vec<Value> {
            ps.iter().map(|p| json!({"label": p.label, "rows": p.rows, "cols": p.cols, "weights": p.weights})).collect()
        };
        Ok::<Value, ApiError>(json!({
            "translatedText": translation,
            "heads": maps.heads,
            "source_tokens": maps.src_tokens,
            "target_tokens": maps.tgt_tokens,
            "encoder": panels(&maps.encoder),
            "decoder": panels(&maps.decoder),
            "cross": panels(&maps.cross),
        }))
    }
    .await;
    guard.respond(result)
}

//! SentencePiece tokenizers (unigram and BPE models), read from their `.model` / `.spm` files
//! and computed as the `sentencepiece` Python package (0.2.3) computes them: a port of its C++
//! (the 0.2.3 sources), checked against the package's own outputs (tests.rs, bpe_tests.rs, load_tests.rs).
//!
//! SentencePiece (Kudo and Richardson, 2018) cuts raw text into pieces without a word splitter:
//! spaces are part of the pieces, written `▁`. A model file is a protobuf `ModelProto`
//! (read by `proto.rs`): the vocabulary (each piece's text, score and type), the algorithm
//! (`trainer_spec.model_type`) and the normalization rules. Encoding a text:
//! 1. normalize it (`normalizer.rs`): user-defined symbols are kept whole, the rest is rewritten
//!    by the longest matching rule of the precompiled character map (NFKC for the default
//!    `nmt_nfkc`), extra spaces are removed, spaces become `▁` and a `▁` is put before the text;
//! 2. segment it, by the model's algorithm:
//!    - unigram (`unigram.rs`, Marian's models): the Viterbi search for the pieces whose
//!      log-probabilities sum highest, in float as the C++ sums them (a user-defined symbol
//!      scores 0.1 per byte after the first, so it always wins; a character no piece covers is
//!      unknown, scored 10 below the lowest piece);
//!    - BPE (`bpe.rs`, the `sentencepiece.bpe.model` of NLLB-200, M2M100, mBART): characters
//!      (and user-defined symbols, never merged) are merged pairwise, the adjacent pair whose
//!      concatenation is the best-scoring piece first, the leftmost among equal scores; a
//!      character left alone that is not a piece is unknown, an `UNUSED` piece is split back;
//! 3. consecutive unknown pieces become one unknown piece, or, in a model with byte fallback,
//!    one `<0xXX>` byte piece per UTF-8 byte of each.
//!
//! Decoding joins the pieces, `▁` back to spaces (the text's first one dropped), byte pieces
//! back to UTF-8 (U+FFFD for a malformed byte), control pieces (`<s>`, `</s>`) invisible and
//! `<unk>` as " ⁇ ", then applies the model's denormalization rules if it has any; it is the
//! same for both algorithms.
//!
//! The models are checked as the package checks them, with the differences of the C++: a
//! unigram model refuses a NaN or infinite score and needs a piece to segment with; a BPE model
//! keeps every piece in one map, so a control, unknown or byte piece may not spell a normal one.
//! Word and char models are refused by name, and so is a byte-fallback model without an unknown
//! piece (which the package accepts). Not ported: sampling (BPE-dropout) and n-best encodings,
//! and the encode/decode options (`add_bos`, `reverse`, `emit_unk_piece`, extra options).

// Used by the translation models' loaders and outside the library (feature `internals`).
#![cfg_attr(not(feature = "internals"), allow(dead_code))]

mod bpe;
#[cfg(test)]
mod bpe_tests;
#[cfg(test)]
mod load_tests;
mod normalizer;
mod proto;
#[cfg(test)]
mod tests;
mod unigram;

use bpe::Bpe;
use crate::error::{Error, Result};
use normalizer::{valid_utf8_prefix, Normalizer, SPACE_SYMBOL};
use proto::{ModelProto, PieceType};
use std::collections::HashMap;
use std::path::Path;
use unigram::{PieceTrie, Unigram};

/// What `<unk>` decodes to when the model does not say (`kDefaultUnknownSymbol`).
const DEFAULT_UNK_SURFACE: &str = " \u{2047} ";

/// Pieces this long or longer are refused (`kMaxPieceSize`).
const MAX_PIECE_BYTES: usize = 8000;

/// A SentencePiece unigram or BPE tokenizer: encodes text to pieces and ids, decodes them back.
#[derive(Debug)]
pub struct SentencePiece {
    /// Each id's piece text and type.
    pieces: Vec<(String, PieceType)>,
    /// `NORMAL`, `USER_DEFINED` and `UNUSED` pieces by text (every piece, in a BPE model).
    piece_ids: HashMap<String, u32>,
    /// The other pieces (unknown, control, byte) by text, looked up first (none in a BPE
    /// model, whose pieces all differ).
    reserved_ids: HashMap<String, u32>,
    /// The id of the unknown piece.
    unk_id: u32,
    /// The ids of `<0x00>`..`<0xFF>` when the model has byte fallback.
    byte_ids: Option<Vec<u32>>,
    /// What `<unk>` decodes to.
    unk_surface: String,
    /// The normalizer spec's `add_dummy_prefix`, which decoding reads.
    add_dummy_prefix: bool,
    /// The normalizer spec's `remove_extra_whitespaces`, which decoding reads.
    remove_extra_whitespaces: bool,
    /// The text's normalization before segmentation.
    normalizer: Normalizer,
    /// The rules applied to decoded text, when the model has some.
    denormalizer: Option<Normalizer>,
    /// The segmentation.
    model: Segmenter,
}

/// The segmentation algorithm (`trainer_spec.model_type`).
#[derive(Debug)]
enum Segmenter {
    /// 1: the Viterbi search over piece log-probabilities (`unigram.rs`).
    Unigram(Unigram),
    /// 2: merges of adjacent symbols by score (`bpe.rs`).
    Bpe(Bpe),
}

/// The piece of byte `b` in a byte-fallback vocabulary.
fn byte_piece(b: u8) -> String {
    format!("<0x{b:02X}>")
}

/// The byte a byte piece stands for (`<0x41>` is 0x41; upper-case hex digits only).
fn piece_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    let upper = |c: char| c.is_ascii_digit() || ('A'..='F').contains(&c);
    if hex.len() != 2 || !hex.chars().all(upper) {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl SentencePiece {
    /// Reads a model file (`.model`, `.spm`).
    pub fn load(path: &Path) -> Result<SentencePiece> {
        let bytes = std::fs::read(path).map_err(|cause| crate::text::TextError::Io {
            path: path.to_path_buf(),
            cause,
        })?;
        SentencePiece::from_bytes(&bytes, path)
    }

    /// Reads a model from the bytes of its file; `path` names it in error messages.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<SentencePiece> {
        let fail = |reason: String| {
            Error::Input(format!(
                "{}: not a usable SentencePiece model: {reason}",
                path.display()
            ))
        };
        let proto = proto::parse_model(bytes)
            .map_err(|e| fail(format!("not a valid model protobuf ({e})")))?;
        if let kind @ (3 | 4) = proto.trainer_spec.model_type {
            let name = if kind == 3 { "word" } else { "char" };
            return Err(Error::Input(format!(
                "{}: SentencePiece {name} models are not supported (only unigram and BPE)",
                path.display()
            )));
        }
        SentencePiece::from_proto(proto).map_err(fail)
    }

    /// The tokenizer of a parsed unigram or BPE model, checked as SentencePiece checks it
    /// (`SentencePieceProcessor::Load`, `ModelInterface::InitializePieces`, `unigram::Model`
    /// or `bpe::Model`, `Normalizer::Init`).
    fn from_proto(mut proto: ModelProto) -> std::result::Result<SentencePiece, String> {
        let byte_fallback = proto.trainer_spec.byte_fallback;
        // A unigram model keeps control, unknown and byte pieces apart from the others (a
        // control piece may spell a normal one); a BPE model keeps all in one map
        // (`InitializePieces(use_reserved_id_map)`).
        let is_bpe = proto.trainer_spec.model_type == 2;
        if byte_fallback {
            // A lone NUL piece (written by some converters) is made unused.
            for p in proto.pieces.iter_mut().filter(|p| p.piece == [0]) {
                p.kind = PieceType::Unused;
            }
        }
        if let Some(i) = proto
            .pieces
            .iter()
            .position(|p| p.piece.len() >= MAX_PIECE_BYTES)
        {
            return Err(format!(
                "piece {i} is too long (at least {MAX_PIECE_BYTES} bytes)"
            ));
        }
        let mut pieces = Vec::with_capacity(proto.pieces.len());
        let mut piece_ids = HashMap::new();
        let mut reserved_ids = HashMap::new();
        let mut unk_id = None;
        let mut byte_ids = vec![None; 256];
        let mut user_symbols = PieceTrie::new();
        let mut scored = Vec::with_capacity(proto.pieces.len());
        for (i, p) in proto.pieces.iter().enumerate() {
            let id = i as u32;
            let text = String::from_utf8(p.piece.clone());
            let Ok(text) = text else {
                return Err(format!("piece {i} is not UTF-8"));
            };
            if text.is_empty() {
                return Err(format!("piece {i} is empty"));
            }
            if text == "\0" && p.kind == PieceType::Unused {
                // Left out of the vocabulary: only its id decodes to it.
                pieces.push((text, PieceType::Unused));
                scored.push(None);
                continue;
            }
            if text.contains('\0') {
                return Err(format!("piece {i} ({text:?}) holds a NUL character"));
            }
            let is_normal = matches!(
                p.kind,
                PieceType::Normal | PieceType::UserDefined | PieceType::Unused
            );
            let map = if is_normal || is_bpe {
                &mut piece_ids
            } else {
                &mut reserved_ids
            };
            if map.insert(text.clone(), id).is_some() {
                return Err(format!("piece {text:?} (id {i}) is already defined"));
            }
            match p.kind {
                PieceType::UserDefined => user_symbols.insert(text.as_bytes(), id),
                PieceType::Unknown => {
                    if let Some(first) = unk_id {
                        return Err(format!("two unknown pieces (ids {first} and {i})"));
                    }
                    unk_id = Some(id);
                }
                PieceType::Byte => {
                    if !byte_fallback {
                        return Err(format!(
                            "byte piece {text:?} (id {i}) in a model without byte_fallback"
                        ));
                    }
                    let Some(b) = piece_byte(&text) else {
                        return Err(format!("invalid byte piece {text:?} (id {i})"));
                    };
                    byte_ids[usize::from(b)] = Some(id);
                }
                _ => {}
            }
            scored.push(Some((p.piece.as_slice(), p.score, p.kind)));
            pieces.push((text, p.kind));
        }
        // (The package accepts a byte-fallback model without one; this port needs it.)
        let Some(unk_id) = unk_id else {
            return Err("no unknown piece (type UNKNOWN, <unk>)".to_string());
        };
        let byte_ids = if byte_fallback {
            let all: Option<Vec<u32>> = byte_ids.into_iter().collect();
            let Some(all) = all else {
                return Err(
                    "byte_fallback is set but the 256 byte pieces are not all there".into(),
                );
            };
            Some(all)
        } else {
            None
        };
        let model = if is_bpe {
            Segmenter::Bpe(Bpe::new(&scored, user_symbols.clone(), unk_id))
        } else {
            // (Only the unigram model refuses these; BPE compares any score.)
            let infinite = proto.pieces.iter().position(|p| !p.score.is_finite());
            if let Some(i) = infinite {
                return Err(format!(
                    "piece {i} has a score of {}",
                    proto.pieces[i].score
                ));
            }
            let unigram = Unigram::new(&scored, unk_id)
                .ok_or("no piece to segment text with (only unknown, control or byte pieces)")?;
            Segmenter::Unigram(unigram)
        };
        let spec = &proto.normalizer_spec;
        let suffix = proto.trainer_spec.treat_whitespace_as_suffix;
        let normalizer = Normalizer::new(spec, suffix, Some(user_symbols))
            .map_err(|e| format!("normalizer_spec ({}): {e}", spec.name))?;
        let denormalizer = match &proto.denormalizer_spec {
            Some(d) if !d.precompiled_charsmap.is_empty() => Some(
                Normalizer::new(d, false, None).map_err(|e| format!("denormalizer_spec: {e}"))?,
            ),
            _ => None,
        };
        let unk_surface = match &proto.trainer_spec.unk_surface {
            Some(s) => String::from_utf8_lossy(s).into_owned(),
            None => DEFAULT_UNK_SURFACE.to_string(),
        };
        Ok(SentencePiece {
            pieces,
            piece_ids,
            reserved_ids,
            unk_id,
            byte_ids,
            unk_surface,
            add_dummy_prefix: spec.add_dummy_prefix,
            remove_extra_whitespaces: spec.remove_extra_whitespaces,
            normalizer,
            denormalizer,
            model,
        })
    }

    /// As the package's `encode(text, out_type=str)` / `encode(text)`: (piece, id) pairs.
    /// A run of unknown characters is one piece (its text, the unknown id), or with byte
    /// fallback one `<0xXX>` piece per byte.
    pub fn encode(&self, text: &str) -> Vec<(String, u32)> {
        let normalized = self.normalizer.normalize(text);
        let mut out: Vec<(String, u32)> = Vec::new();
        let mut prev_unknown = false;
        let segments = match &self.model {
            Segmenter::Unigram(model) => model.encode(normalized.as_bytes()),
            Segmenter::Bpe(model) => model.encode(normalized.as_bytes()),
        };
        for (start, end, id) in segments {
            let piece = normalized.get(start..end).unwrap_or_default();
            let unknown = self.pieces[id as usize].1 == PieceType::Unknown;
            match (&self.byte_ids, out.last_mut()) {
                (Some(byte_ids), _) if unknown => {
                    out.extend(
                        piece
                            .bytes()
                            .map(|b| (byte_piece(b), byte_ids[usize::from(b)])),
                    );
                }
                (_, Some(last)) if unknown && prev_unknown => last.0.push_str(piece),
                _ => out.push((piece.to_string(), id)),
            }
            prev_unknown = unknown;
        }
        out
    }

    /// The text of pieces, as the package's `decode_pieces`: a piece not in the vocabulary
    /// is copied as it is.
    pub fn decode_pieces(&self, pieces: &[&str]) -> String {
        self.decode(
            pieces
                .iter()
                .map(|&p| (p, self.piece_to_id(p).unwrap_or(self.unk_id))),
        )
    }

    /// The text of ids, as the package's `decode(ids)`; an id out of the vocabulary is an error.
    pub fn decode_ids(&self, ids: &[u32]) -> Result<String> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.len()) {
            return Err(Error::Input(format!(
                "cannot decode id {id}: the SentencePiece vocabulary has {} pieces",
                self.len()
            )));
        }
        Ok(self.decode(
            ids.iter()
                .map(|&id| (self.pieces[id as usize].0.as_str(), id)),
        ))
    }

    /// The text of (piece, id) pairs (`SentencePieceProcessor::DecodeOptimized`): byte pieces
    /// gathered into UTF-8, control pieces dropped, `▁` as spaces but the first one of the
    /// text, `<unk>` as the unknown surface, then the denormalization rules.
    fn decode<'a>(&self, items: impl Iterator<Item = (&'a str, u32)>) -> String {
        let mut text = String::new();
        let mut bytes: Vec<u8> = Vec::new();
        let mut is_bos_ws = true;
        let strips_bos_ws = self.add_dummy_prefix || self.remove_extra_whitespaces;
        for (piece, id) in items {
            let kind = self.pieces[id as usize].1;
            if kind == PieceType::Byte {
                bytes.extend(piece_byte(piece));
                continue;
            }
            push_bytes(&mut text, &mut bytes);
            if !text.is_empty() {
                is_bos_ws = false;
            }
            if kind == PieceType::Control {
                continue;
            }
            let mut rest = piece;
            let mut has_bos_ws = false;
            if is_bos_ws && strips_bos_ws {
                if let Some(stripped) = piece.strip_prefix(SPACE_SYMBOL) {
                    rest = stripped;
                    has_bos_ws = true;
                }
                // Removing extra whitespace removes every leading `▁`.
                if self.remove_extra_whitespaces {
                    has_bos_ws = false;
                }
            }
            if kind == PieceType::Unknown {
                // `<unk>` itself, or a piece not in the vocabulary copied unchanged.
                let unk = self.pieces[id as usize].0 == piece;
                text.push_str(if unk { &self.unk_surface } else { piece });
            } else {
                text.push_str(&rest.replace(SPACE_SYMBOL, " "));
            }
            if has_bos_ws || !text.is_empty() {
                is_bos_ws = false;
            }
        }
        push_bytes(&mut text, &mut bytes);
        match &self.denormalizer {
            Some(denormalizer) => denormalizer.normalize(&text),
            None => text,
        }
    }

    /// The id of a piece; `None` when it is not one (the package would give the unknown id).
    pub fn piece_to_id(&self, piece: &str) -> Option<u32> {
        self.reserved_ids
            .get(piece)
            .or_else(|| self.piece_ids.get(piece))
            .copied()
    }

    /// The piece of an id; `None` out of the vocabulary.
    pub fn id_to_piece(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(|(text, _)| text.as_str())
    }

    /// The number of pieces (ids run from 0 to `len() - 1`).
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether the vocabulary is empty (never: a model has at least its unknown piece).
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The id of the unknown piece `<unk>` (the package's `unk_id()` looks the trainer spec's
    /// `unk_piece` up instead, and gives -1 if that is not the unknown piece: the same id in
    /// every model a trainer wrote).
    pub fn unk_id(&self) -> u32 {
        self.unk_id
    }
}

/// Appends pending byte pieces as UTF-8, each malformed byte as U+FFFD (`ProcessByteQueue`).
fn push_bytes(text: &mut String, bytes: &mut Vec<u8>) {
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        let (valid, len) = valid_utf8_prefix(rest);
        match std::str::from_utf8(&rest[..len]) {
            Ok(c) if valid => text.push_str(c),
            _ => text.push('\u{FFFD}'),
        }
        rest = &rest[len..];
    }
    bytes.clear();
}

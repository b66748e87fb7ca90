//! The unigram model's segmentation: the Viterbi search of SentencePiece's
//! `unigram::Model::EncodeOptimized` (`unigram_model.cc`), with its exact float arithmetic,
//! over a byte trie of the pieces.

use super::normalizer::one_char_len;
use super::proto::PieceType;

/// A byte trie: the pieces (or user-defined symbols) with their ids, searched for the keys that
/// prefix a text.
#[derive(Clone, Debug)]
pub(super) struct PieceTrie {
    /// Node 0 is the root.
    nodes: Vec<TrieNode>,
}

/// One trie node: the edges out of it, sorted by byte, and the id of the key ending here.
#[derive(Clone, Debug, Default)]
struct TrieNode {
    children: Vec<(u8, u32)>,
    value: Option<u32>,
}

impl PieceTrie {
    /// An empty trie.
    pub(super) fn new() -> PieceTrie {
        PieceTrie {
            nodes: vec![TrieNode::default()],
        }
    }

    /// Whether no key was inserted.
    pub(super) fn is_empty(&self) -> bool {
        self.nodes.len() == 1 && self.nodes[0].value.is_none()
    }

    /// Adds `key` with `value` (a later insert of the same key replaces the value).
    pub(super) fn insert(&mut self, key: &[u8], value: u32) {
        let mut node = 0usize;
        for &byte in key {
            let children = &self.nodes[node].children;
            node = match children.binary_search_by_key(&byte, |&(b, _)| b) {
                Ok(i) => children[i].1 as usize,
                Err(i) => {
                    let next = self.nodes.len();
                    self.nodes[node].children.insert(i, (byte, next as u32));
                    self.nodes.push(TrieNode::default());
                    next
                }
            };
        }
        self.nodes[node].value = Some(value);
    }

    /// The keys that prefix `text`, as (length in bytes, value), shortest first.
    pub(super) fn prefixes<'a>(
        &'a self,
        text: &'a [u8],
    ) -> impl Iterator<Item = (usize, u32)> + 'a {
        let mut node = 0usize;
        let mut bytes = text.iter().enumerate();
        std::iter::from_fn(move || {
            for (i, &byte) in bytes.by_ref() {
                let children = &self.nodes[node].children;
                let Ok(k) = children.binary_search_by_key(&byte, |&(b, _)| b) else {
                    return None;
                };
                node = children[k].1 as usize;
                if let Some(value) = self.nodes[node].value {
                    return Some((i + 1, value));
                }
            }
            None
        })
        .fuse()
    }

    /// The length of the longest key that prefixes `text` among the 64 shortest ones, as
    /// `PrefixMatcher::PrefixMatch` finds it (its search keeps 64 matches, `kResultSize`).
    pub(super) fn longest_prefix(&self, text: &[u8]) -> Option<usize> {
        const MAX_MATCHES: usize = 64;
        self.prefixes(text).take(MAX_MATCHES).last().map(|(len, _)| len)
    }
}

/// The unigram model: each piece's score and type, the trie of the pieces that segment a text.
#[derive(Debug)]
pub(super) struct Unigram {
    /// The `NORMAL`, `USER_DEFINED` and `UNUSED` pieces (`ModelInterface::pieces_`).
    trie: PieceTrie,
    /// Score of each id.
    scores: Vec<f32>,
    /// Type of each id.
    kinds: Vec<PieceType>,
    /// The lowest score of a `NORMAL` piece (`FLT_MAX` without one).
    min_score: f32,
    /// The id of the unknown piece.
    unk_id: u32,
}

/// The unknown piece scores this much below the lowest piece (`kUnkPenalty`).
const UNK_PENALTY: f32 = 10.0;

/// Path scores beyond this magnitude are shifted back to 0 (`kScoreResetThreshold`), so that
/// long texts keep float precision.
const SCORE_RESET_THRESHOLD: f32 = 100_000.0;

/// The score of a user-defined piece of `length` bytes, `GetUserDefinedScore`: 0.1 per byte
/// after the first (computed in double, returned as a float), so that it beats the
/// log-probabilities (at most 0) of normal pieces and a longer symbol beats shorter ones.
fn user_defined_score(length: usize) -> f32 {
    (0.1 * f64::from(length as i32 - 1)) as f32
}

/// The best segmentation found so far of the text up to a position.
#[derive(Clone, Copy)]
struct BestPath {
    /// The last piece's id.
    id: u32,
    /// The score of the whole path (a `float`, as in SentencePiece).
    score: f32,
    /// Where the last piece starts (`None`: no path ends here yet).
    start: Option<usize>,
}

impl Unigram {
    /// The model of `pieces` (text, score, type of each id; `None` for a piece left out of the
    /// vocabulary); the caller has checked them (none empty, one unknown, scores finite).
    /// `None` when no piece can segment a text.
    pub(super) fn new(pieces: &[Option<(&[u8], f32, PieceType)>], unk_id: u32) -> Option<Unigram> {
        let mut trie = PieceTrie::new();
        let mut min_score = f32::MAX;
        for (id, piece) in pieces.iter().enumerate() {
            let Some((text, score, kind)) = *piece else {
                continue;
            };
            if kind == PieceType::Normal {
                min_score = min_score.min(score);
            }
            if matches!(
                kind,
                PieceType::Normal | PieceType::UserDefined | PieceType::Unused
            ) {
                trie.insert(text, id as u32);
            }
        }
        if trie.is_empty() {
            return None;
        }
        Some(Unigram {
            trie,
            scores: pieces.iter().map(|p| p.map_or(0.0, |p| p.1)).collect(),
            kinds: pieces
                .iter()
                .map(|p| p.map_or(PieceType::Unused, |p| p.2))
                .collect(),
            min_score,
            unk_id,
        })
    }

    /// The best segmentation of a normalized text (`Model::EncodeOptimized`): (start, end, id)
    /// of each piece, in order; an unknown character is one piece with the unknown id.
    pub(super) fn encode(&self, normalized: &[u8]) -> Vec<(usize, usize, u32)> {
        let size = normalized.len();
        if size == 0 {
            return Vec::new();
        }
        let unk_score = self.min_score - UNK_PENALTY;
        let unset = BestPath {
            id: self.unk_id,
            score: 0.0,
            start: None,
        };
        let mut best = vec![unset; size + 1];
        let mut max_frontier = 0usize;
        let mut starts_at = 0usize;
        while starts_at < size {
            let mut till_here = best[starts_at].score;
            // (`abs` keeps C++'s `x < -T || x > T`, false for NaN.)
            if till_here.abs() > SCORE_RESET_THRESHOLD {
                let offset = till_here;
                let frontier = best.iter_mut().enumerate().take(max_frontier + 1);
                for (i, node) in frontier.skip(starts_at) {
                    if i == starts_at || node.start.is_some() {
                        node.score -= offset;
                    }
                }
                till_here = 0.0;
            }
            let mblen = one_char_len(normalized[starts_at]).min(size - starts_at);
            let mut has_single_node = false;
            for (length, id) in self.trie.prefixes(&normalized[starts_at..]) {
                let kind = self.kinds[id as usize];
                if kind == PieceType::Unused {
                    continue;
                }
                let end = starts_at + length;
                max_frontier = max_frontier.max(end);
                let score = if kind == PieceType::UserDefined {
                    user_defined_score(length)
                } else {
                    self.scores[id as usize]
                };
                let candidate = score + till_here;
                let target = &mut best[end];
                if target.start.is_none() || candidate > target.score {
                    *target = BestPath {
                        id,
                        score: candidate,
                        start: Some(starts_at),
                    };
                }
                if length == mblen {
                    has_single_node = true;
                }
            }
            if !has_single_node {
                let end = starts_at + mblen;
                max_frontier = max_frontier.max(end);
                let candidate = unk_score + till_here;
                let target = &mut best[end];
                if target.start.is_none() || candidate > target.score {
                    *target = BestPath {
                        id: self.unk_id,
                        score: candidate,
                        start: Some(starts_at),
                    };
                }
            }
            starts_at += mblen;
        }
        let mut pieces = Vec::new();
        let mut end = size;
        while end > 0 {
            let node = best[end];
            let Some(start) = node.start else { break };
            pieces.push((start, end, node.id));
            end = start;
        }
        pieces.reverse();
        pieces
    }
}

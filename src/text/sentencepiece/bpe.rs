//! The BPE model's segmentation: `bpe::Model::SampleEncode` (`bpe_model.cc`) with `alpha` 0,
//! which is `bpe::Model::Encode`, merge for merge and tie for tie.
//!
//! A normalized text is first cut into symbols `s_1 … s_n`, left to right: at each position
//! the longest user-defined symbol that starts there (a frozen symbol, never merged), else one
//! UTF-8 character (`PrefixMatcher::PrefixMatch`). Every adjacent pair of unfrozen symbols
//! whose concatenation is a `NORMAL`, `USER_DEFINED` or `UNUSED` piece goes on an agenda with
//! that piece's score. Then, while the agenda is not empty, the pair
//!
//! ```text
//!     (l, r) = argmax  (score(s_l s_r), -l)
//! ```
//!
//! (the highest score, compared as the C++ compares the float's bits, i.e. `f32::total_cmp`;
//! among equal scores the leftmost pair) is taken off; if it is stale (either symbol already
//! merged away, or their lengths no longer add up to the pair's) it is dropped, else `s_l`
//! becomes `s_l s_r`, `s_r` leaves the sequence, and the pairs the new symbol makes with its
//! two neighbours go on the agenda. Each remaining symbol is then output with its id,
//! "resegmented": a symbol that is not a piece (or is a control, unknown or byte piece) is
//! unknown; an `UNUSED` piece is split back into the two symbols of the last pair of that text
//! put on the agenda (`rev_merge`: one entry per piece text for the whole text, the last one
//! written wins; every occurrence seems to split alike, the merges inside a piece not depending
//! on what surrounds it), each resegmented in turn, at most 100 levels deep
//! (`kMaxBpeResegmentDepth`: deeper, a symbol is output with its own id, even an `UNUSED` one).
//! The caller merges consecutive unknown pieces, or spells them as byte pieces, as
//! `SentencePieceProcessor::PopulateSentencePieceText` does for every model.
//!
//! Not ported: BPE-dropout (`alpha` > 0). Past the depth limit the C++ could also output a
//! control piece (a one-character control piece split out of a chain of over 100 `UNUSED`
//! merges) and then fail the whole encoding; this port outputs it.

use super::proto::PieceType;
use super::unigram::PieceTrie;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// Resegmentation stops this deep (`kMaxBpeResegmentDepth`).
const MAX_RESEGMENT_DEPTH: usize = 100;

/// The BPE model: every piece by its bytes, each id's score and type, the user-defined symbols.
#[derive(Debug)]
pub(super) struct Bpe {
    /// Every piece (a lone NUL piece of type `UNUSED` left out): a BPE model keeps control,
    /// unknown and byte pieces in the same map as the others (`InitializePieces(false)`).
    ids: HashMap<Vec<u8>, u32>,
    /// Score of each id.
    scores: Vec<f32>,
    /// Type of each id.
    kinds: Vec<PieceType>,
    /// The user-defined symbols, cut out first and never merged (`matcher_`).
    user_symbols: PieceTrie,
    /// The id of the unknown piece.
    unk_id: u32,
}

/// One symbol of the text being merged (`Symbol`): the bytes `start..start + len` (`len` 0
/// once merged into its left neighbour), its neighbours in the sequence.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
    /// A user-defined symbol: never merged.
    freeze: bool,
}

/// A candidate merge (`SymbolPair`): symbols `left` and `right`, the score of their
/// concatenation and its length when it was looked up.
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

/// `SymbolPairComparator`: the agenda's top is the highest score, then the lowest `left`. The
/// C++ compares the scores' bits as integers (negative floats reversed), which orders them as
/// `f32::total_cmp` does (-0 below +0, NaNs at the ends by sign). Two pairs still valid never
/// share `left`, so the order of equal entries, which a heap leaves open, never matters.
impl Ord for Pair {
    fn cmp(&self, other: &Pair) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Pair) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Pair) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

/// Whether pieces of this type are never merged into (`IsReservedId`).
fn is_reserved(kind: PieceType) -> bool {
    !matches!(
        kind,
        PieceType::Normal | PieceType::UserDefined | PieceType::Unused
    )
}

/// The merge state of one text: its symbols, the agenda, the unused pieces' last splits.
struct Merges<'a> {
    text: &'a [u8],
    symbols: Vec<Symbol>,
    agenda: BinaryHeap<Pair>,
    /// Each `UNUSED` piece met, by text: the length of the left symbol of the last pair that
    /// formed it (`rev_merge`).
    rev_merge: HashMap<&'a [u8], usize>,
}

impl Bpe {
    /// The model of `pieces` (text, score, type of each id; `None` for a piece left out of the
    /// vocabulary); the caller has checked them (none empty, none twice, one unknown).
    pub(super) fn new(
        pieces: &[Option<(&[u8], f32, PieceType)>],
        user_symbols: PieceTrie,
        unk_id: u32,
    ) -> Bpe {
        let ids = pieces
            .iter()
            .enumerate()
            .filter_map(|(id, p)| p.map(|(text, _, _)| (text.to_vec(), id as u32)))
            .collect();
        Bpe {
            ids,
            scores: pieces.iter().map(|p| p.map_or(0.0, |p| p.1)).collect(),
            kinds: pieces
                .iter()
                .map(|p| p.map_or(PieceType::Unused, |p| p.2))
                .collect(),
            user_symbols,
            unk_id,
        }
    }

    /// The id a merge may produce for `piece`: a `NORMAL`, `USER_DEFINED` or `UNUSED` piece
    /// (`PieceToIdNoReserved` then the checks against `unk_id_` and `IsReservedId`).
    fn mergeable(&self, piece: &[u8]) -> Option<u32> {
        // (The unknown piece is reserved: `id == unk_id_` is one of the reserved ids.)
        let id = *self.ids.get(piece)?;
        (!is_reserved(self.kinds[id as usize])).then_some(id)
    }

    /// The segmentation of a normalized text: (start, end, id) of each piece, in order; a
    /// symbol no piece covers has the unknown id.
    pub(super) fn encode(&self, normalized: &[u8]) -> Vec<(usize, usize, u32)> {
        let mut symbols = Vec::with_capacity(normalized.len());
        let mut start = 0;
        while start < normalized.len() {
            let rest = &normalized[start..];
            let (len, freeze) = match self.user_symbols.longest_prefix(rest) {
                Some(len) => (len, true),
                None => (super::normalizer::one_char_len(rest[0]).min(rest.len()), false),
            };
            let index = symbols.len();
            symbols.push(Symbol {
                start,
                len,
                prev: index.checked_sub(1),
                next: (start + len < normalized.len()).then_some(index + 1),
                freeze,
            });
            start += len;
        }
        if symbols.is_empty() {
            return Vec::new();
        }
        let mut merges = Merges {
            text: normalized,
            agenda: BinaryHeap::with_capacity(symbols.len()),
            symbols,
            rev_merge: HashMap::new(),
        };
        for left in 1..merges.symbols.len() {
            merges.add_pair(self, Some(left - 1), Some(left));
        }
        while let Some(top) = merges.agenda.pop() {
            let symbols = &mut merges.symbols;
            let (left, right) = (symbols[top.left], symbols[top.right]);
            if left.len == 0 || right.len == 0 || left.len + right.len != top.size {
                continue;
            }
            symbols[top.left].len += right.len;
            symbols[top.left].next = right.next;
            if let Some(next) = right.next {
                symbols[next].prev = Some(top.left);
            }
            symbols[top.right].len = 0;
            merges.add_pair(self, left.prev, Some(top.left));
            merges.add_pair(self, Some(top.left), right.next);
        }
        let mut out = Vec::with_capacity(merges.symbols.len());
        let mut index = Some(0);
        while let Some(i) = index {
            let symbol = merges.symbols[i];
            let (start, end) = (symbol.start, symbol.start + symbol.len);
            self.resegment(&merges, start, end, 0, &mut out);
            index = symbol.next;
        }
        out
    }

    /// Outputs `text[start..end]` as a piece, an `UNUSED` one as the two symbols it was last
    /// merged from (the `resegment` lambda).
    fn resegment(
        &self,
        merges: &Merges,
        start: usize,
        end: usize,
        depth: usize,
        out: &mut Vec<(usize, usize, u32)>,
    ) {
        let piece = &merges.text[start..end];
        let found = self.ids.get(piece).copied();
        if depth > MAX_RESEGMENT_DEPTH {
            out.push((start, end, found.unwrap_or(self.unk_id)));
            return;
        }
        let Some(id) = found.filter(|&id| !is_reserved(self.kinds[id as usize])) else {
            out.push((start, end, self.unk_id));
            return;
        };
        if self.kinds[id as usize] != PieceType::Unused {
            out.push((start, end, id));
            return;
        }
        let Some(&left_len) = merges.rev_merge.get(piece) else {
            out.push((start, end, self.unk_id));
            return;
        };
        self.resegment(merges, start, start + left_len, depth + 1, out);
        self.resegment(merges, start + left_len, end, depth + 1, out);
    }
}

impl<'a> Merges<'a> {
    /// Puts the pair of symbols `left` and `right` on the agenda if neither is frozen and their
    /// concatenation is a piece a merge may produce (`MaybeAddNewSymbolPair`, and the first
    /// pass over the bigrams); records the split of an `UNUSED` one.
    fn add_pair(&mut self, bpe: &Bpe, left: Option<usize>, right: Option<usize>) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (self.symbols[left], self.symbols[right]);
        if l.freeze || r.freeze {
            return;
        }
        let size = l.len + r.len;
        let piece = &self.text[l.start..l.start + size];
        let Some(id) = bpe.mergeable(piece) else {
            return;
        };
        self.agenda.push(Pair {
            score: bpe.scores[id as usize],
            left,
            right,
            size,
        });
        if bpe.kinds[id as usize] == PieceType::Unused {
            self.rev_merge.insert(piece, l.len);
        }
    }
}

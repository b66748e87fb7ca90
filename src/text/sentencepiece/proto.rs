//! A minimal reader of SentencePiece's `ModelProto` (`sentencepiece_model.proto`, proto2): the
//! fields the tokenizer uses, with proto2's defaults, every other field skipped.
//!
//! The wire format: a message is a sequence of fields, each a varint key `number << 3 | wire
//! type` and a value: a varint (type 0), 8 bytes (1), a varint length and that many bytes (2: a
//! string, bytes or an embedded message), a group (3 to 4, obsolete, skipped) or 4 bytes (5: a
//! float). As protobuf does, a singular field given twice keeps the last value, an embedded
//! message given twice is merged, a known field with an unexpected wire type or an enum with an
//! unknown value is kept as an unknown field (so skipped), and a truncated field fails.

/// Why a protobuf could not be read: the reason, for the loader's message.
pub(super) type ParseResult<T> = std::result::Result<T, String>;

/// The type of a piece (`ModelProto.SentencePiece.Type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PieceType {
    /// A piece of the text (`NORMAL`, 1).
    Normal,
    /// The unknown piece, `<unk>` (`UNKNOWN`, 2).
    Unknown,
    /// A control symbol such as `<s>`, `</s>`: never produced by encoding, invisible when
    /// decoding (`CONTROL`, 3).
    Control,
    /// A user-defined symbol, always cut out of the text whole (`USER_DEFINED`, 4).
    UserDefined,
    /// A piece kept in the vocabulary but never produced (`UNUSED`, 5).
    Unused,
    /// A byte `<0xXX>` of the byte fallback (`BYTE`, 6).
    Byte,
}

impl PieceType {
    /// The type of an enum value; `None` for a value the enum does not define.
    fn from_wire(value: i32) -> Option<PieceType> {
        Some(match value {
            1 => PieceType::Normal,
            2 => PieceType::Unknown,
            3 => PieceType::Control,
            4 => PieceType::UserDefined,
            5 => PieceType::Unused,
            6 => PieceType::Byte,
            _ => return None,
        })
    }
}

/// One vocabulary entry (`ModelProto.SentencePiece`).
#[derive(Clone, Debug)]
pub(super) struct PieceProto {
    /// The piece's bytes (UTF-8 in any model a trainer wrote).
    pub piece: Vec<u8>,
    /// Its log probability (unigram) or merge rank.
    pub score: f32,
    /// Its type (default `NORMAL`).
    pub kind: PieceType,
}

/// The fields of `TrainerSpec` that encoding and decoding read.
#[derive(Clone, Debug)]
pub(super) struct TrainerSpec {
    /// `model_type`: 1 unigram (the default), 2 BPE, 3 word, 4 char.
    pub model_type: i32,
    /// `treat_whitespace_as_suffix`: the `▁` goes at the end of words, not the start.
    pub treat_whitespace_as_suffix: bool,
    /// `byte_fallback`: unknown characters are spelt as `<0xXX>` byte pieces.
    pub byte_fallback: bool,
    /// `unk_surface` when the file sets it (the text `<unk>` decodes to; default " ⁇ ").
    pub unk_surface: Option<Vec<u8>>,
}

impl Default for TrainerSpec {
    fn default() -> TrainerSpec {
        TrainerSpec {
            model_type: 1,
            treat_whitespace_as_suffix: false,
            byte_fallback: false,
            unk_surface: None,
        }
    }
}

/// `NormalizerSpec`: the normalization rules and the whitespace options.
#[derive(Clone, Debug)]
pub(super) struct NormalizerSpec {
    /// `name` of the rule set (`nmt_nfkc`, `identity`, ...), for messages only.
    pub name: String,
    /// `precompiled_charsmap`: the rules as a double-array trie and replacement strings.
    pub precompiled_charsmap: Vec<u8>,
    /// `add_dummy_prefix` (default true): a `▁` before the text.
    pub add_dummy_prefix: bool,
    /// `remove_extra_whitespaces` (default true): leading, trailing and repeated spaces go.
    pub remove_extra_whitespaces: bool,
    /// `escape_whitespaces` (default true): spaces become `▁`.
    pub escape_whitespaces: bool,
}

impl Default for NormalizerSpec {
    fn default() -> NormalizerSpec {
        NormalizerSpec {
            name: String::new(),
            precompiled_charsmap: Vec::new(),
            add_dummy_prefix: true,
            remove_extra_whitespaces: true,
            escape_whitespaces: true,
        }
    }
}

/// `ModelProto`: the vocabulary and the specs.
#[derive(Clone, Debug, Default)]
pub(super) struct ModelProto {
    /// The pieces; a piece's id is its index.
    pub pieces: Vec<PieceProto>,
    /// `trainer_spec` (defaults when absent).
    pub trainer_spec: TrainerSpec,
    /// `normalizer_spec` (defaults when absent).
    pub normalizer_spec: NormalizerSpec,
    /// `denormalizer_spec`, when the file has one.
    pub denormalizer_spec: Option<NormalizerSpec>,
}

/// A field's value as read from the wire.
enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 2.
    Bytes(&'a [u8]),
    /// Wire type 5.
    Fixed32([u8; 4]),
    /// Wire types 1 and 3 (a fixed64 or a group, skipped whole).
    Other,
}

/// A cursor over one message's bytes.
struct Reader<'a> {
    /// The message.
    bytes: &'a [u8],
    /// The next byte to read.
    pos: usize,
}

/// Groups nested deeper than this are refused (protobuf's own recursion limit is 100).
const MAX_DEPTH: usize = 100;

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, pos: 0 }
    }

    fn varint(&mut self) -> ParseResult<u64> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let Some(&byte) = self.bytes.get(self.pos) else {
                return Err(format!("truncated varint at byte {}", self.pos));
            };
            self.pos += 1;
            if shift < 64 {
                value |= u64::from(byte & 0x7f) << shift;
            }
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(format!("varint longer than 10 bytes at byte {}", self.pos))
    }

    fn take(&mut self, len: usize) -> ParseResult<&'a [u8]> {
        let end = self
            .pos
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!(
                "field of {len} bytes at byte {} runs past the end ({} bytes)",
                self.pos,
                self.bytes.len()
            ));
        };
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// The next field, `None` at the end of the message.
    fn field(&mut self) -> ParseResult<Option<(u32, Value<'a>)>> {
        if self.pos == self.bytes.len() {
            return Ok(None);
        }
        let at = self.pos;
        let key = self.varint()?;
        let number = key >> 3;
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return Err(format!("invalid field number {number} at byte {at}"));
        }
        let value = self.value(key, 0)?;
        Ok(Some((number as u32, value)))
    }

    /// The value of the field whose key was just read.
    fn value(&mut self, key: u64, depth: usize) -> ParseResult<Value<'a>> {
        Ok(match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Other
            }
            2 => {
                let len = self.varint()?;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&l| l <= i32::MAX as usize);
                let Some(len) = len else {
                    return Err(format!("invalid length at byte {}", self.pos));
                };
                Value::Bytes(self.take(len)?)
            }
            3 => {
                self.skip_group(key >> 3, depth + 1)?;
                Value::Other
            }
            5 => {
                let b = self.take(4)?;
                Value::Fixed32([b[0], b[1], b[2], b[3]])
            }
            wire => return Err(format!("invalid wire type {wire} at byte {}", self.pos)),
        })
    }

    /// Skips a group's fields up to its end key (the same field number, wire type 4).
    fn skip_group(&mut self, number: u64, depth: usize) -> ParseResult<()> {
        if depth > MAX_DEPTH {
            return Err("groups nested too deep".to_string());
        }
        loop {
            if self.pos == self.bytes.len() {
                return Err("unterminated group".to_string());
            }
            let key = self.varint()?;
            if key & 7 == 4 {
                if key >> 3 == number {
                    return Ok(());
                }
                return Err(format!("mismatched end of group at byte {}", self.pos));
            }
            self.value(key, depth)?;
        }
    }
}

/// The fields of a message, through `visit(number, value)` (fixed64 fields and groups skipped);
/// an end-group key outside its group fails, as in protobuf.
fn for_each_field<'a>(
    bytes: &'a [u8],
    mut visit: impl FnMut(u32, Value<'a>) -> ParseResult<()>,
) -> ParseResult<()> {
    let mut reader = Reader::new(bytes);
    while let Some((number, value)) = reader.field()? {
        if let Value::Other = value {
            continue;
        }
        visit(number, value)?;
    }
    Ok(())
}

/// An int32 enum or int32 field: the low 32 bits of the varint, as protobuf reads them.
fn as_i32(value: u64) -> i32 {
    value as u32 as i32
}

fn merge_piece(piece: &mut PieceProto, bytes: &[u8]) -> ParseResult<()> {
    for_each_field(bytes, |number, value| {
        match (number, value) {
            (1, Value::Bytes(b)) => piece.piece = b.to_vec(),
            (2, Value::Fixed32(b)) => piece.score = f32::from_le_bytes(b),
            (3, Value::Varint(v)) => {
                if let Some(kind) = PieceType::from_wire(as_i32(v)) {
                    piece.kind = kind;
                }
            }
            _ => {}
        }
        Ok(())
    })
}

fn merge_trainer_spec(spec: &mut TrainerSpec, bytes: &[u8]) -> ParseResult<()> {
    for_each_field(bytes, |number, value| {
        match (number, value) {
            // An enum value the proto does not define stays an unknown field.
            (3, Value::Varint(v)) if (1..=4).contains(&as_i32(v)) => {
                spec.model_type = as_i32(v);
            }
            (24, Value::Varint(v)) => spec.treat_whitespace_as_suffix = v != 0,
            (35, Value::Varint(v)) => spec.byte_fallback = v != 0,
            (44, Value::Bytes(b)) => spec.unk_surface = Some(b.to_vec()),
            _ => {}
        }
        Ok(())
    })
}

fn merge_normalizer_spec(spec: &mut NormalizerSpec, bytes: &[u8]) -> ParseResult<()> {
    for_each_field(bytes, |number, value| {
        match (number, value) {
            (1, Value::Bytes(b)) => spec.name = String::from_utf8_lossy(b).into_owned(),
            (2, Value::Bytes(b)) => spec.precompiled_charsmap = b.to_vec(),
            (3, Value::Varint(v)) => spec.add_dummy_prefix = v != 0,
            (4, Value::Varint(v)) => spec.remove_extra_whitespaces = v != 0,
            (5, Value::Varint(v)) => spec.escape_whitespaces = v != 0,
            _ => {}
        }
        Ok(())
    })
}

/// Reads a serialized `ModelProto`.
pub(super) fn parse_model(bytes: &[u8]) -> ParseResult<ModelProto> {
    let mut model = ModelProto::default();
    for_each_field(bytes, |number, value| {
        let Value::Bytes(b) = value else {
            return Ok(());
        };
        match number {
            1 => {
                let mut piece = PieceProto {
                    piece: Vec::new(),
                    score: 0.0,
                    kind: PieceType::Normal,
                };
                merge_piece(&mut piece, b)
                    .map_err(|e| format!("piece {}: {e}", model.pieces.len()))?;
                model.pieces.push(piece);
            }
            2 => merge_trainer_spec(&mut model.trainer_spec, b)
                .map_err(|e| format!("trainer_spec: {e}"))?,
            3 => merge_normalizer_spec(&mut model.normalizer_spec, b)
                .map_err(|e| format!("normalizer_spec: {e}"))?,
            5 => {
                let spec = model
                    .denormalizer_spec
                    .get_or_insert_with(NormalizerSpec::default);
                merge_normalizer_spec(spec, b).map_err(|e| format!("denormalizer_spec: {e}"))?;
            }
            // 4, the former self_test_data, is reserved: skipped like any unknown field.
            _ => {}
        }
        Ok(())
    })?;
    Ok(model)
}

//! The subset of Python's pickle format that `torch.save` writes (protocols 2 to 5), run as
//! pickle's own stack machine but without executing anything: a call (`REDUCE`, `NEWOBJ`) is
//! kept as a [`Value::Call`] of the named global and its arguments, for the reader of the result
//! to recognise (`torch._utils._rebuild_tensor_v2`, `collections.OrderedDict`, ...), and a
//! persistent id (`BINPERSID`: torch's storages) as a [`Value::Persistent`].
//!
//! The memo holds copies: a value fetched again (`BINGET`) is the value as it was memoized.
//! `torch.save` memoizes a dict before filling it but never fetches it again, so state dicts
//! read whole; an opcode outside the subset is an error naming it and its offset.

/// A pickled value, calls unevaluated.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An integer that fits 64 bits.
    Int(i64),
    /// A float.
    Float(f64),
    /// A text string.
    Str(String),
    /// A byte string.
    Bytes(Vec<u8>),
    /// A tuple.
    Tuple(Vec<Value>),
    /// A list.
    List(Vec<Value>),
    /// A dict, in insertion order (also `OrderedDict()`, once filled).
    Dict(Vec<(Value, Value)>),
    /// A global `module.name` (a class or a function).
    Global(String, String),
    /// `callable(*args)`, not evaluated.
    Call(Box<Value>, Vec<Value>),
    /// A persistent id (torch: a storage's description).
    Persistent(Box<Value>),
}

/// The stack's entries: values and marks.
enum Entry {
    Value(Value),
    Mark,
}

/// Reads one pickle from `data`; an error says what is wrong and where.
pub fn parse(data: &[u8]) -> Result<Value, String> {
    let mut machine = Machine {
        data,
        at: 0,
        stack: Vec::new(),
        memo: std::collections::HashMap::new(),
    };
    machine.run()
}

struct Machine<'a> {
    data: &'a [u8],
    at: usize,
    stack: Vec<Entry>,
    memo: std::collections::HashMap<u32, Value>,
}

impl Machine<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = (self.at.checked_add(n))
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| format!("truncated at byte {} (wanted {n} more bytes)", self.at))?;
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// A line ending with `\n` (GLOBAL's module and name).
    fn line(&mut self) -> Result<String, String> {
        let rest = &self.data[self.at..];
        let n = (rest.iter().position(|&b| b == b'\n'))
            .ok_or_else(|| format!("an unterminated line at byte {}", self.at))?;
        let text = std::str::from_utf8(&rest[..n])
            .map_err(|_| format!("a line that is not UTF-8 at byte {}", self.at))?
            .to_string();
        self.at += n + 1;
        Ok(text)
    }

    fn text(&mut self, n: usize) -> Result<Value, String> {
        let at = self.at;
        let bytes = self.take(n)?;
        let text = std::str::from_utf8(bytes)
            .map_err(|_| format!("a string that is not UTF-8 at byte {at}"))?;
        Ok(Value::Str(text.to_string()))
    }

    fn len(&mut self, width: usize) -> Result<usize, String> {
        let n = match width {
            1 => u64::from(self.u8()?),
            4 => u64::from(self.u32()?),
            _ => self.u64()?,
        };
        usize::try_from(n).map_err(|_| format!("a length of {n} at byte {}", self.at))
    }

    fn push(&mut self, v: Value) {
        self.stack.push(Entry::Value(v));
    }

    fn pop(&mut self) -> Result<Value, String> {
        match self.stack.pop() {
            Some(Entry::Value(v)) => Ok(v),
            Some(Entry::Mark) => Err(format!("a mark where a value belongs at byte {}", self.at)),
            None => Err(format!("an empty stack at byte {}", self.at)),
        }
    }

    fn top(&mut self) -> Result<&mut Value, String> {
        match self.stack.last_mut() {
            Some(Entry::Value(v)) => Ok(v),
            _ => Err(format!("no value on the stack at byte {}", self.at)),
        }
    }

    /// The values above the topmost mark, the mark removed.
    fn pop_mark(&mut self) -> Result<Vec<Value>, String> {
        let mark = (self.stack.iter().rposition(|e| matches!(e, Entry::Mark)))
            .ok_or_else(|| format!("no mark on the stack at byte {}", self.at))?;
        let values = self.stack.split_off(mark + 1);
        self.stack.pop();
        Ok(values
            .into_iter()
            .map(|e| match e {
                Entry::Value(v) => v,
                Entry::Mark => unreachable!("the topmost mark"),
            })
            .collect())
    }

    fn memoize(&mut self, key: u32) -> Result<(), String> {
        let v = self.top()?.clone();
        self.memo.insert(key, v);
        Ok(())
    }

    fn fetch(&mut self, key: u32) -> Result<(), String> {
        let v = (self.memo.get(&key).cloned())
            .ok_or_else(|| format!("memo entry {key} is not set (byte {})", self.at))?;
        self.push(v);
        Ok(())
    }

    /// Adds `pairs` to the dict on top of the stack.
    fn set_items(&mut self, items: Vec<Value>) -> Result<(), String> {
        if !items.len().is_multiple_of(2) {
            return Err(format!("an odd number of dict items at byte {}", self.at));
        }
        let at = self.at;
        let Value::Dict(dict) = self.top()? else {
            return Err(format!("items set on something not a dict at byte {at}"));
        };
        let mut items = items.into_iter();
        while let (Some(k), Some(v)) = (items.next(), items.next()) {
            dict.push((k, v));
        }
        Ok(())
    }

    fn run(&mut self) -> Result<Value, String> {
        loop {
            let at = self.at;
            let op = self.u8()?;
            match op {
                0x80 => {
                    let protocol = self.u8()?;
                    if protocol > 5 {
                        return Err(format!("pickle protocol {protocol} (at most 5)"));
                    }
                }
                0x95 => drop(self.u64()?), // FRAME: a hint
                b'.' => return self.pop(),
                b'(' => self.stack.push(Entry::Mark),
                b'}' => self.push(Value::Dict(Vec::new())),
                b']' => self.push(Value::List(Vec::new())),
                b')' => self.push(Value::Tuple(Vec::new())),
                b'N' => self.push(Value::None),
                0x88 => self.push(Value::Bool(true)),
                0x89 => self.push(Value::Bool(false)),
                b'J' => {
                    let v = self.u32()? as i32;
                    self.push(Value::Int(i64::from(v)))
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(i64::from(v)))
                }
                b'M' => {
                    let v = self.u16()?;
                    self.push(Value::Int(i64::from(v)))
                }
                0x8a => {
                    // LONG1: a little-endian two's complement integer of n bytes.
                    let n = usize::from(self.u8()?);
                    let bytes = self.take(n)?.to_vec();
                    if n > 8 {
                        return Err(format!("an integer of {n} bytes at byte {at}"));
                    }
                    let mut v: i64 = 0;
                    for (i, &b) in bytes.iter().enumerate() {
                        v |= i64::from(b) << (8 * i);
                    }
                    if n > 0 && n < 8 && bytes[n - 1] & 0x80 != 0 {
                        v -= 1i64 << (8 * n);
                    }
                    self.push(Value::Int(v))
                }
                b'G' => {
                    let bits = u64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes"));
                    self.push(Value::Float(f64::from_bits(bits)))
                }
                b'X' | 0x8c | 0x8d => {
                    let width = match op {
                        b'X' => 4,
                        0x8c => 1,
                        _ => 8,
                    };
                    let n = self.len(width)?;
                    let v = self.text(n)?;
                    self.push(v)
                }
                b'U' | b'T' | b'C' | b'B' | 0x8e => {
                    let width = match op {
                        b'U' | b'C' => 1,
                        b'T' | b'B' => 4,
                        _ => 8,
                    };
                    let n = self.len(width)?;
                    let bytes = self.take(n)?.to_vec();
                    self.push(Value::Bytes(bytes))
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.push(Value::Global(module, name))
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (module, name) {
                        (Value::Str(m), Value::Str(n)) => self.push(Value::Global(m, n)),
                        _ => return Err(format!("STACK_GLOBAL without two strings at byte {at}")),
                    }
                }
                b'q' => {
                    let key = u32::from(self.u8()?);
                    self.memoize(key)?
                }
                b'r' => {
                    let key = self.u32()?;
                    self.memoize(key)?
                }
                0x94 => {
                    let key = self.memo.len() as u32;
                    self.memoize(key)?
                }
                b'h' => {
                    let key = u32::from(self.u8()?);
                    self.fetch(key)?
                }
                b'j' => {
                    let key = self.u32()?;
                    self.fetch(key)?
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Tuple(items))
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.push(Value::Tuple(items))
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Value::List(items))
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Dict(Vec::new()));
                    self.set_items(items)?
                }
                b'a' => {
                    let v = self.pop()?;
                    match self.top()? {
                        Value::List(list) => list.push(v),
                        _ => return Err(format!("APPEND to something not a list at byte {at}")),
                    }
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    match self.top()? {
                        Value::List(list) => list.extend(items),
                        _ => return Err(format!("APPENDS to something not a list at byte {at}")),
                    }
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![k, v])?
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.set_items(items)?
                }
                b'R' | 0x81 => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let Value::Tuple(args) = args else {
                        return Err(format!("a call whose arguments are not a tuple at byte {at}"));
                    };
                    // An empty OrderedDict is a dict to fill.
                    let ordered_dict = matches!(&callable, Value::Global(m, n)
                        if m == "collections" && n == "OrderedDict");
                    if ordered_dict && args.is_empty() {
                        self.push(Value::Dict(Vec::new()))
                    } else {
                        self.push(Value::Call(Box::new(callable), args))
                    }
                }
                b'b' => {
                    // BUILD: the state (a dict's `_metadata`, ...) changes nothing we read.
                    self.pop()?;
                    self.top()?;
                }
                b'Q' => {
                    let id = self.pop()?;
                    self.push(Value::Persistent(Box::new(id)))
                }
                b'0' => drop(self.pop()?),
                b'1' => drop(self.pop_mark()?),
                b'2' => {
                    let v = self.top()?.clone();
                    self.push(v)
                }
                other => {
                    return Err(format!(
                        "pickle opcode 0x{other:02x} at byte {at} is not one torch.save writes"
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_pickle_reads_back() {
        // pickle.dumps({"a": (1, -2, 3.5), "b": [True, None], "c": "é"}, protocol=2)
        let data = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00\x87q\x02X\x01\x00\x00\x00bq\x03]q\x04(\x88NeX\x01\x00\x00\x00cq\x05X\x02\x00\x00\x00\xc3\xa9q\x06u.";
        let v = parse(data).unwrap_or_else(|e| panic!("{e}"));
        let Value::Dict(items) = v else { panic!("{v:?}") };
        assert_eq!(items.len(), 3);
        assert_eq!(
            items[0],
            (
                Value::Str("a".into()),
                Value::Tuple(vec![Value::Int(1), Value::Int(-2), Value::Float(3.5)])
            )
        );
        assert_eq!(items[2].1, Value::Str("é".into()));
        let Value::List(list) = &items[1].1 else { panic!() };
        assert_eq!(list, &[Value::Bool(true), Value::None]);
    }

    #[test]
    fn bad_pickles_are_errors_never_panics() {
        for bad in [
            &b""[..],
            b"\x80\x02",
            b"\x80\x09.",
            b"\x80\x02X\xff\xff\xff\xff",
            b"\x80\x02h\x05.",
            b"\x80\x02t.",
            b"\x80\x02K\x01u.",
            b"\x80\x02\xff",
            b"\x80\x02cmodule",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        // Every prefix of a good pickle, and every byte changed, is handled.
        // pickle.dumps({"a": (1,)}, protocol=2)
        let good = b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01K\x01\x85q\x02s.";
        assert_eq!(
            parse(good),
            Ok(Value::Dict(vec![(
                Value::Str("a".into()),
                Value::Tuple(vec![Value::Int(1)])
            )]))
        );
        for n in 0..good.len() {
            let _ = parse(&good[..n]);
            for b in [0u8, 0x28, 0x2e, 0x71, 0xff] {
                let mut changed = good.to_vec();
                changed[n] = b;
                let _ = parse(&changed);
            }
        }
    }
}

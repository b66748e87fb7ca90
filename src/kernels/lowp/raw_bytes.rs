//! The bytes of a stored tensor, shared without copying: owned by this value, or a range of a
//! buffer other values share (a whole file read into memory, or a memory map of it). The
//! block products of the ggml formats read their weights from one of these, as the file stores
//! them.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

/// A buffer that bytes can be borrowed from for as long as it lives (`Vec<u8>`, a memory map).
pub type SharedBuffer = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// `len` bytes at `start` of a shared buffer; dereferences to `&[u8]`. Cloning shares them.
#[derive(Clone)]
pub struct RawBytes {
    owner: SharedBuffer,
    start: usize,
    len: usize,
}

impl RawBytes {
    /// Bytes owned by this value alone.
    pub fn owned(bytes: Vec<u8>) -> RawBytes {
        let len = bytes.len();
        RawBytes {
            owner: Arc::new(bytes),
            start: 0,
            len,
        }
    }

    /// The bytes `range` of `owner`, or `None` when the range is not inside it.
    pub fn shared(owner: SharedBuffer, range: Range<usize>) -> Option<RawBytes> {
        let total = (*owner).as_ref().len();
        if range.start > range.end || range.end > total {
            return None;
        }
        Some(RawBytes {
            owner,
            start: range.start,
            len: range.end - range.start,
        })
    }

    /// The bytes `range` of these bytes (relative to their start), sharing the same buffer, or
    /// `None` when the range is not inside them.
    pub fn slice(&self, range: Range<usize>) -> Option<RawBytes> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        Some(RawBytes {
            owner: Arc::clone(&self.owner),
            start: self.start + range.start,
            len: range.end - range.start,
        })
    }
}

impl Deref for RawBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // In bounds: `shared` and `slice` checked the range against the buffer, which
        // never changes length (it is behind an `Arc` and only borrowed immutably).
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }
}

impl AsRef<[u8]> for RawBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for RawBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RawBytes({} bytes at {})", self.len, self.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_shared_and_sliced_bytes_read_their_range() {
        let owned = RawBytes::owned(vec![1, 2, 3, 4, 5]);
        assert_eq!(&*owned, &[1, 2, 3, 4, 5]);
        let buffer: SharedBuffer = Arc::new(vec![10u8, 11, 12, 13, 14, 15]);
        let mid = RawBytes::shared(Arc::clone(&buffer), 1..5).unwrap();
        assert_eq!(&*mid, &[11, 12, 13, 14]);
        assert_eq!(&*mid.slice(2..4).unwrap(), &[13, 14]);
        assert!(mid.slice(3..5).is_none());
        assert!(RawBytes::shared(Arc::clone(&buffer), 4..7).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 3..2;
        assert!(RawBytes::shared(buffer, reversed).is_none());
    }
}

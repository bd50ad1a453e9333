//! ClickHouse's `RowBinary` format, the few types the cluster tables use.
//!
//! Rows are their columns back to back, nothing between rows: integers and
//! floats little-endian at their width, a `String` as its length in unsigned
//! LEB128 then its bytes. Floats go as their bits, so what is read back is
//! what was written (text formats gave 1 ulp off on ClickHouse 18.16).

/// Appends values to a `RowBinary` body.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn string(&mut self, s: &[u8]) -> &mut Self {
        self.len(s.len());
        self.buf.extend_from_slice(s);
        self
    }

    /// A length in unsigned LEB128: a `String`'s before its bytes, an
    /// `Array`'s before its elements.
    pub fn len(&mut self, len: usize) -> &mut Self {
        let mut n = len as u64;
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                self.buf.push(byte);
                break;
            }
            self.buf.push(byte | 0x80);
        }
        self
    }

    pub fn i8(&mut self, v: i8) -> &mut Self {
        self.buf.push(v as u8);
        self
    }

    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn f64(&mut self, v: f64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_bits().to_le_bytes());
        self
    }
}

/// Why a `RowBinary` answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error("RowBinary answer ends inside a value at byte {0}")]
    Truncated(usize),
    #[error("RowBinary string or array at byte {0} announces {1} bytes or elements, more than the answer holds")]
    StringTooLong(usize, u64),
}

/// Reads values from a `RowBinary` answer, in column order.
pub struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }

    /// Whether every byte has been read (no row starts here).
    pub fn is_done(&self) -> bool {
        self.at == self.buf.len()
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], ReadError> {
        let bytes = self
            .buf
            .get(self.at..self.at + N)
            .ok_or(ReadError::Truncated(self.at))?;
        self.at += N;
        Ok(bytes.try_into().expect("N bytes"))
    }

    pub fn string(&mut self) -> Result<&'a [u8], ReadError> {
        let start = self.at;
        let len = self.leb128()?;
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| self.at.checked_add(len))
            .filter(|&end| end <= self.buf.len())
            .ok_or(ReadError::StringTooLong(start, len))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// An `Array`'s length: at most what the rest of the answer can hold at
    /// `width` bytes an element.
    pub fn len(&mut self, width: usize) -> Result<usize, ReadError> {
        let start = self.at;
        let len = self.leb128()?;
        usize::try_from(len)
            .ok()
            .filter(|&n| n.saturating_mul(width) <= self.buf.len() - self.at)
            .ok_or(ReadError::StringTooLong(start, len))
    }

    fn leb128(&mut self) -> Result<u64, ReadError> {
        let mut len = 0u64;
        let mut shift = 0;
        loop {
            let [byte] = self.take::<1>()?;
            if shift < 64 {
                len |= u64::from(byte & 0x7f) << shift;
            }
            shift += 7;
            if byte & 0x80 == 0 {
                return Ok(len);
            }
        }
    }

    pub fn i8(&mut self) -> Result<i8, ReadError> {
        Ok(i8::from_le_bytes(self.take()?))
    }

    pub fn i32(&mut self) -> Result<i32, ReadError> {
        Ok(i32::from_le_bytes(self.take()?))
    }

    pub fn i64(&mut self) -> Result<i64, ReadError> {
        Ok(i64::from_le_bytes(self.take()?))
    }

    pub fn u64(&mut self) -> Result<u64, ReadError> {
        Ok(u64::from_le_bytes(self.take()?))
    }

    pub fn f64(&mut self) -> Result<f64, ReadError> {
        Ok(f64::from_bits(u64::from_le_bytes(self.take()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_bytes() {
        let mut w = Writer::default();
        w.string(b"ab").i8(-1).i32(-2).i64(3).u64(u64::MAX).f64(1.5);
        let mut want = vec![2, b'a', b'b', 0xff];
        want.extend_from_slice(&(-2i32).to_le_bytes());
        want.extend_from_slice(&3i64.to_le_bytes());
        want.extend_from_slice(&[0xff; 8]);
        want.extend_from_slice(&1.5f64.to_bits().to_le_bytes());
        assert_eq!(w.buf, want);
        // A 300-byte string's length is two LEB128 bytes: 0xac 0x02.
        let mut w = Writer::default();
        w.string(&[b'x'; 300]);
        assert_eq!(&w.buf[..2], &[0xac, 0x02]);
        assert_eq!(w.buf.len(), 302);
    }

    #[test]
    fn truncated_and_lying_answers_are_errors() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.i64(), Err(ReadError::Truncated(0)));
        let mut r = Reader::new(&[5, b'a']);
        assert_eq!(r.string(), Err(ReadError::StringTooLong(0, 5)));
        // Ten continuation bytes: a length past any buffer, not a panic.
        let mut r = Reader::new(&[0xff; 11]);
        assert!(r.string().is_err());
        assert!(Reader::new(&[]).is_done());
    }

    proptest! {
        #[test]
        fn values_round_trip(s in prop::collection::vec(any::<u8>(), 0..400), a in any::<i8>(), b in any::<i32>(), c in any::<i64>(), d in any::<u64>(), e in any::<u64>()) {
            let mut w = Writer::default();
            w.string(&s).i8(a).i32(b).i64(c).u64(d).f64(f64::from_bits(e));
            let mut r = Reader::new(&w.buf);
            prop_assert_eq!(r.string().unwrap(), &s[..]);
            prop_assert_eq!(r.i8().unwrap(), a);
            prop_assert_eq!(r.i32().unwrap(), b);
            prop_assert_eq!(r.i64().unwrap(), c);
            prop_assert_eq!(r.u64().unwrap(), d);
            prop_assert_eq!(r.f64().unwrap().to_bits(), e);
            prop_assert!(r.is_done());
        }
    }
}

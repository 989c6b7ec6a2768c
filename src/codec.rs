//! Compact, panic-free binary encoding for state kept in the host's shared key-value store.
//!
//! Unsigned integers are LEB128 varints, signed ones zig-zag varints, strings and byte blobs are
//! length-prefixed. Decoding never panics: truncated or corrupt input yields `CodecError`, and
//! lengths are checked against the remaining input so garbage cannot trigger huge allocations.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError(pub &'static str);

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "corrupt state: {}", self.0)
    }
}

impl std::error::Error for CodecError {}

pub type CodecResult<T> = Result<T, CodecError>;

#[derive(Debug, Default, Clone)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Writer { buf: Vec::with_capacity(64) }
    }
    pub fn with_capacity(n: usize) -> Self {
        Writer { buf: Vec::with_capacity(n) }
    }
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u64(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }
    pub fn u32(&mut self, v: u32) {
        self.u64(v as u64)
    }
    pub fn usize(&mut self, v: usize) {
        self.u64(v as u64)
    }
    pub fn i64(&mut self, v: i64) {
        self.u64(((v << 1) ^ (v >> 63)) as u64)
    }
    pub fn i32(&mut self, v: i32) {
        self.i64(v as i64)
    }
    /// Raw 8 bytes little endian (for values that are usually large, e.g. hashes).
    pub fn fixed64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn f64(&mut self, v: f64) {
        self.fixed64(v.to_bits())
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.usize(b.len());
        self.buf.extend_from_slice(b);
    }
    pub fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes())
    }
}

#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    /// Bytes read so far.
    pub fn position(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }
    pub fn u8(&mut self) -> CodecResult<u8> {
        let b = *self.buf.get(self.pos).ok_or(CodecError("truncated"))?;
        self.pos += 1;
        Ok(b)
    }
    #[inline]
    pub fn u64(&mut self) -> CodecResult<u64> {
        // Fast path: one-byte varint (most counts, small deltas).
        if let Some(&b) = self.buf.get(self.pos) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(u64::from(b));
            }
        }
        self.u64_slow()
    }
    fn u64_slow(&mut self) -> CodecResult<u64> {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        let mut v: u64 = 0;
        for (i, &b) in rest.iter().enumerate() {
            let shift = 7 * i as u32;
            if shift >= 64 || (shift == 63 && (b & 0x7e) != 0) {
                self.pos += i + 1;
                return Err(CodecError("varint overflow"));
            }
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                self.pos += i + 1;
                return Ok(v);
            }
        }
        self.pos = self.buf.len();
        Err(CodecError("truncated"))
    }
    pub fn u32(&mut self) -> CodecResult<u32> {
        u32::try_from(self.u64()?).map_err(|_| CodecError("u32 out of range"))
    }
    pub fn usize(&mut self) -> CodecResult<usize> {
        usize::try_from(self.u64()?).map_err(|_| CodecError("usize out of range"))
    }
    /// A count of items that each take at least `min_item_bytes` bytes: checked against the
    /// remaining input so corrupt data cannot make us allocate a huge vector.
    pub fn count(&mut self, min_item_bytes: usize) -> CodecResult<usize> {
        let n = self.usize()?;
        if n.saturating_mul(min_item_bytes.max(1)) > self.remaining() {
            return Err(CodecError("count exceeds input"));
        }
        Ok(n)
    }
    #[inline]
    pub fn i64(&mut self) -> CodecResult<i64> {
        let u = self.u64()?;
        Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
    }
    pub fn i32(&mut self) -> CodecResult<i32> {
        i32::try_from(self.i64()?).map_err(|_| CodecError("i32 out of range"))
    }
    #[inline]
    pub fn fixed64(&mut self) -> CodecResult<u64> {
        let bytes = self.buf.get(self.pos..).and_then(|s| s.first_chunk::<8>());
        let bytes = bytes.ok_or(CodecError("truncated"))?;
        self.pos += 8;
        Ok(u64::from_le_bytes(*bytes))
    }
    /// Skips `n` varints without decoding them (finding where a kept segment's entries end).
    pub fn skip_varints(&mut self, n: usize) -> CodecResult<()> {
        for _ in 0..n {
            let rest = self.buf.get(self.pos..).unwrap_or_default();
            // Fast path: the varint ends within the next 8 bytes (one of them below 0x80).
            let ends = rest.first_chunk::<8>().map_or(0, |a| !u64::from_le_bytes(*a) & 0x8080_8080_8080_8080);
            let last = if ends != 0 {
                (ends.trailing_zeros() / 8) as usize
            } else {
                rest.iter().take(10).position(|&b| b < 0x80).ok_or(CodecError("truncated"))?
            };
            self.pos += last + 1;
        }
        Ok(())
    }
    pub fn f64(&mut self) -> CodecResult<f64> {
        Ok(f64::from_bits(self.fixed64()?))
    }
    pub fn bytes(&mut self) -> CodecResult<&'a [u8]> {
        let n = self.usize()?;
        let end = self.pos.checked_add(n).ok_or(CodecError("truncated"))?;
        let s = self.buf.get(self.pos..end).ok_or(CodecError("truncated"))?;
        self.pos = end;
        Ok(s)
    }
    pub fn str(&mut self) -> CodecResult<&'a str> {
        std::str::from_utf8(self.bytes()?).map_err(|_| CodecError("bad utf-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let mut w = Writer::new();
        w.u64(0);
        w.u64(u64::MAX);
        w.i64(-1);
        w.i64(i64::MIN);
        w.i64(i64::MAX);
        w.str("héllo");
        w.fixed64(42);
        w.f64(0.977);
        w.u8(1);
        let b = w.into_bytes();
        let mut r = Reader::new(&b);
        assert_eq!(r.u64().unwrap(), 0);
        assert_eq!(r.u64().unwrap(), u64::MAX);
        assert_eq!(r.i64().unwrap(), -1);
        assert_eq!(r.i64().unwrap(), i64::MIN);
        assert_eq!(r.i64().unwrap(), i64::MAX);
        assert_eq!(r.str().unwrap(), "héllo");
        assert_eq!(r.fixed64().unwrap(), 42);
        assert_eq!(r.f64().unwrap(), 0.977);
        assert_eq!(r.u8().unwrap(), 1);
        assert!(r.is_empty());
        assert!(r.u8().is_err());
    }

    #[test]
    fn garbage_never_panics() {
        for seed in 0u32..2000 {
            let bytes: Vec<u8> = (0..(seed % 23)).map(|i| (seed.wrapping_mul(2654435761).wrapping_add(i * 97) >> 3) as u8).collect();
            let mut r = Reader::new(&bytes);
            let _ = r.count(1);
            let _ = r.str();
            let _ = r.i64();
            let _ = r.fixed64();
        }
        let mut r = Reader::new(&[0xff; 11]);
        assert!(r.u64().is_err());
    }

    /// The varint reader agrees with the straightforward byte loop (value, error, position).
    #[test]
    fn varint_reader_matches_reference() {
        fn reference(buf: &[u8]) -> (CodecResult<u64>, usize) {
            let mut pos = 0;
            let mut v: u64 = 0;
            let mut shift = 0u32;
            loop {
                let Some(&b) = buf.get(pos) else { return (Err(CodecError("truncated")), pos) };
                pos += 1;
                if shift >= 64 || (shift == 63 && (b & 0x7e) != 0) {
                    return (Err(CodecError("varint overflow")), pos);
                }
                v |= ((b & 0x7f) as u64) << shift;
                if b & 0x80 == 0 {
                    return (Ok(v), pos);
                }
                shift += 7;
            }
        }
        let mut rng = crate::test_rng::Rng(0x9e37_79b9_7f4a_7c15);
        let mut cases: Vec<Vec<u8>> = vec![vec![], vec![0x80; 9], vec![0x80; 10], vec![0x80; 11], vec![0x80; 12]];
        for last in [0u8, 1, 2, 0x7f, 0x80, 0x81, 0x82] {
            let mut c = vec![0xffu8; 9];
            c.push(last);
            cases.push(c.clone());
            c.push(0);
            cases.push(c);
        }
        for n in 0..20_000u32 {
            let x = rng.next();
            let len = (n % 13) as usize;
            cases.push((0..len).map(|k| (x >> (k * 5)) as u8 | if k + 1 < len && n % 3 != 0 { 0x80 } else { 0 }).collect());
            let mut w = Writer::new();
            w.u64(x >> (n % 64));
            cases.push(w.into_bytes());
        }
        for c in cases {
            let mut r = Reader::new(&c);
            let got = r.u64();
            assert_eq!((got, r.pos), reference(&c), "{c:x?}");
        }
    }

    #[test]
    fn varint_bounds() {
        for v in [0u64, 1, 127, 128, 300, 1 << 35, u64::MAX - 1, u64::MAX] {
            let mut w = Writer::new();
            w.u64(v);
            let b = w.into_bytes();
            assert_eq!(Reader::new(&b).u64().unwrap(), v);
            // Every strict prefix is truncated.
            for k in 0..b.len() {
                assert!(Reader::new(&b[..k]).u64().is_err());
            }
        }
        // 10 continuation bytes, or a 10th byte above 1: overflow.
        assert!(Reader::new(&[0xff; 11]).u64().is_err());
        assert!(Reader::new(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]).u64().is_err());
        assert_eq!(Reader::new(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]).u64().unwrap(), u64::MAX);
    }
}

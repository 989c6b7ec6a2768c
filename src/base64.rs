//! Base64, standard alphabet with padding (RFC 4648 §4): how etcd's JSON gateway carries keys
//! and values (Go's `encoding/json` encodes `[]byte` with `base64.StdEncoding`).
//!
//! The decoder accepts what Go's `StdEncoding.DecodeString` accepts, except that line breaks are
//! not skipped (etcd never writes them): the length must be a multiple of 4, `=` only as the last
//! one or two characters; like Go's non-strict mode, the unused low bits of the last symbol are
//! ignored.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Why a string is not base64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base64Error {
    /// The length is not a multiple of 4.
    Length(usize),
    /// A byte outside the alphabet (or a misplaced `=`) at this offset.
    Symbol(usize),
}

impl std::fmt::Display for Base64Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Base64Error::Length(n) => write!(f, "base64 length {n} is not a multiple of 4"),
            Base64Error::Symbol(at) => write!(f, "illegal base64 data at input byte {at}"),
        }
    }
}

fn symbol(i: u32) -> char {
    ALPHABET.get((i & 63) as usize).map_or('A', |&b| char::from(b))
}

/// Encodes `data` with padding.
pub fn encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let n = (b(0) << 16) | (b(1) << 8) | b(2);
        out.push(symbol(n >> 18));
        out.push(symbol(n >> 12));
        out.push(if chunk.len() > 1 { symbol(n >> 6) } else { '=' });
        out.push(if chunk.len() > 2 { symbol(n) } else { '=' });
    }
    out
}

fn value(c: u8) -> Option<u32> {
    let v = match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    };
    Some(u32::from(v))
}

/// Decodes padded standard base64.
pub fn decode(s: &str) -> Result<Vec<u8>, Base64Error> {
    let bytes = s.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return Err(Base64Error::Length(bytes.len()));
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let quads = bytes.len() / 4;
    for (q, quad) in bytes.chunks_exact(4).enumerate() {
        let last = q + 1 == quads;
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return Err(Base64Error::Symbol(q * 4 + 4 - pad));
        }
        let mut n = 0u32;
        for (i, &c) in quad.iter().enumerate().take(4 - pad) {
            n |= value(c).ok_or(Base64Error::Symbol(q * 4 + i))? << (18 - 6 * i);
        }
        let [_, b0, b1, b2] = n.to_be_bytes();
        out.extend([b0, b1, b2].into_iter().take(3 - pad));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4648_vectors() {
        for (raw, enc) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy")]
        {
            assert_eq!(encode(raw.as_bytes()), enc);
            assert_eq!(decode(enc).unwrap(), raw.as_bytes());
        }
        assert_eq!(encode(&[0xfb, 0xff, 0xbf]), "+/+/");
        assert_eq!(encode(b"/apf-wasm/"), "L2FwZi13YXNtLw==");
    }

    #[test]
    fn round_trips_every_length_and_byte() {
        let data: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        for n in 0..data.len() {
            assert_eq!(decode(&encode(&data[..n])).unwrap(), &data[..n], "length {n}");
        }
    }

    #[test]
    fn rejects_malformed_input() {
        assert_eq!(decode("Zg="), Err(Base64Error::Length(3)));
        assert_eq!(decode("Zg=a"), Err(Base64Error::Symbol(2)));
        assert_eq!(decode("Z==="), Err(Base64Error::Symbol(1)));
        assert_eq!(decode("Zg==Zg=="), Err(Base64Error::Symbol(2)));
        assert_eq!(decode("Zm9-"), Err(Base64Error::Symbol(3)));
        assert_eq!(decode("Zm 9"), Err(Base64Error::Symbol(2)));
        assert_eq!(decode("éé"), Err(Base64Error::Symbol(0)));
        assert!(decode("éé==").is_err());
        // Go's non-strict decoding ignores the unused bits of the last symbol.
        assert_eq!(decode("Zh==").unwrap(), b"f");
    }
}

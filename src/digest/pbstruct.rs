//! Decoding of `google.protobuf.Struct` wire bytes into JSON, for JWT claims that Envoy's
//! `jwt_authn` filter stores in dynamic metadata (`payload_in_metadata`) and that the filter
//! reads as the property `metadata.filter_metadata["envoy.filters.http.jwt_authn"]`.
//! Panic-free and bounded (nesting depth, input length).

use serde_json::{Map, Number, Value};

const MAX_DEPTH: u32 = 32;

struct Pb<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Pb<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.pos)?;
            self.pos += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.varint()?).ok()?;
        self.take(n)
    }
    fn fixed64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    /// Skips a field of the given wire type.
    fn skip(&mut self, wire: u64) -> Option<()> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.take(8).map(drop),
            2 => self.bytes().map(drop),
            5 => self.take(4).map(drop),
            _ => None,
        }
    }
}

/// Calls `f` with each field's number and wire type, positioned at its payload; `f` reads or
/// skips it.
fn fields<'a>(b: &'a [u8], mut f: impl FnMut(&mut Pb<'a>, u64, u64) -> Option<()>) -> Option<()> {
    let mut p = Pb { b, pos: 0 };
    while p.pos < b.len() {
        let key = p.varint()?;
        f(&mut p, key >> 3, key & 7)?;
    }
    Some(())
}

/// Decodes a `Struct` message; `None` on malformed input.
pub fn decode_struct(b: &[u8]) -> Option<Value> {
    struct_at(b, 0)
}

fn struct_at(b: &[u8], depth: u32) -> Option<Value> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut map = Map::new();
    fields(b, |p, num, wire| match (num, wire) {
        (1, 2) => {
            let (mut name, mut value) = (String::new(), Value::Null);
            fields(p.bytes()?, |e, num, wire| {
                match (num, wire) {
                    (1, 2) => name = String::from_utf8_lossy(e.bytes()?).into_owned(),
                    (2, 2) => value = value_at(e.bytes()?, depth + 1)?,
                    (_, w) => e.skip(w)?,
                }
                Some(())
            })?;
            map.insert(name, value);
            Some(())
        }
        (_, w) => p.skip(w),
    })?;
    Some(Value::Object(map))
}

fn value_at(b: &[u8], depth: u32) -> Option<Value> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut v = Value::Null;
    fields(b, |p, num, wire| {
        v = match (num, wire) {
            (1, 0) => {
                p.varint()?;
                Value::Null
            }
            (2, 1) => Number::from_f64(f64::from_bits(p.fixed64()?)).map_or(Value::Null, Value::Number),
            (3, 2) => Value::String(String::from_utf8_lossy(p.bytes()?).into_owned()),
            (4, 0) => Value::Bool(p.varint()? != 0),
            (5, 2) => struct_at(p.bytes()?, depth + 1)?,
            (6, 2) => {
                let mut items = Vec::new();
                fields(p.bytes()?, |l, num, wire| match (num, wire) {
                    (1, 2) => {
                        items.push(value_at(l.bytes()?, depth + 1)?);
                        Some(())
                    }
                    (_, w) => l.skip(w),
                })?;
                Value::Array(items)
            }
            // Unknown fields leave the value as it is.
            (_, w) => return p.skip(w),
        };
        Some(())
    })?;
    Some(v)
}

/// The claims inside `jwt_authn`'s metadata: the filter stores the payload under the name set
/// by `payload_in_metadata`; when the struct is a single such object, return that object.
pub fn claims_of(v: Value) -> Value {
    match v {
        Value::Object(m) if m.len() == 1 && m.values().all(Value::is_object) => {
            m.into_iter().next().map_or(Value::Null, |(_, inner)| inner)
        }
        v => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u64, wire: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![((num << 3) | wire) as u8];
        if wire == 2 {
            out.push(payload.len() as u8);
        }
        out.extend_from_slice(payload);
        out
    }
    fn string_value(s: &str) -> Vec<u8> {
        field(3, 2, s.as_bytes())
    }
    fn entry(name: &str, value: &[u8]) -> Vec<u8> {
        let mut e = field(1, 2, name.as_bytes());
        e.extend(field(2, 2, value));
        field(1, 2, &e)
    }

    #[test]
    fn decodes_nested_claims() {
        let groups = {
            let mut l = field(1, 2, &string_value("dev"));
            l.extend(field(1, 2, &string_value("ops")));
            field(6, 2, &l)
        };
        let mut payload = entry("sub", &string_value("alice"));
        payload.extend(entry("groups", &groups));
        let outer = entry("jwt_payload", &field(5, 2, &payload));
        let v = claims_of(decode_struct(&outer).unwrap());
        assert_eq!(v, serde_json::json!({"sub": "alice", "groups": ["dev", "ops"]}));
    }

    #[test]
    fn garbage_is_none_not_panic() {
        for seed in 0u32..3000 {
            let b: Vec<u8> = (0..(seed % 40)).map(|i| (seed.wrapping_mul(2654435761).rotate_left(i)) as u8).collect();
            let _ = decode_struct(&b);
        }
        assert!(decode_struct(&[0x0a, 0x7f]).is_none());
    }
}

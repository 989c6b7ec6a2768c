//! Field and label selector parsing (apimachinery `fields.ParseSelector`, `labels.Parse`), only
//! as far as needed to know whether they parse and which `metadata.name` they pin.

use std::iter::Peekable;

/// One parsed field-selector term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldTerm {
    pub field: String,
    /// `=` / `==` (true) or `!=` (false).
    pub equals: bool,
    pub value: String,
}

/// A field-selector value with its backslash escapes (`\\`, `\,`, `\=`) undone; an
/// unescaped `,` or `=` or any other escape is an error.
fn unescape_value(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                c @ ('\\' | ',' | '=') => out.push(c),
                _ => return None,
            },
            ',' | '=' => return None,
            _ => out.push(c),
        }
    }
    Some(out)
}

/// `fields.ParseSelector` (None = parse error): terms sorted as upstream sorts them.
pub fn parse_field_selector(s: &str) -> Option<Vec<FieldTerm>> {
    if s.is_empty() {
        // Fast path for the common absent selector: no terms, nothing allocated.
        return Some(Vec::new());
    }
    // `splitTerms`: split on `,` not escaped with a backslash.
    let mut escaped = false;
    let mut parts: Vec<&str> = s
        .split(|c| {
            let split = !escaped && c == ',';
            escaped = !escaped && c == '\\';
            split
        })
        .collect();
    parts.sort_unstable();
    let terms = parts.into_iter().filter(|p| !p.is_empty()).map(|part| {
        // `splitTerm`: the first position where an operator starts.
        let (i, op) = part.char_indices().find_map(|(i, _)| {
            let rest = part.get(i..)?;
            ["!=", "==", "="].into_iter().find(|op| rest.starts_with(op)).map(|op| (i, op))
        })?;
        let field = part.get(..i).unwrap_or_default().to_string();
        let value = unescape_value(part.get(i + op.len()..).unwrap_or_default())?;
        Some(FieldTerm { field, equals: op != "!=", value })
    });
    terms.collect()
}

/// `Selector.RequiresExactMatch(field)`.
pub fn requires_exact_match<'a>(terms: &'a [FieldTerm], field: &str) -> Option<&'a str> {
    terms.iter().find(|t| t.equals && t.field == field).map(|t| t.value.as_str())
}

/// Label-selector tokens (`labels.Lexer`); `in` and `notin` stay identifiers, since only the
/// operator position gives them meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok<'a> {
    Ident(&'a str),
    Not,
    /// `=`, `==`, `!=`.
    Eq,
    /// `>`, `<`: the value must be an integer.
    Cmp,
    Open,
    Close,
    Comma,
}

const WHITESPACE: [char; 4] = [' ', '\t', '\r', '\n'];

fn lex(s: &str) -> Vec<Tok<'_>> {
    let ends_ident = |c: char| "=!(),><".contains(c) || WHITESPACE.contains(&c);
    let mut out = Vec::new();
    let mut rest = s.trim_start_matches(WHITESPACE);
    while let Some(c) = rest.chars().next() {
        let (tok, len) = match (c, rest.as_bytes().get(1)) {
            ('!' | '=', Some(b'=')) => (Tok::Eq, 2),
            ('!', _) => (Tok::Not, 1),
            ('=', _) => (Tok::Eq, 1),
            ('>' | '<', _) => (Tok::Cmp, 1),
            ('(', _) => (Tok::Open, 1),
            (')', _) => (Tok::Close, 1),
            (',', _) => (Tok::Comma, 1),
            _ => {
                let n = rest.find(ends_ident).unwrap_or(rest.len());
                (Tok::Ident(rest.get(..n).unwrap_or_default()), n)
            }
        };
        out.push(tok);
        rest = rest.get(len..).unwrap_or_default().trim_start_matches(WHITESPACE);
    }
    out
}

/// Label value / qualified-name part: ≤63, `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn is_name_part(s: &str, allow_empty: bool) -> bool {
    let b = s.as_bytes();
    if b.is_empty() {
        return allow_empty;
    }
    b.len() <= 63
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.iter().all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                && b.first().is_some_and(|&c| c != b'-')
                && b.last().is_some_and(|&c| c != b'-')
        })
}

fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((p, n)) => is_dns1123_subdomain(p) && is_name_part(n, false),
        None => is_name_part(s, false),
    }
}

/// Whether `labels.Parse(s)` succeeds.
pub fn label_selector_is_valid(s: &str) -> bool {
    let toks = lex(s);
    let mut t = toks.iter().copied().peekable();
    while t.peek().is_some() {
        if requirement(&mut t).is_none() {
            return false;
        }
        match t.next() {
            None => return true,
            // A comma must be followed by another requirement.
            Some(Tok::Comma) if t.peek().is_some() => {}
            _ => return false,
        }
    }
    true
}

/// One requirement: `[!]key`, `key op value` or `key in|notin (values)`.
fn requirement<'a>(t: &mut Peekable<impl Iterator<Item = Tok<'a>>>) -> Option<()> {
    let not = t.next_if_eq(&Tok::Not).is_some();
    let Some(Tok::Ident(key)) = t.next() else { return None };
    if !is_qualified_name(key) {
        return None;
    }
    let at_end = matches!(t.peek(), None | Some(Tok::Comma));
    if not || at_end {
        return at_end.then_some(());
    }
    match t.next()? {
        Tok::Ident("in" | "notin") => {
            if t.next()? != Tok::Open {
                return None;
            }
            if t.next_if_eq(&Tok::Close).is_some() {
                return Some(());
            }
            loop {
                // Empty values (`(a,,b)`, `(a,)`) are allowed.
                match t.next()? {
                    Tok::Comma => {}
                    Tok::Ident(v) if is_name_part(v, true) => match t.next()? {
                        Tok::Close => return Some(()),
                        Tok::Comma if t.next_if_eq(&Tok::Close).is_some() => return Some(()),
                        Tok::Comma => {}
                        _ => return None,
                    },
                    _ => return None,
                }
            }
        }
        op @ (Tok::Eq | Tok::Cmp) => {
            let v = match t.peek() {
                None | Some(Tok::Comma) => "",
                _ => match t.next()? {
                    Tok::Ident(v) => v,
                    _ => return None,
                },
            };
            if op == Tok::Cmp {
                v.parse::<i64>().ok().map(drop)
            } else {
                is_name_part(v, true).then_some(())
            }
        }
        _ => None,
    }
}

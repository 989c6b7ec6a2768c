//! A minimal plain HTTP/1.1 client for the CLI (a metrics endpoint, etcd's JSON API), enough on
//! a trusted network; TLS endpoints are reached through `kubectl` or a local proxy.

use std::io::{Read, Write};
use std::net::TcpStream;

use super::HttpError;

/// `method path` on `host[:port]` (port 80 by default) with `headers` and `body`; the response
/// body of a `200`, or why there is none.
pub fn request(host: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Vec<u8>, HttpError> {
    let addr = if host.contains(':') { host.to_string() } else { format!("{host}:80") };
    let mut conn = TcpStream::connect(&addr).map_err(HttpError::Io)?;
    let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(30)));
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes()).and_then(|()| conn.write_all(body)).map_err(HttpError::Io)?;
    let mut resp = Vec::new();
    conn.read_to_end(&mut resp).map_err(HttpError::Io)?;
    let split = resp.windows(4).position(|w| w == b"\r\n\r\n").ok_or(HttpError::NoHeader)?;
    let head = String::from_utf8_lossy(resp.get(..split).unwrap_or_default()).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(HttpError::Status(status.to_string()));
    }
    let body = resp.get(split + 4..).unwrap_or_default();
    if head.contains("transfer-encoding: chunked") {
        return dechunk(body).ok_or(HttpError::BadChunking);
    }
    Ok(body.to_vec())
}

fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(b.len());
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n")?;
        let size_s = std::str::from_utf8(b.get(..eol)?).ok()?;
        let size = usize::from_str_radix(size_s.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(eol + 2..eol + 2 + size)?);
        b = b.get(eol + 4 + size..)?;
    }
}

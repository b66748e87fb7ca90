//! A minimal blocking HTTP/1.1 client for loopback: the server's tests and the load test
//! (`transformer loadtest`). One request per connection (`Connection: close`); bodies with
//! `Content-Length`, `Transfer-Encoding: chunked` or until the server closes; server-sent
//! events read one at a time as they arrive (`data:` lines of one event joined by `\n`).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Response headers, names lowercased, in order.
pub type Headers = Vec<(String, String)>;

/// How the body is framed.
enum Framing {
    Length(usize),
    Chunked { left: usize, done: bool },
    UntilClose,
}

/// One request's connection, its status and headers read.
pub struct Connection {
    reader: BufReader<TcpStream>,
    pub status: u16,
    pub headers: Headers,
    framing: Framing,
    /// Body bytes read but not yet returned as events.
    buffer: Vec<u8>,
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

impl Connection {
    /// Sends `method path` with an optional JSON `body` and reads the response head.
    pub fn open(
        addr: SocketAddr,
        method: &str,
        path: &str,
        body: Option<&str>,
        timeout: Duration,
    ) -> io::Result<Connection> {
        let json = body.map(|_| ("Content-Type", "application/json"));
        Self::open_with(addr, method, path, json.as_slice(), body, timeout)
    }

    /// Sends `method path` with the `headers` given (`Host` replaces the default, the
    /// address) and an optional `body`, and reads the response head.
    pub fn open_with(
        addr: SocketAddr,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
        timeout: Duration,
    ) -> io::Result<Connection> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            request.push_str(&format!("Host: {addr}\r\n"));
        }
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        if let Some(b) = body {
            request.push_str(&format!("Content-Length: {}\r\n", b.len()));
        }
        request.push_str("\r\n");
        request.push_str(body.unwrap_or(""));
        (&stream).write_all(request.as_bytes())?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(format!("bad status line {line:?}")))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Err(bad("connection closed in the headers"));
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let get = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        let framing = if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            Framing::Chunked {
                left: 0,
                done: false,
            }
        } else if let Some(n) = get("content-length").and_then(|v| v.parse().ok()) {
            Framing::Length(n)
        } else {
            Framing::UntilClose
        };
        Ok(Connection {
            reader,
            status,
            headers,
            framing,
            buffer: Vec::new(),
        })
    }

    /// The value of header `name` (lowercase).
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The next piece of the body, `None` at its end.
    fn read_some(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut buf = vec![0u8; 16 << 10];
        match &mut self.framing {
            Framing::Length(0) => Ok(None),
            Framing::Length(left) => {
                let want = (*left).min(buf.len());
                let n = self.reader.read(&mut buf[..want])?;
                if n == 0 {
                    return Err(bad("connection closed in the body"));
                }
                *left -= n;
                buf.truncate(n);
                Ok(Some(buf))
            }
            Framing::UntilClose => {
                let n = self.reader.read(&mut buf)?;
                buf.truncate(n);
                Ok((n > 0).then_some(buf))
            }
            Framing::Chunked { left, done } => {
                if *done {
                    return Ok(None);
                }
                if *left == 0 {
                    let mut line = String::new();
                    self.reader.read_line(&mut line)?;
                    let size =
                        usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                            .map_err(|_| bad(format!("bad chunk size {line:?}")))?;
                    if size == 0 {
                        *done = true;
                        return Ok(None);
                    }
                    *left = size;
                }
                let want = (*left).min(buf.len());
                let n = self.reader.read(&mut buf[..want])?;
                if n == 0 {
                    return Err(bad("connection closed in a chunk"));
                }
                *left -= n;
                if *left == 0 {
                    let mut crlf = String::new();
                    self.reader.read_line(&mut crlf)?;
                }
                buf.truncate(n);
                Ok(Some(buf))
            }
        }
    }

    /// The rest of the body.
    pub fn body(&mut self) -> io::Result<Vec<u8>> {
        let mut out = std::mem::take(&mut self.buffer);
        while let Some(piece) = self.read_some()? {
            out.extend_from_slice(&piece);
        }
        Ok(out)
    }

    /// The rest of the body as text.
    pub fn text(&mut self) -> io::Result<String> {
        String::from_utf8(self.body()?).map_err(|e| bad(e.to_string()))
    }

    /// The `data` of the next server-sent event, `None` at the end of the stream.
    pub fn next_event(&mut self) -> io::Result<Option<String>> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let event = String::from_utf8(event).map_err(|e| bad(e.to_string()))?;
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue; // a comment or keep-alive
                }
                return Ok(Some(data.join("\n")));
            }
            match self.read_some()? {
                Some(piece) => self.buffer.extend_from_slice(&piece),
                None if self.buffer.iter().all(u8::is_ascii_whitespace) => return Ok(None),
                None => return Err(bad("the stream ended inside an event")),
            }
        }
    }
}

/// One whole request with the `headers` given: status, headers and body text.
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    timeout: Duration,
) -> io::Result<(u16, Headers, String)> {
    let mut c = Connection::open_with(addr, method, path, headers, body, timeout)?;
    let text = c.text()?;
    Ok((c.status, std::mem::take(&mut c.headers), text))
}

/// One whole request: status, headers and body text.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> io::Result<(u16, Headers, String)> {
    let mut c = Connection::open(addr, method, path, body, timeout)?;
    let text = c.text()?;
    Ok((c.status, std::mem::take(&mut c.headers), text))
}

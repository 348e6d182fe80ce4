//! The metrics endpoint: one plain thread answers HTTP `GET /metrics`, one
//! request at a time, each within a size limit and deadlines, so that a
//! slow or hostile client holds it for seconds at most.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Bytes of request (line and headers) read at most.
pub const MAX_REQUEST: usize = 8 << 10;
/// Time a client has to send its whole request.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);
/// Time a client has to take the whole response.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(5);

/// The content type of the Prometheus text format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves `render()` at `/metrics` until the process ends.
pub fn serve(listener: TcpListener, render: impl Fn() -> String) {
    for conn in listener.incoming() {
        match conn {
            Ok(s) => {
                if let Err(e) = answer(s, &render) {
                    tracing::debug!("metrics request: {e}");
                }
            }
            // Out of descriptors, or an aborted connection: the next one may work.
            Err(e) => {
                tracing::warn!("metrics endpoint: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Reads one request and answers it; the connection closes after.
fn answer(mut s: TcpStream, render: &impl Fn() -> String) -> io::Result<()> {
    s.set_write_timeout(Some(WRITE_DEADLINE))?;
    let Some(head) = read_head(&mut s)? else {
        respond(
            &mut s,
            "431 Request Header Fields Too Large",
            "",
            "request too large\n",
        )?;
        return linger(s);
    };
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return respond(&mut s, "400 Bad Request", "", "not an HTTP/1 request\n");
    }
    let path = target.split('?').next().unwrap_or("");
    let body = match (method, path) {
        ("GET" | "HEAD", "/metrics") => render(),
        ("GET" | "HEAD", "/") => {
            "rdmablk-target metrics: GET /metrics (Prometheus text format)\n".to_string()
        }
        ("GET" | "HEAD", _) => return respond(&mut s, "404 Not Found", "", "try /metrics\n"),
        _ => {
            return respond(
                &mut s,
                "405 Method Not Allowed",
                "Allow: GET, HEAD\r\n",
                "only GET and HEAD\n",
            )
        }
    };
    // A HEAD response says the length a GET would get, and sends nothing.
    let sent = if method == "HEAD" { "" } else { &body };
    write_response(&mut s, "200 OK", "", body.len(), sent)
}

/// The request line and headers, up to the blank line; `None` when they
/// exceed [`MAX_REQUEST`]. Fails when the client is slower than [`READ_DEADLINE`].
fn read_head(s: &mut TcpStream) -> io::Result<Option<String>> {
    let deadline = Instant::now() + READ_DEADLINE;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request not complete in time",
            ));
        }
        s.set_read_timeout(Some(left))?;
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before the request ended",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.truncate(end);
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
        if buf.len() > MAX_REQUEST {
            return Ok(None);
        }
    }
}

/// Closes after an answer given before the whole request was read: the
/// rest is read and dropped for a moment (at most [`MAX_REQUEST`] bytes
/// more), so that closing with unread data does not reset the connection
/// before the client has read the answer.
fn linger(mut s: TcpStream) -> io::Result<()> {
    s.shutdown(std::net::Shutdown::Write)?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut rest = [0u8; 1024];
    let mut left = MAX_REQUEST;
    while left > 0 {
        match s.read(&mut rest) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
    Ok(())
}

/// An error response.
fn respond(s: &mut TcpStream, status: &str, extra: &str, body: &str) -> io::Result<()> {
    write_response(s, status, extra, body.len(), body)
}

/// Writes the status line, headers (`extra` ends in CRLF when given) with a
/// Content-Length of `len`, and `body`.
fn write_response(
    s: &mut TcpStream,
    status: &str,
    extra: &str,
    len: usize,
    body: &str,
) -> io::Result<()> {
    let ctype = if status.starts_with("200") {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nConnection: close\r\n{extra}Content-Length: {len}\r\n\r\n"
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    s.flush()
}

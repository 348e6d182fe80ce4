//! The target's Prometheus endpoint as a scraper sees it: HTTP requests,
//! scrapes, and the samples of a scrape.

use crate::check::OrPanic;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Sends `request` and returns the status line and the body.
pub fn http(addr: SocketAddr, request: &[u8]) -> (String, String) {
    let mut s = TcpStream::connect(addr).or_panic("connecting to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(request).or_panic("sending the request");
    let mut reply = String::new();
    s.read_to_string(&mut reply)
        .or_panic("reading the response");
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head.lines().next().unwrap_or("").to_string();
    if status.contains(" 200 ") {
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4"),
            "content type of a scrape: {head}"
        );
    }
    (status, body.to_string())
}

/// Scrapes `/metrics` at `addr`, which must answer 200; the body.
pub fn scrape(addr: SocketAddr) -> String {
    let (status, body) = http(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK", "scrape status");
    body
}

/// The samples of a scrape, by series (name and labels as written).
pub fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("series and value");
            (series.to_string(), value.parse().expect("a number"))
        })
        .collect()
}

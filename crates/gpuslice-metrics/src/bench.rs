//! Scrape latency, measured the way Prometheus sees it: a fresh TCP
//! connection, `GET /metrics`, the whole body read.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Why a scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("connecting to {addr}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("no HTTP response from {addr}")]
    NoResponse { addr: SocketAddr },
    #[error("scrape answered {0}")]
    Status(String),
}

/// One scrape: (status line, body length, time taken).
pub fn scrape(addr: SocketAddr, path: &str) -> Result<(String, usize, Duration), ScrapeError> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr).map_err(|source| ScrapeError::Connect { addr, source })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::with_capacity(32 * 1024);
    s.read_to_end(&mut buf)?;
    let took = t0.elapsed();
    let text = String::from_utf8_lossy(&buf);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(ScrapeError::NoResponse { addr });
    };
    let status = head.lines().next().unwrap_or_default().to_string();
    Ok((status, body.len(), took))
}

#[derive(Debug, Clone)]
pub struct Latencies {
    pub scrapes: usize,
    pub body_bytes: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub mean: Duration,
}

/// `n` sequential scrapes of `/metrics`.
pub fn scrapes(addr: SocketAddr, n: usize) -> Result<Latencies, ScrapeError> {
    let mut times = Vec::with_capacity(n);
    let mut body_bytes = 0;
    for _ in 0..n.max(1) {
        let (status, len, took) = scrape(addr, "/metrics")?;
        if !status.contains(" 200 ") {
            return Err(ScrapeError::Status(status));
        }
        body_bytes = len;
        times.push(took);
    }
    times.sort();
    let at = |q: f64| times[((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1];
    Ok(Latencies {
        scrapes: times.len(),
        body_bytes,
        p50: at(0.50),
        p99: at(0.99),
        max: *times.last().expect("n >= 1"),
        mean: times.iter().sum::<Duration>() / times.len() as u32,
    })
}

//! A gRPC unary call over a unix socket, written frame by frame so that it
//! sends the HTTP/2 `:authority` that a given client really sends.
//!
//! Why not tonic: the kubelet's plugin watcher dials a registration socket
//! with grpc-go (`grpc.NewClient(path)`, no authority option), whose
//! default `dns` scheme turns the socket path into the endpoint
//! `var/lib/kubelet/plugins_registry/<driver>-reg.sock` and sends it
//! percent-encoded as `:authority` (`var%2Flib%2Fkubelet%2F…`). gRPC C-core
//! does the same for `unix:` targets. The `http` crate cannot even
//! represent such an authority, so no Rust HTTP/2 client can send it, and
//! a server that rejects it (upstream h2 resets the stream with
//! PROTOCOL_ERROR) is never registered by a real kubelet. `doctor` and the
//! test kubelet use this client to dial the sockets as the kubelet does.
//!
//! Only what a unary call needs: the connection preface, SETTINGS (and its
//! ACK), one HEADERS frame of literal header fields (HPACK without
//! indexing or Huffman coding, which every decoder accepts), one DATA frame
//! with the length-prefixed message, and the answer read frame by frame
//! until the stream ends or is reset. Response headers are not decoded
//! (they are HPACK with Huffman coding): a call succeeds when the stream
//! carried one message, and a trailers-only answer (a gRPC error status)
//! is reported as such.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;
use thiserror::Error;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
/// The largest answer accepted (the kubelet's default receive limit is 16 MiB).
const MAX_MESSAGE: usize = 16 << 20;

#[derive(Debug, Error)]
pub enum WireError {
    #[error("cannot connect to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("i/o on {0}: {1}")]
    Io(String, std::io::Error),
    #[error("the server reset the stream with {0} (an HTTP/2 server that refuses this :authority {1:?})")]
    Reset(&'static str, String),
    #[error("the server closed the connection (GOAWAY {0})")]
    GoAway(&'static str),
    #[error("the call ended without a message (a gRPC error status in its trailers)")]
    NoMessage,
    #[error("malformed answer: {0}")]
    Malformed(String),
}

/// The `:authority` grpc-go sends for `grpc.NewClient(path)` (the kubelet's
/// plugin watcher): the path without its leading `/`, with every byte
/// outside RFC 3986's unreserved and sub-delims characters, `:` and `@`
/// percent-encoded (grpc-go's `encodeAuthority`).
pub fn grpc_go_authority(socket: &Path) -> String {
    let path = socket.to_string_lossy();
    let mut out = String::new();
    for b in path.trim_start_matches('/').bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b);
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn error_name(code: u32) -> &'static str {
    match code {
        0x0 => "NO_ERROR",
        0x1 => "PROTOCOL_ERROR",
        0x2 => "INTERNAL_ERROR",
        0x3 => "FLOW_CONTROL_ERROR",
        0x7 => "REFUSED_STREAM",
        0x8 => "CANCEL",
        _ => "another HTTP/2 error",
    }
}

/// One connection, on which unary calls are made one after the other (the
/// kubelet calls GetInfo and then NotifyRegistrationStatus on one).
pub struct WireConn {
    sock: UnixStream,
    what: String,
    authority: String,
    next_stream: u32,
}

impl WireConn {
    /// Connects to `socket` and sends the preface; each call will carry
    /// `authority`.
    pub fn connect(socket: &Path, authority: &str, timeout: Duration) -> Result<Self, WireError> {
        let what = socket.display().to_string();
        let sock = UnixStream::connect(socket).map_err(|e| WireError::Connect(what.clone(), e))?;
        let io = |e| WireError::Io(what.clone(), e);
        sock.set_read_timeout(Some(timeout)).map_err(io)?;
        sock.set_write_timeout(Some(timeout)).map_err(io)?;
        let mut conn = WireConn {
            sock,
            what,
            authority: authority.into(),
            next_stream: 1,
        };
        conn.write_all(PREFACE)?;
        conn.frame(SETTINGS, 0, 0, &[])?;
        Ok(conn)
    }

    fn io(&self, e: std::io::Error) -> WireError {
        WireError::Io(self.what.clone(), e)
    }

    fn write_all(&mut self, b: &[u8]) -> Result<(), WireError> {
        self.sock.write_all(b).map_err(|e| self.io(e))
    }

    fn frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Result<(), WireError> {
        let len = payload.len() as u32;
        let mut f = Vec::with_capacity(9 + payload.len());
        f.extend_from_slice(&len.to_be_bytes()[1..]);
        f.push(kind);
        f.push(flags);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        self.write_all(&f)
    }

    fn read_frame(&mut self) -> Result<(u8, u8, u32, Vec<u8>), WireError> {
        let mut h = [0u8; 9];
        self.sock.read_exact(&mut h).map_err(|e| self.io(e))?;
        let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
        if len > MAX_MESSAGE {
            return Err(WireError::Malformed(format!("a frame of {len} bytes")));
        }
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        self.sock.read_exact(&mut payload).map_err(|e| self.io(e))?;
        Ok((h[3], h[4], stream, payload))
    }

    /// Calls `path` (`/package.Service/Method`) with the encoded `request`
    /// and returns the encoded answer.
    pub fn call(&mut self, path: &str, request: &[u8]) -> Result<Vec<u8>, WireError> {
        let stream = self.next_stream;
        self.next_stream += 2;
        // grpc-go's order of header fields.
        let authority = self.authority.clone();
        let fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", authority.as_str()),
            ("content-type", "application/grpc"),
            ("user-agent", "grpc-go/1.72.2"),
            ("te", "trailers"),
        ];
        let mut block = Vec::new();
        for (name, value) in fields {
            literal(&mut block, name, value);
        }
        self.frame(HEADERS, END_HEADERS, stream, &block)?;
        let mut msg = Vec::with_capacity(5 + request.len());
        msg.push(0); // not compressed
        msg.extend_from_slice(&(request.len() as u32).to_be_bytes());
        msg.extend_from_slice(request);
        self.frame(DATA, END_STREAM, stream, &msg)?;
        self.answer(stream)
    }

    fn answer(&mut self, stream: u32) -> Result<Vec<u8>, WireError> {
        let mut body = Vec::new();
        loop {
            let (kind, flags, id, mut payload) = self.read_frame()?;
            match kind {
                SETTINGS if flags & ACK == 0 => self.frame(SETTINGS, ACK, 0, &[])?,
                PING if flags & ACK == 0 => self.frame(PING, ACK, 0, &payload)?,
                GOAWAY => {
                    let code = payload
                        .get(4..8)
                        .map_or(0, |c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
                    return Err(WireError::GoAway(error_name(code)));
                }
                RST_STREAM if id == stream => {
                    let code = payload
                        .get(..4)
                        .map_or(0, |c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
                    return Err(WireError::Reset(error_name(code), self.authority.clone()));
                }
                DATA if id == stream => {
                    strip_padding(flags, &mut payload)?;
                    body.extend_from_slice(&payload);
                    if body.len() > MAX_MESSAGE {
                        return Err(WireError::Malformed("an answer over 16 MiB".into()));
                    }
                    // Keep the server's windows open for long answers.
                    if !payload.is_empty() {
                        let inc = (payload.len() as u32).to_be_bytes();
                        self.frame(WINDOW_UPDATE, 0, 0, &inc)?;
                        self.frame(WINDOW_UPDATE, 0, stream, &inc)?;
                    }
                    if flags & END_STREAM != 0 {
                        return message(&body);
                    }
                }
                HEADERS | CONTINUATION if id == stream && flags & END_STREAM != 0 => {
                    return if body.is_empty() {
                        Err(WireError::NoMessage)
                    } else {
                        message(&body)
                    };
                }
                _ => {}
            }
        }
    }
}

fn strip_padding(flags: u8, payload: &mut Vec<u8>) -> Result<(), WireError> {
    if flags & PADDED != 0 {
        let pad = *payload
            .first()
            .ok_or_else(|| WireError::Malformed("a padded frame without its length".into()))?
            as usize;
        if pad + 1 > payload.len() {
            return Err(WireError::Malformed("padding longer than the frame".into()));
        }
        payload.truncate(payload.len() - pad);
        payload.remove(0);
    }
    Ok(())
}

/// The one message of a unary answer, without its 5-byte prefix.
fn message(body: &[u8]) -> Result<Vec<u8>, WireError> {
    if body.len() < 5 {
        return Err(WireError::NoMessage);
    }
    if body[0] != 0 {
        return Err(WireError::Malformed("a compressed message".into()));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    body.get(5..5 + len)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| WireError::Malformed(format!("a message of {len} bytes cut short")))
}

/// HPACK "literal header field without indexing, new name" (RFC 7541
/// §6.2.2), strings not Huffman-coded.
fn literal(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0x00);
    string(out, name.as_bytes());
    string(out, value.as_bytes());
}

fn string(out: &mut Vec<u8>, s: &[u8]) {
    integer(out, s.len(), 7, 0x00);
    out.extend_from_slice(s);
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1).
fn integer(out: &mut Vec<u8>, mut v: usize, n: u32, first: u8) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128 + 128) as u8);
        v /= 128;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authority_as_grpc_go_encodes_it() {
        assert_eq!(
            grpc_go_authority(Path::new(
                "/var/lib/kubelet/plugins_registry/gpu.gpuslice.io-reg.sock"
            )),
            "var%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.gpuslice.io-reg.sock"
        );
        assert_eq!(grpc_go_authority(Path::new("/a b/c%")), "a%20b%2Fc%25");
    }

    #[test]
    fn hpack_integers_and_strings() {
        let mut out = Vec::new();
        integer(&mut out, 10, 7, 0);
        assert_eq!(out, [10]);
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        integer(&mut out, 1337, 5, 0);
        assert_eq!(out, [31, 154, 10]);
        let mut out = Vec::new();
        literal(&mut out, "te", "trailers");
        assert_eq!(out, b"\x00\x02te\x08trailers");
    }

    #[test]
    fn a_unary_message_is_unframed() {
        assert_eq!(message(&[0, 0, 0, 0, 2, 7, 8]).unwrap(), [7, 8]);
        assert!(matches!(message(&[0, 0, 0]), Err(WireError::NoMessage)));
        assert!(matches!(
            message(&[0, 0, 0, 0, 9, 1]),
            Err(WireError::Malformed(_))
        ));
    }
}

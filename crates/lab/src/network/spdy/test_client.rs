//! Test fixtures for SPDY sessions, used by this module's tests and port-forward's: a
//! minimal client and header lists.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::frame::{Frame, decode, encode};
use super::header_block::{
    HeaderCompressor, HeaderDecompressor, decode_header_block, encode_header_block,
};

/// `(name, value)` pairs as a header list.
pub(crate) fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// A minimal SPDY client for tests: opens streams, reads frames, with its own header
/// stream in each direction.
pub(crate) struct TestClient {
    pub io: tokio::io::DuplexStream,
    buf: BytesMut,
    compressor: HeaderCompressor,
    decompressor: HeaderDecompressor,
}

impl TestClient {
    /// A session served on one end of an in-memory connection, and the client's end.
    pub fn new(io: tokio::io::DuplexStream) -> TestClient {
        TestClient {
            io,
            buf: BytesMut::new(),
            compressor: HeaderCompressor::default(),
            decompressor: HeaderDecompressor::default(),
        }
    }

    pub async fn send(&mut self, frame: &Frame) {
        let mut out = BytesMut::new();
        encode(frame, &mut out);
        self.io.write_all(&out).await.unwrap();
    }

    pub async fn open(&mut self, stream: u32, headers: &[(&str, &str)]) {
        let block = self
            .compressor
            .compress(&encode_header_block(&pairs(headers)));
        let frame = Frame::SynStream {
            stream,
            associated: 0,
            priority: 0,
            flags: 0,
            headers: Bytes::from(block),
        };
        self.send(&frame).await;
    }

    /// The next frame, its header block decompressed; None at the end of the connection.
    pub async fn next(&mut self) -> Option<(Frame, Vec<(String, String)>)> {
        loop {
            if let Some(frame) = decode(&mut self.buf).unwrap() {
                let headers = match &frame {
                    Frame::SynReply { headers, .. } => {
                        let block = self.decompressor.decompress(headers).unwrap();
                        decode_header_block(&block).unwrap()
                    }
                    _ => Vec::new(),
                };
                return Some((frame, headers));
            }
            self.buf.reserve(64 * 1024);
            if self.io.read_buf(&mut self.buf).await.unwrap() == 0 {
                return None;
            }
        }
    }
}

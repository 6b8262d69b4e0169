//! SPDY/3.1 server sessions: the framing `kubectl port-forward` still speaks to kubelets.
//!
//! Written by hand: SPDY was retired for HTTP/2 in 2015 and no maintained Rust crate speaks
//! it (the crates from that time are abandoned and client-only), while Kubernetes still uses
//! SPDY/3.1 through moby/spdystream for port-forward. Only the subset spdystream uses is here:
//! peer-opened streams, SYN_REPLY, DATA, RST_STREAM, PING and GOAWAY. There is no flow
//! control, as in spdystream: nothing waits for a window and no WINDOW_UPDATE is sent, so large
//! payloads flow at the speed of the connection.
//!
//! The frame codec and the header-block compression are pure (bytes in, bytes out); [`serve`]
//! runs a session on a connection with one task reading frames and one writing them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// The SPDY/3 header-compression dictionary (SPDY/3 draft §2.6.10.1), as spdystream has it.
pub static DICTIONARY: &[u8] = include_bytes!("spdy3_dictionary.bin");

/// The zlib id (Adler-32) of [`DICTIONARY`], which a peer's header stream names.
const DICTIONARY_ID: u32 = 0xe3c6_a7c2;

/// The protocol version this session speaks.
const VERSION: u16 = 3;

/// The largest payload a frame can carry: its length field has 24 bits.
pub const MAX_PAYLOAD: usize = 0xff_ffff;

/// The largest header block accepted once decompressed.
const MAX_HEADER_BLOCK: usize = 64 * 1024;

/// DATA frames a stream's reader may fall behind by before the session stops reading.
const INBOUND_QUEUE: usize = 16;

/// Frames queued for the writer before senders wait.
const OUTBOUND_QUEUE: usize = 64;

mod kind {
    pub const SYN_STREAM: u16 = 1;
    pub const SYN_REPLY: u16 = 2;
    pub const RST_STREAM: u16 = 3;
    pub const SETTINGS: u16 = 4;
    pub const PING: u16 = 6;
    pub const GOAWAY: u16 = 7;
    pub const HEADERS: u16 = 8;
    pub const WINDOW_UPDATE: u16 = 9;
}

/// The FIN flag, on DATA, SYN_STREAM, SYN_REPLY and HEADERS frames.
pub const FLAG_FIN: u8 = 0x01;

/// A RST_STREAM status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RstStatus(pub u32);

impl RstStatus {
    /// The frame broke the protocol.
    pub const PROTOCOL_ERROR: RstStatus = RstStatus(1);
    /// The stream is not accepted (the session is going away).
    pub const REFUSED_STREAM: RstStatus = RstStatus(3);
    /// The stream is no longer needed (what spdystream's `Reset` sends).
    pub const CANCEL: RstStatus = RstStatus(5);
}

/// GOAWAY status: the peer broke the protocol.
const GOAWAY_PROTOCOL_ERROR: u32 = 1;

/// One SPDY/3 frame. Header blocks are kept compressed: their zlib stream spans the session,
/// so only the session can compress or read them, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Stream data; `fin` ends the sender's half of the stream.
    Data { stream: u32, fin: bool, data: Bytes },
    /// The peer opens a stream.
    SynStream {
        stream: u32,
        associated: u32,
        priority: u8,
        flags: u8,
        headers: Bytes,
    },
    /// The answer to a SYN_STREAM.
    SynReply {
        stream: u32,
        flags: u8,
        headers: Bytes,
    },
    /// A stream ends abnormally.
    RstStream { stream: u32, status: u32 },
    /// Session settings (ignored).
    Settings,
    /// A liveness check; the receiver echoes it.
    Ping { id: u32 },
    /// The sender takes no new streams after `last_good`.
    GoAway { last_good: u32, status: u32 },
    /// More headers for a stream.
    Headers {
        stream: u32,
        flags: u8,
        headers: Bytes,
    },
    /// A flow-control window grows (ignored: no flow control here).
    WindowUpdate { stream: u32, delta: u32 },
    /// A control frame of a type this session does not know (ignored, as the draft says).
    Unknown { kind: u16 },
}

/// Why the bytes from a peer are not SPDY/3 this session can follow.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// A control frame of another SPDY version.
    #[error("SPDY version {0} is not supported (only 3)")]
    Version(u16),
    /// A control frame whose payload is too short or long for its type.
    #[error("control frame of type {kind} with a {length}-byte payload")]
    Length { kind: u16, length: usize },
    /// Stream id 0 where a stream is needed.
    #[error("frame of type {kind} on stream 0")]
    ZeroStream { kind: u16 },
    /// A header block that zlib cannot read with the session's stream.
    #[error("header block: zlib: {0}")]
    Compression(String),
    /// A header block that names a dictionary other than SPDY/3's.
    #[error("header block needs dictionary {0:#010x}, not SPDY/3's")]
    Dictionary(u32),
    /// A header block larger than this session accepts once decompressed.
    #[error("header block over {MAX_HEADER_BLOCK} bytes")]
    HeaderBlockTooLarge,
    /// A decompressed header block that is not a list of name/value pairs.
    #[error("malformed header block")]
    HeaderBlock,
}

/// The next whole frame at the start of `buf`, removed from it; `None` until one has arrived.
pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
    if buf.len() < 8 {
        return Ok(None);
    }
    let first = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let flags = buf[4];
    let length = usize::from(buf[5]) << 16 | usize::from(buf[6]) << 8 | usize::from(buf[7]);
    let control = first & 0x8000_0000 != 0;
    let kind = (first & 0xffff) as u16;
    // A bad control-frame header is refused as it comes, not after its payload (up to 16 MiB,
    // which may never come).
    let version = ((first >> 16) & 0x7fff) as u16;
    if control && version != VERSION {
        return Err(FrameError::Version(version));
    }
    let fits = match kind {
        kind::SYN_STREAM => length >= 10,
        kind::SYN_REPLY | kind::HEADERS => length >= 4,
        kind::PING => length == 4,
        kind::RST_STREAM | kind::GOAWAY | kind::WINDOW_UPDATE => length == 8,
        _ => true,
    };
    if control && !fits {
        return Err(FrameError::Length { kind, length });
    }
    if buf.len() < 8 + length {
        buf.reserve(8 + length - buf.len());
        return Ok(None);
    }
    buf.advance(8);
    let mut payload = buf.split_to(length).freeze();
    if !control {
        let stream = first & 0x7fff_ffff;
        if stream == 0 {
            return Err(FrameError::ZeroStream { kind: 0 });
        }
        let fin = flags & FLAG_FIN != 0;
        return Ok(Some(Frame::Data {
            stream,
            fin,
            data: payload,
        }));
    }
    let frame = match kind {
        kind::SYN_STREAM => {
            let stream = payload.get_u32() & 0x7fff_ffff;
            let associated = payload.get_u32() & 0x7fff_ffff;
            let priority = payload.get_u8() >> 5;
            let _slot = payload.get_u8();
            Frame::SynStream {
                stream,
                associated,
                priority,
                flags,
                headers: payload,
            }
        }
        kind::SYN_REPLY | kind::HEADERS => {
            let stream = payload.get_u32() & 0x7fff_ffff;
            if kind == kind::SYN_REPLY {
                Frame::SynReply {
                    stream,
                    flags,
                    headers: payload,
                }
            } else {
                Frame::Headers {
                    stream,
                    flags,
                    headers: payload,
                }
            }
        }
        kind::RST_STREAM => Frame::RstStream {
            stream: payload.get_u32() & 0x7fff_ffff,
            status: payload.get_u32(),
        },
        kind::SETTINGS => Frame::Settings,
        kind::PING => Frame::Ping {
            id: payload.get_u32(),
        },
        kind::GOAWAY => Frame::GoAway {
            last_good: payload.get_u32() & 0x7fff_ffff,
            status: payload.get_u32(),
        },
        kind::WINDOW_UPDATE => Frame::WindowUpdate {
            stream: payload.get_u32() & 0x7fff_ffff,
            delta: payload.get_u32() & 0x7fff_ffff,
        },
        kind => Frame::Unknown { kind },
    };
    if let Frame::SynStream { stream: 0, .. }
    | Frame::SynReply { stream: 0, .. }
    | Frame::Headers { stream: 0, .. }
    | Frame::RstStream { stream: 0, .. } = frame
    {
        return Err(FrameError::ZeroStream { kind });
    }
    Ok(Some(frame))
}

/// Appends `frame` to `out`. A payload over [`MAX_PAYLOAD`] is the caller's mistake (DATA is
/// split before it gets here); it is cut to fit rather than corrupting the stream.
pub fn encode(frame: &Frame, out: &mut BytesMut) {
    fn control(out: &mut BytesMut, kind: u16, flags: u8, length: usize) {
        out.put_u16(0x8000 | VERSION);
        out.put_u16(kind);
        out.put_u32(u32::from(flags) << 24 | length as u32);
    }
    match frame {
        Frame::Data { stream, fin, data } => {
            let data = &data[..data.len().min(MAX_PAYLOAD)];
            out.put_u32(stream & 0x7fff_ffff);
            let flags = if *fin { FLAG_FIN } else { 0 };
            out.put_u32(u32::from(flags) << 24 | data.len() as u32);
            out.put_slice(data);
        }
        Frame::SynStream {
            stream,
            associated,
            priority,
            flags,
            headers,
        } => {
            let headers = &headers[..headers.len().min(MAX_PAYLOAD - 10)];
            control(out, kind::SYN_STREAM, *flags, 10 + headers.len());
            out.put_u32(stream & 0x7fff_ffff);
            out.put_u32(associated & 0x7fff_ffff);
            out.put_u8((priority & 0x07) << 5);
            out.put_u8(0);
            out.put_slice(headers);
        }
        Frame::SynReply {
            stream,
            flags,
            headers,
        }
        | Frame::Headers {
            stream,
            flags,
            headers,
        } => {
            let kind = if matches!(frame, Frame::SynReply { .. }) {
                kind::SYN_REPLY
            } else {
                kind::HEADERS
            };
            let headers = &headers[..headers.len().min(MAX_PAYLOAD - 4)];
            control(out, kind, *flags, 4 + headers.len());
            out.put_u32(stream & 0x7fff_ffff);
            out.put_slice(headers);
        }
        Frame::RstStream { stream, status } => {
            control(out, kind::RST_STREAM, 0, 8);
            out.put_u32(stream & 0x7fff_ffff);
            out.put_u32(*status);
        }
        Frame::Settings => {
            control(out, kind::SETTINGS, 0, 4);
            out.put_u32(0);
        }
        Frame::Ping { id } => {
            control(out, kind::PING, 0, 4);
            out.put_u32(*id);
        }
        Frame::GoAway { last_good, status } => {
            control(out, kind::GOAWAY, 0, 8);
            out.put_u32(last_good & 0x7fff_ffff);
            out.put_u32(*status);
        }
        Frame::WindowUpdate { stream, delta } => {
            control(out, kind::WINDOW_UPDATE, 0, 8);
            out.put_u32(stream & 0x7fff_ffff);
            out.put_u32(delta & 0x7fff_ffff);
        }
        Frame::Unknown { kind } => control(out, *kind, 0, 0),
    }
}

/// An uncompressed header block: the number of pairs, then each name and value with its
/// length (32 bits each). Names are lowercased; several values of a name go NUL-separated.
pub fn encode_header_block(headers: &[(String, String)]) -> Vec<u8> {
    let mut names: Vec<(String, Vec<&str>)> = Vec::new();
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        match names.iter_mut().find(|(n, _)| *n == name) {
            Some((_, values)) => values.push(value),
            None => names.push((name, vec![value])),
        }
    }
    let mut block = Vec::new();
    block.put_u32(names.len() as u32);
    for (name, values) in names {
        let value = values.join("\0");
        block.put_u32(name.len() as u32);
        block.put_slice(name.as_bytes());
        block.put_u32(value.len() as u32);
        block.put_slice(value.as_bytes());
    }
    block
}

/// The name/value pairs of an uncompressed header block, a pair per value.
pub fn decode_header_block(mut block: &[u8]) -> Result<Vec<(String, String)>, FrameError> {
    fn chunk<'a>(block: &mut &'a [u8]) -> Result<&'a [u8], FrameError> {
        if block.len() < 4 {
            return Err(FrameError::HeaderBlock);
        }
        let length = block.get_u32() as usize;
        if block.len() < length {
            return Err(FrameError::HeaderBlock);
        }
        let (chunk, rest) = block.split_at(length);
        *block = rest;
        Ok(chunk)
    }
    if block.len() < 4 {
        return Err(FrameError::HeaderBlock);
    }
    let count = block.get_u32();
    let mut headers = Vec::new();
    for _ in 0..count {
        let name = std::str::from_utf8(chunk(&mut block)?).map_err(|_| FrameError::HeaderBlock)?;
        let value = chunk(&mut block)?;
        if name.is_empty() {
            return Err(FrameError::HeaderBlock);
        }
        for value in value.split(|b| *b == 0) {
            let value = String::from_utf8_lossy(value).into_owned();
            headers.push((name.to_ascii_lowercase(), value));
        }
    }
    Ok(headers)
}

/// The compressing side of a session's header stream: one zlib stream with the SPDY/3
/// dictionary, each block ending at a sync flush (as Go's framer writes them).
pub struct HeaderCompressor(Compress);

impl Default for HeaderCompressor {
    fn default() -> Self {
        let mut zlib = Compress::new(Compression::best(), true);
        // A fresh stream always takes a dictionary.
        zlib.set_dictionary(DICTIONARY)
            .expect("a new zlib stream takes a dictionary");
        HeaderCompressor(zlib)
    }
}

impl HeaderCompressor {
    /// `block` compressed, ready for a frame; the stream carries on for the next block.
    pub fn compress(&mut self, block: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(block.len() / 2 + 64);
        let start = self.0.total_in();
        loop {
            let consumed = (self.0.total_in() - start) as usize;
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(256));
            }
            // Compressing into memory cannot fail: the stream is ours and never finished.
            let _ = self
                .0
                .compress_vec(&block[consumed..], &mut out, FlushCompress::Sync);
            // The flush is complete once all input is in and output space is left over.
            let all_in = (self.0.total_in() - start) as usize == block.len();
            if all_in && out.len() < out.capacity() {
                return out;
            }
        }
    }
}

/// The decompressing side of a session's header stream.
pub struct HeaderDecompressor(Decompress);

impl Default for HeaderDecompressor {
    fn default() -> Self {
        HeaderDecompressor(Decompress::new(true))
    }
}

impl HeaderDecompressor {
    /// The uncompressed header block of the next frame, `compressed` being its whole block.
    pub fn decompress(&mut self, compressed: &[u8]) -> Result<Vec<u8>, FrameError> {
        let mut out = Vec::with_capacity(compressed.len() * 4 + 64);
        let start = self.0.total_in();
        loop {
            let consumed = (self.0.total_in() - start) as usize;
            if out.capacity() - out.len() < 64 {
                if out.len() >= MAX_HEADER_BLOCK {
                    return Err(FrameError::HeaderBlockTooLarge);
                }
                out.reserve(out.capacity().max(256));
            }
            let (before_in, before_out) = (self.0.total_in(), self.0.total_out());
            match self
                .0
                .decompress_vec(&compressed[consumed..], &mut out, FlushDecompress::Sync)
            {
                Ok(Status::Ok | Status::BufError | Status::StreamEnd) => {}
                Err(e) => match e.needs_dictionary() {
                    Some(DICTIONARY_ID) => {
                        self.0
                            .set_dictionary(DICTIONARY)
                            .map_err(|e| FrameError::Compression(e.to_string()))?;
                        continue;
                    }
                    Some(other) => return Err(FrameError::Dictionary(other)),
                    None => return Err(FrameError::Compression(e.to_string())),
                },
            }
            let all_in = (self.0.total_in() - start) as usize == compressed.len();
            if all_in && out.len() < out.capacity() {
                break;
            }
            let progressed = self.0.total_in() != before_in || self.0.total_out() != before_out;
            if !progressed && out.len() < out.capacity() {
                // Input left that zlib will not take: the block ends mid-stream.
                return Err(FrameError::Compression("truncated header block".into()));
            }
        }
        if out.len() > MAX_HEADER_BLOCK {
            return Err(FrameError::HeaderBlockTooLarge);
        }
        Ok(out)
    }
}

/// Why a stream can no longer be read or written.
#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
pub enum StreamError {
    /// The peer reset the stream (RST_STREAM).
    #[error("stream reset by the peer")]
    Reset,
    /// The session ended (the connection closed, or a protocol error).
    #[error("SPDY session closed")]
    SessionClosed,
    /// This side already ended its half of the stream.
    #[error("stream already finished")]
    Finished,
}

/// What the session hands a stream's reader.
enum Inbound {
    Data(Bytes),
    Fin,
}

/// What the writer task sends: frames, compressed in the order they are written.
enum Outbound {
    Reply {
        stream: u32,
    },
    Frame(Frame),
    /// Write what came before, then end the connection.
    Close,
}

/// A stream the peer opened, not yet answered: accept it (SYN_REPLY) or refuse it
/// (RST_STREAM).
pub struct IncomingStream {
    id: u32,
    headers: Vec<(String, String)>,
    inbound: mpsc::Receiver<Inbound>,
    outbound: mpsc::Sender<Outbound>,
    reset: Arc<AtomicBool>,
}

impl IncomingStream {
    /// The stream id (odd: peer-opened).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The headers of its SYN_STREAM, names lowercase, a pair per value.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Answers with a SYN_REPLY (no headers), queued before anything written on the stream.
    pub async fn accept(self) -> Result<Stream, StreamError> {
        self.outbound
            .send(Outbound::Reply { stream: self.id })
            .await
            .map_err(|_| StreamError::SessionClosed)?;
        Ok(Stream {
            id: self.id,
            headers: self.headers,
            reader: StreamReader {
                inbound: self.inbound,
                reset: self.reset.clone(),
                finished: false,
            },
            writer: StreamWriter {
                id: self.id,
                outbound: self.outbound,
                reset: self.reset,
                finished: false,
            },
        })
    }

    /// Refuses the stream with a RST_STREAM of `status`.
    pub async fn refuse(self, status: RstStatus) {
        let _ = self
            .outbound
            .send(Outbound::Frame(Frame::RstStream {
                stream: self.id,
                status: status.0,
            }))
            .await;
    }
}

/// An accepted stream: what the peer sends, and a handle to send back.
pub struct Stream {
    /// The stream id.
    pub id: u32,
    /// The headers of its SYN_STREAM.
    pub headers: Vec<(String, String)>,
    /// The peer's half.
    pub reader: StreamReader,
    /// This side's half.
    pub writer: StreamWriter,
}

/// The data the peer sends on a stream.
pub struct StreamReader {
    inbound: mpsc::Receiver<Inbound>,
    reset: Arc<AtomicBool>,
    finished: bool,
}

impl StreamReader {
    /// The next data; `Ok(None)` once the peer has finished its half (FIN), for good.
    pub async fn read(&mut self) -> Result<Option<Bytes>, StreamError> {
        if self.finished {
            return Ok(None);
        }
        match self.inbound.recv().await {
            Some(Inbound::Data(data)) => Ok(Some(data)),
            Some(Inbound::Fin) => {
                self.finished = true;
                Ok(None)
            }
            None if self.reset.load(Ordering::SeqCst) => Err(StreamError::Reset),
            None => Err(StreamError::SessionClosed),
        }
    }
}

/// Sends on a stream.
pub struct StreamWriter {
    id: u32,
    outbound: mpsc::Sender<Outbound>,
    reset: Arc<AtomicBool>,
    finished: bool,
}

impl StreamWriter {
    /// Sends `data` (split into frames as large as SPDY allows).
    pub async fn send(&mut self, mut data: Bytes) -> Result<(), StreamError> {
        while !data.is_empty() {
            let chunk = data.split_to(data.len().min(MAX_PAYLOAD));
            self.frame(false, chunk).await?;
        }
        Ok(())
    }

    /// Ends this side's half of the stream: an empty DATA frame with FIN.
    pub async fn finish(&mut self) -> Result<(), StreamError> {
        self.frame(true, Bytes::new()).await?;
        self.finished = true;
        Ok(())
    }

    /// Whether this side has finished its half.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Whether the peer has reset the stream.
    pub fn is_reset(&self) -> bool {
        self.reset.load(Ordering::SeqCst)
    }

    /// Resets the stream (RST_STREAM with `status`): neither side sends on it any more.
    pub async fn reset(&mut self, status: RstStatus) {
        if self.is_reset() {
            return;
        }
        self.finished = true;
        let _ = self
            .outbound
            .send(Outbound::Frame(Frame::RstStream {
                stream: self.id,
                status: status.0,
            }))
            .await;
    }

    async fn frame(&mut self, fin: bool, data: Bytes) -> Result<(), StreamError> {
        if self.finished {
            return Err(StreamError::Finished);
        }
        if self.is_reset() {
            return Err(StreamError::Reset);
        }
        let frame = Frame::Data {
            stream: self.id,
            fin,
            data,
        };
        self.outbound
            .send(Outbound::Frame(frame))
            .await
            .map_err(|_| StreamError::SessionClosed)
    }
}

/// Runs a server session on `io` (an upgraded connection): the streams the peer opens come
/// out of the returned receiver, which closes when the session takes no more (the connection
/// closed, the peer sent GOAWAY, or broke the protocol). Streams end with the connection.
pub fn serve<IO>(io: IO) -> mpsc::Receiver<IncomingStream>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (read, write) = tokio::io::split(io);
    let (outbound, outbound_rx) = mpsc::channel(OUTBOUND_QUEUE);
    let (incoming, incoming_rx) = mpsc::channel(8);
    tokio::spawn(write_frames(write, outbound_rx));
    tokio::spawn(read_frames(read, outbound, incoming));
    incoming_rx
}

/// The writer task: encodes what is queued, in order, until told to close or every sender is
/// gone. It owns the compressing side of the header stream.
async fn write_frames<W: AsyncWrite + Unpin>(mut io: W, mut queue: mpsc::Receiver<Outbound>) {
    let mut compressor = HeaderCompressor::default();
    let empty_block = encode_header_block(&[]);
    let mut buf = BytesMut::new();
    let mut batch = Vec::with_capacity(OUTBOUND_QUEUE);
    let mut close = false;
    while !close && queue.recv_many(&mut batch, OUTBOUND_QUEUE).await > 0 {
        for item in batch.drain(..) {
            match item {
                Outbound::Reply { stream } => {
                    let headers = Bytes::from(compressor.compress(&empty_block));
                    let reply = Frame::SynReply {
                        stream,
                        flags: 0,
                        headers,
                    };
                    encode(&reply, &mut buf);
                }
                Outbound::Frame(frame) => encode(&frame, &mut buf),
                Outbound::Close => {
                    close = true;
                    break;
                }
            }
        }
        if io.write_all(&buf).await.is_err() || io.flush().await.is_err() {
            return;
        }
        buf.clear();
    }
    let _ = io.shutdown().await;
}

/// A stream the session knows: where its data goes, and whether the peer reset it.
struct Known {
    /// None once the peer has finished its half, or the reader is gone.
    inbound: Option<mpsc::Sender<Inbound>>,
    reset: Arc<AtomicBool>,
}

/// The reader task's state: the streams, and the decompressing side of the header stream.
struct Reading {
    streams: HashMap<u32, Known>,
    last_stream: u32,
    /// Where new streams go; None once the peer has said GOAWAY.
    incoming: Option<mpsc::Sender<IncomingStream>>,
    outbound: mpsc::Sender<Outbound>,
    headers: HeaderDecompressor,
}

/// The reader task: reads frames until the connection ends or the peer breaks the protocol
/// (answered with GOAWAY), then closes the session.
async fn read_frames<R: AsyncRead + Unpin>(
    mut io: R,
    outbound: mpsc::Sender<Outbound>,
    incoming: mpsc::Sender<IncomingStream>,
) {
    let mut state = Reading {
        streams: HashMap::new(),
        last_stream: 0,
        incoming: Some(incoming),
        outbound,
        headers: HeaderDecompressor::default(),
    };
    let mut buf = BytesMut::with_capacity(64 * 1024);
    'session: loop {
        loop {
            match decode(&mut buf) {
                Ok(Some(frame)) => {
                    if let Err(e) = state.on_frame(frame).await {
                        tracing::debug!(error = %e, "SPDY session: protocol error");
                        state.go_away(GOAWAY_PROTOCOL_ERROR).await;
                        break 'session;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "SPDY session: bad frame");
                    state.go_away(GOAWAY_PROTOCOL_ERROR).await;
                    break 'session;
                }
            }
        }
        buf.reserve(16 * 1024);
        match io.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    // Dropping the stream senders ends every stream's reader with `SessionClosed`.
    state.streams.clear();
    state.incoming = None;
    let _ = state.outbound.send(Outbound::Close).await;
}

impl Reading {
    async fn on_frame(&mut self, frame: Frame) -> Result<(), FrameError> {
        match frame {
            Frame::SynStream {
                stream,
                flags,
                headers,
                ..
            } => {
                // Read every header block, wanted or not: the zlib stream spans them all.
                let block = self.headers.decompress(&headers)?;
                self.on_syn_stream(stream, flags, decode_header_block(&block))
                    .await;
            }
            Frame::SynReply { headers, .. } | Frame::Headers { headers, .. } => {
                self.headers.decompress(&headers)?;
            }
            Frame::Data { stream, fin, data } => self.on_data(stream, fin, data).await,
            Frame::RstStream { stream, .. } => {
                if let Some(known) = self.streams.get_mut(&stream) {
                    known.reset.store(true, Ordering::SeqCst);
                    known.inbound = None;
                }
            }
            Frame::Ping { id } => self.send(Frame::Ping { id }).await,
            Frame::GoAway { .. } => {
                // No new streams; those open carry on until the connection ends.
                self.incoming = None;
            }
            Frame::Settings | Frame::WindowUpdate { .. } | Frame::Unknown { .. } => {}
        }
        Ok(())
    }

    async fn on_syn_stream(
        &mut self,
        stream: u32,
        flags: u8,
        headers: Result<Vec<(String, String)>, FrameError>,
    ) {
        // Peer-opened ids are odd and always grow (spdystream resets any other).
        let Ok(headers) = headers else {
            return self.reset(stream, RstStatus::PROTOCOL_ERROR).await;
        };
        if stream.is_multiple_of(2) || stream <= self.last_stream {
            return self.reset(stream, RstStatus::PROTOCOL_ERROR).await;
        }
        self.last_stream = stream;
        let Some(incoming) = self.incoming.clone() else {
            return self.reset(stream, RstStatus::REFUSED_STREAM).await;
        };
        // Forget streams nobody holds any more.
        self.streams.retain(|_, known| {
            Arc::strong_count(&known.reset) > 1
                || known.inbound.as_ref().is_some_and(|tx| !tx.is_closed())
        });
        let (tx, rx) = mpsc::channel(INBOUND_QUEUE);
        let reset = Arc::new(AtomicBool::new(false));
        let mut known = Known {
            inbound: Some(tx),
            reset: reset.clone(),
        };
        if flags & FLAG_FIN != 0 {
            // The peer sends nothing on it: the queue is empty, this cannot wait.
            let _ = known.inbound.take().map(|tx| tx.try_send(Inbound::Fin));
        }
        self.streams.insert(stream, known);
        let offered = IncomingStream {
            id: stream,
            headers,
            inbound: rx,
            outbound: self.outbound.clone(),
            reset,
        };
        if incoming.send(offered).await.is_err() {
            self.incoming = None;
            self.streams.remove(&stream);
            self.reset(stream, RstStatus::REFUSED_STREAM).await;
        }
    }

    async fn on_data(&mut self, stream: u32, fin: bool, data: Bytes) {
        // Data on a stream no longer read (or never opened) is dropped, as spdystream does.
        let Some(known) = self.streams.get_mut(&stream) else {
            return;
        };
        let Some(tx) = known.inbound.as_ref() else {
            return;
        };
        // Waiting here holds up the whole session: that is the back-pressure (no flow control).
        if !data.is_empty() && tx.send(Inbound::Data(data)).await.is_err() {
            known.inbound = None;
            return;
        }
        if fin {
            let _ = tx.send(Inbound::Fin).await;
            known.inbound = None;
        }
    }

    async fn reset(&self, stream: u32, status: RstStatus) {
        let status = status.0;
        self.send(Frame::RstStream { stream, status }).await;
    }

    async fn go_away(&self, status: u32) {
        let last_good = self.last_stream;
        self.send(Frame::GoAway { last_good, status }).await;
    }

    async fn send(&self, frame: Frame) {
        let _ = self.outbound.send(Outbound::Frame(frame)).await;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn the_dictionary_is_spdy3s() {
        assert_eq!(DICTIONARY.len(), 1423);
        let mut check = flate2::Decompress::new(true);
        // The zlib header Go writes names the dictionary by its Adler-32: a stream of
        // ours with it set must name the same id.
        let mut c = HeaderCompressor::default();
        let out = c.compress(b"x");
        let id = u32::from_be_bytes([out[2], out[3], out[4], out[5]]);
        assert_eq!(id, DICTIONARY_ID);
        assert_eq!(adler32(DICTIONARY), DICTIONARY_ID);
        let mut sink = Vec::with_capacity(16);
        let e = check
            .decompress_vec(&out, &mut sink, FlushDecompress::Sync)
            .unwrap_err();
        assert_eq!(e.needs_dictionary(), Some(DICTIONARY_ID));
    }

    fn adler32(data: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for byte in data {
            a = (a + u32::from(*byte)) % 65521;
            b = (b + a) % 65521;
        }
        b << 16 | a
    }

    fn round_trip(frame: Frame) {
        let mut buf = BytesMut::new();
        encode(&frame, &mut buf);
        // Byte by byte: nothing comes out before the frame is whole.
        let whole = buf.split().freeze();
        let mut partial = BytesMut::new();
        for (i, byte) in whole.iter().enumerate() {
            assert_eq!(decode(&mut partial), Ok(None), "{frame:?} at byte {i}");
            partial.put_u8(*byte);
        }
        assert_eq!(decode(&mut partial), Ok(Some(frame.clone())));
        assert!(partial.is_empty(), "{frame:?} left bytes");
    }

    #[test]
    fn frames_round_trip() {
        let frames = [
            Frame::Data {
                stream: 1,
                fin: false,
                data: Bytes::from_static(b"hello"),
            },
            Frame::Data {
                stream: 0x7fff_ffff,
                fin: true,
                data: Bytes::new(),
            },
            Frame::SynStream {
                stream: 3,
                associated: 0,
                priority: 7,
                flags: FLAG_FIN | 0x02,
                headers: Bytes::from_static(b"\x78\xbb block"),
            },
            Frame::SynReply {
                stream: 5,
                flags: 0,
                headers: Bytes::from_static(b"block"),
            },
            Frame::RstStream {
                stream: 7,
                status: RstStatus::CANCEL.0,
            },
            Frame::Ping { id: 9 },
            Frame::GoAway {
                last_good: 11,
                status: GOAWAY_PROTOCOL_ERROR,
            },
            Frame::Headers {
                stream: 13,
                flags: FLAG_FIN,
                headers: Bytes::from_static(b"more"),
            },
            Frame::WindowUpdate {
                stream: 15,
                delta: 65536,
            },
            Frame::Unknown { kind: 42 },
        ];
        for frame in frames {
            round_trip(frame);
        }
    }

    #[test]
    fn malformed_frames_are_errors_not_panics() {
        let cases: &[(&[u8], FrameError)] = &[
            // Version 2.
            (
                b"\x80\x02\x00\x06\x00\x00\x00\x04\x00\x00\x00\x01",
                FrameError::Version(2),
            ),
            // A PING of 3 bytes.
            (
                b"\x80\x03\x00\x06\x00\x00\x00\x03\x00\x00\x01",
                FrameError::Length { kind: 6, length: 3 },
            ),
            // A PING claiming 1 MiB: refused from its header, before any payload.
            (
                b"\x80\x03\x00\x06\x00\x10\x00\x00",
                FrameError::Length {
                    kind: 6,
                    length: 0x10_0000,
                },
            ),
            // A SYN_STREAM too short for its fixed fields.
            (
                b"\x80\x03\x00\x01\x00\x00\x00\x02\x00\x01",
                FrameError::Length { kind: 1, length: 2 },
            ),
            // DATA on stream 0.
            (
                b"\x00\x00\x00\x00\x01\x00\x00\x00",
                FrameError::ZeroStream { kind: 0 },
            ),
        ];
        for (bytes, want) in cases {
            let mut buf = BytesMut::from(*bytes);
            assert_eq!(decode(&mut buf).as_ref(), Err(want), "{bytes:?}");
        }
        assert_eq!(
            decode_header_block(b"\x00\x00\x00\x01\x00\x00\x00\x09ab"),
            Err(FrameError::HeaderBlock)
        );
        assert_eq!(
            decode_header_block(b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00"),
            Err(FrameError::HeaderBlock)
        );
        let mut inflater = HeaderDecompressor::default();
        assert!(inflater.decompress(b"not zlib at all").is_err());
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn header_blocks_share_one_zlib_stream_each_way() {
        let first = pairs(&[
            ("streamType", "error"),
            ("port", "8080"),
            ("requestid", "0"),
        ]);
        let second = pairs(&[
            ("streamtype", "data"),
            ("port", "8080"),
            ("requestid", "0"),
            ("x-many", "a"),
            ("x-many", "b"),
        ]);
        let mut compressor = HeaderCompressor::default();
        let mut decompressor = HeaderDecompressor::default();
        let one = compressor.compress(&encode_header_block(&first));
        let two = compressor.compress(&encode_header_block(&second));
        // The second block relies on the first: alone, it is not a zlib stream.
        assert!(HeaderDecompressor::default().decompress(&two).is_err());
        let got = decode_header_block(&decompressor.decompress(&one).unwrap()).unwrap();
        assert_eq!(
            got,
            pairs(&[
                ("streamtype", "error"),
                ("port", "8080"),
                ("requestid", "0")
            ])
        );
        let got = decode_header_block(&decompressor.decompress(&two).unwrap()).unwrap();
        assert_eq!(got, second);
    }

    #[test]
    fn a_header_block_too_large_once_decompressed_is_refused() {
        let huge = pairs(&[("x-big", &"a".repeat(MAX_HEADER_BLOCK + 1))]);
        let mut compressor = HeaderCompressor::default();
        let block = compressor.compress(&encode_header_block(&huge));
        assert!(block.len() < 2048, "repetitive text compresses well");
        assert_eq!(
            HeaderDecompressor::default().decompress(&block),
            Err(FrameError::HeaderBlockTooLarge)
        );
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

    #[tokio::test]
    async fn a_ping_is_echoed_and_garbage_ends_the_session() {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let mut incoming = serve(server);
        let mut client = TestClient::new(client);
        client.send(&Frame::Ping { id: 1 }).await;
        assert_eq!(client.next().await.unwrap().0, Frame::Ping { id: 1 });
        client
            .io
            .write_all(b"\x80\x07\x00\x42garbage!")
            .await
            .unwrap();
        assert_eq!(
            client.next().await.unwrap().0,
            Frame::GoAway {
                last_good: 0,
                status: GOAWAY_PROTOCOL_ERROR
            }
        );
        assert!(client.next().await.is_none(), "the connection ends");
        assert!(incoming.recv().await.is_none());
    }

    #[tokio::test]
    async fn streams_are_replied_to_and_carry_data_both_ways() {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let mut incoming = serve(server);
        let mut client = TestClient::new(client);
        client.open(1, &[("x-name", "one")]).await;
        let offered = incoming.recv().await.unwrap();
        assert_eq!((offered.id(), offered.header("X-Name")), (1, Some("one")));
        let mut stream = offered.accept().await.unwrap();
        let (reply, headers) = client.next().await.unwrap();
        assert!(matches!(
            reply,
            Frame::SynReply {
                stream: 1,
                flags: 0,
                ..
            }
        ));
        assert!(headers.is_empty());

        client
            .send(&Frame::Data {
                stream: 1,
                fin: true,
                data: Bytes::from_static(b"ping"),
            })
            .await;
        assert_eq!(
            stream.reader.read().await,
            Ok(Some(Bytes::from_static(b"ping")))
        );
        assert_eq!(stream.reader.read().await, Ok(None), "FIN is a half-close");
        stream
            .writer
            .send(Bytes::from_static(b"pong"))
            .await
            .unwrap();
        stream.writer.finish().await.unwrap();
        let (data, _) = client.next().await.unwrap();
        assert_eq!(
            data,
            Frame::Data {
                stream: 1,
                fin: false,
                data: Bytes::from_static(b"pong")
            }
        );
        let (fin, _) = client.next().await.unwrap();
        assert_eq!(
            fin,
            Frame::Data {
                stream: 1,
                fin: true,
                data: Bytes::new()
            }
        );

        // A stream the peer resets reads as reset, not finished, and takes no more data.
        client.open(3, &[]).await;
        let mut stream = incoming.recv().await.unwrap().accept().await.unwrap();
        client.next().await.unwrap();
        client
            .send(&Frame::RstStream {
                stream: 3,
                status: RstStatus::CANCEL.0,
            })
            .await;
        assert_eq!(stream.reader.read().await, Err(StreamError::Reset));
        assert_eq!(
            stream.writer.send(Bytes::from_static(b"late")).await,
            Err(StreamError::Reset)
        );

        // A stream id that does not grow is refused.
        client.open(3, &[]).await;
        let (rst, _) = client.next().await.unwrap();
        assert_eq!(
            rst,
            Frame::RstStream {
                stream: 3,
                status: RstStatus::PROTOCOL_ERROR.0
            }
        );

        // After GOAWAY no stream is offered; open streams end with the connection.
        client.open(5, &[]).await;
        let mut open = incoming.recv().await.unwrap().accept().await.unwrap();
        client.next().await.unwrap();
        // Status 0: a normal end.
        let go_away = Frame::GoAway {
            last_good: 5,
            status: 0,
        };
        client.send(&go_away).await;
        assert!(incoming.recv().await.is_none());
        drop(client);
        assert_eq!(open.reader.read().await, Err(StreamError::SessionClosed));
    }
}

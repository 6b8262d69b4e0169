//! SPDY/3 frames, pure: the frame types this session knows, and their codec (bytes in,
//! frames out, and back). Header blocks stay compressed here ([`super::header_block`]).

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The protocol version this session speaks.
const VERSION: u16 = 3;

/// The largest payload a frame can carry: its length field has 24 bits.
pub const MAX_PAYLOAD: usize = 0xff_ffff;

/// The largest header block accepted once decompressed.
pub(super) const MAX_HEADER_BLOCK: usize = 64 * 1024;

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
pub(super) const GOAWAY_PROTOCOL_ERROR: u32 = 1;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::spdy::header_block::{HeaderDecompressor, decode_header_block};

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
}

//! The streams of a SPDY session as its user holds them: one offered by the peer (accept or
//! refuse), and an accepted one's reading and writing halves. The session's tasks
//! ([`super::session`]) move their data.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::frame::{Frame, MAX_PAYLOAD, RstStatus};

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
pub(super) enum Inbound {
    Data(Bytes),
    Fin,
}

/// What the writer task sends: frames, compressed in the order they are written.
pub(super) enum Outbound {
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
    pub(super) id: u32,
    pub(super) headers: Vec<(String, String)>,
    pub(super) inbound: mpsc::Receiver<Inbound>,
    pub(super) outbound: mpsc::Sender<Outbound>,
    pub(super) reset: Arc<AtomicBool>,
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

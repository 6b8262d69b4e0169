//! A SPDY/3.1 server session on a connection: one task reading frames (and offering the
//! streams the peer opens), one writing them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::frame::{FLAG_FIN, Frame, FrameError, GOAWAY_PROTOCOL_ERROR, RstStatus, decode, encode};
use super::header_block::{
    HeaderCompressor, HeaderDecompressor, decode_header_block, encode_header_block,
};
use super::stream::{Inbound, IncomingStream, Outbound};

/// DATA frames a stream's reader may fall behind by before the session stops reading.
const INBOUND_QUEUE: usize = 16;

/// Frames queued for the writer before senders wait.
const OUTBOUND_QUEUE: usize = 64;

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
mod tests {
    use super::*;
    use crate::network::spdy::stream::StreamError;
    use crate::network::spdy::test_client::TestClient;

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

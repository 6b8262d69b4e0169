//! SPDY/3.1 server sessions: the framing `kubectl port-forward` still speaks to kubelets.
//!
//! Written by hand: SPDY was retired for HTTP/2 in 2015 and no maintained Rust crate speaks
//! it (the crates from that time are abandoned and client-only), while Kubernetes still uses
//! SPDY/3.1 through moby/spdystream for port-forward. Only the subset spdystream uses is here:
//! peer-opened streams, SYN_REPLY, DATA, RST_STREAM, PING and GOAWAY. There is no flow
//! control, as in spdystream: nothing waits for a window and no WINDOW_UPDATE is sent, so large
//! payloads flow at the speed of the connection.
//!
//! The frame codec ([`frame`]) and the header-block compression ([`header_block`]) are pure
//! (bytes in, bytes out); [`serve`] ([`session`]) runs a session on a connection with one task
//! reading frames and one writing them, and hands out its [`stream`]s.

pub mod frame;
pub mod header_block;
pub mod session;
pub mod stream;
#[cfg(test)]
pub(crate) mod test_client;

pub use frame::{FLAG_FIN, Frame, FrameError, MAX_PAYLOAD, RstStatus, decode, encode};
pub use header_block::{
    DICTIONARY, HeaderCompressor, HeaderDecompressor, decode_header_block, encode_header_block,
};
pub use session::serve;
pub use stream::{IncomingStream, Stream, StreamError, StreamReader, StreamWriter};

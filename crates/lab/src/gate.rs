//! A TCP gate: forwards 127.0.0.1:<port> to a target and can be closed and reopened, to cut a
//! network path (e.g. a consumer's link to a provider's API server) in partition tests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A closable TCP forwarder; dropping it stops forwarding.
pub struct TcpGate {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
    /// Bumped on every close: live connections end when they see it change.
    generation: watch::Sender<u64>,
    acceptor: JoinHandle<()>,
}

impl TcpGate {
    /// Listens on 127.0.0.1 (a free port) and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<TcpGate> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let open = Arc::new(AtomicBool::new(true));
        let (generation, _) = watch::channel(0u64);
        let acceptor = tokio::spawn(accept(listener, target, open.clone(), generation.clone()));
        Ok(TcpGate {
            addr,
            open,
            generation,
            acceptor,
        })
    }

    /// The gate's local address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port>`: the gate as an API server URL.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Drops every live connection and refuses new ones until [`TcpGate::open`].
    pub fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Forwards new connections again.
    pub fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }

    /// Whether the gate forwards.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }
}

impl Drop for TcpGate {
    fn drop(&mut self) {
        self.close();
        self.acceptor.abort();
    }
}

async fn accept(
    listener: TcpListener,
    target: SocketAddr,
    open: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        if !open.load(Ordering::SeqCst) {
            // Refused: the peer sees the connection end at once.
            drop(inbound);
            continue;
        }
        let mut closed = generation.subscribe();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(target).await else {
                return;
            };
            let mut inbound = inbound;
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                _ = closed.changed() => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream) -> bool {
        if s.write_all(b"ping").await.is_err() {
            return false;
        }
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.is_ok() && &buf == b"ping"
    }

    #[tokio::test]
    async fn closes_live_connections_refuses_new_ones_and_reopens() {
        let gate = TcpGate::start(echo_server().await).await.unwrap();
        let mut live = TcpStream::connect(gate.addr()).await.unwrap();
        assert!(roundtrip(&mut live).await, "open gate forwards");
        gate.close();
        assert!(!roundtrip(&mut live).await, "live connection dropped");
        let mut fresh = TcpStream::connect(gate.addr()).await.unwrap();
        assert!(!roundtrip(&mut fresh).await, "new connection refused");
        gate.open();
        let mut again = TcpStream::connect(gate.addr()).await.unwrap();
        assert!(roundtrip(&mut again).await, "reopened gate forwards");
        assert!(gate.url().starts_with("https://127.0.0.1:"));
    }
}

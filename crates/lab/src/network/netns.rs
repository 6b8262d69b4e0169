//! Entering network namespaces. Sockets the lab needs inside a namespace are created on a
//! dedicated thread that has entered it (namespaces belong to threads; a socket stays in
//! the namespace it was created in), then handed to the async runtime. Async worker threads
//! never change namespace.

use std::os::fd::AsFd;
use std::path::PathBuf;

/// Where `ip netns` keeps the namespace called `name`.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

/// Runs `f` on a fresh thread that has entered the network namespace `name` (as named by
/// `ip netns`), and returns its result.
pub fn run_in<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let path = path(name);
    std::thread::Builder::new()
        .name("lab-netns".into())
        .spawn(move || {
            let file = std::fs::File::open(&path).map_err(|e| {
                std::io::Error::new(e.kind(), format!("opening {}: {e}", path.display()))
            })?;
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| std::io::Error::other(format!("entering {}: {e}", path.display())))?;
            f()
        })?
        .join()
        .map_err(|_| std::io::Error::other("network namespace thread panicked"))?
}

/// [`run_in`] from async code: the namespace thread is waited for on the blocking pool.
pub async fn run_in_async<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let name = name.to_string();
    tokio::task::spawn_blocking(move || run_in(&name, f))
        .await
        .map_err(|e| std::io::Error::other(format!("network namespace task: {e}")))?
}

/// A TCP listener bound to `addr` inside namespace `name`, ready for tokio.
pub async fn tcp_listener(
    name: &str,
    addr: std::net::SocketAddr,
) -> std::io::Result<tokio::net::TcpListener> {
    let std = run_in_async(name, move || {
        let l = std::net::TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .await?;
    tokio::net::TcpListener::from_std(std)
}

/// A UDP socket bound to `addr` inside namespace `name`, ready for tokio.
pub async fn udp_socket(
    name: &str,
    addr: std::net::SocketAddr,
) -> std::io::Result<tokio::net::UdpSocket> {
    let std = run_in_async(name, move || {
        let s = std::net::UdpSocket::bind(addr)?;
        s.set_nonblocking(true)?;
        Ok(s)
    })
    .await?;
    tokio::net::UdpSocket::from_std(std)
}

/// A TCP connection to `addr` made from inside namespace `name` (the socket is created in
/// the namespace; the connect itself runs on the runtime).
pub async fn tcp_connect(
    name: &str,
    addr: std::net::SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let v4 = addr.is_ipv4();
    // A TcpSocket is a plain socket until it connects: it can be made on the namespace's
    // thread and connected from the runtime.
    let socket = run_in_async(name, move || {
        if v4 {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        }
    })
    .await?;
    socket.connect(addr).await
}

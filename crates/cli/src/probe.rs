//! `tandem probe`: the capability-free in-cluster role of Tandem's image that `tandem check`
//! runs on both sides of a peering (the one role a twin namespace may run: it holds no
//! credential and no capability).
//!
//! - `--serve=PORT` answers every HTTP GET with who it is and who asked, as JSON, until
//!   stopped;
//! - `--fetch=NAME=URL` (repeatable) fetches each `http://` URL until it answers or
//!   `--within` seconds have passed, prints one JSON line per URL (`check`, `url`, `ok`, and
//!   `ms` and `answer`, or `error` and `attempts`), and exits 0: the verdicts are data, which
//!   `tandem check` reads from the pod's log.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use serde_json::{Value, json};

/// Run the connectivity probe `tandem check` starts in pods (in-cluster only).
#[derive(clap::Args)]
#[command(
    after_help = "Example (what `tandem check` runs in its pods):\n  tandem probe --serve=8080\n  \
                  tandem probe --fetch=pod=http://10.244.1.7:8080/ --within=60"
)]
pub struct Args {
    /// Answer HTTP on this port: `{"pod": HOSTNAME, "client": "<ip>"}`.
    #[arg(
        long,
        value_name = "PORT",
        conflicts_with = "fetch",
        required_unless_present = "fetch"
    )]
    serve: Option<u16>,
    /// Fetch URL, reported under NAME (repeatable).
    #[arg(long, value_name = "NAME=URL", value_parser = name_and_url)]
    fetch: Vec<(String, String)>,
    /// How long each fetch keeps trying, in seconds (routes may still be converging).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    within: u64,
}

fn name_and_url(s: &str) -> Result<(String, String), String> {
    let (name, url) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=URL"))?;
    if !url.starts_with("http://") {
        return Err(format!("{url:?}: only http:// URLs are fetched"));
    }
    url.parse::<http::Uri>()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    Ok((name.to_string(), url.to_string()))
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if let Some(port) = args.serve {
        return serve(port).await;
    }
    let within = Duration::from_secs(args.within);
    let verdicts = futures::future::join_all(
        args.fetch
            .iter()
            .map(|(name, url)| fetch_until(name, url, within)),
    )
    .await;
    for verdict in verdicts {
        println!("{verdict}");
    }
    Ok(())
}

/// Who this pod is: its hostname (kubelet sets it to the pod's name).
fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

async fn serve(port: u16) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind((std::net::Ipv6Addr::UNSPECIFIED, port))
        .await
        .or(tokio::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port)).await)
        .with_context(|| format!("listening on port {port}"))?;
    eprintln!("probe: serving on port {port}");
    let pod = hostname();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                eprintln!("probe: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let pod = pod.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |_req| {
                let body = json!({"pod": pod, "client": client_ip(peer)});
                eprintln!("probe: answered {}", client_ip(peer));
                async move {
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(format!("{body}\n"))))
                            .expect("static response"),
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The client's address as IPv4 when it came in IPv4-mapped on the dual-stack socket.
fn client_ip(peer: SocketAddr) -> String {
    match peer.ip() {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.to_string(), |v4| v4.to_string()),
        v4 => v4.to_string(),
    }
}

/// Fetches `url` until it answers or `within` has passed; the verdict as one JSON object.
async fn fetch_until(name: &str, url: &str, within: Duration) -> Value {
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let attempt = Instant::now();
        match fetch(url).await {
            Ok(answer) => {
                return json!({"check": name, "url": url, "ok": true, "attempts": attempts,
                              "ms": attempt.elapsed().as_secs_f64() * 1000.0,
                              "answer": serde_json::from_str::<Value>(&answer)
                                  .unwrap_or(Value::String(answer))});
            }
            Err(e) if started.elapsed() >= within => {
                return json!({"check": name, "url": url, "ok": false, "attempts": attempts,
                              "error": format!("{e:#}")});
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// One GET of `url` (http only), bounded: 3 s to resolve and connect, 5 s for the answer.
async fn fetch(url: &str) -> anyhow::Result<String> {
    let uri: http::Uri = url.parse()?;
    let host = uri.host().context("no host")?.trim_matches(['[', ']']);
    let port = uri.port_u16().unwrap_or(80);
    let connect = async {
        let addr = tokio::net::lookup_host((host, port))
            .await
            .with_context(|| format!("resolving {host}"))?
            .next()
            .with_context(|| format!("{host} has no address"))?;
        tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))
    };
    let stream = tokio::time::timeout(Duration::from_secs(3), connect)
        .await
        .map_err(|_| anyhow::anyhow!("no connection to {host}:{port} within 3 s"))??;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let request = http::Request::get(path)
        .header("host", host)
        .header("user-agent", "tandem-probe")
        .body(Empty::<Bytes>::new())?;
    let body = tokio::time::timeout(Duration::from_secs(5), async {
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::ensure!(status.is_success(), "HTTP {status}");
        Ok(body)
    })
    .await
    .map_err(|_| anyhow::anyhow!("no answer from {host}:{port} within 5 s"))??;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_served_probe_answers_who_it_is_and_a_fetch_says_why_it_failed() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let server = tokio::spawn(serve(port));
        let ok = fetch_until(
            "local",
            &format!("http://127.0.0.1:{port}/"),
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(ok["ok"], true, "{ok}");
        assert_eq!(ok["answer"]["client"], "127.0.0.1", "{ok}");
        server.abort();
        // Nothing listens any more: refused, said, within the bound.
        let failed = fetch_until(
            "gone",
            &format!("http://127.0.0.1:{port}/"),
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(failed["ok"], false, "{failed}");
        assert!(
            failed["error"]
                .as_str()
                .unwrap()
                .contains("connecting to 127.0.0.1"),
            "{failed}"
        );
        assert!(failed["attempts"].as_u64().unwrap() >= 2, "{failed}");
    }

    #[test]
    fn only_named_http_urls_are_taken() {
        assert!(name_and_url("pod=http://10.0.0.1:8080/").is_ok());
        assert!(
            name_and_url("pod=http://a b/")
                .unwrap_err()
                .contains("is not a URL")
        );
        assert!(
            name_and_url("x=https://a/")
                .unwrap_err()
                .contains("only http://")
        );
        assert!(name_and_url("nourl").unwrap_err().contains("not NAME=URL"));
    }
}

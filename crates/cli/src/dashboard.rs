//! `tandem dashboard`: a local, read-only web page that draws the topology of the clusters in
//! the kubeconfig — clusters, peerings with direction and phase, virtual nodes, tunnels with
//! state and RTT, offloaded namespaces and pod counts — and follows it live (it reads what
//! `tandem status` reads, from every cluster, every 2 s while the page is open).

use std::convert::Infallible;
use std::net::SocketAddr;

use anyhow::Context as _;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::Serialize;

use crate::flags::ClusterArgs;

/// Serve a live topology page of the clusters in the kubeconfig on localhost.
#[derive(clap::Args)]
#[command(
    after_help = "The page is read-only. It listens on 127.0.0.1 unless --address says otherwise: it \
shows every cluster of the kubeconfig, so do not expose it to a network you do not trust; on a \
loopback address it answers only requests naming that address (a web page elsewhere cannot read it \
through DNS rebinding).\n\nExample:\n  tandem dashboard --kubeconfig ~/.tandem/lab/kubeconfig\n  \
tandem dashboard --contexts lab-1,lab-2 --address 127.0.0.1:9000"
)]
pub struct Args {
    /// Where to serve the page (port 0 picks a free one; the URL is printed).
    #[arg(long, default_value = "127.0.0.1:8001")]
    address: SocketAddr,
    /// The kubeconfig contexts to show [default: --context if given, else every context].
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    contexts: Vec<String>,
}

/// One cluster of the page: what `tandem status -o json` says of it, or why it could not.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterView {
    context: String,
    status: Option<crate::status::Status>,
    error: Option<String>,
}

#[derive(Serialize)]
struct Topology {
    clusters: Vec<ClusterView>,
}

const PAGE: &str = include_str!("dashboard.html");

pub async fn run(args: Args, cluster: &ClusterArgs) -> anyhow::Result<()> {
    let contexts = match (args.contexts.is_empty(), &cluster.context) {
        (false, _) => args.contexts,
        (true, Some(context)) => vec![context.clone()],
        (true, None) => cluster.contexts()?,
    };
    anyhow::ensure!(
        !contexts.is_empty(),
        "the kubeconfig has no context to show"
    );
    let listener = tokio::net::TcpListener::bind(args.address)
        .await
        .with_context(|| format!("listening on {}", args.address))?;
    let bound = listener.local_addr()?;
    if !bound.ip().is_loopback() {
        eprintln!(
            "warning: serving on {bound}, not a loopback address: anyone who reaches it sees \
             the topology of {}",
            contexts.join(", ")
        );
    }
    eprintln!(
        "Tandem dashboard of {}: http://{bound}/ (read-only; Ctrl-C stops it)",
        contexts.join(", ")
    );
    let state = std::sync::Arc::new((cluster.clone(), contexts, bound));
    let interrupted = crate::interrupt()?;
    let serve = async {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let state = state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(route(&req, &state.0, &state.1, state.2).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    };
    tokio::select! {
        () = serve => Ok(()),
        () = interrupted => Ok(()),
    }
}

/// Whether a request's Host names this server: on loopback, only `127.0.0.1`, `[::1]` or
/// `localhost` with its port (what the browser sends for the printed URL).
fn host_allowed(req: &Request<Incoming>, bound: SocketAddr) -> bool {
    if !bound.ip().is_loopback() {
        return true;
    }
    let Some(host) = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    let port = bound.port();
    [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ]
    .iter()
    .any(|allowed| allowed == host)
}

async fn route(
    req: &Request<Incoming>,
    cluster: &ClusterArgs,
    contexts: &[String],
    bound: SocketAddr,
) -> Response<Full<Bytes>> {
    let answer = |status: StatusCode, content_type: &str, body: String| {
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, content_type)
            .header(header::CACHE_CONTROL, "no-store")
            .header("x-content-type-options", "nosniff")
            .body(Full::new(Bytes::from(body)))
            .expect("static response")
    };
    if !host_allowed(req, bound) {
        return answer(
            StatusCode::FORBIDDEN,
            "text/plain",
            format!("this dashboard answers only requests for http://{bound}/\n"),
        );
    }
    if req.method() != Method::GET {
        return answer(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "the dashboard is read-only\n".into(),
        );
    }
    match req.uri().path() {
        "/" => answer(StatusCode::OK, "text/html; charset=utf-8", PAGE.to_string()),
        "/api/topology" => {
            let topology = topology(cluster, contexts).await;
            answer(
                StatusCode::OK,
                "application/json",
                serde_json::to_string(&topology).expect("JSON"),
            )
        }
        _ => answer(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// What `tandem status` reports of every context, read concurrently.
async fn topology(cluster: &ClusterArgs, contexts: &[String]) -> Topology {
    let views = contexts.iter().map(|context| async move {
        let args = ClusterArgs {
            kubeconfig: cluster.kubeconfig.clone(),
            context: Some(context.clone()),
        };
        let status = async {
            let client = args.client().await?;
            crate::status::collect(&client).await
        };
        match tokio::time::timeout(std::time::Duration::from_secs(5), status).await {
            Ok(Ok(status)) => ClusterView {
                context: context.clone(),
                status: Some(status),
                error: None,
            },
            Ok(Err(e)) => ClusterView {
                context: context.clone(),
                status: None,
                error: Some(format!("{e:#}")),
            },
            Err(_) => ClusterView {
                context: context.clone(),
                status: None,
                error: Some("no answer within 5 s".into()),
            },
        }
    });
    Topology {
        clusters: futures::future::join_all(views).await,
    }
}

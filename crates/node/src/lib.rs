//! The network fabric's daemons, as the controller runs them in a cluster (`tandem agent`,
//! `tandem gateway --peer`): kube-facing loops around `tandem-net`'s data plane. The CLI parses
//! their flags and builds the client; everything they do lives here.
//!
//! - [`agent`]: the node agent of the `tandem-agent` DaemonSet, routing each peer's prefixes to
//!   the node of that peer's gateway.
//! - [`gateway`]: the gateway to one peer, running the last valid configuration of its Secret.

pub mod agent;
pub mod gateway;

/// Makes the capabilities this process was given (a gateway's or node agent's NET_ADMIN)
/// effective, and makes them pass to the `nft` it runs. In a cluster the non-root process gets
/// them from the file capability on Tandem's binary (`cap_net_admin+p`: permitted only, so that
/// a pod without the capability in its bounding set, like the controller's, still executes
/// it), and a runtime sets no ambient capabilities: raising them into the ambient set is what
/// lets them survive the exec of `nft`. Best effort: without them `nft` fails, naming it.
/// Call it before the runtime starts its threads: capabilities belong to threads.
pub fn keep_capabilities_across_exec() {
    let Ok(permitted) = caps::read(None, caps::CapSet::Permitted) else {
        return;
    };
    for cap in permitted {
        let raised = caps::raise(None, caps::CapSet::Effective, cap)
            .and_then(|()| caps::raise(None, caps::CapSet::Inheritable, cap))
            .and_then(|()| caps::raise(None, caps::CapSet::Ambient, cap));
        if let Err(e) = raised {
            eprintln!("warning: keeping {cap} for the programs this process runs: {e}");
        }
    }
}

/// Why a daemon stopped, or one of its passes failed (the loops log those and go on).
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A request to the cluster's API server failed.
    #[error("{what}")]
    Api {
        /// What was being read, naming the object (`reading ConfigMap tandem-system/tandem-routes`).
        what: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// An object holds what is not the format the controller writes.
    #[error("{what}")]
    Format {
        /// The object and key (`Secret tandem-gateway-milan: gateway.json is not a gateway configuration`).
        what: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// Reading or changing this node's routes failed.
    #[error("{what}")]
    Routes {
        /// The step (`syncing the routes`).
        what: &'static str,
        /// The netlink error.
        #[source]
        source: tandem_net::route::RouteError,
    },
    /// The gateway could not start or stopped.
    #[error("gateway")]
    Gateway(#[source] tandem_net::GatewayError),
}

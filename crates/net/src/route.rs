//! Routes into the tunnel, kept equal to the plan's tunnel destinations over rtnetlink.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use rtnetlink::{Handle, RouteMessageBuilder};

/// Errors changing routes.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The netlink socket could not be opened.
    #[error("opening rtnetlink socket: {0}")]
    Connect(std::io::Error),
    /// The kernel refused a request.
    #[error("{action} route {prefix} dev #{ifindex}: {source}")]
    Request {
        /// add / delete / list.
        action: &'static str,
        /// The route's destination.
        prefix: String,
        /// The interface index.
        ifindex: u32,
        /// The kernel's answer.
        source: rtnetlink::Error,
    },
}

/// Routes on `ifindex`, as (destination prefix, message for deleting it).
async fn routes_on(
    handle: &Handle,
    ifindex: u32,
) -> Result<Vec<(IpNet, RouteMessage)>, RouteError> {
    let mut found = Vec::new();
    let queries = [
        RouteMessageBuilder::<Ipv4Addr>::new().build(),
        RouteMessageBuilder::<Ipv6Addr>::new().build(),
    ];
    for query in queries {
        let mut stream = handle.route().get(query).execute();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(|source| RouteError::Request {
                action: "list",
                prefix: "*".into(),
                ifindex,
                source,
            })?
        {
            let on_link = msg
                .attributes
                .iter()
                .any(|a| matches!(a, RouteAttribute::Oif(i) if *i == ifindex));
            if !on_link {
                continue;
            }
            let len = msg.header.destination_prefix_length;
            let dst = msg.attributes.iter().find_map(|a| match a {
                RouteAttribute::Destination(RouteAddress::Inet(a)) => Some(IpAddr::V4(*a)),
                RouteAttribute::Destination(RouteAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
                _ => None,
            });
            if let Some(net) = dst.and_then(|d| IpNet::new(d, len).ok()) {
                found.push((net, msg));
            }
        }
    }
    Ok(found)
}

/// Makes the routes via `ifindex` exactly `wanted`: missing ones are added, others removed.
pub async fn sync_routes(ifindex: u32, wanted: &[IpNet]) -> Result<(), RouteError> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(RouteError::Connect)?;
    let task = tokio::spawn(conn);
    let result = sync_with(&handle, ifindex, wanted).await;
    task.abort();
    result
}

async fn sync_with(handle: &Handle, ifindex: u32, wanted: &[IpNet]) -> Result<(), RouteError> {
    let existing = routes_on(handle, ifindex).await?;
    for (net, msg) in &existing {
        // IPv6 link-local and multicast routes belong to the kernel.
        let kernel_owned = matches!(net, IpNet::V6(n) if n.addr().segments()[0] & 0xffc0 == 0xfe80 || n.addr().is_multicast());
        if !wanted.contains(net) && !kernel_owned {
            handle
                .route()
                .del(msg.clone())
                .execute()
                .await
                .map_err(|source| RouteError::Request {
                    action: "delete",
                    prefix: net.to_string(),
                    ifindex,
                    source,
                })?;
        }
    }
    for net in wanted {
        if existing.iter().any(|(n, _)| n == net) {
            continue;
        }
        let msg = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(net.network(), net.prefix_len())
            .expect("prefix is a valid destination")
            .output_interface(ifindex)
            .build();
        handle
            .route()
            .add(msg)
            .replace()
            .execute()
            .await
            .map_err(|source| RouteError::Request {
                action: "add",
                prefix: net.to_string(),
                ifindex,
                source,
            })?;
    }
    Ok(())
}

/// The routing protocol number the node agent marks its routes with (`ip route` shows it as
/// `proto 173`), so that it finds and removes exactly its own routes and no one else's.
pub const AGENT_PROTOCOL: u8 = 173;

/// Makes the IPv4 routes of the main table marked [`AGENT_PROTOCOL`] exactly `wanted`
/// (destination, next hop): routes to a peer's prefixes through the node that runs that
/// peer's gateway. Others' routes are never touched.
pub async fn sync_agent_routes(wanted: &[(ipnet::Ipv4Net, Ipv4Addr)]) -> Result<(), RouteError> {
    use rtnetlink::packet_route::route::RouteProtocol;
    let (conn, handle, _) = rtnetlink::new_connection().map_err(RouteError::Connect)?;
    let task = tokio::spawn(conn);
    let result = async {
        let err = |action: &'static str, prefix: String| {
            move |source| RouteError::Request {
                action,
                prefix,
                ifindex: 0,
                source,
            }
        };
        let mut existing: Vec<((ipnet::Ipv4Net, Option<Ipv4Addr>), RouteMessage)> = Vec::new();
        let mut stream = handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute();
        while let Some(msg) = stream.try_next().await.map_err(err("list", "*".into()))? {
            if msg.header.protocol != RouteProtocol::Other(AGENT_PROTOCOL) {
                continue;
            }
            let dst = msg.attributes.iter().find_map(|a| match a {
                RouteAttribute::Destination(RouteAddress::Inet(a)) => Some(*a),
                _ => None,
            });
            let via = msg.attributes.iter().find_map(|a| match a {
                RouteAttribute::Gateway(RouteAddress::Inet(a)) => Some(*a),
                _ => None,
            });
            if let Some(net) =
                dst.and_then(|d| ipnet::Ipv4Net::new(d, msg.header.destination_prefix_length).ok())
            {
                existing.push(((net, via), msg));
            }
        }
        for ((net, via), msg) in &existing {
            if via.is_none_or(|v| !wanted.contains(&(*net, v))) {
                handle
                    .route()
                    .del(msg.clone())
                    .execute()
                    .await
                    .map_err(err("delete", net.to_string()))?;
            }
        }
        for (net, via) in wanted {
            if existing
                .iter()
                .any(|((n, v), _)| n == net && *v == Some(*via))
            {
                continue;
            }
            let msg = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(net.network(), net.prefix_len())
                .gateway(*via)
                .protocol(RouteProtocol::Other(AGENT_PROTOCOL))
                .build();
            handle
                .route()
                .add(msg)
                .replace()
                .execute()
                .await
                .map_err(err("add", format!("{net} via {via}")))?;
        }
        Ok(())
    }
    .await;
    task.abort();
    result
}

/// The IPv4 addresses of this network namespace's interfaces (the node's, for a
/// hostNetwork pod).
pub async fn local_ipv4_addresses() -> Result<Vec<Ipv4Addr>, RouteError> {
    use rtnetlink::packet_route::address::AddressAttribute;
    let (conn, handle, _) = rtnetlink::new_connection().map_err(RouteError::Connect)?;
    let task = tokio::spawn(conn);
    let mut out = Vec::new();
    let mut stream = handle.address().get().execute();
    let result = loop {
        match stream.try_next().await {
            Ok(Some(msg)) => out.extend(msg.attributes.iter().filter_map(|a| match a {
                AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
                _ => None,
            })),
            Ok(None) => break Ok(out),
            Err(source) => {
                break Err(RouteError::Request {
                    action: "list addresses",
                    prefix: "*".into(),
                    ifindex: 0,
                    source,
                });
            }
        }
    };
    task.abort();
    result
}

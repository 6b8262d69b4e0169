//! The API endpoint an invite names: one its consumers can reach.
//!
//! A kubeconfig's server is where *this* machine reaches the API server; on kind (and on a
//! k3s server's own `k3s.yaml`) that is a loopback address, which another cluster's controller
//! can never reach. The API server advertises where it is reachable from the cluster's network
//! in the `kubernetes` Service's endpoints (kube-apiserver's `--advertise-address`): that is
//! what an invite names then, and it says so.

use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ListParams};

/// The endpoint chosen for an invite, and what the administrator should know about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    /// `https://host:port`.
    pub endpoint: String,
    /// Why it is not the kubeconfig's server, or who can use it; None when it is the server.
    pub note: Option<String>,
}

/// Why no endpoint a consumer could reach can be named.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The kubeconfig's server does not read as a URL.
    #[error("the kubeconfig's server {0:?} is not a URL")]
    NotAUrl(String),
    /// Loopback server, and the cluster advertises no address.
    #[error(
        "the kubeconfig's server {server} is a loopback address, which a peer cannot reach, and \
         the cluster's `kubernetes` Service advertises no address to use instead: pass \
         --endpoint https://<an address peers reach>:<port>"
    )]
    Loopback { server: String },
    /// Reading the `kubernetes` Service's EndpointSlices failed.
    #[error("reading the `kubernetes` Service's EndpointSlices in namespace default")]
    Read(#[source] kube::Error),
}

/// The host of `url` (`https://host:port/...`), brackets removed from an IPv6 address.
fn host_of(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    (!host.is_empty()).then_some(host)
}

/// Whether `host` names this machine only (a loopback or link-local address, `localhost`).
fn host_local(host: &str) -> bool {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => ip.is_loopback() || ip.is_link_local(),
        Ok(IpAddr::V6(ip)) => ip.is_loopback() || ip.is_unicast_link_local(),
        Err(_) => host.eq_ignore_ascii_case("localhost") || host.ends_with(".localhost"),
    }
}

/// The endpoint for an invite of the cluster at `server` (the kubeconfig's), given the address
/// and port its `kubernetes` Service advertises, if any.
pub fn choose(server: &str, advertised: Option<(IpAddr, u16)>) -> Result<Chosen, EndpointError> {
    let server = server.trim_end_matches('/');
    let host = host_of(server).ok_or_else(|| EndpointError::NotAUrl(server.to_string()))?;
    if !host_local(host) {
        return Ok(Chosen {
            endpoint: server.to_string(),
            note: None,
        });
    }
    match advertised {
        None => Err(EndpointError::Loopback {
            server: server.to_string(),
        }),
        // A cluster that is itself on this machine only (a hollow lab): as reachable as it is.
        Some((ip, _)) if host_local(&ip.to_string()) => Ok(Chosen {
            endpoint: server.to_string(),
            note: Some(format!(
                "the API server advertises only {ip}: this invite works for peers on this host \
                 only (pass --endpoint for others)"
            )),
        }),
        Some((ip, port)) => {
            let endpoint = match ip {
                IpAddr::V4(v4) => format!("https://{v4}:{port}"),
                IpAddr::V6(v6) => format!("https://[{v6}]:{port}"),
            };
            Ok(Chosen {
                note: Some(format!(
                    "the kubeconfig's server {server} is a loopback address; the invite names \
                     {endpoint}, which the API server advertises (the `kubernetes` Service's \
                     endpoint); pass --endpoint if peers reach it elsewhere"
                )),
                endpoint,
            })
        }
    }
}

/// The first ready address and the `https` port (else the first) of the `kubernetes` Service's
/// EndpointSlices.
pub async fn advertised(client: &Client) -> Result<Option<(IpAddr, u16)>, EndpointError> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let list = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=kubernetes"))
        .await
        .map_err(EndpointError::Read)?;
    Ok(list.items.iter().find_map(|s| {
        let ports = s.ports.as_ref()?;
        let port = ports
            .iter()
            .find(|p| p.name.as_deref() == Some("https"))
            .or(ports.first())?
            .port?;
        let address = s
            .endpoints
            .iter()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
            .flat_map(|e| e.addresses.iter())
            .find_map(|a| a.parse::<IpAddr>().ok())?;
        Some((address, u16::try_from(port).ok()?))
    }))
}

/// The endpoint for an invite of the cluster `client` reaches at `server`.
pub async fn for_invite(client: &Client, server: &str) -> Result<Chosen, EndpointError> {
    let host_is_local = host_of(server).is_some_and(host_local);
    let advertised = if host_is_local {
        advertised(client).await?
    } else {
        None
    };
    choose(server, advertised)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Case<'a> = (
        &'a str,
        &'a str,
        Option<(IpAddr, u16)>,
        Result<&'a str, &'a str>,
        bool,
    );

    #[test]
    fn choose_table() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // (what, the kubeconfig's server, what the cluster advertises, the endpoint or a part
        // of the refusal, whether a note is said)
        let cases: [Case; 8] = [
            (
                "a reachable server is kept",
                "https://api.example.org:6443",
                None,
                Ok("https://api.example.org:6443"),
                false,
            ),
            (
                "a private address is kept",
                "https://10.0.0.5:6443/",
                Some((ip("172.18.0.2"), 6443)),
                Ok("https://10.0.0.5:6443"),
                false,
            ),
            (
                "kind: the advertised address",
                "https://127.0.0.1:41267",
                Some((ip("172.18.0.2"), 6443)),
                Ok("https://172.18.0.2:6443"),
                true,
            ),
            (
                "localhost too",
                "https://localhost:6443",
                Some((ip("192.168.1.10"), 6443)),
                Ok("https://192.168.1.10:6443"),
                true,
            ),
            (
                "IPv6 loopback",
                "https://[::1]:6443",
                Some((ip("fd00::2"), 6443)),
                Ok("https://[fd00::2]:6443"),
                true,
            ),
            (
                "link-local",
                "https://169.254.1.1:6443",
                Some((ip("10.1.2.3"), 443)),
                Ok("https://10.1.2.3:443"),
                true,
            ),
            (
                "a host-local cluster stays so",
                "https://127.0.0.1:38001",
                Some((ip("127.0.0.1"), 38001)),
                Ok("https://127.0.0.1:38001"),
                true,
            ),
            (
                "nothing advertised",
                "https://127.0.0.1:41267",
                None,
                Err("pass --endpoint"),
                false,
            ),
        ];
        for (what, server, advertised, want, noted) in cases {
            match (choose(server, advertised), want) {
                (Ok(chosen), Ok(endpoint)) => {
                    assert_eq!(chosen.endpoint, endpoint, "{what}");
                    assert_eq!(chosen.note.is_some(), noted, "{what}: {chosen:?}");
                }
                (Err(e), Err(said)) => assert!(e.to_string().contains(said), "{what}: {e}"),
                (got, _) => panic!("{what}: {got:?}"),
            }
        }
    }
}

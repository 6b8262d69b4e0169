//! What the virtual node's kubelet API decides, pure: the authorisation a request needs, where
//! it goes, whether the pod is this node's and offloaded, which parameters reach the provider,
//! and every answer but success ([`Refusal`]) with the status a kubelet would give.

use http::StatusCode;
use k8s_openapi::api::core::v1::Pod;
use tandem_api::NamespaceOffloading;

/// The pod subresources the kubelet API carries to the provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Subresource {
    Logs,
    Exec,
    Attach,
    PortForward,
}

impl Subresource {
    /// As the user reads it in an answer.
    pub(super) fn what(self) -> &'static str {
        match self {
            Subresource::Logs => "logs",
            Subresource::Exec => "exec",
            Subresource::Attach => "attach",
            Subresource::PortForward => "port-forward",
        }
    }

    /// The pod subresource on the provider's API server.
    pub(super) fn provider_subresource(self) -> &'static str {
        match self {
            Subresource::Logs => "log",
            Subresource::Exec => "exec",
            Subresource::Attach => "attach",
            Subresource::PortForward => "portforward",
        }
    }

    /// The field of the provider's Tenant `spec.podAccess` that allows it.
    fn policy_field(self) -> &'static str {
        match self {
            Subresource::Logs => "logs",
            Subresource::Exec => "exec",
            Subresource::Attach => "attach",
            Subresource::PortForward => "portForward",
        }
    }

    /// The query parameters passed on to the provider (`command` repeats, for exec).
    pub(super) fn params(self) -> &'static [&'static str] {
        match self {
            Subresource::Logs => &[
                "follow",
                "previous",
                "sinceSeconds",
                "sinceTime",
                "timestamps",
                "tailLines",
                "limitBytes",
            ],
            Subresource::Exec | Subresource::Attach => {
                &["command", "stdin", "stdout", "stderr", "tty"]
            }
            Subresource::PortForward => &[],
        }
    }
}

/// Where a request of the kubelet API goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// `/metrics/resource`: the offloaded pods' usage, for metrics-server.
    MetricsResource,
    /// A subresource of pod `namespace/pod` (of one container, but for port-forward).
    Pod {
        subresource: Subresource,
        namespace: String,
        pod: String,
        container: Option<String>,
    },
}

/// The authorisation a kubelet asks of the API server for a request (`nodes/<subresource>`):
/// the verb from the HTTP method, `metrics` for /metrics/…, `proxy` for the rest (logs, exec,
/// attach and port-forward alike).
pub(super) fn attributes(method: &http::Method, path: &[String]) -> (&'static str, &'static str) {
    let verb = match *method {
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::DELETE => "delete",
        _ => "get",
    };
    let subresource = if path.first().is_some_and(|p| p == "metrics") {
        "metrics"
    } else {
        "proxy"
    };
    (verb, subresource)
}

/// The route of a request path (split on `/`, without the leading one).
pub(super) fn route(path: &[String]) -> Result<Route, Refusal> {
    let pod = |subresource, ns: &String, pod: &String, container: Option<&String>| Route::Pod {
        subresource,
        namespace: ns.clone(),
        pod: pod.clone(),
        container: container.cloned(),
    };
    match path {
        [m, r] if m == "metrics" && r == "resource" => Ok(Route::MetricsResource),
        [kind, ns, p, container] if kind == "containerLogs" => {
            Ok(pod(Subresource::Logs, ns, p, Some(container)))
        }
        [kind, ns, p, container] if kind == "exec" => {
            Ok(pod(Subresource::Exec, ns, p, Some(container)))
        }
        [kind, ns, p, container] if kind == "attach" => {
            Ok(pod(Subresource::Attach, ns, p, Some(container)))
        }
        // `/portForward/{namespace}/{pod}[/{uid}]`: a pod's ports, not a container's.
        [kind, ns, p] | [kind, ns, p, _] if kind == "portForward" => {
            Ok(pod(Subresource::PortForward, ns, p, None))
        }
        _ => Err(Refusal::NoSuchPath),
    }
}

/// Whether pod `namespace/name` (`found`, None when there is none) is bound to virtual node
/// `node`: a kubelet answers only for its own pods.
pub(super) fn on_node(
    found: Option<&Pod>,
    namespace: &str,
    name: &str,
    node: &str,
) -> Result<(), Refusal> {
    let bound = found
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.node_name.as_deref());
    if bound == Some(node) {
        Ok(())
    } else {
        Err(Refusal::NotOnNode {
            namespace: namespace.into(),
            pod: name.into(),
            node: node.into(),
        })
    }
}

/// The twin namespace on `provider` of namespace `namespace`, from its NamespaceOffloadings.
pub(super) fn twin(
    offloadings: &[NamespaceOffloading],
    namespace: &str,
    provider: &str,
) -> Result<String, Refusal> {
    offloadings
        .iter()
        .find_map(|nso| tandem_api::offloading::twin_of(nso, provider))
        .ok_or_else(|| Refusal::NoTwin {
            namespace: namespace.into(),
            provider: provider.into(),
        })
}

/// The real pod's subresource path on the provider, with the parameters it takes passed on.
pub(super) fn provider_path(
    subresource: Subresource,
    twin: &str,
    pod: &str,
    container: &str,
    params: &[(String, String)],
) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("container", container);
    let allowed = subresource.params();
    for (k, v) in params.iter().filter(|(k, _)| allowed.contains(&k.as_str())) {
        query.append_pair(k, v);
    }
    format!(
        "/api/v1/namespaces/{twin}/pods/{pod}/{}?{}",
        subresource.provider_subresource(),
        query.finish()
    )
}

/// Every answer of the kubelet API but success: the caller's refusals, the provider's, and
/// the failures on the way, each with the status a kubelet would give.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum Refusal {
    /// No client certificate from the API server's client CAs.
    #[error("Unauthorized")]
    Unauthenticated,
    /// The SubjectAccessReview did not allow the caller `nodes/<subresource>` on this node.
    #[error("Forbidden (user={user}, verb={verb}, resource=nodes, subresource={subresource})")]
    Forbidden {
        user: String,
        verb: &'static str,
        subresource: &'static str,
    },
    #[error("404 page not found")]
    NoSuchPath,
    #[error("virtual node {node}: the peering with its provider is not established")]
    NotEstablished { node: String },
    #[error("pod {namespace}/{pod} is not on virtual node {node}")]
    NotOnNode {
        namespace: String,
        pod: String,
        node: String,
    },
    #[error("namespace {namespace} has no ready twin namespace on provider {provider}")]
    NoTwin { namespace: String, provider: String },
    /// The provider answered with `code`: a 403 is its policy for this consumer.
    #[error("{}", provider_refusal(provider, *subresource, *code, message))]
    ByProvider {
        provider: String,
        subresource: Subresource,
        code: u16,
        message: String,
    },
    #[error("provider {provider} did not answer {} for {target}: {error}", subresource.what())]
    ProviderSilent {
        provider: String,
        subresource: Subresource,
        target: String,
        error: String,
    },
    #[error("provider {provider} did not open {} on {target}: {error}", subresource.what())]
    ProviderDidNotOpen {
        provider: String,
        subresource: Subresource,
        target: String,
        error: String,
    },
    /// Exec or attach asked for without a WebSocket upgrade (kubectl's SPDY fallback).
    #[error(
        "only WebSocket streams (v5.channel.k8s.io, v4.channel.k8s.io) are served: use \
         kubectl 1.30 or later"
    )]
    NotWebSocket,
    #[error("the provider speaks {protocol}, which the client did not offer ({offered:?})")]
    ProtocolNotOffered {
        protocol: &'static str,
        offered: Vec<String>,
    },
    #[error("unable to upgrade: port-forward is served as a SPDY/3.1 upgrade (portforward.k8s.io)")]
    NotSpdy,
    /// A read or review this server needed failed: `step` says which.
    #[error("{step}: {error}")]
    Failed { step: String, error: String },
}

impl Refusal {
    pub(super) fn status(&self) -> StatusCode {
        match self {
            Refusal::Unauthenticated => StatusCode::UNAUTHORIZED,
            Refusal::Forbidden { .. } => StatusCode::FORBIDDEN,
            Refusal::NoSuchPath | Refusal::NotOnNode { .. } => StatusCode::NOT_FOUND,
            Refusal::NotEstablished { .. } | Refusal::NoTwin { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Refusal::ByProvider { code, .. } => {
                StatusCode::from_u16(*code).unwrap_or(StatusCode::BAD_GATEWAY)
            }
            Refusal::ProviderSilent { .. } | Refusal::ProviderDidNotOpen { .. } => {
                StatusCode::BAD_GATEWAY
            }
            Refusal::NotWebSocket | Refusal::ProtocolNotOffered { .. } | Refusal::NotSpdy => {
                StatusCode::BAD_REQUEST
            }
            Refusal::Failed { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A refusal or failure of the provider, as the consumer's user should read it: a 403 names
/// the provider's policy.
fn provider_refusal(provider: &str, subresource: Subresource, code: u16, message: &str) -> String {
    if code == 403 {
        format!(
            "provider {provider} does not allow {} on its pods for this cluster (its policy: \
             the Tenant's spec.podAccess.{}): {message}",
            subresource.what(),
            subresource.policy_field()
        )
    } else {
        format!("provider {provider}: {message}")
    }
}

/// The message of a metav1.Status body, else the body as text.
pub(super) fn status_message(body: &[u8]) -> String {
    serde_json::from_slice::<kube::core::Status>(body)
        .ok()
        .map(|s| s.message)
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_api::{NamespaceOffloadingStatus, RemoteNamespaceStatus};

    fn path(p: &str) -> Vec<String> {
        p.trim_start_matches('/')
            .split('/')
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn attributes_table() {
        use http::Method;
        let cases = [
            (Method::GET, "/metrics/resource", ("get", "metrics")),
            (Method::GET, "/containerLogs/ns/p/c", ("get", "proxy")),
            (Method::POST, "/exec/ns/p/c", ("create", "proxy")),
            (Method::GET, "/exec/ns/p/c", ("get", "proxy")),
            (Method::POST, "/portForward/ns/p", ("create", "proxy")),
            (Method::PUT, "/attach/ns/p/c", ("update", "proxy")),
            (Method::DELETE, "/pods", ("delete", "proxy")),
            (Method::PATCH, "/metrics/cadvisor", ("get", "metrics")),
        ];
        for (method, p, want) in cases {
            assert_eq!(attributes(&method, &path(p)), want, "{method} {p}");
        }
    }

    #[test]
    fn route_table() {
        let pod = |subresource, container: Option<&str>| {
            Ok(Route::Pod {
                subresource,
                namespace: "ns".into(),
                pod: "p".into(),
                container: container.map(str::to_string),
            })
        };
        let cases = [
            ("/metrics/resource", Ok(Route::MetricsResource)),
            ("/containerLogs/ns/p/c", pod(Subresource::Logs, Some("c"))),
            ("/exec/ns/p/c", pod(Subresource::Exec, Some("c"))),
            ("/attach/ns/p/c", pod(Subresource::Attach, Some("c"))),
            ("/portForward/ns/p", pod(Subresource::PortForward, None)),
            (
                "/portForward/ns/p/some-uid",
                pod(Subresource::PortForward, None),
            ),
            // What a real kubelet serves and a virtual one does not.
            ("/metrics/cadvisor", Err(Refusal::NoSuchPath)),
            ("/pods", Err(Refusal::NoSuchPath)),
            ("/run/ns/p/c", Err(Refusal::NoSuchPath)),
            ("/exec/ns/p", Err(Refusal::NoSuchPath)),
            ("/containerLogs/ns/p/c/extra", Err(Refusal::NoSuchPath)),
            ("/portForward/ns", Err(Refusal::NoSuchPath)),
        ];
        for (p, want) in cases {
            assert_eq!(route(&path(p)), want, "{p}");
        }
    }

    #[test]
    fn only_pods_bound_to_this_node_are_served() {
        let bound = |node: Option<&str>| Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                node_name: node.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        let refused = Err(Refusal::NotOnNode {
            namespace: "ns".into(),
            pod: "p".into(),
            node: "tandem-prov".into(),
        });
        let cases = [
            (Some(bound(Some("tandem-prov"))), Ok(())),
            (Some(bound(Some("worker-1"))), refused.clone()),
            (Some(bound(None)), refused.clone()),
            (None, refused),
        ];
        for (found, want) in cases {
            assert_eq!(
                on_node(found.as_ref(), "ns", "p", "tandem-prov"),
                want,
                "{found:?}"
            );
        }
    }

    #[test]
    fn the_twin_is_the_ready_one_of_this_provider() {
        let nso = |entries: &[(&str, &str, &str)]| {
            let mut nso = NamespaceOffloading::new("offloading", Default::default());
            nso.status = Some(NamespaceOffloadingStatus {
                remote_namespaces: entries
                    .iter()
                    .map(|(cluster, ns, phase)| RemoteNamespaceStatus {
                        cluster_id: cluster.to_string(),
                        namespace: ns.to_string(),
                        phase: phase.to_string(),
                        message: None,
                    })
                    .collect(),
                ..Default::default()
            });
            nso
        };
        let no_twin = Err(Refusal::NoTwin {
            namespace: "ns".into(),
            provider: "prov".into(),
        });
        let cases = [
            (
                vec![nso(&[
                    ("other", "ns-x", "Ready"),
                    ("prov", "ns-c", "Ready"),
                ])],
                Ok("ns-c".to_string()),
            ),
            (vec![nso(&[("prov", "ns-c", "Pending")])], no_twin.clone()),
            (vec![nso(&[("other", "ns-x", "Ready")])], no_twin.clone()),
            (vec![], no_twin),
        ];
        for (offloadings, want) in cases {
            assert_eq!(twin(&offloadings, "ns", "prov"), want, "{offloadings:?}");
        }
    }

    #[test]
    fn only_the_parameters_of_the_subresource_reach_the_provider() {
        let params: Vec<(String, String)> = [
            ("follow", "true"),
            ("tailLines", "5"),
            ("command", "sh"),
            ("command", "-c"),
            ("tty", "true"),
            ("container", "other"),
            ("insecureSkipTLSVerifyBackend", "true"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            provider_path(Subresource::Logs, "twin", "p", "c", &params),
            "/api/v1/namespaces/twin/pods/p/log?container=c&follow=true&tailLines=5"
        );
        assert_eq!(
            provider_path(Subresource::Exec, "twin", "p", "c", &params),
            "/api/v1/namespaces/twin/pods/p/exec?container=c&command=sh&command=-c&tty=true"
        );
        assert_eq!(
            provider_path(Subresource::Attach, "twin", "p", "c", &params),
            "/api/v1/namespaces/twin/pods/p/attach?container=c&command=sh&command=-c&tty=true"
        );
    }

    #[test]
    fn every_refusal_has_a_status_and_says_what_failed() {
        let s = String::from;
        let cases = [
            (Refusal::Unauthenticated, 401, "Unauthorized"),
            (
                Refusal::Forbidden {
                    user: s("alice"),
                    verb: "create",
                    subresource: "proxy",
                },
                403,
                "Forbidden (user=alice, verb=create, resource=nodes, subresource=proxy)",
            ),
            (Refusal::NoSuchPath, 404, "404 page not found"),
            (
                Refusal::NotEstablished {
                    node: s("tandem-prov"),
                },
                503,
                "virtual node tandem-prov: the peering with its provider is not established",
            ),
            (
                Refusal::NotOnNode {
                    namespace: s("ns"),
                    pod: s("p"),
                    node: s("tandem-prov"),
                },
                404,
                "pod ns/p is not on virtual node tandem-prov",
            ),
            (
                Refusal::NoTwin {
                    namespace: s("ns"),
                    provider: s("prov"),
                },
                503,
                "namespace ns has no ready twin namespace on provider prov",
            ),
            (
                Refusal::ByProvider {
                    provider: s("prov"),
                    subresource: Subresource::PortForward,
                    code: 403,
                    message: s("no"),
                },
                403,
                "provider prov does not allow port-forward on its pods for this cluster (its \
                 policy: the Tenant's spec.podAccess.portForward): no",
            ),
            (
                Refusal::ByProvider {
                    provider: s("prov"),
                    subresource: Subresource::Logs,
                    code: 404,
                    message: s("pods \"p\" not found"),
                },
                404,
                "provider prov: pods \"p\" not found",
            ),
            (
                Refusal::ByProvider {
                    provider: s("prov"),
                    subresource: Subresource::Exec,
                    code: 1000,
                    message: s("?"),
                },
                502,
                "provider prov: ?",
            ),
            (
                Refusal::ProviderSilent {
                    provider: s("prov"),
                    subresource: Subresource::Logs,
                    target: s("twin/p"),
                    error: s("connection refused"),
                },
                502,
                "provider prov did not answer logs for twin/p: connection refused",
            ),
            (
                Refusal::ProviderDidNotOpen {
                    provider: s("prov"),
                    subresource: Subresource::Attach,
                    target: s("twin/p"),
                    error: s("reset"),
                },
                502,
                "provider prov did not open attach on twin/p: reset",
            ),
            (
                Refusal::NotWebSocket,
                400,
                "only WebSocket streams (v5.channel.k8s.io, v4.channel.k8s.io) are served: use \
                 kubectl 1.30 or later",
            ),
            (
                Refusal::ProtocolNotOffered {
                    protocol: "v5.channel.k8s.io",
                    offered: vec![s("v4.channel.k8s.io")],
                },
                400,
                "the provider speaks v5.channel.k8s.io, which the client did not offer ([\"v4.channel.k8s.io\"])",
            ),
            (
                Refusal::NotSpdy,
                400,
                "unable to upgrade: port-forward is served as a SPDY/3.1 upgrade (portforward.k8s.io)",
            ),
            (
                Refusal::Failed {
                    step: s("reading pod ns/p"),
                    error: s("timed out"),
                },
                500,
                "reading pod ns/p: timed out",
            ),
        ];
        for (refusal, status, message) in cases {
            assert_eq!(refusal.status().as_u16(), status, "{refusal:?}");
            assert_eq!(refusal.to_string(), message);
        }
    }

    #[test]
    fn the_provider_policy_named_is_the_field_of_the_subresource() {
        for (subresource, field) in [
            (Subresource::Logs, "podAccess.logs)"),
            (Subresource::Exec, "podAccess.exec)"),
            (Subresource::Attach, "podAccess.attach)"),
            (Subresource::PortForward, "podAccess.portForward)"),
        ] {
            let refusal = Refusal::ByProvider {
                provider: "prov".into(),
                subresource,
                code: 403,
                message: "forbidden".into(),
            };
            assert!(refusal.to_string().contains(field), "{refusal}");
        }
    }

    #[test]
    fn a_status_body_gives_its_message_else_the_text() {
        let status = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods \"p\" is forbidden","code":403}"#;
        assert_eq!(status_message(status), "pods \"p\" is forbidden");
        assert_eq!(status_message(b"  plain text\n"), "plain text");
        assert_eq!(
            status_message(br#"{"kind":"Status","message":""}"#),
            r#"{"kind":"Status","message":""}"#
        );
    }
}

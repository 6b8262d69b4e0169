//! Kubeconfigs as kube's typed [`Kubeconfig`], built and written in one place: the API server's
//! admin and user kubeconfigs, the lab's merged one and the peer identities the controller
//! stores all come from [`single`] and [`to_yaml`].

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};

/// How a kubeconfig's user authenticates.
pub enum Credentials<'a> {
    /// A client certificate and its private key, both PEM.
    ClientCertificate { cert_pem: &'a str, key_pem: &'a str },
    /// A bearer token.
    Token(&'a str),
}

/// A kubeconfig with one cluster (`server`, trusting `ca_pem`), one user and one context, all
/// as kubectl writes them; the context is current and named `context`.
pub fn single(
    context: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    credentials: Credentials<'_>,
    namespace: Option<&str>,
) -> Kubeconfig {
    let auth_info = match credentials {
        Credentials::ClientCertificate { cert_pem, key_pem } => AuthInfo {
            client_certificate_data: Some(STANDARD.encode(cert_pem)),
            client_key_data: Some(STANDARD.encode(key_pem).into()),
            ..Default::default()
        },
        Credentials::Token(token) => AuthInfo {
            token: Some(token.to_string().into()),
            ..Default::default()
        },
    };
    Kubeconfig {
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        clusters: vec![NamedCluster {
            name: context.to_string(),
            cluster: Some(Cluster {
                server: Some(server.to_string()),
                certificate_authority_data: Some(STANDARD.encode(ca_pem)),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: user.to_string(),
            auth_info: Some(auth_info),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: context.to_string(),
            context: Some(Context {
                cluster: context.to_string(),
                user: Some(user.to_string()),
                namespace: namespace.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(context.to_string()),
        ..Default::default()
    }
}

/// The kubeconfig as the YAML kubectl reads (with the YAML library kube itself reads it with).
pub fn to_yaml(kubeconfig: &Kubeconfig) -> String {
    serde_saphyr::to_string(kubeconfig).expect("a kubeconfig serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_kubeconfig_reads_back_with_its_credentials() {
        let cert = single(
            "lab-1",
            "https://127.0.0.1:6443",
            "CA",
            "lab-1-admin",
            Credentials::ClientCertificate {
                cert_pem: "CERT",
                key_pem: "KEY",
            },
            Some("default"),
        );
        let back = Kubeconfig::from_yaml(&to_yaml(&cert)).expect("reads back");
        assert_eq!(back.current_context.as_deref(), Some("lab-1"));
        let cluster = back.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
        let user = back.auth_infos[0].auth_info.as_ref().expect("user");
        assert_eq!(user.client_certificate_data.as_deref(), Some("Q0VSVA=="));
        assert!(user.client_key_data.is_some());
        let context = back.contexts[0].context.as_ref().expect("context");
        assert_eq!(
            (
                context.cluster.as_str(),
                context.user.as_deref(),
                context.namespace.as_deref()
            ),
            ("lab-1", Some("lab-1-admin"), Some("default"))
        );

        let token = single(
            "p",
            "https://h",
            "CA",
            "peer",
            Credentials::Token("t.s"),
            None,
        );
        let yaml = to_yaml(&token);
        let back = Kubeconfig::from_yaml(&yaml).expect("reads back");
        assert!(
            back.auth_infos[0]
                .auth_info
                .as_ref()
                .unwrap()
                .token
                .is_some()
        );
        assert!(
            yaml.contains("t.s"),
            "the token is written, not redacted: {yaml}"
        );
    }
}

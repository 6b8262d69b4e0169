//! Peering without an invite, as the provider's controller sees it: the enrollment
//! credential's token Secret and how far it reaches, and which PeeringPolicy (if any) approves
//! a request by its key — with the names and key fingerprints they share with the admin
//! library, re-exported from [`crate::credentials`]. Enabling enrollment, deciding requests by
//! hand and enrolling a consumer are the admin library's (`tandem_admin::enroll`).

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tandem_api::{PeeringPolicy, names};

#[cfg(test)]
pub(crate) use crate::credentials::with_broken_signature;
pub use crate::credentials::{
    CLUSTER_INFO, CONDITION_ANNOTATION, CONFINED, CertificateKey, DEFAULT_MAX_PENDING,
    DEFAULT_REQUEST_TTL, ENROLL_OBJECTS, ENROLL_QUOTA, ENROLLMENT_CONFIGMAP, FILED_ANNOTATION,
    MODE_ENROLL, MODE_KEY, PUBLIC_INFO_ROLE, REQUEST_TTL_ANNOTATION, SOURCE_KEY, certificate_key,
    condition_of, csr_key_fingerprint, key_fingerprint_der, own_key_fingerprint, quota_key,
    request_name,
};
use crate::invite::{InviteError, api};

/// The enrollment credential's token Secret, if there is one.
pub async fn token_secret(client: &Client) -> Result<Option<Secret>, InviteError> {
    Ok(crate::invite::managed_tokens(client)
        .await?
        .into_iter()
        .find(crate::invite::is_enrollment_token))
}

/// `<id>.<secret>` of a bootstrap-token Secret.
pub fn bearer_of(secret: &Secret) -> Option<String> {
    let data = secret.data.as_ref()?;
    let get = |k: &str| {
        data.get(k)
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    };
    Some(format!("{}.{}", get("token-id")?, get("token-secret")?))
}

/// What the enrollment credential (token `token_id`, once there is one) reaches beyond filing
/// peering requests, one binding a line (see [`tandem_core::enrollment::reach_beyond_filing`]).
/// Every bootstrap token is in `system:bootstrappers` and `system:authenticated`: what an
/// administrator binds to either (kubelet TLS bootstrapping, a "read-only for everyone" grant)
/// the public credential gets too.
pub async fn credential_reach(
    client: &Client,
    token_id: Option<&str>,
) -> Result<Vec<String>, InviteError> {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
    use tandem_core::enrollment::{Binding, Credential, reach_beyond_filing};
    let binding = |namespace: Option<String>,
                   name: String,
                   role: &RoleRef,
                   subjects: &Option<Vec<Subject>>| Binding {
        namespace,
        name,
        role_kind: role.kind.clone(),
        role_name: role.name.clone(),
        subjects: subjects
            .iter()
            .flatten()
            .map(|s| (s.kind.clone(), s.name.clone()))
            .collect(),
    };
    let cluster = Api::<ClusterRoleBinding>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api("listing ClusterRoleBindings"))?;
    let namespaced = Api::<RoleBinding>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api("listing RoleBindings"))?;
    let bindings: Vec<Binding> = cluster
        .items
        .iter()
        .map(|b| binding(None, b.name_any(), &b.role_ref, &b.subjects))
        .chain(
            namespaced
                .items
                .iter()
                .map(|b| binding(b.namespace(), b.name_any(), &b.role_ref, &b.subjects)),
        )
        .collect();
    let user = token_id.map(|id| format!("system:bootstrap:{id}"));
    Ok(reach_beyond_filing(
        &bindings,
        &Credential {
            user: user.as_deref().unwrap_or_default(),
            enroll_group: names::ENROLL_GROUP,
            own_binding: (names::ENROLL_NAMESPACE, ENROLL_OBJECTS, ENROLL_OBJECTS),
        },
    ))
}

/// Why no PeeringPolicy approves a consumer: the near misses, in the order found (none when
/// no policy names its key or its cluster ID).
#[derive(Clone, Debug, Default, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.near_misses.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct NoPolicy {
    pub near_misses: Vec<NearMiss>,
}

/// A PeeringPolicy that names the consumer yet does not approve it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NearMiss {
    #[error("PeeringPolicy {policy} matches but expired")]
    Expired { policy: String },
    #[error("PeeringPolicy {policy} names this key for cluster {named}, not {claimed}")]
    OtherCluster {
        policy: String,
        named: String,
        claimed: String,
    },
    #[error(
        "PeeringPolicy {policy} names cluster {cluster} without a key fingerprint, which approves nothing"
    )]
    NoKey { policy: String, cluster: String },
}

/// The PeeringPolicy approving a consumer with key `fingerprint` claiming `cluster_id` at
/// `now` (Unix seconds), if any; else why none does, for the request's message.
pub fn matching_policy<'a>(
    policies: &'a [PeeringPolicy],
    fingerprint: &str,
    cluster_id: &str,
    now: i64,
) -> Result<&'a PeeringPolicy, NoPolicy> {
    let mut near_misses = Vec::new();
    for p in policies {
        // An expiry that does not read as RFC 3339 counts as passed: a policy never approves
        // for longer than its author wrote.
        let expired = p.spec.expires.as_deref().is_some_and(|e| {
            e.parse::<k8s_openapi::jiff::Timestamp>()
                .map_or(true, |e| e.as_second() <= now)
        });
        for c in &p.spec.consumers {
            match (&c.key_fingerprint, &c.cluster_id) {
                (Some(fp), id)
                    if fp == fingerprint && id.as_ref().is_none_or(|i| i == cluster_id) =>
                {
                    if expired {
                        near_misses.push(NearMiss::Expired {
                            policy: p.name_any(),
                        });
                    } else {
                        return Ok(p);
                    }
                }
                (Some(fp), Some(id)) if fp == fingerprint => {
                    near_misses.push(NearMiss::OtherCluster {
                        policy: p.name_any(),
                        named: id.clone(),
                        claimed: cluster_id.to_string(),
                    })
                }
                (None, Some(id)) if id == cluster_id => near_misses.push(NearMiss::NoKey {
                    policy: p.name_any(),
                    cluster: id.clone(),
                }),
                _ => {}
            }
        }
    }
    Err(NoPolicy { near_misses })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_api::{PeeringPolicySpec, PolicyConsumer};

    fn policy(
        name: &str,
        consumers: &[(Option<&str>, Option<&str>)],
        expires: Option<&str>,
    ) -> PeeringPolicy {
        PeeringPolicy::new(
            name,
            PeeringPolicySpec {
                consumers: consumers
                    .iter()
                    .map(|(fp, id)| PolicyConsumer {
                        key_fingerprint: fp.map(str::to_string),
                        cluster_id: id.map(str::to_string),
                    })
                    .collect(),
                expires: expires.map(str::to_string),
                ..Default::default()
            },
        )
    }

    #[test]
    fn only_a_key_fingerprint_approves() {
        const NOW: i64 = 1_800_000_000;
        let key = "sha256:aa";
        let cases: Vec<(&str, Vec<PeeringPolicy>, Result<&str, &str>)> = vec![
            (
                "the key",
                vec![policy("p", &[(Some(key), None)], None)],
                Ok("p"),
            ),
            (
                "the key and the cluster ID",
                vec![policy("p", &[(Some(key), Some("rome"))], None)],
                Ok("p"),
            ),
            (
                "the cluster ID alone",
                vec![policy("by-name", &[(None, Some("rome"))], None)],
                Err(
                    "PeeringPolicy by-name names cluster rome without a key fingerprint, which approves nothing",
                ),
            ),
            (
                "the key for another cluster ID",
                vec![policy("p", &[(Some(key), Some("turin"))], None)],
                Err("PeeringPolicy p names this key for cluster turin, not rome"),
            ),
            (
                "another key",
                vec![policy("p", &[(Some("sha256:bb"), None)], None)],
                Err(""),
            ),
            (
                "an expired policy",
                vec![policy(
                    "old",
                    &[(Some(key), None)],
                    Some("2020-01-01T00:00:00Z"),
                )],
                Err("PeeringPolicy old matches but expired"),
            ),
            (
                "an expired policy and a live one",
                vec![
                    policy("old", &[(Some(key), None)], Some("2020-01-01T00:00:00Z")),
                    policy("new", &[(Some(key), None)], Some("2099-01-01T00:00:00Z")),
                ],
                Ok("new"),
            ),
        ];
        for (what, policies, want) in cases {
            let got = matching_policy(&policies, key, "rome", NOW)
                .map(|p| p.name_any())
                .map_err(|e| e.to_string());
            assert_eq!(got.as_deref().map_err(String::as_str), want, "{what}");
        }
    }

    #[test]
    fn a_certificate_tells_its_key_groups_and_expiry() {
        use rcgen::PublicKeyData;
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "tandem:peer:rome");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "tandem:peers");
        params.not_after = rcgen::date_time_ymd(2030, 1, 2);
        let cert = params.self_signed(&key).unwrap().pem();
        let got = certificate_key(&cert).expect("a certificate");
        assert_eq!(
            got,
            CertificateKey {
                fingerprint: key_fingerprint_der(&key.subject_public_key_info()),
                groups: vec!["tandem:peers".into()],
                not_after: 1_893_542_400,
            }
        );
        assert_eq!(certificate_key("not a certificate"), None);
    }

    #[test]
    fn a_csr_gives_its_key_only_when_signed_with_it() {
        let key = rcgen::KeyPair::generate().unwrap();
        let csr = rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap();
        {
            use rcgen::PublicKeyData;
            assert_eq!(
                csr_key_fingerprint(&csr),
                Some(key_fingerprint_der(&key.subject_public_key_info()))
            );
        }
        // The same request with a signature that does not verify: it names the key, but does
        // not prove it.
        assert_eq!(csr_key_fingerprint(&with_broken_signature(&csr)), None);
        assert_eq!(csr_key_fingerprint("not a CSR"), None);
    }

    #[test]
    fn a_request_is_named_after_its_key() {
        let fp = tandem_core::discovery::fingerprint(b"key");
        let name = request_name(&fp);
        assert_eq!(name.len(), "enroll-".len() + 32);
        assert!(fp.contains(name.strip_prefix("enroll-").unwrap()));
    }
}

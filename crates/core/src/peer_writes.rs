//! What a provider lets a consumer's peer identity write in its twin namespaces besides
//! ShadowPods, pure: Services, EndpointSlices and PersistentVolumeClaims. Honest reflection
//! writes ClusterIP Services without cluster IPs, EndpointSlices whose addresses are the
//! consumer's pods (in the range the provider granted it) or the real pods of its own
//! ShadowPods, and claims sized from the consumer's. Anything else a peer identity could write
//! there turns the provider's network or storage against itself: a NodePort or LoadBalancer
//! Service with a hand-written slice forwards the provider's public ports to any address inside
//! it (the CVE-2021-25740 class), `externalIPs` intercept traffic to any address
//! (CVE-2020-8554), and a claim naming a volume, a selector or a data source reaches another
//! tenant's data. The provider's controller serves these checks as a validating webhook.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

use crate::pod_admission::Refusal;

/// The Service types a Tenant may allow its consumer besides ClusterIP (headless included).
pub const GRANTABLE_SERVICE_TYPES: [&str; 3] = ["NodePort", "LoadBalancer", "ExternalName"];

fn refuse<T>(rule: &'static str, detail: String) -> Result<T, Refusal> {
    Err(Refusal {
        rule,
        detail,
        pod_security: None,
    })
}

fn is_set(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    }
}

/// A Service written by the peer: ClusterIP or headless only unless `allowed_types` (the
/// Tenant's `allowedServiceTypes`) names its type; never `externalIPs`. (A cluster IP the peer
/// asks for is not refused: the API server allocates before validating admission, so a webhook
/// cannot tell it from one allocated, and the allocator keeps it inside the service range and
/// unused.)
pub fn check_service(svc: &Value, allowed_types: &[String]) -> Result<(), Refusal> {
    let spec = &svc["spec"];
    let type_ = spec["type"].as_str().unwrap_or("ClusterIP");
    if type_ != "ClusterIP" && !allowed_types.iter().any(|t| t == type_) {
        return refuse(
            "services",
            format!(
                "type {type_} is not allowed for a peer (only ClusterIP and headless Services, \
                 unless the Tenant's spec.allowedServiceTypes names {type_})"
            ),
        );
    }
    if is_set(&spec["externalIPs"]) {
        return refuse(
            "services",
            "externalIPs are never allowed for a peer (they intercept traffic to any address: \
             CVE-2020-8554)"
                .into(),
        );
    }
    Ok(())
}

/// An EndpointSlice written by the peer: IPv4 or IPv6 addresses only, each inside `ranges`
/// (the consumer's pod and external ranges as the provider granted them) or the address of
/// one of `own_pods` (the real pods of the consumer's ShadowPods in that twin namespace) —
/// what honest reflection writes.
pub fn check_endpoint_slice(
    slice: &Value,
    ranges: &[IpNet],
    own_pods: &BTreeSet<IpAddr>,
) -> Result<(), Refusal> {
    let address_type = slice["addressType"].as_str().unwrap_or("");
    if !matches!(address_type, "IPv4" | "IPv6") {
        return refuse(
            "endpoint-slices",
            format!("addressType {address_type:?}: only IPv4 and IPv6 slices are reflected"),
        );
    }
    for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
        for address in endpoint["addresses"].as_array().into_iter().flatten() {
            let text = address.as_str().unwrap_or_default();
            let Ok(ip) = text.parse::<IpAddr>() else {
                return refuse(
                    "endpoint-slices",
                    format!("endpoint address {text:?} is not an IP address"),
                );
            };
            if !ranges.iter().any(|r| r.contains(&ip)) && !own_pods.contains(&ip) {
                let granted = if ranges.is_empty() {
                    "no range is granted to it".to_string()
                } else {
                    let r: Vec<String> = ranges.iter().map(ToString::to_string).collect();
                    format!("granted: {}", r.join(", "))
                };
                return refuse(
                    "endpoint-slices",
                    format!(
                        "endpoint address {ip} is neither in the consumer's ranges ({granted}) \
                         nor a pod of its own in this namespace"
                    ),
                );
            }
        }
    }
    Ok(())
}

/// The storage a consumer's claims use, summed over all of its twin namespaces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageUse {
    /// Requested storage, in thousandths of a byte (as [`crate::shadow::parse_quantity`]).
    pub storage: i128,
    pub claims: i128,
}

impl StorageUse {
    /// What one claim adds.
    pub fn of_claim(pvc: &Value) -> StorageUse {
        StorageUse {
            storage: pvc["spec"]["resources"]["requests"]["storage"]
                .as_str()
                .and_then(crate::shadow::parse_quantity)
                .unwrap_or(0),
            claims: 1,
        }
    }
}

impl std::ops::Add for StorageUse {
    type Output = StorageUse;
    fn add(self, o: StorageUse) -> StorageUse {
        StorageUse {
            storage: self.storage + o.storage,
            claims: self.claims + o.claims,
        }
    }
}

impl std::ops::Sub for StorageUse {
    type Output = StorageUse;
    fn sub(self, o: StorageUse) -> StorageUse {
        StorageUse {
            storage: self.storage - o.storage,
            claims: self.claims - o.claims,
        }
    }
}

/// The storage part of a grant: `requests.storage` and `persistentvolumeclaims`, each
/// unbounded when absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageGrant {
    pub storage: Option<i128>,
    pub claims: Option<i128>,
}

impl StorageGrant {
    /// From a Tenant's grant (quantity strings by resource name).
    pub fn from_grant<'a>(grant: impl IntoIterator<Item = (&'a String, &'a str)>) -> StorageGrant {
        let mut g = StorageGrant::default();
        for (k, v) in grant {
            match k.as_str() {
                "requests.storage" => g.storage = crate::shadow::parse_quantity(v),
                "persistentvolumeclaims" => {
                    g.claims = crate::shadow::parse_quantity(v).map(|m| m / 1000)
                }
                _ => {}
            }
        }
        g
    }
}

/// A claim written by the peer (`old`: the stored one, on update): a StorageClass of
/// `classes` (the Tenant's `storageClasses` and the provider's default class) or none; never a
/// chosen volume, a selector or a data source; and, summed over all of the consumer's twin
/// namespaces (`used`: every other claim it has, admitted or stored), within its grant.
pub fn check_claim(
    pvc: &Value,
    old: Option<&Value>,
    classes: &[String],
    grant: StorageGrant,
    used: StorageUse,
) -> Result<(), Refusal> {
    let spec = &pvc["spec"];
    if let Some(class) = spec["storageClassName"].as_str() {
        if class.is_empty() {
            return refuse(
                "claims",
                "storageClassName \"\" binds a pre-provisioned volume of the provider; leave it \
                 unset for the provider's default class"
                    .into(),
            );
        }
        if !classes.iter().any(|c| c == class) {
            return refuse(
                "claims",
                format!(
                    "StorageClass {class:?} is not offered to this consumer (the Tenant's \
                     spec.storageClasses; unset: the provider's default class)"
                ),
            );
        }
    }
    // On update the bound volume's name is the provider's (its binder sets it): only a change
    // is the peer's.
    let old_volume = old.map(|o| &o["spec"]["volumeName"]);
    if is_set(&spec["volumeName"]) && old_volume != Some(&spec["volumeName"]) {
        return refuse(
            "claims",
            "volumeName: a peer's claim never names a volume (it could bind another tenant's)"
                .into(),
        );
    }
    for field in ["selector", "dataSource", "dataSourceRef"] {
        if is_set(&spec[field]) && old.map(|o| &o["spec"][field]) != Some(&spec[field]) {
            return refuse(
                "claims",
                format!("{field}: a peer's claim is always a new, empty volume"),
            );
        }
    }
    let after = used + StorageUse::of_claim(pvc);
    let before = used + old.map(StorageUse::of_claim).unwrap_or_default();
    let grows = |now: i128, was: i128, limit: Option<i128>| limit.filter(|l| now > *l && now > was);
    if let Some(limit) = grows(after.storage, before.storage, grant.storage) {
        return refuse(
            "storage-grant",
            format!(
                "the consumer's claims in all of its namespaces here would request {} bytes of \
                 storage, beyond its grant of {} (requests.storage)",
                after.storage / 1000,
                limit / 1000
            ),
        );
    }
    if let Some(limit) = grows(after.claims, before.claims, grant.claims) {
        return refuse(
            "storage-grant",
            format!(
                "the consumer would have {} claims in all of its namespaces here, beyond its grant \
                 of {limit} (persistentvolumeclaims)",
                after.claims
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(r: Result<(), Refusal>) -> String {
        r.expect_err("refused").to_string()
    }

    #[test]
    fn services_are_cluster_ip_unless_the_tenant_grants_a_type() {
        let svc = |spec: Value| json!({"spec": spec});
        let none: &[String] = &[];
        assert!(check_service(&svc(json!({"ports": [{"port": 80}]})), none).is_ok());
        assert!(
            check_service(
                &svc(json!({"type": "ClusterIP", "clusterIP": "None"})),
                none
            )
            .is_ok()
        );
        for t in GRANTABLE_SERVICE_TYPES {
            let msg = refused(check_service(&svc(json!({"type": t})), none));
            assert!(msg.starts_with("refused by rule services: type"), "{msg}");
            assert!(check_service(&svc(json!({"type": t})), &[t.to_string()]).is_ok());
        }
        let all: Vec<String> = GRANTABLE_SERVICE_TYPES.map(String::from).to_vec();
        let msg = refused(check_service(
            &svc(json!({"type": "LoadBalancer", "externalIPs": ["192.0.2.1"]})),
            &all,
        ));
        assert!(msg.contains("externalIPs"), "{msg}");
    }

    #[test]
    fn slices_point_only_at_the_consumers_ranges_and_its_own_pods() {
        let ranges: Vec<IpNet> = vec!["10.245.0.0/16".parse().unwrap()];
        let own: BTreeSet<IpAddr> = ["10.244.1.7".parse().unwrap()].into();
        let slice = |addresses: Value| json!({"addressType": "IPv4", "endpoints": [{"addresses": addresses}]});
        assert!(
            check_endpoint_slice(&slice(json!(["10.245.3.4", "10.244.1.7"])), &ranges, &own)
                .is_ok()
        );
        for (address, why) in [
            ("10.244.1.8", "another tenant's or the provider's pod"),
            ("172.18.0.2", "a node"),
            ("169.254.169.254", "the metadata service"),
            ("127.0.0.1", "loopback"),
        ] {
            let msg = refused(check_endpoint_slice(
                &slice(json!([address])),
                &ranges,
                &own,
            ));
            assert!(
                msg.starts_with("refused by rule endpoint-slices: endpoint address")
                    && msg.contains(address),
                "{why}: {msg}"
            );
        }
        assert!(
            refused(check_endpoint_slice(
                &slice(json!(["10.244.1.8"])),
                &[],
                &own
            ))
            .contains("no range is granted")
        );
        let fqdn = json!({"addressType": "FQDN", "endpoints": [{"addresses": ["metadata.google.internal"]}]});
        assert!(refused(check_endpoint_slice(&fqdn, &ranges, &own)).contains("addressType"));
    }

    #[test]
    fn claims_are_new_volumes_of_an_offered_class_within_the_summed_grant() {
        let claim = |spec: Value| {
            let mut spec = spec;
            spec["resources"] = json!({"requests": {"storage": "1Gi"}});
            json!({"spec": spec})
        };
        let offered = ["fast".to_string()];
        let unbounded = StorageGrant::default();
        let none = StorageUse::default();
        assert!(check_claim(&claim(json!({})), None, &offered, unbounded, none).is_ok());
        assert!(
            check_claim(
                &claim(json!({"storageClassName": "fast"})),
                None,
                &offered,
                unbounded,
                none
            )
            .is_ok()
        );
        for (spec, needle) in [
            (json!({"storageClassName": "slow"}), "StorageClass \"slow\""),
            (json!({"storageClassName": ""}), "pre-provisioned"),
            (json!({"volumeName": "pv-of-another-tenant"}), "volumeName"),
            (
                json!({"selector": {"matchLabels": {"tenant": "b"}}}),
                "selector",
            ),
            (
                json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "x"}}),
                "dataSource",
            ),
            (
                json!({"dataSourceRef": {"kind": "VolumeSnapshot", "name": "x"}}),
                "dataSourceRef",
            ),
        ] {
            let msg = refused(check_claim(&claim(spec), None, &offered, unbounded, none));
            assert!(
                msg.starts_with("refused by rule claims:") && msg.contains(needle),
                "{msg}"
            );
        }
        // Bound by the binder: the stored volume name is not the peer's choice.
        let bound = claim(json!({"volumeName": "pvc-123"}));
        assert!(check_claim(&bound, Some(&bound), &offered, unbounded, none).is_ok());

        let grant = StorageGrant::from_grant([
            (&"requests.storage".to_string(), "3Gi"),
            (&"persistentvolumeclaims".to_string(), "3"),
        ]);
        let gib = 1i128 << 30;
        let used = StorageUse {
            storage: 2 * gib * 1000,
            claims: 2,
        };
        assert!(check_claim(&claim(json!({})), None, &offered, grant, used).is_ok());
        let full = StorageUse {
            storage: 3 * gib * 1000,
            claims: 2,
        };
        let msg = refused(check_claim(&claim(json!({})), None, &offered, grant, full));
        assert!(
            msg.starts_with("refused by rule storage-grant:")
                && msg.contains("all of its namespaces"),
            "{msg}"
        );
        let many = StorageUse {
            storage: 0,
            claims: 3,
        };
        assert!(
            refused(check_claim(&claim(json!({})), None, &offered, grant, many))
                .contains("persistentvolumeclaims")
        );
        // An update that does not grow is allowed even over the grant (a grant cut later).
        let stored = claim(json!({}));
        assert!(check_claim(&stored, Some(&stored), &offered, grant, full).is_ok());
    }
}

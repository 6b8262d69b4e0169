//! Colliding cluster IDs (issue 47, item 8): a peer chooses its own cluster ID, and the names
//! Tandem derives from it — the gateway's TUN interface, the nftables table named after it,
//! the EndpointSlices of multi-cluster imports — used a 32-bit hash, so two chosen IDs shared
//! them after about 2^16 tries. There is nothing to refuse here: the defence is that the names
//! no longer meet, which these tests check with two IDs that did.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::mcs::{SERVICE_NAME_LABEL, SOURCE_CLUSTER_LABEL};
use tandem_controller::fabric::gateway::{PeerView, gateway_args};
use tandem_core::names::{gateway_interface, import_slice, legacy_short_hash};
use tandem_core::nat::{ClusterPrefixes, NatPlanInput};

use crate::support::{self, Cluster, until};

/// Two cluster IDs with the same old 32-bit FNV-1a hash (`5cdffd25`), found offline by brute
/// force over `hostile-0`, `hostile-1`, … with the old function (`tandem_core::names::
/// legacy_short_hash`), keeping every hash seen until one came back: the 732,781st ID met
/// the 499th.
const COLLIDING: [&str; 2] = ["hostile-498", "hostile-732780"];

const WAIT: Duration = Duration::from_secs(30);

fn prefixes(pod: &str, external: &str) -> ClusterPrefixes {
    ClusterPrefixes {
        pod_cidr: pod.parse().unwrap(),
        external_cidr: external.parse().unwrap(),
    }
}

/// What this cluster knows of a peer once negotiated (the same for both peers: only the ID
/// differs, as an attacker would arrange).
fn view(peer: &str) -> PeerView {
    PeerView {
        peer: peer.to_string(),
        peer_public_key: Some(tandem_net::public_key(&tandem_net::generate_private_key()).unwrap()),
        peer_endpoint: Some("192.0.2.9:51820".into()),
        nat: Some(NatPlanInput {
            local: prefixes("10.244.0.0/16", "10.70.0.0/16"),
            local_as_seen_by_peer: prefixes("10.0.0.0/16", "10.1.0.0/16"),
            peer_as_seen_locally: prefixes("10.2.0.0/16", "10.3.0.0/16"),
        }),
        consumer_of: false,
        provider_for: true,
    }
}

/// Attack 1: two peers whose IDs collide under the old hash each get a gateway of their own
/// — interface and nftables table — where before they shared both (one peer's NAT rules and
/// tunnel replaced the other's).
#[test]
fn colliding_ids_get_their_own_gateway_interface_and_table() {
    let [a, b] = COLLIDING;
    assert_eq!(
        legacy_short_hash(a),
        legacy_short_hash(b),
        "the premise: {a} and {b} collide under the old hash"
    );
    let key = tandem_net::generate_private_key();
    let configs: Vec<tandem_net::GatewayConfig> = [(a, 51820), (b, 51821)]
        .into_iter()
        .map(|(peer, port)| {
            tandem_net::GatewayConfig::try_from(
                gateway_args(&view(peer), &key, port, Vec::new())
                    .expect("a negotiated peer has gateway args"),
            )
            .unwrap_or_else(|e| panic!("{peer}: {e}"))
        })
        .collect();
    assert_ne!(configs[0].interface, configs[1].interface);
    assert_ne!(configs[0].nft_table, configs[1].nft_table);
    for (config, peer) in configs.iter().zip(COLLIDING) {
        assert_eq!(config.interface, gateway_interface(peer));
        assert!(config.interface.len() <= 15, "{}", config.interface);
        // The only name each gateway removes at start is the one both had under the old
        // hash: never the other's current interface or table.
        assert_eq!(config.legacy_interfaces, ["tdm-5cdffd25"]);
        assert_eq!(config.legacy_nft_tables, ["tandem_tdm_5cdffd25"]);
        for other in &configs {
            assert!(!config.legacy_interfaces.contains(&other.interface));
            assert!(!config.legacy_nft_tables.contains(&other.nft_table));
        }
    }
}

/// The import's EndpointSlices in `ns`: (source cluster, addresses, slice name).
async fn import_slices(
    client: &Client,
    ns: &str,
    name: &str,
) -> Vec<(String, BTreeSet<String>, String)> {
    let mut out: Vec<_> = Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={name}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| {
            let cluster = s
                .labels()
                .get(SOURCE_CLUSTER_LABEL)
                .cloned()
                .unwrap_or_default();
            let addresses = s
                .endpoints
                .iter()
                .flat_map(|e| e.addresses.clone())
                .collect();
            (cluster, addresses, s.name_any())
        })
        .collect();
    out.sort();
    out
}

async fn create(client: &Client, ns: Option<&str>, doc: serde_json::Value) {
    let obj: kube::api::DynamicObject = serde_json::from_value(doc).unwrap();
    let gvk = kube::core::GroupVersionKind::try_from(obj.types.as_ref().unwrap()).unwrap();
    let (ar, _) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
    let api: Api<kube::api::DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating {}: {e}", obj.name_any()),
    }
}

/// Attack 2: two providers whose IDs collide under the old hash export the same Service to
/// one consumer. Their endpoints land in slices of their own in the consumer's import, where
/// before both were written to one slice name and each pass replaced the other's endpoints.
/// Then the upgrade: a slice under the old name (what an earlier version wrote) is removed
/// and the import keeps both providers' endpoints.
#[tokio::test(flavor = "multi_thread")]
async fn colliding_providers_keep_their_own_import_slices() {
    let [a, b] = COLLIDING;
    let first = Cluster::start(a, "eu-south", 1).await;
    let second = Cluster::start(b, "eu-south", 1).await;
    let rome = Cluster::start("rome", "eu-central", 1).await;
    let to_first = support::peer(&rome, &first).await;
    let to_second = support::peer(&rome, &second).await;
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}});
    // rome's admin opts `demo` in to its providers' exports (MCS imports only where shared).
    create(
        &rome.client,
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo",
               "annotations": {tandem_core::mcs::IMPORT_FROM_ANNOTATION: "*"}}}),
    )
    .await;
    for (provider, replicas) in [(&first, 2), (&second, 1)] {
        let c = &provider.client;
        create(c, None, namespace.clone()).await;
        create(c, Some("demo"), support::deployment("hello", replicas)).await;
        create(
            c,
            Some("demo"),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hello"},
                   "spec": {"selector": {"app": "hello"},
                            "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
        )
        .await;
        create(
            c,
            Some("demo"),
            json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
                   "metadata": {"name": "hello"}}),
        )
        .await;
    }
    // Each provider's pods as rome reaches them.
    let mut want = Vec::new();
    let derived = tandem_controller::mcs::derived_service_name("demo", "hello");
    for (provider, peering, replicas) in [(&first, &to_first, 2), (&second, &to_second, 1)] {
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(provider.client.clone(), "demo");
        let ips: BTreeSet<String> =
            until(&format!("{}'s pods running", provider.id), WAIT, || async {
                let ips: BTreeSet<String> = pods
                    .list(&ListParams::default().labels("app=hello"))
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter_map(|p| p.status?.pod_ip)
                    .collect();
                (ips.len() == replicas).then_some(ips)
            })
            .await;
        let (here, there) = support::remote_pod_cidrs(peering);
        want.push((
            provider.id.clone(),
            ips.iter()
                .map(|ip| support::translate(ip, there, here))
                .collect::<BTreeSet<_>>(),
        ));
    }
    want.sort();
    // What a user sees: both providers' endpoints in rome's import (under the old names one
    // slice held whichever provider was written last).
    let endpoints = || async {
        import_slices(&rome.client, "demo", "hello")
            .await
            .into_iter()
            .map(|(cluster, addresses, _)| (cluster, addresses))
            .collect::<Vec<_>>()
    };
    until(
        "rome's import holds both colliding providers' endpoints",
        WAIT,
        || async { (endpoints().await == want).then_some(()) },
    )
    .await;
    let names: Vec<String> = import_slices(&rome.client, "demo", "hello")
        .await
        .into_iter()
        .map(|(.., name)| name)
        .collect();
    assert_eq!(
        names,
        [import_slice(&derived, a, 0), import_slice(&derived, b, 0)],
        "each provider's slice under its own name"
    );

    // An earlier version's slice (its name from the old hash, the same labels) is replaced.
    let old = format!("{derived}-{}-0", legacy_short_hash(a));
    let labels = json!({
        "kubernetes.io/service-name": derived,
        "endpointslice.kubernetes.io/managed-by": tandem_controller::mcs::SLICE_MANAGER,
        SERVICE_NAME_LABEL: "hello",
        SOURCE_CLUSTER_LABEL: a,
    });
    create(
        &rome.client,
        Some("demo"),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": old, "labels": labels},
               "addressType": "IPv4",
               "endpoints": [{"addresses": ["10.99.0.7"], "conditions": {"ready": true}}],
               "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
    )
    .await;
    until(
        "the old-named slice removed, both providers' slices kept",
        WAIT,
        || async {
            let now: Vec<String> = import_slices(&rome.client, "demo", "hello")
                .await
                .into_iter()
                .map(|(.., name)| name)
                .collect();
            (now == names && endpoints().await == want).then_some(())
        },
    )
    .await;
}

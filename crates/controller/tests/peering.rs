//! The invite flow end to end on lab clusters: invite → peer → Established with the grant and
//! the network remap; refused tokens leave nothing behind; the grant follows the provider;
//! unpeer removes everything Tandem-owned of the peering on both sides.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use support::{Cluster, tandem_owned, until, until_owned};
use tandem_admin::invite::{self, UnpeerProgress};
use tandem_api::{NetworkParameters, Peering, PeeringRequest, Tenant, names};
use tandem_controller::consumer::peering::UnpeerStep;

/// How long Tandem's objects may take to settle after a step.
const OBJECTS_WAIT: Duration = Duration::from_secs(20);

fn condition<'a>(p: &'a Peering, t: &str) -> Option<&'a str> {
    p.status
        .as_ref()
        .and_then(|s| tandem_api::conditions::find(&s.conditions, t))
        .map(|c| c.status.as_str())
}

#[tokio::test]
async fn invite_peer_negotiate_shrink_unpeer() {
    let provider = Cluster::start("milan", "eu-south", 2).await;
    let consumer = Cluster::start("rome", "eu-central", 1).await;
    let provider_before = tandem_owned(&provider.client).await;
    let consumer_before = tandem_owned(&consumer.client).await;

    let peering = support::peer(&consumer, &provider).await;
    let status = peering.status.clone().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Established"));
    for c in [
        "Authenticated",
        "ResourcesGranted",
        "NetworkNegotiated",
        "ProviderReachable",
    ] {
        assert_eq!(condition(&peering, c), Some("True"), "{c}: {status:?}");
    }
    for r in ["cpu", "memory", "pods"] {
        assert!(
            status.granted.contains_key(r),
            "granted {r}: {:?}",
            status.granted
        );
    }
    assert_eq!(
        status
            .node_labels
            .get("topology.kubernetes.io/region")
            .map(String::as_str),
        Some("eu-south")
    );
    assert_eq!(
        status.remote_tenant_namespace.as_deref(),
        Some("tandem-tenant-rome")
    );
    let network = status.network.clone().unwrap();
    // Both lab clusters use 10.244.0.0/16: each side remaps the other's.
    assert_eq!(network.remote_pod_cidr, "10.244.0.0/16");
    assert_ne!(network.remapped_remote_pod_cidr, "10.244.0.0/16");
    let there = network.local_pod_cidr_in_remote.clone().unwrap();
    assert_ne!(there, "10.244.0.0/16");

    // Provider side: the Tenant with its grant, both network parameters with each other's remap.
    let tenants: Api<Tenant> = Api::namespaced(provider.client.clone(), "tandem-tenant-rome");
    let tenant = tenants.get("rome").await.unwrap();
    assert_eq!(tenant.spec.grant, status.granted);
    let params: Api<NetworkParameters> =
        Api::namespaced(provider.client.clone(), "tandem-tenant-rome");
    let theirs = params.get("provider").await.unwrap();
    assert_eq!(
        theirs.status.unwrap().remapped_pod_cidr.as_deref(),
        Some(network.remapped_remote_pod_cidr.as_str())
    );
    let ours = params.get("consumer").await.unwrap();
    assert_eq!(ours.status.clone().unwrap().remapped_pod_cidr, Some(there));
    // Each side's WireGuard key for the other stays in its own cluster; only the public keys
    // travel, and the consumer knows the provider's.
    let private_key = |cluster: &Cluster, peer: &'static str| {
        let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), names::SYSTEM_NAMESPACE);
        async move {
            let secret = secrets
                .get(&tandem_controller::fabric::gateway_secret(peer))
                .await
                .unwrap_or_else(|e| panic!("the gateway key for {peer}: {e}"));
            let data = secret.data.unwrap();
            String::from_utf8(data[tandem_controller::fabric::PRIVATE_KEY].0.clone()).unwrap()
        }
    };
    let consumer_key = private_key(&consumer, "milan").await;
    let provider_key = private_key(&provider, "rome").await;
    assert_ne!(consumer_key, provider_key);
    let consumer_public = tandem_net::public_key(&consumer_key).unwrap();
    let provider_public = tandem_net::public_key(&provider_key).unwrap();
    assert_eq!(
        ours.spec.public_key.as_deref(),
        Some(consumer_public.as_str())
    );
    let theirs = params.get("provider").await.unwrap();
    assert_eq!(
        theirs.spec.public_key.as_deref(),
        Some(provider_public.as_str())
    );
    assert_eq!(
        network.remote_public_key.as_deref(),
        Some(provider_public.as_str())
    );
    for np in [&ours, &theirs] {
        let text = serde_json::to_string(np).unwrap();
        assert!(
            !text.contains(&consumer_key) && !text.contains(&provider_key),
            "no private key in a NetworkParameters: {text}"
        );
    }
    // The request is cleaned up once the consumer authenticated; the token is spent.
    let requests: Api<PeeringRequest> =
        Api::namespaced(provider.client.clone(), names::SYSTEM_NAMESPACE);
    until(
        "the peering request to be removed",
        Duration::from_secs(10),
        || async {
            requests
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
                .then_some(())
        },
    )
    .await;
    // The consumer no longer holds the token, only its identity.
    let secrets: Api<Secret> = Api::namespaced(consumer.client.clone(), "tandem-tenant-milan");
    assert!(
        secrets
            .get_opt("tandem-invite-milan")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        secrets
            .get_opt("tandem-identity-milan")
            .await
            .unwrap()
            .is_some()
    );

    // The provider shrinks the grant: the consumer's status follows.
    tenants
        .patch(
            "rome",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"grant": {"cpu": "1", "memory": "1Gi", "pods": "7"}}})),
        )
        .await
        .unwrap();
    let peerings: Api<Peering> = Api::all(consumer.client.clone());
    until(
        "the consumer to see the smaller grant",
        Duration::from_secs(15),
        || async {
            let p = peerings.get("milan").await.unwrap();
            let g = p.status?.granted;
            (g.get("pods").map(|q| q.0.as_str()) == Some("7")).then_some(())
        },
    )
    .await;

    // Unpeer from the consumer: nothing of the peering is left on either side.
    invite::unpeer(
        &consumer.client,
        "milan",
        false,
        Duration::from_secs(20),
        &mut |_| {},
    )
    .await
    .unwrap();
    until_owned(&consumer, &consumer_before, "after unpeer", OBJECTS_WAIT).await;
    until_owned(&provider, &provider_before, "after unpeer", OBJECTS_WAIT).await;
}

#[tokio::test]
async fn refused_tokens_name_the_cause_and_leave_nothing() {
    let provider = Cluster::start("oslo", "eu-north", 1).await;
    let consumer = Cluster::start("bergen", "eu-north", 1).await;
    let other = Cluster::start("tromso", "eu-north", 1).await;
    let consumer_before = tandem_owned(&consumer.client).await;
    let other_before = tandem_owned(&other.client).await;

    // Expired: refused locally, before anything is created.
    let mut expired = support::invite(&provider, Duration::from_secs(3600)).await;
    expired.expires -= 3600 + 180;
    let err = invite::accept(&consumer.client, &expired)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("expired 3m ago"), "{err}");
    invite::revoke(&provider.client, &expired.token_id)
        .await
        .unwrap();

    let attempt = |who: &'static Cluster, inv: tandem_core::invite::PeeringInvite| async move {
        invite::accept(&who.client, &inv).await.unwrap();
        let err =
            invite::wait_established(&who.client, "oslo", Duration::from_secs(20), &mut |_| {})
                .await
                .unwrap_err()
                .to_string();
        invite::abandon(&who.client, "oslo").await.unwrap();
        err
    };
    // 'static borrows for the closure: the clusters live for the whole test.
    let consumer: &'static Cluster = Box::leak(Box::new(consumer));
    let other: &'static Cluster = Box::leak(Box::new(other));
    let provider_before = tandem_owned(&provider.client).await;

    // Wrong token: right ID, wrong secret.
    let mut wrong = support::invite(&provider, Duration::from_secs(3600)).await;
    wrong.token_secret = "aaaaaaaaaaaaaaaa".into();
    let err = attempt(consumer, wrong.clone()).await;
    assert!(
        err.contains("does not know this token (wrong or revoked)"),
        "{err}"
    );
    invite::revoke(&provider.client, &wrong.token_id)
        .await
        .unwrap();

    // Revoked token.
    let revoked = support::invite(&provider, Duration::from_secs(3600)).await;
    invite::revoke(&provider.client, &revoked.token_id)
        .await
        .unwrap();
    let err = attempt(consumer, revoked).await;
    assert!(err.contains("wrong or revoked"), "{err}");
    until_owned(
        consumer,
        &consumer_before,
        "after refused tokens",
        OBJECTS_WAIT,
    )
    .await;
    until_owned(
        &provider,
        &provider_before,
        "after refused tokens",
        OBJECTS_WAIT,
    )
    .await;

    // Reused token: a second cluster tries the invite the first one used.
    let used = support::invite(&provider, Duration::from_secs(3600)).await;
    invite::accept(&consumer.client, &used).await.unwrap();
    invite::wait_established(
        &consumer.client,
        "oslo",
        Duration::from_secs(30),
        &mut |_| {},
    )
    .await
    .unwrap();
    // The peering's objects on the provider are complete once the consumer's fence has handed
    // its first nonce back (its Lease there) and the used request was cleaned up (the
    // provider's invite sweep, every second), neither of which Established waits for.
    let consumer_fence = format!("Lease tandem-tenant-{}/{}", consumer.id, names::FENCE_LEASE);
    let provider_peered = until(
        "the consumer's fence Lease on the provider, and its request gone",
        OBJECTS_WAIT,
        || async {
            let owned = tandem_owned(&provider.client).await;
            (owned.contains(&consumer_fence)
                && !owned.iter().any(|o| o.starts_with("PeeringRequest ")))
            .then_some(owned)
        },
    )
    .await;
    let err = attempt(other, used).await;
    assert!(err.contains("already used"), "{err}");
    until_owned(other, &other_before, "after a reused token", OBJECTS_WAIT).await;
    until_owned(
        &provider,
        &provider_peered,
        "after a reused token",
        OBJECTS_WAIT,
    )
    .await;
}

#[tokio::test]
async fn unpeer_from_the_provider_side_and_force_when_the_provider_is_gone() {
    let provider = Cluster::start("lisbon", "eu-west", 1).await;
    let mut consumer = Cluster::start("porto", "eu-west", 1).await;
    let provider_before = tandem_owned(&provider.client).await;
    let consumer_before = tandem_owned(&consumer.client).await;

    // The provider's admin unpeers: the tenant goes, and the consumer sees it lost its grant.
    support::peer(&consumer, &provider).await;
    invite::unpeer(
        &provider.client,
        "porto",
        false,
        Duration::from_secs(20),
        &mut |_| {},
    )
    .await
    .unwrap();
    until_owned(
        &provider,
        &provider_before,
        "after the provider unpeered",
        OBJECTS_WAIT,
    )
    .await;
    let peerings: Api<Peering> = Api::all(consumer.client.clone());
    let p = until(
        "the consumer to notice",
        Duration::from_secs(15),
        || async {
            let p = peerings.get("lisbon").await.unwrap();
            (condition(&p, "ResourcesGranted") == Some("False")).then_some(p)
        },
    )
    .await;
    let cond =
        tandem_api::conditions::find(&p.status.as_ref().unwrap().conditions, "ResourcesGranted")
            .unwrap();
    assert!(cond.message.contains("unpeered us"), "{}", cond.message);
    // The consumer then unpeers too; the provider already forgot it, which is fine.
    invite::unpeer(
        &consumer.client,
        "lisbon",
        false,
        Duration::from_secs(20),
        &mut |_| {},
    )
    .await
    .unwrap();
    until_owned(
        &consumer,
        &consumer_before,
        "after the consumer unpeered",
        OBJECTS_WAIT,
    )
    .await;

    // Peer again, then the provider disappears for good: unpeer says at once which step fails
    // because the provider does not answer and names --force, keeps saying it while the admin
    // waits, and --force removes everything here.
    support::peer(&consumer, &provider).await;
    provider.lab.shutdown();
    let mut told = Vec::new();
    let err = invite::unpeer(
        &consumer.client,
        "lisbon",
        false,
        Duration::from_secs(15),
        &mut |p| told.push(p),
    )
    .await
    .unwrap_err();
    assert_eq!(
        told.first(),
        Some(&UnpeerProgress::PeeringDeleted {
            peer: "lisbon".into()
        }),
        "{told:#?}"
    );
    // The next thing said is the step that fails, before the wait ends.
    let stuck = told.get(1).expect("the stuck step is reported");
    assert!(
        matches!(
            stuck,
            UnpeerProgress::Stuck {
                step: UnpeerStep::DeleteTwinNamespaces,
                provider_unreachable: true,
                ..
            }
        ),
        "{told:#?}"
    );
    assert!(
        stuck.to_string().contains("lisbon is unreachable"),
        "{stuck}"
    );
    assert_eq!(
        stuck.force_hint().as_deref(),
        Some("if lisbon is gone for good, run `tandem unpeer lisbon --force`")
    );
    assert!(
        told.iter().any(|p| matches!(
            p,
            UnpeerProgress::StillStuck {
                step: UnpeerStep::DeleteTwinNamespaces,
                ..
            }
        )),
        "progress repeats while waiting: {told:#?}"
    );
    let err = err.to_string();
    assert!(err.contains("tandem unpeer lisbon --force"), "{err}");
    invite::unpeer(
        &consumer.client,
        "lisbon",
        true,
        Duration::from_secs(20),
        &mut |_| {},
    )
    .await
    .unwrap();
    until_owned(
        &consumer,
        &consumer_before,
        "after a forced unpeer",
        OBJECTS_WAIT,
    )
    .await;
    consumer.kill_controller();
}

/// Files a peering request with `provider`'s invite token as consumer graz (well-formed, as
/// the CRD's schema wants, but proving nothing, with `extra` merged into its spec) and returns
/// the provider's denial; nothing is created for graz.
async fn denial(provider: &Cluster, extra: serde_json::Value) -> String {
    let invite = support::invite(provider, Duration::from_secs(3600)).await;
    let kc = tandem_controller::consumer::peering::kubeconfig(
        &invite.endpoint,
        &invite.ca_data,
        tandem_api::kubeconfig::Credentials::Token(&invite.bearer_token()),
    );
    let token_client = tandem_controller::consumer::link::client_from_kubeconfig(&kc)
        .await
        .unwrap();
    let requests: Api<PeeringRequest> = Api::namespaced(token_client, names::SYSTEM_NAMESPACE);
    let mut req = json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "PeeringRequest",
        "metadata": {"name": invite.token_id},
        "spec": {"clusterID": "graz", "tokenID": invite.token_id, "tokenProof": "00".repeat(32),
                 "csr": "-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n"},
    });
    for (k, v) in extra.as_object().unwrap() {
        req["spec"][k] = v.clone();
    }
    let req: PeeringRequest = serde_json::from_value(req).unwrap();
    requests.create(&Default::default(), &req).await.unwrap();
    let message = until(
        "the request to be denied",
        Duration::from_secs(10),
        || async {
            let s = requests.get(&invite.token_id).await.ok()?.status?;
            (s.phase.as_deref() == Some("Denied")).then(|| s.message.unwrap_or_default())
        },
    )
    .await;
    // Nothing was created for the would-be consumer.
    let ns: Api<Namespace> = Api::all(provider.client.clone());
    assert!(ns.get_opt("tandem-tenant-graz").await.unwrap().is_none());
    message
}

#[tokio::test]
async fn the_provider_denies_a_request_that_does_not_prove_the_token_or_speaks_another_protocol() {
    let provider = Cluster::start("vienna", "eu-central", 1).await;
    let message = denial(&provider, json!({})).await;
    assert!(message.contains("tokenProof does not match"), "{message}");
    // A consumer speaking a protocol this provider cannot is told so, naming both versions,
    // before anything else of its request is judged.
    let message = denial(&provider, json!({"protocolVersion": 99})).await;
    assert_eq!(
        message,
        format!(
            "the consumer speaks peering protocol v99, and this tandem speaks v{}; upgrade the \
             older side",
            tandem_core::protocol::VERSION
        )
    );
}

/// The consumer's virtual node capacity of `resource`, if the node exists.
async fn node_capacity(consumer: &Cluster, provider: &str, resource: &str) -> Option<String> {
    let nodes: Api<Node> = Api::all(consumer.client.clone());
    let node = nodes
        .get_opt(&names::virtual_node_name(provider))
        .await
        .unwrap()?;
    node.status?.capacity?.get(resource).map(|q| q.0.clone())
}

#[tokio::test]
async fn a_grant_that_is_not_a_quantity_is_reported_and_never_reaches_the_virtual_node() {
    let provider = Cluster::start("genoa", "eu-south", 1).await;
    let consumer = Cluster::start("turin", "eu-south", 1).await;
    support::peer_with(
        &consumer,
        &provider,
        json!({"cpu": "2", "memory": "2Gi", "pods": "20"}),
        None,
    )
    .await;
    until("the virtual node's capacity", OBJECTS_WAIT, || async {
        (node_capacity(&consumer, "genoa", "cpu").await.as_deref() == Some("2")).then_some(())
    })
    .await;
    // An admin edits the grant on the provider; a schema that predates validation lets it in.
    support::accept_any_spec(&provider.client, "tenants.tandem.dev").await;
    let tenants: Api<Tenant> = Api::namespaced(provider.client.clone(), "tandem-tenant-turin");
    let peerings: Api<Peering> = Api::all(consumer.client.clone());
    for bad in ["abc", "-5"] {
        tenants
            .patch(
                "turin",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"grant": {"cpu": bad}}})),
            )
            .await
            .unwrap();
        // The provider names the field on the Tenant.
        let ready = until("the Tenant to report its grant", OBJECTS_WAIT, || async {
            let t = tenants.get("turin").await.unwrap();
            let c = tandem_api::conditions::find(&t.status?.conditions, "Ready")?.clone();
            (c.reason == "InvalidGrant" && c.message.contains(&format!("{bad:?}"))).then_some(c)
        })
        .await;
        assert_eq!(ready.status, "False");
        assert!(
            ready.message.starts_with("spec.grant.cpu: "),
            "{}",
            ready.message
        );
        // So does the consumer, on its Peering, keeping the last valid grant.
        let p = until("the consumer to report the grant", OBJECTS_WAIT, || async {
            let p = peerings.get("genoa").await.unwrap();
            let c =
                tandem_api::conditions::find(&p.status.as_ref()?.conditions, "ResourcesGranted")?;
            (c.reason == "InvalidGrant" && c.message.contains(&format!("{bad:?}"))).then_some(p)
        })
        .await;
        let status = p.status.unwrap();
        let granted = tandem_api::conditions::find(&status.conditions, "ResourcesGranted").unwrap();
        assert_eq!(granted.status, "False");
        assert!(
            granted.message.contains("spec.grant.cpu"),
            "{}",
            granted.message
        );
        assert_eq!(status.granted.get("cpu").map(|q| q.0.as_str()), Some("2"));
        assert_eq!(
            node_capacity(&consumer, "genoa", "cpu").await.as_deref(),
            Some("2"),
            "the virtual node keeps its last valid capacity"
        );
    }
    // A valid grant again: both sides take it.
    tenants
        .patch(
            "turin",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"grant": {"cpu": "3"}}})),
        )
        .await
        .unwrap();
    until(
        "the virtual node to take the new grant",
        OBJECTS_WAIT,
        || async {
            (node_capacity(&consumer, "genoa", "cpu").await.as_deref() == Some("3")).then_some(())
        },
    )
    .await;
    until(
        "the Tenant to say its grant is valid",
        OBJECTS_WAIT,
        || async {
            let t = tenants.get("turin").await.unwrap();
            let c = tandem_api::conditions::find(&t.status?.conditions, "Ready")?.clone();
            (c.status == "True" && c.reason == "GrantValid").then_some(())
        },
    )
    .await;
}

/// A provider whose controller may list NetworkParameters but not watch them (a ClusterRole
/// trimmed by hand, say) still negotiates the network: once its watch has kept failing, the
/// provider's sweep reads them from the API instead of the listing the watch began with, which
/// holds no consumer's parameters.
#[tokio::test]
async fn a_provider_that_cannot_watch_network_parameters_still_negotiates() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
    let consumer = Cluster::start("rome", "eu-west", 1).await;
    let mut provider = Cluster::start("milan", "eu-south", 1).await;
    let roles: Api<ClusterRole> = Api::all(provider.client.clone());
    let mut role = roles.get(names::CONTROLLER_NAME).await.unwrap();
    let rules = role.rules.get_or_insert_default();
    let mut trimmed = false;
    for rule in rules.iter_mut() {
        let watches = rule.verbs.iter().any(|v| v == "watch");
        if let Some(resources) = rule.resources.as_mut()
            && watches
            && resources.iter().any(|r| r == "networkparameters")
        {
            resources.retain(|r| r != "networkparameters");
            trimmed = true;
        }
    }
    assert!(
        trimmed,
        "the controller's role lets it watch NetworkParameters"
    );
    rules.push(PolicyRule {
        api_groups: Some(vec![tandem_api::GROUP.into()]),
        resources: Some(vec!["networkparameters".into()]),
        verbs: vec!["get".into(), "list".into()],
        ..Default::default()
    });
    roles
        .replace(names::CONTROLLER_NAME, &Default::default(), &role)
        .await
        .unwrap();
    // The trimmed role holds: listing is allowed, watching is refused.
    let as_controller: Api<NetworkParameters> = Api::all(provider.controller_client.clone());
    as_controller.list(&ListParams::default()).await.unwrap();
    let refused = as_controller
        .watch(&Default::default(), "0")
        .await
        .err()
        .expect("watching NetworkParameters is refused");
    assert_eq!(
        tandem_api::client::status_code(&refused),
        Some(403),
        "{refused}"
    );
    // Its watches start again, under the trimmed role.
    provider.restart_controller().await;

    // Established: the consumer has the provider's remap of its network.
    support::peer(&consumer, &provider).await;
    let theirs: Api<NetworkParameters> = Api::namespaced(
        provider.client.clone(),
        &names::tenant_namespace(&consumer.id),
    );
    let status = theirs
        .get(tandem_controller::rbac::CONSUMER_NETWORK_PARAMETERS)
        .await
        .unwrap()
        .status
        .unwrap_or_default();
    assert!(
        status.remapped_pod_cidr.is_some(),
        "the provider remapped the consumer's pod CIDR: {status:?}"
    );
}

/// The remaps a provider gave its consumers survive its IPAM ConfigMap being deleted by hand:
/// the controller, restarted without it, rebuilds it from the remaps its NetworkParameters
/// record instead of handing prefixes out afresh (which would swap two consumers' remaps, as
/// a fresh allocation goes in another order).
#[tokio::test]
async fn a_deleted_ipam_config_map_is_rebuilt_from_the_recorded_remaps() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use tandem_controller::provider::network::IPAM_CONFIG_MAP;
    let mut provider = Cluster::start("milan", "eu-south", 1).await;
    // Peered in the order opposite to a sweep's (which goes by tenant name).
    let turin = Cluster::start("turin", "eu-west", 1).await;
    let rome = Cluster::start("rome", "eu-west", 1).await;
    support::peer(&turin, &provider).await;
    support::peer(&rome, &provider).await;
    let admin = provider.client.clone();
    let remap = |consumer: &'static str| {
        let params: Api<NetworkParameters> =
            Api::namespaced(admin.clone(), &names::tenant_namespace(consumer));
        async move {
            params
                .get(tandem_controller::rbac::CONSUMER_NETWORK_PARAMETERS)
                .await
                .unwrap()
                .status
                .and_then(|s| s.remapped_pod_cidr)
                .unwrap_or_else(|| panic!("{consumer}'s pod CIDR remapped"))
        }
    };
    let before = (remap("turin").await, remap("rome").await);
    assert_ne!(before.0, before.1);

    let maps: Api<ConfigMap> = Api::namespaced(provider.client.clone(), names::SYSTEM_NAMESPACE);
    maps.delete(IPAM_CONFIG_MAP, &Default::default())
        .await
        .unwrap();
    provider.restart_controller().await;
    // Back, with both consumers' grants as they were.
    let granted = |state: &serde_json::Value, peer: &str| {
        state["peers"][peer][0]["granted"]
            .as_str()
            .map(str::to_string)
    };
    let state = until(
        "the IPAM ConfigMap to hold both consumers again",
        OBJECTS_WAIT,
        || async {
            let map = maps.get_opt(IPAM_CONFIG_MAP).await.unwrap()?;
            let state: serde_json::Value =
                serde_json::from_str(map.data?.get("state.json")?).ok()?;
            (granted(&state, "turin").is_some() && granted(&state, "rome").is_some())
                .then_some(state)
        },
    )
    .await;
    assert_eq!(
        (granted(&state, "turin"), granted(&state, "rome")),
        (Some(before.0.clone()), Some(before.1.clone())),
        "the rebuilt IPAM keeps each consumer's remap"
    );
    // A sweep since then left the remaps in place.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!((remap("turin").await, remap("rome").await), before);
}

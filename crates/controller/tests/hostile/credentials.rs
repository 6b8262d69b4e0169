//! Credentials a provider hands out: the public enrollment credential, and a peer's client
//! certificate once its peering is over.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_admin::enroll;
use tandem_api::{PeeringRequest, Tenant, names};

use crate::support::{self, Cluster, until};

/// The enrollment credential's condition on its token Secret, once the controller judged.
async fn enrollment_condition(
    admin: &Client,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    enroll::token_secret(admin)
        .await
        .unwrap()
        .as_ref()
        .and_then(enroll::condition_of)
}

/// Waits until the credential's condition has `status`; returns its message.
async fn until_condition(admin: &Client, status: &str, what: &str) -> String {
    until(what, Duration::from_secs(30), || async {
        enrollment_condition(admin)
            .await
            .filter(|c| c.status == status)
            .map(|c| c.message)
    })
    .await
}

/// A client holding only bootstrap token `token`.
async fn token_client(provider: &Cluster, token: &str) -> Client {
    let kc = tandem_controller::consumer::peering::kubeconfig(
        &provider.lab.server.url(),
        provider.lab.server.ca_pem(),
        tandem_api::kubeconfig::Credentials::Token(token),
    );
    tandem_controller::consumer::link::client_from_kubeconfig(&kc)
        .await
        .unwrap()
}

/// What the token gets reading a peering request back by name: 404 when it works (none is
/// filed), 401 when the credential is switched off.
async fn token_answer(token: &Client) -> u16 {
    match Api::<PeeringRequest>::namespaced(token.clone(), names::ENROLL_NAMESPACE)
        .get("enroll-none")
        .await
    {
        Ok(_) => 200,
        Err(kube::Error::Api(e)) => e.code,
        Err(e) => panic!("reading a peering request with the token: {e}"),
    }
}

/// An administrator's binding that a bootstrap token would share.
fn binding(
    namespace: Option<&str>,
    name: &str,
    role: &str,
    subject: (&str, &str),
) -> serde_json::Value {
    let mut b = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": if namespace.is_some() { "RoleBinding" } else { "ClusterRoleBinding" },
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": subject.0, "name": subject.1}],
    });
    if let Some(ns) = namespace {
        b["metadata"]["namespace"] = json!(ns);
    }
    b
}

async fn create(admin: &Client, b: &serde_json::Value) {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
    match b["metadata"]["namespace"].as_str() {
        Some(ns) => {
            Api::<RoleBinding>::namespaced(admin.clone(), ns)
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(b.clone()).unwrap(),
                )
                .await
                .unwrap();
        }
        None => {
            Api::<ClusterRoleBinding>::all(admin.clone())
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(b.clone()).unwrap(),
                )
                .await
                .unwrap();
        }
    }
}

async fn delete(admin: &Client, b: &serde_json::Value) {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
    let name = b["metadata"]["name"].as_str().unwrap();
    match b["metadata"]["namespace"].as_str() {
        Some(ns) => drop(
            Api::<RoleBinding>::namespaced(admin.clone(), ns)
                .delete(name, &DeleteParams::default())
                .await
                .unwrap(),
        ),
        None => drop(
            Api::<ClusterRoleBinding>::all(admin.clone())
                .delete(name, &DeleteParams::default())
                .await
                .unwrap(),
        ),
    }
}

/// The published enrollment credential is a bootstrap token, so it is in
/// `system:authenticated` and `system:bootstrappers` whatever Tandem binds: 5 attacks on its
/// reach, each an administrator's binding made while the cluster is advertised — (1) a
/// ClusterRole bound to every authenticated user, (2) one bound to every bootstrap token
/// (kubelet TLS bootstrapping), (3) Tandem's enroll group bound in another namespace,
/// (4) the token's own user bound, (5) a Kubernetes default binding's name reused for another
/// role — and (6) advertising again while one exists. Each withdraws the credential (it stops
/// authenticating) with a condition and a Warning Event naming the binding; each removal
/// brings it back. An invite token, a bootstrap token too, keeps working throughout.
#[tokio::test]
async fn the_enrollment_credential_is_withdrawn_while_a_binding_reaches_further() {
    let provider = Cluster::start("oslo", "eu-north", 1).await;
    let admin = provider.client.clone();
    let endpoint = provider.lab.server.url();
    let ca = provider.lab.server.ca_pem().to_string();
    let enrollment = enroll::enable(&admin, &endpoint, &ca, 4, Duration::from_secs(3600))
        .await
        .expect("Kubernetes' own bindings to system:authenticated are no reason to refuse");
    let token = token_client(&provider, &enrollment.token).await;
    let token_id = enrollment.token.split_once('.').unwrap().0.to_string();
    let message = until_condition(&admin, "True", "the credential judged confined").await;
    assert!(message.contains("nothing but file"), "{message}");
    assert_eq!(
        token_answer(&token).await,
        404,
        "the credential files requests"
    );
    let invite = support::invite(&provider, Duration::from_secs(3600)).await;
    let invite_token = token_client(&provider, &invite.bearer_token()).await;
    let invite_answer = || async {
        match Api::<PeeringRequest>::namespaced(invite_token.clone(), names::SYSTEM_NAMESPACE)
            .get(&invite.token_id)
            .await
        {
            Err(kube::Error::Api(e)) => e.code,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(invite_answer().await, 404);

    let user = format!("system:bootstrap:{token_id}");
    let attacks = [
        (
            binding(
                None,
                "everyone-views",
                "view",
                ("Group", "system:authenticated"),
            ),
            "ClusterRoleBinding everyone-views (ClusterRole view) binds group system:authenticated",
        ),
        (
            binding(
                None,
                "kubelet-bootstrap",
                "view",
                ("Group", "system:bootstrappers"),
            ),
            "ClusterRoleBinding kubelet-bootstrap (ClusterRole view) binds group system:bootstrappers",
        ),
        (
            binding(
                Some("default"),
                "enrollers-edit",
                "edit",
                ("Group", names::ENROLL_GROUP),
            ),
            "RoleBinding default/enrollers-edit (ClusterRole edit) binds group system:bootstrappers:tandem:enroll",
        ),
        (
            binding(None, "token-admin", "cluster-admin", ("User", &user)),
            "ClusterRoleBinding token-admin (ClusterRole cluster-admin) binds user system:bootstrap:",
        ),
    ];
    for (b, named) in &attacks {
        create(&admin, b).await;
        let message = until_condition(
            &admin,
            "False",
            &format!("the credential withdrawn for {named}"),
        )
        .await;
        assert!(
            message.contains(named) && message.contains("withdrawn"),
            "{message}"
        );
        assert_eq!(
            token_answer(&token).await,
            401,
            "a withdrawn credential authenticates no more ({named})"
        );
        // Advertising again is refused, naming the binding.
        let refused = enroll::enable(&admin, &endpoint, &ca, 4, Duration::from_secs(3600))
            .await
            .expect_err("advertising with a binding reaching further");
        assert!(refused.to_string().contains(named), "{refused}");
        let events: Api<Event> = Api::namespaced(admin.clone(), "kube-system");
        let event = events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("EnrollmentWithdrawn"))
            .expect("a Warning Event on the credential's Secret");
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert!(event.message.unwrap_or_default().contains(named));
        delete(&admin, b).await;
        until_condition(
            &admin,
            "True",
            &format!("the credential back after removing {named}"),
        )
        .await;
        assert_eq!(
            token_answer(&token).await,
            404,
            "the credential works again"
        );
    }

    // A binding named as Kubernetes' own, to another role, is not taken for it.
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let crbs = Api::<ClusterRoleBinding>::all(admin.clone());
    let original = crbs.get("system:discovery").await.unwrap();
    crbs.delete("system:discovery", &DeleteParams::default())
        .await
        .unwrap();
    let impostor = binding(
        None,
        "system:discovery",
        "cluster-admin",
        ("Group", "system:authenticated"),
    );
    create(&admin, &impostor).await;
    let message = until_condition(
        &admin,
        "False",
        "the credential withdrawn for a reused name",
    )
    .await;
    assert!(
        message.contains("ClusterRoleBinding system:discovery (ClusterRole cluster-admin)"),
        "{message}"
    );
    delete(&admin, &impostor).await;
    let mut restored = original.clone();
    restored.metadata = kube::api::ObjectMeta {
        name: original.metadata.name.clone(),
        labels: original.metadata.labels.clone(),
        annotations: original.metadata.annotations.clone(),
        ..Default::default()
    };
    crbs.create(&PostParams::default(), &restored)
        .await
        .unwrap();
    until_condition(
        &admin,
        "True",
        "the credential back with Kubernetes' own binding",
    )
    .await;
    assert_eq!(token_answer(&token).await, 404);

    // The credential itself is the same one, still published; nothing else was touched.
    let published = Api::<ConfigMap>::namespaced(admin.clone(), "kube-public")
        .get(enroll::ENROLLMENT_CONFIGMAP)
        .await
        .unwrap();
    assert_eq!(published.data.unwrap()["token"], enrollment.token);
    assert_eq!(invite_answer().await, 404, "an invite token is left alone");
}

/// A renewal request for `consumer`'s identity, made with a fresh key (the provider denies it:
/// not the key on record; what matters here is whether the peer may file it at all).
fn renewal_request(consumer: &str, suffix: &str) -> CertificateSigningRequest {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, names::peer_user(consumer));
    let own = tandem_admin::enroll::key_fingerprint_der(
        &rcgen::PublicKeyData::subject_public_key_info(&key),
    );
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, names::peer_key_group(&own));
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    serde_json::from_value(json!({
        "metadata": {"name": format!("tandem-peer-renewal-{consumer}-{suffix}")},
        "spec": {"request": ByteString(pem.into_bytes()),
                 "signerName": "kubernetes.io/kube-apiserver-client",
                 "usages": ["client auth", "digital signature"], "expirationSeconds": 3600},
    }))
    .unwrap()
}

fn code<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(kube::Error::Api(e)) => e.code,
        Err(e) => panic!("{e}"),
    }
}

/// A peering ends on the provider (its admin unpeers): the former peer's certificate, which
/// lives on until it expires, must lose everything at once. 3 attacks with it afterwards:
/// (1) reading its twin namespace (kept for the data it holds, so the namespace is still
/// there), (2) reading its Tenant, (3) filing a renewal request. Another consumer of the same
/// provider keeps all three.
#[tokio::test]
async fn a_former_peer_certificate_reaches_nothing_and_renews_nothing() {
    let provider = Cluster::start("bergen", "eu-north", 1).await;
    let mut consumer = Cluster::start("tromso", "eu-north", 1).await;
    let mut other = Cluster::start("narvik", "eu-north", 1).await;
    support::peer(&consumer, &provider).await;
    support::peer(&other, &provider).await;
    let twin = support::offload_remote(&consumer, &provider, "data").await;
    let other_twin = support::offload_remote(&other, &provider, "data").await;
    let admin = provider.client.clone();
    let former = support::peer_client(&consumer, &provider).await;
    let still = support::peer_client(&other, &provider).await;
    // From here on both consumers act with their certificates alone.
    consumer.kill_controller();
    other.kill_controller();

    // Data in the twin, so unpeering keeps it (and its namespace) for the provider's admin.
    let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(admin.clone(), &twin)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let reads = |client: Client, ns: String| async move {
        code(
            Api::<ConfigMap>::namespaced(client, &ns)
                .list(&Default::default())
                .await,
        )
    };
    let tenant = |client: Client, id: &str| {
        let id = id.to_string();
        async move {
            code(
                Api::<Tenant>::namespaced(client, &names::tenant_namespace(&id))
                    .get(&id)
                    .await,
            )
        }
    };
    let files = |client: Client, id: &str, n: &str| {
        let csr = renewal_request(id, n);
        async move {
            code(
                Api::<CertificateSigningRequest>::all(client)
                    .create(&PostParams::default(), &csr)
                    .await,
            )
        }
    };
    assert_eq!(reads(former.clone(), twin.clone()).await, 200);
    assert_eq!(tenant(former.clone(), "tromso").await, 200);
    assert_eq!(
        files(former.clone(), "tromso", "1").await,
        200,
        "a peer files its renewal"
    );

    tandem_admin::invite::unpeer(
        &admin,
        "tromso",
        false,
        Duration::from_secs(30),
        &mut |_| {},
    )
    .await
    .unwrap();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    let kept = namespaces.get(&twin).await.unwrap();
    assert!(
        kept.labels().contains_key(names::RETAINED_DATA_LABEL),
        "the twin is kept for its data"
    );
    assert_eq!(
        reads(former.clone(), twin.clone()).await,
        403,
        "attack 1: reading the kept twin"
    );
    assert_eq!(
        tenant(former.clone(), "tromso").await,
        403,
        "attack 2: reading its Tenant"
    );
    assert_eq!(
        files(former.clone(), "tromso", "2").await,
        403,
        "attack 3: filing a renewal"
    );
    let renewal_bindings =
        Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin.clone());
    assert!(
        renewal_bindings
            .get_opt("tandem:peer-renewal:tromso")
            .await
            .unwrap()
            .is_none(),
        "the former peer's renewal binding is gone"
    );

    // The other consumer is untouched.
    assert_eq!(reads(still.clone(), other_twin.clone()).await, 200);
    assert_eq!(tenant(still.clone(), "narvik").await, 200);
    assert_eq!(files(still.clone(), "narvik", "1").await, 200);
}

/// A cluster ID is only a name: once a peering has ended and the ID peers again under another
/// key (another cluster claiming the name, or the same one given a new key), the certificate
/// of the earlier peering reaches nothing, though its user name is the same. 4 attacks with
/// it: reading the new Tenant, reading a new twin namespace, filing a renewal, and the data
/// kept from the earlier peering, which the new peering under another key does not adopt.
#[tokio::test]
async fn a_certificate_of_an_earlier_peering_reaches_nothing_after_a_re_peer() {
    let provider = Cluster::start("visby", "eu-north", 1).await;
    let mut first = Cluster::start("lund", "eu-north", 1).await;
    support::peer(&first, &provider).await;
    let kept = support::offload_remote(&first, &provider, "data").await;
    let admin = provider.client.clone();
    let earlier = support::peer_client(&first, &provider).await;
    first.kill_controller();
    let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(admin.clone(), &kept)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let tenant_of = |client: Client| async move {
        code(
            Api::<Tenant>::namespaced(client, &names::tenant_namespace("lund"))
                .get("lund")
                .await,
        )
    };
    let reads = |client: Client, ns: String| async move {
        code(
            Api::<ConfigMap>::namespaced(client, &ns)
                .list(&Default::default())
                .await,
        )
    };
    assert_eq!(tenant_of(earlier.clone()).await, 200, "while it peers");
    tandem_admin::invite::unpeer(&admin, "lund", false, Duration::from_secs(30), &mut |_| {})
        .await
        .unwrap();
    drop(first);

    // Another cluster claims the name, with a key of its own, through a new invite.
    let second = Cluster::start("lund", "eu-north", 1).await;
    support::peer(&second, &provider).await;
    let now = support::peer_client(&second, &provider).await;
    assert_eq!(tenant_of(now.clone()).await, 200, "the new peering works");
    let fresh = support::offload_remote(&second, &provider, "web").await;
    assert_eq!(reads(now.clone(), fresh.clone()).await, 200);

    assert_eq!(
        tenant_of(earlier.clone()).await,
        403,
        "attack 1: the earlier certificate reading the new Tenant"
    );
    assert_eq!(
        reads(earlier.clone(), fresh.clone()).await,
        403,
        "attack 2: the earlier certificate reading the new twin"
    );
    assert_eq!(
        code(
            Api::<CertificateSigningRequest>::all(earlier.clone())
                .create(&PostParams::default(), &renewal_request("lund", "9"))
                .await
        ),
        403,
        "attack 3: the earlier certificate filing a renewal"
    );

    // Attack 4: the new peering offloads the namespace whose data was kept: not adopted.
    let nsos: Api<tandem_api::NamespaceOffloading> = Api::namespaced(second.client.clone(), "data");
    let pp = kube::api::PatchParams::apply("test").force();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(second.client.clone())
        .patch(
            "data",
            &pp,
            &kube::api::Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "data"}}),
            ),
        )
        .await
        .unwrap();
    nsos.patch(
        names::OFFLOADING_NAME,
        &pp,
        &kube::api::Patch::Apply(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "NamespaceOffloading",
            "metadata": {"name": names::OFFLOADING_NAME},
            "spec": {"podOffloadingStrategy": "Remote"},
        })),
    )
    .await
    .unwrap();
    let requests: Api<tandem_api::RemoteNamespace> =
        Api::namespaced(admin.clone(), &names::tenant_namespace("lund"));
    let message = until(
        "the kept twin refused to the new key",
        Duration::from_secs(60),
        || async {
            let list = requests.list(&Default::default()).await.ok()?;
            let rn = list.items.into_iter().find(|r| r.spec.namespace == kept)?;
            let st = rn.status?;
            (st.phase.as_deref() == Some("Failed")).then(|| st.message.unwrap_or_default())
        },
    )
    .await;
    assert!(
        message.contains("under key sha256:") && message.contains("not re-adopted"),
        "{message}"
    );
    let ns = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .get(&kept)
        .await
        .unwrap();
    assert!(
        ns.labels().contains_key(names::RETAINED_DATA_LABEL),
        "the data stays kept"
    );
    assert_eq!(
        reads(now.clone(), kept.clone()).await,
        403,
        "the new peering got no rights in the kept twin"
    );
}

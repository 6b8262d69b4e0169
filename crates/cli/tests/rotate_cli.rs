//! `tandem rotate` as an administrator runs it on a peered pair of hollow lab clusters: the
//! webhook's serving certificate replaced on demand (a new caBundle, pods still admitted), the
//! WireGuard key for a peer replaced and published to it, and clear refusals where there is
//! nothing to rotate. (The tunnel coming back with rotated keys is checked on a network-mode
//! lab: `fabric_cli`.)

use std::time::Duration;

use serde_json::Value;

use crate::netlab;
use netlab::{hollow_lab, kubectl, ok, rome_offloads_shop_to_milan, tandem, until};

fn json_of(out: std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

#[test]
fn rotate_replaces_the_webhook_certificate_and_wireguard_keys_and_refuses_what_is_not_there() {
    let home = tempfile::tempdir().unwrap();
    let lab = hollow_lab(home.path(), "2");
    let kc = lab.kubeconfig.clone();
    let rotate = |ctx: &str, args: &[&str]| {
        let mut all = vec!["--kubeconfig", kc.as_str(), "--context", ctx, "rotate"];
        all.extend_from_slice(args);
        let out = tandem(home.path(), &all);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };

    // Nothing installed yet: each refusal says why.
    let (done, said) = rotate("lab-1", &["webhook-certificate", "--timeout", "5s"]);
    assert!(!done && said.contains("tandem install"), "{said}");
    let (done, said) = rotate("lab-1", &["wireguard-keys"]);
    assert!(!done && said.contains("no WireGuard key"), "{said}");

    rome_offloads_shop_to_milan(home.path(), &lab);
    let bundle = || {
        json_of(kubectl(
            &lab,
            "lab-1",
            &[
                "get",
                "mutatingwebhookconfiguration",
                "tandem-pod-placement",
                "-o",
                "json",
            ],
        ))["webhooks"][0]["clientConfig"]["caBundle"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let before = until("the webhook's caBundle", Duration::from_secs(30), || {
        Some(bundle()).filter(|b| !b.is_empty())
    });
    let (done, said) = rotate("lab-1", &["webhook-certificate"]);
    assert!(done, "{said}");
    assert!(
        said.contains("the pod-placement webhook serves a new certificate, valid until 20"),
        "{said}"
    );
    let after = bundle();
    assert!(
        !after.is_empty() && after != before,
        "a new CA in the caBundle"
    );
    // Pods of the offloaded namespace still pass the webhook (its failure policy is Fail).
    ok(
        kubectl(
            &lab,
            "lab-1",
            &["-n", "shop", "run", "web", "--image=nginx"],
        ),
        "a pod created after the rotation",
    );
    let pod = json_of(kubectl(
        &lab,
        "lab-1",
        &["-n", "shop", "get", "pod", "web", "-o", "json"],
    ));
    assert!(
        pod["spec"]["tolerations"].as_array().is_some_and(|t| t
            .iter()
            .any(|t| t["key"] == "virtual-node.tandem.dev/not-allowed")),
        "the webhook placed the pod: {pod}"
    );

    // WireGuard keys: an unknown peer is refused naming the known ones; milan's is replaced
    // and published to milan.
    let (done, said) = rotate("lab-1", &["wireguard-keys", "--peer", "paris"]);
    assert!(
        !done && said.contains("\"paris\"") && said.contains("milan"),
        "{said}"
    );
    let published = || {
        json_of(kubectl(
            &lab,
            "lab-2",
            &[
                "-n",
                "tandem-tenant-rome",
                "get",
                "networkparameters",
                "consumer",
                "-o",
                "json",
            ],
        ))["spec"]["publicKey"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let old_key = until(
        "rome's public key published to milan",
        Duration::from_secs(30),
        || Some(published()).filter(|k| !k.is_empty()),
    );
    let (done, said) = rotate("lab-1", &["wireguard-keys", "--peer", "milan"]);
    assert!(
        done && said.contains("✓ milan: new WireGuard key pair"),
        "{said}"
    );
    let new_key = until(
        "rome's new public key published to milan",
        Duration::from_secs(30),
        || Some(published()).filter(|k| *k != old_key),
    );
    assert!(
        said.contains(&new_key),
        "the announced key is the published one: {said}"
    );
}

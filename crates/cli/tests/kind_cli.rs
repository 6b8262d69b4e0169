//! The first run on kind, in the lab's kind profile: what breaks there and how Tandem says so.

use std::time::Duration;

use crate::netlab;
use netlab::{json, kubectl, ok, tandem, until};

/// kind's nodes hold only the images loaded into them and reach no registry here: `tandem
/// install` with the default image does not print "installed" while the controller sits in
/// ImagePullBackOff. It fails, naming the pod, the image and how to load it; once the image
/// is loaded (`tandem lab load-image`, the lab's `kind load docker-image`), the same install
/// waits for the controller and succeeds.
#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn on_kind_install_names_an_image_the_nodes_lack_and_succeeds_once_it_is_loaded() {
    tandem_testing::needs_root();
    let home = tempfile::tempdir().unwrap();
    let lab = netlab::lab_up_as(home.path(), "lab", "1", "1", "kind");
    let kc = lab.kubeconfig.clone();
    let image = tandem_admin::install::default_image();
    let install = || {
        tandem(
            home.path(),
            &[
                "install",
                "--kubeconfig",
                &kc,
                "--context",
                "lab-1",
                "--cluster-id",
                "rome",
            ],
        )
    };
    let out = install();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "install succeeded although no node has {image}: {stderr}"
    );
    assert!(
        stderr.contains(&format!("cannot pull its image {image} (ImagePullBackOff"))
            && stderr.contains(&format!("tandem lab load-image {image}"))
            && stderr.contains(&format!("kind load docker-image {image}")),
        "{stderr}"
    );
    assert!(!stderr.contains("Tandem is installed"), "{stderr}");
    // What kubectl shows is what kubelet reports: the pull failed, and is backing off.
    let pods = json(&lab, "lab-1", &["-n", "tandem-system", "get", "pods"]);
    let waiting = &pods["items"][0]["status"]["containerStatuses"][0]["state"]["waiting"];
    assert!(
        matches!(
            waiting["reason"].as_str(),
            Some("ImagePullBackOff" | "ErrImagePull")
        ),
        "{pods}"
    );
    let events = ok(
        kubectl(&lab, "lab-1", &["-n", "tandem-system", "get", "events"]),
        "events",
    );
    assert!(
        events.contains(&format!("Failed to pull image \"{image}\"")),
        "{events}"
    );

    let out = tandem(
        home.path(),
        &[
            "lab",
            "load-image",
            &image,
            "--dir",
            &home.path().join("lab").to_string_lossy(),
        ],
    );
    let loaded = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "lab load-image");
    assert!(
        loaded.contains(&format!("image {image} loaded onto lab-1")),
        "{loaded}"
    );
    let out = install();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "install once the image is loaded");
    assert!(
        stderr.contains("✓ controller Ready") && stderr.contains("installed as cluster \"rome\""),
        "{stderr}"
    );
    // The controller that now runs said which protocol it speaks, on its leader Lease.
    let protocol = tandem_core::protocol::VERSION;
    assert!(
        stderr.contains(&format!(
            "✓ controller {} speaks peering protocol v{protocol}",
            env!("CARGO_PKG_VERSION")
        )),
        "{stderr}"
    );
    until(
        "the controller's pod Running",
        Duration::from_secs(30),
        || {
            let pods = json(&lab, "lab-1", &["-n", "tandem-system", "get", "pods"]);
            (pods["items"][0]["status"]["phase"] == "Running").then_some(())
        },
    );
}

/// An image's version is known only once it runs: `tandem install` reads what the controller
/// holding the leader Lease says it speaks, and refuses one older than the CLI's peering
/// protocol, naming both, the pod and the image (a hollow lab: its pods run nothing, so the
/// Lease is written here as an old controller's would be).
#[test]
fn install_refuses_a_running_controller_older_than_its_peering_protocol() {
    let home = tempfile::tempdir().unwrap();
    let lab = netlab::hollow_lab(home.path(), "1");
    let kc = lab.kubeconfig.clone();
    let install = || {
        tandem(
            home.path(),
            &[
                "install",
                "--kubeconfig",
                &kc,
                "--context",
                "lab-1",
                "--cluster-id",
                "rome",
                "--timeout",
                "60s",
            ],
        )
    };
    let first = install();
    let stderr = String::from_utf8_lossy(&first.stderr).into_owned();
    ok(first, "install");
    // No controller runs in a hollow pod, so none holds the Lease: said, not refused.
    assert!(
        stderr.contains("the controller's peering protocol is not known"),
        "{stderr}"
    );
    let pods = json(&lab, "lab-1", &["-n", "tandem-system", "get", "pods"]);
    let pod = pods["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let lease = |protocol: u32| {
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "tandem-controller", "namespace": "tandem-system",
                         "annotations": {"tandem.dev/controller-version": "0.0.9",
                                         "tandem.dev/peering-protocol": protocol.to_string()}},
            "spec": {"holderIdentity": format!("{pod}_0a1b2c"), "leaseDurationSeconds": 3600},
        })
        .to_string()
    };
    let old = tandem_core::protocol::VERSION - 1;
    let file = home.path().join("lease.json");
    std::fs::write(&file, lease(old)).unwrap();
    ok(
        kubectl(&lab, "lab-1", &["apply", "-f", &file.to_string_lossy()]),
        "the old controller's Lease",
    );
    let out = install();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "an older controller was accepted: {stderr}"
    );
    let image = tandem_admin::install::default_image();
    assert!(
        stderr.contains(&format!(
            "the controller now running (pod tandem-system/{pod}, image {image}, tandem 0.0.9) \
             speaks peering protocol v{old}, and this tandem {} speaks v{}",
            env!("CARGO_PKG_VERSION"),
            tandem_core::protocol::VERSION
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("Tandem is installed"), "{stderr}");
    // The same controller at this protocol passes, and `tandem version` shows what it runs.
    std::fs::write(&file, lease(tandem_core::protocol::VERSION)).unwrap();
    ok(
        kubectl(&lab, "lab-1", &["apply", "-f", &file.to_string_lossy()]),
        "the Lease at this protocol",
    );
    ok(install(), "install with a controller of this protocol");
    let version = ok(
        tandem(
            home.path(),
            &["version", "--kubeconfig", &kc, "--context", "lab-1"],
        ),
        "tandem version",
    );
    assert!(
        version.contains(&format!(
            "Running:    tandem 0.0.9 (peering protocol v{}), leader {pod}",
            tandem_core::protocol::VERSION
        )),
        "{version}"
    );
}

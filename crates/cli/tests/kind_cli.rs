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
    until(
        "the controller's pod Running",
        Duration::from_secs(30),
        || {
            let pods = json(&lab, "lab-1", &["-n", "tandem-system", "get", "pods"]);
            (pods["items"][0]["status"]["phase"] == "Running").then_some(())
        },
    );
}

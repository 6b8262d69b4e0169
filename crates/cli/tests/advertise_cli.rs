//! `tandem advertise --domain` as an administrator runs it on a lab cluster: DNS-SD records
//! under `_tandem._tcp.<domain>` whose TXT carries the cluster ID, protocol version, endpoint,
//! region and the CA fingerprint exactly as `openssl x509 -fingerprint -sha256` prints it; and
//! clear refusals for a bad domain or a cluster without Tandem.

use std::process::Command;

use tandem_core::discovery::{Advertisement, parse_fingerprint};

use crate::netlab;
use netlab::{hollow_lab, ok, tandem};

/// The strings of a zone-file TXT line (`"a" "b"`, no escapes in what Tandem writes).
fn txt_strings(line: &str) -> Vec<String> {
    line.split_once(" IN TXT ")
        .unwrap()
        .1
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn advertise_prints_the_records_to_publish_with_the_ca_fingerprint_openssl_prints() {
    let home = tempfile::tempdir().unwrap();
    let lab = hollow_lab(home.path(), "1");
    let on = [
        "--kubeconfig",
        lab.kubeconfig.as_str(),
        "--context",
        "lab-1",
    ];
    let advertise = |args: &[&str]| {
        let mut all = on.to_vec();
        all.push("advertise");
        all.extend_from_slice(args);
        tandem(home.path(), &all)
    };

    let out = advertise(&["--domain", "example.org"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("tandem install"),
        "{said}"
    );
    let out = advertise(&["--domain", "Not A Domain"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("is not a DNS domain name"),
        "{said}"
    );

    let mut install = on.to_vec();
    install.extend(["install", "--cluster-id", "milan"]);
    ok(tandem(home.path(), &install), "install");
    let records = ok(
        advertise(&["--domain", "example.org", "--ttl", "60"]),
        "advertise",
    );
    let lines: Vec<&str> = records.lines().filter(|l| !l.starts_with(';')).collect();
    assert_eq!(
        lines[0], "_tandem._tcp.example.org. 60 IN PTR milan._tandem._tcp.example.org.",
        "{records}"
    );
    // The kubeconfig's server, https://127.0.0.1:PORT: a name in the domain with its A record.
    let kubeconfig = std::fs::read_to_string(&lab.kubeconfig).unwrap();
    let port = kubeconfig
        .split("https://127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .unwrap();
    assert_eq!(
        lines[1],
        format!("milan._tandem._tcp.example.org. 60 IN SRV 0 0 {port} milan.example.org."),
        "{records}"
    );
    assert_eq!(
        lines[3], "milan.example.org. 60 IN A 127.0.0.1",
        "{records}"
    );
    let ad = Advertisement::from_txt(&txt_strings(lines[2])).expect("the TXT reads back");
    assert_eq!(ad.cluster_id, "milan");
    assert_eq!(ad.protocol_version, tandem_core::protocol::VERSION);
    assert_eq!(ad.endpoint, format!("https://127.0.0.1:{port}"));
    assert_eq!(
        ad.region.as_deref(),
        Some("eu-west"),
        "the lab's nodes' region"
    );

    // The fingerprint an admin reads off the CA with openssl is the advertised one.
    let ca_pem = home.path().join("ca.pem");
    let out = ok(
        Command::new("kubectl")
            .args([
                "--kubeconfig",
                &lab.kubeconfig,
                "config",
                "view",
                "--raw",
                "--minify",
                "--context",
                "lab-1",
                "-o",
                "jsonpath={.clusters[0].cluster.certificate-authority-data}",
            ])
            .output()
            .unwrap(),
        "kubectl config view",
    );
    use base64::Engine as _;
    std::fs::write(
        &ca_pem,
        base64::engine::general_purpose::STANDARD
            .decode(out.trim())
            .unwrap(),
    )
    .unwrap();
    let openssl = ok(
        Command::new("openssl")
            .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
            .arg(&ca_pem)
            .output()
            .unwrap(),
        "openssl x509 -fingerprint",
    );
    // "sha256 Fingerprint=AB:CD:…"
    let printed = openssl.trim().rsplit('=').next().unwrap();
    assert_eq!(
        parse_fingerprint(printed),
        Ok(ad.ca_fingerprint.clone()),
        "{openssl}"
    );
}

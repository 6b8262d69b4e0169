//! Tandem's image (`deploy/image/Dockerfile`) wraps one statically linked binary. What is
//! tested is that binary, the one every other test runs: it has no program interpreter, and
//! alone in an otherwise empty root, as the image's user, it runs and talks to a lab cluster
//! (TLS, the kube client, name resolution through the `/etc/hosts` a kubelet mounts). The image
//! itself is built without a registry (`deploy/image/build-from-binary`, Debian's buildah) and
//! run: `tandem version` and `nft`, as the image's user, and the binary's file capability. The
//! Dockerfile is checked against what it must agree with.

use std::path::Path;
use std::process::Command;

use crate::netlab;
use netlab::{hollow_lab, ok, tandem};

/// The uid and gid of the image's user (distroless's `nonroot`), which the manifests' pods
/// and the network-mode lab run Tandem's image as.
const IMAGE_USER: u32 = tandem_lab::network::incluster::DEFAULT_UID;

fn dockerfile() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/image/Dockerfile"),
    )
    .expect("deploy/image/Dockerfile")
}

/// Whether the ELF executable at `path` names a program interpreter (`PT_INTERP`): a
/// dynamically linked one does (`/lib64/ld-linux-x86-64.so.2`), a static one does not.
fn has_interpreter(path: &str) -> bool {
    let elf = std::fs::read(path).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF", "{path} is not an ELF file");
    assert_eq!(elf[4], 2, "{path} is not a 64-bit ELF file");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == 3 // PT_INTERP
    })
}

#[test]
fn the_binary_is_static() {
    let binary = env!("CARGO_BIN_EXE_tandem");
    assert!(
        !has_interpreter(binary),
        "{binary} is dynamically linked: the image's binary must need nothing from its base \
         (see .cargo/config.toml)"
    );
    // And the check tells the two apart: Debian's shell is dynamically linked.
    assert!(has_interpreter("/bin/sh"), "/bin/sh names no interpreter");
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn alone_in_an_empty_root_as_the_images_user_it_talks_to_a_cluster() {
    tandem_testing::needs_root();
    let home = tempfile::tempdir().unwrap();
    let lab = hollow_lab(home.path(), "1");
    // The root: the binary, the kubeconfig, and the /etc/hosts a kubelet would mount.
    let rootfs = tempfile::tempdir().unwrap();
    let root = rootfs.path();
    std::fs::copy(env!("CARGO_BIN_EXE_tandem"), root.join("tandem")).unwrap();
    std::fs::create_dir(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/hosts"), "127.0.0.1 localhost\n").unwrap();
    // The lab's API server by name: name resolution works without any NSS library.
    let kubeconfig = std::fs::read_to_string(&lab.kubeconfig)
        .unwrap()
        .replace("https://127.0.0.1:", "https://localhost:");
    std::fs::write(root.join("kubeconfig"), kubeconfig).unwrap();
    nix::unistd::chown(
        &root.join("kubeconfig"),
        Some(nix::unistd::Uid::from_raw(IMAGE_USER)),
        None,
    )
    .unwrap();
    std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let run = |args: &[&str]| {
        // coreutils' chroot by path: the environment is cleared (no PATH).
        Command::new("/usr/sbin/chroot")
            .arg(format!("--userspec={IMAGE_USER}:{IMAGE_USER}"))
            .arg(root)
            .arg("/tandem")
            .args(args)
            .env_clear()
            .env("HOME", "/")
            .output()
            .unwrap()
    };
    let version = ok(run(&["--version"]), "tandem --version in the empty root");
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");
    // Installed from outside, then read from inside: the in-root binary reaches the API
    // server over TLS and reads Tandem's objects.
    ok(
        tandem(
            home.path(),
            &[
                "--kubeconfig",
                &lab.kubeconfig,
                "--context",
                "lab-1",
                "install",
                "--cluster-id",
                "rome",
            ],
        ),
        "install",
    );
    let status = ok(
        run(&[
            "--kubeconfig",
            "/kubeconfig",
            "--context",
            "lab-1",
            "status",
            "-o",
            "json",
        ]),
        "tandem status in the empty root",
    );
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["clusterID"], "rome", "{status}");
}

#[test]
fn the_dockerfile_wraps_the_binary_the_tests_run() {
    let file = dockerfile();
    // The binary comes out of the build stage from where cargo puts the release build of
    // this target (.cargo/config.toml names it; the tests' binary sits at the debug twin).
    let tested = env!("CARGO_BIN_EXE_tandem");
    assert!(
        tested.contains("/x86_64-unknown-linux-gnu/"),
        "the tests run {tested}"
    );
    assert!(
        file.contains("cargo build --release --locked -p tandem-cli --target \"$target\"")
            && file.contains("amd64|\"\") target=x86_64-unknown-linux-gnu")
            && file.contains("install -D -m 0755 \"target/$target/release/tandem\" /out/tandem"),
        "the Dockerfile must build and copy the release binary of tandem-cli"
    );
    // Runs as the user the manifests and the lab give Tandem's pods, never root.
    assert!(
        file.lines()
            .any(|l| l.trim() == format!("USER {IMAGE_USER}:{IMAGE_USER}")),
        "the image's USER must be {IMAGE_USER}"
    );
    // The documented build command tags the image `tandem install` uses by default.
    let default = tandem_admin::install::default_image();
    assert!(
        file.contains(&format!(
            "docker build -f deploy/image/Dockerfile -t {default} ."
        )),
        "the Dockerfile's build command must tag {default}"
    );
    // The gateway and node agent run `nft`: the final stage must install it. They get
    // NET_ADMIN as the non-root user from a permitted-only file capability on the binary
    // (the lab refuses their pods when allowPrivilegeEscalation would void it).
    assert!(file.contains("nftables"), "the image must carry nft");
    assert!(
        file.contains("setcap cap_net_admin+p /usr/local/bin/tandem"),
        "the binary must carry NET_ADMIN as a permitted file capability"
    );
}

/// `buildah` with its own storage in `dir`, so that the test's images and containers live and
/// die with its temporary directory (vfs: no overlay mount to leave behind).
fn buildah(dir: &Path) -> Command {
    let mut c = Command::new("buildah");
    c.arg("--root")
        .arg(dir.join("root"))
        .arg("--runroot")
        .arg(dir.join("run"))
        .args(["--storage-driver", "vfs"]);
    c
}

/// Removes the test's containers and images, even when an assertion fails first.
struct BuildahStore(tempfile::TempDir);

impl Drop for BuildahStore {
    fn drop(&mut self) {
        let _ = buildah(self.0.path()).args(["rm", "--all"]).output();
        let _ = buildah(self.0.path())
            .args(["rmi", "--all", "--force"])
            .output();
    }
}

#[test]
#[cfg_attr(not(tandem_root), ignore = "needs root")]
fn the_image_builds_without_a_registry_and_runs_tandem_version_against_a_lab() {
    tandem_testing::needs_root();
    let store = BuildahStore(tempfile::tempdir().unwrap());
    let dir = store.0.path();
    let opts = format!(
        "--root {} --runroot {} --storage-driver vfs",
        dir.join("root").display(),
        dir.join("run").display()
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/image/build-from-binary");
    let image = "localhost/tandem:test";
    ok(
        Command::new(&script)
            .args([env!("CARGO_BIN_EXE_tandem"), image])
            .env("BUILDAH_OPTS", &opts)
            .output()
            .unwrap(),
        "deploy/image/build-from-binary",
    );
    // The image's configuration: the image's user, the binary as entrypoint, the controller
    // as the default role.
    let config = ok(
        buildah(dir)
            .args(["inspect", "--type", "image", image])
            .output()
            .unwrap(),
        "buildah inspect",
    );
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    let config = &config["OCIv1"]["config"];
    assert_eq!(
        config["User"],
        format!("{IMAGE_USER}:{IMAGE_USER}"),
        "{config}"
    );
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/tandem"]),
        "{config}"
    );
    assert_eq!(config["Cmd"], serde_json::json!(["controller"]), "{config}");
    let ctr = ok(
        buildah(dir).args(["from", image]).output().unwrap(),
        "buildah from",
    );
    let ctr = ctr.trim();
    // The file capability the gateway and node agent raise NET_ADMIN from, permitted only.
    let root = ok(
        buildah(dir).args(["mount", ctr]).output().unwrap(),
        "buildah mount",
    );
    let caps = ok(
        Command::new("getcap")
            .arg(Path::new(root.trim()).join("usr/local/bin/tandem"))
            .output()
            .unwrap(),
        "getcap",
    );
    assert!(
        caps.trim_end().ends_with("cap_net_admin=p"),
        "getcap: {caps}"
    );
    // A hollow lab with Tandem installed: `tandem version` in the image shows the CLI's
    // version and the installed controller's.
    let home = tempfile::tempdir().unwrap();
    let lab = hollow_lab(home.path(), "1");
    ok(
        tandem(
            home.path(),
            &[
                "--kubeconfig",
                &lab.kubeconfig,
                "--context",
                "lab-1",
                "install",
                "--cluster-id",
                "rome",
                "--wait=false",
            ],
        ),
        "install",
    );
    let kubeconfig = Path::new(root.trim()).join("kubeconfig");
    std::fs::copy(&lab.kubeconfig, &kubeconfig).unwrap();
    nix::unistd::chown(
        &kubeconfig,
        Some(nix::unistd::Uid::from_raw(IMAGE_USER)),
        None,
    )
    .unwrap();
    // chroot isolation: no OCI runtime (crun refuses this machine's hybrid cgroups), the
    // host's network, which the lab's API server listens on.
    let run = |args: &[&str]| {
        buildah(dir)
            .args(["run", "--isolation", "chroot", "--user"])
            .arg(format!("{IMAGE_USER}:{IMAGE_USER}"))
            .args([ctr, "--"])
            .args(args)
            .output()
            .unwrap()
    };
    let version = ok(
        run(&[
            "/usr/local/bin/tandem",
            "version",
            "--kubeconfig",
            "/kubeconfig",
            "--context",
            "lab-1",
        ]),
        "tandem version in the image",
    );
    let ours = env!("CARGO_PKG_VERSION");
    assert!(
        version.contains(&format!("Client:     tandem {ours}"))
            && version.contains(&format!("Controller: tandem {ours}")),
        "tandem version in the image: {version}"
    );
    // nft runs with the libraries the image carries (listing needs NET_ADMIN, which the
    // image's user holds only in a gateway's or node agent's pod).
    let nft = ok(
        run(&["/usr/sbin/nft", "--version"]),
        "nft --version in the image",
    );
    assert!(nft.starts_with("nftables v"), "{nft}");
}

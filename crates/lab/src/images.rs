//! Which images a lab node can run without a registry, and why a pull fails.
//!
//! The default profile stands for a cluster whose nodes reach the registries: every image
//! pulls (hollow, or a built-in program). A kind cluster's nodes hold only what kind put on
//! them and what `kind load docker-image` copied in, and in this lab no registry answers, so
//! in the kind profile an image pulls only when it is one of the lab's built-in programs
//! (`tandem.dev/echo`, `tandem.dev/probe`, preloaded as kind preloads its own images) or was
//! loaded with `tandem lab load-image` (the lab's `kind load docker-image`). Anything else
//! fails as kubelet fails it: `ErrImagePull`, then `ImagePullBackOff`, retried with back-off.
//!
//! Loaded images live in the cluster's data directory (`<dir>/images`, one reference a line),
//! so that `tandem lab load-image`, another process, adds to a running lab; a cluster kept in
//! memory holds them in memory only ([`NodeImages::load`]).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

/// The file in a cluster's data directory that lists its loaded images.
pub const IMAGES_FILE: &str = "images";

/// Why a container's image is not there to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullFailure {
    /// The image as the container names it.
    pub image: String,
    /// kubelet's waiting reason right after the attempt: `ErrImagePull` or
    /// `ErrImageNeverPull` (which is not retried).
    pub reason: &'static str,
    /// kubelet's message.
    pub message: String,
}

/// The images of one lab cluster's nodes.
#[derive(Clone, Debug, Default)]
pub struct NodeImages {
    /// None: every image pulls (the default profile). Some: only built-in and loaded ones.
    loaded: Option<Loaded>,
}

#[derive(Clone, Debug)]
struct Loaded {
    file: Option<PathBuf>,
    memory: Arc<Mutex<BTreeSet<String>>>,
}

impl NodeImages {
    /// Nodes that reach a registry: every image pulls.
    pub fn from_registry() -> NodeImages {
        NodeImages { loaded: None }
    }

    /// Nodes with no registry (kind's here): built-in images, and those loaded into
    /// `data_dir` (or into memory when None).
    pub fn loaded_only(data_dir: Option<PathBuf>) -> NodeImages {
        NodeImages {
            loaded: Some(Loaded {
                file: data_dir.map(|d| d.join(IMAGES_FILE)),
                memory: Arc::default(),
            }),
        }
    }

    /// Loads `image` onto the nodes (in memory: a cluster with a data directory is loaded
    /// through [`load_into`], by any process).
    pub fn load(&self, image: &str) {
        if let Some(l) = &self.loaded {
            l.memory.lock().insert(normalize(image));
        }
    }

    /// Whether `image` is on the nodes.
    fn present(&self, image: &str) -> bool {
        let Some(l) = &self.loaded else { return true };
        let image = normalize(image);
        l.memory.lock().contains(&image)
            || l.file
                .as_ref()
                .is_some_and(|f| read_loaded(f).contains(&image))
    }

    /// Why the container with `image` and `pull_policy` cannot start yet; None when it can.
    pub fn pull(&self, image: &str, pull_policy: Option<&str>) -> Option<PullFailure> {
        if self.loaded.is_none() || crate::network::programs::Program::of_image(image).is_some() {
            return None;
        }
        let policy = pull_policy.unwrap_or(if has_latest_tag(image) {
            "Always"
        } else {
            "IfNotPresent"
        });
        let present = self.present(image);
        let failure = |reason, message| {
            Some(PullFailure {
                image: image.to_string(),
                reason,
                message,
            })
        };
        match policy {
            "Never" if present => None,
            "Never" => failure(
                "ErrImageNeverPull",
                format!("Container image \"{image}\" is not present with pull policy of Never"),
            ),
            "IfNotPresent" if present => None,
            // Always asks the registry even for a loaded image, and none answers here: kind's
            // well-known trap for `:latest` images loaded with `kind load docker-image`.
            _ => failure(
                "ErrImagePull",
                format!(
                    "failed to pull and unpack image \"{}\": failed to resolve reference: \
                     pull access denied, repository does not exist or may require \
                     authorization{}",
                    normalize(image),
                    if present {
                        " (the image is loaded on the node, but imagePullPolicy Always asks \
                         the registry anyway: set IfNotPresent)"
                    } else {
                        ""
                    }
                ),
            ),
        }
    }
}

/// Records `image` as loaded in the cluster whose data directory is `data_dir` (what
/// `tandem lab load-image` does); the running lab's kubelets see it at their next pull.
pub fn load_into(data_dir: &std::path::Path, image: &str) -> std::io::Result<()> {
    let file = data_dir.join(IMAGES_FILE);
    let mut images = read_loaded(&file);
    if images.insert(normalize(image)) {
        let text: String = images.iter().map(|i| format!("{i}\n")).collect();
        let tmp = data_dir.join(format!("{IMAGES_FILE}.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::rename(tmp, file)?;
    }
    Ok(())
}

fn read_loaded(file: &std::path::Path) -> BTreeSet<String> {
    std::fs::read_to_string(file)
        .map(|t| {
            t.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `image` has no tag (so `latest`) or the tag `latest`, and no digest: kubelet's
/// default pull policy is then Always.
fn has_latest_tag(image: &str) -> bool {
    if image.contains('@') {
        return false;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        None => true,
        Some((_, tag)) => tag == "latest",
    }
}

/// The fully qualified form of an image reference, as containerd names it:
/// `nginx` → `docker.io/library/nginx:latest`, `me/app:1` → `docker.io/me/app:1`.
pub fn normalize(image: &str) -> String {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let (first, rest) = name.split_once('/').unwrap_or(("", name));
    let name = if first.is_empty() {
        format!("docker.io/library/{rest}")
    } else if first.contains('.') || first.contains(':') || first == "localhost" {
        name.to_string()
    } else {
        format!("docker.io/{name}")
    };
    let last = name.rsplit('/').next().unwrap_or(&name);
    match digest {
        Some(d) => format!("{name}@{d}"),
        None if last.contains(':') => name,
        None => format!("{name}:latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_named_as_containerd_names_them() {
        for (image, want) in [
            ("nginx", "docker.io/library/nginx:latest"),
            ("nginx:1.27", "docker.io/library/nginx:1.27"),
            ("me/app", "docker.io/me/app:latest"),
            (
                "ghcr.io/tandem-dev/tandem:0.1.0",
                "ghcr.io/tandem-dev/tandem:0.1.0",
            ),
            ("localhost:5000/app", "localhost:5000/app:latest"),
            ("localhost/tandem:dev", "localhost/tandem:dev"),
            ("ghcr.io/x/y@sha256:ab", "ghcr.io/x/y@sha256:ab"),
        ] {
            assert_eq!(normalize(image), want, "{image}");
        }
    }

    #[test]
    fn a_kind_node_runs_built_in_and_loaded_images_only() {
        let registry = NodeImages::from_registry();
        assert_eq!(registry.pull("nginx", None), None);
        let kind = NodeImages::loaded_only(None);
        assert_eq!(kind.pull("tandem.dev/echo", None), None);
        let missing = kind.pull("ghcr.io/tandem-dev/tandem:0.1.0", None).unwrap();
        assert_eq!(missing.reason, "ErrImagePull");
        assert!(missing.message.contains("ghcr.io/tandem-dev/tandem:0.1.0"));
        kind.load("ghcr.io/tandem-dev/tandem:0.1.0");
        assert_eq!(kind.pull("ghcr.io/tandem-dev/tandem:0.1.0", None), None);
        // Loaded under its short name, named in full by the pod (and the other way round).
        kind.load("nginx:1.27");
        assert_eq!(kind.pull("docker.io/library/nginx:1.27", None), None);
        // A loaded `:latest` image still asks the registry (default policy Always) ...
        kind.load("app");
        let always = kind.pull("app", None).unwrap();
        assert_eq!(always.reason, "ErrImagePull");
        assert!(
            always.message.contains("set IfNotPresent"),
            "{}",
            always.message
        );
        // ... and runs with IfNotPresent or Never.
        assert_eq!(kind.pull("app", Some("IfNotPresent")), None);
        assert_eq!(kind.pull("app:latest", Some("Never")), None);
        let never = kind.pull("busybox", Some("Never")).unwrap();
        assert_eq!(never.reason, "ErrImageNeverPull");
    }

    #[test]
    fn images_loaded_into_the_data_directory_are_seen_by_the_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let kind = NodeImages::loaded_only(Some(dir.path().into()));
        assert!(kind.pull("localhost/tandem:dev", None).is_some());
        load_into(dir.path(), "localhost/tandem:dev").unwrap();
        load_into(dir.path(), "localhost/tandem:dev").unwrap();
        assert_eq!(kind.pull("localhost/tandem:dev", None), None);
        assert_eq!(
            std::fs::read_to_string(dir.path().join(IMAGES_FILE)).unwrap(),
            "localhost/tandem:dev\n"
        );
    }
}

//! Tandem's own image run as a pod's process: the one real binary a network-mode lab runs.
//!
//! Running it is where the lab could hand out host root, so what a pod spec may say is an
//! allow-list ([`plan`]): only Tandem's in-cluster roles, only their own flags, only a few
//! environment variables, never uid 0, only the network capabilities a gateway needs, never in
//! a twin namespace (peers create pods there). The process then runs as a container would
//! ([`sandbox`], [`enter`]): in the pod's network namespace, in a private mount, UTS and IPC namespace
//! where the ServiceAccount token, CA and namespace appear at
//! `/var/run/secrets/kubernetes.io/serviceaccount/` (a tmpfs seen only by the pod, never the
//! host's own path), with private `/tmp`, the pod's resolv.conf and hostname, its uid, only the
//! capabilities it declares and `no_new_privs`. The token is bound to the pod, as kubelet's
//! projected token is, and renewed at 80% of its life.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};

/// The image repository of Tandem (`ghcr.io/tandem-dev/tandem:<tag>`).
pub const REPOSITORY: &str = "ghcr.io/tandem-dev/tandem";
/// The uid Tandem's image runs as when the pod does not say (the image's `USER`, distroless's
/// nonroot).
pub const DEFAULT_UID: u32 = 65532;
/// Where kubelet mounts a pod's ServiceAccount credentials.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Lifetime of the tokens requested for pods (kubelet's projected token default).
const TOKEN_SECONDS: i64 = 3607;

/// An in-cluster role of Tandem's image: its subcommand, the flags it accepts and the
/// capabilities a pod may give it.
struct Role {
    name: &'static str,
    flags: &'static [&'static str],
    /// Capabilities the role may be given (a gateway's NET_ADMIN, when it joins). A role with
    /// network capabilities needs its own PID namespace too: NET_ADMIN in the host's user
    /// namespace can reach any network namespace through a pid (IFLA_NET_NS_PID).
    capabilities: &'static [&'static str],
    /// Whether the role may run in a twin namespace, where peers create pods: only one that
    /// holds no credential and no capability.
    in_twin: bool,
}

/// The in-cluster roles of Tandem's image. No flag that points the binary at other credentials
/// or files (`--kubeconfig`, `--context`, `--data-dir`, `--config`) is among them.
const ROLES: &[Role] = &[
    Role {
        name: "controller",
        flags: &[
            "--webhook-addr",
            "--webhook-service",
            "--heartbeat-seconds",
            "--provider-grace-seconds",
            "--dns-addr",
            "--metrics-addr",
            "--leader-elect",
            "--peer-certificate-lifetime",
            "--webhook-certificate-lifetime",
        ],
        capabilities: &[],
        in_twin: false,
    },
    // The network fabric's data plane: the gateway to one peer and the node agent, both on
    // the node network (hostNetwork: the node's namespace, which is the lab's, never the
    // host's), with NET_ADMIN and so each in its own PID namespace (see `enter`).
    Role {
        name: "gateway",
        flags: &["--peer"],
        capabilities: &["NET_ADMIN"],
        in_twin: false,
    },
    Role {
        name: "agent",
        flags: &[],
        capabilities: &["NET_ADMIN"],
        in_twin: false,
    },
    // The Helm chart's post-delete hook: removes the CoreDNS stub, with its own Role.
    Role {
        name: "cleanup",
        flags: &[],
        capabilities: &[],
        in_twin: false,
    },
    // `tandem check`'s probe: an HTTP answer and fetches, on both sides of a peering (an
    // offloaded pod runs in a twin namespace), with nothing to protect.
    Role {
        name: "probe",
        flags: &["--serve", "--fetch", "--within"],
        capabilities: &[],
        in_twin: true,
    },
];
/// The users and groups Tandem's image may run as: none of the host's system or login
/// accounts (below) nor `nobody` (above), whose files or processes a pod could then reach.
const IDS: std::ops::RangeInclusive<u32> = 10_000..=65_533;
/// Environment variables a pod may set for Tandem's image (`LD_PRELOAD` and the like never).
const ENV: &[&str] = &["RUST_LOG", "RUST_BACKTRACE", "NO_COLOR"];

/// Whether `image` is Tandem's (any tag or digest).
pub fn is_tandem_image(image: &str) -> bool {
    let repo = image.split('@').next().unwrap_or(image);
    let repo = match repo.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') => r,
        _ => repo,
    };
    repo == REPOSITORY
}

/// What a container of Tandem's image runs, once the pod spec has passed the allow-list.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Launch {
    /// The arguments after `tandem`, role first.
    pub args: Vec<String>,
    /// Environment from the pod spec (allow-listed names, literal values).
    pub env: Vec<(String, String)>,
    /// User and group the process runs as.
    pub uid: u32,
    pub gid: u32,
    /// Capability numbers the process keeps (nothing else, not even in its bounding set).
    pub capabilities: Vec<u32>,
    /// Whether the container mounts the node's `/dev/net/tun` (a hostPath volume of that
    /// path, at that path): the only way a container gets it, as runc creates no such device.
    #[serde(default)]
    pub tun: bool,
}

/// Why the allow-list refuses a container of Tandem's image: what its status reports.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LaunchRefused {
    /// The pod is in a twin namespace, where peers create pods.
    #[error(
        "Tandem's image may not run in namespace {namespace} but as `tandem probe`: it is a twin \
         namespace, where peers create pods"
    )]
    TwinNamespace {
        /// The pod's namespace.
        namespace: String,
    },
    /// The command is not the tandem binary.
    #[error(
        "exec: \"{command}\": Tandem's image has only the tandem binary (command must be \
         tandem or left unset)"
    )]
    Command {
        /// The command's first word.
        command: String,
    },
    /// The first argument is not an in-cluster role.
    #[error(
        "Tandem's image runs only its in-cluster roles ({}), not {found:?}",
        role_names()
    )]
    Role {
        /// The first argument ("" when there is none).
        found: String,
    },
    /// An argument that is not one of the role's flags.
    #[error(
        "argument {name:?} is not allowed for `tandem {role}` in a pod (allowed: {})",
        .allowed.join(", ")
    )]
    Argument {
        /// The argument (without its `=value`).
        name: String,
        /// The role.
        role: &'static str,
        /// The role's flags.
        allowed: &'static [&'static str],
    },
    /// A flag without its value.
    #[error("argument {name} needs a value")]
    MissingValue {
        /// The flag.
        name: String,
    },
    /// `envFrom` is set.
    #[error("envFrom is not allowed for Tandem's image")]
    EnvFrom,
    /// An environment variable outside [`ENV`], or not a literal value.
    #[error(
        "environment variable {name} is not allowed for Tandem's image (allowed, as literal \
         values: {})",
        ENV.join(", ")
    )]
    Env {
        /// The variable.
        name: String,
    },
    /// `privileged: true`.
    #[error("privileged containers of Tandem's image are not run")]
    Privileged,
    /// `runAsUser` or `runAsGroup` out of the range of ids.
    #[error("{field} {value} is not a valid id")]
    InvalidId {
        /// `runAsUser` or `runAsGroup`.
        field: &'static str,
        /// The value given.
        value: i64,
    },
    /// `runAsUser: 0`.
    #[error(
        "Tandem's image never runs as root in the lab (runAsUser 0): its roles need at most \
         the capabilities they declare"
    )]
    Root,
    /// A user or group outside [`IDS`].
    #[error(
        "{field} {value} is not allowed for Tandem's image in the lab: it shares the host's \
         users and groups, so ids must be between {} and {}",
        IDS.start(),
        IDS.end()
    )]
    IdOutOfRange {
        /// `runAsUser` or `runAsGroup`.
        field: &'static str,
        /// The id.
        value: u32,
    },
    /// A capability the role may not be given.
    #[error(
        "capability {name} is not allowed for `tandem {role}` (allowed: {})",
        or_none(.allowed)
    )]
    Capability {
        /// The capability, without `CAP_`.
        name: String,
        /// The role.
        role: &'static str,
        /// The capabilities the role may be given.
        allowed: &'static [&'static str],
    },
    /// A hostPath volume other than the node's TUN device, or that device elsewhere.
    #[error(
        "hostPath volume {volume} ({path} at {mount_path}) is not allowed for Tandem's image \
         in the lab: only {TUN_DEVICE} at {TUN_DEVICE}, of type CharDevice, is"
    )]
    HostPath {
        /// The volume's name.
        volume: String,
        /// Its path on the node.
        path: String,
        /// Where the container mounts it ("" when it does not).
        mount_path: String,
    },
    /// Capabilities asked for with `allowPrivilegeEscalation: false`, which voids them.
    #[error(
        "`tandem {role}` as a non-root user gets its capabilities from the file capability on \
         Tandem's binary, which allowPrivilegeEscalation: false disables: set it to true"
    )]
    NoPrivilegeEscalation {
        /// The role.
        role: &'static str,
    },
}

/// The in-cluster roles, for messages.
fn role_names() -> String {
    ROLES.iter().map(|r| r.name).collect::<Vec<_>>().join(", ")
}

/// `items`, comma-separated, or `none`.
fn or_none(items: &[&str]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

/// Checks `container` of `pod` (Tandem's image) against the allow-list; `twin` says whether the
/// pod's namespace is a twin namespace. The error is what the container's status reports;
/// nothing runs then.
pub fn plan(pod: &Pod, container: &Container, twin: bool) -> Result<Launch, LaunchRefused> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut words: Vec<String> = Vec::new();
    match container.command.as_deref() {
        None | Some([]) => {}
        Some([first, rest @ ..]) if first.rsplit('/').next() == Some("tandem") => {
            words.extend(rest.iter().cloned())
        }
        Some([first, ..]) => {
            return Err(LaunchRefused::Command {
                command: first.clone(),
            });
        }
    }
    words.extend(container.args.iter().flatten().cloned());
    let Some(role) = words
        .first()
        .and_then(|w| ROLES.iter().find(|r| r.name == w))
    else {
        return Err(LaunchRefused::Role {
            found: words.first().cloned().unwrap_or_default(),
        });
    };
    if twin && !role.in_twin {
        return Err(LaunchRefused::TwinNamespace {
            namespace: ns.to_string(),
        });
    }
    let mut rest = words[1..].iter();
    while let Some(word) = rest.next() {
        let name = word.split_once('=').map_or(word.as_str(), |(n, _)| n);
        if !word.starts_with("--") || !role.flags.contains(&name) {
            return Err(LaunchRefused::Argument {
                name: name.to_string(),
                role: role.name,
                allowed: role.flags,
            });
        }
        if !word.contains('=') && rest.next().is_none_or(|v| v.starts_with("--")) {
            return Err(LaunchRefused::MissingValue {
                name: name.to_string(),
            });
        }
    }
    if container.env_from.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err(LaunchRefused::EnvFrom);
    }
    let mut env = Vec::new();
    for var in container.env.iter().flatten() {
        if !ENV.contains(&var.name.as_str()) || var.value_from.is_some() {
            return Err(LaunchRefused::Env {
                name: var.name.clone(),
            });
        }
        env.push((var.name.clone(), var.value.clone().unwrap_or_default()));
    }

    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = container.security_context.as_ref();
    if sc.and_then(|s| s.privileged) == Some(true) {
        return Err(LaunchRefused::Privileged);
    }
    let id = |v: Option<i64>, field: &'static str| -> Result<Option<u32>, LaunchRefused> {
        v.map(|value| u32::try_from(value).map_err(|_| LaunchRefused::InvalidId { field, value }))
            .transpose()
    };
    let uid = id(
        sc.and_then(|s| s.run_as_user)
            .or(pod_sc.and_then(|s| s.run_as_user)),
        "runAsUser",
    )?
    .unwrap_or(DEFAULT_UID);
    if uid == 0 {
        return Err(LaunchRefused::Root);
    }
    let gid = id(
        sc.and_then(|s| s.run_as_group)
            .or(pod_sc.and_then(|s| s.run_as_group)),
        "runAsGroup",
    )?
    .unwrap_or(uid);
    for (field, value) in [("runAsUser", uid), ("runAsGroup", gid)] {
        if !IDS.contains(&value) {
            return Err(LaunchRefused::IdOutOfRange { field, value });
        }
    }
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let dropped: Vec<String> = caps
        .and_then(|c| c.drop.clone())
        .unwrap_or_default()
        .iter()
        .map(|c| normalise_capability(c))
        .collect();
    let mut capabilities = Vec::new();
    for name in caps.and_then(|c| c.add.clone()).unwrap_or_default() {
        let name = normalise_capability(&name);
        if dropped.contains(&name) {
            continue;
        }
        let number = ::caps::Capability::from_str(&format!("CAP_{name}"))
            .ok()
            .filter(|_| role.capabilities.contains(&name.as_str()));
        let Some(number) = number else {
            return Err(LaunchRefused::Capability {
                name,
                role: role.name,
                allowed: role.capabilities,
            });
        };
        capabilities.push(u32::from(number.index()));
    }
    // A container runtime hands a non-root process its added capabilities only through a file
    // capability on the executable it runs (Tandem's image sets cap_net_admin+p on the binary),
    // and no_new_privs — `allowPrivilegeEscalation: false` — voids file capabilities: such a
    // gateway would hold nothing in a real cluster, so the lab does not run it either.
    if !capabilities.is_empty() && sc.and_then(|s| s.allow_privilege_escalation) == Some(false) {
        return Err(LaunchRefused::NoPrivilegeEscalation { role: role.name });
    }
    let tun = tun_mounted(pod, container)?;
    Ok(Launch {
        args: words,
        env,
        uid,
        gid,
        capabilities,
        tun,
    })
}

/// The node's TUN device, the one host path Tandem's image may mount.
pub const TUN_DEVICE: &str = "/dev/net/tun";

/// Whether `container` mounts the node's TUN device; an error for any other hostPath volume of
/// the pod (mounted or not), or that device typed otherwise or mounted elsewhere.
fn tun_mounted(pod: &Pod, container: &Container) -> Result<bool, LaunchRefused> {
    let mut tun = false;
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    for volume in volumes.into_iter().flatten() {
        let Some(host) = &volume.host_path else {
            continue;
        };
        let mount_path = container
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == volume.name)
            .map(|m| m.mount_path.clone())
            .unwrap_or_default();
        let typed = matches!(host.type_.as_deref(), None | Some("" | "CharDevice"));
        if host.path != TUN_DEVICE || !typed || !(mount_path.is_empty() || mount_path == TUN_DEVICE)
        {
            return Err(LaunchRefused::HostPath {
                volume: volume.name.clone(),
                path: host.path.clone(),
                mount_path,
            });
        }
        tun |= mount_path == TUN_DEVICE;
    }
    Ok(tun)
}

fn normalise_capability(name: &str) -> String {
    let upper = name.to_ascii_uppercase();
    upper.strip_prefix("CAP_").unwrap_or(&upper).to_string()
}

/// Everything a sandboxed process is started with.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Sandbox {
    /// The tandem binary on the host.
    pub binary: PathBuf,
    /// What the pod spec asked for, checked.
    pub launch: Launch,
    /// The pod's network namespace (`ip netns` name).
    pub netns: String,
    /// The pod's name, its hostname.
    pub hostname: String,
    /// Files under [`SERVICE_ACCOUNT_DIR`] (token, ca.crt, namespace); empty without a token.
    pub credentials: Vec<(String, String)>,
    /// The pod's /etc/resolv.conf.
    pub resolv_conf: String,
    /// `KUBERNETES_SERVICE_HOST` and `_PORT`.
    pub api_server: (String, u16),
}

/// The hidden first argument that makes the tandem binary set up a sandbox and exec its role
/// ([`enter`]); the sandbox itself comes in [`SANDBOX_ENV`]. Neither can come from a pod spec:
/// the allow-list admits neither that argument nor that variable.
pub const SANDBOX_ARG: &str = "__lab-sandbox";
/// The environment variable carrying the [`Sandbox`] (JSON) to [`enter`].
pub const SANDBOX_ENV: &str = "TANDEM_LAB_SANDBOX";
/// The argument after [`SANDBOX_ARG`] with which a sandbox's relay starts the binary as pid 1
/// of the sandbox's own PID namespace (see [`enter`]).
pub const PID1_ARG: &str = "pid1";

/// The command starting `sandbox`'s process (not yet spawned): the tandem binary in its
/// sandbox-entering mode, stdin closed, stdout and stderr piped, killed when dropped.
pub fn sandbox(sandbox: &Sandbox) -> std::io::Result<tokio::process::Command> {
    let spec = serde_json::to_string(sandbox).map_err(std::io::Error::other)?;
    let mut cmd = tokio::process::Command::new(&sandbox.binary);
    cmd.arg(SANDBOX_ARG)
        .env_clear()
        .env(SANDBOX_ENV, spec)
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    Ok(cmd)
}

/// Mount points given a private tmpfs in the sandbox: /var/run first (it holds the
/// credentials; required), then the world-writable places a process could otherwise leave
/// files in on the host (best effort: they may not exist).
const TMPFS: [(&str, &str); 4] = [
    ("/var/run", "mode=0755,size=4m"),
    ("/tmp", "mode=1777,size=64m"),
    ("/var/tmp", "mode=1777,size=64m"),
    ("/dev/shm", "mode=1777,size=64m"),
];

/// Why a sandbox could not be set up, or its relay failed: what the tandem binary reports
/// before exiting as runc does for a container that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// [`SANDBOX_ENV`] does not hold a sandbox.
    #[error("reading the sandbox")]
    Spec(#[source] serde_json::Error),
    /// A file (the binary, the pod's network namespace) could not be opened.
    #[error("sandbox: opening {}", .path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A system call setting the sandbox up failed.
    #[error("sandbox: {step}")]
    Step {
        /// What it was for.
        step: &'static str,
        /// The error.
        #[source]
        source: nix::Error,
    },
    /// A file of the sandbox could not be written.
    #[error("sandbox: {step}")]
    Io {
        /// What it was for.
        step: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The capability sets could not be set.
    #[error("sandbox: {step}")]
    Capabilities {
        /// Which set.
        step: &'static str,
        /// The error.
        #[source]
        source: caps::errors::CapsError,
    },
    /// The pod mounts the node's TUN device, which the node does not have.
    #[error(
        "sandbox: hostPath type check failed: {TUN_DEVICE} is not a character device on the node"
    )]
    NoTun,
    /// The lab (the parent process) is gone.
    #[error("sandbox: the lab stopped while the pod was starting")]
    LabStopped,
    /// An argument or environment variable cannot be passed to exec.
    #[error("sandbox: {value:?} holds a NUL byte")]
    NulByte {
        /// The argument or `NAME=value`.
        value: String,
    },
    /// A system call of the relay failed.
    #[error("sandbox: relay: {step}")]
    Relay {
        /// What it was for.
        step: &'static str,
        /// The error.
        #[source]
        source: nix::Error,
    },
    /// The relay could not start or wait for its pid 1.
    #[error("sandbox: relay: {step} pid 1")]
    Pid1 {
        /// `starting` or `waiting for`.
        step: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The sandbox's `/dev/net`: empty, or holding the node's TUN device when the pod mounts it
/// (`tun`). No runtime creates `/dev/net/tun` in a container (runc only allows c 10:200 in
/// the device cgroup): a pod has it only from a hostPath volume, which kubelet checks is a
/// character device on the node (`type: CharDevice`) before the container starts. The lab
/// shares the host's /dev, so it hides the host's /dev/net behind a tmpfs, then makes a node
/// with the host device's number and mode there (a bind mount of it, in effect).
fn tun_device(tun: bool) -> Result<(), SandboxError> {
    use nix::mount::{MsFlags, mount};
    use nix::sys::stat::{Mode, SFlag};
    let step = |step: &'static str| move |source| SandboxError::Step { step, source };
    let host = nix::sys::stat::stat(TUN_DEVICE);
    let device = match host {
        Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFCHR => {
            Some((st.st_rdev, Mode::from_bits_truncate(st.st_mode)))
        }
        _ => None,
    };
    if tun && device.is_none() {
        return Err(SandboxError::NoTun);
    }
    if !std::path::Path::new("/dev/net").is_dir() {
        return Ok(());
    }
    mount(
        Some("tmpfs"),
        "/dev/net",
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k"),
    )
    .map_err(step("a private /dev/net"))?;
    if let (true, Some((rdev, mode))) = (tun, device) {
        nix::sys::stat::mknod(TUN_DEVICE, SFlag::S_IFCHR, mode, rdev)
            .map_err(step("/dev/net/tun"))?;
        // mknod's mode is cut by the umask.
        nix::sys::stat::fchmodat(
            nix::fcntl::AT_FDCWD,
            TUN_DEVICE,
            mode,
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )
        .map_err(step("/dev/net/tun mode"))?;
    }
    Ok(())
}

/// Names a file of the sandbox that could not be opened.
fn opening(path: &Path) -> impl FnOnce(std::io::Error) -> SandboxError {
    let path = path.to_path_buf();
    move |source| SandboxError::Open { path, source }
}

/// Sets the sandbox up around the calling process and executes the tandem binary's role in
/// it; returns only on failure. Called by the tandem binary, as root, before it starts any
/// thread (`tandem __lab-sandbox`, with the sandbox in [`SANDBOX_ENV`]): namespaces belong to
/// threads, and a process must be single-threaded to enter a new mount namespace.
///
/// No crate runs a process like a container without a container runtime (runc and youki want
/// an OCI bundle with a root filesystem, which the lab has no image for), so the steps are
/// spelled out here with nix and caps.
pub fn enter(spec: &str, pid1: bool) -> Result<std::convert::Infallible, SandboxError> {
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, setns, unshare};
    use nix::unistd::{Gid, Uid};
    let sandbox: Sandbox = serde_json::from_str(spec).map_err(SandboxError::Spec)?;
    let lab = nix::unistd::getppid();
    let step = |step: &'static str| move |source| SandboxError::Step { step, source };
    // Opened as root: the binary is executed through this descriptor, so the directories of
    // its path need not be searchable by the pod's user.
    let binary = std::fs::File::open(&sandbox.binary).map_err(opening(&sandbox.binary))?;
    // A role with network capabilities gets its own PID namespace: CAP_NET_ADMIN (in the
    // host's user namespace) could otherwise move a link into any process's network
    // namespace by its pid (IFLA_NET_NS_PID), the host's included. Only a child enters a new
    // PID namespace, so this process starts the binary again as that namespace's pid 1
    // (`pid1`), which goes on from here, and stays outside as its relay.
    let own_pids = !sandbox.launch.capabilities.is_empty();
    if pid1 {
        // Dies with its relay from the start (set again after the user changes, which
        // clears it).
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(step("parent-death signal"))?;
        // The relay blocked the signals it relays before starting this process, and a
        // blocked mask survives exec: clear it, or SIGTERM would never reach the role.
        nix::sys::signal::sigprocmask(
            nix::sys::signal::SigmaskHow::SIG_SETMASK,
            Some(&nix::sys::signal::SigSet::empty()),
            None,
        )
        .map_err(step("unblocking signals"))?;
        mount(
            Some("proc"),
            "/proc",
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(step("a /proc of the pod's own PID namespace"))?;
    } else {
        let netns_path = super::netns::path(&sandbox.netns);
        let netns = std::fs::File::open(&netns_path).map_err(opening(&netns_path))?;
        setns(&netns, CloneFlags::CLONE_NEWNET).map_err(step("entering the pod's network"))?;
        drop(netns);
        let mut flags =
            CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWIPC;
        if own_pids {
            flags |= CloneFlags::CLONE_NEWPID;
        }
        unshare(flags).map_err(step("new mount, UTS, IPC (and PID) namespaces"))?;
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .map_err(step("making mounts private"))?;
        if own_pids {
            let Err(e) = relay(&sandbox, spec, lab);
            return Err(e);
        }
    }
    tun_device(sandbox.launch.tun)?;
    // Where the host's resolv.conf really is: when it links into /run (systemd-resolved),
    // the pod's file goes there, inside the private tmpfs.
    let resolv_target = std::fs::canonicalize("/etc/resolv.conf")
        .unwrap_or_else(|_| PathBuf::from("/etc/resolv.conf"));
    let run_is_var_run = std::fs::canonicalize("/var/run").is_ok_and(|p| p == Path::new("/run"));
    for (i, (target, options)) in TMPFS.iter().enumerate() {
        let done = mount(
            Some("tmpfs"),
            *target,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(*options),
        );
        if i == 0 {
            done.map_err(step("a private /var/run"))?;
        }
    }
    if !run_is_var_run {
        // /var/run is a directory of its own here: hide the host's /run (netns, sockets) too.
        let _ = mount(
            Some("tmpfs"),
            "/run",
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0755,size=4m"),
        );
    }
    let io = |step: &'static str| move |source| SandboxError::Io { step, source };
    if !sandbox.credentials.is_empty() {
        std::fs::create_dir_all(SERVICE_ACCOUNT_DIR).map_err(io("credentials directory"))?;
        for (name, content) in &sandbox.credentials {
            std::fs::write(format!("{SERVICE_ACCOUNT_DIR}/{name}"), content)
                .map_err(io("writing credentials"))?;
        }
    }
    // The pod's resolver configuration: written where the host's file resolves to when that
    // is inside the private /run, else bound read-only over the host's.
    if resolv_target.starts_with("/run") {
        if let Some(parent) = resolv_target.parent() {
            std::fs::create_dir_all(parent).map_err(io("resolv.conf directory"))?;
        }
        std::fs::write(&resolv_target, &sandbox.resolv_conf).map_err(io("writing resolv.conf"))?;
    } else {
        let resolv = "/var/run/tandem-lab-resolv.conf";
        std::fs::write(resolv, &sandbox.resolv_conf).map_err(io("writing resolv.conf"))?;
        mount(
            Some(resolv),
            &resolv_target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(step("binding resolv.conf"))?;
        mount(
            None::<&str>,
            &resolv_target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(step("making resolv.conf read-only"))?;
    }
    nix::unistd::sethostname(pod_hostname(&sandbox.hostname))
        .map_err(step("setting the hostname"))?;

    // Capabilities: the declared ones and nothing else, not even in the bounding set.
    let launch = &sandbox.launch;
    let keep: caps::CapsHashSet = caps::all()
        .into_iter()
        .filter(|c| launch.capabilities.contains(&(c.index() as u32)))
        .collect();
    let cap_err = |step: &'static str| move |source| SandboxError::Capabilities { step, source };
    // Only what this kernel knows: dropping a capability it does not have is an error.
    for cap in caps::runtime::thread_all_supported() {
        if !keep.contains(&cap) {
            caps::drop(None, caps::CapSet::Bounding, cap).map_err(cap_err("bounding set"))?;
        }
    }
    nix::sys::prctl::set_keepcaps(!keep.is_empty()).map_err(step("keeping capabilities"))?;
    nix::unistd::setgroups(&[]).map_err(step("dropping groups"))?;
    let (uid, gid) = (Uid::from_raw(launch.uid), Gid::from_raw(launch.gid));
    nix::unistd::setresgid(gid, gid, gid).map_err(step("setting the group"))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(step("setting the user"))?;
    for set in [
        caps::CapSet::Effective,
        caps::CapSet::Permitted,
        caps::CapSet::Inheritable,
    ] {
        caps::set(None, set, &keep).map_err(cap_err("capabilities"))?;
    }
    for cap in &keep {
        caps::raise(None, caps::CapSet::Ambient, *cap).map_err(cap_err("ambient capabilities"))?;
    }
    nix::sys::prctl::set_no_new_privs().map_err(step("no_new_privs"))?;
    // After the user changed (a change of credentials clears it): the process dies with the
    // lab even if it is killed.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(step("parent-death signal"))?;
    // (Pid 1 of its own PID namespace sees no parent: its relay checks for the lab.)
    if !pid1 && nix::unistd::getppid() != lab {
        return Err(SandboxError::LabStopped);
    }
    std::env::set_current_dir("/").map_err(io("cwd"))?;

    let cstr = |s: &str| {
        CString::new(s).map_err(|_| SandboxError::NulByte {
            value: s.to_string(),
        })
    };
    let mut args = vec![cstr("tandem")?];
    for a in &launch.args {
        args.push(cstr(a)?);
    }
    let port = sandbox.api_server.1.to_string();
    let mut env = vec![
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        "HOME=/".to_string(),
        format!("HOSTNAME={}", sandbox.hostname),
        format!("KUBERNETES_SERVICE_HOST={}", sandbox.api_server.0),
        format!("KUBERNETES_SERVICE_PORT={port}"),
        format!("KUBERNETES_SERVICE_PORT_HTTPS={port}"),
    ];
    env.extend(launch.env.iter().map(|(k, v)| format!("{k}={v}")));
    let env = env.iter().map(|e| cstr(e)).collect::<Result<Vec<_>, _>>()?;
    let e = nix::unistd::fexecve(&binary, &args, &env).map_err(step("executing tandem"))?;
    match e {}
}

/// The relay of a sandbox in its own PID namespace (this process has unshared it): starts the
/// binary again as that namespace's pid 1, then drops to the pod's user with no capability at
/// all, dies with the lab, forwards SIGTERM, SIGINT and SIGHUP and exits as the child did
/// (128 + the signal that killed it), as a container's shim does. Never returns on success.
fn relay(
    sandbox: &Sandbox,
    spec: &str,
    lab: nix::unistd::Pid,
) -> Result<std::convert::Infallible, SandboxError> {
    use std::os::unix::process::ExitStatusExt as _;

    use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
    use nix::unistd::{Gid, Pid, Uid};
    let step = |step: &'static str| move |source| SandboxError::Relay { step, source };
    let mut relayed = SigSet::empty();
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGCHLD,
    ] {
        relayed.add(sig);
    }
    // Blocked before the child exists, so that none is lost; the child inherits the mask
    // and clears it first thing (`enter` with `pid1`).
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&relayed), None).map_err(step("blocking signals"))?;
    let mut child = std::process::Command::new(&sandbox.binary)
        .args([SANDBOX_ARG, PID1_ARG])
        .env_clear()
        .env(SANDBOX_ENV, spec)
        .current_dir("/")
        .spawn()
        .map_err(|source| SandboxError::Pid1 {
            step: "starting",
            source,
        })?;
    let pid = Pid::from_raw(child.id() as i32);
    let mut watch = || -> Result<i32, SandboxError> {
        nix::unistd::setgroups(&[]).map_err(step("dropping groups"))?;
        let launch = &sandbox.launch;
        let (uid, gid) = (Uid::from_raw(launch.uid), Gid::from_raw(launch.gid));
        nix::unistd::setresgid(gid, gid, gid).map_err(step("setting the group"))?;
        // From root to the pod's user: every capability goes with it.
        nix::unistd::setresuid(uid, uid, uid).map_err(step("setting the user"))?;
        nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(step("parent-death signal"))?;
        if nix::unistd::getppid() != lab {
            return Err(SandboxError::LabStopped);
        }
        loop {
            match relayed.wait().map_err(step("waiting for signals"))? {
                Signal::SIGCHLD => {
                    if let Some(status) = child.try_wait().map_err(|source| SandboxError::Pid1 {
                        step: "waiting for",
                        source,
                    })? {
                        return Ok(status
                            .code()
                            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)));
                    }
                }
                sig => {
                    let _ = kill(pid, sig);
                }
            }
        }
    };
    match watch() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // The child dies with its relay (its parent-death signal).
            let _ = kill(pid, Signal::SIGKILL);
            Err(e)
        }
    }
}

/// The hostname of a pod called `name`: at most 63 characters, as kubelet truncates it, not
/// ending in `-` or `.`.
fn pod_hostname(name: &str) -> &str {
    let cut = &name[..name.len().min(63)];
    cut.trim_end_matches(['-', '.'])
}

/// Requests a token for the pod's ServiceAccount bound to the pod, as kubelet does for the
/// projected `kube-api-access` volume; returns it and when to renew it (80% of its life).
pub async fn request_token(
    client: &kube::Client,
    pod: &Pod,
) -> Result<(String, Duration), kube::Error> {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .unwrap_or("default");
    let request: TokenRequest = serde_json::from_value(serde_json::json!({"spec": {
        "audiences": [], "expirationSeconds": TOKEN_SECONDS,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                           "name": pod.metadata.name, "uid": pod.metadata.uid}}}))
    .expect("static shape");
    let answer = kube::Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(account, &Default::default(), &request)
        .await?;
    let status = answer
        .status
        .ok_or_else(|| kube::Error::Service("TokenRequest answered without a status".into()))?;
    let left = status
        .expiration_timestamp
        .0
        .duration_since(k8s_openapi::jiff::Timestamp::now())
        .unsigned_abs();
    // Renewed at 80% of its life, as kubelet renews projected tokens.
    Ok((status.token, left.mul_f64(0.8)))
}

/// Replaces the token file of the running process `pid` (through its view of the file system:
/// the tmpfs is private to it), atomically as kubelet's atomic writer does.
pub fn write_token(pid: u32, token: &str) -> std::io::Result<()> {
    // Symbolic links below /proc/<pid>/root resolve against the reader's root, so /var/run
    // (a link to /run on most hosts) is resolved here first: the process sees the same one.
    let var_run = std::fs::canonicalize("/var/run")?;
    let below = SERVICE_ACCOUNT_DIR
        .strip_prefix("/var/run/")
        .expect("the credentials live below /var/run");
    let dir = PathBuf::from(format!("/proc/{pid}/root"))
        .join(var_run.strip_prefix("/").unwrap_or(&var_run))
        .join(below);
    let tmp = dir.join("..token.tmp");
    std::fs::write(&tmp, token)?;
    std::fs::rename(&tmp, dir.join("token"))
}

/// Whether the pod mounts its ServiceAccount token (`automountServiceAccountToken`, default
/// true).
pub fn automounts_token(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.automount_service_account_token)
        != Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> (Pod, Container) {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "ctl", "namespace": "tandem-system"}, "spec": spec}))
        .unwrap();
        let c = pod.spec.as_ref().unwrap().containers[0].clone();
        (pod, c)
    }

    fn container(extra: serde_json::Value) -> serde_json::Value {
        let mut c = json!({"name": "controller", "image": "ghcr.io/tandem-dev/tandem:0.1.0"});
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"containers": [c]})
    }

    #[test]
    fn hostnames_are_cut_to_63_characters_as_kubelet_cuts_them() {
        assert_eq!(pod_hostname("web-0"), "web-0");
        let long = format!("{}-x", "a".repeat(62));
        assert_eq!(pod_hostname(&long), "a".repeat(62));
    }

    #[test]
    fn tandem_images_by_any_tag_or_digest_and_nothing_else() {
        for (image, is) in [
            ("ghcr.io/tandem-dev/tandem", true),
            ("ghcr.io/tandem-dev/tandem:0.1.0", true),
            ("ghcr.io/tandem-dev/tandem@sha256:abc", true),
            ("ghcr.io/tandem-dev/tandem-evil:1", false),
            ("evil.io/ghcr.io/tandem-dev/tandem:1", false),
            ("tandem.dev/echo", false),
        ] {
            assert_eq!(is_tandem_image(image), is, "{image}");
        }
    }

    #[test]
    fn the_controller_role_with_its_own_flags_runs_as_nonroot_without_capabilities() {
        let (p, c) = pod(container(json!({"args": ["controller", "--webhook-addr",
            "0.0.0.0:9443", "--webhook-service=tandem-system/tandem-controller"],
            "env": [{"name": "RUST_LOG", "value": "info"}]})));
        let launch = plan(&p, &c, false).unwrap();
        assert_eq!(launch.args[0], "controller");
        assert_eq!((launch.uid, launch.gid), (DEFAULT_UID, DEFAULT_UID));
        assert!(launch.capabilities.is_empty());
        assert_eq!(launch.env, vec![("RUST_LOG".into(), "info".into())]);
        // `command: [tandem]` is the image's own entrypoint.
        let (p, c) = pod(container(
            json!({"command": ["/tandem", "controller"], "securityContext": {
            "runAsUser": 20000, "capabilities": {"drop": ["ALL"]}}}),
        ));
        let launch = plan(&p, &c, false).unwrap();
        assert_eq!(launch.args, vec!["controller".to_string()]);
        assert_eq!((launch.uid, launch.gid), (20000, 20000));
        assert!(launch.capabilities.is_empty());
    }

    #[test]
    fn the_fabric_roles_get_net_admin_and_nothing_more() {
        for args in [json!(["gateway", "--peer", "milan"]), json!(["agent"])] {
            let (p, c) = pod(container(json!({"args": args, "securityContext": {
                "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}})));
            let launch = plan(&p, &c, false).unwrap();
            assert_eq!(
                launch.capabilities,
                vec![u32::from(::caps::Capability::CAP_NET_ADMIN.index())],
                "{args}"
            );
            assert_eq!(launch.uid, DEFAULT_UID);
        }
        let refused = [
            (
                json!({"args": ["gateway", "--peer", "milan"], "securityContext": {
                    "capabilities": {"add": ["NET_RAW"]}}}),
                "capability NET_RAW is not allowed for `tandem gateway` (allowed: NET_ADMIN)",
            ),
            (
                json!({"args": ["gateway", "--config", "/etc/gw.toml"]}),
                "argument \"--config\" is not allowed for `tandem gateway`",
            ),
            (
                json!({"args": ["agent", "--kubeconfig", "/root/.kube/config"]}),
                "argument \"--kubeconfig\" is not allowed for `tandem agent`",
            ),
            (
                json!({"args": ["gateway", "--peer", "milan"], "securityContext": {
                    "runAsUser": 0, "capabilities": {"add": ["NET_ADMIN"]}}}),
                "never runs as root",
            ),
            // As in a real cluster: no_new_privs voids the binary's file capability.
            (
                json!({"args": ["agent"], "securityContext": {"allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}}),
                "allowPrivilegeEscalation: false disables",
            ),
        ];
        for (extra, want) in refused {
            let (p, c) = pod(container(extra.clone()));
            let err = plan(&p, &c, false)
                .expect_err(&extra.to_string())
                .to_string();
            assert!(err.contains(want), "{extra}: {err}");
        }
    }

    /// The node's TUN device reaches a container only through a hostPath volume of exactly
    /// that device, at that path (runc creates none); any other host path is refused.
    #[test]
    fn the_tun_device_comes_only_from_its_host_path_and_no_other_host_path_is_run() {
        let gateway = |volumes: serde_json::Value, mounts: serde_json::Value| {
            let mut spec = container(json!({"args": ["gateway", "--peer", "milan"],
                "securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}},
                "volumeMounts": mounts}));
            spec["volumes"] = volumes;
            pod(spec)
        };
        let tun = |kind: &str| json!([{"name": "tun", "hostPath": {"path": "/dev/net/tun", "type": kind}}]);
        let at = |path: &str| json!([{"name": "tun", "mountPath": path}]);
        let (p, c) = gateway(json!([]), json!([]));
        assert!(
            !plan(&p, &c, false).unwrap().tun,
            "NET_ADMIN alone gives no device"
        );
        for kind in ["CharDevice", ""] {
            let (p, c) = gateway(tun(kind), at("/dev/net/tun"));
            assert!(plan(&p, &c, false).unwrap().tun, "{kind:?}");
        }
        // Declared but not mounted by this container: nothing, and nothing refused.
        let (p, c) = gateway(tun("CharDevice"), json!([]));
        assert!(!plan(&p, &c, false).unwrap().tun);
        let refused = [
            (tun("CharDevice"), at("/dev/tun")),
            (tun("Directory"), at("/dev/net/tun")),
            (
                json!([{"name": "tun", "hostPath": {"path": "/dev/net"}}]),
                at("/dev/net"),
            ),
            (
                json!([{"name": "tun", "hostPath": {"path": "/"}}]),
                json!([]),
            ),
            (
                json!([{"name": "tun", "hostPath": {"path": "/var/run/netns"}}]),
                at("/var/run/netns"),
            ),
        ];
        for (volumes, mounts) in refused {
            let (p, c) = gateway(volumes.clone(), mounts);
            let err = plan(&p, &c, false)
                .expect_err(&volumes.to_string())
                .to_string();
            assert!(
                err.contains("hostPath volume tun")
                    && err.contains("only /dev/net/tun at /dev/net/tun"),
                "{volumes}: {err}"
            );
        }
    }

    #[test]
    fn everything_outside_the_allow_list_is_refused_with_its_reason() {
        let cases = [
            (
                json!({"args": ["controller", "--kubeconfig", "/root/.kube/config"]}),
                "argument \"--kubeconfig\" is not allowed",
            ),
            (
                json!({"args": ["controller", "--data-dir=/"]}),
                "argument \"--data-dir\"",
            ),
            (json!({"args": ["lab", "up"]}), "only its in-cluster roles"),
            (json!({"args": []}), "only its in-cluster roles"),
            (
                json!({"args": ["controller", "--heartbeat-seconds"]}),
                "needs a value",
            ),
            (
                json!({"command": ["/bin/sh", "-c", "id"]}),
                "exec: \"/bin/sh\"",
            ),
            (
                json!({"args": ["controller"], "env": [{"name": "LD_PRELOAD", "value": "/x.so"}]}),
                "LD_PRELOAD is not allowed",
            ),
            (
                json!({"args": ["controller"], "env": [{"name": "RUST_LOG", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}),
                "RUST_LOG is not allowed",
            ),
            (
                json!({"args": ["controller"], "envFrom": [{"configMapRef": {"name": "x"}}]}),
                "envFrom",
            ),
            (
                json!({"args": ["controller"], "securityContext": {"runAsUser": 0}}),
                "never runs as root",
            ),
            (
                json!({"args": ["controller"], "securityContext": {"privileged": true}}),
                "privileged",
            ),
            (
                json!({"args": ["controller"], "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}),
                "capability SYS_ADMIN is not allowed",
            ),
            (
                json!({"args": ["controller"], "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}),
                "capability NET_ADMIN is not allowed for `tandem controller` (allowed: none)",
            ),
            (
                json!({"args": ["controller"], "securityContext": {"runAsUser": 1000}}),
                "runAsUser 1000 is not allowed",
            ),
            (
                json!({"args": ["controller"], "securityContext": {"runAsGroup": 0}}),
                "runAsGroup 0 is not allowed",
            ),
            (
                json!({"args": ["controller"], "securityContext": {"runAsGroup": 6}}),
                "runAsGroup 6 is not allowed",
            ),
        ];
        for (extra, want) in cases {
            let (p, c) = pod(container(extra.clone()));
            let err = plan(&p, &c, false)
                .expect_err(&extra.to_string())
                .to_string();
            assert!(err.contains(want), "{extra}: {err}");
        }
        let (p, c) = pod(container(json!({"args": ["controller"]})));
        let err = plan(&p, &c, true).unwrap_err().to_string();
        assert!(err.contains("twin namespace"), "{err}");
        // Of the roles, only the probe runs in a twin namespace, and only as it is: no
        // capability, no other role's flag.
        let (p, c) = pod(container(json!({"args": ["probe", "--serve=8080"]})));
        assert_eq!(plan(&p, &c, true).unwrap().capabilities, Vec::<u32>::new());
        for (extra, want) in [
            (
                json!({"args": ["probe", "--serve=8080"],
                       "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}),
                "capability NET_ADMIN is not allowed for `tandem probe` (allowed: none)",
            ),
            (
                json!({"args": ["probe", "--peer=milan"]}),
                "argument \"--peer\" is not allowed for `tandem probe`",
            ),
            (
                json!({"args": ["gateway", "--peer=milan"]}),
                "twin namespace",
            ),
        ] {
            let (p, c) = pod(container(extra.clone()));
            let err = plan(&p, &c, true)
                .expect_err(&extra.to_string())
                .to_string();
            assert!(err.contains(want), "{extra}: {err}");
        }
        // The pod-level user applies; uid 0 there is refused too.
        let (p, c) = pod(json!({"securityContext": {"runAsUser": 0}, "containers": [
            {"name": "c", "image": "ghcr.io/tandem-dev/tandem", "args": ["controller"]}]}));
        assert!(
            plan(&p, &c, false)
                .unwrap_err()
                .to_string()
                .contains("root")
        );
    }
}

//! The namespaces of network mode: one lab *instance* per process (its WAN), per cluster an
//! edge (the node network's bridge, the control-plane address, the uplink to the WAN), a
//! namespace per node and one per pod.
//!
//! Addresses, for cluster index `c` (1-based):
//! - node network 172.<17+c>.0.0/16, the edge at 172.<17+c>.0.1, node k at its InternalIP;
//! - pods: the node's /24 of the pod CIDR; a pod's `eth0` holds its IP as a /32 with a default
//!   route to 169.254.1.1, which the node side of its veth answers by proxy ARP, and the node
//!   routes the /32 to that veth (routed, no bridge: a Service's DNAT on the node sees both
//!   directions of a same-node connection);
//! - WAN: cluster c's public address is 198.18.<c>.2, the WAN router's 198.18.<c>.1; the edge
//!   masquerades what leaves to the WAN, as a cluster's NAT gateway does;
//! - site LAN: every node of every cluster of the instance also has `lan0` on one shared
//!   segment (a bridge in the WAN namespace), node k of cluster c at 198.19.<c>.<k>/16 with no
//!   route but its own and multicast's: the link-local multicast of clusters whose nodes share
//!   a building's LAN (mDNS discovery, from a hostNetwork pod) and nothing else — unicast
//!   between clusters still crosses the WAN.
//!
//! The host's own namespace gets nothing: no address, route or rule. Namespaces are made and
//! configured with iproute2 (`ip`), whose batch mode applies many changes per process; sysctls
//! are written from a thread that entered the namespace.

use std::collections::BTreeMap;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

pub use super::error::NetworkError;
use super::netns;

/// Where instances register their owner's pid (cleaned when the owner is gone).
pub const REGISTRY: &str = "/run/tandem-lab";

fn step(step: impl Into<String>, e: impl std::fmt::Display) -> NetworkError {
    NetworkError::Step {
        step: step.into(),
        detail: e.to_string(),
    }
}

/// Fails with [`NetworkError::NotRoot`] unless the process is root.
pub fn require_root() -> Result<(), NetworkError> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(NetworkError::NotRoot)
    }
}

/// The commands network mode runs, with the Debian packages that have them.
/// The lab API server's Service range (its `service_cidr` default).
const SERVICE_CIDR: &str = "10.96.0.0/12";

const TOOLS: [(&str, &str); 2] = [("ip", "iproute2"), ("nft", "nftables")];

/// The first of [`TOOLS`] found in no directory of `path` (a PATH value).
fn missing_tool(path: &std::ffi::OsStr) -> Option<(&'static str, &'static str)> {
    TOOLS
        .into_iter()
        .find(|(tool, _)| !std::env::split_paths(path).any(|dir| dir.join(tool).is_file()))
}

/// Fails, naming the package, when a command network mode runs is not installed — instead of
/// half-building a cluster's namespaces and failing at the first rule.
pub fn require_tools() -> Result<(), NetworkError> {
    match missing_tool(&std::env::var_os("PATH").unwrap_or_default()) {
        Some((tool, package)) => Err(NetworkError::MissingTool { tool, package }),
        None => Ok(()),
    }
}

/// Runs `ip [-n ns] -batch -` with `lines` as its input.
fn ip_batch(ns: Option<&str>, lines: &str) -> Result<(), NetworkError> {
    use std::io::Write;
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    let mut child = cmd
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| step("running ip (iproute2)", e))?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(lines.as_bytes())
        .map_err(|e| step("writing to ip", e))?;
    let out = child
        .wait_with_output()
        .map_err(|e| step("waiting for ip", e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(step(
            format!("ip {}", ns.map(|n| format!("-n {n} ")).unwrap_or_default()),
            format!(
                "{} (commands: {})",
                String::from_utf8_lossy(&out.stderr).trim(),
                lines.trim().replace('\n', "; ")
            ),
        ))
    }
}

/// Adds the named namespace, its loopback up.
fn add_namespace(name: &str) -> Result<(), NetworkError> {
    ip_batch(None, &format!("netns add {name}\n"))?;
    ip_batch(Some(name), "link set lo up\n")
}

/// Deletes the named namespace (its links, routes and nftables tables go with it).
fn delete_namespace(name: &str) {
    let _ = Command::new("ip")
        .args(["netns", "delete", name])
        .stderr(Stdio::null())
        .status();
}

/// Writes sysctls (`net/ipv4/ip_forward` style paths under /proc/sys) inside namespace `ns`.
fn sysctls(ns: &str, values: &[(String, &'static str)]) -> Result<(), NetworkError> {
    let values: Vec<(String, &'static str)> = values.to_vec();
    netns::run_in(ns, move || {
        for (key, value) in &values {
            std::fs::write(Path::new("/proc/sys").join(key), value)
                .map_err(|e| io::Error::new(e.kind(), format!("{key}: {e}")))?;
        }
        Ok(())
    })
    .map_err(|e| step(format!("setting sysctls in {ns}"), e))
}

/// Runs `nft -f -` with `script` inside namespace `ns` (the child inherits the namespace of
/// the thread that starts it).
pub fn nft(ns: &str, script: &str) -> Result<(), NetworkError> {
    let script = script.to_string();
    let out = netns::run_in(ns, move || {
        use std::io::Write;
        let mut child = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(script.as_bytes())?;
        child.wait_with_output()
    })
    .map_err(|e| step(format!("running nft in {ns}"), e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(step(
            format!("nft in {ns}"),
            String::from_utf8_lossy(&out.stderr).trim(),
        ))
    }
}

/// Names every namespace in /run/netns.
pub fn namespaces() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A short stable hash of `s` (FNV-1a), for names that must fit 15-character link names.
fn short_hash(s: &str) -> String {
    let mut h: u32 = 0x811c9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x01000193);
    }
    format!("{h:08x}")
}

/// The process start time of `pid` (field 22 of /proc/<pid>/stat), to tell a live owner from
/// a new process that reused its pid.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after its closing parenthesis.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// One lab instance: the namespaces of every network-mode cluster of this process, joined
/// by a WAN namespace. Dropping the last handle deletes the WAN and the registration.
pub struct Instance {
    /// Four hex digits naming the instance's namespaces (`lab-<id>-…`).
    pub id: String,
    registration: PathBuf,
    clusters: Mutex<Vec<usize>>,
}

static CURRENT: Mutex<Weak<Instance>> = Mutex::new(Weak::new());

impl Instance {
    /// This process's instance, created (after removing instances whose owner is dead) on
    /// first use.
    pub fn get() -> Result<Arc<Instance>, NetworkError> {
        require_root()?;
        require_tools()?;
        let mut current = CURRENT.lock();
        if let Some(live) = current.upgrade() {
            return Ok(live);
        }
        cleanup_stale();
        let pid = std::process::id();
        let mut id = format!("{:04x}", (pid ^ (pid >> 16)) & 0xffff);
        let taken = |id: &str| {
            Path::new(REGISTRY).join(id).exists()
                || namespaces()
                    .iter()
                    .any(|n| n.starts_with(&format!("lab-{id}-")))
        };
        let mut salt = 1u32;
        while taken(&id) {
            id = format!("{:04x}", (pid.wrapping_mul(2654435761) ^ salt) & 0xffff);
            salt += 1;
        }
        // The registration appears whole (made aside, then renamed), so that another
        // process cleaning up never sees it without its owner.
        let registration = Path::new(REGISTRY).join(&id);
        let staging = Path::new(REGISTRY).join(format!(".new-{pid}-{id}"));
        std::fs::create_dir_all(&staging)
            .map_err(|e| step(format!("creating {}", staging.display()), e))?;
        let owner = format!("{pid} {}\n", start_time(pid).unwrap_or(0));
        std::fs::write(staging.join("owner"), owner)
            .map_err(|e| step("registering the lab instance", e))?;
        std::fs::rename(&staging, &registration).map_err(|e| {
            step(
                format!("registering the lab instance as {}", registration.display()),
                e,
            )
        })?;
        let instance = Arc::new(Instance {
            id,
            registration,
            clusters: Mutex::new(Vec::new()),
        });
        let wan = instance.wan();
        add_namespace(&wan)?;
        sysctls(&wan, &[("net/ipv4/ip_forward".into(), "1")])?;
        ip_batch(
            Some(&wan),
            &format!("link add {LAN_BRIDGE} type bridge\nlink set {LAN_BRIDGE} up\n"),
        )?;
        *current = Arc::downgrade(&instance);
        Ok(instance)
    }

    /// The WAN namespace's name.
    pub fn wan(&self) -> String {
        format!("lab-{}-wan", self.id)
    }

    /// Every namespace of this instance that exists now.
    pub fn namespaces(&self) -> Vec<String> {
        let prefix = format!("lab-{}-", self.id);
        namespaces()
            .into_iter()
            .filter(|n| n.starts_with(&prefix))
            .collect()
    }
}

impl Instance {
    /// Deletes every namespace of the instance and its registration; the next
    /// [`Instance::get`] makes a new instance.
    fn remove(&self) {
        {
            let mut current = CURRENT.lock();
            if current.upgrade().is_some_and(|c| c.id == self.id) {
                *current = Weak::new();
            }
        }
        for ns in self.namespaces() {
            delete_namespace(&ns);
        }
        let _ = std::fs::remove_dir_all(&self.registration);
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Removes the namespaces and registrations of instances whose owner process is gone (never
/// those of a live one).
pub fn cleanup_stale() {
    let Ok(dir) = std::fs::read_dir(REGISTRY) else {
        return;
    };
    let all = namespaces();
    for entry in dir.filter_map(|e| e.ok()) {
        let id = entry.file_name().to_string_lossy().into_owned();
        if let Some(rest) = id.strip_prefix(".new-") {
            // A registration being made: removed only if its maker is gone.
            let maker: Option<u32> = rest.split('-').next().and_then(|p| p.parse().ok());
            if maker.is_some_and(|p| start_time(p).is_none()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
            continue;
        }
        let owner = std::fs::read_to_string(entry.path().join("owner")).unwrap_or_default();
        let mut fields = owner.split_whitespace();
        let pid: Option<u32> = fields.next().and_then(|p| p.parse().ok());
        let started: Option<u64> = fields.next().and_then(|s| s.parse().ok());
        let alive = pid.is_some_and(|pid| {
            let now = start_time(pid);
            now.is_some() && (started.is_none() || started == Some(0) || now == started)
        });
        if alive {
            continue;
        }
        tracing::info!(instance = %id, "removing a lab instance whose process is gone");
        let prefix = format!("lab-{id}-");
        for ns in all.iter().filter(|n| n.starts_with(&prefix)) {
            delete_namespace(ns);
        }
        let _ = std::fs::remove_dir_all(entry.path());
    }
}

/// Every cluster's node network (see [`node_net`]).
const NODE_NETWORKS: &str = "172.16.0.0/12";

/// The node network of cluster `index`: its prefix's first two octets.
fn node_net(index: usize) -> (u8, u8) {
    (172, (17 + index).min(31) as u8)
}

/// The InternalIP of node `k` (1-based) of cluster `index`.
pub fn node_ip(index: usize, k: usize) -> Ipv4Addr {
    let (a, b) = node_net(index);
    Ipv4Addr::new(a, b, (k / 250) as u8, (k % 250 + 2) as u8)
}

/// The control-plane (edge) address of cluster `index` on its node network.
pub fn edge_ip(index: usize) -> Ipv4Addr {
    let (a, b) = node_net(index);
    Ipv4Addr::new(a, b, 0, 1)
}

/// The public (WAN) address of cluster `index`.
pub fn wan_ip(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, index as u8, 2)
}

/// The site LAN's bridge, in the WAN namespace.
const LAN_BRIDGE: &str = "lan";

/// The address of node `k` (1-based) of cluster `index` on the site LAN (a /16), or None past
/// the 254 nodes a cluster's block holds (such nodes get no LAN link).
pub fn lan_ip(index: usize, k: usize) -> Option<Ipv4Addr> {
    (1..=254)
        .contains(&k)
        .then(|| Ipv4Addr::new(198, 19, index as u8, k as u8))
}

/// One node as the topology needs it.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// Node name.
    pub name: String,
    /// 1-based index within the cluster.
    pub index: usize,
    /// InternalIP.
    pub ip: Ipv4Addr,
    /// The node's pod /24.
    pub pod_cidr: ipnet::Ipv4Net,
}

/// The namespaces of one cluster. Dropping it deletes them.
pub struct ClusterNet {
    instance: Arc<Instance>,
    /// The cluster's index in the instance (1-based).
    pub index: usize,
    nodes: Vec<NodeSpec>,
    /// Whether the nodes are on the network every such cluster's nodes share (kind's docker
    /// bridge), rather than behind the cluster's NAT.
    shared: bool,
    pods: Mutex<BTreeMap<String, String>>,
}

impl ClusterNet {
    /// Builds the edge and node namespaces of cluster `index`, and joins it to the WAN.
    /// `shared`: its node network is routed, unNATed, to and from the other clusters' that
    /// are shared too (as kind's clusters share one docker bridge).
    pub fn create(
        instance: Arc<Instance>,
        index: usize,
        nodes: Vec<NodeSpec>,
        shared: bool,
    ) -> Result<ClusterNet, NetworkError> {
        if !(1..=14).contains(&index) {
            return Err(step(
                "choosing the node network",
                format!("cluster index {index} is outside 1..=14"),
            ));
        }
        {
            let mut used = instance.clusters.lock();
            if used.contains(&index) {
                return Err(NetworkError::IndexInUse(index));
            }
            used.push(index);
        }
        let net = ClusterNet {
            instance,
            index,
            nodes,
            shared,
            pods: Mutex::new(BTreeMap::new()),
        };
        net.build()?;
        Ok(net)
    }

    fn build(&self) -> Result<(), NetworkError> {
        let c = self.index;
        let edge = self.edge();
        let wan = self.instance.wan();
        add_namespace(&edge)?;
        sysctls(
            &edge,
            &[
                ("net/ipv4/ip_forward".into(), "1"),
                ("net/ipv4/conf/all/rp_filter".into(), "0"),
            ],
        )?;
        let mut lines = format!(
            "link add br0 type bridge\n\
             addr add {edge_ip}/16 dev br0\n\
             link set br0 up\n\
             link add wan0 type veth peer name c{c} netns {wan}\n\
             addr add {wan_ip}/24 dev wan0\n\
             link set wan0 up\n",
            edge_ip = edge_ip(c),
            wan_ip = wan_ip(c),
        );
        for node in &self.nodes {
            let ns = self.node_ns(node.index);
            add_namespace(&ns)?;
            sysctls(
                &ns,
                &[
                    ("net/ipv4/ip_forward".into(), "1"),
                    ("net/ipv4/conf/all/rp_filter".into(), "0"),
                ],
            )?;
            lines.push_str(&format!(
                "link add n{k} type veth peer name eth0 netns {ns}\n\
                 link set n{k} master br0\n\
                 link set n{k} up\n\
                 route add {cidr} via {ip}\n",
                k = node.index,
                cidr = node.pod_cidr,
                ip = node.ip,
            ));
        }
        // The Service range, so that what the edge itself sends to a ClusterIP (the cluster
        // DNS forwarding a stub domain to a Service) finds a route; kube-proxy's DNAT in the
        // edge then sends it to the endpoint's pod route.
        lines.push_str(&format!("route add {SERVICE_CIDR} dev br0\n"));
        ip_batch(Some(&edge), &lines)?;
        // The WAN router: cluster c's uplink, and the WAN-wide route back through it.
        ip_batch(
            Some(&wan),
            &format!(
                "addr add 198.18.{c}.1/24 dev c{c}\n\
                 link set c{c} up\n"
            ),
        )?;
        ip_batch(
            Some(&edge),
            &format!("route add 198.18.0.0/16 via 198.18.{c}.1\n"),
        )?;
        // A shared node network (kind's): the WAN router routes it to this edge, the edge
        // routes the other shared ones through the WAN, and traffic between nodes keeps its
        // addresses; anything else leaving for the WAN is masqueraded, as before (a pod's
        // traffic to another cluster's node leaves from an address that cluster can answer,
        // as kindnet masquerades what pods send off the pod network).
        let (a, b) = node_net(c);
        let mut keep = String::new();
        if self.shared {
            ip_batch(
                Some(&wan),
                &format!(
                    "route add {a}.{b}.0.0/16 via {wan_ip}\n",
                    wan_ip = wan_ip(c)
                ),
            )?;
            ip_batch(
                Some(&edge),
                &format!("route add {NODE_NETWORKS} via 198.18.{c}.1\n"),
            )?;
            keep = format!("ip saddr {NODE_NETWORKS} ip daddr {NODE_NETWORKS} accept\n\t\t");
        }
        nft(
            &edge,
            &format!(
                "table ip lab-edge {{\n\
                 \tchain postrouting {{\n\
                 \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
                 \t\t{keep}oifname \"wan0\" masquerade\n\
                 \t}}\n\
                 }}\n"
            ),
        )?;
        // The site LAN: each node's `lan0`, its peer on the WAN namespace's bridge.
        let lan: String = self
            .nodes
            .iter()
            .filter(|node| lan_ip(c, node.index).is_some())
            .map(|node| {
                format!(
                    "link add l{c}-{k} type veth peer name lan0 netns {ns}\n\
                     link set l{c}-{k} master {LAN_BRIDGE}\n\
                     link set l{c}-{k} up\n",
                    k = node.index,
                    ns = self.node_ns(node.index),
                )
            })
            .collect();
        if !lan.is_empty() {
            ip_batch(Some(&wan), &lan)?;
        }
        for node in &self.nodes {
            let mut lines = format!(
                "addr add {ip}/16 dev eth0\n\
                 link set eth0 up\n\
                 route add default via {edge}\n",
                ip = node.ip,
                edge = edge_ip(c),
            );
            if let Some(lan_ip) = lan_ip(c, node.index) {
                lines.push_str(&format!(
                    "addr add {lan_ip}/16 dev lan0\n\
                     link set lan0 up\n\
                     route add 224.0.0.0/4 dev lan0\n"
                ));
            }
            for other in self.nodes.iter().filter(|o| o.index != node.index) {
                lines.push_str(&format!("route add {} via {}\n", other.pod_cidr, other.ip));
            }
            ip_batch(Some(&self.node_ns(node.index)), &lines)?;
        }
        Ok(())
    }

    /// The edge namespace's name.
    pub fn edge(&self) -> String {
        format!("lab-{}-{}-net", self.instance.id, self.index)
    }

    /// Node `k`'s namespace name.
    pub fn node_ns(&self, k: usize) -> String {
        format!("lab-{}-{}-node-{k}", self.instance.id, self.index)
    }

    /// The namespace of node `name`, if it is one of this cluster's.
    pub fn node_ns_of(&self, name: &str) -> Option<String> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .map(|n| self.node_ns(n.index))
    }

    /// Every node namespace.
    pub fn node_namespaces(&self) -> Vec<(NodeSpec, String)> {
        self.nodes
            .iter()
            .map(|n| (n.clone(), self.node_ns(n.index)))
            .collect()
    }

    /// The namespace name of pod `namespace/name` (namespace names are at most 255
    /// characters: long pod names are shortened with a hash).
    pub fn pod_ns(&self, namespace: &str, name: &str) -> String {
        let full = format!("lab-{}-{}-{namespace}-{name}", self.instance.id, self.index);
        if full.len() <= 200 {
            full
        } else {
            format!("{}-{}", &full[..190], short_hash(&full))
        }
    }

    /// Gives pod `namespace/name` (uid `uid`) on node `node` its network namespace with
    /// `eth0` at `ip`. Idempotent: an existing namespace for the pod is replaced.
    pub fn attach_pod(
        &self,
        node: &str,
        namespace: &str,
        name: &str,
        uid: &str,
        ip: Ipv4Addr,
    ) -> Result<String, NetworkError> {
        let node_ns = self
            .node_ns_of(node)
            .ok_or_else(|| step("attaching a pod", format!("{node} is not a lab node")))?;
        let ns = self.pod_ns(namespace, name);
        if namespaces().contains(&ns) {
            delete_namespace(&ns);
        }
        add_namespace(&ns)?;
        let veth = format!("v{}", &short_hash(uid)[..8]);
        ip_batch(
            Some(&node_ns),
            &format!(
                "link add {veth} type veth peer name eth0 netns {ns}\n\
                 link set {veth} up\n\
                 route replace {ip}/32 dev {veth}\n"
            ),
        )?;
        // Answered at once, as Calico configures its veths: Linux delays proxy ARP replies by
        // up to proxy_delay (0.8 s by default), which every pod's first packet waited for.
        sysctls(
            &node_ns,
            &[
                (format!("net/ipv4/conf/{veth}/proxy_arp"), "1"),
                (format!("net/ipv4/neigh/{veth}/proxy_delay"), "0"),
            ],
        )?;
        ip_batch(
            Some(&ns),
            &format!(
                "addr add {ip}/32 dev eth0\n\
                 link set eth0 up\n\
                 route add 169.254.1.1 dev eth0 scope link\n\
                 route add default via 169.254.1.1 dev eth0\n"
            ),
        )?;
        self.pods.lock().insert(uid.to_string(), ns.clone());
        Ok(ns)
    }

    /// Removes the pod's namespace (its veth, and the node's route through it, go with it).
    pub fn detach_pod(&self, uid: &str) {
        if let Some(ns) = self.pods.lock().remove(uid) {
            delete_namespace(&ns);
        }
    }
}

impl ClusterNet {
    /// Deletes the cluster's namespaces (and the instance's, if it was its last cluster).
    /// Idempotent; runs on drop too.
    pub fn remove(&self) {
        let prefix = format!("lab-{}-{}-", self.instance.id, self.index);
        for ns in namespaces().iter().filter(|n| n.starts_with(&prefix)) {
            delete_namespace(ns);
        }
        self.pods.lock().clear();
        let last = {
            let mut used = self.instance.clusters.lock();
            let before = used.len();
            used.retain(|i| *i != self.index);
            before > 0 && used.is_empty()
        };
        if last {
            self.instance.remove();
        }
    }
}

impl Drop for ClusterNet {
    fn drop(&mut self) {
        self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_follow_the_cluster_index() {
        assert_eq!(node_ip(1, 1), Ipv4Addr::new(172, 18, 0, 3));
        assert_eq!(node_ip(2, 1), Ipv4Addr::new(172, 19, 0, 3));
        assert_eq!(node_ip(1, 251), Ipv4Addr::new(172, 18, 1, 3));
        assert_eq!(edge_ip(3), Ipv4Addr::new(172, 20, 0, 1));
        assert_eq!(wan_ip(2), Ipv4Addr::new(198, 18, 2, 2));
        assert_eq!(lan_ip(2, 1), Some(Ipv4Addr::new(198, 19, 2, 1)));
        assert_eq!(lan_ip(14, 254), Some(Ipv4Addr::new(198, 19, 14, 254)));
        assert_eq!(lan_ip(1, 255), None);
    }

    #[test]
    fn a_missing_command_is_named_with_its_package() {
        let dir = tempfile::tempdir().unwrap();
        let path = std::env::join_paths([dir.path()]).unwrap();
        let (tool, package) = missing_tool(&path).expect("nothing is installed there");
        let text = NetworkError::MissingTool { tool, package }.to_string();
        assert!(text.contains("`ip`") && text.contains("iproute2"), "{text}");
        for tool in ["ip", "nft"] {
            std::fs::write(dir.path().join(tool), "").unwrap();
        }
        assert_eq!(missing_tool(&path), None);
    }

    #[test]
    fn the_error_without_root_says_what_to_do() {
        let text = NetworkError::NotRoot.to_string();
        assert!(text.contains("needs root"), "{text}");
        assert!(text.contains("leave network mode off"), "{text}");
    }

    #[test]
    fn short_hashes_fit_link_names() {
        let h = short_hash("0f1c2d3e-aaaa-bbbb-cccc-123456789abc");
        assert_eq!(h.len(), 8);
        assert_ne!(h, short_hash("another uid"));
    }
}

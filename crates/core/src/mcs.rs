//! Multi-cluster services (KEP-1645): how the exports of one Service from several clusters
//! merge into one ServiceImport, and which exports conflict.
//!
//! The KEP's rules: the import's ports are the union of the exported ports; every other
//! property (the type — ClusterSetIP or Headless — and session affinity) and any port that
//! clashes are taken from the oldest export (creation time of the ServiceExport, ties broken
//! by cluster ID so every cluster picks the same one). While any export lost a clash, every
//! export of the Service gets the `Conflict` condition (the KEP sets it on all of them), with
//! a message naming what clashed and which cluster's export won.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::prefix::translate;

/// Whether an import has a cluster-set IP or resolves to its endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub enum ImportType {
    #[default]
    ClusterSetIP,
    Headless,
}

impl ImportType {
    pub fn as_str(self) -> &'static str {
        match self {
            ImportType::ClusterSetIP => "ClusterSetIP",
            ImportType::Headless => "Headless",
        }
    }
}

/// One exported Service port (the Service's port, not the endpoints' target port).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportedPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub protocol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    pub port: i32,
}

impl ExportedPort {
    fn describe(&self) -> String {
        match &self.name {
            Some(n) => format!("port {n:?} ({} {})", self.protocol, self.port),
            None => format!("port {} {}", self.protocol, self.port),
        }
    }

    /// Two different ports clash when they share a name (an absent name counts as the empty
    /// one) or a protocol and number: the merged Service could not hold both (KEP-1645).
    fn clashes_with(&self, other: &ExportedPort) -> bool {
        let same_name = self.name.as_deref().unwrap_or("") == other.name.as_deref().unwrap_or("");
        let same_number = self.port == other.port && self.protocol == other.protocol;
        (same_name || same_number) && self != other
    }
}

/// The properties of one cluster's export of a Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportProperties {
    /// The exporting cluster's ID.
    pub cluster: String,
    /// When the ServiceExport was created (Unix seconds): the oldest wins conflicts.
    pub created: i64,
    pub import_type: ImportType,
    pub ports: Vec<ExportedPort>,
    /// `None` or `ClientIP`.
    pub session_affinity: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity_timeout: Option<i32>,
}

/// What a losing export clashed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Conflict {
    Type {
        ours: ImportType,
        theirs: ImportType,
        winner: String,
    },
    Port {
        ours: ExportedPort,
        theirs: ExportedPort,
        winner: String,
    },
    SessionAffinity {
        ours: String,
        theirs: String,
        winner: String,
    },
}

impl Conflict {
    /// The KEP's condition reason for this kind of conflict.
    pub fn reason(&self) -> &'static str {
        match self {
            Conflict::Type { .. } => "TypeConflict",
            Conflict::Port { .. } => "PortConflict",
            Conflict::SessionAffinity { .. } => "SessionAffinityConflict",
        }
    }

    pub fn message(&self) -> String {
        match self {
            Conflict::Type {
                ours,
                theirs,
                winner,
            } => format!(
                "type {} conflicts with the older export of cluster {winner} ({}), which is used",
                ours.as_str(),
                theirs.as_str()
            ),
            Conflict::Port {
                ours,
                theirs,
                winner,
            } => format!(
                "{} conflicts with {} of the older export of cluster {winner}, which is used",
                ours.describe(),
                theirs.describe()
            ),
            Conflict::SessionAffinity {
                ours,
                theirs,
                winner,
            } => format!(
                "sessionAffinity {ours} conflicts with the older export of cluster {winner} \
                 ({theirs}), which is used"
            ),
        }
    }
}

/// The merge of every export of one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Merged {
    pub import_type: ImportType,
    pub ports: Vec<ExportedPort>,
    pub session_affinity: String,
    pub session_affinity_timeout: Option<i32>,
    /// The exporting clusters, sorted.
    pub clusters: Vec<String>,
    /// The conflicts of each cluster whose export lost one (the oldest never appears).
    pub conflicts: BTreeMap<String, Vec<Conflict>>,
}

impl Merged {
    /// The `Conflict` condition's reason (the KEP's reasons, comma-separated) and message
    /// for every export of the Service, or None when the exports agree.
    pub fn conflict_summary(&self) -> Option<(String, String)> {
        let all: Vec<(&String, &Conflict)> = self
            .conflicts
            .iter()
            .flat_map(|(cluster, cs)| cs.iter().map(move |c| (cluster, c)))
            .collect();
        if all.is_empty() {
            return None;
        }
        let mut reasons: Vec<&str> = all.iter().map(|(_, c)| c.reason()).collect();
        reasons.sort();
        reasons.dedup();
        let message = all
            .iter()
            .map(|(cluster, c)| format!("cluster {cluster}: {}", c.message()))
            .collect::<Vec<_>>()
            .join("; ");
        Some((reasons.join(","), message))
    }
}

/// Merges the exports of one Service (at least one) as KEP-1645 says.
pub fn merge(exports: &[ExportProperties]) -> Option<Merged> {
    let mut ordered: Vec<&ExportProperties> = exports.iter().collect();
    ordered.sort_by(|a, b| (a.created, &a.cluster).cmp(&(b.created, &b.cluster)));
    ordered.dedup_by(|a, b| a.cluster == b.cluster);
    let oldest = *ordered.first()?;
    let mut merged = Merged {
        import_type: oldest.import_type,
        ports: Vec::new(),
        session_affinity: oldest.session_affinity.clone(),
        session_affinity_timeout: oldest.session_affinity_timeout,
        clusters: ordered.iter().map(|e| e.cluster.clone()).collect(),
        conflicts: BTreeMap::new(),
    };
    merged.clusters.sort();
    // Which export each kept port came from, to name the winner of a clash.
    let mut owners: Vec<(ExportedPort, String)> = Vec::new();
    for export in &ordered {
        let mut conflicts = Vec::new();
        if export.import_type != oldest.import_type {
            conflicts.push(Conflict::Type {
                ours: export.import_type,
                theirs: oldest.import_type,
                winner: oldest.cluster.clone(),
            });
        }
        if (&export.session_affinity, export.session_affinity_timeout)
            != (&oldest.session_affinity, oldest.session_affinity_timeout)
        {
            conflicts.push(Conflict::SessionAffinity {
                ours: export.session_affinity.clone(),
                theirs: oldest.session_affinity.clone(),
                winner: oldest.cluster.clone(),
            });
        }
        for port in &export.ports {
            if owners.iter().any(|(p, _)| p == port) {
                continue;
            }
            // A Service with several ports must name each one, so an unnamed port of one
            // export cannot sit next to another export's port either.
            let clashes = |(p, owner): &&(ExportedPort, String)| {
                p.clashes_with(port)
                    || (*owner != export.cluster && (p.name.is_none() || port.name.is_none()))
            };
            match owners.iter().find(clashes) {
                Some((theirs, winner)) => conflicts.push(Conflict::Port {
                    ours: port.clone(),
                    theirs: theirs.clone(),
                    winner: winner.clone(),
                }),
                None => owners.push((port.clone(), export.cluster.clone())),
            }
        }
        if !conflicts.is_empty() {
            merged.conflicts.insert(export.cluster.clone(), conflicts);
        }
    }
    merged.ports = owners.into_iter().map(|(p, _)| p).collect();
    merged.ports.sort();
    Some(merged)
}

/// An exported endpoint address as the importing cluster reaches it: `ip` (in the exporting
/// cluster's pod CIDR `remote`) moved into the importing cluster's name for that CIDR
/// (`here`). Anything outside `remote` is not a pod of the exporting cluster, and the
/// importer never points at it (an exporter cannot aim imports at the importer's own
/// addresses or at third clusters): None.
pub fn import_address(ip: &str, remote: IpNet, here: IpNet) -> Option<String> {
    let ip: IpAddr = ip.parse().ok()?;
    translate(ip, &remote, &here).map(|ip| ip.to_string())
}

/// Namespaces no peer's export is imported into unless its administrator opts them in.
pub const SYSTEM_NAMESPACES: &[&str] = &[
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "tandem-system",
];

/// What the importing cluster knows of the namespace of its own that a peer's export names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportNamespace<'a> {
    pub name: &'a str,
    /// When it is a twin namespace: the consumer it belongs to and that consumer's namespace
    /// it mirrors (its labels, set by this cluster when it made the twin).
    pub twin_of: Option<(&'a str, &'a str)>,
    /// Its administrator's opt-in annotation (`mcs.tandem.dev/import-from`): peers' cluster
    /// IDs, comma-separated, or `*` for every peer.
    pub opted_in: Option<&'a str>,
}

/// Why a peer's export may become (part of) an import in a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportScope {
    /// The namespace is the peer's own twin of the namespace it exports from: the relation
    /// of the peering already shares it with that peer.
    Twin,
    /// This cluster's administrator opted the namespace in for that peer.
    OptedIn,
}

/// Why a peer's export is not imported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotImported {
    /// No such namespace here (or it is going): nothing is ever created for a peer.
    NoNamespace,
    /// A tenant namespace (never), or a system namespace not opted in.
    Reserved,
    /// Neither the peer's twin of that namespace nor opted in for it (another consumer's
    /// twin included).
    NotShared { twin_of: Option<String> },
    /// The peer's own twin, but this cluster exports a Service of that name there itself: a
    /// peer's export joins this cluster's own only where the administrator opted in.
    OwnExport,
}

impl NotImported {
    /// The rule, as an Event's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            NotImported::NoNamespace => "NoNamespace",
            NotImported::Reserved => "ReservedNamespace",
            NotImported::NotShared { .. } => "NamespaceNotShared",
            NotImported::OwnExport => "OwnServiceNotMerged",
        }
    }

    /// Whether it may only come from a peer writing what an honest one would not: an honest
    /// peer's export in a namespace not shared with it is a choice of this cluster's
    /// administrator to make, the others are refusals.
    pub fn is_warning(&self) -> bool {
        !matches!(
            self,
            NotImported::NoNamespace | NotImported::NotShared { .. }
        )
    }

    /// What an administrator reads: the rule, the export, and how to opt in where that is
    /// possible.
    pub fn message(&self, peer: &str, namespace: &str, service: &str) -> String {
        let what = format!("the export of Service {namespace}/{service} by cluster {peer}");
        let opt_in = format!(
            "opt in with the annotation {IMPORT_FROM_ANNOTATION}={peer} on namespace {namespace}, \
             or spec.serviceImportNamespaces of the peer's Tenant or Peering"
        );
        match self {
            NotImported::NoNamespace => {
                format!("{what} is not imported: there is no namespace {namespace} here")
            }
            NotImported::Reserved => format!(
                "{what} is not imported: {namespace} is a system or tenant namespace, which \
                 receives no peer's imports unless opted in (tenant namespaces never)"
            ),
            NotImported::NotShared {
                twin_of: Some(owner),
            } => format!(
                "{what} is not imported: namespace {namespace} is the twin namespace of cluster \
                 {owner}, not shared with {peer}; {opt_in}"
            ),
            NotImported::NotShared { twin_of: None } => format!(
                "{what} is not imported: namespace {namespace} is not shared with {peer} (not its \
                 twin namespace, not opted in); {opt_in}"
            ),
            NotImported::OwnExport => format!(
                "{what} is not merged with this cluster's own export of {namespace}/{service}: a \
                 peer's export joins this cluster's own only where the administrator opted in; \
                 {opt_in}"
            ),
        }
    }
}

/// On a namespace: the peers (cluster IDs, comma-separated, or `*`) whose exports its
/// administrator lets become imports there.
pub const IMPORT_FROM_ANNOTATION: &str = "mcs.tandem.dev/import-from";

/// Whether `peer`'s export of a Service in its namespace `exported_from` may become an import
/// in this cluster's namespace of the same name (`here`, None when there is none), and why.
///
/// A peer's export is imported only where the relation applies: the peer's own twin of that
/// namespace (this cluster provides to it and made the twin for it), or a namespace this
/// cluster's administrator opted in for it — listed in `lists` (the peer's Tenant's and
/// Peering's `serviceImportNamespaces`, whichever exist) or annotated
/// ([`IMPORT_FROM_ANNOTATION`]). Tenant namespaces never, system namespaces only opted in.
/// Where this cluster exports a Service of the same name itself (`own_export`), the peer's
/// export joins it only in an opted-in namespace: never by the twin relation alone.
pub fn import_scope(
    peer: &str,
    exported_from: &str,
    here: Option<&ImportNamespace>,
    lists: &[Option<Vec<String>>],
    own_export: bool,
) -> Result<ImportScope, NotImported> {
    let Some(ns) = here else {
        return Err(NotImported::NoNamespace);
    };
    if ns.name.starts_with("tandem-tenant-") {
        return Err(NotImported::Reserved);
    }
    let listed = lists.iter().flatten().flatten().any(|n| n == ns.name);
    let annotated = ns
        .opted_in
        .is_some_and(|v| v.split(',').map(str::trim).any(|p| p == "*" || p == peer));
    if listed || annotated {
        return Ok(ImportScope::OptedIn);
    }
    match ns.twin_of {
        Some((owner, origin)) if owner == peer && origin == exported_from => {
            if own_export {
                Err(NotImported::OwnExport)
            } else {
                Ok(ImportScope::Twin)
            }
        }
        _ if SYSTEM_NAMESPACES.contains(&ns.name) => Err(NotImported::Reserved),
        twin => Err(NotImported::NotShared {
            twin_of: twin.map(|(owner, _)| owner.to_string()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: Option<&str>, protocol: &str, port: i32) -> ExportedPort {
        ExportedPort {
            name: name.map(str::to_string),
            protocol: protocol.into(),
            app_protocol: None,
            port,
        }
    }

    fn export(cluster: &str, created: i64, ports: Vec<ExportedPort>) -> ExportProperties {
        ExportProperties {
            cluster: cluster.into(),
            created,
            import_type: ImportType::ClusterSetIP,
            ports,
            session_affinity: "None".into(),
            session_affinity_timeout: None,
        }
    }

    #[test]
    fn ports_are_the_union_and_a_clash_goes_to_the_oldest() {
        let m = merge(&[
            export(
                "turin",
                20,
                vec![
                    port(Some("http"), "TCP", 8080),
                    port(Some("grpc"), "TCP", 9090),
                ],
            ),
            export("milan", 10, vec![port(Some("http"), "TCP", 80)]),
        ])
        .unwrap();
        assert_eq!(
            m.ports,
            vec![
                port(Some("grpc"), "TCP", 9090),
                port(Some("http"), "TCP", 80)
            ]
        );
        assert_eq!(m.clusters, vec!["milan", "turin"]);
        assert!(
            !m.conflicts.contains_key("milan"),
            "the oldest never conflicts"
        );
        let turin = &m.conflicts["turin"];
        assert_eq!(turin.len(), 1);
        assert_eq!(turin[0].reason(), "PortConflict");
        let msg = turin[0].message();
        assert!(
            msg.contains("\"http\"") && msg.contains("8080") && msg.contains("milan"),
            "{msg}"
        );
        let (reason, message) = m.conflict_summary().unwrap();
        assert_eq!(reason, "PortConflict");
        assert!(
            message.starts_with("cluster turin: port \"http\""),
            "{message}"
        );
    }

    #[test]
    fn unnamed_ports_count_as_one_name() {
        let m = merge(&[
            export("a", 1, vec![port(None, "TCP", 80)]),
            export("b", 2, vec![port(None, "TCP", 443)]),
        ])
        .unwrap();
        assert_eq!(m.ports, vec![port(None, "TCP", 80)]);
        assert_eq!(m.conflicts["b"][0].reason(), "PortConflict");
    }

    #[test]
    fn an_unnamed_port_never_joins_another_exports_ports() {
        let m = merge(&[
            export("a", 1, vec![port(Some("http"), "TCP", 80)]),
            export("b", 2, vec![port(None, "TCP", 443)]),
        ])
        .unwrap();
        assert_eq!(m.ports, vec![port(Some("http"), "TCP", 80)]);
        assert_eq!(m.conflicts["b"][0].reason(), "PortConflict");
        let m = merge(&[
            export("a", 1, vec![port(None, "TCP", 80)]),
            export("b", 2, vec![port(Some("grpc"), "TCP", 9090)]),
        ])
        .unwrap();
        assert_eq!(m.ports, vec![port(None, "TCP", 80)]);
        assert!(m.conflict_summary().unwrap().1.contains("grpc"));
    }

    #[test]
    fn same_number_under_another_name_clashes_too() {
        let m = merge(&[
            export("a", 1, vec![port(Some("web"), "TCP", 80)]),
            export("b", 2, vec![port(Some("http"), "TCP", 80)]),
        ])
        .unwrap();
        assert_eq!(m.ports, vec![port(Some("web"), "TCP", 80)]);
        assert_eq!(m.conflicts["b"][0].reason(), "PortConflict");
    }

    #[test]
    fn identical_exports_merge_without_conflict() {
        let p = vec![port(Some("http"), "TCP", 80)];
        let m = merge(&[export("b", 5, p.clone()), export("a", 5, p.clone())]).unwrap();
        assert_eq!(m.ports, p);
        assert!(m.conflicts.is_empty());
        assert!(m.conflict_summary().is_none());
        assert_eq!(m.clusters, vec!["a", "b"]);
    }

    #[test]
    fn type_and_affinity_follow_the_oldest_and_the_others_conflict() {
        let mut old = export("a", 1, vec![]);
        old.import_type = ImportType::Headless;
        let mut young = export("b", 2, vec![]);
        young.session_affinity = "ClientIP".into();
        young.session_affinity_timeout = Some(60);
        let m = merge(&[young, old]).unwrap();
        assert_eq!(m.import_type, ImportType::Headless);
        assert_eq!(m.session_affinity, "None");
        let reasons: Vec<_> = m.conflicts["b"].iter().map(Conflict::reason).collect();
        assert_eq!(reasons, vec!["TypeConflict", "SessionAffinityConflict"]);
    }

    #[test]
    fn ties_on_age_are_broken_by_cluster_id() {
        let m = merge(&[
            export("b", 1, vec![port(None, "TCP", 80)]),
            export(
                "a",
                1,
                vec![port(Some("y"), "UDP", 80), port(Some("x"), "TCP", 80)],
            ),
        ])
        .unwrap();
        // Same age: "a" is the older by ID, so its TCP 80 ("x") wins over b's unnamed TCP 80.
        assert_eq!(m.conflicts["b"][0].reason(), "PortConflict");
        assert!(!m.conflicts.contains_key("a"));
        assert_eq!(m.ports.len(), 2);
        assert!(merge(&[]).is_none());
    }

    #[test]
    fn addresses_move_into_the_importers_view_and_nothing_else_passes() {
        let remote: IpNet = "10.244.0.0/16".parse().unwrap();
        let here: IpNet = "10.71.0.0/16".parse().unwrap();
        assert_eq!(
            import_address("10.244.1.7", remote, here).as_deref(),
            Some("10.71.1.7")
        );
        assert_eq!(import_address("10.96.0.10", remote, here), None);
        assert_eq!(import_address("not-an-ip", remote, here), None);
    }

    fn ns<'a>(name: &'a str) -> ImportNamespace<'a> {
        ImportNamespace {
            name,
            ..Default::default()
        }
    }

    #[test]
    fn a_peers_export_is_imported_only_where_the_relation_applies() {
        // A plain namespace of this cluster's: never by default, nor a missing one.
        assert_eq!(
            import_scope("basel", "payments", Some(&ns("payments")), &[None], false),
            Err(NotImported::NotShared { twin_of: None })
        );
        assert_eq!(
            import_scope("basel", "payments", None, &[None], false),
            Err(NotImported::NoNamespace)
        );
        // The peer's own twin of the namespace it exports from.
        let mut twin = ns("shop");
        twin.twin_of = Some(("basel", "shop"));
        assert_eq!(
            import_scope("basel", "shop", Some(&twin), &[None], false),
            Ok(ImportScope::Twin)
        );
        // Another consumer's twin, or the peer's twin of another of its namespaces: not its.
        assert_eq!(
            import_scope("geneva", "shop", Some(&twin), &[None], false),
            Err(NotImported::NotShared {
                twin_of: Some("basel".into())
            })
        );
        twin.twin_of = Some(("basel", "web"));
        assert!(import_scope("basel", "shop", Some(&twin), &[None], false).is_err());
        // System and tenant namespaces.
        for name in ["kube-system", "tandem-system", "tandem-tenant-rome"] {
            assert_eq!(
                import_scope("basel", name, Some(&ns(name)), &[None], false),
                Err(NotImported::Reserved),
                "{name}"
            );
        }
    }

    #[test]
    fn the_administrator_opts_namespaces_in_by_list_or_annotation() {
        let list = Some(vec!["demo".to_string(), "kube-system".to_string()]);
        for name in ["demo", "kube-system"] {
            assert_eq!(
                import_scope("basel", name, Some(&ns(name)), &[None, list.clone()], false),
                Ok(ImportScope::OptedIn)
            );
        }
        // An empty list opts nothing in; a listed tenant namespace stays closed.
        assert!(import_scope("basel", "demo", Some(&ns("demo")), &[Some(vec![])], false).is_err());
        let tenant = Some(vec!["tandem-tenant-rome".to_string()]);
        assert_eq!(
            import_scope(
                "basel",
                "tandem-tenant-rome",
                Some(&ns("tandem-tenant-rome")),
                &[tenant],
                false
            ),
            Err(NotImported::Reserved)
        );
        // The annotation names peers, or every peer.
        for (value, basel) in [
            ("basel", true),
            ("geneva, basel", true),
            ("*", true),
            ("geneva", false),
            ("basel-2", false),
            ("", false),
        ] {
            let mut demo = ns("demo");
            demo.opted_in = Some(value);
            assert_eq!(
                import_scope("basel", "demo", Some(&demo), &[None], true).is_ok(),
                basel,
                "{value:?}"
            );
        }
    }

    #[test]
    fn a_peers_export_joins_this_clusters_own_only_where_opted_in() {
        let mut twin = ns("shop");
        twin.twin_of = Some(("basel", "shop"));
        let refused = import_scope("basel", "shop", Some(&twin), &[None], true).unwrap_err();
        assert_eq!(refused, NotImported::OwnExport);
        assert!(refused.is_warning());
        let msg = refused.message("basel", "shop", "api");
        assert!(
            msg.contains("shop/api")
                && msg.contains("basel")
                && msg.contains(IMPORT_FROM_ANNOTATION),
            "{msg}"
        );
        twin.opted_in = Some("basel");
        assert_eq!(
            import_scope("basel", "shop", Some(&twin), &[None], true),
            Ok(ImportScope::OptedIn)
        );
        let mut plain = ns("payments");
        assert!(import_scope("basel", "payments", Some(&plain), &[None], true).is_err());
        plain.opted_in = Some("*");
        assert!(import_scope("basel", "payments", Some(&plain), &[None], true).is_ok());
    }
}

//! Which peers' exports become sources of imports here, and why the others do not: a peer's
//! records read as it wrote them, each kept only where this cluster's namespace rules let it
//! in, valid, within the peer's limits, with its addresses moved into this cluster's view of
//! its pod CIDR.

use std::sync::Arc;

use tandem_api::mcs::{
    ExportedService, ExportedSlice, SOURCE_CLUSTER_LABEL, exported_service_name,
};
use tandem_api::names;
use tandem_core::mcs::{
    ExportProperties, IMPORT_FROM_ANNOTATION, ImportNamespace, ImportScope, NotImported,
};

use super::observed::{Observed, Peer};
use super::records::{Key, Records, imported_slice, label, properties};
use super::sanitize::{self, Unimportable};

/// At most this many of one peer's exports are imported (by name): a peer cannot make this
/// cluster hold an unbounded number of objects.
pub(super) const MAX_RECORDS_PER_PEER: usize = 1000;
/// At most this many of one peer's endpoints, over all its exports.
pub(super) const MAX_ENDPOINTS_PER_PEER: usize = 10_000;

/// One cluster that exports a Service, as this cluster sees its export.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Source {
    pub(super) cluster: String,
    pub(super) props: ExportProperties,
    /// Its endpoints, as this cluster addresses them.
    pub(super) slices: Vec<ExportedSlice>,
    /// Whether its endpoints may be ready (its virtual node / tunnel is up).
    pub(super) healthy: bool,
}

/// Why a peer's export, or part of what it exports, is not imported here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// A record in the peer's place that is not its own export: another cluster's ID, or not
    /// named `<cluster>.<namespace>.<service>`.
    NotItsOwn { record: String },
    /// This cluster's namespace rules ([`tandem_core::mcs::import_scope`]).
    Scope {
        namespace: String,
        service: String,
        why: NotImported,
    },
    /// No import could be written from the record.
    Unimportable {
        namespace: String,
        service: String,
        why: Unimportable,
    },
    /// More than [`MAX_RECORDS_PER_PEER`] records: only the first, by name, are imported.
    TooManyRecords { exported: usize },
    /// More than [`MAX_ENDPOINTS_PER_PEER`] endpoints in all: only the first are imported.
    TooManyEndpoints,
}

/// A peer's export (or part of its exports) this cluster does not import, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Refusal {
    pub(super) peer: String,
    pub(super) why: Refused,
}

/// A refusal as an Event (written once while it lasts) in the peer's tenant namespace, about
/// the peer's record of the export.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct RefusalEvent {
    pub(super) peer: String,
    /// The name of the peer's record (an ExportedService in the tenant namespaces).
    pub(super) record: String,
    pub(super) reason: &'static str,
    pub(super) warning: bool,
    pub(super) message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peer = &self.peer;
        match &self.why {
            Refused::NotItsOwn { record } => write!(
                f,
                "ExportedService {record} of cluster {peer} is not imported: a peer's record \
                 must carry its own cluster ID ({peer}) and be named \
                 <cluster>.<namespace>.<service>"
            ),
            Refused::Scope {
                namespace,
                service,
                why,
            } => f.write_str(&why.message(peer, namespace, service)),
            Refused::Unimportable {
                namespace,
                service,
                why,
            } => write!(f, "not importing {namespace}/{service} from {peer}: {why}"),
            Refused::TooManyRecords { exported } => write!(
                f,
                "cluster {peer} exports {exported} Services; importing the first \
                 {MAX_RECORDS_PER_PEER} by name"
            ),
            Refused::TooManyEndpoints => write!(
                f,
                "cluster {peer} exports more than {MAX_ENDPOINTS_PER_PEER} endpoints; importing \
                 the first"
            ),
        }
    }
}

impl Refusal {
    /// The Event reporting it, for a refusal of one export by this cluster's rules (a missing
    /// namespace is no news: peers export in namespaces this cluster never has).
    pub(super) fn event(&self) -> Option<RefusalEvent> {
        let (record, reason, warning) = match &self.why {
            Refused::NotItsOwn { record } => (record.clone(), "NotThePeersOwnExport", true),
            Refused::Scope { why, .. } if *why == NotImported::NoNamespace => return None,
            Refused::Scope {
                namespace,
                service,
                why,
            } => (
                exported_service_name(&self.peer, namespace, service),
                why.reason(),
                why.is_warning(),
            ),
            Refused::Unimportable { .. }
            | Refused::TooManyRecords { .. }
            | Refused::TooManyEndpoints => return None,
        };
        Some(RefusalEvent {
            peer: self.peer.clone(),
            record,
            reason,
            warning,
            message: self.to_string(),
        })
    }

    /// How loudly it is logged, when it is not an Event: a peer over its limits is worth a
    /// warning, a record no Service could be made from only a debug line.
    pub(super) fn log_level(&self) -> Option<tracing::Level> {
        match &self.why {
            Refused::TooManyRecords { .. } | Refused::TooManyEndpoints => {
                Some(tracing::Level::WARN)
            }
            Refused::Unimportable { .. } => Some(tracing::Level::DEBUG),
            Refused::NotItsOwn { .. } | Refused::Scope { .. } => None,
        }
    }
}

/// The age (Unix seconds) this cluster gives `peer`'s export of a Service, which decides
/// the import's conflicts, from the one it `claimed` and the ages the import recorded:
///
/// - never in the future: a claim from the future counts as now, and once recorded stays
///   (re-dating it on every pass would rewrite the import each time);
/// - once recorded, never earlier: a peer cannot back-date its export later to win.
///
/// A later claim (re-exported) is taken as it is. A first claim is trusted as KEP-1645 trusts
/// creation times: were a newcomer's age floored at the import's oldest, two clusters that
/// peer after both exported would each see its own export win, and disagree.
pub(super) fn export_age(
    claimed: i64,
    now: i64,
    peer: &str,
    stored: Option<&[ExportProperties]>,
) -> i64 {
    let stored = stored.unwrap_or_default();
    match stored.iter().find(|p| p.cluster == peer) {
        Some(first) if claimed < first.created || claimed > now => first.created,
        Some(_) => claimed,
        None => claimed.min(now),
    }
}

/// What `peer` exports that this cluster imports, as of `now` (Unix seconds): what it exports
/// now when its records can be read, else what it last exported as this cluster's imports
/// recorded it. Refusals are added to `refused`.
pub(super) fn of_peer(
    observed: &Observed,
    peer: &Peer,
    own: &Records,
    now: i64,
    refused: &mut Vec<Refusal>,
) -> Vec<(Key, Source)> {
    match exported(observed, peer, own, now, refused) {
        Some(fresh) => fresh,
        None => carried(observed, peer, own),
    }
}

/// The peer's exports this cluster imports: from records it wrote in our tenant namespace
/// for it and in its tenant namespace for us, in namespaces we allow and have, with its
/// addresses moved into our view of its pod CIDR. None while its records cannot be read.
fn exported(
    observed: &Observed,
    peer: &Peer,
    own: &Records,
    now: i64,
    refused: &mut Vec<Refusal>,
) -> Option<Vec<(Key, Source)>> {
    if !peer.readable {
        return None;
    }
    let Some((real, here)) = peer.pod_cidr else {
        // No network with it: nothing of its can be reached from here.
        return Some(Vec::new());
    };
    // The peer's own copy (read through the link) first: the one it wrote into our
    // tenant namespace may be stale while its link to us is down.
    let mut records: Vec<Arc<ExportedService>> = peer.remote.clone().unwrap_or_default();
    if let Some(ns) = &peer.tenant_namespace {
        records.extend(observed.records_in(ns).cloned());
    }
    // Only what the peer says of itself, under the name it must have (our own records
    // beside them are no news).
    records.retain(|r| {
        let name = r.metadata.name.clone().unwrap_or_default();
        let its_own = r.spec.cluster_id == peer.id
            && name == exported_service_name(&peer.id, &r.spec.namespace, &r.spec.service);
        if !its_own && r.spec.cluster_id != observed.me {
            refused.push(Refusal {
                peer: peer.id.clone(),
                why: Refused::NotItsOwn { record: name },
            });
        }
        its_own
    });
    records.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    records.dedup_by(|a, b| a.metadata.name == b.metadata.name);
    if records.len() > MAX_RECORDS_PER_PEER {
        refused.push(Refusal {
            peer: peer.id.clone(),
            why: Refused::TooManyRecords {
                exported: records.len(),
            },
        });
        records.truncate(MAX_RECORDS_PER_PEER);
    }
    let mut out = Vec::new();
    let (mut endpoints, mut over_budget) = (0usize, false);
    for r in records {
        let key = (r.spec.namespace.clone(), r.spec.service.clone());
        if let Err(why) = may_import(observed, peer, &key, own) {
            refused.push(Refusal {
                peer: peer.id.clone(),
                why: Refused::Scope {
                    namespace: key.0,
                    service: key.1,
                    why,
                },
            });
            continue;
        }
        let mut spec = match sanitize::sanitize(&r.spec) {
            Ok(spec) => spec,
            Err(why) => {
                refused.push(Refusal {
                    peer: peer.id.clone(),
                    why: Refused::Unimportable {
                        namespace: key.0,
                        service: key.1,
                        why,
                    },
                });
                continue;
            }
        };
        for slice in &mut spec.endpoint_slices {
            for ep in &mut slice.endpoints {
                ep.addresses = ep
                    .addresses
                    .iter()
                    .filter_map(|a| tandem_core::mcs::import_address(a, real, here))
                    .collect();
            }
            slice.endpoints.retain(|e| !e.addresses.is_empty());
        }
        let mut props = properties(&spec);
        props.created = export_age(
            props.created,
            now,
            &peer.id,
            observed.stored_sources(&key).as_deref(),
        );
        // Bounded in total, not only per record: a peer cannot make this cluster hold
        // more than MAX_ENDPOINTS_PER_PEER endpoints of its.
        let mut slices = spec.endpoint_slices;
        for slice in &mut slices {
            let room = MAX_ENDPOINTS_PER_PEER.saturating_sub(endpoints);
            if slice.endpoints.len() > room {
                over_budget = true;
                slice.endpoints.truncate(room);
            }
            endpoints += slice.endpoints.len();
        }
        slices.retain(|s| !s.endpoints.is_empty());
        out.push((
            key,
            Source {
                cluster: peer.id.clone(),
                props,
                slices,
                healthy: peer.healthy,
            },
        ));
    }
    if over_budget {
        refused.push(Refusal {
            peer: peer.id.clone(),
            why: Refused::TooManyEndpoints,
        });
    }
    Some(out)
}

/// Whether `peer`'s export of `namespace/service` may become (part of) an import here,
/// as [`tandem_core::mcs::import_scope`] decides from the namespace as it is now, the
/// peer's lists and whether this cluster exports that Service itself.
pub(super) fn may_import(
    observed: &Observed,
    peer: &Peer,
    (namespace, service): &Key,
    own: &Records,
) -> Result<ImportScope, NotImported> {
    let ns = observed
        .namespaces
        .get(namespace)
        .filter(|ns| ns.metadata.deletion_timestamp.is_none());
    let here = ns.map(|ns| ImportNamespace {
        name: namespace,
        twin_of: label(ns.as_ref(), names::TWIN_NAMESPACE_LABEL).and_then(|_| {
            Some((
                label(ns.as_ref(), names::ORIGIN_CLUSTER_LABEL)?,
                label(ns.as_ref(), names::ORIGIN_NAMESPACE_LABEL)?,
            ))
        }),
        opted_in: ns
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(IMPORT_FROM_ANNOTATION))
            .map(String::as_str),
    });
    let own_export = own.contains_key(&(namespace.clone(), service.clone()));
    tandem_core::mcs::import_scope(
        &peer.id,
        namespace,
        here.as_ref(),
        &peer.allowed,
        own_export,
    )
}

/// What an unreadable peer last exported, as this cluster last imported it: its part of
/// each import (properties from the import, endpoints from its slices), so that a restart
/// or a link not yet up neither removes imports (and their IPs) nor changes their merge.
/// Its endpoints are ready only while its virtual node is.
fn carried(observed: &Observed, peer: &Peer, own: &Records) -> Vec<(Key, Source)> {
    let mut out = Vec::new();
    for key in observed.imports.keys() {
        let Some(props) = observed
            .stored_sources(key)
            .and_then(|s| s.into_iter().find(|p| p.cluster == peer.id))
        else {
            continue;
        };
        if may_import(observed, peer, key, own).is_err() {
            continue;
        }
        let mut slices: Vec<(u32, ExportedSlice)> = observed
            .import_slices(key)
            .filter(|s| label(s.as_ref(), SOURCE_CLUSTER_LABEL) == Some(peer.id.as_str()))
            .map(|s| {
                let index = s
                    .metadata
                    .name
                    .as_deref()
                    .and_then(|n| n.rsplit('-').next()?.parse().ok())
                    .unwrap_or(u32::MAX);
                (index, imported_slice(s))
            })
            .collect();
        slices.sort_by_key(|(i, _)| *i);
        out.push((
            key.clone(),
            Source {
                cluster: peer.id.clone(),
                props,
                slices: slices.into_iter().map(|(_, s)| s).collect(),
                healthy: peer.healthy,
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::fixtures::*;
    use super::*;

    fn hello() -> RecordFixture {
        RecordFixture::new("demo", "hello")
            .port("http", 80)
            .slice(&["10.244.1.5"])
    }

    /// A refusal's variant, as the table names it.
    fn kind(why: &Refused) -> &'static str {
        match why {
            Refused::NotItsOwn { .. } => "NotItsOwn",
            Refused::Scope { .. } => "Scope",
            Refused::Unimportable { why, .. } => match why {
                Unimportable::Type(_) => "Unimportable::Type",
                Unimportable::ServiceName(_) => "Unimportable::ServiceName",
                Unimportable::Namespace(_) => "Unimportable::Namespace",
                Unimportable::NoPort => "Unimportable::NoPort",
            },
            Refused::TooManyRecords { .. } => "TooManyRecords",
            Refused::TooManyEndpoints => "TooManyEndpoints",
        }
    }

    const EVERY_REFUSAL: [&str; 9] = [
        "NotItsOwn",
        "Scope",
        "Unimportable::Type",
        "Unimportable::ServiceName",
        "Unimportable::Namespace",
        "Unimportable::NoPort",
        "TooManyRecords",
        "TooManyEndpoints",
        "(none)",
    ];

    /// rome, with the namespaces a peer's exports may land in: demo opted in for every
    /// peer, kube-system, private (not opted in), thun's twin of its demo, lugano's twin of
    /// its shared.
    fn rome() -> ClusterFixture {
        ClusterFixture::new("rome")
            .namespace(NamespaceFixture::new("demo").import_from("*"))
            .namespace(NamespaceFixture::new("kube-system"))
            .namespace(NamespaceFixture::new("private"))
            .namespace(NamespaceFixture::new("thun-demo").twin_of("thun", "thun-demo"))
            .namespace(NamespaceFixture::new("shared").twin_of("lugano", "shared"))
            .namespace(NamespaceFixture::new("going").import_from("*").deleting())
            .namespace(NamespaceFixture::new("Bad_NS").import_from("*"))
    }

    /// rome's consumer lugano, exporting `record`.
    fn from_lugano(record: RecordFixture) -> ClusterFixture {
        rome().peer(PeerFixture::consumer("lugano").exports(record))
    }

    /// (case, the cluster, the refusal's kind ("(none)": imported), its Event (reason,
    /// warning), what the Event or log line says, imports made)
    type Case = (
        &'static str,
        ClusterFixture,
        &'static str,
        Option<(&'static str, bool)>,
        &'static str,
        usize,
    );

    #[test]
    fn refusals_table() {
        let many = |n: usize| {
            let mut c = rome().peer(PeerFixture::consumer("lugano"));
            for i in 0..n {
                let svc = format!("svc-{i:04}");
                c.peer_exports("lugano", RecordFixture::new("demo", &svc).port("http", 80));
            }
            c
        };
        let crowded = {
            let addresses: Vec<String> = (0..1000)
                .map(|i| format!("10.244.{}.{}", i / 250, i % 250))
                .collect();
            let addresses: Vec<&str> = addresses.iter().map(String::as_str).collect();
            let mut record = RecordFixture::new("demo", "hello").port("http", 80);
            for _ in 0..11 {
                record = record.slice(&addresses);
            }
            from_lugano(record)
        };
        let cases: Vec<Case> = vec![
            (
                "an export into a namespace opted in",
                from_lugano(hello()),
                "(none)",
                None,
                "",
                1,
            ),
            (
                "an export into the consumer's own twin namespace",
                from_lugano(hello_in("shared")),
                "(none)",
                None,
                "",
                1,
            ),
            (
                "a record under another name than its own",
                from_lugano(hello().named("rome.demo.hello")),
                "NotItsOwn",
                Some(("NotThePeersOwnExport", true)),
                "ExportedService rome.demo.hello of cluster lugano is not imported",
                0,
            ),
            (
                "a record claiming another cluster's export",
                from_lugano(hello().claiming("thun")),
                "NotItsOwn",
                Some(("NotThePeersOwnExport", true)),
                "must carry its own cluster ID (lugano)",
                0,
            ),
            (
                "no such namespace here: no news",
                from_lugano(hello_in("elsewhere")),
                "Scope",
                None,
                "there is no namespace elsewhere here",
                0,
            ),
            (
                "a namespace being deleted counts as none",
                from_lugano(hello_in("going")),
                "Scope",
                None,
                "there is no namespace going here",
                0,
            ),
            (
                "a system namespace",
                from_lugano(hello_in("kube-system")),
                "Scope",
                Some(("ReservedNamespace", true)),
                "kube-system is a system or tenant namespace",
                0,
            ),
            (
                "a namespace not shared with the peer",
                from_lugano(hello_in("private")),
                "Scope",
                Some(("NamespaceNotShared", false)),
                "namespace private is not shared with lugano",
                0,
            ),
            (
                "another consumer's twin namespace",
                from_lugano(hello_in("thun-demo")),
                "Scope",
                Some(("NamespaceNotShared", false)),
                "twin namespace of cluster thun",
                0,
            ),
            (
                "its twin namespace, where this cluster exports the same Service",
                from_lugano(hello_in("shared")).export(
                    ServiceFixture::new("shared", "hello")
                        .port("http", 80)
                        .endpoint("10.244.0.9"),
                ),
                "Scope",
                Some(("OwnServiceNotMerged", true)),
                "is not merged with this cluster's own export of shared/hello",
                // this cluster's own, alone
                1,
            ),
            (
                "a type no Service has",
                from_lugano(hello().type_("LoadBalancer")),
                "Unimportable::Type",
                None,
                "not importing demo/hello from lugano: type \"LoadBalancer\"",
                0,
            ),
            (
                "a name no Service has",
                from_lugano(RecordFixture::new("demo", "Hello").port("http", 80)),
                "Unimportable::ServiceName",
                None,
                "\"Hello\" is not a Service name",
                0,
            ),
            (
                "a namespace name no namespace has",
                from_lugano(RecordFixture::new("Bad_NS", "hello").port("http", 80)),
                "Unimportable::Namespace",
                None,
                "\"Bad_NS\" is not a namespace name",
                0,
            ),
            (
                "a ClusterSetIP export without a valid port",
                from_lugano(RecordFixture::new("demo", "hello").port("http", 0)),
                "Unimportable::NoPort",
                None,
                "a ClusterSetIP export without a valid port",
                0,
            ),
            (
                "more records than a peer may have: the first by name",
                many(MAX_RECORDS_PER_PEER + 1),
                "TooManyRecords",
                None,
                "cluster lugano exports 1001 Services; importing the first 1000 by name",
                MAX_RECORDS_PER_PEER,
            ),
            (
                "more endpoints than a peer may have: the first",
                crowded,
                "TooManyEndpoints",
                None,
                "cluster lugano exports more than 10000 endpoints; importing the first",
                1,
            ),
        ];
        let mut seen = BTreeSet::new();
        for (name, c, want_kind, want_event, says, imports) in cases {
            let plan = c.plan();
            let refused: Vec<&Refusal> = plan.refused.iter().collect();
            let got_kind = match refused.as_slice() {
                [] => "(none)",
                [one] => kind(&one.why),
                more => panic!("{name}: {more:?}"),
            };
            assert_eq!(got_kind, want_kind, "{name}");
            seen.insert(got_kind);
            if let [refusal] = refused.as_slice() {
                assert_eq!(refusal.peer, "lugano", "{name}");
                let event = refusal.event();
                let got = event.as_ref().map(|e| (e.reason, e.warning));
                assert_eq!(got, want_event, "{name}");
                let text = event.map_or_else(|| refusal.to_string(), |e| e.message);
                assert!(text.contains(says), "{name}: {text}");
                // Told one way at most: an Event or a log line.
                assert!(
                    refusal.event().is_none() || refusal.log_level().is_none(),
                    "{name}"
                );
            }
            let made = plan
                .steps
                .iter()
                .filter(|s| matches!(s, super::super::plan::Step::CreateImport(_)))
                .count();
            assert_eq!(made, imports, "{name}");
        }
        assert_eq!(
            seen,
            BTreeSet::from(EVERY_REFUSAL),
            "every refusal in the table"
        );
    }

    fn hello_in(ns: &str) -> RecordFixture {
        RecordFixture::new(ns, "hello")
            .port("http", 80)
            .slice(&["10.244.1.5"])
    }

    #[test]
    fn a_peer_cannot_aim_an_import_outside_its_pods() {
        // Addresses outside the peer's pod CIDR (this cluster's own, a third cluster's) are
        // dropped; its own are moved into this cluster's view of its pods.
        let mut c = from_lugano(
            RecordFixture::new("demo", "hello")
                .port("http", 80)
                .slice(&["10.244.1.5", "10.96.0.1", "192.168.1.1"]),
        );
        c.pass();
        assert_eq!(
            c.endpoints("demo", "hello"),
            [("lugano".to_string(), "10.201.1.5".to_string(), true)]
        );
    }

    #[test]
    fn a_peer_without_network_or_unread_adds_nothing_new() {
        let cases = [
            (
                "no network with it yet",
                PeerFixture::consumer("lugano").without_network(),
            ),
            (
                "not read yet, never imported",
                PeerFixture::consumer("lugano").unreadable(),
            ),
        ];
        for (name, peer) in cases {
            let c = rome().peer(peer.exports(hello()));
            let plan = c.plan();
            assert!(plan.steps.is_empty() && plan.refused.is_empty(), "{name}");
        }
    }

    #[test]
    fn endpoints_not_ready_at_the_exporter_are_not_ready_here() {
        let mut c = from_lugano(hello().not_ready());
        c.pass();
        assert_eq!(
            c.endpoints("demo", "hello"),
            [("lugano".to_string(), "10.201.1.5".to_string(), false)]
        );
    }
}

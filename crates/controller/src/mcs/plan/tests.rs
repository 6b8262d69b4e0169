//! The plan's decisions as a user sees them: which exports become imports, with which ports,
//! endpoints and conditions; how the exports of one Service by several clusters merge and
//! conflict; what goes when an export does; and which writes a pass makes to get there.

use std::collections::BTreeSet;

use tandem_api::mcs::export_condition::{CONFLICT, READY, VALID};
use tandem_api::names;
use tandem_core::mcs::ExportProperties;

use super::super::fixtures::*;
use super::super::records::SOURCES_ANNOTATION;
use super::*;

/// A step's variant, as the tables name it.
fn kind(step: &Step) -> &'static str {
    match step {
        Step::CreateRecord { .. } => "CreateRecord",
        Step::ReplaceRecord { .. } => "ReplaceRecord",
        Step::DeleteRecord { .. } => "DeleteRecord",
        Step::CreateImport(_) => "CreateImport",
        Step::ReplaceImport(_) => "ReplaceImport",
        Step::ApplyService { .. } => "ApplyService",
        Step::CreateSlice { .. } => "CreateSlice",
        Step::ReplaceSlice { .. } => "ReplaceSlice",
        Step::DeleteSlice { .. } => "DeleteSlice",
        Step::SetImportStatus { .. } => "SetImportStatus",
        Step::RemoveImport { .. } => "RemoveImport",
        Step::SetExportStatus { .. } => "SetExportStatus",
    }
}

const EVERY_STEP: [&str; 12] = [
    "CreateRecord",
    "ReplaceRecord",
    "DeleteRecord",
    "CreateImport",
    "ReplaceImport",
    "ApplyService",
    "CreateSlice",
    "ReplaceSlice",
    "DeleteSlice",
    "SetImportStatus",
    "RemoveImport",
    "SetExportStatus",
];

fn kinds(plan: &Plan) -> Vec<&'static str> {
    plan.steps.iter().map(kind).collect()
}

fn s(text: &str) -> String {
    text.to_string()
}

/// rome, whose admin opted `demo` in for every peer's exports, and its provider milan, which
/// exports demo/hello (http 80) from one pod.
fn rome_importing_from_milan() -> ClusterFixture {
    ClusterFixture::new("rome")
        .namespace(NamespaceFixture::new("demo").import_from("*"))
        .peer(PeerFixture::provider("milan").exports(hello()))
}

fn hello() -> RecordFixture {
    RecordFixture::new("demo", "hello")
        .port("http", 80)
        .slice(&["10.244.1.5"])
}

/// rome exporting demo/web, with a consumer (lugano) and a provider (milan).
fn rome_exporting() -> ClusterFixture {
    ClusterFixture::new("rome")
        .peer(PeerFixture::consumer("lugano"))
        .peer(PeerFixture::provider("milan"))
        .export(
            ServiceFixture::new("demo", "web")
                .port("http", 80)
                .endpoint("10.244.0.9"),
        )
}

/// (case, the cluster, what changes after a first pass (none: no first pass), the steps of
/// the next pass, what a user sees after it).
type StepCase = (
    &'static str,
    fn() -> ClusterFixture,
    Option<fn(&mut ClusterFixture)>,
    &'static [&'static str],
    fn(&ClusterFixture),
);

#[test]
fn steps_table() {
    let cases: Vec<StepCase> = vec![
        (
            "a provider's export becomes an import backed by a Service and its endpoints",
            rome_importing_from_milan,
            None,
            &[
                "CreateImport",
                "ApplyService",
                "CreateSlice",
                "SetImportStatus",
            ],
            |c| {
                assert_eq!(c.ports("demo", "hello"), [(s("http"), 80)]);
                assert_eq!(
                    c.endpoints("demo", "hello"),
                    [(s("milan"), s("10.201.1.5"), true)]
                );
                let ip = c.derived("demo", "hello").unwrap().spec.clone().unwrap();
                assert_eq!(
                    c.import("demo", "hello").unwrap().spec.ips,
                    [ip.cluster_ip.unwrap()]
                );
                assert!(ip.selector.is_none());
                assert_eq!(
                    c.import_condition("demo", "hello", READY).unwrap().2,
                    "imported from milan"
                );
            },
        ),
        (
            "a pass after a pass writes nothing",
            rome_importing_from_milan,
            Some(|_| {}),
            &[],
            |c| assert_eq!(c.ports("demo", "hello"), [(s("http"), 80)]),
        ),
        (
            "a port more rewrites the import, its Service and its endpoints' ports",
            rome_importing_from_milan,
            Some(|c| {
                let more = RecordFixture::new("demo", "hello")
                    .port("http", 80)
                    .port("metrics", 9090)
                    .slice(&["10.244.1.5"]);
                c.peer_exports("milan", more);
            }),
            &["ReplaceImport", "ApplyService", "ReplaceSlice"],
            |c| {
                assert_eq!(
                    c.ports("demo", "hello"),
                    [(s("http"), 80), (s("metrics"), 9090)]
                );
                let service = c.derived("demo", "hello").unwrap().spec.clone().unwrap();
                assert_eq!(service.ports.unwrap().len(), 2);
            },
        ),
        (
            "a pod more rewrites its slice",
            rome_importing_from_milan,
            Some(|c| {
                let more = RecordFixture::new("demo", "hello")
                    .port("http", 80)
                    .slice(&["10.244.1.5", "10.244.1.6"]);
                c.peer_exports("milan", more);
            }),
            &["ReplaceSlice"],
            |c| {
                assert_eq!(
                    c.endpoints("demo", "hello"),
                    [
                        (s("milan"), s("10.201.1.5"), true),
                        (s("milan"), s("10.201.1.6"), true)
                    ]
                );
            },
        ),
        (
            "a slice fewer at the exporter is a slice fewer here",
            || {
                ClusterFixture::new("rome")
                    .namespace(NamespaceFixture::new("demo").import_from("*"))
                    .peer(PeerFixture::provider("milan").exports(hello().slice(&["10.244.2.7"])))
            },
            Some(|c| c.peer_exports("milan", hello())),
            &["DeleteSlice"],
            |c| {
                assert_eq!(c.slice_count("demo", "hello"), 1);
                assert_eq!(
                    c.endpoints("demo", "hello"),
                    [(s("milan"), s("10.201.1.5"), true)]
                );
            },
        ),
        (
            "an export turned headless remakes the Service without a ClusterIP",
            rome_importing_from_milan,
            Some(|c| c.peer_exports("milan", hello().headless())),
            &["ReplaceImport", "ApplyService"],
            |c| {
                let import = c.import("demo", "hello").unwrap();
                assert_eq!(import.spec.type_, "Headless");
                assert!(import.spec.ips.is_empty());
                let service = c.derived("demo", "hello").unwrap().spec.clone().unwrap();
                assert_eq!(service.cluster_ip.as_deref(), Some("None"));
            },
        ),
        (
            "a provider down: its endpoints stay, not ready",
            rome_importing_from_milan,
            Some(|c| c.peer_mut("milan").healthy = false),
            &["ReplaceSlice"],
            |c| {
                assert_eq!(
                    c.endpoints("demo", "hello"),
                    [(s("milan"), s("10.201.1.5"), false)]
                );
            },
        ),
        (
            "unexported: the import and all that derives from it go",
            rome_importing_from_milan,
            Some(|c| c.peer_unexports("milan", "demo", "hello")),
            &["RemoveImport"],
            |c| {
                assert!(c.import("demo", "hello").is_none());
                assert!(c.derived("demo", "hello").is_none());
                assert_eq!(c.slice_count("demo", "hello"), 0);
            },
        ),
        (
            "an export here is published to each peer, imported here too, and says so",
            rome_exporting,
            None,
            &[
                "CreateRecord",
                "CreateRecord",
                "CreateImport",
                "ApplyService",
                "CreateSlice",
                "SetImportStatus",
                "SetExportStatus",
            ],
            |c| {
                let published = [(s("demo"), s("web"))];
                let lugano = Place::Tenant(names::tenant_namespace("lugano"));
                assert_eq!(c.published(&lugano), published);
                assert_eq!(c.published(&Place::Provider(s("milan"))), published);
                assert_eq!(
                    c.endpoints("demo", "web"),
                    [(s("rome"), s("10.244.0.9"), true)]
                );
                let ready = c.export_condition("demo", "web", READY).unwrap();
                assert_eq!((ready.0.as_str(), ready.1.as_str()), ("True", "Exported"));
                let valid = c.export_condition("demo", "web", VALID).unwrap();
                assert_eq!(valid.0, "True");
            },
        ),
        (
            "the pods of an export here move: its records and its own import follow",
            rome_exporting,
            Some(|c| c.serve("demo", "web", &["10.244.0.10"])),
            &["ReplaceRecord", "ReplaceRecord", "ReplaceSlice"],
            |c| {
                assert_eq!(
                    c.endpoints("demo", "web"),
                    [(s("rome"), s("10.244.0.10"), true)]
                );
            },
        ),
        (
            "unexported here: the records are taken back from every peer",
            rome_exporting,
            Some(|c| c.unexport("demo", "web")),
            &["DeleteRecord", "DeleteRecord", "RemoveImport"],
            |c| {
                let lugano = Place::Tenant(names::tenant_namespace("lugano"));
                assert!(c.published(&lugano).is_empty());
                assert!(c.published(&Place::Provider(s("milan"))).is_empty());
                assert!(c.import("demo", "web").is_none());
            },
        ),
    ];
    let mut seen = BTreeSet::new();
    for (name, cluster, change, want, then) in cases {
        let mut c = cluster();
        if let Some(change) = change {
            c.pass();
            change(&mut c);
        }
        let plan = c.pass();
        assert_eq!(kinds(&plan), want, "{name}");
        then(&c);
        assert!(kinds(&c.plan()).is_empty(), "{name}: converged in one pass");
        seen.extend(kinds(&plan));
    }
    assert_eq!(seen, BTreeSet::from(EVERY_STEP), "every step in the table");
}

/// milan and turin, providers of rome that do not peer with each other, export demo/hello;
/// milan first.
fn two_providers(milan: RecordFixture, turin: RecordFixture) -> ClusterFixture {
    ClusterFixture::new("rome")
        .namespace(NamespaceFixture::new("demo").import_from("*"))
        .peer(PeerFixture::provider("milan").exports(milan.created(NOW - 200)))
        .peer(
            PeerFixture::provider("turin")
                .remapped("10.202.0.0/16")
                .exports(turin.created(NOW - 100)),
        )
}

#[test]
fn merge_and_conflict_table() {
    // (case, the cluster, the import's ports, its Conflict condition (status, reason), what
    // its message names)
    type Case = (
        &'static str,
        ClusterFixture,
        Vec<(String, i32)>,
        (&'static str, &'static str),
        &'static [&'static str],
    );
    let record = || RecordFixture::new("demo", "hello");
    let cases: Vec<Case> = vec![
        (
            "two providers agree: one import, both clusters' endpoints",
            two_providers(hello(), hello()),
            vec![(s("http"), 80)],
            ("False", "NoConflicts"),
            &["the exports of demo/hello agree"],
        ),
        (
            "ports of different names make the union",
            two_providers(hello(), record().port("grpc", 9090).slice(&["10.244.1.5"])),
            vec![(s("grpc"), 9090), (s("http"), 80)],
            ("False", "NoConflicts"),
            &[],
        ),
        (
            "a port clash: the older export's port is used, the younger conflicts",
            two_providers(hello(), record().port("http", 81).slice(&["10.244.1.5"])),
            vec![(s("http"), 80)],
            ("True", "PortConflict"),
            &[
                "cluster turin: port \"http\" (TCP 81)",
                "port \"http\" (TCP 80) of the older export of cluster milan",
            ],
        ),
        (
            "a type clash: the older export's type is used",
            two_providers(hello(), hello().headless()),
            vec![(s("http"), 80)],
            ("True", "TypeConflict"),
            &[
                "cluster turin: type Headless",
                "cluster milan (ClusterSetIP)",
            ],
        ),
        (
            "a session affinity clash: the older export's is used",
            two_providers(hello(), hello().client_ip_affinity()),
            vec![(s("http"), 80)],
            ("True", "SessionAffinityConflict"),
            &["cluster turin: sessionAffinity ClientIP"],
        ),
    ];
    for (name, mut c, ports, (status, reason), message) in cases {
        c.pass();
        assert_eq!(c.ports("demo", "hello"), ports, "{name}");
        let import = c.import("demo", "hello").unwrap();
        assert_eq!(import.spec.type_, "ClusterSetIP", "{name}");
        let clusters: Vec<&str> = import
            .status
            .iter()
            .flat_map(|s| &s.clusters)
            .map(|c| c.cluster.as_str())
            .collect();
        assert_eq!(clusters, ["milan", "turin"], "{name}");
        let from: BTreeSet<String> = c
            .endpoints("demo", "hello")
            .into_iter()
            .map(|(cluster, ..)| cluster)
            .collect();
        assert_eq!(from, BTreeSet::from([s("milan"), s("turin")]), "{name}");
        let (is, why, says) = c.import_condition("demo", "hello", CONFLICT).unwrap();
        assert_eq!((is.as_str(), why.as_str()), (status, reason), "{name}");
        for part in message {
            assert!(says.contains(part), "{name}: {says}");
        }
    }
}

#[test]
fn an_export_here_merged_with_a_peers_conflicts_on_both() {
    // rome's admin lets milan's export join its own in demo; milan's is older.
    let mut c = ClusterFixture::new("rome")
        .namespace(NamespaceFixture::new("demo"))
        .peer(
            PeerFixture::provider("milan")
                .allows("demo")
                .exports(hello().created(NOW - 200)),
        )
        .export(
            ServiceFixture::new("demo", "hello")
                .port("http", 8080)
                .port("grpc", 9090)
                .created(NOW - 50)
                .endpoint("10.244.0.9"),
        );
    c.pass();
    assert_eq!(
        c.ports("demo", "hello"),
        [(s("grpc"), 9090), (s("http"), 80)]
    );
    let on_export = c.export_condition("demo", "hello", CONFLICT).unwrap();
    assert_eq!(
        (on_export.0.as_str(), on_export.1.as_str()),
        ("True", "PortConflict")
    );
    assert!(
        on_export
            .2
            .contains("cluster rome: port \"http\" (TCP 8080)"),
        "{}",
        on_export.2
    );
    let on_import = c.import_condition("demo", "hello", CONFLICT).unwrap();
    assert_eq!(on_import.1, "PortConflict");
    assert_eq!(
        c.export_condition("demo", "hello", READY).unwrap().2,
        "exported to the peers; imported from milan, rome"
    );
}

#[test]
fn a_peer_not_read_keeps_its_part_and_its_age() {
    let mut c = rome_importing_from_milan();
    c.pass();
    let before = c.import("demo", "hello").unwrap().clone();
    // A restart while milan cannot be read, its virtual node down: what it exported is not
    // known, and is not taken as nothing.
    let milan = c.peer_mut("milan");
    milan.readable = false;
    milan.healthy = false;
    let plan = c.pass();
    assert_eq!(kinds(&plan), ["ReplaceSlice"]);
    assert_eq!(
        c.endpoints("demo", "hello"),
        [(s("milan"), s("10.201.1.5"), false)]
    );
    let after = c.import("demo", "hello").unwrap();
    assert_eq!(
        (&after.spec, &after.metadata.uid),
        (&before.spec, &before.metadata.uid)
    );
    // Read again, exporting it no more: now it is gone.
    c.peer_unexports("milan", "demo", "hello");
    c.peer_mut("milan").readable = true;
    assert_eq!(kinds(&c.pass()), ["RemoveImport"]);
}

#[test]
fn an_import_older_than_its_sources_record_waits_for_every_peer() {
    // Ours, written before imports recorded their sources: it may be an unread peer's.
    let mut c = rome_importing_from_milan();
    c.pass();
    c.peer_unexports("milan", "demo", "hello");
    let mut old = c.import("demo", "hello").unwrap().clone();
    old.metadata.annotations = None;
    c.observed
        .imports
        .insert((s("demo"), s("hello")), std::sync::Arc::new(old));
    c.peer_mut("milan").readable = false;
    assert!(kinds(&c.plan()).is_empty());
    c.peer_mut("milan").readable = true;
    let plan = c.plan();
    let removed: Vec<_> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::RemoveImport { import, service } => Some((import.clone(), service.is_some())),
            _ => None,
        })
        .collect();
    assert_eq!(removed, [((s("demo"), s("hello")), true)]);
}

#[test]
fn objects_not_tandems_are_left_alone() {
    let derived = derived_service_name("demo", "hello");
    let cases = [
        (
            "an administrator's own ServiceImport",
            rome_importing_from_milan().foreign_import("demo", "hello"),
            NotOurs::Import,
        ),
        (
            "a Service of someone else's under the derived name",
            rome_importing_from_milan().foreign_service("demo", &derived),
            NotOurs::DerivedService((s("demo"), derived.clone())),
        ),
    ];
    for (name, c, why) in cases {
        let plan = c.plan();
        assert!(plan.steps.is_empty(), "{name}: {:?}", kinds(&plan));
        assert_eq!(plan.not_ours, [((s("demo"), s("hello")), why)], "{name}");
    }
}

#[test]
fn invalid_exports_table() {
    // (case, the cluster, Valid's reason and message)
    let cases = [
        (
            "no Service of that name",
            ClusterFixture::new("rome")
                .peer(PeerFixture::consumer("lugano"))
                .export_alone("demo", "ghost"),
            InvalidExport::NoService(s("demo"), s("ghost")),
            "Service demo/ghost not found",
        ),
        (
            "an ExternalName Service",
            ClusterFixture::new("rome")
                .peer(PeerFixture::consumer("lugano"))
                .export(ServiceFixture::new("demo", "ghost").external_name()),
            InvalidExport::ExternalName(s("demo"), s("ghost")),
            "Service demo/ghost is of type ExternalName, which cannot be exported",
        ),
    ];
    for (name, mut c, invalid, message) in cases {
        let plan = c.pass();
        assert_eq!(
            kinds(&plan),
            ["SetExportStatus"],
            "{name}: nothing published"
        );
        let valid = c.export_condition("demo", "ghost", VALID).unwrap();
        let want = (s("False"), s(invalid.reason()), s(message));
        assert_eq!(valid, want, "{name}");
        assert_eq!(invalid.to_string(), message, "{name}");
        let ready = c.export_condition("demo", "ghost", READY).unwrap();
        assert_eq!((ready.0, ready.1), (s("False"), s("Failed")), "{name}");
        assert!(
            c.export_condition("demo", "ghost", CONFLICT).is_none(),
            "{name}"
        );
    }
}

#[test]
fn the_plan_reads_the_clock_it_is_given() {
    // A peer's export claiming to come from the future counts as made now: it cannot win
    // every conflict by its claim.
    let mut c = ClusterFixture::new("rome")
        .namespace(NamespaceFixture::new("demo").import_from("*"))
        .peer(PeerFixture::provider("milan").exports(hello().created(NOW + 3600)));
    c.pass();
    let import = c.import("demo", "hello").unwrap();
    let sources: Vec<ExportProperties> =
        serde_json::from_str(&import.metadata.annotations.as_ref().unwrap()[SOURCES_ANNOTATION])
            .unwrap();
    assert_eq!(sources[0].created, NOW);
    // Conditions that change do so at the plan's time.
    let conditions = &import.status.as_ref().unwrap().conditions;
    assert!(conditions.iter().all(|c| c.last_transition_time == at(NOW)));
}

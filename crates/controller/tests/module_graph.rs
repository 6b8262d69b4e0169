//! The controller's modules form a DAG, in floors: helpers (requests, watches, objects,
//! clients, errors, events), shared state (settings, caches, shared watches, credentials, link
//! types), the context, the reconcilers, and the wiring (`runtime`, `consumer::supervisor`).
//! No source file outgrows its module, and modules are not merged to get there.

#[test]
fn controller_modules_import_each_other_in_one_direction_only() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = tandem_layout::ModuleGraph::read(&src);
    // 48 modules before the floors; the count only grows (`uninstall` left for tandem-admin).
    graph.assert_layered("crates/controller", 107);
    let long = graph.long_files(1000);
    assert!(
        long.is_empty(),
        "files over 1,000 lines of code outside their tests (split them): {long:?}"
    );
}

/// The floors hold where a newcomer starts reading: the context and the helpers below it name
/// no reconciler.
#[test]
fn the_context_and_helpers_name_no_reconciler() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = tandem_layout::ModuleGraph::read(&src);
    let reconcilers = [
        "consumer",
        "provider",
        "mcs",
        "fabric",
        "discovery",
        "runtime",
    ];
    for low in [
        "context",
        "requests",
        "watches",
        "objects",
        "clients",
        "settings",
        "shared_watches",
        "ipam_cache",
        "credentials",
        "error",
        "events",
        "rbac",
    ] {
        let named = &graph.edges[low];
        let up: Vec<&String> = named
            .iter()
            .filter(|m| reconcilers.iter().any(|r| m.split("::").next() == Some(*r)))
            .collect();
        assert!(up.is_empty(), "{low} names reconcilers {up:?}");
    }
}

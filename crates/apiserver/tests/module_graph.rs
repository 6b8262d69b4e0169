//! The API server's modules form a DAG: shared state, responses, authorization and the helpers
//! several handlers use sit in modules of their own, below the modules that use them. The
//! graph is read from the sources by `tandem-layout` (see its documentation for what counts as
//! an edge).

#[test]
fn apiserver_modules_import_each_other_in_one_direction_only() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = tandem_layout::ModuleGraph::read(&src);
    graph.assert_layered("crates/apiserver", 44);
}

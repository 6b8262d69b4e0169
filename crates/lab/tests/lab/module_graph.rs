//! The lab's modules form a DAG (floors: helpers and shared types below the controllers and
//! the network mode that use them), and no source file outgrows its module.

#[test]
fn lab_modules_import_each_other_in_one_direction_only() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = tandem_layout::ModuleGraph::read(&src);
    // 71 until the test support (`testing`, `testing::hang`) left for crates/testing, whole.
    graph.assert_layered("crates/lab", 69);
    let long = graph.long_files(1000);
    assert!(
        long.is_empty(),
        "files over 1,000 lines of code (split them): {long:?}"
    );
}

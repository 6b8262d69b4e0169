//! Prints a crate's module graph report: `cargo run -p tandem-layout --example show --
//! crates/controller/src [v]` (with `v`, every module's edges too).

fn main() {
    let src = std::env::args().nth(1).unwrap();
    let g = tandem_layout::ModuleGraph::read(std::path::Path::new(&src));
    println!("{} modules, {} edges", g.len(), g.edge_count());
    for k in g.knots() {
        println!("knot of {}: {}", k.modules.len(), k.cycle.join(" -> "));
        println!("   {:?}", k.modules);
    }
    println!("mutual: {:?}", g.mutual_pairs());
    println!("long: {:?}", g.long_files(1000));
    if std::env::args().nth(2).is_some() {
        for (m, e) in &g.edges {
            println!("{m} -> {e:?}");
        }
    }
}

//! The API server's modules form a DAG: shared state, responses, authorization and the helpers
//! several handlers use sit in modules of their own, below the modules that use them.
//!
//! The graph is read from the sources in `src/`: `a -> b` when `a.rs` names `crate::b` (in a
//! path or a `use crate::{b, c::d}` group), and `lib -> b` when the crate root names `b::`. A
//! `#[cfg(test)] mod tests` is a module of its own that nothing imports, so what it names cannot
//! close a cycle and is left out (by this crate's habit it closes its file).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

/// Module name to the modules it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The crate root's node; a `crate::item` that is not a module points at it.
const ROOT: &str = "lib";

/// The source of a module without its whole-line comments and its test module.
fn code_of(source: &str) -> String {
    let mut code = String::new();
    let mut lines = source.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if trimmed == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        if !trimmed.starts_with("//") {
            code.push_str(line);
            code.push('\n');
        }
    }
    code
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn leading_ident(s: &str) -> &str {
    let s = s.trim_start();
    &s[..s.find(|c| !is_ident(c)).unwrap_or(s.len())]
}

/// First path segments after each `crate::`, including every member of a `crate::{..}` group.
fn crate_references(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        if code[..at].ends_with(is_ident) {
            continue; // e.g. `my_crate::`
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let end = group
                .find(|c| {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => return true,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    false
                })
                .unwrap_or(group.len());
            // Only the group's top-level members start a path from the crate root.
            let mut depth = 0;
            let mut member_start = 0;
            for (i, c) in group[..end].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.insert(leading_ident(&group[member_start..i]).to_string());
                        member_start = i + 1;
                    }
                    _ => {}
                }
            }
            names.insert(leading_ident(&group[member_start..end]).to_string());
        } else {
            names.insert(leading_ident(rest).to_string());
        }
    }
    names.retain(|n| !n.is_empty() && n != "self");
    names
}

/// Modules the crate root names as `module::` (its own paths start at the root).
fn root_references(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut names = crate_references(code);
    for module in modules {
        let needle = format!("{module}::");
        let named = code
            .match_indices(&needle)
            .any(|(at, _)| !code[..at].ends_with(|c: char| is_ident(c) || c == ':'));
        if named {
            names.insert(module.clone());
        }
    }
    names
}

/// The graph of `src/*.rs`, keyed by module name (the crate root is [`ROOT`]).
fn module_graph(src: &Path) -> Graph {
    let mut sources = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("src/ lists") {
        let path = entry.expect("src/ entry").path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let source = std::fs::read_to_string(&path).expect("module reads");
            sources.insert(name, code_of(&source));
        }
    }
    let modules: BTreeSet<String> = sources.keys().filter(|m| *m != ROOT).cloned().collect();
    sources
        .iter()
        .map(|(name, code)| {
            let named = if name == ROOT {
                root_references(code, &modules)
            } else {
                crate_references(code)
            };
            let targets = named
                .into_iter()
                .map(|n| if modules.contains(&n) { n } else { ROOT.into() })
                .filter(|n| n != name)
                .collect();
            (name.clone(), targets)
        })
        .collect()
}

/// Modules that all reach each other (a strongly connected component of more than one).
struct Knot {
    /// Its modules.
    modules: BTreeSet<String>,
    /// One shortest cycle through its first module: `[a, b, a]`.
    cycle: Vec<String>,
}

/// Every knot of the graph; a DAG has none.
fn knots(graph: &Graph) -> Vec<Knot> {
    let reaches = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(n) = todo.pop() {
            for next in graph.get(&n).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|n| (n, reaches(n))).collect();
    let mut placed = BTreeSet::new();
    let mut found = Vec::new();
    for start in graph.keys() {
        if placed.contains(start) || !reach[start].contains(start) {
            continue;
        }
        let component: BTreeSet<&String> = graph
            .keys()
            .filter(|n| reach[start].contains(*n) && reach[*n].contains(start))
            .collect();
        placed.extend(component.iter().map(|n| (*n).clone()));
        // Breadth-first from `start` back to itself, inside the component.
        let mut parent: BTreeMap<&String, &String> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        let mut last = None;
        'search: while let Some(n) = queue.pop_front() {
            for next in &graph[n] {
                if next == start {
                    last = Some(n);
                    break 'search;
                }
                if component.contains(next) && !parent.contains_key(next) {
                    parent.insert(next, n);
                    queue.push_back(next);
                }
            }
        }
        let mut path = Vec::new();
        let mut at = last.expect("a module that reaches itself has a cycle");
        while at != start {
            path.push(at.clone());
            at = parent[at];
        }
        path.reverse();
        found.push(Knot {
            modules: component.into_iter().cloned().collect(),
            cycle: [vec![start.clone()], path, vec![start.clone()]].concat(),
        });
    }
    found
}

/// Pairs of modules that name each other (`a <-> b`).
fn mutual_pairs(graph: &Graph) -> Vec<String> {
    graph
        .iter()
        .flat_map(|(a, targets)| {
            targets
                .iter()
                .filter(move |b| a < *b && graph[*b].contains(a))
                .map(move |b| format!("{a} <-> {b}"))
        })
        .collect()
}

#[test]
fn apiserver_modules_import_each_other_in_one_direction_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    let edges: usize = graph.values().map(BTreeSet::len).sum();
    assert!(
        graph.len() > 10 && edges > graph.len(),
        "the sources were not read: {graph:?}"
    );
    let found = knots(&graph);
    assert!(
        found.is_empty(),
        "modules of crates/apiserver/src import each other (move what both need into a module \
         below them):\n{}\nmodules naming each other: {}",
        found
            .iter()
            .map(|k| format!(
                "  {} (all of {} reach each other)",
                k.cycle.join(" -> "),
                k.modules.iter().cloned().collect::<Vec<_>>().join(", ")
            ))
            .collect::<Vec<_>>()
            .join("\n"),
        mutual_pairs(&graph).join(", ")
    );
}

#[test]
fn references_come_from_paths_and_use_groups_but_not_comments_or_tests() {
    let source = r#"
//! Mentions crate::docs in a comment.
use crate::error::{ApiError, ApiResult};
use crate::{request::{self, Query}, state::State, webhook};
use other_crate::ignored;

fn f() {
    crate::objects::now();
    let _ = crate::CONSTANT;
}

#[cfg(test)]
mod tests {
    use crate::server::Call;
}
"#;
    let named = crate_references(&code_of(source));
    let want = [
        "CONSTANT", "error", "objects", "request", "state", "webhook",
    ];
    assert_eq!(named, want.iter().map(|s| s.to_string()).collect());

    let modules = ["server", "state", "store"].map(String::from).into();
    let root = "mod server;\npub use state::{Config, State};\nlet s = server::serve();\nlet p = tandem::store::Store;";
    assert_eq!(
        root_references(root, &modules),
        ["server", "state"].map(String::from).into()
    );
}

#[test]
fn cycles_are_named_shortest_first_and_a_dag_has_none() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g = Graph::new();
        for (from, to) in edges {
            g.entry(from.to_string())
                .or_default()
                .insert(to.to_string());
            g.entry(to.to_string()).or_default();
        }
        g
    };
    let dag = graph(&[
        ("server", "state"),
        ("handlers", "state"),
        ("server", "handlers"),
    ]);
    assert!(knots(&dag).is_empty());
    assert!(mutual_pairs(&dag).is_empty());

    let tangled = graph(&[
        ("handlers", "scale"),
        ("scale", "handlers"),
        ("server", "state"),
        ("state", "crd"),
        ("crd", "server"),
    ]);
    let found = knots(&tangled);
    let named: Vec<String> = found.iter().map(|k| k.cycle.join(" -> ")).collect();
    assert_eq!(
        named,
        [
            "crd -> server -> state -> crd",
            "handlers -> scale -> handlers"
        ]
    );
    let members: Vec<Vec<&str>> = found
        .iter()
        .map(|k| k.modules.iter().map(String::as_str).collect())
        .collect();
    assert_eq!(
        members,
        [vec!["crd", "server", "state"], vec!["handlers", "scale"]]
    );
    assert_eq!(mutual_pairs(&tangled), ["handlers <-> scale"]);
}

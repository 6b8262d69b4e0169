//! Checks of a crate's source layout, read from the files in its `src/` (no compiler needed):
//! the graph of its modules, the knots (cycles) in it, and how long its files are.
//!
//! Modules are named by path (`consumer::vk`; the crate root is [`ROOT`]), one per file:
//! `a/mod.rs` is `a`, `a/b.rs` is `a::b`. `m -> n` when `m`'s code names `n`: a path starting
//! `crate::`, `super::` or `self::` (every member of a `{..}` group too) resolved to the deepest
//! module it reaches, or a path starting with the name of one of `m`'s child modules (how a
//! `mod.rs` calls what it declares). An item of a module that is not itself a module points at
//! that module. Comments and `#[cfg(test)] mod … { … }` blocks are left out: a test module is
//! a module of its own that nothing imports, so what it names cannot close a cycle.
//!
//! Written by hand because it reads the sources as text, macro bodies included (`tokio::select!`
//! arms name modules too), which a syntax tree crate does not look into.

pub mod errors;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// The crate root's node name.
pub const ROOT: &str = "lib";

/// A crate's modules, each with the modules its code names.
#[derive(Debug, Default)]
pub struct ModuleGraph {
    /// Module name to the modules it names (never itself).
    pub edges: BTreeMap<String, BTreeSet<String>>,
    /// Module name to its file.
    pub files: BTreeMap<String, PathBuf>,
    /// Module name to its lines of code outside comments and test modules.
    pub lines: BTreeMap<String, usize>,
}

/// Modules that all reach each other (a strongly connected component of more than one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Knot {
    /// Its modules.
    pub modules: BTreeSet<String>,
    /// One shortest cycle through its first module: `[a, b, a]`.
    pub cycle: Vec<String>,
}

/// The module name of `file` (relative to `src/`): `a/mod.rs` → `a`, `a/b.rs` → `a::b`.
fn module_name(relative: &Path) -> String {
    let mut parts: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts == ["lib"] || parts == ["main"] || parts.is_empty() {
        return ROOT.into();
    }
    parts.join("::")
}

/// Every `.rs` file under `dir` (appended to `out`), in name order.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without whole-line comments and without `#[cfg(test)] mod … { … }` blocks.
pub fn code_of(source: &str) -> String {
    let mut code = String::new();
    let lines: Vec<&str> = source.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim();
        let test_module = trimmed == "#[cfg(test)]"
            && lines.get(i + 1).is_some_and(|next| {
                let next = next.trim_start();
                // `mod`, `pub mod`, `pub(crate) mod`, `pub(super) mod`.
                let after_vis = next
                    .strip_prefix("pub")
                    .map(|rest| {
                        rest.strip_prefix('(')
                            .and_then(|r| r.split_once(')'))
                            .map_or(rest, |(_, r)| r)
                    })
                    .unwrap_or(next);
                after_vis.trim_start().starts_with("mod ")
            });
        if test_module {
            // Skip to the line that closes the module's brace (or its `mod x;`).
            let mut depth = 0i64;
            let mut opened = false;
            let mut j = i + 1;
            while j < lines.len() {
                let line = lines[j];
                depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
                opened |= line.contains('{');
                if (opened && depth <= 0) || (!opened && line.trim_end().ends_with(';')) {
                    break;
                }
                j += 1;
            }
            i = j + 1;
            continue;
        }
        if !trimmed.starts_with("//") {
            code.push_str(lines[i]);
            code.push('\n');
        }
        i += 1;
    }
    code
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The `a::b::c` path at the start of `s` (segments only, stopping before `::{` or `::*`) and
/// what follows it.
fn leading_path(s: &str) -> (Vec<String>, &str) {
    let mut segments = Vec::new();
    let mut rest = s.trim_start();
    loop {
        let end = rest.find(|c| !is_ident(c)).unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        segments.push(rest[..end].to_string());
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(after) if after.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') => {
                rest = after
            }
            _ => break,
        }
    }
    (segments, rest)
}

/// The top-level members of the `{..}` group that `group` starts inside of.
fn group_members(group: &str) -> Vec<&str> {
    let mut depth = 0;
    let mut start = 0;
    let mut members = Vec::new();
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                members.push(&group[start..i]);
                return members;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                members.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    members.push(&group[start..]);
    members
}

impl ModuleGraph {
    /// Reads every `.rs` file under `src`.
    pub fn read(src: &Path) -> ModuleGraph {
        let mut paths = Vec::new();
        rust_files(src, &mut paths);
        let mut graph = ModuleGraph::default();
        let mut sources = BTreeMap::new();
        for path in paths {
            let relative = path.strip_prefix(src).expect("under src").to_path_buf();
            let name = module_name(&relative);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let code = code_of(&text);
            graph.lines.insert(name.clone(), code.lines().count());
            sources.insert(name.clone(), code);
            graph.files.insert(name, path);
        }
        for (name, code) in &sources {
            let named = graph.references(name, code);
            graph.edges.insert(name.clone(), named);
        }
        graph
    }

    /// The module `path` (segments from the root) lands in: the deepest existing one.
    fn resolve(&self, path: &[String]) -> String {
        for len in (1..=path.len()).rev() {
            let name = path[..len].join("::");
            if self.files.contains_key(&name) {
                return name;
            }
        }
        ROOT.into()
    }

    /// The modules `module`'s code names.
    fn references(&self, module: &str, code: &str) -> BTreeSet<String> {
        let own: Vec<String> = if module == ROOT {
            Vec::new()
        } else {
            module.split("::").map(str::to_string).collect()
        };
        let mut named = BTreeSet::new();
        let mut add = |base: &[String], rest: &str| {
            let (segments, after) = leading_path(rest);
            let group = rest.strip_prefix('{').or_else(|| after.strip_prefix("::{"));
            match group {
                Some(group) => {
                    for member in group_members(group) {
                        let (inner, _) = leading_path(member);
                        let full: Vec<String> = base
                            .iter()
                            .chain(&segments)
                            .chain(inner.iter().filter(|s| *s != "self"))
                            .cloned()
                            .collect();
                        named.insert(self.resolve(&full));
                    }
                }
                None => {
                    let full: Vec<String> = base.iter().chain(&segments).cloned().collect();
                    named.insert(self.resolve(&full));
                }
            }
        };
        // Paths from the root, the parent or this module.
        for keyword in ["crate::", "super::", "self::"] {
            for (at, _) in code.match_indices(keyword) {
                if code[..at].ends_with(|c: char| is_ident(c) || c == ':') {
                    continue; // `my_crate::`, `super::super::` (read from its first `super`)
                }
                let mut rest = &code[at + keyword.len()..];
                let base: Vec<String> = match keyword {
                    "crate::" => Vec::new(),
                    "self::" => own.clone(),
                    _ => {
                        let mut up = 1;
                        while let Some(r) = rest.strip_prefix("super::") {
                            up += 1;
                            rest = r;
                        }
                        own[..own.len().saturating_sub(up)].to_vec()
                    }
                };
                add(&base, rest);
            }
        }
        // Paths starting with a child module's name.
        let prefix = if module == ROOT {
            String::new()
        } else {
            format!("{module}::")
        };
        for child in self.files.keys() {
            let Some(short) = child.strip_prefix(&prefix) else {
                continue;
            };
            if child == ROOT || short.contains("::") || short.is_empty() {
                continue;
            }
            let needle = format!("{short}::");
            let mentioned = code
                .match_indices(&needle)
                .any(|(at, _)| !code[..at].ends_with(|c: char| is_ident(c) || c == ':'));
            if mentioned {
                named.insert(child.clone());
            }
        }
        named.remove(module);
        named
    }

    /// How many modules the crate has.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether no source was read.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// How many edges the graph has.
    pub fn edge_count(&self) -> usize {
        self.edges.values().map(BTreeSet::len).sum()
    }

    /// Every knot of the graph; a DAG has none.
    pub fn knots(&self) -> Vec<Knot> {
        let graph = &self.edges;
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
    pub fn mutual_pairs(&self) -> Vec<String> {
        let graph = &self.edges;
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

    /// Files whose code (outside comments and test modules) is longer than `limit` lines,
    /// with that length.
    pub fn long_files(&self, limit: usize) -> Vec<(String, usize)> {
        self.lines
            .iter()
            .filter(|(_, lines)| **lines > limit)
            .map(|(module, lines)| (self.files[module].display().to_string(), *lines))
            .collect()
    }

    /// Panics, naming each knot and the modules that name each other, unless the graph is a
    /// DAG; and unless it was read at all (at least `min_modules` modules, a guard against a
    /// moved `src/` and against merging modules to break cycles).
    pub fn assert_layered(&self, crate_name: &str, min_modules: usize) {
        assert!(
            self.len() >= min_modules && self.edge_count() > 0,
            "{crate_name}: {} modules read, at least {min_modules} expected (were modules \
             merged, or src/ moved?)",
            self.len()
        );
        let found = self.knots();
        assert!(
            found.is_empty(),
            "modules of {crate_name} import each other (move what both need into a module \
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
            self.mutual_pairs().join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate written to a temporary directory: (relative path, source).
    fn graph_of(files: &[(&str, &str)]) -> ModuleGraph {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tandem-layout-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, source) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, source).unwrap();
        }
        let graph = ModuleGraph::read(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        graph
    }

    fn edges(graph: &ModuleGraph, module: &str) -> Vec<String> {
        graph.edges[module].iter().cloned().collect()
    }

    #[test]
    fn references_come_from_paths_groups_and_children_but_not_comments_or_tests() {
        let graph = graph_of(&[
            (
                "lib.rs",
                "pub mod a;\npub mod b;\npub mod c;\nfn f() { a::run(); }\n",
            ),
            (
                "a/mod.rs",
                "//! Mentions crate::c in a comment.\npub mod x;\npub mod y;\n\
                 use crate::{b::{self, Item}, c::CONST};\nfn g() { x::go(); tokio::select! { _ = super::c::h() => {} } }\n\
                 #[cfg(test)]\nmod tests {\n    use crate::c;\n    fn t() { if true { } }\n}\n\
                 #[cfg(test)]\npub(crate) mod helpers {\n    use crate::c;\n}\n\
                 fn after() { y::go(); }\n",
            ),
            ("a/x.rs", "use super::super::b;\nuse self::inner::Z;\n"),
            ("a/y.rs", "use super::x::Thing;\n"),
            ("b.rs", "pub struct Item;\n"),
            ("c.rs", "use crate::a::x::Thing as _;\n"),
        ]);
        assert_eq!(graph.len(), 6);
        assert_eq!(edges(&graph, ROOT), ["a"]);
        assert_eq!(edges(&graph, "a"), ["a::x", "a::y", "b", "c"]);
        assert_eq!(edges(&graph, "a::x"), ["b"]);
        assert_eq!(edges(&graph, "a::y"), ["a::x"]);
        assert_eq!(edges(&graph, "c"), ["a::x"]);
        assert!(graph.knots().is_empty(), "{:?}", graph.knots());
    }

    #[test]
    fn a_parent_holding_helpers_its_children_use_is_a_knot() {
        let graph = graph_of(&[
            ("lib.rs", "mod m;\n"),
            (
                "m/mod.rs",
                "mod k;\npub fn helper() {}\nfn run() { k::spawn(); }\n",
            ),
            ("m/k.rs", "pub fn spawn() { super::helper(); }\n"),
        ]);
        let knots = graph.knots();
        assert_eq!(knots.len(), 1, "{knots:?}");
        assert_eq!(knots[0].cycle, ["m", "m::k", "m"]);
        assert_eq!(graph.mutual_pairs(), ["m <-> m::k"]);
        let refused = std::panic::catch_unwind(|| graph.assert_layered("demo", 3));
        assert!(refused.is_err(), "a knot fails the check");
        let too_few =
            std::panic::catch_unwind(|| graph_of(&[("lib.rs", "")]).assert_layered("demo", 3));
        assert!(too_few.is_err(), "a graph not read fails the check");
    }

    #[test]
    fn long_files_count_code_outside_tests() {
        let body = "fn f() {}\n".repeat(30);
        let tests = format!(
            "#[cfg(test)]\nmod tests {{\n{}}}\n",
            "fn t() {}\n".repeat(100)
        );
        let graph = graph_of(&[("lib.rs", &format!("{body}{tests}"))]);
        assert!(graph.long_files(30).is_empty());
        assert_eq!(graph.long_files(29).len(), 1);
        assert_eq!(graph.long_files(29)[0].1, 30);
    }

    #[test]
    fn cycles_are_named_shortest_first_and_a_dag_has_none() {
        let graph = |edges: &[(&str, &str)]| {
            let mut g = ModuleGraph::default();
            for (from, to) in edges {
                g.edges
                    .entry(from.to_string())
                    .or_default()
                    .insert(to.to_string());
                g.edges.entry(to.to_string()).or_default();
            }
            g
        };
        let dag = graph(&[
            ("server", "state"),
            ("handlers", "state"),
            ("server", "handlers"),
        ]);
        assert!(dag.knots().is_empty());
        assert!(dag.mutual_pairs().is_empty());

        let tangled = graph(&[
            ("handlers", "scale"),
            ("scale", "handlers"),
            ("server", "state"),
            ("state", "crd"),
            ("crd", "server"),
        ]);
        let found = tangled.knots();
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
        assert_eq!(tangled.mutual_pairs(), ["handlers <-> scale"]);
    }
}

//! Library code carries its errors as types: no function of a library crate returns a text
//! error (`String`, `&str`, `Box<str>` or an alias of them) and no public function of one
//! returns `anyhow`. Binaries (`src/bin`, the CLI's command handlers) may use `anyhow`; clap
//! value parsers are written as `FromStr`, which the rule leaves alone.
//!
//! When the rule was written it found 53 text errors and 21 public functions returning anyhow;
//! none is left.

use std::path::{Path, PathBuf};

use tandem_layout::errors::{Finding, Rule, findings};

/// `crate/path-in-src: function`.
fn key(crate_dir: &Path, f: &Finding) -> String {
    let name = crate_dir.file_name().unwrap().to_string_lossy();
    let src = crate_dir.join("src");
    let file = Path::new(&f.file)
        .strip_prefix(&src)
        .map_or_else(|_| f.file.clone(), |p| p.display().to_string());
    format!("{name}/{file}: {}", f.function)
}

/// Fails naming each function `found`.
fn none(found: Vec<String>, what: &str) {
    assert!(
        found.is_empty(),
        "{} functions {what}; give each an error type (thiserror) that says what failed and \
         keeps its cause:\n{}",
        found.len(),
        found.join("\n")
    );
}

/// Every crate of the workspace with library code, by its directory.
fn library_crates() -> Vec<PathBuf> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&crates)
        .expect("crates/ lists")
        .map(|e| e.expect("entry").path())
        .filter(|d| d.join("src/lib.rs").exists())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 10, "the crates were not found: {dirs:?}");
    dirs
}

/// The functions a crate's clap arguments name as `value_parser = f` (their error is the text
/// clap prints).
fn value_parsers(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    tandem_layout::rust_files(src, &mut files);
    let mut names = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for (at, _) in text.match_indices("value_parser = ") {
            let rest = &text[at + "value_parser = ".len()..];
            let path_end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            if let Some(name) = rest[..path_end].rsplit("::").next() {
                names.push(name.to_string());
            }
        }
    }
    names
}

#[test]
fn no_library_function_returns_a_text_error() {
    let found: Vec<String> = library_crates()
        .iter()
        .flat_map(|dir| {
            let parsers = value_parsers(&dir.join("src"));
            findings(&dir.join("src"), Rule::TextErrors)
                .into_iter()
                .filter(|f| !parsers.contains(&f.function))
                .map(|f| key(dir, &f))
                .collect::<Vec<_>>()
        })
        .collect();
    none(found, "return a text error");
}

#[test]
fn no_library_entry_point_returns_anyhow() {
    let found: Vec<String> = library_crates()
        .iter()
        // The CLI is the binary's own code: its command handlers report through anyhow.
        .filter(|dir| !dir.ends_with("cli"))
        .flat_map(|dir| {
            findings(&dir.join("src"), Rule::AnyhowInPublicApi)
                .into_iter()
                .map(|f| key(dir, &f))
                .collect::<Vec<_>>()
        })
        .collect();
    none(
        found,
        "of library crates return anyhow (callers cannot tell what failed)",
    );
}

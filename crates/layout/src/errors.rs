//! Error types of library functions, read with `syn` from a crate's sources: a function whose
//! error is text (`String`, `&str`, `Box<str>` or an alias of them) cannot be matched on or
//! carry its cause, and one that returns `anyhow` hides what can fail from its callers.

use std::collections::BTreeSet;
use std::path::Path;

use syn::visit::Visit;

use crate::rust_files;

/// A function whose error type breaks the rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    /// The file, as given under `src`.
    pub file: String,
    /// The function (`Type::method` for methods).
    pub function: String,
    /// What its error is (`String`, `anyhow`).
    pub error: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} returns {}", self.file, self.function, self.error)
    }
}

/// What to look for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// A `Result` (anywhere in a function's return type) whose error is text.
    TextErrors,
    /// A public function returning `anyhow::Result` or `Result<_, anyhow::Error>`.
    AnyhowInPublicApi,
}

/// `#[test]`, or a `#[cfg(…)]` that names `test`.
fn is_test_attr(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || (a.path().is_ident("cfg")
                && matches!(&a.meta, syn::Meta::List(l) if l.tokens.to_string().contains("test")))
    })
}

fn path_text(path: &syn::Path) -> String {
    path.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

/// Whether `ty` is text: `String`, `&str`, `Box<str>`, or one of `aliases`.
fn is_text(ty: &syn::Type, aliases: &BTreeSet<String>) -> bool {
    match ty {
        syn::Type::Reference(r) => matches!(&*r.elem, syn::Type::Path(p) if p.path.is_ident("str")),
        syn::Type::Path(p) => {
            let Some(last) = p.path.segments.last() else {
                return false;
            };
            let name = last.ident.to_string();
            if name == "String" || aliases.contains(&name) {
                return true;
            }
            if name == "Box"
                && let syn::PathArguments::AngleBracketed(args) = &last.arguments
                && let Some(syn::GenericArgument::Type(syn::Type::Path(inner))) = args.args.first()
            {
                return inner.path.is_ident("str");
            }
            false
        }
        syn::Type::Paren(p) => is_text(&p.elem, aliases),
        syn::Type::Group(g) => is_text(&g.elem, aliases),
        _ => false,
    }
}

/// The error type of `Result<T, E>` (`E`), if `ty` is such a path.
fn result_error(ty: &syn::TypePath) -> Option<&syn::Type> {
    let last = ty.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let types: Vec<&syn::Type> = args
        .args
        .iter()
        .filter_map(|a| match a {
            syn::GenericArgument::Type(t) => Some(t),
            _ => None,
        })
        .collect();
    (types.len() == 2).then(|| types[1])
}

/// Every type inside `ty` (itself included), to find a `Result` nested in `impl Future<…>`,
/// `Box<dyn Fn() -> …>` or a tuple.
struct Types<'a>(Vec<&'a syn::Type>);

impl<'a> Visit<'a> for Types<'a> {
    fn visit_type(&mut self, ty: &'a syn::Type) {
        self.0.push(ty);
        syn::visit::visit_type(self, ty);
    }
}

fn text_error_in(
    ty: &syn::Type,
    aliases: &BTreeSet<String>,
    result_aliases: &BTreeSet<String>,
) -> bool {
    let mut types = Types(Vec::new());
    types.visit_type(ty);
    types.0.into_iter().any(|t| {
        let syn::Type::Path(p) = t else { return false };
        if p.path
            .segments
            .last()
            .is_some_and(|s| result_aliases.contains(&s.ident.to_string()))
        {
            return true;
        }
        result_error(p).is_some_and(|e| is_text(e, aliases))
    })
}

fn is_anyhow(ty: &syn::Type) -> bool {
    let syn::Type::Path(p) = ty else { return false };
    let text = path_text(&p.path);
    if text == "anyhow::Result" {
        return true;
    }
    result_error(p)
        .is_some_and(|e| matches!(e, syn::Type::Path(ep) if path_text(&ep.path) == "anyhow::Error"))
}

/// Type aliases of a file: names of text aliases (`type Reason = String;`) and of `Result`
/// aliases whose error is text (`type Verdict<T> = Result<T, String>;`).
fn aliases_of(file: &syn::File, text: &mut BTreeSet<String>, results: &mut BTreeSet<String>) {
    struct Aliases<'a>(&'a mut Vec<syn::ItemType>);
    impl<'a> Visit<'_> for Aliases<'a> {
        fn visit_item_type(&mut self, t: &syn::ItemType) {
            self.0.push(t.clone());
        }
    }
    let mut found = Vec::new();
    Aliases(&mut found).visit_file(file);
    for t in found {
        if is_text(&t.ty, text) {
            text.insert(t.ident.to_string());
        }
        if let syn::Type::Path(p) = &*t.ty
            && result_error(p).is_some_and(|e| is_text(e, text))
        {
            results.insert(t.ident.to_string());
        }
    }
}

struct Finder<'a> {
    rule: Rule,
    file: &'a str,
    aliases: &'a BTreeSet<String>,
    result_aliases: &'a BTreeSet<String>,
    /// The type of the `impl` block being read, and whether it implements a trait.
    within: Option<(String, bool)>,
    found: Vec<Finding>,
}

impl Finder<'_> {
    fn check(&mut self, name: String, public: bool, output: &syn::ReturnType) {
        let syn::ReturnType::Type(_, ty) = output else {
            return;
        };
        let error = match self.rule {
            Rule::TextErrors if text_error_in(ty, self.aliases, self.result_aliases) => "text",
            Rule::AnyhowInPublicApi if public && is_anyhow(ty) => "anyhow",
            _ => return,
        };
        self.found.push(Finding {
            file: self.file.to_string(),
            function: name,
            error: error.into(),
        });
    }
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_attr(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if is_test_attr(&f.attrs) {
            return;
        }
        let public = matches!(f.vis, syn::Visibility::Public(_));
        self.check(f.sig.ident.to_string(), public, &f.sig.output);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test_attr(&i.attrs) {
            return;
        }
        let name = match &*i.self_ty {
            syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        }
        .unwrap_or_else(|| "_".into());
        let outer = self.within.replace((name, i.trait_.is_some()));
        syn::visit::visit_item_impl(self, i);
        self.within = outer;
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_test_attr(&f.attrs) {
            return;
        }
        let (owner, of_trait) = self.within.clone().unwrap_or_default();
        // A trait's method has the signature the trait gives it (`FromStr::from_str` with
        // `Err = String` is how clap value parsers are written).
        if !of_trait {
            let public = matches!(f.vis, syn::Visibility::Public(_));
            self.check(format!("{owner}::{}", f.sig.ident), public, &f.sig.output);
        }
        syn::visit::visit_impl_item_fn(self, f);
    }
}

/// The functions of the crate whose sources are under `src` that break `rule`, outside test
/// modules and test functions. Files under `src/bin/` (binaries' `main`s) are left out.
pub fn findings(src: &Path, rule: Rule) -> Vec<Finding> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.retain(|f| !f.strip_prefix(src).is_ok_and(|r| r.starts_with("bin")));
    let parsed: Vec<(String, syn::File)> = files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let file = syn::parse_file(&text)
                .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
            (path.display().to_string(), file)
        })
        .collect();
    // Aliases are collected over the whole crate first (an alias may be used in another file).
    let (mut aliases, mut result_aliases) = (BTreeSet::new(), BTreeSet::new());
    for (_, file) in &parsed {
        aliases_of(file, &mut aliases, &mut result_aliases);
    }
    let mut found = Vec::new();
    for (name, file) in &parsed {
        let mut finder = Finder {
            rule,
            file: name,
            aliases: &aliases,
            result_aliases: &result_aliases,
            within: None,
            found: Vec::new(),
        };
        finder.visit_file(file);
        found.extend(finder.found);
    }
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(source: &str, rule: Rule) -> Vec<String> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("tandem-layout-errors-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("lib.rs"), source).unwrap();
        let out = findings(&dir, rule)
            .into_iter()
            .map(|f| f.function)
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        out
    }

    #[test]
    fn text_errors_are_found_however_they_are_spelled() {
        let source = r#"
type Reason = String;
type Checked<T> = Result<T, String>;
pub fn plain() -> Result<(), String> { Ok(()) }
fn borrowed() -> Result<u8, &'static str> { Ok(1) }
fn boxed() -> Result<u8, Box<str>> { Ok(1) }
fn aliased() -> Result<u8, Reason> { Ok(1) }
fn result_alias() -> Checked<u8> { Ok(1) }
fn nested() -> impl std::future::Future<Output = Result<(), String>> { async { Ok(()) } }
fn typed() -> Result<(), std::io::Error> { Ok(()) }
fn tuple() -> Result<(), (u16, String)> { Ok(()) }
struct S;
impl S { fn method(&self) -> Result<(), String> { Ok(()) } }
impl std::str::FromStr for S { type Err = String; fn from_str(_: &str) -> Result<S, String> { Ok(S) } }
#[cfg(test)]
mod tests { fn helper() -> Result<(), String> { Ok(()) } }
"#;
        assert_eq!(
            found(source, Rule::TextErrors),
            [
                "S::method",
                "aliased",
                "borrowed",
                "boxed",
                "nested",
                "plain",
                "result_alias"
            ]
        );
    }

    #[test]
    fn anyhow_is_found_in_public_functions_only() {
        let source = r#"
pub fn start() -> anyhow::Result<()> { Ok(()) }
pub fn spelled() -> Result<(), anyhow::Error> { Ok(()) }
fn private() -> anyhow::Result<()> { Ok(()) }
pub struct S;
impl S { pub async fn run(&self) -> anyhow::Result<()> { Ok(()) } }
"#;
        assert_eq!(
            found(source, Rule::AnyhowInPublicApi),
            ["S::run", "spelled", "start"]
        );
    }
}

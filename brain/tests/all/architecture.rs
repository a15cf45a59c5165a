//! The module graph's rules (docs/ARCHITECTURE.md), read from the sources as the compiler
//! parses them (`syn`), not as text: every path a module names (`use` trees, paths in code
//! and types, in macro input, and in attribute strings such as serde's `with`) is resolved
//! from `crate`, `super` and `self` to the module it reaches, however it is written.
//!
//! - Nothing in the brain depends on `api/`, so a rule a route and a tool both apply cannot
//!   hide behind HTTP. Only the crate root, which mounts the router, names it.
//! - No circle of imports between modules (a module and its own submodules aside): in a
//!   circle, neither module can be understood, tested or changed without the other, and
//!   the rule each owns stops having one home.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A module's path from its crate's root (`[]` for the root itself).
type Module = Vec<String>;

fn sources(dir: &Path, found: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            sources(&path, found)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    Ok(())
}

/// The library's modules and their sources, by the file layout the compiler follows
/// (`x.rs` or `x/mod.rs` is `x`); binaries (`main.rs`, `bin/`) are crates of their own.
fn library(src: &Path) -> Vec<(Module, String)> {
    let mut files = Vec::new();
    sources(src, &mut files).unwrap();
    files
        .into_iter()
        .filter_map(|file| {
            let relative = file.strip_prefix(src).unwrap();
            let mut module: Module = relative
                .with_extension("")
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            match module.first().map(String::as_str) {
                Some("main" | "bin") => return None,
                Some("lib") if module.len() == 1 => module.clear(),
                _ => {}
            }
            if module.last().is_some_and(|last| last == "mod") {
                module.pop();
            }
            Some((module, std::fs::read_to_string(&file).unwrap()))
        })
        .collect()
}

/// Every module path a file names, resolved to absolute paths (the items' names included).
struct Named<'m> {
    /// The file's module, then the inline modules (`mod tests { … }`) the visit is in.
    at: Module,
    modules: &'m BTreeSet<Module>,
    found: Vec<Module>,
}

impl Named<'_> {
    /// `segments` from the current module; `None` for a path that starts elsewhere (an
    /// extern crate, a local item, a generic), which cannot reach another module of this
    /// crate except through a `use`, which is resolved itself.
    fn resolve(&self, segments: &[String]) -> Option<Module> {
        let (first, rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.at.clone(),
            "super" => {
                let mut base = self.at.clone();
                base.pop()?;
                base
            }
            // A child module named without `self::`.
            _ => {
                let mut child = self.at.clone();
                child.push(first.clone());
                if !self.modules.contains(&child) {
                    return None;
                }
                child
            }
        };
        let mut rest = rest;
        while let Some(("super", tail)) = rest.split_first().map(|(s, t)| (s.as_str(), t)) {
            base.pop()?;
            rest = tail;
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn record(&mut self, segments: &[String]) {
        if let Some(path) = self.resolve(segments) {
            self.found.push(path);
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) if name.ident == "self" => self.record(prefix),
            syn::UseTree::Name(name) => {
                prefix.push(name.ident.to_string());
                self.record(prefix);
                prefix.pop();
            }
            syn::UseTree::Rename(rename) => {
                prefix.push(rename.ident.to_string());
                self.record(prefix);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.record(prefix),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// Paths inside a macro's input (`routes!(crate::api::x)`), which are tokens until the
    /// macro expands: each `crate`, `self` or `super` followed by `::` and names.
    fn tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(group) => self.tokens(group.stream()),
                TokenTree::Ident(ident)
                    if ["crate", "self", "super"].contains(&&*ident.to_string()) =>
                {
                    let mut segments = vec![ident.to_string()];
                    let mut j = i + 1;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segments.push(next.to_string());
                        j += 3;
                    }
                    if segments.len() > 1 {
                        self.record(&segments);
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Named<'_> {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        // `mod x;` declares a child; only an inline module's body is read here.
        if item.content.is_some() {
            self.at.push(item.ident.to_string());
            syn::visit::visit_item_mod(self, item);
            self.at.pop();
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        // `use ::x` names an extern crate.
        if item.leading_colon.is_none() {
            self.use_tree(&mut Vec::new(), &item.tree);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.record(&segments);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        // Doc comments are `Meta::NameValue`: their text names nothing.
        if let syn::Meta::List(list) = &attr.meta {
            self.attribute_strings(list.tokens.clone());
        }
        syn::visit::visit_attribute(self, attr);
    }
}

impl Named<'_> {
    /// Strings in an attribute's input that are paths: `#[serde(with = "crate::x")]`.
    fn attribute_strings(&mut self, tokens: TokenStream) {
        for token in tokens {
            match token {
                TokenTree::Group(group) => self.attribute_strings(group.stream()),
                TokenTree::Literal(literal) => {
                    if let Ok(lit) = syn::parse_str::<syn::LitStr>(&literal.to_string())
                        && let Ok(path) = lit.parse::<syn::Path>()
                    {
                        self.visit_path(&path);
                    }
                }
                _ => {}
            }
        }
    }
}

/// Which modules each module names (the longest module prefix of each path it names).
fn graph(files: &[(Module, String)]) -> BTreeMap<Module, BTreeSet<Module>> {
    let modules: BTreeSet<Module> = files.iter().map(|(m, _)| m.clone()).collect();
    files
        .iter()
        .map(|(module, source)| {
            let file = syn::parse_file(source).unwrap_or_else(|e| panic!("{module:?}: {e}"));
            let mut named = Named {
                at: module.clone(),
                modules: &modules,
                found: Vec::new(),
            };
            named.visit_file(&file);
            let reached = named
                .found
                .into_iter()
                .filter_map(|path| {
                    (0..=path.len())
                        .rev()
                        .map(|n| path[..n].to_vec())
                        .find(|prefix| modules.contains(prefix))
                })
                .collect();
            (module.clone(), reached)
        })
        .collect()
}

fn name(module: &Module) -> String {
    if module.is_empty() {
        "crate".into()
    } else {
        module.join("::")
    }
}

/// Whether one module contains the other (or is it).
fn nested(a: &Module, b: &Module) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The circles of the graph, seen at every depth: between single files (`sessions::relay`
/// and `sessions::tool`), and between whole modules, each with its submodules
/// (`agents`, `approvals` and all of `tools/`). Each is a strongly connected component of
/// more than one module, sorted; edges between a module and its own submodules are left
/// out.
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> BTreeSet<Vec<String>> {
    let deepest = graph.keys().map(Vec::len).max().unwrap_or(0);
    (1..=deepest)
        .flat_map(|depth| {
            let cut = |m: &Module| m[..m.len().min(depth)].to_vec();
            let mut collapsed: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
            for (from, to) in graph {
                let from = cut(from);
                let reached: Vec<Module> =
                    to.iter().map(cut).filter(|t| !nested(&from, t)).collect();
                collapsed.entry(from).or_default().extend(reached);
            }
            components(&collapsed)
        })
        .collect()
}

/// The strongly connected components of more than one module.
fn components(graph: &BTreeMap<Module, BTreeSet<Module>>) -> BTreeSet<Vec<String>> {
    let edges: BTreeMap<&Module, Vec<&Module>> = graph
        .iter()
        .map(|(from, to)| (from, to.iter().collect()))
        .collect();
    // Tarjan's algorithm; the graphs are small enough for recursion.
    struct State<'g> {
        edges: &'g BTreeMap<&'g Module, Vec<&'g Module>>,
        index: BTreeMap<&'g Module, (usize, usize)>,
        stack: Vec<&'g Module>,
        on_stack: BTreeSet<&'g Module>,
        found: BTreeSet<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g Module) {
        let n = s.index.len();
        s.index.insert(v, (n, n));
        s.stack.push(v);
        s.on_stack.insert(v);
        let edges = s.edges;
        for &w in edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.index[w].1.min(s.index[v].1);
                s.index.get_mut(v).unwrap().1 = low;
            } else if s.on_stack.contains(w) {
                let low = s.index[w].0.min(s.index[v].1);
                s.index.get_mut(v).unwrap().1 = low;
            }
        }
        if s.index[v].0 == s.index[v].1 {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(name(w));
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.insert(component);
            }
        }
    }
    let mut state = State {
        edges: &edges,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: BTreeSet::new(),
    };
    for &v in edges.keys() {
        if !state.index.contains_key(v) {
            visit(&mut state, v);
        }
    }
    state.found
}

fn crate_src(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src")
}

/// The modules outside `api/` (the crate root aside) that name `api` or one of its
/// modules.
fn reaching_api(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<String> {
    graph
        .iter()
        .filter(|(from, _)| !from.is_empty() && from[0] != "api")
        .filter(|(_, to)| to.iter().any(|t| t.first().is_some_and(|m| m == "api")))
        .map(|(from, _)| name(from))
        .collect()
}

#[test]
fn nothing_below_the_api_depends_on_it() {
    let files = library(&crate_src("brain"));
    assert!(
        files.len() > 30,
        "the walk found the sources: {}",
        files.len()
    );
    let offenders = reaching_api(&graph(&files));
    assert!(offenders.is_empty(), "these reach into api/: {offenders:?}");
}

/// The crates whose modules must not import in a circle: Cargo holds the layering between
/// crates, not between one crate's modules.
const LAYERED_CRATES: [&str; 6] = [
    "brain",
    "engine",
    "store",
    "domain",
    "providers",
    "scripted-provider",
];

#[test]
fn no_crate_has_import_circles() {
    for krate in LAYERED_CRATES {
        let found = circles(&graph(&library(&crate_src(krate))));
        assert!(
            found.is_empty(),
            "import circles between modules of {krate}: {found:?}"
        );
    }
}

fn module(path: &str) -> Module {
    path.split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn sample(files: &[(&str, &str)]) -> BTreeMap<Module, BTreeSet<Module>> {
    let files: Vec<(Module, String)> = files
        .iter()
        .map(|(m, source)| (module(m), source.to_string()))
        .collect();
    graph(&files)
}

#[test]
fn the_check_sees_every_spelling_of_a_path_into_api() {
    let reaches = |source: &str| {
        let graph = sample(&[
            ("", ""),
            ("api", ""),
            ("api::x", ""),
            ("turn", ""),
            ("turn::stop", source),
        ]);
        !reaching_api(&graph).is_empty()
    };
    assert!(reaches("use crate::api::JsonBody;"));
    assert!(reaches("use crate::{AppState, api, store};"));
    assert!(reaches(
        "use crate::{\n    store,\n    api::{\n        self,\n    },\n};"
    ));
    assert!(reaches("use super::super::api::x::Y;"));
    assert!(reaches("fn f() { crate :: api :: router(); }"));
    assert!(reaches("fn f() -> crate::api::x::Body { todo() }"));
    assert!(reaches("fn f() { routes!(crate::api::x::get); }"));
    assert!(reaches(
        "#[derive(Deserialize)] struct S { #[serde(with = \"crate::api::x\")] a: u8 }"
    ));
    assert!(reaches("mod tests { use super::super::super::api; }"));
    assert!(!reaches(
        "use crate::{AppState, store};\nfn f() { let api_key = 1; }"
    ));
    assert!(!reaches(
        "// crate::api\n/// [`crate::api`]\nconst S: &str = \"use crate::api\";"
    ));
}

#[test]
fn the_check_finds_circles_of_any_length_and_spelling() {
    let found = circles(&sample(&[
        ("", ""),
        ("agents", "use crate::approvals::ApprovalPolicy;"),
        ("approvals", "use crate::{tools::{RiskClass, Tool}};"),
        ("tools", ""),
        ("tools::cron", "fn f() { crate::agents::validate(); }"),
        ("sessions", "use relay::X;"),
        ("sessions::relay", "use super::tool::{Files, call_worker};"),
        ("sessions::tool", "use super::{Sessions, relay};"),
        (
            "metrics",
            "fn f() { for r in crate::intake::Refused::ALL {} }",
        ),
        ("intake", "use crate::metrics::Metrics;"),
    ]));
    let expected: BTreeSet<Vec<String>> = [
        vec!["agents", "approvals", "tools"],
        vec!["intake", "metrics"],
        vec!["sessions::relay", "sessions::tool"],
    ]
    .into_iter()
    .map(|c| c.into_iter().map(str::to_owned).collect())
    .collect();
    assert_eq!(found, expected);
    // A module and its own submodules name each other without making a circle.
    assert!(
        circles(&sample(&[
            ("", "use sessions::Sessions;"),
            ("sessions", "use tool::worker_tools;"),
            ("sessions::tool", "use crate::sessions::Sessions;"),
        ]))
        .is_empty()
    );
}

/// The crate root's module doc is the brain's map: every module it declares is on it.
#[test]
fn the_crate_map_names_every_module() {
    for krate in ["brain", "engine"] {
        let root = std::fs::read_to_string(crate_src(krate).join("lib.rs")).unwrap();
        let map: String = root
            .lines()
            .filter_map(|line| line.strip_prefix("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        let missing: Vec<&str> = root
            .lines()
            .filter_map(|line| line.strip_prefix("pub mod "))
            .map(|rest| rest.trim_end_matches(';'))
            .filter(|module| {
                !map.contains(&format!("`{module}/`")) && !map.contains(&format!("`{module}.rs`"))
            })
            .collect();
        assert!(
            missing.is_empty(),
            "{krate}/src/lib.rs's map omits {missing:?}"
        );
    }
}

/// The engine answers typed errors and streams; only the service maps them to HTTP. Cargo
/// keeps it from naming the service; this keeps an HTTP server out of its manifest and
/// its code (a client's `reqwest::StatusCode` aside).
#[test]
fn the_engine_speaks_no_http() {
    let manifest = std::fs::read_to_string(crate_src("engine").join("../Cargo.toml")).unwrap();
    let servers: Vec<&str> = manifest
        .lines()
        .filter(|line| line.starts_with("axum") || line.starts_with("utoipa-axum"))
        .collect();
    assert!(servers.is_empty(), "the engine depends on {servers:?}");
    let mut files = Vec::new();
    sources(&crate_src("engine"), &mut files).unwrap();
    assert!(
        files.len() > 50,
        "the walk found the engine: {}",
        files.len()
    );
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| {
            let source = std::fs::read_to_string(f).unwrap();
            // Code only: the docs may say where the mapping is.
            source
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .map(|line| line.replace("reqwest::StatusCode", ""))
                .any(|line| {
                    [
                        "IntoResponse",
                        "StatusCode",
                        "axum::",
                        "AppState",
                        "ApiError",
                    ]
                    .iter()
                    .any(|word| line.contains(word))
                })
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "these speak HTTP: {offenders:?}");
}

/// House rule: no production function runs over this many lines, from `fn` to its closing
/// brace. Past it a function holds several phases, and each wants a name of its own.
const MAX_FN_LINES: usize = 100;

/// Test code: `#[cfg(test)]`, or a test attribute (`#[test]`, `#[tokio::test]`).
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let path = attr.path();
        path.segments.last().is_some_and(|s| s.ident == "test")
            || (path.is_ident("cfg")
                && attr
                    .parse_args::<syn::Meta>()
                    .is_ok_and(|meta| meta.path().is_ident("test")))
    })
}

/// The functions over [`MAX_FN_LINES`]: free ones, methods of impls and traits, in
/// modules or in other functions; test code aside.
#[derive(Default)]
struct LongFunctions {
    /// The type whose impl is being read, to name its methods `Type::method`.
    owner: Option<String>,
    found: Vec<String>,
}

impl LongFunctions {
    fn check(&mut self, sig: &syn::Signature, body: &syn::Block) {
        let start = sig.fn_token.span.start().line;
        let lines = body.brace_token.span.close().end().line - start + 1;
        if lines > MAX_FN_LINES {
            let name = match &self.owner {
                Some(owner) => format!("{owner}::{}", sig.ident),
                None => sig.ident.to_string(),
            };
            self.found
                .push(format!("{name} ({lines} lines from line {start})"));
        }
    }
}

impl<'ast> Visit<'ast> for LongFunctions {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !is_test(&item.attrs) {
            syn::visit::visit_item_mod(self, item);
        }
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_test(&item.attrs) {
            self.check(&item.sig, &item.block);
            // A function's own items (a helper fn inside it) are code too.
            let owner = self.owner.take();
            syn::visit::visit_item_fn(self, item);
            self.owner = owner;
        }
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if is_test(&item.attrs) {
            return;
        }
        let owner = match &*item.self_ty {
            syn::Type::Path(path) => path.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        let outer = std::mem::replace(&mut self.owner, owner);
        syn::visit::visit_item_impl(self, item);
        self.owner = outer;
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !is_test(&item.attrs) {
            self.check(&item.sig, &item.block);
            syn::visit::visit_impl_item_fn(self, item);
        }
    }

    fn visit_item_trait(&mut self, item: &'ast syn::ItemTrait) {
        let outer = self.owner.replace(item.ident.to_string());
        syn::visit::visit_item_trait(self, item);
        self.owner = outer;
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if let Some(body) = &item.default
            && !is_test(&item.attrs)
        {
            self.check(&item.sig, body);
        }
        syn::visit::visit_trait_item_fn(self, item);
    }
}

fn long_functions(source: &str) -> Vec<String> {
    let mut finder = LongFunctions::default();
    finder.visit_file(&syn::parse_file(source).unwrap());
    finder.found
}

/// Every workspace crate's sources (`<crate>/src`), test modules kept in files of their own
/// (`tests.rs`, `tests/`) aside.
fn workspace_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
            sources(&dir.join("src"), &mut files).unwrap();
        }
    }
    files.retain(|file| {
        !file
            .iter()
            .any(|part| part == "tests" || part == "tests.rs")
    });
    files
}

#[test]
fn no_production_function_is_over_100_lines() {
    let files = workspace_sources();
    for krate in ["brain", "engine", "store", "providers", "bench", "worker"] {
        assert!(
            files
                .iter()
                .any(|f| f.components().any(|c| c.as_os_str() == krate)),
            "the walk found {krate}"
        );
    }
    let mut offenders = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap();
        for found in long_functions(&source) {
            offenders.push(format!("{}: {found}", file.display()));
        }
    }
    assert!(
        offenders.is_empty(),
        "split these into phases of their own: {offenders:#?}"
    );
}

#[test]
fn the_length_check_counts_from_fn_to_the_closing_brace() {
    let function = |name: &str, lines: usize| {
        let body = "    step();\n".repeat(lines - 2);
        format!("fn {name}() {{\n{body}}}\n")
    };
    assert!(long_functions(&function("fits", 100)).is_empty());
    assert_eq!(
        long_functions(&function("long", 101)),
        ["long (101 lines from line 1)"]
    );
    let method = format!(
        "mod m {{ impl S {{\n{}}} }}\ntrait T {{\n{}}}",
        function("method", 101),
        function("provided", 101)
    );
    assert_eq!(
        long_functions(&method),
        [
            "S::method (101 lines from line 2)",
            "T::provided (101 lines from line 105)"
        ]
    );
    let tests = format!(
        "#[cfg(test)]\nmod tests {{\n{}}}\n#[test]\n{}",
        function("in_tests", 101),
        function("a_test", 101)
    );
    assert!(long_functions(&tests).is_empty());
}

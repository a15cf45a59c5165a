//! The docs a newcomer reads stay in step with the code:
//!
//! - every requirement id a comment cites is defined in `docs/requirements.md`;
//! - every environment variable the code reads is documented in `docs/CONFIGURATION.md`,
//!   and every variable documented there is read somewhere;
//! - `README.md` stays a front page (at most 16 KB; the detail lives under `docs/`) and
//!   `docs/ARCHITECTURE.md` a map (at most 30 KB; the explanations live in `docs/design/`),
//!   every relative link of the README and of a page under `docs/` names a file that
//!   exists, and every test the architecture pages cite as `module::test_name` is a
//!   function of a file `module.rs` or `module/mod.rs`.
//!
//! The code checks walk the workspace's `*.rs` files (skipping `target`, `node_modules` and hidden
//! directories such as `.git`), so they need no build of the crates they look at. They
//! live here because `envcfg` is the cheapest crate to build.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The workspace root: the parent of this crate's directory.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("envcfg sits in the workspace root")
        .to_path_buf()
}

/// Every `*.rs` file of the workspace, as (path relative to the root, text), sorted.
fn rust_files() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "target" && name != "node_modules" && !name.starts_with('.') {
                    walk(&path, out);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(&root(), &mut paths);
    with_texts(paths)
}

/// Each file as (path relative to the workspace root, with `/`, and its text).
fn with_texts(paths: Vec<PathBuf>) -> Vec<(String, String)> {
    let root = root();
    paths
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            (rel, fs::read_to_string(&p).unwrap())
        })
        .collect()
}

fn read_doc(name: &str) -> String {
    fs::read_to_string(root().join("docs").join(name))
        .unwrap_or_else(|e| panic!("docs/{name}: {e}"))
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

// ---------------------------------------------------------------------------------------
// Requirement ids
// ---------------------------------------------------------------------------------------

/// The id families: the SPEC's (T, S, W, R, A, M, B, E, X, O) and those added since
/// (D, P, L). An id is a family letter and a number from 1 to 99 without a leading
/// zero, standing alone (`T8`, `(W11)`, `SPEC X4:`; not `T09:00`, `S3Store`, `IpAddr::V4`).
const FAMILIES: &[char] = &[
    'T', 'S', 'W', 'R', 'A', 'M', 'B', 'E', 'X', 'O', 'D', 'P', 'L',
];

/// The comment of a line: what follows the first `//` outside a string literal (a line
/// with an even number of unescaped `"` before it), or `None`.
fn comment_of(line: &str) -> Option<&str> {
    let bytes = line.as_bytes();
    let mut in_string = false;
    let mut i = 0;
    while i + 1 < bytes.len() {
        match bytes[i] {
            b'\\' if in_string => i += 1,
            b'"' => in_string = !in_string,
            b'/' if !in_string && bytes[i + 1] == b'/' => return Some(&line[i + 2..]),
            _ => {}
        }
        i += 1;
    }
    None
}

/// The ids a comment cites. A range (`T5-T9`, `W6–9`) cites every id in it.
fn cited_ids(comment: &str) -> Vec<String> {
    let chars: Vec<char> = comment.chars().collect();
    let number_at = |start: usize| -> Option<(u32, usize)> {
        let mut end = start;
        while end < chars.len() && chars[end].is_ascii_digit() {
            end += 1;
        }
        let digits: String = chars[start..end].iter().collect();
        let ok = (1..=2).contains(&digits.len())
            && !digits.starts_with('0')
            && chars.get(end).is_none_or(|c| !is_word(*c));
        ok.then(|| (digits.parse().unwrap(), end))
    };
    let mut ids = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let starts_word = i == 0 || !is_word(chars[i - 1]);
        if starts_word
            && FAMILIES.contains(&c)
            && let Some((first, end)) = number_at(i + 1)
        {
            let mut last = first;
            let mut next = end;
            // A range: `-` or `–`, the same letter (optional), a larger number.
            if matches!(chars.get(end), Some('-' | '–')) {
                let mut j = end + 1;
                if chars.get(j) == Some(&c) {
                    j += 1;
                }
                if let Some((upper, after)) = number_at(j)
                    && upper > first
                {
                    last = upper;
                    next = after;
                }
            }
            ids.extend((first..=last).map(|n| format!("{c}{n}")));
            i = next;
            continue;
        }
        i += 1;
    }
    ids
}

/// The ids `docs/requirements.md` defines: each on a line of its own, `- **T8** — …`.
fn defined_ids(doc: &str) -> BTreeSet<String> {
    doc.lines()
        .filter_map(|line| line.strip_prefix("- **")?.split_once("**"))
        .map(|(id, _)| id.to_owned())
        .collect()
}

/// Every id a comment in the workspace's Rust cites, with the first place citing it.
fn ids_cited_in_code() -> BTreeMap<String, String> {
    let mut cited = BTreeMap::new();
    for (path, text) in rust_files() {
        for (n, line) in text.lines().enumerate() {
            let Some(comment) = comment_of(line) else {
                continue;
            };
            for id in cited_ids(comment) {
                cited
                    .entry(id)
                    .or_insert_with(|| format!("{path}:{}", n + 1));
            }
        }
    }
    cited
}

#[test]
fn the_citation_pattern_finds_ids_and_nothing_else() {
    assert_eq!(
        cited_ids(" SPEC W11, (T8) and X4: see T5-T9 and W6–7"),
        ["W11", "T8", "X4", "T5", "T6", "T7", "T8", "T9", "W6", "W7"]
    );
    assert!(cited_ids(" at T09:00 on S3Store, IpAddr::V4, `T0`, T100, Q3, AT8").is_empty());
    assert_eq!(comment_of(r#"let u = "http://x"; // T8"#), Some(" T8"));
    assert_eq!(comment_of(r#"let u = "a\"//b";"#), None);
}

/// Fails when a comment cites a requirement id (`SPEC W11`, `(T8)`, `X4:`) that
/// `docs/requirements.md` does not define.
#[test]
fn every_requirement_id_the_code_cites_is_defined() {
    let defined = defined_ids(&read_doc("requirements.md"));
    assert!(
        defined.len() > 40,
        "found only {defined:?} in docs/requirements.md"
    );
    let cited = ids_cited_in_code();
    let missing: Vec<String> = cited
        .iter()
        .filter(|(id, _)| !defined.contains(*id))
        .map(|(id, at)| format!("{id} (cited at {at})"))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/requirements.md does not define: {}",
        missing.join(", ")
    );
}

// ---------------------------------------------------------------------------------------
// Environment variables
// ---------------------------------------------------------------------------------------

/// Crates whose `src/` is a harness, not the product: the benchmark (its variables are in
/// docs/PERFORMANCE.md) and the tests' shared support.
const HARNESS_CRATES: &[&str] = &["bench/", "test-support/"];

/// Names in production code that the code does not read as configuration.
const NOT_CONFIGURATION: &[(&str, &str)] = &[
    // Chromium's own directories: set for the browser child, never read.
    ("XDG_CONFIG_HOME", "set for Chromium"),
    ("XDG_CACHE_HOME", "set for Chromium"),
    // Passed on, unread, to a stdio connector's child (like PATH, HOME, LANG, TZ, TMPDIR).
    ("LC_ALL", "passed to stdio connectors"),
    // Cargo's, at compile time: where a build script left the migrations' list.
    ("OUT_DIR", "set by Cargo for the build"),
];

/// Production files whose variable-like names are not reads at all.
const NOT_READS: &[(&str, &str)] = &[
    (
        "protocol/src/env.rs",
        "the names an agent secret may not take",
    ),
    ("brain/src/agui/events.rs", "the AG-UI event types' case"),
    (
        "brain/src/a2a/wire.rs",
        "A2A's protobuf enum values (`TASK_STATE_…`, `ROLE_…`)",
    ),
];

fn is_var_name(s: &str, single_word: bool) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && (single_word || s.contains('_'))
        && !s.ends_with('_')
}

/// The string literals of a text (no raw strings; escapes skipped).
fn string_literals(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let raw_start = bytes[i] == b'r' && (i == 0 || !is_word(bytes[i - 1] as char));
        let hashes = bytes[i + 1..].iter().take_while(|b| **b == b'#').count();
        if raw_start && bytes.get(i + 1 + hashes) == Some(&b'"') {
            // A raw string: up to a `"` followed by as many `#`.
            let start = i + 2 + hashes;
            let close = format!("\"{}", "#".repeat(hashes));
            let end = text[start..].find(&close).map_or(text.len(), |e| start + e);
            out.push((i, text[start..end].to_owned()));
            i = end + close.len();
        } else if bytes[i] == b'"' {
            let start = i + 1;
            let mut j = start;
            while j < bytes.len() && bytes[j] != b'"' {
                if bytes[j] == b'\\' {
                    j += 1;
                }
                j += 1;
            }
            let end = j.min(bytes.len());
            out.push((i, text[start..end].to_owned()));
            i = end + 1;
        } else if bytes[i] == b'\'' && bytes.get(i + 2) == Some(&b'\'') {
            i += 3; // a char literal like '"'
        } else if bytes[i] == b'\''
            && bytes.get(i + 1) == Some(&b'\\')
            && bytes.get(i + 3) == Some(&b'\'')
        {
            i += 4; // an escaped one like '\"'
        } else if bytes[i] == b'/' && bytes.get(i + 1) == Some(&b'/') {
            // A comment: skip to the end of the line.
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Names given to `std::env::var(…)` / `var_os(…)` as a literal, single words included.
fn direct_reads(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, lit) in string_literals(text) {
        let before = text[..at].trim_end();
        if (before.ends_with("env::var(") || before.ends_with("var_os(")) && is_var_name(&lit, true)
        {
            out.insert(lit);
        }
    }
    out
}

/// The variables the product's code reads, each with a file that reads it. What counts:
/// in the `src/` of every crate but the harnesses ([`HARNESS_CRATES`]), before the file's
/// first `#[cfg(test)]` line, a string literal that looks like a variable name with an
/// underscore (`"BRAIN_ADDR"`: given to `envcfg`'s helpers, to `Env::get`, to
/// `logging::init`, or named in a table of names like the quota fields), or any name given
/// to `std::env::var`/`var_os` as a literal (`HOSTNAME`). Not counted: `CARGO_*` (Cargo's
/// compile-time `env!`), names only set for or passed on to child processes
/// ([`NOT_CONFIGURATION`]; the worker variables the launchers set are counted anyway,
/// since the worker reads them), files that only list names ([`NOT_READS`]), and
/// whatever tests, `tests/` directories and the harnesses read or set.
fn vars_read_by_product() -> BTreeMap<String, String> {
    let mut read = BTreeMap::new();
    for (path, text) in rust_files() {
        if !path.contains("/src/")
            || HARNESS_CRATES.iter().any(|c| path.starts_with(c))
            || NOT_READS.iter().any(|(p, _)| *p == path)
        {
            continue;
        }
        let product: String = text
            .lines()
            .take_while(|l| !l.starts_with("#[cfg(test)]"))
            .collect::<Vec<_>>()
            .join("\n");
        let names = string_literals(&product)
            .into_iter()
            .map(|(_, lit)| lit)
            .filter(|lit| is_var_name(lit, false))
            .chain(direct_reads(&product));
        for name in names {
            if name.starts_with("CARGO_") || NOT_CONFIGURATION.iter().any(|(n, _)| *n == name) {
                continue;
            }
            read.entry(name).or_insert_with(|| path.clone());
        }
    }
    read
}

/// The variables anything in the workspace reads from its own process environment through
/// `std::env::var`/`var_os` with a literal name: tests and harnesses included.
fn vars_read_anywhere() -> BTreeSet<String> {
    rust_files()
        .iter()
        .flat_map(|(_, text)| direct_reads(text))
        .collect()
}

/// The variables `docs/CONFIGURATION.md` documents: the names in backticks in the first
/// cell of a table row (`| \`A\`, \`B\` | …`; `…_TRACES_TIMEOUT`-style abbreviations are
/// not names), and those opening a bullet of "Read, but not configuration".
fn documented_vars(doc: &str) -> BTreeSet<String> {
    let backticked = |s: &str| -> Vec<String> {
        s.split('`')
            .skip(1)
            .step_by(2)
            .filter(|t| is_var_name(t, true))
            .map(str::to_owned)
            .collect()
    };
    let mut out = BTreeSet::new();
    let mut section = "";
    for line in doc.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            section = title;
        } else if let Some(row) = line.strip_prefix('|') {
            let first = row.split('|').next().unwrap_or("");
            out.extend(backticked(first));
        } else if section == "Read, but not configuration"
            && let Some(rest) = line.strip_prefix("- `")
        {
            out.extend(backticked(&format!("`{rest}")).into_iter().take(1));
        }
    }
    out
}

/// Fails when the product reads a variable docs/CONFIGURATION.md does not document, or
/// the doc documents one nothing reads.
///
/// "Read by the product" is [`vars_read_by_product`]. A documented variable is "read" when
/// the product reads it, or when anything (a test, the test harness, a test-only binary)
/// reads it with `std::env::var`, as the doc's "Tests" table documents. The `OTEL_*`
/// variables are exempt from the second direction only: the OpenTelemetry SDK reads them
/// (the exporter and the batch processor), not our code, as the doc's "Traces" section says.
#[test]
fn configuration_md_documents_exactly_the_variables_the_code_reads() {
    let documented = documented_vars(&read_doc("CONFIGURATION.md"));
    assert!(
        documented.contains("BRAIN_ADDR") && documented.contains("HOSTNAME"),
        "the table parser found {documented:?}"
    );
    let read = vars_read_by_product();
    assert!(
        read.contains_key("BRAIN_JWT_ISSUER") && read.contains_key("WORKER_LOG"),
        "the code scanner found {read:?}"
    );
    let undocumented: Vec<String> = read
        .iter()
        .filter(|(name, _)| !documented.contains(*name))
        .map(|(name, path)| format!("{name} (read in {path})"))
        .collect();
    let anywhere = vars_read_anywhere();
    let unread: Vec<&String> = documented
        .iter()
        .filter(|name| {
            !read.contains_key(*name) && !anywhere.contains(*name) && !name.starts_with("OTEL_")
        })
        .collect();
    assert!(
        undocumented.is_empty() && unread.is_empty(),
        "docs/CONFIGURATION.md misses {undocumented:?} and documents {unread:?}, which nothing reads"
    );
}

#[test]
fn the_variable_scanners_see_what_they_should() {
    let text = r##"
        let a = ranged(env, "BRAIN_A_MS", 1, 1, 2)?; // "NOT_A_READ"
        let b = std::env::var("HOSTNAME");
        let c = "lowercase_name";
        let d = '"'; let e = "ESCAPED_\"NAME"; let f = '\"';
        let g = r#"{"RAW_NAME": 1}"#; let h = "AFTER_RAW";
    "##;
    let lits: Vec<String> = string_literals(text)
        .into_iter()
        .map(|(_, l)| l)
        .filter(|l| is_var_name(l, false))
        .collect();
    assert_eq!(lits, ["BRAIN_A_MS", "AFTER_RAW"]);
    assert_eq!(direct_reads(text), BTreeSet::from(["HOSTNAME".to_owned()]));
    let doc = "| `A_B`, `…_C` | x |\n## Read, but not configuration\n- `HOSTNAME` names `X_Y`\n";
    assert_eq!(
        documented_vars(doc),
        BTreeSet::from(["A_B".to_owned(), "HOSTNAME".to_owned()])
    );
}

// ---------------------------------------------------------------------------------------
// The architecture map and the links between the docs
// ---------------------------------------------------------------------------------------

/// Every Markdown page under `docs/`, as (path relative to the root, text), sorted.
fn doc_pages() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(&root().join("docs"), &mut paths);
    paths.sort();
    with_texts(paths)
}

/// The targets of the Markdown links `[text](target)` of a page, outside fenced code.
fn link_targets(page: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut fenced = false;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    targets
}

/// Whether a link target points inside the repository (not a URL, not an anchor alone).
fn is_relative(target: &str) -> bool {
    !(target.is_empty()
        || target.starts_with('#')
        || target.contains("://")
        || target.starts_with("mailto:"))
}

/// The backticked `module::test_name` citations of a page whose name has at least two
/// underscores, the shape of a test's name (`turn::start` or `store::bounded` are not).
fn cited_tests(page: &str) -> BTreeSet<(String, String)> {
    page.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|code| code.split_once("::"))
        .filter(|(module, name)| {
            let words = |s: &str| {
                !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            };
            words(module) && words(name) && name.matches('_').count() >= 2
        })
        .map(|(module, name)| (module.to_owned(), name.to_owned()))
        .collect()
}

#[test]
fn architecture_md_is_a_map_of_at_most_30_kb() {
    let size = read_doc("ARCHITECTURE.md").len();
    assert!(
        size <= 30 * 1024,
        "docs/ARCHITECTURE.md is {size} bytes, over 30 KB: move the explanation into docs/design/ \
         and leave a line and a link"
    );
}

#[test]
fn readme_is_a_front_page_of_at_most_16_kb() {
    let size = fs::read_to_string(root().join("README.md")).unwrap().len();
    assert!(
        size <= 16 * 1024,
        "README.md is {size} bytes, over 16 KB: move the detail into a page under docs/ \
         and leave a line and a link"
    );
}

#[test]
fn every_relative_link_in_docs_names_a_file_that_exists() {
    let root = root();
    let mut pages = doc_pages();
    pages.extend(with_texts(vec![root.join("README.md")]));
    assert!(
        pages.len() > 10,
        "the walk found the pages: {}",
        pages.len()
    );
    let mut broken = Vec::new();
    for (page, text) in &pages {
        let dir = root.join(page).parent().unwrap().to_path_buf();
        for target in link_targets(text).into_iter().filter(|t| is_relative(t)) {
            let file = target.split('#').next().unwrap();
            if !dir.join(file).exists() {
                broken.push(format!("{page}: {target}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links to nothing:\n{}",
        broken.join("\n")
    );
}

#[test]
fn every_test_the_architecture_pages_cite_exists() {
    let files = rust_files();
    let pages: Vec<(String, String)> = doc_pages()
        .into_iter()
        .filter(|(page, _)| page == "docs/ARCHITECTURE.md" || page.starts_with("docs/design/"))
        .collect();
    let mut missing = Vec::new();
    let mut cited = 0;
    for (page, text) in &pages {
        for (module, name) in cited_tests(text) {
            cited += 1;
            let stems = [format!("/{module}.rs"), format!("/{module}/mod.rs")];
            let found = files.iter().any(|(path, source)| {
                stems
                    .iter()
                    .any(|stem| format!("/{path}").ends_with(stem.as_str()))
                    && source.contains(&format!("fn {name}("))
            });
            if !found {
                missing.push(format!("{page}: {module}::{name}"));
            }
        }
    }
    assert!(cited > 100, "the citations were found: {cited}");
    assert!(
        missing.is_empty(),
        "cited tests that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_link_and_citation_scanners_see_what_they_should() {
    let page =
        "See [a](design/a.md#x), [b](https://x.y) and [c](#here).\n```\n[d](nowhere.md)\n```\n";
    let targets = link_targets(page);
    assert_eq!(targets, ["design/a.md#x", "https://x.y", "#here"]);
    let relative: Vec<_> = targets.iter().filter(|t| is_relative(t)).collect();
    assert_eq!(relative, ["design/a.md#x"]);
    let cited = cited_tests(
        "`turn::start`, `faults::a_cut_postgres_fails`, `Store::fail_the_turn`, `a::b::c_d_e`",
    );
    assert_eq!(
        cited.into_iter().collect::<Vec<_>>(),
        [("faults".to_owned(), "a_cut_postgres_fails".to_owned())]
    );
}

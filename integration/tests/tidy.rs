//! Rules of the tree that a review would otherwise have to remember:
//! which crate may depend on which (ARCHITECTURE.md's "Architecture
//! invariant" lines), and a `//!` doc at the top of every Rust file.
//! Dependencies are read from each member's Cargo.toml, every section
//! (normal, dev, build), so a test-only edge counts too.
//!
//! Within a crate: no cycle among sibling modules, node's modules only
//! using their own layer or lower ones ([`NODE_LAYERS`]), and no crate
//! but storage naming `storage::apply`. These read the sources as text
//! (see the section "Modules" below); `self_tests` feeds that reading
//! synthetic crates to show each check bites.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's own crates, by folder.
const MEMBERS: [&str; 8] = [
    "wire",
    "storage",
    "config",
    "transport",
    "node",
    "agent",
    "integration",
    "integration/k8s-sim",
];

/// Dependency sections of a Cargo.toml.
const SECTIONS: [&str; 3] = ["dependencies", "dev-dependencies", "build-dependencies"];

/// For each crate, the workspace crates it may depend on (any section).
/// Everything else of the workspace is forbidden.
fn allowed() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    BTreeMap::from([
        // The leaves: messages and framing, config files.
        ("wire", BTreeSet::new()),
        ("config", BTreeSet::new()),
        ("storage", BTreeSet::from(["wire"])),
        ("transport", BTreeSet::from(["wire"])),
        // The simulator knows nothing of the product.
        ("k8s-sim", BTreeSet::new()),
        // ctrl and krane never depend on each other, nor on the harness;
        // krane does not link ctrl's storage.
        (
            "node",
            BTreeSet::from(["wire", "storage", "config", "transport"]),
        ),
        ("agent", BTreeSet::from(["wire", "config", "transport"])),
        (
            "integration",
            BTreeSet::from([
                "wire",
                "storage",
                "config",
                "transport",
                "node",
                "agent",
                "k8s-sim",
            ]),
        ),
    ])
}

/// External crates a crate must not depend on in any section.
fn forbidden_external() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    BTreeMap::from([
        // wire is sans-I/O: the async frame helpers live in transport.
        ("wire", BTreeSet::from(["tokio", "quinn"])),
        ("storage", BTreeSet::from(["tokio", "quinn", "openraft"])),
        ("config", BTreeSet::from(["tokio", "quinn"])),
    ])
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// A member's package name and every dependency it names.
fn manifest(member: &str) -> Option<(String, BTreeSet<String>)> {
    let path = root().join(member).join("Cargo.toml");
    let text = std::fs::read_to_string(&path).ok()?;
    let manifest: toml::Table =
        toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let name = manifest["package"]["name"]
        .as_str()
        .expect("package.name")
        .to_string();
    let mut deps = BTreeSet::new();
    for section in SECTIONS {
        if let Some(table) = manifest.get(section).and_then(|v| v.as_table()) {
            deps.extend(table.keys().cloned());
        }
    }
    Some((name, deps))
}

#[test]
fn crates_depend_only_along_the_allowed_edges() {
    let allowed = allowed();
    let forbidden = forbidden_external();
    let workspace: BTreeSet<&str> = allowed.keys().copied().collect();
    let mut violations = Vec::new();
    let mut seen = 0;
    for member in MEMBERS {
        let Some((name, deps)) = manifest(member) else {
            continue;
        };
        seen += 1;
        let Some(may) = allowed.get(name.as_str()) else {
            violations.push(format!(
                "{name}: a crate this test does not know; add its rule"
            ));
            continue;
        };
        for dep in &deps {
            // A crate may dev-depend on itself to turn on a test feature
            // (wire's `golden`).
            if *dep == name {
                continue;
            }
            if workspace.contains(dep.as_str()) && !may.contains(dep.as_str()) {
                violations.push(format!("{name} depends on {dep}"));
            }
            if forbidden
                .get(name.as_str())
                .is_some_and(|f| f.contains(dep.as_str()))
            {
                violations.push(format!("{name} depends on {dep} (forbidden external)"));
            }
        }
    }
    assert!(seen >= 7, "found only {seen} member manifests");
    assert!(
        violations.is_empty(),
        "edges ARCHITECTURE.md forbids:\n{}",
        violations.join("\n")
    );
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_rust_file_opens_with_its_module_doc() {
    let mut files = Vec::new();
    for member in MEMBERS {
        for dir in ["src", "tests", "benches"] {
            rust_files(&root().join(member).join(dir), &mut files);
        }
    }
    assert!(files.len() > 100, "found only {} Rust files", files.len());
    let undocumented: Vec<String> = files
        .iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            !text.trim_start().starts_with("//!")
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(
        undocumented.is_empty(),
        "files without a `//!` module doc:\n{}",
        undocumented.join("\n")
    );
}

// ---------------------------------------------------------------------
// Modules: no cycles between the modules of a crate, node's layers, and
// storage's `apply` kept to storage. A text scan, not a parser: comments
// and literals are blanked, then `crate::`, `super::` and `self::` paths
// (grouped imports expanded) are read off the tokens. The functions below
// work on sources in memory, so the self-tests at the end feed them
// synthetic crates.

/// node's layers, top first. This mirrors the list in node/src/lib.rs's
/// `//!` doc; keep the two in step. A top-level module may use modules of
/// its own layer or of a lower one, never of a higher one (a cycle within
/// a layer is the cycle check's). Every top-level module of node must be
/// here, so a new module forces a decision. Modules lib.rs places beside
/// the layers sit where their uses put them, as commented.
const NODE_LAYERS: &[&[&str]] = &[
    // For the CLI: the ctrl binary's commands (main.rs, which reaches the
    // library as `node::`), the operator client, `deploy --wait`.
    &["cli", "client", "wait"],
    &["boot"],
    &["server", "jobs"],
    &["replica"],
    // metrics: read by boot and server, and replica counts into it;
    // backup: used by server, jobs and the client.
    &["app", "workflow", "notify", "metrics", "backup"],
    &["raft", "runtime", "clock"],
];

/// A token of Rust source: an identifier, `::`, or one other character.
#[derive(Debug, Clone, PartialEq)]
struct Token {
    text: String,
    line: usize,
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` with every comment, string and character literal replaced by
/// spaces (newlines kept, so lines still count).
fn mask(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let word_start = |i: usize| i == 0 || !is_ident_char(chars[i - 1]);
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        // A char literal opens at a `'` that starts a word (or follows a
        // lone `b`); a lifetime or label has no closing `'` two on.
        let char_start = c == '\'' && (word_start(i) || (chars[i - 1] == 'b' && word_start(i - 1)));
        let literal_end = if c == '/' && next == Some('/') {
            Some(
                (i..chars.len())
                    .find(|&j| chars[j] == '\n')
                    .unwrap_or(chars.len()),
            )
        } else if c == '/' && next == Some('*') {
            Some(block_comment_end(&chars, i))
        } else if let Some(end) = raw_string_end(&chars, i) {
            Some(end)
        } else if c == '"' {
            Some(quoted_end(&chars, i, '"'))
        } else if char_start && next == Some('\\') {
            Some(quoted_end(&chars, i, '\''))
        } else if char_start && chars.get(i + 2) == Some(&'\'') {
            Some(i + 3)
        } else {
            None
        };
        match literal_end {
            Some(end) => {
                out.extend(
                    chars[i..end]
                        .iter()
                        .map(|&c| if c == '\n' { c } else { ' ' }),
                );
                i = end;
            }
            None => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// The end (exclusive) of the (nested) block comment opening at `start`.
fn block_comment_end(chars: &[char], start: usize) -> usize {
    let mut depth = 0;
    let mut i = start;
    while i < chars.len() {
        if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    chars.len()
}

/// The end (exclusive) of the literal opening with `quote` at `start`,
/// backslash escapes skipped.
fn quoted_end(chars: &[char], start: usize, quote: char) -> usize {
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

/// The end (exclusive) of a raw string (`r"…"`, `br#"…"#`, `cr"…"`)
/// starting at `start`, if one starts there.
fn raw_string_end(chars: &[char], start: usize) -> Option<usize> {
    let word_start = start == 0 || !is_ident_char(chars[start - 1]);
    let r = match chars[start] {
        'r' if word_start => start,
        'b' | 'c' if word_start && chars.get(start + 1) == Some(&'r') => start + 1,
        _ => return None,
    };
    let hashes = chars[r + 1..].iter().take_while(|&&c| c == '#').count();
    let open = r + 1 + hashes;
    if chars.get(open) != Some(&'"') {
        return None;
    }
    let mut i = open + 1;
    while i < chars.len() {
        if chars[i] == '"' && chars[i + 1..].iter().take_while(|&&c| c == '#').count() >= hashes {
            return Some(i + 1 + hashes);
        }
        i += 1;
    }
    Some(chars.len())
}

/// The tokens of masked source: identifiers (`r#` dropped), numbers, `::`
/// and single characters, each with its line.
fn tokens(masked: &str) -> Vec<Token> {
    let chars: Vec<char> = masked.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if is_ident_char(c) {
            let mut start = i;
            if c == 'r'
                && chars.get(i + 1) == Some(&'#')
                && chars.get(i + 2).is_some_and(|&c| is_ident_char(c))
            {
                start = i + 2;
            }
            let mut end = start;
            while end < chars.len() && is_ident_char(chars[end]) {
                end += 1;
            }
            out.push(Token {
                text: chars[start..end].iter().collect(),
                line,
            });
            i = end;
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push(Token {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    out
}

fn is_ident(token: &Token) -> bool {
    token
        .text
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// The index after the bracket group opening at `open` (`(`, `[` or `{`).
fn group_end(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, token) in tokens.iter().enumerate().skip(open) {
        match token.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// What `#[cfg(test)]` items leave: the tokens of the rest, whether the
/// whole file is test code (`#![cfg(test)]`), and the modules declared
/// test-only (`#[cfg(test)] mod x;`). An item is skipped to its `;` or
/// to the end of its braces.
struct Stripped {
    tokens: Vec<Token>,
    test_only: bool,
    test_mods: Vec<String>,
}

fn strip_cfg_test(all: Vec<Token>) -> Stripped {
    let text = |i: usize| all.get(i).map_or("", |t: &Token| t.text.as_str());
    let is_cfg_test = |i: usize, inner: bool| {
        let at = if inner { i + 1 } else { i };
        text(i) == "#"
            && (!inner || text(i + 1) == "!")
            && ["[", "cfg", "(", "test", ")", "]"]
                .iter()
                .enumerate()
                .all(|(k, s)| text(at + 1 + k) == *s)
    };
    let mut out = Stripped {
        tokens: Vec::new(),
        test_only: false,
        test_mods: Vec::new(),
    };
    let mut i = 0;
    while i < all.len() {
        if is_cfg_test(i, true) {
            out.test_only = true;
            return out;
        }
        if !is_cfg_test(i, false) {
            out.tokens.push(all[i].clone());
            i += 1;
            continue;
        }
        // Past this attribute and any other attributes of the item.
        let mut j = i + 7;
        while text(j) == "#" && text(j + 1) == "[" {
            j = group_end(&all, j + 1);
        }
        let item = j;
        while j < all.len() {
            match text(j) {
                ";" => {
                    j += 1;
                    break;
                }
                "{" => {
                    j = group_end(&all, j);
                    break;
                }
                "(" | "[" => j = group_end(&all, j),
                _ => j += 1,
            }
        }
        let words: Vec<&str> = (item..j)
            .map(text)
            .filter(|w| !["pub", "(", ")", "crate", "super", "in"].contains(w))
            .collect();
        if let ["mod", name, ";"] = words.as_slice() {
            out.test_mods.push((*name).to_string());
        }
        i = j;
    }
    out
}

/// One path of a use tree or expression.
#[derive(Debug, Clone, PartialEq)]
struct TreePath {
    segments: Vec<String>,
    /// The name `as` binds it to.
    rename: Option<String>,
    /// A `::*` import.
    glob: bool,
}

/// The paths of the use tree or path starting at `start` (`a::b::{c,
/// d::e}` gives `a::b::c` and `a::b::d::e`; `{self}` gives its prefix),
/// and the index after it.
fn path_tree(tokens: &[Token], start: usize) -> (Vec<TreePath>, usize) {
    let mut out = Vec::new();
    let end = path_tree_into(tokens, start, Vec::new(), &mut out);
    (out, end)
}

fn path_tree_into(
    tokens: &[Token],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<TreePath>,
) -> usize {
    let text = |i: usize| tokens.get(i).map_or("", |t| t.text.as_str());
    let mut glob = false;
    loop {
        if text(i) == "{" {
            i += 1;
            while i < tokens.len() && text(i) != "}" {
                i = path_tree_into(tokens, i, prefix.clone(), out);
                // Up to the next member.
                while i < tokens.len() && !matches!(text(i), "," | "}") {
                    i += 1;
                }
                if text(i) == "," {
                    i += 1;
                }
            }
            return i + 1;
        }
        match tokens.get(i) {
            Some(token) if is_ident(token) => {
                if token.text != "self" || prefix.is_empty() {
                    prefix.push(token.text.clone());
                }
                i += 1;
                if text(i) == "::" {
                    i += 1;
                    continue;
                }
            }
            Some(token) if token.text == "*" => {
                glob = true;
                i += 1;
            }
            _ => {}
        }
        let mut rename = None;
        if text(i) == "as" && tokens.get(i + 1).is_some_and(is_ident) {
            rename = Some(text(i + 1).to_string());
            i += 2;
        }
        out.push(TreePath {
            segments: prefix,
            rename,
            glob,
        });
        return i;
    }
}

/// Where a source file sits: its target (`""` for `src/lib.rs`,
/// `src/main.rs` and their modules, `bin/NAME` for `src/bin/NAME.rs` or
/// `src/bin/NAME/`) and its module path in that target.
fn module_of(rel: &str) -> (String, Vec<String>) {
    let mut parts: Vec<&str> = rel.split('/').collect();
    let mut target = String::new();
    if parts.len() > 1 && parts[0] == "bin" {
        target = format!("bin/{}", parts[1].trim_end_matches(".rs"));
        parts.drain(..2);
        if parts.is_empty() {
            return (target, Vec::new());
        }
    }
    let file = parts.pop().unwrap_or_default();
    let mut module: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
    let stem = file.trim_end_matches(".rs");
    let is_root = module.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !is_root {
        module.push(stem.to_string());
    }
    (target, module)
}

/// Test-only by its name: `tests.rs`, `testing.rs`, or under a `tests/`.
fn is_test_file(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    let (file, dirs) = parts.split_last().unwrap_or((&"", &[]));
    *file == "tests.rs" || *file == "testing.rs" || dirs.contains(&"tests")
}

/// A reference, in non-test code, from one module of a crate to another.
#[derive(Debug, Clone)]
struct Reference {
    /// The file, relative to the crate's `src/`.
    file: String,
    line: usize,
    /// The path as it reads, groups expanded (`crate::a::b::C`).
    written: String,
    from: Vec<String>,
    to: Vec<String>,
}

/// One target of a crate: its modules (test-only ones left out) and the
/// references between them.
#[derive(Debug, Default)]
struct Target {
    modules: BTreeSet<Vec<String>>,
    references: Vec<Reference>,
}

/// The targets of a crate from its `src/` files (path relative to `src/`
/// → text).
fn scan_crate(sources: &BTreeMap<String, String>) -> BTreeMap<String, Target> {
    struct File<'a> {
        rel: &'a str,
        target: String,
        module: Vec<String>,
        tokens: Vec<Token>,
    }
    let mut files = Vec::new();
    let mut test_modules: BTreeSet<(String, Vec<String>)> = BTreeSet::new();
    let mut names: BTreeMap<String, Names> = BTreeMap::new();
    for (rel, text) in sources {
        let (target, module) = module_of(rel);
        let stripped = strip_cfg_test(tokens(&mask(text)));
        for name in &stripped.test_mods {
            let mut child = module.clone();
            child.push(name.clone());
            test_modules.insert((target.clone(), child));
        }
        if stripped.test_only || is_test_file(rel) {
            test_modules.insert((target.clone(), module.clone()));
        }
        let names = names.entry(target.clone()).or_default();
        names.modules.insert(module.clone());
        for inline in inline_modules(&stripped.tokens) {
            names.modules.insert([module.clone(), inline].concat());
        }
        for import in module_imports(&stripped.tokens) {
            let name = import
                .rename
                .clone()
                .or_else(|| import.segments.last().cloned());
            if let Some(name) = name.filter(|n| n != "_" && !import.glob) {
                names
                    .imports
                    .insert((module.clone(), name), import.segments);
            }
        }
        files.push(File {
            rel,
            target,
            module,
            tokens: stripped.tokens,
        });
    }
    let is_test = |target: &str, module: &[String]| {
        (0..=module.len())
            .any(|n| test_modules.contains(&(target.to_string(), module[..n].to_vec())))
    };
    let mut targets: BTreeMap<String, Target> = BTreeMap::new();
    for file in files {
        if is_test(&file.target, &file.module) {
            continue;
        }
        let names = &names[&file.target];
        let target = targets.entry(file.target.clone()).or_default();
        target.modules.insert(file.module.clone());
        for (line, from, path) in file_paths(&file.tokens, &file.module) {
            let Some(to) = names.resolve(&from, &path) else {
                continue;
            };
            target.references.push(Reference {
                file: file.rel.to_string(),
                line,
                written: path.join("::"),
                from,
                to,
            });
        }
    }
    targets
}

/// What paths of a target can lead to: its modules, and the names each
/// module imports (`use`, `pub use`), as written.
#[derive(Debug, Default)]
struct Names {
    modules: BTreeSet<Vec<String>>,
    imports: BTreeMap<(Vec<String>, String), Vec<String>>,
}

impl Names {
    /// `path`, written in module `from`, as segments from the crate root;
    /// `None` for a path of another crate.
    fn absolute(&self, from: &[String], path: &[String]) -> Option<Vec<String>> {
        let (head, mut rest) = path.split_first()?;
        let mut base: Vec<String> = match head.as_str() {
            "crate" => Vec::new(),
            "self" | "super" => from.to_vec(),
            // A child module (`use child::Item;`), or another crate.
            _ => {
                let full = [from, path].concat();
                return self.modules.contains(&full[..=from.len()]).then_some(full);
            }
        };
        if head == "super" {
            base.pop()?;
            while let Some((next, tail)) = rest.split_first() {
                if next != "super" {
                    break;
                }
                base.pop()?;
                rest = tail;
            }
        }
        Some([base.as_slice(), rest].concat())
    }

    /// The module `path`, written in module `from`, names: the longest
    /// module its segments begin with, imports followed (`crate::Item`
    /// where the root has `pub use a::Item` names `a`).
    fn resolve(&self, from: &[String], path: &[String]) -> Option<Vec<String>> {
        let mut full = self.absolute(from, path)?;
        for _ in 0..8 {
            let n = (0..=full.len())
                .rev()
                .find(|&n| self.modules.contains(&full[..n]))
                .unwrap_or(0);
            let import = full
                .get(n)
                .and_then(|name| self.imports.get(&(full[..n].to_vec(), name.clone())))
                .and_then(|import| self.absolute(&full[..n], import));
            match import {
                Some(import) => full = [import.as_slice(), &full[n + 1..]].concat(),
                None => return Some(full[..n].to_vec()),
            }
        }
        Some(Vec::new())
    }
}

/// The imports of a file's own module: its `use` items outside any
/// braces.
fn module_imports(tokens: &[Token]) -> Vec<TreePath> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i].text.as_str() {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            "use" if depth == 0 => {
                let (paths, end) = path_tree(tokens, i + 1);
                out.extend(paths);
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The inline modules (`mod x { … }`) of a file's tokens, as paths below
/// the file's module.
fn inline_modules(tokens: &[Token]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut stack: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    for (i, token) in tokens.iter().enumerate() {
        match token.text.as_str() {
            "{" => {
                depth += 1;
                if i >= 2 && tokens[i - 2].text == "mod" && is_ident(&tokens[i - 1]) {
                    stack.push((tokens[i - 1].text.clone(), depth));
                    out.push(stack.iter().map(|(name, _)| name.clone()).collect());
                }
            }
            "}" => {
                if stack.last().is_some_and(|(_, d)| *d == depth) {
                    stack.pop();
                }
                depth -= 1;
            }
            _ => {}
        }
    }
    out
}

/// Every `crate::`, `super::` or `self::` path of a file's tokens: its
/// line, the module it is written in (inline modules followed), and its
/// segments.
fn file_paths(tokens: &[Token], module: &[String]) -> Vec<(usize, Vec<String>, Vec<String>)> {
    let text = |i: usize| tokens.get(i).map_or("", |t| t.text.as_str());
    let mut out = Vec::new();
    let mut stack: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        match text(i) {
            "{" => {
                depth += 1;
                if i >= 2 && text(i - 2) == "mod" && is_ident(&tokens[i - 1]) {
                    stack.push((tokens[i - 1].text.clone(), depth));
                }
            }
            "}" => {
                if stack.last().is_some_and(|(_, d)| *d == depth) {
                    stack.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "crate" | "super" | "self"
                if text(i + 1) == "::" && !(i > 0 && matches!(text(i - 1), "$" | "::")) =>
            {
                let line = tokens[i].line;
                let (paths, end) = path_tree(tokens, i);
                let here: Vec<String> = module
                    .iter()
                    .cloned()
                    .chain(stack.iter().map(|(name, _)| name.clone()))
                    .collect();
                out.extend(paths.into_iter().map(|p| (line, here.clone(), p.segments)));
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// A reference lifted to the two sibling modules under the nearest common
/// ancestor of its ends: `(parent, from, to)`, or `None` when one end is
/// the other's ancestor.
fn lift(reference: &Reference) -> Option<(Vec<String>, String, String)> {
    let (from, to) = (&reference.from, &reference.to);
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if common == from.len() || common == to.len() {
        return None;
    }
    Some((
        from[..common].to_vec(),
        from[common].clone(),
        to[common].clone(),
    ))
}

/// Sibling edges of a target: parent → (from, to) → the first reference.
type Edges<'a> = BTreeMap<Vec<String>, BTreeMap<(String, String), &'a Reference>>;

fn sibling_edges(target: &Target) -> Edges<'_> {
    let mut edges: Edges<'_> = BTreeMap::new();
    for reference in &target.references {
        if let Some((parent, from, to)) = lift(reference) {
            edges
                .entry(parent)
                .or_default()
                .entry((from, to))
                .or_insert(reference);
        }
    }
    edges
}

/// The strongly connected sets of two or more nodes of a graph (Tarjan).
fn cycles_of(edges: &BTreeSet<(String, String)>) -> Vec<BTreeSet<String>> {
    let nodes: BTreeSet<&String> = edges.iter().flat_map(|(a, b)| [a, b]).collect();
    let mut index: BTreeMap<&String, usize> = BTreeMap::new();
    let mut low: BTreeMap<&String, usize> = BTreeMap::new();
    let mut stack: Vec<&String> = Vec::new();
    let mut out = Vec::new();
    fn visit<'a>(
        v: &'a String,
        edges: &'a BTreeSet<(String, String)>,
        index: &mut BTreeMap<&'a String, usize>,
        low: &mut BTreeMap<&'a String, usize>,
        stack: &mut Vec<&'a String>,
        out: &mut Vec<BTreeSet<String>>,
    ) {
        let n = index.len();
        index.insert(v, n);
        low.insert(v, n);
        stack.push(v);
        for (_, w) in edges.iter().filter(|(a, _)| a == v) {
            if !index.contains_key(w) {
                visit(w, edges, index, low, stack, out);
                let lw = low[w];
                let lv = low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if stack.contains(&w) {
                let iw = index[w];
                let lv = low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if low[v] == index[v] {
            let mut set = BTreeSet::new();
            while let Some(w) = stack.pop() {
                set.insert(w.clone());
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                out.push(set);
            }
        }
    }
    for v in nodes {
        if !index.contains_key(v) {
            visit(v, edges, &mut index, &mut low, &mut stack, &mut out);
        }
    }
    out
}

fn module_name(target: &str, module: &[String]) -> String {
    let path = std::iter::once("crate".to_string())
        .chain(module.iter().cloned())
        .collect::<Vec<_>>()
        .join("::");
    if target.is_empty() {
        path
    } else {
        format!("{target}: {path}")
    }
}

fn example(prefix: &str, reference: &Reference) -> String {
    format!(
        "{prefix}{}:{} → {}",
        reference.file, reference.line, reference.written
    )
}

/// Each cycle among sibling modules of a crate's targets, with one
/// reference per edge. `prefix` goes before file names (`node/src/`).
fn cycle_report(prefix: &str, targets: &BTreeMap<String, Target>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, target) in targets {
        for (parent, edges) in sibling_edges(target) {
            let pairs: BTreeSet<(String, String)> = edges.keys().cloned().collect();
            for cycle in cycles_of(&pairs) {
                let members: Vec<&str> = cycle.iter().map(String::as_str).collect();
                out.push(format!(
                    "{prefix}: under {}: {}",
                    module_name(name, &parent),
                    members.join(" ⇄ ")
                ));
                for ((from, to), reference) in &edges {
                    if cycle.contains(from) && cycle.contains(to) {
                        out.push(format!("    {from} → {to}: {}", example(prefix, reference)));
                    }
                }
            }
        }
    }
    out
}

/// Uses of a higher layer by a top-level module of the main target, and
/// top-level modules `layers` (top first) does not place or places but
/// the crate lacks.
fn layer_report(prefix: &str, target: &Target, layers: &[&[&str]]) -> Vec<String> {
    let layer_of = |module: &str| layers.iter().position(|layer| layer.contains(&module));
    let mut out = Vec::new();
    let top: BTreeSet<&str> = target
        .modules
        .iter()
        .filter_map(|m| m.first().map(String::as_str))
        .collect();
    for module in &top {
        if layer_of(module).is_none() {
            out.push(format!(
                "{prefix}: module `{module}` is in no layer; add it to the table"
            ));
        }
    }
    for module in layers.iter().flat_map(|layer| layer.iter()) {
        if !top.contains(module) {
            out.push(format!(
                "{prefix}: the table names `{module}`, which is no module"
            ));
        }
    }
    if let Some(edges) = sibling_edges(target).get(&Vec::new()) {
        for ((from, to), reference) in edges {
            let (Some(f), Some(t)) = (layer_of(from), layer_of(to)) else {
                continue;
            };
            if t < f {
                out.push(format!(
                    "{prefix}: {from} (layer {f}) uses {to} (layer {t}, higher): {}",
                    example(prefix, reference)
                ));
            }
        }
    }
    out
}

/// Every path that names `storage::apply` in the given files (display
/// path → text), tests included, comments and literals not.
fn storage_apply_report(files: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (file, text) in files {
        let tokens = tokens(&mask(text));
        let text = |i: usize| tokens.get(i).map_or("", |t: &Token| t.text.as_str());
        let mut i = 0;
        while i < tokens.len() {
            // `storage::` at the start of a path (`::storage::` too).
            let starts = text(i) == "storage"
                && text(i + 1) == "::"
                && (i == 0
                    || text(i - 1) != "::"
                    || i == 1
                    || !(is_ident(&tokens[i - 2]) || text(i - 2) == ">"));
            if !starts {
                i += 1;
                continue;
            }
            let (paths, end) = path_tree(&tokens, i);
            for path in paths {
                if path.segments.get(1).is_some_and(|s| s == "apply") {
                    out.push(format!(
                        "{file}:{} → {}",
                        tokens[i].line,
                        path.segments.join("::")
                    ));
                }
            }
            i = end;
        }
    }
    out
}

/// The `.rs` files under `dir`, by path relative to it.
fn sources_under(dir: &Path) -> BTreeMap<String, String> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    files
        .into_iter()
        .map(|path| {
            let rel = path
                .strip_prefix(dir)
                .expect("under dir")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (rel, text)
        })
        .collect()
}

#[test]
fn the_modules_of_each_crate_form_no_cycle() {
    let mut report = Vec::new();
    for member in MEMBERS {
        let sources = sources_under(&root().join(member).join("src"));
        assert!(!sources.is_empty(), "{member}/src has no Rust file");
        report.extend(cycle_report(
            &format!("{member}/src/"),
            &scan_crate(&sources),
        ));
    }
    assert!(
        report.is_empty(),
        "cycles among sibling modules (each edge with one reference, file:line → path):\n{}",
        report.join("\n")
    );
}

#[test]
fn node_modules_use_only_their_own_or_lower_layers() {
    let targets = scan_crate(&sources_under(&root().join("node/src")));
    let report = layer_report("node/src/", &targets[""], NODE_LAYERS);
    assert!(
        report.is_empty(),
        "node's layers (NODE_LAYERS, as in node/src/lib.rs):\n{}",
        report.join("\n")
    );
}

#[test]
fn nothing_outside_storage_names_storage_apply() {
    let mut files = BTreeMap::new();
    for member in MEMBERS.iter().filter(|m| **m != "storage") {
        for (rel, text) in sources_under(&root().join(member)) {
            files.insert(format!("{member}/{rel}"), text);
        }
    }
    assert!(files.len() > 100, "found only {} Rust files", files.len());
    let report = storage_apply_report(&files);
    assert!(
        report.is_empty(),
        "`storage::apply` is storage's own; use what storage's root exports:\n{}",
        report.join("\n")
    );
}

/// The checks above, fed synthetic crates: each kind of reference they
/// must see is seen, and what they must skip is skipped.
mod self_tests {
    use super::*;

    /// A crate from `(path under src/, text)` pairs.
    fn sources(files: &[(&str, &str)]) -> BTreeMap<String, String> {
        files
            .iter()
            .map(|(path, text)| (path.to_string(), text.to_string()))
            .collect()
    }

    fn cycles(files: &[(&str, &str)]) -> Vec<String> {
        cycle_report("x/src/", &scan_crate(&sources(files)))
    }

    const LIB: &str = "//! Root.\npub mod a;\npub mod b;\n";

    #[test]
    fn a_clean_crate_reports_nothing() {
        let files = [
            ("lib.rs", LIB),
            (
                "a.rs",
                "//! A.\nuse crate::b::B;\npub fn f() -> B { crate::b::new() }\n",
            ),
            (
                "b/mod.rs",
                "//! B.\nmod c;\npub struct B;\npub fn new() -> B { c::make() }\n",
            ),
            // A child naming its parent and the root is no edge.
            (
                "b/c.rs",
                "use super::B;\nuse crate::b::new;\npub fn make() -> B { B }\n",
            ),
        ];
        assert_eq!(cycles(&files), Vec::<String>::new());
        let files = sources(&files);
        assert_eq!(storage_apply_report(&files), Vec::<String>::new());
        let targets = scan_crate(&files);
        let layers: &[&[&str]] = &[&["a"], &["b"]];
        assert_eq!(
            layer_report("x/src/", &targets[""], layers),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_cycle_of_two_modules_is_reported_with_a_reference_per_edge() {
        let report = cycles(&[
            ("lib.rs", LIB),
            ("a.rs", "//! A.\n\nuse crate::b::B;\n"),
            ("b.rs", "//! B.\npub fn f() {\n    crate::a::g();\n}\n"),
        ]);
        assert_eq!(
            report,
            [
                "x/src/: under crate: a ⇄ b",
                "    a → b: x/src/a.rs:3 → crate::b::B",
                "    b → a: x/src/b.rs:3 → crate::a::g",
            ]
        );
    }

    #[test]
    fn a_nested_reference_is_lifted_to_siblings() {
        // a::meta → b lifts to a → b; b::deep::x → a::inner to b → a.
        let report = cycles(&[
            ("lib.rs", LIB),
            ("a/mod.rs", "mod meta;\npub mod inner;\n"),
            ("a/meta.rs", "use crate::b::Thing;\n"),
            ("a/inner.rs", "pub struct I;\n"),
            ("b/mod.rs", "mod deep;\n"),
            ("b/deep/mod.rs", "mod x;\n"),
            ("b/deep/x.rs", "fn f(_: crate::a::inner::I) {}\n"),
        ]);
        assert_eq!(
            report,
            [
                "x/src/: under crate: a ⇄ b",
                "    a → b: x/src/a/meta.rs:1 → crate::b::Thing",
                "    b → a: x/src/b/deep/x.rs:1 → crate::a::inner::I",
            ]
        );
        // Below the root: siblings under their parent.
        let report = cycles(&[
            ("lib.rs", "pub mod p;\n"),
            ("p/mod.rs", "mod q;\nmod r;\n"),
            ("p/q.rs", "use crate::p::r::R;\n"),
            ("p/r/mod.rs", "mod s;\n"),
            ("p/r/s.rs", "use crate::p::q::Q;\n"),
        ]);
        assert_eq!(report[0], "x/src/: under crate::p: q ⇄ r");
    }

    #[test]
    fn a_super_path_is_resolved() {
        let report = cycles(&[
            ("lib.rs", LIB),
            ("a/mod.rs", "mod one;\n"),
            ("a/one.rs", "use super::super::b::B;\n"),
            ("b/mod.rs", "mod two;\n"),
            (
                "b/two.rs",
                "use super::two_helper;\nfn f() { super::super::a::g(); }\n",
            ),
        ]);
        assert_eq!(
            report,
            [
                "x/src/: under crate: a ⇄ b",
                "    a → b: x/src/a/one.rs:1 → super::super::b::B",
                "    b → a: x/src/b/two.rs:2 → super::super::a::g",
            ]
        );
        // In a file's inline module, `super` is the file's module.
        let report = cycles(&[
            ("lib.rs", LIB),
            ("a.rs", "mod inner {\n    use super::super::b::B;\n}\n"),
            ("b.rs", "use crate::a::A;\n"),
        ]);
        assert_eq!(report.len(), 3, "{report:#?}");
    }

    #[test]
    fn a_grouped_import_is_expanded() {
        let report = cycles(&[
            ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
            (
                "a.rs",
                "use crate::{\n    c::C,\n    b::{self, B as Bee},\n};\n",
            ),
            ("b.rs", "use crate::{c, a::A};\n"),
            ("c.rs", "pub struct C;\n"),
        ]);
        assert_eq!(
            report,
            [
                "x/src/: under crate: a ⇄ b",
                "    a → b: x/src/a.rs:1 → crate::b",
                "    b → a: x/src/b.rs:1 → crate::a::A",
            ]
        );
    }

    #[test]
    fn a_path_through_an_import_names_the_imported_module() {
        // `crate::Item`, re-exported by the root from `b`, names `b`;
        // `crate::c::Thing`, which `c` imports from `a`, names `a`.
        let report = cycles(&[
            (
                "lib.rs",
                "pub mod a;\nmod b;\npub use b::{Item, other as Renamed};\n",
            ),
            ("a.rs", "use crate::Item;\nuse crate::b::*;\n"),
            ("b.rs", "fn f() { crate::c::Thing::new(); }\n"),
            ("c.rs", "use crate::a::Thing;\n"),
        ]);
        assert_eq!(
            report,
            [
                "x/src/: under crate: a ⇄ b",
                "    a → b: x/src/a.rs:1 → crate::Item",
                "    b → a: x/src/b.rs:1 → crate::c::Thing::new",
            ]
        );
    }

    #[test]
    fn test_code_comments_and_literals_are_no_references() {
        let files = [
            ("lib.rs", LIB),
            ("a.rs", "use crate::b::B;\n"),
            ("b/helpers.rs", "use crate::a::Helper;\n"),
            (
                "b.rs",
                concat!(
                    "//! Unlike `crate::a::X`, …\n",
                    "#[cfg(test)]\n",
                    "mod helpers;\n",
                    "#[cfg(test)]\n",
                    "#[allow(unused)]\n",
                    "use crate::a::Other;\n",
                    "/* crate::a::Y /* nested */ crate::a::Z */\n",
                    "const S: &str = \"crate::a::S {\";\n",
                    "const R: &str = r#\"crate::a::R\"#;\n",
                    "const C: char = '{';\n",
                    "fn f<'a>(x: &'a str) -> &'a str { x }\n",
                    "macro_rules! m { () => { $crate::a::M }; }\n",
                    "#[cfg(test)]\n",
                    "mod tests {\n",
                    "    use crate::a::T;\n",
                    "    fn g() { if true { crate::a::U; } }\n",
                    "}\n",
                    "#[cfg(test)]\n",
                    "impl B { fn h() { crate::a::V; } }\n",
                ),
            ),
            ("b/tests.rs", "use crate::a::W;\n"),
            ("b/testing.rs", "use crate::a::W;\n"),
            ("b/tests/deep.rs", "use crate::a::W;\n"),
        ];
        assert_eq!(cycles(&files), Vec::<String>::new());
        let targets = scan_crate(&sources(&files));
        let from_b: Vec<&str> = targets[""]
            .references
            .iter()
            .filter(|r| r.file.starts_with('b'))
            .map(|r| r.written.as_str())
            .collect();
        assert_eq!(from_b, Vec::<&str>::new());
        // After the test module, code counts again.
        let files = [
            ("lib.rs", LIB),
            ("a.rs", "use crate::b::B;\n"),
            (
                "b.rs",
                "#[cfg(test)]\nmod tests {\n    use crate::a::T;\n}\nuse crate::a::A;\n",
            ),
        ];
        assert_eq!(cycles(&files)[2], "    b → a: x/src/b.rs:5 → crate::a::A");
    }

    #[test]
    fn the_targets_under_bin_are_apart() {
        let report = cycles(&[
            ("lib.rs", LIB),
            ("main.rs", "mod cli;\n"),
            ("cli.rs", "use crate::a::A;\n"),
            ("bin/tool/main.rs", "mod a;\nmod b;\n"),
            ("bin/tool/a.rs", "use crate::b::B;\n"),
            ("bin/tool/b.rs", "use crate::a::A;\n"),
            ("bin/one.rs", "use crate::a::A;\n"),
        ]);
        assert_eq!(report[0], "x/src/: under bin/tool: crate: a ⇄ b");
        assert_eq!(report.len(), 3, "{report:#?}");
    }

    #[test]
    fn a_use_of_a_higher_layer_is_reported() {
        let targets = scan_crate(&sources(&[
            (
                "lib.rs",
                "pub mod top;\npub mod mid;\npub mod low;\npub mod new;\n",
            ),
            ("top.rs", "use crate::mid::M;\nuse crate::low::L;\n"),
            ("mid.rs", "use crate::low::L;\n"),
            ("low.rs", "pub fn f() { crate::mid::g() }\n"),
            ("new.rs", "\n"),
        ]));
        let layers: &[&[&str]] = &[&["top"], &["mid"], &["low", "gone"]];
        assert_eq!(
            layer_report("x/src/", &targets[""], layers),
            [
                "x/src/: module `new` is in no layer; add it to the table",
                "x/src/: the table names `gone`, which is no module",
                "x/src/: low (layer 2) uses mid (layer 1, higher): x/src/low.rs:1 → crate::mid::g",
            ]
        );
    }

    #[test]
    fn a_path_naming_storage_apply_is_reported() {
        let files = sources(&[
            ("node/src/a.rs", "use storage::apply::Thing;\n"),
            (
                "node/src/b.rs",
                "use storage::{\n    Store,\n    apply::{self, meta},\n};\n",
            ),
            ("node/tests/c.rs", "fn f() { ::storage::apply::run(); }\n"),
            (
                "node/src/d.rs",
                "// storage::apply::Z\nuse storage::Store;\nuse crate::storage::apply;\nfn g() { let s = \"storage::apply\"; }\n",
            ),
        ]);
        assert_eq!(
            storage_apply_report(&files),
            [
                "node/src/a.rs:1 → storage::apply::Thing",
                "node/src/b.rs:1 → storage::apply",
                "node/src/b.rs:1 → storage::apply::meta",
                "node/tests/c.rs:1 → storage::apply::run",
            ]
        );
    }

    #[test]
    fn the_scanner_blanks_literals_and_reads_use_trees() {
        let masked = mask("a /* b */ \"c\\\"d\" 'e' b'{' r##\"f\"# g\"## 'h i // j\nk");
        let words: Vec<String> = tokens(&masked).into_iter().map(|t| t.text).collect();
        assert_eq!(words, ["a", "b", "'", "h", "i", "k"]);
        let toks = tokens("crate::a::{b, c::{self, d as e}, f::*};");
        let (paths, end) = path_tree(&toks, 0);
        let paths: Vec<String> = paths.iter().map(|p| p.segments.join("::")).collect();
        assert_eq!(
            paths,
            [
                "crate::a::b",
                "crate::a::c",
                "crate::a::c::d",
                "crate::a::f"
            ]
        );
        assert_eq!(toks[end].text, ";");
        assert_eq!(module_of("lib.rs"), (String::new(), vec![]));
        assert_eq!(
            module_of("a/b/mod.rs"),
            (String::new(), vec!["a".into(), "b".into()])
        );
        assert_eq!(module_of("bin/x/y.rs"), ("bin/x".into(), vec!["y".into()]));
        assert_eq!(module_of("bin/x.rs"), ("bin/x".into(), vec![]));
    }
}

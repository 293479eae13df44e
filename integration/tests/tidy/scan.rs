//! Reading a crate's sources as text: comments and literals masked, tokens,
//! `crate::`/`super::` paths and grouped imports expanded, test code
//! stripped, each reference lifted to sibling modules; and the reports of
//! the checks built on that reading (cycles, layers, `storage::apply`).

use std::collections::{BTreeMap, BTreeSet};

/// A token of Rust source: an identifier, `::`, or one other character.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Token {
    pub(super) text: String,
    pub(super) line: usize,
}

pub(super) fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` with every comment, string and character literal replaced by
/// spaces (newlines kept, so lines still count).
pub(super) fn mask(text: &str) -> String {
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
pub(super) fn block_comment_end(chars: &[char], start: usize) -> usize {
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
pub(super) fn quoted_end(chars: &[char], start: usize, quote: char) -> usize {
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
pub(super) fn raw_string_end(chars: &[char], start: usize) -> Option<usize> {
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
pub(super) fn tokens(masked: &str) -> Vec<Token> {
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

pub(super) fn is_ident(token: &Token) -> bool {
    token
        .text
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// The index after the bracket group opening at `open` (`(`, `[` or `{`).
pub(super) fn group_end(tokens: &[Token], open: usize) -> usize {
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
pub(super) struct Stripped {
    pub(super) tokens: Vec<Token>,
    pub(super) test_only: bool,
    pub(super) test_mods: Vec<String>,
}

pub(super) fn strip_cfg_test(all: Vec<Token>) -> Stripped {
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
pub(super) struct TreePath {
    pub(super) segments: Vec<String>,
    /// The name `as` binds it to.
    pub(super) rename: Option<String>,
    /// A `::*` import.
    pub(super) glob: bool,
}

/// The paths of the use tree or path starting at `start` (`a::b::{c,
/// d::e}` gives `a::b::c` and `a::b::d::e`; `{self}` gives its prefix),
/// and the index after it.
pub(super) fn path_tree(tokens: &[Token], start: usize) -> (Vec<TreePath>, usize) {
    let mut out = Vec::new();
    let end = path_tree_into(tokens, start, Vec::new(), &mut out);
    (out, end)
}

pub(super) fn path_tree_into(
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
pub(super) fn module_of(rel: &str) -> (String, Vec<String>) {
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
pub(super) fn is_test_file(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    let (file, dirs) = parts.split_last().unwrap_or((&"", &[]));
    *file == "tests.rs" || *file == "testing.rs" || dirs.contains(&"tests")
}

/// A reference, in non-test code, from one module of a crate to another.
#[derive(Debug, Clone)]
pub(super) struct Reference {
    /// The file, relative to the crate's `src/`.
    pub(super) file: String,
    pub(super) line: usize,
    /// The path as it reads, groups expanded (`crate::a::b::C`).
    pub(super) written: String,
    pub(super) from: Vec<String>,
    pub(super) to: Vec<String>,
}

/// One target of a crate: its modules (test-only ones left out) and the
/// references between them.
#[derive(Debug, Default)]
pub(super) struct Target {
    pub(super) modules: BTreeSet<Vec<String>>,
    pub(super) references: Vec<Reference>,
}

/// The targets of a crate from its `src/` files (path relative to `src/`
/// → text).
pub(super) fn scan_crate(sources: &BTreeMap<String, String>) -> BTreeMap<String, Target> {
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
pub(super) struct Names {
    pub(super) modules: BTreeSet<Vec<String>>,
    pub(super) imports: BTreeMap<(Vec<String>, String), Vec<String>>,
}

impl Names {
    /// `path`, written in module `from`, as segments from the crate root;
    /// `None` for a path of another crate.
    pub(super) fn absolute(&self, from: &[String], path: &[String]) -> Option<Vec<String>> {
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
    pub(super) fn resolve(&self, from: &[String], path: &[String]) -> Option<Vec<String>> {
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
pub(super) fn module_imports(tokens: &[Token]) -> Vec<TreePath> {
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
pub(super) fn inline_modules(tokens: &[Token]) -> Vec<Vec<String>> {
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
pub(super) fn file_paths(
    tokens: &[Token],
    module: &[String],
) -> Vec<(usize, Vec<String>, Vec<String>)> {
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
pub(super) fn lift(reference: &Reference) -> Option<(Vec<String>, String, String)> {
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
pub(super) type Edges<'a> = BTreeMap<Vec<String>, BTreeMap<(String, String), &'a Reference>>;

pub(super) fn sibling_edges(target: &Target) -> Edges<'_> {
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
pub(super) fn cycles_of(edges: &BTreeSet<(String, String)>) -> Vec<BTreeSet<String>> {
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

pub(super) fn module_name(target: &str, module: &[String]) -> String {
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

pub(super) fn example(prefix: &str, reference: &Reference) -> String {
    format!(
        "{prefix}{}:{} → {}",
        reference.file, reference.line, reference.written
    )
}

/// Each cycle among sibling modules of a crate's targets, with one
/// reference per edge. `prefix` goes before file names (`node/src/`).
pub(super) fn cycle_report(prefix: &str, targets: &BTreeMap<String, Target>) -> Vec<String> {
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
pub(super) fn layer_report(prefix: &str, target: &Target, layers: &[&[&str]]) -> Vec<String> {
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
pub(super) fn storage_apply_report(files: &BTreeMap<String, String>) -> Vec<String> {
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

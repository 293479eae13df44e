//! The checks of `scan`, fed synthetic crates: each kind of reference
//! they must see is seen, and what they must skip is skipped.

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

//! Tests of `wire/src/golden`.

//! The harness itself, on a type of two versions: `V1`, and `V2` which
//! is `V1` with a field added (what the rule forbids without a bump).

use serde::{Deserialize, Serialize};

use super::*;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct V1 {
    id: String,
    replicas: u32,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct V2 {
    id: String,
    replicas: u32,
    zone: String,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum Kind {
    A(u32),
    B {
        tags: Vec<String>,
        note: Option<String>,
    },
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum KindAppended {
    A(u32),
    B {
        tags: Vec<String>,
        note: Option<String>,
    },
    C,
}

fn v1() -> V1 {
    V1 {
        id: "d1".into(),
        replicas: 3,
    }
}

fn v2() -> V2 {
    V2 {
        id: "d1".into(),
        replicas: 3,
        zone: "a".into(),
    }
}

fn b() -> Kind {
    Kind::B {
        tags: vec!["t".into()],
        note: Some("n".into()),
    }
}

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!(
            "wire-golden-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        Dir(dir)
    }

    fn goldens(&self, version: u32, update: bool) -> Goldens {
        Goldens::new(&self.0, "TEST_VERSION", version).updating(update)
    }

    fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.0.join(format!("{name}.hex"))).unwrap()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn failures(goldens: Goldens) -> Vec<String> {
    goldens.finish().err().map(|f| f.0).unwrap_or_default()
}

#[test]
fn a_missing_golden_fails_until_it_is_recorded() {
    let dir = Dir::new("missing");
    let mut g = dir.goldens(1, false);
    g.check("t", &[v1()]);
    let failed = failures(g);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].contains("no golden file") && failed[0].contains("GOLDEN_UPDATE=1"));

    let mut g = dir.goldens(1, true);
    g.check("t", &[v1()]);
    assert_eq!(g.written().len(), 1);
    g.assert_all();
    let text = dir.text("t");
    assert!(
        text.contains("version TEST_VERSION 1\ncase value 02643103\n"),
        "{text}"
    );

    let mut g = dir.goldens(1, false);
    g.check("t", &[v1()]);
    assert!(g.written().is_empty());
    g.assert_all();
}

#[test]
fn a_field_added_without_a_bump_fails_and_cannot_be_regenerated() {
    let dir = Dir::new("field");
    let mut g = dir.goldens(1, true);
    g.check("t", &[v1()]);
    g.assert_all();
    let recorded = dir.text("t");

    let mut g = dir.goldens(1, false);
    g.check("t", &[v2()]);
    let failed = failures(g);
    assert_eq!(failed.len(), 1, "{failed:?}");
    let message = &failed[0];
    for part in [
        "V2",
        "made under TEST_VERSION 1",
        "the encoding of case `value` changed",
        "first difference at byte 4",
        "bump TEST_VERSION and regenerate with GOLDEN_UPDATE=1",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }

    // Regenerating under the same version is refused and writes nothing.
    let mut g = dir.goldens(1, true);
    g.check("t", &[v2()]);
    assert!(g.written().is_empty());
    let failed = failures(g);
    assert!(failed[0].contains("does not overwrite"), "{failed:?}");
    assert_eq!(dir.text("t"), recorded);

    // After a bump: stale until regenerated, then it passes.
    let mut g = dir.goldens(2, false);
    g.check("t", &[v2()]);
    let failed = failures(g);
    assert!(
        failed[0].contains("made under TEST_VERSION 1, this build has TEST_VERSION 2"),
        "{failed:?}"
    );
    let mut g = dir.goldens(2, true);
    g.check("t", &[v2()]);
    g.assert_all();
    let mut g = dir.goldens(2, false);
    g.check("t", &[v2()]);
    g.assert_all();
}

#[test]
fn an_appended_variant_is_recorded_under_the_same_version() {
    let dir = Dir::new("variant");
    let mut g = dir.goldens(1, true);
    g.check("k", &[Kind::A(7), b()]);
    g.assert_all();

    let appended = [
        KindAppended::A(7),
        KindAppended::B {
            tags: vec!["t".into()],
            note: Some("n".into()),
        },
        KindAppended::C,
    ];
    let mut g = dir.goldens(1, false);
    g.check("k", &appended);
    let failed = failures(g);
    assert!(
        failed.len() == 1 && failed[0].contains("case(s) `C` have no golden"),
        "{failed:?}"
    );
    let mut g = dir.goldens(1, true);
    g.check("k", &appended);
    g.assert_all();
    assert!(dir.text("k").contains("case C 02\n"));

    // A variant inserted before the others shifts their indices.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Inserted {
        Z,
        A(u32),
        B {
            tags: Vec<String>,
            note: Option<String>,
        },
        C,
    }
    let mut g = dir.goldens(1, false);
    g.check(
        "k",
        &[
            Inserted::Z,
            Inserted::A(7),
            Inserted::B {
                tags: vec!["t".into()],
                note: Some("n".into()),
            },
            Inserted::C,
        ],
    );
    let failed = failures(g);
    assert!(failed[0].contains("case `A` changed"), "{failed:?}");

    // A removed variant.
    let mut g = dir.goldens(1, false);
    g.check("k", &[Kind::A(7), b()]);
    let failed = failures(g);
    assert!(failed[0].contains("case `C` is gone"), "{failed:?}");
}

#[test]
fn every_variant_and_every_field_must_be_set() {
    let dir = Dir::new("coverage");
    assert_eq!(enum_variants::<Kind>(), Some(&["A", "B"][..]));
    assert_eq!(enum_variants::<V1>(), None);
    let mut g = dir.goldens(1, true);
    g.check(
        "k",
        &[Kind::B {
            tags: vec![],
            note: None,
        }],
    );
    let failed = failures(g);
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(
        failed[0].contains("B.tags (empty list), B.note (None)"),
        "{failed:?}"
    );
    assert!(failed[1].contains("variant `A` has no case"), "{failed:?}");
}

#[test]
fn repeated_variants_get_numbered_labels_and_files_round_trip() {
    let file = GoldenFile {
        version_name: "V".into(),
        version: 3,
        cases: vec![
            ("A".into(), vec![0, 7]),
            ("A#2".into(), vec![]),
            ("B".into(), vec![0xff]),
        ],
    };
    assert_eq!(parse(&render("x", &file)), Ok(file));
    assert!(parse("case A 0").is_err());
    assert!(parse("case A zz\nversion V 1").is_err());
    assert!(parse("case A 00").unwrap_err().contains("version"));

    let dir = Dir::new("labels");
    let mut g = dir.goldens(1, true);
    g.check("k", &[Kind::A(1), Kind::A(2), b()]);
    g.assert_all();
    assert!(
        dir.text("k")
            .contains("case A 0001\ncase A#2 0002\ncase B ")
    );
}

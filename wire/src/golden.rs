//! Golden-byte checks of serialized formats: what pins the bytes ctrl and
//! krane write and send. Built only with the `golden` feature, which the
//! crates' tests enable; nothing in a binary uses it.
//!
//! Everything written to the Raft log, to the state tables, into snapshots
//! and onto the wire is a postcard encoding of a `wire` or `storage` type.
//! postcard writes no field names and no tags but an enum's variant index,
//! so adding a field, reordering fields or inserting a variant silently
//! changes the format. A golden file holds the encoding of one type's
//! fixture cases (every variant, every field set), recorded under the
//! version of the format it belongs to (`wire::hello::PROTOCOL_VERSION`,
//! `storage::SCHEMA_VERSION`, node's Raft log schema version). The rule:
//!
//! - **enum variants are append-only**: a new variant goes at the end, and
//!   its case is added to the golden under the same version (the bytes of
//!   every existing case stay as they were);
//! - **anything that changes existing bytes** (a new field, a removed or
//!   reordered field or variant, another type for a field) needs a version
//!   bump, after which the goldens are regenerated.
//!
//! [`Goldens`] enforces it. For each type it encodes the cases, checks that
//! they decode back to themselves, that every variant of an enum has a case
//! and that no case leaves an `Option` empty or a list or map empty, and
//! compares the bytes with the type's file (`<dir>/<name>.hex`). A
//! difference fails with a message naming the type and saying what to do.
//! `GOLDEN_UPDATE=1` writes the files — a new file, cases appended to a
//! file, or every file after a version bump — but never overwrites a case
//! of a golden made under the current version with other bytes: a format
//! change that forgot its version bump cannot be regenerated into passing.
//!
//! File format, one line each, `#` lines are comments:
//!
//! ```text
//! version PROTOCOL_VERSION 1
//! case <label> <hex bytes>
//! ```
//!
//! A case's label is its variant name for an enum (`value` otherwise),
//! with `#2`, `#3`, … for further cases of the same variant.

pub mod fixtures;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Debug, Display, Write as _};
use std::path::{Path, PathBuf};

use serde::de::{self, DeserializeOwned, Visitor};
use serde::ser::{self, Serialize};

/// Set to `1` to write golden files (see the module doc for what may be
/// written).
pub const UPDATE_ENV: &str = "GOLDEN_UPDATE";

/// Most bytes of each side a difference message shows, in hex.
const DIFF_BYTES_SHOWN: usize = 48;

/// The golden files of one format version in one directory; collects every
/// failure, reported together by [`Goldens::finish`].
#[derive(Debug)]
pub struct Goldens {
    dir: PathBuf,
    version_name: &'static str,
    version: u32,
    update: bool,
    failures: Vec<String>,
    written: Vec<PathBuf>,
}

/// Every golden check that failed, each naming its type and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoldenFailures(pub Vec<String>);

impl Display for GoldenFailures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} golden format check(s) failed:", self.0.len())?;
        for failure in &self.0 {
            writeln!(f, "\n- {failure}")?;
        }
        Ok(())
    }
}

impl std::error::Error for GoldenFailures {}

/// A parsed golden file.
#[derive(Debug, PartialEq, Eq)]
struct GoldenFile {
    version_name: String,
    version: u32,
    /// In file order.
    cases: Vec<(String, Vec<u8>)>,
}

impl Goldens {
    /// Goldens in `dir` for a format at `version`, named `version_name` in
    /// messages (e.g. `PROTOCOL_VERSION`). Writes files only if
    /// [`UPDATE_ENV`] is set (to anything but `0` or nothing).
    pub fn new(dir: impl Into<PathBuf>, version_name: &'static str, version: u32) -> Goldens {
        let update = std::env::var(UPDATE_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
        Goldens {
            dir: dir.into(),
            version_name,
            version,
            update,
            failures: Vec::new(),
            written: Vec::new(),
        }
    }

    /// Overrides whether files are written (the harness's own tests).
    pub fn updating(mut self, update: bool) -> Goldens {
        self.update = update;
        self
    }

    /// The files written so far.
    pub fn written(&self) -> &[PathBuf] {
        &self.written
    }

    /// Checks the postcard encoding of `cases` of `T` against
    /// `<dir>/<name>.hex`; see the module doc for every rule.
    pub fn check<T>(&mut self, name: &str, cases: &[T])
    where
        T: Serialize + DeserializeOwned + PartialEq + Debug,
    {
        let type_name = std::any::type_name::<T>();
        let variants = enum_variants::<T>();
        let mut labelled = Vec::with_capacity(cases.len());
        let mut seen_variants = BTreeSet::new();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for case in cases {
            let bytes = match postcard::to_allocvec(case) {
                Ok(bytes) => bytes,
                Err(e) => {
                    self.fail(format!(
                        "{type_name}: a case does not encode ({e}): {case:?}"
                    ));
                    return;
                }
            };
            let base = match variants {
                Some(names) => {
                    match leading_varint(&bytes).and_then(|i| names.get(i).map(|n| (i, n))) {
                        Some((index, name)) => {
                            seen_variants.insert(index);
                            (*name).to_string()
                        }
                        None => {
                            self.fail(format!(
                                "{type_name}: a case does not start with a variant index: {case:?}"
                            ));
                            return;
                        }
                    }
                }
                None => "value".to_string(),
            };
            let count = counts.entry(base.clone()).or_insert(0);
            *count += 1;
            let label = if *count == 1 {
                base
            } else {
                format!("{base}#{count}")
            };
            match postcard::from_bytes::<T>(&bytes) {
                Ok(back) if back == *case => {}
                Ok(back) => self.fail(format!(
                    "{type_name}: case `{label}` decodes to another value: {back:?}"
                )),
                Err(e) => self.fail(format!("{type_name}: case `{label}` does not decode: {e}")),
            }
            let absent = absent_fields(case);
            if !absent.is_empty() {
                self.fail(format!(
                    "{type_name}: case `{label}` leaves {} unset; a golden case sets every \
                     field (Some, non-empty lists and maps) so that its bytes pin them",
                    absent.join(", ")
                ));
            }
            labelled.push((label, bytes));
        }
        if let Some(names) = variants {
            for (index, variant) in names.iter().enumerate() {
                if !seen_variants.contains(&index) {
                    self.fail(format!(
                        "{type_name}: variant `{variant}` has no case; every variant is pinned \
                         (add one to the fixtures)"
                    ));
                }
            }
        }
        self.check_bytes(name, type_name, labelled);
    }

    /// Checks already encoded cases of `what` (a format that is not one
    /// postcard value: redb keys, file headers) against `<dir>/<name>.hex`.
    pub fn check_bytes(&mut self, name: &str, what: &str, cases: Vec<(String, Vec<u8>)>) {
        let path = self.dir.join(format!("{name}.hex"));
        let shown = shown(&path);
        let current = GoldenFile {
            version_name: self.version_name.to_string(),
            version: self.version,
            cases,
        };
        let (vname, version) = (self.version_name, self.version);
        let regenerate = format!("bump {vname} and regenerate with {UPDATE_ENV}=1");
        let old = match std::fs::read_to_string(&path) {
            Ok(text) => match parse(&text) {
                Ok(file) => Some(file),
                Err(reason) => {
                    self.fail(format!("{what}: golden {} is malformed: {reason}", shown));
                    return;
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                self.fail(format!("{what}: cannot read golden {}: {e}", shown));
                return;
            }
        };
        let Some(old) = old else {
            if self.update {
                self.write(&path, what, &current);
            } else {
                self.fail(format!(
                    "{what}: no golden file {}; create it with {UPDATE_ENV}=1",
                    shown
                ));
            }
            return;
        };
        if (old.version_name.as_str(), old.version) != (vname, version) {
            if self.update {
                self.write(&path, what, &current);
            } else {
                self.fail(format!(
                    "{what}: golden {} was made under {} {}, this build has {vname} {version}; \
                     regenerate with {UPDATE_ENV}=1",
                    shown, old.version_name, old.version
                ));
            }
            return;
        }
        let now: BTreeMap<&str, &[u8]> = current
            .cases
            .iter()
            .map(|(label, bytes)| (label.as_str(), bytes.as_slice()))
            .collect();
        let mut broken = Vec::new();
        for (label, golden) in &old.cases {
            match now.get(label.as_str()) {
                Some(bytes) if *bytes == golden.as_slice() => {}
                Some(bytes) => broken.push(format!(
                    "the encoding of case `{label}` changed ({})",
                    difference(golden, bytes)
                )),
                None => broken.push(format!(
                    "case `{label}` is gone (enum variants are append-only)"
                )),
            }
        }
        if !broken.is_empty() {
            let refused = if self.update {
                format!(
                    " {UPDATE_ENV}=1 does not overwrite a golden made under the same {vname} \
                     with other bytes."
                )
            } else {
                String::new()
            };
            self.fail(format!(
                "{what}: the format differs from golden {} (made under {vname} {version}): {}. \
                 A format change needs a version bump: {regenerate}.{refused}",
                shown,
                broken.join("; ")
            ));
            return;
        }
        let known: BTreeSet<&str> = old.cases.iter().map(|(label, _)| label.as_str()).collect();
        let added: Vec<&str> = current
            .cases
            .iter()
            .map(|(label, _)| label.as_str())
            .filter(|label| !known.contains(label))
            .collect();
        if added.is_empty() {
            return;
        }
        if self.update {
            self.write(&path, what, &current);
        } else {
            self.fail(format!(
                "{what}: case(s) {} have no golden in {}; an appended variant (or a new case) \
                 is a compatible change: record it with {UPDATE_ENV}=1",
                added
                    .iter()
                    .map(|label| format!("`{label}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                shown
            ));
        }
    }

    /// `Ok` if every check passed, else every failure.
    pub fn finish(self) -> Result<(), GoldenFailures> {
        if self.failures.is_empty() {
            Ok(())
        } else {
            Err(GoldenFailures(self.failures))
        }
    }

    /// Panics with every failure, if any (for tests).
    #[track_caller]
    pub fn assert_all(self) {
        if let Err(failures) = self.finish() {
            panic!("{failures}");
        }
    }

    fn fail(&mut self, message: String) {
        self.failures.push(message);
    }

    fn write(&mut self, path: &Path, what: &str, file: &GoldenFile) {
        let text = render(what, file);
        let result = std::fs::create_dir_all(&self.dir).and_then(|()| std::fs::write(path, text));
        match result {
            Ok(()) => self.written.push(path.to_path_buf()),
            Err(e) => self.fail(format!(
                "{what}: cannot write golden {}: {e}",
                path.display()
            )),
        }
    }
}

/// `path` relative to the working directory (a test's package) when it is
/// inside it, for messages.
fn shown(path: &Path) -> String {
    let relative = std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf));
    relative
        .unwrap_or_else(|| path.to_path_buf())
        .display()
        .to_string()
}

/// Where two encodings first differ, with the start of each, in hex.
fn difference(golden: &[u8], now: &[u8]) -> String {
    let at = golden
        .iter()
        .zip(now)
        .position(|(a, b)| a != b)
        .unwrap_or(golden.len().min(now.len()));
    let start = at.saturating_sub(8);
    let shown = |bytes: &[u8]| {
        let end = bytes.len().min(start + DIFF_BYTES_SHOWN);
        let more = if end < bytes.len() { "…" } else { "" };
        format!("{}{more}", hex(&bytes[start.min(bytes.len())..end]))
    };
    format!(
        "first difference at byte {at}; golden {} bytes, now {}; from byte {start}: golden {}, \
         now {}",
        golden.len(),
        now.len(),
        shown(golden),
        shown(now)
    )
}

fn render(what: &str, file: &GoldenFile) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# Golden encodings of {what}, one case a line.");
    let _ = writeln!(
        out,
        "# Not edited by hand: {UPDATE_ENV}=1 appends new cases, and rewrites cases only after \
         a version bump (see wire::golden)."
    );
    let _ = writeln!(out, "version {} {}", file.version_name, file.version);
    for (label, bytes) in &file.cases {
        let _ = writeln!(
            out,
            "case {label} {}",
            if bytes.is_empty() {
                "-".to_string()
            } else {
                hex(bytes)
            }
        );
    }
    out
}

fn parse(text: &str) -> Result<GoldenFile, String> {
    let mut version = None;
    let mut cases = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["version", name, n] => {
                let n = n
                    .parse::<u32>()
                    .map_err(|e| format!("line {}: version {n:?}: {e}", number + 1))?;
                version = Some((name.to_string(), n));
            }
            ["case", label, bytes] => {
                let bytes = if *bytes == "-" {
                    Vec::new()
                } else {
                    unhex(bytes).map_err(|e| format!("line {}: {e}", number + 1))?
                };
                cases.push((label.to_string(), bytes));
            }
            _ => return Err(format!("line {}: expected `version` or `case`", number + 1)),
        }
    }
    let (version_name, version) = version.ok_or("no `version` line")?;
    Ok(GoldenFile {
        version_name,
        version,
        cases,
    })
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

fn unhex(text: &str) -> Result<Vec<u8>, String> {
    if text.len() % 2 != 0 {
        return Err(format!("odd number of hex digits ({})", text.len()));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(|| format!("not hex at character {i}"))
        })
        .collect()
}

/// postcard's leading varint (an enum's variant index), if any.
fn leading_varint(bytes: &[u8]) -> Option<usize> {
    let mut value: u64 = 0;
    for (i, byte) in bytes.iter().take(5).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return usize::try_from(value).ok();
        }
    }
    None
}

// ---------------------------------------------------------------- probes

/// The variant names of `T` if it is an enum, as serde's derive lists them
/// (in declaration order, which is postcard's index order).
pub fn enum_variants<T: DeserializeOwned>() -> Option<&'static [&'static str]> {
    match T::deserialize(VariantProbe) {
        Err(ProbeError(variants)) => variants,
        Ok(_) => None,
    }
}

/// A deserializer that only answers "which variants?".
struct VariantProbe;

#[derive(Debug)]
struct ProbeError(Option<&'static [&'static str]>);

impl Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("variant probe")
    }
}

impl std::error::Error for ProbeError {}

impl de::Error for ProbeError {
    fn custom<M: Display>(_: M) -> Self {
        ProbeError(None)
    }
}

impl<'de> de::Deserializer<'de> for VariantProbe {
    type Error = ProbeError;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ProbeError> {
        Err(ProbeError(None))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, ProbeError> {
        Err(ProbeError(Some(variants)))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct identifier ignored_any
    }
}

/// The fields of `value` that are unset: `None`, or an empty list or map,
/// as `field.path` (a variant's name is part of the path).
pub fn absent_fields<T: Serialize + ?Sized>(value: &T) -> Vec<String> {
    let mut walk = Walk::default();
    // The walk's own error is never returned.
    let _ = value.serialize(&mut walk);
    walk.absent
}

#[derive(Default)]
struct Walk {
    path: Vec<String>,
    absent: Vec<String>,
}

impl Walk {
    fn record(&mut self, what: &str) {
        let path = if self.path.is_empty() {
            "the value".to_string()
        } else {
            self.path.join(".")
        };
        self.absent.push(format!("{path} ({what})"));
    }

    fn nested<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) -> Result<(), WalkError> {
        self.path.push(name.to_string());
        let result = value.serialize(&mut *self);
        self.path.pop();
        result
    }
}

#[derive(Debug)]
struct WalkError;

impl Display for WalkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("walk")
    }
}

impl std::error::Error for WalkError {}

impl ser::Error for WalkError {
    fn custom<M: Display>(_: M) -> Self {
        WalkError
    }
}

impl<'a> ser::Serializer for &'a mut Walk {
    type Ok = ();
    type Error = WalkError;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = VariantWalk<'a>;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = VariantWalk<'a>;

    fn serialize_bool(self, _: bool) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_i8(self, _: i8) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_i16(self, _: i16) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_i32(self, _: i32) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_i64(self, _: i64) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_u8(self, _: u8) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_u16(self, _: u16) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_u32(self, _: u32) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_u64(self, _: u64) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_f32(self, _: f32) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_f64(self, _: f64) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_char(self, _: char) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_str(self, _: &str) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_bytes(self, bytes: &[u8]) -> Result<(), WalkError> {
        if bytes.is_empty() {
            self.record("empty bytes");
        }
        Ok(())
    }
    fn serialize_none(self) -> Result<(), WalkError> {
        self.record("None");
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), WalkError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), WalkError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), WalkError> {
        self.nested(variant, value)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Self, WalkError> {
        if len == Some(0) {
            self.record("empty list");
        }
        Ok(self)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self, WalkError> {
        Ok(self)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self, WalkError> {
        Ok(self)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<VariantWalk<'a>, WalkError> {
        self.path.push(variant.to_string());
        Ok(VariantWalk(self))
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Self, WalkError> {
        if len == Some(0) {
            self.record("empty map");
        }
        Ok(self)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, WalkError> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<VariantWalk<'a>, WalkError> {
        self.path.push(variant.to_string());
        Ok(VariantWalk(self))
    }
}

impl ser::SerializeSeq for &mut Walk {
    type Ok = ();
    type Error = WalkError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), WalkError> {
        self.nested("[]", value)
    }
    fn end(self) -> Result<(), WalkError> {
        Ok(())
    }
}

impl ser::SerializeTuple for &mut Walk {
    type Ok = ();
    type Error = WalkError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), WalkError> {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), WalkError> {
        Ok(())
    }
}

impl ser::SerializeTupleStruct for &mut Walk {
    type Ok = ();
    type Error = WalkError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), WalkError> {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), WalkError> {
        Ok(())
    }
}

impl ser::SerializeMap for &mut Walk {
    type Ok = ();
    type Error = WalkError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), WalkError> {
        self.nested("{key}", key)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), WalkError> {
        self.nested("{value}", value)
    }
    fn end(self) -> Result<(), WalkError> {
        Ok(())
    }
}

impl ser::SerializeStruct for &mut Walk {
    type Ok = ();
    type Error = WalkError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), WalkError> {
        self.nested(key, value)
    }
    fn end(self) -> Result<(), WalkError> {
        Ok(())
    }
}

/// A tuple or struct variant being walked; its name is on the path until
/// it ends.
struct VariantWalk<'a>(&'a mut Walk);

impl ser::SerializeTupleVariant for VariantWalk<'_> {
    type Ok = ();
    type Error = WalkError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), WalkError> {
        value.serialize(&mut *self.0)
    }
    fn end(self) -> Result<(), WalkError> {
        self.0.path.pop();
        Ok(())
    }
}

impl ser::SerializeStructVariant for VariantWalk<'_> {
    type Ok = ();
    type Error = WalkError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), WalkError> {
        self.0.nested(key, value)
    }
    fn end(self) -> Result<(), WalkError> {
        self.0.path.pop();
        Ok(())
    }
}

#[cfg(test)]
mod tests;

//! Label and field selectors, parsed from their query-string form and
//! matched against JSON objects.
//!
//! Label selectors: `k=v`, `k==v`, `k!=v`, `k` (exists), `!k` (absent),
//! `k in (a,b)`, `k notin (a,b)`, comma-joined (all must hold). Field
//! selectors: `path=v`, `path==v`, `path!=v` on any dotted path of the
//! object (`metadata.name`, `status.phase`, …); a missing field is `""`.
//! Real servers accept only a few field paths per kind; this accepts any.

use serde_json::Value;

/// Limit on a selector's length in bytes (and so on its requirements).
pub const SELECTOR_BYTES_MAX: usize = 4096;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` (or `==`).
    Equals(String, String),
    /// `key!=value`: also true when the label is absent.
    NotEquals(String, String),
    /// `key`: the label is present.
    Exists(String),
    /// `!key`: the label is absent.
    NotExists(String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)`: also true when the label is absent.
    NotIn(String, Vec<String>),
}

/// A conjunction of label requirements; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    /// All must hold.
    pub requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses the `labelSelector` query value.
    pub fn parse(input: &str) -> Result<LabelSelector, String> {
        if input.len() > SELECTOR_BYTES_MAX {
            return Err(format!("selector longer than {SELECTOR_BYTES_MAX} bytes"));
        }
        let mut requirements = Vec::new();
        for term in split_terms(input)? {
            requirements.push(parse_term(&term)?);
        }
        Ok(LabelSelector { requirements })
    }

    /// Builds `k=v,…` from a `matchLabels` map (for `Scale.status.selector`).
    pub fn from_match_labels(labels: &serde_json::Map<String, Value>) -> LabelSelector {
        let requirements = labels
            .iter()
            .map(|(k, v)| Requirement::Equals(k.clone(), v.as_str().unwrap_or("").to_string()))
            .collect();
        LabelSelector { requirements }
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object);
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
        })
    }

    /// Whether it has no requirement (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

impl std::fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let terms: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::Exists(k) => k.clone(),
                Requirement::NotExists(k) => format!("!{k}"),
                Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
            })
            .collect();
        f.write_str(&terms.join(","))
    }
}

/// Splits on commas outside parentheses; empty terms are dropped.
fn split_terms(input: &str) -> Result<Vec<String>, String> {
    let mut terms = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    for c in input.chars() {
        match c {
            '(' => {
                depth += 1;
                current.push(c);
            }
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("unbalanced ')' in selector {input:?}"))?;
                current.push(c);
            }
            ',' if depth == 0 => terms.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced '(' in selector {input:?}"));
    }
    terms.push(current);
    Ok(terms
        .into_iter()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect())
}

fn parse_term(term: &str) -> Result<Requirement, String> {
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Requirement::NotExists(key_checked(key.trim())?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(Requirement::NotEquals(
            key_checked(k.trim())?,
            value_checked(v.trim())?,
        ));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Requirement::Equals(
            key_checked(k.trim())?,
            value_checked(v.trim())?,
        ));
    }
    let words: Vec<&str> = term.splitn(2, char::is_whitespace).collect();
    if let [key, rest] = words.as_slice() {
        let rest = rest.trim();
        let (op, list) = if let Some(list) = rest.strip_prefix("notin") {
            ("notin", list)
        } else if let Some(list) = rest.strip_prefix("in") {
            ("in", list)
        } else {
            return Err(format!("unknown operator in selector term {term:?}"));
        };
        let list = list
            .trim()
            .strip_prefix('(')
            .and_then(|l| l.strip_suffix(')'))
            .ok_or_else(|| format!("expected a parenthesised list in {term:?}"))?;
        let values = list
            .split(',')
            .map(|v| value_checked(v.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        let key = key_checked(key)?;
        return Ok(if op == "in" {
            Requirement::In(key, values)
        } else {
            Requirement::NotIn(key, values)
        });
    }
    Ok(Requirement::Exists(key_checked(term)?))
}

fn key_checked(key: &str) -> Result<String, String> {
    let ok = !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'));
    if ok {
        Ok(key.to_string())
    } else {
        Err(format!("invalid label key {key:?}"))
    }
}

fn value_checked(value: &str) -> Result<String, String> {
    let ok = value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if ok {
        Ok(value.to_string())
    } else {
        Err(format!("invalid label value {value:?}"))
    }
}

/// A conjunction of `path=value` / `path!=value` field requirements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// (dotted path, value, equal?)
    pub requirements: Vec<(String, String, bool)>,
}

impl FieldSelector {
    /// Parses `a=b,c!=d` (field paths such as `metadata.name`); the error names what is wrong.
    pub fn parse(input: &str) -> Result<FieldSelector, String> {
        if input.len() > SELECTOR_BYTES_MAX {
            return Err(format!("selector longer than {SELECTOR_BYTES_MAX} bytes"));
        }
        let mut requirements = Vec::new();
        for term in input.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (path, value, equal) = if let Some((p, v)) = term.split_once("!=") {
                (p, v, false)
            } else if let Some((p, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (p, v, true)
            } else {
                return Err(format!("invalid field selector term {term:?}"));
            };
            let path = path.trim();
            if path.is_empty() || path.split('.').any(str::is_empty) {
                return Err(format!("invalid field path {path:?}"));
            }
            requirements.push((path.to_string(), value.trim().to_string(), equal));
        }
        Ok(FieldSelector { requirements })
    }

    /// Whether `object` satisfies every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        self.requirements.iter().all(|(path, value, equal)| {
            let mut at = Some(object);
            for part in path.split('.') {
                at = at.and_then(|v| v.get(part));
            }
            let found = match at {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (found == *value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"name": "p", "labels": labels}, "status": {"phase": "Running"}})
    }

    #[test]
    fn parses_every_operator() {
        let s = LabelSelector::parse("app=x, tier==web,env!=prod,canary,!legacy").unwrap();
        assert_eq!(
            s.requirements,
            vec![
                Requirement::Equals("app".into(), "x".into()),
                Requirement::Equals("tier".into(), "web".into()),
                Requirement::NotEquals("env".into(), "prod".into()),
                Requirement::Exists("canary".into()),
                Requirement::NotExists("legacy".into()),
            ]
        );
        let s = LabelSelector::parse("zone in (a, b),app.kubernetes.io/name notin (c)").unwrap();
        assert_eq!(
            s.requirements,
            vec![
                Requirement::In("zone".into(), vec!["a".into(), "b".into()]),
                Requirement::NotIn("app.kubernetes.io/name".into(), vec!["c".into()]),
            ]
        );
        assert!(LabelSelector::parse("").unwrap().is_empty());
        assert_eq!(
            LabelSelector::parse("a=1,!b,c in (x,y)")
                .unwrap()
                .to_string(),
            "a=1,!b,c in (x,y)"
        );
    }

    #[test]
    fn rejects_malformed_selectors() {
        for bad in [
            "a=(",
            "a in (x",
            "a) ",
            "a=b c",
            "a ~ b",
            "k$=v",
            "a in x",
            &"k".repeat(5000),
        ] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn matches_labels() {
        let p = pod(json!({"app": "x", "env": "dev"}));
        let yes = [
            "app=x",
            "app=x,env!=prod",
            "env",
            "!canary",
            "env in (dev,qa)",
            "env notin (prod)",
            "nope!=1",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&p), "{s}");
        }
        let no = [
            "app=y",
            "env!=dev",
            "canary",
            "!app",
            "env in (qa)",
            "env notin (dev)",
            "app=x,env=prod",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&p), "{s}");
        }
        let unlabelled = json!({"metadata": {"name": "q"}});
        assert!(LabelSelector::parse("!app").unwrap().matches(&unlabelled));
        assert!(!LabelSelector::parse("app").unwrap().matches(&unlabelled));
    }

    #[test]
    fn matches_fields() {
        let p = pod(json!({}));
        assert!(FieldSelector::parse("metadata.name=p").unwrap().matches(&p));
        assert!(
            FieldSelector::parse("metadata.name==p,status.phase!=Pending")
                .unwrap()
                .matches(&p)
        );
        assert!(!FieldSelector::parse("metadata.name=q").unwrap().matches(&p));
        assert!(
            FieldSelector::parse("metadata.namespace=")
                .unwrap()
                .matches(&p)
        );
        assert!(FieldSelector::parse("bogus").is_err());
        assert!(FieldSelector::parse("a..b=c").is_err());
    }
}

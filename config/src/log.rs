//! [`LogFormat`]: how ctrl and krane write their logs, set by
//! `log_format` in their config files or `--log-format` on the command
//! line (which wins).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The shape of each log line on stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`,
    /// `fields` (with `message`) and the current `span` / `spans`.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<LogFormat, String> {
        match text {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "unknown log format {other:?}: expected text or json"
            )),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::LogFormat;

    #[test]
    fn parses_both_formats_and_names_a_bad_one() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        let err = "yaml".parse::<LogFormat>().unwrap_err();
        assert!(
            err.contains("\"yaml\"") && err.contains("text or json"),
            "{err}"
        );
        assert_eq!(LogFormat::Json.to_string(), "json");
    }
}

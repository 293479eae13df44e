//! `ctrl notify add | list | remove | deliveries | replay`: webhook
//! endpoints and the deliveries of their notifications. A secret is read
//! from a file (never from the command line) and never printed: the list
//! shows `set` or `none`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use config::OperatorConfig;
use node::client::Client;
use serde::Serialize;
use wire::notify::{AddEndpoint, Delivery, EndpointView, SECRET_BYTES_MAX};
use wire::operator::LIST_PAGE_MAX;
use wire::operator::request::{
    ListDeliveries, ListNotifyEndpoints, RemoveNotifyEndpoint, ReplayDelivery,
};

use super::{Output, RequestIdArg};

/// Most deliveries `ctrl notify deliveries` reads (the node keeps at most
/// `storage::DELIVERIES_MAX`).
const DELIVERIES_SHOWN_MAX: usize = 10_000;

#[derive(Debug, Subcommand)]
pub(crate) enum NotifyCommand {
    /// Add a webhook endpoint: every deployment ready or failed and every
    /// rollout transition is POSTed to it (JSON with a `text` field, as
    /// Slack-compatible receivers expect).
    Add(AddArgs),
    /// List the endpoints (secrets shown as set or none).
    List {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Remove an endpoint; its pending deliveries become dead.
    Remove {
        name: String,
        #[command(flatten)]
        request_id: RequestIdArg,
    },
    /// List the deliveries: pending, delivered or dead, with attempts,
    /// the last error and the next attempt time.
    Deliveries {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Make a dead or delivered delivery pending again (attempts reset).
    Replay {
        id: u64,
        #[command(flatten)]
        request_id: RequestIdArg,
    },
}

#[derive(Debug, Args)]
pub(crate) struct AddArgs {
    /// The endpoint's name, a lowercase DNS label.
    pub name: String,
    /// Where to POST: an http or https URL.
    #[arg(long)]
    pub url: String,
    /// A file holding the HMAC-SHA256 key of the `x-ctrl-signature`
    /// header (trailing newlines are ignored).
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    #[command(flatten)]
    pub request_id: RequestIdArg,
}

/// An endpoint in `ctrl notify list -o json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct EndpointLine {
    pub name: String,
    pub url: String,
    /// `set` or `none`.
    pub secret: &'static str,
    pub created_at_ms: u64,
}

impl From<&EndpointView> for EndpointLine {
    fn from(view: &EndpointView) -> EndpointLine {
        EndpointLine {
            name: view.name.clone(),
            url: view.url.clone(),
            secret: if view.secret_set { "set" } else { "none" },
            created_at_ms: view.created_at_ms,
        }
    }
}

/// `ctrl notify deliveries -o json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct DeliveryList {
    pub deliveries: Vec<Delivery>,
    /// Notifications never stored: the table was full of undelivered ones.
    pub dropped: u64,
}

pub(super) async fn run(config: &OperatorConfig, command: NotifyCommand) -> Result<()> {
    let client = Client::new(config)?;
    match command {
        NotifyCommand::Add(args) => {
            let secret = match &args.secret_file {
                Some(path) => Some(read_secret(path)?),
                None => None,
            };
            let request = AddEndpoint {
                name: args.name,
                url: args.url,
                secret,
            };
            let request_id = Some(args.request_id.or_new());
            let view = client.call_with_id(request, request_id).await?;
            let line = EndpointLine::from(&view);
            println!("{} {} secret {}", line.name, line.url, line.secret);
        }
        NotifyCommand::List { output } => {
            let views = client.call(ListNotifyEndpoints).await?;
            let lines: Vec<EndpointLine> = views.iter().map(EndpointLine::from).collect();
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&lines)?),
                Output::Text => print!("{}", endpoint_table(&lines)),
            }
        }
        NotifyCommand::Remove { name, request_id } => {
            let request = RemoveNotifyEndpoint { name };
            let removed = client
                .call_with_id(request, Some(request_id.or_new()))
                .await?;
            println!(
                "{} removed ({} pending deliveries now dead)",
                removed.name, removed.deliveries_dead
            );
        }
        NotifyCommand::Deliveries { output } => {
            let list = deliveries(&client).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&list)?),
                Output::Text => print!("{}", delivery_table(&list)),
            }
        }
        NotifyCommand::Replay { id, request_id } => {
            let request = ReplayDelivery { id };
            let delivery = client
                .call_with_id(request, Some(request_id.or_new()))
                .await?;
            println!(
                "delivery {} of event {} is pending again",
                delivery.id, delivery.event_id
            );
        }
    }
    Ok(())
}

/// The secret in `path`, without trailing newlines.
fn read_secret(path: &PathBuf) -> Result<String> {
    let bytes = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if bytes > u64::try_from(SECRET_BYTES_MAX * 2).unwrap_or(u64::MAX) {
        bail!(
            "{} is longer than a secret may be ({SECRET_BYTES_MAX} bytes)",
            path.display()
        );
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let secret = text.trim_end_matches(['\n', '\r']).to_string();
    if secret.is_empty() {
        bail!("{} holds no secret", path.display());
    }
    Ok(secret)
}

/// Every delivery, page by page, at most [`DELIVERIES_SHOWN_MAX`].
async fn deliveries(client: &Client) -> Result<DeliveryList> {
    let mut list = DeliveryList {
        deliveries: Vec::new(),
        dropped: 0,
    };
    let mut after = 0;
    loop {
        let request = ListDeliveries {
            after,
            limit: LIST_PAGE_MAX,
        };
        let page = client.call(request).await?;
        list.deliveries.extend(page.items);
        list.dropped = page.dropped;
        match page.next_after {
            Some(next) if list.deliveries.len() < DELIVERIES_SHOWN_MAX => after = next,
            _ => break,
        }
    }
    Ok(list)
}

fn endpoint_table(lines: &[EndpointLine]) -> String {
    let mut out = format!("{:<20} {:<7} URL\n", "NAME", "SECRET");
    for line in lines {
        out.push_str(&format!(
            "{:<20} {:<7} {}\n",
            line.name, line.secret, line.url
        ));
    }
    out
}

fn delivery_table(list: &DeliveryList) -> String {
    let mut out = format!(
        "{:<8} {:<8} {:<16} {:<24} {:<10} {:<8} {:<15} LAST ERROR\n",
        "ID", "EVENT", "ENDPOINT", "KIND", "STATE", "ATTEMPTS", "NEXT ATTEMPT"
    );
    for d in &list.deliveries {
        let next = if d.state == wire::notify::DeliveryState::Pending {
            d.next_attempt_at_ms.to_string()
        } else {
            "-".to_string()
        };
        out.push_str(&format!(
            "{:<8} {:<8} {:<16} {:<24} {:<10} {:<8} {:<15} {}\n",
            d.id,
            d.event_id,
            d.endpoint,
            d.event.kind(),
            d.state.as_str(),
            d.attempts,
            next,
            d.last_error.as_deref().unwrap_or("-"),
        ));
    }
    if list.dropped > 0 {
        out.push_str(&format!(
            "{} notifications were dropped: the delivery table was full of undelivered ones\n",
            list.dropped
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use wire::golden::fixtures;

    use super::*;

    #[test]
    fn the_list_shows_whether_a_secret_is_set_never_the_secret() {
        let view = fixtures::endpoint_view();
        let line = EndpointLine::from(&view);
        assert_eq!(line.secret, "set");
        let table = endpoint_table(&[line]);
        assert!(!table.contains("s3cr"), "{table}");
        assert!(table.contains("set"), "{table}");
    }

    #[test]
    fn the_delivery_table_names_the_kind_state_and_error_and_the_drops() {
        let table = delivery_table(&DeliveryList {
            deliveries: vec![fixtures::delivery()],
            dropped: 3,
        });
        assert!(table.contains("deployment.failed"), "{table}");
        assert!(table.contains("dead"), "{table}");
        assert!(table.contains("HTTP 503"), "{table}");
        assert!(table.contains("3 notifications were dropped"), "{table}");
    }

    #[test]
    fn a_secret_file_loses_its_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "k3y\n").unwrap();
        assert_eq!(read_secret(&path).unwrap(), "k3y");
        std::fs::write(&path, "\n").unwrap();
        assert!(read_secret(&path).is_err());
    }
}

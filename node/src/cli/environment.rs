//! `ctrl get environment` and `ctrl list environments`: the live
//! deployment and, per region, where the traffic goes (the route krane
//! writes for the sentinel, its generation and when it changed, the
//! generation the region's sentinel reports serving and since when) and
//! the environment's stable address there.

use anyhow::Result;
use config::OperatorConfig;
use node::client::Client;
use wire::operator::EnvironmentView;
use wire::operator::request::{DescribeEnvironment, ListEnvironments};

use super::Output;

/// Environments per `ListEnvironments` call of `ctrl list environments`.
const LIST_PAGE: u32 = 200;

/// `ctrl get environment ID`.
pub(super) async fn get(config: &OperatorConfig, id: String, output: Output) -> Result<()> {
    let client = Client::new(config)?;
    let view = client.call(DescribeEnvironment { id }).await?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&view)?),
        Output::Text => print_view(&view),
    }
    Ok(())
}

/// `ctrl list environments`.
pub(super) async fn list(config: &OperatorConfig, output: Output) -> Result<()> {
    let client = Client::new(config)?;
    let page = |after| ListEnvironments {
        after,
        limit: LIST_PAGE,
    };
    let all = client.all_pages(page).await?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&all)?),
        Output::Text => {
            println!(
                "{:<24} {:<12} {:<24} {:<10} {:<10} ADDRESS",
                "ENVIRONMENT", "REGION", "ROUTED TO", "GENERATION", "SERVING"
            );
            for view in &all {
                let id = &view.environment.id;
                if view.routes.is_empty() {
                    println!("{id:<24} {:<12} {:<24} {:<10} {:<10} -", "-", "-", "-", "-");
                }
                for r in &view.routes {
                    let serving = r
                        .serving()
                        .map_or_else(|| "-".to_string(), |(g, _)| g.to_string());
                    println!(
                        "{id:<24} {:<12} {:<24} {:<10} {:<10} {}",
                        r.route.region,
                        routed_to(r),
                        r.route.version,
                        serving,
                        r.address
                    );
                }
            }
        }
    }
    Ok(())
}

fn routed_to(route: &wire::operator::RouteView) -> String {
    let backends: Vec<&str> = route
        .route
        .backends
        .iter()
        .map(|b| b.deployment_id.as_str())
        .collect();
    if backends.is_empty() {
        "(nothing live)".to_string()
    } else {
        backends.join(",")
    }
}

fn time(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(at).to_string()
}

fn print_view(view: &EnvironmentView) {
    let e = &view.environment;
    println!("environment: {}", e.id);
    println!(
        "live:        {}",
        e.live_deployment_id.as_deref().unwrap_or("(none)")
    );
    if let Some(attempt) = &e.latest_attempt {
        println!("deploying:   {attempt}");
    }
    if !e.formerly_live.is_empty() {
        println!("formerly:    {}", e.formerly_live.join(", "));
    }
    if view.routes.is_empty() {
        println!("routes:      none yet (written when a deploy reaches its network step)");
        return;
    }
    println!("routes:");
    for r in &view.routes {
        let route = &r.route;
        println!("  {}:", route.region);
        println!("    address:    {}", r.address);
        println!("    routed to:  {}", routed_to(r));
        for b in &route.backends {
            println!(
                "      {} weight {} port {}",
                b.deployment_id, b.weight, b.port
            );
        }
        if let Some(pending) = &route.pending_deployment_id {
            println!("    waiting for {pending} to run in this region before routing to it");
        }
        println!(
            "    generation: {} (changed {})",
            route.version,
            time(route.updated_at_ms)
        );
        match r.serving() {
            Some((generation, since_ms)) if generation >= route.version => {
                println!(
                    "    serving:    generation {generation} since {}",
                    time(since_ms)
                );
            }
            Some((generation, since_ms)) => println!(
                "    serving:    generation {generation} since {} (not yet {})",
                time(since_ms),
                route.version
            ),
            None => println!("    serving:    not reported yet"),
        }
        if let Some(rejected) = r.rejected() {
            println!("    refused by Kubernetes: {:?}", rejected.outcome);
        }
    }
}

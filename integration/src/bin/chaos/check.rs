//! The checks after the faults stop: the state read back through the
//! operator protocol, each simulated cluster against its region's desired
//! state (read as krane reads it, a full-sync watch with the region's
//! agent certificate), and the replicas compared by `ctrl cluster check`.
//! Every check returns its violations, described; none is a pass.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use anyhow::{Context, Result, bail};
use config::OperatorConfig;
use k8s_sim::Simulator;
use k8s_sim::resources::{
    CILIUM_NETWORK_POLICIES, DEPLOYMENTS, POD_DISRUPTION_BUDGETS, ResourceDef, SECRETS, SERVICES,
    STATEFUL_SETS,
};
use node::client::Client;
use serde_json::Value;
use wire::Pk;
use wire::agent::WatchEvent;
use wire::model::{Deployment, JournalEntry, Resource, SentinelDeployStatus};
use wire::operator::request::{
    DeletePolicy, History, ListDeployments, ListPolicies, ListSentinels, RolloutStatus,
};
use wire::operator::{
    LIST_PAGE_MAX, Operation, OperatorRequest, OperatorResponse, PolicyView, SentinelView,
};
use wire::rollout::{Rollout, RolloutState};

use crate::ops::{Kind, OP_MARKER, Op, Outcome, POLICY_NAMES};

/// How long past its deadline a workflow may still be open: the leader's
/// grace after an election, a driver round and the clock's granularity.
pub(crate) const WORKFLOW_GRACE_MS: u64 = 30_000;
/// Bound on reading a region's full sync.
pub(crate) const SYNC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Bound on `ctrl cluster check`.
pub(crate) const CLUSTER_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// The kinds of object krane writes (pods and replica sets are the
/// simulator's, namespaces are shared).
const MANAGED: [&ResourceDef; 6] = [
    &STATEFUL_SETS,
    &SERVICES,
    &SECRETS,
    &DEPLOYMENTS,
    &POD_DISRUPTION_BUDGETS,
    &CILIUM_NETWORK_POLICIES,
];

/// Everything the checks read from ctrl.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// Every deployment.
    pub(crate) deployments: Vec<Deployment>,
    /// The whole journal.
    pub(crate) journal: Vec<JournalEntry>,
    /// Every sentinel.
    pub(crate) sentinels: Vec<SentinelView>,
    /// Every policy.
    pub(crate) policies: Vec<PolicyView>,
    /// The latest rollout.
    pub(crate) rollout: Option<Rollout>,
}

/// Makes `call`; an error names the request.
async fn call<C: Operation + Clone + Debug>(client: &Client, call: C) -> Result<C::Answer> {
    client
        .call(call.clone())
        .await
        .with_context(|| format!("{call:?}"))
}

/// Most times [`read_state`] reads everything again because the journal
/// moved while it read.
const STATE_READS_MAX: u32 = 5;

/// Reads every deployment, journal entry, sentinel and policy, and the
/// latest rollout, page by page, as one state: the journal first and its
/// tail once more at the end, again if anything was journaled in between
/// (a timer of the workflow may fire while the checks read).
pub(crate) async fn read_state(client: &Client) -> Result<State> {
    for _ in 1..STATE_READS_MAX {
        let state = read_once(client).await?;
        let last_seq = state.journal.last().map_or(0, |e| e.seq);
        if journal_after(client, last_seq, 1).await?.0.is_empty() {
            return Ok(state);
        }
    }
    read_once(client).await
}

/// The journal entries after `after`, at most `limit`, and where the next
/// page starts.
async fn journal_after(
    client: &Client,
    after: u64,
    limit: u32,
) -> Result<(Vec<JournalEntry>, Option<u64>)> {
    let request = History {
        environment_id: None,
        deployment_id: None,
        after,
        limit,
    };
    let page = call(client, request).await?;
    Ok((page.items, page.next_after))
}

async fn read_once(client: &Client) -> Result<State> {
    let mut state = State::default();
    let mut after = 0;
    loop {
        let (entries, next_after) = journal_after(client, after, LIST_PAGE_MAX).await?;
        state.journal.extend(entries);
        match next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    let mut after = None;
    loop {
        let request = ListDeployments {
            after: after.clone(),
            limit: LIST_PAGE_MAX,
        };
        let page = call(client, request).await?;
        state.deployments.extend(page.items);
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let mut after = None;
    loop {
        let request = ListSentinels {
            after: after.clone(),
            limit: LIST_PAGE_MAX,
        };
        let page = call(client, request).await?;
        state.sentinels.extend(page.items);
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let mut after = None;
    loop {
        let request = ListPolicies {
            after: after.clone(),
            limit: LIST_PAGE_MAX,
        };
        let items = call(client, request).await?;
        let full = items.len() >= usize::try_from(LIST_PAGE_MAX)?;
        after = items
            .last()
            .map(|p| (p.policy.region.clone(), p.policy.id.clone()));
        state.policies.extend(items);
        if !full {
            break;
        }
    }
    state.rollout = call(client, RolloutStatus).await?;
    Ok(state)
}

/// What is still moving: deploys in flight, sentinel changes in progress,
/// a rollout in progress (empty: quiet).
pub(crate) fn in_progress(state: &State) -> Vec<String> {
    let mut out = Vec::new();
    for d in &state.deployments {
        if d.status.in_flight() {
            out.push(format!("deployment {} {}", d.id, d.status.as_str()));
        }
    }
    for s in &state.sentinels {
        if s.sentinel.deploy.status == SentinelDeployStatus::Progressing {
            out.push(format!("sentinel {} progressing", s.sentinel.id));
        }
    }
    if let Some(r) = &state.rollout
        && matches!(
            r.state,
            RolloutState::InProgress | RolloutState::RollingBack
        )
    {
        out.push(format!("rollout {} {}", r.seq, r.state.as_str()));
    }
    out
}

/// Workflows open past their deadline and [`WORKFLOW_GRACE_MS`] at
/// `now_ms` (wall time, which the leader stamps).
pub(crate) fn overdue(state: &State, now_ms: u64) -> Vec<String> {
    let mut out = Vec::new();
    for d in &state.deployments {
        let deadline = d.workflow.deadline_at_ms;
        if d.status.in_flight() && deadline > 0 && deadline + WORKFLOW_GRACE_MS < now_ms {
            out.push(format!(
                "deployment {} still {} {} ms past its deadline",
                d.id,
                d.status.as_str(),
                now_ms - deadline
            ));
        }
    }
    for s in &state.sentinels {
        let deploy = &s.sentinel.deploy;
        if deploy.status == SentinelDeployStatus::Progressing
            && deploy.deadline_at_ms + WORKFLOW_GRACE_MS < now_ms
        {
            out.push(format!(
                "sentinel {} still progressing {} ms past its deadline",
                s.sentinel.id,
                now_ms - deploy.deadline_at_ms
            ));
        }
    }
    out
}

/// Every acknowledged operation took effect once, and no operation more
/// than once; the journal and the state agree on the deployments (one
/// creation entry each, the status the last entry reached).
pub(crate) fn exactly_once(ops: &[Op], state: &State) -> Vec<String> {
    let mut out = Vec::new();
    // Deployments by the operation that created them.
    let mut by_op: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for d in &state.deployments {
        if let Some(n) = d.env_vars.get(OP_MARKER) {
            by_op.entry(n.clone()).or_default().push(&d.id);
        }
    }
    for (n, ids) in &by_op {
        if ids.len() > 1 {
            out.push(format!(
                "operation {n} created {} deployments: {ids:?}",
                ids.len()
            ));
        }
    }
    // Creation entries of the journal, by deployment and by request id.
    let mut created: BTreeMap<&str, Vec<&JournalEntry>> = BTreeMap::new();
    let mut by_request: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for e in state.journal.iter().filter(|e| e.from.is_none()) {
        created.entry(&e.deployment_id).or_default().push(e);
        if let Some(id) = &e.request_id {
            by_request.entry(id).or_default().push(&e.deployment_id);
        }
    }
    for (request, ids) in &by_request {
        if ids.len() > 1 {
            out.push(format!("request {request} created {ids:?} (journal)"));
        }
    }
    let ids: BTreeSet<&str> = state.deployments.iter().map(|d| d.id.as_str()).collect();
    for d in &state.deployments {
        let entries = created.get(d.id.as_str()).map_or(0, Vec::len);
        if entries != 1 {
            out.push(format!(
                "deployment {} has {entries} creation entries in the journal",
                d.id
            ));
        }
    }
    // Each deployment's status is where its last journal entry left it.
    let mut last: BTreeMap<&str, &JournalEntry> = BTreeMap::new();
    for e in &state.journal {
        if last
            .get(e.deployment_id.as_str())
            .is_none_or(|l| l.seq < e.seq)
        {
            last.insert(&e.deployment_id, e);
        }
    }
    for d in &state.deployments {
        if let Some(entry) = last.get(d.id.as_str())
            && entry.to != d.status
        {
            out.push(format!(
                "deployment {} is {}, its last journal entry ({}) says {}",
                d.id,
                d.status.as_str(),
                entry.seq,
                entry.to.as_str()
            ));
        }
    }
    for id in created.keys() {
        if !ids.contains(id) {
            out.push(format!(
                "the journal created {id}, which is not in the state"
            ));
        }
    }
    for op in ops {
        match (op.kind, op.acked(), &op.outcome) {
            (Kind::Deploy, Some(OperatorResponse::Created { deployment_id }), _) => {
                let found = by_op.get(&op.n.to_string()).cloned().unwrap_or_default();
                if found != [deployment_id.as_str()] {
                    out.push(format!(
                        "acknowledged create {} ({}) answered {deployment_id}, the state holds {found:?}",
                        op.n, op.request_id
                    ));
                }
                let journal = by_request.get(op.request_id.as_str());
                if journal.is_none_or(|ids| ids != &[deployment_id.as_str()]) {
                    out.push(format!(
                        "acknowledged create {} ({}): journal creations {journal:?}",
                        op.n, op.request_id
                    ));
                }
            }
            (Kind::Deploy, _, Outcome::Refused(e)) if by_op.contains_key(&op.n.to_string()) => {
                out.push(format!("refused create {} ({e}) was applied", op.n));
            }
            (_, _, Outcome::Refused(e)) if e.message.contains("was already used") => {
                out.push(format!(
                    "operation {} ({}) refused as another request under its id: {e}",
                    op.n, op.request_id
                ));
            }
            (_, Some(OperatorResponse::Error(e)), _) => {
                out.push(format!(
                    "operation {} acknowledged with an error: {e}",
                    op.n
                ));
            }
            _ => {}
        }
    }
    out.extend(sentinels_once(ops, state));
    out.extend(policies_as_last_acked(ops, state));
    out
}

/// One sentinel per (environment, region); an acknowledged apply's
/// sentinel exists.
fn sentinels_once(ops: &[Op], state: &State) -> Vec<String> {
    let mut out = Vec::new();
    let mut by_key: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for s in &state.sentinels {
        by_key
            .entry((&s.sentinel.environment_id, &s.sentinel.region))
            .or_default()
            .push(&s.sentinel.id);
    }
    for ((environment, region), ids) in &by_key {
        if ids.len() > 1 {
            out.push(format!(
                "environment {environment} has {} sentinels in {region}: {ids:?}",
                ids.len()
            ));
        }
    }
    for op in ops {
        if let Some(OperatorResponse::SentinelDeployed { sentinel_id, .. }) = op.acked()
            && !state
                .sentinels
                .iter()
                .any(|s| &s.sentinel.id == sentinel_id)
        {
            out.push(format!(
                "acknowledged sentinel apply {} answered {sentinel_id}, which does not exist",
                op.n
            ));
        }
    }
    out
}

/// One policy per (environment, region, name) of the operations'; each
/// as the last operation on it left it, when every operation after the
/// last acknowledged one was refused.
fn policies_as_last_acked(ops: &[Op], state: &State) -> Vec<String> {
    let mut out = Vec::new();
    let ours: Vec<&PolicyView> = state
        .policies
        .iter()
        .filter(|p| POLICY_NAMES.contains(&p.policy.k8s_name.as_str()))
        .collect();
    let mut by_key: BTreeMap<(String, String, String), Vec<&PolicyView>> = BTreeMap::new();
    for p in &ours {
        by_key
            .entry((
                p.policy.environment_id.clone(),
                p.policy.region.clone(),
                p.policy.k8s_name.clone(),
            ))
            .or_default()
            .push(p);
    }
    for (key, found) in &by_key {
        if found.len() > 1 {
            out.push(format!("{} policies named {key:?}", found.len()));
        }
    }
    // Each policy id's key, from the applies that answered it.
    let mut key_of: BTreeMap<String, (String, String, String)> = BTreeMap::new();
    for op in ops {
        if let (
            Some(OperatorResponse::PolicyApplied { policy_id }),
            OperatorRequest::ApplyPolicy(apply),
        ) = (op.acked(), &op.request)
        {
            key_of.insert(
                policy_id.clone(),
                (
                    apply.environment_id.clone(),
                    apply.region.clone(),
                    apply.name.clone(),
                ),
            );
        }
    }
    // Per key: the document the last operation left (`None`: deleted),
    // or unknowable (an unanswered operation came after).
    let mut expected: BTreeMap<(String, String, String), Option<Option<String>>> = BTreeMap::new();
    for op in ops {
        let (key, effect) = match &op.request {
            OperatorRequest::ApplyPolicy(apply) => (
                (
                    apply.environment_id.clone(),
                    apply.region.clone(),
                    apply.name.clone(),
                ),
                Some(apply.policy_json.clone()),
            ),
            OperatorRequest::DeletePolicy(DeletePolicy { id }) => match key_of.get(id) {
                Some(key) => (key.clone(), None),
                None => continue,
            },
            _ => continue,
        };
        match &op.outcome {
            Outcome::Acked(_) => {
                expected.insert(key, Some(effect));
            }
            Outcome::Unknown(_) => {
                expected.insert(key, None);
            }
            Outcome::Refused(_) => {}
        }
    }
    for (key, want) in expected {
        let Some(want) = want else { continue };
        let have = by_key
            .get(&key)
            .and_then(|found| found.first())
            .map(|p| p.policy.policy_json.clone());
        if have != want {
            out.push(format!(
                "policy {key:?}: the last acknowledged operation left {want:?}, the state holds {have:?}"
            ));
        }
    }
    out
}

/// A managed object: (kind, namespace, name).
pub(crate) type ObjectKey = (&'static str, String, String);

/// A region's desired objects, as krane would build them.
#[derive(Debug, Default)]
pub(crate) struct Desired {
    /// The objects by kind, namespace and name.
    pub(crate) objects: BTreeMap<ObjectKey, Value>,
    /// The highest version among the region's resources.
    pub(crate) version: Pk,
    /// Objects two resources would both write, described.
    pub(crate) collisions: Vec<String>,
}

/// A region's desired objects as krane would build them, read from a
/// full-sync watch with the region's agent certificate.
pub(crate) async fn desired(agent: &OperatorConfig, region: &str) -> Result<Desired> {
    let client = Client::new(agent)?;
    let read = async {
        let mut stream = client.watch(region, 0).await?;
        let mut resources = Vec::new();
        loop {
            match stream.next().await? {
                Some(WatchEvent::SyncStart { .. }) => {}
                Some(WatchEvent::SyncItem(resource)) => resources.push(resource),
                Some(WatchEvent::SyncEnd { .. }) => return anyhow::Ok(resources),
                Some(other) => bail!("unexpected event in a full sync: {other:?}"),
                None => bail!("the full sync of {region} ended early"),
            }
        }
    };
    let resources = tokio::time::timeout(SYNC_TIMEOUT, read)
        .await
        .with_context(|| format!("reading {region}'s full sync"))??;
    let mut desired = Desired::default();
    for resource in &resources {
        let key = resource.key();
        let objects = &mut desired.objects;
        let before = objects.len();
        let mut added = 0;
        let mut insert = |kind: &'static str, object: Value| {
            added += 1;
            insert(objects, kind, object);
        };
        let version = &mut desired.version;
        match resource {
            Resource::DeploymentTopology(t) => {
                *version = (*version).max(t.version);
                if agent::controller::deployment::wants_objects(t) {
                    let (service, sts) = agent::controller::deployment::desired_objects(t);
                    insert(SERVICES.plural, serde_json::to_value(service)?);
                    insert(STATEFUL_SETS.plural, serde_json::to_value(sts)?);
                    if let Some(secret) = agent::controller::deployment::desired_secret(t) {
                        insert(SECRETS.plural, serde_json::to_value(secret)?);
                    }
                }
            }
            Resource::Sentinel(s) => {
                *version = (*version).max(s.version);
                if agent::controller::sentinel::wants_objects(s) {
                    let (deployment, service, budget) =
                        agent::controller::sentinel::desired_objects(s);
                    insert(DEPLOYMENTS.plural, serde_json::to_value(deployment)?);
                    insert(SERVICES.plural, serde_json::to_value(service)?);
                    insert(POD_DISRUPTION_BUDGETS.plural, serde_json::to_value(budget)?);
                }
            }
            Resource::CiliumNetworkPolicy(p) => {
                *version = (*version).max(p.version);
                // A document krane refuses has no object.
                if let Ok(object) = agent::controller::cilium::desired_object(p) {
                    insert(
                        CILIUM_NETWORK_POLICIES.plural,
                        serde_json::to_value(object)?,
                    );
                }
            }
            // Its ConfigMap holds the pods' addresses: not compared.
            Resource::Route(r) => *version = (*version).max(r.version),
        }
        if desired.objects.len() != before + added {
            desired.collisions.push(format!(
                "{region}: {key:?} would write an object another resource writes"
            ));
        }
    }
    Ok(desired)
}

fn insert(objects: &mut BTreeMap<ObjectKey, Value>, kind: &'static str, object: Value) {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    objects.insert((kind, namespace, name), object);
}

/// Differences between a simulated cluster's krane-managed objects and
/// `desired`: missing, unexpected, or with other labels or spec.
pub(crate) fn cluster_diff(sim: &Simulator, desired: &BTreeMap<ObjectKey, Value>) -> Vec<String> {
    let actual: BTreeMap<ObjectKey, Value> = sim.inspect(|view| {
        let mut actual = BTreeMap::new();
        for res in MANAGED {
            for object in view.list(res, None, wire::k8s_name::MANAGED_BY_SELECTOR) {
                let name = object["metadata"]["name"].as_str().unwrap_or_default();
                let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
                actual.insert(
                    (res.plural, namespace.to_string(), name.to_string()),
                    object.clone(),
                );
            }
        }
        actual
    });
    let mut out = Vec::new();
    for (key, want) in desired {
        match actual.get(key) {
            None => out.push(format!("missing {key:?}")),
            Some(have) => {
                let mut diffs = Vec::new();
                subset(
                    "metadata.labels",
                    &want["metadata"]["labels"],
                    &have["metadata"]["labels"],
                    &mut diffs,
                );
                for field in ["spec", "data", "stringData"] {
                    subset(field, &want[field], &have[field], &mut diffs);
                }
                if !diffs.is_empty() {
                    out.push(format!("{key:?} differs: {}", diffs.join("; ")));
                }
            }
        }
    }
    for key in actual.keys() {
        if !desired.contains_key(key) {
            out.push(format!("unexpected {key:?}"));
        }
    }
    out
}

/// Records in `out` where `have` lacks what `want` holds (fields set to
/// null in `want` are not wanted; arrays must match element by element).
fn subset(path: &str, want: &Value, have: &Value, out: &mut Vec<String>) {
    match (want, have) {
        (Value::Null, _) => {}
        (Value::Object(want), Value::Object(have)) => {
            for (key, value) in want {
                subset(
                    &format!("{path}.{key}"),
                    value,
                    have.get(key).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Object(want), Value::Null) if want.values().all(Value::is_null) => {}
        (Value::Array(want), Value::Array(have)) if want.len() == have.len() => {
            for (i, (w, h)) in want.iter().zip(have).enumerate() {
                subset(&format!("{path}[{i}]"), w, h, out);
            }
        }
        (want, have) if want == have => {}
        (want, have) => out.push(format!("{path}: want {want}, have {have}")),
    }
}

/// `ctrl cluster check -o json` through `operator_path`: the nodes whose
/// state differs or that did not answer, described (empty: identical).
pub(crate) async fn replicas(operator_path: &std::path::Path) -> Result<Vec<String>> {
    let cli = integration::kit::ctrl::with_config(operator_path)
        .await?
        .timeout(CLUSTER_CHECK_TIMEOUT);
    let output = cli.run(&["cluster", "check", "-o", "json"]).await?;
    let text = String::from_utf8_lossy(&output.stdout);
    let report: Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "cluster check printed no report: {text}{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    if report["ok"] == Value::Bool(true) {
        return Ok(Vec::new());
    }
    Ok(vec![format!("cluster check: {report}")])
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use wire::model::CiliumNetworkPolicy;

    use super::*;

    #[test]
    fn an_object_holding_more_than_wanted_matches_and_less_does_not() {
        let want = json!({"replicas": 2, "template": {"image": "a", "unset": null}, "ports": [{"port": 80}]});
        let have = json!({"replicas": 2, "template": {"image": "a", "extra": 1}, "ports": [{"port": 80, "protocol": "TCP"}]});
        let mut out = Vec::new();
        subset("spec", &want, &have, &mut out);
        assert!(out.is_empty(), "{out:?}");
        let have = json!({"replicas": 1, "template": {}, "ports": []});
        subset("spec", &want, &have, &mut out);
        assert_eq!(out.len(), 3, "{out:?}");
        assert!(out[0].starts_with("spec.ports"), "{out:?}");
    }

    fn op(n: u64, request: OperatorRequest, outcome: Outcome) -> Op {
        Op {
            n,
            kind: Kind::PolicyApply,
            request_id: format!("req-{n}"),
            request,
            outcome,
            tries: 1,
        }
    }

    fn apply(doc: &str) -> OperatorRequest {
        wire::operator::ApplyPolicy {
            workspace_id: "ws".into(),
            environment_id: "env".into(),
            region: "us-east".into(),
            name: POLICY_NAMES[0].into(),
            namespace: "ns".into(),
            policy_json: doc.into(),
        }
        .into()
    }

    fn policy(id: &str, doc: &str) -> PolicyView {
        PolicyView {
            policy: CiliumNetworkPolicy {
                id: id.into(),
                workspace_id: "ws".into(),
                environment_id: "env".into(),
                region: "us-east".into(),
                k8s_name: POLICY_NAMES[0].into(),
                k8s_namespace: "ns".into(),
                policy_json: doc.into(),
                version: 1,
                created_at_ms: 0,
                updated_at_ms: 0,
            },
            applied_version: None,
            rejected: None,
        }
    }

    #[test]
    fn policies_are_as_the_last_acknowledged_operation_left_them() {
        let applied = |id: &str| {
            Outcome::Acked(Box::new(OperatorResponse::PolicyApplied {
                policy_id: id.into(),
            }))
        };
        let ops = vec![
            op(1, apply("a"), applied("p1")),
            op(2, apply("b"), applied("p1")),
        ];
        let state = |policies| State {
            policies,
            ..State::default()
        };
        assert!(policies_as_last_acked(&ops, &state(vec![policy("p1", "b")])).is_empty());
        assert_eq!(
            policies_as_last_acked(&ops, &state(vec![policy("p1", "a")])).len(),
            1,
            "an older document"
        );
        assert_eq!(
            policies_as_last_acked(&ops, &state(vec![policy("p1", "b"), policy("p2", "b")])).len(),
            1,
            "a duplicate"
        );
        let mut deleted = ops.clone();
        deleted.push(op(
            3,
            DeletePolicy { id: "p1".into() }.into(),
            Outcome::Acked(Box::new(OperatorResponse::PolicyDeleted {
                policy_id: "p1".into(),
            })),
        ));
        assert!(policies_as_last_acked(&deleted, &state(vec![])).is_empty());
        assert_eq!(
            policies_as_last_acked(&deleted, &state(vec![policy("p1", "b")])).len(),
            1,
            "deleted but present"
        );
        // An unanswered operation last: either state will do.
        deleted.push(op(4, apply("c"), Outcome::Unknown("lost".into())));
        assert!(policies_as_last_acked(&deleted, &state(vec![])).is_empty());
        assert!(policies_as_last_acked(&deleted, &state(vec![policy("p1", "c")])).is_empty());
    }
}
